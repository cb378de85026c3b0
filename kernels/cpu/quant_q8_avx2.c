/* The AVX2 Q8_0 kernel (quant_q8_internal.h), under its own target pragma: the 16 rows of a
 * group in two 8-lane halves; per 4-column step the u8 weights become s8 again (xor 0x80),
 * and vpmaddubsw multiplies |x| with sign(w, x) (no pair sum can saturate: |q|, |x| <= 127), then
 * vpmaddwd with ones gives each row's 4-product int32 sum. The same exact integer sums, scale
 * and fma per block as the other variants. For 4 tokens two groups share each broadcast. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h). */
#define TSR__Q_PREFETCH_BYTES 4096
#include "kernels/cpu/quant_q8_internal.h"

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

/* Block b of NG (1 or 2, a constant after inlining) groups: wb[h] and acc[h] are group h's
 * bytes and accumulators. With two groups each broadcast of a token's 4 int8 values feeds
 * four weight vectors instead of two. One source for both counts, so a row's operations
 * (and bits) do not depend on whether its group ran alone or in a pair. */
static inline __attribute__((always_inline)) void
tsr__q8_y_blkn(const uint8_t *const *wb, int ng, const int8_t *xq, const float *xd, int64_t nb,
               int64_t b, int nx, tsr__ymm_acc *const *acc) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i lo[2][4], hi[2][4];
    const int8_t *x[4];
    /* the loops over tokens and groups unrolled (nx and ng are constants after inlining),
     * as in quant_q8_avx512.c: left as loops, GCC keeps the accumulators of nx 3 and 4 in
     * memory (unrolling the 8 steps too made nx = 1 slower here) */
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
#pragma GCC unroll 2
        for (int h = 0; h < ng; h++) lo[h][i] = hi[h][i] = _mm256_setzero_si256();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q8_BLOCK;
    }
    for (int s = 0; s < 8; s++) {
        __m256i wl[2], wh[2];
#pragma GCC unroll 2
        for (int h = 0; h < ng; h++) {
            const uint8_t *ws = wb[h] + 32 + s * 64;
            wl[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)ws), flip);
            wh[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(ws + 32)), flip);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            /* |x| (4 values, one vpabsb per step and token) times sign(w, x): the same
             * products as |w| times sign(x, w), without a vpabsb per weight register */
            __m256i xb = _mm256_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            __m256i ax = _mm256_abs_epi8(xb);
#pragma GCC unroll 2
            for (int h = 0; h < ng; h++) {
                __m256i pl = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wl[h], xb));
                __m256i ph = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wh[h], xb));
                lo[h][i] = _mm256_add_epi32(lo[h][i], _mm256_madd_epi16(pl, ones));
                hi[h][i] = _mm256_add_epi32(hi[h][i], _mm256_madd_epi16(ph, ones));
            }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < ng; h++) {
        __m256 dl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wb[h]));
        __m256 dh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb[h] + 16)));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256 dx = _mm256_set1_ps(xd[(size_t)i * (size_t)nb + (size_t)b]);
            tsr__ymm_acc *a = &acc[h][i];
            a->lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[h][i]), _mm256_mul_ps(dl, dx), a->lo);
            a->hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[h][i]), _mm256_mul_ps(dh, dx), a->hi);
        }
    }
}

static inline __attribute__((always_inline)) void
tsr__q8_y_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    (void)xs;
    tsr__q8_y_blkn(&wb, 1, xq, xd, nb, b, nx, &acc);
}

/* The fewest tokens that run two groups per pass. With 16 ymm registers a pair's int32
 * sums (2 groups x 2 halves x nx) no longer all fit, so the pair pays only where it saves
 * the most broadcasts: tsr_q8gemm on one core of an AVX2-only EPYC (Zen 1) measured nx 4
 * 4-13 % faster in pairs, nx 3 the same, nx 2 about 10 % slower (docs/perf.md). */
#define TSR__Q8_Y_PAIR_NX 4

/* Groups g and g + 1 (both inside the matrix) through tsr__q8_y_blkn, as the AVX-512
 * kernel's tsr__q8_z_pair. */
static inline __attribute__((always_inline)) void
tsr__q8_y_pair(const uint8_t *w, int64_t nb, int64_t rows, int64_t g, const int8_t *xq,
               const float *xd, int nx, const int32_t *bseg, int n_parts, bool sum, float *y,
               int64_t ldy, int64_t ldp) {
#define TSR__Q8_Y_BLOCK2(w0, w1, b, a0, a1)                                                  \
    tsr__q8_y_blkn((const uint8_t *const[2]){w0, w1}, 2, xq, xd, nb, b, nx,                  \
                   (tsr__ymm_acc *const[2]){a0, a1})
    TSR__QPAIR_BODY(nx, TSR_Q8_GROUP_BLOCK_BYTES, TSR__Q8_Y_BLOCK2, tsr__ymm_acc,
                    TSR__YMM_ZERO, TSR__YMM_STORE)
#undef TSR__Q8_Y_BLOCK2
}

static inline __attribute__((always_inline)) void
tsr__q8_y_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                  const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                  const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                  int64_t ldp) {
    if (nx >= TSR__Q8_Y_PAIR_NX)
        for (; g0 + 2 <= g1; g0 += 2)
            tsr__q8_y_pair(w, nb, rows, g0, xq, xd, nx, bseg, n_parts, sum, y, ldy, ldp);
    TSR__Q8_GEMV_BODY(nx, tsr__q8_y_block, tsr__ymm_acc, TSR__YMM_ZERO, TSR__YMM_STORE)
}

TSR__Q8_GEMV_FN(tsr__q8_y_gemv, tsr__q8_y_gemv_nx)

/* tsr__q8_quantize_act's operations in 8 lanes (as quant_q8_avx512.c's in 16): max of |x|
 * (exact), the scalar d and 1/d, v = x * id, truncation, and the half-away rounding of the
 * exact fraction; the int32 codes packed to int8 in order (vpackssdw and vpacksswb work per
 * 128-bit lane, vpermd puts the 4-byte groups back). */
static void tsr__q8_y_quant_act(const float *x, int64_t cols, int8_t *qs, float *d,
                                int32_t *bsum, float *xm) {
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
        const float *xb = x + b * TSR_Q8_BLOCK;
        __m256 xv[4];
        __m256 m = _mm256_setzero_ps();
        for (int h = 0; h < 4; h++) {
            xv[h] = _mm256_loadu_ps(xb + 8 * h);
            m = _mm256_max_ps(m, _mm256_and_ps(xv[h], absmask));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        float dd = amax / 127.0f;
        float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int h = 0; h < 4; h++) {
            __m256 v = _mm256_mul_ps(xv[h], vid);
            __m256i i = _mm256_cvttps_epi32(v);
            __m256 f = _mm256_sub_ps(v, _mm256_cvtepi32_ps(i));
            /* a compare's true lanes are -1: subtracting adds one, adding subtracts one */
            i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(f, half, _CMP_GE_OQ)));
            i = _mm256_add_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(f, mhalf, _CMP_LE_OQ)));
            q[h] = i;
            sum = _mm256_add_epi32(sum, i);
        }
        __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                        _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qs + b * TSR_Q8_BLOCK),
                            _mm256_permutevar8x32_epi32(p8, order));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        bsum[b] = _mm_cvtsi128_si32(s4);
        d[b] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(dd), _MM_FROUND_TO_NEAREST_INT)));
        if (xm)
            xm[b] = _mm_cvtss_f32(_mm_cvtph_ps(
                _mm_cvtps_ph(_mm_set_ss((float)bsum[b] * dd), _MM_FROUND_TO_NEAREST_INT)));
    }
}

const tsr__q8_kernels tsr__q8_k_avx2 = {TSR__Q8_AVX2, "avx2", tsr__q8_y_gemv,
    tsr__q8_y_quant_act};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
