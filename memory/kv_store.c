/* The paged cache's store (see kv_store.h). */
#include "memory/kv_store.h"

#include <string.h>

#include "base/alloc.h"

tsr_status tsr_kv_store_init(tsr_kv_store *s, tsr_backend *be, int64_t n_blocks,
                             int32_t block, int32_t row, int dtype, bool scores) {
    memset(s, 0, sizeof *s);
    if (!be)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: no backend for the K/V store "
                             "(tsr_kv_paged_config.be is NULL)");
    size_t slots = (size_t)n_blocks * (size_t)block, bytes;
    size_t rb = tsr_kv_row_bytes(dtype, row);
    if (rb == 0)
        return tsr_error_set(TSR_ERR_INVALID, "KV cache: --kv-dtype %s cannot store rows of "
                             "%d elements", tsr_kv_dtype_name(dtype), (int)row);
    if (!tsr_mul_size(slots, rb * 2, &bytes))
        return tsr_error_set(TSR_ERR_NOMEM, "KV cache: pool size overflow");
    s->be = be;
    s->n_slots = (int64_t)slots;
    void *buf = NULL;
    tsr_status st = be->ops->buffer_alloc(be, bytes, &buf);
    if (st != TSR_OK) return st;
    s->lay = (tsr_kv_layout){.k = buf, .v = tsr_kv_rows_at(buf, dtype, row, (int64_t)block * row),
                             .block_stride = 2 * (int64_t)block * row, .block = block,
                             .row = row, .dtype = dtype};
    s->pos = tsr_malloc_aligned(slots * sizeof *s->pos);
    if (scores) s->score = tsr_malloc_aligned(slots * sizeof *s->score);
    if (!s->pos || (scores && !s->score)) {
        tsr_kv_store_release(s);
        return tsr_error_set(TSR_ERR_NOMEM, "KV cache: cannot allocate the metadata of %zu "
                             "slots", slots);
    }
    return TSR_OK;
}

void tsr_kv_store_release(tsr_kv_store *s) {
    if (s->lay.k) s->be->ops->buffer_free(s->be, s->lay.k);
    tsr_free(s->pos);
    tsr_free(s->score);
    memset(s, 0, sizeof *s);
}

const float *tsr_kv_store_block_k(const tsr_kv_store *s, int32_t b) {
    return tsr_kv_rows_at(s->lay.k, s->lay.dtype, s->lay.row, (int64_t)b * s->lay.block_stride);
}

const float *tsr_kv_store_block_v(const tsr_kv_store *s, int32_t b) {
    return tsr_kv_rows_at(s->lay.v, s->lay.dtype, s->lay.row, (int64_t)b * s->lay.block_stride);
}

tsr_status tsr_kv_store_write(tsr_kv_store *s, const int32_t *slots, int64_t n,
                              const float *k, const float *v, int32_t pos0) {
    if (n <= 0) return TSR_OK;
    TSR_TRY(s->be->ops->kv_write(s->be, &s->lay, slots, n, k, v));
    for (int64_t i = 0; i < n; i++) {
        s->pos[slots[i]] = pos0 + (int32_t)i;
        if (s->score) s->score[slots[i]] = 0.0f;
    }
    return TSR_OK;
}

tsr_status tsr_kv_store_copy(tsr_kv_store *s, const int32_t *dst, const int32_t *src,
                             int64_t n) {
    if (n <= 0) return TSR_OK;
    TSR_TRY(s->be->ops->kv_copy(s->be, &s->lay, dst, src, n));
    for (int64_t i = 0; i < n; i++) {
        s->pos[dst[i]] = s->pos[src[i]];
        if (s->score) s->score[dst[i]] = s->score[src[i]];
    }
    return TSR_OK;
}

tsr_status tsr_kv_store_scatter(tsr_kv_store *s, const int32_t *slots, int64_t n,
                                const float *k, const float *v, const int32_t *pos,
                                const float *score) {
    if (n <= 0) return TSR_OK;
    TSR_TRY(s->be->ops->kv_scatter(s->be, &s->lay, slots, n, k, v, NULL));
    for (int64_t i = 0; i < n; i++) {
        s->pos[slots[i]] = pos[i];
        if (s->score) s->score[slots[i]] = score ? score[i] : 0.0f;
    }
    return TSR_OK;
}

tsr_status tsr_kv_store_put(tsr_kv_store *s, const int32_t *slots, int64_t n, const float *k,
                            const float *v, const int32_t *pos) {
    if (n <= 0) return TSR_OK;
    TSR_TRY(s->be->ops->kv_write(s->be, &s->lay, slots, n, k, v));
    for (int64_t i = 0; i < n; i++) {
        s->pos[slots[i]] = pos[i];
        if (s->score) s->score[slots[i]] = 0.0f;
    }
    return TSR_OK;
}

tsr_status tsr_kv_store_gather(const tsr_kv_store *s, const int32_t *slots, int64_t n,
                               float *k, float *v, int32_t *pos, float *score) {
    if (n <= 0) return TSR_OK;
    if (k || v) TSR_TRY(s->be->ops->kv_gather(s->be, &s->lay, slots, n, k, v, NULL));
    for (int64_t i = 0; i < n; i++) {
        if (pos) pos[i] = s->pos[slots[i]];
        if (score) score[i] = s->score ? s->score[slots[i]] : 0.0f;
    }
    return TSR_OK;
}
