// The sample op on the device (kernels/backend.h: sample; the host reference is
// kernels/sample.c). Per row, one block of kThreads:
// - prep: the argmax (first index of the largest, NaN never wins, a NaN at 0 gives 0), and
//   for a sampled row the softmax at the temperature in place (sum in double, as the host);
//   a row without top-k / top-p draws from the cumulative sum in token order (a block scan
//   in chunks); a row with them leaves one 64-bit sort key per token.
// - sort (rows with top-k / top-p): cub's segmented radix sort, descending, of keys
//   (probability bits << 32 | ~id): probabilities are >= +0, so their bits order as the
//   values, and equal probabilities come lowest id first, the host's order, whatever the
//   sort's stability.
// - pick: a block scan over the sorted probabilities finds the top-p cut within the top k
//   and then the token whose cumulative mass passes r times the kept mass.
// Only the ids leave the device. The parallel sums round differently from the host's
// sequential ones, so a draw within a few ulps of a boundary may differ from the CPU's.
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// Tokens whose sort keys one pass holds (keys in and out: 16 bytes each): 64 MiB of scratch.
constexpr int64_t kGroupItems = int64_t{1} << 22;

__device__ __forceinline__ bool row_sorts(const tsr__cuda_sample_row &p, int vocab) {
    const int k = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
    return p.temperature != 0.0f && !(k == vocab && p.top_p >= 1.0f);
}

// Inclusive scan over the block (every thread passes v; *total gets the block's sum). `sh`
// has kWarps floats.
__device__ float block_scan(float v, float *sh, float *total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 1; o < 32; o <<= 1) {
        const float t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    if (lane == 31) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = sh[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const float t = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += t;
        }
        sh[lane] = w;
    }
    __syncthreads();
    const float r = v + (warp > 0 ? sh[warp - 1] : 0.0f);
    *total = sh[kWarps - 1];
    __syncthreads(); // sh is reused by the next call
    return r;
}

// First index i < n whose inclusive prefix sum of val(i) passes the test `hit(prefix)`;
// n when none. *sum gets the sum of all n. Chunks of kThreads, carried in float.
template <typename Val, typename Hit>
__device__ int first_prefix(int n, Val val, Hit hit, float *sh, int *found, float *sum) {
    float carry = 0.0f;
    for (int base = 0; base < n; base += kThreads) {
        const int i = base + static_cast<int>(threadIdx.x);
        float total;
        const float c = carry + block_scan(i < n ? val(i) : 0.0f, sh, &total);
        if (threadIdx.x == 0) *found = INT_MAX;
        __syncthreads();
        if (i < n && hit(c)) atomicMin(found, i);
        __syncthreads();
        const int f = *found;
        __syncthreads();
        if (f != INT_MAX) {
            *sum = carry + total;
            return f;
        }
        carry += total;
    }
    *sum = carry;
    return n;
}

__global__ void __launch_bounds__(kThreads)
    sample_prep_kernel(float *logits, int vocab, const tsr__cuda_sample_row *par,
                       int64_t row0, int32_t *ids, unsigned long long *keys) {
    __shared__ float shv[kWarps];
    __shared__ int shi[kWarps];
    __shared__ double shd[kWarps];
    __shared__ int found;
    const int64_t row = row0 + blockIdx.x;
    const tsr__cuda_sample_row p = par[row];
    float *x = logits + row * vocab;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    // argmax: the largest value, lowest index on ties; NaN never compares greater
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = tid; i < vocab; i += kThreads) {
        const float v = x[i];
        if (v > bv || (v == bv && i < bi)) {
            bv = v;
            bi = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        shv[warp] = bv;
        shi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = shv[lane];
        bi = shi[lane];
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) shi[0] = bi;
    }
    __syncthreads();
    int am = shi[0];
    const float x0 = x[0];
    if (am == INT_MAX || x0 != x0) am = 0;
    __syncthreads();
    if (p.temperature == 0.0f) {
        if (tid == 0) ids[row] = am;
        return;
    }

    const float mx = x[am];
    __syncthreads(); // every thread has read x[am] before it is overwritten
    double s = 0.0;
    for (int i = tid; i < vocab; i += kThreads) {
        const float e = expf((x[i] - mx) / p.temperature);
        x[i] = e;
        s += e;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) shd[warp] = s;
    __syncthreads();
    double sum = 0.0;
    for (int w = 0; w < kWarps; w++) sum += shd[w];
    for (int i = tid; i < vocab; i += kThreads) x[i] = static_cast<float>(x[i] / sum);
    __syncthreads();

    if (!row_sorts(p, vocab)) {
        float total;
        const float r = p.r;
        const int f = first_prefix(
            vocab, [x](int i) { return x[i]; }, [r](float c) { return r < c; }, shv, &found,
            &total);
        if (tid == 0) ids[row] = f < vocab ? f : vocab - 1;
        return;
    }
    unsigned long long *kr = keys + (row - row0) * vocab;
    for (int i = tid; i < vocab; i += kThreads)
        kr[i] = (static_cast<unsigned long long>(__float_as_uint(x[i])) << 32) |
                static_cast<unsigned long long>(0xffffffffu - static_cast<unsigned>(i));
}

__device__ __forceinline__ float key_p(unsigned long long k) {
    return __uint_as_float(static_cast<unsigned>(k >> 32));
}

__device__ __forceinline__ int32_t key_id(unsigned long long k) {
    return static_cast<int32_t>(0xffffffffu - static_cast<unsigned>(k & 0xffffffffu));
}

__global__ void __launch_bounds__(kThreads)
    sample_pick_kernel(int vocab, const tsr__cuda_sample_row *par, int64_t row0, int32_t *ids,
                       const unsigned long long *sorted) {
    __shared__ float shv[kWarps];
    __shared__ int found;
    const int64_t row = row0 + blockIdx.x;
    const tsr__cuda_sample_row p = par[row];
    if (!row_sorts(p, vocab)) return;
    const unsigned long long *kr = sorted + (row - row0) * vocab;
    const int k = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
    // keep: the top k, cut after the first prefix whose mass reaches top-p
    const float top_p = p.top_p;
    float mass;
    const int cut = first_prefix(
        k, [kr](int i) { return key_p(kr[i]); }, [top_p](float c) { return c >= top_p; }, shv,
        &found, &mass);
    const int keep = cut < k ? cut + 1 : k;
    if (cut < k) { // mass of the kept prefix only
        float t;
        (void)first_prefix(
            keep, [kr](int i) { return key_p(kr[i]); }, [](float) { return false; }, shv, &found,
            &t);
        mass = t;
    }
    const float target = p.r * mass;
    float t;
    const int f = first_prefix(
        keep, [kr](int i) { return key_p(kr[i]); }, [target](float c) { return target < c; },
        shv, &found, &t);
    if (threadIdx.x == 0) ids[row] = key_id(kr[f < keep ? f : keep - 1]);
}

__global__ void offsets_kernel(int *offs, int rows, int vocab) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= rows; i += gridDim.x * blockDim.x)
        offs[i] = i * vocab;
}

int64_t group_rows(int64_t n, int vocab) {
    int64_t g = kGroupItems / vocab;
    if (g < 1) g = 1;
    return g < n ? g : n;
}

// Byte offsets of the scratch parts: keys in, keys out, offsets, cub's temporary storage.
struct sample_work {
    size_t keys_out, offs, temp, temp_bytes, total;
};

sample_work work_layout(int64_t rows, int vocab) {
    sample_work w;
    const size_t items = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
    w.keys_out = items * sizeof(unsigned long long);
    w.offs = 2 * w.keys_out;
    w.temp = (w.offs + (static_cast<size_t>(rows) + 1) * sizeof(int) + 255) / 256 * 256;
    w.temp_bytes = 0;
    (void)cub::DeviceSegmentedRadixSort::SortKeysDescending(
        nullptr, w.temp_bytes, static_cast<const unsigned long long *>(nullptr),
        static_cast<unsigned long long *>(nullptr), static_cast<int>(items),
        static_cast<int>(rows), static_cast<const int *>(nullptr),
        static_cast<const int *>(nullptr));
    w.total = w.temp + w.temp_bytes;
    return w;
}

} // namespace

extern "C" size_t tsr__cuda_sample_work(int64_t n, int vocab, int sorts) {
    if (n <= 0 || vocab <= 0 || !sorts) return 0;
    return work_layout(group_rows(n, vocab), vocab).total;
}

extern "C" cudaError_t tsr__cuda_launch_sample(float *logits, int64_t n, int vocab,
                                               const tsr__cuda_sample_row *par, int sorts,
                                               int32_t *ids, void *work, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (vocab <= 0 || (sorts && !work)) return cudaErrorInvalidValue;
    const int64_t g = group_rows(n, vocab);
    const sample_work w = sorts ? work_layout(g, vocab) : sample_work{};
    char *base = static_cast<char *>(work);
    unsigned long long *keys = sorts ? reinterpret_cast<unsigned long long *>(base) : nullptr;
    unsigned long long *sorted =
        sorts ? reinterpret_cast<unsigned long long *>(base + w.keys_out) : nullptr;
    int *offs = sorts ? reinterpret_cast<int *>(base + w.offs) : nullptr;
    for (int64_t r0 = 0; r0 < n; r0 += g) {
        const int rows = static_cast<int>(n - r0 < g ? n - r0 : g);
        sample_prep_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, par, r0, ids, keys);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess || !sorts) {
            if (e != cudaSuccess) return e;
            continue;
        }
        offsets_kernel<<<(rows + 256) / 256, 256, 0, stream>>>(offs, rows, vocab);
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        size_t temp_bytes = w.temp_bytes;
        e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
            base + w.temp, temp_bytes, keys, sorted, rows * vocab, rows, offs, offs + 1, 0,
            64, stream);
        if (e != cudaSuccess) return e;
        sample_pick_kernel<<<rows, kThreads, 0, stream>>>(vocab, par, r0, ids, sorted);
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
