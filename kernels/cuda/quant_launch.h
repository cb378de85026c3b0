/* Launchers of the quantized-weight kernels (quant.cu), callable from C host code
 * (quant_gemm.c). As launch.h: each enqueues on `stream`, returns the launch status and
 * never synchronizes; pointers are device pointers. Matrices are row-major [rows][ld]
 * (ld in elements for FP8, in 32-value blocks for Q8_0) and a product reads the column
 * window [k0, k0 + k) of each row; x rows are ldx floats apart and start at that window's
 * first column (the caller offsets x); y rows ([n][rows]) are ldy floats apart.
 *
 * Layouts on the device: F8_E4M3 as base/dtype.h (codes, then the per-row f32 scales, passed
 * separately here); Q8_0, Q4_0, Q4_1 as GGUF's block rows, not the CPU's repacked groups
 * (quant_gemm.c converts at upload). */
#ifndef TSR_KERNELS_CUDA_QUANT_LAUNCH_H
#define TSR_KERNELS_CUDA_QUANT_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest batch of the GEMVs (decode); more rows take a GEMM path. */
#define TSR__CUDA_GEMV_MAX_N 8

/* y[i][r] = scale[r] * sum_j x[i][j] * e4m3(w[r][k0 + j]), f32 accumulation, n <= 8.
 * Weight-only: x stays f32. 16-byte loads of 16 codes when w + k0, ld and k allow. */
cudaError_t tsr__cuda_launch_fp8_gemv(const uint8_t *w, const float *scale, int64_t rows,
                                      int64_t ld, int64_t k0, int64_t k, const float *x,
                                      int64_t ldx, int n, float *y, int64_t ldy,
                                      cudaStream_t stream);
/* GGUF block types of the kernels below, by GGML type id (quant.cu has the formats). */
#define TSR__GGML_Q4_0 2
#define TSR__GGML_Q4_1 3
#define TSR__GGML_Q8_0 8

/* y[i][r] = sum over blocks b of the window of block b's values . x[i][32 b ..] (f32), for
 * rows of GGUF blocks of `type` (Q8_0, Q4_0, Q4_1); n <= 8; k0 and k multiples of 32. */
cudaError_t tsr__cuda_launch_gguf_gemv(int type, const uint8_t *blocks, int64_t rows,
                                       int64_t ld_blocks, int64_t k0, int64_t k, const float *x,
                                       int64_t ldx, int n, float *y, int64_t ldy,
                                       cudaStream_t stream);
/* out[r][j] (bf16, rows nr, ld k) = rows [r0, r0 + nr), window [k0, k0 + k) of w
 * dequantized: FP8 codes as they are (exact in bf16; the row scale is applied to the
 * product), GGUF blocks' values rounded to bf16. dtype: -1 for FP8 (ld in codes) or a
 * TSR__GGML_* type (ld in blocks). */
cudaError_t tsr__cuda_launch_dequant_bf16(const uint8_t *w, int dtype, int64_t ld, int64_t r0,
                                          int64_t nr, int64_t k0, int64_t k, uint16_t *out,
                                          cudaStream_t stream);
/* out[i][j] (bf16, ld k) = x[i][j] (ldx apart), round to nearest even. */
cudaError_t tsr__cuda_launch_x_bf16(const float *x, int64_t ldx, int64_t n, int64_t k,
                                    uint16_t *out, cudaStream_t stream);
/* Per-token FP8: scale[i] = amax(x[i]) / 448 (1 for a zero row), out[i][j] (ld k) =
 * e4m3(x[i][j] / scale[i]) saturated. */
cudaError_t tsr__cuda_launch_x_fp8(const float *x, int64_t ldx, int64_t n, int64_t k,
                                   uint8_t *out, float *scale, cudaStream_t stream);
/* y[i][r] *= (row_scale ? row_scale[i] : 1) * col_scale[r] for n rows of `rows` (ldy). */
cudaError_t tsr__cuda_launch_scale_out(float *y, int64_t ldy, int64_t n, int64_t rows,
                                       const float *row_scale, const float *col_scale,
                                       cudaStream_t stream);
/* out[i] = row ids[i] of a GGUF-block embedding of `type`, dequantized; an id outside
 * [0, rows) writes zeros and sets *bad_id = 1. */
cudaError_t tsr__cuda_launch_embed_gguf(int type, const uint8_t *blocks, int64_t rows,
                                        int64_t cols, const int32_t *ids, int64_t n, float *out,
                                        int *bad_id, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
