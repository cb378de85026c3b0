/* The paged KV cache: KV rows live in fixed-size blocks from one tsr_block_pool, one block
 * holding `block_size` token slots of ONE layer (K and V of every KV head, a position per
 * slot, optionally an accumulated score per slot). Each sequence has one block table per
 * layer, so a score policy may keep different tokens in different layers. It implements
 * tsr_kv_cache_ops (vLLM semantics: keeps every token) and exposes the slot-level mechanism
 * the policies (policies/) build on: per-slot scores, eviction with compaction, row insert,
 * fork, swap to the host pool and drop-for-recompute. */
#ifndef TSR_MEMORY_KV_PAGED_H
#define TSR_MEMORY_KV_PAGED_H

#include <stdint.h>

#include "memory/host_pool.h"
#include "memory/kv_cache.h"

typedef struct tsr_kv_paged_config {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;        /* tokens per block; 0: 16 */
    int64_t memory_bytes;  /* the pool's budget: all blocks are made up front within it */
    int max_seqs;
    int max_seq_len;       /* longest sequence (the model context) */
    int prefix_caching;    /* hash full blocks; prefix_attach shares them */
    int keep_scores;       /* a float per slot, added to by tsr_kv_paged_add_scores */
    tsr_host_pool *host;   /* swap target (not owned); NULL: swap unavailable */
    tsr_backend *be;       /* where the K/V bytes live (not owned): the store is a backend
                            * buffer, touched only through be's ops */
} tsr_kv_paged_config;

typedef struct tsr_kv_paged_stats {
    int32_t block_size;
    int32_t blocks_total;
    int32_t blocks_used;     /* referenced by some sequence */
    int32_t blocks_cached;   /* free but still holding a hashed prefix */
    int32_t blocks_peak;
    int64_t block_bytes;
    int64_t prefix_query_tokens;
    int64_t prefix_hit_tokens;
    int64_t cow_copies;
    int64_t evicted_tokens;  /* slots removed by tsr_kv_paged_evict */
    int64_t cached_evictions; /* hashed free blocks reused for new content */
    int64_t swap_out_bytes, swap_in_bytes;
    int64_t preempt_drops;
} tsr_kv_paged_stats;

/* Bytes one block takes (K + V + positions [+ scores]). */
int64_t tsr_kv_paged_block_bytes(const tsr_kv_paged_config *cfg);

tsr_status tsr_kv_paged_create(const tsr_kv_paged_config *cfg, tsr_kv_cache **out);
/* Non-zero when kv was made by tsr_kv_paged_create. */
int tsr_kv_is_paged(const tsr_kv_cache *kv);
void tsr_kv_paged_get_stats(const tsr_kv_cache *kv, tsr_kv_paged_stats *out);
int32_t tsr_kv_paged_block_size(const tsr_kv_cache *kv);
int32_t tsr_kv_paged_free_blocks(const tsr_kv_cache *kv);

/* The answer reserve(seq, n) would give (TSR_OK, TSR_ERR_NO_BLOCKS, TSR_ERR_BUDGET, ...),
 * changing nothing but array capacity; after TSR_OK, reserve(seq, n) with nothing changed in
 * between cannot fail. The distributed block manager agrees on it before committing. */
tsr_status tsr_kv_paged_reserve_check(tsr_kv_cache *kv, int seq, int32_t n);

/* Blocks of `layer` in seq's table (tests). */
int32_t tsr_kv_paged_seq_blocks(const tsr_kv_cache *kv, int layer, int seq,
                                const int32_t **ids);

/* --- slot mechanism for policies ------------------------------------------------------ */

/* Rows present in seq's `layer` (committed plus written this step). */
int32_t tsr_kv_paged_slots(const tsr_kv_cache *kv, int layer, int seq);
/* Adds key scores ([n_kv_heads][slots], span order) to the slots, summed over KV heads. */
tsr_status tsr_kv_paged_add_scores(tsr_kv_cache *kv, int layer, int seq,
                                   const float *key_scores);
/* Adds one score per slot ([slots], span order), already summed over the KV heads. */
tsr_status tsr_kv_paged_add_slot_scores(tsr_kv_cache *kv, int layer, int seq,
                                        const float *scores);
/* Copies each slot's position and accumulated score (either may be NULL). */
tsr_status tsr_kv_paged_read_slots(const tsr_kv_cache *kv, int layer, int seq, int32_t *pos,
                                   float *score);
/* Pointers to the K and V row of one slot. */
tsr_status tsr_kv_paged_row(const tsr_kv_cache *kv, int layer, int seq, int32_t slot,
                            float **k, float **v);
/* Removes n distinct slots of seq's `layer`: rows from the tail move into the holes, so the
 * table stays dense, and emptied tail blocks go back to the pool. */
tsr_status tsr_kv_paged_evict(tsr_kv_cache *kv, int layer, int seq, const int32_t *slots,
                              int32_t n);
/* Makes room for `rows` more slots in seq's `layer` beyond its current rows (check, then
 * commit; TSR_ERR_NO_BLOCKS / TSR_ERR_BUDGET as reserve). */
tsr_status tsr_kv_paged_reserve_rows(tsr_kv_cache *kv, int layer, int seq, int32_t rows);
/* Appends one row at position `pos` (room made by reserve_rows); its score starts at 0. */
tsr_status tsr_kv_paged_insert(tsr_kv_cache *kv, int layer, int seq, int32_t pos,
                               const float *k, const float *v);

/* --- sharing and preemption ----------------------------------------------------------- */

/* Starts `dst` as a copy of `src` sharing all its blocks (parallel sampling, beam search);
 * the first write into a shared partial block copies it (copy-on-write). */
tsr_status tsr_kv_paged_fork(tsr_kv_cache *kv, int src, int dst);
/* Preemption by swap: copies seq's rows to the host pool and frees its blocks (held by a
 * reference until the copy completes). The sequence keeps its length; it may not run
 * until tsr_kv_paged_swap_in (TSR_ERR_NO_BLOCKS while the pool is short). */
tsr_status tsr_kv_paged_swap_out(tsr_kv_cache *kv, int seq);
tsr_status tsr_kv_paged_swap_in(tsr_kv_cache *kv, int seq);
int tsr_kv_paged_is_swapped(const tsr_kv_cache *kv, int seq);
/* Preemption by recompute: frees seq's blocks (full ones stay prefix-cache hits) and empties
 * it; *tokens and *n get its token history, to be fed again (prefix_attach first). The pointer
 * stays valid until the sequence grows past that length or is freed. */
tsr_status tsr_kv_paged_drop(tsr_kv_cache *kv, int seq, const int32_t **tokens, int32_t *n);

/* --- checkpoints ---------------------------------------------------------------------- */

/* The logical contents of one layer of a sequence: its slot rows in table order. */
typedef struct tsr_kv_seq_layer {
    int32_t slots;
    int dense;       /* slot s holds position s (nothing evicted) */
    float *k, *v;    /* [slots][kv_dim] */
    int32_t *pos;    /* [slots] */
    float *score;    /* [slots]; NULL when the cache keeps no scores */
} tsr_kv_seq_layer;

/* One sequence, independent of block ids, so it can be restored into another pool. */
typedef struct tsr_kv_seq_state {
    int32_t len;     /* committed tokens (the next position) */
    int32_t *tokens; /* [len] */
    int n_layers, kv_dim, has_scores;
    tsr_kv_seq_layer *layers; /* [n_layers] */
} tsr_kv_seq_state;

/* Copies seq's contents (between steps; not swapped out) into *out (allocated). */
tsr_status tsr_kv_paged_export_seq(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out);
/* Fills the sequence `seq` (added, still empty) with `st` (geometry checked; TSR_ERR_NO_BLOCKS
 * when the pool is short). */
tsr_status tsr_kv_paged_import_seq(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *st);
/* For readers (jobs/checkpoint.c): alloc_layers makes layers[] and tokens[] from len,
 * n_layers; once layers[l].slots are set, alloc_rows makes each layer's row arrays (kv_dim,
 * has_scores). tsr_kv_seq_state_free frees whatever was made. */
tsr_status tsr_kv_seq_state_alloc_layers(tsr_kv_seq_state *st);
tsr_status tsr_kv_seq_state_alloc_rows(tsr_kv_seq_state *st);
void tsr_kv_seq_state_free(tsr_kv_seq_state *st);

#endif
