/* MXFP4 rows on AVX-512F (mxfp4_internal.h: the scalar kernel's bits). A block's 16 bytes
 * widen to 16 int32 lanes; vpermd duplicates each byte into the lanes of its two elements
 * (2j and 2j + 1), a variable shift by 0 or 4 and a mask leave the code, and vpermps with
 * the 16-entry E2M1 table (sign included) gives the value, times the block's 2^(scale -
 * 127): 32 weights in two registers, whose lanes are also those of the 32 running sums
 * (one register of sums per half block). Up to 4 inputs share each decoded block; more
 * decode the row once into the scratch row. The target is avx512f; the project's -std=c11
 * keeps GCC from fusing the multiply into the add. */
#include "kernels/cpu/mxfp4_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif

#define TSR__MX5_INLINE static inline __attribute__((always_inline))

/* The block's 32 weights: w[0] elements 0..15, w[1] 16..31. */
TSR__MX5_INLINE void tsr__mx5_dec32(const uint8_t *q, uint8_t s, __m512 w[2]) {
    const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f,
                                      -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    const __m512i idx_lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i idx_hi =
        _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i m15 = _mm512_set1_epi32(15);
    uint32_t u = s ? (uint32_t)s << 23 : 0x00400000u; /* 2^(s - 127); s = 0: subnormal */
    float f;
    memcpy(&f, &u, 4);
    const __m512 sc = _mm512_set1_ps(f);
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(idx_lo, bytes), sh), m15);
    __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(idx_hi, bytes), sh), m15);
    w[0] = _mm512_mul_ps(_mm512_permutexvar_ps(lo, lut), sc);
    w[1] = _mm512_mul_ps(_mm512_permutexvar_ps(hi, lut), sc);
}

/* The 32 sums of one output, 2 registers (block positions 0-15, 16-31): the shared fold's
 * first step is their add, its second the add of the result's halves. */
TSR__MX5_INLINE float tsr__mx5_fold(__m512 a0, __m512 a1) {
    __m512 s16 = _mm512_add_ps(a0, a1);
    __m256 lo = _mm512_castps512_ps256(s16);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1));
    float a[8];
    _mm256_storeu_ps(a, _mm256_add_ps(lo, hi));
    return tsr__mxfp4_fold8(a);
}

TSR__MX5_INLINE void tsr__mx5_row_fused(const uint8_t *q, const uint8_t *s, int64_t cols,
                                        const float *x, int m, float *out, int64_t ldo) {
    __m512 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < cols / 32; b++) {
        __m512 w[2];
        tsr__mx5_dec32(q + b * 16, s[b], w);
        for (int i = 0; i < m; i++) {
            const float *xi = x + i * cols + b * 32;
            acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_mul_ps(w[0], _mm512_loadu_ps(xi)));
            acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_mul_ps(w[1], _mm512_loadu_ps(xi + 16)));
        }
    }
    for (int i = 0; i < m; i++) out[i * ldo] = tsr__mx5_fold(acc[i][0], acc[i][1]);
}

TSR__MX5_INLINE void tsr__mx5_row_buf(const float *w, int64_t cols, const float *x, int m,
                                      float *out, int64_t ldo) {
    __m512 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 32) { /* cols % 32 == 0 */
        __m512 w0 = _mm512_loadu_ps(w + c), w1 = _mm512_loadu_ps(w + c + 16);
        for (int i = 0; i < m; i++) {
            const float *xi = x + i * cols + c;
            acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_mul_ps(w0, _mm512_loadu_ps(xi)));
            acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_mul_ps(w1, _mm512_loadu_ps(xi + 16)));
        }
    }
    for (int i = 0; i < m; i++) out[i * ldo] = tsr__mx5_fold(acc[i][0], acc[i][1]);
}

void tsr__mxfp4_rows_avx512(const uint8_t *blocks, const uint8_t *scales, int64_t r0,
                            int64_t r1, int64_t rows, int64_t cols, const float *x, int64_t nx,
                            float *y, float *w) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = blocks + (size_t)r * (size_t)(cols / 2);
        const uint8_t *s = scales + (size_t)r * (size_t)(cols / 32);
        if (nx <= 4) {
            switch (nx) {
            case 1: tsr__mx5_row_fused(q, s, cols, x, 1, y + r, rows); break;
            case 2: tsr__mx5_row_fused(q, s, cols, x, 2, y + r, rows); break;
            case 3: tsr__mx5_row_fused(q, s, cols, x, 3, y + r, rows); break;
            case 4: tsr__mx5_row_fused(q, s, cols, x, 4, y + r, rows); break;
            default: break;
            }
            continue;
        }
        for (int64_t b = 0; b < cols / 32; b++) {
            __m512 wv[2];
            tsr__mx5_dec32(q + b * 16, s[b], wv);
            _mm512_storeu_ps(w + b * 32, wv[0]);
            _mm512_storeu_ps(w + b * 32 + 16, wv[1]);
        }
        int64_t i = 0;
        for (; i + 4 <= nx; i += 4)
            tsr__mx5_row_buf(w, cols, x + i * cols, 4, y + i * rows + r, rows);
        switch (nx - i) {
        case 1: tsr__mx5_row_buf(w, cols, x + i * cols, 1, y + i * rows + r, rows); break;
        case 2: tsr__mx5_row_buf(w, cols, x + i * cols, 2, y + i * rows + r, rows); break;
        case 3: tsr__mx5_row_buf(w, cols, x + i * cols, 3, y + i * rows + r, rows); break;
        default: break;
        }
    }
}

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
