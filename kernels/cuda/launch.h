/* Launchers of the CUDA kernels (ops.cu, attn.cu), callable from the backend's C host code.
 * Each enqueues on `stream` and returns the launch status (cudaGetLastError), never
 * synchronizing; all pointers are device pointers unless a comment says otherwise. Dtype
 * arguments carry tsr_dtype values (base/dtype.h). */
#ifndef TSR_KERNELS_CUDA_LAUNCH_H
#define TSR_KERNELS_CUDA_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim the attention kernel supports (its per-thread accumulator size). */
#define TSR__CUDA_MAX_HEAD_DIM 1024

/* One tsr_kv_span as the attention kernel reads it: the device copy of the host array,
 * plus the index of its first key among all keys of the call (for key_scores). */
typedef struct tsr__cuda_span {
    const float *k;
    const float *v;
    const int32_t *pos; /* NULL: contiguous from pos0 */
    int64_t stride;     /* floats between rows */
    int64_t key_off;    /* keys in the spans before this one */
    int32_t pos0;
    int32_t n;
    int32_t dtype;      /* tsr_kv_dtype of k and v (kernels/kv_dtype.h); attention reads
                         * f32 rows: tsr__cuda_launch_attention converts the others first */
} tsr__cuda_span;

typedef struct tsr__cuda_attn {
    const float *q;
    const int32_t *q_pos;
    int n_q;
    const tsr__cuda_span *spans; /* device array */
    int n_spans;
    int64_t n_keys; /* sum of spans' n */
    /* Non-zero when every span is contiguous (pos NULL) and positions increase across
     * spans: the kernel then stops at the first key past the query's position. */
    int monotone;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    float scale;
    float *out;
    float *key_scores; /* NULL or [n_heads][n_keys], added to */
    /* Multiprocessors of the device: the split-K decode path sizes its key chunks so that
     * one sequence fills them. */
    int sm_count;
    /* Device scratch of tsr__cuda_attention_work(a) floats (the split-K partials, then with
     * dq the f32 copies of the K/V rows), or NULL when that is 0. */
    float *work;
    /* Non-zero when some span is not f32: the launch converts every span's rows into work
     * and points the (device) spans there before the attention kernels. */
    int dq;
    /* GPT-OSS (tsr_attn_args): sinks NULL or [n_heads] device logits that join each
     * query's softmax denominator once (the split path adds them in the merge, never per
     * chunk); window > 0: a query at position p sees keys at positions > p - window. */
    const float *sinks;
    int window;
} tsr__cuda_attn;

/* tsr_kv_layout (kernels/backend.h) as the KV row kernels take it: slot s's K row is at
 * k + (s / block) * block_stride + (s % block) * row floats, its V row at the same offset
 * from v (device pointers). A copy, so that the .cu files need not include backend.h. */
typedef struct tsr__cuda_kv {
    float *k;
    float *v;
    int64_t block_stride;
    int32_t block;
    int32_t row;
    int32_t dtype; /* tsr_kv_dtype: offsets count whole rows of its bytes (kv_codec.cuh) */
} tsr__cuda_kv;

/* KV rows by slot (kv.cu); slot lists are device arrays of n int32. put: row i of k and v
 * ([n][row], either may be NULL: that half is skipped) goes to slot slots[i]. get: row i
 * of k and v (either may be NULL) gets slot slots[i]'s rows. copy: slot dst[i] gets slot
 * src[i]'s rows, pairs applied strictly in list order (one block; see kv.cu). */
cudaError_t tsr__cuda_launch_kv_put(const tsr__cuda_kv *l, const int32_t *slots, int64_t n,
                                    const float *k, const float *v, cudaStream_t stream);
cudaError_t tsr__cuda_launch_kv_get(const tsr__cuda_kv *l, const int32_t *slots, int64_t n,
                                    float *k, float *v, cudaStream_t stream);
cudaError_t tsr__cuda_launch_kv_copy(const tsr__cuda_kv *l, const int32_t *dst,
                                     const int32_t *src, int64_t n, cudaStream_t stream);
/* The op qkv_rope (kernels/backend.h, tsr_qkv_rope_args) on the device (kv.cu), one block
 * per token: row i of qkv ([n][(nh + 2 nkv) * hd]) plus bias (NULL: none; f32), each head
 * RMS-normed with q_norm / k_norm (NULL: none; f32, wdtype TSR_F32; eps), q and k rotated at pos[i]
 * with inv_freq (hd / 2, device) and cos_scale (1, or YaRN's attention factor); q to q
 * ([n][nh * hd]); k and v to slot slots[i] of l when l is non-NULL, else to k and v
 * ([n][nkv * hd]). pos and slots are device arrays. */
cudaError_t tsr__cuda_launch_qkv_rope(const float *qkv, int64_t n, int nh, int nkv, int hd,
                                      const int32_t *pos, const float *inv_freq,
                                      float cos_scale, int interleaved, const float *bias,
                                      const void *q_norm, const void *k_norm, int wdtype,
                                      float eps, float *q, const tsr__cuda_kv *l,
                                      const int32_t *slots, float *k, float *v,
                                      cudaStream_t stream);

/* out[i] = f32(emb[ids[i]]); an id outside [0, rows) writes zeros and sets *bad_id = 1. */
cudaError_t tsr__cuda_launch_embed(const void *emb, int dtype, int64_t rows, int64_t cols,
                                   const int32_t *ids, int64_t n, float *out, int *bad_id,
                                   cudaStream_t stream);
/* out[i] = x[i] / rms(x[i]) * w for n rows of dim (out may equal x); w has dtype wdtype. */
cudaError_t tsr__cuda_launch_rmsnorm(const float *x, const void *w, int wdtype, int64_t n, int dim,
                                     float eps, float *out, cudaStream_t stream);
/* rmsnorm that also writes its rows rounded to BF16 into out16 ([n][dim]): the next BF16
 * GEMM's input (rmsnorm_matmul). */
cudaError_t tsr__cuda_launch_rmsnorm_bf16(const float *x, const void *w, int wdtype, int64_t n,
                                          int dim, float eps, float *out, void *out16,
                                          cudaStream_t stream);
/* In-place rotary embedding; inv_freq holds head_dim/2 frequencies (device); cos and sin
 * are multiplied by cos_scale (YaRN's attention factor, else 1: exact). */
cudaError_t tsr__cuda_launch_rope(float *x, const int32_t *pos, int64_t n, int n_heads,
                                  int head_dim, const float *inv_freq, int interleaved,
                                  float cos_scale, cudaStream_t stream);
cudaError_t tsr__cuda_launch_swiglu(float *gate, const float *up, int64_t n, cudaStream_t stream);
/* y[r] = w[r] . x for one f32 input row and a BF16 [rows, cols] w (decode at batch 1,
 * without cuBLAS; backend_cuda.c takes it under TSR_CUDA_GEMV=1). */
cudaError_t tsr__cuda_launch_gemv_bf16(const void *w, int64_t rows, int64_t cols,
                                       const float *x, float *y, cudaStream_t stream);
/* out[r][j] = silu(gu[r][j]) * gu[r][hidden + j] for n rows of the fused gate/up product
 * ([n][2 * hidden]); out [n][hidden], f32, or BF16 when out_dtype is TSR_BF16 (the next
 * GEMM's input as it reads it). */
cudaError_t tsr__cuda_launch_swiglu_fused(const float *gu, int64_t n, int hidden, void *out,
                                          int out_dtype, cudaStream_t stream);
cudaError_t tsr__cuda_launch_add(float *x, const float *y, int64_t n, cudaStream_t stream);
/* y[i] = ((parts[i] + parts[m + i]) + parts[2m + i]) + ... over n_parts parts of m floats:
 * the ordered sum of matmul_parts, one launch; accumulate: y[i] += that sum (the residual
 * add of matmul_parts_acc). */
cudaError_t tsr__cuda_launch_sum_parts(float *y, const float *parts, int n_parts, int64_t m,
                                       int accumulate, cudaStream_t stream);
/* dst[i] = (dtype) src[i], round to nearest even (BF16 or F16) */
cudaError_t tsr__cuda_launch_convert_f32(void *dst, int dtype, const float *src, int64_t n,
                                         cudaStream_t stream);
/* Causal GQA attention with an online softmax (attn.cu). `a` itself is host memory. The
 * launcher picks the kernel: split-K over the key range (flash-decoding) for a few queries
 * over many keys, query tiles with K/V tiles in shared memory for prefill, else one block
 * per (query, head). */
cudaError_t tsr__cuda_launch_attention(const tsr__cuda_attn *a, cudaStream_t stream);
/* Floats of device scratch the call `a` (its geometry and sm_count) needs in a->work: the
 * split-K path's per-chunk partials; 0 for the other paths. */
size_t tsr__cuda_attention_work(const tsr__cuda_attn *a);

/* tsr_attn_paged_args (kernels/backend.h) as attn_paged.cu reads it: every array is
 * device memory; scale = 1 / sqrt(head_dim). */
typedef struct tsr__cuda_attn_paged {
    const float *q;
    float *out;
    int n_q, n_heads, n_kv_heads, head_dim;
    float scale;
    tsr__cuda_kv lay;
    const int32_t *q_pos, *q_seq, *n_keys, *tables;
    int n_seqs, max_blocks;
    const float *sinks; /* as in tsr__cuda_attn: NULL or [n_heads] (device) */
    int window;
} tsr__cuda_attn_paged;
/* One launch for every query row and head of a step (attn_paged.cu). */
cudaError_t tsr__cuda_launch_attention_paged(const tsr__cuda_attn_paged *a,
                                             cudaStream_t stream);

/* One projection of a mixture-of-experts layer as mxfp4.cu reads it (tsr_experts,
 * base/tensor.h): expert e's rows are rows e * rows .. of the stacked matrix w (MXFP4: U8
 * codes [n * rows][cols / 2] and E8M0 scales [n * rows][cols / 32]; else dtype F32, BF16
 * or F16 [n * rows][cols]); bias NULL or f32 [n][rows]. */
typedef struct tsr__cuda_experts {
    const void *w;
    const uint8_t *scales;
    const float *bias;
    int64_t rows, cols;
    int dtype;
    int mxfp4;
} tsr__cuda_experts;
/* For each active expert i (list[3i] the expert, its routes list[3i + 1] .. + list[3i + 2],
 * a device array): y[r][rows] = x[r][cols] . W_e^T + b_e for those routes r, each expert's
 * weights read once for up to 8 routes (mxfp4.cu). */
cudaError_t tsr__cuda_launch_experts_matmul(const tsr__cuda_experts *w, const int32_t *list,
                                            int n_active, const float *x, float *y,
                                            cudaStream_t stream);
/* moe.cu: xg[r] = x[rows[r]] for nr routes of dim floats; act[r][j] = the clamped GPT-OSS
 * gate of gu[r] ([nr][2 * inter], gate/up interleaved); out[t] = sum over tok_routes[tok_off[t]
 * .. tok_off[t + 1]) of weights[r] * y[r] (in that order, from 0). */
/* x[r][j] += b[j] for n rows of width, one launch (the op bias_add: GPT-OSS's q/k/v/o and
 * router biases over a whole prefill chunk). */
cudaError_t tsr__cuda_launch_bias_rows(float *x, const float *b, int64_t n, int64_t width,
                                       cudaStream_t stream);
cudaError_t tsr__cuda_launch_moe_gather(const float *x, int64_t dim, const int32_t *rows,
                                        int64_t nr, float *xg, cudaStream_t stream);
cudaError_t tsr__cuda_launch_moe_act(const float *gu, int64_t nr, int64_t inter, float limit,
                                     float alpha, float *act, cudaStream_t stream);
cudaError_t tsr__cuda_launch_moe_combine(const float *y, int64_t dim, const int32_t *tok_off,
                                         const int32_t *tok_routes, const float *weights,
                                         int64_t n, float *out, cudaStream_t stream);

/* tsr_sample_params (kernels/backend.h) as the sample kernels read it (sample.cu). */
typedef struct tsr__cuda_sample_row {
    float temperature;
    float top_p;
    int32_t top_k;
    float r;
} tsr__cuda_sample_row;

/* Bytes of device scratch tsr__cuda_launch_sample needs for n rows of vocab tokens (0 when
 * no row has top-k or top-p: `sorts` false). */
size_t tsr__cuda_sample_work(int64_t n, int vocab, int sorts);
/* ids[i] (device) = the token drawn from row i of logits (overwritten) with par[i] (device);
 * sorts: some row has top-k or top-p (work then has tsr__cuda_sample_work bytes). */
cudaError_t tsr__cuda_launch_sample(float *logits, int64_t n, int vocab,
                                    const tsr__cuda_sample_row *par, int sorts, int32_t *ids,
                                    void *work, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
