#include "jobs/kv_cli.h"

#include <string.h>

void tsr_kv_cli_init(tsr_kv_cli *k) {
    memset(k, 0, sizeof *k);
    k->kv = (tsr_kv_options){.policy = "paged", .block_size = 16, .h2o_scores = "tiled"};
    k->recent = 0.5f;
}

void tsr_kv_cli_opts(tsr_kv_cli *k, tsr_cli_opt *out) {
    const tsr_cli_opt opts[TSR_KV_CLI_N_OPTS] = {
        {"kv-policy", TSR_OPT_STRING, &k->kv.policy, "NAME",
         "KV-cache policy: paged (keep all), h2o (heavy hitters + recent), offload "
         "(host tier + speculative fetch)", false},
        {"kv-memory", TSR_OPT_STRING, &k->memory, "BYTES",
         "KV block pool size, e.g. 512M or 4G (default: on the CPU half the host's free "
         "memory, on a device 90 % of the device's free memory after the weights; less the "
         "prefill workspace)", false},
        {"block-size", TSR_OPT_INT, &k->kv.block_size, "N", "tokens per KV block", false},
        {"kv-budget", TSR_OPT_FLOAT, &k->budget, "B",
         "h2o and offload (paged ignores it, with a warning): tokens kept per layer (> 1) "
         "or a fraction of the sequence (<= 1); 0 = keep all", false},
        {"h2o-recent", TSR_OPT_FLOAT, &k->recent, "F",
         "h2o only (others warn): share of the budget for the recent window", false},
        {"h2o-scores", TSR_OPT_STRING, &k->kv.h2o_scores, "MODE",
         "h2o only (others warn): tiled (never materialized) or materialize (the original "
         "n x n baseline)", false},
        {"offload-mode", TSR_OPT_STRING, &k->kv.offload_mode, "MODE",
         "offload only (others warn): skew (InfiniGen: partial keys from the weights' SVD, "
         "the next layer speculated; not with --pp) or warmup (channel pairs from the "
         "first keys, the layer's own queries)", false},
        {"stats", TSR_OPT_FLAG, &k->stats, NULL,
         "print JSON lines of KV-cache stats (and, for generate, communication) to stderr",
         false},
    };
    memcpy(out, opts, sizeof opts);
}

tsr_cli_result tsr_kv_cli_check(const tsr_cli *cli, tsr_kv_cli *k) {
    if (k->memory && tsr_cli_parse_bytes(k->memory, &k->kv.memory_bytes) != 0)
        return tsr_cli_usage_error(cli, "invalid size '%s' for --kv-memory", k->memory);
    if (k->kv.block_size < 1) return tsr_cli_usage_error(cli, "--block-size must be >= 1");
    if (k->budget < 0) return tsr_cli_usage_error(cli, "--kv-budget must be >= 0");
    if (k->kv.offload_mode && strcmp(k->kv.offload_mode, "skew") &&
        strcmp(k->kv.offload_mode, "warmup"))
        return tsr_cli_usage_error(cli, "--offload-mode must be skew or warmup");
    if (!(k->recent >= 0 && k->recent <= 1))
        return tsr_cli_usage_error(cli, "--h2o-recent must be in [0, 1]");
    /* An option the chosen policy ignores (paged keeps every token: no budget; offload
     * budgets without h2o's scores or window) gets one warning line instead of silence.
     * Not refused: scripts that loop over policies with one set of options rely on it
     * (tests/cli/test_run_checkpoint.sh). An unknown policy is left to tsr_kv_setup. */
    const char *pol = k->kv.policy ? k->kv.policy : "paged";
    static const struct {
        const char *opt;
        bool h2o, offload;
        const char *which;
    } only[] = {{"kv-budget", true, true, "h2o and offload"},
                {"h2o-recent", true, false, "h2o"},
                {"h2o-scores", true, false, "h2o"},
                {"offload-mode", false, true, "offload"}};
    bool is_h2o = !strcmp(pol, "h2o"), is_off = !strcmp(pol, "offload");
    if (!k->quiet && (is_h2o || is_off || !strcmp(pol, "paged"))) {
        for (size_t i = 0; i < sizeof only / sizeof only[0]; i++) {
            const tsr_cli_opt *o = tsr_cli_find(cli, only[i].opt);
            if (!o || !o->seen || (is_h2o && only[i].h2o) || (is_off && only[i].offload))
                continue;
            tsr_cli_warn(cli, "--%s is ignored under --kv-policy %s (it applies to %s)",
                         only[i].opt, pol, only[i].which);
        }
    }
    k->kv.budget = k->budget;
    k->kv.recent = k->recent;
    return TSR_CLI_OK;
}
