/* The paged KV cache over the block pool: block metadata and tables. Block b of the pool
 * owns slots [b*bs, (b+1)*bs) of the store (memory/kv_store.h: K/V rows in backend memory,
 * positions and scores on the host); a sequence's layer table lists its blocks, and slot s
 * of the layer lives at table[s / bs], offset s % bs. While a layer never lost a token
 * ("dense"), slot s holds position s: its full blocks are hashed for prefix sharing and
 * spans are contiguous (pos0). Rows move only through the store, one backend call per
 * batch of slots. This file: tables, reserve, write, spans, prefix sharing, the cache ops;
 * kv_paged_slots.c: the policies' slot mechanism, fork, swap, drop and checkpoints. */
#include "memory/kv_paged.h"

#include <string.h>

#include "memory/kv_paged_internal.h"
#include "base/alloc.h"

static const tsr_kv_cache_ops tsr__paged_ops;

int64_t tsr_kv_paged_block_bytes(const tsr_kv_paged_config *cfg) {
    int64_t bs = cfg->block_size > 0 ? cfg->block_size : 16;
    int64_t kvd = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    return bs * (2 * (int64_t)tsr_kv_row_bytes(cfg->kv_dtype, kvd) + 4 +
                 (cfg->keep_scores ? 4 : 0));
}

int tsr_kv_is_paged(const tsr_kv_cache *kv) { return kv && kv->ops == &tsr__paged_ops; }

/* Makes the scratch slot lists hold n entries each. */
tsr_status tsr__kvp_scratch(tsr__paged *p, int64_t n) {
    if (n <= p->sl_cap) return TSR_OK;
    int64_t c = p->sl_cap ? p->sl_cap : 256;
    while (c < n) c *= 2;
    int32_t *a = tsr_realloc(p->sl_a, (size_t)c * sizeof *a);
    if (!a) return TSR_ERR_NOMEM;
    p->sl_a = a;
    int32_t *b = tsr_realloc(p->sl_b, (size_t)c * sizeof *b);
    if (!b) return TSR_ERR_NOMEM;
    p->sl_b = b;
    p->sl_cap = c;
    return TSR_OK;
}

tsr_status tsr__kvp_grow_i32(int32_t **a, int32_t *cap, int32_t need) {
    if (need <= *cap) return TSR_OK;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    int32_t *n = tsr_realloc(*a, (size_t)c * sizeof *n);
    if (!n) return TSR_ERR_NOMEM;
    *a = n;
    *cap = c;
    return TSR_OK;
}

/* Releases every block of a layer, tail first. */
void tsr__kvp_layer_release(tsr__paged *p, tsr__player *L) {
    for (int32_t i = L->nb - 1; i >= 0; i--) tsr_block_pool_unref(p->pool, &L->blocks[i], 1);
    L->nb = 0;
}

void tsr__kvp_seq_release(tsr__paged *p, tsr__pseq *s) {
    if (s->layers) {
        for (int l = p->base.n_layers - 1; l >= 0; l--) {
            tsr__kvp_layer_release(p, &s->layers[l]);
            tsr_free(s->layers[l].blocks);
        }
    }
    if (s->swap_buf) tsr_host_pool_free(p->cfg.host, s->swap_buf, s->swap_bytes);
    tsr_free(s->layers);
    tsr_free(s->tokens);
    tsr_free(s->hashes);
    memset(s, 0, sizeof *s);
}

static void tsr__paged_destroy(tsr_kv_cache *kv) {
    tsr__paged *p = (tsr__paged *)kv;
    if (p->seqs)
        for (int i = 0; i < p->cfg.max_seqs; i++)
            if (p->seqs[i].active) tsr__kvp_seq_release(p, &p->seqs[i]);
    tsr_free(p->seqs);
    tsr_free(p->spans);
    tsr_free(p->sl_a);
    tsr_free(p->sl_b);
    tsr_kv_store_release(&p->kvs);
    tsr_block_pool_destroy(p->pool);
    tsr_free(p);
}

tsr_status tsr__kvp_seq_add(tsr_kv_cache *kv, int seq) {
    tsr__paged *p = (tsr__paged *)kv;
    if (seq < 0 || seq >= p->cfg.max_seqs)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence id %d out of range [0, %d)",
                             seq, p->cfg.max_seqs);
    tsr__pseq *s = &p->seqs[seq];
    if (s->active)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence %d already exists", seq);
    s->layers = tsr_calloc((size_t)kv->n_layers, sizeof *s->layers);
    if (!s->layers) return TSR_ERR_NOMEM;
    for (int l = 0; l < kv->n_layers; l++) s->layers[l].dense = 1;
    s->active = 1;
    return TSR_OK;
}

static void tsr__paged_seq_free(tsr_kv_cache *kv, int seq) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s = tsr__seq(p, seq);
    if (s) tsr__kvp_seq_release(p, s);
}

static int32_t tsr__paged_seq_len(const tsr_kv_cache *kv, int seq) {
    const tsr__pseq *s = tsr__seq((const tsr__paged *)kv, seq);
    return s ? s->len : 0;
}

/* Blocks layer L must gain to hold `rows` more slots after its first `slots`, and whether
 * its partial last block is shared (then written rows need a private copy first). */
static int32_t tsr__layer_need(const tsr__paged *p, const tsr__player *L, int32_t slots,
                               int32_t rows, int *cow) {
    int32_t want = tsr__ceil_div((int64_t)slots + rows, p->bs);
    *cow = rows > 0 && slots % p->bs != 0 && L->nb > 0 && slots / p->bs == L->nb - 1 &&
           p->pool->blocks[L->blocks[L->nb - 1]].ref_cnt > 1;
    return (want > L->nb ? want - L->nb : 0) + *cow;
}

/* n new blocks for layer l into ids, the first to follow block `prev` (-1: none). Each
 * takes the block right after the one before it when that block lies in layer l's share
 * of the ids ([l*N/L, (l+1)*N/L) of N blocks, L layers) and is free with nothing cached;
 * else the pool's LRU head, as plain allocation would. Blocks are handed out in id order,
 * so without this a decode step's new blocks interleave the layers and a layer's rows lie
 * in 16-row pieces a pool's width apart, which read 25-30 % slower than one run
 * (bench/attn.c --interleave, docs/kv-cache.md). The caller checked that n are free. */
void tsr__kvp_layer_alloc(tsr__paged *p, int l, int32_t prev, int32_t n, int32_t *ids) {
    int64_t nbk = p->pool->n_blocks, nl = p->base.n_layers;
    int32_t lo = (int32_t)(nbk * l / nl), hi = (int32_t)(nbk * (l + 1) / nl);
    for (int32_t i = 0; i < n; i++) {
        int32_t want = prev >= 0 ? prev + 1 : lo;
        if (!(want >= lo && want < hi && tsr_block_pool_take(p->pool, want))) {
            tsr_status st = tsr_block_pool_alloc(p->pool, 1, &want);
            TSR_ASSERT(st == TSR_OK);
        }
        ids[i] = prev = want;
    }
}

/* Makes the partial last block of layer l private (copy-on-write): one kv_copy of its
 * used rows. A free block must exist and the scratch lists hold bs entries. */
static tsr_status tsr__layer_cow(tsr__paged *p, int l, tsr__player *L) {
    int32_t old = L->blocks[L->nb - 1], nw;
    tsr__kvp_layer_alloc(p, l, L->nb > 1 ? L->blocks[L->nb - 2] : -1, 1, &nw);
    int32_t used = L->slots - (L->nb - 1) * p->bs;
    for (int32_t j = 0; j < used; j++) {
        p->sl_a[j] = nw * p->bs + j;
        p->sl_b[j] = old * p->bs + j;
    }
    tsr_block_pool_unref(p->pool, &old, 1);
    L->blocks[L->nb - 1] = nw;
    p->st.cow_copies++;
    return tsr_kv_store_copy(&p->kvs, p->sl_a, p->sl_b, used);
}

/* The rows a reserve grows from: a retried step (retry) drops the rows of the failed one. */
static int32_t tsr__rows_from(const tsr__player *L, int retry) {
    return retry ? L->base : L->slots;
}

/* The check half of growing the layers in [l0, l1) by `rows` slots each: the answer the
 * commit would give, changing nothing but array capacity, so that the commit cannot fail
 * (the distributed block manager agrees on this answer before any rank commits). */
static tsr_status tsr__reserve_check(tsr__paged *p, tsr__pseq *s, int seq, int l0, int l1,
                                     int32_t rows, int retry) {
    int64_t need = 0, total = 0;
    for (int l = l0; l < l1; l++) {
        int cow;
        int32_t from = tsr__rows_from(&s->layers[l], retry);
        need += tsr__layer_need(p, &s->layers[l], from, rows, &cow);
        total += tsr__ceil_div((int64_t)from + rows, p->bs);
    }
    for (int l = 0; l < p->base.n_layers; l++)
        if (l < l0 || l >= l1) total += s->layers[l].nb;
    if (total > p->pool->n_blocks)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: sequence %d needs %lld blocks, the pool holds %d "
                             "(--kv-memory)", seq, (long long)total, p->pool->n_blocks);
    if (need > p->pool->n_free)
        return tsr_error_set(TSR_ERR_NO_BLOCKS,
                             "KV cache: sequence %d needs %lld more blocks, %d free", seq,
                             (long long)need, p->pool->n_free);
    for (int l = l0; l < l1; l++) {
        tsr__player *L = &s->layers[l];
        int32_t want = tsr__ceil_div((int64_t)tsr__rows_from(L, retry) + rows, p->bs);
        TSR_TRY(tsr__kvp_grow_i32(&L->blocks, &L->cap, want));
    }
    return tsr__kvp_scratch(p, p->bs);
}

/* The commit half, after a passed check with nothing changed in between: the block tables
 * cannot fail now; only a copy-on-write's backend copy can (a device failure). */
static tsr_status tsr__reserve_commit(tsr__paged *p, tsr__pseq *s, int l0, int l1,
                                      int32_t rows, int retry) {
    tsr_status st = TSR_OK;
    for (int l = l0; l < l1; l++) {
        tsr__player *L = &s->layers[l];
        L->slots = tsr__rows_from(L, retry);
        int cow;
        int32_t add = tsr__layer_need(p, L, L->slots, rows, &cow) - cow;
        if (cow) {
            tsr_status cs = tsr__layer_cow(p, l, L);
            if (st == TSR_OK) st = cs;
        }
        tsr__kvp_layer_alloc(p, l, L->nb > 0 ? L->blocks[L->nb - 1] : -1, add, L->blocks + L->nb);
        L->nb += add;
    }
    tsr__note_peak(p);
    return st;
}

/* Check-then-commit growth of the layers in [l0, l1) by `rows` slots each. */
tsr_status tsr__kvp_reserve_layers(tsr__paged *p, tsr__pseq *s, int seq, int l0, int l1,
                                      int32_t rows) {
    TSR_TRY(tsr__reserve_check(p, s, seq, l0, l1, rows, 0));
    return tsr__reserve_commit(p, s, l0, l1, rows, 0);
}

/* Everything reserve(seq, n) checks; on TSR_OK the reserve cannot fail. */
static tsr_status tsr__paged_reserve_check(tsr__paged *p, int seq, int32_t n,
                                           tsr__pseq **out) {
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s) return tsr_error_set(TSR_ERR_INVALID, "KV cache: no sequence %d", seq);
    if (s->swapped)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence %d is swapped out", seq);
    if (n < 0 || (int64_t)s->len + n > p->cfg.max_seq_len)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: sequence %d needs %lld tokens, the context holds %d",
                             seq, (long long)s->len + n, p->cfg.max_seq_len);
    TSR_TRY(tsr__reserve_check(p, s, seq, 0, p->base.n_layers, n, s->in_step));
    TSR_TRY(tsr__kvp_grow_i32(&s->tokens, &s->tok_cap, s->len + n));
    *out = s;
    return TSR_OK;
}

static tsr_status tsr__paged_reserve_check_op(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr__pseq *s;
    return tsr__paged_reserve_check(tsr__P(kv), seq, n, &s);
}

tsr_status tsr_kv_paged_reserve_check(tsr_kv_cache *kv, int seq, int32_t n) {
    return tsr__paged_reserve_check_op(kv, seq, n);
}

/* A failed reserve changes nothing; a retried step (in_step) drops the rows the failed one
 * wrote and keeps its blocks. */
static tsr_status tsr__paged_reserve(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s;
    TSR_TRY(tsr__paged_reserve_check(p, seq, n, &s));
    tsr_status st = tsr__reserve_commit(p, s, 0, kv->n_layers, n, s->in_step);
    for (int l = 0; l < kv->n_layers; l++) s->layers[l].base = s->layers[l].slots;
    s->in_step = 1;
    return st;
}

static tsr_status tsr__paged_write(tsr_kv_cache *kv, int layer, int seq, int32_t n,
                                   const float *k, const float *v) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || layer < 0 || layer >= kv->n_layers || !s->in_step || n < 0)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: bad write (seq %d, layer %d)", seq,
                             layer);
    tsr__player *L = &s->layers[layer];
    if ((int64_t)L->base + n > (int64_t)L->nb * p->bs)
        return tsr_error_set(TSR_ERR_INTERNAL, "KV cache: write of %d rows past reservation",
                             n);
    TSR_TRY(tsr__kvp_scratch(p, n));
    for (int32_t i = 0; i < n; i++) {
        int32_t slot = L->base + i;
        TSR_ASSERT(p->pool->blocks[L->blocks[slot / p->bs]].ref_cnt == 1);
        p->sl_a[i] = tsr__slot(p, L, slot);
    }
    /* One backend call for the layer's chunk (the rows are the layer's activations). */
    TSR_TRY(tsr_kv_store_write(&p->kvs, p->sl_a, n, k, v, s->len));
    L->slots = L->base + n;
    return TSR_OK;
}

/* write()'s bookkeeping for a dense layer; the rows move later in the caller's one
 * kv_write for the whole batch (tsr_kv_cache_ops.write_slots). */
static tsr_status tsr__paged_write_slots(tsr_kv_cache *kv, int layer, int seq, int32_t n,
                                         int32_t *slots, tsr_kv_layout *lay,
                                         const int32_t **table, int32_t *n_blocks) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || layer < 0 || layer >= kv->n_layers || !s->in_step || n < 0)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: bad write (seq %d, layer %d)", seq,
                             layer);
    tsr__player *L = &s->layers[layer];
    if (!L->dense || L->base != s->len) return TSR_ERR_UNSUPPORTED;
    if ((int64_t)L->base + n > (int64_t)L->nb * p->bs)
        return tsr_error_set(TSR_ERR_INTERNAL, "KV cache: write of %d rows past reservation",
                             n);
    for (int32_t i = 0; i < n; i++) {
        int32_t slot = L->base + i;
        TSR_ASSERT(p->pool->blocks[L->blocks[slot / p->bs]].ref_cnt == 1);
        slots[i] = tsr__slot(p, L, slot);
        p->kvs.pos[slots[i]] = s->len + i; /* what tsr_kv_store_write records */
        if (p->kvs.score) p->kvs.score[slots[i]] = 0.0f;
    }
    L->slots = L->base + n;
    *lay = p->kvs.lay;
    *table = L->blocks;
    *n_blocks = tsr__ceil_div(L->slots, p->bs);
    return TSR_OK;
}

static tsr_status tsr__paged_spans(tsr_kv_cache *kv, int layer, int seq,
                                   const tsr_kv_span **spans, int *n_spans) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || layer < 0 || layer >= kv->n_layers || s->swapped)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: bad spans (seq %d, layer %d)", seq,
                             layer);
    tsr__player *L = &s->layers[layer];
    int32_t nsp = tsr__ceil_div(L->slots, p->bs);
    if (nsp > p->spans_cap) {
        tsr_kv_span *ns = tsr_realloc(p->spans, (size_t)nsp * sizeof *ns);
        if (!ns) return TSR_ERR_NOMEM;
        p->spans = ns;
        p->spans_cap = nsp;
    }
    for (int32_t j = 0; j < nsp; j++) {
        size_t at = (size_t)L->blocks[j] * p->bs;
        int32_t n = L->slots - j * p->bs < p->bs ? L->slots - j * p->bs : p->bs;
        const int32_t *pos = p->kvs.pos + at;
        int contiguous = 1;
        if (!L->dense)
            for (int32_t i = 1; i < n && contiguous; i++) contiguous = pos[i] == pos[0] + i;
        p->spans[j] = (tsr_kv_span){.k = tsr_kv_store_block_k(&p->kvs, L->blocks[j]),
                                    .v = tsr_kv_store_block_v(&p->kvs, L->blocks[j]),
                                    .pos = contiguous ? NULL : pos,
                                    .pos0 = L->dense ? j * p->bs : pos[0], .n = n,
                                    .stride = kv->kv_dim, .dtype = p->kvs.lay.dtype};
    }
    *spans = p->spans;
    *n_spans = nsp;
    return TSR_OK;
}

tsr_status tsr__kvp_hash_full_blocks(tsr__paged *p, tsr__pseq *s) {
    int32_t full = s->len / p->bs;
    if (full <= s->n_hashed) return TSR_OK;
    if (full > s->hash_cap) {
        int32_t c = s->hash_cap ? s->hash_cap : 16;
        while (c < full) c *= 2;
        uint64_t *nh = tsr_realloc(s->hashes, (size_t)c * sizeof *nh);
        if (!nh) return TSR_ERR_NOMEM;
        s->hashes = nh;
        s->hash_cap = c;
    }
    for (int32_t i = s->n_hashed; i < full; i++) {
        s->hashes[i] = tsr_block_hash(i ? s->hashes[i - 1] : 0, s->tokens + (size_t)i * p->bs,
                                      p->bs, 0);
        for (int l = 0; l < p->base.n_layers; l++) {
            tsr__player *L = &s->layers[l];
            if (L->dense && i < L->nb)
                tsr_block_pool_set_hash(p->pool, L->blocks[i], tsr__layer_hash(s->hashes[i], l));
        }
    }
    s->n_hashed = full;
    return TSR_OK;
}

static tsr_status tsr__paged_commit(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                    int32_t n) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || !s->in_step || (int64_t)s->len + n > s->tok_cap)
        return tsr_error_set(TSR_ERR_INTERNAL, "KV cache: bad commit (seq %d, %d tokens)", seq,
                             n);
    if (tokens) memmove(s->tokens + s->len, tokens, (size_t)n * sizeof *tokens);
    else memset(s->tokens + s->len, 0, (size_t)n * sizeof *tokens);
    s->len += n;
    s->in_step = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        tsr__player *L = &s->layers[l];
        L->base = L->slots;
        if (L->dense && L->slots != s->len) L->dense = 0;
    }
    if (p->cfg.prefix_caching && tokens) TSR_TRY(tsr__kvp_hash_full_blocks(p, s));
    return TSR_OK;
}

static int32_t tsr__paged_prefix_attach(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                        int32_t n) {
    tsr__paged *p = (tsr__paged *)kv;
    tsr__pseq *s = tsr__seq(p, seq);
    if (!s || s->len != 0 || s->swapped || n <= 0) return 0;
    p->st.prefix_query_tokens += n;
    if (!p->cfg.prefix_caching) return 0;
    int32_t max_blocks = (n - 1) / p->bs, hit = 0;
    uint64_t chain = 0;
    uint64_t *chains = tsr_malloc((size_t)(max_blocks ? max_blocks : 1) * sizeof *chains);
    if (!chains) return 0;
    for (; hit < max_blocks; hit++) {
        chain = tsr_block_hash(chain, tokens + (size_t)hit * p->bs, p->bs, 0);
        int all = 1;
        for (int l = 0; l < kv->n_layers && all; l++)
            all = tsr_block_pool_lookup(p->pool, tsr__layer_hash(chain, l)) >= 0;
        if (!all) break;
        chains[hit] = chain;
    }
    int ok = hit > 0;
    for (int l = 0; l < kv->n_layers && ok; l++)
        ok = tsr__kvp_grow_i32(&s->layers[l].blocks, &s->layers[l].cap, hit) == TSR_OK;
    ok = ok && tsr__kvp_grow_i32(&s->tokens, &s->tok_cap, hit * p->bs) == TSR_OK;
    if (ok && hit > s->hash_cap) {
        uint64_t *nh = tsr_realloc(s->hashes, (size_t)hit * sizeof *nh);
        ok = nh != NULL;
        if (ok) {
            s->hashes = nh;
            s->hash_cap = hit;
        }
    }
    if (!ok) {
        tsr_free(chains);
        return 0;
    }
    for (int l = 0; l < kv->n_layers; l++) {
        tsr__player *L = &s->layers[l];
        for (int32_t i = 0; i < hit; i++) {
            int32_t b = tsr_block_pool_lookup(p->pool, tsr__layer_hash(chains[i], l));
            tsr_block_pool_ref(p->pool, b);
            L->blocks[i] = b;
        }
        L->nb = hit;
        L->slots = L->base = hit * p->bs;
    }
    memcpy(s->hashes, chains, (size_t)hit * sizeof *chains);
    tsr_free(chains);
    s->n_hashed = hit;
    s->len = hit * p->bs;
    memcpy(s->tokens, tokens, (size_t)s->len * sizeof *tokens);
    p->st.prefix_hit_tokens += s->len;
    tsr__note_peak(p);
    return s->len;
}

void tsr_kv_paged_get_stats(const tsr_kv_cache *kv, tsr_kv_paged_stats *out) {
    const tsr__paged *p = tsr__P(kv);
    *out = p->st;
    out->block_size = p->bs;
    out->blocks_total = p->pool->n_blocks;
    out->blocks_used = p->pool->n_blocks - p->pool->n_free;
    out->blocks_cached = 0;
    for (int32_t i = p->pool->free_head; i >= 0; i = p->pool->blocks[i].next)
        if (p->pool->blocks[i].hash) out->blocks_cached++;
    out->block_bytes = tsr_kv_paged_block_bytes(&p->cfg);
    out->cached_evictions = p->pool->cached_evictions;
}

static void tsr__paged_stats(const tsr_kv_cache *kv, tsr_kv_stats *out) {
    const tsr__paged *p = (const tsr__paged *)kv;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < p->cfg.max_seqs; i++)
        if (p->seqs[i].active && !p->seqs[i].swapped)
            out->tokens_resident += p->seqs[i].layers[0].slots;
    int64_t bb = tsr_kv_paged_block_bytes(&p->cfg);
    out->bytes_used = (int64_t)(p->pool->n_blocks - p->pool->n_free) * bb;
    out->bytes_peak = (int64_t)p->st.blocks_peak * bb;
    out->bytes_capacity = (int64_t)p->pool->n_blocks * bb;
    out->evictions = p->st.evicted_tokens;
}

static void tsr__paged_detail(const tsr_kv_cache *kv, tsr_kv_detail *out) {
    out->policy = "paged";
    tsr__paged_stats(kv, &out->kv);
    tsr_kv_paged_get_stats(kv, &out->blocks);
}

tsr_backend *tsr_kv_paged_backend(const tsr_kv_cache *kv) { return tsr__P(kv)->kvs.be; }

int32_t tsr_kv_paged_block_size(const tsr_kv_cache *kv) { return tsr__P(kv)->bs; }
int32_t tsr_kv_paged_free_blocks(const tsr_kv_cache *kv) { return tsr__P(kv)->pool->n_free; }

int32_t tsr_kv_paged_seq_blocks(const tsr_kv_cache *kv, int layer, int seq,
                                const int32_t **ids) {
    const tsr__paged *p = tsr__P(kv);
    const tsr__pseq *s = tsr__seq(p, seq);
    if (!s || layer < 0 || layer >= kv->n_layers) return 0;
    if (ids) *ids = s->layers[layer].blocks;
    return s->layers[layer].nb;
}

static const tsr_kv_cache_ops tsr__paged_ops = {
    .name = "paged",
    .destroy = tsr__paged_destroy,
    .seq_add = tsr__kvp_seq_add,
    .seq_free = tsr__paged_seq_free,
    .seq_len = tsr__paged_seq_len,
    .reserve = tsr__paged_reserve,
    .write = tsr__paged_write,
    .spans = tsr__paged_spans,
    .observe = NULL,
    .commit = tsr__paged_commit,
    .prefix_attach = tsr__paged_prefix_attach,
    .stats = tsr__paged_stats,
    .detail = tsr__paged_detail,
    .export_seq = tsr__kvp_export_seq,
    .import_seq = tsr__kvp_import_seq,
    .reserve_check = tsr__paged_reserve_check_op,
    .seq_blocks = tsr_kv_paged_seq_blocks,
    .swap_out = tsr__kvp_swap_out_op,
    .swap_in = tsr__kvp_swap_in_op,
    .write_slots = tsr__paged_write_slots,
};

tsr_status tsr_kv_paged_create(const tsr_kv_paged_config *cfg, tsr_kv_cache **out) {
    *out = NULL;
    if (cfg->n_layers <= 0 || cfg->n_kv_heads <= 0 || cfg->head_dim <= 0 ||
        cfg->max_seqs <= 0 || cfg->max_seq_len <= 0 || cfg->block_size < 0)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: invalid geometry");
    if (!cfg->be)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: no backend for the K/V store "
                             "(tsr_kv_paged_config.be is NULL)");
    if (!tsr_kv_dtype_fits(cfg->kv_dtype, cfg->head_dim))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: --kv-dtype %s does not fit heads "
                             "of %d elements (q8 needs a multiple of %d)",
                             tsr_kv_dtype_name(cfg->kv_dtype), cfg->head_dim, TSR_KV_Q8_BLOCK);
    int64_t bb = tsr_kv_paged_block_bytes(cfg);
    int64_t nblocks = cfg->memory_bytes / bb;
    if (nblocks <= 0)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: --kv-memory %lld bytes holds no block of %lld bytes",
                             (long long)cfg->memory_bytes, (long long)bb);
    if (nblocks > INT32_MAX / 1024) nblocks = INT32_MAX / 1024;
    tsr__paged *p = tsr_calloc(1, sizeof *p);
    if (!p) return TSR_ERR_NOMEM;
    p->cfg = *cfg;
    p->bs = cfg->block_size > 0 ? cfg->block_size : 16;
    p->cfg.block_size = p->bs;
    p->base = (tsr_kv_cache){.ops = &tsr__paged_ops, .n_layers = cfg->n_layers,
                             .kv_dim = cfg->n_kv_heads * cfg->head_dim,
                             .n_kv_heads = cfg->n_kv_heads, .max_seq_len = cfg->max_seq_len,
                             .wants_scores = 0};
    tsr_status st = tsr_block_pool_create((int32_t)nblocks, &p->pool);
    if (st == TSR_OK)
        st = tsr_kv_store_init(&p->kvs, cfg->be, nblocks, p->bs, (int32_t)tsr__kvd(p),
                               cfg->kv_dtype, cfg->keep_scores != 0);
    if (st == TSR_OK) {
        p->seqs = tsr_calloc((size_t)cfg->max_seqs, sizeof *p->seqs);
        if (!p->seqs)
            st = tsr_error_set(TSR_ERR_NOMEM, "KV cache: cannot allocate a pool of %lld bytes",
                               (long long)(nblocks * bb));
    }
    if (st != TSR_OK) {
        tsr__paged_destroy(&p->base);
        return st;
    }
    *out = &p->base;
    return TSR_OK;
}
