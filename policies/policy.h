/* KV-cache policies: one vtable, so that a new policy is one file plus one line in
 * registry.c. A policy decides; the paged cache (memory/kv_paged.h) is the mechanism. A
 * policy decides from small host arrays (positions, scores, queries, its own host copies)
 * and never reads K/V bytes in place: those live in backend memory and reach the host only
 * through the mechanism's gathers or the backend's download. The
 * registry wraps a paged cache into a tsr_kv_cache that calls the policy's hooks in the
 * forward pass's order: admit (seq_add) -> append (before reserve) -> write -> queries ->
 * select (before spans) -> observe (after attention) -> commit. */
#ifndef TSR_POLICIES_POLICY_H
#define TSR_POLICIES_POLICY_H

#include <stdint.h>

#include "comm/comm.h"
#include "memory/host_pool.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"

typedef struct tsr_kv_policy_config {
    /* --kv-budget: > 1 a token count; in (0, 1] a fraction of the sequence (1: 100 %); 0
     * (or a count >= the sequence) keeps everything. */
    double budget;
    double recent;           /* --h2o-recent: share of the budget for recent tokens (0: 0.5) */
    int scores_materialize;  /* --h2o-scores=materialize: the original n x n score matrix */
    int64_t materialize_limit; /* bytes the matrix may take; 0: the available memory */
    int spec_pairs;          /* offload: rotary channel pairs per head to speculate on (0: 4) */
    int measure_recall;      /* offload: also compute exact scores to report recall (slow) */
    int n_heads;             /* query heads */
    int rope_interleaved;    /* rotary pairs (2i, 2i+1) rather than (i, i + hd/2) */
    tsr_host_pool *host;     /* offload: where the full KV lives */
    /* Tensor parallelism: the ranks of the TP group hold different KV heads of the same
     * tokens, so score decisions sum the heads over the group (tsr_kv_policy_sum_heads)
     * and every rank evicts / selects the same tokens. NULL: one process. */
    tsr_comm *comm;
    /* TP ranks [kv_share_begin, kv_share_end) hold this rank's KV heads (several when tp
     * exceeds the KV heads and they are replicated; runtime/parallel.h); each holds part of
     * their query group. Both 0: this rank alone. */
    int kv_share_begin, kv_share_end;
    int owns_host;           /* the cache destroys `host` with itself */
} tsr_kv_policy_config;

/* tsr_kv_policy_stats: memory/kv_cache.h (a cache reports it through detail()). */

/* The rotated queries of the layer call in flight (from the cache's queries hook: host
 * memory), kept by policies that need them at select/observe time; valid until that
 * layer's observe. */
typedef struct tsr_kv_policy_queries {
    const float *q; /* [n][heads * head_dim]; NULL when none */
    const int32_t *pos;
    int n, layer, seq, heads;
} tsr_kv_policy_queries;

static inline void tsr_kv_policy_queries_set(tsr_kv_policy_queries *qs, int layer, int seq,
                                             const float *q, const int32_t *pos, int n,
                                             int heads) {
    *qs = (tsr_kv_policy_queries){.q = q, .pos = pos, .n = n, .layer = layer, .seq = seq,
                                  .heads = heads};
}

/* Non-zero when qs holds queries of (layer, seq). */
static inline int tsr_kv_policy_queries_for(const tsr_kv_policy_queries *qs, int layer,
                                            int seq) {
    return qs->q && qs->layer == layer && qs->seq == seq;
}

typedef struct tsr_kv_policy_ops {
    const char *name;
    int wants_scores;        /* attention must produce key_scores for observe */
    int allows_prefix_cache; /* sharing blocks needs an unmodified layout (paged only) */
    /* `mech` is the paged cache the policy steers (owned by the wrapper). */
    tsr_status (*create)(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech, void **state);
    void (*destroy)(void *state);
    /* All hooks below are optional (NULL: nothing to do). */
    tsr_status (*admit)(void *state, int seq);
    tsr_status (*append)(void *state, int seq, int32_t n);
    /* k, v: the layer's activations, backend memory (download to keep a host copy). */
    tsr_status (*write)(void *state, int layer, int seq, int32_t n, const float *k,
                        const float *v);
    /* q, q_pos: host memory (memory/kv_cache.h). */
    tsr_status (*queries)(void *state, int layer, int seq, const float *q,
                          const int32_t *q_pos, int n_q, int n_heads);
    tsr_status (*select)(void *state, int layer, int seq);
    /* key_scores: host memory. */
    tsr_status (*observe)(void *state, int layer, int seq, const float *key_scores);
    tsr_status (*commit)(void *state, int seq, int32_t n);
    void (*release)(void *state, int seq);
    void (*stats)(const void *state, tsr_kv_policy_stats *out);
} tsr_kv_policy_ops;

/* The policy named `name` ("paged", "h2o", "offload"), or NULL. */
const tsr_kv_policy_ops *tsr_kv_policy_find(const char *name);
/* "paged|h2o|offload", for --help and error lines. */
const char *tsr_kv_policy_names(void);

/* A tsr_kv_cache: a paged cache made from `kcfg`, steered by policy `ops`. */
tsr_status tsr_kv_policy_cache_create(const tsr_kv_policy_ops *ops,
                                      const tsr_kv_policy_config *pcfg,
                                      const tsr_kv_paged_config *kcfg, tsr_kv_cache **out);
/* Non-zero when kv was made by tsr_kv_policy_cache_create. */
int tsr_kv_is_policy(const tsr_kv_cache *kv);
/* The paged cache underneath, and the policy's stats. */
tsr_kv_cache *tsr_kv_policy_mech(const tsr_kv_cache *kv);
void tsr_kv_policy_get_stats(const tsr_kv_cache *kv, tsr_kv_policy_stats *out);
const char *tsr_kv_policy_name(const tsr_kv_cache *kv);

/* out[i] = sum over the heads of the whole TP group, in global head order, of parts[h][i]
 * (this rank gives n_local heads of n floats each): ((h0 + h1) + h2) + ..., so that the
 * per-token scores, and the decisions made from them, are the same bits on every rank and
 * for every tp. out may not alias parts. */
tsr_status tsr_kv_policy_sum_heads(const tsr_kv_policy_config *cfg, const float *parts,
                                   int n_local, size_t n, float *out);

/* The budget in tokens for a sequence of `len` tokens (len when everything is kept). */
int32_t tsr_kv_policy_budget(const tsr_kv_policy_config *cfg, int32_t len);

extern const tsr_kv_policy_ops tsr_kv_policy_paged;
extern const tsr_kv_policy_ops tsr_kv_policy_h2o;
extern const tsr_kv_policy_ops tsr_kv_policy_offload;
extern const tsr_kv_policy_ops tsr_kv_policy_snapkv;
extern const tsr_kv_policy_ops tsr_kv_policy_streaming;

#endif
