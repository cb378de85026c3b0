// Causal GQA attention over KV spans (kernels/backend.h, tsr_attn_args), one thread block
// per (query, head). Keys are visited in tiles of kTile with an online softmax (running
// max m, running sum l, rescaled accumulator), so memory stays O(head_dim) per block and no
// n_q x n_keys matrix exists. When key_scores is wanted, a second pass over the same keys
// recomputes each score and adds its final probability exp(s - m) / l with atomics.
#include <math.h>

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kThreads; // one score per thread in the softmax step
constexpr int kAccR = TSR__CUDA_MAX_HEAD_DIM / kThreads;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reductions over the block (every thread gets the result); `red` has kWarps floats.
__device__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < kWarps; w++) t += red[w];
    __syncthreads();
    return t;
}

__device__ float block_max(float v, float *red) {
    v = warp_max(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int w = 0; w < kWarps; w++) t = fmaxf(t, red[w]);
    __syncthreads();
    return t;
}

// Index of the span holding flat key `key` (the last span whose key_off <= key).
__device__ int find_span(const tsr__cuda_span *sp, int n_spans, int64_t key) {
    int lo = 0, hi = n_spans - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (sp[mid].key_off <= key)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// Keys [0, limit) can be visible to a query at position qp.
__device__ int64_t key_limit(const tsr__cuda_attn &a, int32_t qp) {
    if (!a.monotone) return a.n_keys;
    int lo = 0, hi = a.n_spans - 1, best = -1;
    while (lo <= hi) { // last span whose first position is <= qp
        const int mid = (lo + hi) / 2;
        if (a.spans[mid].pos0 <= qp) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (best < 0) return 0;
    const tsr__cuda_span &s = a.spans[best];
    const int64_t vis = static_cast<int64_t>(qp) - s.pos0 + 1;
    return s.key_off + (vis < s.n ? vis : s.n);
}

// Score of one key for the whole warp (all lanes get it), or -inf when masked. Also gives
// the key's V row.
__device__ float key_score(const tsr__cuda_attn &a, const float *qs, int64_t key, int32_t qp,
                           int kvh, const float **vrow) {
    const int s = a.n_spans > 1 ? find_span(a.spans, a.n_spans, key) : 0;
    const tsr__cuda_span &sp = a.spans[s];
    const int64_t i = key - sp.key_off;
    const int32_t kp = sp.pos ? sp.pos[i] : sp.pos0 + static_cast<int32_t>(i);
    *vrow = nullptr;
    if (kp > qp) return -INFINITY;
    const int64_t off = i * sp.stride + static_cast<int64_t>(kvh) * a.head_dim;
    const float *k = sp.k + off;
    float d = 0.0f;
    for (int c = threadIdx.x % 32; c < a.head_dim; c += 32) d += qs[c] * k[c];
    *vrow = sp.v + off;
    return warp_sum(d) * a.scale;
}

__global__ void __launch_bounds__(kThreads) attn_kernel(tsr__cuda_attn a) {
    __shared__ float qs[TSR__CUDA_MAX_HEAD_DIM];
    __shared__ float ps[kTile];
    __shared__ const float *vrows[kTile];
    __shared__ float red[kWarps];

    const int qi = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int hd = a.head_dim;
    const int kvh = h / (a.n_heads / a.n_kv_heads);
    const int64_t row = static_cast<int64_t>(qi) * a.n_heads * hd + static_cast<int64_t>(h) * hd;
    for (int c = tid; c < hd; c += kThreads) qs[c] = a.q[row + c];
    const int32_t qp = a.q_pos[qi];
    const int64_t n_lim = key_limit(a, qp);
    __syncthreads();

    float m = -INFINITY, l = 0.0f;
    float acc[kAccR];
    for (int r = 0; r < kAccR; r++) acc[r] = 0.0f;

    for (int64_t t0 = 0; t0 < n_lim; t0 += kTile) {
        // Scores: warps take interleaved keys of the tile; lanes split head_dim.
        for (int j = warp; j < kTile; j += kWarps) {
            const int64_t key = t0 + j;
            float s = -INFINITY;
            const float *vr = nullptr;
            if (key < n_lim) s = key_score(a, qs, key, qp, kvh, &vr);
            if (lane == 0) {
                ps[j] = s;
                vrows[j] = vr;
            }
        }
        __syncthreads();
        const float s_own = ps[tid];
        const float m_new = fmaxf(m, block_max(s_own, red));
        if (m_new == -INFINITY) continue;    // nothing visible yet; uniform over the block
        const float alpha = expf(m - m_new); // 0 on the first visible tile
        const float p = s_own == -INFINITY ? 0.0f : expf(s_own - m_new);
        ps[tid] = p;
        l = l * alpha + block_sum(p, red); // its barrier also publishes ps
        for (int r = 0; r < kAccR; r++) acc[r] *= alpha;
        for (int j = 0; j < kTile; j++) {
            const float pj = ps[j];
            if (pj == 0.0f) continue;
            const float *vr = vrows[j];
            for (int r = 0; r < kAccR; r++) {
                const int d = tid + r * kThreads;
                if (d < hd) acc[r] += pj * vr[d];
            }
        }
        m = m_new;
        __syncthreads(); // ps and vrows are rewritten by the next tile
    }

    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int r = 0; r < kAccR; r++) {
        const int d = tid + r * kThreads;
        if (d < hd) a.out[row + d] = acc[r] * inv;
    }
    if (!a.key_scores || l <= 0.0f) return;

    // Second pass: the final probabilities, summed into this query head's row.
    float *ks = a.key_scores + static_cast<int64_t>(h) * a.n_keys;
    for (int64_t key = warp; key < n_lim; key += kWarps) {
        const float *vr;
        const float s = key_score(a, qs, key, qp, kvh, &vr);
        if (lane == 0 && s != -INFINITY) atomicAdd(ks + key, expf(s - m) * inv);
    }
}

} // namespace

extern "C" cudaError_t tsr__cuda_launch_attention(const tsr__cuda_attn *a, cudaStream_t stream) {
    if (a->n_q <= 0 || a->n_heads <= 0) return cudaSuccess;
    if (a->head_dim > TSR__CUDA_MAX_HEAD_DIM || a->n_heads > 65535 || a->n_kv_heads <= 0 ||
        a->n_heads % a->n_kv_heads != 0)
        return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(a->n_q), static_cast<unsigned>(a->n_heads));
    attn_kernel<<<grid, kThreads, 0, stream>>>(*a);
    return cudaGetLastError();
}
