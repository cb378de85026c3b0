/* The dense KV cache: per sequence and layer, contiguous K and V rows grown by doubling up
 * to max_tokens. It is the exact reference the block-managed policies are tested against.
 * A sequence's rows of all layers share one backend buffer (K then V of layer 0, then of
 * layer 1, ...); rows move only through the backend's copies (the write is one device
 * copy per K and V, the growth one per layer). Rows of another dtype than f32
 * (kernels/kv_dtype.h) are written by the backend's kv_write, which converts. */
#include <string.h>

#include "memory/kv_cache.h"
#include "base/alloc.h"

typedef struct tsr__dense_seq {
    int active;
    int32_t len;      /* committed tokens */
    int32_t reserved; /* tokens with storage */
    int32_t cap;      /* allocated rows per layer */
    float **k;        /* [n_layers] -> [cap][kv_dim] of dtype, inside buf (backend memory) */
    float **v;
    float *buf;       /* K then V of layer 0, then of layer 1, ... (backend memory) */
    size_t buf_bytes;
    int32_t pending;  /* rows written this step (same for every layer) */
} tsr__dense_seq;

typedef struct tsr__dense {
    tsr_kv_cache base;
    tsr_backend *be;
    int max_tokens;
    int max_seqs;
    tsr__dense_seq *seqs;
    tsr_kv_span span; /* the one span spans() returns */
    int dtype;        /* tsr_kv_dtype of the stored rows */
    int32_t *slots;   /* kv_write's slot list (non-f32 rows) */
    int32_t slots_cap;
    int64_t bytes_used, bytes_peak;
} tsr__dense;

static tsr__dense_seq *tsr__seq(const tsr__dense *d, int seq) {
    if (seq < 0 || seq >= d->max_seqs || !d->seqs[seq].active) return NULL;
    return &d->seqs[seq];
}

static size_t tsr__row_bytes(const tsr__dense *d) {
    return tsr_kv_row_bytes(d->dtype, d->base.kv_dim);
}

static void tsr__seq_release(tsr__dense *d, tsr__dense_seq *s) {
    if (s->buf) d->be->ops->buffer_free(d->be, s->buf);
    d->bytes_used -= (int64_t)s->buf_bytes;
    tsr_free(s->k);
    tsr_free(s->v);
    memset(s, 0, sizeof *s);
}

static void tsr__dense_destroy(tsr_kv_cache *kv) {
    tsr__dense *d = (tsr__dense *)kv;
    for (int i = 0; i < d->max_seqs; i++)
        if (d->seqs[i].active) tsr__seq_release(d, &d->seqs[i]);
    tsr_free(d->seqs);
    tsr_free(d->slots);
    tsr_free(d);
}

static tsr_status tsr__dense_seq_add(tsr_kv_cache *kv, int seq) {
    tsr__dense *d = (tsr__dense *)kv;
    if (seq < 0 || seq >= d->max_seqs)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence id %d out of range [0, %d)",
                             seq, d->max_seqs);
    if (d->seqs[seq].active)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: sequence %d already exists", seq);
    tsr__dense_seq *s = &d->seqs[seq];
    s->k = tsr_calloc((size_t)kv->n_layers, sizeof *s->k);
    s->v = tsr_calloc((size_t)kv->n_layers, sizeof *s->v);
    if (!s->k || !s->v) {
        tsr_free(s->k);
        tsr_free(s->v);
        memset(s, 0, sizeof *s);
        return TSR_ERR_NOMEM;
    }
    s->active = 1;
    return TSR_OK;
}

static void tsr__dense_seq_free(tsr_kv_cache *kv, int seq) {
    tsr__dense *d = (tsr__dense *)kv;
    tsr__dense_seq *s = tsr__seq(d, seq);
    if (s) tsr__seq_release(d, s);
}

static int32_t tsr__dense_seq_len(const tsr_kv_cache *kv, int seq) {
    const tsr__dense_seq *s = tsr__seq((const tsr__dense *)kv, seq);
    return s ? s->len : 0;
}

static tsr_status tsr__dense_reserve(tsr_kv_cache *kv, int seq, int32_t n) {
    tsr__dense *d = (tsr__dense *)kv;
    tsr__dense_seq *s = tsr__seq(d, seq);
    if (!s) return tsr_error_set(TSR_ERR_INVALID, "KV cache: no sequence %d", seq);
    int64_t need = (int64_t)s->len + n;
    if (n < 0 || need > d->max_tokens)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: sequence %d needs %lld tokens, the context holds %d",
                             seq, (long long)need, d->max_tokens);
    if (need > s->cap) {
        int32_t cap = s->cap ? s->cap : 64;
        while (cap < need) cap = cap > d->max_tokens / 2 ? d->max_tokens : cap * 2;
        if (cap > d->max_tokens) cap = d->max_tokens;
        size_t bytes = (size_t)cap * tsr__row_bytes(d), total;
        if (!tsr_mul_size(bytes, 2 * (size_t)kv->n_layers, &total))
            return tsr_error_set(TSR_ERR_NOMEM, "KV cache: size overflow growing sequence %d",
                                 seq);
        void *nbuf = NULL;
        if (d->be->ops->buffer_alloc(d->be, total, &nbuf) != TSR_OK) /* the sequence stays */
            return tsr_error_set(TSR_ERR_NOMEM,
                                 "KV cache: out of memory growing sequence %d to %d tokens",
                                 seq, cap);
        char *nb = nbuf;
        size_t used = (size_t)s->len * tsr__row_bytes(d);
        tsr_status st = TSR_OK;
        for (int l = 0; l < kv->n_layers && s->buf && st == TSR_OK; l++) {
            void *nk = nb + 2 * (size_t)l * bytes, *nv = nb + (2 * (size_t)l + 1) * bytes;
            st = tsr_backend_copy(d->be, nk, s->k[l], used);
            if (st == TSR_OK) st = tsr_backend_copy(d->be, nv, s->v[l], used);
        }
        if (st != TSR_OK) {
            d->be->ops->buffer_free(d->be, nb);
            return st;
        }
        for (int l = 0; l < kv->n_layers; l++) {
            s->k[l] = (float *)(nb + 2 * (size_t)l * bytes);
            s->v[l] = (float *)(nb + (2 * (size_t)l + 1) * bytes);
        }
        if (s->buf) d->be->ops->buffer_free(d->be, s->buf);
        d->bytes_used += (int64_t)total - (int64_t)s->buf_bytes;
        s->buf = (float *)nb;
        s->buf_bytes = total;
        if (d->bytes_used > d->bytes_peak) d->bytes_peak = d->bytes_used;
        s->cap = cap;
    }
    s->reserved = (int32_t)need;
    return TSR_OK;
}

static tsr_status tsr__dense_write(tsr_kv_cache *kv, int layer, int seq, int32_t n,
                                   const float *k, const float *v) {
    tsr__dense *d = (tsr__dense *)kv;
    tsr__dense_seq *s = tsr__seq(d, seq);
    if (!s || layer < 0 || layer >= kv->n_layers)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: bad write (seq %d, layer %d)", seq,
                             layer);
    if (s->len + n > s->reserved)
        return tsr_error_set(TSR_ERR_INTERNAL, "KV cache: write of %d rows past reservation",
                             n);
    if (d->dtype != TSR_KV_F32) {
        if (n > d->slots_cap) {
            int32_t *ns = tsr_realloc(d->slots, (size_t)n * sizeof *ns);
            if (!ns) return TSR_ERR_NOMEM;
            d->slots = ns;
            d->slots_cap = n;
        }
        for (int32_t i = 0; i < n; i++) d->slots[i] = s->len + i;
        tsr_kv_layout lay = {.k = s->k[layer], .v = s->v[layer], .block_stride = 0,
                             .block = s->cap, .row = kv->kv_dim, .dtype = d->dtype};
        TSR_TRY(d->be->ops->kv_write(d->be, &lay, d->slots, n, k, v));
        s->pending = n;
        return TSR_OK;
    }
    size_t off = (size_t)s->len * (size_t)kv->kv_dim;
    TSR_TRY(tsr_backend_copy(d->be, s->k[layer] + off, k, (size_t)n * tsr__row_bytes(d)));
    TSR_TRY(tsr_backend_copy(d->be, s->v[layer] + off, v, (size_t)n * tsr__row_bytes(d)));
    s->pending = n;
    return TSR_OK;
}

static tsr_status tsr__dense_spans(tsr_kv_cache *kv, int layer, int seq,
                                   const tsr_kv_span **spans, int *n_spans) {
    tsr__dense *d = (tsr__dense *)kv;
    tsr__dense_seq *s = tsr__seq(d, seq);
    if (!s || layer < 0 || layer >= kv->n_layers)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: bad spans (seq %d, layer %d)", seq,
                             layer);
    d->span = (tsr_kv_span){.k = s->k[layer], .v = s->v[layer], .pos = NULL, .pos0 = 0,
                            .n = s->len + s->pending, .stride = kv->kv_dim,
                            .dtype = d->dtype};
    *spans = &d->span;
    *n_spans = 1;
    return TSR_OK;
}

static tsr_status tsr__dense_commit(tsr_kv_cache *kv, int seq, const int32_t *tokens,
                                    int32_t n) {
    (void)tokens;
    tsr__dense *d = (tsr__dense *)kv;
    tsr__dense_seq *s = tsr__seq(d, seq);
    if (!s || s->len + n > s->reserved)
        return tsr_error_set(TSR_ERR_INTERNAL, "KV cache: bad commit (seq %d, %d tokens)", seq,
                             n);
    s->len += n;
    s->pending = 0;
    return TSR_OK;
}

static void tsr__dense_stats(const tsr_kv_cache *kv, tsr_kv_stats *out) {
    const tsr__dense *d = (const tsr__dense *)kv;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < d->max_seqs; i++)
        if (d->seqs[i].active) out->tokens_resident += d->seqs[i].len;
    out->bytes_used = d->bytes_used;
    out->bytes_peak = d->bytes_peak;
    out->bytes_capacity =
        (int64_t)d->max_seqs * d->max_tokens * (int64_t)tsr__row_bytes(d) * 2 * kv->n_layers;
}

static const tsr_kv_cache_ops tsr__dense_ops = {
    .name = "dense",
    .destroy = tsr__dense_destroy,
    .seq_add = tsr__dense_seq_add,
    .seq_free = tsr__dense_seq_free,
    .seq_len = tsr__dense_seq_len,
    .reserve = tsr__dense_reserve,
    .write = tsr__dense_write,
    .spans = tsr__dense_spans,
    .observe = NULL,
    .commit = tsr__dense_commit,
    .stats = tsr__dense_stats,
    .prefix_attach = NULL,
};

tsr_status tsr_kv_dense_create(tsr_backend *be, int n_layers, int n_kv_heads, int head_dim,
                               int max_tokens, int max_seqs, tsr_kv_cache **out) {
    return tsr_kv_dense_create_dtype(be, n_layers, n_kv_heads, head_dim, max_tokens, max_seqs,
                                     TSR_KV_F32, out);
}

tsr_status tsr_kv_dense_create_dtype(tsr_backend *be, int n_layers, int n_kv_heads,
                                     int head_dim, int max_tokens, int max_seqs, int dtype,
                                     tsr_kv_cache **out) {
    *out = NULL;
    if (!tsr_kv_dtype_fits(dtype, head_dim))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: --kv-dtype %s does not fit heads "
                             "of %d elements", tsr_kv_dtype_name(dtype), head_dim);
    if (!be)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: no backend for the dense cache");
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || max_tokens <= 0 || max_seqs <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: invalid geometry");
    tsr__dense *d = tsr_calloc(1, sizeof *d);
    if (!d) return TSR_ERR_NOMEM;
    d->seqs = tsr_calloc((size_t)max_seqs, sizeof *d->seqs);
    if (!d->seqs) {
        tsr_free(d);
        return TSR_ERR_NOMEM;
    }
    d->base = (tsr_kv_cache){.ops = &tsr__dense_ops, .n_layers = n_layers,
                             .kv_dim = n_kv_heads * head_dim, .n_kv_heads = n_kv_heads,
                             .max_seq_len = max_tokens, .wants_scores = 0};
    d->be = be;
    d->dtype = dtype;
    d->max_tokens = max_tokens;
    d->max_seqs = max_seqs;
    *out = &d->base;
    return TSR_OK;
}
