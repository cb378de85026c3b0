/* Private to the Q4_K kernels of the CPU backend (quant_q4k.c: packing, the Q8_K activation
 * quantizer, the scalar reference and dispatch; quant_q4k_avx2.c, quant_q4k_avxvnni.c,
 * quant_q4k_avx512.c: one ISA each under its own target pragma). The variants and their
 * choice are the Q8_0 kernels' (quant_q8_internal.h: the same ISA cap). */
#ifndef TSR_KERNELS_CPU_QUANT_Q4K_INTERNAL_H
#define TSR_KERNELS_CPU_QUANT_Q4K_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/quant_q4k.h"
#include "kernels/cpu/quant_q8_internal.h"

#define TSR__Q4K_GBB TSR_Q4K_GROUP_BLOCK_BYTES
#define TSR__Q4K_DMIN 32   /* offsets in a group block: the dmin plane */
#define TSR__Q4K_SCALES 64 /* the three scale planes */
#define TSR__Q4K_CODES 256 /* the 32 code steps */
#define TSR__Q4K_SUB 8     /* sub-blocks of 32 per super-block */

/* One Q4_K matvec kernel, the Q8_0 kernel's contract (quant_q8_internal.h) over
 * super-blocks: for the row groups [g0, g1) of the packed w (nb super-blocks per row) and
 * nx <= 4 activation rows quantized by tsr__q4k_quantize_act (int8 xq + i*nb*256, scales
 * xd + i*nb, sub-block sums xs + i*nb*8), part p of row r covers super-blocks
 * [bseg[p], bseg[p+1]), per super-block in order from acc = 0:
 *   acc = fmaf((float)isum, d_w * d_x, acc); acc = fmaf((float)msum, -(dmin_w * d_x), acc)
 * with isum and msum the exact int32 sums of quant_q4k.h, so every variant gives the same
 * bits. Stores as tsr__q8_gemv_fn. */
typedef void (*tsr__q4k_gemv_fn)(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                 int64_t g1, const int8_t *xq, const float *xd,
                                 const int32_t *xs, int nx, const int32_t *bseg, int n_parts,
                                 bool sum, float *y, int64_t ldy, int64_t ldp);

typedef struct tsr__q4k_kernels {
    tsr__q8_variant variant;
    const char *name;
    tsr__q4k_gemv_fn gemv;
} tsr__q4k_kernels;

/* The variant's kernels, or NULL when this CPU lacks its instructions. */
const tsr__q4k_kernels *tsr__q4k_kernels_for(tsr__q8_variant v);
/* The variant tsr__q8_kernels_get chooses (the same ISA cap). */
const tsr__q4k_kernels *tsr__q4k_kernels_get(void);

/* Q8_K: one activation row of cols (% 256 == 0) values into qs[cols], d[cols / 256] (f32)
 * and bsum[cols / 32] (each 32 columns' sum of qs), as llama.cpp's quantize_row_q8_K. */
void tsr__q4k_quantize_act(const float *x, int64_t cols, int8_t *qs, float *d, int32_t *bsum);

#if defined(__x86_64__) || defined(__i386__)
extern const tsr__q4k_kernels tsr__q4k_k_avx2;
extern const tsr__q4k_kernels tsr__q4k_k_avxvnni;
extern const tsr__q4k_kernels tsr__q4k_k_avx512vnni;
#endif

_Static_assert(TSR_Q4K_GROUP == 16, "tsr__qgroup_store_* assume 16-row groups");

/* The per-group driver every variant shares: BLOCK_FN(wb, xq, xd, xs, nb, b, nx, acc) adds
 * super-block b of the group to the nx accumulators. */
#define TSR__Q4K_GEMV_BODY(NX, BLOCK_FN, ACC_T, ZERO, STORE)                                 \
    for (int64_t g = g0; g < g1; g++) {                                                     \
        const uint8_t *wg = w + (size_t)g * (size_t)nb * TSR__Q4K_GBB;                      \
        float tot[4][16], part[4][16];                                                      \
        for (int p = 0; p < n_parts; p++) {                                                 \
            ACC_T acc[4];                                                                   \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) acc[i] = ZERO;             \
            for (int64_t b = bseg[p]; b < bseg[p + 1]; b++) {                               \
                tsr__qprefetch(wg + (size_t)b * TSR__Q4K_GBB, TSR__Q4K_GBB);                \
                BLOCK_FN(wg + (size_t)b * TSR__Q4K_GBB, xq, xd, xs, nb, b, NX, acc);        \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) STORE(part[i], acc[i]);    \
            tsr__qgroup_store_part(part, tot, p, NX, g, rows, sum, y, ldy, ldp);              \
        }                                                                                   \
        if (sum) tsr__qgroup_store_sum(tot, NX, n_parts, g, rows, y, ldy);                  \
    }

/* The table entry from a block function: the body with nx a constant. */
#define TSR__Q4K_GEMV_DEF(PFX, BLOCK_FN, ACC_T, ZERO, STORE)                                 \
    static inline __attribute__((always_inline)) void PFX##_nx(                             \
        const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,                 \
        const int8_t *xq, const float *xd, const int32_t *xs, int nx, const int32_t *bseg,  \
        int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp) {                        \
        TSR__Q4K_GEMV_BODY(nx, BLOCK_FN, ACC_T, ZERO, STORE)                                \
    }                                                                                       \
    static void PFX##_gemv(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,          \
                           int64_t g1, const int8_t *xq, const float *xd, const int32_t *xs, \
                           int nx, const int32_t *bseg, int n_parts, bool sum, float *y,    \
                           int64_t ldy, int64_t ldp) {                                      \
        switch (nx) {                                                                       \
        case 1: PFX##_nx(w, nb, rows, g0, g1, xq, xd, xs, 1, bseg, n_parts, sum, y, ldy, ldp); break; \
        case 2: PFX##_nx(w, nb, rows, g0, g1, xq, xd, xs, 2, bseg, n_parts, sum, y, ldy, ldp); break; \
        case 3: PFX##_nx(w, nb, rows, g0, g1, xq, xd, xs, 3, bseg, n_parts, sum, y, ldy, ldp); break; \
        default: PFX##_nx(w, nb, rows, g0, g1, xq, xd, xs, 4, bseg, n_parts, sum, y, ldy, ldp); break; \
        }                                                                                   \
    }

#endif
