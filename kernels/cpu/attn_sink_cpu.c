/* Attention with GPT-OSS's extras (kernels/backend.h tsr_attn_args.sinks and .window): per
 * query head a sink logit in the softmax denominator, and a sliding window enforced by key
 * position (whatever the spans hold, so a policy that keeps old tokens cannot change a
 * sliding layer). One task per query head, all queries in order: the optional key scores
 * of a head are then added by one task, race-free and independent of the thread count.
 * Online softmax per (query, head), started at the sink: m = sink, l = 1 (the sink's
 * exp(sink - m)), so the sink counts exactly once whatever the spans or tiles. */
#include <math.h>

#include "kernels/cpu/cpu_internal.h"

static inline int32_t tsr__sk_pos(const tsr_kv_span *s, int64_t j) {
    return s->pos ? s->pos[j] : s->pos0 + (int32_t)j;
}

static inline bool tsr__sk_visible(int32_t kp, int32_t qp, int window) {
    return kp <= qp && (window <= 0 || kp > qp - window);
}

static inline float tsr__sk_dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int t = 0; t < n; t++) s += a[t] * b[t];
    return s;
}

/* Query head h over all queries. */
static void tsr__sk_head(const tsr_attn_args *a, int h, float scale, int64_t keys) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const size_t ld = (size_t)a->n_heads * (size_t)hd, koff = (size_t)(h / group) * (size_t)hd;
    float acc[TSR__CPU_MAX_HEAD_DIM];
    for (int64_t i = 0; i < a->n_q; i++) {
        const int32_t qp = a->q_pos[i];
        const float *q = a->q + (size_t)i * ld + (size_t)h * (size_t)hd;
        float m = a->sinks ? a->sinks[h] : -INFINITY;
        float l = a->sinks ? 1.0f : 0.0f;
        for (int t = 0; t < hd; t++) acc[t] = 0.0f;
        for (int s = 0; s < a->n_spans; s++) {
            const tsr_kv_span *sp = &a->spans[s];
            for (int64_t j = 0; j < sp->n; j++) {
                if (!tsr__sk_visible(tsr__sk_pos(sp, j), qp, a->window)) continue;
                const float *k = sp->k + (size_t)j * (size_t)sp->stride + koff;
                const float *v = sp->v + (size_t)j * (size_t)sp->stride + koff;
                float x = tsr__sk_dot(q, k, hd) * scale;
                if (x > m) {
                    float c = expf(m - x); /* 0 when m was -inf */
                    l = l * c + 1.0f;
                    for (int t = 0; t < hd; t++) acc[t] = acc[t] * c + v[t];
                    m = x;
                } else {
                    float p = expf(x - m);
                    l += p;
                    for (int t = 0; t < hd; t++) acc[t] += p * v[t];
                }
            }
        }
        float *o = a->out + (size_t)i * ld + (size_t)h * (size_t)hd;
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int t = 0; t < hd; t++) o[t] = acc[t] * inv;
        if (!a->key_scores || !(l > 0.0f)) continue;
        /* probabilities of the real keys: they sum to 1 - p_sink */
        float *ks = a->key_scores + (size_t)h * (size_t)keys;
        int64_t off = 0;
        for (int s = 0; s < a->n_spans; s++) {
            const tsr_kv_span *sp = &a->spans[s];
            for (int64_t j = 0; j < sp->n; j++) {
                if (!tsr__sk_visible(tsr__sk_pos(sp, j), qp, a->window)) continue;
                const float *k = sp->k + (size_t)j * (size_t)sp->stride + koff;
                ks[off + j] += expf(tsr__sk_dot(q, k, hd) * scale - m) * inv;
            }
            off += sp->n;
        }
    }
}

tsr_status tsr__cpu_attention_sink(const tsr_attn_args *a, int threads) {
    float scale = 1.0f / sqrtf((float)a->head_dim);
    int64_t keys = 0;
    for (int s = 0; s < a->n_spans; s++) keys += a->spans[s].n;
    int64_t work = keys * a->n_q * a->n_heads * a->head_dim;
    if (threads > 1 && a->n_heads > 1 && work >= 32768) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int h = 0; h < a->n_heads; h++) tsr__sk_head(a, h, scale, keys);
    } else {
        for (int h = 0; h < a->n_heads; h++) tsr__sk_head(a, h, scale, keys);
    }
    return TSR_OK;
}
