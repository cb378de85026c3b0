/* Quantized weights on the CUDA backend, host side: F8_E4M3 (per-row scales) and Q8_0
 * matrices in matmul, matmul_parts and embed, and their device layout at upload.
 *
 * Products y[n][rows] = x[n][k] . w[:, k0:k0+k]^T by batch size:
 * - n <= 8 (decode): weight-only GEMVs (quant.cu), x in f32, f32 accumulation; one pass
 *   over the weight bytes, the step's bandwidth floor.
 * - n > 8, FP8 on sm_89 and later: cuBLASLt FP8 GEMM (E4M3 x E4M3, TN, FP32 compute and
 *   output) on the activations quantized per token (scale = amax / 448), unit A/B scale
 *   pointers, then y[i][r] *= x_scale[i] * w_scale[r] (per-token and per-channel scales
 *   factor out of the sum). TSR_CUDA_FP8_GEMM=0 turns it off.
 * - otherwise (Q8_0, FP8 before sm_89 or shapes cuBLASLt refuses: K or the row stride not a
 *   multiple of 16, unaligned windows): weight tiles dequantized to bf16 (FP8 codes exactly,
 *   the row scale applied to the product; Q8_0 q * d rounded to bf16) and cuBLAS BF16 GEMMs
 *   with x rounded to bf16, f32 accumulation, the arithmetic of a BF16 model. On an
 *   architecture without FP8 tensor cores this is said once, at warning level.
 * Device layouts: F8_E4M3 as on the host (base/dtype.h); Q8_0 as GGUF's block_q8_0 rows
 * (the host's repacked groups are unpacked at upload: tsr__cuda_quant_device_copy). */
#ifndef TSR_KERNELS_CUDA_QUANT_GEMM_H
#define TSR_KERNELS_CUDA_QUANT_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "base/status.h"
#include "base/tensor.h"

typedef struct tsr__cuda_quant tsr__cuda_quant;

/* cc: compute capability (major * 10 + minor). blas: the backend's handle, on stream. */
tsr_status tsr__cuda_quant_create(int cc, cudaStream_t stream, cublasHandle_t blas,
                                  tsr__cuda_quant **out);
void tsr__cuda_quant_destroy(tsr__cuda_quant *q);

/* Whether matmul on weights of this dtype goes through tsr__cuda_quant_parts. */
bool tsr__cuda_quant_takes(tsr_dtype t);

/* The bytes a host tensor has on the device when they differ from its host bytes: Q8_0 ->
 * GGUF block rows in a new host buffer (*buf, free with tsr_free; *bytes its size). *buf
 * NULL: upload the host bytes as they are. */
tsr_status tsr__cuda_quant_device_copy(const tsr_tensor *host, void **buf, size_t *bytes);

/* matmul_parts semantics of kernels/backend.h (seg host memory; sum: ordered sum of the
 * parts; acc: y += that sum) for a quantized w (device layout); matmul is one part [0,
 * cols) without sum. */
tsr_status tsr__cuda_quant_parts(tsr__cuda_quant *q, const float *x, int64_t n,
                                 const tsr_tensor *w, const int32_t *seg, int n_parts, bool sum,
                                 bool acc, float *y);

/* out[i] = row ids[i] (device ids) of a Q8_0 embedding, dequantized. */
tsr_status tsr__cuda_quant_embed(tsr__cuda_quant *q, const tsr_tensor *emb, const int32_t *ids,
                                 int64_t n, float *out, int *bad_id);

#endif
