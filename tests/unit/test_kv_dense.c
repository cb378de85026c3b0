#include "memory/kv_cache.h"
#include "runtime/base/status.h"
#include "tests/test.h"

TSR_TEST(test_write_commit_spans) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_dense_create(2, 2, 4, 300, 2, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    float k[8 * 100], v[8 * 100];
    for (int i = 0; i < 800; i++) {
        k[i] = (float)i;
        v[i] = (float)-i;
    }
    /* Two steps: 100 tokens, then 100 more, forcing growth past the first capacity. */
    for (int step = 0; step < 2; step++) {
        ASSERT_OK(kv->ops->reserve(kv, 1, 100));
        for (int l = 0; l < 2; l++) ASSERT_OK(kv->ops->write(kv, l, 1, 100, k, v));
        const tsr_kv_span *sp;
        int ns;
        ASSERT_OK(kv->ops->spans(kv, 1, 1, &sp, &ns));
        ASSERT_EQ_INT(ns, 1);
        ASSERT_EQ_INT(sp[0].n, 100 * (step + 1)); /* written rows are visible */
        int32_t toks[100] = {0};
        ASSERT_OK(kv->ops->commit(kv, 1, toks, 100));
    }
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 1), 200);
    const tsr_kv_span *sp;
    int ns;
    ASSERT_OK(kv->ops->spans(kv, 0, 1, &sp, &ns));
    ASSERT_NEAR(sp[0].k[150 * 8 + 3], k[50 * 8 + 3], 0);
    ASSERT_NEAR(sp[0].v[7], v[7], 0);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.tokens_resident, 200);
    ASSERT_TRUE(s.bytes_peak >= 200 * 8 * 4 * 2 * 2);
    tsr_kv_cache_destroy(kv);
}

TSR_TEST(test_budget_and_errors) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_dense_create(1, 1, 2, 10, 1, &kv));
    ASSERT_EQ_INT(kv->ops->seq_add(kv, 3), TSR_ERR_INVALID);
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_EQ_INT(kv->ops->seq_add(kv, 0), TSR_ERR_INVALID);
    ASSERT_EQ_INT(kv->ops->reserve(kv, 0, 11), TSR_ERR_BUDGET);
    ASSERT_OK(kv->ops->reserve(kv, 0, 10));
    kv->ops->seq_free(kv, 0);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 0);
    tsr_kv_cache_destroy(kv);
}

TSR_TEST_MAIN(test_write_commit_spans, test_budget_and_errors)
