/* The paged cache's row moves besides a step's write (see kv_paged_internal.h): the slot
 * mechanism the policies steer (scores, gathers, eviction with compaction, inserts),
 * sharing and preemption (fork, swap to the host pool, drop) and checkpoints. Each moves
 * K/V through the store with one backend call per operation. */
#include <string.h>

#include "memory/kv_paged_internal.h"
#include "base/alloc.h"

/* --- slot mechanism ------------------------------------------------------------------- */

int32_t tsr_kv_paged_slots(const tsr_kv_cache *kv, int layer, int seq) {
    tsr__pseq *s;
    tsr__player *L;
    return tsr__layer_of(kv, layer, seq, &s, &L) == TSR_OK ? L->slots : 0;
}

tsr_status tsr_kv_paged_add_scores(tsr_kv_cache *kv, int layer, int seq,
                                   const float *key_scores) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    if (!p->kvs.score)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: created without keep_scores");
    for (int32_t i = 0; i < L->slots; i++) {
        float sum = 0.0f;
        for (int g = 0; g < kv->n_kv_heads; g++) sum += key_scores[(size_t)g * L->slots + i];
        p->kvs.score[tsr__slot(p, L, i)] += sum;
    }
    return TSR_OK;
}

tsr_status tsr_kv_paged_add_slot_scores(tsr_kv_cache *kv, int layer, int seq,
                                        const float *scores) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    if (!p->kvs.score)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: created without keep_scores");
    for (int32_t i = 0; i < L->slots; i++) p->kvs.score[tsr__slot(p, L, i)] += scores[i];
    return TSR_OK;
}

tsr_status tsr_kv_paged_read_slots(const tsr_kv_cache *kv, int layer, int seq, int32_t *pos,
                                   float *score) {
    const tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    for (int32_t i = 0; i < L->slots; i++) {
        int32_t at = tsr__slot(p, L, i);
        if (pos) pos[i] = p->kvs.pos[at];
        if (score) score[i] = p->kvs.score ? p->kvs.score[at] : 0.0f;
    }
    return TSR_OK;
}

tsr_status tsr_kv_paged_gather(tsr_kv_cache *kv, int layer, int seq, const int32_t *slots,
                               int32_t n, float *k, float *v) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    if (n < 0 || (!slots && n > L->slots))
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: gather of %d rows, layer %d of "
                             "sequence %d holds %d", n, layer, seq, L->slots);
    TSR_TRY(tsr__kvp_scratch(p, n));
    for (int32_t i = 0; i < n; i++) {
        int32_t t = slots ? slots[i] : i;
        if (t < 0 || t >= L->slots)
            return tsr_error_set(TSR_ERR_INVALID, "KV cache: slot %d out of range [0, %d)",
                                 t, L->slots);
        p->sl_a[i] = tsr__slot(p, L, t);
    }
    return tsr_kv_store_gather(&p->kvs, p->sl_a, n, k, v, NULL, NULL);
}

tsr_status tsr_kv_paged_evict(tsr_kv_cache *kv, int layer, int seq, const int32_t *slots,
                              int32_t n) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    if (n <= 0) return TSR_OK;
    uint8_t *gone = tsr_calloc((size_t)L->slots, 1);
    if (!gone) return TSR_ERR_NOMEM;
    for (int32_t i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= L->slots || gone[slots[i]]) {
            tsr_free(gone);
            return tsr_error_set(TSR_ERR_INVALID, "KV cache: bad eviction slot %d", slots[i]);
        }
        gone[slots[i]] = 1;
    }
    /* Blocks that receive rows must be private; shared ones are copied first. The copies
     * (whole shared blocks, then tail rows into holes) are listed in program order and
     * run as one kv_copy, which keeps that order. A block is copied before any row lands
     * in it, and a row read from a block before that block is copied read the same
     * bytes, so the order gives what copying one by one gave. At most n moves plus a block
     * per move. */
    int32_t keep = L->slots - n, t = L->slots - 1;
    int64_t nc = 0;
    tsr_status st = tsr__kvp_scratch(p, (int64_t)n * (p->bs + 1));
    for (int32_t h = 0; h < keep && st == TSR_OK; h++) {
        if (!gone[h]) continue;
        while (gone[t]) t--;
        int32_t bi = h / p->bs;
        if (p->pool->blocks[L->blocks[bi]].ref_cnt > 1) {
            int32_t nw, old = L->blocks[bi];
            st = tsr_block_pool_alloc(p->pool, 1, &nw);
            if (st != TSR_OK) break;
            for (int32_t j = 0; j < p->bs; j++, nc++) {
                p->sl_a[nc] = nw * p->bs + j;
                p->sl_b[nc] = old * p->bs + j;
            }
            tsr_block_pool_unref(p->pool, &old, 1);
            L->blocks[bi] = nw;
            p->st.cow_copies++;
        }
        p->sl_a[nc] = tsr__slot(p, L, h);
        p->sl_b[nc++] = tsr__slot(p, L, t);
        gone[t] = 1;
        t--;
    }
    tsr_free(gone);
    /* On a failed allocation the copies listed so far still run: the tables already
     * point at the new blocks. */
    tsr_status cst = tsr_kv_store_copy(&p->kvs, p->sl_a, p->sl_b, nc);
    TSR_TRY(st);
    TSR_TRY(cst);
    L->slots = keep;
    if (L->base > keep) L->base = keep;
    L->dense = 0;
    int32_t nb = tsr__ceil_div(keep, p->bs);
    for (int32_t i = L->nb - 1; i >= nb; i--) tsr_block_pool_unref(p->pool, &L->blocks[i], 1);
    L->nb = nb;
    p->st.evicted_tokens += n;
    return TSR_OK;
}

tsr_status tsr_kv_paged_reserve_rows(tsr_kv_cache *kv, int layer, int seq, int32_t rows) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    return tsr__kvp_reserve_layers(p, s, seq, layer, layer + 1, rows);
}

/* insert and insert_device: the rows from host memory (scatter) or backend memory (write). */
static tsr_status tsr__kvp_insert(tsr_kv_cache *kv, int layer, int seq, const int32_t *pos,
                                  int32_t n, const float *k, const float *v, int device) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s;
    tsr__player *L;
    TSR_TRY(tsr__layer_of(kv, layer, seq, &s, &L));
    if (n < 0 || (int64_t)L->slots + n > (int64_t)L->nb * p->bs)
        return tsr_error_set(TSR_ERR_INTERNAL, "KV cache: insert past reservation");
    TSR_TRY(tsr__kvp_scratch(p, n));
    tsr__slots_of(p, L, L->slots, n, p->sl_a);
    TSR_TRY(device ? tsr_kv_store_put(&p->kvs, p->sl_a, n, k, v, pos)
                   : tsr_kv_store_scatter(&p->kvs, p->sl_a, n, k, v, pos, NULL));
    for (int32_t i = 0; i < n; i++)
        if (L->dense && pos[i] != L->slots + i) L->dense = 0;
    L->slots += n;
    return TSR_OK;
}

tsr_status tsr_kv_paged_insert(tsr_kv_cache *kv, int layer, int seq, const int32_t *pos,
                               int32_t n, const float *k, const float *v) {
    return tsr__kvp_insert(kv, layer, seq, pos, n, k, v, 0);
}

tsr_status tsr_kv_paged_insert_device(tsr_kv_cache *kv, int layer, int seq,
                                      const int32_t *pos, int32_t n, const float *k,
                                      const float *v) {
    return tsr__kvp_insert(kv, layer, seq, pos, n, k, v, 1);
}

/* --- sharing and preemption ----------------------------------------------------------- */

tsr_status tsr_kv_paged_fork(tsr_kv_cache *kv, int src, int dst) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *a = tsr__seq(p, src);
    if (!a || a->swapped || a->in_step)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: cannot fork sequence %d", src);
    TSR_TRY(tsr__kvp_seq_add(kv, dst));
    tsr__pseq *b = &p->seqs[dst];
    tsr_status st = tsr__kvp_grow_i32(&b->tokens, &b->tok_cap, a->len > 0 ? a->len : 1);
    if (st == TSR_OK && a->n_hashed) {
        b->hashes = tsr_malloc((size_t)a->n_hashed * sizeof *b->hashes);
        if (!b->hashes) st = TSR_ERR_NOMEM;
        else b->hash_cap = a->n_hashed;
    }
    for (int l = 0; l < kv->n_layers && st == TSR_OK; l++)
        st = tsr__kvp_grow_i32(&b->layers[l].blocks, &b->layers[l].cap, a->layers[l].nb);
    if (st != TSR_OK) {
        tsr__kvp_seq_release(p, b);
        return st;
    }
    for (int l = 0; l < kv->n_layers; l++) {
        tsr__player *La = &a->layers[l], *Lb = &b->layers[l];
        for (int32_t i = 0; i < La->nb; i++) tsr_block_pool_ref(p->pool, La->blocks[i]);
        memcpy(Lb->blocks, La->blocks, (size_t)La->nb * sizeof *La->blocks);
        Lb->nb = La->nb;
        Lb->slots = Lb->base = La->slots;
        Lb->dense = La->dense;
    }
    memcpy(b->tokens, a->tokens, (size_t)a->len * sizeof *a->tokens);
    if (a->n_hashed) memcpy(b->hashes, a->hashes, (size_t)a->n_hashed * sizeof *a->hashes);
    b->n_hashed = a->n_hashed;
    b->len = a->len;
    return TSR_OK;
}

/* Host bytes of seq's rows swapped out: K and V rows, a position and a score each. */
static size_t tsr__swap_rows(const tsr__paged *p, const tsr__pseq *s, size_t *bytes) {
    size_t rows = 0;
    for (int l = 0; l < p->base.n_layers; l++) rows += (size_t)s->layers[l].slots;
    *bytes = rows * tsr__row_bytes(p);
    return rows;
}

/* A step reserved but not run (the scheduler preempts while it plans) is abandoned: its
 * rows were never written, and its blocks go with the others. */
static void tsr__abandon_step(tsr__paged *p, tsr__pseq *s) {
    if (!s->in_step) return;
    for (int l = 0; l < p->base.n_layers; l++) s->layers[l].slots = s->layers[l].base;
    s->in_step = 0;
}

/* The swap-out answer: the host pool's budget decides (an allocation can still fail when
 * the system refuses, which the check cannot see). */
static tsr_status tsr__swap_out_check(tsr__paged *p, tsr__pseq *s, int seq, size_t *bytes) {
    if (!s || s->swapped)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: cannot swap out sequence %d", seq);
    if (!p->cfg.host)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: no host pool to swap sequence %d "
                             "to", seq);
    size_t rows = 0;
    for (int l = 0; l < p->base.n_layers; l++) {
        const tsr__player *L = &s->layers[l];
        rows += (size_t)(s->in_step ? L->base : L->slots);
    }
    *bytes = rows * tsr__row_bytes(p);
    const tsr_host_pool *h = p->cfg.host;
    if (h->budget > 0 && (int64_t)*bytes > h->budget)
        return tsr_error_set(TSR_ERR_BUDGET, "KV cache: sequence %d takes %zu bytes swapped "
                             "out, the host pool holds %lld", seq, *bytes,
                             (long long)h->budget);
    if (h->budget > 0 && h->used + (int64_t)*bytes > h->budget)
        return tsr_error_set(TSR_ERR_NO_BLOCKS, "KV cache: swap-out of sequence %d needs %zu "
                             "bytes, the host pool has %lld free", seq, *bytes,
                             (long long)(h->budget - h->used));
    return TSR_OK;
}

static tsr_status tsr__swap_out(tsr__paged *p, tsr__pseq *s, int seq) {
    size_t bytes;
    TSR_TRY(tsr__swap_out_check(p, s, seq, &bytes));
    tsr__abandon_step(p, s);
    size_t rows = tsr__swap_rows(p, s, &bytes);
    TSR_TRY(tsr__kvp_scratch(p, (int64_t)rows));
    void *buf = NULL;
    if (bytes) TSR_TRY(tsr_host_pool_alloc(p->cfg.host, bytes, &buf));
    /* The sequence's references pin its blocks until the copy is done. Every layer's rows
     * in one gather: K [rows][kv_dim], V [rows][kv_dim], then positions and scores. */
    size_t kvd = tsr__kvd(p), r = 0;
    for (int l = 0; l < p->base.n_layers; l++) {
        tsr__player *L = &s->layers[l];
        tsr__slots_of(p, L, 0, L->slots, p->sl_a + r);
        r += (size_t)L->slots;
    }
    if (rows) {
        float *hk = buf, *hv = hk + rows * kvd;
        int32_t *hp = (int32_t *)(hv + rows * kvd);
        float *hs = (float *)(hp + rows);
        tsr_status st = tsr_kv_store_gather(&p->kvs, p->sl_a, (int64_t)rows, hk, hv, hp, hs);
        if (st != TSR_OK) {
            tsr_host_pool_free(p->cfg.host, buf, bytes);
            return st;
        }
    }
    for (int l = p->base.n_layers - 1; l >= 0; l--) tsr__kvp_layer_release(p, &s->layers[l]);
    s->swap_buf = buf;
    s->swap_bytes = bytes;
    s->swapped = 1;
    p->st.swap_out_bytes += (int64_t)bytes;
    return TSR_OK;
}

tsr_status tsr_kv_paged_swap_out(tsr_kv_cache *kv, int seq) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s = tsr__seq(p, seq);
    if (s && s->in_step)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: cannot swap out sequence %d", seq);
    return tsr__swap_out(p, s, seq);
}

/* The swap-in answer: blocks for every layer's rows plus `extra` more slots each. */
static tsr_status tsr__swap_in_check(tsr__paged *p, tsr__pseq *s, int seq, int32_t extra) {
    if (!s || !s->swapped)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence %d is not swapped out", seq);
    int64_t need = 0;
    for (int l = 0; l < p->base.n_layers; l++)
        need += tsr__ceil_div((int64_t)s->layers[l].slots + extra, p->bs);
    if (need > p->pool->n_blocks)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: swap-in of sequence %d needs %lld blocks, the pool "
                             "holds %d", seq, (long long)need, p->pool->n_blocks);
    if (need > p->pool->n_free)
        return tsr_error_set(TSR_ERR_NO_BLOCKS,
                             "KV cache: swap-in of sequence %d needs %lld blocks, %d free", seq,
                             (long long)need, p->pool->n_free);
    for (int l = 0; l < p->base.n_layers; l++) {
        tsr__player *L = &s->layers[l];
        TSR_TRY(tsr__kvp_grow_i32(&L->blocks, &L->cap, tsr__ceil_div(L->slots, p->bs)));
    }
    size_t bytes;
    return tsr__kvp_scratch(p, (int64_t)tsr__swap_rows(p, s, &bytes));
}

static tsr_status tsr__swap_in(tsr__paged *p, tsr__pseq *s, int seq, int32_t extra) {
    TSR_TRY(tsr__swap_in_check(p, s, seq, extra));
    size_t bytes;
    size_t rows = tsr__swap_rows(p, s, &bytes);
    size_t kvd = tsr__kvd(p), r = 0;
    for (int l = 0; l < p->base.n_layers; l++) {
        tsr__player *L = &s->layers[l];
        int32_t nb = tsr__ceil_div(L->slots, p->bs);
        tsr__kvp_layer_alloc(p, l, -1, nb, L->blocks);
        L->nb = nb;
        tsr__slots_of(p, L, 0, L->slots, p->sl_a + r);
        r += (size_t)L->slots;
        if (p->cfg.prefix_caching && L->dense)
            for (int32_t i = 0; i < s->n_hashed && i < nb; i++)
                tsr_block_pool_set_hash(p->pool, L->blocks[i], tsr__layer_hash(s->hashes[i], l));
    }
    if (rows) {
        /* The swap-out layout (K rows, V rows, positions, scores), in one scatter. */
        const float *hk = s->swap_buf, *hv = hk + rows * kvd;
        const int32_t *hp = (const int32_t *)(hv + rows * kvd);
        const float *hs = (const float *)(hp + rows);
        tsr_status st = tsr_kv_store_scatter(&p->kvs, p->sl_a, (int64_t)rows, hk, hv, hp, hs);
        if (st != TSR_OK) {
            /* Nothing lost: the rows are still in the host buffer; the blocks go back. */
            for (int l = p->base.n_layers - 1; l >= 0; l--)
                tsr__kvp_layer_release(p, &s->layers[l]);
            return st;
        }
    }
    if (s->swap_buf) tsr_host_pool_free(p->cfg.host, s->swap_buf, s->swap_bytes);
    p->st.swap_in_bytes += (int64_t)s->swap_bytes;
    s->swap_buf = NULL;
    s->swap_bytes = 0;
    s->swapped = 0;
    tsr__note_peak(p);
    return TSR_OK;
}

tsr_status tsr_kv_paged_swap_in(tsr_kv_cache *kv, int seq) {
    tsr__paged *p = tsr__P(kv);
    return tsr__swap_in(p, tsr__seq(p, seq), seq, 0);
}

/* The cache ops (memory/kv_cache.h): swap-in waits until the sequence can also take its
 * next token, so that a sequence brought back is not preempted again at once. */
tsr_status tsr__kvp_swap_out_op(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s = tsr__seq(p, seq);
    size_t b = 0;
    tsr_status st = check ? tsr__swap_out_check(p, s, seq, &b) : tsr__swap_out(p, s, seq);
    if (bytes) *bytes = st == TSR_OK && !check ? (int64_t)s->swap_bytes : (int64_t)b;
    return st;
}

tsr_status tsr__kvp_swap_in_op(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s = tsr__seq(p, seq);
    if (bytes) *bytes = s && s->swapped ? (int64_t)s->swap_bytes : 0;
    return check ? tsr__swap_in_check(p, s, seq, 1) : tsr__swap_in(p, s, seq, 1);
}

int tsr_kv_paged_is_swapped(const tsr_kv_cache *kv, int seq) {
    const tsr__pseq *s = tsr__seq(tsr__P(kv), seq);
    return s && s->swapped;
}

tsr_status tsr_kv_paged_drop(tsr_kv_cache *kv, int seq, const int32_t **tokens, int32_t *n) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || s->in_step)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: cannot drop sequence %d", seq);
    if (s->swapped) {
        tsr_host_pool_free(p->cfg.host, s->swap_buf, s->swap_bytes);
        s->swap_buf = NULL;
        s->swapped = 0;
    }
    for (int l = kv->n_layers - 1; l >= 0; l--) {
        tsr__player *L = &s->layers[l];
        tsr__kvp_layer_release(p, L);
        L->slots = L->base = 0;
        L->dense = 1;
    }
    *tokens = s->tokens;
    *n = s->len;
    s->len = 0;
    s->n_hashed = 0;
    p->st.preempt_drops++;
    return TSR_OK;
}

/* --- checkpoints ---------------------------------------------------------------------- */

tsr_status tsr__kvp_export_seq(const tsr_kv_cache *kv, int seq,
                                        tsr_kv_seq_state *out) {
    tsr__paged *p = (tsr__paged *)tsr__P(kv); /* scratch lists only */
    memset(out, 0, sizeof *out);
    const tsr__pseq *s = tsr__seq(p, seq);
    if (!s || s->swapped || s->in_step)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: cannot export sequence %d", seq);
    *out = (tsr_kv_seq_state){.len = s->len, .n_layers = kv->n_layers, .kv_dim = kv->kv_dim,
                              .has_scores = p->kvs.score != NULL};
    tsr_status st = tsr_kv_seq_state_alloc_layers(out);
    for (int l = 0; l < kv->n_layers && st == TSR_OK; l++) {
        out->layers[l].slots = s->layers[l].slots;
        out->layers[l].dense = s->layers[l].dense;
    }
    if (st == TSR_OK) st = tsr_kv_seq_state_alloc_rows(out);
    if (st != TSR_OK) {
        tsr_kv_seq_state_free(out);
        return TSR_ERR_NOMEM;
    }
    memcpy(out->tokens, s->tokens, (size_t)s->len * sizeof *s->tokens);
    for (int l = 0; l < kv->n_layers && st == TSR_OK; l++) {
        const tsr__player *L = &s->layers[l];
        tsr_kv_seq_layer *o = &out->layers[l];
        st = tsr__kvp_scratch(p, L->slots);
        if (st != TSR_OK) break;
        tsr__slots_of(p, L, 0, L->slots, p->sl_a);
        st = tsr_kv_store_gather(&p->kvs, p->sl_a, L->slots, o->k, o->v, o->pos, o->score);
    }
    if (st != TSR_OK) tsr_kv_seq_state_free(out);
    return st;
}

tsr_status tsr__kvp_import_seq(tsr_kv_cache *kv, int seq,
                                        const tsr_kv_seq_state *in) {
    tsr__paged *p = tsr__P(kv);
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || s->swapped || s->in_step || s->len != 0)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence %d is not empty for import",
                             seq);
    for (int l = 0; l < kv->n_layers; l++)
        if (s->layers[l].nb)
            return tsr_error_set(TSR_ERR_INVALID,
                                 "KV cache: sequence %d is not empty for import", seq);
    if (in->n_layers != kv->n_layers || in->kv_dim != kv->kv_dim ||
        (in->has_scores != 0) != (p->kvs.score != NULL))
        return tsr_error_set(TSR_ERR_INVALID,
                             "KV cache: saved sequence has %d layers x %d (scores %d), the "
                             "cache %d x %d (scores %d)", in->n_layers, in->kv_dim,
                             in->has_scores, kv->n_layers, kv->kv_dim, p->kvs.score != NULL);
    if (in->len < 0 || in->len > p->cfg.max_seq_len)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: saved sequence of %d tokens does not "
                             "fit the context of %d", in->len, p->cfg.max_seq_len);
    int64_t need = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        const tsr_kv_seq_layer *L = &in->layers[l];
        if (L->slots < 0 || L->slots > in->len || (L->dense && L->slots != in->len))
            return tsr_error_set(TSR_ERR_INVALID,
                                 "KV cache: saved layer %d has %d rows for %d tokens", l,
                                 L->slots, in->len);
        for (int32_t i = 0; i < L->slots; i++)
            if (L->pos[i] < 0 || L->pos[i] >= in->len)
                return tsr_error_set(TSR_ERR_INVALID,
                                     "KV cache: saved layer %d has position %d of %d tokens",
                                     l, L->pos[i], in->len);
        need += tsr__ceil_div(L->slots, p->bs);
    }
    if (need > p->pool->n_free)
        return tsr_error_set(TSR_ERR_NO_BLOCKS,
                             "KV cache: restoring sequence %d needs %lld blocks, %d free", seq,
                             (long long)need, p->pool->n_free);
    TSR_TRY(tsr__kvp_grow_i32(&s->tokens, &s->tok_cap, in->len > 0 ? in->len : 1));
    for (int l = 0; l < kv->n_layers; l++)
        TSR_TRY(tsr__kvp_grow_i32(&s->layers[l].blocks, &s->layers[l].cap,
                              tsr__ceil_div(in->layers[l].slots, p->bs)));
    int32_t most = 0;
    for (int l = 0; l < kv->n_layers; l++)
        if (in->layers[l].slots > most) most = in->layers[l].slots;
    TSR_TRY(tsr__kvp_scratch(p, most));
    tsr_status st = TSR_OK;
    for (int l = 0; l < kv->n_layers; l++) {
        tsr__player *L = &s->layers[l];
        const tsr_kv_seq_layer *I = &in->layers[l];
        int32_t nb = tsr__ceil_div(I->slots, p->bs);
        tsr__kvp_layer_alloc(p, l, -1, nb, L->blocks);
        L->nb = nb;
        L->slots = L->base = I->slots;
        L->dense = I->dense;
        tsr__slots_of(p, L, 0, I->slots, p->sl_a);
        if (st == TSR_OK)
            st = tsr_kv_store_scatter(&p->kvs, p->sl_a, I->slots, I->k, I->v, I->pos,
                                      in->has_scores ? I->score : NULL);
    }
    memcpy(s->tokens, in->tokens, (size_t)in->len * sizeof *s->tokens);
    s->len = in->len;
    s->n_hashed = 0;
    tsr__note_peak(p);
    TSR_TRY(st);
    /* Full blocks become prefix-cache entries again, as they were before the stop. */
    if (p->cfg.prefix_caching) TSR_TRY(tsr__kvp_hash_full_blocks(p, s));
    return TSR_OK;
}
