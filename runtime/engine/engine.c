/* Engine start-up and teardown (runtime/engine/engine.h). */
#include "runtime/engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "runtime/model/fp8.h"
#include "runtime/model/fuse.h"
#include "runtime/model/quantize.h"
#include "base/file.h"
#include "base/log.h"
#include "base/sys.h"
#include "kernels/cpu/quant_blocks.h"
#include "memory/kv_paged.h"
#include "runtime/text/harmony.h"

/* Every rank passes its own status; all get the same answer. */
static tsr_status tsr__agree(tsr_engine *e, tsr_status st) {
    return e->par_.comm ? tsr_comm_agree(e->par_.comm, st) : st;
}

tsr_status tsr_engine_agree(tsr_engine *e, tsr_status st) { return tsr__agree(e, st); }

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
    const bool fused = e->be->ops->qkv_rope && e->be->ops->swiglu_fused;
    TSR_TRY(tsr__place(e, &m->tok_emb, &e->placed_.tok_emb));
    TSR_TRY(tsr__place(e, &m->out_norm, &e->placed_.out_norm));
    if (m->classifier.data == m->tok_emb.data)
        e->placed_.classifier = e->placed_.tok_emb;
    else
        TSR_TRY(tsr__place(e, &m->classifier, &e->placed_.classifier));
    for (int l = 0; l < L; l++) {
        const tsr_layer_weights *h = &m->layers[l];
        tsr_layer_weights *d = &e->placed_.layers[l];
        d->gate_up = h->gate_up; /* shapes; the tensors are placed below */
        d->down = h->down;
        const tsr_tensor *hs[] = {&h->attn_norm, &h->wq,     &h->wk,   &h->wv,    &h->wo,
                                  &h->ffn_norm,  &h->w_gate, &h->w_up, &h->w_down,
                                  &h->bq, &h->bk, &h->bv, &h->q_norm, &h->k_norm,
                                  &h->bo, &h->sinks, &h->router, &h->router_b,
                                  &h->gate_up.w, &h->gate_up.scales, &h->gate_up.bias,
                                  &h->down.w, &h->down.scales, &h->down.bias};
        tsr_tensor *ds[] = {&d->attn_norm, &d->wq,     &d->wk,   &d->wv,    &d->wo,
                            &d->ffn_norm,  &d->w_gate, &d->w_up, &d->w_down,
                            &d->bq, &d->bk, &d->bv, &d->q_norm, &d->k_norm,
                            &d->bo, &d->sinks, &d->router, &d->router_b,
                            &d->gate_up.w, &d->gate_up.scales, &d->gate_up.bias,
                            &d->down.w, &d->down.scales, &d->down.bias};
        /* Fused (runtime/model/fuse.h) on a backend with the fused ops: the forward pass
         * reads the fused tensors only, so they are placed instead of their parts. */
        bool fq = fused && h->wqkv.data, fg = fused && h->w_gate_up.data;
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
            bool part = (fq && (hs[i] == &h->wq || hs[i] == &h->wk || hs[i] == &h->wv ||
                                hs[i] == &h->bq || hs[i] == &h->bk || hs[i] == &h->bv)) ||
                        (fg && (hs[i] == &h->w_gate || hs[i] == &h->w_up));
            if (!part) TSR_TRY(tsr__place(e, hs[i], ds[i]));
        }
        if (fq) TSR_TRY(tsr__place(e, &h->wqkv, &d->wqkv));
        if (fq) TSR_TRY(tsr__place(e, &h->bqkv, &d->bqkv));
        if (fg) TSR_TRY(tsr__place(e, &h->w_gate_up, &d->w_gate_up));
    }
    e->weights = &e->placed_;
    return TSR_OK;
}

/* Re-stores one matrix in `dt` (model-owned memory, the huge-page arena for large ones);
 * the old data stays with its owner (the file mapping, unmapped by a later pack). Empty
 * tensors (layers of other stages) stay empty. */
static tsr_status tsr__convert_tensor(tsr_model *m, tsr_tensor *t, tsr_dtype dt) {
    size_t n = (size_t)t->rows * (size_t)t->cols;
    /* Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (a GGUF's) are kept: already the smaller formats */
    if (t->dtype == dt || t->dtype == TSR_Q8_0 || t->dtype == TSR_Q4_0 || t->dtype == TSR_Q4_1 ||
        t->dtype == TSR_Q4_K || t->dtype == TSR_Q5_K || t->dtype == TSR_Q6_K || !t->data ||
        n == 0)
        return TSR_OK;
    if (t->dtype == TSR_F8_E4M3) return tsr_fp8_dequantize(m, t, dt);
    void *dst;
    TSR_TRY(tsr_model_alloc(m, n * tsr_dtype_size(dt), &dst));
    if (dt == TSR_F32) {
        tsr_dtype_to_f32(t->dtype, t->data, dst, n);
    } else {
        float *row = tsr_malloc((size_t)t->cols * sizeof *row);
        if (!row)
            return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory converting the weights",
                                 m->source);
        for (int64_t r = 0; r < t->rows; r++) {
            tsr_dtype_to_f32(t->dtype, tsr_tensor_row(t, r), row, (size_t)t->cols);
            uint16_t *out = (uint16_t *)dst + (size_t)r * (size_t)t->cols;
            for (int64_t c = 0; c < t->cols; c++)
                out[c] = dt == TSR_BF16 ? tsr_f32_to_bf16(row[c]) : tsr_f32_to_f16(row[c]);
        }
        tsr_free(row);
    }
    t->data = dst;
    t->dtype = dt;
    return TSR_OK;
}

/* The shard's matrices in spec.weights_dtype; norms stay f32, as every loader keeps them.
 * Before packing, so the pack copies nothing that is converted afterwards. */
static tsr_status tsr__convert(tsr_engine *e, const tsr_engine_spec *o) {
    tsr_model *m = e->model;
    if (!o->convert_weights) return TSR_OK;
    tsr_dtype dt = o->weights_dtype;
    if (dt == TSR_F32 || dt == TSR_BF16 || dt == TSR_F16) {
        /* A GGUF's block-quantized matrices stay as they are (tsr__convert_tensor): say so, or a
         * float dtype asked for would seem to be what runs */
        tsr_dtype kept = dt;
        for (int l = 0; l < m->cfg.n_layers && kept == dt; l++) /* layers of other stages: empty */
            if (m->layers[l].wq.data && tsr_qblocks_is(m->layers[l].wq.dtype))
                kept = m->layers[l].wq.dtype;
        if (kept != dt)
            TSR_LOG_WARN("%s: weights in %s asked for, but its %s matrices are kept as stored "
                         "(TSR_GGUF_DEQUANT=1 expands them to f32 at load)",
                         m->source, tsr_dtype_name(dt), tsr_dtype_name(kept));
    }
    if (m->cfg.dtype == dt) return TSR_OK;
    if (e->borrowed_)
        return tsr_error_set(TSR_ERR_INVALID, "engine: a borrowed model is not converted "
                             "(convert_weights)");
    if (dt == TSR_F8_E4M3) return tsr_model_quantize_fp8(m); /* a borrowed model: refused above */
    if (dt == TSR_Q8_0 || dt == TSR_Q4_0 || dt == TSR_Q4_1) {
        /* FP8 matrices first: the quantizers read 16- and 32-bit ones */
        TSR_TRY(tsr_model_fp8_to_q8(m, dt == TSR_Q8_0 ? "--dtype q8_0" : "--dtype q4_*"));
        return tsr_model_quantize(m, dt); /* runtime/model/quantize.h */
    }
    bool tied = m->classifier.data && m->classifier.data == m->tok_emb.data;
    TSR_TRY(tsr__convert_tensor(m, &m->tok_emb, dt));
    if (tied)
        m->classifier = m->tok_emb;
    else
        TSR_TRY(tsr__convert_tensor(m, &m->classifier, dt));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        tsr_tensor *ts[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            TSR_TRY(tsr__convert_tensor(m, ts[i], dt));
    }
    m->cfg.dtype = dt;
    return TSR_OK;
}

/* Host-memory backends: the weights (this rank's shard) leave the file mapping for huge
 * pages, because decode streams them every token; info level says how much of the process
 * the kernel backed with huge pages. */
static tsr_status tsr__pack(tsr_engine *e, const tsr_engine_spec *o) {
    if (!o->pack_weights || e->borrowed_ || !e->be->host_memory) return TSR_OK;
    TSR_TRY(tsr__agree(e, tsr_model_pack(e->model)));
    int64_t huge = tsr_sys_anon_huge_bytes();
    double mib = (double)tsr_model_weight_bytes(e->model) / 1048576.0;
    /* Large weights with no huge page at all: THP is off ("never") on this node. */
    bool thp_off = huge == 0 && mib >= 64.0;
    int rank = e->par_.comm ? tsr_comm_world_rank(e->par_.comm) : 0;
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

/* A user message rendered with the model's own chat template (generation prompt on); a
 * GPT-OSS model without one gets the built-in harmony template (runtime/text/harmony.h). */
static tsr_status tsr__chat_prompt(const char *model_path, const tsr_model_config *c,
                                   const char *text, char **out, size_t *len) {
    tsr_chat_template t;
    TSR_TRY(tsr_model_chat_template(model_path, &t));
    tsr_status st = TSR_OK;
    if (t.kind == TSR_CHAT_NONE && c->arch == TSR_ARCH_GPT_OSS) st = tsr_harmony_template(&t);
    if (t.kind == TSR_CHAT_NONE)
        st = tsr_error_set(TSR_ERR_INVALID, "%s: the model has no chat template (--chat needs "
                           "one; give the formatted prompt without --chat)",
                           model_path ? model_path : "model");
    tsr_chat_message msg = {.role = "user", .content = text};
    if (st == TSR_OK) st = tsr_chat_render(&t, &msg, 1, out, len);
    tsr_chat_template_free(&t);
    return st;
}

/* spec.model_path; a synthetic shape is made in spec.weights_dtype when the path names no
 * dtype, so that no conversion doubles its memory. */
static tsr_status tsr__load_model(const tsr_engine_spec *o, tsr_model **out) {
    const char *path = o->model_path;
    if (!o->convert_weights || !path || strncmp(path, "synthetic:", 10) != 0 ||
        strstr(path, ",dtype="))
        return tsr_model_load(path, out);
    /* q8_0, q4_*, fp8: made in bf16; q8_0 and q4_* quantized after the shard cut
     * (tsr__convert), fp8 before it (tsr__load) */
    tsr_dtype wd = o->weights_dtype;
    bool quant = wd == TSR_Q8_0 || wd == TSR_Q4_0 || wd == TSR_Q4_1 || wd == TSR_F8_E4M3;
    const char *dt = tsr_dtype_name(quant ? TSR_BF16 : wd);
    size_t len = strlen(path) + strlen(",dtype=") + strlen(dt) + 1;
    char *spec = tsr_malloc(len);
    if (!spec) return TSR_ERR_NOMEM;
    snprintf(spec, len, "%s,dtype=%s", path, dt);
    tsr_status st = tsr_model_load(spec, out);
    tsr_free(spec);
    return st;
}

/* Step 2, local (the caller agrees): the prompt's text, the model, its tokenizer, the
 * prompt's ids and the context, in the order a user fixes them. */
static tsr_status tsr__load(tsr_engine *e, const tsr_engine_spec *o) {
    const tsr_engine_prompt *p = &o->prompt;
    char *buf = NULL;
    const char *text = p->text;
    size_t text_len = text ? strlen(text) : 0;
    bool prompt = p->text || p->file;
    if (p->file) {
        TSR_TRY(tsr_file_read(p->file, "prompt file", 0, &buf, &text_len));
        text = buf;
    }
    tsr_status st = TSR_OK;
    if (prompt && text_len == 0)
        st = tsr_error_set(TSR_ERR_INVALID, "%s: empty prompt", p->file ? p->file : "--prompt");
    if (st == TSR_OK && !e->model) st = tsr__load_model(o, &e->model);
    const tsr_model_config *c = e->model ? &e->model->cfg : NULL;
    if (st == TSR_OK && prompt && p->chat) { /* the text becomes the rendered conversation */
        char *rendered = NULL;
        st = tsr__chat_prompt(o->model_path, c, text, &rendered, &text_len);
        tsr_free(buf);
        buf = rendered;
        text = rendered;
    }
    if (st == TSR_OK && o->config_out) *o->config_out = *c;
    if (st == TSR_OK && o->model_loaded) o->model_loaded(o->model_loaded_ctx, e->model);
    /* fp8: before the shard cut, so that a row's scale covers the whole row whatever tp
     * cuts its columns into (runtime/model/fp8.h); tsr__convert then has nothing to do */
    if (st == TSR_OK && o->convert_weights && o->weights_dtype == TSR_F8_E4M3 &&
        e->model->cfg.dtype != TSR_F8_E4M3 && !e->borrowed_)
        st = tsr_model_quantize_fp8(e->model);
    if (st == TSR_OK && o->min_context > c->max_seq_len)
        st = tsr_error_set(TSR_ERR_BUDGET, "%s holds %d positions, fewer than the %d this job "
                           "needs", e->model->source ? e->model->source : "the model",
                           c->max_seq_len, o->min_context);
    if (st == TSR_OK && o->load_tokenizer)
        st = tsr_tokenizer_for_model(o->model_path, o->tokenizer_path, c->vocab_size, &e->tok);
    if (st == TSR_OK)
        e->ctx = o->kv.max_context > 0 && o->kv.max_context < c->max_seq_len ? o->kv.max_context
                                                                            : c->max_seq_len;
    if (st == TSR_OK && o->one_sequence && e->max_tokens > e->ctx) e->max_tokens = e->ctx;
    if (st == TSR_OK && prompt && !e->tok)
        st = tsr_error_set(TSR_ERR_INVALID, "a prompt needs the tokenizer (load_tokenizer)");
    if (st == TSR_OK && prompt)
        st = tsr_tokenizer_encode(e->tok, text, text_len,
                                  !p->no_bos && !p->chat && e->tok->bos_id >= 0,
                                  false, &e->prompt_ids, &e->n_prompt);
    tsr_free(buf);
    TSR_TRY(st);
    if (!prompt) return TSR_OK;
    if (e->n_prompt == 0) return tsr_error_set(TSR_ERR_INVALID, "prompt encodes to no tokens");
    if ((int64_t)e->n_prompt >= e->ctx)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "prompt of %zu tokens does not fit the context of %d tokens "
                             "(leaves no room to generate; see --max-context)",
                             e->n_prompt, e->ctx);
    if ((size_t)e->max_tokens > e->n_prompt) e->max_tokens = (int)e->n_prompt;
    return TSR_OK;
}

/* spec.kv_blocks blocks per layer of this rank's paged pool, in bytes (as tsr_kv_setup
 * counts a block: the policy's declaration says whether it keeps scores). */
static int64_t tsr__pool_bytes(const tsr_kv_options *kvo, const tsr_model_config *c,
                               int64_t blocks) {
    const tsr_kv_policy_decl *pol = kvo->policy ? kvo->policy : tsr_kv_policy_default();
    const tsr_parallel_shard *sh = kvo->shard;
    int layers = sh ? sh->layer_end - sh->layer_begin : c->n_layers;
    tsr_kv_paged_config kc = {.n_kv_heads = sh ? sh->kv_head_end - sh->kv_head_begin
                                               : c->n_kv_heads,
                              .head_dim = c->head_dim, .block_size = kvo->block_size,
                              .keep_scores = pol->reads_scores};
    return blocks * layers * tsr_kv_paged_block_bytes(&kc);
}

/* Steps 1 to 4: the job, the model, its shard and this rank's place. */
static tsr_status tsr__job(tsr_engine *e, const tsr_engine_spec *o) {
    e->par_ = o->par;
    if (!o->distributed) {
        e->dist.world = 1;
        e->dist.local_rank = o->local_rank;
        return tsr__agree(e, tsr__load(e, o));
    }
    tsr_dist *d = &e->dist;
    e->dist_started_ = true;
    TSR_TRY(tsr_dist_start(d));
    if (o->rank_out) *o->rank_out = d->rank;
    e->par_.comm = d->comm; /* agreements from here on */
    TSR_TRY(tsr__agree(e, tsr__load(e, o)));
    TSR_TRY(tsr_dist_layout(d, &o->dist, e->model, o->model_path ? o->model_path : "the model"));
    if (e->threads <= 0) e->threads = tsr_dist_default_threads(d);
    TSR_TRY(tsr__agree(e, tsr_dist_place(d, o->dist.bind, o->backend)));
    e->par_ = tsr_dist_forward(d);
    return TSR_OK;
}

static tsr_status tsr__start(tsr_engine *e, const tsr_engine_spec *o) {
    TSR_TRY(tsr__job(e, o));
    TSR_TRY(tsr__agree(e, tsr__convert(e, o)));
    if (o->backend_given) {
        e->be = o->backend_given;
    } else {
        TSR_TRY(tsr__agree(e, tsr_backend_create_local(o->backend, e->threads, e->dist.local_rank,
                                                       &e->be)));
    }
    e->device_base_ = tsr__device_used(e->be);
    /* FP8 matrices stay FP8 only where the backend computes with them (runtime/model/fp8.h) */
    if (!e->be->fp8_weights && !e->borrowed_) {
        char why[96];
        snprintf(why, sizeof why, "the %s backend computes no FP8", e->be->ops->name);
        TSR_TRY(tsr__agree(e, tsr_model_fp8_to_q8(e->model, why)));
    }
    /* a GGUF's 3- to 6-bit matrices likewise stay in their blocks only where the backend has
     * kernels for them (runtime/model/quantize.h); TSR_GGUF_Q8=1 requantizes them on any
     * backend, so that a CPU run computes with the weights a CUDA run has (comparisons) */
    const char *gq8 = getenv("TSR_GGUF_Q8");
    bool forced = gq8 && !strcmp(gq8, "1");
    if ((!e->be->gguf_blocks || forced) && !e->borrowed_) {
        char why[96];
        if (forced) snprintf(why, sizeof why, "TSR_GGUF_Q8=1");
        else snprintf(why, sizeof why, "the %s backend has no kernels for them", e->be->ops->name);
        TSR_TRY(tsr__agree(e, tsr_model_blocks_to_q8(e->model, why)));
    }
    /* Under a quantized --dtype every product takes 8-bit activations: MXFP4 experts too,
     * where the backend has their integer kernels (runtime/model/quantize.h), unless
     * TSR_MXFP4_F32=1 keeps their f32 kernel (to compare the two) */
    tsr_dtype mdt = e->model->cfg.dtype;
    const char *mx_f32 = getenv("TSR_MXFP4_F32");
    if (e->be->mxfp4_packed && !e->borrowed_ && !(mx_f32 && !strcmp(mx_f32, "1")) &&
        (mdt == TSR_Q8_0 || mdt == TSR_Q4_0 || mdt == TSR_Q4_1))
        TSR_TRY(tsr__agree(e, tsr_model_pack_experts(e->model)));
    /* The activations' data plane follows the backend (collective, same answer on every
     * rank: tsr_dist_data_plane). */
    if (o->distributed) TSR_TRY(tsr_dist_data_plane(&e->dist, e->be, o->kv.policy));
    if (!o->no_fuse && e->be->ops->qkv_rope && e->be->ops->swiglu_fused)
        TSR_TRY(tsr__agree(e, tsr_model_fuse(e->model)));
    TSR_TRY(tsr__pack(e, o));
    if (!e->borrowed_) tsr_model_trim(e->model); /* the weights are final from here */
    TSR_TRY(tsr__agree(e, tsr__place_weights(e)));
    const tsr_model_config *c = &e->model->cfg;
    tsr_kv_options kvo = o->kv;
    if (o->distributed) tsr_dist_kv_options(&e->dist, &kvo);
    kvo.be = e->be;
    kvo.model = e->model; /* host weights (offload's skew) */
    kvo.max_context = e->ctx;
    if (o->one_sequence || o->prompt.text || o->prompt.file) kvo.chunk_tokens = e->max_tokens;
    if (o->kv_blocks > 0) kvo.memory_bytes = tsr__pool_bytes(&kvo, c, o->kv_blocks);
    int kv_dtype = TSR_KV_F32;
    tsr_status st = tsr_kv_dtype_resolve(&kvo, &kv_dtype);
    if (st == TSR_OK && o->dense_kv_tokens > 0)
        st = tsr_kv_dense_create_dtype(e->be, c->n_layers, c->n_kv_heads, c->head_dim,
                                       o->dense_kv_tokens, kvo.max_seqs > 0 ? kvo.max_seqs : 1,
                                       kv_dtype, &e->kv);
    else if (st == TSR_OK)
        st = tsr_kv_setup(&kvo, c, &e->kv);
    TSR_TRY(tsr__agree(e, st));
    const tsr_forward_parallel *par = e->par_.comm ? &e->par_ : NULL;
    TSR_TRY(tsr__agree(e, tsr_forward_create_parallel(e->weights, e->be, e->max_tokens, par,
                                                      &e->fwd)));
    if (o->distributed) tsr_dist_ready(&e->dist);
    return TSR_OK;
}

void tsr_engine_spec_dtype(tsr_engine_spec *spec, const char *dtype) {
    if (!dtype) return;
    spec->convert_weights = true;
    spec->weights_dtype = (tsr_dtype)tsr_dtype_parse(dtype);
}

tsr_status tsr_engine_create(const tsr_engine_spec *spec, tsr_engine **out) {
    *out = NULL;
    if (spec->rank_out) *spec->rank_out = 0;
    if (spec->config_out) *spec->config_out = (tsr_model_config){0};
    tsr_engine *e = tsr_calloc(1, sizeof *e);
    if (!e) {
        if (!spec->borrow_model) tsr_model_destroy(spec->model);
        tsr_backend_destroy(spec->backend_given);
        return TSR_ERR_NOMEM;
    }
    e->model = spec->model;
    e->borrowed_ = spec->model && spec->borrow_model;
    e->threads = spec->threads;
    e->max_tokens = spec->max_tokens;
    tsr_status st = spec->model || spec->model_path
                        ? TSR_OK
                        : tsr_error_set(TSR_ERR_INVALID, "engine: no model given");
    if (st == TSR_OK) st = tsr__start(e, spec);
    if (st != TSR_OK) {
        if (!e->be) tsr_backend_destroy(spec->backend_given); /* taken over whatever happens */
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
    tsr_free(e->prompt_ids);
    if (e->tok) tsr_tokenizer_destroy(e->tok);
    if (!e->borrowed_) tsr_model_destroy(e->model);
    if (e->dist_started_) tsr_dist_end(&e->dist); /* the comm last: MPI finalizes */
    tsr_free(e);
}

const char *tsr_engine_device_name(const tsr_engine *e) {
    tsr_backend *be = e->be;
    const char *n = be->ops->device_name ? be->ops->device_name(be) : NULL;
    return n ? n : be->ops->name;
}
