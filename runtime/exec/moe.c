/* Mixture-of-experts block (moe.h). */
#include "runtime/exec/moe.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/exec/parallel.h"

/* Expert parallelism (moe.h): the group's state. Routes are (token t, slot j) pairs; the
 * send layout is this rank's routes sorted by (expert, token), which groups them by owner;
 * the receive layout is, per source rank, its routes to this rank's experts in the same
 * order. */
typedef struct tsr__moe_ep {
    tsr_comm *comm;
    int n, me;             /* the EP group (the TP group): size and my rank */
    int e0, e1;            /* my experts [e0, e1) */
    bool nccl;             /* the data plane is device memory (NCCL) */
    float *hx;             /* host: my rows of xb [T][dim] */
    float *hsend, *hrecv;  /* host: [T*K][dim] each, send / receive layout */
    float *hout;           /* host: all rows of the block's output [T][dim] */
    float *x_dev, *y_dev;  /* backend: received rows / their outputs [T*K][dim] */
    float *send_dev;       /* backend, NCCL only: the send-side plane buffer [T*K][dim] */
    int32_t *spos;         /* [T*K] route (t, j)'s place in the send layout */
    int32_t *soff;         /* [E + 1] my routes per expert, prefix */
    int32_t *cnt;          /* [n][e1 - e0] routes from source p to my expert e */
    int32_t *loff, *lrows; /* the kernel's offsets [e1 - e0 + 1] and rows [T*K] */
    float *ones;           /* [T*K] 1.0: the kernel returns each route's raw output */
    size_t *sb, *so, *rb, *ro; /* [n] each: alltoallv byte counts and offsets */
} tsr__moe_ep;

struct tsr_moe {
    tsr_backend *be;
    const tsr_model_config *c;
    int max_tokens;
    float *logits_dev, *out_dev; /* backend: [max_tokens][E], [max_tokens][dim] */
    float *logits;               /* host [max_tokens][E] */
    int32_t *idx, *rows, *offsets, *fill;
    float *wts, *weights;
    tsr__moe_ep *ep; /* NULL: every expert here */
};

void tsr_moe_route(const float *logits, int n_experts, int k, int32_t *idx, float *wts) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_experts; e++) {
            bool taken = false;
            for (int p = 0; p < j && !taken; p++) taken = idx[p] == e;
            if (taken) continue;
            /* strict >: the lower index wins a tie; NaN never wins */
            if (best < 0 || logits[e] > logits[best]) best = e;
        }
        idx[j] = best;
    }
    float m = logits[idx[0]], sum = 0.0f;
    for (int j = 0; j < k; j++) {
        wts[j] = expf(logits[idx[j]] - m);
        sum += wts[j];
    }
    for (int j = 0; j < k; j++) wts[j] /= sum;
}

static void tsr__ep_free(tsr_backend *be, tsr__moe_ep *p) {
    if (!p) return;
    float *dev[] = {p->x_dev, p->y_dev, p->send_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->ops->buffer_free(be, dev[i]);
    void *host[] = {p->hx, p->hsend, p->hrecv, p->hout, p->spos, p->soff, p->cnt,
                    p->loff, p->lrows, p->ones, p->sb};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) tsr_free(host[i]);
    tsr_free(p);
}

void tsr_moe_destroy(tsr_moe *mo) {
    if (!mo) return;
    tsr__ep_free(mo->be, mo->ep);
    if (mo->logits_dev) mo->be->ops->buffer_free(mo->be, mo->logits_dev);
    if (mo->out_dev) mo->be->ops->buffer_free(mo->be, mo->out_dev);
    tsr_free(mo->logits);
    tsr_free(mo->idx);
    tsr_free(mo->rows);
    tsr_free(mo->offsets);
    tsr_free(mo->fill);
    tsr_free(mo->wts);
    tsr_free(mo->weights);
    tsr_free(mo);
}

static tsr_status tsr__ep_create(tsr_moe *mo, tsr_comm *comm, const tsr_parallel_shard *sh) {
    const tsr_model_config *c = mo->c;
    int n = tsr_comm_size(comm, TSR_COMM_TP), me = tsr_comm_rank(comm, TSR_COMM_TP);
    int b = 0, e = 0;
    if (n > 0) tsr_parallel_split(c->n_experts, n, me, &b, &e);
    if (n < 2 || b != sh->expert_begin || e != sh->expert_end)
        return tsr_error_set(TSR_ERR_INTERNAL, "moe: experts %d-%d on rank %d of a %d-rank "
                             "tensor-parallel group (expected %d-%d)", sh->expert_begin,
                             sh->expert_end - 1, me, n, b, e - 1);
    tsr__moe_ep *p = tsr_calloc(1, sizeof *p);
    if (!p) return TSR_ERR_NOMEM;
    mo->ep = p;
    p->comm = comm;
    p->n = n;
    p->me = me;
    p->e0 = b;
    p->e1 = e;
    p->nccl = tsr_comm_uses_nccl(comm);
    tsr_backend *be = mo->be;
    size_t T = (size_t)mo->max_tokens, K = (size_t)c->n_experts_used, D = (size_t)c->dim;
    size_t E = (size_t)c->n_experts, El = (size_t)(e - b), TK = T * K;
    p->hx = tsr_malloc(T * D * sizeof(float));
    p->hsend = tsr_malloc(TK * D * sizeof(float));
    p->hrecv = tsr_malloc(TK * D * sizeof(float));
    p->hout = tsr_malloc(T * D * sizeof(float));
    p->spos = tsr_malloc(TK * sizeof(int32_t));
    p->soff = tsr_malloc((E + 1) * sizeof(int32_t));
    p->cnt = tsr_malloc((size_t)n * El * sizeof(int32_t));
    p->loff = tsr_malloc((El + 1) * sizeof(int32_t));
    p->lrows = tsr_malloc(TK * sizeof(int32_t));
    p->ones = tsr_malloc(TK * sizeof(float));
    p->sb = tsr_malloc((size_t)4 * (size_t)n * sizeof(size_t));
    if (!p->hx || !p->hsend || !p->hrecv || !p->hout || !p->spos || !p->soff || !p->cnt ||
        !p->loff || !p->lrows || !p->ones || !p->sb)
        return TSR_ERR_NOMEM;
    p->so = p->sb + n;
    p->rb = p->sb + 2 * n;
    p->ro = p->sb + 3 * n;
    for (size_t i = 0; i < TK; i++) p->ones[i] = 1.0f;
    TSR_TRY(be->ops->buffer_alloc(be, TK * D * sizeof(float), (void **)&p->x_dev));
    TSR_TRY(be->ops->buffer_alloc(be, TK * D * sizeof(float), (void **)&p->y_dev));
    if (p->nccl) TSR_TRY(be->ops->buffer_alloc(be, TK * D * sizeof(float), (void **)&p->send_dev));
    return TSR_OK;
}

tsr_status tsr_moe_create(tsr_backend *be, const tsr_model_config *c, int max_tokens,
                          tsr_comm *comm, const tsr_parallel_shard *sh, tsr_moe **out) {
    *out = NULL;
    if (!be->ops->moe)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "forward: backend %s has no "
                             "mixture-of-experts kernel yet (GPT-OSS runs on cpu and "
                             "cpu-fenced)", be->ops->name);
    tsr_moe *mo = tsr_calloc(1, sizeof *mo);
    if (!mo) return TSR_ERR_NOMEM;
    mo->be = be;
    mo->c = c;
    mo->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens, E = (size_t)c->n_experts, K = (size_t)c->n_experts_used;
    tsr_status st = be->ops->buffer_alloc(be, T * E * sizeof(float), (void **)&mo->logits_dev);
    if (st == TSR_OK)
        st = be->ops->buffer_alloc(be, T * (size_t)c->dim * sizeof(float), (void **)&mo->out_dev);
    if (st == TSR_OK) {
        mo->logits = tsr_malloc(T * E * sizeof(float));
        mo->idx = tsr_malloc(T * K * sizeof(int32_t));
        mo->rows = tsr_malloc(T * K * sizeof(int32_t));
        mo->wts = tsr_malloc(T * K * sizeof(float));
        mo->weights = tsr_malloc(T * K * sizeof(float));
        mo->offsets = tsr_malloc((E + 1) * sizeof(int32_t));
        mo->fill = tsr_malloc((E + 1) * sizeof(int32_t));
        if (!mo->logits || !mo->idx || !mo->rows || !mo->wts || !mo->weights || !mo->offsets ||
            !mo->fill)
            st = TSR_ERR_NOMEM;
    }
    /* a shard that names no range (expert_end 0) holds every expert */
    if (st == TSR_OK && sh && sh->expert_end > 0 &&
        sh->expert_end - sh->expert_begin < c->n_experts)
        st = tsr__ep_create(mo, comm, sh);
    if (st != TSR_OK) {
        tsr_moe_destroy(mo);
        return st;
    }
    *out = mo;
    return TSR_OK;
}

tsr_status tsr_moe_shard_experts(tsr_experts *x, int begin, int end) {
    if (begin < 0 || end > x->n || begin >= end)
        return tsr_error_set(TSR_ERR_INVALID, "moe: experts %d-%d of %d", begin, end - 1, x->n);
    if (begin == 0 && end == x->n) return TSR_OK;
    int64_t r0 = (int64_t)begin * x->rows, nr = (int64_t)(end - begin) * x->rows;
    tsr_tensor *t[] = {&x->w, &x->scales};
    for (int i = 0; i < 2; i++) {
        if (!t[i]->data) continue;
        /* bytes of the rows before (repacked MXFP4: whole 16-row groups per expert) */
        tsr_tensor before = {.dtype = t[i]->dtype, .rows = r0, .cols = t[i]->cols};
        t[i]->data = (const char *)t[i]->data + tsr_tensor_bytes(&before);
        t[i]->rows = nr;
    }
    if (x->bias.data) {
        x->bias.data = (const float *)x->bias.data + (size_t)begin * (size_t)x->rows;
        x->bias.rows = end - begin;
    }
    x->n = end - begin;
    return TSR_OK;
}

/* Expert parallelism, after every rank has routed all n rows (the router is replicated, so
 * every rank knows every route and no counts travel). Rows are split contiguously over the
 * group; each rank sends its rows' hidden states to the owners of their experts, each owner
 * runs its experts over every route it received (all of its experts' rows, in token order:
 * the same products as one process), the raw outputs go back, and each rank adds its rows'
 * weighted outputs in expert order, the kernel's order, from 0: one process's bits. The
 * rows are then gathered on every rank of the group (the attention of the tensor-parallel
 * layout needs them all). */
static tsr_status tsr__ep_run(tsr_moe *mo, const tsr_layer_weights *w, const float *xb,
                              int64_t n, const float **out) {
    tsr__moe_ep *p = mo->ep;
    tsr_backend *be = mo->be;
    const int E = mo->c->n_experts, K = mo->c->n_experts_used, El = p->e1 - p->e0;
    const size_t D = (size_t)mo->c->dim, rowb = D * sizeof(float);
    int t0, t1;
    tsr_parallel_split((int)n, p->n, p->me, &t0, &t1);
    /* my rows' hidden states, and my routes in the send layout */
    if (t1 > t0)
        TSR_TRY(tsr_backend_download(be, p->hx, xb + (size_t)t0 * D, (size_t)(t1 - t0) * rowb));
    memset(p->soff, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t r = (int64_t)t0 * K; r < (int64_t)t1 * K; r++) p->soff[mo->idx[r] + 1]++;
    for (int e = 0; e < E; e++) p->soff[e + 1] += p->soff[e];
    memcpy(mo->fill, p->soff, (size_t)(E + 1) * sizeof(int32_t));
    for (int t = t0; t < t1; t++)
        for (int j = 0; j < K; j++) {
            int32_t at = mo->fill[mo->idx[(size_t)t * K + j]]++;
            p->spos[(size_t)t * K + j] = at;
            memcpy(p->hsend + (size_t)at * D, p->hx + (size_t)(t - t0) * D, rowb);
        }
    /* what comes from each source: its rows' routes to my experts, by expert then token */
    memset(p->cnt, 0, (size_t)p->n * (size_t)El * sizeof(int32_t));
    for (int q = 0; q < p->n; q++) {
        int b, e;
        tsr_parallel_split((int)n, p->n, q, &b, &e);
        for (int64_t r = (int64_t)b * K; r < (int64_t)e * K; r++) {
            int x = mo->idx[r];
            if (x >= p->e0 && x < p->e1) p->cnt[(size_t)q * El + (x - p->e0)]++;
        }
    }
    size_t recv_rows = 0;
    for (int q = 0; q < p->n; q++) {
        int b, e;
        tsr_parallel_split(E, p->n, q, &b, &e);
        p->sb[q] = (size_t)(p->soff[e] - p->soff[b]) * rowb;
        p->so[q] = (size_t)p->soff[b] * rowb;
        size_t c = 0;
        for (int x = 0; x < El; x++) c += (size_t)p->cnt[(size_t)q * El + x];
        p->rb[q] = c * rowb;
        p->ro[q] = recv_rows * rowb;
        recv_rows += c;
    }
    /* the kernel's routes: by expert, then source, then token; each route its own output
     * row (weight 1), so the output comes back in the receive layout */
    p->loff[0] = 0;
    for (int x = 0; x < El; x++) {
        int32_t at = p->loff[x];
        size_t base = 0;
        for (int q = 0; q < p->n; q++) {
            int32_t pre = 0;
            for (int y = 0; y < x; y++) pre += p->cnt[(size_t)q * El + y];
            for (int32_t i = 0; i < p->cnt[(size_t)q * El + x]; i++)
                p->lrows[at++] = (int32_t)(base + (size_t)pre + (size_t)i);
            base += p->rb[q] / rowb;
        }
        p->loff[x + 1] = at;
    }
    /* dispatch */
    if (p->nccl) {
        size_t sent = (size_t)p->soff[E] * rowb;
        if (sent) TSR_TRY(tsr_backend_upload(be, p->send_dev, p->hsend, sent));
        TSR_TRY(tsr_comm_alltoallv(p->comm, TSR_COMM_TP, p->send_dev, p->sb, p->so, p->x_dev,
                                   p->rb, p->ro));
    } else {
        TSR_TRY(tsr_comm_alltoallv(p->comm, TSR_COMM_TP, p->hsend, p->sb, p->so, p->hrecv,
                                   p->rb, p->ro));
        if (recv_rows) TSR_TRY(tsr_backend_upload(be, p->x_dev, p->hrecv, recv_rows * rowb));
    }
    /* my experts over every route they received */
    tsr_experts gu = w->gate_up, dn = w->down;
    if (gu.n == E) { /* a model not cut to the shard: my experts' views */
        TSR_TRY(tsr_moe_shard_experts(&gu, p->e0, p->e1));
        TSR_TRY(tsr_moe_shard_experts(&dn, p->e0, p->e1));
    }
    tsr_moe_args a = {.x = p->x_dev, .n = (int64_t)recv_rows, .gate_up = &gu, .down = &dn,
                      .offsets = p->loff, .rows = p->lrows, .weights = p->ones,
                      .limit = mo->c->swiglu_limit, .alpha = mo->c->swiglu_alpha,
                      .out = p->y_dev};
    if (recv_rows) TSR_TRY(be->ops->moe(be, &a));
    /* the outputs back to their tokens' ranks (the reverse exchange) */
    if (p->nccl) {
        TSR_TRY(tsr_comm_alltoallv(p->comm, TSR_COMM_TP, p->y_dev, p->rb, p->ro, p->send_dev,
                                   p->sb, p->so));
        size_t got = (size_t)p->soff[E] * rowb;
        if (got) TSR_TRY(tsr_backend_download(be, p->hsend, p->send_dev, got));
    } else {
        if (recv_rows) TSR_TRY(tsr_backend_download(be, p->hrecv, p->y_dev, recv_rows * rowb));
        TSR_TRY(tsr_comm_alltoallv(p->comm, TSR_COMM_TP, p->hrecv, p->rb, p->ro, p->hsend,
                                   p->sb, p->so));
    }
    /* each of my rows: its weighted outputs in expert order, as the kernel adds them */
    float *blk = p->hrecv; /* free now: my rows' results [t1 - t0][D] */
    for (int t = t0; t < t1; t++) {
        float *o = blk + (size_t)(t - t0) * D;
        memset(o, 0, rowb);
        const int32_t *ix = mo->idx + (size_t)t * K;
        int32_t order[64];
        for (int j = 0; j < K; j++) {
            int i = j;
            while (i > 0 && ix[order[i - 1]] > ix[j]) {
                order[i] = order[i - 1];
                i--;
            }
            order[i] = j;
        }
        for (int jj = 0; jj < K; jj++) {
            int j = order[jj];
            float wgt = mo->wts[(size_t)t * K + j];
            const float *yi = p->hsend + (size_t)p->spos[(size_t)t * K + j] * D;
            for (size_t d = 0; d < D; d++) o[d] += yi[d] * wgt;
        }
    }
    /* every rank's rows to every rank: my block to all, each rank's block at its rows */
    for (int q = 0; q < p->n; q++) {
        int b, e;
        tsr_parallel_split((int)n, p->n, q, &b, &e);
        p->sb[q] = (size_t)(t1 - t0) * rowb;
        p->so[q] = 0;
        p->rb[q] = (size_t)(e - b) * rowb;
        p->ro[q] = (size_t)b * rowb;
    }
    if (p->nccl) {
        if (t1 > t0) TSR_TRY(tsr_backend_upload(be, p->send_dev, blk, (size_t)(t1 - t0) * rowb));
        TSR_TRY(tsr_comm_alltoallv(p->comm, TSR_COMM_TP, p->send_dev, p->sb, p->so, mo->out_dev,
                                   p->rb, p->ro));
    } else {
        TSR_TRY(tsr_comm_alltoallv(p->comm, TSR_COMM_TP, blk, p->sb, p->so, p->hout, p->rb,
                                   p->ro));
        TSR_TRY(tsr_backend_upload(be, mo->out_dev, p->hout, (size_t)n * rowb));
    }
    *out = mo->out_dev;
    return TSR_OK;
}

tsr_status tsr_moe_run(tsr_moe *mo, const tsr_layer_weights *w, const float *xb, int64_t n,
                       const float **out) {
    tsr_backend *be = mo->be;
    const int E = mo->c->n_experts, K = mo->c->n_experts_used;
    if (n > mo->max_tokens)
        return tsr_error_set(TSR_ERR_INVALID, "moe: %lld rows exceed %d", (long long)n,
                             mo->max_tokens);
    TSR_TRY(be->ops->matmul(be, xb, n, &w->router, mo->logits_dev));
    TSR_TRY(be->ops->bias_add(be, mo->logits_dev, &w->router_b, n));
    const float *lg = mo->logits_dev; /* on a host-memory backend: read in place */
    if (!be->host_memory) {
        TSR_TRY(tsr_backend_download(be, mo->logits, mo->logits_dev,
                                     (size_t)n * (size_t)E * sizeof(float)));
        lg = mo->logits;
    }
    for (int64_t t = 0; t < n; t++)
        tsr_moe_route(lg + (size_t)t * (size_t)E, E, K, mo->idx + (size_t)t * (size_t)K,
                      mo->wts + (size_t)t * (size_t)K);
    if (mo->ep) return tsr__ep_run(mo, w, xb, n, out);
    /* counting sort by expert; rows ascending within an expert */
    memset(mo->offsets, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t r = 0; r < n * K; r++) mo->offsets[mo->idx[r] + 1]++;
    for (int e = 0; e < E; e++) mo->offsets[e + 1] += mo->offsets[e];
    memcpy(mo->fill, mo->offsets, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int e = mo->idx[t * K + j];
            int32_t at = mo->fill[e]++;
            mo->rows[at] = (int32_t)t;
            mo->weights[at] = mo->wts[t * K + j];
        }
    tsr_moe_args a = {.x = xb, .n = n, .gate_up = &w->gate_up, .down = &w->down,
                      .offsets = mo->offsets, .rows = mo->rows, .weights = mo->weights,
                      .limit = mo->c->swiglu_limit, .alpha = mo->c->swiglu_alpha,
                      .out = mo->out_dev};
    TSR_TRY(be->ops->moe(be, &a));
    *out = mo->out_dev;
    return TSR_OK;
}
