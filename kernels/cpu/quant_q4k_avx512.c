/* The AVX-512 VNNI Q4_K kernel (quant_q4k_internal.h), under its own target pragma: one
 * 32-bit lane per row of a 16-row group. Per super-block, the rows' 6-bit scales and mins
 * are unpacked lane-wise from the three scale planes (ggml's word arithmetic); per 64-column
 * chunk, 8 loads of 64 bytes (16 rows x 8 codes), the low nibbles (sub-block 2c) and high
 * nibbles (2c + 1) each multiplied with 4 broadcast int8 activations by vpdpbusd into 16
 * int32 sub-block sums, which vpmulld weights by the rows' scales; the mins meet the
 * activation sub-block sums by vpdpwssd on int16 pairs. Then two fmas per super-block. Each
 * weight load serves up to 4 tokens; all integer sums are exact, so the bits are the scalar
 * reference's. */
/* The weight stream prefetched 4 KiB ahead on Intel CPUs only (tsr__cpu_intel). */
#define TSR__Q_PREFETCH_BYTES (TSR__Q_PREFETCH_INTEL ? 4096 : 0)
#include "kernels/cpu/quant_q4k_internal.h"

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

/* xs[a] and xs[b] as one 32-bit lane of two int16 (each sub-block sum fits: |s| <= 32 * 127) */
static inline __attribute__((always_inline)) __m512i tsr__q4k_z_pair(const int32_t *xs, int a,
                                                                     int b) {
    return _mm512_set1_epi32((int32_t)(((uint32_t)xs[a] & 0xffffu) | ((uint32_t)xs[b] << 16)));
}

/* Sub-blocks 2c and 2c + 1 of the nx tokens: SC the scale word holding their scales in
 * bytes SH / 8 and SH / 8 + 1. */
#define TSR__Q4K_Z_CHUNK(C, SC, SH)                                                          \
    do {                                                                                     \
        __m512i a0[4], a1[4];                                                                \
        _Pragma("GCC unroll 4") for (int i = 0; i < nx; i++) a0[i] = a1[i] =               \
            _mm512_setzero_si512();                                                          \
        for (int s = 0; s < 8; s++) {                                                        \
            __m512i w = _mm512_loadu_si512((const void *)(codes + ((C) * 8 + s) * 64));      \
            __m512i wl = _mm512_and_si512(w, m4);                                            \
            __m512i wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);                      \
            _Pragma("GCC unroll 4") for (int i = 0; i < nx; i++) {                           \
                const int8_t *xc = x[i] + (C) * 64 + 4 * s;                                  \
                a0[i] = _mm512_dpbusd_epi32(a0[i], wl, _mm512_set1_epi32(tsr__q_x4(xc))); \
                a1[i] = _mm512_dpbusd_epi32(a1[i], wh,                                       \
                                            _mm512_set1_epi32(tsr__q_x4(xc + 32)));      \
            }                                                                                \
        }                                                                                    \
        __m512i sc0 = _mm512_and_si512(_mm512_srli_epi32(SC, SH), ff);                       \
        __m512i sc1 = _mm512_and_si512(_mm512_srli_epi32(SC, (SH) + 8), ff);                 \
        _Pragma("GCC unroll 4") for (int i = 0; i < nx; i++)                                 \
            is[i] = _mm512_add_epi32(is[i], _mm512_add_epi32(_mm512_mullo_epi32(a0[i], sc0), \
                                                             _mm512_mullo_epi32(a1[i], sc1))); \
    } while (0)

static inline __attribute__((always_inline)) void
tsr__q4k_z_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 int64_t nb, int64_t b, int nx, __m512 *acc) {
    const uint8_t *codes = wb + TSR__Q4K_CODES;
    const __m512i m4 = _mm512_set1_epi8(0x0f), ff = _mm512_set1_epi32(0xff);
    const __m512i k3f = _mm512_set1_epi32(0x3f3f3f3f), k0f = _mm512_set1_epi32(0x0f0f0f0f),
                  k03 = _mm512_set1_epi32(0x03030303), kw = _mm512_set1_epi32(0x00ff00ff);
    __m512i u0 = _mm512_loadu_si512((const void *)(wb + TSR__Q4K_SCALES));
    __m512i u1 = _mm512_loadu_si512((const void *)(wb + TSR__Q4K_SCALES + 64));
    __m512i u2 = _mm512_loadu_si512((const void *)(wb + TSR__Q4K_SCALES + 128));
    __m512i s0 = _mm512_and_si512(u0, k3f);
    __m512i hi0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k03), 4);
    __m512i hi1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k03), 4);
    __m512i s1 = _mm512_or_si512(_mm512_and_si512(u2, k0f), hi0);
    __m512i n0 = _mm512_and_si512(u1, k3f);
    __m512i n1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k0f), hi1);
    /* mins as int16 pairs per lane: (m0, m2), (m1, m3), (m4, m6), (m5, m7) */
    __m512i p02 = _mm512_and_si512(n0, kw), p13 = _mm512_and_si512(_mm512_srli_epi32(n0, 8), kw);
    __m512i p46 = _mm512_and_si512(n1, kw), p57 = _mm512_and_si512(_mm512_srli_epi32(n1, 8), kw);
    __m512i is[4], ms[4];
    const int8_t *x[4];
    /* every loop over tokens unrolled (nx is a constant after inlining), as in
     * quant_q8_avx512.c: left as loops, GCC keeps the accumulators of nx 3 and 4 in memory */
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        const int32_t *s = xs + k * TSR__Q4K_SUB;
        x[i] = xq + k * TSR_Q4K_BLOCK;
        is[i] = _mm512_setzero_si512();
        ms[i] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p02, tsr__q4k_z_pair(s, 0, 2));
        ms[i] = _mm512_dpwssd_epi32(ms[i], p13, tsr__q4k_z_pair(s, 1, 3));
        ms[i] = _mm512_dpwssd_epi32(ms[i], p46, tsr__q4k_z_pair(s, 4, 6));
        ms[i] = _mm512_dpwssd_epi32(ms[i], p57, tsr__q4k_z_pair(s, 5, 7));
    }
    TSR__Q4K_Z_CHUNK(0, s0, 0);
    TSR__Q4K_Z_CHUNK(1, s0, 16);
    TSR__Q4K_Z_CHUNK(2, s1, 0);
    TSR__Q4K_Z_CHUNK(3, s1, 16);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + TSR__Q4K_DMIN)));
    const __m512i sign = _mm512_set1_epi32((int32_t)0x80000000u); /* -(v) exactly, zeros too */
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        __m512 dx = _mm512_set1_ps(xd[(size_t)i * (size_t)nb + (size_t)b]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[i]), _mm512_mul_ps(dw, dx), acc[i]);
        __m512 nm = _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(mw, dx)), sign));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ms[i]), nm, acc[i]);
    }
}

#define TSR__Q4K_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

TSR__Q4K_GEMV_DEF(tsr__q4k_z, tsr__q4k_z_block, __m512, _mm512_setzero_ps(), TSR__Q4K_Z_STORE)

const tsr__q4k_kernels tsr__q4k_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni", tsr__q4k_z_gemv};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
