// Paged decode attention with split-K (flash-decoding), one launch over every query row of
// the batch, then one merge launch (the op attention_paged; attn_paged.cu is the
// reference it replaces on sm_80+ and that TSR_CUDA_ATTN=reference keeps).
//
// Decode reads every K/V byte once per step and does ~1 flop per byte, so the kernel is
// about keeping enough bytes in flight: one block per (query row, group of G query heads of
// one kv head, partition of `part` keys). The grid is sized by the partitions so that even
// batch 1 fills the multiprocessors (attn_paged.cu had a block per (row, head) walking all
// of the row's keys: 32 blocks at batch 1 on the 8B shape). Inside a block, a key takes
// head_dim / 8 lanes, each loading 8 elements in one 16-byte load (bf16; two for f32), so a
// warp has 32 / (head_dim / 8) keys in flight, and each lane group handles two keys per
// step with both loads issued before either is used. The G query heads of the kv head
// share every K/V load (GQA: the K/V bytes are read once per kv head, not once per query
// head). q8 and fp8 rows (not 16-byte aligned) go through the codec element by element.
//
// Each block leaves its partition's running max, sum and unnormalised output per head; the
// merge kernel rescales the partitions to the common max, adds the sink (GPT-OSS: once per
// row, so in the merge and not per partition) and divides. Scores are in log2 units (the
// query is scaled by scale * log2(e)). The sliding window is by position: key j of a
// sequence is at position j (the paged layout's contract).
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/cuda/flash_attn.h"
#include "kernels/cuda/kv_codec.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMinPart = 128;
constexpr float kLog2e = 1.4426950408889634f;

// Lanes per key: head_dim / 8 rounded up to a power of two (a lane group never straddles a
// warp and its reduction is a butterfly).
__host__ __device__ inline int lanes_per_key(int hd) {
    int l = 1;
    while (l * 8 < hd) l *= 2;
    return l;
}

// Query heads per block: the largest of 8, 4, 2, 1 that divides the GQA group.
__host__ __device__ inline int heads_per_block(int group) {
    return group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
}

// Eight elements of a stored row from element c (c a multiple of 8 within the row).
template <int DT> __device__ __forceinline__ void load8(const uint8_t *row, int64_t c, float *x) {
    if (DT == tsr_kv::BF16) {
        const uint4 u = *reinterpret_cast<const uint4 *>(row + 2 * c);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else if (DT == tsr_kv::F32) {
        const float4 a = *reinterpret_cast<const float4 *>(row + 4 * c);
        const float4 b = *reinterpret_cast<const float4 *>(row + 4 * c + 16);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = tsr_kv::load(row, DT, c + i);
    }
}

struct Dec {
    tsr__cuda_attn_paged a;
    const float *sinks;
    int window;
    int part, parts, G, lpk;
    float *pm, *pl, *po; // partials: [n_q][n_heads][parts] max and sum, then [..][hd] output
};

template <int G, int DT> __global__ void __launch_bounds__(kThreads) split_kernel(Dec d) {
    const tsr__cuda_attn_paged &a = d.a;
    const int r = blockIdx.x, hg = blockIdx.y, p = blockIdx.z;
    const int hd = a.head_dim, lpk = d.lpk, kpw = 32 / lpk, n_kg = kWarps * kpw;
    const int tid = threadIdx.x, lane = tid % 32;
    const int kg = tid / 32 * kpw + lane / lpk; // this lane's key group in the block
    const int sub = lane % lpk, c8 = 8 * sub;   // its 8 elements of head_dim
    const bool on = c8 < hd;
    const int h0 = hg * G, group = a.n_heads / a.n_kv_heads, kvh = h0 / group;
    const int s = a.q_seq[r];
    const int32_t qp = a.q_pos[r];
    int32_t nk = a.n_keys[s];
    if (nk > qp + 1) nk = qp + 1; // causal
    int32_t lo = 0;
    if (d.window > 0 && qp - d.window + 1 > 0) lo = qp - d.window + 1;
    int32_t k0 = p * d.part, k1 = k0 + d.part;
    if (k0 < lo) k0 = lo;
    if (k1 > nk) k1 = nk;

    float q[G][8], acc[G][8], m[G], l[G];
    const float qs = a.scale * kLog2e;
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qr = a.q + (static_cast<int64_t>(r) * a.n_heads + h0 + g) * hd;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            q[g][i] = on ? qr[c8 + i] * qs : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    const int32_t *tb = a.tables + static_cast<int64_t>(s) * a.max_blocks;
    const int64_t c0 = static_cast<int64_t>(kvh) * hd + c8;
    auto row_of = [&](const float *base, int32_t j) {
        const int64_t at = static_cast<int64_t>(tb[j / a.lay.block]) * a.lay.block_stride +
                           static_cast<int64_t>(j % a.lay.block) * a.lay.row;
        return tsr_kv::row_at(base, DT, a.lay.row, at);
    };
    // two keys per lane group per step: j and j + n_kg, both loads before any use. The
    // loop is uniform over the block (the shuffles below need every lane of the warp).
    for (int32_t base = k0; base < k1; base += 2 * n_kg) {
        const int32_t j = base + kg, j2 = j + n_kg;
        const bool one = j < k1, two = j2 < k1;
        float kx[8], ky[8], vx[8], vy[8];
#pragma unroll
        for (int i = 0; i < 8; i++) kx[i] = ky[i] = vx[i] = vy[i] = 0.0f;
        if (on && one) {
            load8<DT>(row_of(a.lay.k, j), c0, kx);
            load8<DT>(row_of(a.lay.v, j), c0, vx);
        }
        if (on && two) {
            load8<DT>(row_of(a.lay.k, j2), c0, ky);
            load8<DT>(row_of(a.lay.v, j2), c0, vy);
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float sx = 0.0f, sy = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                sx += q[g][i] * kx[i];
                sy += q[g][i] * ky[i];
            }
            for (int o = lpk / 2; o > 0; o >>= 1) {
                sx += __shfl_xor_sync(0xffffffffu, sx, o);
                sy += __shfl_xor_sync(0xffffffffu, sy, o);
            }
            if (!one) sx = -INFINITY;
            if (!two) sy = -INFINITY;
            const float mn = fmaxf(m[g], fmaxf(sx, sy));
            if (mn == -INFINITY) continue; // this lane group has no key here
            const float corr = exp2f(m[g] - mn), px = exp2f(sx - mn), py = exp2f(sy - mn);
            l[g] = l[g] * corr + px + py;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[g][i] = acc[g][i] * corr + px * vx[i] + py * vy[i];
            m[g] = mn;
        }
    }

    // the block's key groups merged through shared memory: kg's state for head g
    __shared__ float sm[kThreads][G], sl[kThreads][G];
    __shared__ float so[G][kThreads * 8];
    if (sub == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            sm[kg][g] = m[g];
            sl[kg][g] = l[g];
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (on) so[g][kg * hd + c8 + i] = acc[g][i];
    __syncthreads();
    for (int g = 0; g < G; g++) {
        float M = -INFINITY;
        for (int k = 0; k < n_kg; k++) M = fmaxf(M, sm[k][g]);
        const int64_t pi = (static_cast<int64_t>(r) * a.n_heads + h0 + g) * d.parts + p;
        if (tid == 0) {
            float L = 0.0f;
            if (M > -INFINITY)
                for (int k = 0; k < n_kg; k++)
                    if (sm[k][g] > -INFINITY) L += sl[k][g] * exp2f(sm[k][g] - M);
            d.pm[pi] = M;
            d.pl[pi] = L;
        }
        for (int c = tid; c < hd; c += kThreads) {
            float o = 0.0f;
            if (M > -INFINITY)
                for (int k = 0; k < n_kg; k++)
                    if (sm[k][g] > -INFINITY) o += so[g][k * hd + c] * exp2f(sm[k][g] - M);
            d.po[pi * hd + c] = o;
        }
    }
}

// One block per (row, head): the partitions rescaled to the common max, the sink added to
// the denominator once, the output divided.
__global__ void __launch_bounds__(kThreads) merge_kernel(Dec d) {
    const int r = blockIdx.x, h = blockIdx.y, hd = d.a.head_dim;
    const int64_t base = (static_cast<int64_t>(r) * d.a.n_heads + h) * d.parts;
    float M = -INFINITY;
    for (int p = 0; p < d.parts; p++) M = fmaxf(M, d.pm[base + p]);
    const float z = d.sinks ? d.sinks[h] * kLog2e : -INFINITY;
    M = fmaxf(M, z);
    float L = 0.0f;
    if (M > -INFINITY) {
        for (int p = 0; p < d.parts; p++)
            if (d.pm[base + p] > -INFINITY) L += d.pl[base + p] * exp2f(d.pm[base + p] - M);
        if (d.sinks) L += exp2f(z - M);
    }
    float *out = d.a.out + (static_cast<int64_t>(r) * d.a.n_heads + h) * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0.0f;
        if (L > 0.0f)
            for (int p = 0; p < d.parts; p++)
                if (d.pm[base + p] > -INFINITY)
                    o += d.po[(base + p) * hd + c] * exp2f(d.pm[base + p] - M);
        out[c] = L > 0.0f ? o / L : 0.0f;
    }
}

template <int G> cudaError_t launch_g(const Dec &d, dim3 grid, cudaStream_t stream) {
    switch (d.a.lay.dtype) {
    case tsr_kv::BF16: split_kernel<G, tsr_kv::BF16><<<grid, kThreads, 0, stream>>>(d); break;
    case tsr_kv::Q8: split_kernel<G, tsr_kv::Q8><<<grid, kThreads, 0, stream>>>(d); break;
    case tsr_kv::FP8: split_kernel<G, tsr_kv::FP8><<<grid, kThreads, 0, stream>>>(d); break;
    default: split_kernel<G, tsr_kv::F32><<<grid, kThreads, 0, stream>>>(d); break;
    }
    return cudaGetLastError();
}

} // namespace

extern "C" int tsr__cuda_decode_fits(const tsr__cuda_attn_paged *a) {
    if (a->head_dim <= 0 || a->head_dim % 8 || a->head_dim > 256) return 0;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads) return 0;
    // the 16-byte loads: f32 rows must start on 4-element boundaries, bf16 on 8
    const int64_t align = a->lay.dtype == tsr_kv::F32 ? 4 : a->lay.dtype == tsr_kv::BF16 ? 8 : 1;
    if (a->lay.block_stride % align || a->lay.row % align) return 0;
    if (reinterpret_cast<uintptr_t>(a->lay.k) % 16 || reinterpret_cast<uintptr_t>(a->lay.v) % 16)
        return a->lay.dtype != tsr_kv::F32 && a->lay.dtype != tsr_kv::BF16;
    return 1;
}

extern "C" tsr__cuda_decode_plan tsr__cuda_decode_plan_for(const tsr__cuda_attn_paged *a,
                                                           int sm_count) {
    tsr__cuda_decode_plan p = {kMinPart, 1};
    const int64_t max_keys = static_cast<int64_t>(a->max_blocks) * a->lay.block;
    const int G = heads_per_block(a->n_kv_heads > 0 ? a->n_heads / a->n_kv_heads : 1);
    const int64_t base = static_cast<int64_t>(a->n_q > 0 ? a->n_q : 1) * (a->n_heads / G);
    // enough blocks for about four per multiprocessor, counting the longest sequence
    const int64_t target = 4 * static_cast<int64_t>(sm_count > 0 ? sm_count : 1);
    const int64_t want = base >= target ? 1 : (target + base - 1) / base;
    int64_t part = (max_keys + want - 1) / want;
    part = (part + 63) / 64 * 64;
    if (part < kMinPart) part = kMinPart;
    p.part = static_cast<int>(part);
    p.parts = static_cast<int>((max_keys + part - 1) / part);
    if (p.parts < 1) p.parts = 1;
    return p;
}

extern "C" size_t tsr__cuda_decode_work(const tsr__cuda_attn_paged *a, tsr__cuda_decode_plan p) {
    if (a->n_q <= 0) return 0;
    const size_t n = static_cast<size_t>(a->n_q) * a->n_heads * p.parts;
    return n * (2 + static_cast<size_t>(a->head_dim)) * sizeof(float);
}

extern "C" cudaError_t tsr__cuda_decode_paged(const tsr__cuda_attn_paged *a, const float *sinks,
                                              int window, tsr__cuda_decode_plan p, void *work,
                                              cudaStream_t stream) {
    if (a->n_q <= 0) return cudaSuccess;
    if (!work || !tsr__cuda_decode_fits(a) || p.parts < 1 || p.parts > 65535 || p.part < 1)
        return cudaErrorInvalidValue;
    Dec d;
    d.a = *a;
    d.sinks = sinks;
    d.window = window;
    d.part = p.part;
    d.parts = p.parts;
    d.G = heads_per_block(a->n_heads / a->n_kv_heads);
    d.lpk = lanes_per_key(a->head_dim);
    const size_t n = static_cast<size_t>(a->n_q) * a->n_heads * p.parts;
    d.pm = static_cast<float *>(work);
    d.pl = d.pm + n;
    d.po = d.pl + n;
    const dim3 grid(static_cast<unsigned>(a->n_q), static_cast<unsigned>(a->n_heads / d.G),
                    static_cast<unsigned>(p.parts));
    cudaError_t e;
    switch (d.G) {
    case 8: e = launch_g<8>(d, grid, stream); break;
    case 4: e = launch_g<4>(d, grid, stream); break;
    case 2: e = launch_g<2>(d, grid, stream); break;
    default: e = launch_g<1>(d, grid, stream); break;
    }
    if (e != cudaSuccess) return e;
    merge_kernel<<<dim3(static_cast<unsigned>(a->n_q), static_cast<unsigned>(a->n_heads)), kThreads,
                   0, stream>>>(d);
    return cudaGetLastError();
}
