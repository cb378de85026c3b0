/* Collective admission over the ranks of a distributed job (see kv_dist.h). */
#include "memory/kv_dist.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

typedef struct tsr__dist {
    tsr_kv_cache base;
    tsr_kv_cache *in;
    tsr_comm *comm;
    int rank;
    int fail_rank, fail_left; /* injected shortages (tsr_kv_dist_test_fail_rank) */
    tsr_kv_dist_stats st;
} tsr__dist;

static const tsr_kv_cache_ops tsr__dist_ops;

#define TSR__D(kv) ((tsr__dist *)(kv))
#define TSR__IN(kv) (((tsr__dist *)(kv))->in)

int tsr_kv_is_dist(const tsr_kv_cache *kv) { return kv && kv->ops == &tsr__dist_ops; }

tsr_kv_cache *tsr_kv_dist_inner(const tsr_kv_cache *kv) {
    return tsr_kv_is_dist(kv) ? ((const tsr__dist *)kv)->in : (tsr_kv_cache *)kv;
}

void tsr_kv_dist_get_stats(const tsr_kv_cache *kv, tsr_kv_dist_stats *out) {
    memset(out, 0, sizeof *out);
    if (tsr_kv_is_dist(kv)) *out = ((const tsr__dist *)kv)->st;
}

void tsr_kv_dist_test_fail_rank(tsr_kv_cache *kv, int rank, int n) {
    if (!tsr_kv_is_dist(kv)) return;
    tsr__dist *d = TSR__D(kv);
    d->fail_rank = rank;
    d->fail_left = n > 0 ? n : 0;
}

/* Takes one injected shortage when this rank has one pending. */
static bool tsr__injected(tsr__dist *d) {
    if (d->fail_left <= 0 || d->rank != d->fail_rank) return false;
    d->fail_left--;
    d->st.injected++;
    return true;
}

static tsr_status tsr__shortage(const tsr__dist *d) {
    return tsr_error_set(TSR_ERR_NO_BLOCKS, "KV cache: rank %d: injected shortage (test)",
                         d->rank);
}

/* Severity of an outcome: retry-later < never-fits < a real failure. */
static int64_t tsr__severity(tsr_status st) {
    return st == TSR_OK ? 0 : st == TSR_ERR_NO_BLOCKS ? 1 : st == TSR_ERR_BUDGET ? 2 : 3;
}

/* The outcome every rank takes: the worst over the world. */
static tsr_status tsr__agree(tsr__dist *d, tsr_status local) {
    int64_t sev = tsr__severity(local);
    tsr_status st = tsr_comm_allreduce_i64(d->comm, TSR_COMM_WORLD, &sev, 1, TSR_COMM_MAX);
    if (st != TSR_OK) return st;
    d->st.agreements++;
    if (sev != tsr__severity(local)) d->st.disagreements++;
    switch (sev) {
    case 0: return TSR_OK;
    case 1:
        return local == TSR_ERR_NO_BLOCKS
                   ? local
                   : tsr_error_set(TSR_ERR_NO_BLOCKS, "KV cache: another rank is short of blocks");
    case 2:
        return local == TSR_ERR_BUDGET
                   ? local
                   : tsr_error_set(TSR_ERR_BUDGET, "KV cache: the sequence never fits another "
                                   "rank's share of the cache");
    default: return tsr_comm_agree(d->comm, sev == tsr__severity(local) ? local : TSR_OK);
    }
}

static void tsr__dist_destroy(tsr_kv_cache *kv) {
    tsr_kv_cache_destroy(TSR__IN(kv));
    tsr_free(kv);
}

/* Adding a sequence takes no blocks, so a rank that added it while another failed undoes
 * it exactly with seq_free. */
static tsr_status tsr__dist_seq_add(tsr_kv_cache *kv, int seq) {
    tsr_kv_cache *in = TSR__IN(kv);
    tsr_status local = tsr__injected(TSR__D(kv)) ? tsr__shortage(TSR__D(kv))
                                                 : in->ops->seq_add(in, seq);
    tsr_status st = tsr__agree(TSR__D(kv), local);
    if (st != TSR_OK && local == TSR_OK) in->ops->seq_free(in, seq); /* others had no room */
    return st;
}

static void tsr__dist_seq_free(tsr_kv_cache *kv, int seq) {
    tsr_kv_cache *in = TSR__IN(kv);
    in->ops->seq_free(in, seq);
}

static int32_t tsr__dist_seq_len(const tsr_kv_cache *kv, int seq) {
    const tsr_kv_cache *in = ((const tsr__dist *)kv)->in;
    return in->ops->seq_len(in, seq);
}

/* Check, agree, commit: every rank first answers without changing its cache, the ranks
 * agree, and only an agreed TSR_OK is committed, on every rank. A shortage on any rank thus
 * fails the reserve on all of them with every cache as it was, so block tables stay
 * identical and the scheduler's preemption (or deferral) is the same everywhere. Reserving
 * first and releasing on disagreement would not restore the pool: an allocation takes
 * cached prefix blocks off the free list and drops their hashes. */
static tsr_status tsr__dist_reserve(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr__dist *d = TSR__D(kv);
    tsr_status local = tsr__injected(d) ? tsr__shortage(d)
                                        : d->in->ops->reserve_check(d->in, seq, n);
    TSR_TRY(tsr__agree(d, local));
    /* The paged reserve cannot fail now; the policy's own step hook (h2o materialize's
     * memory check) still can, on one rank, and the others are past the agreement. */
    tsr_status st = d->in->ops->reserve(d->in, seq, n);
    if (st != TSR_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s (after the ranks agreed on the reserve)",
                 tsr_last_error());
        tsr_comm_abort(d->comm, 1, msg);
    }
    return TSR_OK;
}

static tsr_status tsr__dist_write(tsr_kv_cache *kv, int layer, int seq, int32_t n,
                                  const float *k, const float *v) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->write(in, layer, seq, n, k, v);
}

static tsr_status tsr__dist_spans(tsr_kv_cache *kv, int layer, int seq,
                                  const tsr_kv_span **spans, int *n_spans) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->spans(in, layer, seq, spans, n_spans);
}

static tsr_status tsr__dist_observe(tsr_kv_cache *kv, int layer, int seq,
                                    const float *key_scores) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->observe ? in->ops->observe(in, layer, seq, key_scores) : TSR_OK;
}

static tsr_status tsr__dist_queries(tsr_kv_cache *kv, int layer, int seq, const float *q,
                                    const int32_t *q_pos, int n_q, int n_heads) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->queries ? in->ops->queries(in, layer, seq, q, q_pos, n_q, n_heads) : TSR_OK;
}

static tsr_status tsr__dist_attn_input(tsr_kv_cache *kv, int layer, int seq, const float *x,
                                       int n, int dim) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->attn_input ? in->ops->attn_input(in, layer, seq, x, n, dim) : TSR_OK;
}

static tsr_status tsr__dist_commit(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                   int32_t n) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->commit(in, seq, tokens, n);
}

/* Prefix hits are agreed on (MIN); a rank that found more drops back to the shared count
 * by starting the sequence again and attaching only that many tokens. */
static int32_t tsr__dist_prefix_attach(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                       int32_t n) {
    tsr__dist *d = TSR__D(kv);
    tsr_kv_cache *in = d->in;
    int32_t got = in->ops->prefix_attach ? in->ops->prefix_attach(in, seq, tokens, n) : 0;
    int64_t agreed = got;
    if (tsr_comm_allreduce_i64(d->comm, TSR_COMM_WORLD, &agreed, 1, TSR_COMM_MIN) != TSR_OK)
        tsr_comm_abort(d->comm, 1, "KV cache: prefix agreement failed");
    d->st.agreements++;
    if (agreed == got) return got;
    d->st.disagreements++;
    in->ops->seq_free(in, seq);
    if (in->ops->seq_add(in, seq) != TSR_OK)
        tsr_comm_abort(d->comm, 1, "KV cache: cannot restart a sequence after a prefix "
                                   "disagreement");
    /* Attach at most `agreed` tokens: offer the prefix whose last token is computed. */
    int32_t again = agreed > 0 ? in->ops->prefix_attach(in, seq, tokens, (int32_t)agreed + 1) : 0;
    if (again != agreed)
        tsr_comm_abort(d->comm, 1, "KV cache: ranks disagree on cached prefixes");
    return again;
}

static void tsr__dist_stats(const tsr_kv_cache *kv, tsr_kv_stats *out) {
    const tsr_kv_cache *in = ((const tsr__dist *)kv)->in;
    in->ops->stats(in, out);
}

static void tsr__dist_detail(const tsr_kv_cache *kv, tsr_kv_detail *out) {
    tsr_kv_cache_detail(((const tsr__dist *)kv)->in, out);
}

/* Checkpoints are per rank (its shard): local, like the rows they hold. */
static tsr_status tsr__dist_export_seq(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out) {
    return tsr_kv_export_seq(((const tsr__dist *)kv)->in, seq, out);
}

static tsr_status tsr__dist_import_seq(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *st) {
    return tsr_kv_import_seq(TSR__IN(kv), seq, st);
}

/* This rank's answer (the agreement is reserve's). */
static tsr_status tsr__dist_reserve_check(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr_kv_cache *in = TSR__IN(kv);
    return in->ops->reserve_check(in, seq, n);
}

static int32_t tsr__dist_seq_blocks(const tsr_kv_cache *kv, int layer, int seq,
                                    const int32_t **ids) {
    const tsr_kv_cache *in = ((const tsr__dist *)kv)->in;
    return in->ops->seq_blocks(in, layer, seq, ids);
}

/* Swap is collective like reserve: every rank checks (its host pool for a swap-out, its
 * blocks for a swap-in), the ranks agree, and only an agreed TSR_OK is carried out,
 * everywhere; a shortage on any rank leaves every cache as it was, so the scheduler falls
 * back to recompute (or keeps the sequence out) on all ranks alike. */
static tsr_status tsr__dist_swap(tsr_kv_cache *kv, int seq, int check, int64_t *bytes,
                                 int out) {
    tsr__dist *d = TSR__D(kv);
    tsr_status (*op)(tsr_kv_cache *, int, int, int64_t *) = out ? tsr_kv_swap_out
                                                                : tsr_kv_swap_in;
    tsr_status local = op(d->in, seq, 1, bytes);
    if (check) return local; /* this rank's answer (the agreement is the call's) */
    TSR_TRY(tsr__agree(d, local));
    tsr_status st = op(d->in, seq, 0, bytes);
    if (st != TSR_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s (after the ranks agreed on the swap)", tsr_last_error());
        tsr_comm_abort(d->comm, 1, msg);
    }
    return st;
}

static tsr_status tsr__dist_swap_out(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    return tsr__dist_swap(kv, seq, check, bytes, 1);
}

static tsr_status tsr__dist_swap_in(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    return tsr__dist_swap(kv, seq, check, bytes, 0);
}

static const tsr_kv_cache_ops tsr__dist_ops = {
    .name = "dist",
    .destroy = tsr__dist_destroy,
    .seq_add = tsr__dist_seq_add,
    .seq_free = tsr__dist_seq_free,
    .seq_len = tsr__dist_seq_len,
    .reserve = tsr__dist_reserve,
    .write = tsr__dist_write,
    .spans = tsr__dist_spans,
    .observe = tsr__dist_observe,
    .commit = tsr__dist_commit,
    .prefix_attach = tsr__dist_prefix_attach,
    .stats = tsr__dist_stats,
    .queries = tsr__dist_queries,
    .attn_input = tsr__dist_attn_input,
    .detail = tsr__dist_detail,
    .export_seq = tsr__dist_export_seq,
    .import_seq = tsr__dist_import_seq,
    .reserve_check = tsr__dist_reserve_check,
    .seq_blocks = tsr__dist_seq_blocks,
    .swap_out = tsr__dist_swap_out,
    .swap_in = tsr__dist_swap_in,
};

tsr_status tsr_kv_dist_create(tsr_kv_cache *inner, tsr_comm *comm, tsr_kv_cache **out) {
    *out = NULL;
    /* Agreeing before committing needs a reserve that can be checked first. */
    if (!inner->ops->reserve_check || !inner->ops->seq_blocks)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: the distributed block manager needs "
                                              "a paged cache (%s)", inner->ops->name);
    tsr__dist *d = tsr_calloc(1, sizeof *d);
    if (!d) return TSR_ERR_NOMEM;
    d->base = *inner; /* geometry and wants_scores */
    d->base.ops = &tsr__dist_ops;
    d->in = inner;
    d->comm = comm;
    d->rank = tsr_comm_world_rank(comm);
    *out = &d->base;
    return TSR_OK;
}

uint64_t tsr_kv_dist_tables_digest(const tsr_kv_cache *kv, int n_seqs) {
    const tsr_kv_cache *c = kv;
    if (!c->ops->seq_blocks) return 0;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over (seq, layer, block ids) */
    for (int s = 0; s < n_seqs; s++)
        for (int l = 0; l < c->n_layers; l++) {
            const int32_t *ids = NULL;
            int32_t nb = c->ops->seq_blocks(c, l, s, &ids);
            int32_t v[3] = {s, l, nb};
            for (int i = 0; i < 3 + (nb > 0 ? nb : 0); i++) {
                uint32_t x = (uint32_t)(i < 3 ? v[i] : ids[i - 3]);
                for (int b = 0; b < 4; b++) {
                    h ^= (x >> (8 * b)) & 0xffu;
                    h *= 1099511628211ull;
                }
            }
        }
    return h;
}
