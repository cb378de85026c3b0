/* Element types of KV storage (tsr_kv_layout.dtype, tsr_kv_span.dtype) and the row codecs
 * every backend's KV row ops and attention use. The forward pass hands K/V to the cache as
 * f32 rows and attention accumulates in f32 whatever the storage; only the stored bytes
 * change:
 * - F32: 4 bytes per element.
 * - BF16: 2 bytes, round to nearest even (torch's rounding).
 * - Q8: Q8_0-style blocks of 32 elements along the row (an f32 scale, then 32 int8: 36
 *   bytes per 32 elements), so a row of whole heads (head_dim a multiple of 32) never
 *   shares a block with another head and a tensor-parallel shard's rows quantize exactly
 *   as the unsplit row's. An f32 scale rather than GGUF's f16: 1.125 bytes per element
 *   against 1.0625, and no second rounding of the scale.
 * - FP8: E4M3 (float8_e4m3fn: no infinities, 0x7f / 0xff NaN, max 448) with one f32 scale
 *   per row (amax / 448) ahead of the row's bytes. A per-row scale needs no calibration pass
 *   and no rescaling when later tokens grow the layer's range; it costs 4 bytes a row.
 * A row of `row` elements takes tsr_kv_row_bytes(dtype, row) bytes; layouts and spans
 * address rows, never elements inside a non-f32 row. */
#ifndef TSR_KERNELS_KV_DTYPE_H
#define TSR_KERNELS_KV_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum tsr_kv_dtype {
    TSR_KV_F32 = 0,
    TSR_KV_BF16 = 1,
    TSR_KV_Q8 = 2,
    TSR_KV_FP8 = 3,
} tsr_kv_dtype;

#define TSR_KV_Q8_BLOCK 32
/* Bytes of one stored Q8 block: its f32 scale, then TSR_KV_Q8_BLOCK int8. */
#define TSR_KV_Q8_BLOCK_BYTES (4 + TSR_KV_Q8_BLOCK)

/* "f32", "bf16", "q8", "fp8". */
const char *tsr_kv_dtype_name(int dtype);
/* The dtype named by s (as tsr_kv_dtype_name writes it); -1 when unknown. */
int tsr_kv_dtype_parse(const char *s);
/* Bytes of one stored row of `row` elements (0 when row does not suit the dtype: Q8 needs
 * a multiple of TSR_KV_Q8_BLOCK). */
size_t tsr_kv_row_bytes(int dtype, int64_t row);
/* Whether rows of heads of head_dim elements can be stored as dtype. */
int tsr_kv_dtype_fits(int dtype, int head_dim);

/* n rows of `row` f32 elements (src rows src_ld floats apart) to stored rows (dst rows
 * tsr_kv_row_bytes apart), and back. */
void tsr_kv_rows_encode(int dtype, const float *src, int64_t src_ld, void *dst, int64_t n,
                        int64_t row);
void tsr_kv_rows_decode(int dtype, const void *src, float *dst, int64_t dst_ld, int64_t n,
                        int64_t row);

/* Element e of one stored row as tsr_kv_rows_decode gives it (the same arithmetic), for
 * readers that decode in place and need a single element (a SIMD kernel's row tail). */
float tsr_kv_elem_decode(int dtype, const void *row, int64_t e);

/* E4M3 (float8_e4m3fn) scalar codec: decode is exact; encode rounds to nearest even and
 * saturates to +-448 (NaN stays NaN). */
float tsr_e4m3_to_f32(uint8_t b);
uint8_t tsr_f32_to_e4m3(float f);

#endif
