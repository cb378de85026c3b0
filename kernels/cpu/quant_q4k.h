/* GGUF's Q4_K on the CPU, computed natively the way llama.cpp's Q4_K x Q8_K dot product does.
 *
 * A GGUF block_q4_K holds 256 values of a row (a super-block) in 144 bytes: fp16 d, fp16
 * dmin, 12 bytes of 6-bit scales sc[8] and mins m[8] for its 8 sub-blocks of 32 (ggml's
 * get_scale_min_k4 packing: bytes 0-3 the low 6 bits of sc[0..3], bytes 4-7 those of
 * m[0..3], their top 2 bits the high bits of sc[4..7] / m[4..7], whose low 4 bits are the
 * nibbles of bytes 8-11), then 128 bytes of codes q: byte 32c + l holds column 64c + l in
 * its low nibble and column 64c + 32 + l in its high one (sub-blocks 2c and 2c + 1). Value
 * of column k in sub-block j: d * sc[j] * q - dmin * m[j] (gguf's dequantize).
 *
 * Activations are quantized per token and 256-column block as llama.cpp's Q8_K: max = the
 * value of largest magnitude, iscale = -127 / max, x_q = min(127, nearest_int(iscale * x))
 * (round half to even), d_x = 1 / iscale kept in f32, and block sums of x_q (llama.cpp keeps
 * them per 16 columns and adds pairs; here per 32, the same integers). Per super-block, in
 * exact int32: isum = sum_j sc[j] * sum(q * x_q over sub-block j), msum = sum_j m[j] *
 * bsum_j; then acc = fmaf(isum, d * d_x, acc), acc = fmaf(msum, -(dmin * d_x), acc): the
 * integers and the activation codes are llama.cpp's, the f32 accumulation one chain.
 *
 * Storage (TSR_Q4_K tensors): repacked at load, losslessly and in the same 144 bytes per
 * super-block, into groups of 16 rows (the last padded with zero rows); per group and
 * super-block 2304 bytes: the 16 rows' fp16 d (32 bytes), their fp16 dmin (32), their
 * 12 scale bytes as three planes of 64 (plane w holds row j's bytes 4w..4w+3 at 4j, so each
 * is one 16-lane vector of 32-bit words that ggml's scale unpacking works on lane-wise), then
 * 32 steps of 64 bytes, step s holding row j's code bytes 4s..4s+3 at 4j (one AVX-512
 * register of 16 rows x 4 columns, the low nibbles and, shifted by 4, the high nibbles 32
 * columns further), as quant_q4.h's Q4_0 layout has it. */
#ifndef TSR_KERNELS_CPU_QUANT_Q4K_H
#define TSR_KERNELS_CPU_QUANT_Q4K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TSR_Q4K_BLOCK 256        /* values per super-block */
#define TSR_Q4K_BLOCK_BYTES 144  /* GGUF block_q4_K */
#define TSR_Q4K_GROUP 16         /* rows per repacked group */
#define TSR_Q4K_GROUP_BLOCK_BYTES (TSR_Q4K_GROUP * TSR_Q4K_BLOCK_BYTES) /* 2304 */

/* Whether a [rows, cols] matrix can be stored so (cols a positive multiple of 256). */
bool tsr_q4k_fits(int64_t rows, int64_t cols);

/* Repacks a [rows, cols] matrix of GGUF block_q4_K (row-major, as the file stores them) into
 * `packed` (tsr_tensor_bytes of the Q4_K tensor), padding rows included. */
void tsr_q4k_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed);
/* Row r back to GGUF blocks (the lossless inverse of the packing). */
void tsr_q4k_unpack_row(const void *packed, int64_t cols, int64_t r, uint8_t *blocks);
/* Row r dequantized to f32: (d * sc) * q - (dmin * m), gguf's dequantization. */
void tsr_q4k_dequant_row(const void *packed, int64_t cols, int64_t r, float *out);

/* One row of cols / 256 GGUF Q4_K blocks rewritten as cols / 32 GGUF Q4_1 blocks (20 bytes:
 * fp16 d, fp16 m, 16 code bytes), sub-block j of a super-block becoming one Q4_1 block with
 * d = fp16(d * sc[j]), m = fp16(-(dmin * m[j])) and the same codes. Lossy only by fp16's
 * rounding of those two products (they need up to 17 significant bits; relative error at
 * most 2^-12 of the sub-block's scale and offset), and computed then on 32-column blocks, so
 * for matrices whose reduction parts cut super-blocks. False when a product overflows
 * fp16 (the caller expands such a matrix instead). */
bool tsr_q4k_to_q4_1(const uint8_t *blocks, int64_t cols, uint8_t *out);

/* Rows [r0, r1) and columns [c0, c1) (multiples of 256) of the Q4_K tensor src, repacked
 * into dst (tsr_tensor_bytes of the [r1 - r0, c1 - c0] Q4_K tensor). */
tsr_status tsr_q4k_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         void *dst);

#endif
