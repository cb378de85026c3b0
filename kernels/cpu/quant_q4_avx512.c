/* The AVX-512 VNNI 4-bit kernel (quant_q4_internal.h), under its own target pragma: per
 * 32-column block of a 16-row group, 4 loads of 64 bytes (16 rows x 8 codes), each split into
 * its low nibbles (columns 4s..4s+3) and high nibbles (16 further), each multiplied with the
 * 4 broadcast int8 activations by vpdpbusd into 16 int32 row sums; Q4_0 subtracts 8 * the
 * activation block's sum; then one fma per block with the rows' scales times the token's
 * (Q4_1: and one with the rows' m times the token's block sum). MXFP4 maps each nibble
 * through the vpshufb table to twice its value + 12 and subtracts 12 * the block sum, its
 * scales E8M0. No horizontal sums; each weight load serves up to 4 tokens. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h): on an
 * AMX Xeon SmolLM2 Q4_1 decoded 1.35-1.43x faster so (its weights in that VM's L3), an
 * 8-layer GPT-OSS (experts from DRAM, 1.27 GB a token) 5 % slower (docs/kernels-cpu.md). */
#define TSR__Q_PREFETCH_BYTES 4096
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

/* 16 rows' E8M0 bytes as tsr__mx_scale gives them: the byte as the exponent field (0: the
 * subnormal 2^-127), halved. */
static inline __attribute__((always_inline)) __m512 tsr__q4_z_e8m0(const uint8_t *e) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)e));
    __m512i u = _mm512_mask_mov_epi32(_mm512_slli_epi32(v, 23),
                                      _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()),
                                      _mm512_set1_epi32(0x00400000));
    return _mm512_mul_ps(_mm512_castsi512_ps(u), _mm512_set1_ps(0.5f));
}

/* A block's codes as vpdpbusd multiplies them: the nibble, or for MXFP4 twice its E2M1
 * value + 12 through the vpshufb table (in each 128-bit lane). */
static inline __attribute__((always_inline)) __m512i tsr__q4_z_codes(__m512i nib, const int mx) {
    if (!mx) return nib;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(TSR__MX_LUT12));
    return _mm512_shuffle_epi8(lut, nib);
}

/* The rows' scales of a block: fp16 d, or MXFP4's E8M0. */
static inline __attribute__((always_inline)) __m512 tsr__q4_z_scales(const uint8_t *wb,
                                                                   const int mx) {
    return mx ? tsr__q4_z_e8m0(wb) : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
}

/* ty: 0 Q4_0, 1 Q4_1, 2 MXFP4 (a constant after inlining). */
static inline __attribute__((always_inline)) void
tsr__q4_z_blk(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
              const float *xm, int64_t nb, int64_t b, int nx, __m512 *acc, const int ty) {
    const int q41 = ty == 1, mx = ty == 2;
    const uint8_t *codes = wb + (q41 ? 64 : mx ? 16 : 32);
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
        __m512i wl = tsr__q4_z_codes(_mm512_and_si512(w, m4), mx);
        __m512i wh = tsr__q4_z_codes(_mm512_and_si512(_mm512_srli_epi16(w, 4), m4), mx);
        #pragma GCC unroll 8
        for (int i = 0; i < nx; i++) {
            a0[i] = _mm512_dpbusd_epi32(a0[i], wl, _mm512_set1_epi32(tsr__q_x4(x[i] + 4 * s)));
            a1[i] = _mm512_dpbusd_epi32(a1[i], wh,
                                        _mm512_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s)));
        }
    }
    __m512 dw = tsr__q4_z_scales(wb, mx);
    __m512 mw = q41 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + 32)))
                    : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m512i is = _mm512_add_epi32(a0[i], a1[i]);
        if (!q41) is = _mm512_sub_epi32(is, _mm512_set1_epi32((mx ? 12 : 8) * xs[k]));
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

static inline __attribute__((always_inline)) void
tsr__q4_z_blockm(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, __m512 *acc) {
    tsr__q4_z_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 2);
}

/* Block b of two groups at once for nx >= 2 tokens (as the Q8_0 kernel's tsr__q8_z_block2):
 * each broadcast of a token's 4 int8 values feeds both groups' codes. The operations per
 * row and token are tsr__q4_z_blk's, so are the bits. */
static inline __attribute__((always_inline)) void
tsr__q4_z_blk2(const uint8_t *wb0, const uint8_t *wb1, const int8_t *xq, const float *xd,
               const int32_t *xs, const float *xm, int64_t nb, int64_t b, int nx, __m512 *acc0,
               __m512 *acc1, const int ty) {
    const int q41 = ty == 1, mx = ty == 2;
    const int off = q41 ? 64 : mx ? 16 : 32;
    const uint8_t *c0 = wb0 + off, *c1 = wb1 + off;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i a0[4], a1[4], e0[4], e1[4]; /* group 0 low/high nibbles, group 1 low/high */
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        a0[i] = a1[i] = e0[i] = e1[i] = _mm512_setzero_si512();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q4_BLOCK;
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m512i w0 = _mm512_loadu_si512((const void *)(c0 + s * 64));
        __m512i w1 = _mm512_loadu_si512((const void *)(c1 + s * 64));
        __m512i w0l = tsr__q4_z_codes(_mm512_and_si512(w0, m4), mx);
        __m512i w0h = tsr__q4_z_codes(_mm512_and_si512(_mm512_srli_epi16(w0, 4), m4), mx);
        __m512i w1l = tsr__q4_z_codes(_mm512_and_si512(w1, m4), mx);
        __m512i w1h = tsr__q4_z_codes(_mm512_and_si512(_mm512_srli_epi16(w1, 4), m4), mx);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m512i xl = _mm512_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            __m512i xh = _mm512_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s));
            a0[i] = _mm512_dpbusd_epi32(a0[i], w0l, xl);
            a1[i] = _mm512_dpbusd_epi32(a1[i], w0h, xh);
            e0[i] = _mm512_dpbusd_epi32(e0[i], w1l, xl);
            e1[i] = _mm512_dpbusd_epi32(e1[i], w1h, xh);
        }
    }
    __m512 dw0 = tsr__q4_z_scales(wb0, mx), dw1 = tsr__q4_z_scales(wb1, mx);
    __m512 mw0 = q41 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb0 + 32)))
                     : _mm512_setzero_ps();
    __m512 mw1 = q41 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb1 + 32)))
                     : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m512i is0 = _mm512_add_epi32(a0[i], a1[i]), is1 = _mm512_add_epi32(e0[i], e1[i]);
        if (!q41) {
            __m512i c8 = _mm512_set1_epi32((mx ? 12 : 8) * xs[k]);
            is0 = _mm512_sub_epi32(is0, c8);
            is1 = _mm512_sub_epi32(is1, c8);
        }
        __m512 xv = _mm512_set1_ps(xd[k]);
        acc0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is0), _mm512_mul_ps(dw0, xv), acc0[i]);
        acc1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is1), _mm512_mul_ps(dw1, xv), acc1[i]);
        if (q41) {
            __m512 mv = _mm512_set1_ps(xm[k]);
            acc0[i] = _mm512_fmadd_ps(mw0, mv, acc0[i]);
            acc1[i] = _mm512_fmadd_ps(mw1, mv, acc1[i]);
        }
    }
}

#define TSR__Q4_Z_STORE(dst, a) _mm512_storeu_ps(dst, a)

/* Groups g and g + 1 (both inside the matrix) through tsr__q4_z_blk2. */
static inline __attribute__((always_inline)) void
tsr__q4_z_pair(const uint8_t *w, int64_t nb, int64_t rows, int64_t g, const int8_t *xq,
               const float *xd, const int32_t *xs, const float *xm, int nx, const int32_t *bseg,
               int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp, const int ty) {
#define TSR__Q4_Z_BLOCK2(w0, w1, b, a0, a1)                                                  \
    tsr__q4_z_blk2(w0, w1, xq, xd, xs, xm, nb, b, nx, a0, a1, ty)
    const int gbb = ty == 1 ? TSR__Q4_1_GBB : ty == 2 ? TSR__MX_GBB : TSR__Q4_0_GBB;
    TSR__QPAIR_BODY(nx, gbb, TSR__Q4_Z_BLOCK2, __m512, _mm512_setzero_ps(), TSR__Q4_Z_STORE)
#undef TSR__Q4_Z_BLOCK2
}


/* One type's kernel: pairs of groups for 2+ tokens, then the one-group body (one token
 * streams the codes from memory: one group at a time is as fast). */
#define TSR__Q4_Z_NX(NAME, TY, GBB, BLOCK)                                                   \
    static inline __attribute__((always_inline)) void NAME(                                 \
        const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,                 \
        const int8_t *xq, const float *xd, const int32_t *xs, const float *xm, int nx,      \
        const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp) {   \
        if (nx >= 2)                                                                        \
            for (; g0 + 2 <= g1; g0 += 2)                                                   \
                tsr__q4_z_pair(w, nb, rows, g0, xq, xd, xs, xm, nx, bseg, n_parts, sum, y,  \
                               ldy, ldp, TY);                                               \
        TSR__Q4_GEMV_BODY(nx, GBB, BLOCK, __m512, _mm512_setzero_ps(), TSR__Q4_Z_STORE)      \
    }

TSR__Q4_Z_NX(tsr__q4_z_nx0, 0, TSR__Q4_0_GBB, tsr__q4_z_block0)
TSR__Q4_Z_NX(tsr__q4_z_nx1, 1, TSR__Q4_1_GBB, tsr__q4_z_block1)
TSR__Q4_Z_NX(tsr__q4_z_nxm, 2, TSR__MX_GBB, tsr__q4_z_blockm)
TSR__Q4_GEMV_FN(tsr__q4_z_gemv0, tsr__q4_z_nx0)
TSR__Q4_GEMV_FN(tsr__q4_z_gemv1, tsr__q4_z_nx1)
TSR__Q4_GEMV_FN(tsr__q4_z_gemvm, tsr__q4_z_nxm)

const tsr__q4_kernels tsr__q4_k_avx512vnni = {TSR__Q8_AVX512VNNI, "avx512vnni", tsr__q4_z_gemv0,
                                              tsr__q4_z_gemv1, tsr__q4_z_gemvm};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
