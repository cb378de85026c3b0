/* Q8_0 weights on the CPU: GGUF's Q8_0 numerics (blocks of 32 values along a row, each
 * with an fp16 scale d = amax / 127 and int8 q = roundf(x / d) computed with the unrounded
 * f32 d, exactly as ggml's reference quantizer and the `gguf` Python package), activations
 * quantized per token the same way, and products summed per block in int32.
 *
 * Storage (TSR_Q8_0 tensors): the rows are repacked at load, losslessly, for the int8 dot
 * instructions: groups of 16 rows (the last group padded with zero rows), and per group
 * and 32-column block 544 bytes: the 16 rows' fp16 scales (32 bytes), then for each 4-column
 * step s (0..7) the 16 rows' 4 weights (64 bytes: row j's at 4j), each stored as the
 * unsigned byte q + 128. One 64-byte load is thus one AVX-512 register of 16 rows x 4
 * columns for vpdpbusd (u8 weights x s8 activations), and a group's blocks are contiguous,
 * so decode streams a matrix front to back. Same bytes per weight as GGUF (8.5 bits). */
#ifndef TSR_KERNELS_CPU_QUANT_Q8_H
#define TSR_KERNELS_CPU_QUANT_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TSR_Q8_BLOCK 32      /* values per block */
#define TSR_Q8_BLOCK_BYTES 34 /* GGUF block_q8_0: fp16 d, then 32 int8 */
#define TSR_Q8_GROUP 16      /* rows per repacked group */
#define TSR_Q8_GROUP_BLOCK_BYTES (TSR_Q8_GROUP * TSR_Q8_BLOCK_BYTES) /* 544 */

/* GGUF block_q8_0 bytes of n values (n % 32 == 0): ggml's quantize_row_q8_0_ref. */
void tsr_q8_quantize_blocks(const float *x, int64_t n, uint8_t *blocks);

/* Whether a [rows, cols] matrix can be stored as Q8_0 (cols a positive multiple of 32). */
bool tsr_q8_fits(int64_t rows, int64_t cols);

/* Repacks row r of a [rows, cols] matrix from GGUF blocks (cols / 32 blocks of 34 bytes)
 * into `packed` (tsr_tensor_bytes of the Q8_0 tensor; padding rows must be zero-filled by
 * the caller, e.g. by tsr_q8_pack_init). */
void tsr_q8_pack_row(uint8_t *packed, int64_t cols, int64_t r, const uint8_t *blocks);
/* Zero-fills the padding rows of the last group (their scales 0, weights 128). */
void tsr_q8_pack_init(uint8_t *packed, int64_t rows, int64_t cols);
/* Row r back to GGUF blocks (the lossless inverse of tsr_q8_pack_row). */
void tsr_q8_unpack_row(const uint8_t *packed, int64_t cols, int64_t r, uint8_t *blocks);
/* Row r dequantized to f32 (q * d per value: GGUF's dequantization). */
void tsr_q8_dequant_row(const uint8_t *packed, int64_t cols, int64_t r, float *out);

/* Repacks a whole [rows, cols] matrix of GGUF Q8_0 blocks (row-major, as the file stores
 * them) into `packed` (tsr_tensor_bytes of the Q8_0 tensor), padding rows included. */
void tsr_q8_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed);

/* Rows [r0, r1) and columns [c0, c1) (multiples of 32) of the Q8_0 tensor src, repacked
 * into dst (tsr_tensor_bytes of the [r1 - r0, c1 - c0] Q8_0 tensor). */
tsr_status tsr_q8_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        void *dst);

/* Quantizes `src` (F32, BF16 or F16, [rows, cols], tsr_q8_fits) into `packed`
 * (tsr_tensor_bytes of the Q8_0 tensor). */
tsr_status tsr_q8_quantize_tensor(const tsr_tensor *src, void *packed);

#endif
