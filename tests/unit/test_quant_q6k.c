/* Q6_K weights: GGUF blocks repacked into 32-column blocks and dequantized as the `gguf`
 * package does (tests/data/q6k, tools/make_q6k_testdata.py; tests/data/gguf/types.gguf's
 * Q6_K tensor); slices; every kernel variant against the scalar reference (bits) for nx 1..4,
 * odd shapes and parts, the scalar reference against a double sum over the dequantized
 * weights and the Q8_0 activations; the cpu and cpu-fenced backends; two tiny llamas with
 * Q6_K matrices (a Q4_K_M-like mix, and every matrix Q6_K where wo's and w_down's reduction
 * parts are 64 and 128 columns) natively against their f32 expansion. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_q6k_internal.h"
#include "runtime/engine/engine.h"
#include "runtime/format/gguf.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "memory/kv_cache.h"
#include "tests/quant32_test_util.h"
#include "tests/test.h"

#define DATA TSR_SOURCE_DIR "/tests/data/q6k/"

enum { GR = 37, GC = 768, GNB = GC / 256 };

/* w_q6k.bin repacked (rows 17 and 37: padded last groups) and dequantized to the package's
 * values bit for bit. */
TSR_TEST(test_repack_and_dequant) {
    size_t nq, nd;
    uint8_t *blocks = read_all(DATA "w_q6k.bin", &nq);
    float *deq = read_all(DATA "w_deq.f32", &nd);
    ASSERT_TRUE(blocks && deq);
    ASSERT_EQ_INT((int)nq, GR * GNB * TSR_Q6K_GGUF_BLOCK_BYTES);
    ASSERT_EQ_INT((int)nd, GR * GC * 4);
    for (int rows = 17; rows <= GR; rows += 20) {
        tsr_tensor q = {.dtype = TSR_Q6_K, .rows = rows, .cols = GC};
        ASSERT_EQ_INT((int)tsr_tensor_bytes(&q), (rows + 15) / 16 * 16 * (GC / 32) * 28);
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_TRUE(packed);
        tsr_q6k_pack_gguf(blocks, rows, GC, packed);
        for (int r = 0; r < rows; r++) {
            float got[GC];
            tsr_q6k_dequant_row(packed, GC, r, got);
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

/* types.gguf's Q6_K tensor (random bytes), as test_gguf's dequantization check. */
TSR_TEST(test_types_gguf) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(TSR_SOURCE_DIR "/tests/data/gguf/types.gguf", &g));
    size_t n;
    uint8_t *raw = read_all(TSR_SOURCE_DIR "/tests/data/gguf/types_expected.f32", &n);
    ASSERT_TRUE(raw && n == g->n_tensors * 512 * 4);
    int seen = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tsr_gguf_tensor *tt = &g->tensors[i];
        if (tt->type != TSR_GGML_Q6_K) continue;
        tsr_tensor q = {.dtype = TSR_Q6_K, .rows = 2, .cols = 256};
        void *packed = tsr_malloc(tsr_tensor_bytes(&q));
        tsr_q6k_pack_gguf(tt->data, 2, 256, packed);
        for (int r = 0; r < 2; r++) {
            float got[256];
            tsr_q6k_dequant_row(packed, 256, r, got);
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

/* ---- kernels ---- */

/* A [rows, cols] Q6_K matrix of random GGUF blocks (every code, scale and high-bit pattern),
 * fp16 d in [1e-3, 1e-2). */
static tsr_tensor make_q6k(int64_t rows, int64_t cols) {
    int64_t nb = cols / 256;
    uint8_t *b = tsr_malloc((size_t)(rows * nb) * TSR_Q6K_GGUF_BLOCK_BYTES);
    for (int64_t i = 0; i < rows * nb; i++) {
        uint8_t *o = b + i * TSR_Q6K_GGUF_BLOCK_BYTES;
        for (int k = 0; k < TSR_Q6K_GGUF_BLOCK_BYTES; k++) o[k] = (uint8_t)urand();
        uint16_t d = tsr_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand()));
        o[208] = (uint8_t)d;
        o[209] = (uint8_t)(d >> 8);
    }
    tsr_tensor q = {.dtype = TSR_Q6_K, .rows = rows, .cols = cols};
    void *p = tsr_malloc(tsr_tensor_bytes(&q));
    tsr_q6k_pack_gguf(b, rows, cols, p);
    tsr_free(b);
    q.data = p;
    return q;
}

TSR_TEST(test_kernels_equal_scalar) {
    const tsr__q6k_kernels *ref = tsr__q6k_kernels_for(TSR__Q8_SCALAR);
    int64_t rows_list[] = {1, 15, 17, 37};
    int64_t cols_list[] = {256, 768, 2048};
    int tested = 0;
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q6k_kernels *k = tsr__q6k_kernels_for((tsr__q8_variant)v);
        if (!k) {
            fprintf(stderr, "  q6_k variant %d: not on this CPU\n", v);
            continue;
        }
        tested++;
        for (size_t ri = 0; ri < 4; ri++)
            for (size_t ci = 0; ci < 3; ci++) {
                int64_t rows = rows_list[ri], cols = cols_list[ci];
                tsr_tensor w = make_q6k(rows, cols);
                float *x = tsr_malloc((size_t)(4 * cols) * 4);
                for (int64_t i = 0; i < 4 * cols; i++) x[i] = frand() * (i % 97 ? 3.0f : 40.0f);
                /* a block whose largest code is -127 and -32 weights: the int16 sums' bound */
                for (int64_t i = 0; i < 32; i++) x[cols + 64 + i] = -1.0f;
                qt_qact a = qt_qact_make(x, 4, cols, tsr__q6k_act_sums);
                qt_case32 gc = {&w, &a, tsr_q6k_dequant_row};
                qt_variant_vs_scalar(k->name, &ref->gemv, &k->gemv, qt_case32_gemv, &gc, rows,
                                     cols / 32, v == 0 ? qt_case32_exact : NULL);
                qt_qact_free(&a);
                tsr_free(x);
                tsr_free((void *)w.data);
            }
    }
    fprintf(stderr, "  q6_k: %d variants against scalar (chosen here: %s)\n", tested,
            tsr__q6k_kernels_get()->name);
    ASSERT_TRUE(tested >= 1);
}

/* The int16 sums at their bound: every code -32 (q = -32) and every activation code -127
 * or 127, scales -128 and 127: each variant gives the scalar's bits and the exact value. */
TSR_TEST(test_extreme_codes) {
    int64_t rows = 16, cols = 256;
    uint8_t blk[TSR_Q6K_GGUF_BLOCK_BYTES * 16];
    memset(blk, 0, sizeof blk); /* codes 0: q = -32 */
    for (int r = 0; r < 16; r++) {
        uint8_t *o = blk + r * TSR_Q6K_GGUF_BLOCK_BYTES;
        for (int k = 0; k < 16; k++) o[192 + k] = (uint8_t)(r % 2 ? 0x80 : 0x7f);
        if (r >= 8) memset(o, 0xff, 192); /* codes 63: q = 31 */
        uint16_t d = tsr_f32_to_f16(0.01f);
        o[208] = (uint8_t)d;
        o[209] = (uint8_t)(d >> 8);
    }
    tsr_tensor w = {.dtype = TSR_Q6_K, .rows = rows, .cols = cols};
    void *p = tsr_malloc(tsr_tensor_bytes(&w));
    tsr_q6k_pack_gguf(blk, rows, cols, p);
    w.data = p;
    float x[4 * 256];
    for (int i = 0; i < 4 * 256; i++) x[i] = i < 512 ? -5.0f : (i % 2 ? 5.0f : -5.0f);
    qt_qact a = qt_qact_make(x, 4, cols, tsr__q6k_act_sums);
    qt_case32 gc = {&w, &a, tsr_q6k_dequant_row};
    const tsr__q6k_kernels *ref = tsr__q6k_kernels_for(TSR__Q8_SCALAR);
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q6k_kernels *k = tsr__q6k_kernels_for((tsr__q8_variant)v);
        if (k)
            qt_variant_vs_scalar(k->name, &ref->gemv, &k->gemv, qt_case32_gemv, &gc, rows,
                                 cols / 32, qt_case32_exact);
    }
    qt_qact_free(&a);
    tsr_free(p);
}

/* Rows and columns cut on groups and 32-column blocks (inside a GGUF block too). */
TSR_TEST(test_slice) {
    tsr_tensor q = make_q6k(40, 1024);
    int64_t r0 = 5, r1 = 38, c0 = 96, c1 = 736;
    tsr_tensor s = {.dtype = TSR_Q6_K, .rows = r1 - r0, .cols = c1 - c0};
    void *sp = tsr_malloc(tsr_tensor_bytes(&s));
    ASSERT_OK(tsr_q6k_slice(&q, r0, r1, c0, c1, sp));
    for (int64_t r = r0; r < r1; r++) {
        float full[1024], part[1024];
        tsr_q6k_dequant_row(q.data, 1024, r, full);
        tsr_q6k_dequant_row(sp, c1 - c0, r - r0, part);
        ASSERT_TRUE(!memcmp(part, full + c0, (size_t)(c1 - c0) * 4));
    }
    ASSERT_EQ_INT(tsr_q6k_slice(&q, 0, 24, 16, 768, sp), TSR_ERR_INVALID);
    tsr_free(sp);
    tsr_free((void *)q.data);
}

/* The backends: matmul (n 1..5 and a prefill of 40) and matmul_parts against the scalar
 * kernel's rows computed directly; cpu (1 and 2 threads) and cpu-fenced give its bits; a
 * part boundary inside a 32-column block is refused. */
TSR_TEST(test_backends) {
    qt_backends bs;
    qt_backends_open(&bs);
    ASSERT_TRUE(bs.n >= 2);
    const tsr__q6k_kernels *ref = tsr__q6k_kernels_for(TSR__Q8_SCALAR);
    int64_t shapes[][2] = {{37, 768}, {300, 512}};
    for (int si = 0; si < 2; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1], nb = cols / 32;
        tsr_tensor w = make_q6k(rows, cols);
        int ns[] = {1, 2, 3, 5, 40};
        for (int ni = 0; ni < 5; ni++) {
            int64_t n = ns[ni];
            float *x = tsr_malloc((size_t)(n * cols) * 4);
            for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
            qt_qact a = qt_qact_make(x, n, cols, tsr__q6k_act_sums);
            int32_t seg[4] = {0, 96, 96, (int32_t)cols};
            int32_t bseg[4] = {0, 3, 3, (int32_t)nb};
            float *want = tsr_malloc((size_t)(n * rows) * 4);
            float *wantp = tsr_malloc((size_t)(3 * n * rows) * 4);
            int32_t whole[2] = {0, (int32_t)nb};
            for (int64_t i = 0; i < n; i++) {
                ref->gemv(w.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                          a.s + i * nb, 1, whole, 1, true, want + i * rows, rows, 0);
                ref->gemv(w.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                          a.s + i * nb, 1, bseg, 3, false, wantp + i * rows, rows, n * rows);
            }
            qt_backends_agree(&bs, &w, x, n, seg, 16, want, wantp);
            qt_qact_free(&a);
            tsr_free(want);
            tsr_free(wantp);
            tsr_free(x);
        }
        tsr_free((void *)w.data);
    }
    qt_backends_close(&bs);
}

/* ---- tiny llamas against their f32 expansion ---- */

/* The expected quantization effect: natively the activations of the Q6_K (and Q4_K)
 * matrices are quantized to 8 bits, the expansion keeps them f32; the weights are the same
 * values. Measured: max |logit diff| 4.9 % of the logits' rms on the mix, 6.0 % on the
 * all-Q6_K model (whose embedding, every matrix and w_down of 128-column parts take 8-bit
 * activations per 32 columns), one top-1 near-tie there. A broken kernel or layout moves
 * logits by their whole size (ratios near 1). */
#define TOL_LOGIT_REL 0.1

/* A Q4_K_M-like mix: attn_v, ffn_down and the untied output Q6_K, the rest Q4_K. */
TSR_TEST(test_mixed_model) {
    tsr_model *m;
    ASSERT_OK(tsr_model_load(DATA "tiny_q6k.gguf", &m));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        ASSERT_EQ_INT(m->layers[l].wv.dtype, TSR_Q6_K);
        ASSERT_EQ_INT(m->layers[l].w_down.dtype, TSR_Q6_K);
        ASSERT_EQ_INT(m->layers[l].wq.dtype, TSR_Q4_K);
    }
    ASSERT_EQ_INT(m->classifier.dtype, TSR_Q6_K);
    ASSERT_EQ_INT(m->cfg.dtype, TSR_Q4_K);
    tsr_model_destroy(m);
    qt_native_vs_expanded(DATA "tiny_q6k.gguf", "tiny Q4_K/Q6_K llama", TOL_LOGIT_REL);
}

/* Every matrix Q6_K, the embedding too; wo's reduction parts are 64 columns and w_down's
 * 128, which Q6_K's 32-column blocks take (Q4_K's super-blocks do not). */
TSR_TEST(test_all_q6k_hd64) {
    qt_expect_dtypes(DATA "tiny_q6k_hd64.gguf", TSR_Q6_K, TSR_Q6_K, TSR_Q6_K, TSR_Q6_K, TSR_Q6_K,
                     TSR_Q6_K, TSR_Q6_K);
    qt_native_vs_expanded(DATA "tiny_q6k_hd64.gguf", "tiny all-Q6_K llama (head_dim 64)",
                          TOL_LOGIT_REL);
}

TSR_TEST_MAIN(test_repack_and_dequant, test_types_gguf, test_kernels_equal_scalar,
              test_extreme_codes, test_slice, test_backends, test_mixed_model, test_all_q6k_hd64)
