/* The `offload` policy, InfiniGen (Lee et al., OSDI'24): the full KV of every layer lives
 * in the host pool; the paged cache holds only a budgeted resident set (on the CPU backend a
 * separately budgeted arena, so the copies and the bytes moved are real). Before a layer's
 * attention, a cheap speculative score over a small "partial key" cache picks the prior
 * tokens to make resident; the tokens of the current step are always resident. Two modes
 * (docs/kv-cache.md):
 *
 * skew (TSR_OFFLOAD_SKEW): per layer and query head (InfiniGen skews per query head), the
 * chosen columns of an orthogonal transform, applied after RoPE to queries and keys alike, so
 * it cancels in q.k exactly: at create from the weights (policies/offload_skew.h: the
 * eigenvectors of the KV group's rotated query's position-averaged covariance), then from the
 * layer's own first queries (--offload-calib: the eigenvectors of each head's query moment,
 * the union of the best columns by query energy and by the keys' |k.v|, InfiniGen's partial
 * weights). The partial keys (per query head) are the rotated keys' projections; layer L's
 * attention input (the cache's `attn_input` hook) times layer L+1's Wq, rotated and
 * projected, speculates L+1's selection, the heads' softmax scores summed per token (a
 * resident token holds every head); InfiniGen's alpha rule sizes the fetch. Under
 * tensor parallelism the heads' scores and counts are summed over the group, as below; not
 * with pipeline stages or replicated KV heads (those run warmup).
 *
 * Dense prefill (--offload-dense-prefill on, the default): a step of several tokens (a
 * prefill chunk) attends to every prior token, as InfiniGen's prefill does; the layer's
 * resident set goes back to its budgeted selection after its attention (tsr__off_trim).
 *
 * warmup (TSR_OFFLOAD_WARMUP; skew, the default, falls back to it whenever the policy gets
 * no weights): partial q.k over a
 * few rotary channel pairs per KV head with the layer's own queries (the `queries` hook).
 * Channel pairs are chosen per layer during a warm-up (the first TSR__OFF_WARM keys and
 * their queries) by the largest query energy x key variance. A pair is rotation-invariant,
 * so partial scores match RoPE'd keys. Without queries the selection falls back to the most
 * recent tokens (counted apart in the stats).
 *
 * Tensor parallelism (warmup): every rank must choose the channels one process would. The
 * query energy of a KV head is the sum over its whole query group, added per query head in
 * global head order; when tp exceeds the KV heads, a rank holds a replicated KV head but
 * only part of its group, so the group's per-head energies are gathered from the ranks
 * that share it (tsr__off_group_qe, kv_share_begin/end of the policy config). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/rope_freq.h"
#include "policies/offload_copy.h"
#include "policies/offload_skew.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "base/log.h"

/* Rows (per layer) whose key and query energy choose the channel pairs; the choice is
 * final after them. */
#define TSR__OFF_WARM 64
#define TSR__OFF_MAXHALF 128
/* Query rows (the last of a call) that score a selection. */
#define TSR__OFF_ROWS 4
/* Without --measure-recall, one selection in this many also measures recall. */
#define TSR__OFF_RECALL_EVERY 16
/* skew: query rows of a layer's first calibration (then at 2x, 4x, ... up to --offload-calib) */
#define TSR__OFF_CAL0 16

typedef struct tsr__olayer {
    float *hk, *hv;  /* host copy: [cap][kv_dim] ([cap_v] for hv: see tsr__off_grow) */
    size_t cap_v;
    float *pk;       /* partial keys: [cap][n_kv_heads][2 * pairs] */
    uint8_t *res;    /* [cap] resident flag */
    size_t cap;
    int32_t n;       /* rows in the host copy */
    /* skew: the speculated partial queries of this layer's next selection ([TSR__OFF_ROWS]
     * [H][cols], from the previous layer's attention input), sq_n rows; 0: none */
    float *sq;
    int sq_n;
    /* skew with copy streams: this layer's selection, made early (at the previous layer's
     * attention input, right after the speculation) so that its fetch overlaps that layer:
     * ew[len] the wanted prior tokens, ew_take of them, for ew_len prior tokens and
     * ew_total rows; ew_ok 0: none (select chooses as usual) */
    uint8_t *ew;
    int32_t ew_cap, ew_len, ew_total, ew_take;
    int ew_ok;
    /* dense prefill: the prior tokens [0, tk_len) the budgeted selection keeps (tk[j] 1)
     * once this layer's attention over all of them is done (tsr__off_trim) */
    uint8_t *tk;
    int32_t tk_cap, tk_len;
} tsr__olayer;

typedef struct tsr__oseq {
    int active;
    int32_t pending;
    /* dense prefill: a layer whose resident set holds every prior token for its attention
     * and goes back to its budgeted selection at the next select of this sequence or at
     * commit, whichever comes first (trim_layer; trim 0: none) */
    int trim, trim_layer;
    tsr__olayer *layers;
} tsr__oseq;

/* Its options (the declaration below) and stats. */
/* The modes (--offload-mode, docs/kv-cache.md); the index into tsr__off_modes. */
/* skew is the default: InfiniGen's own method, with dense prefill InfiniGen's prefill; on
 * SmolLM2 it is no worse than h2o at 20 and 50 % decode-only and within the InfiniGen
 * reference's figures with a prompt (docs/kv-cache.md). */
enum { TSR_OFFLOAD_WARMUP = 0, TSR_OFFLOAD_SKEW = 1 };
static const char *const tsr__off_modes[] = {"warmup", "skew", NULL};
static const char *const tsr__off_switch[] = {"off", "on", NULL};

typedef struct tsr__off_opts {
    int mode;           /* TSR_OFFLOAD_SKEW or TSR_OFFLOAD_WARMUP */
    int spec_pairs;     /* channel pairs per head to speculate on (0: the mode's default) */
    int measure_recall; /* also compute exact scores on every selection (slow) */
    double alpha;       /* skew: fetch the keys within alpha of the max partial logit */
    double ratio;       /* skew: partial-weight ratio, the share of a head's columns kept */
    int dense_layers;   /* skew: the first offloaded layers keep every token (InfiniGen: 2) */
    int calib;          /* skew: query rows per layer that recalibrate the transform (0: none) */
    int dense_prefill;  /* a step of several tokens (a prefill chunk) attends to every prior
                         * token (0 off, 1 on) */
    int sync;           /* no copy streams: every fetch and write-back waits (the reference) */
} tsr__off_opts;

typedef struct tsr__off_counters {
    int64_t evictions;        /* token slots moved out of residence */
    int64_t bytes_offloaded;  /* written to the host copy */
    int64_t bytes_fetched;    /* host -> resident */
    int64_t tokens_processed; /* tokens committed (denominator of bytes per token) */
    int64_t selections;       /* selections made (speculative or fallback) */
    int64_t fallback_selections; /* of them, without queries: the recent window */
    double recall_sum;        /* sum of per-selection recall of the exact top tokens */
    int64_t recall_n;
    int64_t host_bytes_peak;
    int64_t fetch_short;      /* selections that fetched less for a short pool */
    double bytes_per_token;   /* reported: (offloaded + fetched) / tokens */
    double fetched_per_token; /* reported: fetched / tokens */
    double recall;            /* reported: recall_sum / recall_n, -1 when not measured */
    /* the copy streams (policies/offload_copy.h); reported */
    int64_t copy_prefetches, copy_prefetch_used, copy_prefetch_dropped, copy_writebacks;
    int64_t copy_drains, copy_timed;
    int64_t copy_late; /* of the prefetches, those queued at the select itself */
    double copy_ms, copy_stall_ms;
    double copy_hidden; /* 1 - stall / copy over the timed prefetches; -1: not timed */
} tsr__off_counters;

typedef struct tsr__off {
    tsr_kv_policy_config cfg;
    tsr__off_opts opt;
    tsr_kv_cache *mech;
    int L, G, H, hd, kvd, pairs; /* H: this rank's query heads */
    int mode;         /* what runs: TSR_OFFLOAD_SKEW or TSR_OFFLOAD_WARMUP */
    int pw;           /* partial key width per head: 2 * pairs, or (skew) up to 2 x cols */
    int pkh;          /* heads of the partial keys: G (warmup), H (skew: per query head) */
    int cols;         /* skew: columns ranked by each of the query and the key side */
    /* skew: [L][H][pw][hd], each query head's transform columns (InfiniGen skews per query
     * head); rows past the head's column count are zero */
    float *A;
    int *ncol;        /* skew: [L][H] the columns each head uses (<= pw) */
    tsr_tensor *wq;   /* skew: [L] this rank's query rows (views of the model's weights) */
    float *inv_freq;  /* skew: [hd / 2] rotary frequencies */
    float *wrow;      /* skew: [dim] one weight row as f32 */
    int dim;          /* skew: the attention input's width */
    /* skew: per layer and query head, the second moment of its rotated queries
     * ([L][H][hd][hd], upper triangle) over the first opt.calib query rows (cal_n), whose
     * eigenvectors replace the weights' transform each time cal_n reaches cal_next (16 rows,
     * doubling: decode from BOS gets a calibrated transform early), final at opt.calib
     * (cal_done): InfiniGen's SVD of calibration queries */
    double *cq;
    int32_t *cal_n, *cal_next;
    uint8_t *cal_done;
    int tp;           /* ranks of the TP group (each with H query heads) */
    int *chan;        /* [L][G][2 * pairs] channel indices within the head */
    uint8_t *chan_set; /* [L] the choice is final */
    double *ke;       /* [L][G][hd / 2] warm-up key energy per pair */
    /* [L][H][hd / 2] warm-up query energy per pair and query head: kept per head so that
     * a KV head's group sum has one order for every tp */
    double *qe;
    double *km;       /* [L][G][hd] warm-up key sums per channel (for the variance) */
    int32_t *warm;    /* [L] key rows seen in the warm-up */
    /* GPT-OSS: [L] each layer's sliding window (NULL: none, every layer full). A sliding layer
     * is not offloaded: it keeps its window (the policy cache drops what leaves it,
     * registry.c), has no host copy and no selection, and is no speculation's source. */
    int32_t *windows;
    tsr__oseq *seqs;
    int n_seqs;
    tsr_kv_policy_queries qs;
    int64_t resident_meta_bytes;
    tsr__off_counters st;
    /* TSR_OFFLOAD_DUMP=FILE (a debugging aid, tools/infinigen_ref.py --replay reads it): one
     * line per speculated selection, "layer len take pos...", the prior tokens made resident */
    FILE *dump;
    /* copy streams for the fetch and the write-back; NULL: synchronous copies (a backend
     * whose memory is the host's, or --offload-sync) */
    tsr_offload_copy *copy;
} tsr__off;

typedef struct tsr__ocand {
    float score;
    int32_t pos;
} tsr__ocand;

static void tsr__off_destroy(void *state);
static void tsr__off_arrived(void *ctx, int seq, int layer, int32_t at, int32_t n);

/* The skew mode's transforms from the weights (once, at create): per layer and KV head the
 * best `cols` columns of the orthogonal transform (policies/offload_skew.h). */
static tsr_status tsr__off_skew_init(tsr__off *o, const tsr_kv_policy_model *pm) {
    const tsr_model_config *mc = pm->cfg;
    if (mc->head_dim != o->hd || o->H % o->G)
        return tsr_error_set(TSR_ERR_INVALID, "offload: the model's head_dim %d, the cache's %d",
                             mc->head_dim, o->hd);
    int cols = o->opt.spec_pairs > 0 ? 2 * o->opt.spec_pairs
                                     : (int)ceil(o->opt.ratio * o->hd);
    if (cols > o->hd) cols = o->hd;
    if (cols < 1) cols = 1;
    o->cols = cols;
    /* calibrated: InfiniGen's union of the best `cols` by the query and by the key side */
    o->pw = o->opt.calib > 0 && 2 * cols < o->hd ? 2 * cols : o->opt.calib > 0 ? o->hd : cols;
    o->pkh = o->H;
    o->dim = (int)pm->layers[0].wq.cols;
    o->A = tsr_calloc((size_t)o->L * o->H * o->pw * o->hd, sizeof *o->A);
    o->ncol = tsr_malloc((size_t)o->L * o->H * sizeof *o->ncol);
    o->wq = tsr_malloc((size_t)o->L * sizeof *o->wq);
    o->inv_freq = tsr_malloc((size_t)(o->hd / 2 ? o->hd / 2 : 1) * sizeof *o->inv_freq);
    o->wrow = tsr_malloc((size_t)(o->dim > 0 ? o->dim : 1) * sizeof *o->wrow);
    if (!o->A || !o->ncol || !o->wq || !o->inv_freq || !o->wrow) return TSR_ERR_NOMEM;
    for (size_t i = 0; i < (size_t)o->L * o->H; i++) o->ncol[i] = cols;
    tsr_rope_inv_freq(mc, o->inv_freq);
    if (o->opt.calib > 0) {
        o->cq = tsr_calloc((size_t)o->L * o->H * o->hd * o->hd, sizeof *o->cq);
        o->cal_n = tsr_calloc((size_t)o->L, sizeof *o->cal_n);
        o->cal_done = tsr_calloc((size_t)o->L, 1);
        o->cal_next = tsr_malloc((size_t)o->L * sizeof *o->cal_next);
        if (!o->cq || !o->cal_n || !o->cal_done || !o->cal_next) return TSR_ERR_NOMEM;
        for (int l = 0; l < o->L; l++)
            o->cal_next[l] = o->opt.calib < TSR__OFF_CAL0 ? o->opt.calib : TSR__OFF_CAL0;
    }
    int group = o->H / o->G;
    float *a = tsr_malloc((size_t)cols * o->hd * sizeof *a);
    if (!a) return TSR_ERR_NOMEM;
    tsr_status st = TSR_OK;
    for (int l = 0; l < o->L && st == TSR_OK; l++) {
        const tsr_kv_policy_layer *w = &pm->layers[l];
        if (w->wq.rows != (int64_t)o->H * o->hd || w->wk.rows != (int64_t)o->kvd ||
            w->wq.cols != o->dim) {
            st = tsr_error_set(TSR_ERR_INVALID, "offload: layer %d's Wq/Wk have %lld/%lld "
                               "rows, the cache wants %d/%d", l, (long long)w->wq.rows,
                               (long long)w->wk.rows, o->H * o->hd, o->kvd);
            break;
        }
        o->wq[l] = w->wq;
        /* until the first calibration: the KV head group's transform from the weights, the
         * same for each of its query heads */
        for (int g = 0; g < o->G && st == TSR_OK; g++) {
            st = tsr_offload_skew_head(mc, o->inv_freq, &w->wq, (int64_t)g * group * o->hd,
                                       group, &w->attn_norm, cols, a);
            for (int h = g * group; h < (g + 1) * group && st == TSR_OK; h++)
                memcpy(o->A + ((size_t)l * o->H + h) * o->pw * o->hd, a,
                       (size_t)cols * o->hd * sizeof *a);
        }
    }
    tsr_free(a);
    return st;
}

/* The mode a cache runs: skew as asked only with the weights (its transforms come from
 * Wq), and split-independent only without pipeline stages or replicated KV heads: a stage's
 * first layer has no previous layer's input to speculate from, and a replicated KV head's
 * transform needs its whole query group's Wq, which no rank holds. The warm-up mode is
 * split-independent. Plain tensor parallelism is: a rank holds whole query groups, and the
 * scores and counts are summed over the group's heads (tsr_kv_policy_sum_heads). */
static int tsr__off_mode(const tsr__off_opts *opt, int has_model, int pipeline, int shared) {
    return opt->mode == TSR_OFFLOAD_SKEW && has_model && !pipeline && !shared
               ? TSR_OFFLOAD_SKEW
               : TSR_OFFLOAD_WARMUP;
}

static tsr_status tsr__off_create(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech,
                                  void **state) {
    if (!cfg->host)
        return tsr_error_set(TSR_ERR_INVALID, "offload: the policy needs a host pool");
    tsr__off *o = tsr_calloc(1, sizeof *o);
    if (!o) return TSR_ERR_NOMEM;
    o->cfg = *cfg;
    o->opt = *(const tsr__off_opts *)cfg->opts;
    o->mech = mech;
    o->L = mech->n_layers;
    o->G = mech->n_kv_heads;
    o->kvd = mech->kv_dim;
    o->hd = o->kvd / o->G;
    o->H = cfg->n_heads > 0 ? cfg->n_heads : o->G;
    o->pairs = o->opt.spec_pairs > 0 ? o->opt.spec_pairs : 4;
    if (o->pairs > o->hd / 2) o->pairs = o->hd / 2;
    o->chan = tsr_calloc((size_t)o->L * o->G * 2 * o->pairs, sizeof *o->chan);
    o->chan_set = tsr_calloc((size_t)o->L, 1);
    size_t ne = (size_t)o->L * o->G * (size_t)(o->hd / 2);
    o->ke = tsr_calloc(ne ? ne : 1, sizeof *o->ke);
    size_t nq = (size_t)o->L * o->H * (size_t)(o->hd / 2);
    o->qe = tsr_calloc(nq ? nq : 1, sizeof *o->qe);
    o->km = tsr_calloc(ne ? 2 * ne : 1, sizeof *o->km);
    o->warm = tsr_calloc((size_t)o->L, sizeof *o->warm);
    o->windows = tsr_kv_policy_windows(cfg, o->L);
    o->pw = 2 * o->pairs;
    o->pkh = o->G;
    o->qs.layer = -1;
    const char *dump = getenv("TSR_OFFLOAD_DUMP");
    if (dump && *dump) o->dump = fopen(dump, "w");
    *state = o;
    int too_wide = o->hd / 2 > TSR__OFF_MAXHALF;
    if (!o->chan || !o->chan_set || !o->ke || !o->qe || !o->km || !o->warm || too_wide) {
        tsr__off_destroy(o);
        *state = NULL;
        return too_wide ? tsr_error_set(TSR_ERR_UNSUPPORTED, "offload: head_dim > %d",
                                        2 * TSR__OFF_MAXHALF)
                        : TSR_ERR_NOMEM;
    }
    int pp = cfg->comm ? tsr_comm_size(cfg->comm, TSR_COMM_PP) : 1;
    int shared = cfg->kv_share_end - cfg->kv_share_begin > 1;
    o->tp = cfg->comm ? tsr_comm_size(cfg->comm, TSR_COMM_TP) : 1;
    o->mode = tsr__off_mode(&o->opt, cfg->model != NULL, pp > 1, shared);
    if (o->opt.mode == TSR_OFFLOAD_SKEW && cfg->model && o->mode != TSR_OFFLOAD_SKEW &&
        tsr_comm_world_rank(cfg->comm) == 0) /* split: the user asked for skew */
        TSR_LOG_WARN("offload: --offload-mode skew (the default) needs pp 1 and tp <= the "
                     "KV heads; this job uses --offload-mode warmup");
    tsr_status st = o->mode == TSR_OFFLOAD_SKEW ? tsr__off_skew_init(o, cfg->model) : TSR_OK;
    if (st == TSR_OK && !o->opt.sync)
        st = tsr_offload_copy_create(tsr_kv_paged_backend(mech), o->L, o->kvd, tsr__off_arrived,
                                     o, &o->copy);
    if (st != TSR_OK) {
        tsr__off_destroy(o);
        *state = NULL;
    }
    return st;
}

static void tsr__off_release(void *state, int seq) {
    tsr__off *o = state;
    if (seq < 0 || seq >= o->n_seqs || !o->seqs[seq].active) return;
    tsr__oseq *s = &o->seqs[seq];
    /* its copies in flight land before the memory goes; nothing to report from here */
    if (tsr_offload_copy_release(o->copy, seq) != TSR_OK)
        TSR_LOG_WARN("offload: releasing sequence %d's copies: %s", seq, tsr_last_error());
    size_t pw = (size_t)o->pkh * o->pw;
    for (int l = 0; l < o->L; l++) {
        tsr__olayer *L = &s->layers[l];
        tsr_host_pool_free(o->cfg.host, L->hk, L->cap * o->kvd * 4);
        tsr_host_pool_free(o->cfg.host, L->hv, L->cap_v * o->kvd * 4);
        o->resident_meta_bytes -= (int64_t)(L->cap * (pw * 4 + 1));
        tsr_free(L->pk);
        tsr_free(L->res);
        tsr_free(L->sq);
        tsr_free(L->ew);
        tsr_free(L->tk);
    }
    tsr_free(s->layers);
    memset(s, 0, sizeof *s);
}

static void tsr__off_destroy(void *state) {
    tsr__off *o = state;
    for (int i = 0; i < o->n_seqs; i++) tsr__off_release(o, i);
    tsr_offload_copy_destroy(o->copy);
    tsr_free(o->seqs);
    tsr_free(o->A);
    tsr_free(o->ncol);
    tsr_free(o->wq);
    tsr_free(o->inv_freq);
    tsr_free(o->wrow);
    tsr_free(o->cq);
    tsr_free(o->cal_n);
    tsr_free(o->cal_done);
    tsr_free(o->cal_next);
    tsr_free(o->chan);
    tsr_free(o->chan_set);
    tsr_free(o->ke);
    tsr_free(o->qe);
    tsr_free(o->km);
    tsr_free(o->warm);
    tsr_free(o->windows);
    if (o->dump) fclose(o->dump);
    tsr_free(o);
}

static tsr_status tsr__off_admit(void *state, int seq) {
    tsr__off *o = state;
    if (seq >= o->n_seqs) {
        tsr__oseq *ns = tsr_realloc(o->seqs, (size_t)(seq + 1) * sizeof *ns);
        if (!ns) return TSR_ERR_NOMEM;
        memset(ns + o->n_seqs, 0, (size_t)(seq + 1 - o->n_seqs) * sizeof *ns);
        o->seqs = ns;
        o->n_seqs = seq + 1;
    }
    tsr__oseq *s = &o->seqs[seq];
    s->layers = tsr_calloc((size_t)o->L, sizeof *s->layers);
    if (!s->layers) return TSR_ERR_NOMEM;
    s->active = 1;
    return TSR_OK;
}

/* A sliding layer (GPT-OSS): left to the policy cache's window (see `windows`). */
static int tsr__off_sliding(const tsr__off *o, int layer) {
    return o->windows && o->windows[layer] > 0;
}

/* Skew's dense layers are the first `dense_layers` offloaded (full-attention) layers: with
 * GPT-OSS's alternating sliding and full layers, counting layer indices would leave only half
 * as many offloaded layers dense, and the first full layer is the one with no previous full
 * layer to speculate from. */
static int tsr__off_dense(const tsr__off *o, int layer) {
    int before = 0; /* full layers below `layer` */
    for (int l = 0; l < layer && before < o->opt.dense_layers; l++) before += !tsr__off_sliding(o, l);
    return before < o->opt.dense_layers;
}

static tsr__oseq *tsr__oseq_get(tsr__off *o, int seq) {
    return seq >= 0 && seq < o->n_seqs && o->seqs[seq].active ? &o->seqs[seq] : NULL;
}

static tsr_status tsr__off_append(void *state, int seq, int32_t n) {
    tsr__off *o = state;
    tsr__oseq *s = tsr__oseq_get(o, seq);
    if (!s) return tsr_error_set(TSR_ERR_INVALID, "offload: no sequence %d", seq);
    s->pending = n;
    /* a step starts: the last step's copies land (one host wait, when any are in flight),
     * and the rows written back get their partial keys (tsr__off_arrived) */
    return tsr_offload_copy_drain(o->copy);
}

static void tsr__off_pair(const tsr__off *o, int p, int *a, int *b) {
    *a = o->cfg.rope_interleaved ? 2 * p : p;
    *b = o->cfg.rope_interleaved ? 2 * p + 1 : p + o->hd / 2;
}

/* Adds the pair energy of n rows ([n][heads][hd]) to e ([heads][hd / 2]), per head. */
static void tsr__off_energy(const tsr__off *o, double *e, const float *x, int32_t n,
                            int heads) {
    int half = o->hd / 2;
    for (int32_t i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            const float *r = x + ((size_t)i * heads + h) * o->hd;
            double *eg = e + (size_t)h * half;
            for (int p = 0; p < half; p++) {
                int a, b;
                tsr__off_pair(o, p, &a, &b);
                eg[p] += (double)r[a] * r[a] + (double)r[b] * r[b];
            }
        }
}

/* Partial keys of rows [from, to) of L from the host copy: the chosen channels, or (skew)
 * the rotated key times the layer's transform columns. */
static void tsr__off_partial(const tsr__off *o, tsr__olayer *L, int layer, int32_t from,
                             int32_t to) {
    int pw = o->pw;
    if (o->mode == TSR_OFFLOAD_SKEW) {
        int group = o->H / o->G;
        for (int32_t i = from; i < to; i++)
            for (int h = 0; h < o->H; h++) {
                float *pk = L->pk + ((size_t)i * o->H + h) * pw;
                const float *k = L->hk + (size_t)i * o->kvd + (size_t)(h / group) * o->hd;
                const float *a = o->A + ((size_t)layer * o->H + h) * pw * o->hd;
                int nc = o->ncol[(size_t)layer * o->H + h];
                for (int c = 0; c < nc; c++) {
                    float d = 0.0f;
                    for (int t = 0; t < o->hd; t++) d += a[(size_t)c * o->hd + t] * k[t];
                    pk[c] = d;
                }
            }
        return;
    }
    const int *chan = o->chan + (size_t)layer * o->G * pw;
    for (int32_t i = from; i < to; i++)
        for (int g = 0; g < o->G; g++) {
            float *pk = L->pk + ((size_t)i * o->G + g) * pw;
            const float *k = L->hk + (size_t)i * o->kvd + (size_t)g * o->hd;
            for (int c = 0; c < pw; c++) pk[c] = k[chan[g * pw + c]];
        }
}

/* Adds heads [h0, h1) of qh ([..][half]) into out ([half]) one head after the other. */
static void tsr__off_add_heads(double *out, const double *qh, int h0, int h1, int half) {
    for (int h = h0; h < h1; h++)
        for (int p = 0; p < half; p++) out[p] += qh[(size_t)h * half + p];
}

/* qg ([G][half]): the query energy of each local KV head's whole query group, the group's
 * per-head sums added in global head order, so the bits are one process's for any tp.
 * A rank holding several KV heads holds their whole groups. When tp exceeds the KV heads,
 * the TP ranks [kv_share_begin, kv_share_end) share one replicated KV head and each holds
 * part of its group (runtime/exec/parallel.h): every TP rank broadcasts its per-head query
 * energy (host memory, a control-plane step even when activations go over NCCL) and the
 * sharing ranks add theirs in rank order, which is head order. Collective over TP: select
 * runs in step on all ranks and the warm-up, hence this call, is the same on every rank. */
static tsr_status tsr__off_group_qe(tsr__off *o, int layer, double *qg) {
    int half = o->hd / 2, per = o->H / o->G;
    const double *qh = o->qe + (size_t)layer * o->H * half;
    memset(qg, 0, (size_t)o->G * half * sizeof *qg);
    tsr_comm *c = o->cfg.comm;
    int b = o->cfg.kv_share_begin, e = o->cfg.kv_share_end;
    if (!c || e - b <= 1) {
        for (int g = 0; g < o->G; g++)
            tsr__off_add_heads(qg + (size_t)g * half, qh, g * per, (g + 1) * per, half);
        return TSR_OK;
    }
    int tp = tsr_comm_size(c, TSR_COMM_TP), me = tsr_comm_rank(c, TSR_COMM_TP);
    size_t rw = (size_t)o->H * half;
    double *all = tsr_malloc((size_t)tp * rw * sizeof *all);
    if (!all) return TSR_ERR_NOMEM;
    memcpy(all + (size_t)me * rw, qh, rw * sizeof *all);
    tsr_status st = TSR_OK;
    for (int r = 0; r < tp && st == TSR_OK; r++)
        st = tsr_comm_bcast(c, TSR_COMM_TP, all + (size_t)r * rw, rw * sizeof *all, r);
    for (int r = b; r < e && st == TSR_OK; r++)
        tsr__off_add_heads(qg, all + (size_t)r * rw, 0, o->H, half);
    tsr_free(all);
    return st;
}

/* Per KV head, the `pairs` rotary pairs with the largest sqrt(query energy * key energy)
 * (key energy alone before any query came); partial keys follow a changed choice. */
static tsr_status tsr__off_choose(tsr__off *o, int layer) {
    int half = o->hd / 2, changed = 0;
    double e[TSR__OFF_MAXHALF];
    size_t nqg = (size_t)o->G * half;
    double *qg = tsr_malloc((nqg ? nqg : 1) * sizeof *qg);
    if (!qg) return TSR_ERR_NOMEM;
    tsr_status st = tsr__off_group_qe(o, layer, qg);
    if (st != TSR_OK) {
        tsr_free(qg);
        return st;
    }
    for (int g = 0; g < o->G; g++) {
        const double *ke = o->ke + ((size_t)layer * o->G + g) * half;
        const double *qe = qg + (size_t)g * half;
        const double *km = o->km + ((size_t)layer * o->G + g) * o->hd;
        double w = o->warm[layer] > 0 ? 1.0 / o->warm[layer] : 0.0;
        for (int p = 0; p < half; p++) {
            int a, b;
            tsr__off_pair(o, p, &a, &b);
            /* the spread of this pair's q.k across keys: query energy x key variance */
            double var = ke[p] * w - (km[a] * w) * (km[a] * w) - (km[b] * w) * (km[b] * w);
            if (var < 0) var = 0;
            e[p] = qe[p] > 0 ? qe[p] * var : var;
        }
        int *ch = o->chan + ((size_t)layer * o->G + g) * 2 * o->pairs;
        for (int c = 0; c < o->pairs; c++) {
            int best = 0;
            for (int p = 1; p < half; p++)
                if (e[p] > e[best]) best = p;
            int a, b;
            tsr__off_pair(o, best, &a, &b);
            changed |= ch[2 * c] != a || ch[2 * c + 1] != b;
            ch[2 * c] = a;
            ch[2 * c + 1] = b;
            e[best] = -1.0;
        }
    }
    tsr_free(qg);
    if (!changed) return TSR_OK;
    for (int s = 0; s < o->n_seqs; s++)
        if (o->seqs[s].active)
            tsr__off_partial(o, &o->seqs[s].layers[layer], layer, 0, o->seqs[s].layers[layer].n);
    return TSR_OK;
}

static tsr_status tsr__off_grow(tsr__off *o, tsr__olayer *L, int32_t rows) {
    if ((size_t)rows <= L->cap) return TSR_OK;
    size_t cap = L->cap ? L->cap : 256;
    while (cap < (size_t)rows) cap *= 2;
    size_t kb = (size_t)o->kvd * 4, pw = (size_t)o->pkh * o->pw;
    /* Heap metadata first (freed without a size), then the two host-pool arrays, each
     * with its own recorded size, so that a failure anywhere still frees everything with
     * its true length (a placed pool unmaps exactly that). */
    float *pk = tsr_realloc(L->pk, cap * pw * 4);
    if (!pk) return TSR_ERR_NOMEM;
    L->pk = pk;
    uint8_t *res = tsr_realloc(L->res, cap);
    if (!res) return TSR_ERR_NOMEM;
    L->res = res;
    if (L->cap_v < cap) {
        TSR_TRY(tsr_host_pool_realloc(o->cfg.host, (void **)&L->hv, L->cap_v * kb, cap * kb));
        L->cap_v = cap;
    }
    TSR_TRY(tsr_host_pool_realloc(o->cfg.host, (void **)&L->hk, L->cap * kb, cap * kb));
    o->resident_meta_bytes += (int64_t)((cap - L->cap) * (pw * 4 + 1));
    L->cap = cap;
    if (o->cfg.host->peak > o->st.host_bytes_peak) o->st.host_bytes_peak = o->cfg.host->peak;
    return TSR_OK;
}

/* skew: whether layer's transform may be recalibrated during this step (its queries hook
 * adding this step's rows reaches cal_next): that recomputes the layer's partial keys from
 * every row of the host copy, this step's included, and replaces its speculation, so
 * neither the write-back nor the selection of such a layer may run ahead. Counted over
 * every sequence of the step, so the answer holds for the whole step (and is the same on
 * every rank). */
static int tsr__off_will_calibrate(const tsr__off *o, int layer) {
    if (!o->cal_done || o->cal_done[layer]) return 0;
    int64_t rows = 0;
    for (int s = 0; s < o->n_seqs; s++)
        if (o->seqs[s].active) rows += o->seqs[s].pending;
    return o->cal_n[layer] + rows >= o->cal_next[layer];
}

/* A write-back landed (the drain at a step's start): the rows' partial keys. */
static void tsr__off_arrived(void *ctx, int seq, int layer, int32_t at, int32_t n) {
    tsr__off *o = ctx;
    tsr__oseq *s = tsr__oseq_get(o, seq);
    if (!s || at + n > s->layers[layer].n) return;
    tsr__off_partial(o, &s->layers[layer], layer, at, at + n);
}

static tsr_status tsr__off_write(void *state, int layer, int seq, int32_t n, const float *k,
                                 const float *v) {
    tsr__off *o = state;
    tsr__oseq *s = tsr__oseq_get(o, seq);
    if (!s) return tsr_error_set(TSR_ERR_INVALID, "offload: no sequence %d", seq);
    if (tsr__off_sliding(o, layer)) return TSR_OK;
    tsr__olayer *L = &s->layers[layer];
    int32_t at = o->mech->ops->seq_len(o->mech, seq);
    TSR_TRY(tsr__off_grow(o, L, at + n));
    size_t kvd = (size_t)o->kvd;
    /* k and v are the layer's activations (backend memory): the host copy is a download.
     * With copy streams, when nothing reads this step's rows on the host before the next
     * step (skew: no calibration due; warmup: the channels chosen, so no warm-up energy;
     * no dump), it goes down on the device-to-host stream and the rows' partial keys wait
     * for the next step's drain (tsr__off_arrived); otherwise it waits, and everything
     * below reads that copy. */
    bool queued = false;
    int later = o->mode == TSR_OFFLOAD_SKEW ? !tsr__off_will_calibrate(o, layer)
                                            : o->chan_set[layer];
    if (o->copy && later && !o->dump)
        TSR_TRY(tsr_offload_copy_writeback(o->copy, seq, layer, k, v, n,
                                           L->hk + (size_t)at * kvd, L->hv + (size_t)at * kvd,
                                           at, &queued));
    if (!queued) {
        tsr_backend *be = tsr_kv_paged_backend(o->mech);
        TSR_TRY(tsr_backend_download(be, L->hk + (size_t)at * kvd, k, (size_t)n * kvd * 4));
        TSR_TRY(tsr_backend_download(be, L->hv + (size_t)at * kvd, v, (size_t)n * kvd * 4));
        k = L->hk + (size_t)at * kvd;
        if (o->mode == TSR_OFFLOAD_WARMUP && !o->chan_set[layer]) {
            tsr__off_energy(o, o->ke + (size_t)layer * o->G * (o->hd / 2), k, n, o->G);
            double *km = o->km + (size_t)layer * o->kvd;
            for (int32_t i = 0; i < n; i++)
                for (int c = 0; c < o->kvd; c++) km[c] += k[(size_t)i * kvd + c];
            o->warm[layer] += n;
        }
        tsr__off_partial(o, L, layer, at, at + n);
    }
    memset(L->res + at, 1, (size_t)n);
    L->n = at + n;
    o->st.bytes_offloaded += (int64_t)n * (int64_t)kvd * 8;
    return TSR_OK;
}

/* skew: adds n rotated query rows ([n][H][hd]) to the layer's calibration moments; each time
 * cal_n reaches cal_next (16, 32, ... opt.calib rows) each query head's transform becomes the
 * eigenvectors of its moment, its columns InfiniGen's union by the query and the key side
 * (tsr_offload_skew_cols, the keys of Lk: the sequence whose queries these are), and the layer's
 * partial keys and any pending speculation (made with the old transform) follow. */
static tsr_status tsr__off_calibrate(tsr__off *o, int layer, const tsr__olayer *Lk,
                                     const float *q, int n) {
    int hd = o->hd, group = o->H / o->G;
    size_t hh = (size_t)hd * hd;
    double *cl = o->cq + (size_t)layer * o->H * hh;
    for (int r = 0; r < n; r++)
        for (int h = 0; h < o->H; h++) {
            const float *x = q + ((size_t)r * o->H + h) * hd;
            double *c = cl + (size_t)h * hh;
            for (int i = 0; i < hd; i++)
                for (int j = i; j < hd; j++) c[(size_t)i * hd + j] += (double)x[i] * x[j];
        }
    o->cal_n[layer] += n;
    if (o->cal_n[layer] < o->cal_next[layer]) return TSR_OK;
    while (o->cal_next[layer] <= o->cal_n[layer] && o->cal_next[layer] < o->opt.calib)
        o->cal_next[layer] = 2 * o->cal_next[layer] < o->opt.calib ? 2 * o->cal_next[layer]
                                                                   : o->opt.calib;
    double *v = tsr_malloc((2 * hh + 2 * (size_t)hd) * sizeof *v);
    if (!v) return TSR_ERR_NOMEM;
    for (int h = 0; h < o->H; h++) {
        size_t at = (size_t)layer * o->H + h;
        o->ncol[at] = tsr_offload_skew_cols(cl + (size_t)h * hh, hd,
                                            Lk ? Lk->hk + (size_t)(h / group) * hd : NULL,
                                            Lk ? Lk->n : 0, (size_t)o->kvd, o->cols, o->pw, v,
                                            o->A + at * o->pw * hd);
    }
    tsr_free(v);
    o->cal_done[layer] = o->cal_n[layer] >= o->opt.calib;
    int all = 1; /* the moments go once every layer's transform is final */
    for (int l = 0; l < o->L; l++) all &= o->cal_done[l];
    if (all) {
        tsr_free(o->cq);
        o->cq = NULL;
    }
    for (int s = 0; s < o->n_seqs; s++)
        if (o->seqs[s].active) {
            tsr__olayer *L = &o->seqs[s].layers[layer];
            tsr__off_partial(o, L, layer, 0, L->n);
            L->sq_n = 0; /* select projects this layer's own queries instead */
        }
    return TSR_OK;
}

static tsr_status tsr__off_queries(void *state, int layer, int seq, const float *q,
                                   const int32_t *q_pos, int n_q, int n_heads) {
    tsr__off *o = state;
    if (tsr__off_sliding(o, layer)) return TSR_OK;
    tsr_kv_policy_queries_set(&o->qs, layer, seq, q, q_pos, n_q, n_heads);
    if (o->mode == TSR_OFFLOAD_SKEW && o->cal_done && !o->cal_done[layer] && n_heads == o->H) {
        tsr__oseq *s = tsr__oseq_get(o, seq);
        TSR_TRY(tsr__off_calibrate(o, layer, s ? &s->layers[layer] : NULL, q, n_q));
    }
    if (o->mode == TSR_OFFLOAD_WARMUP && !o->chan_set[layer] && n_heads == o->H &&
        n_heads % o->G == 0)
        tsr__off_energy(o, o->qe + (size_t)layer * o->H * (o->hd / 2), q, n_q, n_heads);
    return TSR_OK;
}

static int tsr__ocand_gt(const tsr__ocand *a, const tsr__ocand *b) {
    return a->score > b->score || (a->score == b->score && a->pos > b->pos);
}

/* Partially orders c so that its first k entries are the k largest (quickselect). */
static void tsr__oselect(tsr__ocand *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        tsr__ocand piv = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (tsr__ocand_gt(&c[i], &piv)) i++;
            while (tsr__ocand_gt(&piv, &c[j])) j--;
            if (i <= j) {
                tsr__ocand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* Scores of prior positions [0, len): softmax over partial (or exact) logits of the last
 * few query rows, summed over rows per head, then over the heads of the whole TP group in
 * head order (tsr_kv_policy_sum_heads), so every rank of the group selects the same
 * tokens, with the same bits for every tp. */
static tsr_status tsr__off_scores(tsr__off *o, const tsr__olayer *L, int layer, int32_t len,
                                  int exact, tsr__ocand *c) {
    int rows = o->qs.n < 4 ? o->qs.n : 4, heads = o->qs.heads, group = heads / o->G;
    int pw = o->pw;
    const int *chan = o->chan + (size_t)layer * o->G * pw;
    size_t n = (size_t)(len ? len : 1);
    float *lg = tsr_malloc(n * sizeof *lg);
    float *part = tsr_calloc(n * (size_t)heads, sizeof *part);
    float *sum = tsr_malloc(n * sizeof *sum);
    tsr_status st = lg && part && sum ? TSR_OK : TSR_ERR_NOMEM;
    for (int h = 0; h < heads && st == TSR_OK; h++) {
        int g = h / group;
        float *ph = part + (size_t)h * (size_t)len;
        for (int r = o->qs.n - rows; r < o->qs.n; r++) {
            const float *q = o->qs.q + ((size_t)r * heads + h) * o->hd;
            float mx = -INFINITY;
            for (int32_t j = 0; j < len; j++) {
                float d = 0.0f;
                if (exact) {
                    const float *k = L->hk + (size_t)j * o->kvd + (size_t)g * o->hd;
                    for (int t = 0; t < o->hd; t++) d += q[t] * k[t];
                } else {
                    const float *pk = L->pk + (size_t)j * o->G * pw + (size_t)g * pw;
                    for (int t = 0; t < pw; t++) d += q[chan[g * pw + t]] * pk[t];
                }
                lg[j] = d;
                mx = d > mx ? d : mx;
            }
            float scale = 1.0f / sqrtf((float)o->hd), z = 0.0f;
            for (int32_t j = 0; j < len; j++) {
                lg[j] = expf((lg[j] - mx) * scale);
                z += lg[j];
            }
            for (int32_t j = 0; j < len; j++) ph[j] += lg[j] / z;
        }
    }
    if (st == TSR_OK) st = tsr_kv_policy_sum_heads(&o->cfg, part, heads, (size_t)len, sum);
    for (int32_t j = 0; j < len && st == TSR_OK; j++) c[j] = (tsr__ocand){sum[j], j};
    tsr_free(lg);
    tsr_free(part);
    tsr_free(sum);
    return st;
}

/* The skew mode's partial queries of layer `t` ([rows][H][cols] into L->sq) from rotated
 * queries q ([rows][H * hd]). */
static tsr_status tsr__off_project(tsr__off *o, tsr__olayer *L, int t, const float *q,
                                   int rows) {
    size_t w = (size_t)o->H * o->pw;
    if (!L->sq) {
        L->sq = tsr_malloc(TSR__OFF_ROWS * w * sizeof *L->sq);
        if (!L->sq) return TSR_ERR_NOMEM;
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < o->H; h++) {
            const float *qh = q + ((size_t)r * o->H + h) * o->hd;
            const float *a = o->A + ((size_t)t * o->H + h) * o->pw * o->hd;
            float *out = L->sq + (size_t)r * w + (size_t)h * o->pw;
            int nc = o->ncol[(size_t)t * o->H + h];
            for (int c = 0; c < nc; c++) {
                float d = 0.0f;
                for (int i = 0; i < o->hd; i++) d += a[(size_t)c * o->hd + i] * qh[i];
                out[c] = d;
            }
        }
    L->sq_n = rows;
    return TSR_OK;
}

/* Speculates layer t's queries of the last rows of x ([n][dim], an attention input, the
 * rows at positions pos0 ..): x . Wq_t^T, rotated, projected on t's transform columns. */
static tsr_status tsr__off_speculate(tsr__off *o, tsr__olayer *L, int t, const float *x,
                                     int n, int32_t pos0) {
    int rows = n < TSR__OFF_ROWS ? n : TSR__OFF_ROWS;
    size_t qd = (size_t)o->H * o->hd, dim = (size_t)o->dim;
    float *q = tsr_malloc((size_t)rows * qd * sizeof *q);
    if (!q) return TSR_ERR_NOMEM;
    const tsr_tensor *wq = &o->wq[t];
    for (size_t i = 0; i < qd; i++) {
        const float *w = o->wrow;
        if (wq->dtype == TSR_F32) w = tsr_tensor_row(wq, (int64_t)i);
        else tsr_qblocks_row_f32(wq, (int64_t)i, o->wrow); /* Q8_0, 4-bit: dequantized */
        for (int r = 0; r < rows; r++) {
            q[(size_t)r * qd + i] = (float)tsr_offload_dot(w, x + (size_t)(n - rows + r) * dim, dim);
        }
    }
    for (int r = 0; r < rows; r++)
        tsr_offload_rope(q + (size_t)r * qd, o->H, o->hd, o->inv_freq, o->cfg.rope_interleaved,
                         pos0 + n - rows + r);
    tsr_status st = tsr__off_project(o, L, t, q, rows);
    tsr_free(q);
    return st;
}

static tsr_status tsr__off_early(tsr__off *o, tsr__oseq *s, int seq, int layer);

/* Layer `layer`'s attention input: speculates the next layer's selection from it (InfiniGen:
 * hidden states change little from one layer to the next, so the next layer's fetch can be
 * decided, and overlap, while this layer computes). The first layer of a rank has no
 * previous one here and speculates from its own input. With sliding layers (GPT-OSS) the
 * next layer is the next full one: a full layer speculates from the previous full layer's
 * input, and sliding layers neither speculate nor serve as a source. */
static tsr_status tsr__off_attn_input(void *state, int layer, int seq, const float *x, int n,
                                      int dim) {
    tsr__off *o = state;
    if (o->mode != TSR_OFFLOAD_SKEW || n <= 0 || tsr__off_sliding(o, layer)) return TSR_OK;
    tsr__oseq *s = tsr__oseq_get(o, seq);
    if (!s) return tsr_error_set(TSR_ERR_INVALID, "offload: no sequence %d", seq);
    if (dim != o->dim)
        return tsr_error_set(TSR_ERR_INVALID, "offload: attention input of width %d, Wq has %d",
                             dim, o->dim);
    int32_t pos0 = o->mech->ops->seq_len(o->mech, seq);
    if (tsr_kv_policy_budget(&o->cfg, pos0 + n) >= pos0 + n) return TSR_OK; /* keeps all */
    if (s->layers[layer].sq_n == 0) TSR_TRY(tsr__off_speculate(o, &s->layers[layer], layer, x, n, pos0));
    int next = tsr_kv_policy_next_full(o->windows, o->L, layer);
    if (next < o->L) {
        TSR_TRY(tsr__off_speculate(o, &s->layers[next], next, x, n, pos0));
        TSR_TRY(tsr__off_early(o, s, seq, next));
    }
    return TSR_OK;
}

/* The skew mode's scores of prior positions [0, len) from L's speculated partial queries:
 * the softmax of the partial logits summed over rows and heads (the ranking), and the
 * fetch size by InfiniGen's rule, the mean count per row and head of logits within alpha
 * of the maximum, capped at `cap` (tsr_offload_alpha_fetch). */
static tsr_status tsr__off_skew_scores(tsr__off *o, const tsr__olayer *L, int layer,
                                       int32_t len, int32_t cap, tsr__ocand *c,
                                       int32_t *take) {
    int rows = L->sq_n, heads = o->H, pw = o->pw;
    size_t n = (size_t)(len ? len : 1);
    float *lg = tsr_malloc(n * sizeof *lg);
    float *part = tsr_calloc(n * (size_t)heads, sizeof *part);
    float *sum = tsr_malloc(n * sizeof *sum);
    float *cnt = tsr_calloc((size_t)heads, sizeof *cnt);
    tsr_status st = lg && part && sum && cnt ? TSR_OK : TSR_ERR_NOMEM;
    float scale = 1.0f / sqrtf((float)o->hd);
    for (int h = 0; h < heads && st == TSR_OK; h++) {
        int nc = o->ncol[(size_t)layer * heads + h];
        float *ph = part + (size_t)h * (size_t)len;
        for (int r = 0; r < rows; r++) {
            const float *q = L->sq + ((size_t)r * heads + h) * pw;
            float mx = -INFINITY;
            for (int32_t j = 0; j < len; j++) {
                const float *pk = L->pk + ((size_t)j * heads + h) * pw;
                float d = 0.0f;
                for (int t = 0; t < nc; t++) d += q[t] * pk[t];
                lg[j] = d * scale;
                mx = lg[j] > mx ? lg[j] : mx;
            }
            cnt[h] += (float)tsr_offload_alpha_count(lg, 1, len, (float)o->opt.alpha);
            float z = 0.0f;
            for (int32_t j = 0; j < len; j++) {
                lg[j] = expf(lg[j] - mx);
                z += lg[j];
            }
            for (int32_t j = 0; j < len; j++) ph[j] += lg[j] / z;
        }
    }
    float tot = 0.0f;
    if (st == TSR_OK) st = tsr_kv_policy_sum_heads(&o->cfg, part, heads, (size_t)len, sum);
    if (st == TSR_OK) st = tsr_kv_policy_sum_heads(&o->cfg, cnt, heads, 1, &tot);
    if (st == TSR_OK) *take = tsr_offload_alpha_fetch(tot, (double)rows * heads * o->tp, cap);
    for (int32_t j = 0; j < len && st == TSR_OK; j++) c[j] = (tsr__ocand){sum[j], j};
    tsr_free(lg);
    tsr_free(part);
    tsr_free(sum);
    tsr_free(cnt);
    return st;
}

/* skew with copy streams: layer's selection made now, from the speculation just taken at
 * the previous layer's attention input (the inputs select would use: the speculated
 * queries, the partial keys of the prior tokens, the budget of this step's rows), stashed
 * for select, and the upload of its missing rows queued on the host-to-device stream, so
 * that it runs while the previous layer computes. Not for a layer whose transform may be
 * recalibrated this step (tsr__off_will_calibrate), whose selection select makes then. The
 * same calls on every rank (the scores are summed over the TP group). */
static tsr_status tsr__off_early(tsr__off *o, tsr__oseq *s, int seq, int layer) {
    tsr__olayer *L = &s->layers[layer];
    L->ew_ok = 0;
    if (!o->copy || o->mode != TSR_OFFLOAD_SKEW || !L->sq_n || layer < o->opt.dense_layers ||
        tsr__off_sliding(o, layer) || tsr__off_will_calibrate(o, layer))
        return TSR_OK;
    tsr_kv_cache *m = o->mech;
    int32_t len = m->ops->seq_len(m, seq), total = L->n + s->pending;
    if (L->n != len) return TSR_OK;
    /* a dense prefill chunk fetches every prior token at select: nothing to choose early */
    if (o->opt.dense_prefill && total - len > 1) return TSR_OK;
    int32_t keep = tsr_kv_policy_budget(&o->cfg, total) - (total - len);
    if (keep <= 0 || keep >= len) return TSR_OK; /* select keeps all, or only the new rows */
    if (L->ew_cap < len) {
        uint8_t *ew = tsr_realloc(L->ew, (size_t)len);
        if (!ew) return TSR_ERR_NOMEM;
        L->ew = ew;
        L->ew_cap = len;
    }
    tsr__ocand *c = tsr_malloc((size_t)len * sizeof *c);
    int32_t *fp = tsr_malloc((size_t)len * sizeof *fp);
    int32_t take = keep;
    tsr_status st = c && fp ? tsr__off_skew_scores(o, L, layer, len, keep, c, &take)
                            : TSR_ERR_NOMEM;
    if (st == TSR_OK) {
        tsr__oselect(c, len, take);
        memset(L->ew, 0, (size_t)len);
        for (int32_t j = 0; j < take; j++) L->ew[c[j].pos] = 1;
        L->ew_len = len;
        L->ew_total = total;
        L->ew_take = take;
        L->ew_ok = 1;
        int32_t nf = 0;
        for (int32_t j = 0; j < len; j++)
            if (L->ew[j] && !L->res[j]) fp[nf++] = j;
        bool queued = false;
        st = tsr_offload_copy_prefetch(o->copy, seq, layer, L->hk, L->hv, fp, nf, &queued);
    }
    tsr_free(c);
    tsr_free(fp);
    return st;
}

/* Evicts the resident prior tokens of L (positions < len) that want does not hold. */
static tsr_status tsr__off_evict(tsr__off *o, tsr__olayer *L, int layer, int seq,
                                 const uint8_t *want, int32_t len) {
    tsr_kv_cache *m = o->mech;
    int32_t ns = tsr_kv_paged_slots(m, layer, seq), ne = 0;
    int32_t *pos = tsr_malloc((size_t)(ns ? ns : 1) * sizeof *pos);
    int32_t *ev = tsr_malloc((size_t)(ns ? ns : 1) * sizeof *ev);
    tsr_status st = pos && ev ? tsr_kv_paged_read_slots(m, layer, seq, pos, NULL)
                              : TSR_ERR_NOMEM;
    for (int32_t i = 0; i < ns && st == TSR_OK; i++)
        if (pos[i] < len && !want[pos[i]]) {
            ev[ne++] = i;
            L->res[pos[i]] = 0;
        }
    if (st == TSR_OK && ne) st = tsr_kv_paged_evict(m, layer, seq, ev, ne);
    if (st == TSR_OK) o->st.evictions += ne;
    tsr_free(pos);
    tsr_free(ev);
    return st;
}

/* Dense prefill, after the attention of the layer that held every prior token: its resident
 * prior tokens go back to the budgeted selection made at its select (tk), the set the layer
 * would have held without dense prefill. Local (no collective): the selection was made on
 * every rank alike. Called at the sequence's next select (any layer: the forward pass runs a
 * sequence's layers in order, each select after the previous layer's attention) and at its
 * commit, so at most one layer of a sequence holds more than its budgeted set at a time. */
static tsr_status tsr__off_trim(tsr__off *o, tsr__oseq *s, int seq) {
    if (!s->trim) return TSR_OK;
    s->trim = 0;
    tsr__olayer *L = &s->layers[s->trim_layer];
    return tsr__off_evict(o, L, s->trim_layer, seq, L->tk, L->tk_len);
}

static tsr_status tsr__off_select(void *state, int layer, int seq) {
    tsr__off *o = state;
    tsr__oseq *s = tsr__oseq_get(o, seq);
    if (!s) return tsr_error_set(TSR_ERR_INVALID, "offload: no sequence %d", seq);
    TSR_TRY(tsr__off_trim(o, s, seq)); /* the previous layer's attention is done */
    if (tsr__off_sliding(o, layer)) return TSR_OK; /* its window, whatever the budget */
    tsr__olayer *L = &s->layers[layer];
    tsr_kv_cache *m = o->mech;
    if (o->mode == TSR_OFFLOAD_WARMUP && !o->chan_set[layer]) {
        TSR_TRY(tsr__off_choose(o, layer));
        if (o->warm[layer] >= TSR__OFF_WARM) o->chan_set[layer] = 1;
    }
    int32_t len = m->ops->seq_len(m, seq), total = L->n;
    int32_t budget = tsr_kv_policy_budget(&o->cfg, total);
    int32_t keep = budget - (total - len);
    if (keep < 0) keep = 0;
    if (keep > len) keep = len;
    /* InfiniGen leaves its first layers dense: layer 0 has no previous layer to speculate
     * from, and the first layers' attention is spread wide (tools/infinigen_ref.py). */
    if (o->mode == TSR_OFFLOAD_SKEW && tsr__off_dense(o, layer)) keep = len;
    /* InfiniGen prefills the prompt with full attention and selects only at decode: a chunk
     * that saw only budget - chunk prior tokens (none for a chunk over the budget) would
     * write every later layer's prompt KV from a starved attention. So a step of several
     * tokens (a prefill chunk) makes the budgeted selection as usual (`keep` tokens, by the
     * mode's rule), then fetches every other prior token too for this layer's attention;
     * after it, tsr__off_trim evicts them again, leaving the budgeted selection. The resident
     * set exceeds what it holds without dense prefill by at most one layer's prior tokens
     * (len - keep rows) per prefilling sequence. */
    int prefill = o->opt.dense_prefill && total - len > 1 && keep < len;
    uint8_t *want = tsr_calloc((size_t)(len ? len : 1), 1);
    if (!want) return TSR_ERR_NOMEM;
    if (keep == len) {
        memset(want, 1, (size_t)len);
    } else if (keep > 0) {
        tsr__ocand *c = tsr_malloc((size_t)len * sizeof *c);
        if (!c) {
            tsr_free(want);
            return TSR_ERR_NOMEM;
        }
        int have_q = tsr_kv_policy_queries_for(&o->qs, layer, seq) && o->qs.n > 0;
        tsr_status sst = TSR_OK;
        int32_t take = keep;
        /* made early, from the same inputs (tsr__off_early) */
        int early = L->ew_ok && L->ew_len == len && L->ew_total == total && L->sq_n;
        if (!early && o->mode == TSR_OFFLOAD_SKEW && !L->sq_n && have_q) {
            /* nothing speculated (no attention input came): this layer's own queries */
            int rows = o->qs.n < TSR__OFF_ROWS ? o->qs.n : TSR__OFF_ROWS;
            sst = tsr__off_project(o, L, layer,
                                   o->qs.q + (size_t)(o->qs.n - rows) * o->H * o->hd, rows);
        }
        if (early) {
            memcpy(want, L->ew, (size_t)len);
            take = L->ew_take;
        } else if (sst == TSR_OK && o->mode == TSR_OFFLOAD_SKEW && L->sq_n)
            sst = tsr__off_skew_scores(o, L, layer, len, keep, c, &take);
        else if (sst == TSR_OK && have_q) sst = tsr__off_scores(o, L, layer, len, 0, c);
        else {
            for (int32_t j = 0; j < len; j++) c[j] = (tsr__ocand){(float)j, j};
            o->st.fallback_selections++;
        }
        if (sst != TSR_OK) {
            tsr_free(c);
            tsr_free(want);
            return sst;
        }
        if (!early) {
            tsr__oselect(c, len, take);
            for (int32_t j = 0; j < take; j++) want[c[j].pos] = 1;
        }
        o->st.selections++;
        if (have_q && (o->opt.measure_recall || o->st.selections % TSR__OFF_RECALL_EVERY == 1)) {
            /* the exact pass is collective too (the same flag and count on every rank);
             * recall of the exact top `take` tokens (the layer's own queries, all keys) */
            sst = tsr__off_scores(o, L, layer, len, 1, c);
            if (sst != TSR_OK) {
                tsr_free(c);
                tsr_free(want);
                return sst;
            }
            tsr__oselect(c, len, take);
            int32_t hit = 0;
            for (int32_t j = 0; j < take; j++) hit += want[c[j].pos];
            o->st.recall_sum += (double)hit / take;
            o->st.recall_n++;
        }
        tsr_free(c);
    }
    if (prefill) {
        if (L->tk_cap < len) {
            uint8_t *tk = tsr_realloc(L->tk, (size_t)len);
            if (!tk) {
                tsr_free(want);
                return TSR_ERR_NOMEM;
            }
            L->tk = tk;
            L->tk_cap = len;
        }
        memcpy(L->tk, want, (size_t)len);
        L->tk_len = len;
        s->trim = 1;
        s->trim_layer = layer;
        memset(want, 1, (size_t)len);
    }
    /* the dump lists the sets attention saw, a dense prefill chunk's being all */
    int dumped = o->dump && keep < len && !prefill;
    if (dumped) { /* keep 0 too: only the step's tokens stay */
        int32_t nw = 0;
        for (int32_t j = 0; j < len; j++) nw += want[j];
        fprintf(o->dump, "%d %d %d", layer, (int)len, (int)nw);
        for (int32_t j = 0; j < len; j++)
            if (want[j]) fprintf(o->dump, " %d", (int)j);
        fputc('\n', o->dump);
    }
    /* Evict resident prior tokens that are not wanted, then fetch the missing ones. */
    int32_t nf = 0;
    tsr_status st = tsr__off_evict(o, L, layer, seq, want, len);
    for (int32_t j = 0; j < len && st == TSR_OK; j++) nf += want[j] && !L->res[j];
    if (st == TSR_OK && nf > 0) st = tsr_kv_paged_reserve_rows(m, layer, seq, nf);
    /* NO_BLOCKS: not free now; BUDGET: more than the whole pool holds for the sequence */
    int short_pool = st == TSR_ERR_NO_BLOCKS || st == TSR_ERR_BUDGET;
    if (short_pool && prefill) {
        /* The pool cannot hold every prior token of this layer (it is sized for the
         * budget, tsr_kv_setup): the chunk attends to its budgeted selection instead, as
         * without dense prefill, and it counts as a short fetch. */
        memcpy(want, L->tk, (size_t)len);
        s->trim = 0;
        o->st.fetch_short++;
        nf = 0;
        st = tsr__off_evict(o, L, layer, seq, want, len);
        for (int32_t j = 0; j < len && st == TSR_OK; j++) nf += want[j] && !L->res[j];
        if (st == TSR_OK && nf > 0) st = tsr_kv_paged_reserve_rows(m, layer, seq, nf);
        short_pool = st == TSR_ERR_NO_BLOCKS || st == TSR_ERR_BUDGET;
    }
    if (short_pool) {
        /* The pool is shorter than the fetch (a tight --kv-memory: skew's alpha rule can
         * want more rows than the layer held, a dense layer every prior token). Failing here would end the job in the middle
         * of a forward pass, so fetch what fits in the layer's last block, the most recent
         * tokens first, and count it (fetch_short). */
        int32_t bs = tsr_kv_block_size(m), cur = tsr_kv_paged_slots(m, layer, seq);
        int32_t room = bs > 0 ? (bs - cur % bs) % bs : 0, kept = 0;
        for (int32_t j = len - 1; j >= 0; j--) {
            if (!want[j] || L->res[j]) continue;
            if (kept < room) kept++;
            else want[j] = 0;
        }
        nf = kept;
        o->st.fetch_short++;
        st = nf > 0 ? tsr_kv_paged_reserve_rows(m, layer, seq, nf) : TSR_OK;
    }
    if (st == TSR_OK && nf > 0) {
        /* The missing rows go in with one call: the prefetch's device rows when it holds
         * exactly these (the compute stream waits for its upload, the host does not), else
         * packed from the host copy and scattered; the same slots and bits either way. */
        size_t kvd = (size_t)o->kvd;
        float *fk = NULL;
        int32_t *fp = tsr_malloc((size_t)nf * sizeof *fp);
        st = fp ? TSR_OK : TSR_ERR_NOMEM;
        int32_t f = 0;
        for (int32_t j = 0; j < len && st == TSR_OK; j++)
            if (want[j] && !L->res[j]) fp[f++] = j;
        const float *dk = NULL, *dv = NULL;
        if (st == TSR_OK) st = tsr_offload_copy_take(o->copy, seq, layer, fp, nf, &dk, &dv);
        if (st == TSR_OK && !dk && o->copy) {
            /* nothing made early (warmup selects from the layer's own queries): the same
             * copy from pinned staging on the copy stream, waited for at once by the
             * compute stream, not the host; no overlap, but no host wait either */
            bool q = false;
            st = tsr_offload_copy_prefetch(o->copy, seq, layer, L->hk, L->hv, fp, nf, &q);
            if (st == TSR_OK && q) {
                o->st.copy_late++;
                st = tsr_offload_copy_take(o->copy, seq, layer, fp, nf, &dk, &dv);
            }
        }
        if (st == TSR_OK && dk) {
            st = tsr_kv_paged_insert_device(m, layer, seq, fp, nf, dk, dv);
        } else if (st == TSR_OK) {
            fk = tsr_malloc((size_t)nf * kvd * 2 * sizeof *fk);
            st = fk ? TSR_OK : TSR_ERR_NOMEM;
            float *fv = fk ? fk + (size_t)nf * kvd : NULL;
            for (int32_t i = 0; i < nf && st == TSR_OK; i++) {
                memcpy(fk + (size_t)i * kvd, L->hk + (size_t)fp[i] * kvd, kvd * 4);
                memcpy(fv + (size_t)i * kvd, L->hv + (size_t)fp[i] * kvd, kvd * 4);
            }
            if (st == TSR_OK) st = tsr_kv_paged_insert(m, layer, seq, fp, nf, fk, fv);
        }
        for (int32_t i = 0; i < f && st == TSR_OK; i++) L->res[fp[i]] = 1;
        if (st == TSR_OK) o->st.bytes_fetched += (int64_t)nf * o->kvd * 8;
        tsr_free(fk);
        tsr_free(fp);
    }
    if (st == TSR_OK && dumped) {
        /* the resident rows against the host copy: slots whose K/V or position depart from
         * the selection (a debugging aid with the dump) */
        int32_t n2 = tsr_kv_paged_slots(m, layer, seq), bad = 0, seen = 0;
        size_t kvd = (size_t)o->kvd;
        int32_t *p2 = tsr_malloc((size_t)(n2 ? n2 : 1) * sizeof *p2);
        float *gk = tsr_malloc((size_t)(n2 ? n2 : 1) * kvd * 2 * sizeof *gk);
        if (p2 && gk && tsr_kv_paged_read_slots(m, layer, seq, p2, NULL) == TSR_OK &&
            tsr_kv_paged_gather(m, layer, seq, NULL, n2, gk, gk + (size_t)n2 * kvd) == TSR_OK)
            for (int32_t i = 0; i < n2; i++) {
                int32_t q = p2[i];
                int okp = q >= 0 && q < L->n && (q >= len || want[q]);
                seen += q < len && okp;
                if (!okp || memcmp(gk + (size_t)i * kvd, L->hk + (size_t)q * kvd, kvd * 4) ||
                    memcmp(gk + ((size_t)n2 + i) * kvd, L->hv + (size_t)q * kvd, kvd * 4))
                    bad++;
            }
        const tsr_kv_span *sp = NULL;
        int nsp = 0;
        int32_t rows = 0;
        if (m->ops->spans(m, layer, seq, &sp, &nsp) == TSR_OK)
            for (int j = 0; j < nsp; j++) rows += sp[j].n;
        fprintf(o->dump, "# %d %d slots %d bad %d prior %d span_rows %d\n", layer, (int)len,
                (int)n2, (int)bad, (int)seen, (int)rows);
        tsr_free(p2);
        tsr_free(gk);
    }
    tsr_free(want);
    o->qs.q = NULL;
    L->sq_n = 0; /* a speculation serves one selection */
    L->ew_ok = 0;
    return st;
}

static tsr_status tsr__off_commit(void *state, int seq, int32_t n) {
    tsr__off *o = state;
    tsr__oseq *s = tsr__oseq_get(o, seq);
    if (s) s->pending = 0;
    o->st.tokens_processed += n;
    return s ? tsr__off_trim(o, s, seq) : TSR_OK; /* the last layer's attention is done */
}

static void tsr__off_stats(const void *state, void *out_) {
    const tsr__off *o = state;
    tsr__off_counters *out = out_;
    *out = o->st;
    if (o->cfg.host->peak > out->host_bytes_peak) out->host_bytes_peak = o->cfg.host->peak;
    out->bytes_per_token = out->tokens_processed ? (double)(out->bytes_offloaded +
                                                            out->bytes_fetched) /
                                                       (double)out->tokens_processed
                                                 : 0.0;
    out->fetched_per_token = out->tokens_processed
                                 ? (double)out->bytes_fetched / (double)out->tokens_processed
                                 : 0.0;
    out->recall = out->recall_n ? out->recall_sum / (double)out->recall_n : -1.0;
    tsr_offload_copy_stats cs;
    tsr_offload_copy_get_stats(o->copy, &cs);
    out->copy_prefetches = cs.prefetches;
    out->copy_prefetch_used = cs.prefetch_used;
    out->copy_prefetch_dropped = cs.prefetch_dropped;
    out->copy_writebacks = cs.writebacks;
    out->copy_drains = cs.drains;
    out->copy_timed = cs.timed;
    out->copy_ms = cs.copy_ms;
    out->copy_stall_ms = cs.stall_ms;
    out->copy_hidden = cs.timed && cs.copy_ms > 0 ? 1.0 - cs.stall_ms / cs.copy_ms : -1.0;
}

/* Rows per layer of one sequence at most (policy.h, `resident`; in: the default, the
 * budget plus a chunk). Skew's dense layers hold every token; the others their budgeted
 * selection. Dense prefill holds, on top, one layer's every prior token while a prompt
 * chunk attends (tsr__off_select; trimmed at the next select), so its peak is one
 * budgeted layer holding the whole context; without room for that the chunk attends to
 * its budgeted selection (fetch_short). Which layer it is changes from layer to layer:
 * the first budgeted one stands for it. Every layer counts as a full one, as in the
 * default (GPT-OSS's sliding layers hold their window instead, whatever the policy). */
static void tsr__off_resident(const void *opts, const tsr_kv_policy_extent *in, int32_t *need,
                              int32_t *want) {
    const tsr__off_opts *opt = opts;
    int skew = tsr__off_mode(opt, in->has_model, in->pipeline, in->kv_replicated) ==
               TSR_OFFLOAD_SKEW;
    int dense = skew ? opt->dense_layers : 0;
    for (int l = 0; l < in->n_layers && l < dense; l++) need[l] = want[l] = in->context;
    if (!opt->dense_prefill) return;
    for (int l = 0; l < in->n_layers; l++)
        if (need[l] < in->context) {
            want[l] = in->context;
            return;
        }
}

static const tsr_kv_policy_option tsr__off_options[] = {
    {"offload-mode", TSR_KV_OPT_ENUM, offsetof(tsr__off_opts, mode), "MODE",
     "skew (InfiniGen: partial keys from each query head's skewing transform, the next "
     "layer speculated; warmup under --pp, with replicated KV heads or without model "
     "weights) or warmup (channel pairs from the first keys, the layer's own queries)",
     "skew", 0, 0, tsr__off_modes},
    {"offload-pairs", TSR_KV_OPT_INT, offsetof(tsr__off_opts, spec_pairs), "N",
     "channel pairs per head the speculation scores with (0: 20 % of the head's channels "
     "in skew mode, 4 pairs in warmup)", "0", 0, 64, NULL},
    {"offload-alpha", TSR_KV_OPT_DOUBLE, offsetof(tsr__off_opts, alpha), "A",
     "skew: fetch the keys whose speculated logit is within A of the maximum (InfiniGen's "
     "alpha; 5 in its Llama scripts), at most the budget", "5", 0, 1e6, NULL},
    {"offload-ratio", TSR_KV_OPT_DOUBLE, offsetof(tsr__off_opts, ratio), "R",
     "skew: the share of each head's channels kept as partial keys when --offload-pairs is "
     "0 (InfiniGen's partial-weight ratio)", "0.2", 0.01, 1, NULL},
    {"offload-dense-layers", TSR_KV_OPT_INT, offsetof(tsr__off_opts, dense_layers), "N",
     "skew: the first N offloaded layers keep every token, as InfiniGen does (their KV "
     "still counts in the host copy); with sliding-window layers (GPT-OSS) N counts the "
     "full-attention layers only", "2", 0, 1 << 20, NULL},
    {"offload-calib", TSR_KV_OPT_INT, offsetof(tsr__off_opts, calib), "N",
     "skew: each query head's transform becomes the eigenvectors of its first queries' "
     "second moment after 16 rows, again at 32, 64, ... up to N, the columns InfiniGen's "
     "union by query energy and by key magnitude (0: the weights' transform throughout)",
     "256", 0, 1 << 20, NULL},
    {"offload-dense-prefill", TSR_KV_OPT_ENUM, offsetof(tsr__off_opts, dense_prefill),
     "off|on",
     "on: a prefill chunk attends to every prior token (InfiniGen's prefill), those its "
     "budgeted selection leaves out fetched for the layer's attention and evicted after "
     "it; off: to the budgeted selection only", "on", 0, 0,
     tsr__off_switch},
    {"offload-sync", TSR_KV_OPT_FLAG, offsetof(tsr__off_opts, sync), NULL,
     "no copy streams: every fetch and write-back of K/V waits for its copy (the overlapped "
     "path's reference, the same tokens)", NULL, 0, 1, NULL},
    {"offload-recall", TSR_KV_OPT_FLAG, offsetof(tsr__off_opts, measure_recall), NULL,
     "score every selection exactly for the speculation's recall (slow; by default every "
     "16th)", NULL, 0, 1, NULL},
};

/* The JSON keys predate the declaration (bench/quality.sh reads them). */
static const tsr_kv_policy_stat_field tsr__off_stat_fields[] = {
    {"evictions", TSR_KV_STAT_I64, offsetof(tsr__off_counters, evictions)},
    {"bytes_offloaded", TSR_KV_STAT_I64, offsetof(tsr__off_counters, bytes_offloaded)},
    {"bytes_fetched", TSR_KV_STAT_I64, offsetof(tsr__off_counters, bytes_fetched)},
    {"bytes_moved_per_token", TSR_KV_STAT_F64, offsetof(tsr__off_counters, bytes_per_token)},
    {"bytes_fetched_per_token", TSR_KV_STAT_F64,
     offsetof(tsr__off_counters, fetched_per_token)},
    {"tokens_processed", TSR_KV_STAT_I64, offsetof(tsr__off_counters, tokens_processed)},
    {"host_bytes_peak", TSR_KV_STAT_I64, offsetof(tsr__off_counters, host_bytes_peak)},
    {"spec_selections", TSR_KV_STAT_I64, offsetof(tsr__off_counters, selections)},
    {"spec_fallbacks", TSR_KV_STAT_I64, offsetof(tsr__off_counters, fallback_selections)},
    {"spec_recall", TSR_KV_STAT_F64, offsetof(tsr__off_counters, recall)},
    {"spec_recall_n", TSR_KV_STAT_I64, offsetof(tsr__off_counters, recall_n)},
    {"fetch_short", TSR_KV_STAT_I64, offsetof(tsr__off_counters, fetch_short)},
    {"copy_prefetches", TSR_KV_STAT_I64, offsetof(tsr__off_counters, copy_prefetches)},
    {"copy_prefetch_used", TSR_KV_STAT_I64, offsetof(tsr__off_counters, copy_prefetch_used)},
    {"copy_prefetch_dropped", TSR_KV_STAT_I64,
     offsetof(tsr__off_counters, copy_prefetch_dropped)},
    {"copy_late", TSR_KV_STAT_I64, offsetof(tsr__off_counters, copy_late)},
    {"copy_writebacks", TSR_KV_STAT_I64, offsetof(tsr__off_counters, copy_writebacks)},
    {"copy_drains", TSR_KV_STAT_I64, offsetof(tsr__off_counters, copy_drains)},
    {"copy_timed", TSR_KV_STAT_I64, offsetof(tsr__off_counters, copy_timed)},
    {"copy_ms", TSR_KV_STAT_F64, offsetof(tsr__off_counters, copy_ms)},
    {"copy_stall_ms", TSR_KV_STAT_F64, offsetof(tsr__off_counters, copy_stall_ms)},
    {"copy_hidden", TSR_KV_STAT_F64, offsetof(tsr__off_counters, copy_hidden)},
};

/* Queries (warmup's channel choice and selection, recall checks in both modes) and the
 * attention input (skew's speculation) every layer; partial scores summed over the TP
 * group; its host copy of the KV is no part of a checkpoint. */
const tsr_kv_policy_decl tsr_kv_policy_offload = {
    .name = "offload",
    .help = "host tier + speculative fetch",
    .reads_queries = 1,
    .reads_attn_input = 1,
    .uses_budget = 1,
    .tp_host_sums = 1,
    .options = tsr__off_options,
    .n_options = TSR_KV_COUNT(tsr__off_options),
    .options_size = sizeof(tsr__off_opts),
    .stat_fields = tsr__off_stat_fields,
    .n_stats = TSR_KV_COUNT(tsr__off_stat_fields),
    .stats_size = sizeof(tsr__off_counters),
    .resident = tsr__off_resident,
    .resident_short = "dense prefill attends to the budgeted selection of the layer it "
                      "cannot fetch every prior token for (counted in fetch_short)",
    .create = tsr__off_create,
    .destroy = tsr__off_destroy,
    .admit = tsr__off_admit,
    .append = tsr__off_append,
    .write = tsr__off_write,
    .queries = tsr__off_queries,
    .attn_input = tsr__off_attn_input,
    .select = tsr__off_select,
    .commit = tsr__off_commit,
    .release = tsr__off_release,
    .stats = tsr__off_stats,
};
