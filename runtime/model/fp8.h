/* FP8 weights: E4M3 (float8_e4m3fn) matrices with one f32 scale per output row
 * (base/dtype.h TSR_F8_E4M3), as compressed-tensors checkpoints carry them and as
 * `--dtype fp8` makes them.
 *
 * Checkpoints (quantization_config.quant_method "compressed-tensors", format
 * "float-quantized", 8-bit float weights): each quantized Linear NAME has NAME.weight
 * F8_E4M3 [out, in] and NAME.weight_scale in F32/F16/BF16 of shape [1] or [] (strategy
 * "tensor": stored once per row here) or [out] / [out, 1] (strategy "channel"); the value is
 * code * scale. Activation scales (input_scale, static) are not used: the GPU kernels
 * compute with the activations in 16 or 32 bits (weight-only) or scale them per token.
 * Matrices a checkpoint leaves unquantized (lm_head, usually the embedding) load as usual.
 *
 * Only the CUDA backend computes with FP8 matrices (be->fp8_weights). Everywhere else the
 * engine converts them at load (tsr_model_fp8_to_q8): each row is dequantized exactly to f32
 * and requantized to Q8_0 (two roundings: FP8's, then Q8_0's 32-value blocks), or kept in
 * f32 where Q8_0 does not fit the matrix (runtime/model/quantize.h), with one warning line
 * saying so. */
#ifndef TSR_RUNTIME_MODEL_FP8_H
#define TSR_RUNTIME_MODEL_FP8_H

#include <stdbool.h>

#include "runtime/format/safetensors.h"
#include "runtime/model/model.h"

#define TSR_FP8_MAX 448.0f /* largest finite E4M3 magnitude */

/* The per-row scales of an F8_E4M3 tensor (rows floats). */
static inline const float *tsr_fp8_scales(const tsr_tensor *t) {
    return (const float *)((const char *)t->data + tsr_fp8_scale_offset(t->rows, t->cols));
}

/* config.json's quantization_config (root: the whole config; absent or null: nothing to
 * check). Accepts compressed-tensors with 8-bit float weights of strategy tensor or channel;
 * anything else is TSR_ERR_UNSUPPORTED with one line naming what. */
tsr_status tsr_fp8_check_config(const void *cjson_root, const char *path);

/* One checkpoint matrix: codes w (F8_E4M3 [rows, cols]) and its weight_scale, copied into
 * model-owned memory as an F8_E4M3 tensor. file names the file in messages. */
tsr_status tsr_fp8_from_st(tsr_model *m, const char *file, const tsr_st_tensor *w,
                           const tsr_st_tensor *scale, tsr_tensor *dst);

/* Quantizes `src` (F32, BF16 or F16 [rows, cols]) per row: scale = amax / 448 (1 for an
 * all-zero row), code = E4M3(x / scale) rounded to nearest even, as compressed-tensors'
 * channel strategy. dst: tsr_tensor_bytes of the F8_E4M3 tensor. */
tsr_status tsr_fp8_quantize_tensor(const tsr_tensor *src, void *dst);

/* Row r of an F8_E4M3 tensor as f32 (code * scale; exact). */
void tsr_fp8_dequant_row(const tsr_tensor *t, int64_t r, float *out);

/* Rows [r0, r1) and columns [c0, c1) of an F8_E4M3 tensor as a new F8_E4M3 tensor in
 * model-owned memory (the tensor-parallel cut; the rows keep their scales). */
tsr_status tsr_fp8_slice(tsr_model *m, tsr_tensor *t, int64_t r0, int64_t r1, int64_t c0,
                         int64_t c1);

/* An F8_E4M3 tensor into dt (F32, BF16 or F16), in model-owned memory (--dtype bf16 on
 * an FP8 checkpoint). */
tsr_status tsr_fp8_dequantize(tsr_model *m, tsr_tensor *t, tsr_dtype dt);

/* Whether any matrix of the model (layers' projections) is F8_E4M3. */
bool tsr_model_has_fp8(const tsr_model *m);

/* `--dtype fp8`: the layers' projection matrices (not the embedding or the classifier, as
 * FP8 checkpoints leave them) into F8_E4M3 per-channel. Sets cfg.dtype. The engine calls it
 * on the whole model, before the tensor-parallel cut, so that every layout quantizes a row
 * with the same scale. */
tsr_status tsr_model_quantize_fp8(tsr_model *m);

/* F8_E4M3 matrices into Q8_0, or f32 where tsr_model_q8_eligible says no (see above); a
 * model without any is left as it is. why: the warning line's reason ("the cpu backend
 * computes no FP8"). */
tsr_status tsr_model_fp8_to_q8(tsr_model *m, const char *why);

#endif
