/* Q4_K weights: GGUF blocks repacked losslessly and dequantized as the `gguf` package does
 * (tests/data/q4k, tools/make_q4k_testdata.py; tests/data/gguf/types.gguf's Q4_K tensor);
 * the Q8_K activation quantizer's bytes against llama.cpp's reference (the script's f32
 * numpy copy); slices; every kernel variant against the scalar reference (bits) for nx 1..4,
 * odd shapes and parts, the scalar reference against a double sum over the dequantized
 * weights and activations; the cpu and cpu-fenced backends; a tiny all-Q4_K llama natively
 * against its f32 expansion (greedy tokens, logits); the Q4_1 rewriting of a wo and w_down
 * whose reduction parts cut super-blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_q4k_internal.h"
#include "runtime/engine/engine.h"
#include "runtime/format/gguf.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "memory/kv_cache.h"
#include "tests/quant_test_util.h"
#include "tests/test.h"

#define DATA TSR_SOURCE_DIR "/tests/data/q4k/"

enum { GR = 37, GC = 768, GNB = GC / 256 };

/* w_q4k.bin repacked (rows 17 and 37: padded last groups), back byte for byte, and
 * dequantized to the package's values bit for bit. */
TSR_TEST(test_repack_and_dequant) {
    size_t nq, nd;
    uint8_t *blocks = read_all(DATA "w_q4k.bin", &nq);
    float *deq = read_all(DATA "w_deq.f32", &nd);
    ASSERT_TRUE(blocks && deq);
    ASSERT_EQ_INT((int)nq, GR * GNB * TSR_Q4K_BLOCK_BYTES);
    ASSERT_EQ_INT((int)nd, GR * GC * 4);
    for (int rows = 17; rows <= GR; rows += 20) {
        tsr_tensor q = {.dtype = TSR_Q4_K, .rows = rows, .cols = GC};
        ASSERT_EQ_INT((int)tsr_tensor_bytes(&q), (rows + 15) / 16 * 16 * GNB * 144);
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_TRUE(packed);
        tsr_q4k_pack_gguf(blocks, rows, GC, packed);
        for (int r = 0; r < rows; r++) {
            uint8_t back[GNB * TSR_Q4K_BLOCK_BYTES];
            float got[GC];
            tsr_q4k_unpack_row(packed, GC, r, back);
            ASSERT_TRUE(!memcmp(back, blocks + r * GNB * TSR_Q4K_BLOCK_BYTES, sizeof back));
            tsr_q4k_dequant_row(packed, GC, r, got);
            for (int k = 0; k < GC; k++)
                if (memcmp(&got[k], &deq[r * GC + k], 4))
                    TSR_FAIL_("row %d col %d: %.9g vs gguf %.9g", r, k, (double)got[k],
                              (double)deq[r * GC + k]);
        }
        tsr_free(packed);
    }
    free(blocks);
    free(deq);
}

/* types.gguf's Q4_K tensor (random scale bytes), as test_gguf's dequantization check. */
TSR_TEST(test_types_gguf) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(TSR_SOURCE_DIR "/tests/data/gguf/types.gguf", &g));
    size_t n;
    uint8_t *raw = read_all(TSR_SOURCE_DIR "/tests/data/gguf/types_expected.f32", &n);
    ASSERT_TRUE(raw && n == g->n_tensors * 512 * 4);
    int seen = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tsr_gguf_tensor *tt = &g->tensors[i];
        if (tt->type != TSR_GGML_Q4_K) continue;
        tsr_tensor q = {.dtype = TSR_Q4_K, .rows = 2, .cols = 256};
        void *packed = tsr_malloc(tsr_tensor_bytes(&q));
        tsr_q4k_pack_gguf(tt->data, 2, 256, packed);
        for (int r = 0; r < 2; r++) {
            float got[256];
            tsr_q4k_dequant_row(packed, 256, r, got);
            for (int k = 0; k < 256; k++) {
                float e;
                memcpy(&e, raw + (i * 512 + (uint64_t)(r * 256 + k)) * 4, 4);
                if (!(fabsf(got[k] - e) <= 1e-6f * (1 + fabsf(e))))
                    TSR_FAIL_("%s[%d]: %.9g vs %.9g", tt->name, r * 256 + k, (double)got[k],
                              (double)e);
            }
        }
        tsr_free(packed);
        seen++;
    }
    ASSERT_EQ_INT(seen, 1);
    free(raw);
    tsr_gguf_close(g);
}

/* Q8_K: codes, f32 scales and 32-column sums equal the reference's (x_q8k.bin). */
TSR_TEST(test_act_quant) {
    size_t nx, nq;
    float *x = read_all(DATA "x.f32", &nx);
    uint8_t *want = read_all(DATA "x_q8k.bin", &nq);
    ASSERT_TRUE(x && want);
    size_t per = GC + GNB * 4 + GNB * 8 * 4;
    ASSERT_EQ_INT((int)nx, 4 * GC * 4);
    ASSERT_EQ_INT((int)nq, (int)(4 * per));
    for (int r = 0; r < 4; r++) {
        int8_t q[GC];
        float d[GNB];
        int32_t s[GNB * 8];
        tsr__q4k_quantize_act(x + r * GC, GC, q, d, s);
        const uint8_t *w = want + r * per;
        ASSERT_TRUE(!memcmp(q, w, GC));
        ASSERT_TRUE(!memcmp(d, w + GC, sizeof d));
        ASSERT_TRUE(!memcmp(s, w + GC + sizeof d, sizeof s));
    }
    free(x);
    free(want);
}

/* ---- kernels ---- */

/* A [rows, cols] Q4_K matrix of random valid blocks: every scale/min bit pattern, codes
 * 0..15, fp16 d and dmin in [1e-3, 1e-2) (some rows' dmin 0). */
static tsr_tensor make_q4k(int64_t rows, int64_t cols) {
    int64_t nb = cols / 256;
    uint8_t *b = tsr_malloc((size_t)(rows * nb) * 144);
    for (int64_t i = 0; i < rows * nb; i++) {
        uint8_t *o = b + i * 144;
        for (int k = 0; k < 144; k++) o[k] = (uint8_t)urand();
        uint16_t d = tsr_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand()));
        uint16_t m = (i / nb) % 5 == 3 ? 0 : tsr_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand()));
        o[0] = (uint8_t)d;
        o[1] = (uint8_t)(d >> 8);
        o[2] = (uint8_t)m;
        o[3] = (uint8_t)(m >> 8);
    }
    tsr_tensor q = {.dtype = TSR_Q4_K, .rows = rows, .cols = cols};
    void *p = tsr_malloc(tsr_tensor_bytes(&q));
    tsr_q4k_pack_gguf(b, rows, cols, p);
    tsr_free(b);
    q.data = p;
    return q;
}

typedef struct qact {
    int8_t *qs;
    float *d;
    int32_t *s;
} qact;

static qact make_act(const float *x, int64_t n, int64_t cols) {
    size_t nb = (size_t)(n * cols / 256);
    qact a = {tsr_malloc((size_t)(n * cols)), tsr_malloc(nb * 4), tsr_malloc(nb * 8 * 4)};
    for (int64_t i = 0; i < n; i++)
        tsr__q4k_quantize_act(x + i * cols, cols, a.qs + i * cols, a.d + i * cols / 256,
                              a.s + i * cols / 32);
    return a;
}

static void free_act(qact *a) {
    tsr_free(a->qs);
    tsr_free(a->d);
    tsr_free(a->s);
}

/* Row r for token i in double: the dequantized weights times d_x * x_q (the same products
 * as the integer formulation, summed exactly enough). */
static double exact_row(const tsr_tensor *w, const qact *a, int i, int64_t r, double *mag) {
    int64_t cols = w->cols;
    float *deq = tsr_malloc((size_t)cols * 4);
    tsr_q4k_dequant_row(w->data, cols, r, deq);
    double e = 0;
    *mag = 0;
    for (int64_t k = 0; k < cols; k++) {
        double p = (double)deq[k] * a->d[(i * cols + k) / 256] * a->qs[i * cols + k];
        e += p;
        *mag += fabs(p);
    }
    tsr_free(deq);
    return e;
}

typedef struct gemv_case {
    const tsr_tensor *w;
    const qact *a;
} gemv_case;

static void gemv_call(const void *kern, const void *ctx, int64_t g0, int64_t g1, int nx,
                      const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                      int64_t ldp) {
    const gemv_case *c = ctx;
    ((const tsr__q4k_kernels *)kern)->gemv(c->w->data, c->w->cols / 256, c->w->rows, g0, g1,
                                           c->a->qs, c->a->d, c->a->s, nx, bseg, n_parts, sum,
                                           y, ldy, ldp);
}

static double exact_call(const void *ctx, int i, int64_t r, double *mag) {
    const gemv_case *c = ctx;
    return exact_row(c->w, c->a, i, r, mag);
}

TSR_TEST(test_kernels_equal_scalar) {
    const tsr__q4k_kernels *ref = tsr__q4k_kernels_for(TSR__Q8_SCALAR);
    int64_t rows_list[] = {1, 15, 17, 37};
    int64_t cols_list[] = {256, 768, 2048};
    int tested = 0;
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q4k_kernels *k = tsr__q4k_kernels_for((tsr__q8_variant)v);
        if (!k) {
            fprintf(stderr, "  q4_k variant %d: not on this CPU\n", v);
            continue;
        }
        tested++;
        for (size_t ri = 0; ri < 4; ri++)
            for (size_t ci = 0; ci < 3; ci++) {
                int64_t rows = rows_list[ri], cols = cols_list[ci], nb = cols / 256;
                tsr_tensor w = make_q4k(rows, cols);
                float *x = tsr_malloc((size_t)(4 * cols) * 4);
                for (int64_t i = 0; i < 4 * cols; i++) x[i] = frand() * (i % 97 ? 3.0f : 40.0f);
                qact a = make_act(x, 4, cols);
                gemv_case gc = {&w, &a};
                qt_variant_vs_scalar(k->name, ref, k, gemv_call, &gc, rows, nb,
                                     v == 0 ? exact_call : NULL);
                free_act(&a);
                tsr_free(x);
                tsr_free((void *)w.data);
            }
    }
    fprintf(stderr, "  q4_k: %d variants against scalar (chosen here: %s)\n", tested,
            tsr__q4k_kernels_get()->name);
    ASSERT_TRUE(tested >= 1);
}

/* Rows and columns cut on group and super-block boundaries: the source's blocks. */
TSR_TEST(test_slice) {
    tsr_tensor q = make_q4k(40, 1024);
    int64_t r0 = 5, r1 = 38, c0 = 256, c1 = 768;
    tsr_tensor s = {.dtype = TSR_Q4_K, .rows = r1 - r0, .cols = c1 - c0};
    void *sp = tsr_malloc(tsr_tensor_bytes(&s));
    ASSERT_OK(tsr_q4k_slice(&q, r0, r1, c0, c1, sp));
    for (int64_t r = r0; r < r1; r++) {
        uint8_t full[4 * 144], part[2 * 144];
        tsr_q4k_unpack_row(q.data, 1024, r, full);
        tsr_q4k_unpack_row(sp, c1 - c0, r - r0, part);
        ASSERT_TRUE(!memcmp(part, full + 144, 2 * 144));
    }
    ASSERT_EQ_INT(tsr_q4k_slice(&q, 0, 24, 32, 768, sp), TSR_ERR_INVALID);
    tsr_free(sp);
    tsr_free((void *)q.data);
}

/* The backends: matmul (n 1..5 and a prefill of 40) and matmul_parts against the scalar
 * kernel's rows computed directly; cpu (1 and 2 threads) and cpu-fenced give its bits; a
 * part boundary inside a super-block is refused. */
TSR_TEST(test_backends) {
    qt_backends bs;
    qt_backends_open(&bs);
    ASSERT_TRUE(bs.n >= 2);
    const tsr__q4k_kernels *ref = tsr__q4k_kernels_for(TSR__Q8_SCALAR);
    int64_t shapes[][2] = {{37, 768}, {300, 512}};
    for (int si = 0; si < 2; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1], nb = cols / 256;
        tsr_tensor w = make_q4k(rows, cols);
        int ns[] = {1, 2, 3, 5, 40};
        for (int ni = 0; ni < 5; ni++) {
            int64_t n = ns[ni];
            float *x = tsr_malloc((size_t)(n * cols) * 4);
            for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
            qact a = make_act(x, n, cols);
            int32_t seg[4] = {0, 256, 256, (int32_t)cols};
            int32_t bseg[4] = {0, 1, 1, (int32_t)nb};
            float *want = tsr_malloc((size_t)(n * rows) * 4);
            float *wantp = tsr_malloc((size_t)(3 * n * rows) * 4);
            int32_t whole[2] = {0, (int32_t)nb};
            for (int64_t i = 0; i < n; i++) {
                ref->gemv(w.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                          a.s + i * nb * 8, 1, whole, 1, true, want + i * rows, rows, 0);
                ref->gemv(w.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                          a.s + i * nb * 8, 1, bseg, 3, false, wantp + i * rows, rows, n * rows);
            }
            qt_backends_agree(&bs, &w, x, n, seg, 128, want, wantp);
            free_act(&a);
            tsr_free(want);
            tsr_free(wantp);
            tsr_free(x);
        }
        tsr_free((void *)w.data);
    }
    qt_backends_close(&bs);
}

/* ---- the tiny Q4_K llama against its f32 expansion ---- */

/* Greedy continuation of ids[0..n) for steps tokens (the model's own choices fed back). */
static tsr_status greedy(tsr_engine *e, const int32_t *ids, int n, int steps, int V,
                         float *logits, int32_t *out) {
    e->kv->ops->seq_free(e->kv, 0);
    TSR_TRY(e->kv->ops->seq_add(e->kv, 0));
    tsr_batch_seq s = {.seq = 0, .tokens = ids, .n_tokens = n, .want_logits = true};
    int got = 0;
    TSR_TRY(tsr_forward_run(e->fwd, e->kv, &s, 1, logits, &got));
    for (int i = 0; i < steps; i++) {
        out[i] = qt_argmax(logits, V);
        if (i + 1 == steps) break;
        tsr_batch_seq t = {.seq = 0, .tokens = &out[i], .n_tokens = 1, .want_logits = true};
        TSR_TRY(tsr_forward_run(e->fwd, e->kv, &t, 1, logits, &got));
    }
    return TSR_OK;
}

/* The expected quantization effect: native Q4_K quantizes the activations to 8 bits per 256
 * (Q8_K, llama.cpp's W4A8), the expansion keeps them f32; the weights are the same values.
 * Measured (the test prints it): max |logit diff| 0.047 against a logit sd of 7.1 (0.66 %),
 * top-1 16/16 teacher-forced, greedy 24/24 (this random model repeats one token); the bound
 * (5 % of the sd) catches a broken kernel or layout, which moves logits by whole units. */
#define TOL_LOGIT_REL 0.05 /* max |diff| / the logits' standard deviation */
#define STEPS 24

TSR_TEST(test_tiny_model_native_vs_expanded) {
    tsr_model *mq, *mf;
    ASSERT_OK(tsr_model_load(DATA "tiny_q4k.gguf", &mq));
    setenv("TSR_GGUF_DEQUANT", "1", 1);
    tsr_status ls = tsr_model_load(DATA "tiny_q4k.gguf", &mf);
    unsetenv("TSR_GGUF_DEQUANT");
    ASSERT_OK(ls);
    ASSERT_EQ_INT(mq->cfg.dtype, TSR_Q4_K);
    ASSERT_EQ_INT(mq->tok_emb.dtype, TSR_Q4_K);
    for (int l = 0; l < mq->cfg.n_layers; l++) {
        ASSERT_EQ_INT(mq->layers[l].wq.dtype, TSR_Q4_K);
        ASSERT_EQ_INT(mq->layers[l].wo.dtype, TSR_Q4_K);
        ASSERT_EQ_INT(mq->layers[l].w_down.dtype, TSR_Q4_K);
    }
    ASSERT_EQ_INT(mf->layers[0].wq.dtype, TSR_F32);
    int V = mq->cfg.vocab_size, N = 16;
    tsr_engine *eq = qt_engine(mq, N + STEPS), *ef = qt_engine(mf, N + STEPS);
    ASSERT_TRUE(eq && ef);
    int32_t ids[16] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104};
    float *lq = tsr_malloc((size_t)N * (size_t)V * 4), *lf = tsr_malloc((size_t)N * (size_t)V * 4);
    ASSERT_OK(qt_all_logits(eq, ids, N, lq));
    ASSERT_OK(qt_all_logits(ef, ids, N, lf));
    double worst = 0, var = 0, mean = 0;
    int top1 = 0;
    for (int r = 0; r < N; r++) {
        const float *a = lq + (size_t)r * V, *b = lf + (size_t)r * V;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)a[v] - b[v]);
            if (!(d <= worst)) worst = d;
            mean += b[v];
        }
        top1 += qt_argmax(a, V) == qt_argmax(b, V);
    }
    mean /= (double)N * V;
    for (int i = 0; i < N * V; i++) var += (lf[i] - mean) * (lf[i] - mean);
    double sd = sqrt(var / ((double)N * V));
    int32_t gq[STEPS], gf[STEPS];
    ASSERT_OK(greedy(eq, ids, N, STEPS, V, lq, gq));
    ASSERT_OK(greedy(ef, ids, N, STEPS, V, lf, gf));
    int same = 0;
    while (same < STEPS && gq[same] == gf[same]) same++;
    fprintf(stderr, "  tiny Q4_K llama, native vs f32 expansion: max abs logit diff %.3g (logit "
            "sd %.3g, ratio %.3g, tol %g), top-1 %d/%d, greedy %d/%d tokens equal\n", worst, sd,
            worst / sd, TOL_LOGIT_REL, top1, N, same, STEPS);
    tsr_free(lq);
    tsr_free(lf);
    tsr_engine_destroy(eq);
    tsr_engine_destroy(ef);
    tsr_model_destroy(mq);
    tsr_model_destroy(mf);
    ASSERT_TRUE(worst <= TOL_LOGIT_REL * sd);
    ASSERT_EQ_INT(top1, N);
    ASSERT_EQ_INT(same, STEPS);
}

/* head_dim 64, hidden 512 over 4 heads: wo's and w_down's reduction parts cut super-blocks,
 * so those two run as Q4_1 (tsr_q4k_to_q4_1), the rest stays Q4_K; the model runs, and its
 * logits stay near the f32 expansion's. Measured: max |diff| 0.129 against a logit rms of
 * 1.66 (7.8 %; 0.086 with wo and w_down in f32 instead: the Q4_1 pair adds its 8-bit
 * activations per 32), top-1 8/8; a wrong conversion moves logits by units. */
#define TOL_HD64_REL 0.15
TSR_TEST(test_ineligible_as_q4_1) {
    tsr_model *m;
    ASSERT_OK(tsr_model_load(DATA "tiny_q4k_hd64.gguf", &m));
    ASSERT_EQ_INT(m->cfg.head_dim, 64);
    ASSERT_EQ_INT(m->cfg.dtype, TSR_Q4_K);
    const tsr_layer_weights *w = &m->layers[0];
    ASSERT_EQ_INT(w->wq.dtype, TSR_Q4_K);
    ASSERT_EQ_INT(w->w_gate.dtype, TSR_Q4_K);
    ASSERT_EQ_INT(w->wo.dtype, TSR_Q4_1);
    ASSERT_EQ_INT(w->w_down.dtype, TSR_Q4_1);
    tsr_model *mf;
    setenv("TSR_GGUF_DEQUANT", "1", 1);
    tsr_status ls = tsr_model_load(DATA "tiny_q4k_hd64.gguf", &mf);
    unsetenv("TSR_GGUF_DEQUANT");
    ASSERT_OK(ls);
    tsr_engine *e = qt_engine(m, 8), *ef = qt_engine(mf, 8);
    ASSERT_TRUE(e && ef);
    int32_t ids[8] = {72, 101, 108, 108, 111, 44, 32, 119};
    int V = m->cfg.vocab_size;
    float *l = tsr_malloc((size_t)8 * (size_t)V * 4), *lf = tsr_malloc((size_t)8 * (size_t)V * 4);
    ASSERT_OK(qt_all_logits(e, ids, 8, l));
    ASSERT_OK(qt_all_logits(ef, ids, 8, lf));
    double worst = 0, var = 0;
    int top1 = 0;
    for (int i = 0; i < 8 * V; i++) {
        double d = fabs((double)l[i] - lf[i]);
        if (!(d <= worst)) worst = d;
        var += (double)lf[i] * lf[i];
    }
    for (int r = 0; r < 8; r++) top1 += qt_argmax(l + r * V, V) == qt_argmax(lf + r * V, V);
    double rms = sqrt(var / (8.0 * V));
    fprintf(stderr, "  hd64 (wo, w_down as Q4_1) vs f32 expansion: max abs logit diff %.3g "
            "(logit rms %.3g, ratio %.3g, tol %g), top-1 %d/8\n", worst, rms, worst / rms,
            TOL_HD64_REL, top1);
    ASSERT_TRUE(worst <= TOL_HD64_REL * rms);
    ASSERT_EQ_INT(top1, 8);
    tsr_free(l);
    tsr_free(lf);
    tsr_engine_destroy(e);
    tsr_engine_destroy(ef);
    tsr_model_destroy(m);
    tsr_model_destroy(mf);
}

/* tsr_q4k_to_q4_1 on w_q4k.bin: each Q4_1 value within fp16's rounding of d * sc and
 * dmin * m of the package's, codes unchanged (the values equal wherever both products are
 * fp16 numbers: d * 1 and dmin * 0 in the edge blocks). */
TSR_TEST(test_to_q4_1) {
    size_t nq, nd;
    uint8_t *blocks = read_all(DATA "w_q4k.bin", &nq);
    float *deq = read_all(DATA "w_deq.f32", &nd);
    ASSERT_TRUE(blocks && deq);
    uint8_t q41[GC / 32 * 20];
    int exact = 0;
    for (int r = 0; r < GR; r++) {
        ASSERT_TRUE(tsr_q4k_to_q4_1(blocks + r * GNB * 144, GC, q41));
        for (int b = 0; b < GC / 32; b++) {
            const uint8_t *o = q41 + b * 20;
            float d = tsr_f16_to_f32((uint16_t)(o[0] | o[1] << 8));
            float m = tsr_f16_to_f32((uint16_t)(o[2] | o[3] << 8));
            for (int k = 0; k < 32; k++) {
                int q = k < 16 ? o[4 + k] & 15 : o[4 + k - 16] >> 4;
                float v = d * (float)q + m, e = deq[r * GC + b * 32 + k];
                /* fp16 keeps 11 bits: each product within 2^-11 of itself */
                double tol = ldexp(fabs(d) * 15 + fabs(m), -10) + 1e-7;
                if (!(fabs(v - e) <= tol))
                    TSR_FAIL_("row %d block %d col %d: %.9g vs gguf %.9g (tol %.3g)", r, b, k,
                              (double)v, (double)e, tol);
                exact += v == e;
            }
        }
    }
    fprintf(stderr, "  q4_k -> q4_1: %d of %d values equal the package's\n", exact, GR * GC);
    free(blocks);
    free(deq);
}

TSR_TEST_MAIN(test_repack_and_dequant, test_types_gguf, test_act_quant, test_kernels_equal_scalar,
              test_slice, test_backends, test_tiny_model_native_vs_expanded,
              test_ineligible_as_q4_1, test_to_q4_1)
