// The expert projections of a mixture-of-experts layer (kernels/backend.h tsr_moe_args):
// one launch for every active expert of a step, MXFP4 weights dequantized in registers
// (W4A16-style: Hopper has no FP4 MMA, and decode is bound by the weight bytes), or plain
// F32/BF16/F16 experts with the same loop.
//
// A warp per output row of one expert: lane j takes the row's 32-element blocks j, j + 32,
// ... (for MXFP4 a 16-byte load of codes plus its E8M0 scale byte: a warp reads 512
// contiguous bytes), decodes the block to 32 floats once and multiplies it with every
// route's input of that block, up to kTok routes at a time; the per-route sums are reduced
// across the warp. So an expert's weights cross HBM once per step for up to kTok routes
// (prefill rereads them per kTok routes, from L2 for the most part).
//
// MXFP4 decode (the CPU's, kernels/cpu/mxfp4_cpu.c): element 2j of a block is the low nibble
// of byte j, 2j + 1 the high nibble; an E2M1 code (bit 3 the sign) from the 16-entry table
// times 2^(scale - 127) in f32, so scale 0 gives the subnormal 2^-127 and every product is
// exact.
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTok = 8; // routes multiplied per decoded block

__constant__ float kFp4[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

__device__ __forceinline__ float e8m0(unsigned s) {
    return __uint_as_float(s ? s << 23 : 0x00400000u);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block b (32 elements) of MXFP4 row `row` into w[32]; lut is the table in shared memory.
__device__ __forceinline__ void mxfp4_block(const uint8_t *blocks, const uint8_t *scales,
                                            int64_t row, int64_t nb, int64_t b,
                                            const float *lut, float *w) {
    const uint4 q = *reinterpret_cast<const uint4 *>(blocks + (row * nb + b) * 16);
    const float sc = e8m0(scales[row * nb + b]);
    const unsigned words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned byte = (words[k] >> (8 * j)) & 0xffu; // little-endian byte 4k + j
            w[8 * k + 2 * j] = lut[byte & 15u] * sc;
            w[8 * k + 2 * j + 1] = lut[byte >> 4] * sc;
        }
    }
}

__device__ __forceinline__ float plain_load(const void *p, int dtype, int64_t i) {
    if (dtype == 0) return static_cast<const float *>(p)[i]; // TSR_F32
    const unsigned short h = static_cast<const unsigned short *>(p)[i];
    if (dtype == 2) return __uint_as_float(static_cast<unsigned>(h) << 16); // TSR_BF16
    return __half2float(__ushort_as_half(h));                               // TSR_F16
}

// Grid (row groups, active experts). list[3i .. 3i + 2] = expert, first route, routes.
__global__ void __launch_bounds__(kThreads) experts_kernel(tsr__cuda_experts w,
                                                           const int32_t *list, const float *x,
                                                           float *y) {
    __shared__ float lut[16];
    if (threadIdx.x < 16) lut[threadIdx.x] = kFp4[threadIdx.x];
    __syncthreads();
    const int e = list[3 * blockIdx.y], r0 = list[3 * blockIdx.y + 1];
    const int cnt = list[3 * blockIdx.y + 2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t cols = w.cols, nb = (cols + 31) / 32;
    for (int64_t orow = static_cast<int64_t>(blockIdx.x) * kWarps + warp; orow < w.rows;
         orow += static_cast<int64_t>(gridDim.x) * kWarps) {
        const int64_t row = static_cast<int64_t>(e) * w.rows + orow; // row of the stacked matrix
        const float bias = w.bias ? w.bias[row] : 0.0f;
        for (int t0 = 0; t0 < cnt; t0 += kTok) {
            const int nt = cnt - t0 < kTok ? cnt - t0 : kTok;
            float acc[kTok];
#pragma unroll
            for (int t = 0; t < kTok; t++) acc[t] = 0.0f;
            for (int64_t b = lane; b < nb; b += 32) {
                float wv[32];
                if (w.mxfp4) {
                    mxfp4_block(static_cast<const uint8_t *>(w.w), w.scales, row, nb, b, lut, wv);
                } else {
#pragma unroll
                    for (int k = 0; k < 32; k++) {
                        const int64_t c = b * 32 + k;
                        wv[k] = c < cols ? plain_load(w.w, w.dtype, row * cols + c) : 0.0f;
                    }
                }
#pragma unroll
                for (int t = 0; t < kTok; t++) {
                    if (t >= nt) break;
                    const float *xr = x + static_cast<int64_t>(r0 + t0 + t) * cols + b * 32;
                    float s = 0.0f;
                    if (b * 32 + 32 <= cols && (cols & 3) == 0) { // rows 16-byte aligned
#pragma unroll
                        for (int k = 0; k < 32; k += 4) {
                            const float4 xv = *reinterpret_cast<const float4 *>(xr + k);
                            s += wv[k] * xv.x + wv[k + 1] * xv.y + wv[k + 2] * xv.z +
                                 wv[k + 3] * xv.w;
                        }
                    } else {
                        for (int k = 0; b * 32 + k < cols; k++) s += wv[k] * xr[k];
                    }
                    acc[t] += s;
                }
            }
#pragma unroll
            for (int t = 0; t < kTok; t++) {
                if (t >= nt) break; // uniform over the warp
                const float s = warp_sum(acc[t]);
                if (lane == 0) y[static_cast<int64_t>(r0 + t0 + t) * w.rows + orow] = s + bias;
            }
        }
    }
}

} // namespace

extern "C" cudaError_t tsr__cuda_launch_experts_matmul(const tsr__cuda_experts *w,
                                                       const int32_t *list, int n_active,
                                                       const float *x, float *y,
                                                       cudaStream_t stream) {
    if (n_active <= 0 || w->rows <= 0) return cudaSuccess;
    if (n_active > 65535 || w->cols <= 0 || (w->mxfp4 && w->cols % 32))
        return cudaErrorInvalidValue;
    int64_t gx = (w->rows + kWarps - 1) / kWarps;
    if (gx > 65535) gx = 65535; // the kernel strides over the rest
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(n_active));
    experts_kernel<<<grid, kThreads, 0, stream>>>(*w, list, x, y);
    return cudaGetLastError();
}
