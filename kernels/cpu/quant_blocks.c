/* The GGUF-block family (quant_blocks.h): dispatch to each type's module, and the one
 * plane-by-plane slicer of the 32-column layouts. */
#include "kernels/cpu/quant_blocks.h"

#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/quant_q4.h"
#include "kernels/cpu/quant_q4k.h"
#include "kernels/cpu/quant_q5k.h"
#include "kernels/cpu/quant_q6k.h"
#include "kernels/cpu/quant_q8.h"

bool tsr_qblocks_is(tsr_dtype t) {
    return t == TSR_Q8_0 || tsr_q4_is(t) || t == TSR_Q4_K || t == TSR_Q5_K || t == TSR_Q6_K;
}

size_t tsr_qblocks_group_bytes(tsr_dtype t, int64_t cols) {
    switch (t) {
    case TSR_Q8_0: return (size_t)(cols / TSR_Q8_BLOCK) * TSR_Q8_GROUP_BLOCK_BYTES;
    case TSR_Q4_0:
    case TSR_Q4_1: return (size_t)(cols / TSR_Q4_BLOCK) * tsr_q4_group_block_bytes(t);
    case TSR_Q4_K: return (size_t)(cols / TSR_Q4K_BLOCK) * TSR_Q4K_GROUP_BLOCK_BYTES;
    case TSR_Q5_K: return (size_t)(cols / TSR_Q5K_BLOCK) * TSR_Q5K_GROUP_BLOCK_BYTES;
    case TSR_Q6_K: return (size_t)(cols / TSR_Q6K_BLOCK) * TSR_Q6K_GROUP_BLOCK_BYTES;
    default: return 0;
    }
}

void tsr_qblocks_row_f32(const tsr_tensor *t, int64_t r, float *out) {
    switch (t->dtype) {
    case TSR_Q8_0: tsr_q8_dequant_row(t->data, t->cols, r, out); break;
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_MXFP4: tsr_q4_dequant_row(t->dtype, t->data, t->cols, r, out); break;
    case TSR_Q4_K: tsr_q4k_dequant_row(t->data, t->cols, r, out); break;
    case TSR_Q5_K: tsr_q5k_dequant_row(t->data, t->cols, r, out); break;
    case TSR_Q6_K: tsr_q6k_dequant_row(t->data, t->cols, r, out); break;
    default: tsr_dtype_to_f32(t->dtype, tsr_tensor_row(t, r), out, (size_t)t->cols); break;
    }
}

tsr_status tsr_qblocks_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1, void *dst) {
    switch (src->dtype) {
    case TSR_Q8_0: return tsr_q8_slice(src, r0, r1, c0, c1, dst);
    case TSR_Q4_0:
    case TSR_Q4_1: return tsr_q4_slice(src, r0, r1, c0, c1, dst);
    case TSR_Q4_K: return tsr_q4k_slice(src, r0, r1, c0, c1, dst);
    case TSR_Q5_K: return tsr_q5k_slice(src, r0, r1, c0, c1, dst);
    case TSR_Q6_K: return tsr_q6k_slice(src, r0, r1, c0, c1, dst);
    default:
        return tsr_error_set(TSR_ERR_INVALID, "slice: %s is no GGUF-block dtype",
                             tsr_dtype_name(src->dtype));
    }
}

tsr_status tsr_qplanes_slice(const tsr_qplanes *l, const tsr_tensor *src, int64_t r0,
                             int64_t r1, int64_t c0, int64_t c1, void *dst) {
    if (src->dtype != l->dtype || r0 < 0 || r1 > src->rows || r0 >= r1 || c0 < 0 ||
        c1 > src->cols || c0 >= c1 || c0 % 32 || c1 % 32)
        return tsr_error_set(TSR_ERR_INVALID, "%s slice: rows [%lld, %lld) columns "
                             "[%lld, %lld) of a [%lld, %lld] %s matrix (columns on 32)",
                             tsr_dtype_name(l->dtype), (long long)r0, (long long)r1,
                             (long long)c0, (long long)c1, (long long)src->rows,
                             (long long)src->cols, tsr_dtype_name(src->dtype));
    tsr_tensor d = {.dtype = l->dtype, .rows = r1 - r0, .cols = c1 - c0};
    memset(dst, 0, tsr_tensor_bytes(&d));
    int64_t snb = src->cols / 32, dnb = d.cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        int js = (int)(r % TSR_QBLOCKS_GROUP), jd = (int)((r - r0) % TSR_QBLOCKS_GROUP);
        const uint8_t *sg = (const uint8_t *)src->data +
                            (size_t)(r / TSR_QBLOCKS_GROUP) * (size_t)snb * l->gbb;
        uint8_t *dg = (uint8_t *)dst + (size_t)((r - r0) / TSR_QBLOCKS_GROUP) * (size_t)dnb *
                                           l->gbb;
        for (int64_t b = 0; b < dnb; b++) {
            const uint8_t *s = sg + (size_t)(b + c0 / 32) * l->gbb;
            uint8_t *o = dg + (size_t)b * l->gbb;
            for (int p = 0; p < l->n; p++) {
                size_t w = l->p[p].width;
                memcpy(o + l->p[p].off + w * (size_t)jd, s + l->p[p].off + w * (size_t)js, w);
            }
        }
    }
    return TSR_OK;
}
