/* The `h2o` policy (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle"): per layer, keep the
 * recent window plus the heavy hitters, the tokens with the largest accumulated attention,
 * within --kv-budget. Scores come from the attention kernel's tiled per-key accumulation
 * (kernels/cpu/attn_cpu.c), [n_heads][keys] per call, and are summed over all heads (in
 * global head order) into one float per token slot: a slot row holds every KV head, so eviction is per
 * (layer, token) and a group-level choice could not free any memory (docs/kv-cache.md).
 * Evicted slots are refilled by compaction in the paged cache, so block tables stay dense
 * and emptied blocks return to the pool.
 *
 * --h2o-scores=materialize is the faithful baseline: like the original code it builds the
 * [heads][n_q][n_k] probability matrix and sums it, after checking that it fits. Both
 * kinds of scores stay per query head until the TP-wide sum over heads in global head
 * order, so they are the same bits for every tp, also when tp > n_kv_heads splits a KV
 * head's query group over ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "policies/policy.h"
#include "base/alloc.h"

/* Its options (the declaration below) and stats. */
typedef struct tsr__h2o_opts {
    double recent;           /* share of the budget for recent tokens (0: 0.5) */
    int scores_materialize;  /* the original n x n score matrix */
    double materialize_limit; /* bytes the matrix may take; 0: the available memory */
} tsr__h2o_opts;

typedef struct tsr__h2o_counters {
    int64_t evictions;
    int64_t tokens_processed;
    int64_t score_matrix_bytes_peak; /* materialize baseline */
    int64_t score_matrix_rebuilds;   /* matrices built from the layer's queries */
} tsr__h2o_counters;

typedef struct tsr__h2o {
    tsr_kv_policy_config cfg;
    tsr__h2o_opts opt;
    tsr_kv_cache *mech;
    int32_t *pending; /* per seq: tokens of the step in flight */
    int n_seqs;
    /* the queries of the current layer call (materialize), valid until observe */
    tsr_kv_policy_queries qs;
    tsr__h2o_counters st;
    /* GPT-OSS (NULL: none): per cache layer its window, and [layer][head] sink logits */
    int *window;
    float *sinks;
    /* TSR_H2O_DUMP=FILE (a debugging aid, tools/h2o_ref.py --dump writes the same): after
     * each observe, "newest_position layer kept positions..." in position order. */
    FILE *dump;
} tsr__h2o;

typedef struct tsr__cand {
    float score;
    int32_t pos;
    int32_t slot;
} tsr__cand;

static int tsr__by_pos_desc(const void *a, const void *b) {
    const tsr__cand *x = a, *y = b;
    return (x->pos < y->pos) - (x->pos > y->pos);
}

static int tsr__by_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Highest score first; on ties the newer token first (so the older is evicted). */
static int tsr__by_score_desc(const void *a, const void *b) {
    const tsr__cand *x = a, *y = b;
    if (x->score != y->score) return (x->score < y->score) - (x->score > y->score);
    return (x->pos < y->pos) - (x->pos > y->pos);
}

static void tsr__h2o_destroy(void *state);

static tsr_status tsr__h2o_create(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech,
                                  void **state) {
    if (cfg->n_heads <= 0 || cfg->n_heads % mech->n_kv_heads != 0)
        return tsr_error_set(TSR_ERR_INVALID, "h2o: %d query heads over %d kv heads (the "
                             "key scores come per query head)", cfg->n_heads,
                             mech->n_kv_heads);
    tsr__h2o *h = tsr_calloc(1, sizeof *h);
    if (!h) return TSR_ERR_NOMEM;
    h->cfg = *cfg;
    h->opt = *(const tsr__h2o_opts *)cfg->opts;
    if (!(h->opt.recent > 0.0)) h->opt.recent = 0.5;
    if (h->opt.recent > 1.0) h->opt.recent = 1.0;
    h->mech = mech;
    h->qs.layer = -1;
    /* GPT-OSS: the sinks and windows the materialize baseline must apply (copied: the
     * model's views may go) */
    if (cfg->model && cfg->model->layers) {
        h->window = tsr_calloc((size_t)mech->n_layers, sizeof *h->window);
        h->sinks = tsr_calloc((size_t)mech->n_layers * (size_t)cfg->n_heads, sizeof *h->sinks);
        if (!h->window || !h->sinks) {
            tsr__h2o_destroy(h);
            return TSR_ERR_NOMEM;
        }
        for (int l = 0; l < mech->n_layers; l++) {
            const tsr_kv_policy_layer *pl = &cfg->model->layers[l];
            h->window[l] = pl->window;
            for (int i = 0; i < cfg->n_heads; i++)
                h->sinks[(size_t)l * cfg->n_heads + i] =
                    pl->sinks.data && pl->sinks.cols == cfg->n_heads
                        ? ((const float *)pl->sinks.data)[i]
                        : -INFINITY;
        }
    }
    const char *dump = getenv("TSR_H2O_DUMP");
    if (dump && *dump && !(h->dump = fopen(dump, "w"))) {
        tsr__h2o_destroy(h);
        return tsr_error_set(TSR_ERR_IO, "h2o: cannot write TSR_H2O_DUMP=%s", dump);
    }
    *state = h;
    return TSR_OK;
}

static void tsr__h2o_destroy(void *state) {
    tsr__h2o *h = state;
    if (h->dump) fclose(h->dump);
    tsr_free(h->pending);
    tsr_free(h->window);
    tsr_free(h->sinks);
    tsr_free(h);
}

static int64_t tsr__avail_bytes(void) {
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (int64_t)pages * psz : INT64_MAX;
}

static tsr_status tsr__h2o_append(void *state, int seq, int32_t n) {
    tsr__h2o *h = state;
    if (seq < 0) return tsr_error_set(TSR_ERR_INVALID, "h2o: bad sequence %d", seq);
    if (seq >= h->n_seqs) {
        int32_t *p = tsr_realloc(h->pending, (size_t)(seq + 1) * sizeof *p);
        if (!p) return TSR_ERR_NOMEM;
        for (int i = h->n_seqs; i <= seq; i++) p[i] = 0;
        h->pending = p;
        h->n_seqs = seq + 1;
    }
    h->pending[seq] = n;
    if (h->opt.scores_materialize) {
        /* Fail before any work when the step's n_q x n_k matrix cannot fit. */
        tsr_kv_cache *m = h->mech;
        int heads = h->cfg.n_heads > 0 ? h->cfg.n_heads : m->n_kv_heads;
        double keys = (double)tsr_kv_paged_slots(m, 0, seq) + n;
        double bytes = (double)heads * n * keys * 4.0;
        int64_t limit =
            h->opt.materialize_limit > 0 ? (int64_t)h->opt.materialize_limit : tsr__avail_bytes();
        if (bytes > (double)limit)
            return tsr_error_set(TSR_ERR_NOMEM,
                                 "h2o --h2o-scores=materialize: the %d x %d x %.0f score "
                                 "matrix needs %.0f bytes, only %lld available",
                                 heads, n, keys, bytes, (long long)limit);
    }
    return TSR_OK;
}

static tsr_status tsr__h2o_queries(void *state, int layer, int seq, const float *q,
                                   const int32_t *q_pos, int n_q, int n_heads) {
    tsr__h2o *h = state;
    tsr_kv_policy_queries_set(&h->qs, layer, seq, q, q_pos, n_q, n_heads);
    return TSR_OK;
}

/* The baseline: the full [heads][n_q][n_k] probability matrix, then its sums per query
 * head into scores ([heads][n_keys]; untouched without queries). */
static tsr_status tsr__h2o_materialize(tsr__h2o *h, int layer, int seq, int32_t n_keys,
                                       float *scores) {
    tsr_kv_cache *m = h->mech;
    int have_q = tsr_kv_policy_queries_for(&h->qs, layer, seq);
    int n_heads =
        have_q ? h->qs.heads : (h->cfg.n_heads > 0 ? h->cfg.n_heads : m->n_kv_heads);
    int64_t n_q = have_q ? h->qs.n : h->pending[seq];
    double bytes = (double)n_heads * (double)n_q * (double)n_keys * 4.0;
    int64_t limit = h->opt.materialize_limit > 0 ? (int64_t)h->opt.materialize_limit
                                                  : tsr__avail_bytes();
    if (bytes > (double)limit)
        return tsr_error_set(TSR_ERR_NOMEM,
                             "h2o --h2o-scores=materialize: the %d x %lld x %d score matrix "
                             "needs %.0f bytes, only %lld available",
                             n_heads, (long long)n_q, n_keys, bytes, (long long)limit);
    float *att = tsr_malloc((size_t)bytes > 0 ? (size_t)bytes : 4);
    if (!att)
        return tsr_error_set(TSR_ERR_NOMEM,
                             "h2o --h2o-scores=materialize: cannot allocate the %.0f-byte "
                             "score matrix", bytes);
    if ((double)(int64_t)bytes > (double)h->st.score_matrix_bytes_peak)
        h->st.score_matrix_bytes_peak = (int64_t)bytes;
    if (!have_q) {
        /* Without the queries only the footprint can be reproduced; the sums are the
         * kernel's. */
        memset(att, 0, (size_t)bytes);
        tsr_free(att);
        return TSR_OK;
    }
    int hd = m->kv_dim / m->n_kv_heads, group = n_heads / m->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    /* The layer's K rows come to the host once (one gather), as the original code's
     * matrix product reads them. */
    int32_t *pos = tsr_malloc((size_t)(n_keys ? n_keys : 1) * sizeof *pos);
    float *keys = tsr_malloc((size_t)(n_keys ? n_keys : 1) * (size_t)m->kv_dim * sizeof *keys);
    tsr_status st = pos && keys ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) st = tsr_kv_paged_read_slots(m, layer, seq, pos, NULL);
    if (st == TSR_OK) st = tsr_kv_paged_gather(m, layer, seq, NULL, n_keys, keys, NULL);
    if (st != TSR_OK) {
        tsr_free(pos);
        tsr_free(keys);
        tsr_free(att);
        return st;
    }
    memset(scores, 0, (size_t)n_heads * n_keys * sizeof *scores);
    for (int hh = 0; hh < n_heads; hh++) {
        int g = hh / group;
        for (int64_t i = 0; i < n_q; i++) {
            float *row = att + ((size_t)hh * n_q + i) * n_keys;
            const float *qi = h->qs.q + (size_t)i * n_heads * hd + (size_t)hh * hd;
            /* GPT-OSS: the window by position, and the sink once in the denominator */
            int win = h->window ? h->window[layer] : 0;
            float sink = h->sinks && hh < h->cfg.n_heads
                             ? h->sinks[(size_t)layer * h->cfg.n_heads + hh]
                             : -INFINITY;
            float mx = sink;
            for (int32_t j = 0; j < n_keys; j++) {
                const float *kr = keys + (size_t)j * m->kv_dim;
                float d = 0.0f;
                for (int t = 0; t < hd; t++) d += qi[t] * kr[g * hd + t];
                bool vis = pos[j] <= h->qs.pos[i] && (win <= 0 || pos[j] > h->qs.pos[i] - win);
                row[j] = vis ? d * scale : -INFINITY;
                mx = row[j] > mx ? row[j] : mx;
            }
            float sum = sink == -INFINITY ? 0.0f : expf(sink - mx);
            for (int32_t j = 0; j < n_keys; j++) {
                row[j] = expf(row[j] - mx);
                sum += row[j];
            }
            for (int32_t j = 0; j < n_keys; j++) scores[(size_t)hh * n_keys + j] += row[j] / sum;
        }
    }
    tsr_free(pos);
    tsr_free(keys);
    tsr_free(att);
    h->st.score_matrix_rebuilds++;
    return TSR_OK;
}

/* Keeps the `recent` newest slots plus the highest-scored others, `budget` in all. */
static tsr_status tsr__h2o_evict(tsr__h2o *h, int layer, int seq, int32_t budget) {
    tsr_kv_cache *m = h->mech;
    int32_t n = tsr_kv_paged_slots(m, layer, seq);
    if (n <= budget) return TSR_OK;
    tsr__cand *c = tsr_malloc((size_t)n * sizeof *c);
    int32_t *pos = tsr_malloc((size_t)n * sizeof *pos);
    float *sc = tsr_malloc((size_t)n * sizeof *sc);
    int32_t *ev = tsr_malloc((size_t)n * sizeof *ev);
    tsr_status st = c && pos && sc && ev ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) st = tsr_kv_paged_read_slots(m, layer, seq, pos, sc);
    if (st == TSR_OK) {
        for (int32_t i = 0; i < n; i++) c[i] = (tsr__cand){sc[i], pos[i], i};
        int32_t recent = (int32_t)floor(budget * h->opt.recent + 0.5);
        if (recent > budget) recent = budget;
        int32_t heavy = budget - recent;
        qsort(c, (size_t)n, sizeof *c, tsr__by_pos_desc);
        qsort(c + recent, (size_t)(n - recent), sizeof *c, tsr__by_score_desc);
        int32_t ne = 0;
        for (int32_t i = recent + heavy; i < n; i++) ev[ne++] = c[i].slot;
        st = tsr_kv_paged_evict(m, layer, seq, ev, ne);
        if (st == TSR_OK) h->st.evictions += ne;
    }
    tsr_free(c);
    tsr_free(pos);
    tsr_free(sc);
    tsr_free(ev);
    return st;
}

/* One TSR_H2O_DUMP line: the layer's kept positions after the step ending at len. */
static tsr_status tsr__h2o_dump(tsr__h2o *h, int layer, int seq, int32_t len) {
    int32_t n = tsr_kv_paged_slots(h->mech, layer, seq);
    int32_t *pos = tsr_malloc((size_t)(n ? n : 1) * sizeof *pos);
    if (!pos) return TSR_ERR_NOMEM;
    tsr_status st = tsr_kv_paged_read_slots(h->mech, layer, seq, pos, NULL);
    if (st == TSR_OK) {
        qsort(pos, (size_t)n, sizeof *pos, tsr__by_i32);
        fprintf(h->dump, "%d %d", (int)len - 1, layer);
        for (int32_t i = 0; i < n; i++) fprintf(h->dump, " %d", (int)pos[i]);
        fputc('\n', h->dump);
    }
    tsr_free(pos);
    return st;
}

static tsr_status tsr__h2o_observe(void *state, int layer, int seq, const float *key_scores) {
    tsr__h2o *h = state;
    tsr_kv_cache *m = h->mech;
    if (seq < 0 || seq >= h->n_seqs)
        return tsr_error_set(TSR_ERR_INVALID, "h2o: observe before reserve (seq %d)", seq);
    int32_t n = tsr_kv_paged_slots(m, layer, seq);
    float *ms = NULL, *sum = NULL;
    tsr_status st = TSR_OK;
    const float *ks = key_scores;
    int parts = h->cfg.n_heads; /* the kernel's and materialize's: per query head */
    if (h->opt.scores_materialize) {
        int have_q = tsr_kv_policy_queries_for(&h->qs, layer, seq);
        int heads = have_q ? h->qs.heads : h->cfg.n_heads;
        ms = tsr_malloc((size_t)heads * (n ? n : 1) * sizeof *ms);
        st = ms ? tsr__h2o_materialize(h, layer, seq, n, ms) : TSR_ERR_NOMEM;
        if (have_q) {
            ks = ms;
            parts = heads; /* per query head */
        }
    }
    /* One score per slot, summed over every head of the TP group (the same on every
     * rank): a slot row holds all heads, so the ranks must evict the same slots. */
    if (st == TSR_OK && ks) {
        sum = tsr_malloc((size_t)(n ? n : 1) * sizeof *sum);
        st = sum ? tsr_kv_policy_sum_heads(&h->cfg, ks, parts, (size_t)n, sum)
                 : TSR_ERR_NOMEM;
        if (st == TSR_OK) st = tsr_kv_paged_add_slot_scores(m, layer, seq, sum);
    }
    tsr_free(ms);
    tsr_free(sum);
    TSR_TRY(st);
    h->qs.q = NULL;
    int32_t len = m->ops->seq_len(m, seq) + h->pending[seq];
    if (h->window && h->window[layer] > 0) return TSR_OK; /* a sliding layer keeps its window */
    TSR_TRY(tsr__h2o_evict(h, layer, seq, tsr_kv_policy_budget(&h->cfg, len)));
    return h->dump ? tsr__h2o_dump(h, layer, seq, len) : TSR_OK;
}

static tsr_status tsr__h2o_commit(void *state, int seq, int32_t n) {
    tsr__h2o *h = state;
    if (seq >= 0 && seq < h->n_seqs) h->pending[seq] = 0;
    h->st.tokens_processed += n;
    return TSR_OK;
}

static void tsr__h2o_stats(const void *state, void *out) {
    *(tsr__h2o_counters *)out = ((const tsr__h2o *)state)->st;
}

static const char *const tsr__h2o_score_modes[] = {"tiled", "materialize", NULL};

static const tsr_kv_policy_option tsr__h2o_options[] = {
    {"h2o-recent", TSR_KV_OPT_DOUBLE, offsetof(tsr__h2o_opts, recent), "F",
     "share of the budget for the recent window", "0.5", 0, 1, NULL},
    {"h2o-scores", TSR_KV_OPT_ENUM, offsetof(tsr__h2o_opts, scores_materialize), "MODE",
     "how scores accumulate: tiled never builds the n x n matrix, materialize does (the "
     "original baseline)",
     "tiled", 0, 0, tsr__h2o_score_modes},
    {"h2o-materialize-limit", TSR_KV_OPT_DOUBLE, offsetof(tsr__h2o_opts, materialize_limit),
     "BYTES", "bytes the materialized n x n matrix may take (0: the available memory)",
     "0", 0, 1e18, NULL},
};

static const tsr_kv_policy_stat_field tsr__h2o_stat_fields[] = {
    {"evictions", TSR_KV_STAT_I64, offsetof(tsr__h2o_counters, evictions)},
    {"tokens_processed", TSR_KV_STAT_I64, offsetof(tsr__h2o_counters, tokens_processed)},
    {"score_matrix_bytes_peak", TSR_KV_STAT_I64,
     offsetof(tsr__h2o_counters, score_matrix_bytes_peak)},
    {"score_matrix_rebuilds", TSR_KV_STAT_I64, offsetof(tsr__h2o_counters, score_matrix_rebuilds)},
};

/* Queries only for the materialized matrix: the tiled scores come from the kernel. */
static int tsr__h2o_reads_queries(const void *opts) {
    return ((const tsr__h2o_opts *)opts)->scores_materialize;
}

/* Scores every layer; queries only to materialize; the scores summed over the TP group;
 * its scores travel in the mechanism's rows, so a checkpoint restores it. */
const tsr_kv_policy_decl tsr_kv_policy_h2o = {
    .name = "h2o",
    .help = "heavy hitters + recent window",
    .reads_queries = 1,
    .reads_queries_with = tsr__h2o_reads_queries,
    .reads_scores = 1,
    .uses_budget = 1,
    .checkpointable = 1,
    .tp_host_sums = 1,
    .options = tsr__h2o_options,
    .n_options = TSR_KV_COUNT(tsr__h2o_options),
    .options_size = sizeof(tsr__h2o_opts),
    .stat_fields = tsr__h2o_stat_fields,
    .n_stats = TSR_KV_COUNT(tsr__h2o_stat_fields),
    .stats_size = sizeof(tsr__h2o_counters),
    .create = tsr__h2o_create,
    .destroy = tsr__h2o_destroy,
    .append = tsr__h2o_append,
    .queries = tsr__h2o_queries,
    .observe = tsr__h2o_observe,
    .commit = tsr__h2o_commit,
    .stats = tsr__h2o_stats,
};
