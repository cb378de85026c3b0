/* GGUF's Q6_K on the CPU, computed natively on its 6-bit codes.
 *
 * A GGUF block_q6_K holds 256 values of a row in 210 bytes: ql[128] (the codes' low 4 bits),
 * qh[64] (their high 2 bits), scales[16] (int8, one per 16 values), fp16 d. For half n of the
 * block (values 128n ..) and l < 32, value 128n + l takes the low nibble of ql[64n + l] and
 * bits 0-1 of qh[32n + l]; + 32: the low nibble of ql[64n + 32 + l], bits 2-3; + 64: the high
 * nibble of ql[64n + l], bits 4-5; + 96: the high nibble of ql[64n + 32 + l], bits 6-7. Value
 * of column k: (d * scales[k / 16]) * q with q = code - 32 in [-32, 31] (gguf's dequantize).
 *
 * The product: every 32 columns of an input row quantized as Q8_0 (kernels/cpu/quant_q8.h:
 * int8 x_q, one scale d_x per 32, the Q8_0 weights' own activation quantizer), and per row
 * and 32-column block b, in exact int32, isum = scales[2b'] * sum(q * x_q over the block's
 * first 16 columns) + scales[2b' + 1] * sum(over its last 16); acc = fmaf((float)isum,
 * d * d_x, acc) from acc = 0, block by block. llama.cpp quantizes the activations per 256
 * columns (Q8_K) instead: per 32 the codes follow the activations more closely, and the
 * matrix takes every reduction part of 32 columns that Q8_0 takes, so tensor-parallel splits
 * of wo and w_down (and their fixed parts at tp 1) never cut a block.
 *
 * Storage (TSR_Q6_K tensors): repacked at load, losslessly, into groups of 16 rows (the last
 * padded with zero rows) of 32-column blocks; per group and block 448 bytes (28 a row, d
 * repeated per block so that any 32-column slice is a tensor of its own):
 *   0    the 16 rows' fp16 d                                             32 bytes
 *   32   the 16 rows' two int8 scales (columns 0-15, 16-31)              32
 *   64   4 steps of 64 bytes: step s holds row j's bytes at 4j, byte e the low 4 bits of
 *        the code of column 4s + e in its low nibble and of column 16 + 4s + e in its high
 *        one                                                            256
 *   320  64 bytes: row j's byte e at 4j + e holds the high 2 bits of the codes of columns
 *        4s + e at bits 2s, 2s + 1 (s = 0..3)                            64
 *   384  the same for columns 16 + 4s + e                                64
 * so one 256-bit vector of a step is 8 rows x 4 columns of each half, as the Q8_0 layout
 * (quant_q8.h) has them. */
#ifndef TSR_KERNELS_CPU_QUANT_Q6K_H
#define TSR_KERNELS_CPU_QUANT_Q6K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TSR_Q6K_BLOCK 32               /* columns per repacked block */
#define TSR_Q6K_GROUP 16               /* rows per repacked group */
#define TSR_Q6K_ROW_BYTES 28           /* bytes of one row's block */
#define TSR_Q6K_GROUP_BLOCK_BYTES 448  /* TSR_Q6K_GROUP * TSR_Q6K_ROW_BYTES */
#define TSR_Q6K_GGUF_BLOCK 256         /* values per GGUF block_q6_K */
#define TSR_Q6K_GGUF_BLOCK_BYTES 210
#define TSR_Q3K_GGUF_BLOCK_BYTES 110   /* GGUF block_q3_K: 256 values */

/* Whether a [rows, cols] matrix can be stored so (cols a positive multiple of 32; a GGUF's
 * are multiples of 256). */
bool tsr_q6k_fits(int64_t rows, int64_t cols);

/* Repacks a [rows, cols] matrix (cols % 256 == 0) of GGUF block_q6_K (row-major, as the
 * file stores them) into `packed` (tsr_tensor_bytes of the Q6_K tensor), padding included. */
void tsr_q6k_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed);
/* The same from GGUF block_q3_K (cols % 256 == 0), whose values d (sc - 32) q (6-bit scales
 * per 16 columns, q = 2 low bits less 4 where the hmask bit is clear, -4..3) are this
 * layout's d sc' (code - 32) with sc' = sc - 32 and code = q + 32: exact, 7 bits a weight
 * against the file's 3.44 (Q3_K_M files run on the Q6_K kernels). */
void tsr_q6k_pack_q3k(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed);
/* Row r dequantized to f32: (d * scale) * q, gguf's dequantization. */
void tsr_q6k_dequant_row(const void *packed, int64_t cols, int64_t r, float *out);

/* Rows [r0, r1) and columns [c0, c1) (multiples of 32) of the Q6_K tensor src, repacked
 * into dst (tsr_tensor_bytes of the [r1 - r0, c1 - c0] Q6_K tensor). */
tsr_status tsr_q6k_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         void *dst);

#endif
