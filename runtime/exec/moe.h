/* The mixture-of-experts block of GPT-OSS in the forward pass: the router on the backend
 * (matmul + bias), its logits to the host, top-k and the softmax over the k there, the
 * routes grouped by expert, then the backend's `moe` op (kernels/backend.h tsr_moe_args),
 * which reads each expert's weights once for all of its tokens. */
#ifndef TSR_RUNTIME_EXEC_MOE_H
#define TSR_RUNTIME_EXEC_MOE_H

#include "kernels/backend.h"
#include "runtime/model/model.h"

typedef struct tsr_moe tsr_moe;

/* For up to max_tokens rows per call; refuses a backend without the `moe` op by name. */
tsr_status tsr_moe_create(tsr_backend *be, const tsr_model_config *c, int max_tokens,
                          tsr_moe **out);
void tsr_moe_destroy(tsr_moe *mo);

/* The block's output for n rows of normed input xb ([n][dim], backend memory), in *out
 * ([n][dim], backend memory owned by mo, valid until the next call). */
tsr_status tsr_moe_run(tsr_moe *mo, const tsr_layer_weights *w, const float *xb, int64_t n,
                       const float **out);

/* One token's routing as transformers' GptOssTopKRouter: the k largest logits (the lower
 * index first among equals), in descending order, into idx; softmax over those k into wts. */
void tsr_moe_route(const float *logits, int n_experts, int k, int32_t *idx, float *wts);

#endif
