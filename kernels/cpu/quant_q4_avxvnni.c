/* The AVX-VNNI 4-bit kernel (quant_q4_internal.h, body in quant_q4_ymm.h): 256-bit vpdpbusd
 * of the u8 codes (0..15) and the s8 activations, the exact 4-product int32 sums per lane. */
#include "kernels/cpu/quant_q4_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avxvnni,avx2,fma,f16c"))),              \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#endif

#define TSR__Q4_YDOT(acc, w, x) _mm256_dpbusd_avx_epi32((acc), (w), (x))
#define TSR__Q4_Y_VARIANT TSR__Q8_AVXVNNI
#define TSR__Q4_Y_NAME "avxvnni"
#define TSR__Q4_Y_TABLE tsr__q4_k_avxvnni
#include "kernels/cpu/quant_q4_ymm.h"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
