/* The batched forward pass. All tokens of a call go through each matrix together (prompt
 * chunks become matrix-matrix products); attention runs per sequence over the spans its KV
 * cache returns; the classifier runs only for the rows that need logits.
 *
 * Distribution (runtime/exec/parallel.h): a rank holds a stage's layers and a TP slice of each.
 * The two row-parallel products (wo, w_down) are always computed as per-part partial sums
 * in canonical part order, in one process too, which is what makes tp = 1, 2, 4 give the
 * same bits.
 *
 * Fused weights (runtime/model/fuse.h): a layer with wqkv / w_gate_up makes one product
 * where it made three / two, and the calls around them merge (qkv_rope, rmsnorm_matmul,
 * swiglu_matmul_acc: kernels/backend.h), with the unfused bits on the CPU backends. */
#include "runtime/exec/forward.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/sample.h"
#include "runtime/exec/moe.h"

/* Pipeline micro-batches per call at most. */
#define TSR__MAX_MB 64
/* Rows per row-parallel block: bounded so that the parts of a block take at most this many
 * bytes for the model's (global) part count, whatever tp is. */
#define TSR__PARTS_BYTES ((size_t)64 << 20)

struct tsr_forward {
    const tsr_model *m;
    tsr_backend *be;
    int max_tokens;
    tsr_comm *comm;          /* NULL: one process */
    tsr_parallel_shard sh;
    int tp, pp, micro_batches;
    bool sample_last; /* logits stay on the last stage (tsr_forward_sample_last_stage) */
    bool use_nccl;
    int qd, kvd, hid, nh, nkv; /* local widths and heads */
    int n_parts;             /* local reduction parts */
    int32_t *wo_seg, *down_seg;
    int64_t row_block;       /* rows per row-parallel block */
    /* activations, [max_tokens][width] each, from the backend */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    /* Fused weights (runtime/model/fuse.h) with the backend's fused ops: the q/k/v product
     * [max_tokens][qd + 2 kvd] and the gate/up product [max_tokens][2 hid]; NULL: unused. */
    float *qkv, *gu;
    bool fused_qkv, fused_gu;
    float *xl;          /* rows that need logits, gathered: [max_tokens][dim] */
    float *parts;       /* tp > 1 over MPI: [n_parts][row_block][dim] */
    int32_t *pos;       /* host: position of each row */
    int32_t *ids;       /* host: token id of each row */
    /* Grown on demand. Backend: the classifier's output rows and the attention's key
     * scores (per local query head x keys). Host: their copies for the caller and the
     * cache's observe(), and the queries handed to the cache's queries() hook. */
    float *logits_dev, *scores_dev;
    size_t logits_cap, scores_cap;        /* bytes */
    int logits_rows; /* rows of logits_dev from the last call with logits NULL */
    float *scores_host, *q_host, *xb_host;
    size_t scores_host_cap, q_host_cap, xb_host_cap; /* bytes */
    /* MPI data plane on a backend whose memory the host may not touch: the activations
     * cross ranks through these host buffers (host_alloc), [max_tokens][dim] for the
     * pipeline and the parts and sum of one row-parallel block for tensor parallelism. */
    bool stage;
    float *h_x, *h_parts, *h_y;
    tsr_moe *moe; /* GPT-OSS: the mixture-of-experts block (runtime/exec/moe.h) */
    /* This call's logit rows are all its rows in order (decode: one token per sequence),
     * so the final norm reads x itself and no row is gathered. */
    bool logits_all_rows;
    /* The sampling parameters of tsr_forward_sample, pinned (host_alloc): the op stages
     * them with an asynchronous copy, not a pageable one. */
    tsr_sample_params *h_params;
    int h_params_cap;
    /* The batched step (tsr__step_meta): when the cache hands out slots and block tables
     * (kv->ops->write_slots) and the backend has attention_paged, the step's metadata
     * (ids, positions, each row's sequence, key counts, every layer's slots and block
     * tables) is built in one pinned buffer and uploaded once, on a copy stream the
     * compute stream waits for; every op then reads it in backend memory, one kv_write and
     * one attention per layer for the whole batch, no staging copy and no host wait.
     * Reusing both buffers in the next call is safe: a call ends with a host wait behind
     * its work (the ids, the logits' download or a synchronize). */
    bool batched;
    int32_t *h_meta, *d_meta;     /* pinned host / backend */
    size_t h_meta_cap, d_meta_cap; /* bytes */
    int32_t *h_slots;             /* host scratch: [layers][T] slots */
    size_t h_slots_cap;           /* bytes */
    const int32_t **h_tab;        /* host scratch: [layers][seqs] tables and their lengths */
    int32_t *h_nb;
    size_t h_tab_cap;             /* entries */
    tsr_stream *meta_stream;
    tsr_event *meta_ev;
    tsr_kv_layout lay;
    int meta_T, meta_S, meta_MB;
    const int32_t *m_ids, *m_pos, *m_seq, *m_nkeys, *m_slots, *m_tables; /* in d_meta */
};

void tsr_forward_sample_last_stage(tsr_forward *f, bool on) { f->sample_last = on; }

bool tsr_forward_has_logits(const tsr_forward *f) {
    return f->pp <= 1 || !f->sample_last || f->sh.last_stage;
}

tsr_status tsr_forward_share_tokens(tsr_forward *f, int32_t *ids, int n) {
    if (f->pp <= 1 || !f->sample_last || n <= 0) return TSR_OK;
    /* Control-plane sized (4 bytes a row) but host memory: MPI even under NCCL. */
    return tsr_comm_bcast(f->comm, TSR_COMM_PP, ids, (size_t)n * sizeof *ids, f->pp - 1);
}

size_t tsr_forward_workspace_bytes(const tsr_model_config *c, int max_tokens) {
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    /* with the fused products' rows (runtime/model/fuse.h) */
    size_t per_row = 3 * (size_t)c->dim + 3 * qd + 4 * kvd + 4 * (size_t)c->hidden_dim;
    return (size_t)max_tokens * (per_row * 4 + 8);
}

void tsr_forward_destroy(tsr_forward *f) {
    if (!f) return;
    float *bufs[] = {f->x,  f->xb,  f->q,     f->k,         f->v,          f->att,
                     f->hb, f->hb2, f->xl,    f->parts,     f->logits_dev, f->scores_dev,
                     f->qkv, f->gu};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) f->be->ops->buffer_free(f->be, bufs[i]);
    if (f->d_meta) f->be->ops->buffer_free(f->be, f->d_meta);
    if (f->meta_ev) f->be->ops->event_destroy(f->be, f->meta_ev);
    if (f->meta_stream) f->be->ops->stream_destroy(f->be, f->meta_stream);
    tsr_free(f->h_slots);
    tsr_free(f->h_tab);
    tsr_free(f->h_nb);
    void *hbufs[] = {f->h_x,      f->h_parts,     f->h_y,         f->h_params,
                     f->h_meta,   f->scores_host, f->q_host,      f->xb_host};
    for (size_t i = 0; i < sizeof hbufs / sizeof hbufs[0]; i++)
        if (hbufs[i]) f->be->ops->host_free(f->be, hbufs[i]);
    tsr_free(f->pos);
    tsr_free(f->ids);
    tsr_free(f->wo_seg);
    tsr_free(f->down_seg);
    tsr_moe_destroy(f->moe);
    tsr_free(f);
}

tsr_status tsr_forward_create(const tsr_model *m, tsr_backend *be, int max_tokens,
                              tsr_forward **out) {
    return tsr_forward_create_parallel(m, be, max_tokens, NULL, out);
}

/* Whether layer w can run on its fused q/k/v (or gate/up) weights: present, and the
 * backend has the op that splits the product (runtime/model/fuse.h). */
static bool tsr__qkv_fusable(const tsr_forward *f, const tsr_layer_weights *w) {
    return w->wqkv.data && f->be->ops->qkv_rope && (!f->m->cfg.qkv_bias || w->bqkv.data);
}

static bool tsr__gu_fusable(const tsr_forward *f, const tsr_layer_weights *w) {
    return w->w_gate_up.data && f->be->ops->swiglu_fused && f->m->cfg.n_experts == 0;
}

/* ... and does: the product's buffer was made when the forward was (a model fused later,
 * by another engine that borrows it, keeps its unfused parts as views, read here). */
static bool tsr__fused_qkv(const tsr_forward *f, const tsr_layer_weights *w) {
    return f->qkv && tsr__qkv_fusable(f, w);
}

static bool tsr__fused_gu(const tsr_forward *f, const tsr_layer_weights *w) {
    return f->gu && tsr__gu_fusable(f, w);
}

/* Activations live in the backend's memory. NCCL moves them as they are, ordered on the
 * backend's stream; MPI takes host memory, so on a backend whose memory is not the host's
 * the forward stages them through host buffers (download, send; receive, upload). NCCL
 * with a host backend would hand host pointers to NCCL, and NCCL on another stream than
 * the kernels would race them: both are refused before anything runs. One process moves
 * nothing. */
static tsr_status tsr__check_data_plane(tsr_comm *comm, tsr_backend *be, bool nccl) {
    if (!comm || tsr_comm_world_size(comm) < 2 || !nccl) return TSR_OK;
    if (be->device < 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "forward: the data plane is on NCCL, but backend %s keeps "
                             "activations in host memory", be->ops->name);
    void *bs = be->ops->stream_handle ? be->ops->stream_handle(be) : NULL;
    if (bs && tsr_comm_cuda_stream(comm) != bs)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "forward: NCCL is ordered on another CUDA stream than backend "
                             "%s's kernels, so its transfers would race them", be->ops->name);
    return TSR_OK;
}

tsr_status tsr_forward_create_parallel(const tsr_model *m, tsr_backend *be, int max_tokens,
                                       const tsr_forward_parallel *par, tsr_forward **out) {
    *out = NULL;
    if (max_tokens <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "forward: max tokens per step must be > 0");
    if (!be->ops->matmul_parts)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "forward: backend %s lacks matmul_parts",
                             be->ops->name);
    if (m->cfg.qkv_bias && !be->ops->bias_add)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "forward: backend %s lacks bias_add, which "
                             "the q/k/v biases of this model need", be->ops->name);
    tsr_comm *comm = par ? par->comm : NULL;
    TSR_TRY(tsr__check_data_plane(comm, be, comm && tsr_comm_uses_nccl(comm)));
    const tsr_model_config *c = &m->cfg;
    tsr_parallel_shard sh;
    if (par) sh = par->shard;
    else TSR_TRY(tsr_parallel_shard_whole(c, &sh));
    tsr_forward *f = tsr_calloc(1, sizeof *f);
    if (!f) return TSR_ERR_NOMEM;
    f->m = m;
    f->be = be;
    f->max_tokens = max_tokens;
    f->sh = sh;
    f->comm = comm;
    f->tp = f->comm ? tsr_comm_tp(f->comm) : 1;
    f->pp = f->comm ? tsr_comm_pp(f->comm) : 1;
    if (f->tp < 1) f->tp = 1;
    if (f->pp < 1) f->pp = 1;
    f->micro_batches = par && par->micro_batches > 0 ? par->micro_batches : f->pp;
    if (f->micro_batches > TSR__MAX_MB) f->micro_batches = TSR__MAX_MB;
    /* NCCL sums device buffers in place; MPI gets the parts in host memory */
    f->use_nccl = f->comm && tsr_comm_uses_nccl(f->comm);
    f->qd = tsr_parallel_shard_qdim(&sh, c);
    f->kvd = tsr_parallel_shard_kvdim(&sh, c);
    f->hid = tsr_parallel_shard_hidden(&sh);
    f->nh = sh.head_end - sh.head_begin;
    f->nkv = sh.kv_head_end - sh.kv_head_begin;
    f->n_parts = sh.part_end - sh.part_begin;
    size_t T = (size_t)max_tokens;
    /* Fused weights are used, layer by layer, where the backend has the fused ops
     * (runtime/model/fuse.h): their products' buffers when some local layer has them. */
    for (int l = sh.layer_begin; l < sh.layer_end; l++) {
        f->fused_qkv |= tsr__qkv_fusable(f, &m->layers[l]);
        f->fused_gu |= tsr__gu_fusable(f, &m->layers[l]);
    }
    size_t rb = TSR__PARTS_BYTES / ((size_t)sh.n_parts * (size_t)c->dim * 4);
    f->row_block = rb < 1 ? 1 : rb > T ? (int64_t)T : (int64_t)rb;
    struct {
        float **p;
        size_t rows, width;
    } plan[] = {{&f->x, T, (size_t)c->dim},   {&f->xb, T, (size_t)c->dim},
                {&f->q, T, (size_t)f->qd},     {&f->k, T, (size_t)f->kvd},
                {&f->v, T, (size_t)f->kvd},    {&f->att, T, (size_t)f->qd},
                {&f->hb, T, (size_t)f->hid},   {&f->hb2, T, (size_t)f->hid},
                {&f->xl, T, (size_t)c->dim},
                {&f->qkv, f->fused_qkv ? T : 0, (size_t)(f->qd + 2 * f->kvd)},
                {&f->gu, f->fused_gu ? T : 0, 2 * (size_t)f->hid},
                {&f->parts, f->tp > 1 && !f->use_nccl ? (size_t)f->row_block * f->n_parts : 0,
                 (size_t)c->dim}};
    tsr_status st = TSR_OK;
    for (size_t i = 0; i < sizeof plan / sizeof plan[0] && st == TSR_OK; i++) {
        size_t bytes;
        if (plan[i].rows == 0) continue;
        if (!tsr_mul_size(plan[i].rows, plan[i].width * 4, &bytes))
            st = tsr_error_set(TSR_ERR_NOMEM, "forward: workspace size overflow");
        else
            st = be->ops->buffer_alloc(be, bytes, (void **)plan[i].p);
    }
    /* The plain CPU backend's memory is the host's: MPI takes it in place, as before. */
    f->stage = f->comm && tsr_comm_world_size(f->comm) > 1 && !f->use_nccl && !be->host_memory;
    if (st == TSR_OK && f->stage) {
        size_t xb = T * (size_t)c->dim * 4, yb = (size_t)f->row_block * (size_t)c->dim * 4;
        st = be->ops->host_alloc(be, xb, false, (void **)&f->h_x);
        if (st == TSR_OK && f->tp > 1)
            st = be->ops->host_alloc(be, yb * (size_t)f->n_parts, false, (void **)&f->h_parts);
        if (st == TSR_OK && f->tp > 1) st = be->ops->host_alloc(be, yb, false, (void **)&f->h_y);
    }
    if (st == TSR_OK) {
        f->pos = tsr_calloc(T, sizeof *f->pos);
        f->ids = tsr_calloc(T, sizeof *f->ids);
        f->wo_seg = tsr_calloc((size_t)f->n_parts + 1, sizeof *f->wo_seg);
        f->down_seg = tsr_calloc((size_t)f->n_parts + 1, sizeof *f->down_seg);
        if (!f->pos || !f->ids || !f->wo_seg || !f->down_seg) st = TSR_ERR_NOMEM;
    }
    if (st == TSR_OK && c->n_experts > 0) st = tsr_moe_create(be, c, max_tokens, comm, &sh, &f->moe);
    if (st != TSR_OK) {
        tsr_forward_destroy(f);
        return st;
    }
    tsr_parallel_shard_segments(&sh, c, f->wo_seg, f->down_seg);
    *out = f;
    return TSR_OK;
}

/* Grows a backend buffer to `bytes` (contents lost). */
static tsr_status tsr__grow_dev(tsr_forward *f, float **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return TSR_OK;
    if (*p) f->be->ops->buffer_free(f->be, *p);
    *p = NULL;
    *cap = 0;
    TSR_TRY(f->be->ops->buffer_alloc(f->be, bytes, (void **)p));
    *cap = bytes;
    return TSR_OK;
}

/* Grows a pinned host buffer (host_alloc) to `bytes` (contents lost): the policies' copies
 * of queries, scores and attention input, so that their downloads are no pageable copies. */
static tsr_status tsr__grow_pin(tsr_forward *f, float **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return TSR_OK;
    /* doubling: the key scores grow every step, and pinning memory is slow */
    size_t want = bytes > 2 * *cap ? bytes : 2 * *cap;
    if (*p) f->be->ops->host_free(f->be, *p);
    *p = NULL;
    *cap = 0;
    TSR_TRY(f->be->ops->host_alloc(f->be, want, true, (void **)p));
    *cap = want;
    return TSR_OK;
}

static tsr_status tsr__grow_host(float **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return TSR_OK;
    float *q = tsr_realloc(*p, bytes);
    if (!q) return TSR_ERR_NOMEM;
    *p = q;
    *cap = bytes;
    return TSR_OK;
}

/* Attention of sequences [s0, s1) of the batch for local layer `layer`; their rows start at
 * row0 of q/k/v. The cache's policy gets host copies of what its declaration says it reads
 * (kv->wants_attn_input, wants_queries, wants_scores: policies/policy.h) and nothing else:
 * on a device backend each is a download, and a wait, per layer and sequence, so a policy
 * that reads none of them (paged, streaming) costs none. */
static tsr_status tsr__attention(tsr_forward *f, tsr_kv_cache *kv, int layer,
                                 const tsr_batch_seq *seqs, int s0, int s1, int64_t row0) {
    const tsr_model_config *c = &f->m->cfg;
    tsr_backend *be = f->be;
    size_t qd = (size_t)f->qd, kvd = (size_t)f->kvd;
    int64_t row = row0;
    for (int i = s0; i < s1; i++) {
        const tsr_batch_seq *s = &seqs[i];
        if (kv->wants_attn_input && kv->ops->attn_input) { /* the normed input, on the host */
            size_t dim = (size_t)c->dim;
            const float *xh = f->xb + row * dim;
            if (!be->host_memory) {
                size_t nb = (size_t)s->n_tokens * dim * sizeof(float);
                TSR_TRY(tsr__grow_pin(f, &f->xb_host, &f->xb_host_cap, nb));
                TSR_TRY(tsr_backend_download(be, f->xb_host, xh, nb));
                xh = f->xb_host;
            }
            TSR_TRY(kv->ops->attn_input(kv, layer, s->seq, xh, s->n_tokens, c->dim));
        }
        TSR_TRY(kv->ops->write(kv, layer, s->seq, s->n_tokens, f->k + row * kvd,
                               f->v + row * kvd));
        if (kv->wants_queries && kv->ops->queries) { /* the cache reads them on the host */
            const float *qh = f->q + row * qd; /* in place when backend memory is host memory */
            if (!be->host_memory) {
                size_t qb = (size_t)s->n_tokens * qd * sizeof(float);
                TSR_TRY(tsr__grow_pin(f, &f->q_host, &f->q_host_cap, qb));
                TSR_TRY(tsr_backend_download(be, f->q_host, qh, qb));
                qh = f->q_host;
            }
            TSR_TRY(kv->ops->queries(kv, layer, s->seq, qh, f->pos + row, s->n_tokens, f->nh));
        }
        const tsr_kv_span *spans;
        int n_spans;
        TSR_TRY(kv->ops->spans(kv, layer, s->seq, &spans, &n_spans));
        float *scores = NULL;
        size_t sb = 0;
        if (kv->wants_scores && kv->ops->observe) {
            size_t keys = 0;
            for (int j = 0; j < n_spans; j++) keys += (size_t)spans[j].n;
            sb = keys * (size_t)f->nh * sizeof(float); /* per query head */
            /* On a host-memory backend attention adds into the host array itself. */
            if (be->host_memory) {
                TSR_TRY(tsr__grow_pin(f, &f->scores_host, &f->scores_host_cap, sb));
                scores = f->scores_host;
            } else {
                TSR_TRY(tsr__grow_dev(f, &f->scores_dev, &f->scores_cap, sb));
                TSR_TRY(tsr__grow_pin(f, &f->scores_host, &f->scores_host_cap, sb));
                scores = f->scores_dev;
            }
            TSR_TRY(be->ops->memset(be, scores, 0, sb)); /* attention adds to it */
        }
        tsr_attn_args a = {.q = f->q + row * qd, .q_pos = f->pos + row, .n_q = s->n_tokens,
                           .spans = spans, .n_spans = n_spans, .n_heads = f->nh,
                           .n_kv_heads = f->nkv, .head_dim = c->head_dim,
                           .out = f->att + row * qd, .key_scores = scores};
        int gl = f->sh.layer_begin + layer; /* GPT-OSS: sinks of the local heads, window */
        if (c->attn_sinks) a.sinks = (const float *)f->m->layers[gl].sinks.data + f->sh.head_begin;
        a.window = tsr_config_layer_window(c, gl);
        TSR_TRY(be->ops->attention(be, &a));
        if (scores) {
            if (scores != f->scores_host)
                TSR_TRY(tsr_backend_download(be, f->scores_host, scores, sb));
            TSR_TRY(kv->ops->observe(kv, layer, s->seq, f->scores_host));
        }
        row += s->n_tokens;
    }
    return TSR_OK;
}

/* y[n][dim] = x[n][w.cols] . w^T for a row-parallel w (wo, w_down): the local parts'
 * products summed with every other TP rank's in canonical part order. With `res` (the
 * residual stream), res += that product instead, y unused: in one process on a backend
 * with matmul_parts_acc, the add is the product's epilogue (the same bits: res + sum). */
static tsr_status tsr__row_parallel(tsr_forward *f, const float *x, int64_t n,
                                    const tsr_tensor *w, const int32_t *seg, float *y,
                                    float *res) {
    if (res && f->tp == 1 && f->be->ops->matmul_parts_acc)
        return f->be->ops->matmul_parts_acc(f->be, x, n, w, seg, f->n_parts, res);
    if (res) {
        TSR_TRY(tsr__row_parallel(f, x, n, w, seg, y, NULL));
        return f->be->ops->add(f->be, res, y, n * f->m->cfg.dim);
    }
    const tsr_backend_ops *op = f->be->ops;
    size_t dim = (size_t)f->m->cfg.dim, cols = (size_t)w->cols;
    for (int64_t r0 = 0; r0 < n; r0 += f->row_block) {
        int64_t nr = n - r0 < f->row_block ? n - r0 : f->row_block;
        const float *xr = x + (size_t)r0 * cols;
        float *yr = y + (size_t)r0 * dim;
        if (f->tp == 1) {
            TSR_TRY(op->matmul_parts(f->be, xr, nr, w, seg, f->n_parts, true, yr));
        } else if (f->use_nccl) {
            /* NCCL sums in its own order: equal to one process within rounding only */
            TSR_TRY(op->matmul_parts(f->be, xr, nr, w, seg, f->n_parts, true, yr));
            TSR_TRY(tsr_comm_allreduce_sum_f32(f->comm, TSR_COMM_TP, yr, (size_t)nr * dim));
        } else if (!f->stage) {
            TSR_TRY(op->matmul_parts(f->be, xr, nr, w, seg, f->n_parts, false, f->parts));
            TSR_TRY(tsr_comm_allreduce_sum_f32_parts(f->comm, TSR_COMM_TP, f->parts,
                                                     f->n_parts, (size_t)nr * dim, yr));
        } else {
            /* the parts are [n_parts][nr][dim], packed for this block's nr rows */
            size_t pb = (size_t)f->n_parts * (size_t)nr * dim * sizeof(float);
            TSR_TRY(op->matmul_parts(f->be, xr, nr, w, seg, f->n_parts, false, f->parts));
            TSR_TRY(tsr_backend_download(f->be, f->h_parts, f->parts, pb));
            TSR_TRY(tsr_comm_allreduce_sum_f32_parts(f->comm, TSR_COMM_TP, f->h_parts,
                                                     f->n_parts, (size_t)nr * dim, f->h_y));
            TSR_TRY(tsr_backend_upload(f->be, yr, f->h_y, (size_t)nr * dim * sizeof(float)));
        }
    }
    return TSR_OK;
}

/* Attention of the batch's rows [row0, row0 + n) in the batched step (the step's metadata
 * in backend memory): one call for every sequence. */
static tsr_status tsr__attention_paged(tsr_forward *f, int ll, int64_t row0, int64_t n) {
    float *q = f->q + row0 * f->qd, *att = f->att + row0 * f->qd;
    tsr_attn_paged_args pa = {
        .q = q, .out = att, .n_q = (int)n, .n_heads = f->nh, .n_kv_heads = f->nkv,
        .head_dim = f->m->cfg.head_dim, .lay = f->lay, .q_pos = f->m_pos + row0,
        .q_seq = f->m_seq + row0, .n_keys = f->m_nkeys,
        .tables = f->m_tables + (size_t)ll * f->meta_S * f->meta_MB,
        .n_seqs = f->meta_S, .max_blocks = f->meta_MB};
    return f->be->ops->attention_paged(f->be, &pa);
}

/* xb = rmsnorm(x), y = xb . w^T: one call where the backend has it (rmsnorm_matmul: on
 * CUDA the normed rows go to the GEMM in BF16 with no conversion launch). */
static tsr_status tsr__norm_matmul(tsr_forward *f, const float *x, const tsr_tensor *norm,
                                   int64_t n, float *xb, const tsr_tensor *w, float *y) {
    const tsr_model_config *c = &f->m->cfg;
    const tsr_backend_ops *op = f->be->ops;
    if (op->rmsnorm_matmul)
        return op->rmsnorm_matmul(f->be, x, norm, n, c->dim, c->norm_eps, xb, w, y);
    TSR_TRY(op->rmsnorm(f->be, x, norm, n, c->dim, c->norm_eps, xb));
    return op->matmul(f->be, xb, n, w, y);
}

/* From the residual stream x to its normed rows xb, q rotated and the new K/V rows in the
 * cache, for local layer ll. Fused weights (runtime/model/fuse.h): the norm with one
 * product, then one qkv_rope (bias, q/k norms, both ropes and, batched, the K/V write);
 * otherwise each step its own call. The same bits either way on the CPU backends
 * (tests/unit/test_fuse.c). */
static tsr_status tsr__qkv(tsr_forward *f, const tsr_layer_weights *w, int ll, int64_t row0,
                           int64_t n) {
    const float *x = f->x + row0 * (size_t)f->m->cfg.dim;
    const tsr_model_config *c = &f->m->cfg;
    tsr_backend *be = f->be;
    const tsr_backend_ops *op = be->ops;
    float *xb = f->xb + row0 * (size_t)c->dim;
    float *q = f->q + row0 * f->qd, *k = f->k + row0 * f->kvd, *v = f->v + row0 * f->kvd;
    /* batched: positions and slots from the step's metadata, one call each */
    const int32_t *pos = f->batched ? f->m_pos + row0 : f->pos + row0;
    const int32_t *slots = f->batched ? f->m_slots + (size_t)ll * f->meta_T + row0 : NULL;
    if (tsr__fused_qkv(f, w)) {
        float *qkv = f->qkv + row0 * (f->qd + 2 * f->kvd);
        TSR_TRY(tsr__norm_matmul(f, x, &w->attn_norm, n, xb, &w->wqkv, qkv));
        tsr_qkv_rope_args qa = {
            .qkv = qkv, .n = n, .n_heads = f->nh, .n_kv_heads = f->nkv, .cfg = c, .pos = pos,
            .bias = c->qkv_bias ? &w->bqkv : NULL, .q_norm = c->qk_norm ? &w->q_norm : NULL,
            .k_norm = c->qk_norm ? &w->k_norm : NULL, .q = q,
            .lay = f->batched ? &f->lay : NULL, .slots = slots, .k = k, .v = v};
        return op->qkv_rope(be, &qa);
    }
    TSR_TRY(op->rmsnorm(be, x, &w->attn_norm, n, c->dim, c->norm_eps, xb));
    TSR_TRY(op->matmul(be, xb, n, &w->wq, q));
    TSR_TRY(op->matmul(be, xb, n, &w->wk, k));
    TSR_TRY(op->matmul(be, xb, n, &w->wv, v));
    if (c->qkv_bias) { /* Qwen2, GPT-OSS */
        TSR_TRY(op->bias_add(be, q, &w->bq, n));
        TSR_TRY(op->bias_add(be, k, &w->bk, n));
        TSR_TRY(op->bias_add(be, v, &w->bv, n));
    }
    if (c->qk_norm) { /* Qwen3: each head's row of head_dim is normed on its own */
        TSR_TRY(op->rmsnorm(be, q, &w->q_norm, n * f->nh, c->head_dim, c->norm_eps, q));
        TSR_TRY(op->rmsnorm(be, k, &w->k_norm, n * f->nkv, c->head_dim, c->norm_eps, k));
    }
    TSR_TRY(op->rope(be, q, pos, n, f->nh, c));
    TSR_TRY(op->rope(be, k, pos, n, f->nkv, c));
    if (f->batched) TSR_TRY(op->kv_write(be, &f->lay, slots, n, k, v));
    return TSR_OK;
}

/* This stage's layers for sequences [s0, s1), rows [row0, row0 + n) of the activations. */
static tsr_status tsr__layers(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                              int s0, int s1, int64_t row0, int64_t n) {
    const tsr_model *m = f->m;
    const tsr_model_config *c = &m->cfg;
    tsr_backend *be = f->be;
    const tsr_backend_ops *op = be->ops;
    size_t dim = (size_t)c->dim;
    float *x = f->x + row0 * dim, *xb = f->xb + row0 * dim;
    float *att = f->att + row0 * f->qd;
    float *hb = f->hb + row0 * f->hid, *hb2 = f->hb2 + row0 * f->hid;
    for (int l = f->sh.layer_begin; l < f->sh.layer_end; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        int ll = l - f->sh.layer_begin;
        /* attention block */
        TSR_TRY(tsr__qkv(f, w, ll, row0, n));
        if (f->batched)
            TSR_TRY(tsr__attention_paged(f, ll, row0, n));
        else /* the cache writes the rows and hands out the spans, per sequence */
            TSR_TRY(tsr__attention(f, kv, ll, seqs, s0, s1, row0));
        if (c->o_bias) { /* GPT-OSS: the bias goes in before the residual add */
            TSR_TRY(tsr__row_parallel(f, att, n, &w->wo, f->wo_seg, xb, NULL));
            TSR_TRY(op->bias_add(be, xb, &w->bo, n));
            TSR_TRY(op->add(be, x, xb, n * c->dim));
        } else {
            TSR_TRY(tsr__row_parallel(f, att, n, &w->wo, f->wo_seg, xb, x)); /* x += */
        }
        bool fg = tsr__fused_gu(f, w);
        float *gu = fg ? f->gu + row0 * 2 * (size_t)f->hid : NULL;
        if (fg) /* the norm and the gate/up product */
            TSR_TRY(tsr__norm_matmul(f, x, &w->ffn_norm, n, xb, &w->w_gate_up, gu));
        else
            TSR_TRY(op->rmsnorm(be, x, &w->ffn_norm, n, c->dim, c->norm_eps, xb));
        if (f->moe) { /* GPT-OSS: mixture of experts (runtime/exec/moe.c) */
            const float *y;
            TSR_TRY(tsr_moe_run(f->moe, w, xb, n, &y));
            TSR_TRY(op->add(be, x, y, n * c->dim));
            continue;
        }
        /* SwiGLU MLP block. Fused: the product is in gu; SwiGLU and w_down (+ residual) in
         * one call in one process (on CUDA the SwiGLU rows go to the GEMM in BF16) */
        if (fg && f->tp == 1 && op->swiglu_matmul_acc && op->matmul_parts_acc) {
            TSR_TRY(op->swiglu_matmul_acc(be, gu, n, f->hid, hb, &w->w_down, f->down_seg,
                                          f->n_parts, x)); /* x += */
            continue;
        }
        if (fg) {
            TSR_TRY(op->swiglu_fused(be, gu, n, f->hid, hb));
        } else {
            TSR_TRY(op->matmul(be, xb, n, &w->w_gate, hb));
            TSR_TRY(op->matmul(be, xb, n, &w->w_up, hb2));
            TSR_TRY(op->swiglu(be, hb, hb2, n * f->hid));
        }
        TSR_TRY(tsr__row_parallel(f, hb, n, &w->w_down, f->down_seg, xb, x)); /* x += */
    }
    return TSR_OK;
}

/* Rows of sequences [s0, s1) that need logits, gathered into xl from *nl on (counted
 * only when they are all the rows: the final norm then reads x). */
static tsr_status tsr__gather_logit_rows(tsr_forward *f, const tsr_batch_seq *seqs, int s0,
                                         int s1, int64_t row, int64_t *nl) {
    size_t dim = (size_t)f->m->cfg.dim;
    if (f->logits_all_rows) {
        for (int i = s0; i < s1; i++) *nl += seqs[i].n_tokens;
        return TSR_OK;
    }
    for (int i = s0; i < s1; i++) {
        const tsr_batch_seq *s = &seqs[i];
        if (s->all_logits) {
            TSR_TRY(tsr_backend_copy(f->be, f->xl + *nl * dim, f->x + row * dim,
                                     (size_t)s->n_tokens * dim * 4));
            *nl += s->n_tokens;
        } else if (s->want_logits) {
            TSR_TRY(tsr_backend_copy(f->be, f->xl + *nl * dim,
                                     f->x + (row + s->n_tokens - 1) * dim, dim * 4));
            (*nl)++;
        }
        row += s->n_tokens;
    }
    return TSR_OK;
}

/* Cuts the batch into at most f->micro_batches contiguous groups of sequences with about
 * equal token counts: group g is seqs [cut[g], cut[g+1]). Returns the group count. */
static int tsr__micro_batches(const tsr_forward *f, const tsr_batch_seq *seqs, int n_seqs,
                              int64_t T, int *cut) {
    int M = f->micro_batches < n_seqs ? f->micro_batches : n_seqs;
    if (M < 1) M = 1;
    int g = 0;
    int64_t acc = 0;
    cut[0] = 0;
    for (int i = 0; i < n_seqs && g < M - 1; i++) {
        acc += seqs[i].n_tokens;
        if (acc * M >= T * (g + 1) && i + 1 < n_seqs) cut[++g] = i + 1;
    }
    cut[g + 1] = n_seqs;
    return g + 1;
}

/* The stages, micro-batch by micro-batch: receive (or embed), run the layers, send on (or
 * gather the logit rows). Receives are posted up front and sends are non-blocking, so a
 * stage works on micro-batch i+1 while the next one works on i. */
static tsr_status tsr__pipeline(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                                int n_seqs, int64_t T, int64_t *nl) {
    const tsr_model *m = f->m;
    size_t dim = (size_t)m->cfg.dim;
    int cut[TSR__MAX_MB + 1];
    int64_t row0[TSR__MAX_MB + 1];
    int M = tsr__micro_batches(f, seqs, n_seqs, T, cut);
    row0[0] = 0;
    for (int g = 0; g < M; g++) {
        row0[g + 1] = row0[g];
        for (int i = cut[g]; i < cut[g + 1]; i++) row0[g + 1] += seqs[i].n_tokens;
    }
    bool first = f->sh.first_stage, last = f->sh.last_stage;
    int me = f->comm ? tsr_comm_rank(f->comm, TSR_COMM_PP) : 0;
    tsr_comm_request rq[TSR__MAX_MB], sq[TSR__MAX_MB];
    memset(rq, 0, sizeof rq);
    memset(sq, 0, sizeof sq);
    tsr_status st = TSR_OK;
    if (first) {
        st = f->be->ops->embed(f->be, &m->tok_emb, f->batched ? f->m_ids : f->ids, T, f->x);
    } else {
        /* Staged: each micro-batch's rows arrive in the host buffer's same rows, and are
         * uploaded once received; its send later reuses them (the receive is complete). */
        float *rx = f->stage ? f->h_x : f->x;
        for (int g = 0; g < M && st == TSR_OK; g++)
            st = tsr_comm_irecv(f->comm, TSR_COMM_PP, rx + row0[g] * dim,
                                (size_t)(row0[g + 1] - row0[g]) * dim * 4, me - 1, g, &rq[g]);
    }
    for (int g = 0; g < M && st == TSR_OK; g++) {
        int64_t n = row0[g + 1] - row0[g];
        size_t off = (size_t)row0[g] * dim, bytes = (size_t)n * dim * 4;
        if (!first) st = tsr_comm_wait(f->comm, &rq[g]);
        if (st == TSR_OK && !first && f->stage)
            st = tsr_backend_upload(f->be, f->x + off, f->h_x + off, bytes);
        if (st == TSR_OK) st = tsr__layers(f, kv, seqs, cut[g], cut[g + 1], row0[g], n);
        if (st != TSR_OK) break;
        if (last) {
            st = tsr__gather_logit_rows(f, seqs, cut[g], cut[g + 1], row0[g], nl);
        } else {
            const float *sx = f->x + off;
            if (f->stage) {
                st = tsr_backend_download(f->be, f->h_x + off, f->x + off, bytes);
                sx = f->h_x + off;
            }
            if (st == TSR_OK)
                st = tsr_comm_isend(f->comm, TSR_COMM_PP, sx, bytes, me + 1, g, &sq[g]);
        }
    }
    /* Complete what was started even after a failure: the buffers are ours. A failed rank
     * may leave its peers waiting; the caller's agreement or abort ends the job. */
    for (int g = 0; g < M && f->comm; g++) {
        tsr_status w1 = tsr_comm_wait(f->comm, &sq[g]);
        if (st == TSR_OK) st = w1;
    }
    return st;
}

/* Grows a pinned host buffer to `bytes` (contents lost). */
static tsr_status tsr__grow_pinned(tsr_forward *f, int32_t **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return TSR_OK;
    if (*p) f->be->ops->host_free(f->be, *p);
    *p = NULL;
    *cap = 0;
    TSR_TRY(f->be->ops->host_alloc(f->be, bytes, true, (void **)p));
    *cap = bytes;
    return TSR_OK;
}

/* The batched step's metadata (struct tsr_forward, `batched`), after reserve: asks the
 * cache for every layer's slots and tables (its write bookkeeping), lays them out after
 * the ids, positions, row sequences and key counts in the pinned buffer, and uploads it
 * once. *ok false (nothing uploaded) when the cache declines for some sequence: the
 * per-sequence path then writes every row again through write(), which redoes the same
 * bookkeeping. */
static tsr_status tsr__step_meta(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                                 int S, int64_t T, bool *ok) {
    tsr_backend *be = f->be;
    const int L = kv->n_layers;
    *ok = false;
    TSR_TRY(tsr__grow_host((float **)&f->h_slots, &f->h_slots_cap,
                           (size_t)L * (size_t)T * sizeof(int32_t)));
    size_t nt = (size_t)L * (size_t)S;
    if (nt > f->h_tab_cap) {
        const int32_t **t = tsr_realloc(f->h_tab, nt * sizeof *t);
        if (!t) return TSR_ERR_NOMEM;
        f->h_tab = t;
        int32_t *nb = tsr_realloc(f->h_nb, nt * sizeof *nb);
        if (!nb) return TSR_ERR_NOMEM;
        f->h_nb = nb;
        f->h_tab_cap = nt;
    }
    int32_t MB = 1;
    for (int l = 0; l < L; l++) {
        int64_t row = 0;
        for (int i = 0; i < S; i++) {
            size_t e = (size_t)l * (size_t)S + (size_t)i;
            tsr_status st = kv->ops->write_slots(kv, l, seqs[i].seq, seqs[i].n_tokens,
                                                 f->h_slots + (size_t)l * (size_t)T + row,
                                                 &f->lay, &f->h_tab[e], &f->h_nb[e]);
            if (st == TSR_ERR_UNSUPPORTED) return TSR_OK;
            TSR_TRY(st);
            if (f->h_nb[e] > MB) MB = f->h_nb[e];
            row += seqs[i].n_tokens;
        }
    }
    /* ids[T] pos[T] seq[T] n_keys[S] slots[L][T] tables[L][S][MB] */
    size_t n_ints = 3 * (size_t)T + (size_t)S + (size_t)L * (size_t)T + nt * (size_t)MB;
    size_t bytes = n_ints * sizeof(int32_t);
    TSR_TRY(tsr__grow_pinned(f, &f->h_meta, &f->h_meta_cap, bytes));
    TSR_TRY(tsr__grow_dev(f, (float **)&f->d_meta, &f->d_meta_cap, bytes));
    if (!f->meta_stream) TSR_TRY(be->ops->stream_create(be, &f->meta_stream));
    if (!f->meta_ev) TSR_TRY(be->ops->event_create(be, &f->meta_ev));
    int32_t *h = f->h_meta;
    memcpy(h, f->ids, (size_t)T * sizeof *h);
    memcpy(h + T, f->pos, (size_t)T * sizeof *h);
    int32_t *hs = h + 2 * T, *hk = h + 3 * T, *hl = hk + S, *ht = hl + (size_t)L * T;
    for (int i = 0, row = 0; i < S; i++) {
        for (int32_t j = 0; j < seqs[i].n_tokens; j++) hs[row++] = i;
        hk[i] = kv->ops->seq_len(kv, seqs[i].seq) + seqs[i].n_tokens;
    }
    memcpy(hl, f->h_slots, (size_t)L * (size_t)T * sizeof *hl);
    for (size_t e = 0; e < nt; e++) {
        memcpy(ht + e * (size_t)MB, f->h_tab[e], (size_t)f->h_nb[e] * sizeof *ht);
        memset(ht + e * (size_t)MB + f->h_nb[e], 0, (size_t)(MB - f->h_nb[e]) * sizeof *ht);
    }
    TSR_TRY(be->ops->upload(be, f->d_meta, h, bytes, f->meta_stream));
    TSR_TRY(be->ops->event_record(be, f->meta_ev, f->meta_stream));
    TSR_TRY(be->ops->stream_wait(be, NULL, f->meta_ev));
    const int32_t *d = f->d_meta;
    f->m_ids = d;
    f->m_pos = d + T;
    f->m_seq = d + 2 * T;
    f->m_nkeys = d + 3 * T;
    f->m_slots = f->m_nkeys + S;
    f->m_tables = f->m_slots + (size_t)L * T;
    f->meta_T = (int)T;
    f->meta_S = S;
    f->meta_MB = MB;
    *ok = true;
    return TSR_OK;
}

tsr_status tsr_forward_run(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                           int n_seqs, float *logits, int *n_rows) {
    const tsr_model *m = f->m;
    const tsr_model_config *c = &m->cfg;
    tsr_backend *be = f->be;
    const tsr_backend_ops *op = be->ops;
    *n_rows = 0;

    /* Check the whole batch before touching any state (the same on every rank). */
    if (kv->n_layers != f->sh.layer_end - f->sh.layer_begin || kv->kv_dim != f->kvd)
        return tsr_error_set(TSR_ERR_INVALID, "forward: the KV cache has %d layers of width %d, "
                             "this rank computes %d of width %d", kv->n_layers, kv->kv_dim,
                             f->sh.layer_end - f->sh.layer_begin, f->kvd);
    if (!logits && f->pp > 1 && !f->sample_last)
        return tsr_error_set(TSR_ERR_INVALID, "forward: logits kept on the device need "
                             "sampling on the last stage (tsr_forward_sample_last_stage)");
    int64_t T = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i].n_tokens <= 0)
            return tsr_error_set(TSR_ERR_INVALID, "forward: sequence %d has an empty chunk",
                                 seqs[i].seq);
        T += seqs[i].n_tokens;
        for (int32_t j = 0; j < seqs[i].n_tokens; j++)
            if (seqs[i].tokens[j] < 0 || seqs[i].tokens[j] >= c->vocab_size)
                return tsr_error_set(TSR_ERR_INVALID,
                                     "forward: token id %d out of range [0, %d)",
                                     seqs[i].tokens[j], c->vocab_size);
    }
    if (T == 0) return TSR_OK;
    if (T > f->max_tokens)
        return tsr_error_set(TSR_ERR_INVALID, "forward: %lld tokens exceed the step limit %d",
                             (long long)T, f->max_tokens);
    for (int i = 0; i < n_seqs; i++) {
        int32_t len = kv->ops->seq_len(kv, seqs[i].seq);
        if ((int64_t)len + seqs[i].n_tokens > c->max_seq_len)
            return tsr_error_set(TSR_ERR_BUDGET,
                                 "sequence of %lld tokens exceeds the model context of %d",
                                 (long long)len + seqs[i].n_tokens, c->max_seq_len);
    }
    for (int i = 0; i < n_seqs; i++) TSR_TRY(kv->ops->reserve(kv, seqs[i].seq, seqs[i].n_tokens));

    int64_t row = 0, nl_all = 0;
    f->logits_all_rows = true;
    for (int i = 0; i < n_seqs; i++) {
        int32_t len = kv->ops->seq_len(kv, seqs[i].seq);
        nl_all += seqs[i].all_logits ? seqs[i].n_tokens : seqs[i].want_logits ? 1 : 0;
        if (!seqs[i].all_logits && !(seqs[i].want_logits && seqs[i].n_tokens == 1))
            f->logits_all_rows = false;
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, row++) {
            f->ids[row] = seqs[i].tokens[j];
            f->pos[row] = len + j;
        }
    }

    /* attention_paged has no sinks and no sliding window (GPT-OSS, Mistral): those models
     * take the per-sequence op, which enforces both. */
    f->batched = false;
    if (kv->ops->write_slots && be->ops->attention_paged && !kv->wants_scores &&
        !kv->wants_queries && !kv->wants_attn_input && !c->attn_sinks &&
        c->sliding_window <= 0)
        TSR_TRY(tsr__step_meta(f, kv, seqs, n_seqs, T, &f->batched));

    /* The step's device work (layers, final norm, classifier) as one graph when it reads
     * nothing but backend memory: the batched step of one process with its logits kept for
     * the device sampler. The key names what the recorded launches depend on. */
    const size_t lb_all = (size_t)nl_all * (size_t)c->vocab_size * sizeof(float);
    bool graph = f->batched && f->pp == 1 && f->tp == 1 && !logits && f->logits_all_rows &&
                 nl_all == T && be->ops->graph_begin && be->ops->graph_end;
    bool replayed = false;
    if (graph) {
        TSR_TRY(tsr__grow_dev(f, &f->logits_dev, &f->logits_cap, lb_all));
        uint64_t key = 1469598103934665603ull;
        const uint64_t parts[] = {(uint64_t)T, (uint64_t)n_seqs, (uint64_t)f->meta_MB,
                                  (uint64_t)(uintptr_t)f->d_meta,
                                  (uint64_t)(uintptr_t)f->logits_dev,
                                  (uint64_t)(uintptr_t)f->lay.k};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            key = (key ^ parts[i]) * 1099511628211ull;
        TSR_TRY(be->ops->graph_begin(be, key, &replayed));
    }
    int64_t nl = replayed ? nl_all : 0;
    tsr_status st = replayed ? TSR_OK : tsr__pipeline(f, kv, seqs, n_seqs, T, &nl);

    /* Norm + classifier on the gathered rows only, on the last stage; then every stage
     * gets the logits (every rank samples the same tokens), unless the caller samples on
     * the last stage and shares the ids (tsr_forward_share_tokens). */
    f->logits_rows = 0;
    if (st == TSR_OK && f->sh.last_stage && nl > 0) {
        size_t lb = (size_t)nl * (size_t)c->vocab_size * sizeof(float);
        const float *xn = f->logits_all_rows ? f->x : f->xl;
        if (!replayed) st = op->rmsnorm(be, xn, &m->out_norm, nl, c->dim, c->norm_eps, f->xl);
        if (st != TSR_OK) {
        } else if (!logits) { /* kept in backend memory for tsr_forward_sample */
            st = tsr__grow_dev(f, &f->logits_dev, &f->logits_cap, lb);
            if (st == TSR_OK && !replayed)
                st = op->matmul(be, f->xl, nl, &m->classifier, f->logits_dev);
            if (st == TSR_OK) f->logits_rows = (int)nl;
        } else if (be->host_memory) { /* the caller's buffer is the backend's memory: no copy */
            st = op->matmul(be, f->xl, nl, &m->classifier, logits);
        } else {
            st = tsr__grow_dev(f, &f->logits_dev, &f->logits_cap, lb);
            if (st == TSR_OK) st = op->matmul(be, f->xl, nl, &m->classifier, f->logits_dev);
            if (st == TSR_OK) st = tsr_backend_download(be, logits, f->logits_dev, lb);
        }
    }
    if (graph && !replayed) { /* ended on failure too; the first error wins */
        tsr_status ge = be->ops->graph_end(be);
        if (st == TSR_OK) st = ge;
    }
    TSR_TRY(st);
    for (int i = 0; i < n_seqs; i++)
        TSR_TRY(kv->ops->commit(kv, seqs[i].seq, seqs[i].tokens, seqs[i].n_tokens));

    /* The host waits once per step: for the ids (tsr_forward_sample) when the logits stay
     * on the device, for the logits' download when they come back; otherwise here, so
     * that the call returns with its work done as before. */
    bool waited = f->sh.last_stage && nl > 0 && (!logits || !be->host_memory);
    if (!waited || f->pp > 1) TSR_TRY(op->synchronize(be));
    if (f->pp > 1 && nl_all > 0 && !f->sample_last && logits)
        TSR_TRY(tsr_comm_bcast(f->comm, TSR_COMM_PP, logits,
                               (size_t)nl_all * (size_t)c->vocab_size * sizeof(float), f->pp - 1));
    *n_rows = (int)nl_all;
    return TSR_OK;
}

tsr_status tsr_forward_sample(tsr_forward *f, tsr_sampler *const *samplers, int n_rows,
                              int32_t *ids) {
    tsr_backend *be = f->be;
    const int V = f->m->cfg.vocab_size;
    if (n_rows <= 0) return TSR_OK;
    if (n_rows != f->logits_rows)
        return tsr_error_set(TSR_ERR_INVALID, "forward: %d rows to sample, the last call kept "
                             "%d rows of logits on the device", n_rows, f->logits_rows);
    if (n_rows > f->h_params_cap) {
        if (f->h_params) be->ops->host_free(be, f->h_params);
        f->h_params = NULL;
        f->h_params_cap = 0;
        TSR_TRY(be->ops->host_alloc(be, (size_t)n_rows * sizeof *f->h_params, true,
                                    (void **)&f->h_params));
        f->h_params_cap = n_rows;
    }
    tsr_sample_params *par = f->h_params;
    /* The uniforms come from each request's seeded sampler here, on the host, exactly as
     * tsr_sampler_sample draws them, so the backend picks the host's tokens. */
    for (int i = 0; i < n_rows; i++) tsr_sampler_row_params(samplers[i], &par[i]);
    tsr_status st = TSR_OK;
    if (be->ops->sample) {
        st = be->ops->sample(be, f->logits_dev, n_rows, V, par, ids);
    } else { /* no device sampler: the logits come down and the host draws */
        size_t lb = (size_t)n_rows * (size_t)V * sizeof(float);
        float *h = tsr_malloc(lb);
        tsr_sample_cand *cand = tsr_malloc((size_t)V * sizeof *cand);
        st = h && cand ? tsr_backend_download(be, h, f->logits_dev, lb) : TSR_ERR_NOMEM;
        for (int i = 0; st == TSR_OK && i < n_rows; i++)
            ids[i] = tsr_sample_row(h + (size_t)i * (size_t)V, V, &par[i], cand);
        tsr_free(h);
        tsr_free(cand);
    }
    f->logits_rows = 0; /* the op overwrote them */
    return st;
}
