// Quantized-weight kernels of the CUDA backend (quant_launch.h): the decode GEMVs for FP8
// E4M3 (per-row scale) and GGUF Q8_0, Q4_0 and Q4_1 blocks, the dequantization of weight tiles to bf16 for
// GEMM fallbacks, the per-token FP8 quantization of activations for cuBLASLt's FP8 GEMM, its
// scale epilogue, and the GGUF-block embedding. Decode is bandwidth-bound: a GEMV reads each
// weight byte once per step for up to 8 tokens, one warp per output row, f32 accumulation,
// a warp reduction at the end. E4M3 decodes through cuda_fp8.h's conversions (hardware on
// sm_89 and later, emulated exactly before), so the GEMVs run on every architecture.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/quant_launch.h"

namespace {

constexpr int kWarps = 8;                // output rows per GEMV block
constexpr int kThreads = kWarps * 32;    // threads of every kernel here
constexpr float kFp8Max = 448.0f;

unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return static_cast<unsigned>(b);
}

// Two E4M3 codes (low byte first) to two floats, exactly.
__device__ __forceinline__ float2 fp8x2_to_float2(unsigned short two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two),
                                                     __NV_E4M3);
    return __half22float2(__half2(h));
}

__device__ __forceinline__ float fp8_to_float(unsigned char b) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
    return __half2float(__half(h));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// FP8 GEMV. VEC: each lane takes 16 consecutive codes per step (one 16-byte load) and the
// matching 16 floats of every x row (four float4 loads); the caller guarantees 16-byte
// alignment of w + r * ld + k0 and of x rows, and k % 16 == 0. Otherwise one code per lane.
template <int NB, bool VEC>
__global__ void __launch_bounds__(kThreads)
fp8_gemv_kernel(const uint8_t *__restrict__ w, const float *__restrict__ scale, int64_t rows,
                int64_t ld, int64_t k0, int64_t k, const float *__restrict__ x, int64_t ldx,
                int n, float *__restrict__ y, int64_t ldy) {
    const int lane = threadIdx.x % 32;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const uint8_t *wr = w + r * ld + k0;
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = 0.0f;
    if (VEC) {
        for (int64_t j = static_cast<int64_t>(lane) * 16; j < k; j += 32 * 16) {
            const uint4 q = __ldg(reinterpret_cast<const uint4 *>(wr + j));
            const unsigned words[4] = {q.x, q.y, q.z, q.w};
            float wf[16];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const float2 lo = fp8x2_to_float2(static_cast<unsigned short>(words[t] & 0xffffu));
                const float2 hi = fp8x2_to_float2(static_cast<unsigned short>(words[t] >> 16));
                wf[4 * t] = lo.x;
                wf[4 * t + 1] = lo.y;
                wf[4 * t + 2] = hi.x;
                wf[4 * t + 3] = hi.y;
            }
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b >= n) break;
                const float4 *xb = reinterpret_cast<const float4 *>(x + b * ldx + j);
                float s = acc[b];
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    const float4 xv = __ldg(xb + t);
                    s = fmaf(wf[4 * t], xv.x, s);
                    s = fmaf(wf[4 * t + 1], xv.y, s);
                    s = fmaf(wf[4 * t + 2], xv.z, s);
                    s = fmaf(wf[4 * t + 3], xv.w, s);
                }
                acc[b] = s;
            }
        }
    } else {
        for (int64_t j = lane; j < k; j += 32) {
            const float wv = fp8_to_float(wr[j]);
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < n) acc[b] = fmaf(wv, x[b * ldx + j], acc[b]);
        }
    }
    const float s = scale[r];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (b >= n) break;
        const float v = warp_sum(acc[b]);
        if (lane == 0) y[b * ldy + r] = v * s;
    }
}

// GGUF block formats the GEMVs read (GGML type ids): Q8_0 (34 bytes: fp16 d, 32 int8;
// v = d q), Q4_0 (18 bytes: fp16 d, 16 bytes of nibbles, value j in the low nibble of byte
// j, value j + 16 in its high nibble; v = d (q - 8)), Q4_1 (20 bytes: fp16 d, fp16 m, the
// nibbles as Q4_0; v = d q + m).
constexpr int kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;

template <int TYPE> struct gguf_block;
template <> struct gguf_block<kQ8_0> { static constexpr int bytes = 34; };
template <> struct gguf_block<kQ4_0> { static constexpr int bytes = 18; };
template <> struct gguf_block<kQ4_1> { static constexpr int bytes = 20; };

// The 32 values of a block as q (int, before scaling), d and m (v = d q + m). Blocks are
// only 2-byte aligned in a row, hence 16-bit loads.
template <int TYPE>
__device__ __forceinline__ void gguf_load(const uint8_t *blk, float q[32], float *d, float *m) {
    const unsigned short *p = reinterpret_cast<const unsigned short *>(blk);
    *d = __half2float(__ushort_as_half(__ldg(p)));
    *m = 0.0f;
    if (TYPE == kQ8_0) {
#pragma unroll
        for (int t = 0; t < 16; t++) {
            const unsigned short two = __ldg(p + 1 + t);
            q[2 * t] = static_cast<float>(static_cast<signed char>(two & 0xffu));
            q[2 * t + 1] = static_cast<float>(static_cast<signed char>(two >> 8));
        }
    } else {
        const int off = TYPE == kQ4_1 ? 2 : 1; // 16-bit words before the nibbles
        if (TYPE == kQ4_1) *m = __half2float(__ushort_as_half(__ldg(p + 1)));
        const float bias = TYPE == kQ4_0 ? 8.0f : 0.0f;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const unsigned short two = __ldg(p + off + t);
            q[2 * t] = static_cast<float>(two & 0xfu) - bias;
            q[2 * t + 16] = static_cast<float>((two >> 4) & 0xfu) - bias;
            q[2 * t + 1] = static_cast<float>((two >> 8) & 0xfu) - bias;
            q[2 * t + 17] = static_cast<float>(two >> 12) - bias;
        }
    }
}

// GGUF-block GEMV: lane per block, so a warp's loads cover consecutive blocks of the row.
template <int TYPE, int NB>
__global__ void __launch_bounds__(kThreads)
gguf_gemv_kernel(const uint8_t *__restrict__ blocks, int64_t rows, int64_t ld_blocks,
                 int64_t b0, int64_t nb, const float *__restrict__ x, int64_t ldx, int n,
                 float *__restrict__ y, int64_t ldy) {
    constexpr int kBytes = gguf_block<TYPE>::bytes;
    const int lane = threadIdx.x % 32;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const uint8_t *row = blocks + (r * ld_blocks + b0) * kBytes;
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = 0.0f;
    for (int64_t blk = lane; blk < nb; blk += 32) {
        float wq[32], d, m;
        gguf_load<TYPE>(row + blk * kBytes, wq, &d, &m);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b >= n) break;
            const float *xb = x + b * ldx + blk * 32;
            float s = 0.0f, sx = 0.0f;
#pragma unroll
            for (int t = 0; t < 32; t++) {
                s = fmaf(wq[t], xb[t], s);
                if (TYPE == kQ4_1) sx += xb[t];
            }
            acc[b] = fmaf(d, s, acc[b]);
            if (TYPE == kQ4_1) acc[b] = fmaf(m, sx, acc[b]);
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (b >= n) break;
        const float v = warp_sum(acc[b]);
        if (lane == 0) y[b * ldy + r] = v;
    }
}

__device__ __forceinline__ int gguf_bytes(int type) {
    return type == kQ8_0 ? 34 : type == kQ4_1 ? 20 : 18;
}

// Value c of a row of GGUF blocks (any of the three types).
__device__ __forceinline__ float gguf_value(const uint8_t *row, int type, int64_t c) {
    const uint8_t *blk = row + (c / 32) * gguf_bytes(type);
    const int j = static_cast<int>(c % 32);
    const float d = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short *>(blk)));
    if (type == kQ8_0) return d * static_cast<float>(static_cast<signed char>(blk[2 + j]));
    const uint8_t *qs = blk + (type == kQ4_1 ? 4 : 2);
    const int q = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
    if (type == kQ4_0) return d * static_cast<float>(q - 8);
    const float m = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short *>(blk + 2)));
    return fmaf(d, static_cast<float>(q), m);
}

__global__ void dequant_bf16_kernel(const uint8_t *w, int dtype, int64_t ld, int64_t r0,
                                    int64_t nr, int64_t k0, int64_t k, __nv_bfloat16 *out) {
    const int64_t total = nr * k;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = r0 + e / k, j = k0 + e % k;
        float v;
        if (dtype < 0) { // FP8 codes
            v = fp8_to_float(w[r * ld + j]);
        } else { // GGUF blocks (dtype: the GGML type id); ld counts blocks
            v = gguf_value(w + r * ld * gguf_bytes(dtype), dtype, j);
        }
        out[e] = __float2bfloat16_rn(v);
    }
}

__global__ void x_bf16_kernel(const float *x, int64_t ldx, int64_t n, int64_t k,
                              __nv_bfloat16 *out) {
    const int64_t total = n * k;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[e] = __float2bfloat16_rn(x[(e / k) * ldx + e % k]);
}

// One block per token: amax by block reduction, then the codes.
__global__ void x_fp8_kernel(const float *x, int64_t ldx, int64_t k, uint8_t *out,
                             float *scale) {
    __shared__ float red[kWarps];
    const int64_t i = blockIdx.x;
    const float *xr = x + i * ldx;
    float m = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) m = fmaxf(m, fabsf(xr[j]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    float amax = 0.0f;
    for (int wi = 0; wi < kWarps; wi++) amax = fmaxf(amax, red[wi]);
    const float s = amax > 0.0f ? amax / kFp8Max : 1.0f;
    uint8_t *o = out + i * k;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
        o[j] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(xr[j] / s, __NV_SATFINITE, __NV_E4M3));
    if (threadIdx.x == 0) scale[i] = s;
}

__global__ void scale_out_kernel(float *y, int64_t ldy, int64_t n, int64_t rows,
                                 const float *row_scale, const float *col_scale) {
    const int64_t total = n * rows;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = e / rows, r = e % rows;
        const float f = (row_scale ? row_scale[i] : 1.0f) * col_scale[r];
        y[i * ldy + r] *= f;
    }
}

__global__ void embed_gguf_kernel(const uint8_t *blocks, int type, int64_t rows, int64_t cols,
                                  const int32_t *ids, float *out, int *bad_id) {
    const int64_t i = blockIdx.x;
    const int32_t id = ids[i];
    float *o = out + i * cols;
    if (id < 0 || id >= rows) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = 0.0f;
        if (threadIdx.x == 0) *bad_id = 1;
        return;
    }
    const uint8_t *row = blocks + static_cast<int64_t>(id) * (cols / 32) * gguf_bytes(type);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = gguf_value(row, type, c);
}

template <int NB>
void fp8_gemv_nb(bool vec, unsigned grid, cudaStream_t stream, const uint8_t *w,
                 const float *scale, int64_t rows, int64_t ld, int64_t k0, int64_t k,
                 const float *x, int64_t ldx, int n, float *y, int64_t ldy) {
    if (vec)
        fp8_gemv_kernel<NB, true><<<grid, kThreads, 0, stream>>>(w, scale, rows, ld, k0, k, x,
                                                                 ldx, n, y, ldy);
    else
        fp8_gemv_kernel<NB, false><<<grid, kThreads, 0, stream>>>(w, scale, rows, ld, k0, k, x,
                                                                  ldx, n, y, ldy);
}

template <int TYPE, int NB>
void gguf_gemv_nb(unsigned grid, cudaStream_t stream, const uint8_t *blocks, int64_t rows,
                  int64_t ld_blocks, int64_t b0, int64_t nb, const float *x, int64_t ldx, int n,
                  float *y, int64_t ldy) {
    gguf_gemv_kernel<TYPE, NB><<<grid, kThreads, 0, stream>>>(blocks, rows, ld_blocks, b0, nb, x,
                                                              ldx, n, y, ldy);
}

template <int TYPE>
void gguf_gemv_type(unsigned grid, cudaStream_t stream, const uint8_t *blocks, int64_t rows,
                    int64_t ld_blocks, int64_t b0, int64_t nb, const float *x, int64_t ldx,
                    int n, float *y, int64_t ldy) {
    if (n == 1) gguf_gemv_nb<TYPE, 1>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
    else if (n == 2) gguf_gemv_nb<TYPE, 2>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
    else if (n <= 4) gguf_gemv_nb<TYPE, 4>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
    else gguf_gemv_nb<TYPE, 8>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
}

bool gguf_type_ok(int type) { return type == kQ8_0 || type == kQ4_0 || type == kQ4_1; }

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

} // namespace

extern "C" cudaError_t tsr__cuda_launch_fp8_gemv(const uint8_t *w, const float *scale,
                                                 int64_t rows, int64_t ld, int64_t k0,
                                                 int64_t k, const float *x, int64_t ldx, int n,
                                                 float *y, int64_t ldy, cudaStream_t stream) {
    if (n < 1 || n > TSR__CUDA_GEMV_MAX_N || rows <= 0) return cudaErrorInvalidValue;
    const unsigned grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    // every row start (w + r * ld + k0) and every x row 16-byte aligned, whole 16-code steps
    const bool vec = aligned16(w + k0) && ld % 16 == 0 && k % 16 == 0 && aligned16(x) &&
                     (n == 1 || ldx % 4 == 0);
    if (n == 1) fp8_gemv_nb<1>(vec, grid, stream, w, scale, rows, ld, k0, k, x, ldx, n, y, ldy);
    else if (n == 2) fp8_gemv_nb<2>(vec, grid, stream, w, scale, rows, ld, k0, k, x, ldx, n, y, ldy);
    else if (n <= 4) fp8_gemv_nb<4>(vec, grid, stream, w, scale, rows, ld, k0, k, x, ldx, n, y, ldy);
    else fp8_gemv_nb<8>(vec, grid, stream, w, scale, rows, ld, k0, k, x, ldx, n, y, ldy);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_gguf_gemv(int type, const uint8_t *blocks, int64_t rows,
                                                  int64_t ld_blocks, int64_t k0, int64_t k,
                                                  const float *x, int64_t ldx, int n, float *y,
                                                  int64_t ldy, cudaStream_t stream) {
    if (!gguf_type_ok(type) || n < 1 || n > TSR__CUDA_GEMV_MAX_N || rows <= 0 || k0 % 32 ||
        k % 32)
        return cudaErrorInvalidValue;
    const unsigned grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    const int64_t b0 = k0 / 32, nb = k / 32;
    if (type == kQ8_0)
        gguf_gemv_type<kQ8_0>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
    else if (type == kQ4_0)
        gguf_gemv_type<kQ4_0>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
    else
        gguf_gemv_type<kQ4_1>(grid, stream, blocks, rows, ld_blocks, b0, nb, x, ldx, n, y, ldy);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_dequant_bf16(const uint8_t *w, int dtype, int64_t ld,
                                                     int64_t r0, int64_t nr, int64_t k0,
                                                     int64_t k, uint16_t *out,
                                                     cudaStream_t stream) {
    if (dtype >= 0 && !gguf_type_ok(dtype)) return cudaErrorInvalidValue;
    if (nr <= 0 || k <= 0) return cudaSuccess;
    dequant_bf16_kernel<<<blocks_for(nr * k), kThreads, 0, stream>>>(
        w, dtype, ld, r0, nr, k0, k, reinterpret_cast<__nv_bfloat16 *>(out));
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_x_bf16(const float *x, int64_t ldx, int64_t n, int64_t k,
                                               uint16_t *out, cudaStream_t stream) {
    if (n <= 0 || k <= 0) return cudaSuccess;
    x_bf16_kernel<<<blocks_for(n * k), kThreads, 0, stream>>>(
        x, ldx, n, k, reinterpret_cast<__nv_bfloat16 *>(out));
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_x_fp8(const float *x, int64_t ldx, int64_t n, int64_t k,
                                              uint8_t *out, float *scale, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffffLL) return cudaErrorInvalidValue;
    x_fp8_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, ldx, k, out, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_scale_out(float *y, int64_t ldy, int64_t n, int64_t rows,
                                                  const float *row_scale, const float *col_scale,
                                                  cudaStream_t stream) {
    if (n <= 0 || rows <= 0) return cudaSuccess;
    scale_out_kernel<<<blocks_for(n * rows), kThreads, 0, stream>>>(y, ldy, n, rows, row_scale,
                                                                    col_scale);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_embed_gguf(int type, const uint8_t *blocks, int64_t rows,
                                                   int64_t cols, const int32_t *ids, int64_t n,
                                                   float *out, int *bad_id,
                                                   cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (!gguf_type_ok(type) || n > 0x7fffffffLL || cols % 32) return cudaErrorInvalidValue;
    embed_gguf_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(blocks, type, rows, cols,
                                                                         ids, out, bad_id);
    return cudaGetLastError();
}
