/* The offload policy's copy streams (policies/offload_copy.h). */
#include "policies/offload_copy.h"

#include <string.h>

#include "base/alloc.h"

/* One (sequence, layer): its staging and the state of its copies. */
typedef struct tsr__ocl {
    float *pin;  /* pinned host staging of a prefetch: K rows, then V rows */
    size_t pin_bytes;
    float *dev;  /* device staging of a prefetch, the same layout */
    size_t dev_bytes;
    float *wdev; /* device staging of a write-back: K rows, then V rows */
    size_t wdev_bytes;
    int32_t *pos; /* the rows of the prefetch in flight */
    int32_t n, pos_cap;
    bool queued; /* a prefetch not yet taken or dropped */
    bool busy;   /* pin/dev read or written by a copy that no drain has covered yet */
    int32_t wb_at, wb_n; /* a write-back in flight (wb_n 0: none) */
    tsr_event *up;       /* the end of the prefetch's upload (timed when timing) */
    tsr_event *t0, *c0, *c1; /* timing: upload start; compute before and after the wait */
    bool timed;          /* t0 .. c1 hold a measurement to read at the drain */
} tsr__ocl;

struct tsr_offload_copy {
    tsr_backend *be;
    int L, kvd;
    tsr_stream *h2d, *d2h;
    tsr_event *ev_c, *ev_a, *ev_b; /* compute -> d2h order; the drain's two */
    bool timing;   /* the backend times events */
    bool inflight; /* anything queued since the last drain */
    tsr__ocl **seqs; /* [n_seqs][L], rows made on first use */
    int n_seqs;
    tsr_offload_copy_arrived_fn arrived;
    void *ctx;
    tsr_offload_copy_stats st;
};

tsr_status tsr_offload_copy_create(tsr_backend *be, int n_layers, int kv_dim,
                                   tsr_offload_copy_arrived_fn arrived, void *ctx,
                                   tsr_offload_copy **out) {
    *out = NULL;
    if (!be || be->host_memory) return TSR_OK;
    tsr_offload_copy *c = tsr_calloc(1, sizeof *c);
    if (!c) return TSR_ERR_NOMEM;
    c->be = be;
    c->L = n_layers;
    c->kvd = kv_dim;
    c->arrived = arrived;
    c->ctx = ctx;
    c->timing = be->ops->event_create_timed && be->ops->event_elapsed;
    const tsr_backend_ops *op = be->ops;
    tsr_status st = op->stream_create(be, &c->h2d);
    if (st == TSR_OK) st = op->stream_create(be, &c->d2h);
    if (st == TSR_OK) st = op->event_create(be, &c->ev_c);
    if (st == TSR_OK) st = op->event_create(be, &c->ev_a);
    if (st == TSR_OK) st = op->event_create(be, &c->ev_b);
    if (st != TSR_OK) {
        tsr_offload_copy_destroy(c);
        return st;
    }
    *out = c;
    return TSR_OK;
}

static void tsr__ocl_free(tsr_offload_copy *c, tsr__ocl *l) {
    tsr_backend *be = c->be;
    if (l->pin) be->ops->host_free(be, l->pin);
    if (l->dev) be->ops->buffer_free(be, l->dev);
    if (l->wdev) be->ops->buffer_free(be, l->wdev);
    tsr_event *ev[4] = {l->up, l->t0, l->c0, l->c1};
    for (int i = 0; i < 4; i++)
        if (ev[i]) be->ops->event_destroy(be, ev[i]);
    tsr_free(l->pos);
    memset(l, 0, sizeof *l);
}

static tsr_status tsr__drain(tsr_offload_copy *c, bool report) {
    if (!c->inflight) return TSR_OK;
    tsr_backend *be = c->be;
    const tsr_backend_ops *op = be->ops;
    /* d2h after the compute stream and h2d, then one host wait for d2h */
    TSR_TRY(op->event_record(be, c->ev_c, NULL));
    TSR_TRY(op->stream_wait(be, c->d2h, c->ev_c));
    TSR_TRY(op->event_record(be, c->ev_a, c->h2d));
    TSR_TRY(op->stream_wait(be, c->d2h, c->ev_a));
    TSR_TRY(op->event_record(be, c->ev_b, c->d2h));
    TSR_TRY(op->event_sync(be, c->ev_b));
    c->inflight = false;
    c->st.drains++;
    tsr_status st = TSR_OK;
    for (int s = 0; s < c->n_seqs; s++) {
        if (!c->seqs[s]) continue;
        for (int l = 0; l < c->L; l++) {
            tsr__ocl *x = &c->seqs[s][l];
            if (x->wb_n > 0 && report && c->arrived) c->arrived(c->ctx, s, l, x->wb_at, x->wb_n);
            x->wb_n = 0;
            x->busy = false;
            if (x->queued) c->st.prefetch_dropped++; /* queued, never taken */
            x->queued = false;
            if (x->timed && st == TSR_OK) {
                float copy = 0.0f, stall = 0.0f;
                st = op->event_elapsed(be, x->t0, x->up, &copy);
                if (st == TSR_OK) st = op->event_elapsed(be, x->c0, x->c1, &stall);
                if (st == TSR_OK) {
                    c->st.copy_ms += copy;
                    c->st.stall_ms += stall;
                    c->st.timed++;
                }
            }
            x->timed = false;
        }
    }
    return st;
}

tsr_status tsr_offload_copy_drain(tsr_offload_copy *c) {
    return c ? tsr__drain(c, true) : TSR_OK;
}

void tsr_offload_copy_destroy(tsr_offload_copy *c) {
    if (!c) return;
    (void)tsr__drain(c, false);
    tsr_backend *be = c->be;
    for (int s = 0; s < c->n_seqs; s++) {
        for (int l = 0; c->seqs[s] && l < c->L; l++) tsr__ocl_free(c, &c->seqs[s][l]);
        tsr_free(c->seqs[s]);
    }
    tsr_free(c->seqs);
    tsr_event *ev[3] = {c->ev_c, c->ev_a, c->ev_b};
    for (int i = 0; i < 3; i++)
        if (ev[i]) be->ops->event_destroy(be, ev[i]);
    if (c->h2d) be->ops->stream_destroy(be, c->h2d);
    if (c->d2h) be->ops->stream_destroy(be, c->d2h);
    tsr_free(c);
}

/* The pair's state, made on first use. */
static tsr_status tsr__ocl_get(tsr_offload_copy *c, int seq, int layer, tsr__ocl **out) {
    if (seq < 0 || layer < 0 || layer >= c->L)
        return tsr_error_set(TSR_ERR_INVALID, "offload: no copy state for sequence %d layer %d",
                             seq, layer);
    if (seq >= c->n_seqs) {
        tsr__ocl **ns = tsr_realloc(c->seqs, (size_t)(seq + 1) * sizeof *ns);
        if (!ns) return TSR_ERR_NOMEM;
        memset(ns + c->n_seqs, 0, (size_t)(seq + 1 - c->n_seqs) * sizeof *ns);
        c->seqs = ns;
        c->n_seqs = seq + 1;
    }
    if (!c->seqs[seq]) {
        c->seqs[seq] = tsr_calloc((size_t)c->L, sizeof **c->seqs);
        if (!c->seqs[seq]) return TSR_ERR_NOMEM;
    }
    *out = &c->seqs[seq][layer];
    return TSR_OK;
}

/* Grows a device buffer to `bytes` (its old contents dropped); false when the backend has
 * no memory for it (the caller copies synchronously instead). */
static bool tsr__grow_dev(tsr_backend *be, float **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return true;
    size_t want = bytes > 2 * *cap ? bytes : 2 * *cap;
    if (*p) be->ops->buffer_free(be, *p);
    *p = NULL;
    *cap = 0;
    if (be->ops->buffer_alloc(be, want, (void **)p) != TSR_OK) {
        *p = NULL;
        return false;
    }
    *cap = want;
    return true;
}

static bool tsr__grow_pin(tsr_backend *be, float **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return true;
    size_t want = bytes > 2 * *cap ? bytes : 2 * *cap;
    if (*p) be->ops->host_free(be, *p);
    *p = NULL;
    *cap = 0;
    if (be->ops->host_alloc(be, want, true, (void **)p) != TSR_OK) {
        *p = NULL;
        return false;
    }
    *cap = want;
    return true;
}

tsr_status tsr_offload_copy_writeback(tsr_offload_copy *c, int seq, int layer, const float *k,
                                      const float *v, int32_t n, float *hk, float *hv,
                                      int32_t at, bool *queued) {
    *queued = false;
    if (!c || n <= 0) return TSR_OK;
    tsr__ocl *x;
    TSR_TRY(tsr__ocl_get(c, seq, layer, &x));
    if (x->wb_n > 0) return TSR_OK; /* its staging is in flight: no drain since */
    tsr_backend *be = c->be;
    const tsr_backend_ops *op = be->ops;
    size_t nb = (size_t)n * c->kvd * sizeof(float);
    if (!tsr__grow_dev(be, &x->wdev, &x->wdev_bytes, 2 * nb)) return TSR_OK;
    float *wv = x->wdev + (size_t)n * c->kvd;
    TSR_TRY(op->copy(be, x->wdev, k, nb));
    TSR_TRY(op->copy(be, wv, v, nb));
    TSR_TRY(op->event_record(be, c->ev_c, NULL));
    TSR_TRY(op->stream_wait(be, c->d2h, c->ev_c));
    TSR_TRY(op->download(be, hk, x->wdev, nb, c->d2h));
    TSR_TRY(op->download(be, hv, wv, nb, c->d2h));
    x->wb_at = at;
    x->wb_n = n;
    c->inflight = true;
    c->st.writebacks++;
    *queued = true;
    return TSR_OK;
}

/* A timing event, made once. */
static tsr_status tsr__timed(tsr_offload_copy *c, tsr_event **ev) {
    return *ev ? TSR_OK : c->be->ops->event_create_timed(c->be, ev);
}

tsr_status tsr_offload_copy_prefetch(tsr_offload_copy *c, int seq, int layer, const float *hk,
                                     const float *hv, const int32_t *pos, int32_t n,
                                     bool *queued) {
    *queued = false;
    if (!c || n <= 0) return TSR_OK;
    tsr__ocl *x;
    TSR_TRY(tsr__ocl_get(c, seq, layer, &x));
    if (x->busy || x->queued) return TSR_OK; /* staging in flight: no drain since */
    tsr_backend *be = c->be;
    const tsr_backend_ops *op = be->ops;
    size_t kvd = (size_t)c->kvd, nb = (size_t)n * kvd * sizeof(float);
    if (!tsr__grow_pin(be, &x->pin, &x->pin_bytes, 2 * nb) ||
        !tsr__grow_dev(be, &x->dev, &x->dev_bytes, 2 * nb))
        return TSR_OK;
    if (n > x->pos_cap) {
        int32_t *p = tsr_realloc(x->pos, (size_t)n * sizeof *p);
        if (!p) return TSR_ERR_NOMEM;
        x->pos = p;
        x->pos_cap = n;
    }
    if (!x->up) TSR_TRY(c->timing ? tsr__timed(c, &x->up) : op->event_create(be, &x->up));
    if (c->timing) {
        TSR_TRY(tsr__timed(c, &x->t0));
        TSR_TRY(tsr__timed(c, &x->c0));
        TSR_TRY(tsr__timed(c, &x->c1));
    }
    float *pv = x->pin + (size_t)n * kvd;
    for (int32_t i = 0; i < n; i++) {
        memcpy(x->pin + (size_t)i * kvd, hk + (size_t)pos[i] * kvd, kvd * sizeof(float));
        memcpy(pv + (size_t)i * kvd, hv + (size_t)pos[i] * kvd, kvd * sizeof(float));
    }
    memcpy(x->pos, pos, (size_t)n * sizeof *pos);
    x->n = n;
    if (c->timing) TSR_TRY(op->event_record(be, x->t0, c->h2d));
    TSR_TRY(op->upload(be, x->dev, x->pin, 2 * nb, c->h2d));
    TSR_TRY(op->event_record(be, x->up, c->h2d));
    x->queued = x->busy = true;
    c->inflight = true;
    c->st.prefetches++;
    *queued = true;
    return TSR_OK;
}

tsr_status tsr_offload_copy_take(tsr_offload_copy *c, int seq, int layer, const int32_t *pos,
                                 int32_t n, const float **k, const float **v) {
    *k = *v = NULL;
    if (!c || seq < 0 || seq >= c->n_seqs || !c->seqs[seq] || layer < 0 || layer >= c->L)
        return TSR_OK;
    tsr__ocl *x = &c->seqs[seq][layer];
    if (!x->queued) return TSR_OK;
    x->queued = false;
    if (n != x->n || memcmp(pos, x->pos, (size_t)n * sizeof *pos) != 0) {
        c->st.prefetch_dropped++;
        return TSR_OK;
    }
    tsr_backend *be = c->be;
    if (c->timing) TSR_TRY(be->ops->event_record(be, x->c0, NULL));
    TSR_TRY(be->ops->stream_wait(be, NULL, x->up));
    if (c->timing) {
        TSR_TRY(be->ops->event_record(be, x->c1, NULL));
        x->timed = true;
    }
    *k = x->dev;
    *v = x->dev + (size_t)n * c->kvd;
    c->st.prefetch_used++;
    return TSR_OK;
}

tsr_status tsr_offload_copy_release(tsr_offload_copy *c, int seq) {
    if (!c || seq < 0 || seq >= c->n_seqs || !c->seqs[seq]) return TSR_OK;
    bool busy = false;
    for (int l = 0; l < c->L; l++) busy |= c->seqs[seq][l].busy || c->seqs[seq][l].wb_n > 0;
    /* the other sequences' arrivals are reported; this one's rows go with it */
    for (int l = 0; busy && l < c->L; l++) c->seqs[seq][l].wb_n = 0;
    if (busy) TSR_TRY(tsr__drain(c, true));
    for (int l = 0; l < c->L; l++) tsr__ocl_free(c, &c->seqs[seq][l]);
    tsr_free(c->seqs[seq]);
    c->seqs[seq] = NULL;
    return TSR_OK;
}

void tsr_offload_copy_get_stats(const tsr_offload_copy *c, tsr_offload_copy_stats *out) {
    if (c) *out = c->st;
    else memset(out, 0, sizeof *out);
}
