/* 4-bit weights (Q4_0, Q4_1, and GPT-OSS's MXFP4 experts repacked): the quantizer's bytes against the `gguf` package's
 * (tests/data/q4, tools/make_q4_testdata.py); a GGUF's blocks repacked losslessly and
 * dequantized as the package does (tests/data/gguf/types.gguf); slices; every kernel variant
 * against the scalar reference (bits) for nx 1..4 and odd shapes, and the scalar reference
 * against a double-precision sum of the same integers; the cpu and cpu-fenced backends'
 * matmul and matmul_parts on 4-bit weights. MXFP4's exact sums come from the checkpoint
 * layout through the f32 decode of the f32 kernels (tsr__mxfp4_row), not the packing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_q4_internal.h"
#include "runtime/format/gguf.h"
#include "tests/quant_test_util.h"
#include "tests/test.h"

static const tsr_dtype TYPES[3] = {TSR_Q4_0, TSR_Q4_1, TSR_MXFP4};

TSR_TEST(test_quantizer_bytes_and_repack) {
    size_t nf;
    float *w = read_all(TSR_SOURCE_DIR "/tests/data/q8/edge_f32.bin", &nf);
    ASSERT_TRUE(w);
    enum { ROWS = 24, COLS = 96, NB = COLS / 32 };
    ASSERT_EQ_INT((int)nf, ROWS * COLS * 4);
    for (int ti = 0; ti < 2; ti++) {
        tsr_dtype t = TYPES[ti];
        size_t bb = tsr_q4_block_bytes(t), nq;
        uint8_t *want = read_all(t == TSR_Q4_0 ? TSR_SOURCE_DIR "/tests/data/q4/edge_q4_0.bin"
                                               : TSR_SOURCE_DIR "/tests/data/q4/edge_q4_1.bin",
                                 &nq);
        ASSERT_TRUE(want);
        ASSERT_EQ_INT((int)nq, ROWS * NB * (int)bb);
        uint8_t got[ROWS * NB * 20];
        for (int r = 0; r < ROWS; r++) tsr_q4_quantize_blocks(t, w + r * COLS, COLS, got + r * NB * bb);
        for (size_t i = 0; i < nq; i++)
            if (got[i] != want[i])
                TSR_FAIL_("%s: byte %zu (row %zu): %u vs gguf %u", tsr_dtype_name(t), i,
                          i / (NB * bb), got[i], want[i]);
        /* repacked (rows 17 and 24: a padded last group) and back, byte for byte */
        for (int rows = 17; rows <= ROWS; rows += 7) {
            tsr_tensor q = {.dtype = t, .rows = rows, .cols = COLS};
            uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
            ASSERT_TRUE(packed);
            tsr_q4_pack_gguf(t, want, rows, COLS, packed);
            tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = COLS, .data = w};
            uint8_t *packed2 = tsr_malloc(tsr_tensor_bytes(&q));
            ASSERT_OK(tsr_q4_quantize_tensor(&src, t, packed2));
            ASSERT_TRUE(!memcmp(packed, packed2, tsr_tensor_bytes(&q)));
            for (int r = 0; r < rows; r++) {
                uint8_t back[NB * 20];
                tsr_q4_unpack_row(t, packed, COLS, r, back);
                ASSERT_TRUE(!memcmp(back, want + r * NB * bb, NB * bb));
            }
            tsr_free(packed);
            tsr_free(packed2);
        }
        free(want);
    }
    free(w);
}

/* types.gguf's Q4_0 and Q4_1 tensors: repacked and dequantized row by row, the package's
 * values (types_expected.f32, as test_gguf's dequantization check). */
TSR_TEST(test_gguf_dequant) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(TSR_SOURCE_DIR "/tests/data/gguf/types.gguf", &g));
    size_t n;
    uint8_t *raw = read_all(TSR_SOURCE_DIR "/tests/data/gguf/types_expected.f32", &n);
    ASSERT_TRUE(raw && n == g->n_tensors * 512 * 4);
    int seen = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tsr_gguf_tensor *tt = &g->tensors[i];
        if (tt->type != TSR_GGML_Q4_0 && tt->type != TSR_GGML_Q4_1) continue;
        tsr_dtype t = tt->type == TSR_GGML_Q4_0 ? TSR_Q4_0 : TSR_Q4_1;
        tsr_tensor q = {.dtype = t, .rows = 2, .cols = 256};
        void *packed = tsr_malloc(tsr_tensor_bytes(&q));
        tsr_q4_pack_gguf(t, tt->data, 2, 256, packed);
        for (int r = 0; r < 2; r++) {
            float got[256];
            tsr_q4_dequant_row(t, packed, 256, r, got);
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
    ASSERT_EQ_INT(seen, 2);
    free(raw);
    tsr_gguf_close(g);
}

/* ---- MXFP4 ---- */

/* A random MXFP4 matrix in the checkpoint layout: every code, scales around 2^0 (with 0 and
 * 254 at the edges of the first row: the subnormal and the largest finite scale). */
static void make_mx_src(int64_t rows, int64_t cols, uint8_t **blocks, uint8_t **scales) {
    *blocks = tsr_malloc((size_t)(rows * cols / 2));
    *scales = tsr_malloc((size_t)(rows * cols / 32));
    if (!*blocks || !*scales) abort();
    for (int64_t i = 0; i < rows * cols / 2; i++) (*blocks)[i] = (uint8_t)(rand() & 0xff);
    for (int64_t i = 0; i < rows * cols / 32; i++) (*scales)[i] = (uint8_t)(121 + rand() % 12);
    (*scales)[0] = 0;
    if (cols >= 64) (*scales)[1] = 254;
}

/* Packed and dequantized rows are the f32 decode of the checkpoint's rows, and the
 * packing's padding rows are zero (so they add nothing). */
TSR_TEST(test_mxfp4_pack) {
    for (int64_t rows = 15; rows <= 33; rows += 18) {
        int64_t cols = 96;
        uint8_t *blocks, *scales;
        make_mx_src(rows, cols, &blocks, &scales);
        tsr_tensor q = {.dtype = TSR_MXFP4, .rows = rows, .cols = cols};
        ASSERT_EQ_INT((int)tsr_tensor_bytes(&q), (int)(((rows + 15) / 16) * 16 * 3 * 17));
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_TRUE(packed);
        tsr_q4_pack_mxfp4(blocks, scales, rows, cols, packed);
        for (int64_t r = 0; r < rows; r++) {
            float want[96], got[96], got2[96];
            tsr__mxfp4_row(blocks + r * cols / 2, scales + r * cols / 32, cols, want);
            tsr_q4_dequant_row(TSR_MXFP4, packed, cols, r, got);
            q.data = packed;
            tsr_qblocks_row_f32(&q, r, got2);
            for (int k = 0; k < 96; k++) /* by value: the decode keeps -0 (code 8) */
                if (!(want[k] == got[k] && want[k] == got2[k]))
                    TSR_FAIL_("row %d col %d: %.9g %.9g vs decode %.9g", (int)r, k,
                              (double)got[k], (double)got2[k], (double)want[k]);
        }
        tsr_free(packed);
        tsr_free(blocks);
        tsr_free(scales);
    }
}

/* ---- kernels ---- */

/* The source of the last MXFP4 matrix make_q4 made (exact_row reads it). */
static uint8_t *mx_blocks, *mx_scales;

static tsr_tensor make_q4(tsr_dtype t, int64_t rows, int64_t cols) {
    tsr_tensor q = {.dtype = t, .rows = rows, .cols = cols};
    if (t == TSR_MXFP4) {
        tsr_free(mx_blocks);
        tsr_free(mx_scales);
        make_mx_src(rows, cols, &mx_blocks, &mx_scales);
        void *p = tsr_malloc(tsr_tensor_bytes(&q));
        if (!p) abort();
        tsr_q4_pack_mxfp4(mx_blocks, mx_scales, rows, cols, p);
        q.data = p;
        return q;
    }
    float *f = tsr_malloc((size_t)(rows * cols) * 4);
    /* Q4_1's offsets matter: shift half the rows */
    for (int64_t i = 0; i < rows * cols; i++)
        f[i] = frand() * (1.0f + (float)(i % 7)) + ((i / cols) % 2 ? 0.5f : 0.0f);
    void *p = tsr_malloc(tsr_tensor_bytes(&q));
    tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = cols, .data = f};
    if (tsr_q4_quantize_tensor(&src, t, p) != TSR_OK) abort();
    tsr_free(f);
    q.data = p;
    return q;
}

/* Q8_0 activations and Q4_1's block sums */
typedef struct qact {
    int8_t *qs;
    float *d, *m;
    int32_t *s;
} qact;

static qact make_act(const float *x, int64_t n, int64_t cols) {
    size_t nb = (size_t)(n * cols / 32);
    qact a = {tsr_malloc((size_t)(n * cols)), tsr_malloc(nb * 4), tsr_malloc(nb * 4),
              tsr_malloc(nb * 4)};
    for (int64_t i = 0; i < n; i++) {
        tsr__q8_quantize_act(x + i * cols, cols, a.qs + i * cols, a.d + i * cols / 32,
                             a.s + i * cols / 32, a.m + i * cols / 32);
    }
    return a;
}

static void free_act(qact *a) {
    tsr_free(a->qs);
    tsr_free(a->d);
    tsr_free(a->m);
    tsr_free(a->s);
}

/* The exact (double) sum of row r's block products for token i. */
static double exact_row(tsr_dtype t, const tsr_tensor *w, const qact *a, int i, int64_t r,
                        double *mag) {
    int64_t cols = w->cols, nb = cols / 32;
    if (t == TSR_MXFP4) { /* the f32 decode's weights times the int8 activations */
        float wf[5632];
        tsr__mxfp4_row(mx_blocks + r * cols / 2, mx_scales + r * cols / 32, cols, wf);
        double e = 0;
        *mag = 0;
        for (int64_t b = 0; b < nb; b++) {
            double is = 0;
            for (int k = 0; k < 32; k++)
                is += (double)wf[b * 32 + k] * a->qs[i * cols + b * 32 + k];
            double p = is * a->d[i * nb + b];
            e += p;
            *mag += fabs(p);
        }
        return e;
    }
    size_t bb = tsr_q4_block_bytes(t);
    uint8_t blk[5632 / 32 * 20];
    tsr_q4_unpack_row(t, w->data, cols, r, blk);
    double e = 0;
    *mag = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = blk + b * bb, *qs = o + bb - 16;
        double dw = tsr_f16_to_f32((uint16_t)(o[0] | o[1] << 8));
        long is = 0;
        const int8_t *x = a->qs + i * cols + b * 32;
        for (int j = 0; j < 16; j++) {
            int lo = qs[j] & 15, hi = qs[j] >> 4;
            if (t == TSR_Q4_0) {
                lo -= 8;
                hi -= 8;
            }
            is += (long)lo * x[j] + (long)hi * x[j + 16];
        }
        double p = (double)is * dw * a->d[i * nb + b];
        if (t == TSR_Q4_1) {
            double m = tsr_f16_to_f32((uint16_t)(o[2] | o[3] << 8));
            e += m * a->m[i * nb + b];
            *mag += fabs(m * a->m[i * nb + b]);
        }
        e += p;
        *mag += fabs(p);
    }
    return e;
}

typedef struct gemv_case {
    tsr_dtype t;
    const tsr_tensor *w;
    const qact *a;
} gemv_case;

static void gemv_call(const void *kern, const void *ctx, int64_t g0, int64_t g1, int nx,
                      const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                      int64_t ldp) {
    const gemv_case *c = ctx;
    tsr__q4_gemv_for(kern, c->t)(c->w->data, c->w->cols / 32, c->w->rows, g0, g1, c->a->qs,
                                 c->a->d, c->a->s, c->a->m, nx, bseg, n_parts, sum, y, ldy,
                                 ldp);
}

static double exact_call(const void *ctx, int i, int64_t r, double *mag) {
    const gemv_case *c = ctx;
    return exact_row(c->t, c->w, c->a, i, r, mag);
}

TSR_TEST(test_kernels_equal_scalar) {
    const tsr__q4_kernels *ref = tsr__q4_kernels_for(TSR__Q8_SCALAR);
    /* groups 1, 1, 2, 3, 3, 5; qt_variant_vs_scalar splits them in two calls: 33's second
     * call [1, 3) is one pair of groups (the last padded), 70's [2, 5) a pair, then the
     * padded last group alone (the AVX-512 kernel pairs groups for nx >= 2) */
    int64_t rows_list[] = {1, 15, 17, 33, 48, 70};
    int64_t cols_list[] = {32, 96, 768, 2048, 5632};
    int tested = 0;
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q4_kernels *k = tsr__q4_kernels_for((tsr__q8_variant)v);
        if (!k) {
            fprintf(stderr, "  q4 variant %d: not on this CPU\n", v);
            continue;
        }
        tested++;
        for (int ti = 0; ti < 3; ti++) {
            tsr_dtype t = TYPES[ti];
            for (size_t ri = 0; ri < 6; ri++)
                for (size_t ci = 0; ci < 5; ci++) {
                    int64_t rows = rows_list[ri], cols = cols_list[ci], nb = cols / 32;
                    if (rows * cols > 48 * 2048 && rows > 17) continue;
                    tsr_tensor w = make_q4(t, rows, cols);
                    float *x = tsr_malloc((size_t)(4 * cols) * 4);
                    for (int64_t i = 0; i < 4 * cols; i++) x[i] = frand() * 3.0f;
                    qact a = make_act(x, 4, cols);
                    gemv_case gc = {t, &w, &a};
                    char name[64];
                    snprintf(name, sizeof name, "%s %s", k->name, tsr_dtype_name(t));
                    qt_variant_vs_scalar(name, ref, k, gemv_call, &gc, rows, nb,
                                         v == 0 ? exact_call : NULL);
                    free_act(&a);
                    tsr_free(x);
                    tsr_free((void *)w.data);
                }
        }
    }
    ASSERT_TRUE(tested >= 1);
}

/* Rows and columns cut on block boundaries: the source's blocks. */
TSR_TEST(test_slice) {
    for (int ti = 0; ti < 2; ti++) {
        tsr_dtype t = TYPES[ti];
        size_t bb = tsr_q4_block_bytes(t);
        tsr_tensor q = make_q4(t, 40, 128);
        int64_t r0 = 5, r1 = 38, c0 = 32, c1 = 96;
        tsr_tensor s = {.dtype = t, .rows = r1 - r0, .cols = c1 - c0};
        void *sp = tsr_malloc(tsr_tensor_bytes(&s));
        ASSERT_OK(tsr_q4_slice(&q, r0, r1, c0, c1, sp));
        for (int64_t r = r0; r < r1; r++) {
            uint8_t full[4 * 20], part[2 * 20];
            tsr_q4_unpack_row(t, q.data, 128, r, full);
            tsr_q4_unpack_row(t, sp, c1 - c0, r - r0, part);
            ASSERT_TRUE(!memcmp(part, full + bb, 2 * bb));
        }
        ASSERT_EQ_INT(tsr_q4_slice(&q, 0, 24, 16, 96, sp), TSR_ERR_INVALID);
        tsr_free(sp);
        tsr_free((void *)q.data);
    }
}

/* The backends: matmul (n 1..5 and a prefill of 40) and matmul_parts against the scalar
 * kernel's rows computed directly; cpu (1 and 2 threads) and cpu-fenced give its bits. */
TSR_TEST(test_backends) {
    qt_backends bs;
    qt_backends_open(&bs);
    ASSERT_TRUE(bs.n >= 2);
    const tsr__q4_kernels *ref = tsr__q4_kernels_for(TSR__Q8_SCALAR);
    int64_t shapes[][2] = {{37, 96}, {300, 256}};
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 2; si++) {
            tsr_dtype t = TYPES[ti];
            tsr__q4_gemv_fn f0 = tsr__q4_gemv_for(ref, t);
            int64_t rows = shapes[si][0], cols = shapes[si][1], nb = cols / 32;
            tsr_tensor w = make_q4(t, rows, cols);
            int ns[] = {1, 2, 3, 5, 40};
            for (int ni = 0; ni < 5; ni++) {
                int64_t n = ns[ni];
                float *x = tsr_malloc((size_t)(n * cols) * 4);
                for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
                qact a = make_act(x, n, cols);
                int32_t seg[4] = {0, 32, (int32_t)(cols / 2 / 32 * 32), (int32_t)cols};
                int32_t bseg[4] = {0, 1, seg[2] / 32, (int32_t)nb};
                float *want = tsr_malloc((size_t)(n * rows) * 4);
                float *wantp = tsr_malloc((size_t)(3 * n * rows) * 4);
                int32_t whole[2] = {0, (int32_t)nb};
                for (int64_t i = 0; i < n; i++) {
                    f0(w.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                       a.s + i * nb, a.m + i * nb, 1, whole, 1, true, want + i * rows, rows, 0);
                    f0(w.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                       a.s + i * nb, a.m + i * nb, 1, bseg, 3, false, wantp + i * rows, rows,
                       n * rows);
                }
                qt_backends_agree(&bs, &w, x, n, seg, 16, want, wantp);
                free_act(&a);
                tsr_free(want);
                tsr_free(wantp);
                tsr_free(x);
            }
            tsr_free((void *)w.data);
        }
    qt_backends_close(&bs);
}

TSR_TEST_MAIN(test_quantizer_bytes_and_repack, test_gguf_dequant, test_mxfp4_pack,
              test_kernels_equal_scalar, test_slice, test_backends)
