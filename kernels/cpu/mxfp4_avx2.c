/* MXFP4 rows on AVX2 (mxfp4_internal.h: the scalar kernel's bits, the 32 running sums in 4
 * registers). Decode of 8 elements from one little-endian 32-bit word of a block: element k
 * is nibble k (bits 4k .. 4k + 3; element 2j = low nibble of byte j, 2j + 1 = its high
 * nibble), so a variable shift of the broadcast word by 0, 4, .., 28 lines the codes up;
 * vpermps with the 8 magnitudes takes the low 3 bits, bit 3 becomes the sign bit; times the
 * block's 2^(scale - 127). Up to 4 inputs share each decoded block (decode is the dominant
 * cost of a single-token product); more inputs decode the row once into the scratch row and
 * stream it per 4 inputs. The target is avx2 without fma, so no multiply-add is ever
 * fused. */
#include "kernels/cpu/mxfp4_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

#define TSR__MX2_INLINE static inline __attribute__((always_inline))

TSR__MX2_INLINE __m256 tsr__mx2_dec8(uint32_t u, __m256 sc) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256 mags = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    __m256i code = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), shifts),
                                    _mm256_set1_epi32(15));
    __m256 mag = _mm256_permutevar8x32_ps(mags, code); /* index: the low 3 bits */
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
    return _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), sc);
}

TSR__MX2_INLINE __m256 tsr__mx2_scale(uint8_t s) {
    uint32_t u = s ? (uint32_t)s << 23 : 0x00400000u; /* 2^(s - 127); s = 0: subnormal */
    float f;
    memcpy(&f, &u, 4);
    return _mm256_set1_ps(f);
}

/* The 32 sums of one output, 4 registers (block positions 0-7, 8-15, 16-23, 24-31): the
 * shared fold's first two steps are the two register adds. */
TSR__MX2_INLINE float tsr__mx2_fold(const __m256 acc[4]) {
    float a[8];
    _mm256_storeu_ps(a, _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
    return tsr__mxfp4_fold8(a);
}

/* Row r against inputs x[0 .. m) (m <= 4, a constant after inlining), decoding each block
 * once; per input 4 independent sums. */
TSR__MX2_INLINE void tsr__mx2_row_fused(const uint8_t *q, const uint8_t *s, int64_t cols,
                                        const float *x, int m, float *out, int64_t ldo) {
    __m256 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++) acc[i][k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < cols / 32; b++) {
        __m256 sc = tsr__mx2_scale(s[b]);
        uint32_t u[4];
        memcpy(u, q + b * 16, 16);
        for (int k = 0; k < 4; k++) {
            __m256 w = tsr__mx2_dec8(u[k], sc);
            for (int i = 0; i < m; i++)
                acc[i][k] = _mm256_add_ps(
                    acc[i][k], _mm256_mul_ps(w, _mm256_loadu_ps(x + i * cols + b * 32 + k * 8)));
        }
    }
    for (int i = 0; i < m; i++) out[i * ldo] = tsr__mx2_fold(acc[i]);
}

/* Row decoded into w (cols floats), then against inputs x[0 .. m) (m <= 4). */
TSR__MX2_INLINE void tsr__mx2_row_buf(const float *w, int64_t cols, const float *x, int m,
                                      float *out, int64_t ldo) {
    __m256 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++) acc[i][k] = _mm256_setzero_ps();
    for (int64_t c = 0; c < cols; c += 32)
        for (int k = 0; k < 4; k++) {
            __m256 wv = _mm256_loadu_ps(w + c + k * 8);
            for (int i = 0; i < m; i++)
                acc[i][k] = _mm256_add_ps(
                    acc[i][k], _mm256_mul_ps(wv, _mm256_loadu_ps(x + i * cols + c + k * 8)));
        }
    for (int i = 0; i < m; i++) out[i * ldo] = tsr__mx2_fold(acc[i]);
}

static void tsr__mx2_decode_row(const uint8_t *q, const uint8_t *s, int64_t cols, float *w) {
    for (int64_t b = 0; b < cols / 32; b++) {
        __m256 sc = tsr__mx2_scale(s[b]);
        uint32_t u[4];
        memcpy(u, q + b * 16, 16);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(w + b * 32 + k * 8, tsr__mx2_dec8(u[k], sc));
    }
}

void tsr__mxfp4_rows_avx2(const uint8_t *blocks, const uint8_t *scales, int64_t r0, int64_t r1,
                          int64_t rows, int64_t cols, const float *x, int64_t nx, float *y,
                          float *w) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = blocks + (size_t)r * (size_t)(cols / 2);
        const uint8_t *s = scales + (size_t)r * (size_t)(cols / 32);
        if (nx <= 4) {
            switch (nx) {
            case 1: tsr__mx2_row_fused(q, s, cols, x, 1, y + r, rows); break;
            case 2: tsr__mx2_row_fused(q, s, cols, x, 2, y + r, rows); break;
            case 3: tsr__mx2_row_fused(q, s, cols, x, 3, y + r, rows); break;
            case 4: tsr__mx2_row_fused(q, s, cols, x, 4, y + r, rows); break;
            default: break;
            }
            continue;
        }
        tsr__mx2_decode_row(q, s, cols, w);
        int64_t i = 0;
        for (; i + 4 <= nx; i += 4)
            tsr__mx2_row_buf(w, cols, x + i * cols, 4, y + i * rows + r, rows);
        switch (nx - i) {
        case 1: tsr__mx2_row_buf(w, cols, x + i * cols, 1, y + i * rows + r, rows); break;
        case 2: tsr__mx2_row_buf(w, cols, x + i * cols, 2, y + i * rows + r, rows); break;
        case 3: tsr__mx2_row_buf(w, cols, x + i * cols, 3, y + i * rows + r, rows); break;
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
