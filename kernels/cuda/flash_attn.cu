// Prefill attention on BF16 tensor cores (mma.sync m16n8k16, FP32 accumulation; sm_80+),
// the flash-attention scheme: query tiles stay in registers, K/V tiles stream through
// shared memory, an online softmax (running max and sum per row, rescaled accumulator)
// keeps no n_q x n_keys matrix anywhere. Four kernels per call:
// 1. pack: every key of the call's spans (any KV dtype, kv_codec.cuh; positions contiguous
//    or listed) becomes a BF16 row per kv head in one contiguous plane, its position in an
//    int array; padding keys (up to a whole tile) get zero rows and position INT_MAX. Why a
//    pass and not the codec in the inner loop: a paged cache hands over thousands of spans
//    (a binary search per key), q8/fp8 rows are not 16-byte aligned, and the tensor cores
//    want BF16 tiles that cp.async copies 16 bytes at a time. The pass moves O(n) bytes
//    against the O(n^2) flops of the attention (a 128K prefill: ~1 GB against ~1.4e14
//    flops), so it costs well under 1 % there.
// 2. bounds: the least and greatest position of each key tile, so that a query tile skips
//    the tiles its causal mask or sliding window hides whole (positions, not indices: the
//    keys of a pruned cache are not in position order, and the mask is by position).
// 3. forward: a block per (128 query rows, kv head) with 8 warps of 16 rows. The rows are
//    (query, query head of the kv head's group) pairs, so every query head of a GQA group
//    shares each K/V tile the block loads. K/V tiles of 64 keys are double-buffered with
//    cp.async; S = Q K^T and O += P V on mma.sync, P going from the S accumulators to the A
//    operand in registers, V's B operand by ldmatrix.trans. The sink (GPT-OSS) joins each
//    row's denominator once at the end, the sliding window masks by position.
// 4. scores (h2o, only with key_scores): a block per (128 keys, query head) walks the
//    query tiles, recomputes S^T = K Q^T and sums P = exp2(s - lse) over the queries with
//    the row's log-sum-exp that the forward saved. Each key's sum belongs to one thread of
//    one block, added in a fixed order: deterministic, no atomics, no partial buffers.
// Scores are kept in log2 units (the queries are scaled by scale * log2(e) before BF16).
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/flash_attn.h"
#include "kernels/cuda/kv_codec.cuh"

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBr = 16 * kWarps; // query rows per forward block
constexpr int kBc = 64;          // keys per forward K/V tile
constexpr int kBk = 16 * kWarps; // keys per scores block
constexpr int kBq = 64;          // queries per scores Q tile
constexpr int kPad = 8;          // BF16 elements of padding per shared row (bank spread)
constexpr int kMinRows = 64;     // fewer (query, head) rows per kv head: attn.cu serves
constexpr float kLog2e = 1.4426950408889634f;

typedef __nv_bfloat16 bf16;

__host__ __device__ inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The scratch of one call, carved from `work` in this order (each part 256-byte aligned).
struct Layout {
    int64_t n_pad;  // keys rounded up to kBk (a multiple of kBc too)
    int64_t q_pad;  // queries rounded up to kBq
    size_t kb, vb;  // [n_kv_heads][n_pad][hd] bf16
    size_t kpos;    // [n_pad] int32
    size_t kmin, kmax; // [n_pad / kBc] int32
    size_t qb;      // [n_heads][q_pad][hd] bf16 (scores only)
    size_t lse;     // [n_q][n_heads] f32 (scores only)
    size_t qpos;       // [q_pad] int32 (scores only)
    size_t qmin, qmax; // [q_pad / kBq] int32 (scores only)
    size_t total;
};

Layout layout_of(const tsr__cuda_attn &a) {
    Layout l;
    const bool sc = a.key_scores != nullptr;
    l.n_pad = round_up(a.n_keys > 0 ? a.n_keys : 1, kBk);
    l.q_pad = round_up(a.n_q, kBq);
    const size_t kv = static_cast<size_t>(a.n_kv_heads) * l.n_pad * a.head_dim * sizeof(bf16);
    size_t at = 0;
    auto take = [&at](size_t bytes) {
        const size_t here = at;
        at += static_cast<size_t>(round_up(static_cast<int64_t>(bytes), 256));
        return here;
    };
    l.kb = take(kv);
    l.vb = take(kv);
    l.kpos = take(l.n_pad * sizeof(int32_t));
    l.kmin = take(l.n_pad / kBc * sizeof(int32_t));
    l.kmax = take(l.n_pad / kBc * sizeof(int32_t));
    l.qb = sc ? take(static_cast<size_t>(a.n_heads) * l.q_pad * a.head_dim * sizeof(bf16)) : 0;
    l.lse = sc ? take(static_cast<size_t>(a.n_q) * a.n_heads * sizeof(float)) : 0;
    l.qpos = sc ? take(l.q_pad * sizeof(int32_t)) : 0;
    l.qmin = sc ? take(l.q_pad / kBq * sizeof(int32_t)) : 0;
    l.qmax = sc ? take(l.q_pad / kBq * sizeof(int32_t)) : 0;
    l.total = at;
    return l;
}

// Index of the span holding flat key `key` (the last span whose key_off <= key).
__device__ int span_of(const tsr__cuda_span *sp, int n_spans, int64_t key) {
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

// Key at position kp visible to a query at qp (causal, and the window when there is one).
__device__ __forceinline__ bool visible(int32_t kp, int32_t qp, int window) {
    return kp <= qp && (window <= 0 || static_cast<int64_t>(kp) > static_cast<int64_t>(qp) - window);
}

__global__ void pack_kernel(tsr__cuda_attn a, bf16 *kb, bf16 *vb, int32_t *kpos, int64_t n_pad) {
    const int hd = a.head_dim;
    const int64_t kvd = static_cast<int64_t>(a.n_kv_heads) * hd;
    for (int64_t key = blockIdx.x; key < n_pad; key += gridDim.x) {
        if (key >= a.n_keys) {
            for (int64_t c = threadIdx.x; c < kvd; c += blockDim.x) {
                const int64_t o = ((c / hd) * n_pad + key) * hd + c % hd;
                kb[o] = __float2bfloat16(0.0f);
                vb[o] = __float2bfloat16(0.0f);
            }
            if (threadIdx.x == 0) kpos[key] = INT_MAX;
            continue;
        }
        const int s = a.n_spans > 1 ? span_of(a.spans, a.n_spans, key) : 0;
        const tsr__cuda_span &sp = a.spans[s];
        const int64_t i = key - sp.key_off;
        const uint8_t *rk = nullptr, *rv = nullptr;
        if (sp.dtype != tsr_kv::F32) {
            rk = tsr_kv::row_at(sp.k, sp.dtype, kvd, i * kvd);
            rv = tsr_kv::row_at(sp.v, sp.dtype, kvd, i * kvd);
        }
        for (int64_t c = threadIdx.x; c < kvd; c += blockDim.x) {
            float k, v;
            if (sp.dtype == tsr_kv::F32) {
                k = sp.k[i * sp.stride + c];
                v = sp.v[i * sp.stride + c];
            } else {
                k = tsr_kv::load(rk, sp.dtype, c);
                v = tsr_kv::load(rv, sp.dtype, c);
            }
            const int64_t o = ((c / hd) * n_pad + key) * hd + c % hd;
            kb[o] = __float2bfloat16(k);
            vb[o] = __float2bfloat16(v);
        }
        if (threadIdx.x == 0) kpos[key] = sp.pos ? sp.pos[i] : sp.pos0 + static_cast<int32_t>(i);
    }
}

// The keys of the one sequence of a paged call (attention_paged of a prefill chunk): key j
// at position j, in block tables[j / block]; keys from n_keys[0] on (read here, on the
// device: the host does not know it) are padding.
__global__ void pack_paged_kernel(tsr__cuda_attn_paged a, bf16 *kb, bf16 *vb, int32_t *kpos,
                                  int64_t n_pad) {
    const int hd = a.head_dim;
    const int64_t kvd = static_cast<int64_t>(a.n_kv_heads) * hd;
    const int64_t nk = a.n_keys[0];
    for (int64_t key = blockIdx.x; key < n_pad; key += gridDim.x) {
        const bool real = key < nk;
        const uint8_t *rk = nullptr, *rv = nullptr;
        if (real) {
            const int64_t at = static_cast<int64_t>(a.tables[key / a.lay.block]) * a.lay.block_stride +
                               key % a.lay.block * a.lay.row;
            rk = tsr_kv::row_at(a.lay.k, a.lay.dtype, a.lay.row, at);
            rv = tsr_kv::row_at(a.lay.v, a.lay.dtype, a.lay.row, at);
        }
        for (int64_t c = threadIdx.x; c < kvd; c += blockDim.x) {
            const int64_t o = ((c / hd) * n_pad + key) * hd + c % hd;
            kb[o] = __float2bfloat16(real ? tsr_kv::load(rk, a.lay.dtype, c) : 0.0f);
            vb[o] = __float2bfloat16(real ? tsr_kv::load(rv, a.lay.dtype, c) : 0.0f);
        }
        if (threadIdx.x == 0) kpos[key] = real ? static_cast<int32_t>(key) : INT_MAX;
    }
}

// Least and greatest position of each group of `per` entries, one warp per group. Entries
// equal to `pad` are padding: they count in neither bound, but a group holding any has the
// greatest bound INT_MAX, so that no test takes it for whole (tile_full) while the least
// bound still says what it can hide.
__global__ void bounds_kernel(const int32_t *pos, int64_t n_groups, int per, int32_t *lo,
                              int32_t *hi, int32_t pad) {
    const int64_t gi = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (gi >= n_groups) return;
    int32_t mn = INT_MAX, mx = INT_MIN;
    for (int j = threadIdx.x % 32; j < per; j += 32) {
        const int32_t p = pos[gi * per + j];
        mx = max(mx, p == pad ? INT_MAX : p);
        if (p != pad) mn = min(mn, p);
    }
    for (int o = 16; o > 0; o >>= 1) {
        mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    if (threadIdx.x % 32 == 0) {
        lo[gi] = mn;
        hi[gi] = mx;
    }
}

// Query positions padded to q_pad (INT_MIN: no query), for the scores pass's tile bounds.
__global__ void qpos_pad_kernel(const int32_t *q_pos, int n_q, int64_t q_pad, int32_t *out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < q_pad) out[i] = i < n_q ? q_pos[i] : INT_MIN;
}

// ---- tensor-core primitives (sm_80+; built for an older target they trap, and the
// backend never launches these kernels on a device older than sm_80) ----

__device__ __forceinline__ void cp16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
    *static_cast<uint4 *>(smem) = *static_cast<const uint4 *>(gmem);
#endif
}

__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// c += a * b: A 16x16 (row), B 16x8 (col), BF16 in, FP32 accumulators. Fragments (lane =
// 4 * g + t): a0 (row g, k 2t..2t+1), a1 (row g + 8, same k), a2 (row g, k 2t+8..), a3
// (row g + 8, k 2t+8..); b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g); c0, c1 (row g,
// cols 2t, 2t+1), c2, c3 (row g + 8, same cols).
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;
    __trap();
#endif
}

// Four 8x8 BF16 matrices from shared memory: with lane l addressing row l % 8 of matrix
// l / 8, register i holds matrix i's (row g, cols 2t..2t+1): from a row-major [n][k] tile
// (K as [key][dim]), the B fragments of two k steps.
__device__ __forceinline__ void ldsm_x4(const void *smem, uint32_t &r0, uint32_t &r1,
                                        uint32_t &r2, uint32_t &r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
#else
    (void)smem;
    r0 = r1 = r2 = r3 = 0;
    __trap();
#endif
}

// Four 8x8 BF16 matrices from shared memory, transposed: with lane l addressing row l % 8
// of matrix l / 8, register i holds matrix i's (row 2t..2t+1, col g): the B fragment of a
// row-major [k][n] tile.
__device__ __forceinline__ void ldsm_x4_trans(const void *smem, uint32_t &r0, uint32_t &r1,
                                              uint32_t &r2, uint32_t &r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
#else
    (void)smem;
    r0 = r1 = r2 = r3 = 0;
    __trap();
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (low half) = lo
    return *reinterpret_cast<const uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t lds32(const bf16 *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

struct Fwd {
    const float *q;
    const int32_t *q_pos;
    int n_q, n_heads, group;
    float qscale; // scale * log2(e)
    const bf16 *kb, *vb;
    const int32_t *kpos, *kmin, *kmax;
    int64_t n_pad;
    int n_tiles;
    const float *sinks;
    int window;
    float *out;
    bf16 *qb;   // NULL, or the scaled BF16 queries [n_heads][q_pad][hd] for the scores pass
    float *lse; // NULL, or [n_q][n_heads] log2-sum-exp of each row
    int64_t q_pad;
};

template <int HD> constexpr size_t fwd_smem() {
    return (static_cast<size_t>(kBr) * (HD + kPad) + 4 * static_cast<size_t>(kBc) * (HD + kPad)) *
               sizeof(bf16) +
           2 * kBc * sizeof(int32_t);
}

// Tile t can hold a key visible to some query of [qmin, qmax].
__device__ __forceinline__ bool tile_live(const Fwd &f, int t, int32_t qmin, int32_t qmax) {
    const int32_t lo = f.kmin[t], hi = f.kmax[t];
    if (lo > hi || lo > qmax) return false; // empty, or after every query
    return f.window <= 0 || static_cast<int64_t>(hi) > static_cast<int64_t>(qmin) - f.window;
}

// Every key of tile t visible to every query of [qmin, qmax]: the tile needs no mask.
__device__ __forceinline__ bool tile_full(const Fwd &f, int t, int32_t qmin, int32_t qmax) {
    const int32_t lo = f.kmin[t], hi = f.kmax[t];
    if (hi > qmin) return false; // (a tile with padding keys has hi INT_MAX)
    return f.window <= 0 || static_cast<int64_t>(lo) > static_cast<int64_t>(qmax) - f.window;
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(Fwd f) {
    constexpr int LD = HD + kPad;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *qs = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *ks = qs + kBr * LD; // [2][kBc][LD]
    bf16 *vs = ks + 2 * kBc * LD;
    int32_t *kps = reinterpret_cast<int32_t *>(vs + 2 * kBc * LD); // [2][kBc]
    __shared__ int32_t rpos[kBr];
    __shared__ int32_t qlo, qhi;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int kvh = blockIdx.y;
    const int64_t rows = static_cast<int64_t>(f.n_q) * f.group;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBr;
    if (tid == 0) {
        qlo = INT_MAX;
        qhi = INT_MIN;
    }
    __syncthreads();
    // Q tile: f32 -> scaled BF16 in shared memory (and to qb for the scores pass).
    for (int i = tid; i < kBr * (HD / 4); i += kThreads) {
        const int r = i / (HD / 4), c = 4 * (i % (HD / 4));
        const int64_t R = row0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int64_t qi = 0;
        int head = 0;
        if (R < rows) {
            qi = R / f.group;
            head = kvh * f.group + static_cast<int>(R % f.group);
            v = *reinterpret_cast<const float4 *>(f.q + (qi * f.n_heads + head) * HD + c);
            v.x *= f.qscale, v.y *= f.qscale, v.z *= f.qscale, v.w *= f.qscale;
        }
        uint2 p;
        p.x = pack_bf16(v.x, v.y);
        p.y = pack_bf16(v.z, v.w);
        *reinterpret_cast<uint2 *>(qs + r * LD + c) = p;
        if (f.qb && R < rows)
            *reinterpret_cast<uint2 *>(f.qb + (static_cast<int64_t>(head) * f.q_pad + qi) * HD + c) = p;
    }
    if (tid < kBr) {
        const int64_t R = row0 + tid;
        int32_t p = INT_MIN;
        if (R < rows) {
            p = f.q_pos[R / f.group];
            atomicMin(&qlo, p);
            atomicMax(&qhi, p);
        }
        rpos[tid] = p;
    }
    __syncthreads();
    const int32_t qmin = qlo, qmax = qhi;

    // This warp's 16 rows: A fragments of Q for every k step of head_dim.
    const int ra = warp * 16 + g, rb = ra + 8;
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
        qa[k][0] = lds32(qs + ra * LD + 16 * k + 2 * t4);
        qa[k][1] = lds32(qs + rb * LD + 16 * k + 2 * t4);
        qa[k][2] = lds32(qs + ra * LD + 16 * k + 8 + 2 * t4);
        qa[k][3] = lds32(qs + rb * LD + 16 * k + 8 + 2 * t4);
    }
    const int32_t pa = rpos[ra], pb = rpos[rb];

    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    auto load_tile = [&](int t, int buf) {
        const bf16 *gk = f.kb + (static_cast<int64_t>(kvh) * f.n_pad + static_cast<int64_t>(t) * kBc) * HD;
        const bf16 *gv = f.vb + (static_cast<int64_t>(kvh) * f.n_pad + static_cast<int64_t>(t) * kBc) * HD;
        bf16 *sk = ks + buf * kBc * LD, *sv = vs + buf * kBc * LD;
        for (int i = tid; i < kBc * (HD / 8); i += kThreads) {
            const int r = i / (HD / 8), c = 8 * (i % (HD / 8));
            cp16(sk + r * LD + c, gk + r * HD + c);
            cp16(sv + r * LD + c, gv + r * HD + c);
        }
        if (tid < kBc) kps[buf * kBc + tid] = f.kpos[static_cast<int64_t>(t) * kBc + tid];
    };
    auto next_live = [&](int t) {
        while (t < f.n_tiles && !tile_live(f, t, qmin, qmax)) t++;
        return t;
    };

    int t = qmin <= qmax ? next_live(0) : f.n_tiles;
    if (t < f.n_tiles) load_tile(t, 0);
    cp_commit();
    int buf = 0;
    while (t < f.n_tiles) {
        const int tn = next_live(t + 1);
        if (tn < f.n_tiles) load_tile(tn, buf ^ 1);
        cp_commit();
        cp_wait<1>(); // tile t's group has landed (the newest may still be in flight)
        __syncthreads();
        const bf16 *sk = ks + buf * kBc * LD, *sv = vs + buf * kBc * LD;
        const int32_t *kp = kps + buf * kBc;

        // S = Q K^T for this warp's 16 rows and the tile's 64 keys (8 n-tiles of 8 keys).
        float s[kBc / 8][4];
#pragma unroll
        for (int j = 0; j < kBc / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            // keys 8j .. 8j + 7; matrices 0-3: dims 16k, 16k + 8, 16k + 16, 16k + 24
            const bf16 *kr = sk + (8 * j + (lane & 7)) * LD + 8 * (lane >> 3);
#pragma unroll
            for (int k = 0; k < HD / 16; k += 2) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(kr + 16 * k, b0, b1, b2, b3);
                mma16816(s[j], qa[k], b0, b1);
                mma16816(s[j], qa[k + 1], b2, b3);
            }
        }
        // mask by position (not in a tile every row sees whole: rows past the last query
        // then keep finite scores, but nothing of theirs is written), then the online
        // softmax of rows a (g) and b (g + 8)
        float mta = -INFINITY, mtb = -INFINITY;
        const bool full = tile_full(f, t, qmin, qmax);
#pragma unroll
        for (int j = 0; j < kBc / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (!full) {
                    const int32_t p = kp[8 * j + 2 * t4 + e];
                    if (!visible(p, pa, f.window)) s[j][e] = -INFINITY;
                    if (!visible(p, pb, f.window)) s[j][2 + e] = -INFINITY;
                }
                mta = fmaxf(mta, s[j][e]);
                mtb = fmaxf(mtb, s[j][2 + e]);
            }
        }
        mta = quad_max(mta);
        mtb = quad_max(mtb);
        const float na = fmaxf(ma, mta), nb = fmaxf(mb, mtb);
        // a row that has seen no visible key yet keeps base 0 (every p is 0 then)
        const float ba = na == -INFINITY ? 0.0f : na, bb = nb == -INFINITY ? 0.0f : nb;
        const float ca = exp2f(ma - ba), cb = exp2f(mb - bb);
        ma = na;
        mb = nb;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int j = 0; j < kBc / 8; j++) {
            s[j][0] = exp2f(s[j][0] - ba);
            s[j][1] = exp2f(s[j][1] - ba);
            s[j][2] = exp2f(s[j][2] - bb);
            s[j][3] = exp2f(s[j][3] - bb);
            sa += s[j][0] + s[j][1];
            sb += s[j][2] + s[j][3];
        }
        la = la * ca + sa; // per-thread partial sums; the quad is added at the end
        lb = lb * cb + sb;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= ca;
            o[n][1] *= ca;
            o[n][2] *= cb;
            o[n][3] *= cb;
        }
        // O += P V: P's accumulators of key n-tiles 2kk and 2kk + 1 are the A fragment of
        // keys 16kk .. 16kk + 15; V's B fragments come transposed by ldmatrix.
#pragma unroll
        for (int kk = 0; kk < kBc / 16; kk++) {
            uint32_t pa4[4];
            pa4[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            pa4[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            pa4[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa4[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const bf16 *vr = sv + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
#pragma unroll
            for (int n2 = 0; n2 < HD / 16; n2++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(vr + 16 * n2, b0, b1, b2, b3);
                mma16816(o[2 * n2], pa4, b0, b1);
                mma16816(o[2 * n2 + 1], pa4, b2, b3);
            }
        }
        __syncthreads(); // every warp is done with buf before it is loaded again
        buf ^= 1;
        t = tn;
    }
    cp_wait<0>();

    la = quad_sum(la);
    lb = quad_sum(lb);
    const int64_t Ra = row0 + ra, Rb = row0 + rb;
    const int64_t qia = Ra / f.group, qib = Rb / f.group;
    const int ha = kvh * f.group + static_cast<int>(Ra % f.group);
    const int hb = kvh * f.group + static_cast<int>(Rb % f.group);
    if (f.sinks) { // exp(sink - m) joins the denominator once, with no value
        const float za = f.sinks[Ra < rows ? ha : 0] * kLog2e, zb = f.sinks[Rb < rows ? hb : 0] * kLog2e;
        const float na = fmaxf(ma, za), nb = fmaxf(mb, zb);
        const float ca = exp2f(ma - na), cb = exp2f(mb - nb);
        la = la * ca + exp2f(za - na);
        lb = lb * cb + exp2f(zb - nb);
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= ca;
            o[n][1] *= ca;
            o[n][2] *= cb;
            o[n][3] *= cb;
        }
        ma = na;
        mb = nb;
    }
    const float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        const int c = 8 * n + 2 * t4;
        if (Ra < rows)
            *reinterpret_cast<float2 *>(f.out + (qia * f.n_heads + ha) * HD + c) =
                make_float2(o[n][0] * ia, o[n][1] * ia);
        if (Rb < rows)
            *reinterpret_cast<float2 *>(f.out + (qib * f.n_heads + hb) * HD + c) =
                make_float2(o[n][2] * ib, o[n][3] * ib);
    }
    if (f.lse && t4 == 0) { // no visible key: +inf, so that every p of the row is 0
        if (Ra < rows) f.lse[qia * f.n_heads + ha] = la > 0.0f ? ma + log2f(la) : INFINITY;
        if (Rb < rows) f.lse[qib * f.n_heads + hb] = lb > 0.0f ? mb + log2f(lb) : INFINITY;
    }
}

struct Scores {
    const bf16 *qb, *kb;
    const float *lse;
    const int32_t *q_pos, *kpos, *kmin, *kmax, *qmin, *qmax;
    int n_q, n_heads, group, window;
    int64_t n_keys, n_pad, q_pad;
    float *key_scores; // [n_heads][n_keys], added to
};

template <int HD> constexpr size_t scores_smem() {
    return (static_cast<size_t>(kBk) * (HD + kPad) + 2 * static_cast<size_t>(kBq) * (HD + kPad)) *
               sizeof(bf16) +
           (kBk + 4 * kBq) * sizeof(int32_t);
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) scores_kernel(Scores f) {
    constexpr int LD = HD + kPad;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *ks = reinterpret_cast<bf16 *>(smem_raw); // [kBk][LD]
    bf16 *qs = ks + kBk * LD;                      // [2][kBq][LD]
    int32_t *kps = reinterpret_cast<int32_t *>(qs + 2 * kBq * LD); // [kBk]
    int32_t *qps = kps + kBk;                                      // [2][kBq]
    float *lss = reinterpret_cast<float *>(qps + 2 * kBq);         // [2][kBq]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int head = blockIdx.y, kvh = head / f.group;
    const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBk;
    const bf16 *gk = f.kb + (static_cast<int64_t>(kvh) * f.n_pad + k0) * HD;
    for (int i = tid; i < kBk * (HD / 8); i += kThreads) {
        const int r = i / (HD / 8), c = 8 * (i % (HD / 8));
        cp16(ks + r * LD + c, gk + r * HD + c);
    }
    if (tid < kBk) kps[tid] = f.kpos[k0 + tid];
    cp_commit();
    // the key tile's position bounds (two forward tiles of kBc)
    int32_t klo = INT_MAX, khi = INT_MIN;
    for (int j = 0; j < kBk / kBc; j++) {
        const int64_t ti = k0 / kBc + j;
        if (f.kmin[ti] <= f.kmax[ti]) {
            klo = min(klo, f.kmin[ti]);
            khi = max(khi, f.kmax[ti]);
        }
    }
    const int n_qt = static_cast<int>(f.q_pad / kBq);
    auto live = [&](int qt) {
        const int32_t lo = f.qmin[qt], hi = f.qmax[qt];
        if (lo > hi || klo > khi || klo > hi) return false;
        return f.window <= 0 || static_cast<int64_t>(khi) > static_cast<int64_t>(lo) - f.window;
    };
    auto next_live = [&](int qt) {
        while (qt < n_qt && !live(qt)) qt++;
        return qt;
    };
    auto load_q = [&](int qt, int buf) {
        const bf16 *gq = f.qb + (static_cast<int64_t>(head) * f.q_pad + static_cast<int64_t>(qt) * kBq) * HD;
        bf16 *sq = qs + buf * kBq * LD;
        for (int i = tid; i < kBq * (HD / 8); i += kThreads) {
            const int r = i / (HD / 8), c = 8 * (i % (HD / 8));
            cp16(sq + r * LD + c, gq + r * HD + c);
        }
        if (tid < kBq) {
            const int64_t qi = static_cast<int64_t>(qt) * kBq + tid;
            qps[buf * kBq + tid] = qi < f.n_q ? f.q_pos[qi] : INT_MIN;
            lss[buf * kBq + tid] = qi < f.n_q ? f.lse[qi * f.n_heads + head] : INFINITY;
        }
    };
    int qt = next_live(0);
    if (qt < n_qt) load_q(qt, 0);
    cp_commit();
    cp_wait<1>(); // the K tile
    __syncthreads();
    const int ka_row = warp * 16 + g;
    uint32_t ka[HD / 16][4];
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
        ka[k][0] = lds32(ks + ka_row * LD + 16 * k + 2 * t4);
        ka[k][1] = lds32(ks + (ka_row + 8) * LD + 16 * k + 2 * t4);
        ka[k][2] = lds32(ks + ka_row * LD + 16 * k + 8 + 2 * t4);
        ka[k][3] = lds32(ks + (ka_row + 8) * LD + 16 * k + 8 + 2 * t4);
    }
    const int32_t kpa = kps[ka_row], kpb = kps[ka_row + 8];
    float suma = 0.0f, sumb = 0.0f;
    int buf = 0;
    while (qt < n_qt) {
        const int qn = next_live(qt + 1);
        if (qn < n_qt) load_q(qn, buf ^ 1);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        const bf16 *sq = qs + buf * kBq * LD;
        const int32_t *qp = qps + buf * kBq;
        const float *ls = lss + buf * kBq;
        // S^T = K Q^T: rows are this warp's 16 keys, columns 8 queries per n-tile
#pragma unroll
        for (int j = 0; j < kBq / 8; j++) {
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const bf16 *qr = sq + (8 * j + (lane & 7)) * LD + 8 * (lane >> 3);
#pragma unroll
            for (int k = 0; k < HD / 16; k += 2) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(qr + 16 * k, b0, b1, b2, b3);
                mma16816(c, ka[k], b0, b1);
                mma16816(c, ka[k + 1], b2, b3);
            }
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int qc = 8 * j + 2 * t4 + e;
                const int32_t p = qp[qc];
                const float l = ls[qc];
                suma += visible(kpa, p, f.window) ? exp2f(c[e] - l) : 0.0f;
                sumb += visible(kpb, p, f.window) ? exp2f(c[2 + e] - l) : 0.0f;
            }
        }
        __syncthreads();
        buf ^= 1;
        qt = qn;
    }
    cp_wait<0>();
    suma = quad_sum(suma);
    sumb = quad_sum(sumb);
    if (t4 == 0) {
        const int64_t ka_key = k0 + ka_row, kb_key = ka_key + 8;
        float *ks_out = f.key_scores + static_cast<int64_t>(head) * f.n_keys;
        if (ka_key < f.n_keys) ks_out[ka_key] += suma;
        if (kb_key < f.n_keys) ks_out[kb_key] += sumb;
    }
}

// paged: NULL, or the paged call whose one sequence's keys replace a's spans (a.n_keys is
// then the table's capacity, an upper bound).
template <int HD> cudaError_t launch(const tsr__cuda_attn &a, const float *sinks, int window,
                                     unsigned char *work, cudaStream_t stream,
                                     const tsr__cuda_attn_paged *paged) {
    const Layout l = layout_of(a);
    bf16 *kb = reinterpret_cast<bf16 *>(work + l.kb), *vb = reinterpret_cast<bf16 *>(work + l.vb);
    int32_t *kpos = reinterpret_cast<int32_t *>(work + l.kpos);
    int32_t *kmin = reinterpret_cast<int32_t *>(work + l.kmin);
    int32_t *kmax = reinterpret_cast<int32_t *>(work + l.kmax);
    const bool sc = a.key_scores != nullptr;
    const int64_t n_tiles = l.n_pad / kBc;
    {
        const unsigned g = static_cast<unsigned>(l.n_pad < 65535 ? l.n_pad : 65535);
        if (paged)
            pack_paged_kernel<<<g, 128, 0, stream>>>(*paged, kb, vb, kpos, l.n_pad);
        else
            pack_kernel<<<g, 128, 0, stream>>>(a, kb, vb, kpos, l.n_pad);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        bounds_kernel<<<static_cast<unsigned>((n_tiles + 7) / 8), 256, 0, stream>>>(
            kpos, n_tiles, kBc, kmin, kmax, INT_MAX);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    Fwd f = {};
    f.q = a.q;
    f.q_pos = a.q_pos;
    f.n_q = a.n_q;
    f.n_heads = a.n_heads;
    f.group = a.n_heads / a.n_kv_heads;
    f.qscale = a.scale * kLog2e;
    f.kb = kb;
    f.vb = vb;
    f.kpos = kpos;
    f.kmin = kmin;
    f.kmax = kmax;
    f.n_pad = l.n_pad;
    f.n_tiles = static_cast<int>(n_tiles);
    f.sinks = sinks;
    f.window = window;
    f.out = a.out;
    f.qb = sc ? reinterpret_cast<bf16 *>(work + l.qb) : nullptr;
    f.lse = sc ? reinterpret_cast<float *>(work + l.lse) : nullptr;
    f.q_pad = l.q_pad;
    const int64_t rows = static_cast<int64_t>(a.n_q) * f.group;
    const size_t smem = fwd_smem<HD>();
    cudaError_t e = cudaFuncSetAttribute(fwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    const dim3 grid(static_cast<unsigned>((rows + kBr - 1) / kBr), static_cast<unsigned>(a.n_kv_heads));
    fwd_kernel<HD><<<grid, kThreads, smem, stream>>>(f);
    if ((e = cudaGetLastError()) != cudaSuccess || !sc) return e;

    Scores s = {};
    s.qb = f.qb;
    s.kb = kb;
    s.lse = f.lse;
    s.q_pos = a.q_pos;
    s.kpos = kpos;
    s.kmin = kmin;
    s.kmax = kmax;
    int32_t *qmin = reinterpret_cast<int32_t *>(work + l.qmin);
    int32_t *qmax = reinterpret_cast<int32_t *>(work + l.qmax);
    s.qmin = qmin;
    s.qmax = qmax;
    s.n_q = a.n_q;
    s.n_heads = a.n_heads;
    s.group = f.group;
    s.window = window;
    s.n_keys = a.n_keys;
    s.n_pad = l.n_pad;
    s.q_pad = l.q_pad;
    s.key_scores = a.key_scores;
    // query tile bounds: the positions padded to whole tiles (INT_MIN: no query), then each
    // tile's least and greatest
    int32_t *qposp = reinterpret_cast<int32_t *>(work + l.qpos);
    qpos_pad_kernel<<<static_cast<unsigned>((l.q_pad + 255) / 256), 256, 0, stream>>>(
        a.q_pos, a.n_q, l.q_pad, qposp);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const int64_t n_qt = l.q_pad / kBq;
    bounds_kernel<<<static_cast<unsigned>((n_qt + 7) / 8), 256, 0, stream>>>(
        qposp, n_qt, kBq, qmin, qmax, INT_MIN);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const size_t ssmem = scores_smem<HD>();
    e = cudaFuncSetAttribute(scores_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(ssmem));
    if (e != cudaSuccess) return e;
    const dim3 sgrid(static_cast<unsigned>(l.n_pad / kBk), static_cast<unsigned>(a.n_heads));
    scores_kernel<HD><<<sgrid, kThreads, ssmem, stream>>>(s);
    return cudaGetLastError();
}

} // namespace

extern "C" int tsr__cuda_flash_prefill_fits(const tsr__cuda_attn *a) {
    if (a->head_dim != 64 && a->head_dim != 128) return 0;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads) return 0;
    if (reinterpret_cast<uintptr_t>(a->q) % 16 || reinterpret_cast<uintptr_t>(a->out) % 16) return 0;
    // fewer rows than a tile's worth per kv head: decode-like, attn.cu's split-K serves
    return static_cast<int64_t>(a->n_q) * (a->n_heads / a->n_kv_heads) >= kMinRows;
}

extern "C" size_t tsr__cuda_flash_prefill_work(const tsr__cuda_attn *a) {
    if (a->n_q <= 0 || a->n_kv_heads <= 0) return 0;
    return layout_of(*a).total;
}

extern "C" cudaError_t tsr__cuda_flash_prefill(const tsr__cuda_attn *a, const float *sinks,
                                               int window, void *work, cudaStream_t stream) {
    if (a->n_q <= 0 || a->n_heads <= 0) return cudaSuccess;
    if (!work || !tsr__cuda_flash_prefill_fits(a) || a->n_heads > 65535) return cudaErrorInvalidValue;
    unsigned char *w = static_cast<unsigned char *>(work);
    return a->head_dim == 64 ? launch<64>(*a, sinks, window, w, stream, nullptr)
                             : launch<128>(*a, sinks, window, w, stream, nullptr);
}

namespace {
// The paged call as the span-based geometry (no spans: pack_paged_kernel reads the table).
tsr__cuda_attn as_attn(const tsr__cuda_attn_paged *p) {
    tsr__cuda_attn a = {};
    a.q = p->q;
    a.q_pos = p->q_pos;
    a.n_q = p->n_q;
    a.n_keys = static_cast<int64_t>(p->max_blocks) * p->lay.block;
    a.n_heads = p->n_heads;
    a.n_kv_heads = p->n_kv_heads;
    a.head_dim = p->head_dim;
    a.scale = p->scale;
    a.out = p->out;
    return a;
}
} // namespace

extern "C" int tsr__cuda_flash_paged_fits(const tsr__cuda_attn_paged *a) {
    if (a->n_seqs != 1 || a->lay.block <= 0 || a->max_blocks <= 0) return 0;
    const tsr__cuda_attn g = as_attn(a);
    return tsr__cuda_flash_prefill_fits(&g);
}

extern "C" size_t tsr__cuda_flash_paged_work(const tsr__cuda_attn_paged *a) {
    const tsr__cuda_attn g = as_attn(a);
    return tsr__cuda_flash_prefill_work(&g);
}

extern "C" cudaError_t tsr__cuda_flash_prefill_paged(const tsr__cuda_attn_paged *a,
                                                     const float *sinks, int window, void *work,
                                                     cudaStream_t stream) {
    if (a->n_q <= 0) return cudaSuccess;
    if (!work || !tsr__cuda_flash_paged_fits(a) || a->n_heads > 65535) return cudaErrorInvalidValue;
    const tsr__cuda_attn g = as_attn(a);
    unsigned char *w = static_cast<unsigned char *>(work);
    return a->head_dim == 64 ? launch<64>(g, sinks, window, w, stream, a)
                             : launch<128>(g, sinks, window, w, stream, a);
}
