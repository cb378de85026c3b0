/* The AVX-VNNI Q4_K kernel (quant_q4k_internal.h, body in quant_q4k_ymm.h): 256-bit vpdpbusd
 * of the u8 codes and s8 activations into exact int32 sub-block sums per row, weighted by
 * the rows' scales with vpmulld. */
#include "kernels/cpu/quant_q4k_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avxvnni,avx2,fma,f16c"))),              \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#endif

#define TSR__Q4K_Y_DOT(a, w, x) _mm256_dpbusd_avx_epi32((a), (w), (x))
#define TSR__Q4K_Y_SCALE(a, sc) _mm256_mullo_epi32((a), (sc))
#define TSR__Q4K_Y_VARIANT TSR__Q8_AVXVNNI
#define TSR__Q4K_Y_NAME "avxvnni"
#define TSR__Q4K_Y_TABLE tsr__q4k_k_avxvnni
#include "kernels/cpu/quant_q4k_ymm.h"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
