/* The paged cache's insides, shared by its two files: kv_paged.c (block tables, reserve,
 * write, spans, prefix sharing, the cache ops) and kv_paged_slots.c (the slot mechanism of
 * the policies, sharing, preemption and checkpoints: the row moves that are not a step's
 * write). Not for other modules. */
#ifndef TSR_MEMORY_KV_PAGED_INTERNAL_H
#define TSR_MEMORY_KV_PAGED_INTERNAL_H

#include <stdint.h>

#include "memory/block_pool.h"
#include "memory/kv_paged.h"
#include "memory/kv_store.h"
#include "base/status.h"

typedef struct tsr__player {
    int32_t *blocks;
    int32_t nb, cap;
    int32_t slots;  /* rows present */
    int32_t base;   /* rows before this step's write (set by reserve) */
    int dense;      /* slot s holds position s */
} tsr__player;

typedef struct tsr__pseq {
    int active;
    int swapped;
    int in_step;       /* reserve done, commit pending */
    int32_t len;       /* committed tokens (the next position) */
    int32_t *tokens;   /* [len] ids (prefix hashing, recompute) */
    int32_t tok_cap;
    uint64_t *hashes;  /* chain hash of each full block (layer-free) */
    int32_t n_hashed, hash_cap;
    tsr__player *layers;
    void *swap_buf;
    size_t swap_bytes;
} tsr__pseq;

typedef struct tsr__paged {
    tsr_kv_cache base;
    tsr_kv_paged_config cfg;
    int bs;
    tsr_block_pool *pool;
    /* Block b holds its K rows, then its V rows (bs x kv_dim floats each): attention reads
     * a block's K and then its V, so a layer's blocks, adjacent in the pool, are one
     * forward stream (docs/kv-cache.md). */
    tsr_kv_store kvs;
    /* Scratch slot lists (host) for the store's batched calls. */
    int32_t *sl_a, *sl_b;
    int64_t sl_cap;
    tsr__pseq *seqs;
    tsr_kv_span *spans;
    int32_t spans_cap;
    tsr_kv_paged_stats st;
} tsr__paged;

static inline tsr__paged *tsr__P(const tsr_kv_cache *kv) {
    TSR_ASSERT(tsr_kv_is_paged(kv));
    return (tsr__paged *)kv;
}

static inline tsr__pseq *tsr__seq(const tsr__paged *p, int seq) {
    if (seq < 0 || seq >= p->cfg.max_seqs || !p->seqs[seq].active) return NULL;
    return &p->seqs[seq];
}

static inline size_t tsr__kvd(const tsr__paged *p) { return (size_t)p->base.kv_dim; }

/* Slot address: index into the store. */
static inline int32_t tsr__slot(const tsr__paged *p, const tsr__player *L, int32_t s) {
    return L->blocks[s / p->bs] * p->bs + s % p->bs;
}

/* The store slots of table slots [first, first + n) of L into out. */
static inline void tsr__slots_of(const tsr__paged *p, const tsr__player *L, int32_t first,
                                 int32_t n, int32_t *out) {
    for (int32_t i = 0; i < n; i++) out[i] = tsr__slot(p, L, first + i);
}

static inline void tsr__note_peak(tsr__paged *p) {
    int32_t used = p->pool->n_blocks - p->pool->n_free;
    if (used > p->st.blocks_peak) p->st.blocks_peak = used;
}

static inline int32_t tsr__ceil_div(int64_t a, int32_t b) { return (int32_t)((a + b - 1) / b); }

/* Per-layer hash of full block i: the sequence's chain hash keyed by the layer. */
static inline uint64_t tsr__layer_hash(uint64_t chain, int layer) {
    return tsr_block_hash(chain, NULL, 0, (uint64_t)layer + 1);
}

static inline tsr_status tsr__layer_of(const tsr_kv_cache *kv, int layer, int seq,
                                       tsr__pseq **s, tsr__player **L) {
    const tsr__paged *p = tsr__P(kv);
    *L = NULL;
    *s = tsr__seq(p, seq);
    if (!*s || layer < 0 || layer >= kv->n_layers || (*s)->swapped)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: no layer %d of sequence %d", layer,
                             seq);
    *L = &(*s)->layers[layer];
    return TSR_OK;
}

static inline size_t tsr__row_bytes(const tsr__paged *p) { return tsr__kvd(p) * 8 + 8; }

/* Makes the scratch slot lists hold n entries each. */
tsr_status tsr__kvp_scratch(tsr__paged *p, int64_t n);
tsr_status tsr__kvp_grow_i32(int32_t **a, int32_t *cap, int32_t need);
/* Releases every block of a layer, tail first; and a whole sequence. */
void tsr__kvp_layer_release(tsr__paged *p, tsr__player *L);
void tsr__kvp_seq_release(tsr__paged *p, tsr__pseq *s);
/* n new blocks for layer l, the first to follow block `prev` (kv_paged.c says why). */
void tsr__kvp_layer_alloc(tsr__paged *p, int l, int32_t prev, int32_t n, int32_t *ids);
/* Check-then-commit growth of the layers in [l0, l1) by `rows` slots each. */
tsr_status tsr__kvp_reserve_layers(tsr__paged *p, tsr__pseq *s, int seq, int l0, int l1,
                                   int32_t rows);
tsr_status tsr__kvp_seq_add(tsr_kv_cache *kv, int seq);
tsr_status tsr__kvp_hash_full_blocks(tsr__paged *p, tsr__pseq *s);
/* The checkpoint ops (kv_paged_slots.c). */
tsr_status tsr__kvp_export_seq(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out);
tsr_status tsr__kvp_import_seq(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *in);
/* The swap ops (kv_paged_slots.c; memory/kv_cache.h). */
tsr_status tsr__kvp_swap_out_op(tsr_kv_cache *kv, int seq, int check, int64_t *bytes);
tsr_status tsr__kvp_swap_in_op(tsr_kv_cache *kv, int seq, int check, int64_t *bytes);

#endif
