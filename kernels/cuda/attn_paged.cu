/* Batched paged attention (the op attention_paged, kernels/backend.h): one launch for every
 * query row of a step, the block tables, key counts and positions read from device memory,
 * so that the step stages nothing and a CUDA Graph can capture it.
 *
 * One block per (query row, query head), one warp per key in flight: warp w takes keys
 * w, w + warps, ... of the row's sequence, each lane holds head_dim / 32 (rounded up) of
 * the query and of its running output, and keeps an online softmax (running max and
 * sum); the warps' partial states are merged through shared memory at the end. FP32
 * throughout, the arithmetic of attn.cu's per-(query, head) kernel; the split-K and
 * tensor-core variants of issue 24 item 3 replace it later. GPT-OSS: a sliding window
 * starts the row's keys at position qp - window + 1 (key j is position j here), and the
 * head's sink logit joins the merged denominator once. */
#include <math.h>

#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/launch.h"

#define TSR__AP_WARPS 4
#define TSR__AP_PER_LANE (TSR__CUDA_MAX_HEAD_DIM / 32)

__global__ void tsr__attn_paged_kernel(tsr__cuda_attn_paged a) {
    const int r = blockIdx.x, h = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hd = a.head_dim, per = (hd + 31) / 32;
    const int group = a.n_heads / a.n_kv_heads, kvh = h / group;
    const int s = a.q_seq[r];
    const int32_t qp = a.q_pos[r];
    int32_t nk = a.n_keys[s];
    if (nk > qp + 1) nk = qp + 1; /* causal: keys at positions <= the query's */
    int32_t j0 = 0;               /* window: keys at positions > qp - window */
    if (a.window > 0 && qp - a.window + 1 > 0) j0 = qp - a.window + 1;
    const float *q = a.q + ((size_t)r * a.n_heads + h) * hd;
    float qv[TSR__AP_PER_LANE], acc[TSR__AP_PER_LANE];
    for (int i = 0; i < per; i++) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? q[d] * a.scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int32_t *tb = a.tables + (size_t)s * a.max_blocks;
    for (int32_t j = j0 + warp; j < nk; j += TSR__AP_WARPS) {
        /* the stored row (any KV dtype, kv_codec.cuh), element kvh * hd + d of it */
        int64_t at = (int64_t)tb[j / a.lay.block] * a.lay.block_stride +
                     (int64_t)(j % a.lay.block) * a.lay.row;
        const uint8_t *k = tsr_kv::row_at(a.lay.k, a.lay.dtype, a.lay.row, at);
        const uint8_t *v = tsr_kv::row_at(a.lay.v, a.lay.dtype, a.lay.row, at);
        const int64_t c0 = (int64_t)kvh * hd;
        float dot = 0.0f;
        for (int i = 0; i < per; i++) {
            int d = lane + 32 * i;
            if (d < hd) dot += qv[i] * tsr_kv::load(k, a.lay.dtype, c0 + d);
        }
        for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float mn = fmaxf(m, dot), corr = expf(m - mn), p = expf(dot - mn);
        l = l * corr + p;
        for (int i = 0; i < per; i++) {
            int d = lane + 32 * i;
            acc[i] = acc[i] * corr + (d < hd ? p * tsr_kv::load(v, a.lay.dtype, c0 + d) : 0.0f);
        }
        m = mn;
    }
    /* merge the warps: each one's max, sum and output in shared memory */
    __shared__ float sm[TSR__AP_WARPS], sl[TSR__AP_WARPS];
    __shared__ float so[TSR__AP_WARPS][TSR__CUDA_MAX_HEAD_DIM];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int i = 0; i < per; i++) {
        int d = lane + 32 * i;
        if (d < hd) so[warp][d] = acc[i];
    }
    __syncthreads();
    const float sink = a.sinks ? a.sinks[h] : -INFINITY;
    float M = sink;
    for (int w = 0; w < TSR__AP_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = sink > -INFINITY ? expf(sink - M) : 0.0f;
    for (int w = 0; w < TSR__AP_WARPS; w++)
        if (sm[w] > -INFINITY) L += sl[w] * expf(sm[w] - M);
    float *out = a.out + ((size_t)r * a.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < TSR__AP_WARPS; w++)
            if (sm[w] > -INFINITY) o += so[w][d] * expf(sm[w] - M);
        out[d] = L > 0.0f ? o / L : 0.0f;
    }
}

extern "C" cudaError_t tsr__cuda_launch_attention_paged(const tsr__cuda_attn_paged *a,
                                                        cudaStream_t stream) {
    if (a->n_q <= 0) return cudaSuccess;
    dim3 grid((unsigned)a->n_q, (unsigned)a->n_heads);
    tsr__attn_paged_kernel<<<grid, 32 * TSR__AP_WARPS, 0, stream>>>(*a);
    return cudaGetLastError();
}
