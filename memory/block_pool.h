/* The block pool (vLLM v1's BlockPool in C): every KV block record is made up front, free
 * blocks sit on an intrusive doubly linked LRU list, and full blocks are indexed by a hash
 * of their content (parent hash + token ids) for prefix caching. A freed block keeps its
 * hash and stays a cache hit until it leaves the free list for reuse (lazy eviction). The
 * pool manages ids only; the storage they index lives with the cache (memory/kv_paged.c). */
#ifndef TSR_MEMORY_BLOCK_POOL_H
#define TSR_MEMORY_BLOCK_POOL_H

#include <stdint.h>

#include "base/status.h"

typedef struct tsr_block {
    int32_t id;
    int32_t ref_cnt;
    uint64_t hash;     /* 0: none (not full, or not hashed) */
    int32_t prev, next; /* free-list links, -1 at the ends */
    int32_t hnext;     /* next block of the same hash bucket, -1 at the end */
    uint8_t in_free;
} tsr_block;

typedef struct tsr_block_pool {
    int32_t n_blocks;
    tsr_block *blocks;
    int32_t free_head, free_tail, n_free;
    int32_t *buckets; /* hash map: bucket -> first block, chained through hnext */
    uint32_t bucket_mask;
    int64_t cached_evictions; /* hashed blocks reused for new content */
} tsr_block_pool;

tsr_status tsr_block_pool_create(int32_t n_blocks, tsr_block_pool **out);
void tsr_block_pool_destroy(tsr_block_pool *p);

/* Free blocks (including cached ones that still carry a hash). */
static inline int32_t tsr_block_pool_num_free(const tsr_block_pool *p) { return p->n_free; }

/* Takes n blocks from the LRU head (ref_cnt 1 each); a cached block loses its hash. All or
 * nothing: TSR_ERR_NO_BLOCKS, with nothing changed, when fewer than n are free. */
tsr_status tsr_block_pool_alloc(tsr_block_pool *p, int32_t n, int32_t *ids);

/* Takes block `id` (ref_cnt 1) when it is free and caches nothing, so no prefix-cache
 * content is lost and the LRU order of cached blocks stays as it was; else changes nothing
 * and returns 0. Lets a cache pick where a block's rows land (memory/kv_paged.c keeps each
 * layer's blocks adjacent) with the same accounting as tsr_block_pool_alloc. */
int tsr_block_pool_take(tsr_block_pool *p, int32_t id);

/* One more reference; a block on the free list (a prefix-cache hit) leaves it. */
void tsr_block_pool_ref(tsr_block_pool *p, int32_t id);

/* Drops one reference per id, in the order given; blocks reaching 0 go to the free-list
 * tail (keeping their hash). Callers free a sequence's blocks in reverse, so its tail
 * blocks are reused first and its prefix stays cached longest. */
void tsr_block_pool_unref(tsr_block_pool *p, const int32_t *ids, int32_t n);

/* Records the content hash of a full block (hash != 0) in the map. */
void tsr_block_pool_set_hash(tsr_block_pool *p, int32_t id, uint64_t hash);

/* A block holding content `hash`, or -1. */
int32_t tsr_block_pool_lookup(const tsr_block_pool *p, uint64_t hash);

/* The hash of a full block: chains the parent block's hash (0 for the first block), the
 * token ids and an extra key (the layer, a cache salt). Never 0. */
uint64_t tsr_block_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t extra);

#endif
