/* The AVX-512 VNNI Q5_K kernel (quant_q5k_internal.h), under its own target pragma: per
 * 4-column step of a block, one 512-bit load holds the 16 rows' low nibbles of their 4
 * columns of the first 16 (low nibbles) and of the last 16 (high nibbles); the fifth bits come
 * from the block's one 64-byte plane shifted into bit 4 (epi16 shifts: the mask drops what
 * crosses a byte). The codes (0..31, unsigned) meet the broadcast int8 activations in
 * vpdpbusd, 8 per block and token into one int32 sum per row: sum(q * x), exact. Then the
 * scalar's two fmas: (float)(sc * sum) is cvt(sum) * sc in float, exact (|sc * sum| <= 63 *
 * 32 * 31 * 127 < 2^24), and (float)(m * bsum) likewise, so the bits are the scalar's. Where
 * AVX2's kernel needs vpmaddubsw, int16 sums and vpmaddwd, this has one vpdpbusd per 64
 * products. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h). */
#define TSR__Q_PREFETCH_BYTES 4096
#include "kernels/cpu/quant_q5k_internal.h"

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

/* Bit s (b = false) or 4 + s (b = true) of every byte of h moved to bit 4 (s, b constants
 * after unrolling). */
static inline __attribute__((always_inline)) __m512i tsr__q5k_z_high(__m512i h, int s, bool b) {
    const __m512i m10 = _mm512_set1_epi8(0x10);
    int left = 4 - s; /* b: 4 + s to 4 is a right shift by s */
    if (b) return _mm512_and_si512(s ? _mm512_srli_epi16(h, (unsigned)s) : h, m10);
    return _mm512_and_si512(_mm512_slli_epi16(h, (unsigned)left), m10);
}

static inline __attribute__((always_inline)) void
tsr__q5k_z_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 int64_t nb, int64_t b, int nx, __m512 *acc) {
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i hq = _mm512_loadu_si512((const void *)(wb + TSR__Q5K_QH));
    __m512i sa[4], sb[4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q5K_BLOCK;
        sa[i] = sb[i] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m512i l = _mm512_loadu_si512((const void *)(wb + TSR__Q5K_QL + 64 * s));
        __m512i ca = _mm512_or_si512(_mm512_and_si512(l, m0f), tsr__q5k_z_high(hq, s, false));
        __m512i cb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m0f),
                                     tsr__q5k_z_high(hq, s, true));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            sa[i] = _mm512_dpbusd_epi32(sa[i], ca, _mm512_set1_epi32(tsr__q_x4(x[i] + 4 * s)));
            sb[i] = _mm512_dpbusd_epi32(sb[i], cb,
                                        _mm512_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s)));
        }
    }
    __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wb + TSR__Q5K_SC))));
    __m512 mn = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wb + TSR__Q5K_M))));
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + TSR__Q5K_DMIN)));
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m512 is = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sa[i], sb[i])), sc);
        __m512 ms = _mm512_mul_ps(mn, _mm512_set1_ps((float)xs[k]));
        __m512 dx = _mm512_set1_ps(xd[k]);
        __m512 t = _mm512_fmadd_ps(is, _mm512_mul_ps(dw, dx), acc[i]);
        __m512 nm = _mm512_castsi512_ps(_mm512_xor_si512( /* -() */
            _mm512_castps_si512(_mm512_mul_ps(mw, dx)), _mm512_set1_epi32(INT32_MIN)));
        acc[i] = _mm512_fmadd_ps(ms, nm, t);
    }
}

#define TSR__Q5K_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

static inline __attribute__((always_inline)) void
tsr__q5k_z_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                   const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                   const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                   int64_t ldp) {
    TSR__QGEMV_BODY(nx, TSR__Q5K_GBB, tsr__q5k_z_block, __m512, _mm512_setzero_ps(),
                    TSR__Q5K_Z_STORE)
}

TSR__Q8_GEMV_FN(tsr__q5k_z_gemv, tsr__q5k_z_gemv_nx)

const tsr__q5k_kernels tsr__q5k_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni",
                                                tsr__q5k_z_gemv};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
