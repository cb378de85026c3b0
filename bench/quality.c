/* Perplexity driver for bench/quality.sh: scores held-out text token by token (decode mode,
 * one token per forward call, so a policy evicts exactly as it does in generation) through
 * the KV cache of a policy, and prints one line: policy, budget, tokens scored, mean NLL,
 * perplexity, seconds and the KV stats JSON. Stories are separated by blank lines; each is
 * one sequence starting at BOS (and must fit the model context). Exit 0 on success, 2 when
 * the run fails (the error line goes to stderr).
 *
 *   tsr_quality MODEL TOKENIZER TEXT POLICY [--budget B] [--recent R] [--pairs P]
 *               [--recall] [--materialize] [--threads T] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "runtime/forward.h"
#include "runtime/engine.h"
#include "runtime/kv_setup.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"

static double tsr__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tsr_status tsr__read_file(const char *path, char **out, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return tsr_error_set(TSR_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = tsr_realloc(buf, cap);
            if (!nb) {
                tsr_free(buf);
                fclose(fp);
                return TSR_ERR_NOMEM;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, fp);
        n += r;
        if (r < 4096) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        tsr_free(buf);
        return tsr_error_set(TSR_ERR_IO, "%s: read failed", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return TSR_OK;
}

/* Natural-log NLL of `next` under logits (log-sum-exp minus the logit). */
static double tsr__nll(const float *logits, int V, int32_t next) {
    float mx = logits[0];
    for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - logits[next];
}

/* Scores one story as sequence 0 of kv; adds to *nll and *count. */
static tsr_status tsr__score(tsr_forward *f, tsr_kv_cache *kv, const tsr_tokenizer *tok,
                             int V, int ctx, const char *text, size_t len, float *logits,
                             double *nll, int64_t *count) {
    int32_t *ids = NULL;
    size_t n = 0;
    TSR_TRY(tsr_tokenizer_encode(tok, text, len, true, false, &ids, &n));
    tsr_status st = TSR_OK;
    if ((int64_t)n > ctx)
        st = tsr_error_set(TSR_ERR_BUDGET, "quality: a story of %zu tokens exceeds the "
                                           "model context of %d", n, ctx);
    int added = 0;
    if (st == TSR_OK) st = kv->ops->seq_add(kv, 0);
    if (st == TSR_OK) added = 1;
    for (size_t t = 0; st == TSR_OK && t + 1 < n; t++) {
        int rows;
        tsr_batch_seq b = {.seq = 0, .tokens = ids + t, .n_tokens = 1, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
        if (st == TSR_OK) {
            *nll += tsr__nll(logits, V, ids[t + 1]);
            (*count)++;
        }
    }
    if (added) kv->ops->seq_free(kv, 0);
    tsr_free(ids);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL TOKENIZER TEXT POLICY [--budget B] [--recent R] "
                        "[--pairs P] [--recall] [--materialize] [--threads T]\n", argv[0]);
        return 1;
    }
    const char *model_path = argv[1], *tok_path = argv[2], *text_path = argv[3];
    const char *policy = argv[4];
    int threads = 1, materialize = 0;
    double budget = 0;
    /* Policy options: any the policy declares (--h2o-recent F, --offload-recall, ...),
     * checked by the registry; --recent, --pairs, --recall and --materialize are the
     * short names bench/quality.sh uses. */
    const tsr_kv_policy_ops *pol = tsr_kv_policy_find(policy);
    tsr_kv_policy_arg args[32];
    int n_args = 0;
    for (int i = 5; i < argc && n_args < 32; i++) {
        const tsr_kv_policy_option *po = pol ? tsr_kv_policy_option_find(pol, argv[i] + 2) : NULL;
        if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recent") && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){"h2o-recent", argv[++i]};
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){"offload-pairs", argv[++i]};
        else if (!strcmp(argv[i], "--recall"))
            args[n_args++] = (tsr_kv_policy_arg){"offload-recall", "1"};
        else if (!strcmp(argv[i], "--materialize")) {
            args[n_args++] = (tsr_kv_policy_arg){"h2o-scores", "materialize"};
            materialize = 1;
        } else if (po && po->kind == TSR_KV_OPT_FLAG)
            args[n_args++] = (tsr_kv_policy_arg){po->name, "1"};
        else if (po && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){po->name, argv[++i]};
        else {
            fprintf(stderr, "quality: unknown option %s\n", argv[i]);
            return 1;
        }
    }
    tsr_model *m = NULL;
    tsr_tokenizer *tok = NULL;
    tsr_engine *eng = NULL;
    tsr_forward *f = NULL;
    tsr_kv_cache *kv = NULL;
    float *logits = NULL;
    char *text = NULL;
    size_t text_len = 0;
    double nll = 0.0, t0 = tsr__now();
    int64_t count = 0;
    int stories = 0;
    tsr_status st = tsr_model_load(model_path, &m);
    if (st == TSR_OK) st = tsr_tokenizer_load(tok_path, &tok);
    if (st == TSR_OK) st = tsr__read_file(text_path, &text, &text_len);
    if (st == TSR_OK) {
        tsr_engine_options eo = {
            .backend = "cpu", .threads = threads, .max_tokens = 1,
            .kv = {.policy = policy, .memory_bytes = 16 << 20, .block_size = 16,
                   .budget = budget, .policy_args = args, .n_policy_args = n_args,
                   .max_seqs = 1, .chunk_tokens = 1}};
        st = tsr_engine_create(m, &eo, &eng); /* owns the model from here on */
        m = st == TSR_OK ? eng->model : NULL;
    }
    if (st == TSR_OK) {
        f = eng->fwd;
        kv = eng->kv;
        logits = tsr_malloc((size_t)m->cfg.vocab_size * 4);
        if (!logits) st = TSR_ERR_NOMEM;
    }
    /* Stories: runs of text separated by blank lines. */
    for (char *p = text; st == TSR_OK && p && *p;) {
        while (*p == '\n' || *p == ' ') p++;
        if (!*p) break;
        char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == ' ')) len--;
        st = tsr__score(f, kv, tok, m->cfg.vocab_size, m->cfg.max_seq_len, p, len, logits,
                        &nll, &count);
        stories++;
        p = end ? end + 2 : NULL;
    }
    double secs = tsr__now() - t0;
    int rc = 0;
    if (st == TSR_OK && count > 0) {
        char json[2048];
        tsr_kv_stats_json(kv, json, sizeof json);
        printf("policy=%s%s budget=%g stories=%d tokens=%lld nll=%.4f ppl=%.3f seconds=%.2f "
               "kv=%s\n", policy, materialize ? "(materialize)" : "", budget, stories,
               (long long)count, nll / (double)count, exp(nll / (double)count), secs, json);
    } else {
        if (st == TSR_OK) st = tsr_error_set(TSR_ERR_INVALID, "%s: no text", text_path);
        fprintf(stderr, "quality: %s: %s\n", tsr_strerror(st), tsr_last_error());
        printf("policy=%s budget=%g FAILED (%s)\n", policy, budget, tsr_strerror(st));
        rc = 2;
    }
    tsr_free(logits);
    tsr_free(text);
    if (eng) tsr_engine_destroy(eng);
    else if (m) tsr_model_destroy(m);
    if (tok) tsr_tokenizer_destroy(tok);
    return rc;
}
