// KV rows by slot (kernels/backend.h: kv_write, kv_copy, kv_gather, kv_scatter) on the
// device. Pure data movement: each kernel copies whole rows between a tsr__cuda_kv layout
// and dense [n][row] arrays, one thread block per row and the block's threads over the
// row's floats. The slot lists are device arrays here; the host code stages them.
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace {

constexpr int kThreads = 256;
// kv_copy runs in a single block (see kv_copy_kernel): as many threads as a block takes.
constexpr int kCopyThreads = 1024;

// Offset in floats of slot s's row from the layout's k (or v): the formula of
// tsr_kv_layout, in 64-bit so that large caches do not overflow.
__device__ __forceinline__ int64_t slot_off(const tsr__cuda_kv &l, int32_t s) {
    return static_cast<int64_t>(s / l.block) * l.block_stride +
           static_cast<int64_t>(s % l.block) * l.row;
}

// Grid size for n rows: one block per row, capped (the kernels loop over the rest).
unsigned row_blocks(int64_t n) {
    return static_cast<unsigned>(n < 65535 ? n : 65535);
}

// Row i of k / v (either may be null: that half is skipped) goes to slot slots[i].
__global__ void kv_put_kernel(tsr__cuda_kv l, const int32_t *slots, int64_t n, const float *k,
                              const float *v) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t off = slot_off(l, slots[i]);
        const int64_t src = i * l.row;
        for (int c = threadIdx.x; c < l.row; c += blockDim.x) {
            if (k) l.k[off + c] = k[src + c];
            if (v) l.v[off + c] = v[src + c];
        }
    }
}

// Row i of k / v (either may be null) gets slot slots[i]'s row.
__global__ void kv_get_kernel(tsr__cuda_kv l, const int32_t *slots, int64_t n, float *k,
                              float *v) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t off = slot_off(l, slots[i]);
        const int64_t dst = i * l.row;
        for (int c = threadIdx.x; c < l.row; c += blockDim.x) {
            if (k) k[dst + c] = l.k[off + c];
            if (v) v[dst + c] = l.v[off + c];
        }
    }
}

// Slot dst[i] gets slot src[i]'s rows, for i = 0, 1, ... strictly in order, the way the CPU
// backend's loop does it. A compaction list may chain (a later pair reads a slot an earlier
// pair wrote), so the pairs cannot run in parallel blocks without an analysis of the list.
// One block walks the pairs instead; its threads share a row, and the barrier after each
// pair makes that pair's writes visible to the whole block before the next pair reads
// (__syncthreads orders global memory within a block). Compactions move few rows, so one
// block's bandwidth is enough. A pair with dst == src is skipped, as on the CPU.
__global__ void kv_copy_kernel(tsr__cuda_kv l, const int32_t *dst, const int32_t *src,
                               int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const int32_t d = dst[i], s = src[i];
        if (d != s) {
            const int64_t od = slot_off(l, d), os = slot_off(l, s);
            for (int c = threadIdx.x; c < l.row; c += blockDim.x) {
                l.k[od + c] = l.k[os + c];
                l.v[od + c] = l.v[os + c];
            }
        }
        __syncthreads();
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
