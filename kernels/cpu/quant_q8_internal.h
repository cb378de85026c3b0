/* Private to the Q8_0 kernels of the CPU backend (quant_q8.c: scalar and dispatch;
 * quant_q8_avx2.c: AVX2 and AVX-VNNI; quant_q8_avx512.c: AVX-512 VNNI). Each ISA's kernel
 * lives in a file under its own target pragma, like the SIMD tables of simd_internal.h. */
#ifndef TSR_KERNELS_CPU_QUANT_Q8_INTERNAL_H
#define TSR_KERNELS_CPU_QUANT_Q8_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/quant_q8.h"

typedef enum tsr__q8_variant {
    TSR__Q8_SCALAR = 0,
    TSR__Q8_AVX2 = 1,       /* maddubs on |w| and sign(x, w) */
    TSR__Q8_AVXVNNI = 2,    /* 256-bit vpdpbusd */
    TSR__Q8_AVX512VNNI = 3, /* 512-bit vpdpbusd, one register per 16 rows x 4 columns */
    TSR__Q8_N_VARIANTS = 4
} tsr__q8_variant;

/* One Q8_0 matvec kernel: for the row groups [g0, g1) of the packed matrix w (nb blocks
 * per row, `rows` real rows) and the nx <= 4 quantized activation rows i (int8 qs + i*nb*32,
 * scales xd + i*nb, block sums of the int8 values xs + i*nb), part p's product of row r
 * covers blocks [bseg[p], bseg[p+1]): per block b in order, the exact int32 sum of q_w * q_x
 * and acc = fmaf((float)isum, d_w * d_x, acc) from acc = 0. sum: y[i*ldy + r] = ((P_0 +
 * P_1) + P_2) + ...; else y[p*ldp + i*ldy + r] = P_p. Every variant gives the same bits
 * (integer sums are exact, the float operations are the same). */
typedef void (*tsr__q8_gemv_fn)(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                int64_t g1, const int8_t *xq, const float *xd,
                                const int32_t *xs, int nx, const int32_t *bseg, int n_parts,
                                bool sum, float *y, int64_t ldy, int64_t ldp);

/* The AMX kernel (quant_q8_amx.c): tsr__q8_gemv_fn's product for nt tokens, nt a multiple of
 * 16 (the rest go through the gemv 4 at a time), the same bits. The activations come in the
 * order tsr__q8_amx_pack_act writes (xa, xd, xc); token i's outputs go to y + i * ldy. */
typedef void (*tsr__q8_gemm16_fn)(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                  int64_t g1, const int8_t *xa, const float *xd,
                                  const int32_t *xc, int64_t nt, const int32_t *bseg,
                                  int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp);
/* Token i's nb blocks (int8 values xqi, scales xdi, block sums xsi) in the AMX kernel's
 * order, block b of tokens 16 tb .. 16 tb + 15 together: their values at xa + (tb * nb + b)
 * * 512 (32 bytes a token: a tile load reads 8 whole cache lines instead of halves of 16),
 * their scales at xd + (tb * nb + b) * 16 and -128 x their block sums (the u8 weights'
 * offset) at xc + (tb * nb + b) * 16 (the epilogue takes each as a broadcast operand from
 * one cache line). */
void tsr__q8_amx_pack_act(const int8_t *xqi, const float *xdi, const int32_t *xsi, int64_t nb,
                          int64_t i, int8_t *xa, float *xd, int32_t *xc);
/* The AMX kernel where this CPU has AMX-INT8, the OS lets this process use it and the
 * kernels run AVX-512 VNNI (TSR_CPU_ISA=avx512 keeps them there without AMX); else NULL. */
tsr__q8_gemm16_fn tsr__q8_amx_get(void);

/* Four int8 activations as one int32, the operand the kernels broadcast to a vector. */
static inline __attribute__((always_inline)) int32_t tsr__q_x4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return v;
}

/* Activation quantizer with tsr__q8_quantize_act's results (bits). xm, when not NULL, gets
 * per block Q4_1's m-term sum: fp16(bsum * max|x| / 127), the scale unrounded (the s of
 * llama.cpp's Q8_1 activations); computed here, where max|x| and bsum already are, it cost a
 * tenth of a SmolLM2 Q4_1 prefill as a second pass with scalar fp16 rounding. */
typedef void (*tsr__q8_act_fn)(const float *x, int64_t cols, int8_t *qs, float *d,
                               int32_t *bsum, float *xm);

typedef struct tsr__q8_kernels {
    tsr__q8_variant variant;
    const char *name;
    tsr__q8_gemv_fn gemv;
    tsr__q8_act_fn quant_act;
} tsr__q8_kernels;

/* The variant's kernels, or NULL when this CPU lacks its instructions. */
const tsr__q8_kernels *tsr__q8_kernels_for(tsr__q8_variant v);
/* The fastest variant within the ISA the CPU backend's tables were capped at
 * (TSR_CPU_ISA=scalar|avx2 applies here too). */
const tsr__q8_kernels *tsr__q8_kernels_get(void);

/* Quantizes one activation row of cols (% 32 == 0) values: qs[cols], d[cols/32] (the fp16
 * scale as f32), bsum[cols/32] (sum of each block's qs). The weights' quantizer. */
void tsr__q8_quantize_act(const float *x, int64_t cols, int8_t *qs, float *d, int32_t *bsum,
                          float *xm);


#if defined(__x86_64__) || defined(__i386__)
extern const tsr__q8_kernels tsr__q8_k_avx2;
extern const tsr__q8_kernels tsr__q8_k_avxvnni;
extern const tsr__q8_kernels tsr__q8_k_avx512vnni;
#endif

/* The group drivers' stores (Q8_0 here, Q4_* in quant_q4_internal.h; both groups are 16
 * rows): part p of group g either goes to its own plane of y (!sum) or into the running
 * total tot, which tsr__qgroup_store_sum writes once the parts are done. */
_Static_assert(TSR_Q8_GROUP == 16, "tsr__qgroup_store_* assume 16-row groups");

static inline void tsr__qgroup_store_part(float part[][16], float tot[][16], int p, int nx,
                                          int64_t g, int64_t rows, bool sum, float *y,
                                          int64_t ldy, int64_t ldp) {
    int64_t r0 = g * 16;
    int nr = rows - r0 < 16 ? (int)(rows - r0) : 16;
    if (!sum) {
        for (int i = 0; i < nx; i++)
            for (int j = 0; j < nr; j++)
                y[(size_t)p * (size_t)ldp + (size_t)i * (size_t)ldy + (size_t)(r0 + j)] =
                    part[i][j];
    } else {
        for (int i = 0; i < nx; i++)
            for (int j = 0; j < 16; j++) tot[i][j] = p == 0 ? part[i][j] : tot[i][j] + part[i][j];
    }
}

static inline void tsr__qgroup_store_sum(float tot[][16], int nx, int n_parts, int64_t g,
                                         int64_t rows, float *y, int64_t ldy) {
    int64_t r0 = g * 16;
    int nr = rows - r0 < 16 ? (int)(rows - r0) : 16;
    for (int i = 0; i < nx; i++)
        for (int j = 0; j < nr; j++)
            y[(size_t)i * (size_t)ldy + (size_t)(r0 + j)] = n_parts > 0 ? tot[i][j] : 0.0f;
}

/* Software prefetch of the weight stream in the drivers below: the cache lines of a group
 * block TSR__Q_PREFETCH_BYTES past it (the groups are stored one after another, so those
 * are the bytes a few blocks later). A variant's source sets the distance before it
 * includes this header; 0, the default, compiles it away. An AVX2-only EPYC (Zen 1)
 * read its weights from memory at 60-70 % of the in-cache speed of its AVX2 kernels:
 * its hardware prefetchers fall behind a stream read at the kernels' pace, and 4 KiB
 * ahead brought them to the in-cache speed (docs/kernels-cpu.md). On Zen 4, prefetching
 * the AVX-512 kernel's weights 1-4 KiB ahead measured slower (docs/perf.md), while on an
 * AMX Xeon the AVX-512 kernels gained with it (the 4-bit ones always prefetch, the Q8_0
 * and Q4_K ones on Intel CPUs only); AVX-VNNI keeps 0. x86 prefetches never fault, so the
 * lines past a matrix's end may be named (as an integer address: no pointer past the
 * object is formed). */
#ifndef TSR__Q_PREFETCH_BYTES
#define TSR__Q_PREFETCH_BYTES 0
#endif
/* Whether this is an Intel CPU (tsr__cpu_intel, set by the CPU dispatch's pick, which every
 * kernel choice follows): the AVX-512 Q8_0 and Q4_K kernels prefetch only there, as their
 * distance (TSR__Q_PREFETCH_INTEL ? 4096 : 0) says. On an AMX Xeon they gained with it
 * (docs/kernels-cpu.md); on Zen 4 the Q8_0 one measured slower. */
#define TSR__Q_PREFETCH_INTEL atomic_load_explicit(&tsr__cpu_intel, memory_order_relaxed)
static inline __attribute__((always_inline)) void tsr__qprefetch(const uint8_t *wb, int gbb) {
    const int dist = TSR__Q_PREFETCH_BYTES;
    for (int o = 0; dist > 0 && o < gbb; o += 64)
        __builtin_prefetch((const void *)((uintptr_t)wb + (uintptr_t)dist + (uintptr_t)o));
}

/* The per-group driver every variant shares: BLOCK_FN(wb, xq, xd, xs, nb, b, nx, acc) adds
 * block b of the group (GBB bytes a group block) to the nx accumulators; the driver runs the
 * parts and stores. TSR__Q8_GEMV_BODY is Q8_0's; the Q5_K and Q6_K kernels use it with theirs. */
#define TSR__QGEMV_BODY(NX, GBB, BLOCK_FN, ACC_T, ZERO, STORE)                               \
    for (int64_t g = g0; g < g1; g++) {                                                     \
        const uint8_t *wg = w + (size_t)g * (size_t)nb * (GBB);                             \
        float tot[4][16], part[4][16];                                                      \
        for (int p = 0; p < n_parts; p++) {                                                 \
            ACC_T acc[4];                                                                   \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) acc[i] = ZERO;             \
            for (int64_t b = bseg[p]; b < bseg[p + 1]; b++) {                               \
                tsr__qprefetch(wg + (size_t)b * (GBB), (GBB));                              \
                BLOCK_FN(wg + (size_t)b * (GBB), xq, xd, xs, nb, b, NX, acc);               \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) STORE(part[i], acc[i]);    \
            tsr__qgroup_store_part(part, tot, p, NX, g, rows, sum, y, ldy, ldp);              \
        }                                                                                   \
        if (sum) tsr__qgroup_store_sum(tot, NX, n_parts, g, rows, y, ldy);                  \
    }
#define TSR__Q8_GEMV_BODY(NX, BLOCK_FN, ACC_T, ZERO, STORE)                                  \
    TSR__QGEMV_BODY(NX, TSR_Q8_GROUP_BLOCK_BYTES, BLOCK_FN, ACC_T, ZERO, STORE)

/* The same for groups g and g + 1 at once (both inside the matrix), for kernels that run
 * one block of two groups per call: BLOCK2(wb0, wb1, b, acc0, acc1) adds block b of both
 * (wb0, wb1: its bytes in each group, GBB bytes a group block); each group is stored as
 * TSR__Q8_GEMV_BODY stores one. */
#define TSR__QPAIR_BODY(NX, GBB, BLOCK2, ACC_T, ZERO, STORE)                                 \
    {                                                                                       \
        const uint8_t *wg0 = w + (size_t)g * (size_t)nb * (GBB);                            \
        const uint8_t *wg1 = wg0 + (size_t)nb * (GBB);                                      \
        float tot0[4][16], tot1[4][16], part[4][16];                                        \
        for (int p = 0; p < n_parts; p++) {                                                 \
            ACC_T acc0[4], acc1[4];                                                         \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) acc0[i] = acc1[i] = ZERO;  \
            for (int64_t b = bseg[p]; b < bseg[p + 1]; b++) {                               \
                tsr__qprefetch(wg0 + (size_t)b * (GBB), (GBB));                             \
                tsr__qprefetch(wg1 + (size_t)b * (GBB), (GBB));                             \
                BLOCK2(wg0 + (size_t)b * (GBB), wg1 + (size_t)b * (GBB), b, acc0, acc1);    \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) STORE(part[i], acc0[i]);   \
            tsr__qgroup_store_part(part, tot0, p, NX, g, rows, sum, y, ldy, ldp);             \
            _Pragma("GCC unroll 4") for (int i = 0; i < NX; i++) STORE(part[i], acc1[i]);   \
            tsr__qgroup_store_part(part, tot1, p, NX, g + 1, rows, sum, y, ldy, ldp);         \
        }                                                                                   \
        if (sum) {                                                                          \
            tsr__qgroup_store_sum(tot0, NX, n_parts, g, rows, y, ldy);                      \
            tsr__qgroup_store_sum(tot1, NX, n_parts, g + 1, rows, y, ldy);                  \
        }                                                                                   \
    }

/* The table entry: BODY_FN with nx a constant. */
#define TSR__Q8_GEMV_FN(NAME, IMPL)                                                          \
    static void NAME(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0, int64_t g1,    \
                     const int8_t *xq, const float *xd, const int32_t *xs, int nx,          \
                     const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,     \
                     int64_t ldp) {                                                         \
        switch (nx) {                                                                       \
        case 1: IMPL(w, nb, rows, g0, g1, xq, xd, xs, 1, bseg, n_parts, sum, y, ldy, ldp); break; \
        case 2: IMPL(w, nb, rows, g0, g1, xq, xd, xs, 2, bseg, n_parts, sum, y, ldy, ldp); break; \
        case 3: IMPL(w, nb, rows, g0, g1, xq, xd, xs, 3, bseg, n_parts, sum, y, ldy, ldp); break; \
        default: IMPL(w, nb, rows, g0, g1, xq, xd, xs, 4, bseg, n_parts, sum, y, ldy, ldp); break; \
        }                                                                                   \
    }

#endif
