/* The batched forward pass. All tokens of a call go through each matrix together (prompt
 * chunks become matrix-matrix products); attention runs per sequence over the spans its KV
 * cache returns; the classifier runs only for the rows that need logits. */
#include "runtime/forward.h"

#include <math.h>
#include <string.h>

#include "runtime/base/alloc.h"

struct tsr_forward {
    const tsr_model *m;
    tsr_backend *be;
    int max_tokens;
    /* activations, [max_tokens][width] each, from the backend */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    float *xl;          /* rows that need logits, gathered: [max_tokens][dim] */
    int32_t *pos;       /* host: position of each row */
    int32_t *ids;       /* host: token id of each row */
    float *key_scores;  /* host: per kv head x keys, grown on demand */
    size_t key_scores_cap;
};

size_t tsr_forward_workspace_bytes(const tsr_model_config *c, int max_tokens) {
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t per_row = 3 * (size_t)c->dim + 2 * qd + 2 * kvd + 2 * (size_t)c->hidden_dim;
    return (size_t)max_tokens * (per_row * 4 + 8);
}

void tsr_forward_destroy(tsr_forward *f) {
    if (!f) return;
    float *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->xl};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) f->be->ops->buffer_free(f->be, bufs[i]);
    tsr_free(f->pos);
    tsr_free(f->ids);
    tsr_free(f->key_scores);
    tsr_free(f);
}

tsr_status tsr_forward_create(const tsr_model *m, tsr_backend *be, int max_tokens,
                              tsr_forward **out) {
    *out = NULL;
    if (max_tokens <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "forward: max tokens per step must be > 0");
    tsr_forward *f = tsr_calloc(1, sizeof *f);
    if (!f) return TSR_ERR_NOMEM;
    f->m = m;
    f->be = be;
    f->max_tokens = max_tokens;
    const tsr_model_config *c = &m->cfg;
    size_t T = (size_t)max_tokens;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    struct {
        float **p;
        size_t width;
    } plan[] = {{&f->x, (size_t)c->dim},   {&f->xb, (size_t)c->dim},
                {&f->q, qd},               {&f->k, kvd},
                {&f->v, kvd},              {&f->att, qd},
                {&f->hb, (size_t)c->hidden_dim}, {&f->hb2, (size_t)c->hidden_dim},
                {&f->xl, (size_t)c->dim}};
    tsr_status st = TSR_OK;
    for (size_t i = 0; i < sizeof plan / sizeof plan[0] && st == TSR_OK; i++) {
        size_t bytes;
        if (!tsr_mul_size(T, plan[i].width * 4, &bytes))
            st = tsr_error_set(TSR_ERR_NOMEM, "forward: workspace size overflow");
        else
            st = be->ops->buffer_alloc(be, bytes, (void **)plan[i].p);
    }
    if (st == TSR_OK) {
        f->pos = tsr_calloc(T, sizeof *f->pos);
        f->ids = tsr_calloc(T, sizeof *f->ids);
        if (!f->pos || !f->ids) st = TSR_ERR_NOMEM;
    }
    if (st != TSR_OK) {
        tsr_forward_destroy(f);
        return st;
    }
    *out = f;
    return TSR_OK;
}

static tsr_status tsr__key_scores(tsr_forward *f, size_t n, float **out) {
    if (n > f->key_scores_cap) {
        float *p = tsr_realloc(f->key_scores, n * sizeof *p);
        if (!p) return TSR_ERR_NOMEM;
        f->key_scores = p;
        f->key_scores_cap = n;
    }
    memset(f->key_scores, 0, n * sizeof *f->key_scores);
    *out = f->key_scores;
    return TSR_OK;
}

/* Attention of every sequence of the batch for one layer; rows [row0, row0+n) of q/k/v
 * belong to seqs[i]. */
static tsr_status tsr__attention(tsr_forward *f, tsr_kv_cache *kv, int layer,
                                 const tsr_batch_seq *seqs, int n_seqs) {
    const tsr_model_config *c = &f->m->cfg;
    tsr_backend *be = f->be;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    int64_t row = 0;
    for (int i = 0; i < n_seqs; i++) {
        const tsr_batch_seq *s = &seqs[i];
        TSR_TRY(kv->ops->write(kv, layer, s->seq, s->n_tokens, f->k + row * kvd,
                               f->v + row * kvd));
        if (kv->ops->queries)
            TSR_TRY(kv->ops->queries(kv, layer, s->seq, f->q + row * qd, f->pos + row,
                                     s->n_tokens, c->n_heads));
        const tsr_kv_span *spans;
        int n_spans;
        TSR_TRY(kv->ops->spans(kv, layer, s->seq, &spans, &n_spans));
        float *scores = NULL;
        if (kv->wants_scores && kv->ops->observe) {
            size_t keys = 0;
            for (int j = 0; j < n_spans; j++) keys += (size_t)spans[j].n;
            TSR_TRY(tsr__key_scores(f, keys * (size_t)c->n_kv_heads, &scores));
        }
        tsr_attn_args a = {.q = f->q + row * qd, .q_pos = f->pos + row, .n_q = s->n_tokens,
                           .spans = spans, .n_spans = n_spans, .n_heads = c->n_heads,
                           .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                           .out = f->att + row * qd, .key_scores = scores};
        TSR_TRY(be->ops->attention(be, &a));
        if (scores) TSR_TRY(kv->ops->observe(kv, layer, s->seq, scores));
        row += s->n_tokens;
    }
    return TSR_OK;
}

tsr_status tsr_forward_run(tsr_forward *f, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                           int n_seqs, float *logits, int *n_rows) {
    const tsr_model *m = f->m;
    const tsr_model_config *c = &m->cfg;
    tsr_backend *be = f->be;
    const tsr_backend_ops *op = be->ops;
    *n_rows = 0;

    /* Check the whole batch before touching any state. */
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

    int64_t row = 0;
    for (int i = 0; i < n_seqs; i++) {
        int32_t len = kv->ops->seq_len(kv, seqs[i].seq);
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, row++) {
            f->ids[row] = seqs[i].tokens[j];
            f->pos[row] = len + j;
        }
    }

    size_t dim = (size_t)c->dim;
    TSR_TRY(op->embed(be, &m->tok_emb, f->ids, T, f->x));
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        /* attention block */
        TSR_TRY(op->rmsnorm(be, f->x, &w->attn_norm, T, c->dim, c->norm_eps, f->xb));
        TSR_TRY(op->matmul(be, f->xb, T, &w->wq, f->q));
        TSR_TRY(op->matmul(be, f->xb, T, &w->wk, f->k));
        TSR_TRY(op->matmul(be, f->xb, T, &w->wv, f->v));
        TSR_TRY(op->rope(be, f->q, f->pos, T, c->n_heads, c));
        TSR_TRY(op->rope(be, f->k, f->pos, T, c->n_kv_heads, c));
        TSR_TRY(tsr__attention(f, kv, l, seqs, n_seqs));
        TSR_TRY(op->matmul(be, f->att, T, &w->wo, f->xb));
        TSR_TRY(op->add(be, f->x, f->xb, T * c->dim));
        /* SwiGLU MLP block */
        TSR_TRY(op->rmsnorm(be, f->x, &w->ffn_norm, T, c->dim, c->norm_eps, f->xb));
        TSR_TRY(op->matmul(be, f->xb, T, &w->w_gate, f->hb));
        TSR_TRY(op->matmul(be, f->xb, T, &w->w_up, f->hb2));
        TSR_TRY(op->swiglu(be, f->hb, f->hb2, T * c->hidden_dim));
        TSR_TRY(op->matmul(be, f->hb, T, &w->w_down, f->xb));
        TSR_TRY(op->add(be, f->x, f->xb, T * c->dim));
    }
    for (int i = 0; i < n_seqs; i++)
        TSR_TRY(kv->ops->commit(kv, seqs[i].seq, seqs[i].tokens, seqs[i].n_tokens));

    /* Gather the rows that need logits, then norm + classifier on those only. */
    int64_t nl = 0;
    row = 0;
    for (int i = 0; i < n_seqs; i++) {
        const tsr_batch_seq *s = &seqs[i];
        if (s->all_logits) {
            TSR_TRY(tsr_backend_copy(be, f->xl + nl * dim, f->x + row * dim,
                                     (size_t)s->n_tokens * dim * 4));
            nl += s->n_tokens;
        } else if (s->want_logits) {
            TSR_TRY(tsr_backend_copy(be, f->xl + nl * dim, f->x + (row + s->n_tokens - 1) * dim,
                                     dim * 4));
            nl++;
        }
        row += s->n_tokens;
    }
    if (nl > 0) {
        TSR_TRY(op->rmsnorm(be, f->xl, &m->out_norm, nl, c->dim, c->norm_eps, f->xl));
        TSR_TRY(op->matmul(be, f->xl, nl, &m->classifier, logits));
    }
    TSR_TRY(op->synchronize(be));
    *n_rows = (int)nl;
    return TSR_OK;
}
