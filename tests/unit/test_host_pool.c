/* memory/host_pool: accounting, realloc, NUMA placement from synthetic and XML topologies
 * (the pool follows each rank's placement; the memory is unbound there but usable), this
 * machine, and the pin hooks. */
#include <stdint.h>
#include <string.h>

#include "memory/host_pool.h"
#include "base/alloc.h"
#include "tests/test.h"

#define TWO_BY_TWO "pack:2 numa:2 core:4 pu:1"
#define FIXTURE TSR_SOURCE_DIR "/tests/data/topology/two_gpus.xml"

/* Allocation, growth (contents kept), shrink and free, on any pool. */
static void tsr__exercise(tsr_host_pool *h) {
    unsigned char *a = NULL;
    ASSERT_OK(tsr_host_pool_alloc(h, 1000, (void **)&a));
    ASSERT_TRUE(((uintptr_t)a % 64) == 0);
    for (int i = 0; i < 1000; i++) a[i] = (unsigned char)i;
    ASSERT_OK(tsr_host_pool_realloc(h, (void **)&a, 1000, 300000));
    for (int i = 0; i < 1000; i++) ASSERT_EQ_INT(a[i], (unsigned char)i);
    memset(a + 1000, 7, 300000 - 1000);
    ASSERT_EQ_INT(h->used, 300000);
    ASSERT_OK(tsr_host_pool_realloc(h, (void **)&a, 300000, 500));
    ASSERT_EQ_INT(a[499], (unsigned char)499);
    ASSERT_EQ_INT(h->used, 500);
    void *b = NULL;
    ASSERT_OK(tsr_host_pool_realloc(h, &b, 0, 4096)); /* from NULL: a new allocation */
    void *z = NULL;
    ASSERT_OK(tsr_host_pool_alloc(h, 0, &z));
    ASSERT_TRUE(z != NULL);
    ASSERT_EQ_INT(h->n_allocs, 3);
    ASSERT_TRUE(h->peak >= 300000);
    tsr_host_pool_free(h, a, 500);
    tsr_host_pool_free(h, b, 4096);
    tsr_host_pool_free(h, z, 0);
    tsr_host_pool_free(h, NULL, 10);
    ASSERT_EQ_INT(h->used, 0);
    ASSERT_EQ_INT(h->n_allocs, 0);
}

TSR_TEST(test_unplaced_pool) {
    tsr_host_pool *h = NULL;
    ASSERT_OK(tsr_host_pool_create(0, &h));
    ASSERT_TRUE(!tsr_host_pool_bound(h));
    ASSERT_EQ_INT(tsr_host_pool_numa(h), -1);
    tsr__exercise(h);
    tsr_host_pool_destroy(h);
    /* The budget. */
    ASSERT_OK(tsr_host_pool_create(1000, &h));
    void *a = NULL, *b = NULL;
    ASSERT_EQ_INT(tsr_host_pool_alloc(h, 1001, &a), TSR_ERR_BUDGET);
    ASSERT_OK(tsr_host_pool_alloc(h, 600, &a));
    ASSERT_EQ_INT(tsr_host_pool_alloc(h, 600, &b), TSR_ERR_NO_BLOCKS);
    ASSERT_STR_CONTAINS(tsr_last_error(), "600 bytes wanted, 400 free");
    ASSERT_EQ_INT(tsr_host_pool_realloc(h, &a, 600, 1200), TSR_ERR_NO_BLOCKS);
    ASSERT_OK(tsr_host_pool_realloc(h, &a, 600, 1000));
    tsr_host_pool_free(h, a, 1000);
    ASSERT_EQ_INT(h->used, 0);
    tsr_host_pool_destroy(h);
}

/* CPU ranks: 4 ranks on 2 packages x 2 NUMA nodes get one node each, 2 ranks one per
 * package; each rank's pool sits on its rank's node. */
TSR_TEST(test_placed_synthetic_cpu_ranks) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(TWO_BY_TWO, &t));
    tsr_placement p[4];
    ASSERT_OK(tsr_topology_place(t, 4, NULL, p));
    for (int r = 0; r < 4; r++) {
        tsr_host_pool *h = NULL;
        ASSERT_OK(tsr_host_pool_create_placed(0, t, &p[r], &h));
        ASSERT_EQ_INT(tsr_host_pool_numa(h), r);
        ASSERT_TRUE(!tsr_host_pool_bound(h)); /* a synthetic machine cannot be bound to */
        tsr__exercise(h);
        ASSERT_TRUE(h->n_unbound >= 4);
        tsr_host_pool_destroy(h);
    }
    ASSERT_OK(tsr_topology_place(t, 2, NULL, p));
    int want[2] = {0, 2};
    for (int r = 0; r < 2; r++) {
        tsr_host_pool *h = NULL;
        ASSERT_OK(tsr_host_pool_create_placed(1 << 20, t, &p[r], &h));
        ASSERT_EQ_INT(tsr_host_pool_numa(h), want[r]);
        tsr_host_pool_destroy(h);
    }
    tsr_host_pool *h = NULL;
    ASSERT_EQ_INT(tsr_host_pool_create_placed(0, NULL, &p[0], &h), TSR_ERR_INVALID);
    tsr_topology_destroy(t);
}

/* GPU ranks: the pool follows the NUMA node nearest each rank's GPU, whatever the rank
 * order; a device hwloc does not know falls back to the rank spread. */
TSR_TEST(test_placed_near_gpu) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(FIXTURE, &t));
    const char *bus[3] = {"0000:65:00.0", "0000:17:00.0", "0000:99:00.0"};
    tsr_placement p[3];
    ASSERT_OK(tsr_topology_place(t, 3, bus, p));
    int want[3] = {1, 0, 1}; /* rank 2: unknown device, spread 2 * 2 / 3 = node 1 */
    for (int r = 0; r < 3; r++) {
        tsr_host_pool *h = NULL;
        ASSERT_OK(tsr_host_pool_create_placed(0, t, &p[r], &h));
        ASSERT_EQ_INT(tsr_host_pool_numa(h), want[r]);
        ASSERT_EQ_INT(h->place.near_device, r < 2);
        tsr__exercise(h);
        tsr_host_pool_destroy(h);
    }
    tsr_topology_destroy(t);
}

TSR_TEST(test_placed_this_machine) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load("system-cpu", &t));
    tsr_placement p;
    ASSERT_OK(tsr_topology_place(t, 1, NULL, &p));
    tsr_host_pool *h = NULL;
    ASSERT_OK(tsr_host_pool_create_placed(0, t, &p, &h));
    ASSERT_EQ_INT(tsr_host_pool_numa(h), 0);
    bool probe = tsr_host_pool_bound(h);
    size_t bytes = 1 << 20;
    unsigned char *m = NULL;
    ASSERT_OK(tsr_host_pool_alloc(h, bytes, (void **)&m));
    memset(m, 0x5a, bytes);
    ASSERT_EQ_INT(m[bytes - 1], 0x5a);
    /* The probe predicts real allocations (same node, same system). */
    ASSERT_EQ_INT(tsr_host_pool_bound(h), probe);
    fprintf(stderr, "  this machine: host pool on NUMA node 0, %s\n",
            probe ? "bound" : "unbound (no NUMA binding here)");
    tsr_host_pool_free(h, m, bytes);
    tsr__exercise(h);
    tsr_host_pool_destroy(h);
    tsr_topology_destroy(t);
}

/* A fake pinner: records what it saw, refuses when told. */
typedef struct tsr__pins {
    int pinned, unpinned, live;
    size_t last_bytes;
    void *last_ptr;
    bool refuse;
} tsr__pins;

static tsr_status tsr__pin(void *ctx, void *ptr, size_t bytes) {
    tsr__pins *s = ctx;
    if (s->refuse) return tsr_error_set(TSR_ERR_CUDA, "cudaHostRegister: refused (test)");
    s->pinned++;
    s->live++;
    s->last_ptr = ptr;
    s->last_bytes = bytes;
    return TSR_OK;
}

static void tsr__unpin(void *ctx, void *ptr) {
    tsr__pins *s = ctx;
    (void)ptr;
    s->unpinned++;
    s->live--;
}

static void tsr__check_pins(tsr_host_pool *h) {
    tsr__pins s = {0};
    ASSERT_OK(tsr_host_pool_set_pinning(h, tsr__pin, tsr__unpin, &s));
    void *a = NULL;
    ASSERT_OK(tsr_host_pool_alloc(h, 5000, &a));
    ASSERT_TRUE(s.last_ptr == a && s.last_bytes == 5000 && s.live == 1);
    ASSERT_OK(tsr_host_pool_realloc(h, &a, 5000, 9000));
    ASSERT_TRUE(s.last_ptr == a && s.last_bytes == 9000);
    ASSERT_EQ_INT(s.live, 1); /* old one unpinned, new one pinned */
    /* Hooks cannot change under live allocations. */
    ASSERT_EQ_INT(tsr_host_pool_set_pinning(h, NULL, NULL, NULL), TSR_ERR_INVALID);
    /* A refused pin fails the allocation and leaves the pool as it was. */
    s.refuse = true;
    void *b = NULL;
    ASSERT_EQ_INT(tsr_host_pool_alloc(h, 100, &b), TSR_ERR_CUDA);
    ASSERT_TRUE(b == NULL);
    ASSERT_EQ_INT(tsr_host_pool_realloc(h, &a, 9000, 20000), TSR_ERR_CUDA);
    ASSERT_EQ_INT(h->used, 9000);
    ASSERT_EQ_INT(h->n_allocs, 1);
    s.refuse = false;
    tsr_host_pool_free(h, a, 9000);
    ASSERT_EQ_INT(s.live, 0);
    ASSERT_EQ_INT(s.pinned, s.unpinned);
    ASSERT_OK(tsr_host_pool_set_pinning(h, NULL, NULL, NULL));
}

TSR_TEST(test_pin_hooks) {
    tsr_host_pool *h = NULL;
    ASSERT_OK(tsr_host_pool_create(0, &h));
    tsr__check_pins(h);
    tsr_host_pool_destroy(h);
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(TWO_BY_TWO, &t));
    tsr_placement p;
    ASSERT_OK(tsr_topology_place(t, 1, NULL, &p));
    ASSERT_OK(tsr_host_pool_create_placed(0, t, &p, &h));
    tsr__check_pins(h);
    tsr_host_pool_destroy(h);
    tsr_topology_destroy(t);
}

TSR_TEST_MAIN(test_unplaced_pool, test_placed_synthetic_cpu_ranks, test_placed_near_gpu,
              test_placed_this_machine, test_pin_hooks)
