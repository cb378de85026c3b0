/* The AVX-512 VNNI Q6_K kernel (quant_q6k_internal.h), under its own target pragma: per
 * 4-column step of a block, one 512-bit load holds the 16 rows' low 4 bits of their 4
 * columns of the first 16 (low nibbles) and of the last 16 (high nibbles); the high 2 bits
 * come from the block's two 64-byte planes shifted into bits 4-5. The unsigned codes q + 32
 * (0..63) meet the broadcast int8 activations in vpdpbusd, into one int32 sum per row for
 * each 16-column half, started at -32 times the activations' sum over that half (xs), so each
 * is sum(q * x) exactly. sc_a sum_a + sc_b sum_b is then taken in float: both products and
 * their sum are below 2^24 in magnitude (2 x 127 x 16 x 32 x 127), so cvt(sum_a) * sc_a and
 * the fma adding cvt(sum_b) * sc_b are exact, the scalar's (float)isum; then its fma with
 * d * d_x. Where AVX2's kernel needs vpmaddubsw, int16 sums and vpmaddwd, this has one
 * vpdpbusd per 64 products. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h). */
#define TSR__Q_PREFETCH_BYTES 4096
#include "kernels/cpu/quant_q6k_internal.h"

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

/* Bits 2s, 2s + 1 of every byte of h moved to bits 4, 5 (s a constant after unrolling). */
static inline __attribute__((always_inline)) __m512i tsr__q6k_z_high(__m512i h, int s) {
    const __m512i m30 = _mm512_set1_epi8(0x30);
    switch (s) {
    case 0: return _mm512_and_si512(_mm512_slli_epi16(h, 4), m30);
    case 1: return _mm512_and_si512(_mm512_slli_epi16(h, 2), m30);
    case 2: return _mm512_and_si512(h, m30);
    default: return _mm512_and_si512(_mm512_srli_epi16(h, 2), m30);
    }
}

static inline __attribute__((always_inline)) void
tsr__q6k_z_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 int64_t nb, int64_t b, int nx, __m512 *acc) {
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i ha = _mm512_loadu_si512((const void *)(wb + TSR__Q6K_QHA));
    const __m512i hb = _mm512_loadu_si512((const void *)(wb + TSR__Q6K_QHB));
    __m512i sa[4], sb[4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        x[i] = xq + k * TSR_Q6K_BLOCK;
        /* the 16-column sums: the low int16 of xs, then the high one */
        sa[i] = _mm512_set1_epi32(-32 * (int32_t)(int16_t)(xs[k] & 0xffff));
        sb[i] = _mm512_set1_epi32(-32 * (xs[k] >> 16));
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m512i l = _mm512_loadu_si512((const void *)(wb + TSR__Q6K_QL + 64 * s));
        __m512i ca = _mm512_or_si512(_mm512_and_si512(l, m0f), tsr__q6k_z_high(ha, s));
        __m512i cb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m0f),
                                     tsr__q6k_z_high(hb, s));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            sa[i] = _mm512_dpbusd_epi32(sa[i], ca, _mm512_set1_epi32(tsr__q_x4(x[i] + 4 * s)));
            sb[i] = _mm512_dpbusd_epi32(sb[i], cb,
                                        _mm512_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s)));
        }
    }
    /* the rows' two int8 scales, interleaved (a, b) per row */
    __m512i sab = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wb + TSR__Q6K_SC)));
    __m512 sca = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sab, 16), 16));
    __m512 scb = _mm512_cvtepi32_ps(_mm512_srai_epi32(sab, 16));
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        __m512 is = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb[i]), scb,
                                    _mm512_mul_ps(_mm512_cvtepi32_ps(sa[i]), sca));
        __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[(size_t)i * (size_t)nb + (size_t)b]));
        acc[i] = _mm512_fmadd_ps(is, dd, acc[i]);
    }
}

#define TSR__Q6K_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

static inline __attribute__((always_inline)) void
tsr__q6k_z_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                   const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                   const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                   int64_t ldp) {
    TSR__QGEMV_BODY(nx, TSR__Q6K_GBB, tsr__q6k_z_block, __m512, _mm512_setzero_ps(),
                    TSR__Q6K_Z_STORE)
}

TSR__Q8_GEMV_FN(tsr__q6k_z_gemv, tsr__q6k_z_gemv_nx)

const tsr__q6k_kernels tsr__q6k_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni",
                                                tsr__q6k_z_gemv};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
