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

int tsr_kv_detail_json(const tsr_kv_detail *d, char *buf, size_t size) {
    const tsr_kv_block_stats *b = &d->blocks;
    const tsr_kv_policy_stats *p = &d->pol;
    double recall = p->recall_n ? p->recall_sum / (double)p->recall_n : -1.0;
    double per_tok = p->tokens_processed
                         ? (double)(p->bytes_offloaded + p->bytes_fetched) / p->tokens_processed
                         : 0.0;
    double fetch_tok = p->tokens_processed ? (double)p->bytes_fetched / p->tokens_processed : 0.0;
    return snprintf(buf, size,
                    "{\"policy\":\"%s\",\"block_size\":%d,\"blocks_used\":%d,"
                    "\"blocks_total\":%d,\"blocks_peak\":%d,\"bytes_used\":%lld,"
                    "\"bytes_peak\":%lld,\"bytes_capacity\":%lld,\"tokens_resident\":%lld,"
                    "\"evictions\":%lld,\"prefix_query_tokens\":%lld,\"prefix_hit_tokens\":%lld,"
                    "\"cow_copies\":%lld,\"swap_out_bytes\":%lld,\"swap_in_bytes\":%lld,"
                    "\"bytes_offloaded\":%lld,\"bytes_fetched\":%lld,"
                    "\"bytes_moved_per_token\":%.1f,\"bytes_fetched_per_token\":%.1f,"
                    "\"host_bytes_peak\":%lld,"
                    "\"spec_selections\":%lld,\"spec_fallbacks\":%lld,\"spec_recall\":%.4f,"
                    "\"score_matrix_bytes_peak\":%lld}",
                    d->policy ? d->policy : "", b->block_size, b->blocks_used, b->blocks_total,
                    b->blocks_peak, (long long)d->kv.bytes_used, (long long)d->kv.bytes_peak,
                    (long long)d->kv.bytes_capacity, (long long)d->kv.tokens_resident,
                    (long long)d->kv.evictions, (long long)b->prefix_query_tokens,
                    (long long)b->prefix_hit_tokens, (long long)b->cow_copies,
                    (long long)b->swap_out_bytes, (long long)b->swap_in_bytes,
                    (long long)p->bytes_offloaded, (long long)p->bytes_fetched, per_tok, fetch_tok,
                    (long long)p->host_bytes_peak, (long long)p->selections,
                    (long long)p->fallback_selections, recall,
                    (long long)p->score_matrix_bytes_peak);
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
