/* The AVX-512 VNNI Q8_0 kernel (quant_q8_internal.h), under its own target pragma like the
 * SIMD tables: per 32-column block of a 16-row group, 8 loads of 64 bytes (16 rows x 4
 * columns of u8 weights q + 128), each multiplied with the broadcast 4 int8 activations by
 * vpdpbusd into 16 int32 row sums; minus 128 * the activation block's sum, that is the exact
 * sum of q_w * q_x; then one fma per block with the 16 rows' scales times the token's. No
 * horizontal sums; each weight load serves up to 4 tokens. */
#include "kernels/cpu/quant_q8_internal.h"

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

static inline __attribute__((always_inline)) int32_t tsr__q8_z_x4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return v;
}

static inline __attribute__((always_inline)) void
tsr__q8_z_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                int64_t nb, int64_t b, int nx, __m512 *acc) {
    __m512i a0[4], a1[4];
    const int8_t *x[4];
    for (int i = 0; i < nx; i++) {
        a0[i] = _mm512_setzero_si512();
        a1[i] = _mm512_setzero_si512();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q8_BLOCK;
    }
    /* two chains per token, so vpdpbusd's latency hides behind the other's */
    for (int s = 0; s < 8; s += 2) {
        __m512i w0 = _mm512_loadu_si512((const void *)(wb + 32 + s * 64));
        __m512i w1 = _mm512_loadu_si512((const void *)(wb + 32 + (s + 1) * 64));
        for (int i = 0; i < nx; i++) {
            a0[i] = _mm512_dpbusd_epi32(a0[i], w0, _mm512_set1_epi32(tsr__q8_z_x4(x[i] + 4 * s)));
            a1[i] = _mm512_dpbusd_epi32(a1[i], w1,
                                        _mm512_set1_epi32(tsr__q8_z_x4(x[i] + 4 * s + 4)));
        }
    }
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m512i is = _mm512_sub_epi32(_mm512_add_epi32(a0[i], a1[i]),
                                      _mm512_set1_epi32(128 * xs[k]));
        __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[k]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), dd, acc[i]);
    }
}

#define TSR__Q8_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

static inline __attribute__((always_inline)) void
tsr__q8_z_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                  const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                  const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                  int64_t ldp) {
    TSR__Q8_GEMV_BODY(nx, tsr__q8_z_block, __m512, _mm512_setzero_ps(), TSR__Q8_Z_STORE)
}

TSR__Q8_GEMV_FN(tsr__q8_z_gemv, tsr__q8_z_gemv_nx)

const tsr__q8_kernels tsr__q8_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni",
                                              tsr__q8_z_gemv};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
