/* The paged cache's store: K/V rows of every pool slot in one backend buffer, plus each
 * slot's position and accumulated score in host memory. Slot s lives in block s / block,
 * row s % block; a block holds its K rows, then its V rows (tsr_kv_layout: v = k + block *
 * row, block_stride = 2 * block * row), so attention reads a block's K and then its V in
 * one forward stream (docs/kv-cache.md). Host code moves K/V bytes only through the
 * backend's KV row ops, one call per batch of slots (a GPU launch per row would be slow);
 * positions and scores are metadata and move with their rows. */
#ifndef TSR_MEMORY_KV_STORE_H
#define TSR_MEMORY_KV_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "base/status.h"

typedef struct tsr_kv_store {
    tsr_backend *be;    /* not owned */
    tsr_kv_layout lay;  /* lay.k: the backend buffer */
    int64_t n_slots;
    int32_t *pos;       /* [n_slots] host */
    float *score;       /* [n_slots] host; NULL without scores */
} tsr_kv_store;

/* n_blocks blocks of `block` slots of `row` elements of `dtype` (K and V; tsr_kv_dtype,
 * converted from and to f32 rows by the backend's row ops); scores when asked. */
tsr_status tsr_kv_store_init(tsr_kv_store *s, tsr_backend *be, int64_t n_blocks,
                             int32_t block, int32_t row, int dtype, bool scores);
void tsr_kv_store_release(tsr_kv_store *s);

/* The first K / V row of block b, in backend memory (for attention spans; the bytes of
 * lay.dtype). */
const float *tsr_kv_store_block_k(const tsr_kv_store *s, int32_t b);
const float *tsr_kv_store_block_v(const tsr_kv_store *s, int32_t b);

/* Row i of k and v ([n][row], backend memory: activations) to slots[i], at position
 * pos0 + i with score 0. */
tsr_status tsr_kv_store_write(tsr_kv_store *s, const int32_t *slots, int64_t n,
                              const float *k, const float *v, int32_t pos0);
/* Slot dst[i] gets slot src[i]'s rows, position and score, in order i = 0.. */
tsr_status tsr_kv_store_copy(tsr_kv_store *s, const int32_t *dst, const int32_t *src,
                             int64_t n);
/* Host rows k[i], v[i] ([n][row]) to slots[i] with positions pos[i] and scores score[i]
 * (score NULL: 0). */
tsr_status tsr_kv_store_scatter(tsr_kv_store *s, const int32_t *slots, int64_t n,
                                const float *k, const float *v, const int32_t *pos,
                                const float *score);
/* Rows k[i], v[i] in backend memory ([n][row]: a staging buffer filled by a copy the
 * compute stream was ordered after) to slots[i] with positions pos[i] and score 0. */
tsr_status tsr_kv_store_put(tsr_kv_store *s, const int32_t *slots, int64_t n, const float *k,
                            const float *v, const int32_t *pos);
/* Slots to host rows and metadata (any of k, v, pos, score may be NULL; score reads 0
 * without scores). */
tsr_status tsr_kv_store_gather(const tsr_kv_store *s, const int32_t *slots, int64_t n,
                               float *k, float *v, int32_t *pos, float *score);

#endif
