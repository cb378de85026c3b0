/* The 256-bit 4-bit kernels' body, included by quant_q4_avx2.c and quant_q4_avxvnni.c under
 * their target pragmas; each defines TSR__Q4_YDOT(acc, w, x) (acc + per 32-bit lane the sum
 * of 4 products of u8 w and s8 x), TSR__Q4_Y_VARIANT, TSR__Q4_Y_NAME and TSR__Q4_Y_TABLE
 * first. The 16 rows of a group in two 8-lane halves (each 64-byte code step is rows 0-7 then
 * 8-15); the low nibbles meet the activations 4s..4s+3, the high ones 16 further. MXFP4's
 * codes go through the vpshufb table first (quant_q4_internal.h). */
#ifndef TSR__Q4_YDOT
#error "define TSR__Q4_YDOT before including quant_q4_ymm.h"
#endif
/* 1: YDOT is vpmaddubsw + vpmaddwd (AVX2), whose int16 products are summed over several
 * steps before one vpmaddwd (half the multiplies; same exact sums) */
#ifndef TSR__Q4_Y_I16
#define TSR__Q4_Y_I16 0
#endif

#include <string.h>

#include "kernels/cpu/quant_ymm_acc.h"

/* Every loop over the nx tokens is unrolled (`GCC unroll`; nx is a constant after inlining):
 * left as loops, GCC keeps the accumulators of nx 3 and 4 in memory (quant_q8_avx512.c). */
/* 8 rows' E8M0 bytes as tsr__mx_scale gives them: the byte as the exponent field (0: the
 * subnormal 2^-127), halved. */
static inline __attribute__((always_inline)) __m256 tsr__q4_y_e8m0(const uint8_t *e) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    __m256i u = _mm256_blendv_epi8(_mm256_slli_epi32(v, 23), _mm256_set1_epi32(0x00400000),
                                   _mm256_cmpeq_epi32(v, _mm256_setzero_si256()));
    return _mm256_mul_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(0.5f));
}

static inline __attribute__((always_inline)) void
tsr__q4_y_blk(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
              const float *xm, int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc,
              const int ty) { /* ty: 0 Q4_0, 1 Q4_1, 2 MXFP4 (a constant after inlining) */
    const int q41 = ty == 1, mx = ty == 2;
    const uint8_t *codes = wb + (q41 ? 64 : mx ? 16 : 32);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i lut = _mm256_setr_epi8(TSR__MX_LUT12, TSR__MX_LUT12);
    __m256i lo[4], hi[4], l16[4], h16[4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        lo[i] = hi[i] = l16[i] = h16[i] = _mm256_setzero_si256();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q4_BLOCK;
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m256i wl = _mm256_loadu_si256((const __m256i *)(codes + s * 64));
        __m256i wh = _mm256_loadu_si256((const __m256i *)(codes + s * 64 + 32));
        __m256i wl0 = _mm256_and_si256(wl, m4), wl1 = _mm256_and_si256(_mm256_srli_epi16(wl, 4), m4);
        __m256i wh0 = _mm256_and_si256(wh, m4), wh1 = _mm256_and_si256(_mm256_srli_epi16(wh, 4), m4);
        if (mx) { /* code -> twice its value + 12 */
            wl0 = _mm256_shuffle_epi8(lut, wl0);
            wl1 = _mm256_shuffle_epi8(lut, wl1);
            wh0 = _mm256_shuffle_epi8(lut, wh0);
            wh1 = _mm256_shuffle_epi8(lut, wh1);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256i xa = _mm256_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            __m256i xb = _mm256_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s));
            if (TSR__Q4_Y_I16) {
                l16[i] = _mm256_add_epi16(l16[i], _mm256_add_epi16(_mm256_maddubs_epi16(wl0, xa),
                                                                   _mm256_maddubs_epi16(wl1, xb)));
                h16[i] = _mm256_add_epi16(h16[i], _mm256_add_epi16(_mm256_maddubs_epi16(wh0, xa),
                                                                   _mm256_maddubs_epi16(wh1, xb)));
            } else {
                lo[i] = TSR__Q4_YDOT(TSR__Q4_YDOT(lo[i], wl0, xa), wl1, xb);
                hi[i] = TSR__Q4_YDOT(TSR__Q4_YDOT(hi[i], wh0, xa), wh1, xb);
            }
        }
        /* the int16 sums into int32: a vpmaddubsw pair is at most 2 * 15 * 127 (4-bit codes)
         * or 2 * 24 * 127 (MXFP4's 0..24), so a whole block's 8 (Q4) or two steps' 4
         * (MXFP4) add without overflow; one vpmaddwd then serves them all */
        if (TSR__Q4_Y_I16 && (s == 3 || (mx && s == 1))) {
            const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++) {
                lo[i] = _mm256_add_epi32(lo[i], _mm256_madd_epi16(l16[i], ones));
                hi[i] = _mm256_add_epi32(hi[i], _mm256_madd_epi16(h16[i], ones));
                l16[i] = h16[i] = _mm256_setzero_si256();
            }
        }
    }
    __m256 dl, dh;
    if (mx) {
        dl = tsr__q4_y_e8m0(wb);
        dh = tsr__q4_y_e8m0(wb + 8);
    } else {
        dl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wb));
        dh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16)));
    }
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m256 dx = _mm256_set1_ps(xd[k]);
        if (!q41) {
            __m256i c = _mm256_set1_epi32((mx ? 12 : 8) * xs[k]);
            lo[i] = _mm256_sub_epi32(lo[i], c);
            hi[i] = _mm256_sub_epi32(hi[i], c);
        }
        acc[i].lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[i]), _mm256_mul_ps(dl, dx), acc[i].lo);
        acc[i].hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[i]), _mm256_mul_ps(dh, dx), acc[i].hi);
        if (q41) {
            __m256 sx = _mm256_set1_ps(xm[k]);
            __m256 ml = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 32)));
            __m256 mh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 48)));
            acc[i].lo = _mm256_fmadd_ps(ml, sx, acc[i].lo);
            acc[i].hi = _mm256_fmadd_ps(mh, sx, acc[i].hi);
        }
    }
}

static inline __attribute__((always_inline)) void
tsr__q4_y_block0(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    tsr__q4_y_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 0);
}

static inline __attribute__((always_inline)) void
tsr__q4_y_block1(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    tsr__q4_y_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 1);
}

static inline __attribute__((always_inline)) void
tsr__q4_y_blockm(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    tsr__q4_y_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 2);
}

TSR__Q4_GEMV_PAIR(tsr__q4_y, tsr__ymm_acc, TSR__YMM_ZERO, TSR__YMM_STORE)

const tsr__q4_kernels TSR__Q4_Y_TABLE = {TSR__Q4_Y_VARIANT, TSR__Q4_Y_NAME, tsr__q4_y_gemv0,
                                         tsr__q4_y_gemv1, tsr__q4_y_gemvm};
