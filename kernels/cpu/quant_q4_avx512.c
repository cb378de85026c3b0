/* The AVX-512 VNNI 4-bit kernel (quant_q4_internal.h), under its own target pragma: per
 * 32-column block of a 16-row group, 4 loads of 64 bytes (16 rows x 8 codes), each split into
 * its low nibbles (columns 4s..4s+3) and high nibbles (16 further), each multiplied with the
 * 4 broadcast int8 activations by vpdpbusd into 16 int32 row sums; Q4_0 subtracts 8 * the
 * activation block's sum; then one fma per block with the rows' scales times the token's
 * (Q4_1: and one with the rows' m times the token's block sum). No horizontal sums; each
 * weight load serves up to 4 tokens. */
#include "kernels/cpu/quant_q4_internal.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(                                                                 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))),           \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

static inline __attribute__((always_inline)) int32_t tsr__q4_z_x4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return v;
}

static inline __attribute__((always_inline)) void
tsr__q4_z_blk(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
              const float *xm, int64_t nb, int64_t b, int nx, __m512 *acc, const int q41) {
    const uint8_t *codes = wb + (q41 ? 64 : 32);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i a0[4], a1[4];
    const int8_t *x[4];
    #pragma GCC unroll 8
    for (int i = 0; i < nx; i++) {
        a0[i] = _mm512_setzero_si512();
        a1[i] = _mm512_setzero_si512();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q4_BLOCK;
    }
    /* two chains per token (low and high nibbles), so vpdpbusd's latency hides; the
     * loops unrolled (nx is a constant), else GCC keeps nx 3-4 accumulators in memory */
    #pragma GCC unroll 8
    for (int s = 0; s < 4; s++) {
        __m512i w = _mm512_loadu_si512((const void *)(codes + s * 64));
        __m512i wl = _mm512_and_si512(w, m4);
        __m512i wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
        #pragma GCC unroll 8
        for (int i = 0; i < nx; i++) {
            a0[i] = _mm512_dpbusd_epi32(a0[i], wl, _mm512_set1_epi32(tsr__q4_z_x4(x[i] + 4 * s)));
            a1[i] = _mm512_dpbusd_epi32(a1[i], wh,
                                        _mm512_set1_epi32(tsr__q4_z_x4(x[i] + 16 + 4 * s)));
        }
    }
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    __m512 mw = q41 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + 32)))
                    : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m512i is = _mm512_add_epi32(a0[i], a1[i]);
        if (!q41) is = _mm512_sub_epi32(is, _mm512_set1_epi32(8 * xs[k]));
        __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[k]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), dd, acc[i]);
        if (q41) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xm[k]), acc[i]);
    }
}

static inline __attribute__((always_inline)) void
tsr__q4_z_block0(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, __m512 *acc) {
    tsr__q4_z_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 0);
}

static inline __attribute__((always_inline)) void
tsr__q4_z_block1(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, __m512 *acc) {
    tsr__q4_z_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 1);
}

#define TSR__Q4_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

TSR__Q4_GEMV_PAIR(tsr__q4_z, __m512, _mm512_setzero_ps(), TSR__Q4_Z_STORE)

const tsr__q4_kernels tsr__q4_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni", tsr__q4_z_gemv0,
                                              tsr__q4_z_gemv1};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
