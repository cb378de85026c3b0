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

/* Block-level counters of a block-managed cache (memory/kv_paged.h); zero for others. */
typedef struct tsr_kv_block_stats {
    int32_t block_size;
    int32_t blocks_total;
    int32_t blocks_used;     /* referenced by some sequence */
    int32_t blocks_cached;   /* free but still holding a hashed prefix */
    int32_t blocks_peak;
    int64_t block_bytes;
    int64_t prefix_query_tokens;
    int64_t prefix_hit_tokens;
    int64_t cow_copies;
    int64_t evicted_tokens;  /* slots removed by eviction */
    int64_t cached_evictions; /* hashed free blocks reused for new content */
    int64_t swap_out_bytes, swap_in_bytes;
    int64_t preempt_drops;
} tsr_kv_block_stats;

/* A policy's counters as named values: each policy declares its own (policies/policy.h),
 * so this layer knows none of them by name. Zero values without a policy. */
#define TSR_KV_POLICY_STATS_MAX 32
typedef struct tsr_kv_stat_value {
    const char *name; /* JSON key (static storage: the policy's declaration) */
    int is_double;
    int64_t i;
    double d;
} tsr_kv_stat_value;

typedef struct tsr_kv_policy_stats {
    int64_t evictions; /* the value named "evictions", if any: counts as the cache's */
    int n;
    tsr_kv_stat_value v[TSR_KV_POLICY_STATS_MAX];
} tsr_kv_policy_stats;

/* The value named `name` as a double (0 when the policy reports none). */
double tsr_kv_policy_stat(const tsr_kv_policy_stats *s, const char *name);

/* Everything a cache reports, through whatever wrappers it sits in (tsr_kv_cache_detail). */
typedef struct tsr_kv_detail {
    const char *policy;        /* the policy's name, else the cache's ("paged", "dense") */
    /* The policy's option settings as text ("kv-budget=24 h2o-recent=0.5 ..."; NULL without
     * a policy), owned by the cache. */
    const char *policy_options;
    tsr_kv_stats kv;
    tsr_kv_block_stats blocks;
    tsr_kv_policy_stats pol;
} tsr_kv_detail;

/* The logical contents of one layer of a sequence: its slot rows in table order. Host
 * memory. */
typedef struct tsr_kv_seq_layer {
    int32_t slots;
    int dense;       /* slot s holds position s (nothing evicted) */
    float *k, *v;    /* [slots][kv_dim] */
    int32_t *pos;    /* [slots] */
    float *score;    /* [slots]; NULL when the cache keeps no scores */
} tsr_kv_seq_layer;

/* One sequence, independent of block ids, so it can be restored into another pool (the
 * checkpoint of a request). */
typedef struct tsr_kv_seq_state {
    int32_t len;     /* committed tokens (the next position) */
    int32_t *tokens; /* [len] */
    int n_layers, kv_dim, has_scores;
    tsr_kv_seq_layer *layers; /* [n_layers] */
} tsr_kv_seq_state;

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
    /* Stores n rows of k and v ([n][kv_dim], backend memory: the layer's activations) for
     * positions seq_len .. seq_len+n-1 of `layer`. The length advances only at commit. */
    tsr_status (*write)(tsr_kv_cache *kv, int layer, int seq, int32_t n, const float *k,
                        const float *v);
    /* The spans attention must read for `layer` (including rows written but not yet
     * committed). The array is owned by the cache, valid until its next call; span k/v
     * point into backend memory, span pos into host memory. */
    tsr_status (*spans)(tsr_kv_cache *kv, int layer, int seq, const tsr_kv_span **spans,
                        int *n_spans);
    /* Optional (may be NULL): the per-key accumulated attention of the last attention
     * call over these spans ([n_heads][keys], per query head: tsr_attn_args), for
     * score-driven policies. HOST memory: the forward pass downloads the attention's
     * key_scores before the call, so that a policy decides from host arrays only. */
    tsr_status (*observe)(tsr_kv_cache *kv, int layer, int seq, const float *key_scores);
    /* Advances the sequence by the n tokens (ids given, so a block cache can hash full
     * blocks for prefix sharing) after all layers wrote them. */
    tsr_status (*commit)(tsr_kv_cache *kv, int seq, const int32_t *tokens, int32_t n);
    /* Optional (may be NULL): attaches cached blocks holding a prefix of `tokens` to the
     * (empty) sequence and returns how many tokens are already computed (at most n - 1, so
     * the last prompt token still produces logits); the caller then feeds only the rest. */
    int32_t (*prefix_attach)(tsr_kv_cache *kv, int seq, const int32_t *tokens, int32_t n);
    void (*stats)(const tsr_kv_cache *kv, tsr_kv_stats *out);
    /* Optional (may be NULL; called only with wants_queries): this call's rotated queries
     * of `layer` ([n_q][n_heads * head_dim], positions q_pos), given before spans() so
     * that a cache can choose what to make resident (offload's speculative selection) or
     * rebuild scores (h2o's materialize baseline). q and q_pos are HOST memory (the
     * forward pass downloads the rotated queries before the call); valid until that
     * layer's observe. */
    tsr_status (*queries)(tsr_kv_cache *kv, int layer, int seq, const float *q,
                          const int32_t *q_pos, int n_q, int n_heads);
    /* Optional (may be NULL): layer `layer`'s attention input for `seq` (the normed hidden
     * rows, [n][dim], HOST memory: downloaded like the queries), given before write(), so
     * that a cache can speculate what the next layer will attend to (offload's InfiniGen
     * mode) while this layer computes. Valid during the call only. */
    tsr_status (*attn_input)(tsr_kv_cache *kv, int layer, int seq, const float *x, int n,
                             int dim);

    /* --- what callers need from a cache whatever wraps it (all optional: NULL where the
     * cache has no such thing; wrappers forward to the cache they wrap) --------------- */
    /* Fills *out (zeroed by the caller: tsr_kv_cache_detail). */
    void (*detail)(const tsr_kv_cache *kv, tsr_kv_detail *out);
    /* Copies seq's contents (between steps; not swapped out) into *out (allocated: free
     * with tsr_kv_seq_state_free). */
    tsr_status (*export_seq)(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out);
    /* Fills the sequence `seq` (added, still empty) with `st` (geometry checked;
     * TSR_ERR_NO_BLOCKS when the pool is short). */
    tsr_status (*import_seq)(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *st);
    /* The answer reserve(seq, n) would give, changing nothing but array capacity; after
     * TSR_OK, reserve(seq, n) with nothing changed in between cannot fail (the
     * distributed block manager agrees on it before committing). */
    tsr_status (*reserve_check)(tsr_kv_cache *kv, int seq, int32_t n);
    /* Blocks of `layer` in seq's table (*ids valid until the next call that changes it). */
    int32_t (*seq_blocks)(const tsr_kv_cache *kv, int layer, int seq, const int32_t **ids);
    /* Preemption by swap (between steps). swap_out moves seq's rows (with their positions
     * and scores, table order kept) to the host pool and frees its blocks; the sequence
     * keeps its id, length and whatever its cache keeps per sequence, and may only be
     * swapped in or freed until swap_in brings the rows back, into other blocks, in the same
     * table order. check != 0 answers without changing anything (swap_out: TSR_ERR_NO_BLOCKS
     * when the host pool is short; swap_in: TSR_ERR_NO_BLOCKS until the pool has room for
     * the rows and the sequence's next token); after that TSR_OK the call with check == 0
     * fails only on a device or system error. *bytes (may be NULL): the host bytes the
     * sequence takes swapped out. A step reserved for seq but not run is abandoned. */
    tsr_status (*swap_out)(tsr_kv_cache *kv, int seq, int check, int64_t *bytes);
    tsr_status (*swap_in)(tsr_kv_cache *kv, int seq, int check, int64_t *bytes);
    /* Optional (NULL: none), for the batched step (runtime/exec/forward.c): write()'s
     * bookkeeping for n rows of `layer` without moving them. slots[i] gets the store slot
     * of row i (the caller writes the rows there with the backend's kv_write before the
     * layer's attention), *lay the store's layout, *table and *n_blocks the layer's block
     * table (valid until the next call that changes it), whose keys are then exactly the
     * positions 0 .. seq_len + n - 1 in table order. TSR_ERR_UNSUPPORTED, changing
     * nothing, when the layer is not so (it lost tokens) or the cache's policy must see
     * the rows or choose the keys: the caller takes write() and spans(). */
    tsr_status (*write_slots)(tsr_kv_cache *kv, int layer, int seq, int32_t n, int32_t *slots,
                              tsr_kv_layout *lay, const int32_t **table, int32_t *n_blocks);
} tsr_kv_cache_ops;

struct tsr_kv_cache {
    const tsr_kv_cache_ops *ops;
    int n_layers;
    int kv_dim;      /* n_kv_heads * head_dim */
    int n_kv_heads;
    int max_seq_len;
    /* non-zero when observe() wants key scores from attention */
    int wants_scores;
    /* non-zero when attn_input() wants the layer's attention input (a download on a device) */
    int wants_attn_input;
    /* non-zero when queries() wants the layer's rotated queries (a download on a device);
     * the forward pass calls queries() only then */
    int wants_queries;
};

/* Dense cache: each sequence gets [n_layers][tokens][kv_dim] for K and V in backend memory
 * of `be` (not owned), grown by doubling up to max_tokens; max_seqs bounds the number of
 * concurrent sequences. */
tsr_status tsr_kv_dense_create(tsr_backend *be, int n_layers, int n_kv_heads, int head_dim,
                               int max_tokens, int max_seqs, tsr_kv_cache **out);
/* The same with K/V stored as `dtype` (tsr_kv_dtype: kernels/kv_dtype.h). */
tsr_status tsr_kv_dense_create_dtype(tsr_backend *be, int n_layers, int n_kv_heads,
                                     int head_dim, int max_tokens, int max_seqs, int dtype,
                                     tsr_kv_cache **out);

void tsr_kv_cache_destroy(tsr_kv_cache *kv);

/* The cache's stats, block stats and policy stats (ops->detail, else the plain stats). */
void tsr_kv_cache_detail(const tsr_kv_cache *kv, tsr_kv_detail *out);
/* One JSON object (no newline) of d: policy, blocks, bytes, evictions, prefix hits, swap
 * traffic, then the policy's own stats under their declared names. Returns the length
 * it needs (as snprintf). */
int tsr_kv_detail_json(const tsr_kv_detail *d, char *buf, size_t size);

/* Checkpoint calls through the interface: TSR_ERR_UNSUPPORTED when the cache has none. */
tsr_status tsr_kv_export_seq(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out);
tsr_status tsr_kv_import_seq(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *st);
/* Swap calls through the interface (ops->swap_out / swap_in): TSR_ERR_UNSUPPORTED when the
 * cache cannot swap; tsr_kv_can_swap says whether it can. */
int tsr_kv_can_swap(const tsr_kv_cache *kv);
tsr_status tsr_kv_swap_out(tsr_kv_cache *kv, int seq, int check, int64_t *bytes);
tsr_status tsr_kv_swap_in(tsr_kv_cache *kv, int seq, int check, int64_t *bytes);
/* Tokens per block of a block-managed cache, 0 otherwise. */
int32_t tsr_kv_block_size(const tsr_kv_cache *kv);

/* For readers (jobs/run/checkpoint.c): alloc_layers makes layers[] and tokens[] from len,
 * n_layers; once layers[l].slots are set, alloc_rows makes each layer's row arrays (kv_dim,
 * has_scores). tsr_kv_seq_state_free frees whatever was made. */
tsr_status tsr_kv_seq_state_alloc_layers(tsr_kv_seq_state *st);
tsr_status tsr_kv_seq_state_alloc_rows(tsr_kv_seq_state *st);
void tsr_kv_seq_state_free(tsr_kv_seq_state *st);

#endif
