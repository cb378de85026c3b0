/* Long-context prefill driver for bench/longctx.sh: feeds N pseudo-random tokens to one
 * sequence in chunks through the forward pass with the KV cache of a policy, then prints
 * one line: policy, n, seconds, peak RSS and the KV stats JSON. Exit 0 on success, 2 when
 * the run fails (the error line goes to stderr), e.g. materialize running out of memory.
 *
 *   tsr_longctx SPEC POLICY N [--budget B] [--chunk C] [--materialize] [--threads T] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "runtime/forward.h"
#include "runtime/engine.h"
#include "runtime/kv_setup.h"
#include "runtime/model.h"

static double tsr__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s SPEC POLICY N [--budget B] [--chunk C] [--materialize] "
                        "[--threads T]\n", argv[0]);
        return 1;
    }
    const char *spec = argv[1], *policy = argv[2];
    int n = atoi(argv[3]), chunk = 512, threads = 2, materialize = 0;
    double budget = 0;
    /* --materialize is h2o's --h2o-scores materialize; any option the policy declares
     * (policies/policy.h) passes through as --NAME V (a flag: --NAME). */
    const tsr_kv_policy_ops *pol = tsr_kv_policy_find(policy);
    tsr_kv_policy_arg args[32];
    int n_args = 0;
    for (int i = 4; i < argc && n_args < 32; i++) {
        const tsr_kv_policy_option *po = pol ? tsr_kv_policy_option_find(pol, argv[i] + 2) : NULL;
        if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--materialize")) {
            args[n_args++] = (tsr_kv_policy_arg){"h2o-scores", "materialize"};
            materialize = 1;
        } else if (po && po->kind == TSR_KV_OPT_FLAG)
            args[n_args++] = (tsr_kv_policy_arg){po->name, "1"};
        else if (po && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){po->name, argv[++i]};
    }
    if (materialize) chunk = n; /* the original H2O prefill: one n x n call */
    tsr_model *m = NULL;
    tsr_engine *eng = NULL;
    tsr_forward *f = NULL;
    tsr_kv_cache *kv = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    tsr_status st = tsr_model_load(spec, &m);
    if (st == TSR_OK) {
        const tsr_model_config *c = &m->cfg;
        /* A pool that holds the whole sequence (pages are touched only as blocks fill). */
        int64_t row = (int64_t)c->n_layers * c->n_kv_heads * c->head_dim * 8 + 8 * c->n_layers;
        tsr_engine_options eo = {
            .backend = "cpu", .threads = threads, .max_tokens = chunk,
            .kv = {.policy = policy, .memory_bytes = row * ((int64_t)n + 1024) * 2,
                   .block_size = 16, .budget = budget, .max_seqs = 1,
                   .policy_args = args, .n_policy_args = n_args,
                   .chunk_tokens = chunk}};
        st = tsr_engine_create(m, &eo, &eng); /* owns the model from here on */
        m = st == TSR_OK ? eng->model : NULL;
    }
    if (st == TSR_OK) {
        f = eng->fwd;
        kv = eng->kv;
        logits = tsr_malloc((size_t)m->cfg.vocab_size * 4);
        toks = tsr_malloc((size_t)n * sizeof *toks);
        if (!logits || !toks) st = TSR_ERR_NOMEM;
    }
    if (st == TSR_OK) st = kv->ops->seq_add(kv, 0);
    double t0 = tsr__now();
    if (st == TSR_OK) {
        uint32_t r = 42;
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            toks[i] = (int32_t)((r >> 8) % (uint32_t)m->cfg.vocab_size);
        }
        for (int pos = 0; pos < n && st == TSR_OK; pos += chunk) {
            int len = n - pos < chunk ? n - pos : chunk, rows;
            tsr_batch_seq b = {.seq = 0, .tokens = toks + pos, .n_tokens = len,
                               .want_logits = pos + len == n};
            st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
        }
    }
    double secs = tsr__now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int rc = 0;
    if (st == TSR_OK) {
        char json[2048];
        tsr_kv_stats_json(kv, json, sizeof json);
        printf("policy=%s%s n=%d budget=%g seconds=%.2f peak_rss_mb=%.1f kv=%s\n", policy,
               materialize ? "(materialize)" : "", n, budget, secs, ru.ru_maxrss / 1024.0,
               json);
    } else {
        fprintf(stderr, "longctx: %s: %s\n", tsr_strerror(st), tsr_last_error());
        printf("policy=%s%s n=%d budget=%g FAILED (%s) peak_rss_mb=%.1f\n", policy,
               materialize ? "(materialize)" : "", n, budget, tsr_strerror(st),
               ru.ru_maxrss / 1024.0);
        rc = 2;
    }
    tsr_free(logits);
    tsr_free(toks);
    if (eng) tsr_engine_destroy(eng);
    else if (m) tsr_model_destroy(m);
    return rc;
}
