/* The KV-cache interface the forward pass talks to. Implementations: a dense per-sequence
 * cache (memory/kv_dense.c, the foundation's reference) and the block-managed policies
 * (policies/). Keys are stored after RoPE with their original positions, so a cache may
 * drop or move tokens without re-rotating anything. Sequences are small integer ids
 * chosen by the caller (the scheduler). */
#ifndef TSR_MEMORY_KV_CACHE_H
#define TSR_MEMORY_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "base/status.h"

typedef struct tsr_kv_cache tsr_kv_cache;

typedef struct tsr_kv_stats {
    int64_t tokens_resident;
    int64_t bytes_used;
    int64_t bytes_peak;
    int64_t bytes_capacity;
    int64_t evictions;
} tsr_kv_stats;

typedef struct tsr_kv_cache_ops {
    const char *name;
    void (*destroy)(tsr_kv_cache *kv);
    /* Starts sequence `seq` (empty). */
    tsr_status (*seq_add)(tsr_kv_cache *kv, int seq);
    void (*seq_free)(tsr_kv_cache *kv, int seq);
    /* Tokens the sequence holds (its next position). */
    int32_t (*seq_len)(const tsr_kv_cache *kv, int seq);
    /* Makes room for n more tokens of `seq` in every layer; checks before it changes
     * anything (TSR_ERR_NO_BLOCKS: retry later, TSR_ERR_BUDGET: never fits). */
    tsr_status (*reserve)(tsr_kv_cache *kv, int seq, int32_t n);
    /* Stores n rows of k and v ([n][kv_dim]) for positions seq_len .. seq_len+n-1 of
     * `layer`. The length advances only at commit. */
    tsr_status (*write)(tsr_kv_cache *kv, int layer, int seq, int32_t n, const float *k,
                        const float *v);
    /* The spans attention must read for `layer` (including rows written but not yet
     * committed). The array is owned by the cache, valid until its next call. */
    tsr_status (*spans)(tsr_kv_cache *kv, int layer, int seq, const tsr_kv_span **spans,
                        int *n_spans);
    /* Optional (may be NULL): the per-key accumulated attention of the last attention
     * call over these spans ([n_heads][keys], per query head: tsr_attn_args), for
     * score-driven policies. */
    tsr_status (*observe)(tsr_kv_cache *kv, int layer, int seq, const float *key_scores);
    /* Advances the sequence by the n tokens (ids given, so a block cache can hash full
     * blocks for prefix sharing) after all layers wrote them. */
    tsr_status (*commit)(tsr_kv_cache *kv, int seq, const int32_t *tokens, int32_t n);
    /* Optional (may be NULL): attaches cached blocks holding a prefix of `tokens` to the
     * (empty) sequence and returns how many tokens are already computed (at most n - 1, so
     * the last prompt token still produces logits); the caller then feeds only the rest. */
    int32_t (*prefix_attach)(tsr_kv_cache *kv, int seq, const int32_t *tokens, int32_t n);
    void (*stats)(const tsr_kv_cache *kv, tsr_kv_stats *out);
    /* Optional (may be NULL): this call's rotated queries of `layer` ([n_q][n_heads *
     * head_dim], positions q_pos), given before spans() so that a cache can choose what to
     * make resident (offload's speculative selection) or rebuild scores (h2o's
     * materialize baseline). */
    tsr_status (*queries)(tsr_kv_cache *kv, int layer, int seq, const float *q,
                          const int32_t *q_pos, int n_q, int n_heads);
} tsr_kv_cache_ops;

struct tsr_kv_cache {
    const tsr_kv_cache_ops *ops;
    int n_layers;
    int kv_dim;      /* n_kv_heads * head_dim */
    int n_kv_heads;
    int max_seq_len;
    /* non-zero when observe() wants key scores from attention */
    int wants_scores;
};

/* Dense cache: each sequence gets [n_layers][max_tokens][kv_dim] for K and V, allocated at
 * seq_add; capacity bounds the number of concurrent sequences. */
tsr_status tsr_kv_dense_create(int n_layers, int n_kv_heads, int head_dim, int max_tokens,
                               int max_seqs, tsr_kv_cache **out);

void tsr_kv_cache_destroy(tsr_kv_cache *kv);

#endif
