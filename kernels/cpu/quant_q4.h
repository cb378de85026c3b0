/* 4-bit weights on the CPU: GGUF's Q4_0 and Q4_1 computed natively, the way llama.cpp's dot
 * products do. A block holds 32 values of a row: Q4_0 an fp16 scale d and 4-bit codes q
 * (value d * (q - 8)); Q4_1 fp16 d and fp16 m (value d * q + m). Activations are quantized
 * per token and 32-column block as for Q8_0 (kernels/cpu/quant_q8.h: d_x = amax / 127,
 * int8 codes); Q4_0 rows then sum d_w * d_x * sum((q - 8) * x_q) per block (llama.cpp's
 * Q4_0 x Q8_0), Q4_1 rows d_w * d_x * sum(q * x_q) + m_w * s_x per block, with s_x =
 * fp16(d_x * sum(x_q)) taken with the unrounded d_x (llama.cpp's Q8_1 block sum).
 *
 * Storage (TSR_Q4_0 / TSR_Q4_1 tensors): repacked at load, losslessly, into groups of 16 rows
 * (the last padded with zero rows), per group and 32-column block: the 16 rows' fp16 d (32
 * bytes), for Q4_1 then their fp16 m (32 bytes), then 4 steps of 64 bytes, step s holding
 * row j's GGUF code bytes qs[4s .. 4s+3] at 4j: the low nibble of byte qs[k] is column k,
 * the high nibble column k + 16, as in a GGUF block. A step's 64 bytes masked with 0x0f are
 * one AVX-512 register of 16 rows x 4 columns of u8 codes for vpdpbusd, shifted right by 4
 * the 4 columns 16 further. 288 (Q4_0) or 320 (Q4_1) bytes per group block: 16 GGUF blocks'
 * bytes, 4.5 or 5 bits per weight.
 *
 * MXFP4 (TSR_MXFP4, GPT-OSS's experts, OCP microscaling): a block holds 32 E2M1 codes (bit 3
 * the sign, values 0, 0.5, 1, 1.5, 2, 3, 4, 6) and one E8M0 byte e (2^(e - 127)). Twice a
 * code's value is an integer in [-12, 12], so a block's product with a quantized activation
 * block is exact in int32: d_w * d_x * sum(v2 * x_q) with d_w = 2^(e - 128) (llama.cpp's
 * MXFP4 x Q8_0). Packed like Q4_0, the scale area being the 16 rows' E8M0 bytes (16 bytes),
 * then the 4 code steps with byte k of a row's block holding codes k (low nibble) and k + 16
 * (high), 272 bytes per group block, 4.25 bits per weight as in the checkpoint. The kernels
 * map a code to v2 + 12 (0..24, u8 for vpdpbusd) by a 16-byte table (vpshufb) and subtract
 * 12 * sum(x_q), as Q4_0 subtracts 8 * sum(x_q). */
#ifndef TSR_KERNELS_CPU_QUANT_Q4_H
#define TSR_KERNELS_CPU_QUANT_Q4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TSR_Q4_BLOCK 32 /* values per block */
#define TSR_Q4_GROUP 16 /* rows per repacked group */

/* Whether dtype is one of the 4-bit types (TSR_Q4_0, TSR_Q4_1). */
bool tsr_q4_is(tsr_dtype t);
/* Whether t runs on the 4-bit kernels' repacked 16-row groups: Q4_0, Q4_1, and MXFP4
 * experts repacked at start-up (tsr_q4_pack_mxfp4). */
bool tsr_q4_grouped(tsr_dtype t);
/* GGUF bytes of one block: 18 (Q4_0) or 20 (Q4_1). */
size_t tsr_q4_block_bytes(tsr_dtype t);
/* Bytes of one 16-row group's block in the repacked layout: 288 or 320. */
size_t tsr_q4_group_block_bytes(tsr_dtype t);
/* Whether a [rows, cols] matrix can be stored so (cols a positive multiple of 32). */
bool tsr_q4_fits(int64_t rows, int64_t cols);

/* GGUF blocks of n values (n % 32 == 0), as ggml's quantize_row_q4_0_ref / q4_1_ref. */
void tsr_q4_quantize_blocks(tsr_dtype t, const float *x, int64_t n, uint8_t *blocks);

/* Repacks a [rows, cols] matrix of GGUF blocks (row-major, as the file stores them) into
 * `packed` (tsr_tensor_bytes of the tensor), padding rows included. */
void tsr_q4_pack_gguf(tsr_dtype t, const uint8_t *blocks, int64_t rows, int64_t cols,
                      void *packed);
/* Row r back to GGUF blocks (the lossless inverse of the packing). */
void tsr_q4_unpack_row(tsr_dtype t, const void *packed, int64_t cols, int64_t r,
                       uint8_t *blocks);
/* Row r dequantized to f32 (GGUF's dequantization: d * (q - 8), or d * q + m; MXFP4: the
 * code's value times 2^(e - 127)). */
void tsr_q4_dequant_row(tsr_dtype t, const void *packed, int64_t cols, int64_t r, float *out);

/* Repacks a [rows, cols] MXFP4 matrix (blocks: 16 bytes per 32 columns, element 2j the low
 * nibble of byte j, 2j + 1 the high; scales: one E8M0 byte per block; both row-major as a
 * checkpoint stores them) into `packed` (tsr_tensor_bytes of the TSR_MXFP4 tensor). */
void tsr_q4_pack_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t rows,
                       int64_t cols, void *packed);

/* Rows [r0, r1) and columns [c0, c1) (multiples of 32) of the 4-bit tensor src, repacked
 * into dst (tsr_tensor_bytes of the [r1 - r0, c1 - c0] tensor of src's dtype). */
tsr_status tsr_q4_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        void *dst);

/* Quantizes `src` (F32, BF16 or F16, [rows, cols], tsr_q4_fits) into `packed` of dtype t. */
tsr_status tsr_q4_quantize_tensor(const tsr_tensor *src, tsr_dtype t, void *packed);

#endif
