/* The AVX-512 VNNI Q8_0 kernel (quant_q8_internal.h), under its own target pragma like the
 * SIMD tables: per 32-column block of a 16-row group, 8 loads of 64 bytes (16 rows x 4
 * columns of u8 weights q + 128), each multiplied with the broadcast 4 int8 activations by
 * vpdpbusd into 16 int32 row sums; minus 128 * the activation block's sum, that is the exact
 * sum of q_w * q_x; then one fma per block with the 16 rows' scales times the token's. No
 * horizontal sums; each weight load serves up to 4 tokens. */
/* The weight stream prefetched 4 KiB ahead on Intel CPUs only (tsr__cpu_intel). */
#define TSR__Q_PREFETCH_BYTES (TSR__Q_PREFETCH_INTEL ? 4096 : 0)
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

/* Every loop over tokens and steps is unrolled (nx is a constant after inlining): left as
 * loops, GCC kept the accumulators of nx 3 and 4 in memory, a store and a reload around
 * every vpdpbusd. Each token's int32 sum starts at -128 * its block sum (the u8 offset of
 * the weights), so the epilogue is one convert, one product of the scales and one fma. */
static inline __attribute__((always_inline)) void
tsr__q8_z_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                int64_t nb, int64_t b, int nx, __m512 *acc) {
    __m512i a0[4], a1[4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        a0[i] = _mm512_set1_epi32(-128 * xs[k]);
        a1[i] = _mm512_setzero_si512();
        x[i] = xq + k * TSR_Q8_BLOCK;
    }
    /* nx <= 2: two chains per token, so vpdpbusd's latency hides behind the other's;
     * nx >= 3 has enough independent chains with one */
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m512i ws = _mm512_loadu_si512((const void *)(wb + 32 + s * 64));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m512i xb = _mm512_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            if (nx <= 2 && (s & 1))
                a1[i] = _mm512_dpbusd_epi32(a1[i], ws, xb);
            else
                a0[i] = _mm512_dpbusd_epi32(a0[i], ws, xb);
        }
    }
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m512i is = nx <= 2 ? _mm512_add_epi32(a0[i], a1[i]) : a0[i];
        __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[k]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), dd, acc[i]);
    }
}

/* Block b of two groups at once for nx >= 2 tokens: each broadcast of a token's 4 int8
 * values feeds both groups' weights, so a vpdpbusd needs about half the loads (with one
 * group, the loads rather than the vpdpbusd were the limit of batched products). The
 * operations per row and token are tsr__q8_z_block's, so are the bits. */
static inline __attribute__((always_inline)) void
tsr__q8_z_block2(const uint8_t *wb0, const uint8_t *wb1, const int8_t *xq, const float *xd,
                 const int32_t *xs, int64_t nb, int64_t b, int nx, __m512 *acc0,
                 __m512 *acc1) {
    __m512i s0[4], s1[4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        s0[i] = s1[i] = _mm512_set1_epi32(-128 * xs[k]);
        x[i] = xq + k * TSR_Q8_BLOCK;
    }
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m512i w0 = _mm512_loadu_si512((const void *)(wb0 + 32 + s * 64));
        __m512i w1 = _mm512_loadu_si512((const void *)(wb1 + 32 + s * 64));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m512i xb = _mm512_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            s0[i] = _mm512_dpbusd_epi32(s0[i], w0, xb);
            s1[i] = _mm512_dpbusd_epi32(s1[i], w1, xb);
        }
    }
    __m512 dw0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb0));
    __m512 dw1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb1));
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        __m512 xv = _mm512_set1_ps(xd[(size_t)i * (size_t)nb + (size_t)b]);
        acc0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[i]), _mm512_mul_ps(dw0, xv), acc0[i]);
        acc1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[i]), _mm512_mul_ps(dw1, xv), acc1[i]);
    }
}

#define TSR__Q8_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

/* Groups g and g + 1 (both inside the matrix) through tsr__q8_z_block2. */
static inline __attribute__((always_inline)) void
tsr__q8_z_pair(const uint8_t *w, int64_t nb, int64_t rows, int64_t g, const int8_t *xq,
               const float *xd, const int32_t *xs, int nx, const int32_t *bseg, int n_parts,
               bool sum, float *y, int64_t ldy, int64_t ldp) {
#define TSR__Q8_Z_BLOCK2(w0, w1, b, a0, a1) tsr__q8_z_block2(w0, w1, xq, xd, xs, nb, b, nx, a0, a1)
    TSR__QPAIR_BODY(nx, TSR_Q8_GROUP_BLOCK_BYTES, TSR__Q8_Z_BLOCK2, __m512, _mm512_setzero_ps(),
                    TSR__Q8_Z_STORE)
#undef TSR__Q8_Z_BLOCK2
}

static inline __attribute__((always_inline)) void
tsr__q8_z_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                  const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                  const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                  int64_t ldp) {
    /* one token streams the weights from memory: one group at a time is as fast */
    if (nx >= 2)
        for (; g0 + 2 <= g1; g0 += 2)
            tsr__q8_z_pair(w, nb, rows, g0, xq, xd, xs, nx, bseg, n_parts, sum, y, ldy, ldp);
    TSR__Q8_GEMV_BODY(nx, tsr__q8_z_block, __m512, _mm512_setzero_ps(), TSR__Q8_Z_STORE)
}

TSR__Q8_GEMV_FN(tsr__q8_z_gemv, tsr__q8_z_gemv_nx)

/* tsr__q8_quantize_act's operations in 16 lanes: max of |x| (exact), the scalar d and
 * 1/d, v = x * id, truncation, and the half-away rounding of the fraction (exact). */
static void tsr__q8_z_quant_act(const float *x, int64_t cols, int8_t *qs, float *d,
                                int32_t *bsum, float *xm) {
    const __m512 half = _mm512_set1_ps(0.5f), mhalf = _mm512_set1_ps(-0.5f);
    const __m512i one = _mm512_set1_epi32(1);
    for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
        const float *xb = x + b * TSR_Q8_BLOCK;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        float dd = amax / 127.0f;
        float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q[2];
        for (int h = 0; h < 2; h++) {
            __m512 v = _mm512_mul_ps(h ? x1 : x0, vid);
            __m512i i = _mm512_cvttps_epi32(v);
            __m512 f = _mm512_sub_ps(v, _mm512_cvtepi32_ps(i));
            i = _mm512_mask_add_epi32(i, _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ), i, one);
            i = _mm512_mask_sub_epi32(i, _mm512_cmp_ps_mask(f, mhalf, _CMP_LE_OQ), i, one);
            q[h] = i;
        }
        _mm_storeu_si128((__m128i *)(qs + b * TSR_Q8_BLOCK), _mm512_cvtepi32_epi8(q[0]));
        _mm_storeu_si128((__m128i *)(qs + b * TSR_Q8_BLOCK + 16), _mm512_cvtepi32_epi8(q[1]));
        bsum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
        d[b] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(dd), _MM_FROUND_TO_NEAREST_INT)));
        if (xm)
            xm[b] = _mm_cvtss_f32(_mm_cvtph_ps(
                _mm_cvtps_ph(_mm_set_ss((float)bsum[b] * dd), _MM_FROUND_TO_NEAREST_INT)));
    }
}

const tsr__q8_kernels tsr__q8_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni",
                                              tsr__q8_z_gemv, tsr__q8_z_quant_act};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
