// Causal GQA attention over KV spans (kernels/backend.h, tsr_attn_args). Three kernels, all
// with an online softmax (running max m, running sum l, rescaled accumulator), so no
// n_q x n_keys matrix exists; the launcher picks one per call:
// - split-K decode (flash-decoding): a few queries over many keys. A block per (query, kv
//   head, key chunk) serves every query head of the kv head's group, so each K/V row is read
//   once per group, and leaves a partial (m, l, acc) per head and chunk; a small kernel
//   merges the chunks. The chunks are sized so that one sequence fills the multiprocessors.
// - tiled prefill: a block per (tile of kBq queries, head); K/V tiles of kBk keys go through
//   shared memory once for the whole query tile.
// - otherwise (head_dim beyond the tiled kernel's) a block per (query, head).
// GPT-OSS's extras: a per-head sink logit starts each online softmax at (m = sink, l = 1),
// so it joins the denominator exactly once (the split path adds it in the merge, not per
// chunk); a sliding window masks keys by position (visible()), whatever the spans hold.
// When key_scores is wanted, a second pass over the same keys recomputes each score and
// adds its final probability exp(s - m) / l with atomics (per key and query tile in the
// tiled kernel, so the atomics are kBq times fewer).
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/cuda/kv_codec.cuh"
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

// Whether a key at position kp is visible to a query at qp (causal, and within the window).
__device__ __forceinline__ bool visible(int32_t kp, int32_t qp, int window) {
    return kp <= qp && (window <= 0 || static_cast<int64_t>(kp) > static_cast<int64_t>(qp) - window);
}

// Keys before key_start(a, qp) are outside the query's window: with monotone spans the
// first key at a position > qp - window (0 without a window or monotone spans).
__device__ int64_t key_start(const tsr__cuda_attn &a, int32_t qp) {
    if (!a.monotone || a.window <= 0) return 0;
    const int64_t lo_pos = static_cast<int64_t>(qp) - a.window + 1; // first visible position
    int lo = 0, hi = a.n_spans - 1, best = -1;
    while (lo <= hi) { // last span whose first position is <= lo_pos
        const int mid = (lo + hi) / 2;
        if (a.spans[mid].pos0 <= lo_pos) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (best < 0) return 0;
    const tsr__cuda_span &s = a.spans[best];
    const int64_t skip = lo_pos - s.pos0;
    return s.key_off + (skip < s.n ? skip : s.n);
}

// The sink logit of query head h, or -inf without sinks.
__device__ __forceinline__ float sink_of(const tsr__cuda_attn &a, int h) {
    return a.sinks ? a.sinks[h] : -INFINITY;
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
    if (!visible(kp, qp, a.window)) return -INFINITY;
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
    const int64_t n_lim = key_limit(a, qp), n_start = key_start(a, qp);
    __syncthreads();

    // the sink (if any) is the softmax's first term: exp(sink - m) with m = sink
    float m = sink_of(a, h), l = a.sinks ? 1.0f : 0.0f;
    float acc[kAccR];
    for (int r = 0; r < kAccR; r++) acc[r] = 0.0f;

    for (int64_t t0 = n_start; t0 < n_lim; t0 += kTile) {
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
        const float alpha = expf(m - m_new); // 0 on the first visible tile (no finite sink)
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
    for (int64_t key = n_start + warp; key < n_lim; key += kWarps) {
        const float *vr;
        const float s = key_score(a, qs, key, qp, kvh, &vr);
        if (lane == 0 && s != -INFINITY) atomicAdd(ks + key, expf(s - m) * inv);
    }
}

// ---- split-K decode (flash-decoding) ----------------------------------------------------

constexpr int kSplitMaxQ = 8;         // queries per call up to which split-K is chosen
constexpr int64_t kSplitMinKeys = 256; // and keys from which
constexpr int kMaxGroup = 16;         // query heads per kv head one block serves
constexpr int64_t kMinChunk = 2 * kTile;
constexpr int kMaxChunks = 1024;
constexpr size_t kSmemLimit = 48 * 1024; // without cudaFuncSetAttribute
constexpr int kUnroll = 8;               // V rows loaded at once per thread
// Blocks per multiprocessor the chunking aims at: with one query and a few kv heads the
// blocks are few, and each holds only 4 warps with one K row load each in flight, so
// enough of them must share a multiprocessor to cover the memory latency.
constexpr int kBlocksPerSm = 8;

// The K and V rows of flat key `key` for kv head kvh, or false when the key's position is
// past the query's (masked).
__device__ bool key_rows(const tsr__cuda_attn &a, int64_t key, int32_t qp, int kvh,
                         const float **kr, const float **vr) {
    const int s = a.n_spans > 1 ? find_span(a.spans, a.n_spans, key) : 0;
    const tsr__cuda_span &sp = a.spans[s];
    const int64_t i = key - sp.key_off;
    const int32_t kp = sp.pos ? sp.pos[i] : sp.pos0 + static_cast<int32_t>(i);
    if (!visible(kp, qp, a.window)) return false;
    const int64_t off = i * sp.stride + static_cast<int64_t>(kvh) * a.head_dim;
    *kr = sp.k + off;
    *vr = sp.v + off;
    return true;
}

struct split_plan {
    int64_t chunk; // keys per chunk, a multiple of kTile
    int chunks;
};

size_t split_smem(int group, int hd) {
    // qs and acc [group][hd], scores [group][kTile], m/l/alpha/pad [4][group], V row pointers
    return (static_cast<size_t>(2 * group * hd + group * kTile + 4 * group)) * sizeof(float) +
           kTile * sizeof(const float *);
}

// Whether call a goes split-K, and its chunks: kBlocksPerSm (query, kv head, chunk) blocks
// per multiprocessor, chunks of at least kMinChunk keys, at most kMaxChunks.
bool split_plan_for(const tsr__cuda_attn &a, split_plan *p) {
    if (a.n_q > kSplitMaxQ || a.n_keys < kSplitMinKeys || a.n_spans <= 0) return false;
    const int group = a.n_heads / a.n_kv_heads;
    if (group > kMaxGroup || split_smem(group, a.head_dim) > kSmemLimit) return false;
    const int64_t base = static_cast<int64_t>(a.n_q) * a.n_kv_heads;
    const int64_t target = kBlocksPerSm * static_cast<int64_t>(a.sm_count > 0 ? a.sm_count : 1);
    int64_t want = (target + base - 1) / base;
    if (want < 1) want = 1;
    int64_t chunk = (a.n_keys + want - 1) / want;
    if (chunk < kMinChunk) chunk = kMinChunk;
    if ((a.n_keys + chunk - 1) / chunk > kMaxChunks) chunk = (a.n_keys + kMaxChunks - 1) / kMaxChunks;
    chunk = (chunk + kTile - 1) / kTile * kTile;
    p->chunk = chunk;
    p->chunks = static_cast<int>((a.n_keys + chunk - 1) / chunk);
    return true;
}

// Scratch layout of the split path, in floats: acc [n_q][n_heads][chunks][hd], then m and
// l [n_q][n_heads][chunks], then the merged m and l [n_q][n_heads] (the score pass's).
struct split_work {
    float *acc, *m, *l, *fm, *fl;
};

__host__ __device__ split_work split_layout(const tsr__cuda_attn &a, int chunks) {
    const int64_t rows = static_cast<int64_t>(a.n_q) * a.n_heads;
    split_work w;
    w.acc = a.work;
    w.m = w.acc + rows * chunks * a.head_dim;
    w.l = w.m + rows * chunks;
    w.fm = w.l + rows * chunks;
    w.fl = w.fm + rows;
    return w;
}

size_t split_floats(const tsr__cuda_attn &a, int chunks) {
    const size_t rows = static_cast<size_t>(a.n_q) * static_cast<size_t>(a.n_heads);
    return rows * static_cast<size_t>(chunks) * (static_cast<size_t>(a.head_dim) + 2) + 2 * rows;
}

// Block (query qi, kv head kvh, chunk c) over keys [c * chunk, (c + 1) * chunk) for the
// group's query heads. Warps take interleaved keys of a tile and compute the key's score for
// every head of the group (the K row is read once, from L1 after the first head); a warp per
// head does that head's online softmax step; then every thread owns head_dim columns of the
// group's accumulators (shared memory) and reads each V row element once for all heads.
__global__ void __launch_bounds__(kThreads) attn_split_kernel(tsr__cuda_attn a, int64_t chunk,
                                                              int chunks) {
    extern __shared__ __align__(16) float smem[];
    const int group = a.n_heads / a.n_kv_heads, hd = a.head_dim;
    float *qs = smem, *acc = qs + group * hd, *ps = acc + group * hd;
    float *mst = ps + group * kTile, *lst = mst + group, *ast = lst + group;
    const float **vrows = reinterpret_cast<const float **>(mst + 4 * group);

    const int qi = blockIdx.x, kvh = blockIdx.y, c = blockIdx.z, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32, h0 = kvh * group;
    const int64_t qrow = static_cast<int64_t>(qi) * a.n_heads * hd + static_cast<int64_t>(h0) * hd;
    for (int e = tid; e < group * hd; e += kThreads) {
        qs[e] = a.q[qrow + e]; // the group's heads are adjacent in the query row
        acc[e] = 0.0f;
    }
    if (tid < group) {
        mst[tid] = -INFINITY;
        lst[tid] = 0.0f;
    }
    const int32_t qp = a.q_pos[qi];
    const int64_t lim = key_limit(a, qp), first = key_start(a, qp);
    const int64_t c0 = static_cast<int64_t>(c) * chunk;
    const int64_t k0 = c0 > first ? c0 : first; // chunks before the window stay empty
    const int64_t k1 = c0 + chunk < lim ? c0 + chunk : lim;
    __syncthreads();

    for (int64_t t0 = k0; t0 < k1; t0 += kTile) {
        for (int j = warp; j < kTile; j += kWarps) {
            const int64_t key = t0 + j;
            const float *kr = nullptr, *vr = nullptr;
            if (key < k1 && !key_rows(a, key, qp, kvh, &kr, &vr)) kr = vr = nullptr;
            for (int g = 0; g < group; g++) {
                float sc = -INFINITY;
                if (kr) {
                    float d = 0.0f;
                    for (int e = lane; e < hd; e += 32) d += qs[g * hd + e] * kr[e];
                    sc = warp_sum(d) * a.scale;
                }
                if (lane == 0) ps[g * kTile + j] = sc;
            }
            if (lane == 0) vrows[j] = vr;
        }
        __syncthreads();
        for (int g = warp; g < group; g += kWarps) {
            float sv[kTile / 32];
            float mt = -INFINITY;
#pragma unroll
            for (int i = 0; i < kTile / 32; i++) {
                sv[i] = ps[g * kTile + lane + 32 * i];
                mt = fmaxf(mt, sv[i]);
            }
            mt = warp_max(mt);
            const float m_old = mst[g], m_new = fmaxf(m_old, mt);
            const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < kTile / 32; i++) {
                const float p = sv[i] == -INFINITY ? 0.0f : expf(sv[i] - m_new);
                ps[g * kTile + lane + 32 * i] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                mst[g] = m_new;
                lst[g] = lst[g] * alpha + sum;
                ast[g] = alpha;
            }
        }
        __syncthreads();
        for (int d = tid; d < hd; d += kThreads) {
            for (int g = 0; g < group; g++) acc[g * hd + d] *= ast[g];
            // kUnroll V loads in flight before they are used; a masked key has p = 0 and
            // contributes an exact 0
            for (int j0 = 0; j0 < kTile; j0 += kUnroll) {
                float vj[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    const float *vr = vrows[j0 + u];
                    vj[u] = vr ? vr[d] : 0.0f;
                }
#pragma unroll 1 // (unrolled, nvcc put vj on the stack)
                for (int g = 0; g < group; g++) {
                    float o = acc[g * hd + d];
#pragma unroll
                    for (int u = 0; u < kUnroll; u++) o += ps[g * kTile + j0 + u] * vj[u];
                    acc[g * hd + d] = o;
                }
            }
        }
        __syncthreads(); // ps, vrows and the stats are rewritten by the next tile
    }

    const split_work w = split_layout(a, chunks);
    for (int g = 0; g < group; g++) {
        const int64_t idx = (static_cast<int64_t>(qi) * a.n_heads + h0 + g) * chunks + c;
        if (tid == 0) {
            w.m[idx] = mst[g];
            w.l[idx] = lst[g];
        }
        for (int d = tid; d < hd; d += kThreads) w.acc[idx * hd + d] = acc[g * hd + d];
    }
}

// Block (query, head): out = sum_c acc_c exp(m_c - M) / sum_c l_c exp(m_c - M), M the
// largest chunk max; the merged M and L are kept for the score pass.
__global__ void __launch_bounds__(kThreads) attn_merge_kernel(tsr__cuda_attn a, int chunks) {
    __shared__ float wts[kMaxChunks];
    __shared__ float red[kWarps];
    const int qi = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, hd = a.head_dim;
    const split_work w = split_layout(a, chunks);
    const int64_t rowi = static_cast<int64_t>(qi) * a.n_heads + h, base = rowi * chunks;
    float mx = -INFINITY;
    for (int c = tid; c < chunks; c += kThreads)
        if (w.l[base + c] > 0.0f) mx = fmaxf(mx, w.m[base + c]);
    // the sink joins here, once per (query, head), never in a chunk's partial
    const float sink = sink_of(a, h);
    mx = fmaxf(block_max(mx, red), sink);
    float lsum = 0.0f;
    for (int c = tid; c < chunks; c += kThreads) {
        const float wt = w.l[base + c] > 0.0f ? expf(w.m[base + c] - mx) : 0.0f;
        wts[c] = wt;
        lsum += w.l[base + c] * wt;
    }
    lsum = block_sum(lsum, red); // its barriers also publish wts
    if (sink != -INFINITY) lsum += expf(sink - mx);
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const int64_t row = static_cast<int64_t>(qi) * a.n_heads * hd + static_cast<int64_t>(h) * hd;
    for (int d = tid; d < hd; d += kThreads) {
        float o = 0.0f;
        for (int c = 0; c < chunks; c++)
            if (wts[c] != 0.0f) o += w.acc[(base + c) * hd + d] * wts[c];
        a.out[row + d] = o * inv;
    }
    if (tid == 0) {
        w.fm[rowi] = mx;
        w.fl[rowi] = lsum;
    }
}

// The split path's score pass: block (query, kv head, chunk) adds exp(s - M) / L of every
// visible key of its chunk, for each head of the group, into key_scores.
__global__ void __launch_bounds__(kThreads) attn_split_scores_kernel(tsr__cuda_attn a,
                                                                     int64_t chunk, int chunks) {
    extern __shared__ __align__(16) float smem[];
    const int group = a.n_heads / a.n_kv_heads, hd = a.head_dim;
    float *qs = smem, *mg = qs + group * hd, *ig = mg + group;
    const int qi = blockIdx.x, kvh = blockIdx.y, c = blockIdx.z, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32, h0 = kvh * group;
    const int64_t qrow = static_cast<int64_t>(qi) * a.n_heads * hd + static_cast<int64_t>(h0) * hd;
    for (int e = tid; e < group * hd; e += kThreads) qs[e] = a.q[qrow + e];
    const split_work w = split_layout(a, chunks);
    if (tid < group) {
        const int64_t rowi = static_cast<int64_t>(qi) * a.n_heads + h0 + tid;
        mg[tid] = w.fm[rowi];
        ig[tid] = w.fl[rowi] > 0.0f ? 1.0f / w.fl[rowi] : 0.0f;
    }
    const int32_t qp = a.q_pos[qi];
    const int64_t lim = key_limit(a, qp), first = key_start(a, qp);
    const int64_t c0 = static_cast<int64_t>(c) * chunk;
    const int64_t k0 = c0 > first ? c0 : first;
    const int64_t k1 = c0 + chunk < lim ? c0 + chunk : lim;
    __syncthreads();
    for (int64_t key = k0 + warp; key < k1; key += kWarps) {
        const float *kr, *vr;
        if (!key_rows(a, key, qp, kvh, &kr, &vr)) continue;
        for (int g = 0; g < group; g++) {
            float d = 0.0f;
            for (int e = lane; e < hd; e += 32) d += qs[g * hd + e] * kr[e];
            const float sc = warp_sum(d) * a.scale;
            if (lane == 0 && ig[g] > 0.0f)
                atomicAdd(a.key_scores + static_cast<int64_t>(h0 + g) * a.n_keys + key,
                          expf(sc - mg[g]) * ig[g]);
        }
    }
}

// ---- tiled prefill ---------------------------------------------------------------------

constexpr int kBq = 16;          // queries per block
constexpr int kBk = 32;          // keys per shared-memory tile (a warp's lanes)
constexpr int kPreMaxHd = 128;   // head_dim up to which the tiled kernel runs
constexpr int kRows = kBq / kWarps; // query rows per warp

// Block (query tile, head). Per key tile: the tile's K and V rows go to shared memory once
// (a thread per key finds its span); warp w scores its kRows query rows against the tile's
// keys (lane = key) and does their online softmax step with shuffles; then thread d adds
// p . V[:, d] for every row of the tile. The K tile rows are padded by one float so that
// the lanes' reads of different keys fall in different banks.
__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(tsr__cuda_attn a) {
    __shared__ float qs[kBq][kPreMaxHd];
    __shared__ float kt[kBk][kPreMaxHd + 1];
    __shared__ float vt[kBk][kPreMaxHd];
    __shared__ float pt[kBq][kBk + 1];
    __shared__ const float *krow[kBk];
    __shared__ const float *vrow[kBk];
    __shared__ int32_t kpos[kBk];
    __shared__ int32_t qps[kBq];
    __shared__ float arow[kBq], mrow[kBq], lrow[kBq];
    __shared__ float colsum[kWarps][kBk];

    const int h = blockIdx.y, q0 = blockIdx.x * kBq, hd = a.head_dim;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int kvh = h / (a.n_heads / a.n_kv_heads);
    const int nq = a.n_q - q0 < kBq ? a.n_q - q0 : kBq;
    const int64_t q_ld = static_cast<int64_t>(a.n_heads) * hd;
    for (int e = tid; e < kBq * hd; e += kThreads) {
        const int r = e / hd, d = e % hd;
        qs[r][d] = r < nq ? a.q[(q0 + r) * q_ld + static_cast<int64_t>(h) * hd + d] : 0.0f;
    }
    if (tid < kBq) qps[tid] = tid < nq ? a.q_pos[q0 + tid] : INT_MIN; // padding rows see nothing
    __syncthreads();
    int64_t lim = 0, first = INT64_MAX; // keys any query of the tile can see
    for (int r = 0; r < nq; r++) {
        const int64_t l = key_limit(a, qps[r]), f = key_start(a, qps[r]);
        lim = l > lim ? l : lim;
        first = f < first ? f : first;
    }
    if (nq <= 0) first = 0;

    float m[kRows], l[kRows], acc[kBq];
    const float sink = sink_of(a, h); // each row's softmax starts at the sink (m, l = 1)
#pragma unroll
    for (int i = 0; i < kRows; i++) {
        m[i] = sink;
        l[i] = a.sinks ? 1.0f : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kBq; r++) acc[r] = 0.0f;

    for (int64_t t0 = first; t0 < lim; t0 += kBk) {
        if (tid < kBk) {
            const int64_t key = t0 + tid;
            const float *kr = nullptr, *vr = nullptr;
            int32_t kp = INT_MAX;
            if (key < lim) {
                const int s = a.n_spans > 1 ? find_span(a.spans, a.n_spans, key) : 0;
                const tsr__cuda_span &sp = a.spans[s];
                const int64_t i = key - sp.key_off;
                kp = sp.pos ? sp.pos[i] : sp.pos0 + static_cast<int32_t>(i);
                const int64_t off = i * sp.stride + static_cast<int64_t>(kvh) * hd;
                kr = sp.k + off;
                vr = sp.v + off;
            }
            krow[tid] = kr;
            vrow[tid] = vr;
            kpos[tid] = kp;
        }
        __syncthreads();
        for (int e = tid; e < kBk * hd; e += kThreads) {
            const int j = e / hd, d = e % hd;
            const float *kr = krow[j];
            kt[j][d] = kr ? kr[d] : 0.0f;
            vt[j][d] = kr ? vrow[j][d] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kRows; i++) {
            const int r = warp * kRows + i;
            float sc = -INFINITY;
            if (krow[lane] && visible(kpos[lane], qps[r], a.window)) {
                float d = 0.0f;
                for (int e = 0; e < hd; e++) d += qs[r][e] * kt[lane][e];
                sc = d * a.scale;
            }
            const float m_new = fmaxf(m[i], warp_max(sc));
            const float alpha = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
            l[i] = l[i] * alpha + warp_sum(p);
            m[i] = m_new;
            pt[r][lane] = p;
            if (lane == 0) arow[r] = alpha;
        }
        __syncthreads();
        if (tid < hd) {
#pragma unroll
            for (int r = 0; r < kBq; r++) {
                float o = acc[r] * arow[r];
                for (int j = 0; j < kBk; j++) o += pt[r][j] * vt[j][tid];
                acc[r] = o;
            }
        }
        __syncthreads(); // the tile's shared arrays are rewritten next
    }
#pragma unroll
    for (int i = 0; i < kRows; i++)
        if (lane == 0) {
            mrow[warp * kRows + i] = m[i];
            lrow[warp * kRows + i] = l[i];
        }
    __syncthreads();
    if (tid < hd) {
#pragma unroll
        for (int r = 0; r < kBq; r++) {
            if (r >= nq) break;
            const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
            a.out[(q0 + r) * q_ld + static_cast<int64_t>(h) * hd + tid] = acc[r] * inv;
        }
    }
    if (!a.key_scores) return;

    // Score pass: per key tile, the final probabilities of the tile's queries, summed over
    // the query rows in the block (a column sum) and added with one atomic per key.
    float *ks = a.key_scores + static_cast<int64_t>(h) * a.n_keys;
    for (int64_t t0 = first; t0 < lim; t0 += kBk) {
        if (tid < kBk) {
            const int64_t key = t0 + tid;
            const float *kr = nullptr;
            int32_t kp = INT_MAX;
            if (key < lim) {
                const int s = a.n_spans > 1 ? find_span(a.spans, a.n_spans, key) : 0;
                const tsr__cuda_span &sp = a.spans[s];
                const int64_t i = key - sp.key_off;
                kp = sp.pos ? sp.pos[i] : sp.pos0 + static_cast<int32_t>(i);
                kr = sp.k + i * sp.stride + static_cast<int64_t>(kvh) * hd;
            }
            krow[tid] = kr;
            kpos[tid] = kp;
        }
        __syncthreads();
        for (int e = tid; e < kBk * hd; e += kThreads) {
            const int j = e / hd, d = e % hd;
            kt[j][d] = krow[j] ? krow[j][d] : 0.0f;
        }
        __syncthreads();
        float cs = 0.0f;
#pragma unroll
        for (int i = 0; i < kRows; i++) {
            const int r = warp * kRows + i;
            if (krow[lane] && visible(kpos[lane], qps[r], a.window) && lrow[r] > 0.0f) {
                float d = 0.0f;
                for (int e = 0; e < hd; e++) d += qs[r][e] * kt[lane][e];
                cs += expf(d * a.scale - mrow[r]) * (1.0f / lrow[r]);
            }
        }
        colsum[warp][lane] = cs;
        __syncthreads();
        if (tid < kBk && t0 + tid < lim) {
            float t = 0.0f;
            for (int w = 0; w < kWarps; w++) t += colsum[w][tid];
            if (t != 0.0f) atomicAdd(ks + t0 + tid, t);
        }
        __syncthreads();
    }
}

// K/V stored as another dtype than f32 (kv_codec.cuh): one block per key converts its K
// and V rows into f32 rows of dq (K of all keys, then V), in key order, so that the
// attention kernels read f32 and accumulate in f32 whatever the storage. Stored rows are
// whole rows of kv_dim elements (tsr_kv_span's contract for other dtypes).
__global__ void kv_dequant_kernel(tsr__cuda_attn a, float *dq) {
    const int64_t kvd = static_cast<int64_t>(a.n_kv_heads) * a.head_dim;
    for (int64_t key = blockIdx.x; key < a.n_keys; key += gridDim.x) {
        const int s = a.n_spans > 1 ? find_span(a.spans, a.n_spans, key) : 0;
        const tsr__cuda_span &sp = a.spans[s];
        const int64_t i = key - sp.key_off;
        float *dk = dq + key * kvd, *dv = dq + (a.n_keys + key) * kvd;
        if (sp.dtype == tsr_kv::F32) {
            for (int64_t c = threadIdx.x; c < kvd; c += blockDim.x) {
                dk[c] = sp.k[i * sp.stride + c];
                dv[c] = sp.v[i * sp.stride + c];
            }
            continue;
        }
        const uint8_t *rk = tsr_kv::row_at(sp.k, sp.dtype, kvd, i * kvd);
        const uint8_t *rv = tsr_kv::row_at(sp.v, sp.dtype, kvd, i * kvd);
        for (int64_t c = threadIdx.x; c < kvd; c += blockDim.x) {
            dk[c] = tsr_kv::load(rk, sp.dtype, c);
            dv[c] = tsr_kv::load(rv, sp.dtype, c);
        }
    }
}

// The device spans pointed at the converted rows (after kv_dequant_kernel on the stream).
__global__ void kv_respan_kernel(tsr__cuda_attn a, float *dq) {
    const int64_t kvd = static_cast<int64_t>(a.n_kv_heads) * a.head_dim;
    tsr__cuda_span *sp = const_cast<tsr__cuda_span *>(a.spans);
    for (int s = threadIdx.x; s < a.n_spans; s += blockDim.x) {
        sp[s].k = dq + sp[s].key_off * kvd;
        sp[s].v = dq + (a.n_keys + sp[s].key_off) * kvd;
        sp[s].stride = kvd;
        sp[s].dtype = tsr_kv::F32;
    }
}

// Floats of work the split-K partials take (0 without the split path).
size_t split_partials(const tsr__cuda_attn &a) {
    split_plan p;
    if (a.n_q <= 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 || !split_plan_for(a, &p)) return 0;
    return split_floats(a, p.chunks);
}

} // namespace

extern "C" size_t tsr__cuda_attention_work(const tsr__cuda_attn *a) {
    size_t w = split_partials(*a);
    if (a->dq && a->n_q > 0 && a->n_keys > 0)
        w += 2 * static_cast<size_t>(a->n_keys) * static_cast<size_t>(a->n_kv_heads) *
             static_cast<size_t>(a->head_dim);
    return w;
}

extern "C" cudaError_t tsr__cuda_launch_attention(const tsr__cuda_attn *a, cudaStream_t stream) {
    if (a->n_q <= 0 || a->n_heads <= 0) return cudaSuccess;
    if (a->head_dim > TSR__CUDA_MAX_HEAD_DIM || a->n_heads > 65535 || a->n_kv_heads <= 0 ||
        a->n_heads % a->n_kv_heads != 0)
        return cudaErrorInvalidValue;
    if (a->dq && a->n_keys > 0) {
        if (!a->work) return cudaErrorInvalidValue;
        float *dq = a->work + split_partials(*a);
        const unsigned g = static_cast<unsigned>(a->n_keys < 65535 ? a->n_keys : 65535);
        kv_dequant_kernel<<<g, kThreads, 0, stream>>>(*a, dq);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        kv_respan_kernel<<<1, kThreads, 0, stream>>>(*a, dq);
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    split_plan p;
    if (a->work && split_partials(*a) > 0 && split_plan_for(*a, &p)) {
        const int group = a->n_heads / a->n_kv_heads;
        const dim3 grid(static_cast<unsigned>(a->n_q), static_cast<unsigned>(a->n_kv_heads),
                        static_cast<unsigned>(p.chunks));
        attn_split_kernel<<<grid, kThreads, split_smem(group, a->head_dim), stream>>>(
            *a, p.chunk, p.chunks);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        const dim3 mgrid(static_cast<unsigned>(a->n_q), static_cast<unsigned>(a->n_heads));
        attn_merge_kernel<<<mgrid, kThreads, 0, stream>>>(*a, p.chunks);
        e = cudaGetLastError();
        if (e != cudaSuccess || !a->key_scores) return e;
        const size_t smem = static_cast<size_t>(group * a->head_dim + 2 * group) * sizeof(float);
        attn_split_scores_kernel<<<grid, kThreads, smem, stream>>>(*a, p.chunk, p.chunks);
        return cudaGetLastError();
    }
    if (a->n_q > kSplitMaxQ && a->head_dim <= kPreMaxHd) {
        const dim3 grid(static_cast<unsigned>((a->n_q + kBq - 1) / kBq),
                        static_cast<unsigned>(a->n_heads));
        attn_prefill_kernel<<<grid, kThreads, 0, stream>>>(*a);
        return cudaGetLastError();
    }
    const dim3 grid(static_cast<unsigned>(a->n_q), static_cast<unsigned>(a->n_heads));
    attn_kernel<<<grid, kThreads, 0, stream>>>(*a);
    return cudaGetLastError();
}
