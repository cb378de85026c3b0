/* Long-context prefill driver for bench/longctx.sh and tests/device/run.sh: feeds N
 * pseudo-random tokens to one sequence in chunks through the forward pass with the KV cache
 * of a policy, on a backend (the CPU by default), then prints one line: policy, n, seconds,
 * peak RSS, on a device backend the peak device memory, and the KV stats JSON. Exit 0 on
 * success, 2 when the run fails (the error line goes to stderr), e.g. materialize running
 * out of memory.
 *
 *   tsr_longctx SPEC POLICY N [--budget B] [--chunk C] [--materialize] [--threads T]
 *               [--backend NAME] [--pool-tokens T] [--progress S]
 *   tsr_longctx --policies      the policies the registry knows, one a line
 *
 * --progress S: every S seconds a line "progress tokens= seconds= device_peak_mb=" on
 * stderr, so that a run stopped at a time limit still says how far it got.
 *
 * The block pool holds what one sequence of N tokens holds at the policy's peak, as its
 * declaration says (tsr_kv_policy_resident_of: all N tokens for paged, the budget plus a
 * chunk otherwise, offload's dense layers and dense prefill on top; --pool-tokens T per
 * layer overrides), so the device peak is the policy's and not a fixed pool's. device_peak_mb is the most device memory in use (the
 * backend's memory query: total - free) after any chunk, less what was in use before the
 * weights were placed: weights + pool + workspace. It is sampled after each chunk (the
 * backend's scratch buffers only grow, so a chunk's transients stay counted). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "base/sys.h"
#include "runtime/exec/forward.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"

/* Backend memory in use now, once the queued work is done, less what was in use before
 * the engine placed the weights (0 when the backend's memory is the host's: not ours
 * alone). */
static size_t tsr__dev_used(tsr_engine *e) {
    if (e->be->host_memory || e->be->ops->synchronize(e->be) != TSR_OK) return 0;
    return (size_t)tsr_engine_device_bytes(e);
}

static int tsr__list_policies(void) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", tsr_kv_policy_names());
    char *save = NULL;
    for (char *p = strtok_r(buf, "|", &save); p; p = strtok_r(NULL, "|", &save)) puts(p);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--policies")) return tsr__list_policies();
    if (argc < 4) {
        fprintf(stderr, "usage: %s SPEC POLICY N [--budget B] [--chunk C] [--materialize] "
                        "[--threads T] [--backend NAME] [--pool-tokens T] [--progress S]\n"
                        "       %s --policies\n", argv[0], argv[0]);
        return 1;
    }
    const char *spec = argv[1], *policy = argv[2], *backend = "cpu";
    int n = atoi(argv[3]), chunk = 512, threads = 2, materialize = 0;
    long long pool_tokens = 0;
    double budget = 0, progress = 0;
    /* --materialize is h2o's --h2o-scores materialize; any option the policy declares
     * (policies/policy.h) passes through as --NAME V (a flag: --NAME). */
    const tsr_kv_policy_decl *pol = tsr_kv_policy_find(policy);
    if (!pol) {
        fprintf(stderr, "longctx: unknown policy %s (use %s)\n", policy, tsr_kv_policy_names());
        return 1;
    }
    tsr_kv_policy_arg args[32];
    int n_args = 0;
    for (int i = 4; i < argc; i++) {
        const tsr_kv_policy_option *po =
            !strncmp(argv[i], "--", 2) ? tsr_kv_policy_option_find(pol, argv[i] + 2) : NULL;
        if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--pool-tokens") && i + 1 < argc) pool_tokens = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--progress") && i + 1 < argc) progress = atof(argv[++i]);
        else if (!strcmp(argv[i], "--materialize") && n_args < 32) {
            args[n_args++] = (tsr_kv_policy_arg){"h2o-scores", "materialize"};
            materialize = 1;
        } else if (po && po->kind == TSR_KV_OPT_FLAG && n_args < 32)
            args[n_args++] = (tsr_kv_policy_arg){po->name, "1"};
        else if (po && i + 1 < argc && n_args < 32)
            args[n_args++] = (tsr_kv_policy_arg){po->name, argv[++i]};
        else {
            fprintf(stderr, "longctx: unknown or incomplete option %s\n", argv[i]);
            return 1;
        }
    }
    if (n <= 0 || chunk <= 0) {
        fprintf(stderr, "longctx: N and --chunk must be positive\n");
        return 1;
    }
    if (materialize) chunk = n; /* the original H2O prefill: one n x n call */
    tsr_engine *eng = NULL;
    tsr_forward *f = NULL;
    tsr_kv_cache *kv = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    size_t peak_used = 0;
    /* The pool: what one sequence of n tokens holds at the policy's peak, as its
     * declaration says (tsr_kv_setup's fit_seqs), unless --pool-tokens sizes it. */
    tsr_engine_spec eo = {
        .model_path = spec, .backend = backend, .threads = threads, .max_tokens = chunk,
        .kv_blocks = pool_tokens > 0 ? (pool_tokens + 15) / 16 + 1 : 0,
        .kv = {.policy = pol, .block_size = 16, .budget = budget, .max_seqs = 1,
               .max_context = n, .policy_args = args, .n_policy_args = n_args,
               .chunk_tokens = chunk, .fit_seqs = 1}};
    tsr_status st = tsr_engine_create(&eo, &eng);
    if (st == TSR_OK) {
        f = eng->fwd;
        kv = eng->kv;
        logits = tsr_malloc((size_t)eng->model->cfg.vocab_size * 4);
        toks = tsr_malloc((size_t)n * sizeof *toks);
        if (!logits || !toks) st = TSR_ERR_NOMEM;
    }
    if (st == TSR_OK) st = kv->ops->seq_add(kv, 0);
    double t0 = tsr_sys_now();
    if (st == TSR_OK) {
        int vocab = eng->model->cfg.vocab_size;
        uint32_t r = 42;
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            toks[i] = (int32_t)((r >> 8) % (uint32_t)vocab);
        }
        peak_used = tsr__dev_used(eng);
        double last = t0;
        for (int pos = 0; pos < n && st == TSR_OK; pos += chunk) {
            int len = n - pos < chunk ? n - pos : chunk, rows;
            tsr_batch_seq b = {.seq = 0, .tokens = toks + pos, .n_tokens = len,
                               .want_logits = pos + len == n};
            st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
            size_t u = tsr__dev_used(eng);
            if (u > peak_used) peak_used = u;
            /* How far a run got, for a caller that stops it at a time limit. */
            double now = tsr_sys_now();
            if (progress > 0 && now - last >= progress) {
                fprintf(stderr, "progress tokens=%d seconds=%.1f device_peak_mb=%.1f\n",
                        pos + len, now - t0,
                        (double)peak_used / 1048576.0);
                last = now;
            }
        }
        if (st == TSR_OK && !isfinite(logits[0]))
            st = tsr_error_set(TSR_ERR_INTERNAL, "longctx: last logits are not finite");
    }
    double secs = tsr_sys_now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char dev[320] = "";
    if (eng && !eng->be->host_memory)
        snprintf(dev, sizeof dev, " device=%s device_peak_mb=%.1f weights_mb=%.1f",
                 tsr_engine_device_name(eng),
                 (double)peak_used / 1048576.0,
                 (double)eng->placed_bytes / 1048576.0);
    int rc = 0;
    if (st == TSR_OK) {
        char json[2048];
        tsr_kv_stats_json(kv, json, sizeof json);
        printf("policy=%s%s n=%d budget=%g seconds=%.2f peak_rss_mb=%.1f%s kv=%s\n", policy,
               materialize ? "(materialize)" : "", n, budget, secs, ru.ru_maxrss / 1024.0, dev,
               json);
    } else {
        fprintf(stderr, "longctx: %s: %s\n", tsr_strerror(st), tsr_last_error());
        printf("policy=%s%s n=%d budget=%g FAILED (%s) peak_rss_mb=%.1f%s\n", policy,
               materialize ? "(materialize)" : "", n, budget, tsr_strerror(st),
               ru.ru_maxrss / 1024.0, dev);
        rc = 2;
    }
    tsr_free(logits);
    tsr_free(toks);
    if (eng) tsr_engine_destroy(eng);
    return rc;
}
