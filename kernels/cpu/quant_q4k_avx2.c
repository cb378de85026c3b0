/* The AVX2 Q4_K kernel (quant_q4k_internal.h, body in quant_q4k_ymm.h): per sub-block,
 * vpmaddubsw of the u8 codes (0..15) and s8 activations (a pair at most 2 * 15 * 127) summed
 * over its 8 steps in int16 (at most 30480, no overflow), then vpmaddwd with the rows'
 * scales as int16 pairs: each row's exact scale * sub-block sum per lane, as llama.cpp's own
 * AVX2 Q4_K kernel weights its sums. */
/* No weight prefetch (tsr__qprefetch, quant_q8_internal.h): on the Zen 1 EPYC where the
 * other AVX2 kernels gained from 4 KiB ahead, this one lost (a random all-Q4_K llama,
 * dim 1024, hidden 4096, 8 layers: decode 143-144 against 115-122 tok/s at 2 threads). */
#include "kernels/cpu/quant_q4k_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define TSR__Q4K_Y_DOT(a, w, x) _mm256_add_epi16((a), _mm256_maddubs_epi16((w), (x)))
#define TSR__Q4K_Y_SCALE(a, sc)                                                              \
    _mm256_madd_epi16((a), _mm256_or_si256((sc), _mm256_slli_epi32((sc), 16)))
#define TSR__Q4K_Y_VARIANT TSR__Q8_AVX2
#define TSR__Q4K_Y_NAME "avx2"
#define TSR__Q4K_Y_TABLE tsr__q4k_k_avx2
#include "kernels/cpu/quant_q4k_ymm.h"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
