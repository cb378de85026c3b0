/* The `snapkv` policy (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before
 * Generation"): at the end of a prompt, the attention the last W prompt queries (the
 * observation window, --snapkv-window, 32) give each earlier key, pooled over neighbouring
 * keys (1-D pooling, --snapkv-pool avg|max, --snapkv-kernel 7) and summed over heads, picks
 * the keys to keep: the top (budget - window) of them plus the window itself.
 *
 * When the prompt ends: the cache interface sees step sizes, not requests, so every step of
 * more than one token (a prefill chunk) ends with a compression of each layer that holds
 * more than the budget, and a one-token step (a decode) appends. A prompt that fits in one
 * chunk is compressed once, at its end, exactly as in the paper; a chunked prompt is
 * compressed after each chunk (each with the last W queries seen so far as its window), so
 * a 128K prefill holds budget + one chunk per layer instead of the whole prompt. The last
 * chunk's compression is the paper's, over the keys the earlier ones kept.
 *
 * Decode steps: the paper appends every generated token, so its cache grows past the budget
 * by the generation. The pool is sized for budget + one chunk per layer
 * (tsr_kv_policy_resident_of's default, runtime/exec/kv_setup.c), so here a layer grows by
 * decode steps up to that bound (tsr_kv_policy_bound: the budget at the sequence's length
 * plus cfg->chunk) and no further: the decode step that brings it there ends, at commit,
 * with the layer compressed to its budget again by the same selection, its window the last
 * W queries seen (now decode queries). The next step's reserve (and the scheduler's
 * reserve_check before it) then sees the compressed layer, so a sequence never needs more
 * blocks than the start-up check counted, however long it generates; a prompt shorter than
 * the budget is held to it the same way. A generation that stays under the bound appends
 * exactly as the paper does (same tokens); one that reaches it is compressed every `chunk`
 * decode steps, one scoring of the layer's keys each time.
 *
 * The forward pass's key_scores sum over every query of a call, so this policy does not
 * ask for them (reads_scores 0): the queries hook hands the step's rotated queries (host
 * memory), of which each layer keeps the last W; at commit each layer's keys come to the
 * host tile by tile through the mechanism's gather, and q.k is the score (queries and keys
 * are both rotated with their own positions, so q.k carries RoPE's relative position). The
 * softmax over a window query's keys needs its row maximum and sum first, so the tiles are
 * read twice: W x tile logits at a time, never n x n.
 *
 * Tensor parallelism: each rank scores its own query heads (per query head, against its KV
 * head), pools them per head and sums them over the whole TP group in global head order
 * (tsr_kv_policy_sum_heads), so every rank keeps the same tokens, the same bits for any tp. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "base/alloc.h"

/* Keys gathered to the host per tile. */
#define TSR__SNAP_TILE 256

/* Its options (the declaration below) and stats. */
typedef struct tsr__snap_opts {
    int window;  /* the observation window: the last `window` queries */
    int kernel;  /* pooling kernel over neighbouring keys (odd) */
    int maxpool; /* max rather than average pooling */
} tsr__snap_opts;

typedef struct tsr__snap_counters {
    int64_t evictions;
    int64_t tokens_processed;
    int64_t compressions;          /* layer compressions */
    int64_t compressions_unscored; /* of them, without window queries: the newest kept */
    int64_t decode_compressions;   /* of them, after a decode step reached the bound */
} tsr__snap_counters;

typedef struct tsr__sseq {
    int active;
    float *q;      /* [L][W][H * hd]: each layer's last queries, oldest first */
    int32_t *qpos; /* [L][W] */
    int32_t *nq;   /* [L] queries held */
} tsr__sseq;

typedef struct tsr__snap {
    tsr_kv_policy_config cfg;
    tsr_kv_cache *mech;
    int32_t *windows; /* GPT-OSS sliding layers: no budget there (tsr_kv_policy_windows) */
    int L, G, H, hd, kvd;
    int window, kernel, maxpool;
    tsr__sseq *seqs;
    int n_seqs;
    tsr__snap_counters st;
} tsr__snap;

typedef struct tsr__scand {
    float score;
    int32_t pos;
    int32_t slot;
} tsr__scand;

static int tsr__snap_by_pos(const void *a, const void *b) {
    const tsr__scand *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Highest score first; on ties the newer token first (so the older is evicted). */
static int tsr__snap_by_score(const void *a, const void *b) {
    const tsr__scand *x = a, *y = b;
    if (x->score != y->score) return (x->score < y->score) - (x->score > y->score);
    return (x->pos < y->pos) - (x->pos > y->pos);
}

static tsr_status tsr__snap_create(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech,
                                   void **state) {
    const tsr__snap_opts *o = cfg->opts;
    if (cfg->n_heads <= 0 || cfg->n_heads % mech->n_kv_heads != 0)
        return tsr_error_set(TSR_ERR_INVALID, "snapkv: %d query heads over %d kv heads",
                             cfg->n_heads, mech->n_kv_heads);
    if (o->kernel % 2 == 0) /* a centred window: kernel / 2 keys on either side */
        return tsr_error_set(TSR_ERR_INVALID, "--snapkv-kernel %d: must be odd", o->kernel);
    tsr__snap *s = tsr_calloc(1, sizeof *s);
    if (!s) return TSR_ERR_NOMEM;
    s->cfg = *cfg;
    s->mech = mech;
    s->L = mech->n_layers;
    s->G = mech->n_kv_heads;
    s->kvd = mech->kv_dim;
    s->hd = s->kvd / s->G;
    s->H = cfg->n_heads;
    s->window = o->window;
    s->kernel = o->kernel;
    s->maxpool = o->maxpool;
    s->windows = tsr_kv_policy_windows(cfg, mech->n_layers);
    *state = s;
    return TSR_OK;
}

static void tsr__snap_release(void *state, int seq) {
    tsr__snap *s = state;
    if (seq < 0 || seq >= s->n_seqs || !s->seqs[seq].active) return;
    tsr__sseq *q = &s->seqs[seq];
    tsr_free(q->q);
    tsr_free(q->qpos);
    tsr_free(q->nq);
    memset(q, 0, sizeof *q);
}

static void tsr__snap_destroy(void *state) {
    tsr__snap *s = state;
    for (int i = 0; i < s->n_seqs; i++) tsr__snap_release(s, i);
    tsr_free(s->seqs);
    tsr_free(s->windows);
    tsr_free(s);
}

static tsr_status tsr__snap_admit(void *state, int seq) {
    tsr__snap *s = state;
    if (seq < 0) return tsr_error_set(TSR_ERR_INVALID, "snapkv: bad sequence %d", seq);
    if (seq >= s->n_seqs) {
        tsr__sseq *ns = tsr_realloc(s->seqs, (size_t)(seq + 1) * sizeof *ns);
        if (!ns) return TSR_ERR_NOMEM;
        memset(ns + s->n_seqs, 0, (size_t)(seq + 1 - s->n_seqs) * sizeof *ns);
        s->seqs = ns;
        s->n_seqs = seq + 1;
    }
    tsr__snap_release(s, seq);
    tsr__sseq *q = &s->seqs[seq];
    size_t rows = (size_t)s->L * (size_t)s->window;
    q->q = tsr_malloc((rows ? rows : 1) * (size_t)s->H * (size_t)s->hd * sizeof *q->q);
    q->qpos = tsr_malloc((rows ? rows : 1) * sizeof *q->qpos);
    q->nq = tsr_calloc((size_t)(s->L ? s->L : 1), sizeof *q->nq);
    if (!q->q || !q->qpos || !q->nq) {
        tsr_free(q->q);
        tsr_free(q->qpos);
        tsr_free(q->nq);
        memset(q, 0, sizeof *q);
        return TSR_ERR_NOMEM;
    }
    q->active = 1;
    return TSR_OK;
}

static tsr__sseq *tsr__snap_seq(tsr__snap *s, int seq) {
    return seq >= 0 && seq < s->n_seqs && s->seqs[seq].active ? &s->seqs[seq] : NULL;
}

/* Keeps the last `window` of the layer's queries: the held ones shifted, the call's
 * appended. */
static tsr_status tsr__snap_queries(void *state, int layer, int seq, const float *q,
                                    const int32_t *q_pos, int n_q, int n_heads) {
    tsr__snap *s = state;
    tsr__sseq *sq = tsr__snap_seq(s, seq);
    if (!sq) return tsr_error_set(TSR_ERR_INVALID, "snapkv: no sequence %d", seq);
    if (layer < 0 || layer >= s->L || n_heads != s->H)
        return tsr_error_set(TSR_ERR_INVALID, "snapkv: queries of layer %d with %d heads "
                             "(the cache has %d layers, %d query heads)", layer, n_heads,
                             s->L, s->H);
    if (n_q <= 0 || s->window <= 0) return TSR_OK;
    size_t qw = (size_t)s->H * s->hd, W = (size_t)s->window;
    float *ring = sq->q + (size_t)layer * W * qw;
    int32_t *rpos = sq->qpos + (size_t)layer * W;
    int32_t add = n_q < s->window ? n_q : s->window;
    int32_t keep = sq->nq[layer];
    if (keep > s->window - add) keep = s->window - add;
    int32_t drop = sq->nq[layer] - keep;
    if (keep > 0 && drop > 0) {
        memmove(ring, ring + (size_t)drop * qw, (size_t)keep * qw * sizeof *ring);
        memmove(rpos, rpos + drop, (size_t)keep * sizeof *rpos);
    }
    memcpy(ring + (size_t)keep * qw, q + (size_t)(n_q - add) * qw, (size_t)add * qw * sizeof *ring);
    memcpy(rpos + keep, q_pos + (n_q - add), (size_t)add * sizeof *rpos);
    sq->nq[layer] = keep + add;
    return TSR_OK;
}

/* out[j] ([n]) = the pooled in[j]: the maximum or the mean (zero-padded, as PyTorch's
 * avg_pool1d with padding kernel / 2) of in[j - kernel / 2 .. j + kernel / 2]. */
static void tsr__snap_pool(const float *in, int32_t n, int kernel, int maxpool, float *out) {
    int r = kernel / 2;
    for (int32_t j = 0; j < n; j++) {
        int32_t a = j - r < 0 ? 0 : j - r, b = j + r >= n ? n - 1 : j + r;
        float acc = maxpool ? in[a] : 0.0f;
        for (int32_t t = a; t <= b; t++) acc = maxpool ? (in[t] > acc ? in[t] : acc) : acc + in[t];
        out[j] = maxpool ? acc : acc / (float)kernel;
    }
}

/* sc ([H][nc]): per local query head, the attention the w window queries (q: [w][H][hd],
 * positions qpos) give the first nc of the n keys in `slot` order (positions kpos,
 * ascending), each query's softmax over all n keys it may see (causal). Keys come tile by
 * tile, transposed per KV head so that the dots run along the keys. */
static tsr_status tsr__snap_scores(tsr__snap *s, int layer, int seq, const float *q,
                                   const int32_t *qpos, int w, const int32_t *slot,
                                   const int32_t *kpos, int32_t n, int32_t nc, float *sc) {
    enum { T = TSR__SNAP_TILE };
    int H = s->H, hd = s->hd, group = s->H / s->G;
    size_t qw = (size_t)H * hd, hw = (size_t)H * (size_t)w;
    float scale = 1.0f / sqrtf((float)hd);
    float *kt = tsr_malloc((size_t)T * (size_t)s->kvd * sizeof *kt);
    float *kT = tsr_malloc((size_t)T * (size_t)s->kvd * sizeof *kT); /* [kvd][T] */
    float *mx = tsr_malloc(hw * sizeof *mx), *sum = tsr_malloc(hw * sizeof *sum);
    float *lg = tsr_malloc((size_t)T * sizeof *lg);
    tsr_status st = kt && kT && mx && sum && lg ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) {
        for (size_t i = 0; i < hw; i++) {
            mx[i] = -INFINITY;
            sum[i] = 0.0f;
        }
        memset(sc, 0, (size_t)H * (size_t)nc * sizeof *sc);
    }
    /* Pass 0: each (head, query)'s running maximum and sum over all n keys; pass 1: the
     * probabilities of the candidates (all older than every window query: no mask),
     * summed over the window's queries. */
    for (int pass = 0; pass < 2 && st == TSR_OK; pass++) {
        int32_t end = pass == 0 ? n : nc;
        for (int32_t t0 = 0; t0 < end && st == TSR_OK; t0 += T) {
            int32_t tn = end - t0 < T ? end - t0 : T;
            st = tsr_kv_paged_gather(s->mech, layer, seq, slot + t0, tn, kt, NULL);
            if (st != TSR_OK) break;
            for (int32_t j = 0; j < tn; j++)
                for (int c = 0; c < s->kvd; c++) kT[(size_t)c * T + j] = kt[(size_t)j * s->kvd + c];
            for (int h = 0; h < H; h++) {
                const float *kg = kT + (size_t)(h / group) * hd * T;
                for (int i = 0; i < w; i++) {
                    const float *qi = q + (size_t)i * qw + (size_t)h * hd;
                    for (int32_t j = 0; j < tn; j++) lg[j] = 0.0f;
                    for (int c = 0; c < hd; c++) {
                        float qc = qi[c] * scale;
                        const float *kc = kg + (size_t)c * T;
                        for (int32_t j = 0; j < tn; j++) lg[j] += qc * kc[j];
                    }
                    size_t hi = (size_t)h * w + (size_t)i;
                    if (pass == 1) {
                        if (!(sum[hi] > 0.0f)) continue; /* saw no key: no weight */
                        float inv = 1.0f / sum[hi], *out = sc + (size_t)h * nc + t0;
                        for (int32_t j = 0; j < tn; j++) out[j] += expf(lg[j] - mx[hi]) * inv;
                        continue;
                    }
                    /* keys after the query (the window's own, in the last tiles) */
                    int32_t vis = tn;
                    while (vis > 0 && kpos[t0 + vis - 1] > qpos[i]) vis--;
                    if (vis == 0) continue;
                    float m = lg[0];
                    for (int32_t j = 1; j < vis; j++) m = lg[j] > m ? lg[j] : m;
                    float nm = m > mx[hi] ? m : mx[hi], acc = 0.0f;
                    for (int32_t j = 0; j < vis; j++) acc += expf(lg[j] - nm);
                    sum[hi] = sum[hi] * expf(mx[hi] - nm) + acc;
                    mx[hi] = nm;
                }
            }
        }
    }
    tsr_free(kt);
    tsr_free(kT);
    tsr_free(mx);
    tsr_free(sum);
    tsr_free(lg);
    return st;
}

/* ev gets the slots to evict from c ([n]: the layer's slots in position order) for
 * `budget`: the window's keys stay, and of the nc older ones the `cap` best-scored. */
static tsr_status tsr__snap_choose(tsr__snap *s, tsr__sseq *sq, int layer, int seq,
                                   tsr__scand *c, int32_t n, int32_t budget, int32_t *ev,
                                   int32_t *ne) {
    int w = sq->nq[layer];
    const float *q = sq->q + (size_t)layer * s->window * (size_t)s->H * s->hd;
    const int32_t *qpos = sq->qpos + (size_t)layer * s->window;
    *ne = 0;
    /* Candidates: the keys older than the window (the first nc in position order). */
    int32_t nc = n;
    if (w > 0)
        while (nc > 0 && c[nc - 1].pos >= qpos[0]) nc--;
    int32_t cap = budget - (n - nc);
    s->st.compressions++;
    if (w == 0 || cap <= 0) {
        /* No queries, or the window alone fills the budget: the newest tokens stay. */
        if (w == 0) s->st.compressions_unscored++;
        for (int32_t i = 0; i < n - budget; i++) ev[(*ne)++] = c[i].slot;
        return TSR_OK;
    }
    size_t hn = (size_t)s->H * (size_t)nc;
    int32_t *slot = tsr_malloc((size_t)n * sizeof *slot);
    int32_t *pos = tsr_malloc((size_t)n * sizeof *pos);
    float *sc = tsr_malloc((hn ? hn : 1) * sizeof *sc);
    float *pooled = tsr_malloc((hn ? hn : 1) * sizeof *pooled);
    float *tot = tsr_malloc((size_t)(nc ? nc : 1) * sizeof *tot);
    tsr_status st = slot && pos && sc && pooled && tot ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) {
        for (int32_t i = 0; i < n; i++) {
            slot[i] = c[i].slot;
            pos[i] = c[i].pos;
        }
        st = tsr__snap_scores(s, layer, seq, q, qpos, w, slot, pos, n, nc, sc);
    }
    if (st == TSR_OK) {
        for (int h = 0; h < s->H; h++)
            tsr__snap_pool(sc + (size_t)h * nc, nc, s->kernel > 0 ? s->kernel : 1, s->maxpool,
                           pooled + (size_t)h * nc);
        /* One score per token over every head of the TP group: all ranks keep the same. */
        st = tsr_kv_policy_sum_heads(&s->cfg, pooled, s->H, (size_t)nc, tot);
    }
    if (st == TSR_OK) {
        for (int32_t i = 0; i < nc; i++) c[i].score = tot[i];
        qsort(c, (size_t)nc, sizeof *c, tsr__snap_by_score);
        for (int32_t i = cap; i < nc; i++) ev[(*ne)++] = c[i].slot;
    }
    tsr_free(slot);
    tsr_free(pos);
    tsr_free(sc);
    tsr_free(pooled);
    tsr_free(tot);
    return st;
}

/* Compresses `layer` of seq to its budget when it holds more and, after a decode step
 * (`decode`), only when it holds its bound: budget + chunk rows, so that the next step's row
 * would pass what the pool is sized for. */
static tsr_status tsr__snap_compress(tsr__snap *s, tsr__sseq *sq, int layer, int seq,
                                     int decode) {
    tsr_kv_cache *m = s->mech;
    if (s->windows && s->windows[layer] > 0) return TSR_OK; /* a sliding layer keeps its window */
    int32_t n = tsr_kv_paged_slots(m, layer, seq);
    int32_t len = m->ops->seq_len(m, seq);
    int32_t budget = tsr_kv_policy_budget(&s->cfg, len);
    if (n <= budget || (decode && n < tsr_kv_policy_bound(&s->cfg, len))) return TSR_OK;
    if (decode) s->st.decode_compressions++;
    tsr__scand *c = tsr_malloc((size_t)n * sizeof *c);
    int32_t *pos = tsr_malloc((size_t)n * sizeof *pos);
    int32_t *ev = tsr_malloc((size_t)n * sizeof *ev);
    int32_t ne = 0;
    tsr_status st = c && pos && ev ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) st = tsr_kv_paged_read_slots(m, layer, seq, pos, NULL);
    if (st == TSR_OK) {
        for (int32_t i = 0; i < n; i++) c[i] = (tsr__scand){0.0f, pos[i], i};
        qsort(c, (size_t)n, sizeof *c, tsr__snap_by_pos);
        st = tsr__snap_choose(s, sq, layer, seq, c, n, budget, ev, &ne);
    }
    if (st == TSR_OK) st = tsr_kv_paged_evict(m, layer, seq, ev, ne);
    if (st == TSR_OK) s->st.evictions += ne;
    tsr_free(c);
    tsr_free(pos);
    tsr_free(ev);
    return st;
}

/* A prefill chunk (more than one token) ends with each layer compressed; a decode step
 * appends, and compresses a layer that it brought to its bound. */
static tsr_status tsr__snap_commit(void *state, int seq, int32_t n) {
    tsr__snap *s = state;
    tsr__sseq *sq = tsr__snap_seq(s, seq);
    if (!sq) return tsr_error_set(TSR_ERR_INVALID, "snapkv: no sequence %d", seq);
    s->st.tokens_processed += n;
    for (int l = 0; l < s->L; l++) TSR_TRY(tsr__snap_compress(s, sq, l, seq, n <= 1));
    return TSR_OK;
}

static void tsr__snap_stats(const void *state, void *out) {
    *(tsr__snap_counters *)out = ((const tsr__snap *)state)->st;
}

static const char *const tsr__snap_pools[] = {"avg", "max", NULL};

static const tsr_kv_policy_option tsr__snap_options[] = {
    {"snapkv-window", TSR_KV_OPT_INT, offsetof(tsr__snap_opts, window), "N",
     "observation window: the last N queries seen (the prompt's, later decode steps') score "
     "the older keys", "32", 1, 4096, NULL},
    {"snapkv-kernel", TSR_KV_OPT_INT, offsetof(tsr__snap_opts, kernel), "N",
     "pooling kernel over neighbouring keys, odd; 1 pools nothing", "7", 1, 255, NULL},
    {"snapkv-pool", TSR_KV_OPT_ENUM, offsetof(tsr__snap_opts, maxpool), "KIND",
     "pooling of the window's scores", "avg", 0, 0, tsr__snap_pools},
};

static const tsr_kv_policy_stat_field tsr__snap_stat_fields[] = {
    {"evictions", TSR_KV_STAT_I64, offsetof(tsr__snap_counters, evictions)},
    {"tokens_processed", TSR_KV_STAT_I64, offsetof(tsr__snap_counters, tokens_processed)},
    {"snapkv_compressions", TSR_KV_STAT_I64, offsetof(tsr__snap_counters, compressions)},
    {"snapkv_unscored", TSR_KV_STAT_I64,
     offsetof(tsr__snap_counters, compressions_unscored)},
    {"snapkv_decode_compressions", TSR_KV_STAT_I64,
     offsetof(tsr__snap_counters, decode_compressions)},
};

/* Queries (its observation window's), not the kernel's scores summed over all queries;
 * the window's scores summed over the TP group. */
const tsr_kv_policy_decl tsr_kv_policy_snapkv = {
    .name = "snapkv",
    .help = "keys the last queries attend to + that window; decoding recompresses at "
            "budget + chunk",
    .reads_queries = 1,
    .uses_budget = 1,
    .checkpointable = 1,
    .tp_host_sums = 1,
    .options = tsr__snap_options,
    .n_options = TSR_KV_COUNT(tsr__snap_options),
    .options_size = sizeof(tsr__snap_opts),
    .stat_fields = tsr__snap_stat_fields,
    .n_stats = TSR_KV_COUNT(tsr__snap_stat_fields),
    .stats_size = sizeof(tsr__snap_counters),
    .create = tsr__snap_create,
    .destroy = tsr__snap_destroy,
    .admit = tsr__snap_admit,
    .queries = tsr__snap_queries,
    .commit = tsr__snap_commit,
    .release = tsr__snap_release,
    .stats = tsr__snap_stats,
};
