/* The AVX2 Q6_K kernel (quant_q6k_internal.h), under its own target pragma: per 4-column step
 * of a block, one 256-bit vector of each half (rows 0-7, 8-15) holds the low nibbles of its
 * rows' 4 columns of the first 16 and, in the high nibbles, of the last 16; the high bits
 * come from one vector per 16 columns shifted into bits 4-5 (epi16 shifts: the mask drops
 * what crosses a byte). The codes stay unsigned (0..63, q + 32) for vpmaddubsw against the
 * int8 activations, whose pair sums (at most 2 * 63 * 127) are added in int16 over two steps
 * (at most 32004), then vpmaddwd with each row's scale in both int16 halves; the offset
 * 32 * (sc_a X_a + sc_b X_b) comes off once per block, X the activations' 16-column sums
 * (xs, tsr__q6k_act_sums): the exact isum of quant_q6k.h, with no vpsignb or vpabsb per
 * step. The float step is Q8_0's: one fma per block with d_w * d_x. AVX-VNNI and AVX-512
 * CPUs run this kernel too. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h). */
#define TSR__Q_PREFETCH_BYTES 4096
#include "kernels/cpu/quant_q6k_internal.h"

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

/* Bits 2s, 2s + 1 of every byte of h moved to bits 4, 5 (s a constant after unrolling). */
static inline __attribute__((always_inline)) __m256i tsr__q6k_y_high(__m256i h, int s) {
    const __m256i m30 = _mm256_set1_epi8(0x30);
    switch (s) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(h, 4), m30);
    case 1: return _mm256_and_si256(_mm256_slli_epi16(h, 2), m30);
    case 2: return _mm256_and_si256(h, m30);
    default: return _mm256_and_si256(_mm256_srli_epi16(h, 2), m30);
    }
}

static inline __attribute__((always_inline)) void
tsr__q6k_y_block(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 int64_t nb, int64_t b, int nx, tsr__ymm_acc *acc) {
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    /* each row's two scales as int16 (a, b) in its 32-bit lane; a in both halves; b */
    const __m256i dupa = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0,
                                          1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dupb = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                          2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
    __m256i sc[2], sca[2], scb[2], ha[2], hb[2];
    /* [half][token]: the int32 row sums, and the int16 pair sums of two steps of columns
     * 0-15 (a) and 16-31 (b) */
    __m256i is[2][4], pa[2][4], pb[2][4];
    const int8_t *x[4];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        sc[h] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + TSR__Q6K_SC + 16 * h)));
        sca[h] = _mm256_shuffle_epi8(sc[h], dupa);
        scb[h] = _mm256_shuffle_epi8(sc[h], dupb);
        ha[h] = _mm256_loadu_si256((const __m256i *)(wb + TSR__Q6K_QHA + 32 * h));
        hb[h] = _mm256_loadu_si256((const __m256i *)(wb + TSR__Q6K_QHB + 32 * h));
    }
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        x[i] = xq + k * TSR_Q6K_BLOCK;
        /* 32 * (sc_a X_a + sc_b X_b), the codes' offset, from the 16-column sums */
        __m256i xab = _mm256_set1_epi32(xs[k]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            is[h][i] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_slli_epi32(_mm256_madd_epi16(sc[h], xab), 5));
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m256i ca[2], cb[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i l = _mm256_loadu_si256((const __m256i *)(wb + TSR__Q6K_QL + 64 * s + 32 * h));
            ca[h] = _mm256_or_si256(_mm256_and_si256(l, m0f), tsr__q6k_y_high(ha[h], s));
            cb[h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m0f),
                                    tsr__q6k_y_high(hb[h], s));
        }
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256i xa = _mm256_set1_epi32(tsr__q_x4(x[i] + 4 * s));
            __m256i xb = _mm256_set1_epi32(tsr__q_x4(x[i] + 16 + 4 * s));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i ta = _mm256_maddubs_epi16(ca[h], xa);
                __m256i tb = _mm256_maddubs_epi16(cb[h], xb);
                if (s % 2 == 0) {
                    pa[h][i] = ta;
                    pb[h][i] = tb;
                } else { /* two steps in int16, then the rows' scales */
                    is[h][i] = _mm256_add_epi32(
                        is[h][i],
                        _mm256_add_epi32(
                            _mm256_madd_epi16(_mm256_add_epi16(pa[h][i], ta), sca[h]),
                            _mm256_madd_epi16(_mm256_add_epi16(pb[h][i], tb), scb[h])));
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16 * h)));
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(xd[(size_t)i * (size_t)nb + (size_t)b]));
            __m256 *a = h ? &acc[i].hi : &acc[i].lo;
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[h][i]), dd, *a);
        }
    }
}

static inline __attribute__((always_inline)) void
tsr__q6k_y_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                   const int8_t *xq, const float *xd, const int32_t *xs, int nx,
                   const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                   int64_t ldp) {
    TSR__QGEMV_BODY(nx, TSR__Q6K_GBB, tsr__q6k_y_block, tsr__ymm_acc, TSR__YMM_ZERO,
                    TSR__YMM_STORE)
}

TSR__Q8_GEMV_FN(tsr__q6k_y_gemv, tsr__q6k_y_gemv_nx)

const tsr__q6k_kernels tsr__q6k_k_avx2 = {TSR__Q8_AVX2, "avx2", tsr__q6k_y_gemv};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
