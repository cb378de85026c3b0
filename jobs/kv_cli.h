/* The KV-cache options shared by `tessera generate` and `tessera run`: one table of
 * --kv-* flags, validated once, turned into tsr_kv_options. */
#ifndef TSR_JOBS_KV_CLI_H
#define TSR_JOBS_KV_CLI_H

#include <stdbool.h>

#include "jobs/cli.h"
#include "runtime/kv_setup.h"

#define TSR_KV_CLI_N_OPTS 8

typedef struct tsr_kv_cli {
    tsr_kv_options kv; /* filled by tsr_kv_cli_check */
    const char *memory;
    float budget, recent;
    bool stats;
    bool quiet; /* set by the caller before tsr_kv_cli_check: no warning lines */
} tsr_kv_cli;

/* Defaults: paged, 16-token blocks, tiled scores, recent half of the budget. */
void tsr_kv_cli_init(tsr_kv_cli *k);
/* Writes the TSR_KV_CLI_N_OPTS option entries (bound to k) at `out`. */
void tsr_kv_cli_opts(tsr_kv_cli *k, tsr_cli_opt *out);
/* Validates the parsed values and completes k->kv; prints a usage error when wrong, and
 * (unless k->quiet) one warning line per option the chosen policy ignores. */
tsr_cli_result tsr_kv_cli_check(const tsr_cli *cli, tsr_kv_cli *k);

#endif
