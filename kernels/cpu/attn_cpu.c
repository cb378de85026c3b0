/* Causal GQA attention over KV spans with an online softmax (FlashAttention's running max,
 * sum and output accumulator): keys are visited in tiles of TSR__ATTN_TILE, so memory is
 * O(tile) per task and no n_q x n_k matrix exists. One task is a query row and a block of
 * consecutive query heads (all of them when serial); key tiles are the outer loop, so the
 * K/V rows of a tile are swept once for every head of the task, GQA groups included. The
 * optional per-key score pass recomputes q.k per key tile with each query's final max and
 * sum; each (kv head, key tile) belongs to one task and sums queries and heads in a fixed
 * order, so it is race-free and independent of the thread count. GPT-OSS's extras run in
 * the same tiles: a sliding window by key position (whatever the spans hold, so a policy
 * that keeps old tokens cannot change a sliding layer) and a sink logit per query head in
 * the softmax's denominator, counted once per query: the running max and sum start at the
 * sink (m = sink, l = 1), or a decode row's partitions are merged with it. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"
#include "base/alloc.h"

#define TSR__ATTN_TILE 64
/* Rows per chunk within a tile: 16 concurrent row streams are what the Zen 4 hardware
 * prefetchers follow (32 or a whole tile measured as slow as head by head), and one
 * AVX-512 dot_rows group. */
#define TSR__ATTN_SUB 16
/* K + V bytes of a prefill call from which it reads in row order (about a Zen 4 L2). */
#define TSR__ATTN_ROWS_MIN ((size_t)1 << 20)
/* A decode row's keys per partition, at least, and the most partitions (tsr__attn_decode):
 * each partition's merge costs about one key's arithmetic, so under 1/64 of the work; up
 * to 128 partitions keep that many threads busy (the shares: 128 x heads x head_dim floats). */
#define TSR__ATTN_PART_KEYS 64
#define TSR__ATTN_PARTS 128
/* partitions start on tile boundaries, so a row's tiles are the same however it is cut */
_Static_assert(TSR__ATTN_PART_KEYS % TSR__ATTN_TILE == 0, "partitions of whole tiles");
/* Accumulator floats per task (on the stack) and most heads one task carries. */
#define TSR__ATTN_ACC 4096
#define TSR__ATTN_MAXH 64

/* A run of n keys from key j0 of span s0 on (a decode row's partition). */
typedef struct tsr__attn_range {
    int s0;
    int64_t j0, n;
} tsr__attn_range;

typedef struct tsr__attn_geom {
    const tsr_attn_args *a;
    const tsr__cpu_kernels *k;
    int group;      /* query heads per kv head */
    int64_t q_ld;   /* floats per query row */
    float scale;
    bool rows; /* one key row for all heads of a task (dot_heads/acc_heads), else chunks */
    bool qblock; /* the main pass ran in query lanes (attn_qblock): the score pass does too */
    /* rows, with the spans' stored rows read as they are (dot_heads_kv, acc_heads_kv): all
     * spans of dtype kvdt, row_bytes apart */
    bool stored;
    int kvdt;
    int64_t row_bytes;
} tsr__attn_geom;

static inline int32_t tsr__span_pos(const tsr_kv_span *s, int64_t j) {
    return s->pos ? s->pos[j] : s->pos0 + (int32_t)j;
}

/* Keys of span s worth visiting for query position qp: contiguous spans stop at qp. */
static inline int64_t tsr__span_limit(const tsr_kv_span *s, int32_t qp) {
    if (s->pos) return s->n;
    int64_t lim = (int64_t)qp - s->pos0 + 1;
    return lim < 0 ? 0 : lim > s->n ? s->n : lim;
}

/* The first key of span s inside the window of a query at qp: contiguous spans start at
 * position qp - window + 1 (0 without a window, and for position arrays, masked key by
 * key instead). */
static inline int64_t tsr__span_start(const tsr_kv_span *s, int32_t qp, int window) {
    if (s->pos || window <= 0) return 0;
    int64_t lo = (int64_t)qp - window + 1 - s->pos0;
    return lo < 0 ? 0 : lo > s->n ? s->n : lo;
}

/* Whether a query at qp sees a key at kp: causal, and within the window when there is one
 * (window > 0: positions > qp - window). */
static inline bool tsr__attn_visible(int32_t kp, int32_t qp, int window) {
    return kp <= qp && (window <= 0 || (int64_t)kp > (int64_t)qp - window);
}

/* The lowest and highest positions of keys [j0, j0 + nt) of span s. */
static inline void tsr__tile_pos_range(const tsr_kv_span *s, int64_t j0, int nt, int32_t *lo,
                                       int32_t *hi) {
    *lo = INT32_MAX;
    *hi = INT32_MIN;
    for (int j = 0; j < nt; j++) {
        int32_t p = tsr__span_pos(s, j0 + j);
        *lo = p < *lo ? p : *lo;
        *hi = p > *hi ? p : *hi;
    }
}

/* False when a query at qp can see no key with a position in [lo, hi] (all after it, or
 * all before its window); true may still mean none (a position array's gaps). */
static inline bool tsr__attn_may_see(int32_t lo, int32_t hi, int32_t qp, int window) {
    return lo <= qp && (window <= 0 || (int64_t)hi > (int64_t)qp - window);
}

/* The sink logit of query head h as the online softmax starts from it: *m = sink, *l = 1;
 * none (or a -inf sink, which adds exp(-inf) = 0) starts empty, so a -inf sink gives the
 * bits of no sink. */
static inline void tsr__attn_sink_start(const tsr_attn_args *a, int h, float *m, float *l) {
    float s = a->sinks ? a->sinks[h] : -INFINITY;
    *m = s > -INFINITY ? s : -INFINITY;
    *l = s > -INFINITY ? 1.0f : 0.0f;
}

/* Whether a has a sink logit above -inf: a -inf sink adds nothing, so all -inf sinks are no
 * sinks, and take the paths (the prefill lanes) that have none, with the same bits. */
static bool tsr__attn_has_sinks(const tsr_attn_args *a) {
    for (int h = 0; a->sinks && h < a->n_heads; h++)
        if (a->sinks[h] > -INFINITY) return true;
    return false;
}

/* A tile's keys within one span: n visible keys from key j0 of sp, at offset off of the
 * tile's scores. */
typedef struct tsr__attn_piece {
    const tsr_kv_span *sp;
    int64_t j0;
    int n, off;
} tsr__attn_piece;

/* Attention of query row i for heads [h0, h0+nh) over the keys of r (all keys when NULL).
 * Key tiles are the outer loop: windows of TSR__ATTN_TILE keys of the spans taken as one
 * sequence, counted from r's first key (partitions start at multiples of the tile), so a
 * tile may take its keys from several spans and the arithmetic depends on the keys' order
 * alone, not on where the spans cut it: a paged cache's blocks give a dense cache's bits.
 * Within a tile come the scores of all heads, the online softmax per head, then the
 * values. With G->rows the scores and values go one key row at a time for all heads of
 * the task (the row read front to back: the order DRAM streams best,
 * docs/kernels-cpu.md); otherwise in chunks of TSR__ATTN_SUB rows with every head inside
 * a chunk (less arithmetic, best when the rows are in L2). Per key and per element the
 * arithmetic is that of one head at a time over the whole tile either way (q.k is per
 * key; the V sums run over the keys in order, scaled by c first, and a sum continued
 * after acc * 1 is the same sum), so the bits depend neither on the order nor on which
 * heads share a task. Keys outside a's window are left out of the tiles (contiguous
 * spans) or masked (position arrays). part NULL: the softmax starts at the sinks, the
 * output normalized into a->out, and ml receives each head's final running max and sum
 * (for the score pass); else, without the sinks (tsr__attn_merge adds them), the
 * accumulators unnormalized into part and max and sum into ml (a partition's share). */
static void tsr__attn_task(const tsr__attn_geom *G, int64_t i, int h0, int nh,
                           const tsr__attn_range *r, float *part, float *ml) {
    const tsr_attn_args *a = G->a;
    const int hd = a->head_dim;
    const int32_t qp = a->q_pos[i];
    const float *qi = a->q + (size_t)i * G->q_ld;
    int32_t koff[TSR__ATTN_MAXH];
    for (int hh = 0; hh < nh; hh++) koff[hh] = (int32_t)((h0 + hh) / G->group * hd);
    float acc_own[TSR__ATTN_ACC];
    float *acc = part ? part + (size_t)h0 * hd : acc_own; /* a partition sums in its share */
    float m[TSR__ATTN_MAXH], l[TSR__ATTN_MAXH], corr[TSR__ATTN_MAXH];
    float sc[TSR__ATTN_MAXH][TSR__ATTN_TILE];
    tsr__attn_piece pc[TSR__ATTN_TILE];
    for (int hh = 0; hh < nh; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
        if (!part) tsr__attn_sink_start(a, h0 + hh, &m[hh], &l[hh]);
    }
    for (int t = 0; t < nh * hd; t++) acc[t] = 0.0f;
    int s = r ? r->s0 : 0;
    int64_t js = r ? r->j0 : 0, left = r ? r->n : INT64_MAX;
    while (left > 0 && s < a->n_spans) {
        /* the tile: the next TSR__ATTN_TILE keys, their visible runs as pieces */
        int npc = 0, nt = 0;
        for (int64_t w = 0; w < TSR__ATTN_TILE && left > 0 && s < a->n_spans;) {
            const tsr_kv_span *sp = &a->spans[s];
            int64_t take = sp->n - js;
            take = take < TSR__ATTN_TILE - w ? take : TSR__ATTN_TILE - w;
            take = take < left ? take : left;
            int64_t lim = tsr__span_limit(sp, qp), lo = tsr__span_start(sp, qp, a->window);
            int64_t b = js > lo ? js : lo, e = js + take < lim ? js + take : lim;
            if (e > b) {
                pc[npc++] = (tsr__attn_piece){sp, b, (int)(e - b), nt};
                nt += (int)(e - b);
            }
            w += take;
            left -= take;
            js += take;
            if (js >= sp->n) {
                s++;
                js = 0;
            }
        }
        if (nt == 0) continue;
        for (int p = 0; p < npc; p++) {
            const tsr__attn_piece *e = &pc[p];
            const size_t ts = (size_t)e->sp->stride;
            const float *kt = e->sp->k + (size_t)e->j0 * ts;
            if (G->stored) { /* the same rows, stored */
                const size_t rb = (size_t)G->row_bytes;
                const uint8_t *kb = (const uint8_t *)e->sp->k + (size_t)e->j0 * rb;
                for (int j = 0; j < e->n; j++)
                    G->k->dot_heads_kv(qi + (size_t)h0 * hd, kb + (size_t)j * rb, G->kvdt, koff,
                                       nh, hd, G->scale, &sc[0][e->off + j], TSR__ATTN_TILE);
            } else if (G->rows) {
                for (int j = 0; j < e->n; j++)
                    G->k->dot_heads(qi + (size_t)h0 * hd, kt + j * ts, koff, nh, hd, G->scale,
                                    &sc[0][e->off + j], TSR__ATTN_TILE);
            } else {
                for (int c = 0; c < e->n; c += TSR__ATTN_SUB) {
                    int n = e->n - c < TSR__ATTN_SUB ? e->n - c : TSR__ATTN_SUB;
                    for (int hh = 0; hh < nh; hh++)
                        G->k->dot_rows(qi + (size_t)(h0 + hh) * hd, kt + c * ts + koff[hh],
                                       e->sp->stride, n, hd, G->scale, sc[hh] + e->off + c);
                }
            }
            if (e->sp->pos) {
                for (int j = 0; j < e->n; j++)
                    if (!tsr__attn_visible(e->sp->pos[e->j0 + j], qp, a->window))
                        for (int hh = 0; hh < nh; hh++) sc[hh][e->off + j] = -INFINITY;
            }
        }
        for (int hh = 0; hh < nh; hh++) {
            float *x = sc[hh];
            float mt = -INFINITY;
            for (int j = 0; j < nt; j++) mt = x[j] > mt ? x[j] : mt;
            if (mt == -INFINITY) { /* nothing visible in this tile */
                corr[hh] = NAN;
                continue;
            }
            float mn = m[hh] > mt ? m[hh] : mt;
            corr[hh] = expf(m[hh] - mn); /* 0 on the first visible tile */
            float sum = G->k->exp_sum(x, nt, mn);
            l[hh] = l[hh] * corr[hh] + sum;
            m[hh] = mn;
        }
        if (G->rows) {
            /* acc * c first (acc_rows over no keys: its own rounding), then the keys,
             * over each run of heads that saw a key in this tile (usually all of them;
             * the others are left untouched, as the chunked order leaves them). */
            for (int h = 0; h < nh;) {
                if (isnan(corr[h])) {
                    h++;
                    continue;
                }
                int e = h;
                for (; e < nh && !isnan(corr[e]); e++)
                    if (corr[e] != 1.0f) /* acc * 1 is acc */
                        G->k->acc_rows(acc + (size_t)e * hd, corr[e], NULL, NULL, 0, 0, hd);
                for (int p = 0; p < npc; p++) {
                    const tsr__attn_piece *q = &pc[p];
                    const size_t ts = (size_t)q->sp->stride;
                    if (G->stored)
                        G->k->acc_heads_kv(acc + (size_t)h * hd, &sc[h][q->off], TSR__ATTN_TILE,
                                           (const uint8_t *)q->sp->v +
                                               (size_t)q->j0 * (size_t)G->row_bytes,
                                           G->row_bytes, G->kvdt, koff + h, q->n, e - h, hd);
                    else
                        G->k->acc_heads(acc + (size_t)h * hd, &sc[h][q->off], TSR__ATTN_TILE,
                                        q->sp->v + (size_t)q->j0 * ts, q->sp->stride,
                                        koff + h, q->n, e - h, hd);
                }
                h = e;
            }
        } else {
            for (int p = 0; p < npc; p++) {
                const tsr__attn_piece *q = &pc[p];
                const float *vt = q->sp->v + (size_t)q->j0 * (size_t)q->sp->stride;
                for (int c = 0; c < q->n; c += TSR__ATTN_SUB) {
                    int n = q->n - c < TSR__ATTN_SUB ? q->n - c : TSR__ATTN_SUB;
                    for (int hh = 0; hh < nh; hh++) {
                        if (isnan(corr[hh])) continue;
                        G->k->acc_rows(acc + (size_t)hh * hd,
                                       q->off + c ? 1.0f : corr[hh], sc[hh] + q->off + c,
                                       vt + (size_t)c * (size_t)q->sp->stride + koff[hh],
                                       q->sp->stride, n, hd);
                    }
                }
            }
        }
    }
    if (part) { /* a partition's share, merged by tsr__attn_merge */
        for (int hh = 0; hh < nh; hh++) {
            ml[2 * (h0 + hh)] = m[hh];
            ml[2 * (h0 + hh) + 1] = l[hh];
        }
        return;
    }
    for (int hh = 0; hh < nh; hh++) {
        float *o = a->out + (size_t)i * G->q_ld + (size_t)(h0 + hh) * hd;
        float inv = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
        for (int t = 0; t < hd; t++) o[t] = acc[(size_t)hh * hd + t] * inv;
        size_t idx = (size_t)i * a->n_heads + (size_t)(h0 + hh);
        ml[2 * idx] = m[hh];
        ml[2 * idx + 1] = l[hh];
    }
}

/* tsr__attn_scores_tile over stored rows (G->stored: one decode row): the q.k of the
 * group's heads one key row at a time with dot_heads_kv, the main pass's kernel, so s - m
 * is exactly the main pass's; then each head's exp against its final max. */
static void tsr__attn_scores_tile_stored(const tsr__attn_geom *G, const float *ml, int g,
                                         const tsr_kv_span *sp, int64_t j0, int nt,
                                         float *ks0, int64_t total) {
    const tsr_attn_args *a = G->a;
    const int hd = a->head_dim;
    const int32_t qp = a->q_pos[0];
    const size_t rb = (size_t)G->row_bytes;
    const uint8_t *kb = (const uint8_t *)sp->k + (size_t)j0 * rb;
    float sc[TSR__ATTN_MAXH][TSR__ATTN_TILE];
    int32_t koff[TSR__ATTN_MAXH];
    for (int hh = 0; hh < TSR__ATTN_MAXH; hh++) koff[hh] = (int32_t)(g * hd);
    int32_t lo, hi;
    tsr__tile_pos_range(sp, j0, nt, &lo, &hi);
    if (!tsr__attn_may_see(lo, hi, qp, a->window)) return;
    for (int h0 = g * G->group; h0 < (g + 1) * G->group; h0 += TSR__ATTN_MAXH) {
        int nh = (g + 1) * G->group - h0;
        nh = nh < TSR__ATTN_MAXH ? nh : TSR__ATTN_MAXH;
        for (int j = 0; j < nt; j++)
            G->k->dot_heads_kv(a->q + (size_t)h0 * hd, kb + (size_t)j * rb, G->kvdt, koff, nh,
                               hd, G->scale, &sc[0][j], TSR__ATTN_TILE);
        for (int hh = 0; hh < nh; hh++) {
            float m = ml[2 * (h0 + hh)], l = ml[2 * (h0 + hh) + 1];
            if (!(l > 0.0f)) continue;
            float inv = 1.0f / l, *ks = ks0 + (size_t)(h0 + hh) * (size_t)total;
            (void)G->k->exp_sum(sc[hh], nt, m);
            for (int j = 0; j < nt; j++)
                if (tsr__attn_visible(tsr__span_pos(sp, j0 + j), qp, a->window))
                    ks[j] += sc[hh][j] * inv;
        }
    }
}

/* Adds to key_scores[h][off + j0 .. +nt), for the query heads h of kv head g, the
 * probabilities of keys j0.. of span sp (ks: key_scores + off + j0, rows `total` apart). */
static void tsr__attn_scores_tile(const tsr__attn_geom *G, const float *ml, int g,
                                  const tsr_kv_span *sp, int64_t j0, int nt, float *ks0,
                                  int64_t total) {
    const tsr_attn_args *a = G->a;
    const int hd = a->head_dim;
    if (G->stored) {
        tsr__attn_scores_tile_stored(G, ml, g, sp, j0, nt, ks0, total);
        return;
    }
    if (G->qblock) {
        for (int hh = 0; hh < G->group; hh++) {
            int h = g * G->group + hh;
            G->k->attn_scores_qblock(a->q + (size_t)h * hd, G->q_ld, a->q_pos, (int)a->n_q, hd,
                                     G->scale, sp, j0, nt, g * hd, ml + 2 * (size_t)h,
                                     2 * (int64_t)a->n_heads, ks0 + (size_t)h * (size_t)total);
        }
        return;
    }
    float sc[TSR__ATTN_TILE];
    const float *kt = sp->k + (size_t)j0 * (size_t)sp->stride + (size_t)g * hd;
    int32_t lo, hi;
    tsr__tile_pos_range(sp, j0, nt, &lo, &hi);
    for (int64_t i = 0; i < a->n_q; i++) {
        int32_t qp = a->q_pos[i];
        if (!tsr__attn_may_see(lo, hi, qp, a->window)) continue; /* it would add nothing */
        for (int hh = 0; hh < G->group; hh++) {
            int h = g * G->group + hh;
            float m = ml[2 * ((size_t)i * a->n_heads + h)];
            float l = ml[2 * ((size_t)i * a->n_heads + h) + 1];
            if (!(l > 0.0f)) continue;
            float inv = 1.0f / l;
            const float *q = a->q + (size_t)i * G->q_ld + (size_t)h * hd;
            float *ks = ks0 + (size_t)h * (size_t)total;
            G->k->dot_rows(q, kt, sp->stride, nt, hd, G->scale, sc);
            (void)G->k->exp_sum(sc, nt, m); /* the main pass's exp, so the terms agree */
            for (int j = 0; j < nt; j++)
                if (tsr__attn_visible(tsr__span_pos(sp, j0 + j), qp, a->window))
                    ks[j] += sc[j] * inv;
        }
    }
}

/* Task t of the main pass: query row and block of `blk` consecutive query heads. */
static void tsr__attn_run(const tsr__attn_geom *G, int64_t t, int blk, int nblk, float *ml) {
    int64_t i = t / nblk;
    int h0 = (int)(t % nblk) * blk;
    int nh = G->a->n_heads - h0 < blk ? G->a->n_heads - h0 : blk;
    tsr__attn_task(G, i, h0, nh, NULL, NULL, ml);
}

_Static_assert(TSR__ATTN_TILE <= TSR__CPU_QBLOCK_MAX_TILE, "attn_qblock holds one tile");

/* Task t of the query-block path: query rows 16 * (t / n_heads) .. +16, head t % n_heads. */
static void tsr__attn_qblock_run(const tsr__attn_geom *G, int64_t t, float *ml) {
    const tsr_attn_args *a = G->a;
    int h = (int)(t % a->n_heads), hd = a->head_dim;
    int64_t i0 = t / a->n_heads * 16;
    int nq = a->n_q - i0 < 16 ? (int)(a->n_q - i0) : 16;
    size_t off = (size_t)i0 * (size_t)G->q_ld + (size_t)h * (size_t)hd;
    G->k->attn_qblock(a->q + off, G->q_ld, a->q_pos + i0, nq, hd, G->scale, a->spans,
                      a->n_spans, h / G->group * hd, TSR__ATTN_TILE, a->out + off,
                      ml + 2 * ((size_t)i0 * (size_t)a->n_heads + (size_t)h),
                      2 * (int64_t)a->n_heads);
}

/* Task t of the score pass: one (kv head, key tile). */
static void tsr__attn_score_run(const tsr__attn_geom *G, int64_t t, int64_t ntiles,
                                int64_t total, const float *ml) {
    const tsr_attn_args *a = G->a;
    int g = (int)(t / ntiles);
    int64_t tile = t % ntiles;
    /* Find the span and key offset of this tile. */
    int64_t off = 0;
    int s = 0;
    for (;; s++) {
        int64_t nts = (a->spans[s].n + TSR__ATTN_TILE - 1) / TSR__ATTN_TILE;
        if (tile < nts) break;
        tile -= nts;
        off += a->spans[s].n;
    }
    const tsr_kv_span *sp = &a->spans[s];
    int64_t j0 = tile * TSR__ATTN_TILE;
    int nt = sp->n - j0 < TSR__ATTN_TILE ? (int)(sp->n - j0) : TSR__ATTN_TILE;
    tsr__attn_scores_tile(G, ml, g, sp, j0, nt, a->key_scores + (size_t)(off + j0), total);
}

/* The key-score pass after the main pass (nothing without key_scores): one task per (kv
 * head, key tile), on `threads` threads. */
static void tsr__attn_score_pass(const tsr__attn_geom *G, int threads, int64_t keys,
                                 const float *ml) {
    const tsr_attn_args *a = G->a;
    if (!a->key_scores) return;
    int64_t ntiles = 0;
    for (int s = 0; s < a->n_spans; s++)
        ntiles += (a->spans[s].n + TSR__ATTN_TILE - 1) / TSR__ATTN_TILE;
    int64_t nst = ntiles * a->n_kv_heads;
    if (threads > 1 && nst > 1) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int64_t t = 0; t < nst; t++) tsr__attn_score_run(G, t, ntiles, keys, ml);
    } else {
        for (int64_t t = 0; t < nst; t++) tsr__attn_score_run(G, t, ntiles, keys, ml);
    }
}

/* Keys per partition of a decode row: TSR__ATTN_PART_KEYS, doubled while there would be
 * more than TSR__ATTN_PARTS partitions. It depends on the key count alone, so the bits do
 * not depend on the thread count. */
static int64_t tsr__attn_part_keys(int64_t keys) {
    int64_t pk = TSR__ATTN_PART_KEYS;
    while (pk * TSR__ATTN_PARTS < keys) pk *= 2;
    return pk;
}

/* Head h of a decode row from its partitions' shares (acc unnormalized, m, l), in
 * partition order: M the largest m (and the sink), then sum_p acc_p e^(m_p - M) /
 * (sum_p l_p e^(m_p - M) + e^(sink - M)) (acc_rows over the shares as rows). A partition
 * in which the head saw no key (m_p = -inf, acc_p zero) adds nothing. */
static void tsr__attn_merge(const tsr__attn_geom *G, const float *pacc, const float *pml,
                            int np, int h, float *ml) {
    const tsr_attn_args *a = G->a;
    const int hd = a->head_dim;
    const int64_t hw = (int64_t)a->n_heads * hd;
    float *o = a->out + (size_t)h * hd, w[TSR__ATTN_PARTS];
    float sink, l1, mx, l = 0.0f;
    tsr__attn_sink_start(a, h, &sink, &l1);
    mx = sink;
    for (int p = 0; p < np; p++) {
        float m = pml[2 * ((size_t)p * a->n_heads + h)];
        mx = m > mx ? m : mx;
    }
    for (int p = 0; p < np; p++) {
        const float *pm = pml + 2 * ((size_t)p * a->n_heads + h);
        w[p] = pm[0] == -INFINITY ? 0.0f : expf(pm[0] - mx);
        l += pm[1] * w[p];
    }
    if (l1 > 0.0f) l += expf(sink - mx);
    memset(o, 0, (size_t)hd * sizeof *o);
    if (l > 0.0f) {
        G->k->acc_rows(o, 1.0f, w, pacc + (size_t)h * hd, hw, np, hd);
        G->k->acc_rows(o, 1.0f / l, NULL, NULL, 0, 0, hd);
    }
    ml[2 * h] = mx;
    ml[2 * h + 1] = l;
}

/* Task t of a partitioned decode row: partition t / nblk, head block t % nblk. */
static void tsr__attn_part_run(const tsr__attn_geom *G, int64_t t, int blk, int nblk,
                               const tsr__attn_range *r, float *pacc, float *pml) {
    const tsr_attn_args *a = G->a;
    int64_t p = t / nblk;
    int h0 = (int)(t % nblk) * blk;
    int nh = a->n_heads - h0 < blk ? a->n_heads - h0 : blk;
    tsr__attn_task(G, 0, h0, nh, r + p, pacc + (size_t)p * a->n_heads * a->head_dim,
                   pml + 2 * (size_t)p * a->n_heads);
}

/* One decode row (n_q 1). Its keys are cut into partitions (tsr__attn_part_keys); each
 * (partition, head block) is a task over a contiguous run of K/V rows, and the heads are
 * merged in partition order afterwards (FlashDecoding's split over keys). Splitting the
 * heads instead gave each thread a strip of every row, which ran slower than one thread
 * for rows under 8 KiB (2 vCPUs, 12 kv heads of 64 in halves of 1.5 KB: 1.8-2.8 against
 * 0.9-1.3 ms per token at 256 keys), so most models' decode attention ran on one thread
 * however many a rank had. Called for rows of more than one partition (keys >
 * TSR__ATTN_PART_KEYS); a row of one runs as a prefill row does. */
static tsr_status tsr__attn_decode(const tsr__attn_geom *G, tsr__attn_scratch *sc, int threads,
                                   int64_t keys, int blk, float *ml) {
    const tsr_attn_args *a = G->a;
    int nblk = (a->n_heads + blk - 1) / blk;
    int64_t pk = tsr__attn_part_keys(keys), np = (keys + pk - 1) / pk;
    size_t hw = (size_t)a->n_heads * (size_t)a->head_dim;
    TSR_TRY(tsr__cpu_scratch(&sc->part, &sc->part_cap,
                             (size_t)np * (hw + 2 * (size_t)a->n_heads)));
    float *pacc = sc->part, *pml = sc->part + (size_t)np * hw;
    /* where each partition starts: one walk over the spans */
    tsr__attn_range r[TSR__ATTN_PARTS];
    int s = 0;
    int64_t j0 = 0;
    for (int p = 0; p < (int)np; p++) {
        int64_t need = p ? pk : 0;
        while (s < a->n_spans && j0 + need >= a->spans[s].n) {
            need -= a->spans[s].n - j0;
            j0 = 0;
            s++;
        }
        j0 += need;
        r[p] = (tsr__attn_range){s, j0, pk};
    }
    int64_t ntask = np * nblk;
    if (threads > 1) {
        /* one region: the merge waits at the first loop's barrier, not a second fork */
#pragma omp parallel num_threads(threads)
        {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < ntask; t++) tsr__attn_part_run(G, t, blk, nblk, r, pacc, pml);
#pragma omp for schedule(static)
            for (int h = 0; h < a->n_heads; h++) tsr__attn_merge(G, pacc, pml, (int)np, h, ml);
        }
    } else {
        for (int64_t t = 0; t < ntask; t++) tsr__attn_part_run(G, t, blk, nblk, r, pacc, pml);
        for (int h = 0; h < a->n_heads; h++) tsr__attn_merge(G, pacc, pml, (int)np, h, ml);
    }
    return TSR_OK;
}

/* Attention over K/V stored in another dtype than f32 (BF16, Q8, FP8: kernels/kv_dtype.h):
 * the call's rows are converted to f32 scratch, span by span, and the f32 kernels below run
 * over spans pointing there, so every SIMD table and the key-score pass serve every dtype
 * and accumulate in f32 with the same arithmetic. The conversion reads each stored row once
 * per call (the kernels read a row once per call in decode too); its scratch is 8 bytes per
 * key and KV element, reused across calls. *out: a's copy with the f32 spans (a itself when
 * every span is f32). */
static tsr_status tsr__attn_dequant(tsr__attn_scratch *c, const tsr_attn_args *a,
                                    tsr_attn_args *out) {
    *out = *a;
    int any = 0;
    int64_t keys = 0;
    for (int s = 0; s < a->n_spans; s++) {
        any |= a->spans[s].dtype != TSR_KV_F32;
        keys += a->spans[s].n;
    }
    if (!any) return TSR_OK;
    const int64_t kvd = (int64_t)a->n_kv_heads * a->head_dim;
    for (int s = 0; s < a->n_spans; s++) {
        const tsr_kv_span *sp = &a->spans[s];
        if (sp->dtype != TSR_KV_F32 &&
            (sp->stride != kvd || tsr_kv_row_bytes(sp->dtype, kvd) == 0))
            return tsr_error_set(TSR_ERR_INVALID, "cpu attention: a %s KV span of rows %lld "
                                 "apart for %lld-element rows", tsr_kv_dtype_name(sp->dtype),
                                 (long long)sp->stride, (long long)kvd);
    }
    TSR_TRY(tsr__cpu_scratch(&c->kvdq, &c->kvdq_cap, 2 * (size_t)keys * (size_t)kvd));
    if (c->dqspan_cap < a->n_spans) {
        tsr_kv_span *ns = tsr_realloc(c->dqspan, (size_t)a->n_spans * sizeof *ns);
        if (!ns) return tsr_error_set(TSR_ERR_NOMEM, "cpu attention: %d spans", a->n_spans);
        c->dqspan = ns;
        c->dqspan_cap = a->n_spans;
    }
    float *kd = c->kvdq, *vd = c->kvdq + (size_t)keys * (size_t)kvd;
    for (int s = 0; s < a->n_spans; s++) {
        const tsr_kv_span *sp = &a->spans[s];
        tsr_kv_span *d = &c->dqspan[s];
        *d = *sp;
        if (sp->dtype == TSR_KV_F32) continue;
        tsr_kv_rows_decode(sp->dtype, sp->k, kd, kvd, sp->n, kvd);
        tsr_kv_rows_decode(sp->dtype, sp->v, vd, kvd, sp->n, kvd);
        d->k = kd;
        d->v = vd;
        d->dtype = TSR_KV_F32;
        kd += (size_t)sp->n * (size_t)kvd;
        vd += (size_t)sp->n * (size_t)kvd;
    }
    out->spans = c->dqspan;
    return TSR_OK;
}

void tsr__attn_scratch_free(tsr__attn_scratch *s) {
    tsr_free(s->lse);
    tsr_free(s->kvdq);
    tsr_free(s->dqspan);
    tsr_free(s->spans);
    tsr_free(s->part);
    *s = (tsr__attn_scratch){0};
}

tsr_status tsr__cpu_attention(tsr_backend *be, const tsr_attn_args *a) {
    tsr__cpu_ctx *c = be->ctx;
    return tsr__cpu_attention_on(a, c->threads, &c->attn);
}

tsr_status tsr__cpu_attention_on(const tsr_attn_args *a_in, int threads,
                                 tsr__attn_scratch *sc) {
    const tsr_attn_args *a = a_in;
    if (a->head_dim <= 0 || a->head_dim > TSR__CPU_MAX_HEAD_DIM)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu attention: head_dim %d (max %d)",
                             a->head_dim, TSR__CPU_MAX_HEAD_DIM);
    if (a->n_kv_heads <= 0 || a->n_heads <= 0 || a->n_heads % a->n_kv_heads != 0)
        return tsr_error_set(TSR_ERR_INVALID, "cpu attention: %d heads over %d kv heads",
                             a->n_heads, a->n_kv_heads);
    if (a->n_q <= 0) return TSR_OK;
    /* A decode row (its key scores too) over stored rows the kernels read as they are
     * (kv_rows) takes them so, with no scratch; everything else goes through f32 copies. */
    const tsr__cpu_kernels *kt = tsr__cpu_kernels_get();
    const int64_t kvd = (int64_t)a->n_kv_heads * a->head_dim;
    const int kvdt = a->n_spans > 0 ? a->spans[0].dtype : TSR_KV_F32;
    bool stored = kvdt != TSR_KV_F32 && kvdt >= 0 && kvdt < 32 && (kt->kv_rows >> kvdt & 1u) &&
                  tsr_kv_row_bytes(kvdt, kvd) > 0 && a->n_q == 1;
    for (int s = 0; stored && s < a->n_spans; s++)
        stored = a->spans[s].dtype == kvdt && a->spans[s].stride == kvd;
    tsr_attn_args af32;
    if (!stored) {
        TSR_TRY(tsr__attn_dequant(sc, a_in, &af32));
        a = &af32;
    }
    tsr__attn_geom G = {
        .a = a,
        .k = kt,
        .stored = stored,
        .kvdt = kvdt,
        .row_bytes = stored ? (int64_t)tsr_kv_row_bytes(kvdt, kvd) : 0,
        .group = a->n_heads / a->n_kv_heads,
        .q_ld = (int64_t)a->n_heads * a->head_dim,
        .scale = 1.0f / sqrtf((float)a->head_dim),
    };
    /* Running max and sum per (query, head), kept for the score pass. */
    size_t nml = 2 * (size_t)a->n_q * (size_t)a->n_heads;
    TSR_TRY(tsr__cpu_scratch(&sc->lse, &sc->lse_cap, nml));
    float *ml = sc->lse;
    int64_t keys = 0;
    for (int s = 0; s < a->n_spans; s++) keys += a->spans[s].n;
    int64_t work = keys * a->n_q * a->n_heads * a->head_dim;
    int par = threads > 1 && (a->n_q > 1 || a->n_heads > 1) && work >= 32768;
    /* Prefill: 16 queries per task in the lanes of a vector (attn_qblock). The row tasks
     * spend a 16-leaf reduction on every 16 scores (45 vector operations against 16 fmas
     * when head_dim is 8: stories260K's attention was 57 % of its prefill), and for wider
     * heads they load q and the accumulators for every key; the query lanes keep 16
     * scores or 16 output dimensions in registers and broadcast the key and value
     * entries. 128 queries, 1 thread, warm: head_dim 8 356 -> 68 us per layer (260K),
     * 48 395 -> 173 us (15M), 64 900 -> 444 (110M), 128 with GQA 8.1 -> 3.1 ms. With key
     * scores (h2o) the score pass follows, in lanes as well (attn_scores_qblock): its q.k
     * has the lanes' arithmetic, so s - m is exactly the main pass's. Sinks and windows
     * (GPT-OSS) take the row tasks below: the lanes have neither. */
    G.qblock = G.k->attn_qblock && G.k->attn_scores_qblock && a->n_q > 1 &&
               TSR__CPU_QBLOCK_FITS(a->head_dim) && !tsr__attn_has_sinks(a) &&
               a->window <= 0;
    if (G.qblock) {
        int64_t ntask = (a->n_q + 15) / 16 * a->n_heads;
        if (par && ntask > 1) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
            for (int64_t t = 0; t < ntask; t++) tsr__attn_qblock_run(&G, t, ml);
        } else {
            for (int64_t t = 0; t < ntask; t++) tsr__attn_qblock_run(&G, t, ml);
        }
        tsr__attn_score_pass(&G, par ? threads : 1, keys, ml);
        return TSR_OK;
    }
    /* Heads per task: as many as the stack accumulator holds (a decode row keeps them all,
     * reading each row front to back); when a prefill is threaded,
     * about 4 tasks per thread (balance); whole GQA groups where possible, so a group's K/V
     * tile is read by one task. Per-head results do not depend on the blocking. */
    int blk = TSR__ATTN_ACC / a->head_dim;
    blk = blk > TSR__ATTN_MAXH ? TSR__ATTN_MAXH : blk;
    blk = blk > a->n_heads ? a->n_heads : blk;
    /* Row order when the K/V rows come from DRAM: always in decode (the weights of the
     * other layers stream through the caches between two visits of a layer), and for a
     * prefill over more than an L2 of K + V. Measured with the AVX-512 kernels
     * (bench/attn.c, 12 kv heads of 64, 256 keys, 12 layers, 1 thread, Zen 4): cold
     * 1.08-1.15 against 1.45-1.52 ms per token; warm in L3 about equal; warm in L2 19
     * against 11-14 us per layer. With the AVX2 kernels f32 rows stay in chunks: on an
     * AVX2-only EPYC (Zen 1, 8 MiB L3) rows measured 4 % slower in decode (bench/attn.c,
     * 1024 keys) and 8 % in a 960-token prefill, since dot_heads loads a q vector for every
     * k vector where dot_rows shares one among four keys, and Zen 1 loads two 128-bit
     * halves a cycle. Stored rows (BF16, Q8, FP8) go in row order everywhere: read as they
     * are, they save the converted f32 copy (tsr__attn_dequant), which cost 2x in that
     * CPU's decode. */
    if (G.k->dot_heads && G.k->acc_heads) {
        size_t kv_bytes = (size_t)keys * (size_t)a->n_kv_heads * (size_t)a->head_dim * 8;
        G.rows = G.k->isa == TSR__ISA_AVX512 && (a->n_q == 1 || kv_bytes > TSR__ATTN_ROWS_MIN);
    }
    G.rows |= G.stored;
    if (a->n_q == 1 && keys > TSR__ATTN_PART_KEYS) { /* more than one partition */
        TSR_TRY(tsr__attn_decode(&G, sc, par ? threads : 1, keys, blk, ml));
        tsr__attn_score_pass(&G, par ? threads : 1, keys, ml);
        return TSR_OK;
    }
    if (par && a->n_q > 1) {
        int64_t want = 4 * (int64_t)threads;
        int64_t per = ((int64_t)a->n_q * a->n_heads + want - 1) / want;
        if (per < blk) blk = per < 1 ? 1 : (int)per;
        if (blk > G.group) blk -= blk % G.group;
    }
    int nblk = (a->n_heads + blk - 1) / blk;
    int64_t ntask = (int64_t)a->n_q * nblk;
    int par_main = par && ntask > 1;
    /* Dynamic: causal rows differ in length; results do not depend on the assignment.
     * Serial runs skip OpenMP (a serialized region still costs ~0.7 us and a futex). */
    if (par_main) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) tsr__attn_run(&G, t, blk, nblk, ml);
    } else {
        for (int64_t t = 0; t < ntask; t++) tsr__attn_run(&G, t, blk, nblk, ml);
    }
    tsr__attn_score_pass(&G, par ? threads : 1, keys, ml);
    return TSR_OK;
}
