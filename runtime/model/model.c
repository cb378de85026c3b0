#define _DEFAULT_SOURCE /* munmap of file mappings */
#include "runtime/model/model.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "runtime/format/gguf.h"
#include "runtime/model/loader.h"

struct tsr_model_resource {
    void *addr;
    size_t len; /* 0: a tsr_malloc buffer, else a mapping of len bytes */
    bool huge;  /* the mapping is a weight arena chunk (tsr_malloc_huge), not a model file */
    tsr_model_resource *next;
};

tsr_status tsr_model_create(const char *source, const tsr_model_config *cfg, tsr_model **out) {
    *out = NULL;
    tsr_model *m = tsr_calloc(1, sizeof *m);
    if (!m) return TSR_ERR_NOMEM;
    m->cfg = *cfg;
    m->source = tsr_strdup(source ? source : "?");
    m->layers = tsr_calloc((size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1), sizeof *m->layers);
    if (!m->source || !m->layers) {
        tsr_model_destroy(m);
        return TSR_ERR_NOMEM;
    }
    *out = m;
    return TSR_OK;
}

void tsr_model_destroy(tsr_model *m) {
    if (!m) return;
    tsr_model_resource *r = m->resources;
    while (r) {
        tsr_model_resource *next = r->next;
        if (r->huge)
            tsr_free_huge(r->addr, r->len);
        else if (r->len)
            munmap(r->addr, r->len);
        else
            tsr_free(r->addr);
        tsr_free(r);
        r = next;
    }
    tsr_free(m->layers);
    tsr_free(m->source);
    tsr_free(m);
}

/* A mapping of a model file: tensors may view it. */
static bool tsr__is_file_map(const tsr_model_resource *r) { return r->len && !r->huge; }

static tsr_status tsr__own(tsr_model *m, void *addr, size_t len, bool huge) {
    tsr_model_resource *r = tsr_malloc(sizeof *r);
    if (!r) return TSR_ERR_NOMEM;
    r->addr = addr;
    r->len = len;
    r->huge = huge;
    r->next = m->resources;
    m->resources = r;
    return TSR_OK;
}

tsr_status tsr_model_own_mmap(tsr_model *m, void *addr, size_t len) {
    return tsr__own(m, addr, len ? len : 1, false);
}

tsr_status tsr_model_own_buffer(tsr_model *m, void *ptr) {
    return tsr__own(m, ptr, 0, false);
}

/* Weights are read once per decoded token, front to back: a memory stream, which reads
 * faster from 2 MiB pages (tsr_malloc_huge; measured in docs/perf.md). So tensors of at
 * least TSR__ARENA_MIN bytes are carved, 4 KiB-aligned and back to back, from huge-page
 * chunks; small tensors (norms) stay on the heap. */
#define TSR__ARENA_MIN ((size_t)256 << 10)
#define TSR__ARENA_CHUNK ((size_t)64 << 20)

static tsr_status tsr__arena_chunk(tsr_model *m, size_t need) {
    tsr_model_trim(m); /* the chunk left behind keeps only what it holds */
    size_t len = need > TSR__ARENA_CHUNK ? need : TSR__ARENA_CHUNK;
    char *base = tsr_malloc_huge(len);
    if (!base)
        return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory mapping %zu bytes of weights",
                             m->source, len);
    tsr_status st = tsr__own(m, base, len, true);
    if (st != TSR_OK) {
        tsr_free_huge(base, len);
        return st;
    }
    m->arena_next = base;
    m->arena_left = len;
    return TSR_OK;
}

void tsr_model_trim(tsr_model *m) {
    /* The first write into a chunk's 2 MiB page faults in the whole page, so up to 2 MiB
     * past the last tensor are resident with nothing in them. The tail stays usable: a
     * later tensor there faults its pages in again. */
    tsr_pages_drop(m->arena_next, m->arena_left);
}

tsr_status tsr_model_alloc(tsr_model *m, size_t bytes, void **out) {
    *out = NULL;
    if (bytes >= TSR__ARENA_MIN) {
        size_t need = (bytes + 4095) & ~(size_t)4095;
        if (m->arena_left < need) TSR_TRY(tsr__arena_chunk(m, need));
        *out = m->arena_next;
        m->arena_next += need;
        m->arena_left -= need;
        return TSR_OK;
    }
    void *p = tsr_malloc_aligned(bytes ? bytes : 1);
    if (!p) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory allocating %zu bytes",
                                 m->source, bytes);
    tsr_status st = tsr_model_own_buffer(m, p);
    if (st != TSR_OK) {
        tsr_free(p);
        return st;
    }
    *out = p;
    return TSR_OK;
}

static tsr_status tsr__check_tensor(const tsr_model *m, const tsr_tensor *t, const char *name,
                                    int layer, int64_t rows, int64_t cols) {
    char where[64] = "";
    if (layer >= 0) snprintf(where, sizeof where, " of layer %d", layer);
    if (!t->data)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: missing tensor %s%s", m->source, name, where);
    if (t->rows != rows || t->cols != cols)
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: tensor %s%s has shape [%lld, %lld], expected [%lld, %lld]",
                             m->source, name, where, (long long)t->rows, (long long)t->cols,
                             (long long)rows, (long long)cols);
    return TSR_OK;
}

/* GPT-OSS: o bias, sinks, router and the two expert projections of layer l. */
static tsr_status tsr__check_experts(const tsr_model *m, const tsr_layer_weights *w, int l) {
    const tsr_model_config *c = &m->cfg;
    int64_t E = c->n_experts;
    if (c->o_bias) TSR_TRY(tsr__check_tensor(m, &w->bo, "o_proj bias", l, 1, c->dim));
    if (c->attn_sinks) TSR_TRY(tsr__check_tensor(m, &w->sinks, "sinks", l, 1, c->n_heads));
    TSR_TRY(tsr__check_tensor(m, &w->router, "router", l, E, c->dim));
    TSR_TRY(tsr__check_tensor(m, &w->router_b, "router bias", l, 1, E));
    const tsr_experts *ex[2] = {&w->gate_up, &w->down};
    const char *nm[2] = {"gate_up_proj", "down_proj"};
    int64_t rows[2] = {2 * (int64_t)c->hidden_dim, c->dim}, cols[2] = {c->dim, c->hidden_dim};
    for (int i = 0; i < 2; i++) {
        const tsr_experts *x = ex[i];
        if (x->n != E || x->rows != rows[i] || x->cols != cols[i])
            return tsr_error_set(TSR_ERR_FORMAT, "%s: experts %s of layer %d are %d of [%lld, "
                                 "%lld], expected %lld of [%lld, %lld]", m->source, nm[i], l,
                                 x->n, (long long)x->rows, (long long)x->cols, (long long)E,
                                 (long long)rows[i], (long long)cols[i]);
        int64_t wc = x->mxfp4 ? cols[i] / 2 : cols[i];
        TSR_TRY(tsr__check_tensor(m, &x->w, nm[i], l, E * rows[i], wc));
        if (x->mxfp4)
            TSR_TRY(tsr__check_tensor(m, &x->scales, "expert scales", l, E * rows[i],
                                      cols[i] / 32));
        TSR_TRY(tsr__check_tensor(m, &x->bias, "expert bias", l, E, rows[i]));
    }
    return TSR_OK;
}

tsr_status tsr_model_check(const tsr_model *m) {
    const tsr_model_config *c = &m->cfg;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    TSR_TRY(tsr__check_tensor(m, &m->tok_emb, "token embedding", -1, c->vocab_size, c->dim));
    TSR_TRY(tsr__check_tensor(m, &m->out_norm, "final norm", -1, 1, c->dim));
    TSR_TRY(tsr__check_tensor(m, &m->classifier, "classifier", -1, c->vocab_size, c->dim));
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        TSR_TRY(tsr__check_tensor(m, &w->attn_norm, "attention norm", l, 1, c->dim));
        TSR_TRY(tsr__check_tensor(m, &w->wq, "q_proj", l, q, c->dim));
        TSR_TRY(tsr__check_tensor(m, &w->wk, "k_proj", l, kv, c->dim));
        TSR_TRY(tsr__check_tensor(m, &w->wv, "v_proj", l, kv, c->dim));
        TSR_TRY(tsr__check_tensor(m, &w->wo, "o_proj", l, c->dim, q));
        TSR_TRY(tsr__check_tensor(m, &w->ffn_norm, "mlp norm", l, 1, c->dim));
        if (c->n_experts > 0) {
            TSR_TRY(tsr__check_experts(m, w, l));
        } else {
            TSR_TRY(tsr__check_tensor(m, &w->w_gate, "gate_proj", l, c->hidden_dim, c->dim));
            TSR_TRY(tsr__check_tensor(m, &w->w_up, "up_proj", l, c->hidden_dim, c->dim));
            TSR_TRY(tsr__check_tensor(m, &w->w_down, "down_proj", l, c->dim, c->hidden_dim));
        }
        if (c->qkv_bias) {
            TSR_TRY(tsr__check_tensor(m, &w->bq, "q_proj bias", l, 1, q));
            TSR_TRY(tsr__check_tensor(m, &w->bk, "k_proj bias", l, 1, kv));
            TSR_TRY(tsr__check_tensor(m, &w->bv, "v_proj bias", l, 1, kv));
            if (w->bq.dtype != TSR_F32 || w->bk.dtype != TSR_F32 || w->bv.dtype != TSR_F32)
                return tsr_error_set(TSR_ERR_INTERNAL, "%s: biases of layer %d not f32",
                                     m->source, l);
        }
        if (c->qk_norm) {
            TSR_TRY(tsr__check_tensor(m, &w->q_norm, "q_norm", l, 1, c->head_dim));
            TSR_TRY(tsr__check_tensor(m, &w->k_norm, "k_norm", l, 1, c->head_dim));
            if (w->q_norm.dtype != TSR_F32 || w->k_norm.dtype != TSR_F32)
                return tsr_error_set(TSR_ERR_INTERNAL, "%s: q/k norms of layer %d not f32",
                                     m->source, l);
        }
        if (w->attn_norm.dtype != TSR_F32 || w->ffn_norm.dtype != TSR_F32)
            return tsr_error_set(TSR_ERR_INTERNAL, "%s: norms of layer %d not f32", m->source, l);
    }
    return TSR_OK;
}

/* Initializer of an array with the addresses of a layer's tensors. */
#define TSR__LAYER_TENSORS(w)                                                        \
    {&(w)->attn_norm, &(w)->wq,     &(w)->wk,   &(w)->wv,    &(w)->wo,                 \
     &(w)->ffn_norm,  &(w)->w_gate, &(w)->w_up, &(w)->w_down, &(w)->bq,                \
     &(w)->bk,        &(w)->bv,     &(w)->q_norm, &(w)->k_norm, &(w)->bo,               \
     &(w)->sinks,     &(w)->router, &(w)->router_b, &(w)->gate_up.w,                    \
     &(w)->gate_up.scales, &(w)->gate_up.bias, &(w)->down.w, &(w)->down.scales,          \
     &(w)->down.bias, &(w)->wqkv, &(w)->bqkv, &(w)->w_gate_up}

size_t tsr_model_weight_bytes(const tsr_model *m) {
    size_t total = tsr_tensor_bytes(&m->classifier) + tsr_tensor_bytes(&m->out_norm);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        const tsr_tensor *ts[] = TSR__LAYER_TENSORS(w);
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            /* fused (fuse.h): the parts are counted in their fused tensor */
            if ((w->wqkv.data && (ts[i] == &w->wq || ts[i] == &w->wk || ts[i] == &w->wv ||
                                  ts[i] == &w->bq || ts[i] == &w->bk || ts[i] == &w->bv)) ||
                (w->w_gate_up.data && (ts[i] == &w->w_gate || ts[i] == &w->w_up)))
                continue;
            total += tsr_tensor_bytes(ts[i]);
        }
    }
    return total;
}

void tsr_model_discard(tsr_model *m, const void *p, size_t bytes) {
    if (!p || !bytes) return;
    /* malloc'ed weights (under TSR__ARENA_MIN) lie in no resource: kept */
    for (tsr_model_resource *r = m->resources; r; r = r->next) {
        const char *a = r->addr;
        if (!r->len || (const char *)p < a || (const char *)p + bytes > a + r->len) continue;
        /* Arena allocations are whole 4 KiB pages (tsr_model_alloc); in a file mapping the
         * pages wholly inside the range go (a neighbour sharing an edge page keeps it; a
         * dropped page comes back from the file if touched), so a matrix copied out of a
         * mapped file is not resident twice. */
        tsr_pages_drop(p, bytes);
        return;
    }
}

/* The file mapping that holds p, or NULL. */
static tsr_model_resource *tsr__file_map_of(const tsr_model *m, const void *p) {
    for (tsr_model_resource *r = m->resources; r; r = r->next)
        if (tsr__is_file_map(r) && (const char *)p >= (const char *)r->addr &&
            (const char *)p < (const char *)r->addr + r->len)
            return r;
    return NULL;
}

/* Moves one tensor out of a file mapping; the mapped source pages are dropped as soon as
 * they are copied (they come back from the file if touched), so the peak stays near one
 * copy of the weights. */
static tsr_status tsr__pack_one(tsr_model *m, tsr_tensor *t) {
    if (!t->data || !tsr__file_map_of(m, t->data)) return TSR_OK;
    size_t bytes = tsr_tensor_bytes(t);
    void *dst;
    TSR_TRY(tsr_model_alloc(m, bytes, &dst));
    memcpy(dst, t->data, bytes);
    tsr_pages_drop(t->data, bytes);
    t->data = dst;
    return TSR_OK;
}

tsr_status tsr_model_pack(tsr_model *m) {
    bool tied = m->classifier.data && m->classifier.data == m->tok_emb.data;
    TSR_TRY(tsr__pack_one(m, &m->tok_emb));
    if (tied)
        m->classifier.data = m->tok_emb.data;
    else
        TSR_TRY(tsr__pack_one(m, &m->classifier));
    TSR_TRY(tsr__pack_one(m, &m->out_norm));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        tsr_tensor *ts[] = TSR__LAYER_TENSORS(w);
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) TSR_TRY(tsr__pack_one(m, ts[i]));
    }
    /* Nothing views the files any more. */
    for (tsr_model_resource **pr = &m->resources; *pr;) {
        tsr_model_resource *r = *pr;
        if (!tsr__is_file_map(r)) {
            pr = &r->next;
            continue;
        }
        *pr = r->next;
        munmap(r->addr, r->len);
        tsr_free(r);
    }
    return TSR_OK;
}

tsr_status tsr_model_load(const char *spec, tsr_model **out) {
    *out = NULL;
    if (!spec || !*spec) return tsr_error_set(TSR_ERR_INVALID, "no model given (--model PATH)");
    tsr_status st;
    if (!strncmp(spec, "synthetic:", 10)) {
        st = tsr_synthetic_create(spec + 10, out);
    } else {
        struct stat sb;
        if (stat(spec, &sb) != 0)
            return tsr_error_set(TSR_ERR_IO, "%s: model not found", spec);
        st = S_ISDIR(sb.st_mode)       ? tsr_loader_hf(spec, out)
             : tsr_gguf_is_gguf(spec) ? tsr_loader_gguf(spec, out)
                                      : tsr_loader_llama2c(spec, out);
    }
    if (st != TSR_OK) return st;
    st = tsr_model_check(*out);
    if (st != TSR_OK) {
        tsr_model_destroy(*out);
        *out = NULL;
    }
    return st;
}

tsr_status tsr_model_chat_template(const char *path, tsr_chat_template *out) {
    memset(out, 0, sizeof *out);
    if (!path || !tsr_gguf_is_gguf(path)) return tsr_chat_template_detect(path, out);
    char *tpl = NULL, *bos = NULL, *eos = NULL;
    tsr_status st = tsr_gguf_chat_template(path, &tpl, &bos, &eos);
    if (st == TSR_OK && tpl)
        st = tsr_chat_template_from_source(tpl, strlen(tpl), bos, eos, path, out);
    tsr_free(tpl);
    tsr_free(bos);
    tsr_free(eos);
    return st;
}
