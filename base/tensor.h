/* A 1-D or 2-D weight tensor: a typed view of memory owned elsewhere (mmap or buffer). */
#ifndef TSR_BASE_TENSOR_H
#define TSR_BASE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

typedef struct tsr_tensor {
    tsr_dtype dtype;
    int64_t rows; /* out features (matrices) or 1 (vectors) */
    int64_t cols; /* in features, contiguous */
    const void *data;
} tsr_tensor;

/* F8_E4M3: where the per-row f32 scales start (after the codes, 16-byte aligned). */
static inline size_t tsr_fp8_scale_offset(int64_t rows, int64_t cols) {
    return ((size_t)rows * (size_t)cols + 15u) & ~(size_t)15u;
}

/* Q8_0, Q4_0, Q4_1, MXFP4, Q5_K, Q6_K: groups of 16 rows (the last padded) of 34-, 18-, 20-,
 * 17-, 26- or 28-byte blocks per 32 columns; Q4_K: of 144-byte blocks per 256 columns (host
 * layout; a device backend may hold its own, see kernels/backend.h place_weight). F8_E4M3:
 * codes, then one f32 scale per row. */
static inline size_t tsr_tensor_bytes(const tsr_tensor *t) {
    if (t->dtype == TSR_F8_E4M3)
        return tsr_fp8_scale_offset(t->rows, t->cols) + (size_t)t->rows * 4u;
    if (t->dtype == TSR_Q4_K)
        return (size_t)((t->rows + 15) / 16) * 16u * (size_t)(t->cols / 256) * 144u;
    if (t->dtype == TSR_Q6_K || t->dtype == TSR_Q5_K)
        return (size_t)((t->rows + 15) / 16) * 16u * (size_t)(t->cols / 32) *
               (t->dtype == TSR_Q6_K ? 28u : 26u);
    if (t->dtype == TSR_Q8_0 || t->dtype == TSR_Q4_0 || t->dtype == TSR_Q4_1 ||
        t->dtype == TSR_MXFP4)
        return (size_t)((t->rows + 15) / 16) * 16u * (size_t)(t->cols / 32) *
               (t->dtype == TSR_Q8_0   ? 34u
                : t->dtype == TSR_Q4_0 ? 18u
                : t->dtype == TSR_Q4_1 ? 20u
                                       : 17u);
    return (size_t)t->rows * (size_t)t->cols * tsr_dtype_size(t->dtype);
}

/* The experts of one mixture-of-experts projection (GPT-OSS): n experts of [rows, cols]
 * (out, in features) each, expert e's rows at e * rows. Plain: w is an F32/BF16
 * [n * rows, cols] matrix. MXFP4 (OCP microscaling): w is U8 [n * rows, cols / 2], 32
 * consecutive inputs of a row in 16 bytes (element 2j the low nibble of byte j, 2j+1 the
 * high), each an E2M1 code (bit 3 the sign), times 2^(scale - 127) with the block's E8M0
 * byte in scales (U8 [n * rows, cols / 32]). Repacked (mxfp4 0, w of TSR_MXFP4 [n * rows,
 * cols], rows % 16 == 0 so that each expert is whole groups; scales empty): the CPU's
 * integer form (kernels/cpu/quant_q4.h), made at load for --dtype q8_0. bias: f32 [n, rows]. */
typedef struct tsr_experts {
    int n;
    int64_t rows, cols;
    int mxfp4; /* 1: w and scales as above */
    tsr_tensor w;
    tsr_tensor scales;
    tsr_tensor bias;
} tsr_experts;

/* Pointer to row r (not for Q8_0, MXFP4, Q4_*, Q5_K and Q6_K, whose rows interleave in groups;
 * F8_E4M3: the codes). */
static inline const void *tsr_tensor_row(const tsr_tensor *t, int64_t r) {
    return (const char *)t->data + (size_t)r * (size_t)t->cols * tsr_dtype_size(t->dtype);
}

#endif
