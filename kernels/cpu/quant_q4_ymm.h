/* The 256-bit 4-bit kernels' body, included by quant_q4_avx2.c and quant_q4_avxvnni.c under
 * their target pragmas; each defines TSR__Q4_YDOT(acc, w, x) (acc + per 32-bit lane the sum
 * of 4 products of u8 w and s8 x), TSR__Q4_Y_VARIANT, TSR__Q4_Y_NAME and TSR__Q4_Y_TABLE
 * first. The 16 rows of a group in two 8-lane halves (each 64-byte code step is rows 0-7 then
 * 8-15); the low nibbles meet the activations 4s..4s+3, the high ones 16 further. */
#ifndef TSR__Q4_YDOT
#error "define TSR__Q4_YDOT before including quant_q4_ymm.h"
#endif

#include <string.h>

typedef struct {
    __m256 lo, hi;
} tsr__q4_y_acc;

/* Every loop over the nx tokens is unrolled (`GCC unroll`; nx is a constant after inlining):
 * left as loops, GCC keeps the accumulators of nx 3 and 4 in memory (quant_q8_avx512.c). */
static inline __attribute__((always_inline)) int32_t tsr__q4_y_x4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return v;
}

static inline __attribute__((always_inline)) void
tsr__q4_y_blk(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
              const float *xm, int64_t nb, int64_t b, int nx, tsr__q4_y_acc *acc,
              const int q41) {
    const uint8_t *codes = wb + (q41 ? 64 : 32);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i lo[4], hi[4];
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        lo[i] = hi[i] = _mm256_setzero_si256();
        x[i] = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q4_BLOCK;
    }
    for (int s = 0; s < 4; s++) {
        __m256i wl = _mm256_loadu_si256((const __m256i *)(codes + s * 64));
        __m256i wh = _mm256_loadu_si256((const __m256i *)(codes + s * 64 + 32));
        __m256i wl0 = _mm256_and_si256(wl, m4), wl1 = _mm256_and_si256(_mm256_srli_epi16(wl, 4), m4);
        __m256i wh0 = _mm256_and_si256(wh, m4), wh1 = _mm256_and_si256(_mm256_srli_epi16(wh, 4), m4);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256i xa = _mm256_set1_epi32(tsr__q4_y_x4(x[i] + 4 * s));
            __m256i xb = _mm256_set1_epi32(tsr__q4_y_x4(x[i] + 16 + 4 * s));
            lo[i] = TSR__Q4_YDOT(TSR__Q4_YDOT(lo[i], wl0, xa), wl1, xb);
            hi[i] = TSR__Q4_YDOT(TSR__Q4_YDOT(hi[i], wh0, xa), wh1, xb);
        }
    }
    __m256 dl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wb));
    __m256 dh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16)));
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        size_t k = (size_t)i * (size_t)nb + (size_t)b;
        __m256 dx = _mm256_set1_ps(xd[k]);
        if (!q41) {
            __m256i c = _mm256_set1_epi32(8 * xs[k]);
            lo[i] = _mm256_sub_epi32(lo[i], c);
            hi[i] = _mm256_sub_epi32(hi[i], c);
        }
        acc[i].lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[i]), _mm256_mul_ps(dl, dx), acc[i].lo);
        acc[i].hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[i]), _mm256_mul_ps(dh, dx), acc[i].hi);
        if (q41) {
            __m256 sx = _mm256_set1_ps(xm[k]);
            __m256 ml = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 32)));
            __m256 mh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 48)));
            acc[i].lo = _mm256_fmadd_ps(ml, sx, acc[i].lo);
            acc[i].hi = _mm256_fmadd_ps(mh, sx, acc[i].hi);
        }
    }
}

static inline __attribute__((always_inline)) void
tsr__q4_y_block0(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, tsr__q4_y_acc *acc) {
    tsr__q4_y_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 0);
}

static inline __attribute__((always_inline)) void
tsr__q4_y_block1(const uint8_t *wb, const int8_t *xq, const float *xd, const int32_t *xs,
                 const float *xm, int64_t nb, int64_t b, int nx, tsr__q4_y_acc *acc) {
    tsr__q4_y_blk(wb, xq, xd, xs, xm, nb, b, nx, acc, 1);
}

#define TSR__Q4_Y_STORE(dst, a)                                                              \
    do {                                                                                     \
        _mm256_storeu_ps(dst, (a).lo);                                                       \
        _mm256_storeu_ps((dst) + 8, (a).hi);                                                 \
    } while (0)
#define TSR__Q4_Y_ZERO ((tsr__q4_y_acc){_mm256_setzero_ps(), _mm256_setzero_ps()})

TSR__Q4_GEMV_PAIR(tsr__q4_y, tsr__q4_y_acc, TSR__Q4_Y_ZERO, TSR__Q4_Y_STORE)

const tsr__q4_kernels TSR__Q4_Y_TABLE = {TSR__Q4_Y_VARIANT, TSR__Q4_Y_NAME, tsr__q4_y_gemv0,
                                         tsr__q4_y_gemv1};
