// Element-wise and row kernels of the CUDA backend: embed, rmsnorm, rope, swiglu (also on a
// fused gate/up product), add and
// the f32 -> bf16/f16 conversion in front of reduced-precision GEMMs. Semantics follow the
// CPU backend (kernels/backend.h); accurate libm calls (expf, sincosf), never fast-math,
// so results stay within float rounding of the CPU; this file is built with --fmad=false
// (cmake/TesseraCuda.cmake) so that products round like the CPU's, unfused.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "base/dtype.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float tsr_load(const void *p, int dtype, int64_t i) {
    if (dtype == TSR_F32) return static_cast<const float *>(p)[i];
    const unsigned short h = static_cast<const unsigned short *>(p)[i];
    if (dtype == TSR_BF16) return __uint_as_float(static_cast<unsigned>(h) << 16);
    return __half2float(__ushort_as_half(h));
}

// Grid-stride count of blocks for n elements, capped so the grid stays legal.
unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return static_cast<unsigned>(b);
}

__global__ void embed_kernel(const void *emb, int dtype, int64_t rows, int64_t cols,
                             const int32_t *ids, float *out, int *bad_id) {
    const int64_t i = blockIdx.x;
    const int32_t id = ids[i];
    float *o = out + i * cols;
    if (id < 0 || id >= rows) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = 0.0f;
        if (threadIdx.x == 0) *bad_id = 1;
        return;
    }
    const int64_t base = static_cast<int64_t>(id) * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = tsr_load(emb, dtype, base + c);
}

// Sum over the block; every thread gets the result. `red` holds one float per warp.
__device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) / 32;
    float t = 0.0f;
    for (int w = 0; w < nw; w++) t += red[w];
    __syncthreads();
    return t;
}

// out16 (may be null): the same rows rounded to BF16, the input of the next BF16 GEMM
// (rmsnorm_matmul), so that no conversion kernel runs between the two.
__global__ void rmsnorm_kernel(const float *x, const void *w, int wdtype, int dim, float eps,
                               float *out, __nv_bfloat16 *out16) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    float *orow = out + row * dim;
    // Each element is read and written by the same thread, so out == x is safe.
    __nv_bfloat16 *o16 = out16 ? out16 + row * dim : nullptr;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float y = xr[c] * inv * tsr_load(w, wdtype, c);
        orow[c] = y;
        if (o16) o16[c] = __float2bfloat16_rn(y);
    }
}

// One thread per rotated pair (row, head, i).
__global__ void rope_kernel(float *x, const int32_t *pos, int64_t pairs, int n_heads, int head_dim,
                            const float *inv_freq, int interleaved, float cos_scale) {
    const int half = head_dim / 2;
    for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < pairs;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int i = static_cast<int>(t % half);
        const int64_t rh = t / half; // row * n_heads + head
        const int64_t row = rh / n_heads;
        float *h = x + rh * head_dim;
        const float angle = static_cast<float>(pos[row]) * inv_freq[i];
        float s, c;
        sincosf(angle, &s, &c);
        s *= cos_scale; // YaRN's attention factor (1 otherwise: exact), as the CPU scales
        c *= cos_scale;
        float *a = interleaved ? h + 2 * i : h + i;
        float *b = interleaved ? h + 2 * i + 1 : h + i + half;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = interleaved ? x0 * s + x1 * c : x1 * c + x0 * s; // the CPU's operand order
    }
}

__global__ void swiglu_kernel(float *gate, const float *up, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__device__ __forceinline__ void store_act(float *p, float y) { *p = y; }
__device__ __forceinline__ void store_act(__nv_bfloat16 *p, float y) { *p = __float2bfloat16_rn(y); }

// The fused gate/up product's halves: out[r][j] = silu(gate) * up, swiglu_kernel's
// arithmetic; BF16 out rounds to nearest even, as the conversion in front of a GEMM would.
template <typename T>
__global__ void swiglu_fused_kernel(const float *gu, int64_t n, int hidden, T *out) {
    const int64_t total = n * hidden;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / hidden, j = i % hidden;
        const float g = gu[r * 2 * hidden + j], u = gu[r * 2 * hidden + hidden + j];
        const float y = g / (1.0f + expf(-g)) * u;
        store_act(out + i, y);
    }
}

// y[r] = w[r] . x for one input row (decode at batch 1) with BF16 weights: a warp per
// weight row, 16-byte loads (8 weights) in flight per lane, FP32 products and sums, x read
// as f32 (no conversion launch). Rows of cols % 8 == 0 and 16-byte aligned (the common
// case) take the vector path; others the scalar loop.
constexpr int kGemvWarps = 8;

__global__ void gemv_bf16_kernel(const unsigned short *w, int64_t rows, int64_t cols,
                                 const float *x, float *y) {
    const int lane = threadIdx.x % 32;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const unsigned short *wr = w + r * cols;
    float acc = 0.0f;
    const bool vec = cols % 8 == 0 && (reinterpret_cast<uintptr_t>(wr) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    if (vec) {
        const uint4 *w8 = reinterpret_cast<const uint4 *>(wr);
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        for (int64_t i = lane; i < cols / 8; i += 32) {
            const uint4 p = __ldg(w8 + i);
            const float4 xa = __ldg(x4 + 2 * i), xb = __ldg(x4 + 2 * i + 1);
            const unsigned u[4] = {p.x, p.y, p.z, p.w};
            const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            for (int j = 0; j < 4; j++) {
                acc += __uint_as_float(u[j] << 16) * xs[2 * j];
                acc += __uint_as_float(u[j] & 0xffff0000u) * xs[2 * j + 1];
            }
        }
    } else {
        for (int64_t c = lane; c < cols; c += 32)
            acc += __uint_as_float(static_cast<unsigned>(wr[c]) << 16) * x[c];
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[r] = acc;
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] += y[i];
}

/* y[i] = ((p_0[i] + p_1[i]) + p_2[i]) + ..., the parts m floats apart: the order of the
 * add-per-part loop, so the same bits, in one launch. */
__global__ void sum_parts_kernel(float *y, const float *parts, int n_parts, int64_t m,
                                 int accumulate) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float acc = parts[i];
        for (int p = 1; p < n_parts; p++) acc += parts[static_cast<int64_t>(p) * m + i];
        y[i] = accumulate ? y[i] + acc : acc;
    }
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void to_f16_kernel(__half *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

} // namespace

extern "C" cudaError_t tsr__cuda_launch_embed(const void *emb, int dtype, int64_t rows,
                                              int64_t cols, const int32_t *ids, int64_t n,
                                              float *out, int *bad_id, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffffLL) return cudaErrorInvalidValue;
    embed_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(emb, dtype, rows, cols, ids,
                                                                    out, bad_id);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_rmsnorm(const float *x, const void *w, int wdtype,
                                                int64_t n, int dim, float eps, float *out,
                                                cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffffLL) return cudaErrorInvalidValue;
    rmsnorm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, wdtype, dim, eps, out,
                                                                      nullptr);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_rmsnorm_bf16(const float *x, const void *w, int wdtype,
                                                     int64_t n, int dim, float eps, float *out,
                                                     void *out16, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffffLL) return cudaErrorInvalidValue;
    rmsnorm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        x, w, wdtype, dim, eps, out, static_cast<__nv_bfloat16 *>(out16));
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_rope(float *x, const int32_t *pos, int64_t n, int n_heads,
                                             int head_dim, const float *inv_freq, int interleaved,
                                             float cos_scale, cudaStream_t stream) {
    const int64_t pairs = n * n_heads * (head_dim / 2);
    if (pairs <= 0) return cudaSuccess;
    rope_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(x, pos, pairs, n_heads, head_dim,
                                                            inv_freq, interleaved, cos_scale);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_swiglu(float *gate, const float *up, int64_t n,
                                               cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    swiglu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, n);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_swiglu_fused(const float *gu, int64_t n, int hidden,
                                                     void *out, int out_dtype,
                                                     cudaStream_t stream) {
    if (n <= 0 || hidden <= 0) return cudaSuccess;
    const int64_t total = n * hidden;
    if (out_dtype == TSR_BF16)
        swiglu_fused_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
            gu, n, hidden, static_cast<__nv_bfloat16 *>(out));
    else if (out_dtype == TSR_F32)
        swiglu_fused_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
            gu, n, hidden, static_cast<float *>(out));
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_gemv_bf16(const void *w, int64_t rows, int64_t cols,
                                                  const float *x, float *y,
                                                  cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    const int64_t blocks = (rows + kGemvWarps - 1) / kGemvWarps;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    gemv_bf16_kernel<<<static_cast<unsigned>(blocks), kGemvWarps * 32, 0, stream>>>(
        static_cast<const unsigned short *>(w), rows, cols, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_add(float *x, const float *y, int64_t n,
                                            cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_sum_parts(float *y, const float *parts, int n_parts,
                                                  int64_t m, int accumulate,
                                                  cudaStream_t stream) {
    if (m <= 0 || n_parts <= 0) return cudaSuccess;
    sum_parts_kernel<<<blocks_for(m), kThreads, 0, stream>>>(y, parts, n_parts, m,
                                                             accumulate);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_convert_f32(void *dst, int dtype, const float *src,
                                                    int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dtype == TSR_BF16)
        to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(dst),
                                                               src, n);
    else if (dtype == TSR_F16)
        to_f16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<__half *>(dst), src, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
