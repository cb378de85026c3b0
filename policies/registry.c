/* The policy table and its lookup by name (the only place a policy's name is compared),
 * what is generated from the policies' declarations (option parsing, help lines, the
 * options string, named stats) and the wrapper cache that runs a policy's hooks around the
 * paged mechanism, calling only the ones its declaration says it reads. A new policy: one
 * file defining a tsr_kv_policy_decl (policy.h shows how), one line in TSR__POLICY_LIST
 * below. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "base/alloc.h"

/* The registry: one line per policy, X(NAME) for the `tsr_kv_policy_NAME` its file
 * defines, in --help order. */
#define TSR__POLICY_LIST(X) \
    X(paged)                \
    X(h2o)                  \
    X(offload)              \
    X(snapkv)               \
    X(streaming)            \
    /* a new policy: one line above */

#define TSR__DECLARE(name) extern const tsr_kv_policy_decl tsr_kv_policy_##name;
TSR__POLICY_LIST(TSR__DECLARE)
#define TSR__ENTRY(name) &tsr_kv_policy_##name,
static const tsr_kv_policy_decl *const tsr__policies[] = {TSR__POLICY_LIST(TSR__ENTRY)};

enum { TSR__N_POLICIES = sizeof tsr__policies / sizeof tsr__policies[0], TSR__N_EXTRA = 8 };

/* Policies registered at run time (tests/unit/test_policy_registry.c), after the table. */
static const tsr_kv_policy_decl *tsr__extra[TSR__N_EXTRA];
static int tsr__n_extra;

int tsr_kv_policy_count(void) { return TSR__N_POLICIES + tsr__n_extra; }

const tsr_kv_policy_decl *tsr_kv_policy_at(int i) {
    if (i >= 0 && i < TSR__N_POLICIES) return tsr__policies[i];
    if (i >= TSR__N_POLICIES && i < TSR__N_POLICIES + tsr__n_extra)
        return tsr__extra[i - TSR__N_POLICIES];
    return NULL;
}

const tsr_kv_policy_decl *tsr_kv_policy_find(const char *name) {
    for (int i = 0; name && i < tsr_kv_policy_count(); i++)
        if (strcmp(tsr_kv_policy_at(i)->name, name) == 0) return tsr_kv_policy_at(i);
    return NULL;
}

const tsr_kv_policy_decl *tsr_kv_policy_default(void) { return tsr__policies[0]; }

/* What pol says it reads and the hooks it has must agree: the forward pass makes the host
 * copies the declaration names, and the wrapper calls exactly those hooks. */
static tsr_status tsr__check_decl(const tsr_kv_policy_decl *pol) {
    static const char *const what[] = {"queries", "attn_input", "observe"};
    const int declared[] = {pol->reads_queries, pol->reads_attn_input, pol->reads_scores};
    const int hooked[] = {pol->queries != NULL, pol->attn_input != NULL, pol->observe != NULL};
    static const char *const flag[] = {"reads_queries", "reads_attn_input", "reads_scores"};
    if (!pol->create)
        return tsr_error_set(TSR_ERR_INVALID, "KV policy %s: no create hook", pol->name);
    for (int i = 0; i < 3; i++)
        if (!declared[i] != !hooked[i])
            return tsr_error_set(TSR_ERR_INVALID, "KV policy %s: %s is %d but its %s hook is "
                                 "%s", pol->name, flag[i], declared[i], what[i],
                                 hooked[i] ? "set" : "NULL");
    if (pol->reads_queries_with && !pol->reads_queries)
        return tsr_error_set(TSR_ERR_INVALID, "KV policy %s: reads_queries_with without "
                             "reads_queries", pol->name);
    return TSR_OK;
}

tsr_status tsr_kv_policy_register(const tsr_kv_policy_decl *pol) {
    if (tsr_kv_policy_find(pol->name))
        return tsr_error_set(TSR_ERR_INVALID, "KV policy %s: already registered", pol->name);
    if (tsr__n_extra == TSR__N_EXTRA)
        return tsr_error_set(TSR_ERR_INVALID, "KV policy %s: at most %d registered at run "
                             "time", pol->name, TSR__N_EXTRA);
    TSR_TRY(tsr__check_decl(pol));
    tsr__extra[tsr__n_extra++] = pol;
    return TSR_OK;
}

const char *tsr_kv_policy_names(void) {
    static char names[256];
    size_t len = 0;
    names[0] = '\0';
    for (int i = 0; i < tsr_kv_policy_count() && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? "|" : "",
                                tsr_kv_policy_at(i)->name);
    return names;
}

const tsr_kv_policy_option *tsr_kv_policy_option_find(const tsr_kv_policy_decl *pol,
                                                      const char *name) {
    for (int i = 0; pol && name && i < pol->n_options; i++)
        if (!strcmp(pol->options[i].name, name)) return &pol->options[i];
    return NULL;
}

tsr_status tsr_kv_policy_option_parse(const tsr_kv_policy_option *o, const char *text,
                                      void *opts) {
    char *at = opts ? (char *)opts + o->offset : NULL;
    char *end = NULL;
    switch (o->kind) {
    case TSR_KV_OPT_FLAG: {
        int v = !text || !strcmp(text, "1") ? 1 : !strcmp(text, "0") ? 0 : -1;
        if (v < 0) break;
        if (at) memcpy(at, &v, sizeof v);
        return TSR_OK;
    }
    case TSR_KV_OPT_ENUM:
        for (int i = 0; text && o->values[i]; i++)
            if (!strcmp(o->values[i], text)) {
                if (at) memcpy(at, &i, sizeof i);
                return TSR_OK;
            }
        break;
    case TSR_KV_OPT_DOUBLE:
    case TSR_KV_OPT_INT: {
        if (!text) break;
        errno = 0;
        double v = o->kind == TSR_KV_OPT_INT ? (double)strtol(text, &end, 10)
                                             : strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v)) break;
        if (v < o->min || v > o->max)
            return tsr_error_set(TSR_ERR_INVALID, "--%s %s: must be in [%g, %g]", o->name,
                                 text, o->min, o->max);
        if (at && o->kind == TSR_KV_OPT_INT) {
            int iv = (int)v;
            memcpy(at, &iv, sizeof iv);
        } else if (at) {
            memcpy(at, &v, sizeof v);
        }
        return TSR_OK;
    }
    }
    if (o->kind == TSR_KV_OPT_ENUM) {
        char vals[256];
        size_t len = 0;
        for (int i = 0; o->values[i] && len < sizeof vals; i++)
            len += (size_t)snprintf(vals + len, sizeof vals - len, "%s%s", i ? ", " : "",
                                    o->values[i]);
        return tsr_error_set(TSR_ERR_INVALID, "--%s %s: use one of %s", o->name,
                             text ? text : "(none)", vals);
    }
    return tsr_error_set(TSR_ERR_INVALID, "--%s %s: not %s", o->name, text ? text : "(none)",
                         o->kind == TSR_KV_OPT_INT    ? "an integer"
                         : o->kind == TSR_KV_OPT_FLAG ? "0 or 1"
                                                      : "a number");
}

int tsr_kv_policy_option_help(const tsr_kv_policy_option *o, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s", o->help);
    size_t len = n > 0 ? (size_t)n : 0;
    if (len >= size) return n;
    if (o->kind == TSR_KV_OPT_ENUM) {
        for (int i = 0; o->values[i] && len < size; i++)
            len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? "|" : " (",
                                    o->values[i]);
        if (len < size)
            len += (size_t)snprintf(buf + len, size - len, "; default: %s)",
                                    o->def ? o->def : o->values[0]);
    } else if (o->kind != TSR_KV_OPT_FLAG) {
        if (o->max >= 1e15) /* no upper bound worth printing */
            len += (size_t)snprintf(buf + len, size - len, " (>= %g; default: %s)", o->min,
                                    o->def ? o->def : "0");
        else
            len += (size_t)snprintf(buf + len, size - len, " (%g..%g; default: %s)", o->min,
                                    o->max, o->def ? o->def : "0");
    }
    return (int)len;
}

tsr_status tsr_kv_policy_options_parse(const tsr_kv_policy_decl *pol,
                                       const tsr_kv_policy_arg *args, int n_args, void *opts) {
    if (pol->options_size) memset(opts, 0, pol->options_size);
    for (int i = 0; i < pol->n_options; i++) {
        const tsr_kv_policy_option *o = &pol->options[i];
        if (o->def) TSR_TRY(tsr_kv_policy_option_parse(o, o->def, opts));
    }
    for (int i = 0; i < n_args; i++) {
        const tsr_kv_policy_option *o = tsr_kv_policy_option_find(pol, args[i].name);
        if (o) TSR_TRY(tsr_kv_policy_option_parse(o, args[i].value, opts));
    }
    return TSR_OK;
}

int tsr_kv_policy_options_string(const tsr_kv_policy_decl *pol, double budget,
                                 const void *opts, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
#define TSR__ADD(...)                                                                  \
    do {                                                                               \
        if (len < size) len += (size_t)snprintf(buf + len, size - len, __VA_ARGS__);   \
    } while (0)
    if (pol->uses_budget) TSR__ADD("kv-budget=%g", budget);
    for (int i = 0; i < pol->n_options; i++) {
        const tsr_kv_policy_option *o = &pol->options[i];
        const char *at = (const char *)opts + o->offset;
        const char *sep = len ? " " : "";
        int iv = 0;
        double dv = 0;
        if (o->kind == TSR_KV_OPT_DOUBLE) {
            memcpy(&dv, at, sizeof dv);
            TSR__ADD("%s%s=%g", sep, o->name, dv);
            continue;
        }
        memcpy(&iv, at, sizeof iv);
        if (o->kind == TSR_KV_OPT_ENUM) TSR__ADD("%s%s=%s", sep, o->name, o->values[iv]);
        else TSR__ADD("%s%s=%d", sep, o->name, iv);
    }
#undef TSR__ADD
    if (!len) return snprintf(buf, size, "none");
    return (int)len;
}

int32_t tsr_kv_policy_budget(const tsr_kv_policy_config *cfg, int32_t len) {
    double b = cfg->budget;
    if (b <= 0.0) return len;
    int64_t t = b <= 1.0 ? (int64_t)ceil(b * len) : (int64_t)b;
    if (t < 1) t = 1;
    return t < len ? (int32_t)t : len;
}

int64_t tsr_kv_policy_bound(const tsr_kv_policy_config *cfg, int32_t len) {
    return (int64_t)tsr_kv_policy_budget(cfg, len) +
           (cfg->chunk > 0 ? cfg->chunk : TSR_KV_POLICY_CHUNK);
}

tsr_status tsr_kv_policy_resident_of(const tsr_kv_policy_decl *pol,
                                     const tsr_kv_policy_extent *in, int block_size,
                                     tsr_kv_policy_resident *out) {
    memset(out, 0, sizeof *out);
    if (in->context < 1 || in->n_layers < 1 || block_size < 1)
        return tsr_error_set(TSR_ERR_INVALID, "KV sizing: context %d, %d layers, blocks of "
                             "%d rows: each must be positive", (int)in->context, in->n_layers,
                             block_size);
    int32_t ctx = in->context, rows = ctx;
    if (pol->uses_budget && in->budget > 0) {
        /* the budget at the full context, and a step's rows written before eviction */
        tsr_kv_policy_config pc = {.budget = in->budget, .chunk = in->chunk};
        int64_t t = tsr_kv_policy_bound(&pc, ctx);
        rows = t < ctx ? (int32_t)t : ctx;
    }
    size_t n = (size_t)in->n_layers;
    int32_t *need = tsr_malloc(2 * n * sizeof *need);
    void *opts = pol->options_size ? tsr_calloc(1, pol->options_size) : NULL;
    tsr_status st = need && (opts || !pol->options_size) ? TSR_OK : TSR_ERR_NOMEM;
    int32_t *want = need ? need + n : NULL;
    if (st == TSR_OK) st = tsr_kv_policy_options_parse(pol, in->args, in->n_args, opts);
    if (st == TSR_OK) {
        for (size_t l = 0; l < n; l++) need[l] = want[l] = rows;
        if (pol->resident) pol->resident(opts, in, need, want);
        for (size_t l = 0; l < n; l++) {
            /* a layer never holds more than the context, nor wants less than it needs */
            int32_t a = need[l] < ctx ? need[l] : ctx;
            int32_t b = want[l] < ctx ? want[l] : ctx;
            if (b < a) b = a;
            out->need_rows += a;
            out->want_rows += b;
            out->need_blocks += (a + block_size - 1) / block_size;
            out->want_blocks += (b + block_size - 1) / block_size;
        }
    }
    tsr_free(opts);
    tsr_free(need);
    return st;
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
    const tsr_kv_policy_decl *pol;
    void *state;
    tsr_host_pool *owned_host;
    void *opts;       /* the policy's parsed options (cfg->opts) */
    void *stats_buf;  /* the policy's stats struct, refilled by each get_stats */
    char opts_text[512];
    /* GPT-OSS: per layer of the cache its sliding window (NULL: no sliding layer). Whatever
     * the policy, a sliding layer drops the positions no later query can see at every
     * commit, so it holds at most window - 1 old rows plus a step (and its blocks go back
     * to the pool as they empty). offload leaves its sliding layers to this (it neither
     * copies them to its host tier nor selects in them). */
    int32_t *windows;
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
    const tsr_kv_policy_decl *pol = c->pol;
    if (!pol->stats || !c->stats_buf) return;
    memset(c->stats_buf, 0, pol->stats_size);
    pol->stats(c->state, c->stats_buf);
    for (int i = 0; i < pol->n_stats && out->n < TSR_KV_POLICY_STATS_MAX; i++) {
        const tsr_kv_policy_stat_field *f = &pol->stat_fields[i];
        const char *at = (const char *)c->stats_buf + f->offset;
        tsr_kv_stat_value *v = &out->v[out->n++];
        v->name = f->name;
        v->is_double = f->kind == TSR_KV_STAT_F64;
        if (v->is_double) memcpy(&v->d, at, sizeof v->d);
        else memcpy(&v->i, at, sizeof v->i);
        if (!v->is_double && !strcmp(f->name, "evictions")) out->evictions = v->i;
    }
}

#define TSR__M(kv) (((tsr__pcache *)(kv))->mech)
#define TSR__C(kv) ((tsr__pcache *)(kv))

static void tsr__pc_destroy(tsr_kv_cache *kv) {
    tsr__pcache *c = TSR__C(kv);
    if (c->state && c->pol->destroy) c->pol->destroy(c->state);
    tsr_kv_cache_destroy(c->mech);
    tsr_host_pool_destroy(c->owned_host);
    tsr_free(c->opts);
    tsr_free(c->stats_buf);
    tsr_free(c->windows);
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

static tsr_status tsr__pc_attn_input(tsr_kv_cache *kv, int layer, int seq, const float *x,
                                     int n, int dim) {
    tsr__pcache *c = TSR__C(kv);
    return c->pol->attn_input ? c->pol->attn_input(c->state, layer, seq, x, n, dim) : TSR_OK;
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

int32_t *tsr_kv_policy_windows(const tsr_kv_policy_config *cfg, int n_layers) {
    int32_t *w = NULL;
    for (int l = 0; cfg->model && cfg->model->layers && l < n_layers; l++) {
        if (cfg->model->layers[l].window <= 0) continue;
        if (!w && !(w = tsr_calloc((size_t)n_layers, sizeof *w))) return NULL;
        w[l] = cfg->model->layers[l].window;
    }
    return w;
}

int tsr_kv_policy_next_full(const int32_t *windows, int n_layers, int layer) {
    int l = layer + 1;
    while (windows && l < n_layers && windows[l] > 0) l++;
    return l < n_layers ? l : n_layers;
}

/* A sliding layer's rows at positions <= len - window: the next query (position >= len)
 * sees only keys > its position - window. */
static tsr_status tsr__pc_window_evict(tsr__pcache *c, int layer, int seq, int32_t window) {
    tsr_kv_cache *m = c->mech;
    int32_t len = m->ops->seq_len(m, seq);
    int32_t n = tsr_kv_paged_slots(m, layer, seq);
    if (n <= window - 1) return TSR_OK;
    int32_t *pos = tsr_malloc((size_t)n * sizeof *pos), *ev = tsr_malloc((size_t)n * sizeof *ev);
    tsr_status st = pos && ev ? tsr_kv_paged_read_slots(m, layer, seq, pos, NULL) : TSR_ERR_NOMEM;
    int32_t ne = 0;
    for (int32_t i = 0; st == TSR_OK && i < n; i++)
        if (pos[i] <= len - window) ev[ne++] = i;
    if (st == TSR_OK && ne) st = tsr_kv_paged_evict(m, layer, seq, ev, ne);
    tsr_free(pos);
    tsr_free(ev);
    return st;
}

static tsr_status tsr__pc_commit(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                 int32_t n) {
    tsr__pcache *c = TSR__C(kv);
    TSR_TRY(c->mech->ops->commit(c->mech, seq, tokens, n));
    if (c->pol->commit) TSR_TRY(c->pol->commit(c->state, seq, n));
    for (int l = 0; c->windows && l < c->mech->n_layers; l++)
        if (c->windows[l] > 0) TSR_TRY(tsr__pc_window_evict(c, l, seq, c->windows[l]));
    return TSR_OK;
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
    out->policy_options = c->opts_text;
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

/* Swap moves the mechanism's rows in table order with their positions and scores, so what
 * a policy keeps per sequence stays true: h2o's scores travel in the rows, offload's host
 * copy and resident flags are keyed by position, and neither keys anything by block or
 * store slot. A policy that does must be told here. */
static tsr_status tsr__pc_swap_out(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    return tsr_kv_swap_out(TSR__M(kv), seq, check, bytes);
}

static tsr_status tsr__pc_swap_in(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    return tsr_kv_swap_in(TSR__M(kv), seq, check, bytes);
}

/* Only for a policy that neither sees the rows nor chooses the keys (paged): the others
 * take write() and spans(). */
static tsr_status tsr__pc_write_slots(tsr_kv_cache *kv, int layer, int seq, int32_t n,
                                      int32_t *slots, tsr_kv_layout *lay,
                                      const int32_t **table, int32_t *n_blocks) {
    tsr__pcache *c = TSR__C(kv);
    const tsr_kv_policy_decl *pol = c->pol;
    if (pol->write || pol->select || pol->queries || pol->attn_input || pol->observe ||
        kv->wants_scores || kv->wants_queries || kv->wants_attn_input ||
        !c->mech->ops->write_slots)
        return TSR_ERR_UNSUPPORTED;
    return c->mech->ops->write_slots(c->mech, layer, seq, n, slots, lay, table, n_blocks);
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
    .attn_input = tsr__pc_attn_input,
    .detail = tsr__pc_detail,
    .export_seq = tsr__pc_export_seq,
    .import_seq = tsr__pc_import_seq,
    .reserve_check = tsr__pc_reserve_check,
    .seq_blocks = tsr__pc_seq_blocks,
    .swap_out = tsr__pc_swap_out,
    .swap_in = tsr__pc_swap_in,
    .write_slots = tsr__pc_write_slots,
};

tsr_status tsr_kv_policy_cache_create(const tsr_kv_policy_decl *pol,
                                      const tsr_kv_policy_config *pcfg,
                                      const tsr_kv_paged_config *kcfg, tsr_kv_cache **out) {
    *out = NULL;
    if (!pol) return tsr_error_set(TSR_ERR_INVALID, "KV policy: unknown policy");
    TSR_TRY(tsr__check_decl(pol));
    tsr_kv_paged_config kc = *kcfg;
    if (!pol->allows_prefix_cache) kc.prefix_caching = 0;
    int32_t *windows = NULL; /* sliding layers (GPT-OSS), see tsr__pcache */
    for (int l = 0; pcfg->model && pcfg->model->layers && l < kc.n_layers; l++) {
        if (pcfg->model->layers[l].window <= 0) continue;
        if (!windows && !(windows = tsr_calloc((size_t)kc.n_layers, sizeof *windows)))
            return TSR_ERR_NOMEM;
        windows[l] = pcfg->model->layers[l].window;
    }
    if (windows) kc.prefix_caching = 0; /* shared blocks would lose rows */
    if (pol->reads_scores) kc.keep_scores = 1;
    if (pol->n_stats > TSR_KV_POLICY_STATS_MAX)
        return tsr_error_set(TSR_ERR_INVALID, "KV policy %s: %d stats, at most %d", pol->name,
                             pol->n_stats, TSR_KV_POLICY_STATS_MAX);
    tsr__pcache *c = tsr_calloc(1, sizeof *c);
    if (!c) {
        tsr_free(windows);
        return TSR_ERR_NOMEM;
    }
    c->windows = windows;
    c->pol = pol;
    c->opts = tsr_calloc(1, pol->options_size ? pol->options_size : 1);
    c->stats_buf = pol->stats_size ? tsr_calloc(1, pol->stats_size) : NULL;
    tsr_status st = c->opts && (c->stats_buf || !pol->stats_size) ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) st = tsr_kv_policy_options_parse(pol, pcfg->args, pcfg->n_args, c->opts);
    tsr_kv_policy_config pc = *pcfg;
    pc.opts = c->opts;
    if (st == TSR_OK) st = tsr_kv_paged_create(&kc, &c->mech);
    if (st == TSR_OK) st = pol->create(&pc, c->mech, &c->state);
    if (st != TSR_OK) {
        tsr_kv_cache_destroy(c->mech);
        tsr_free(c->opts);
        tsr_free(c->stats_buf);
        tsr_free(c->windows);
        tsr_free(c);
        return st;
    }
    tsr_kv_policy_options_string(pol, pcfg->budget, c->opts, c->opts_text, sizeof c->opts_text);
    if (pcfg->owns_host) c->owned_host = pcfg->host;
    c->base = *c->mech;
    c->base.ops = &tsr__pcache_ops;
    /* What the forward pass copies to the host for this cache: what the policy reads. */
    c->base.wants_queries =
        pol->reads_queries && (!pol->reads_queries_with || pol->reads_queries_with(c->opts));
    c->base.wants_attn_input = pol->reads_attn_input;
    c->base.wants_scores = pol->reads_scores;
    *out = &c->base;
    return TSR_OK;
}
