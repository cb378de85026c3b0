/* GGUF's Q5_K on the CPU, computed natively on its 5-bit codes.
 *
 * A GGUF block_q5_K holds 256 values of a row in 176 bytes: fp16 d, fp16 dmin, 12 bytes of
 * 6-bit scales sc[8] and mins m[8] of its 8 sub-blocks of 32 (Q4_K's packing,
 * kernels/cpu/quant_q4k.h), qh[32] (the codes' high bits), qs[128] (their low 4 bits). Code of
 * column 32j + l (sub-block j): the nibble j % 2 of qs[32 (j / 2) + l], plus 16 times bit j of
 * qh[l]. Value: (d * sc[j]) * q - dmin * m[j], q in 0..31 (gguf's dequantize).
 *
 * The product: every 32 columns of an input row quantized as Q8_0 (kernels/cpu/quant_q8.h:
 * int8 x_q, one scale d_x and the code sum bsum per 32, the Q8_0 weights' own activation
 * quantizer; llama.cpp quantizes Q5_K's per 256), and per row and 32-column block (one
 * sub-block), from acc = 0, block by block: acc = fmaf((float)(sc * sum(q * x_q)), d * d_x,
 * acc); acc = fmaf((float)(m * bsum), -(dmin * d_x), acc), the sums exact in int32. Like
 * Q6_K's (quant_q6k.h), the blocks are 32 columns, so the matrix takes every reduction part of
 * 32 columns that Q8_0 takes.
 *
 * Storage (TSR_Q5_K tensors): repacked at load, losslessly, into groups of 16 rows (the last
 * padded with zero rows) of 32-column blocks; per group and block 416 bytes (26 a row, d and
 * dmin repeated per block):
 *   0    the 16 rows' fp16 d                                             32 bytes
 *   32   their fp16 dmin                                                 32
 *   64   their scales sc (u8, 0..63)                                     16
 *   80   their mins m (u8, 0..63)                                        16
 *   96   4 steps of 64 bytes: step s holds row j's bytes at 4j, byte e the low 4 bits of the
 *        code of column 4s + e in its low nibble and of column 16 + 4s + e in its high one
 *                                                                        256
 *   352  64 bytes: row j's byte e at 4j + e holds the high bit of the code of column 4s + e
 *        at bit s and of column 16 + 4s + e at bit 4 + s (s = 0..3)      64
 *
 * GGUF's Q5_0 and Q5_1 (32 values a block: fp16 d, for Q5_1 an fp16 min m, 4 bytes of high
 * bits, 16 of low nibbles; d * (q - 16), resp. d * q + m) are the same arithmetic with scale
 * 1 and, for Q5_0, dmin = d with min 16, for Q5_1 dmin = -m with min 1: exact, so they load
 * into this layout losslessly and run on these kernels. llama.cpp writes them into its K-quant
 * files for the matrices whose width is not a multiple of 256 (Q4_K_M's Q4_K becomes Q5_0,
 * Q5_K_M's Q5_K becomes Q5_1: SmolLM2's 576 columns, Qwen2.5-0.5B's 896). */
#ifndef TSR_KERNELS_CPU_QUANT_Q5K_H
#define TSR_KERNELS_CPU_QUANT_Q5K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TSR_Q5K_BLOCK 32               /* columns per repacked block */
#define TSR_Q5K_GROUP 16               /* rows per repacked group */
#define TSR_Q5K_ROW_BYTES 26           /* bytes of one row's block */
#define TSR_Q5K_GROUP_BLOCK_BYTES 416  /* TSR_Q5K_GROUP * TSR_Q5K_ROW_BYTES */
#define TSR_Q5K_GGUF_BLOCK 256         /* values per GGUF block_q5_K */
#define TSR_Q5K_GGUF_BLOCK_BYTES 176
#define TSR_Q5_0_BLOCK_BYTES 22        /* GGUF block_q5_0: 32 values */
#define TSR_Q5_1_BLOCK_BYTES 24        /* GGUF block_q5_1: 32 values */

/* Whether a [rows, cols] matrix can be stored so (cols a positive multiple of 32). */
bool tsr_q5k_fits(int64_t rows, int64_t cols);

/* Repacks a [rows, cols] matrix (cols % 256 == 0) of GGUF block_q5_K (row-major, as the file
 * stores them) into `packed` (tsr_tensor_bytes of the Q5_K tensor), padding included. */
void tsr_q5k_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed);
/* Repacks a [rows, cols] matrix (cols % 32 == 0) of GGUF block_q5_1 (with_min) or
 * block_q5_0 blocks, row-major, into `packed` as the Q5_K tensor of the same values. */
void tsr_q5k_pack_q5(const uint8_t *blocks, bool with_min, int64_t rows, int64_t cols,
                     void *packed);
/* Row r dequantized to f32: (d * sc) * q - dmin * m, gguf's dequantization. */
void tsr_q5k_dequant_row(const void *packed, int64_t cols, int64_t r, float *out);

/* Rows [r0, r1) and columns [c0, c1) (multiples of 32) of the Q5_K tensor src, repacked
 * into dst (tsr_tensor_bytes of the [r1 - r0, c1 - c0] Q5_K tensor). */
tsr_status tsr_q5k_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         void *dst);

#endif
