/* Host pool accounting over tsr_malloc_aligned (unplaced) or tsr_topology_alloc (placed),
 * with optional pin hooks around every allocation. */
#include "memory/host_pool.h"

#include <string.h>

#include "base/alloc.h"

tsr_status tsr_host_pool_create(int64_t budget_bytes, tsr_host_pool **out) {
    *out = tsr_calloc(1, sizeof **out);
    if (!*out) return TSR_ERR_NOMEM;
    (*out)->budget = budget_bytes;
    return TSR_OK;
}

tsr_status tsr_host_pool_create_placed(int64_t budget_bytes, const tsr_topology *t,
                                       const tsr_placement *p, tsr_host_pool **out) {
    *out = NULL;
    if (!t || !p)
        return tsr_error_set(TSR_ERR_INVALID, "host pool: placed pool without a topology");
    /* One page tells whether this system binds at all, before any real allocation. */
    void *probe = NULL;
    bool bound = false;
    TSR_TRY(tsr_topology_alloc(t, p, 4096, &probe, &bound));
    tsr_topology_free(t, probe, 4096);
    tsr_host_pool *h = NULL;
    TSR_TRY(tsr_host_pool_create(budget_bytes, &h));
    h->topo = t;
    h->place = *p;
    h->bound = bound;
    *out = h;
    return TSR_OK;
}

void tsr_host_pool_destroy(tsr_host_pool *p) { tsr_free(p); }

tsr_status tsr_host_pool_set_pinning(tsr_host_pool *p, tsr_host_pool_pin_fn pin,
                                     tsr_host_pool_unpin_fn unpin, void *ctx) {
    if (p->n_allocs > 0)
        return tsr_error_set(TSR_ERR_INVALID, "host pool: pin hooks set while %lld allocations "
                             "are live (they would be unpinned without being pinned)",
                             (long long)p->n_allocs);
    p->pin = pin;
    p->unpin = unpin;
    p->pin_ctx = ctx;
    return TSR_OK;
}

bool tsr_host_pool_bound(const tsr_host_pool *p) { return p->topo && p->bound; }
int tsr_host_pool_numa(const tsr_host_pool *p) { return p->topo ? p->place.numa_node : -1; }

/* A zero-byte request still gets a real, distinct allocation (the callers free it). */
static size_t tsr__size(size_t bytes) { return bytes ? bytes : 1; }

static void tsr__release(tsr_host_pool *p, void *ptr, size_t bytes) {
    if (p->topo) tsr_topology_free(p->topo, ptr, tsr__size(bytes));
    else tsr_free(ptr);
}

/* Memory from the system, placed and pinned as the pool says; no accounting. */
static tsr_status tsr__acquire(tsr_host_pool *p, size_t bytes, void **out) {
    size_t sz = tsr__size(bytes);
    *out = NULL;
    if (p->topo) {
        bool bound = false;
        TSR_TRY(tsr_topology_alloc(p->topo, &p->place, sz, out, &bound));
        if (!bound) {
            p->n_unbound++;
            p->bound = false;
        }
    } else {
        *out = tsr_malloc_aligned(sz);
        if (!*out)
            return tsr_error_set(TSR_ERR_NOMEM, "host pool: out of memory for %zu bytes", bytes);
    }
    if (p->pin) {
        tsr_status st = p->pin(p->pin_ctx, *out, sz);
        if (st != TSR_OK) {
            tsr__release(p, *out, bytes);
            *out = NULL;
            return st;
        }
    }
    return TSR_OK;
}

static void tsr__dispose(tsr_host_pool *p, void *ptr, size_t bytes) {
    if (p->unpin) p->unpin(p->pin_ctx, ptr);
    tsr__release(p, ptr, bytes);
}

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
    TSR_TRY(tsr__acquire(p, bytes, out));
    p->used += (int64_t)bytes;
    if (p->used > p->peak) p->peak = p->used;
    p->n_allocs++;
    return TSR_OK;
}

/* A shrink moves too: the caller frees with the new size, which a placed allocation
 * (munmap of its length) and the accounting both need to be the real one. */
tsr_status tsr_host_pool_realloc(tsr_host_pool *p, void **ptr, size_t old_bytes,
                                 size_t new_bytes) {
    if (new_bytes == old_bytes && *ptr) return TSR_OK;
    TSR_TRY(tsr__host_check(p, (int64_t)new_bytes - (int64_t)(*ptr ? old_bytes : 0)));
    void *n = NULL;
    TSR_TRY(tsr__acquire(p, new_bytes, &n));
    if (*ptr) {
        memcpy(n, *ptr, old_bytes < new_bytes ? old_bytes : new_bytes);
        tsr__dispose(p, *ptr, old_bytes);
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
    tsr__dispose(p, ptr, bytes);
    p->used -= (int64_t)bytes;
    p->n_allocs--;
}
