// The row kernels around the expert projections of a mixture-of-experts layer
// (kernels/backend.h tsr_moe_args; the projections are mxfp4.cu): gather each route's
// input row, the clamped GPT-OSS gate over interleaved gate/up rows, and the weighted sum
// of a token's routes in expert order (the CPU's order, kernels/cpu/moe_cpu.c); and the
// broadcasting bias add of the op bias_add. The arithmetic rounds each step as the CPU does
// (explicit _rn intrinsics: no contraction into fused multiply-adds).
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return static_cast<unsigned>(b);
}

__global__ void gather_kernel(const float *x, int64_t dim, const int32_t *rows, int64_t nr,
                              float *xg) {
    const int64_t total = nr * dim;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / dim, c = i % dim;
        xg[i] = x[static_cast<int64_t>(rows[r]) * dim + c];
    }
}

// act[r][j] = (up + 1) * gate * sigmoid(alpha * gate), gate = min(gu[r][2j], limit),
// up = clamp(gu[r][2j + 1], -limit, limit).
__global__ void act_kernel(const float *gu, int64_t nr, int64_t inter, float limit, float alpha,
                           float *act) {
    const int64_t total = nr * inter;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / inter, j = i % inter;
        float gate = gu[r * 2 * inter + 2 * j], up = gu[r * 2 * inter + 2 * j + 1];
        gate = gate > limit ? limit : gate;
        up = up > limit ? limit : up < -limit ? -limit : up;
        const float sig = 1.0f / __fadd_rn(1.0f, expf(-__fmul_rn(gate, alpha)));
        act[i] = __fmul_rn(__fadd_rn(up, 1.0f), __fmul_rn(gate, sig));
    }
}

// out[t][c] = sum over t's routes (tok_routes[tok_off[t] ..], expert order) of
// weights[r] * y[r][c], from 0.
__global__ void combine_kernel(const float *y, int64_t dim, const int32_t *tok_off,
                               const int32_t *tok_routes, const float *weights, int64_t n,
                               float *out) {
    const int64_t total = n * dim;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = i / dim, c = i % dim;
        float o = 0.0f;
        for (int32_t k = tok_off[t]; k < tok_off[t + 1]; k++) {
            const int32_t r = tok_routes[k];
            o = __fadd_rn(o, __fmul_rn(y[static_cast<int64_t>(r) * dim + c], weights[r]));
        }
        out[i] = o;
    }
}

// x[r][j] += b[j] over n rows of width (one rounding, the CPU's bits).
__global__ void bias_rows_kernel(float *x, const float *b, int64_t n, int64_t width) {
    const int64_t total = n * width;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = __fadd_rn(x[i], b[i % width]);
}

} // namespace

extern "C" cudaError_t tsr__cuda_launch_bias_rows(float *x, const float *b, int64_t n,
                                                  int64_t width, cudaStream_t stream) {
    if (n <= 0 || width <= 0) return cudaSuccess;
    bias_rows_kernel<<<blocks_for(n * width), kThreads, 0, stream>>>(x, b, n, width);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_moe_gather(const float *x, int64_t dim,
                                                   const int32_t *rows, int64_t nr, float *xg,
                                                   cudaStream_t stream) {
    if (nr <= 0 || dim <= 0) return cudaSuccess;
    gather_kernel<<<blocks_for(nr * dim), kThreads, 0, stream>>>(x, dim, rows, nr, xg);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_moe_act(const float *gu, int64_t nr, int64_t inter,
                                                float limit, float alpha, float *act,
                                                cudaStream_t stream) {
    if (nr <= 0 || inter <= 0) return cudaSuccess;
    act_kernel<<<blocks_for(nr * inter), kThreads, 0, stream>>>(gu, nr, inter, limit, alpha, act);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_moe_combine(const float *y, int64_t dim,
                                                    const int32_t *tok_off,
                                                    const int32_t *tok_routes,
                                                    const float *weights, int64_t n, float *out,
                                                    cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    combine_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(y, dim, tok_off, tok_routes,
                                                                 weights, n, out);
    return cudaGetLastError();
}
