/* The AVX2 Q5_K kernel (quant_q5k_internal.h), under its own target pragma: per 4-column step
 * of a block, one 256-bit vector of each half (rows 0-7, 8-15) holds the low nibbles of its
 * rows' 4 columns of the first 16 and, in the high nibbles, of the last 16; the fifth bits
 * come from one vector shifted into bit 4 (epi16 shifts: the mask drops what crosses a
 * byte). The codes (0..31) meet the int8 activations in vpmaddubsw, whose int16 sums over the
 * block's 4 steps stay below 4 * 2 * 31 * 127 = 31496 for each 16 columns; vpmaddwd with
 * each row's scale in both int16 halves gives sc * sum(q * x); the min term m * bsum is one
 * vpmaddwd too. The float steps are the scalar's two fmas. The weights are prefetched 4 KiB
 * ahead, as Q6_K's. AVX-VNNI and AVX-512 CPUs run this kernel too. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h). */
#define TSR__Q_PREFETCH_BYTES 4096
#include "kernels/cpu/quant_q5k_internal.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "kernels/cpu/quant_ymm_acc.h"

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

/* Bit s (b = false) or 4 + s (b = true) of every byte of h moved to bit 4 (s, b constants
 * after unrolling). */
static inline __attribute__((always_inline)) __m256i tsr__q5k_y_high(__m256i h, int s, bool b) {
    const __m256i m10 = _mm256_set1_epi8(0x10);
    if (!b) {
        switch (s) {
        case 0: return _mm256_and_si256(_mm256_slli_epi16(h, 4), m10);
        case 1: return _mm256_and_si256(_mm256_slli_epi16(h, 3), m10);
        case 2: return _mm256_and_si256(_mm256_slli_epi16(h, 2), m10);
        default: return _mm256_and_si256(_mm256_slli_epi16(h, 1), m10);
        }
    }
    switch (s) {
    case 0: return _mm256_and_si256(h, m10);
    case 1: return _mm256_and_si256(_mm256_srli_epi16(h, 1), m10);
    case 2: return _mm256_and_si256(_mm256_srli_epi16(h, 2), m10);
    default: return _mm256_and_si256(_mm256_srli_epi16(h, 3), m10);
    }
}

static inline __attribute__((always_inline)) void
tsr__q5k_y_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    __m256i hq[2];
    /* [half][token]: the int16 pair sums of columns 0-15 (a) and 16-31 (b) */
    __m256i pa[2][4], pb[2][4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q5K_BLOCK;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
        hq[h] = _mm256_loadu_si256((const __m256i *)(wb + TSR__Q5K_QH + 32 * h));
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m256i ca[2], cb[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i l = _mm256_loadu_si256((const __m256i *)(wb + TSR__Q5K_QL + 64 * s + 32 * h));
            ca[h] = _mm256_or_si256(_mm256_and_si256(l, m0f), tsr__q5k_y_high(hq[h], s, false));
            cb[h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m0f),
                                    tsr__q5k_y_high(hq[h], s, true));
        }
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256i xa = _mm256_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            __m256i xb = _mm256_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i ta = _mm256_maddubs_epi16(ca[h], xa);
                __m256i tb = _mm256_maddubs_epi16(cb[h], xb);
                pa[h][i] = s ? _mm256_add_epi16(pa[h][i], ta) : ta;
                pb[h][i] = s ? _mm256_add_epi16(pb[h][i], tb) : tb;
            }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        /* each row's scale in both int16 halves of its lane; its min as (m, 0) */
        __m256i sc = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64((const __m128i *)(wb + TSR__Q5K_SC + 8 * h)));
        sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
        __m256i mn = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64((const __m128i *)(wb + TSR__Q5K_M + 8 * h)));
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16 * h)));
        __m256 mw = _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(wb + TSR__Q5K_DMIN + 16 * h)));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            size_t k = (size_t)i * (size_t)nb + (size_t)b;
            __m256i is = _mm256_add_epi32(_mm256_madd_epi16(pa[h][i], sc),
                                          _mm256_madd_epi16(pb[h][i], sc));
            /* |bsum| <= 32 * 127 fits the low int16 */
            __m256i ms = _mm256_madd_epi16(mn, _mm256_set1_epi32((int32_t)(uint16_t)xs[k]));
            __m256 dx = _mm256_set1_ps(xd[k]);
            __m256 *a = h ? &acc[i].hi : &acc[i].lo;
            __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, dx), *a);
            __m256 nm = _mm256_xor_ps(_mm256_mul_ps(mw, dx), _mm256_set1_ps(-0.0f)); /* -() */
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), nm, t);
        }
    }
}

static inline __attribute__((always_inline)) void
tsr__q5k_y_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                   const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                   const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                   int64_t ldp) {
    TSR__QGEMV_BODY(nx, TSR__Q5K_GBB, tsr__q5k_y_block, tsr__ymm_acc, TSR__YMM_ZERO,
                    TSR__YMM_STORE)
}

TSR__Q8_GEMV_FN(tsr__q5k_y_gemv, tsr__q5k_y_gemv_nx)

const tsr__q5k_kernels tsr__q5k_k_avx2 = {TSR__Q8_AVX2, "avx2", tsr__q5k_y_gemv};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
