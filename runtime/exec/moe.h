/* The mixture-of-experts block of GPT-OSS in the forward pass: the router on the backend
 * (matmul + bias), its logits to the host, top-k and the softmax over the k there, the
 * routes grouped by expert, then the backend's `moe` op (kernels/backend.h tsr_moe_args),
 * which reads each expert's weights once for all of its tokens.
 *
 * Expert parallelism (--ep N): the experts are spread over the ranks of the
 * tensor-parallel group (N = tp), E / N contiguous experts each (tsr_parallel_shard's
 * expert range). Every rank routes all rows (the router is small and replicated), owns a
 * contiguous share of the rows, sends their hidden states to the ranks of their experts
 * (tsr_comm_alltoallv), runs its experts over all the rows routed to them, sends the
 * outputs back, adds its rows' weighted outputs in expert order and all-gathers the rows.
 * Each expert sees the same rows in the same order as in one process and the sum keeps
 * the kernel's order, so on the CPU backends the output is one process's bit for bit. */
#ifndef TSR_RUNTIME_EXEC_MOE_H
#define TSR_RUNTIME_EXEC_MOE_H

#include "comm/comm.h"
#include "kernels/backend.h"
#include "runtime/exec/parallel.h"
#include "runtime/model/model.h"

typedef struct tsr_moe tsr_moe;

/* For up to max_tokens rows per call; refuses a backend without the `moe` op by name.
 * sh NULL or holding every expert: all experts here; a partial expert range: expert
 * parallelism over comm's TP group, whose every rank must call tsr_moe_run with the same
 * rows (the layers' experts may be cut to the range, tsr_moe_shard_experts, or whole). */
tsr_status tsr_moe_create(tsr_backend *be, const tsr_model_config *c, int max_tokens,
                          tsr_comm *comm, const tsr_parallel_shard *sh, tsr_moe **out);

/* Cuts x to a view of experts [begin, end) (no copy). */
tsr_status tsr_moe_shard_experts(tsr_experts *x, int begin, int end);
void tsr_moe_destroy(tsr_moe *mo);

/* The block's output for n rows of normed input xb ([n][dim], backend memory), in *out
 * ([n][dim], backend memory owned by mo, valid until the next call). */
tsr_status tsr_moe_run(tsr_moe *mo, const tsr_layer_weights *w, const float *xb, int64_t n,
                       const float **out);

/* One token's routing as transformers' GptOssTopKRouter: the k largest logits (the lower
 * index first among equals), in descending order, into idx; softmax over those k into wts. */
void tsr_moe_route(const float *logits, int n_experts, int k, int32_t *idx, float *wts);

#endif
