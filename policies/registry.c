/* The policy table and the wrapper cache that runs a policy's hooks around the paged
 * mechanism. A new policy: one file defining a tsr_kv_policy_ops, one line below. */
#include <math.h>
#include <string.h>

#include "policies/policy.h"
#include "base/alloc.h"

static const tsr_kv_policy_ops *const tsr__policies[] = {
    &tsr_kv_policy_paged,
    &tsr_kv_policy_h2o,
    &tsr_kv_policy_offload,
    &tsr_kv_policy_snapkv,
    &tsr_kv_policy_streaming,
};

const tsr_kv_policy_ops *tsr_kv_policy_find(const char *name) {
    for (size_t i = 0; i < sizeof tsr__policies / sizeof tsr__policies[0]; i++)
        if (name && strcmp(tsr__policies[i]->name, name) == 0) return tsr__policies[i];
    return NULL;
}

const char *tsr_kv_policy_names(void) { return "paged|h2o|offload|snapkv|streaming"; }

int32_t tsr_kv_policy_budget(const tsr_kv_policy_config *cfg, int32_t len) {
    double b = cfg->budget;
    if (b <= 0.0) return len;
    int64_t t = b <= 1.0 ? (int64_t)ceil(b * len) : (int64_t)b;
    if (t < 1) t = 1;
    return t < len ? (int32_t)t : len;
}

tsr_status tsr_kv_policy_sum_heads(const tsr_kv_policy_config *cfg, const float *parts,
                                   int n_local, size_t n, float *out) {
    if (cfg->comm && tsr_comm_size(cfg->comm, TSR_COMM_TP) > 1) {
        if (tsr_comm_uses_nccl(cfg->comm))
            return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV policy scores under tensor "
                                 "parallelism need the MPI data plane (host memory), not NCCL");
        return tsr_comm_allreduce_sum_f32_parts(cfg->comm, TSR_COMM_TP, parts, n_local, n, out);
    }
    if (n == 0) return TSR_OK;
    memcpy(out, parts, n * sizeof *out);
    for (int h = 1; h < n_local; h++)
        for (size_t i = 0; i < n; i++) out[i] += parts[(size_t)h * n + i];
    return TSR_OK;
}

typedef struct tsr__pcache {
    tsr_kv_cache base;
    tsr_kv_cache *mech;
    const tsr_kv_policy_ops *pol;
    void *state;
    tsr_host_pool *owned_host;
} tsr__pcache;

static const tsr_kv_cache_ops tsr__pcache_ops;

int tsr_kv_is_policy(const tsr_kv_cache *kv) { return kv && kv->ops == &tsr__pcache_ops; }

tsr_kv_cache *tsr_kv_policy_mech(const tsr_kv_cache *kv) {
    return tsr_kv_is_policy(kv) ? ((const tsr__pcache *)kv)->mech : NULL;
}

const char *tsr_kv_policy_name(const tsr_kv_cache *kv) {
    return tsr_kv_is_policy(kv) ? ((const tsr__pcache *)kv)->pol->name : kv->ops->name;
}

void tsr_kv_policy_get_stats(const tsr_kv_cache *kv, tsr_kv_policy_stats *out) {
    memset(out, 0, sizeof *out);
    if (!tsr_kv_is_policy(kv)) return;
    const tsr__pcache *c = (const tsr__pcache *)kv;
    if (c->pol->stats) c->pol->stats(c->state, out);
}

#define TSR__M(kv) (((tsr__pcache *)(kv))->mech)
#define TSR__C(kv) ((tsr__pcache *)(kv))

static void tsr__pc_destroy(tsr_kv_cache *kv) {
    tsr__pcache *c = TSR__C(kv);
    if (c->state && c->pol->destroy) c->pol->destroy(c->state);
    tsr_kv_cache_destroy(c->mech);
    tsr_host_pool_destroy(c->owned_host);
    tsr_free(c);
}

static tsr_status tsr__pc_seq_add(tsr_kv_cache *kv, int seq) {
    tsr__pcache *c = TSR__C(kv);
    TSR_TRY(c->mech->ops->seq_add(c->mech, seq));
    if (c->pol->admit) {
        tsr_status st = c->pol->admit(c->state, seq);
        if (st != TSR_OK) {
            c->mech->ops->seq_free(c->mech, seq);
            return st;
        }
    }
    return TSR_OK;
}

static void tsr__pc_seq_free(tsr_kv_cache *kv, int seq) {
    tsr__pcache *c = TSR__C(kv);
    if (c->pol->release) c->pol->release(c->state, seq);
    c->mech->ops->seq_free(c->mech, seq);
}

static int32_t tsr__pc_seq_len(const tsr_kv_cache *kv, int seq) {
    const tsr_kv_cache *m = ((const tsr__pcache *)kv)->mech;
    return m->ops->seq_len(m, seq);
}

static tsr_status tsr__pc_reserve(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr__pcache *c = TSR__C(kv);
    if (c->pol->append) TSR_TRY(c->pol->append(c->state, seq, n));
    return c->mech->ops->reserve(c->mech, seq, n);
}

static tsr_status tsr__pc_write(tsr_kv_cache *kv, int layer, int seq, int32_t n,
                                const float *k, const float *v) {
    tsr__pcache *c = TSR__C(kv);
    TSR_TRY(c->mech->ops->write(c->mech, layer, seq, n, k, v));
    if (c->pol->write) TSR_TRY(c->pol->write(c->state, layer, seq, n, k, v));
    return TSR_OK;
}

static tsr_status tsr__pc_queries(tsr_kv_cache *kv, int layer, int seq, const float *q,
                                  const int32_t *q_pos, int n_q, int n_heads) {
    tsr__pcache *c = TSR__C(kv);
    return c->pol->queries ? c->pol->queries(c->state, layer, seq, q, q_pos, n_q, n_heads)
                           : TSR_OK;
}

static tsr_status tsr__pc_spans(tsr_kv_cache *kv, int layer, int seq,
                                const tsr_kv_span **spans, int *n_spans) {
    tsr__pcache *c = TSR__C(kv);
    if (c->pol->select) TSR_TRY(c->pol->select(c->state, layer, seq));
    return c->mech->ops->spans(c->mech, layer, seq, spans, n_spans);
}

static tsr_status tsr__pc_observe(tsr_kv_cache *kv, int layer, int seq,
                                  const float *key_scores) {
    tsr__pcache *c = TSR__C(kv);
    return c->pol->observe ? c->pol->observe(c->state, layer, seq, key_scores) : TSR_OK;
}

static tsr_status tsr__pc_commit(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                 int32_t n) {
    tsr__pcache *c = TSR__C(kv);
    TSR_TRY(c->mech->ops->commit(c->mech, seq, tokens, n));
    return c->pol->commit ? c->pol->commit(c->state, seq, n) : TSR_OK;
}

static int32_t tsr__pc_prefix_attach(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                     int32_t n) {
    tsr__pcache *c = TSR__C(kv);
    if (!c->pol->allows_prefix_cache) return 0;
    return c->mech->ops->prefix_attach(c->mech, seq, tokens, n);
}

static void tsr__pc_stats(const tsr_kv_cache *kv, tsr_kv_stats *out) {
    const tsr__pcache *c = (const tsr__pcache *)kv;
    c->mech->ops->stats(c->mech, out);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    if (ps.evictions > out->evictions) out->evictions = ps.evictions;
}

/* The mechanism's detail, with this policy's name, stats and eviction count. */
static void tsr__pc_detail(const tsr_kv_cache *kv, tsr_kv_detail *out) {
    const tsr__pcache *c = (const tsr__pcache *)kv;
    tsr_kv_cache_detail(c->mech, out);
    out->policy = c->pol->name;
    tsr__pc_stats(kv, &out->kv);
    tsr_kv_policy_get_stats(kv, &out->pol);
}

/* Checkpoints save and restore the mechanism's rows; a policy's own state (offload's host
 * copy) is not part of them. */
static tsr_status tsr__pc_export_seq(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out) {
    const tsr_kv_cache *m = ((const tsr__pcache *)kv)->mech;
    return tsr_kv_export_seq(m, seq, out);
}

static tsr_status tsr__pc_import_seq(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *st) {
    return tsr_kv_import_seq(TSR__M(kv), seq, st);
}

/* The mechanism's answer; the policy's own append hook runs only in reserve. */
static tsr_status tsr__pc_reserve_check(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr_kv_cache *m = TSR__M(kv);
    return m->ops->reserve_check(m, seq, n);
}

static int32_t tsr__pc_seq_blocks(const tsr_kv_cache *kv, int layer, int seq,
                                  const int32_t **ids) {
    const tsr_kv_cache *m = ((const tsr__pcache *)kv)->mech;
    return m->ops->seq_blocks(m, layer, seq, ids);
}

static const tsr_kv_cache_ops tsr__pcache_ops = {
    .name = "policy",
    .destroy = tsr__pc_destroy,
    .seq_add = tsr__pc_seq_add,
    .seq_free = tsr__pc_seq_free,
    .seq_len = tsr__pc_seq_len,
    .reserve = tsr__pc_reserve,
    .write = tsr__pc_write,
    .spans = tsr__pc_spans,
    .observe = tsr__pc_observe,
    .commit = tsr__pc_commit,
    .prefix_attach = tsr__pc_prefix_attach,
    .stats = tsr__pc_stats,
    .queries = tsr__pc_queries,
    .detail = tsr__pc_detail,
    .export_seq = tsr__pc_export_seq,
    .import_seq = tsr__pc_import_seq,
    .reserve_check = tsr__pc_reserve_check,
    .seq_blocks = tsr__pc_seq_blocks,
};

tsr_status tsr_kv_policy_cache_create(const tsr_kv_policy_ops *ops,
                                      const tsr_kv_policy_config *pcfg,
                                      const tsr_kv_paged_config *kcfg, tsr_kv_cache **out) {
    *out = NULL;
    if (!ops) return tsr_error_set(TSR_ERR_INVALID, "KV policy: unknown policy");
    tsr_kv_paged_config kc = *kcfg;
    if (!ops->allows_prefix_cache) kc.prefix_caching = 0;
    if (ops->wants_scores) kc.keep_scores = 1;
    tsr__pcache *c = tsr_calloc(1, sizeof *c);
    if (!c) return TSR_ERR_NOMEM;
    c->pol = ops;
    tsr_status st = tsr_kv_paged_create(&kc, &c->mech);
    if (st == TSR_OK) st = ops->create(pcfg, c->mech, &c->state);
    if (st != TSR_OK) {
        tsr_kv_cache_destroy(c->mech);
        tsr_free(c);
        return st;
    }
    if (pcfg->owns_host) c->owned_host = pcfg->host;
    c->base = *c->mech;
    c->base.ops = &tsr__pcache_ops;
    c->base.wants_scores = ops->wants_scores;
    *out = &c->base;
    return TSR_OK;
}
