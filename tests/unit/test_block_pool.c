#include "memory/block_pool.h"
#include "base/status.h"
#include "tests/test.h"

TSR_TEST(test_alloc_free_counts) {
    tsr_block_pool *p = NULL;
    ASSERT_OK(tsr_block_pool_create(8, &p));
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 8);
    int32_t ids[8];
    ASSERT_OK(tsr_block_pool_alloc(p, 5, ids));
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 3);
    for (int i = 0; i < 5; i++) ASSERT_EQ_INT(p->blocks[ids[i]].ref_cnt, 1);
    /* All or nothing. */
    int32_t more[4] = {-7, -7, -7, -7};
    ASSERT_EQ_INT(tsr_block_pool_alloc(p, 4, more), TSR_ERR_NO_BLOCKS);
    ASSERT_EQ_INT(more[0], -7);
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 3);
    tsr_block_pool_ref(p, ids[0]);
    tsr_block_pool_unref(p, ids, 1);
    ASSERT_EQ_INT(p->blocks[ids[0]].ref_cnt, 1);
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 3);
    tsr_block_pool_unref(p, ids, 5);
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 8);
    tsr_block_pool_destroy(p);
    ASSERT_EQ_INT(tsr_block_pool_create(0, &p), TSR_ERR_BUDGET);
}

TSR_TEST(test_lru_order) {
    tsr_block_pool *p = NULL;
    ASSERT_OK(tsr_block_pool_create(4, &p));
    int32_t ids[4];
    ASSERT_OK(tsr_block_pool_alloc(p, 4, ids));
    /* Hashed (cached) blocks freed in the order 2, 0, 3, 1 come back in that order. */
    for (int i = 0; i < 4; i++) tsr_block_pool_set_hash(p, ids[i], 100 + (uint64_t)i);
    int32_t order[4] = {ids[2], ids[0], ids[3], ids[1]};
    tsr_block_pool_unref(p, order, 4);
    /* A touched free block (cache hit) leaves the middle of the list. */
    tsr_block_pool_ref(p, ids[3]);
    int32_t got[3];
    ASSERT_OK(tsr_block_pool_alloc(p, 3, got));
    ASSERT_EQ_INT(got[0], ids[2]);
    ASSERT_EQ_INT(got[1], ids[0]);
    ASSERT_EQ_INT(got[2], ids[1]);
    tsr_block_pool_destroy(p);
    /* Unhashed blocks are reused last-freed first, before never-touched blocks, so an
     * evicting policy keeps touching the same pages. */
    ASSERT_OK(tsr_block_pool_create(8, &p));
    ASSERT_OK(tsr_block_pool_alloc(p, 3, ids));
    int32_t back[2] = {ids[0], ids[2]};
    tsr_block_pool_unref(p, back, 2);
    ASSERT_OK(tsr_block_pool_alloc(p, 3, got));
    ASSERT_EQ_INT(got[0], ids[2]);
    ASSERT_EQ_INT(got[1], ids[0]);
    ASSERT_EQ_INT(got[2], 3); /* then the first never-used block */
    tsr_block_pool_destroy(p);
}

TSR_TEST(test_hash_kept_until_reuse) {
    tsr_block_pool *p = NULL;
    ASSERT_OK(tsr_block_pool_create(3, &p));
    int32_t toks[4] = {1, 2, 3, 4};
    uint64_t h0 = tsr_block_hash(0, toks, 4, 0);
    uint64_t h1 = tsr_block_hash(h0, toks, 4, 0);
    ASSERT_TRUE(h0 != h1);                          /* the parent is part of the hash */
    ASSERT_TRUE(h0 != tsr_block_hash(0, toks, 4, 1)); /* so is the extra key */
    int32_t ids[3];
    ASSERT_OK(tsr_block_pool_alloc(p, 2, ids));
    tsr_block_pool_set_hash(p, ids[0], h0);
    tsr_block_pool_set_hash(p, ids[1], h1);
    ASSERT_EQ_INT(tsr_block_pool_lookup(p, h0), ids[0]);
    /* Freed (reverse order): still a hit. */
    int32_t rev[2] = {ids[1], ids[0]};
    tsr_block_pool_unref(p, rev, 2);
    ASSERT_EQ_INT(tsr_block_pool_lookup(p, h0), ids[0]);
    ASSERT_EQ_INT(tsr_block_pool_lookup(p, h1), ids[1]);
    /* The never-used block goes first, then the tail block (h1), evicting its hash. */
    int32_t a[2];
    ASSERT_OK(tsr_block_pool_alloc(p, 2, a));
    ASSERT_EQ_INT(a[0], 2);
    ASSERT_EQ_INT(a[1], ids[1]);
    ASSERT_EQ_INT(tsr_block_pool_lookup(p, h1), -1);
    ASSERT_EQ_INT(tsr_block_pool_lookup(p, h0), ids[0]);
    ASSERT_EQ_INT(p->cached_evictions, 1);
    tsr_block_pool_destroy(p);
}

TSR_TEST(test_take_free_uncached) {
    tsr_block_pool *p = NULL;
    ASSERT_OK(tsr_block_pool_create(6, &p));
    int32_t ids[2];
    ASSERT_OK(tsr_block_pool_alloc(p, 2, ids)); /* 0, 1 */
    tsr_block_pool_set_hash(p, ids[1], 77);
    tsr_block_pool_unref(p, &ids[1], 1); /* 1: free, cached */
    ASSERT_EQ_INT(tsr_block_pool_take(p, 0), 0);  /* in use */
    ASSERT_EQ_INT(tsr_block_pool_take(p, 1), 0);  /* caches a block: never taken */
    ASSERT_EQ_INT(tsr_block_pool_take(p, -1), 0); /* out of range */
    ASSERT_EQ_INT(tsr_block_pool_take(p, 6), 0);
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 5);
    ASSERT_EQ_INT(tsr_block_pool_take(p, 4), 1); /* from the middle of the free list */
    ASSERT_EQ_INT(p->blocks[4].ref_cnt, 1);
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 4);
    ASSERT_EQ_INT(tsr_block_pool_take(p, 4), 0); /* once */
    /* The rest keep their order: uncached 2, 3, 5, then the cached block 1. */
    int32_t got[4];
    ASSERT_OK(tsr_block_pool_alloc(p, 4, got));
    ASSERT_EQ_INT(got[0], 2);
    ASSERT_EQ_INT(got[1], 3);
    ASSERT_EQ_INT(got[2], 5);
    ASSERT_EQ_INT(got[3], 1);
    ASSERT_EQ_INT(p->cached_evictions, 1);
    int32_t four = 4;
    tsr_block_pool_unref(p, &four, 1);
    ASSERT_EQ_INT(tsr_block_pool_num_free(p), 1);
    tsr_block_pool_destroy(p);
}

TSR_TEST_MAIN(test_alloc_free_counts, test_lru_order, test_hash_kept_until_reuse,
              test_take_free_uncached)
