/* The host buffer pool: host memory for swapped-out and offloaded KV under a byte budget.
 * For now a malloc-backed arena with accounting; NUMA binding (hwloc) comes with the
 * topology module. Allocations are 64-byte aligned. */
#ifndef TSR_MEMORY_HOST_POOL_H
#define TSR_MEMORY_HOST_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/status.h"

typedef struct tsr_host_pool {
    int64_t budget;      /* bytes; <= 0: unlimited */
    int64_t used, peak;
    int64_t n_allocs;
} tsr_host_pool;

tsr_status tsr_host_pool_create(int64_t budget_bytes, tsr_host_pool **out);
void tsr_host_pool_destroy(tsr_host_pool *p);

/* TSR_ERR_NO_BLOCKS when the budget is short now, TSR_ERR_BUDGET when `bytes` exceeds the
 * whole budget, TSR_ERR_NOMEM when the system refuses. */
tsr_status tsr_host_pool_alloc(tsr_host_pool *p, size_t bytes, void **out);
/* Grows (or shrinks) an allocation, keeping its contents; *ptr may be NULL. */
tsr_status tsr_host_pool_realloc(tsr_host_pool *p, void **ptr, size_t old_bytes,
                                 size_t new_bytes);
void tsr_host_pool_free(tsr_host_pool *p, void *ptr, size_t bytes);

#endif
