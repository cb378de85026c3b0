/* BF16 prefill on AMX tiles (cpu_internal.h, tsr__gemm_amx_*): y = x . W^T for BF16 W and f32
 * x, on TDPBF16PS (16 x 16 f32 sums += 16 x 32 bf16 . 32 x 16 bf16, f32 accumulation).
 *
 * The weights need no repacking: 16 rows of W, 32 columns wide, are an A operand as W
 * stores them (tileloadd with W's row pitch), so the output tile is [16 rows][16 tokens]
 * and is stored transposed into y. The activations are packed once per call as the B
 * operands (pairs of columns interleaved, 16 tokens a tile), and in two parts: hi, x rounded
 * to bf16, and lo, the rest x - hi rounded to bf16. Each product is then w * hi + w * lo,
 * exact in f32, with x carried to 16 of its 24 mantissa bits (relative error <= 2^-17
 * against the 2^-9 of x rounded to bf16 once): the result stays within f32 rounding noise of
 * the sgemm path instead of moving every activation by up to 0.4 %. Twice the tile
 * products of bf16 x alone, and still several times the AVX-512 sgemm's rate
 * (docs/kernels-cpu.md, "AMX").
 *
 * Every output's sum runs over the same K steps in the same order (hi then lo per step)
 * whatever its row's place in W, its token's place in x or the thread that computes it,
 * so a row slice of W and any thread count give the same bits. */
#include "kernels/cpu/cpu_internal.h"

#include <string.h>

#include "base/dtype.h"

/* Tokens per B tile, columns (bf16) per K step. */
#define TSR__GA_TOK 16
#define TSR__GA_K 32
/* uint16 elements of one K step's hi and lo tiles of 16 tokens. */
#define TSR__GA_STEP (2 * TSR__GA_TOK * TSR__GA_K)

size_t tsr__gemm_amx_xp_elems(int64_t n, int64_t ns) {
    return (size_t)((n + TSR__GA_TOK - 1) / TSR__GA_TOK) * (size_t)ns * TSR__GA_STEP;
}

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw"))),   \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw")
#endif

/* The permutes of tsr__gemm_amx_transpose's rounds of width 8, 4, 2, 1: a block's lower
 * (lo) and upper (hi) halves of the two registers, lane p of the result picking lane i of
 * the first (i < 16) or i - 16 of the second. */
static const int32_t tsr__gemm_amx_tlo[4][16] __attribute__((aligned(64))) = {
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
static const int32_t tsr__gemm_amx_thi[4][16] __attribute__((aligned(64))) = {
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};

/* r[16] (16 x 16 32-bit lanes) transposed in place: four rounds of two-register permutes,
 * the round of width b swapping the b-wide blocks off the diagonal of each 2b x 2b block. */
static inline __attribute__((always_inline)) void tsr__gemm_amx_transpose(__m512i r[16]) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int b = 8 >> k;
        __m512i il = _mm512_load_si512((const void *)tsr__gemm_amx_tlo[k]);
        __m512i ih = _mm512_load_si512((const void *)tsr__gemm_amx_thi[k]);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i & b) continue;
            __m512i a = r[i];
            r[i] = _mm512_permutex2var_epi32(a, il, r[i + b]);
            r[i + b] = _mm512_permutex2var_epi32(a, ih, r[i + b]);
        }
    }
}

/* 16 lanes of f32 bits u rounded to bf16 (round to nearest even, NaN kept quiet: base/
 * dtype.h's tsr_f32_to_bf16), in the low half of each lane. */
static inline __m512i tsr__gemm_amx_bf16(__m512i u) {
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
    __m512i q = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    return _mm512_srli_epi32(_mm512_mask_mov_epi32(r, nan, q), 16);
}

void tsr__gemm_amx_pack(const float *x, int64_t ldx, int64_t n, int64_t ns, int64_t g,
                        uint16_t *xp) {
    uint16_t *xg = xp + (size_t)g * (size_t)ns * TSR__GA_STEP;
    int nt = n - g * TSR__GA_TOK >= TSR__GA_TOK ? TSR__GA_TOK : (int)(n - g * TSR__GA_TOK);
    const __m512i expo = _mm512_set1_epi32(0x7f80);
    for (int64_t s = 0; s < ns; s++) {
        __m512i hi[16], lo[16];
        for (int j = 0; j < TSR__GA_TOK; j++) {
            if (j >= nt) { /* tokens past n are zeros */
                hi[j] = lo[j] = _mm512_setzero_si512();
                continue;
            }
            const float *xj = x + (size_t)(g * TSR__GA_TOK + j) * (size_t)ldx + s * TSR__GA_K;
            __m256i h2[2], l2[2];
            for (int q = 0; q < 2; q++) {
                __m512 v = _mm512_loadu_ps(xj + 16 * q);
                __m512i h = tsr__gemm_amx_bf16(_mm512_castps_si512(v));
                __m512 hv = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
                /* infinities and NaN keep lo 0, so w * x stays what it is in f32 */
                __mmask16 fin = _mm512_cmpneq_epi32_mask(_mm512_and_si512(h, expo), expo);
                __m512i l = tsr__gemm_amx_bf16(_mm512_castps_si512(_mm512_sub_ps(v, hv)));
                h2[q] = _mm512_cvtepi32_epi16(h);
                l2[q] = _mm512_cvtepi32_epi16(_mm512_maskz_mov_epi32(fin, l));
            }
            /* 16 lanes of column pairs (even column in the low half) */
            hi[j] = _mm512_inserti64x4(_mm512_castsi256_si512(h2[0]), h2[1], 1);
            lo[j] = _mm512_inserti64x4(_mm512_castsi256_si512(l2[0]), l2[1], 1);
        }
        /* B row k holds the 16 tokens' pairs (2k, 2k + 1) */
        tsr__gemm_amx_transpose(hi);
        tsr__gemm_amx_transpose(lo);
        uint16_t *bh = xg + (size_t)s * TSR__GA_STEP, *bl = bh + TSR__GA_STEP / 2;
        for (int k = 0; k < 16; k++) {
            _mm512_storeu_si512((void *)(bh + 32 * k), hi[k]);
            _mm512_storeu_si512((void *)(bl + 32 * k), lo[k]);
        }
    }
}

/* Tile registers: sums C[row half][token half], A (16 weight rows) for each row half, B the
 * hi and lo operands of one token half. */
#define TSR__GA_C00 0
#define TSR__GA_C01 1
#define TSR__GA_C10 2
#define TSR__GA_C11 3
#define TSR__GA_A0 4
#define TSR__GA_A1 5
#define TSR__GA_BH 6
#define TSR__GA_BL 7

static void tsr__gemm_amx_config(void) {
    tsr__amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { /* every tile 16 rows of 64 bytes */
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    tsr__amx_load_cfg(&cfg);
}

/* Sum tile c ([16 rows][16 tokens]) into (add: onto) y: rows [r, r + nr) of tokens
 * [t, t + nt). */
static void tsr__gemm_amx_put(const float c[16][16], int nr, int nt, bool add, float *y,
                              int64_t ldy, int64_t r, int64_t t) {
    if (!nr || !nt) return;
    __m512i v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_load_si512((const void *)c[i]);
    tsr__gemm_amx_transpose(v);
    __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int j = 0; j < nt; j++) {
        float *yj = y + (size_t)(t + j) * (size_t)ldy + (size_t)r;
        __m512 o = _mm512_castsi512_ps(v[j]);
        if (add) o = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yj), o);
        _mm512_mask_storeu_ps(yj, m, o);
    }
}

/* One K step of a token half (its hi and lo tiles at b) into the sum tiles C0 (rows of A0)
 * and, with a1, C1 (rows of A1): hi then lo, the order every output's sum follows. */
#define TSR__GA_TOKENS(b, C0, C1)                                                              \
    do {                                                                                      \
        _tile_loadd(TSR__GA_BH, (b), 64);                                                     \
        _tile_loadd(TSR__GA_BL, (b) + TSR__GA_STEP / 2, 64);                                  \
        _tile_dpbf16ps(C0, TSR__GA_A0, TSR__GA_BH);                                           \
        _tile_dpbf16ps(C0, TSR__GA_A0, TSR__GA_BL);                                           \
        if (a1) {                                                                             \
            _tile_dpbf16ps(C1, TSR__GA_A1, TSR__GA_BH);                                       \
            _tile_dpbf16ps(C1, TSR__GA_A1, TSR__GA_BL);                                       \
        }                                                                                     \
    } while (0)

/* 16 or 32 rows (a0, and a1 when not NULL; their rows lda0 and lda1 bytes apart) for 16
 * or 32 tokens (the packed groups b0, and b1 when not NULL) over ns K steps, into c[4]
 * (C00 C01 C10 C11). */
static void tsr__gemm_amx_block(const uint16_t *a0, size_t lda0, const uint16_t *a1,
                                size_t lda1, const uint16_t *b0, const uint16_t *b1,
                                int64_t ns, float c[4][16][16]) {
    _tile_zero(TSR__GA_C00);
    _tile_zero(TSR__GA_C01);
    _tile_zero(TSR__GA_C10);
    _tile_zero(TSR__GA_C11);
    for (int64_t s = 0; s < ns; s++) {
        size_t kw = (size_t)s * TSR__GA_K, kx = (size_t)s * TSR__GA_STEP;
        _tile_loadd(TSR__GA_A0, a0 + kw, lda0);
        if (a1) _tile_loadd(TSR__GA_A1, a1 + kw, lda1);
        TSR__GA_TOKENS(b0 + kx, TSR__GA_C00, TSR__GA_C10);
        if (b1) TSR__GA_TOKENS(b1 + kx, TSR__GA_C01, TSR__GA_C11);
    }
    _tile_stored(TSR__GA_C00, c[0], 64);
    _tile_stored(TSR__GA_C01, c[1], 64);
    _tile_stored(TSR__GA_C10, c[2], 64);
    _tile_stored(TSR__GA_C11, c[3], 64);
}

/* Bytes of packed operands per pass over a thread's rows (tokens x columns x 4): they stay
 * in L2 while the rows stream through. */
#define TSR__GA_CHUNK_BYTES (1024 << 10)

void tsr__gemm_amx_rows(const uint16_t *w, int64_t ldw, int64_t r0, int64_t r1,
                        const uint16_t *xp, int64_t nsx, int64_t sx, int64_t ns, int64_t n,
                        uint16_t *tail, bool add, float *y, int64_t ldy) {
    size_t gstride = (size_t)nsx * TSR__GA_STEP;
    xp += (size_t)sx * TSR__GA_STEP;
    int64_t ng = (n + TSR__GA_TOK - 1) / TSR__GA_TOK, kc = ns * TSR__GA_K;
    size_t lda = (size_t)ldw * 2, ldt = (size_t)kc * 2;
    /* A last block's rows short of 16 are read from a copy (ldt bytes a row) padded with
     * zero rows, so no tile load reads past r1. */
    int64_t rfull = r0 + (r1 - r0) / 16 * 16;
    if (rfull < r1) {
        memset(tail, 0, 16 * ldt);
        for (int64_t r = rfull; r < r1; r++)
            memcpy(tail + (size_t)(r - rfull) * (size_t)kc, w + (size_t)r * (size_t)ldw, ldt);
    }
    float c[4][16][16] __attribute__((aligned(64)));
    tsr__gemm_amx_config();
    /* token groups per pass: an even number (the blocks take two), at least 2 */
    int64_t gc = TSR__GA_CHUNK_BYTES / (ns * TSR__GA_STEP * 2 + 1) / 2 * 2;
    if (gc < 2) gc = 2;
    for (int64_t g0 = 0; g0 < ng; g0 += gc) {
        int64_t g1 = g0 + gc < ng ? g0 + gc : ng;
        for (int64_t r = r0; r < r1; r += 32) {
            bool t0 = r >= rfull, t1 = r + 16 >= rfull;
            const uint16_t *a0 = t0 ? tail : w + (size_t)r * (size_t)ldw;
            const uint16_t *a1 = r + 16 >= r1 ? NULL
                                 : t1         ? tail
                                              : w + (size_t)(r + 16) * (size_t)ldw;
            int nr0 = r1 - r >= 16 ? 16 : (int)(r1 - r);
            int nr1 = !a1 ? 0 : r1 - r - 16 >= 16 ? 16 : (int)(r1 - r - 16);
            for (int64_t g = g0; g < g1; g += 2) {
                const uint16_t *b0 = xp + (size_t)g * gstride;
                const uint16_t *b1 = g + 1 < g1 ? b0 + gstride : NULL;
                tsr__gemm_amx_block(a0, t0 ? ldt : lda, a1, t1 ? ldt : lda, b0, b1, ns, c);
                int64_t u0 = g * TSR__GA_TOK, u1 = u0 + TSR__GA_TOK;
                int nu0 = n - u0 >= 16 ? 16 : (int)(n - u0);
                int nu1 = !b1 ? 0 : n - u1 >= 16 ? 16 : (int)(n - u1);
                tsr__gemm_amx_put(c[0], nr0, nu0, add, y, ldy, r, u0);
                tsr__gemm_amx_put(c[1], nr0, nu1, add, y, ldy, r, u1);
                tsr__gemm_amx_put(c[2], nr1, nu0, add, y, ldy, r + 16, u0);
                tsr__gemm_amx_put(c[3], nr1, nu1, add, y, ldy, r + 16, u1);
            }
        }
    }
    _tile_release();
}

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else

void tsr__gemm_amx_pack(const float *x, int64_t ldx, int64_t n, int64_t ns, int64_t g,
                        uint16_t *xp) {
    (void)x, (void)ldx, (void)n, (void)ns, (void)g, (void)xp;
}

void tsr__gemm_amx_rows(const uint16_t *w, int64_t ldw, int64_t r0, int64_t r1,
                        const uint16_t *xp, int64_t nsx, int64_t sx, int64_t ns, int64_t n,
                        uint16_t *tail, bool add, float *y, int64_t ldy) {
    (void)w, (void)ldw, (void)r0, (void)r1, (void)xp, (void)nsx, (void)sx, (void)ns, (void)n,
        (void)tail, (void)add, (void)y, (void)ldy;
}

#endif
