/* Continuous batching. Requests wait in a FIFO queue and join the running set (at most
 * max_seqs) as others finish; every step builds one forward batch in which each decoding
 * sequence contributes its one new token and prefilling sequences contribute prompt chunks,
 * so that a step never carries more than max_tokens tokens (chunked prefill mixed with
 * decode). Each request has its own sampler (seeded per request), so its tokens do not
 * depend on its batch neighbours. KV memory is used only through memory/kv_cache.h ops: a
 * cache that is short (TSR_ERR_NO_BLOCKS) defers admission, and when a running sequence
 * cannot grow the newest one is preempted: by recompute (its KV dropped, its tokens
 * prefilled again later) or by swap (its KV moved to the host pool and brought back intact
 * before any new request is admitted). */
#ifndef TSR_RUNTIME_SCHEDULER_H
#define TSR_RUNTIME_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "memory/kv_cache.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/sampler.h"

typedef enum tsr_finish_reason {
    TSR_FINISH_NONE = 0, /* still running */
    TSR_FINISH_EOS,      /* the model produced an end-of-sequence token (not reported) */
    TSR_FINISH_LENGTH,   /* max_new_tokens generated */
    TSR_FINISH_CONTEXT,  /* the context is full */
    TSR_FINISH_ERROR,    /* can never fit the KV cache (TSR_ERR_BUDGET from reserve): a
                          * sequence larger than the whole pool. tsr_kv_setup refuses
                          * pools that cannot hold one full context at start, so with its
                          * caches every request that fits the context finishes, however
                          * often the others are preempted for it. */
} tsr_finish_reason;

/* How a preempted sequence gives up its KV (docs/kv-cache.md, "Preemption"). */
typedef enum tsr_sched_preempt {
    TSR_PREEMPT_RECOMPUTE = 0, /* drop it; prefill its tokens again when readmitted */
    TSR_PREEMPT_SWAP,          /* move it to the host pool (kv ops swap_out / swap_in); a
                                * sequence the host pool has no room for, or a cache that
                                * cannot swap, is recomputed instead (counted as a fallback) */
} tsr_sched_preempt;

typedef struct tsr_sched_config {
    int max_seqs;    /* running sequences at most (KV sequence ids 0 .. max_seqs-1) */
    int max_tokens;  /* tokens per forward call at most; >= max_seqs */
    int max_context; /* positions per sequence, prompt included */
    int vocab_size;  /* logits row width */
    int n_eos;       /* ids that end generation */
    int32_t eos_ids[9];
    tsr_sched_preempt preempt;
} tsr_sched_config;

/* Runs one batch (tsr_forward_run's contract). Tests pass their own. */
typedef tsr_status (*tsr_sched_exec_fn)(void *ctx, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                                        int n_seqs, float *logits, int *n_rows);

/* exec_ctx is a tsr_forward *. */
tsr_status tsr_sched_exec_forward(void *exec_ctx, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                                  int n_seqs, float *logits, int *n_rows);

typedef struct tsr_sched_request {
    uint64_t tag;           /* the caller's handle, echoed in events */
    const int32_t *prompt;  /* copied at submit */
    int32_t n_prompt;       /* 1 .. max_context-1 */
    int32_t max_new_tokens; /* >= 0 */
    tsr_sampler_params sampling;
} tsr_sched_request;

typedef struct tsr_sched_event {
    uint64_t tag;
    int32_t token;            /* the new token; -1 when the event carries none */
    int32_t n_generated;      /* tokens generated so far (EOS not counted) */
    tsr_finish_reason finish; /* TSR_FINISH_NONE while the request goes on */
    /* TSR_FINISH_EOS: the end-of-sequence token that ended it (harmony's <|return|> and
     * <|call|> differ), not in `token`; -1 otherwise */
    int32_t eos;
} tsr_sched_event;

typedef struct tsr_sched_step_info {
    int n_seqs;           /* sequences in the batch */
    int n_tokens;         /* tokens in the batch */
    int n_decode;         /* sequences contributing one decode token */
    int n_prefill;        /* sequences contributing a prefill chunk */
    int n_preempted;      /* sequences preempted during this step */
    int n_admitted;       /* sequences that joined the running set */
    int n_swapped_out;    /* of the preempted, those swapped to the host pool */
    int n_swapped_in;     /* swapped sequences that came back (not in n_admitted) */
} tsr_sched_step_info;

typedef struct tsr_sched_totals {
    int64_t steps, batch_tokens, prefill_tokens, decode_tokens, preemptions;
    int max_running;      /* largest running set seen */
    /* preemption by swap: sequences swapped out and back in, the host bytes they moved
     * each way, and preemptions that fell back to recompute (host pool short) */
    int64_t swaps_out, swaps_in, swap_out_bytes, swap_in_bytes, swap_fallbacks;
} tsr_sched_totals;

typedef struct tsr_sched tsr_sched;

/* kv must have room for max_seqs sequences; the scheduler does not own kv or exec_ctx. */
tsr_status tsr_sched_create(const tsr_sched_config *cfg, tsr_kv_cache *kv, tsr_sched_exec_fn exec,
                            void *exec_ctx, tsr_sched **out);
void tsr_sched_destroy(tsr_sched *s);

/* Queues a request (TSR_ERR_BUDGET when its prompt leaves no room in the context). */
tsr_status tsr_sched_submit(tsr_sched *s, const tsr_sched_request *r);

/* Ends a request between steps (a stop string matched): frees its KV, no more events.
 * Returns false when the tag is unknown or already finished. */
bool tsr_sched_finish(tsr_sched *s, uint64_t tag);

/* Keeps each step's logits in backend memory on the last pipeline stage of f (the forward
 * this scheduler executes through tsr_sched_exec_forward): the backend's sample op draws
 * them (tsr_forward_sample, the same tokens as the host's sampler) and only the token ids
 * come to the host and cross the stage boundaries, 4 bytes a row instead of 4 V
 * (runtime/exec/forward.h). Without it the exec's logits come to the host and are sampled
 * there. Every rank of the job calls it, or none. */
tsr_status tsr_sched_sample_last_stage(tsr_sched *s, tsr_forward *f);

/* Waiting requests, the swapped-out ones included (they resume first). */
int tsr_sched_n_waiting(const tsr_sched *s);
int tsr_sched_n_running(const tsr_sched *s);
static inline bool tsr_sched_has_work(const tsr_sched *s) {
    return tsr_sched_n_waiting(s) + tsr_sched_n_running(s) > 0;
}

/* Admits, runs one batch, samples, and reports one event per sequence that produced a
 * token or finished. *events is owned by the scheduler, valid until the next call. A
 * non-OK status is fatal (the forward failed); info may be NULL. */
tsr_status tsr_sched_step(tsr_sched *s, const tsr_sched_event **events, int *n_events,
                          tsr_sched_step_info *info);

void tsr_sched_get_totals(const tsr_sched *s, tsr_sched_totals *out);

/* --- checkpoints ---------------------------------------------------------------------- */

/* A request's whole state between steps, as a checkpoint saves it. */
typedef struct tsr_sched_saved {
    uint64_t tag;
    const int32_t *tokens;  /* prompt + generated [n_tokens] */
    int32_t n_tokens, n_prompt;
    int32_t n_computed;     /* tokens the KV cache holds (0 when waiting) */
    int32_t n_generated, max_new_tokens;
    tsr_sampler_params sampling;
    uint64_t rng;           /* the sampler's state when sampler_ready */
    int sampler_ready;      /* 0: never admitted, the sampler starts from the seed */
    int slot;               /* KV sequence id when running, -1 when waiting */
} tsr_sched_saved;

/* Running plus waiting requests: what tsr_sched_export reports. */
static inline int tsr_sched_n_requests(const tsr_sched *s) {
    return tsr_sched_n_waiting(s) + tsr_sched_n_running(s);
}
/* Fills out[0 .. n) (n = tsr_sched_n_requests) with the running requests in admission
 * order, then the swapped-out ones (as waiting: slot -1, recomputed when imported), then
 * the waiting ones front to back. tokens point into the scheduler, valid
 * until the next step, finish or import. Call between steps. */
void tsr_sched_export(const tsr_sched *s, tsr_sched_saved *out);
/* Adds a saved request (tokens copied), in export order: slot >= 0 joins the running set
 * as its newest member and must name a KV sequence that already holds exactly n_computed
 * tokens (restored by the caller); slot < 0 joins the back of the waiting queue. Checks
 * the request against the scheduler's limits (TSR_ERR_INVALID). */
tsr_status tsr_sched_import(tsr_sched *s, const tsr_sched_saved *r);

#endif
