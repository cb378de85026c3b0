#include "jobs/kv_cli.h"

#include <math.h>
#include <string.h>

#include "base/status.h"

void tsr_kv_cli_init(tsr_kv_cli *k) {
    memset(k, 0, sizeof *k);
    k->kv = (tsr_kv_options){.policy = tsr_kv_policy_default(), .block_size = 16};
    k->policy_name = k->kv.policy->name;
}

/* Non-zero when --name is an option of p (kv-budget: the policies with uses_budget). */
static int tsr__applies(const tsr_kv_policy_decl *p, const char *name) {
    return !strcmp(name, "kv-budget") ? p->uses_budget : !!tsr_kv_policy_option_find(p, name);
}

/* "h2o and offload" / "a, b and c": the policies --name applies to. */
static void tsr__owners(const char *name, char *buf, size_t size) {
    int total = 0, n = 0;
    for (int i = 0; i < tsr_kv_policy_count(); i++)
        total += tsr__applies(tsr_kv_policy_at(i), name);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < tsr_kv_policy_count() && len < size; i++) {
        const tsr_kv_policy_decl *p = tsr_kv_policy_at(i);
        if (!tsr__applies(p, name)) continue;
        const char *sep = n == 0 ? "" : n == total - 1 ? " and " : ", ";
        len += (size_t)snprintf(buf + len, size - len, "%s%s", sep, p->name);
        n++;
    }
}

int tsr_kv_cli_opts(tsr_kv_cli *k, tsr_cli_opt *out) {
    size_t len = (size_t)snprintf(k->policy_help, sizeof k->policy_help, "KV-cache policy:");
    for (int i = 0; i < tsr_kv_policy_count() && len < sizeof k->policy_help; i++) {
        const tsr_kv_policy_decl *p = tsr_kv_policy_at(i);
        len += (size_t)snprintf(k->policy_help + len, sizeof k->policy_help - len, "%s %s (%s)",
                                i ? "," : "", p->name, p->help ? p->help : "");
    }
    char users[128];
    tsr__owners("kv-budget", users, sizeof users);
    snprintf(k->budget_help, sizeof k->budget_help,
             "%s (others ignore it, with a warning): whole tokens kept per layer (> 1) or "
             "a fraction of the sequence (<= 1); 0 = keep all", users);
    int n = 0;
    out[n++] = (tsr_cli_opt){"kv-policy", TSR_OPT_STRING, &k->policy_name, "NAME",
                             k->policy_help, false};
    out[n++] = (tsr_cli_opt){"kv-memory", TSR_OPT_STRING, &k->memory, "BYTES",
                             "KV block pool size, e.g. 512M or 4G (default: on the CPU what "
                             "the batch's sequences can use at full context, twice over, at "
                             "most half the memory left under the job's limit (cgroup, else "
                             "available memory) shared by the node's ranks; on a device 90 % "
                             "of its free memory after the weights; less the prefill "
                             "workspace)", false};
    out[n++] = (tsr_cli_opt){"block-size", TSR_OPT_INT, &k->kv.block_size, "N",
                             "tokens per KV block", false};
    out[n++] = (tsr_cli_opt){"kv-budget", TSR_OPT_DOUBLE, &k->budget, "B", k->budget_help,
                             false};
    out[n++] = (tsr_cli_opt){"kv-dtype", TSR_OPT_STRING, &k->kv.kv_dtype, "T",
                             "KV storage: f32, bf16, q8 (32-element blocks, a scale each) or "
                             "fp8 (E4M3, a scale per row); attention accumulates in f32 "
                             "(default: bf16 on a GPU, f32 on the CPU)", false};
    /* Each policy's options under it, in registry order; a name two policies share is
     * listed once, under the first. */
    k->n_pol = 0;
    for (int i = 0; i < tsr_kv_policy_count(); i++) {
        const tsr_kv_policy_decl *p = tsr_kv_policy_at(i);
        for (int j = 0; j < p->n_options && k->n_pol < TSR_KV_CLI_MAX_POLICY_OPTS; j++) {
            const tsr_kv_policy_option *o = &p->options[j];
            int dup = 0;
            for (int e = 0; e < k->n_pol; e++) dup |= !strcmp(k->pol_opt[e]->name, o->name);
            if (dup) continue;
            int e = k->n_pol++;
            k->pol_opt[e] = o;
            char owners[128];
            tsr__owners(o->name, owners, sizeof owners);
            size_t hl = (size_t)snprintf(k->pol_help[e], sizeof k->pol_help[e], "%s: ", owners);
            if (hl < sizeof k->pol_help[e])
                tsr_kv_policy_option_help(o, k->pol_help[e] + hl, sizeof k->pol_help[e] - hl);
            if (o->kind == TSR_KV_OPT_FLAG)
                out[n++] = (tsr_cli_opt){o->name, TSR_OPT_FLAG, &k->pol_flag[e], NULL,
                                         k->pol_help[e], false};
            else
                out[n++] = (tsr_cli_opt){o->name, TSR_OPT_STRING, &k->pol_text[e],
                                         o->metavar ? o->metavar : "X", k->pol_help[e], false};
        }
    }
    out[n++] = (tsr_cli_opt){"stats", TSR_OPT_FLAG, &k->stats, NULL,
                             "print JSON lines of KV-cache stats (and, for generate, "
                             "communication) to stderr", false};
    return n;
}

tsr_cli_result tsr_kv_cli_check(const tsr_cli *cli, tsr_kv_cli *k) {
    /* The one place a policy's name is resolved: from here on, its declaration. */
    const tsr_kv_policy_decl *decl = tsr_kv_policy_find(k->policy_name);
    if (!decl)
        return tsr_cli_usage_error(cli, "--kv-policy %s: unknown (use %s)",
                                   k->policy_name ? k->policy_name : "(none)",
                                   tsr_kv_policy_names());
    k->kv.policy = decl;
    if (k->memory && tsr_cli_parse_bytes(k->memory, &k->kv.memory_bytes) != 0)
        return tsr_cli_usage_error(cli, "invalid size '%s' for --kv-memory", k->memory);
    if (k->kv.block_size < 1) return tsr_cli_usage_error(cli, "--block-size must be >= 1");
    if (k->budget < 0) return tsr_cli_usage_error(cli, "--kv-budget must be >= 0");
    /* 2.5 is neither: a fraction is <= 1, a token count a whole number (it was taken as 2
     * tokens without a word). */
    if (k->budget > 1 && k->budget != floor(k->budget))
        return tsr_cli_usage_error(cli, "--kv-budget %g: a fraction of the sequence must be "
                                   "<= 1, a count of tokens a whole number > 1", k->budget);
    if (k->kv.kv_dtype && tsr_kv_dtype_parse(k->kv.kv_dtype) < 0)
        return tsr_cli_usage_error(cli, "--kv-dtype %s: unknown (use f32, bf16, q8 or fp8)",
                                   k->kv.kv_dtype);
    /* Every value given is checked against its declaration, whichever policy runs. */
    for (int e = 0; e < k->n_pol; e++) {
        const tsr_cli_opt *c = tsr_cli_find(cli, k->pol_opt[e]->name);
        if (c && c->seen && k->pol_opt[e]->kind != TSR_KV_OPT_FLAG &&
            tsr_kv_policy_option_parse(k->pol_opt[e], k->pol_text[e], NULL) != TSR_OK)
            return tsr_cli_usage_error(cli, "%s", tsr_last_error());
    }
    /* An option the chosen policy ignores (paged keeps every token: no budget; offload
     * budgets without h2o's scores or window) gets one warning line instead of silence.
     * Not refused: scripts that loop over policies with one set of options rely on it
     * (tests/cli/test_run_checkpoint.sh). */
    const char *pol = decl->name;
    char owners[128];
    if (!k->quiet && !decl->uses_budget) {
        const tsr_cli_opt *c = tsr_cli_find(cli, "kv-budget");
        if (c && c->seen) {
            tsr__owners("kv-budget", owners, sizeof owners);
            tsr_cli_warn(cli, "--kv-budget is ignored under --kv-policy %s (it applies to %s)",
                         pol, owners);
        }
    }
    int n_args = 0;
    for (int e = 0; e < k->n_pol; e++) {
        const tsr_kv_policy_option *o = k->pol_opt[e];
        const tsr_cli_opt *c = tsr_cli_find(cli, o->name);
        if (!c || !c->seen) continue;
        if (tsr_kv_policy_option_find(decl, o->name)) {
            k->args[n_args++] = (tsr_kv_policy_arg){
                o->name, o->kind == TSR_KV_OPT_FLAG ? "1" : k->pol_text[e]};
        } else if (!k->quiet) {
            tsr__owners(o->name, owners, sizeof owners);
            tsr_cli_warn(cli, "--%s is ignored under --kv-policy %s (it applies to %s)",
                         o->name, pol, owners);
        }
    }
    k->kv.policy_args = k->args;
    k->kv.n_policy_args = n_args;
    k->kv.budget = k->budget;
    return TSR_CLI_OK;
}

void tsr_kv_cli_print_policies(FILE *f) {
    fprintf(f, "\nKV-cache policies (--kv-policy NAME) and their options:\n");
    for (int i = 0; i < tsr_kv_policy_count(); i++) {
        const tsr_kv_policy_decl *p = tsr_kv_policy_at(i);
        fprintf(f, "  %-10s %s%s\n", p->name, p->help ? p->help : "",
                p->uses_budget ? " (uses --kv-budget)" : "");
        for (int j = 0; j < p->n_options; j++) {
            const tsr_kv_policy_option *o = &p->options[j];
            char left[64], help[320];
            snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
            tsr_kv_policy_option_help(o, help, sizeof help);
            fprintf(f, "    %-30s %s\n", left, help);
        }
    }
}
