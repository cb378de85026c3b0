/* Private to the SIMD kernels of the CPU backend (simd_cpu.c, simd_avx2.c, simd_avx512.c):
 * what the kernels of every instruction set share. Each ISA's kernels live in a file of
 * their own under that file's target pragma, so no kernel can pick up instructions of a
 * wider ISA than the one its table is chosen for; this header holds only macros, the dtype
 * codes and the tables' declarations, none of which generate code on their own. */
#ifndef TSR_KERNELS_CPU_SIMD_INTERNAL_H
#define TSR_KERNELS_CPU_SIMD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#define TSR__X86 1
#include <immintrin.h>
#endif

enum { TSR__DT_F32 = 0, TSR__DT_BF16 = 1, TSR__DT_F16 = 2 };

#define TSR__INLINE static inline __attribute__((always_inline))

/* The per-row driver of the segmented matvec, shared by the ISAs through DOT. */
#define TSR__MATVEC_SEG_BODY(DOT)                                                         \
    size_t esz = dt == TSR__DT_F32 ? 4 : 2;                                               \
    for (int64_t r = r0; r < r1; r++) {                                                   \
        const char *wr = (const char *)w + (size_t)r * (size_t)cols * esz;                \
        float acc[4] = {0, 0, 0, 0}, d[4];                                                \
        for (int p = 0; p < n_parts; p++) {                                               \
            DOT(wr, x, cols, seg[p], (int64_t)seg[p + 1] - seg[p], nx, dt, d);            \
            if (!sum) {                                                                   \
                for (int i = 0; i < nx; i++)                                              \
                    y[(size_t)p * (size_t)ldp + (size_t)i * (size_t)ldy + (size_t)r] = d[i]; \
            } else if (p == 0) {                                                          \
                for (int i = 0; i < nx; i++) acc[i] = d[i];                               \
            } else {                                                                      \
                for (int i = 0; i < nx; i++) acc[i] += d[i];                              \
            }                                                                             \
        }                                                                                 \
        if (sum)                                                                          \
            for (int i = 0; i < nx; i++) y[(size_t)i * (size_t)ldy + (size_t)r] = acc[i]; \
    }

/* The table entry of the segmented matvec for dtype DT: IMPL with nx a constant. */
#define TSR__MATVEC_SEG_FN(NAME, IMPL, T, DT)                                             \
    static void NAME(const T *w, int64_t cols, int64_t r0, int64_t r1, const float *x,   \
                     int nx, const int32_t *seg, int n_parts, bool sum, float *y,         \
                     int64_t ldy, int64_t ldp) {                                          \
        switch (nx) {                                                                     \
        case 1: IMPL(w, cols, r0, r1, x, 1, seg, n_parts, sum, y, ldy, ldp, DT); break;   \
        case 2: IMPL(w, cols, r0, r1, x, 2, seg, n_parts, sum, y, ldy, ldp, DT); break;   \
        case 3: IMPL(w, cols, r0, r1, x, 3, seg, n_parts, sum, y, ldy, ldp, DT); break;   \
        default: IMPL(w, cols, r0, r1, x, 4, seg, n_parts, sum, y, ldy, ldp, DT); break;  \
        }                                                                                 \
    }

/* Vector expf (Cephes): n = round(x log2 e), r = x - n ln2 (two-part ln2), exp(r) by a
 * polynomial, times 2^n built in the exponent bits. About 1-2 ulp on [-87.3, 88.7]; below
 * that it returns 0 (libm gives denormals < 1.2e-38), above +inf; NaN passes through.
 * Constants shared by the AVX2 and AVX-512 versions. */
#define TSR__EXP_HI 88.72283935546875f
#define TSR__EXP_LO -87.33654022216797f
#define TSR__EXP_LOG2E 1.44269504088896341f
#define TSR__EXP_C1 0.693359375f
#define TSR__EXP_C2 -2.12194440e-4f
#define TSR__EXP_P0 1.9875691500e-4f
#define TSR__EXP_P1 1.3981999507e-3f
#define TSR__EXP_P2 8.3334519073e-3f
#define TSR__EXP_P3 4.1665795894e-2f
#define TSR__EXP_P4 1.6666665459e-1f
#define TSR__EXP_P5 5.0000001201e-1f

#ifdef TSR__X86
/* The vector kernels' tables (simd_avx2.c, simd_avx512.c); tsr__cpu_kernels_for hands them
 * out only when the CPU has their instructions. */
extern const tsr__cpu_kernels tsr__cpu_k_avx2;
extern const tsr__cpu_kernels tsr__cpu_k_avx512;
#endif

#endif
