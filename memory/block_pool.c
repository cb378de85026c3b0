/* Block records, the intrusive LRU free list and the full-block hash map. Freed hashed
 * blocks join the LRU tail (prefix-cache hits kept longest); unhashed ones the head. */
#include "memory/block_pool.h"

#include "base/alloc.h"

tsr_status tsr_block_pool_create(int32_t n_blocks, tsr_block_pool **out) {
    *out = NULL;
    if (n_blocks <= 0)
        return tsr_error_set(TSR_ERR_BUDGET, "block pool: the budget holds no block");
    tsr_block_pool *p = tsr_calloc(1, sizeof *p);
    if (!p) return TSR_ERR_NOMEM;
    uint32_t nb = 16;
    while (nb < (uint32_t)n_blocks && nb < (1u << 30)) nb <<= 1;
    p->blocks = tsr_calloc((size_t)n_blocks, sizeof *p->blocks);
    p->buckets = tsr_malloc((size_t)nb * sizeof *p->buckets);
    if (!p->blocks || !p->buckets) {
        tsr_block_pool_destroy(p);
        return TSR_ERR_NOMEM;
    }
    p->n_blocks = n_blocks;
    p->bucket_mask = nb - 1;
    for (uint32_t i = 0; i < nb; i++) p->buckets[i] = -1;
    for (int32_t i = 0; i < n_blocks; i++) {
        p->blocks[i] = (tsr_block){.id = i, .ref_cnt = 0, .hash = 0, .prev = i - 1,
                                   .next = i + 1 < n_blocks ? i + 1 : -1, .hnext = -1,
                                   .in_free = 1};
    }
    p->free_head = 0;
    p->free_tail = n_blocks - 1;
    p->n_free = n_blocks;
    *out = p;
    return TSR_OK;
}

void tsr_block_pool_destroy(tsr_block_pool *p) {
    if (!p) return;
    tsr_free(p->blocks);
    tsr_free(p->buckets);
    tsr_free(p);
}

static void tsr__free_remove(tsr_block_pool *p, tsr_block *b) {
    if (b->prev >= 0) p->blocks[b->prev].next = b->next;
    else p->free_head = b->next;
    if (b->next >= 0) p->blocks[b->next].prev = b->prev;
    else p->free_tail = b->prev;
    b->prev = b->next = -1;
    b->in_free = 0;
    p->n_free--;
}

static void tsr__free_append(tsr_block_pool *p, tsr_block *b) {
    b->prev = p->free_tail;
    b->next = -1;
    if (p->free_tail >= 0) p->blocks[p->free_tail].next = b->id;
    else p->free_head = b->id;
    p->free_tail = b->id;
    b->in_free = 1;
    p->n_free++;
}

/* A block with nothing cached goes to the head, so it is reused before blocks never
 * touched: the pool's resident pages then follow the peak in use, not the churn of an
 * evicting policy walking the whole pool. */
static void tsr__free_prepend(tsr_block_pool *p, tsr_block *b) {
    b->prev = -1;
    b->next = p->free_head;
    if (p->free_head >= 0) p->blocks[p->free_head].prev = b->id;
    else p->free_tail = b->id;
    p->free_head = b->id;
    b->in_free = 1;
    p->n_free++;
}

static void tsr__hash_remove(tsr_block_pool *p, tsr_block *b) {
    if (!b->hash) return;
    int32_t *link = &p->buckets[b->hash & p->bucket_mask];
    while (*link >= 0 && *link != b->id) link = &p->blocks[*link].hnext;
    if (*link == b->id) *link = b->hnext;
    b->hnext = -1;
    b->hash = 0;
}

tsr_status tsr_block_pool_alloc(tsr_block_pool *p, int32_t n, int32_t *ids) {
    if (n < 0 || n > p->n_free)
        return tsr_error_set(TSR_ERR_NO_BLOCKS, "block pool: %d blocks wanted, %d free", n,
                             p->n_free);
    for (int32_t i = 0; i < n; i++) {
        tsr_block *b = &p->blocks[p->free_head];
        tsr__free_remove(p, b);
        if (b->hash) {
            tsr__hash_remove(p, b);
            p->cached_evictions++;
        }
        b->ref_cnt = 1;
        ids[i] = b->id;
    }
    return TSR_OK;
}

int tsr_block_pool_take(tsr_block_pool *p, int32_t id) {
    if (id < 0 || id >= p->n_blocks) return 0;
    tsr_block *b = &p->blocks[id];
    if (!b->in_free || b->hash) return 0;
    tsr__free_remove(p, b);
    b->ref_cnt = 1;
    return 1;
}

void tsr_block_pool_ref(tsr_block_pool *p, int32_t id) {
    tsr_block *b = &p->blocks[id];
    if (b->in_free) tsr__free_remove(p, b);
    b->ref_cnt++;
}

void tsr_block_pool_unref(tsr_block_pool *p, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        tsr_block *b = &p->blocks[ids[i]];
        TSR_ASSERT(b->ref_cnt > 0);
        if (--b->ref_cnt == 0) {
            if (b->hash) tsr__free_append(p, b);
            else tsr__free_prepend(p, b);
        }
    }
}

void tsr_block_pool_set_hash(tsr_block_pool *p, int32_t id, uint64_t hash) {
    tsr_block *b = &p->blocks[id];
    if (b->hash == hash || !hash) return;
    tsr__hash_remove(p, b);
    b->hash = hash;
    uint32_t k = (uint32_t)(hash & p->bucket_mask);
    b->hnext = p->buckets[k];
    p->buckets[k] = id;
}

int32_t tsr_block_pool_lookup(const tsr_block_pool *p, uint64_t hash) {
    if (!hash) return -1;
    for (int32_t i = p->buckets[hash & p->bucket_mask]; i >= 0; i = p->blocks[i].hnext)
        if (p->blocks[i].hash == hash) return i;
    return -1;
}

/* splitmix64 finalizer: a cheap, well-mixed step for chaining. */
static uint64_t tsr__mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t tsr_block_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t extra) {
    uint64_t h = tsr__mix(parent ^ 0x5bd1e9955bd1e995ull);
    h = tsr__mix(h ^ extra);
    h = tsr__mix(h ^ (uint64_t)(uint32_t)n);
    for (int32_t i = 0; i < n; i++) h = tsr__mix(h ^ (uint64_t)(uint32_t)tokens[i]);
    return h ? h : 1;
}
