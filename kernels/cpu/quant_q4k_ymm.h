/* The 256-bit Q4_K kernels' body, included by quant_q4k_avx2.c and quant_q4k_avxvnni.c under
 * their target pragmas; each defines first TSR__Q4K_Y_DOT(a, w, x) (a sub-block accumulator a
 * plus the products of u8 codes w and s8 activations x), TSR__Q4K_Y_SCALE(a, sc) (the
 * accumulator's per-row int32 sum times the rows' scales sc, one int32 per lane),
 * TSR__Q4K_Y_VARIANT, TSR__Q4K_Y_NAME and TSR__Q4K_Y_TABLE. The 16 rows of a group in two
 * 8-lane halves (each 64-byte plane or code step is rows 0-7 then 8-15), one half after the
 * other; scales and mins are unpacked lane-wise as in quant_q4k_avx512.c, the mins meet the
 * activation sub-block sums as int16 pairs by vpmaddwd. Exact integers, the scalar bits. */
#ifndef TSR__Q4K_Y_DOT
#error "define TSR__Q4K_Y_DOT before including quant_q4k_ymm.h"
#endif

#include <string.h>

#include "kernels/cpu/quant_ymm_acc.h"

/* Every loop over the nx tokens is unrolled (`GCC unroll`; nx is a constant after inlining):
 * left as loops, GCC keeps the accumulators of nx 3 and 4 in memory (quant_q8_avx512.c). */
static inline __attribute__((always_inline)) __m256i tsr__q4k_y_pair(const int32_t *xs, int a,
                                                                     int b) {
    return _mm256_set1_epi32((int32_t)(((uint32_t)xs[a] & 0xffffu) | ((uint32_t)xs[b] << 16)));
}

/* Sub-blocks 2c and 2c + 1 of half H for the nx tokens (SC: the scale word, SH: the bit
 * offset of sub-block 2c's scale in it). */
#define TSR__Q4K_Y_CHUNK(C, SC, SH)                                                          \
    do {                                                                                     \
        __m256i a0[4], a1[4];                                                                \
        _Pragma("GCC unroll 4") for (int i = 0; i < nx; i++) a0[i] = a1[i] = _mm256_setzero_si256();                \
        for (int s = 0; s < 8; s++) {                                                        \
            __m256i w = _mm256_loadu_si256((const __m256i *)(codes + ((C) * 8 + s) * 64));   \
            __m256i wl = _mm256_and_si256(w, m4);                                            \
            __m256i wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);                      \
            _Pragma("GCC unroll 4") for (int i = 0; i < nx; i++) {                                                   \
                const int8_t *xc = x[i] + (C) * 64 + 4 * s;                                  \
                a0[i] = TSR__Q4K_Y_DOT(a0[i], wl, _mm256_set1_epi32(tsr__q_x4(xc)));    \
                a1[i] = TSR__Q4K_Y_DOT(a1[i], wh, _mm256_set1_epi32(tsr__q_x4(xc + 32))); \
            }                                                                                \
        }                                                                                    \
        __m256i sc0 = _mm256_and_si256(_mm256_srli_epi32(SC, SH), ff);                       \
        __m256i sc1 = _mm256_and_si256(_mm256_srli_epi32(SC, (SH) + 8), ff);                 \
        _Pragma("GCC unroll 4") for (int i = 0; i < nx; i++)                                                         \
            is[i] = _mm256_add_epi32(is[i], _mm256_add_epi32(TSR__Q4K_Y_SCALE(a0[i], sc0),  \
                                                             TSR__Q4K_Y_SCALE(a1[i], sc1))); \
    } while (0)

/* Half h (rows 8h .. 8h + 7) of the group's super-block: the 8 rows' f32 results added to
 * out[i] as the contract's two fmas. */
static inline __attribute__((always_inline)) void
tsr__q4k_y_half(const uint8_t *wb, int h, const int8_t *const *x, const int32_t *const *xsub,
                const float *dxs, int nx, __m256 *out) {
    const uint8_t *codes = wb + TSR__Q4K_CODES + 32 * h;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ff = _mm256_set1_epi32(0xff);
    const __m256i k3f = _mm256_set1_epi32(0x3f3f3f3f), k0f = _mm256_set1_epi32(0x0f0f0f0f),
                  k03 = _mm256_set1_epi32(0x03030303), kw = _mm256_set1_epi32(0x00ff00ff);
    const uint8_t *sp = wb + TSR__Q4K_SCALES + 32 * h;
    __m256i u0 = _mm256_loadu_si256((const __m256i *)sp);
    __m256i u1 = _mm256_loadu_si256((const __m256i *)(sp + 64));
    __m256i u2 = _mm256_loadu_si256((const __m256i *)(sp + 128));
    __m256i s0 = _mm256_and_si256(u0, k3f);
    __m256i hi0 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k03), 4);
    __m256i hi1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k03), 4);
    __m256i s1 = _mm256_or_si256(_mm256_and_si256(u2, k0f), hi0);
    __m256i n0 = _mm256_and_si256(u1, k3f);
    __m256i n1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k0f), hi1);
    __m256i p02 = _mm256_and_si256(n0, kw), p13 = _mm256_and_si256(_mm256_srli_epi32(n0, 8), kw);
    __m256i p46 = _mm256_and_si256(n1, kw), p57 = _mm256_and_si256(_mm256_srli_epi32(n1, 8), kw);
    __m256i is[4], ms[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        const int32_t *s = xsub[i];
        is[i] = _mm256_setzero_si256();
        ms[i] = _mm256_add_epi32(
            _mm256_add_epi32(_mm256_madd_epi16(p02, tsr__q4k_y_pair(s, 0, 2)),
                             _mm256_madd_epi16(p13, tsr__q4k_y_pair(s, 1, 3))),
            _mm256_add_epi32(_mm256_madd_epi16(p46, tsr__q4k_y_pair(s, 4, 6)),
                             _mm256_madd_epi16(p57, tsr__q4k_y_pair(s, 5, 7))));
    }
    TSR__Q4K_Y_CHUNK(0, s0, 0);
    TSR__Q4K_Y_CHUNK(1, s0, 16);
    TSR__Q4K_Y_CHUNK(2, s1, 0);
    TSR__Q4K_Y_CHUNK(3, s1, 16);
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16 * h)));
    __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + TSR__Q4K_DMIN + 16 * h)));
    const __m256i sign = _mm256_set1_epi32((int32_t)0x80000000u);
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        __m256 dx = _mm256_set1_ps(dxs[i]);
        __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i]), _mm256_mul_ps(dw, dx), out[i]);
        __m256 nm = _mm256_castsi256_ps(
            _mm256_xor_si256(_mm256_castps_si256(_mm256_mul_ps(mw, dx)), sign));
        out[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms[i]), nm, a);
    }
}

static inline __attribute__((always_inline)) void
tsr__q4k_y_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    const int8_t *x[4];
    const int32_t *xsub[4];
    float dxs[4];
    __m256 lo[4], hi[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        x[i] = xq + k * TSR_Q4K_BLOCK;
        xsub[i] = xs + k * TSR__Q4K_SUB;
        dxs[i] = xd[k];
        lo[i] = acc[i].lo;
        hi[i] = acc[i].hi;
    }
    tsr__q4k_y_half(wb, 0, x, xsub, dxs, nx, lo);
    tsr__q4k_y_half(wb, 1, x, xsub, dxs, nx, hi);
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        acc[i].lo = lo[i];
        acc[i].hi = hi[i];
    }
}

TSR__Q4K_GEMV_DEF(tsr__q4k_y, tsr__q4k_y_block, tsr__ymm_acc, TSR__YMM_ZERO,
                  TSR__YMM_STORE)

const tsr__q4k_kernels TSR__Q4K_Y_TABLE = {TSR__Q4K_Y_VARIANT, TSR__Q4K_Y_NAME, tsr__q4k_y_gemv};
