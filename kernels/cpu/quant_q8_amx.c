/* The AMX Q8_0 kernel (quant_q8_internal.h, tsr__q8_gemm16_fn): 16 tokens at a time, for
 * prefill and batched decode. The repacked layout is already an AMX B operand: a group
 * block's 8 column steps of 64 bytes (16 rows x 4 columns of u8 weights q + 128) are the
 * 8 rows of a K = 32 tile, so one TDPBSUD (signed activations x unsigned weights) gives the
 * 16 tokens x 16 rows of int32 sums of a block; minus 128 * each token's block sum, those are
 * the exact sums of q_w * q_x, and the epilogue is the other variants' (one convert, the
 * product of the scales and one fma per block in order), so the bits are theirs. The tile
 * does the multiplies; the vector pipes run the epilogue, 4 operations per 16 outputs and
 * block against the AVX-512 kernel's 8 vpdpbusd, their broadcasts and the same epilogue.
 * What bounds it is the per-block scale of Q8_0: every block's int32 tile must leave the
 * tile unit (a 1 KiB store and reload) before the next block's scales apply, so a sum tile
 * never accumulates over K. On an AMX Xeon the product ran 1.4-1.5x the AVX-512 kernel's
 * at 64 and 512 inputs (docs/kernels-cpu.md, "AMX").
 *
 * Whether AMX may run (the CPU, the OS's permission, TSR_CPU_ISA) is the CPU dispatch's
 * answer (tsr__cpu_amx). */
#include "kernels/cpu/quant_q8_internal.h"

#include <string.h>

void tsr__q8_amx_pack_act(const int8_t *xqi, const float *xdi, const int32_t *xsi, int64_t nb,
                          int64_t i, int8_t *xa, float *xd, int32_t *xc) {
    size_t k = (size_t)(i / 16) * (size_t)nb * 16 + (size_t)(i % 16);
    for (int64_t b = 0; b < nb; b++, k += 16) {
        memcpy(xa + k * TSR_Q8_BLOCK, xqi + (size_t)b * TSR_Q8_BLOCK, TSR_Q8_BLOCK);
        xd[k] = xdi[b];
        xc[k] = -128 * xsi[b];
    }
}

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#include "kernels/cpu/cpu_internal.h"

#ifdef __clang__
#pragma clang attribute push(                                                                 \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c"))),    \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

/* Tile registers (macros: the tile intrinsics paste the register number into assembly).
 * The products run two blocks at a time into a pair of sum tiles, C0 C1 or C2 C3 by turns,
 * each with its operands A (16 tokens x 32 int8) and B (8 steps x 16 rows x 4 u8): the next
 * pair is issued before this one's epilogue, so a CPU that overlaps the tile unit with the
 * vector pipes may (the AMX Xeon measured here serialized them: docs/kernels-cpu.md). */
#define TSR__AMX_A0 4
#define TSR__AMX_B0 5
#define TSR__AMX_A1 6
#define TSR__AMX_B1 7

static void tsr__q8_x_config(void) {
    tsr__amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int c = 0; c < 4; c++) { /* 16 tokens x 16 rows of int32 */
        cfg.rows[c] = 16;
        cfg.colsb[c] = 64;
    }
    cfg.rows[TSR__AMX_A0] = cfg.rows[TSR__AMX_A1] = 16;
    cfg.colsb[TSR__AMX_A0] = cfg.colsb[TSR__AMX_A1] = TSR_Q8_BLOCK;
    cfg.rows[TSR__AMX_B0] = cfg.rows[TSR__AMX_B1] = TSR_Q8_BLOCK / 4;
    cfg.colsb[TSR__AMX_B0] = cfg.colsb[TSR__AMX_B1] = 64;
    tsr__amx_load_cfg(&cfg);
}

/* Block b's tile product into sum tile C: 16 tokens (xa, their operands) x the group's 16
 * rows (wg). */
#define TSR__Q8_X_TDP(C, A, B, b)                                                              \
    do {                                                                                      \
        _tile_zero(C);                                                                        \
        _tile_loadd(A, xa + (size_t)(b) * 16 * TSR_Q8_BLOCK, TSR_Q8_BLOCK);                   \
        _tile_loadd(B, wg + (size_t)(b) * TSR_Q8_GROUP_BLOCK_BYTES + 32, 64);                 \
        _tile_dpbsud(C, A, B);                                                                \
    } while (0)
/* Blocks b and, when two, b + 1 into the pair of sum tiles C, D; and their stores. */
#define TSR__Q8_X_ISSUE(C, D, b, two)                                                          \
    do {                                                                                      \
        TSR__Q8_X_TDP(C, TSR__AMX_A0, TSR__AMX_B0, b);                                        \
        if (two) TSR__Q8_X_TDP(D, TSR__AMX_A1, TSR__AMX_B1, (b) + 1);                         \
    } while (0)
#define TSR__Q8_X_STORE(C, D, cb, two)                                                         \
    do {                                                                                      \
        _tile_stored(C, (cb)[0], 64);                                                         \
        if (two) _tile_stored(D, (cb)[1], 64);                                                \
    } while (0)

/* The epilogue of block b (its int32 tile in c) into acc[t], token by token: xd and xc hold
 * the 16 tokens' scales and offsets of the block. */
static inline __attribute__((always_inline)) void
tsr__q8_x_epilogue(const int32_t c[16][16], const uint8_t *wb, const float *xd,
                   const int32_t *xc, __m512 acc[16]) {
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) {
        __m512i is = _mm512_add_epi32(_mm512_loadu_si512((const void *)c[t]),
                                      _mm512_set1_epi32(xc[t]));
        __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[t]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), dd, acc[t]);
    }
}

/* Blocks [b0, b1) of group wg for 16 tokens into acc, two at a time: the products of pair
 * i + 1 are issued after the stores of pair i and before its epilogue. */
static inline __attribute__((always_inline)) void
tsr__q8_x_part(const uint8_t *wg, const int8_t *xa, const float *xd, const int32_t *xc,
               int64_t b0, int64_t b1, int32_t cbuf[2][16][16], __m512 acc[16]) {
    if (b0 >= b1) return;
    TSR__Q8_X_ISSUE(0, 1, b0, b1 - b0 >= 2);
    for (int64_t b = b0, i = 0; b < b1; b += 2, i++) {
        bool two = b1 - b >= 2, next = b + 2 < b1, next2 = b1 - b >= 4;
        if (!(i & 1)) {
            TSR__Q8_X_STORE(0, 1, cbuf, two);
            if (next) TSR__Q8_X_ISSUE(2, 3, b + 2, next2);
        } else {
            TSR__Q8_X_STORE(2, 3, cbuf, two);
            if (next) TSR__Q8_X_ISSUE(0, 1, b + 2, next2);
        }
        tsr__q8_x_epilogue(cbuf[0], wg + (size_t)b * TSR_Q8_GROUP_BLOCK_BYTES, xd + b * 16,
                           xc + b * 16, acc);
        if (two)
            tsr__q8_x_epilogue(cbuf[1], wg + (size_t)(b + 1) * TSR_Q8_GROUP_BLOCK_BYTES,
                               xd + (b + 1) * 16, xc + (b + 1) * 16, acc);
    }
}

/* Group g's 16 outputs per token (part) into y: straight when one part is summed, else
 * through the group drivers' part and sum stores. */
static void tsr__q8_x_put(float part[16][16], int64_t g, int64_t rows, int p, int n_parts,
                          bool sum, float *y, int64_t ldy, int64_t ldp, float tot[16][16]) {
    int64_t r0 = g * 16;
    if (sum && n_parts == 1) {
        __mmask16 m = rows - r0 >= 16 ? 0xffff : (__mmask16)((1u << (rows - r0)) - 1);
        for (int t = 0; t < 16; t++)
            _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ldy + (size_t)r0, m,
                                  _mm512_loadu_ps(part[t]));
        return;
    }
    tsr__qgroup_store_part(part, tot, p, 16, g, rows, sum, y, ldy, ldp);
    if (sum && p == n_parts - 1) tsr__qgroup_store_sum(tot, 16, n_parts, g, rows, y, ldy);
}

/* Groups [g0, g1) for nt (a multiple of 16) tokens (quant_q8_internal.h). */
static void tsr__q8_x_gemm16(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                             int64_t g1, const int8_t *xa, const float *xd, const int32_t *xc,
                             int64_t nt, const int32_t *bseg, int n_parts, bool sum, float *y,
                             int64_t ldy, int64_t ldp) {
    int32_t cbuf[2][16][16] __attribute__((aligned(64)));
    float tot[16][16], part[16][16];
    tsr__q8_x_config();
    for (int64_t i0 = 0; i0 < nt; i0 += 16) {
        const int8_t *xai = xa + (size_t)i0 * (size_t)nb * TSR_Q8_BLOCK;
        const float *xdi = xd + (size_t)i0 * (size_t)nb;
        const int32_t *xci = xc + (size_t)i0 * (size_t)nb;
        float *yi = y + (size_t)i0 * (size_t)ldy;
        for (int64_t g = g0; g < g1; g++) {
            const uint8_t *wg = w + (size_t)g * (size_t)nb * TSR_Q8_GROUP_BLOCK_BYTES;
            for (int p = 0; p < n_parts; p++) {
                __m512 acc[16];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
                tsr__q8_x_part(wg, xai, xdi, xci, bseg[p], bseg[p + 1], cbuf, acc);
                /* acc's address stays here, so its 16 registers stay registers */
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) _mm512_storeu_ps(part[t], acc[t]);
                tsr__q8_x_put(part, g, rows, p, n_parts, sum, yi, ldy, ldp, tot);
            }
        }
    }
    _tile_release();
}

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

tsr__q8_gemm16_fn tsr__q8_amx_get(void) {
    return tsr__cpu_amx() & TSR__AMX_INT8 && tsr__q8_kernels_get()->variant == TSR__Q8_AVX512VNNI
               ? tsr__q8_x_gemm16
               : NULL;
}

#else

tsr__q8_gemm16_fn tsr__q8_amx_get(void) { return NULL; }

#endif
