/* Private to the 4-bit kernels of the CPU backend (quant_q4.c: packing, the scalar reference
 * and dispatch; quant_q4_avx2.c, quant_q4_avxvnni.c, quant_q4_avx512.c: one ISA each under
 * its own target pragma). The activations are quantized by the Q8_0 kernels' quantizer
 * (quant_q8_internal.h), so the variants and their choice are the Q8_0 ones. */
#ifndef TSR_KERNELS_CPU_QUANT_Q4_INTERNAL_H
#define TSR_KERNELS_CPU_QUANT_Q4_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/quant_q4.h"
#include "kernels/cpu/quant_q8_internal.h"

#define TSR__Q4_0_GBB 288 /* group block bytes: 16 fp16 d, 4 x 64 code bytes */
#define TSR__Q4_1_GBB 320 /* 16 fp16 d, 16 fp16 m, 4 x 64 code bytes */
#define TSR__MX_GBB 272   /* 16 E8M0 bytes, 4 x 64 code bytes */

/* MXFP4: u8 code -> twice its E2M1 value + 12 (the kernels' vpshufb table), and the block
 * scale 2^(e - 128) (half the E8M0 value: the table holds twice the values) as f32, exact:
 * e = 0 gives the subnormal 2^-128, e = 255 infinity (the f32 decode's 2^128). */
#define TSR__MX_LUT12 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0
static inline float tsr__mx_scale(uint8_t e) {
    uint32_t u = e ? (uint32_t)e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f * 0.5f;
}

/* One 4-bit matvec kernel, the Q8_0 kernel's contract (quant_q8_internal.h) with the 4-bit
 * block products: for the row groups [g0, g1) of the packed w (nb blocks per row) and nx <= 4
 * quantized activation rows (int8 xq, scales xd, int32 block sums xs, and for Q4_1 the block
 * sums xm = fp16(d_x * sum) as f32), per block b in order from acc = 0:
 *   Q4_0: acc = fmaf((float)(sum(q * x_q) - 8 * xs), d_w * d_x, acc)
 *   Q4_1: acc = fmaf((float)sum(q * x_q), d_w * d_x, acc); acc = fmaf(m_w, xm, acc)
 *   MXFP4: acc = fmaf((float)(sum((v2 + 12) * x_q) - 12 * xs), tsr__mx_scale(e) * d_x, acc)
 * with the integer sums exact, so every variant gives the same bits. */
typedef void (*tsr__q4_gemv_fn)(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                int64_t g1, const int8_t *xq, const float *xd,
                                const int32_t *xs, const float *xm, int nx,
                                const int32_t *bseg, int n_parts, bool sum, float *y,
                                int64_t ldy, int64_t ldp);

typedef struct tsr__q4_kernels {
    tsr__q8_variant variant;
    const char *name;
    tsr__q4_gemv_fn gemv_q4_0;
    tsr__q4_gemv_fn gemv_q4_1;
    tsr__q4_gemv_fn gemv_mxfp4; /* NULL: the AVX2 variant's (tsr__q4_gemv_for) */
} tsr__q4_kernels;

/* The variant's kernels, or NULL when this CPU lacks its instructions. */
const tsr__q4_kernels *tsr__q4_kernels_for(tsr__q8_variant v);
/* The variant tsr__q8_kernels_get chooses (the same ISA cap). */
const tsr__q4_kernels *tsr__q4_kernels_get(void);
/* The kernel for dtype t (TSR_Q4_0, TSR_Q4_1 or TSR_MXFP4) of k. */
tsr__q4_gemv_fn tsr__q4_gemv_for(const tsr__q4_kernels *k, tsr_dtype t);

#if defined(__x86_64__) || defined(__i386__)
extern const tsr__q4_kernels tsr__q4_k_avx2;
extern const tsr__q4_kernels tsr__q4_k_avxvnni;
extern const tsr__q4_kernels tsr__q4_k_avx512vnni;
#endif

_Static_assert(TSR_Q4_GROUP == 16, "tsr__qgroup_store_* assume 16-row groups");

/* The per-group driver every variant shares (TSR__Q8_GEMV_BODY with GBB bytes per group
 * block and the Q4_1 sums): BLOCK_FN(wb, xq, xd, xs, xm, nb, b, nx, acc) adds block b. */
#define TSR__Q4_GEMV_BODY(NX, GBB, BLOCK_FN, ACC_T, ZERO, STORE)                             \
    for (int64_t g = g0; g < g1; g++) {                                                     \
        const uint8_t *wg = w + (size_t)g * (size_t)nb * (GBB);                              \
        float tot[4][16], part[4][16];                                                      \
        for (int p = 0; p < n_parts; p++) {                                                 \
            ACC_T acc[4];                                                                   \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) acc[i] = ZERO;             \
            for (int64_t b = bseg[p]; b < bseg[p + 1]; b++) {                               \
                tsr__qprefetch(wg + (size_t)b * (GBB), (GBB));                              \
                BLOCK_FN(wg + (size_t)b * (GBB), xq, xd, xs, xm, nb, b, NX, acc);           \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) STORE(part[i], acc[i]);    \
            tsr__qgroup_store_part(part, tot, p, NX, g, rows, sum, y, ldy, ldp);              \
        }                                                                                   \
        if (sum) tsr__qgroup_store_sum(tot, NX, n_parts, g, rows, y, ldy);                  \
    }

/* The table entry: IMPL with nx a constant. */
#define TSR__Q4_GEMV_FN(NAME, IMPL)                                                          \
    static void NAME(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,    \
                     const int8_t *xq, const float *xd, const int32_t *xs, const float *xm, \
                     int nx, const int32_t *bseg, int n_parts, bool sum, float *y,          \
                     int64_t ldy, int64_t ldp) {                                            \
        switch (nx) {                                                                       \
        case 1: IMPL(w, nb, rows, g0, g1, xq, xd, xs, xm, 1, bseg, n_parts, sum, y, ldy, ldp); break; \
        case 2: IMPL(w, nb, rows, g0, g1, xq, xd, xs, xm, 2, bseg, n_parts, sum, y, ldy, ldp); break; \
        case 3: IMPL(w, nb, rows, g0, g1, xq, xd, xs, xm, 3, bseg, n_parts, sum, y, ldy, ldp); break; \
        default: IMPL(w, nb, rows, g0, g1, xq, xd, xs, xm, 4, bseg, n_parts, sum, y, ldy, ldp); break; \
        }                                                                                   \
    }

/* One type's table entry of one variant: PFX##_gemv##SUF from the block function
 * PFX##_block##SUF and the type's group block bytes. */
#define TSR__Q4_GEMV_ONE(PFX, SUF, GBB, ACC_T, ZERO, STORE)                                  \
    static inline __attribute__((always_inline)) void PFX##_nx##SUF(                        \
        const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,                 \
        const int8_t *xq, const float *xd, const int32_t *xs, const float *xm, int nx,      \
        const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp) {   \
        TSR__Q4_GEMV_BODY(nx, GBB, PFX##_block##SUF, ACC_T, ZERO, STORE)                    \
    }                                                                                       \
    TSR__Q4_GEMV_FN(PFX##_gemv##SUF, PFX##_nx##SUF)

/* The three types' table entries of one variant from its block functions PFX##_block0
 * (Q4_0), PFX##_block1 (Q4_1) and PFX##_blockm (MXFP4). */
#define TSR__Q4_GEMV_PAIR(PFX, ACC_T, ZERO, STORE)                                           \
    TSR__Q4_GEMV_ONE(PFX, 0, TSR__Q4_0_GBB, ACC_T, ZERO, STORE)                             \
    TSR__Q4_GEMV_ONE(PFX, 1, TSR__Q4_1_GBB, ACC_T, ZERO, STORE)                             \
    TSR__Q4_GEMV_ONE(PFX, m, TSR__MX_GBB, ACC_T, ZERO, STORE)

#endif
