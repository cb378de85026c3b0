/* What every KV cache shares: destruction, the detailed stats and their JSON line, the
 * checkpoint calls through the interface, and the sequence state helpers. */
#include "memory/kv_cache.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

void tsr_kv_cache_destroy(tsr_kv_cache *kv) {
    if (kv) kv->ops->destroy(kv);
}

void tsr_kv_cache_detail(const tsr_kv_cache *kv, tsr_kv_detail *out) {
    memset(out, 0, sizeof *out);
    out->policy = kv->ops->name;
    if (kv->ops->detail) kv->ops->detail(kv, out);
    else kv->ops->stats(kv, &out->kv);
}

double tsr_kv_policy_stat(const tsr_kv_policy_stats *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].name, name)) return s->v[i].is_double ? s->v[i].d : (double)s->v[i].i;
    return 0.0;
}

/* Adds what one snprintf at buf + *len needed, so the total is known past the end. */
static void tsr__cat(int *len, int n) {
    if (n > 0) *len += n;
}

int tsr_kv_detail_json(const tsr_kv_detail *d, char *buf, size_t size) {
    const tsr_kv_block_stats *b = &d->blocks;
    const tsr_kv_policy_stats *p = &d->pol;
    int len = 0;
#define TSR__AT (buf && (size_t)len < size ? buf + len : NULL), \
                (buf && (size_t)len < size ? size - (size_t)len : 0)
    tsr__cat(&len,
             snprintf(TSR__AT,
                      "{\"policy\":\"%s\",\"block_size\":%d,\"blocks_used\":%d,"
                      "\"blocks_total\":%d,\"blocks_peak\":%d,\"bytes_used\":%lld,"
                      "\"bytes_peak\":%lld,\"bytes_capacity\":%lld,\"tokens_resident\":%lld,"
                      "\"evictions\":%lld,\"prefix_query_tokens\":%lld,"
                      "\"prefix_hit_tokens\":%lld,\"cow_copies\":%lld,\"swap_out_bytes\":%lld,"
                      "\"swap_in_bytes\":%lld",
                      d->policy ? d->policy : "", b->block_size, b->blocks_used,
                      b->blocks_total, b->blocks_peak, (long long)d->kv.bytes_used,
                      (long long)d->kv.bytes_peak, (long long)d->kv.bytes_capacity,
                      (long long)d->kv.tokens_resident, (long long)d->kv.evictions,
                      (long long)b->prefix_query_tokens, (long long)b->prefix_hit_tokens,
                      (long long)b->cow_copies, (long long)b->swap_out_bytes,
                      (long long)b->swap_in_bytes));
    /* The policy's own values; its evictions are already the cache's above. */
    for (int i = 0; i < p->n; i++) {
        const tsr_kv_stat_value *v = &p->v[i];
        if (!strcmp(v->name, "evictions")) continue;
        if (v->is_double)
            tsr__cat(&len, snprintf(TSR__AT, ",\"%s\":%.4f", v->name, v->d));
        else
            tsr__cat(&len,
                     snprintf(TSR__AT, ",\"%s\":%lld", v->name, (long long)v->i));
    }
    tsr__cat(&len, snprintf(TSR__AT, "}"));
#undef TSR__AT
    return len;
}

tsr_status tsr_kv_export_seq(const tsr_kv_cache *kv, int seq, tsr_kv_seq_state *out) {
    memset(out, 0, sizeof *out);
    if (!kv->ops->export_seq)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: a %s cache cannot export a "
                             "sequence", kv->ops->name);
    return kv->ops->export_seq(kv, seq, out);
}

tsr_status tsr_kv_import_seq(tsr_kv_cache *kv, int seq, const tsr_kv_seq_state *st) {
    if (!kv->ops->import_seq)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: a %s cache cannot import a "
                             "sequence", kv->ops->name);
    return kv->ops->import_seq(kv, seq, st);
}

int tsr_kv_can_swap(const tsr_kv_cache *kv) {
    return kv->ops->swap_out && kv->ops->swap_in;
}

tsr_status tsr_kv_swap_out(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    if (bytes) *bytes = 0;
    if (!tsr_kv_can_swap(kv))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: a %s cache cannot swap",
                             kv->ops->name);
    return kv->ops->swap_out(kv, seq, check, bytes);
}

tsr_status tsr_kv_swap_in(tsr_kv_cache *kv, int seq, int check, int64_t *bytes) {
    if (bytes) *bytes = 0;
    if (!tsr_kv_can_swap(kv))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "KV cache: a %s cache cannot swap",
                             kv->ops->name);
    return kv->ops->swap_in(kv, seq, check, bytes);
}

int32_t tsr_kv_block_size(const tsr_kv_cache *kv) {
    tsr_kv_detail d;
    tsr_kv_cache_detail(kv, &d);
    return d.blocks.block_size;
}

tsr_status tsr_kv_seq_state_alloc_layers(tsr_kv_seq_state *st) {
    st->layers = tsr_calloc((size_t)(st->n_layers > 0 ? st->n_layers : 1), sizeof *st->layers);
    st->tokens = tsr_malloc((size_t)(st->len > 0 ? st->len : 1) * sizeof *st->tokens);
    return st->layers && st->tokens ? TSR_OK : TSR_ERR_NOMEM;
}

tsr_status tsr_kv_seq_state_alloc_rows(tsr_kv_seq_state *st) {
    for (int l = 0; l < st->n_layers; l++) {
        tsr_kv_seq_layer *L = &st->layers[l];
        size_t n = (size_t)(L->slots > 0 ? L->slots : 1), kvd = (size_t)st->kv_dim;
        L->k = tsr_malloc(n * kvd * sizeof *L->k);
        L->v = tsr_malloc(n * kvd * sizeof *L->v);
        L->pos = tsr_malloc(n * sizeof *L->pos);
        if (st->has_scores) L->score = tsr_malloc(n * sizeof *L->score);
        if (!L->k || !L->v || !L->pos || (st->has_scores && !L->score)) return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

void tsr_kv_seq_state_free(tsr_kv_seq_state *st) {
    if (st->layers)
        for (int l = 0; l < st->n_layers; l++) {
            tsr_free(st->layers[l].k);
            tsr_free(st->layers[l].v);
            tsr_free(st->layers[l].pos);
            tsr_free(st->layers[l].score);
        }
    tsr_free(st->layers);
    tsr_free(st->tokens);
    memset(st, 0, sizeof *st);
}
