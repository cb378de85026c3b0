/* Engine start-up and teardown (runtime/engine.h). */
#include "runtime/engine.h"

#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"

static tsr_status tsr__agree(const tsr_engine_options *o, tsr_status st) {
    return o->par.comm ? tsr_comm_agree(o->par.comm, st) : st;
}

static tsr_status tsr__keep_buffer(tsr_engine *e, void *p) {
    if (e->n_bufs_ == e->cap_bufs_) {
        int cap = e->cap_bufs_ ? 2 * e->cap_bufs_ : 32;
        void **b = tsr_realloc(e->bufs_, (size_t)cap * sizeof *b);
        if (!b) return TSR_ERR_NOMEM;
        e->bufs_ = b;
        e->cap_bufs_ = cap;
    }
    e->bufs_[e->n_bufs_++] = p;
    return TSR_OK;
}

static tsr_status tsr__place(tsr_engine *e, const tsr_tensor *host, tsr_tensor *dev) {
    bool copied = false;
    TSR_TRY(tsr_backend_place_tensor(e->be, host, dev, &copied));
    if (!copied) return TSR_OK;
    tsr_status st = tsr__keep_buffer(e, (void *)dev->data);
    if (st != TSR_OK) {
        e->be->ops->buffer_free(e->be, (void *)dev->data);
        return st;
    }
    e->placed_bytes += tsr_tensor_bytes(host);
    return TSR_OK;
}

/* The model's tensors in backend memory, once: the placed model shares the host model's
 * config and views only, with its own layer array (never destroyed as a model). A tied
 * classifier stays tied. Layers of other stages are empty tensors and stay so. */
static tsr_status tsr__place_weights(tsr_engine *e) {
    const tsr_model *m = e->model;
    if (e->be->host_memory) {
        e->weights = m;
        return TSR_OK;
    }
    int L = m->cfg.n_layers;
    e->placed_ = *m;
    e->placed_.resources = NULL;
    e->placed_.arena_next = NULL;
    e->placed_.arena_left = 0;
    e->placed_.layers = tsr_calloc((size_t)(L > 0 ? L : 1), sizeof *e->placed_.layers);
    if (!e->placed_.layers) return TSR_ERR_NOMEM;
    TSR_TRY(tsr__place(e, &m->tok_emb, &e->placed_.tok_emb));
    TSR_TRY(tsr__place(e, &m->out_norm, &e->placed_.out_norm));
    if (m->classifier.data == m->tok_emb.data)
        e->placed_.classifier = e->placed_.tok_emb;
    else
        TSR_TRY(tsr__place(e, &m->classifier, &e->placed_.classifier));
    for (int l = 0; l < L; l++) {
        const tsr_layer_weights *h = &m->layers[l];
        tsr_layer_weights *d = &e->placed_.layers[l];
        const tsr_tensor *hs[] = {&h->attn_norm, &h->wq,     &h->wk,   &h->wv,    &h->wo,
                                  &h->ffn_norm,  &h->w_gate, &h->w_up, &h->w_down};
        tsr_tensor *ds[] = {&d->attn_norm, &d->wq,     &d->wk,   &d->wv,    &d->wo,
                            &d->ffn_norm,  &d->w_gate, &d->w_up, &d->w_down};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) TSR_TRY(tsr__place(e, hs[i], ds[i]));
    }
    e->weights = &e->placed_;
    return TSR_OK;
}

/* Host-memory backends: the weights (this rank's shard) leave the file mapping for huge
 * pages, because decode streams them every token; info level says how much of the process
 * the kernel backed with huge pages. */
static tsr_status tsr__pack(tsr_engine *e, const tsr_engine_options *o) {
    if (!o->pack_weights || o->borrow_model || !e->be->host_memory) return TSR_OK;
    TSR_TRY(tsr__agree(o, tsr_model_pack(e->model)));
    int64_t huge = tsr_sys_anon_huge_bytes();
    double mib = (double)tsr_model_weight_bytes(e->model) / 1048576.0;
    /* Large weights with no huge page at all: THP is off ("never") on this node. */
    bool thp_off = huge == 0 && mib >= 64.0;
    int rank = o->par.comm ? tsr_comm_world_rank(o->par.comm) : 0;
    TSR_LOG_INFO("rank %d: weights %.1f MiB in memory, %s%.1f MiB of the process in "
                 "transparent huge pages%s",
                 rank, mib, huge < 0 ? "? " : "", huge < 0 ? 0.0 : (double)huge / 1048576.0,
                 thp_off ? " (THP off? decode reads 4 KiB pages: see docs/perf.md)" : "");
    return TSR_OK;
}

/* Bytes of backend memory in use by the backend's own count (0 on a host-memory backend,
 * or when it cannot say). */
static int64_t tsr__device_used(tsr_backend *be) {
    size_t free_b = 0, total_b = 0;
    if (be->host_memory || !be->ops->memory || be->ops->memory(be, &free_b, &total_b) != TSR_OK ||
        free_b > total_b)
        return 0;
    return (int64_t)(total_b - free_b);
}

int64_t tsr_engine_device_bytes(const tsr_engine *e) {
    int64_t used = tsr__device_used(e->be) - e->device_base_;
    return used > 0 ? used : 0;
}

static tsr_status tsr__start(tsr_engine *e, const tsr_engine_options *o) {
    if (o->backend_given)
        e->be = o->backend_given;
    else
        TSR_TRY(tsr__agree(o, tsr_backend_create_local(o->backend, o->threads, o->local_rank,
                                                       &e->be)));
    e->device_base_ = tsr__device_used(e->be);
    if (o->on_backend) TSR_TRY(o->on_backend(o->on_backend_ctx, e->be));
    TSR_TRY(tsr__pack(e, o));
    TSR_TRY(tsr__agree(o, tsr__place_weights(e)));
    const tsr_model_config *c = &e->model->cfg;
    tsr_kv_options kvo = o->kv;
    kvo.be = e->be;
    kvo.model = e->model; /* host weights (offload's skew) */
    tsr_status st;
    if (o->dense_kv_tokens > 0)
        st = tsr_kv_dense_create(e->be, c->n_layers, c->n_kv_heads, c->head_dim, o->dense_kv_tokens,
                                 kvo.max_seqs > 0 ? kvo.max_seqs : 1, &e->kv);
    else
        st = tsr_kv_setup(&kvo, c, &e->kv);
    TSR_TRY(tsr__agree(o, st));
    const tsr_forward_parallel *par = o->par.comm ? &o->par : NULL;
    return tsr__agree(o, tsr_forward_create_parallel(e->weights, e->be, o->max_tokens, par,
                                                     &e->fwd));
}

tsr_status tsr_engine_create(tsr_model *model, const tsr_engine_options *o, tsr_engine **out) {
    *out = NULL;
    tsr_engine *e = tsr_calloc(1, sizeof *e);
    if (!e) {
        if (!o->borrow_model) tsr_model_destroy(model);
        tsr_backend_destroy(o->backend_given);
        return TSR_ERR_NOMEM;
    }
    e->model = model;
    e->borrowed_ = o->borrow_model;
    tsr_status st = tsr__start(e, o);
    if (st != TSR_OK) {
        tsr_engine_destroy(e);
        return st;
    }
    *out = e;
    return TSR_OK;
}

void tsr_engine_destroy(tsr_engine *e) {
    if (!e) return;
    tsr_forward_destroy(e->fwd);
    tsr_kv_cache_destroy(e->kv);
    for (int i = 0; i < e->n_bufs_; i++) e->be->ops->buffer_free(e->be, e->bufs_[i]);
    tsr_free(e->bufs_);
    tsr_free(e->placed_.layers);
    tsr_backend_destroy(e->be);
    if (!e->borrowed_) tsr_model_destroy(e->model);
    tsr_free(e);
}

const char *tsr_engine_device_name(const tsr_engine *e) {
    tsr_backend *be = e->be;
    const char *n = be->ops->device_name ? be->ops->device_name(be) : NULL;
    return n ? n : be->ops->name;
}
