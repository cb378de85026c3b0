/* CPU attention (tiled online softmax) vs a naive reference that builds the full score
 * matrix in double: several spans, non-contiguous position arrays, strided rows, GQA ratios
 * 1/2/4, decode and prefill continuing after cached keys, per-key score accumulation, and
 * GPT-OSS's sinks and sliding windows. 1 and 2 threads must agree bit for bit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "base/alloc.h"
#include "tests/test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* Whether a query at qp sees a key at kp (causal, within a->window when > 0). */
static int ref_visible(const tsr_attn_args *a, int32_t kp, int32_t qp) {
    return kp <= qp && (a->window <= 0 || kp > qp - a->window);
}

/* Reference: out and key_scores (added to) for the same arguments; a sink logit joins each
 * query's softmax denominator (its probability is not a key's). */
static void attn_ref(const tsr_attn_args *a, float *out, float *ks) {
    int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    int64_t total = 0;
    for (int s = 0; s < a->n_spans; s++) total += a->spans[s].n;
    double *sc = tsr_malloc((size_t)total * sizeof(double));
    for (int i = 0; i < a->n_q; i++) {
        for (int h = 0; h < a->n_heads; h++) {
            int g = h / group;
            const float *q = a->q + ((size_t)i * a->n_heads + h) * hd;
            double sink = a->sinks ? a->sinks[h] : -INFINITY, mx = sink;
            int64_t j = 0;
            for (int s = 0; s < a->n_spans; s++) {
                const tsr_kv_span *sp = &a->spans[s];
                for (int t = 0; t < sp->n; t++, j++) {
                    int32_t p = sp->pos ? sp->pos[t] : sp->pos0 + t;
                    const float *k = sp->k + (size_t)t * sp->stride + (size_t)g * hd;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)q[e] * k[e];
                    sc[j] = ref_visible(a, p, a->q_pos[i]) ? d / sqrt((double)hd) : -INFINITY;
                    if (sc[j] > mx) mx = sc[j];
                }
            }
            double sum = sink > -INFINITY ? exp(sink - mx) : 0.0;
            for (j = 0; j < total; j++) {
                sc[j] = exp(sc[j] - mx);
                sum += sc[j];
            }
            float *o = out + ((size_t)i * a->n_heads + h) * hd;
            for (int e = 0; e < hd; e++) {
                double acc = 0;
                j = 0;
                for (int s = 0; s < a->n_spans; s++) {
                    const tsr_kv_span *sp = &a->spans[s];
                    for (int t = 0; t < sp->n; t++, j++)
                        acc += sc[j] / sum * sp->v[(size_t)t * sp->stride + (size_t)g * hd + e];
                }
                o[e] = (float)acc;
            }
            if (ks)
                for (j = 0; j < total; j++) ks[(size_t)h * total + j] += (float)(sc[j] / sum);
        }
    }
    tsr_free(sc);
}

typedef struct span_spec {
    int n;
    int32_t pos0;
    int shuffled; /* positions from a permutation of pos0.. (non-contiguous order) */
    int pad;      /* extra floats between rows */
} span_spec;

/* GPT-OSS's extras for the next run_case: sinks (0 none, 1 N(0, 2)-like logits, 2 all
 * -inf) and the window (0 none). */
static int case_sinks, case_window;

/* Builds spans + queries, runs the backend at 1, 2 and 3 threads and the reference. */
static void run_case(int n_q, const int32_t *q_pos, const span_spec *specs, int n_spans,
                     int n_heads, int n_kv_heads, int hd, int with_scores) {
    int kv_dim = n_kv_heads * hd;
    tsr_kv_span spans[8];
    float *kbuf[8], *vbuf[8];
    int32_t *pbuf[8];
    int64_t total = 0;
    for (int s = 0; s < n_spans; s++) {
        const span_spec *sp = &specs[s];
        int64_t stride = kv_dim + sp->pad;
        kbuf[s] = tsr_malloc((size_t)(sp->n * stride) * 4);
        vbuf[s] = tsr_malloc((size_t)(sp->n * stride) * 4);
        for (int64_t i = 0; i < sp->n * stride; i++) {
            kbuf[s][i] = frand();
            vbuf[s][i] = frand();
        }
        pbuf[s] = NULL;
        if (sp->shuffled) {
            pbuf[s] = tsr_malloc((size_t)sp->n * 4);
            for (int i = 0; i < sp->n; i++) pbuf[s][i] = sp->pos0 + i;
            for (int i = sp->n - 1; i > 0; i--) {
                int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
                int32_t t = pbuf[s][i];
                pbuf[s][i] = pbuf[s][j];
                pbuf[s][j] = t;
            }
        }
        spans[s] = (tsr_kv_span){kbuf[s], vbuf[s], pbuf[s], sp->pos0, sp->n, stride, TSR_KV_F32};
        total += sp->n;
    }
    size_t qn = (size_t)n_q * n_heads * hd;
    float *q = tsr_malloc(qn * 4), *ref = tsr_malloc(qn * 4);
    for (size_t i = 0; i < qn; i++) q[i] = 2.0f * frand();
    float sinks[64];
    for (int h = 0; h < n_heads && h < 64; h++)
        sinks[h] = case_sinks == 2 ? -INFINITY : 2.0f * frand();
    float *out[3], *ks[3];
    float *ks_ref = tsr_malloc((size_t)(n_heads * total) * 4);
    for (int64_t i = 0; i < n_heads * total; i++) ks_ref[i] = 0.5f;
    for (int t = 0; t < 3; t++) {
        out[t] = tsr_malloc(qn * 4);
        ks[t] = tsr_malloc((size_t)(n_heads * total) * 4);
        for (int64_t i = 0; i < n_heads * total; i++) ks[t][i] = 0.5f; /* added to */
        tsr_attn_args a = {q, q_pos, n_q, spans, n_spans, n_heads, n_kv_heads, hd, out[t],
                           with_scores ? ks[t] : NULL, case_sinks ? sinks : NULL, case_window};
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(t + 1, &be));
        ASSERT_OK(be->ops->attention(be, &a));
        tsr_backend_destroy(be);
        if (t == 0) attn_ref(&a, ref, with_scores ? ks_ref : NULL);
    }
    for (size_t i = 0; i < qn; i++)
        if (!(fabsf(out[0][i] - ref[i]) <= 1e-5f))
            TSR_FAIL_("out[%zu] = %.9g, ref %.9g (nq %d heads %d/%d hd %d)", i, out[0][i],
                      ref[i], n_q, n_heads, n_kv_heads, hd);
    ASSERT_TRUE(memcmp(out[0], out[1], qn * 4) == 0);
    ASSERT_TRUE(memcmp(out[0], out[2], qn * 4) == 0);
    if (with_scores) {
        for (int64_t i = 0; i < n_heads * total; i++)
            if (!(fabsf(ks[0][i] - ks_ref[i]) <= 1e-5f * (1.0f + fabsf(ks_ref[i]))))
                TSR_FAIL_("key_scores[%lld] = %.9g, ref %.9g", (long long)i, ks[0][i],
                          ks_ref[i]);
        ASSERT_TRUE(memcmp(ks[0], ks[1], (size_t)(n_heads * total) * 4) == 0);
        ASSERT_TRUE(memcmp(ks[0], ks[2], (size_t)(n_heads * total) * 4) == 0);
    }
    for (int s = 0; s < n_spans; s++) {
        tsr_free(kbuf[s]);
        tsr_free(vbuf[s]);
        tsr_free(pbuf[s]);
    }
    for (int t = 0; t < 3; t++) {
        tsr_free(out[t]);
        tsr_free(ks[t]);
    }
    tsr_free(ks_ref);
    tsr_free(q);
    tsr_free(ref);
}

static const int gqa[3][2] = {{4, 4}, {4, 2}, {8, 2}};

TSR_TEST(test_decode_one_span) {
    span_spec sp = {137, 0, 0, 0};
    int32_t qp = 137;
    for (int g = 0; g < 3; g++)
        for (int hd = 20; hd <= 64; hd += 44) {
            run_case(1, &qp, &sp, 1, gqa[g][0], gqa[g][1], hd, 1);
            if (tsr_test_failed_flag) return;
        }
}

/* Decode over 8 spans of 80 rows: one key row at a time for all heads (AVX-512) or 16-row
 * chunks, in 10 partitions of 64 keys that cross the spans' ends, on 1, 2 or 3 threads
 * (kernels/cpu/attn_cpu.c); each must give the reference and the same bits. Spans with
 * padded strides and shuffled positions. */
TSR_TEST(test_decode_long_spans) {
    span_spec sp[8];
    for (int s = 0; s < 8; s++) sp[s] = (span_spec){80, 80 * s, s % 3 == 1, s % 2 ? 7 : 0};
    int32_t qp = 8 * 80;
    run_case(1, &qp, sp, 8, 16, 8, 64, 1);
    if (tsr_test_failed_flag) return;
    run_case(1, &qp, sp, 8, 8, 8, 64, 1);
    if (tsr_test_failed_flag) return;
    run_case(1, &qp, sp, 8, 32, 32, 64, 1);
}

/* Decode rows split into partitions (kernels/cpu/attn_cpu.c tsr__attn_decode): a query at
 * position 100 over 300 contiguous keys (the partitions past it see nothing and add
 * nothing), spans of 16 rows as a paged cache holds them and spans that end inside a
 * partition, and 8300 keys (more than 128 partitions of 64: partitions of 128). */
TSR_TEST(test_decode_partitions) {
    span_spec one = {300, 0, 0, 2};
    int32_t qp = 100;
    for (int g = 0; g < 3; g++) {
        run_case(1, &qp, &one, 1, gqa[g][0], gqa[g][1], 32, 1);
        if (tsr_test_failed_flag) return;
    }
    span_spec blocks[8];
    for (int s = 0; s < 8; s++) blocks[s] = (span_spec){16, 16 * s, 0, 0};
    qp = 8 * 16 - 1;
    run_case(1, &qp, blocks, 8, 8, 2, 64, 1);
    if (tsr_test_failed_flag) return;
    span_spec odd[4] = {{37, 0, 0, 1}, {64, 37, 1, 0}, {1, 101, 0, 0}, {90, 102, 0, 3}};
    qp = 191;
    run_case(1, &qp, odd, 4, 4, 2, 48, 1);
    if (tsr_test_failed_flag) return;
    span_spec many[3] = {{5000, 0, 0, 0}, {3000, 5000, 1, 0}, {300, 8000, 0, 1}};
    qp = 8299;
    run_case(1, &qp, many, 3, 4, 2, 16, 1);
}

/* A prefill chunk over more than 1 MiB of K + V (row order, threaded: 4 tasks a thread)
 * after 8 spans of cached keys. */
TSR_TEST(test_prefill_row_order) {
    span_spec sp[8];
    for (int s = 0; s < 8; s++) sp[s] = (span_spec){80, 80 * s, s == 3, s % 2 ? 5 : 0};
    int32_t qp[24];
    for (int i = 0; i < 24; i++) qp[i] = 8 * 80 - 24 + i;
    run_case(24, qp, sp, 8, 16, 8, 64, 1);
}

/* A prefill chunk of 9 queries at positions 70..78 over 70 cached keys + its own 9 keys. */
TSR_TEST(test_prefill_after_cache) {
    span_spec sp[2] = {{70, 0, 0, 3}, {9, 70, 0, 0}};
    int32_t qp[9];
    for (int i = 0; i < 9; i++) qp[i] = 70 + i;
    for (int g = 0; g < 3; g++) {
        run_case(9, qp, sp, 2, gqa[g][0], gqa[g][1], 16, 1);
        if (tsr_test_failed_flag) return;
        run_case(9, qp, sp, 2, gqa[g][0], gqa[g][1], 24, 0);
        if (tsr_test_failed_flag) return;
    }
}

/* Paged-like spans with shuffled position arrays, strides, and queries at mixed positions
 * (two sequences' worth of rows: the mask alone decides what each sees). */
TSR_TEST(test_shuffled_spans) {
    span_spec sp[3] = {{64, 0, 1, 5}, {150, 64, 1, 0}, {30, 214, 0, 1}};
    int32_t qp[6] = {243, 10, 100, 214, 0, 63};
    for (int g = 0; g < 3; g++) {
        run_case(6, qp, sp, 3, gqa[g][0], gqa[g][1], 32, 1);
        if (tsr_test_failed_flag) return;
        run_case(6, qp, sp, 3, gqa[g][0], gqa[g][1], 13, 1);
        if (tsr_test_failed_flag) return;
    }
}

/* Long causal prefill from position 0 (many tiles, threaded). */
TSR_TEST(test_causal_prefill) {
    span_spec sp = {200, 0, 0, 0};
    int32_t qp[200];
    for (int i = 0; i < 200; i++) qp[i] = i;
    run_case(200, qp, &sp, 1, 8, 2, 64, 1);
}

/* A query that sees no key gets zeros, not NaN. */
TSR_TEST(test_no_visible_key) {
    float k[8], v[8], q[8], out[8];
    for (int i = 0; i < 8; i++) k[i] = v[i] = q[i] = 1.0f;
    tsr_kv_span sp = {k, v, NULL, 5, 1, 8, TSR_KV_F32};
    int32_t qp = 2;
    tsr_attn_args a = {q, &qp, 1, &sp, 1, 1, 1, 8, out, NULL, NULL, 0};
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(1, &be));
    ASSERT_OK(be->ops->attention(be, &a));
    for (int i = 0; i < 8; i++) ASSERT_TRUE(out[i] == 0.0f);
    a.n_kv_heads = 3;
    ASSERT_EQ_INT(be->ops->attention(be, &a), TSR_ERR_INVALID);
    tsr_backend_destroy(be);
}


/* A tile in which one kv head's keys are all NaN (V infinite) is skipped for that head's
 * queries in every order, so they keep the other tiles' finite result and the other heads
 * are untouched; 1 and 2 threads agree. (Row order once added 0 * inf there: NaN.) */
TSR_TEST(test_decode_skips_a_nan_tile_per_head) {
    enum { N = 80, G = 2, H = 4, HD = 16, KVD = G * HD };
    static float k[N * KVD], v[N * KVD], q[H * HD], out[2][H * HD];
    for (int i = 0; i < N * KVD; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (int j = 64; j < N; j++) /* the whole second tile of kv head 0 */
        for (int e = 0; e < HD; e++) {
            k[j * KVD + e] = NAN;
            v[j * KVD + e] = INFINITY;
        }
    for (int i = 0; i < H * HD; i++) q[i] = frand();
    tsr_kv_span sp = {k, v, NULL, 0, N, KVD, TSR_KV_F32};
    int32_t qp = N - 1;
    for (int t = 0; t < 2; t++) {
        tsr_attn_args a = {q, &qp, 1, &sp, 1, H, G, HD, out[t], NULL, NULL, 0};
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(t + 1, &be));
        ASSERT_OK(be->ops->attention(be, &a));
        tsr_backend_destroy(be);
    }
    for (int i = 0; i < H * HD; i++) ASSERT_TRUE(isfinite(out[0][i]));
    ASSERT_TRUE(memcmp(out[0], out[1], sizeof out[0]) == 0);
}

/* Prefill through the query lanes (no key scores: queries in vector lanes on AVX-512, 16
 * per task): from position 0 with a last partial block of queries, after cached keys, over
 * shuffled spans with mixed query positions, and with the key-score pass (the row tasks)
 * for comparison; tiny heads with a specialized kernel (4, 8, 16) and not (12), and wide
 * ones (32, 48, 64, 128; 16 dimensions at a time). */
TSR_TEST(test_prefill_tiny_heads) {
    span_spec causal = {37, 0, 0, 0};
    int32_t qp[37];
    for (int i = 0; i < 37; i++) qp[i] = i;
    for (int g = 0; g < 3; g++) {
        run_case(37, qp, &causal, 1, gqa[g][0], gqa[g][1], 8, 0);
        if (tsr_test_failed_flag) return;
    }
    span_spec cached[2] = {{70, 0, 0, 3}, {9, 70, 0, 0}};
    for (int i = 0; i < 9; i++) qp[i] = 70 + i;
    const int hds[4] = {4, 8, 12, 16};
    for (int h = 0; h < 4; h++)
        for (int sc = 0; sc < 2; sc++) {
            run_case(9, qp, cached, 2, 8, 2, hds[h], sc);
            if (tsr_test_failed_flag) return;
        }
    const int wide[3] = {32, 64, 128};
    for (int h = 0; h < 3; h++) {
        run_case(9, qp, cached, 2, 8, 2, wide[h], 0);
        if (tsr_test_failed_flag) return;
    }
    for (int i = 0; i < 37; i++) qp[i] = i;
    run_case(37, qp, &causal, 1, 4, 4, 64, 0);
    if (tsr_test_failed_flag) return;
    for (int i = 0; i < 9; i++) qp[i] = 70 + i;
    span_spec shuffled[3] = {{64, 0, 1, 5}, {150, 64, 1, 0}, {30, 214, 0, 1}};
    int32_t mixed[20] = {243, 10, 100, 214, 0, 63, 5, 240, 199, 64, 1, 2, 3, 150, 151, 213,
                         230, 231, 17, 99};
    run_case(20, mixed, shuffled, 3, 8, 4, 8, 0);
    if (tsr_test_failed_flag) return;
    run_case(20, mixed, shuffled, 3, 8, 4, 48, 0);
}

/* Tiny-head prefill: queries before every key get zeros; a tile whose keys are NaN (V
 * infinite) for one kv head is skipped for that head's queries, as in the row tasks; 1
 * and 2 threads agree. */
TSR_TEST(test_prefill_tiny_heads_edges) {
    enum { N = 80, G = 2, H = 4, HD = 8, KVD = G * HD, NQ = 18 };
    static float k[N * KVD], v[N * KVD], q[NQ * H * HD], out[2][NQ * H * HD];
    for (int i = 0; i < N * KVD; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (int j = 64; j < N; j++)
        for (int e = 0; e < HD; e++) {
            k[j * KVD + e] = NAN;
            v[j * KVD + e] = INFINITY;
        }
    for (int i = 0; i < NQ * H * HD; i++) q[i] = frand();
    tsr_kv_span sp = {k, v, NULL, 10, N, KVD, TSR_KV_F32};
    int32_t qp[NQ];
    for (int i = 0; i < NQ; i++) qp[i] = i < 2 ? 3 + i : 10 + N - NQ + i; /* 2 see nothing */
    for (int t = 0; t < 2; t++) {
        tsr_attn_args a = {q, qp, NQ, &sp, 1, H, G, HD, out[t], NULL, NULL, 0};
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(t + 1, &be));
        ASSERT_OK(be->ops->attention(be, &a));
        tsr_backend_destroy(be);
    }
    for (int i = 0; i < NQ * H * HD; i++) {
        ASSERT_TRUE(isfinite(out[0][i]));
        if (i < 2 * H * HD) ASSERT_TRUE(out[0][i] == 0.0f);
    }
    ASSERT_TRUE(memcmp(out[0], out[1], sizeof out[0]) == 0);
}

/* GPT-OSS's sinks and sliding windows against the reference: decode rows of one partition
 * and of several (the sink joins the partitions' merge; partitions before the window see
 * nothing), over contiguous spans (keys before the window left out of the tiles) and
 * shuffled position arrays (masked key by key), with key scores; prefill from position 0
 * and after cached keys with mixed query positions. */
TSR_TEST(test_sinks_and_window) {
    span_spec one = {40, 0, 0, 0}, longer = {300, 0, 0, 2};
    span_spec sh[3] = {{64, 0, 1, 5}, {150, 64, 1, 0}, {30, 214, 0, 1}};
    int32_t qp[200];
    const int modes[3][2] = {{1, 0}, {1, 16}, {0, 100}}; /* sinks, window */
    for (int m = 0; m < 3 && !tsr_test_failed_flag; m++) {
        case_sinks = modes[m][0];
        case_window = modes[m][1];
        for (int g = 0; g < 3 && !tsr_test_failed_flag; g++) {
            qp[0] = 39;
            run_case(1, qp, &one, 1, gqa[g][0], gqa[g][1], 64, 1);
            qp[0] = 299;
            if (!tsr_test_failed_flag) run_case(1, qp, &longer, 1, gqa[g][0], gqa[g][1], 32, 1);
            qp[0] = 243;
            if (!tsr_test_failed_flag) run_case(1, qp, sh, 3, gqa[g][0], gqa[g][1], 16, 1);
        }
        for (int i = 0; i < 200; i++) qp[i] = i;
        if (!tsr_test_failed_flag) run_case(200, qp, &longer, 1, 8, 2, 64, 1);
        int32_t mixed[8] = {243, 10, 100, 214, 0, 63, 150, 230};
        if (!tsr_test_failed_flag) run_case(8, mixed, sh, 3, 8, 4, 24, 1);
    }
    case_sinks = case_window = 0;
}

/* A -inf sink adds exp(-inf) = 0: the bits of no sink, in decode (one partition and
 * several) and prefill. */
TSR_TEST(test_minus_inf_sinks_are_none) {
    enum { N = 200, G = 2, H = 8, HD = 32, KVD = G * HD };
    static float k[N * KVD], v[N * KVD], q[N * H * HD], o[2][N * H * HD];
    for (int i = 0; i < N * KVD; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (int i = 0; i < N * H * HD; i++) q[i] = frand();
    float sinks[H];
    for (int h = 0; h < H; h++) sinks[h] = -INFINITY;
    int32_t qp[N];
    for (int i = 0; i < N; i++) qp[i] = i;
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(2, &be));
    const int calls[3][2] = {{1, 40}, {1, N}, {N, N}}; /* queries, keys */
    for (int c = 0; c < 3; c++) {
        int nq = calls[c][0], nk = calls[c][1];
        tsr_kv_span sp = {k, v, NULL, 0, nk, KVD, TSR_KV_F32};
        for (int t = 0; t < 2; t++) {
            tsr_attn_args a = {q, nq == 1 ? &qp[nk - 1] : qp, nq, &sp, 1, H, G, HD, o[t],
                               NULL, t ? sinks : NULL, 0};
            ASSERT_OK(be->ops->attention(be, &a));
        }
        ASSERT_TRUE(memcmp(o[0], o[1], (size_t)nq * H * HD * sizeof(float)) == 0);
    }
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_decode_one_span, test_decode_long_spans, test_decode_partitions,
              test_prefill_row_order,
              test_prefill_after_cache,
              test_shuffled_spans, test_causal_prefill, test_no_visible_key,
              test_decode_skips_a_nan_tile_per_head, test_prefill_tiny_heads,
              test_prefill_tiny_heads_edges, test_sinks_and_window,
              test_minus_inf_sinks_are_none)
