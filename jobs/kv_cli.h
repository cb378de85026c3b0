/* The KV-cache options shared by `tessera generate` and `tessera run`: the common --kv-*
 * flags, then every registered policy's own options, generated from their declarations
 * (policies/policy.h), validated once, turned into tsr_kv_options. --kv-policy is resolved
 * here, once, into the policy's declaration (tsr_kv_options.policy); callers ask it, not
 * the name. */
#ifndef TSR_JOBS_KV_CLI_H
#define TSR_JOBS_KV_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "jobs/cli.h"
#include "policies/policy.h"
#include "runtime/exec/kv_setup.h"

/* Distinct option names over all registered policies. */
#define TSR_KV_CLI_MAX_POLICY_OPTS 32
/* The most entries tsr_kv_cli_opts writes (size option arrays with it). */
#define TSR_KV_CLI_N_OPTS (6 + TSR_KV_CLI_MAX_POLICY_OPTS)

typedef struct tsr_kv_cli {
    tsr_kv_options kv; /* filled by tsr_kv_cli_check */
    const char *policy_name; /* --kv-policy as given */
    const char *memory;
    double budget; /* double: a float 0.1 keeps one token more at some lengths */
    bool stats;
    bool quiet; /* set by the caller before tsr_kv_cli_check: no warning lines */
    /* The policies' options as parsed (text, or a flag), one per distinct name. */
    int n_pol;
    const tsr_kv_policy_option *pol_opt[TSR_KV_CLI_MAX_POLICY_OPTS];
    const char *pol_text[TSR_KV_CLI_MAX_POLICY_OPTS];
    bool pol_flag[TSR_KV_CLI_MAX_POLICY_OPTS];
    tsr_kv_policy_arg args[TSR_KV_CLI_MAX_POLICY_OPTS]; /* the chosen policy's, given */
    char pol_help[TSR_KV_CLI_MAX_POLICY_OPTS][320];
    char policy_help[512], budget_help[320];
} tsr_kv_cli;

/* Defaults: paged, 16-token blocks; each policy's options at their declared defaults. */
void tsr_kv_cli_init(tsr_kv_cli *k);
/* Writes the option entries (bound to k, at most TSR_KV_CLI_N_OPTS) at `out` and returns
 * how many: --kv-policy, --kv-memory, --block-size, --kv-budget, --kv-dtype, then each policy's
 * options in registry order (help generated: "h2o: ..."), then --stats. */
int tsr_kv_cli_opts(tsr_kv_cli *k, tsr_cli_opt *out);
/* Validates the parsed values against their declarations and completes k->kv (its policy:
 * the declaration --kv-policy names); prints a usage error when wrong (an unknown policy
 * included), and (unless k->quiet) one warning line per option the chosen policy ignores. */
tsr_cli_result tsr_kv_cli_check(const tsr_cli *cli, tsr_kv_cli *k);
/* The registered policies, each with its options under it (for `tessera --help`). */
void tsr_kv_cli_print_policies(FILE *f);

#endif
