/* The AVX2 4-bit kernel (quant_q4_internal.h, body in quant_q4_ymm.h): vpmaddubsw of the u8
 * codes (0..15) and the s8 activations (a pair sums to at most 2 * 15 * 128, no saturation),
 * then vpmaddwd with ones: each row's exact 4-product int32 sum per lane. */
/* The weight stream prefetched 4 KiB ahead (tsr__qprefetch, quant_q8_internal.h). */
#define TSR__Q_PREFETCH_BYTES 4096
#include "kernels/cpu/quant_q4_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define TSR__Q4_YDOT(acc, w, x)                                                              \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((w), (x)),               \
                                              _mm256_set1_epi16(1)))
#define TSR__Q4_Y_I16 1
#define TSR__Q4_Y_VARIANT TSR__Q8_AVX2
#define TSR__Q4_Y_NAME "avx2"
#define TSR__Q4_Y_TABLE tsr__q4_k_avx2
#include "kernels/cpu/quant_q4_ymm.h"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
