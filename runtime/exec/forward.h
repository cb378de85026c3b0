/* The batched forward pass: one readable loop over layers (llama2.c's shape) that calls
 * backend ops only. A batch holds chunks of several sequences (prefill chunks and decode
 * tokens mixed); logits are computed only for the rows that ask for them. */
#ifndef TSR_RUNTIME_FORWARD_H
#define TSR_RUNTIME_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/exec/sampler.h"
#include "runtime/exec/parallel.h"

typedef struct tsr_batch_seq {
    int seq;               /* KV-cache sequence id */
    const int32_t *tokens; /* chunk of tokens appended at the sequence's current length */
    int32_t n_tokens;
    bool want_logits;      /* logits for the chunk's last token */
    bool all_logits;       /* logits for every token of the chunk (tests, perplexity) */
} tsr_batch_seq;

typedef struct tsr_forward tsr_forward;

/* Where this rank stands in a tp x pp job. */
typedef struct tsr_forward_parallel {
    tsr_comm *comm;           /* with its layout set; NULL: a single process */
    tsr_parallel_shard shard; /* what this rank computes; m must be cut to it
                               * (tsr_parallel_shard_model) */
    int micro_batches;        /* pipeline micro-batches per call (0: pp) */
} tsr_forward_parallel;

/* max_tokens: the most tokens one call may carry (the prefill chunk size). The whole model
 * on one process. */
tsr_status tsr_forward_create(const tsr_model *m, tsr_backend *be, int max_tokens,
                              tsr_forward **out);

/* One rank's part of a distributed forward pass (par NULL: tsr_forward_create). Every rank
 * of the job calls tsr_forward_run with the same batch: the first stage embeds, each stage
 * runs its layers on micro-batches of sequences and passes the activations on with
 * non-blocking sends, the TP ranks of a stage all-reduce after wo and w_down in canonical
 * part order (bit-identical to one process), and the last stage's logits are broadcast
 * to every stage. `kv` holds this rank's layers and KV heads. Micro-batching changes the
 * row counts of the matmuls, so bit-identity with one process holds for one micro-batch
 * (one sequence, or micro_batches = 1). */
tsr_status tsr_forward_create_parallel(const tsr_model *m, tsr_backend *be, int max_tokens,
                                       const tsr_forward_parallel *par, tsr_forward **out);
void tsr_forward_destroy(tsr_forward *f);

/* Runs the batch: appends each chunk to its sequence in `kv` (reserve + write + commit)
 * and writes logits rows, in batch order, to `logits` ([rows][vocab], host memory: the
 * classifier runs into a backend buffer and its rows are downloaded); *n_rows gets the
 * count. `logits` must hold max_tokens rows when any seq asks all_logits, else one row per
 * sequence. logits NULL: the rows stay in backend memory for tsr_forward_sample. */
tsr_status tsr_forward_run(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                           int n_seqs, float *logits, int *n_rows);

/* Sampling on the last pipeline stage. By default the last stage broadcasts each call's
 * logits ([rows][vocab], 4 V bytes a row) to the earlier stages so that every rank can
 * sample. After tsr_forward_sample_last_stage(f, true) the logits stay on the last stage:
 * a caller samples where tsr_forward_has_logits, advances its samplers elsewhere
 * (tsr_sampler_skip), and then every rank calls tsr_forward_share_tokens with the same
 * count, which broadcasts the last stage's token ids (4 bytes a row) to its pipeline. */
void tsr_forward_sample_last_stage(tsr_forward *f, bool on);
bool tsr_forward_has_logits(const tsr_forward *f);
tsr_status tsr_forward_share_tokens(tsr_forward *f, int32_t *ids, int n);

/* Sampling on the backend (its op `sample`, kernels/backend.h): tsr_forward_run with
 * logits NULL leaves the rows' logits in backend memory (nothing is downloaded; with
 * pp > 1 only after tsr_forward_sample_last_stage, on the last stage); then
 * tsr_forward_sample draws row i with samplers[i] (its RNG advances as tsr_sampler_sample
 * would; n_rows as tsr_forward_run returned) and writes the token ids to ids (host). Only
 * the ids leave the device; on the CPU backends the tokens are tsr_sampler_sample's bit for
 * bit. A backend without the op gets the logits downloaded and sampled on the host. */
tsr_status tsr_forward_sample(tsr_forward *f, tsr_sampler *const *samplers, int n_rows,
                              int32_t *ids);

/* Bytes of scratch the forward holds for max_tokens (admission budgets it). */
size_t tsr_forward_workspace_bytes(const tsr_model_config *c, int max_tokens);

#endif
