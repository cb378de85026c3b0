/* Q5_K weights: GGUF blocks repacked into 32-column blocks and dequantized as the `gguf`
 * package does (tests/data/q5k, tools/make_q5k_testdata.py; tests/data/gguf/types.gguf's
 * Q5_K tensor); slices; every kernel variant against the scalar reference (bits) for nx 1..4,
 * odd shapes and parts, the scalar reference against a double sum over the dequantized
 * weights and the Q8_0 activations; the cpu and cpu-fenced backends; a tiny llama mixed as
 * llama.cpp's Q5_K_M (wo's and w_down's reduction parts 64 and 128 columns) natively against
 * its f32 expansion; GGUF's Q5_0 and Q5_1 loaded into the Q5_K layout (w_q5_0.bin,
 * w_q5_1.bin, tiny_q5_01.gguf) likewise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_q5k_internal.h"
#include "runtime/engine/engine.h"
#include "runtime/format/gguf.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "memory/kv_cache.h"
#include "tests/quant32_test_util.h"
#include "tests/test.h"

#define DATA TSR_SOURCE_DIR "/tests/data/q5k/"

enum { GR = 37, GC = 768, GNB = GC / 256 };

/* w_q5k.bin repacked (rows 17 and 37: padded last groups) and dequantized to the package's
 * values bit for bit. */
TSR_TEST(test_repack_and_dequant) {
    size_t nq, nd;
    uint8_t *blocks = read_all(DATA "w_q5k.bin", &nq);
    float *deq = read_all(DATA "w_deq.f32", &nd);
    ASSERT_TRUE(blocks && deq);
    ASSERT_EQ_INT((int)nq, GR * GNB * TSR_Q5K_GGUF_BLOCK_BYTES);
    ASSERT_EQ_INT((int)nd, GR * GC * 4);
    for (int rows = 17; rows <= GR; rows += 20) {
        tsr_tensor q = {.dtype = TSR_Q5_K, .rows = rows, .cols = GC};
        ASSERT_EQ_INT((int)tsr_tensor_bytes(&q), (rows + 15) / 16 * 16 * (GC / 32) * 26);
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_TRUE(packed);
        tsr_q5k_pack_gguf(blocks, rows, GC, packed);
        for (int r = 0; r < rows; r++) {
            float got[GC];
            tsr_q5k_dequant_row(packed, GC, r, got);
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

/* types.gguf's Q5_K tensor (random bytes), as test_gguf's dequantization check. */
TSR_TEST(test_types_gguf) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(TSR_SOURCE_DIR "/tests/data/gguf/types.gguf", &g));
    size_t n;
    uint8_t *raw = read_all(TSR_SOURCE_DIR "/tests/data/gguf/types_expected.f32", &n);
    ASSERT_TRUE(raw && n == g->n_tensors * 512 * 4);
    int seen = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tsr_gguf_tensor *tt = &g->tensors[i];
        if (tt->type != TSR_GGML_Q5_K) continue;
        tsr_tensor q = {.dtype = TSR_Q5_K, .rows = 2, .cols = 256};
        void *packed = tsr_malloc(tsr_tensor_bytes(&q));
        tsr_q5k_pack_gguf(tt->data, 2, 256, packed);
        for (int r = 0; r < 2; r++) {
            float got[256];
            tsr_q5k_dequant_row(packed, 256, r, got);
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

/* GGUF's Q5_0 and Q5_1 (w_q5_0.bin, w_q5_1.bin: quantized by the package, edge blocks):
 * repacked into the Q5_K layout and dequantized to the package's values (a zero's sign aside:
 * Q5_0's d q - 16 d is +0 where d (q - 16) may be -0), and dequantized by the GGUF reader
 * (the fallback path) to them bit for bit. */
TSR_TEST(test_q5_0_q5_1) {
    enum { R = 37, C = 160 };
    for (int q51 = 0; q51 <= 1; q51++) {
        size_t nq, nd, bb = q51 ? TSR_Q5_1_BLOCK_BYTES : TSR_Q5_0_BLOCK_BYTES;
        uint8_t *blocks = read_all(q51 ? DATA "w_q5_1.bin" : DATA "w_q5_0.bin", &nq);
        float *deq = read_all(q51 ? DATA "w_q5_1.f32" : DATA "w_q5_0.f32", &nd);
        ASSERT_TRUE(blocks && deq);
        ASSERT_EQ_INT((int)nq, R * (C / 32) * (int)bb);
        ASSERT_EQ_INT((int)nd, R * C * 4);
        tsr_tensor q = {.dtype = TSR_Q5_K, .rows = R, .cols = C};
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        float *viagguf = tsr_malloc((size_t)R * C * 4);
        ASSERT_TRUE(packed && viagguf);
        tsr_q5k_pack_q5(blocks, q51, R, C, packed);
        tsr_gguf fake = {.path = "w_q5.bin"};
        tsr_gguf_tensor t = {.name = "w", .n_dims = 2, .ne = {C, R, 1, 1},
                             .type = q51 ? TSR_GGML_Q5_1 : TSR_GGML_Q5_0, .nbytes = nq,
                             .numel = (int64_t)R * C, .data = blocks};
        ASSERT_OK(tsr_gguf_dequant(&fake, &t, TSR_F32, viagguf));
        for (int r = 0; r < R; r++) {
            float got[C];
            tsr_q5k_dequant_row(packed, C, r, got);
            for (int k = 0; k < C; k++) {
                const float *e = &deq[r * C + k];
                if (!(got[k] == *e) || memcmp(&viagguf[r * C + k], e, 4))
                    TSR_FAIL_("Q5_%d row %d col %d: %.9g (repacked), %.9g (reader) vs gguf "
                              "%.9g", q51, r, k, (double)got[k], (double)viagguf[r * C + k],
                              (double)*e);
            }
        }
        tsr_free(viagguf);
        tsr_free(packed);
        free(blocks);
        free(deq);
    }
}

/* ---- kernels ---- */

/* A [rows, cols] Q5_K matrix of random GGUF blocks (every code, scale, min and high-bit
 * pattern), fp16 d and dmin in [1e-3, 1e-2) (some rows' dmin 0). */
static tsr_tensor make_q5k(int64_t rows, int64_t cols) {
    int64_t nb = cols / 256;
    uint8_t *b = tsr_malloc((size_t)(rows * nb) * TSR_Q5K_GGUF_BLOCK_BYTES);
    for (int64_t i = 0; i < rows * nb; i++) {
        uint8_t *o = b + i * TSR_Q5K_GGUF_BLOCK_BYTES;
        for (int k = 0; k < TSR_Q5K_GGUF_BLOCK_BYTES; k++) o[k] = (uint8_t)urand();
        uint16_t d = tsr_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand()));
        uint16_t m = (i / nb) % 5 == 3 ? 0
                                       : tsr_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand()));
        o[0] = (uint8_t)d;
        o[1] = (uint8_t)(d >> 8);
        o[2] = (uint8_t)m;
        o[3] = (uint8_t)(m >> 8);
    }
    tsr_tensor q = {.dtype = TSR_Q5_K, .rows = rows, .cols = cols};
    void *p = tsr_malloc(tsr_tensor_bytes(&q));
    tsr_q5k_pack_gguf(b, rows, cols, p);
    tsr_free(b);
    q.data = p;
    return q;
}

TSR_TEST(test_kernels_equal_scalar) {
    const tsr__q5k_kernels *ref = tsr__q5k_kernels_for(TSR__Q8_SCALAR);
    int64_t rows_list[] = {1, 15, 17, 37};
    int64_t cols_list[] = {256, 768, 2048};
    int tested = 0;
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q5k_kernels *k = tsr__q5k_kernels_for((tsr__q8_variant)v);
        if (!k) {
            fprintf(stderr, "  q5_k variant %d: not on this CPU\n", v);
            continue;
        }
        tested++;
        for (size_t ri = 0; ri < 4; ri++)
            for (size_t ci = 0; ci < 3; ci++) {
                int64_t rows = rows_list[ri], cols = cols_list[ci];
                tsr_tensor w = make_q5k(rows, cols);
                float *x = tsr_malloc((size_t)(4 * cols) * 4);
                for (int64_t i = 0; i < 4 * cols; i++) x[i] = frand() * (i % 97 ? 3.0f : 40.0f);
                /* a block whose largest code is -127 and -32 weights: the int16 sums' bound */
                for (int64_t i = 0; i < 32; i++) x[cols + 64 + i] = -1.0f;
                qt_qact a = qt_qact_make(x, 4, cols, NULL);
                qt_case32 gc = {&w, &a, tsr_q5k_dequant_row};
                qt_variant_vs_scalar(k->name, &ref->gemv, &k->gemv, qt_case32_gemv, &gc, rows,
                                     cols / 32, v == 0 ? qt_case32_exact : NULL);
                qt_qact_free(&a);
                tsr_free(x);
                tsr_free((void *)w.data);
            }
    }
    fprintf(stderr, "  q5_k: %d variants against scalar (chosen here: %s)\n", tested,
            tsr__q5k_kernels_get()->name);
    ASSERT_TRUE(tested >= 1);
}

/* The int16 sums at their bound: every code 31 (or 0) and every activation code -127 or
 * 127, scales and mins 63: each variant gives the scalar's bits and the exact value. */
TSR_TEST(test_extreme_codes) {
    int64_t rows = 16, cols = 256;
    uint8_t blk[TSR_Q5K_GGUF_BLOCK_BYTES * 16];
    memset(blk, 0, sizeof blk);
    for (int r = 0; r < 16; r++) {
        uint8_t *o = blk + r * TSR_Q5K_GGUF_BLOCK_BYTES;
        memset(o + 4, 0xff, 12); /* every scale and min 63 */
        if (r < 12) memset(o + 16, 0xff, 160); /* codes 31 */
        uint16_t d = tsr_f32_to_f16(0.01f), m = tsr_f32_to_f16(r % 2 ? 0.02f : 0.0f);
        o[0] = (uint8_t)d;
        o[1] = (uint8_t)(d >> 8);
        o[2] = (uint8_t)m;
        o[3] = (uint8_t)(m >> 8);
    }
    tsr_tensor w = {.dtype = TSR_Q5_K, .rows = rows, .cols = cols};
    void *p = tsr_malloc(tsr_tensor_bytes(&w));
    tsr_q5k_pack_gguf(blk, rows, cols, p);
    w.data = p;
    float x[4 * 256];
    for (int i = 0; i < 4 * 256; i++)
        x[i] = i < 512 ? (i < 256 ? 5.0f : -5.0f) : (i % 2 ? 5.0f : -5.0f);
    qt_qact a = qt_qact_make(x, 4, cols, NULL);
    qt_case32 gc = {&w, &a, tsr_q5k_dequant_row};
    const tsr__q5k_kernels *ref = tsr__q5k_kernels_for(TSR__Q8_SCALAR);
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q5k_kernels *k = tsr__q5k_kernels_for((tsr__q8_variant)v);
        if (k)
            qt_variant_vs_scalar(k->name, &ref->gemv, &k->gemv, qt_case32_gemv, &gc, rows,
                                 cols / 32, qt_case32_exact);
    }
    qt_qact_free(&a);
    tsr_free(p);
}

/* Rows and columns cut on groups and 32-column blocks (inside a GGUF block too). */
TSR_TEST(test_slice) {
    tsr_tensor q = make_q5k(40, 1024);
    int64_t r0 = 5, r1 = 38, c0 = 96, c1 = 736;
    tsr_tensor s = {.dtype = TSR_Q5_K, .rows = r1 - r0, .cols = c1 - c0};
    void *sp = tsr_malloc(tsr_tensor_bytes(&s));
    ASSERT_OK(tsr_q5k_slice(&q, r0, r1, c0, c1, sp));
    for (int64_t r = r0; r < r1; r++) {
        float full[1024], part[1024];
        tsr_q5k_dequant_row(q.data, 1024, r, full);
        tsr_q5k_dequant_row(sp, c1 - c0, r - r0, part);
        ASSERT_TRUE(!memcmp(part, full + c0, (size_t)(c1 - c0) * 4));
    }
    ASSERT_EQ_INT(tsr_q5k_slice(&q, 0, 24, 16, 768, sp), TSR_ERR_INVALID);
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
    const tsr__q5k_kernels *ref = tsr__q5k_kernels_for(TSR__Q8_SCALAR);
    int64_t shapes[][2] = {{37, 768}, {300, 512}};
    for (int si = 0; si < 2; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1], nb = cols / 32;
        tsr_tensor w = make_q5k(rows, cols);
        int ns[] = {1, 2, 3, 5, 40};
        for (int ni = 0; ni < 5; ni++) {
            int64_t n = ns[ni];
            float *x = tsr_malloc((size_t)(n * cols) * 4);
            for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
            qt_qact a = qt_qact_make(x, n, cols, NULL);
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

/* The expected quantization effect: natively the activations of the Q5_K and Q6_K matrices
 * are quantized to 8 bits per 32 columns, the expansion keeps them f32; the weights are the
 * same values. A broken kernel or layout moves logits by their whole size (ratios near 1). */
#define TOL_LOGIT_REL 0.1

/* A Q5_K_M-like mix: attn_v, ffn_down and the untied output Q6_K, the rest (the embedding
 * too) Q5_K; wo's reduction parts are 64 columns and w_down's 128. */
TSR_TEST(test_mixed_model) {
    qt_expect_dtypes(DATA "tiny_q5k.gguf", TSR_Q5_K, TSR_Q5_K, TSR_Q6_K, TSR_Q5_K, TSR_Q5_K,
                     TSR_Q6_K, TSR_Q6_K);
    qt_native_vs_expanded(DATA "tiny_q5k.gguf", "tiny Q5_K/Q6_K llama", TOL_LOGIT_REL);
}

/* A llama of width 384 as llama.cpp's K-quant files store one (their fallback for widths not
 * a multiple of 256): Q5_0 and Q5_1 matrices (the embedding Q5_1, the output Q5_0) run as
 * Q5_K, attn_v Q8_0, ffn_down Q6_K. */
TSR_TEST(test_q5_01_model) {
    qt_expect_dtypes(DATA "tiny_q5_01.gguf", TSR_Q5_K, TSR_Q5_K, TSR_Q5_K, TSR_Q5_K, TSR_Q5_K,
                     TSR_Q8_0, TSR_Q6_K);
    qt_native_vs_expanded(DATA "tiny_q5_01.gguf", "tiny Q5_0/Q5_1 llama", TOL_LOGIT_REL);
}

TSR_TEST_MAIN(test_repack_and_dequant, test_types_gguf, test_q5_0_q5_1, test_kernels_equal_scalar,
              test_extreme_codes, test_slice, test_backends, test_mixed_model, test_q5_01_model)
