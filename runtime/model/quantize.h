/* Weights quantized at load: `--dtype q8_0` (tsr_engine_spec.weights_dtype TSR_Q8_0) turns
 * an F32/BF16/F16 model's matrices into Q8_0 (kernels/cpu/quant_q8.h), the embedding and
 * classifier included, as llama.cpp's Q8_0 files have them. A matrix whose 32-column blocks
 * would cross a reduction part boundary of the tensor-parallel forward (wo when head_dim %
 * 32 != 0, w_down when the hidden chunks are not whole 32-column units) or whose columns
 * are not a multiple of 32 stays in BF16. The choice depends on the config alone, never on
 * tp or pp, so every layout computes the same products. `--dtype q4_0|q4_1` quantizes the
 * layers' matrices to 4 bits the same way (tsr_model_quantize). */
#ifndef TSR_RUNTIME_MODEL_QUANTIZE_H
#define TSR_RUNTIME_MODEL_QUANTIZE_H

#include <stdbool.h>

#include "runtime/model/model.h"

/* Quantizes the model's present matrices (a shard's; empty tensors stay empty) in place,
 * into model-owned memory, slab by slab, each source slab's pages given back once quantized
 * (peak RSS near the quantized size). Sets cfg.dtype to Q8_0. */
tsr_status tsr_model_quantize_q8(tsr_model *m);

/* The same into dt: Q8_0, or Q4_0 / Q4_1 (kernels/cpu/quant_q4.h: ggml's reference
 * quantizers) for the layers' matrices with the embedding and classifier in Q8_0, as the
 * 4-bit GGUF files of llama.cpp users often have them. Sets cfg.dtype to dt. */
tsr_status tsr_model_quantize(tsr_model *m, tsr_dtype dt);

/* MXFP4 experts (GPT-OSS) repacked for the CPU's integer kernels (TSR_MXFP4, kernels/cpu/
 * quant_q4.h), which quantize the activations per token and 32-column block as the Q8_0
 * matrices do: the engine calls it for a quantized --dtype on a backend that takes them
 * (be->mxfp4_packed). Projections whose rows are not whole 16-row groups per expert stay as
 * they are (their f32 kernel). Lossless; each expert's source pages are given back. */
tsr_status tsr_model_pack_experts(tsr_model *m);

/* A GGUF's matrices kept in their blocks (Q4_0, Q4_1, Q4_K, Q5_K, Q6_K: runtime/model/
 * gguf_loader.c, or --dtype q4_0|q4_1) requantized to Q8_0, for a backend without kernels
 * for them (be->gguf_blocks false: CUDA): each row dequantized exactly to f32 (GGUF's values)
 * and quantized per 32 columns (Q8_0's rounding on top of the file's), slab by slab, with
 * one warning line saying so and why. A matrix Q8_0 does not fit (none the loader keeps in
 * blocks) becomes BF16. Sets cfg.dtype to Q8_0 when it was one of those types. */
tsr_status tsr_model_blocks_to_q8(tsr_model *m, const char *why);

/* Whether matrix `which` of a layer is stored as Q8_0 under tsr_model_quantize_q8:
 * which is "wo", "w_down", or any other matrix name (then cols % 32 decides). */
bool tsr_model_q8_eligible(const tsr_model_config *c, const char *which, int64_t cols);

#endif
