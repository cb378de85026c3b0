/* The repacked GGUF-block weight dtypes as one family: Q8_0 (quant_q8.h), Q4_0 and Q4_1
 * (quant_q4.h), Q4_K (quant_q4k.h), Q5_K (quant_q5k.h) and Q6_K (quant_q6k.h). Each stores
 * groups of 16 rows, a group's blocks contiguous and the groups in row order, so whole groups
 * of rows are a view into the tensor and any other cut is a repacked copy. Code that cuts or
 * reads weights of any of them (the tensor-parallel cut, the embedding, offload's
 * speculation, export, requantization) goes through here instead of dispatching itself. */
#ifndef TSR_KERNELS_CPU_QUANT_BLOCKS_H
#define TSR_KERNELS_CPU_QUANT_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TSR_QBLOCKS_GROUP 16 /* rows per repacked group, every member */

/* Whether t is one of the family. */
bool tsr_qblocks_is(tsr_dtype t);

/* Bytes of one 16-row group of a [*, cols] matrix of the family's dtype t (all its blocks):
 * rows [16 g, ...) start at byte g times this. */
size_t tsr_qblocks_group_bytes(tsr_dtype t, int64_t cols);

/* Row r of a matrix of any weight dtype as cols f32 values: the family's rows (and those of
 * MXFP4 experts repacked in the 4-bit layout, tsr_q4_pack_mxfp4) dequantized from their
 * repacked groups (GGUF's values), the others converted. */
void tsr_qblocks_row_f32(const tsr_tensor *t, int64_t r, float *out);

/* Rows [r0, r1) and columns [c0, c1) of src (a member; columns on the type's blocks) into
 * dst, tsr_tensor_bytes of the [r1 - r0, c1 - c0] tensor of src's dtype, by the type's own
 * slicer. */
tsr_status tsr_qblocks_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1, void *dst);

/* A layout of 16-row groups of 32-column blocks stored plane by plane (Q5_K, Q6_K): in a
 * group block of gbb bytes, plane p holds row slot j's width bytes at off + width * j. */
typedef struct tsr_qplanes {
    tsr_dtype dtype;
    size_t gbb;
    int n;
    struct {
        uint16_t off, width;
    } p[10];
} tsr_qplanes;

/* tsr_qblocks_slice for such a layout (columns on 32), padding rows zero: the row slots'
 * bytes copied plane by plane. */
tsr_status tsr_qplanes_slice(const tsr_qplanes *l, const tsr_tensor *src, int64_t r0,
                             int64_t r1, int64_t c0, int64_t c1, void *dst);

#endif
