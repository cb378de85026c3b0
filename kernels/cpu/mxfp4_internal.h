/* Private to the MXFP4 kernels of the CPU backend (mxfp4_cpu.c: the scalar kernel and the
 * dispatch; mxfp4_avx2.c, mxfp4_avx512.c: one ISA each, under its own target pragma, like
 * the SIMD tables of simd_internal.h). Every variant gives the scalar kernel's bits: the
 * same f32 decode (code value times 2^(scale - 127), exact), and per output the same 32
 * running sums, one per position in the 32-weight block (lane k adds column c + k for c =
 * 0, 32, 64, ..., each product rounded before its add: no fused multiply-add, as the
 * project's -std=c11 keeps GCC from contracting), folded by tsr__mxfp4_fold32. 32 lanes,
 * not 8: each lane's adds form a dependency chain, and with 8 lanes a single-token product
 * waited on the add latency (2 columns a cycle) instead of the memory. */
#ifndef TSR_KERNELS_CPU_MXFP4_INTERNAL_H
#define TSR_KERNELS_CPU_MXFP4_INTERNAL_H

#include <stdint.h>

#include "kernels/cpu/cpu_internal.h"

/* y[i * rows + r] = x[i] . W[r] for rows r in [r0, r1) of the MXFP4 matrix (blocks, scales;
 * cols % 32 == 0) and the nx inputs x ([nx][cols]); w: scratch of cols floats. */
typedef void (*tsr__mxfp4_rows_fn)(const uint8_t *blocks, const uint8_t *scales, int64_t r0,
                                   int64_t r1, int64_t rows, int64_t cols, const float *x,
                                   int64_t nx, float *y, float *w);

/* The kernel for one ISA, or NULL when this CPU lacks it (tests compare them); the one the
 * backend uses follows the CPU backend's ISA choice (TSR_CPU_ISA caps both). */
tsr__mxfp4_rows_fn tsr__mxfp4_rows_for(tsr__cpu_isa isa);

/* The fold of the 32 running sums, shared so that every variant rounds alike: s16[k] =
 * a[k] + a[k + 16], s8[k] = s16[k] + s16[k + 8] (what two vector halves give), then
 * ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)). */
static inline float tsr__mxfp4_fold8(const float a[8]) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static inline float tsr__mxfp4_fold32(const float a[32]) {
    float s16[16], s8[8];
    for (int k = 0; k < 16; k++) s16[k] = a[k] + a[k + 16];
    for (int k = 0; k < 8; k++) s8[k] = s16[k] + s16[k + 8];
    return tsr__mxfp4_fold8(s8);
}

#if defined(__x86_64__) || defined(__i386__)
void tsr__mxfp4_rows_avx2(const uint8_t *blocks, const uint8_t *scales, int64_t r0, int64_t r1,
                          int64_t rows, int64_t cols, const float *x, int64_t nx, float *y,
                          float *w);
void tsr__mxfp4_rows_avx512(const uint8_t *blocks, const uint8_t *scales, int64_t r0,
                            int64_t r1, int64_t rows, int64_t cols, const float *x, int64_t nx,
                            float *y, float *w);
#endif

#endif
