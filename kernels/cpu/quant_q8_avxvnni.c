/* The AVX-VNNI Q8_0 kernel (quant_q8_internal.h), under its own target pragma: the 16 rows
 * of a group in two 8-lane halves, 256-bit vpdpbusd of the u8 weights (q + 128) and the
 * broadcast int8 activations, minus 128 * the activation block's sum: the exact integer sums,
 * scale and fma per block of the other variants. */
#include "kernels/cpu/quant_q8_internal.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "kernels/cpu/quant_ymm_acc.h"

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avxvnni,avx2,fma,f16c"))),              \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#endif

static inline __attribute__((always_inline)) void
tsr__q8_v_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    __m256i lo[4], hi[4];
    const int8_t *x[4];
    /* the loops over tokens unrolled, as in quant_q8_avx2.c (accumulators in registers) */
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        lo[i] = hi[i] = _mm256_setzero_si256();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q8_BLOCK;
    }
    for (int s = 0; s < 8; s++) {
        __m256i wl = _mm256_loadu_si256((const __m256i *)(wb + 32 + s * 64));
        __m256i wh = _mm256_loadu_si256((const __m256i *)(wb + 32 + s * 64 + 32));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256i xb = _mm256_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            lo[i] = _mm256_dpbusd_avx_epi32(lo[i], wl, xb);
            hi[i] = _mm256_dpbusd_avx_epi32(hi[i], wh, xb);
        }
    }
    __m256 dl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wb));
    __m256 dh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16)));
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m256i c = _mm256_set1_epi32(128 * xs[k]);
        __m256 dx = _mm256_set1_ps(xd[k]);
        acc[i].lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo[i], c)),
                                    _mm256_mul_ps(dl, dx), acc[i].lo);
        acc[i].hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi[i], c)),
                                    _mm256_mul_ps(dh, dx), acc[i].hi);
    }
}

static inline __attribute__((always_inline)) void
tsr__q8_v_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                  const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                  const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                  int64_t ldp) {
    TSR__Q8_GEMV_BODY(nx, tsr__q8_v_block, tsr__ymm_acc, TSR__YMM_ZERO, TSR__YMM_STORE)
}

TSR__Q8_GEMV_FN(tsr__q8_v_gemv, tsr__q8_v_gemv_nx)

const tsr__q8_kernels tsr__q8_k_avxvnni = {TSR__Q8_AVXVNNI, "avxvnni", tsr__q8_v_gemv,
    tsr__q8_quantize_act};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
