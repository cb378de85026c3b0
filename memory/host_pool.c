/* Host pool accounting over tsr_malloc_aligned. */
#include "memory/host_pool.h"

#include <string.h>

#include "runtime/base/alloc.h"

tsr_status tsr_host_pool_create(int64_t budget_bytes, tsr_host_pool **out) {
    *out = tsr_calloc(1, sizeof **out);
    if (!*out) return TSR_ERR_NOMEM;
    (*out)->budget = budget_bytes;
    return TSR_OK;
}

void tsr_host_pool_destroy(tsr_host_pool *p) { tsr_free(p); }

static tsr_status tsr__host_check(const tsr_host_pool *p, int64_t grow) {
    if (p->budget > 0 && grow > p->budget)
        return tsr_error_set(TSR_ERR_BUDGET, "host pool: %lld bytes exceed the budget of %lld",
                             (long long)grow, (long long)p->budget);
    if (p->budget > 0 && p->used + grow > p->budget)
        return tsr_error_set(TSR_ERR_NO_BLOCKS, "host pool: %lld bytes wanted, %lld free",
                             (long long)grow, (long long)(p->budget - p->used));
    return TSR_OK;
}

tsr_status tsr_host_pool_alloc(tsr_host_pool *p, size_t bytes, void **out) {
    *out = NULL;
    TSR_TRY(tsr__host_check(p, (int64_t)bytes));
    *out = tsr_malloc_aligned(bytes ? bytes : 1);
    if (!*out)
        return tsr_error_set(TSR_ERR_NOMEM, "host pool: out of memory for %zu bytes", bytes);
    p->used += (int64_t)bytes;
    if (p->used > p->peak) p->peak = p->used;
    p->n_allocs++;
    return TSR_OK;
}

tsr_status tsr_host_pool_realloc(tsr_host_pool *p, void **ptr, size_t old_bytes,
                                 size_t new_bytes) {
    if (new_bytes <= old_bytes && *ptr) return TSR_OK;
    TSR_TRY(tsr__host_check(p, (int64_t)new_bytes - (int64_t)old_bytes));
    void *n = tsr_malloc_aligned(new_bytes ? new_bytes : 1);
    if (!n)
        return tsr_error_set(TSR_ERR_NOMEM, "host pool: out of memory for %zu bytes",
                             new_bytes);
    if (*ptr) {
        memcpy(n, *ptr, old_bytes);
        tsr_free(*ptr);
        p->used -= (int64_t)old_bytes;
    } else {
        p->n_allocs++;
    }
    *ptr = n;
    p->used += (int64_t)new_bytes;
    if (p->used > p->peak) p->peak = p->used;
    return TSR_OK;
}

void tsr_host_pool_free(tsr_host_pool *p, void *ptr, size_t bytes) {
    if (!ptr) return;
    tsr_free(ptr);
    p->used -= (int64_t)bytes;
    p->n_allocs--;
}
