/* Launchers of the tensor-core attention kernels (flash_attn.cu: prefill; attn_decode.cu:
 * paged split-K decode), callable from the backend's C host code. Both need sm_80 or newer
 * (mma.sync BF16, cp.async); the backend checks the device and keeps attn.cu and
 * attn_paged.cu for older ones and for TSR_CUDA_ATTN=reference. Each enqueues on `stream`
 * and returns the launch status, never synchronizing. */
#ifndef TSR_KERNELS_CUDA_FLASH_ATTN_H
#define TSR_KERNELS_CUDA_FLASH_ATTN_H

#include <stddef.h>

#include "kernels/cuda/launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the flash prefill serves call `a` (head_dim 64 or 128, enough query rows to fill
 * a tile); the backend sends the others to attn.cu. */
int tsr__cuda_flash_prefill_fits(const tsr__cuda_attn *a);
/* Bytes of device scratch the flash prefill of `a` needs: the K/V rows of the call packed as
 * BF16 per kv head, their positions and per-tile position bounds, and with key_scores the
 * BF16 queries and each row's log-sum-exp for the second pass. */
size_t tsr__cuda_flash_prefill_work(const tsr__cuda_attn *a);
/* Causal GQA attention of `a` (spans as attn.cu reads them, any KV dtype) on BF16 tensor
 * cores with FP32 accumulation. sinks: [n_heads] logits on the device or NULL; window > 0:
 * keys at positions > q_pos - window only. work: tsr__cuda_flash_prefill_work(a) bytes. When
 * a->key_scores is set, a second pass adds each key's probability summed over the queries
 * (recomputed from the saved log-sum-exp; deterministic, no atomics). */
cudaError_t tsr__cuda_flash_prefill(const tsr__cuda_attn *a, const float *sinks, int window,
                                    void *work, cudaStream_t stream);

/* The flash prefill over a paged layout, for attention_paged calls of one sequence (a
 * prefill chunk: the rows of several sequences would need the host to know which rows are
 * whose, and it does not without a download). Its keys come from the block table, their
 * count read on the device; the scratch is sized for max_blocks * block keys. */
int tsr__cuda_flash_paged_fits(const tsr__cuda_attn_paged *a);
size_t tsr__cuda_flash_paged_work(const tsr__cuda_attn_paged *a);
cudaError_t tsr__cuda_flash_prefill_paged(const tsr__cuda_attn_paged *a, const float *sinks,
                                          int window, void *work, cudaStream_t stream);

/* Split-K paged decode: the partitions of the grid and the bytes of scratch for a call of
 * n_q rows, n_heads heads, head_dim, at most max_keys keys per sequence on sm_count
 * multiprocessors. */
typedef struct tsr__cuda_decode_plan {
    int part;  /* keys per partition (a multiple of 64) */
    int parts; /* partitions of the longest sequence */
} tsr__cuda_decode_plan;
tsr__cuda_decode_plan tsr__cuda_decode_plan_for(const tsr__cuda_attn_paged *a, int sm_count);
size_t tsr__cuda_decode_work(const tsr__cuda_attn_paged *a, tsr__cuda_decode_plan p);
/* Whether the split-K decode serves `a` (head_dim a multiple of 8, at most 256). */
int tsr__cuda_decode_fits(const tsr__cuda_attn_paged *a);
/* attention_paged by partitions of keys, several keys in flight per warp and 16-byte loads
 * (f32 and bf16 KV; q8 and fp8 through the codec), then a merge kernel that adds the sink
 * (sinks, window as for the prefill). work: tsr__cuda_decode_work bytes. */
cudaError_t tsr__cuda_decode_paged(const tsr__cuda_attn_paged *a, const float *sinks, int window,
                                   tsr__cuda_decode_plan p, void *work, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
