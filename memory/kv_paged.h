/* The paged KV cache: KV rows live in fixed-size blocks from one tsr_block_pool, one block
 * holding `block_size` token slots of ONE layer (K and V of every KV head, a position per
 * slot, optionally an accumulated score per slot). Each sequence has one block table per
 * layer, so a score policy may keep different tokens in different layers. It implements
 * tsr_kv_cache_ops (vLLM semantics: keeps every token) and exposes the slot-level mechanism
 * the policies (policies/) build on: per-slot scores, eviction with compaction, row insert,
 * fork, swap to the host pool and drop-for-recompute. The K/V rows are backend memory of
 * cfg.be (memory/kv_store.h), moved only by the backend's KV row ops, one call per batch of
 * slots; block tables, positions, scores, hashes and reference counts are host memory. */
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
    int kv_dtype;          /* element type of the stored K/V (tsr_kv_dtype; 0: f32) */
} tsr_kv_paged_config;

/* The block counters (memory/kv_cache.h), also what detail() reports. */
typedef tsr_kv_block_stats tsr_kv_paged_stats;

/* Bytes one block takes (K + V in backend memory, positions [+ scores] on the host). */
int64_t tsr_kv_paged_block_bytes(const tsr_kv_paged_config *cfg);

tsr_status tsr_kv_paged_create(const tsr_kv_paged_config *cfg, tsr_kv_cache **out);
/* Non-zero when kv was made by tsr_kv_paged_create. */
int tsr_kv_is_paged(const tsr_kv_cache *kv);
/* The backend whose memory holds the K/V rows. */
tsr_backend *tsr_kv_paged_backend(const tsr_kv_cache *kv);
void tsr_kv_paged_get_stats(const tsr_kv_cache *kv, tsr_kv_paged_stats *out);
int32_t tsr_kv_paged_block_size(const tsr_kv_cache *kv);
int32_t tsr_kv_paged_free_blocks(const tsr_kv_cache *kv);

/* The answer reserve(seq, n) would give (TSR_OK, TSR_ERR_NO_BLOCKS, TSR_ERR_BUDGET, ...),
 * changing nothing but array capacity; after TSR_OK, reserve(seq, n) with nothing changed in
 * between cannot fail (also ops->reserve_check). */
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
/* Copies each slot's position and accumulated score (either may be NULL; host metadata). */
tsr_status tsr_kv_paged_read_slots(const tsr_kv_cache *kv, int layer, int seq, int32_t *pos,
                                   float *score);
/* Gathers the K and V rows of n slots of seq's `layer` (slots[i]; slots NULL: 0 .. n-1)
 * into host rows k[i], v[i] ([n][kv_dim]; either may be NULL), in one backend call. */
tsr_status tsr_kv_paged_gather(tsr_kv_cache *kv, int layer, int seq, const int32_t *slots,
                               int32_t n, float *k, float *v);
/* Removes n distinct slots of seq's `layer`: rows from the tail move into the holes, so the
 * table stays dense, and emptied tail blocks go back to the pool. */
tsr_status tsr_kv_paged_evict(tsr_kv_cache *kv, int layer, int seq, const int32_t *slots,
                              int32_t n);
/* Makes room for `rows` more slots in seq's `layer` beyond its current rows (check, then
 * commit; TSR_ERR_NO_BLOCKS / TSR_ERR_BUDGET as reserve). */
tsr_status tsr_kv_paged_reserve_rows(tsr_kv_cache *kv, int layer, int seq, int32_t rows);
/* Appends n host rows k[i], v[i] ([n][kv_dim]) at positions pos[i] (room made by
 * reserve_rows), in one backend call; their scores start at 0. */
tsr_status tsr_kv_paged_insert(tsr_kv_cache *kv, int layer, int seq, const int32_t *pos,
                               int32_t n, const float *k, const float *v);
/* The same from rows in backend memory ([n][kv_dim] f32 each: a staging buffer the caller
 * filled on a copy stream and ordered the compute stream after), in one kv_write: the
 * slots, positions and bits of insert. */
tsr_status tsr_kv_paged_insert_device(tsr_kv_cache *kv, int layer, int seq,
                                      const int32_t *pos, int32_t n, const float *k,
                                      const float *v);

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

/* Checkpoints go through the interface: ops->export_seq / import_seq (memory/kv_cache.h,
 * tsr_kv_export_seq / tsr_kv_import_seq). */

#endif
