/* Mixture-of-experts block (moe.h). */
#include "runtime/exec/moe.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"

struct tsr_moe {
    tsr_backend *be;
    const tsr_model_config *c;
    int max_tokens;
    float *logits_dev, *out_dev; /* backend: [max_tokens][E], [max_tokens][dim] */
    float *logits;               /* host [max_tokens][E] */
    int32_t *idx, *rows, *offsets, *fill;
    float *wts, *weights;
};

void tsr_moe_route(const float *logits, int n_experts, int k, int32_t *idx, float *wts) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_experts; e++) {
            bool taken = false;
            for (int p = 0; p < j && !taken; p++) taken = idx[p] == e;
            if (taken) continue;
            /* strict >: the lower index wins a tie; NaN never wins */
            if (best < 0 || logits[e] > logits[best]) best = e;
        }
        idx[j] = best;
    }
    float m = logits[idx[0]], sum = 0.0f;
    for (int j = 0; j < k; j++) {
        wts[j] = expf(logits[idx[j]] - m);
        sum += wts[j];
    }
    for (int j = 0; j < k; j++) wts[j] /= sum;
}

void tsr_moe_destroy(tsr_moe *mo) {
    if (!mo) return;
    if (mo->logits_dev) mo->be->ops->buffer_free(mo->be, mo->logits_dev);
    if (mo->out_dev) mo->be->ops->buffer_free(mo->be, mo->out_dev);
    tsr_free(mo->logits);
    tsr_free(mo->idx);
    tsr_free(mo->rows);
    tsr_free(mo->offsets);
    tsr_free(mo->fill);
    tsr_free(mo->wts);
    tsr_free(mo->weights);
    tsr_free(mo);
}

tsr_status tsr_moe_create(tsr_backend *be, const tsr_model_config *c, int max_tokens,
                          tsr_moe **out) {
    *out = NULL;
    if (!be->ops->moe)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "forward: backend %s has no "
                             "mixture-of-experts kernel yet (GPT-OSS runs on cpu and "
                             "cpu-fenced)", be->ops->name);
    tsr_moe *mo = tsr_calloc(1, sizeof *mo);
    if (!mo) return TSR_ERR_NOMEM;
    mo->be = be;
    mo->c = c;
    mo->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens, E = (size_t)c->n_experts, K = (size_t)c->n_experts_used;
    tsr_status st = be->ops->buffer_alloc(be, T * E * sizeof(float), (void **)&mo->logits_dev);
    if (st == TSR_OK)
        st = be->ops->buffer_alloc(be, T * (size_t)c->dim * sizeof(float), (void **)&mo->out_dev);
    if (st == TSR_OK) {
        mo->logits = tsr_malloc(T * E * sizeof(float));
        mo->idx = tsr_malloc(T * K * sizeof(int32_t));
        mo->rows = tsr_malloc(T * K * sizeof(int32_t));
        mo->wts = tsr_malloc(T * K * sizeof(float));
        mo->weights = tsr_malloc(T * K * sizeof(float));
        mo->offsets = tsr_malloc((E + 1) * sizeof(int32_t));
        mo->fill = tsr_malloc((E + 1) * sizeof(int32_t));
        if (!mo->logits || !mo->idx || !mo->rows || !mo->wts || !mo->weights || !mo->offsets ||
            !mo->fill)
            st = TSR_ERR_NOMEM;
    }
    if (st != TSR_OK) {
        tsr_moe_destroy(mo);
        return st;
    }
    *out = mo;
    return TSR_OK;
}

tsr_status tsr_moe_run(tsr_moe *mo, const tsr_layer_weights *w, const float *xb, int64_t n,
                       const float **out) {
    tsr_backend *be = mo->be;
    const int E = mo->c->n_experts, K = mo->c->n_experts_used;
    if (n > mo->max_tokens)
        return tsr_error_set(TSR_ERR_INVALID, "moe: %lld rows exceed %d", (long long)n,
                             mo->max_tokens);
    TSR_TRY(be->ops->matmul(be, xb, n, &w->router, mo->logits_dev));
    TSR_TRY(be->ops->bias_add(be, mo->logits_dev, &w->router_b, n));
    const float *lg = mo->logits_dev; /* on a host-memory backend: read in place */
    if (!be->host_memory) {
        TSR_TRY(tsr_backend_download(be, mo->logits, mo->logits_dev,
                                     (size_t)n * (size_t)E * sizeof(float)));
        lg = mo->logits;
    }
    for (int64_t t = 0; t < n; t++)
        tsr_moe_route(lg + (size_t)t * (size_t)E, E, K, mo->idx + (size_t)t * (size_t)K,
                      mo->wts + (size_t)t * (size_t)K);
    /* counting sort by expert; rows ascending within an expert */
    memset(mo->offsets, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t r = 0; r < n * K; r++) mo->offsets[mo->idx[r] + 1]++;
    for (int e = 0; e < E; e++) mo->offsets[e + 1] += mo->offsets[e];
    memcpy(mo->fill, mo->offsets, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int e = mo->idx[t * K + j];
            int32_t at = mo->fill[e]++;
            mo->rows[at] = (int32_t)t;
            mo->weights[at] = mo->wts[t * K + j];
        }
    tsr_moe_args a = {.x = xb, .n = n, .gate_up = &w->gate_up, .down = &w->down,
                      .offsets = mo->offsets, .rows = mo->rows, .weights = mo->weights,
                      .limit = mo->c->swiglu_limit, .alpha = mo->c->swiglu_alpha,
                      .out = mo->out_dev};
    TSR_TRY(be->ops->moe(be, &a));
    *out = mo->out_dev;
    return TSR_OK;
}
