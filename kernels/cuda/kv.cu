// KV rows by slot (kernels/backend.h: kv_write, kv_copy, kv_gather, kv_scatter, and the
// K/V write of qkv_rope, with its bias, q/k norms and ropes) on the device. Each kernel moves whole rows between a tsr__cuda_kv layout and dense f32
// [n][row] arrays, converting to and from the layout's dtype (kv_codec.cuh), one thread
// block per row and the block's threads over the row's elements. The slot lists are device arrays here; the host code stages them.
#include <cuda_runtime.h>

#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/launch.h"

namespace {

constexpr int kThreads = 256;
// kv_copy runs in a single block (see kv_copy_kernel): as many threads as a block takes.
constexpr int kCopyThreads = 1024;

// Offset in elements of slot s's row from the layout's k (or v): the formula of
// tsr_kv_layout, in 64-bit so that large caches do not overflow; a whole number of rows.
__device__ __forceinline__ int64_t slot_off(const tsr__cuda_kv &l, int32_t s) {
    return static_cast<int64_t>(s / l.block) * l.block_stride +
           static_cast<int64_t>(s % l.block) * l.row;
}

__device__ __forceinline__ uint8_t *slot_row(const tsr__cuda_kv &l, float *base, int32_t s) {
    return const_cast<uint8_t *>(tsr_kv::row_at(base, l.dtype, l.row, slot_off(l, s)));
}

// Grid size for n rows: one block per row, capped (the kernels loop over the rest).
unsigned row_blocks(int64_t n) {
    return static_cast<unsigned>(n < 65535 ? n : 65535);
}

// The f32 row x stored as dtype at r, by all threads of the block (fp8's row maximum is a
// block reduction through red[kThreads / 32]; q8's 32-element blocks are one warp each, as
// the row is a multiple of 32 and the block of warps).
__device__ void store_row(uint8_t *r, const float *x, int dtype, int row, float *red) {
    switch (dtype) {
    case tsr_kv::BF16:
        for (int c = threadIdx.x; c < row; c += blockDim.x)
            reinterpret_cast<uint16_t *>(r)[c] = tsr_kv::f32_to_bf16(x[c]);
        break;
    case tsr_kv::Q8:
        for (int c = threadIdx.x; c < row; c += blockDim.x) {
            const float xv = x[c];
            float m = fabsf(xv);
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float d = m / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            uint8_t *b = r + c / tsr_kv::Q8_BLOCK * (4 + tsr_kv::Q8_BLOCK);
            if (c % tsr_kv::Q8_BLOCK == 0) memcpy(b, &d, 4);
            b[4 + c % tsr_kv::Q8_BLOCK] =
                static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(xv * id)));
        }
        break;
    case tsr_kv::FP8: {
        float m = 0.0f;
        for (int c = threadIdx.x; c < row; c += blockDim.x) m = fmaxf(m, fabsf(x[c]));
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
        __syncthreads();
        m = 0.0f;
        for (unsigned w = 0; w < blockDim.x / 32; w++) m = fmaxf(m, red[w]);
        __syncthreads(); // red is reused by the next row
        const float d = m / 448.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        if (threadIdx.x == 0) memcpy(r, &d, 4);
        for (int c = threadIdx.x; c < row; c += blockDim.x) r[4 + c] = tsr_kv::f32_to_e4m3(x[c] * id);
        break;
    }
    default:
        for (int c = threadIdx.x; c < row; c += blockDim.x) reinterpret_cast<float *>(r)[c] = x[c];
    }
}

// Row i of k / v (either may be null: that half is skipped) goes to slot slots[i].
__global__ void kv_put_kernel(tsr__cuda_kv l, const int32_t *slots, int64_t n, const float *k,
                              const float *v) {
    __shared__ float red[kThreads / 32];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t src = i * l.row;
        if (k) store_row(slot_row(l, l.k, slots[i]), k + src, l.dtype, l.row, red);
        if (v) store_row(slot_row(l, l.v, slots[i]), v + src, l.dtype, l.row, red);
    }
}

// Row i of k / v (either may be null) gets slot slots[i]'s row, as f32.
__global__ void kv_get_kernel(tsr__cuda_kv l, const int32_t *slots, int64_t n, float *k,
                              float *v) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const uint8_t *rk = slot_row(l, l.k, slots[i]), *rv = slot_row(l, l.v, slots[i]);
        const int64_t dst = i * l.row;
        for (int c = threadIdx.x; c < l.row; c += blockDim.x) {
            if (k) k[dst + c] = tsr_kv::load(rk, l.dtype, c);
            if (v) v[dst + c] = tsr_kv::load(rv, l.dtype, c);
        }
    }
}

// Slot dst[i] gets slot src[i]'s rows, for i = 0, 1, ... strictly in order, the way the CPU
// backend's loop does it. A compaction list may chain (a later pair reads a slot an earlier
// pair wrote), so the pairs cannot run in parallel blocks without an analysis of the list.
// One block walks the pairs instead; its threads share a row, and the barrier after each
// pair makes that pair's writes visible to the whole block before the next pair reads
// (__syncthreads orders global memory within a block). Compactions move few rows, so one
// block's bandwidth is enough. A pair with dst == src is skipped, as on the CPU. The stored
// bytes move as they are, whatever the dtype.
__global__ void kv_copy_kernel(tsr__cuda_kv l, const int32_t *dst, const int32_t *src,
                               int64_t n) {
    const int64_t rb = tsr_kv::row_bytes(l.dtype, l.row);
    for (int64_t i = 0; i < n; i++) {
        const int32_t d = dst[i], s = src[i];
        if (d != s) {
            uint8_t *kd = slot_row(l, l.k, d), *vd = slot_row(l, l.v, d);
            const uint8_t *ks = slot_row(l, l.k, s), *vs = slot_row(l, l.v, s);
            for (int64_t c = threadIdx.x; c < rb; c += blockDim.x) {
                kd[c] = ks[c];
                vd[c] = vs[c];
            }
        }
        __syncthreads();
    }
}

// The q/k norm weights: f32, as every loader keeps norms (the launcher refuses others).
__device__ __forceinline__ float w_at(const void *w, int i) {
    return static_cast<const float *>(w)[i];
}

// The op qkv_rope (launch.h), one block of kThreads per token. q goes straight to its output
// row; k and v wait in shared memory (2 * kvd floats) for the slot store, which converts
// to the layout's dtype as kv_put does. Each head's norm is a warp's: its sum of squares
// is a warp reduction (another order than rmsnorm_kernel's block sum: within rounding).
__global__ void qkv_rope_kernel(const float *qkv, int64_t n, int nh, int nkv, int hd,
                                const int32_t *pos, const float *inv_freq, float cos_scale,
                                int interleaved, const float *bias, const void *q_norm,
                                const void *k_norm, float eps, float *q,
                                tsr__cuda_kv l, int has_lay, const int32_t *slots, float *k,
                                float *v) {
    extern __shared__ float skv[]; // [2][kvd]
    __shared__ float red[kThreads / 32];
    const int qd = nh * hd, kvd = nkv * hd, ld = qd + 2 * kvd, half = hd / 2;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *src = qkv + r * ld;
        float *qo = q + r * qd;
        for (int c = threadIdx.x; c < ld; c += blockDim.x) {
            const float x = bias ? src[c] + bias[c] : src[c];
            if (c < qd) qo[c] = x;
            else skv[c - qd] = x;
        }
        __syncthreads();
        if (q_norm) {
            for (int h = warp; h < nh + nkv; h += nw) {
                float *x = h < nh ? qo + h * hd : skv + (h - nh) * hd;
                const void *w = h < nh ? q_norm : k_norm;
                float ss = 0.0f;
                for (int c = lane; c < hd; c += 32) ss += x[c] * x[c];
                for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
                for (int c = lane; c < hd; c += 32) x[c] = x[c] * inv * w_at(w, c);
            }
            __syncthreads();
        }
        const float p = static_cast<float>(pos[r]);
        for (int t = threadIdx.x; t < (nh + nkv) * half; t += blockDim.x) {
            const int h = t / half, i = t % half;
            float *x = h < nh ? qo + h * hd : skv + (h - nh) * hd;
            float s, c;
            sincosf(p * inv_freq[i], &s, &c);
            c *= cos_scale;
            s *= cos_scale;
            float *a = interleaved ? x + 2 * i : x + i;
            float *b = interleaved ? x + 2 * i + 1 : x + i + half;
            const float x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = interleaved ? x0 * s + x1 * c : x1 * c + x0 * s; // the CPU's operand order
        }
        __syncthreads();
        if (has_lay) {
            store_row(slot_row(l, l.k, slots[r]), skv, l.dtype, l.row, red);
            store_row(slot_row(l, l.v, slots[r]), skv + kvd, l.dtype, l.row, red);
        } else {
            for (int c = threadIdx.x; c < kvd; c += blockDim.x) {
                k[r * kvd + c] = skv[c];
                v[r * kvd + c] = skv[kvd + c];
            }
        }
        __syncthreads(); // skv is the next row's
    }
}

} // namespace

extern "C" cudaError_t tsr__cuda_launch_kv_put(const tsr__cuda_kv *l, const int32_t *slots,
                                               int64_t n, const float *k, const float *v,
                                               cudaStream_t stream) {
    if (n <= 0 || l->row <= 0 || (!k && !v)) return cudaSuccess;
    if (l->block <= 0) return cudaErrorInvalidValue;
    kv_put_kernel<<<row_blocks(n), kThreads, 0, stream>>>(*l, slots, n, k, v);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_kv_get(const tsr__cuda_kv *l, const int32_t *slots,
                                               int64_t n, float *k, float *v,
                                               cudaStream_t stream) {
    if (n <= 0 || l->row <= 0 || (!k && !v)) return cudaSuccess;
    if (l->block <= 0) return cudaErrorInvalidValue;
    kv_get_kernel<<<row_blocks(n), kThreads, 0, stream>>>(*l, slots, n, k, v);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_kv_copy(const tsr__cuda_kv *l, const int32_t *dst,
                                                const int32_t *src, int64_t n,
                                                cudaStream_t stream) {
    if (n <= 0 || l->row <= 0) return cudaSuccess;
    if (l->block <= 0) return cudaErrorInvalidValue;
    const int threads = l->row < kCopyThreads ? ((l->row + 31) / 32) * 32 : kCopyThreads;
    kv_copy_kernel<<<1, threads, 0, stream>>>(*l, dst, src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t tsr__cuda_launch_qkv_rope(const float *qkv, int64_t n, int nh, int nkv,
                                                 int hd, const int32_t *pos,
                                                 const float *inv_freq, float cos_scale,
                                                 int interleaved, const float *bias,
                                                 const void *q_norm, const void *k_norm,
                                                 int wdtype, float eps, float *q,
                                                 const tsr__cuda_kv *l, const int32_t *slots,
                                                 float *k, float *v, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (hd <= 0 || hd % 2 || nh <= 0 || nkv <= 0 || (l && (l->block <= 0 || l->row != nkv * hd)) ||
        (q_norm && wdtype != 0)) // TSR_F32 norms only
        return cudaErrorInvalidValue;
    const size_t shared = 2 * static_cast<size_t>(nkv) * hd * sizeof(float);
    if (shared > 48 * 1024) return cudaErrorInvalidValue; // 6144 K/V floats: far above GQA's
    tsr__cuda_kv none = {};
    qkv_rope_kernel<<<row_blocks(n), kThreads, shared, stream>>>(
        qkv, n, nh, nkv, hd, pos, inv_freq, cos_scale, interleaved, bias, q_norm, k_norm,
        eps, q, l ? *l : none, l ? 1 : 0, slots, k, v);
    return cudaGetLastError();
}
