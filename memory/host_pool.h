/* The host buffer pool: host memory for swapped-out and offloaded KV under a byte budget.
 *
 * Two kinds of pool:
 *  - unplaced (tsr_host_pool_create): 64-byte aligned tsr_malloc_aligned memory;
 *  - placed (tsr_host_pool_create_placed): every allocation comes from tsr_topology_alloc,
 *    bound to the rank's NUMA node (hwloc_alloc_membind) where the system allows it, and
 *    unbound (page-aligned) otherwise; the pool records whether any allocation fell back.
 * Either kind can call pin hooks on each allocation and free, so that a GPU backend can
 * page-lock the memory (cudaHostRegister) for asynchronous copies. */
#ifndef TSR_MEMORY_HOST_POOL_H
#define TSR_MEMORY_HOST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memory/topology.h"
#include "base/status.h"

/* Called on every allocation (after it is made) and before every free. */
typedef tsr_status (*tsr_host_pool_pin_fn)(void *ctx, void *ptr, size_t bytes);
typedef void (*tsr_host_pool_unpin_fn)(void *ctx, void *ptr);

typedef struct tsr_host_pool {
    int64_t budget;      /* bytes; <= 0: unlimited */
    int64_t used, peak;
    int64_t n_allocs;
    /* Placement: topo NULL for an unplaced pool. The topology is borrowed. */
    const tsr_topology *topo;
    tsr_placement place;
    bool bound;          /* placed, and every allocation so far was bound to its node */
    int64_t n_unbound;   /* placed allocations that fell back to unbound memory */
    tsr_host_pool_pin_fn pin;
    tsr_host_pool_unpin_fn unpin;
    void *pin_ctx;
} tsr_host_pool;

tsr_status tsr_host_pool_create(int64_t budget_bytes, tsr_host_pool **out);

/* A pool whose memory lives on placement p's NUMA node of topology t (t must outlive the
 * pool; p is copied). Creating it probes one page, so tsr_host_pool_bound tells at once
 * whether the system enforces the binding (false on synthetic/XML topologies, without
 * NUMA support or without the permission to bind). */
tsr_status tsr_host_pool_create_placed(int64_t budget_bytes, const tsr_topology *t,
                                       const tsr_placement *p, tsr_host_pool **out);
void tsr_host_pool_destroy(tsr_host_pool *p);

/* Installs pin hooks (either may be NULL); later allocations are pinned, frees unpinned.
 * TSR_ERR_INVALID while the pool holds allocations: those were not pinned, and unpinning
 * them later would be wrong. A failing pin fails the allocation (memory released). */
tsr_status tsr_host_pool_set_pinning(tsr_host_pool *p, tsr_host_pool_pin_fn pin,
                                     tsr_host_pool_unpin_fn unpin, void *ctx);

/* Whether the pool's memory is bound to its NUMA node (false when unplaced or when any
 * allocation fell back), and the logical NUMA node it was placed on (-1: unplaced). */
bool tsr_host_pool_bound(const tsr_host_pool *p);
int tsr_host_pool_numa(const tsr_host_pool *p);

/* TSR_ERR_NO_BLOCKS when the budget is short now, TSR_ERR_BUDGET when `bytes` exceeds the
 * whole budget, TSR_ERR_NOMEM when the system refuses. */
tsr_status tsr_host_pool_alloc(tsr_host_pool *p, size_t bytes, void **out);
/* Grows (or shrinks) an allocation, keeping its contents; *ptr may be NULL. */
tsr_status tsr_host_pool_realloc(tsr_host_pool *p, void **ptr, size_t old_bytes,
                                 size_t new_bytes);
/* bytes: the size the allocation was made (or last reallocated) with. */
void tsr_host_pool_free(tsr_host_pool *p, void *ptr, size_t bytes);

#endif
