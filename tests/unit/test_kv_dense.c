#include "memory/kv_cache.h"
#include "base/status.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

TSR_KV_TEST(test_write_commit_spans) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_dense_create_dtype(kvt_be, 2, 2, 4, 300, 2, kvt_dtype(), &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    float k[8 * 100], v[8 * 100];
    for (int i = 0; i < 800; i++) {
        k[i] = kvt_round((float)i);
        v[i] = kvt_round((float)-i);
    }
    /* Two steps: 100 tokens, then 100 more, forcing growth past the first capacity. */
    for (int step = 0; step < 2; step++) {
        ASSERT_OK(kv->ops->reserve(kv, 1, 100));
        for (int l = 0; l < 2; l++) ASSERT_OK(kvt_write(kv, l, 1, 100, k, v));
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
    float rk[151 * 8], rv[8];
    ASSERT_OK(kvt_read_rows(rk, sp[0].k, sp[0].dtype, 151, 8));
    ASSERT_OK(kvt_read_rows(rv, sp[0].v, sp[0].dtype, 1, 8));
    ASSERT_NEAR(rk[150 * 8 + 3], k[50 * 8 + 3], 0);
    ASSERT_NEAR(rv[7], v[7], 0);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.tokens_resident, 200);
    ASSERT_TRUE(s.bytes_peak >= 200 * (int64_t)tsr_kv_row_bytes(kvt_dtype(), 8) * 2 * 2);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_budget_and_errors) {
    tsr_kv_cache *kv = NULL;
    ASSERT_EQ_INT(tsr_kv_dense_create(NULL, 1, 1, 2, 10, 1, &kv), TSR_ERR_INVALID);
    ASSERT_OK(tsr_kv_dense_create_dtype(kvt_be, 1, 1, 2, 10, 1, kvt_dtype(), &kv));
    ASSERT_EQ_INT(kv->ops->seq_add(kv, 3), TSR_ERR_INVALID);
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_EQ_INT(kv->ops->seq_add(kv, 0), TSR_ERR_INVALID);
    ASSERT_EQ_INT(kv->ops->reserve(kv, 0, 11), TSR_ERR_BUDGET);
    ASSERT_OK(kv->ops->reserve(kv, 0, 10));
    kv->ops->seq_free(kv, 0);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 0);
    tsr_kv_cache_destroy(kv);
}


/* Growth of a sequence whose rows of all layers (one backend buffer) reach several MiB:
 * every layer's K and V rows survive each doubling (backend copies). */
TSR_KV_TEST(test_growth_keeps_every_layer) {
    enum { L = 3, KVD = 1024, STEP = 150, STEPS = 5 };
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_dense_create_dtype(kvt_be, L, 8, KVD / 8, STEP * STEPS, 1, kvt_dtype(), &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    static float k[STEP * KVD], v[STEP * KVD];
    int32_t toks[STEP] = {0};
    for (int step = 0; step < STEPS; step++) {
        ASSERT_OK(kv->ops->reserve(kv, 0, STEP));
        for (int l = 0; l < L; l++) {
            for (int i = 0; i < STEP * KVD; i++) { /* value = f(layer, row, column) */
                int row = step * STEP + i / KVD;
                k[i] = (float)(l * 1000000 + row * 1000 + i % KVD % 997);
                v[i] = -k[i];
            }
            ASSERT_OK(kvt_write(kv, l, 0, STEP, k, v));
        }
        ASSERT_OK(kv->ops->commit(kv, 0, toks, STEP));
    }
    for (int l = 0; l < L; l++) {
        const tsr_kv_span *sp;
        int ns;
        ASSERT_OK(kv->ops->spans(kv, l, 0, &sp, &ns));
        ASSERT_EQ_INT(sp[0].n, STEP * STEPS);
        static float rk[KVD], rv[KVD];
        for (int row = 0; row < STEP * STEPS; row += 37) {
            ASSERT_OK(kvt_read_rows(rk, tsr_kv_rows_at((float *)sp[0].k, sp[0].dtype, KVD,
                                                       (int64_t)row * KVD), sp[0].dtype, 1, KVD));
            ASSERT_OK(kvt_read_rows(rv, tsr_kv_rows_at((float *)sp[0].v, sp[0].dtype, KVD,
                                                       (int64_t)row * KVD), sp[0].dtype, 1, KVD));
            for (int c = 0; c < KVD; c += 101) {
                float want = kvt_round((float)(l * 1000000 + row * 1000 + c % 997));
                ASSERT_TRUE(rk[c] == want);
                ASSERT_TRUE(rv[c] == -want);
            }
        }
    }
    tsr_kv_cache_destroy(kv);
}

TSR_TEST_MAIN(test_write_commit_spans, test_budget_and_errors, test_growth_keeps_every_layer)
