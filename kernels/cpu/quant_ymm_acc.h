/* The 16 rows' f32 accumulators of the 256-bit quantized kernels (AVX2 and AVX-VNNI:
 * quant_q8_avx2.c, quant_q8_avxvnni.c, quant_q4_ymm.h, quant_q4k_ymm.h, quant_q5k_avx2.c,
 * quant_q6k_avx2.c): rows 0-7 of a group in lo, 8-15 in hi, stored and zeroed as the drivers'
 * ACC_STORE and ACC_ZERO (quant_q8_internal.h). Included after <immintrin.h>; the macros
 * expand under the includer's target pragma. */
#ifndef TSR_KERNELS_CPU_QUANT_YMM_ACC_H
#define TSR_KERNELS_CPU_QUANT_YMM_ACC_H

typedef struct {
    __m256 lo, hi;
} tsr__ymm_acc;

#define TSR__YMM_STORE(dst, a)                                                               \
    do {                                                                                     \
        _mm256_storeu_ps(dst, (a).lo);                                                       \
        _mm256_storeu_ps((dst) + 8, (a).hi);                                                 \
    } while (0)
#define TSR__YMM_ZERO ((tsr__ymm_acc){_mm256_setzero_ps(), _mm256_setzero_ps()})

#endif
