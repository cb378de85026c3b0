/* The batched forward pass: one readable loop over layers (llama2.c's shape) that calls
 * backend ops only. A batch holds chunks of several sequences (prefill chunks and decode
 * tokens mixed); logits are computed only for the rows that ask for them. */
#ifndef TSR_RUNTIME_FORWARD_H
#define TSR_RUNTIME_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/model.h"

typedef struct tsr_batch_seq {
    int seq;               /* KV-cache sequence id */
    const int32_t *tokens; /* chunk of tokens appended at the sequence's current length */
    int32_t n_tokens;
    bool want_logits;      /* logits for the chunk's last token */
    bool all_logits;       /* logits for every token of the chunk (tests, perplexity) */
} tsr_batch_seq;

typedef struct tsr_forward tsr_forward;

/* max_tokens: the most tokens one call may carry (the prefill chunk size). */
tsr_status tsr_forward_create(const tsr_model *m, tsr_backend *be, int max_tokens,
                              tsr_forward **out);
void tsr_forward_destroy(tsr_forward *f);

/* Runs the batch: appends each chunk to its sequence in `kv` (reserve + write + commit)
 * and writes logits rows, in batch order, to `logits` ([rows][vocab]); *n_rows gets the
 * count. `logits` must hold max_tokens rows when any seq asks all_logits, else one row per
 * sequence. */
tsr_status tsr_forward_run(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                           int n_seqs, float *logits, int *n_rows);

/* Bytes of scratch the forward holds for max_tokens (admission budgets it). */
size_t tsr_forward_workspace_bytes(const tsr_model_config *c, int max_tokens);

#endif
