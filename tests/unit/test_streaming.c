/* The streaming policy (policies/streaming.c): after every step each layer holds exactly
 * the attention sinks (positions 0 .. 3) and the most recent budget - 4 positions; at a
 * budget covering the sequence it generates what paged generates. */
#include <stdint.h>

#include "kernels/backend.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "base/status.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

#include "tests/policy_util.h"

#define G_ 2
#define HD_ 4
#define KVD_ (G_ * HD_)
#define SINKS_ 4

/* sinks: --streaming-sinks as text, NULL for the default (4). */
static tsr_status tsr__mk_stream(double budget, int layers, const char *sinks,
                                 tsr_kv_cache **kv) {
    tsr_kv_paged_config kc = {.n_layers = layers, .n_kv_heads = G_, .head_dim = HD_,
                              .block_size = 4, .max_seqs = 1, .max_seq_len = 4096,
                              .be = kvt_be, .kv_dtype = kvt_dtype()};
    kc.memory_bytes = 64 * tsr_kv_paged_block_bytes(&kc) * layers;
    tsr_kv_policy_arg arg = {"streaming-sinks", sinks};
    tsr_kv_policy_config pc = {.budget = budget, .n_heads = 2 * G_, .args = &arg,
                               .n_args = sinks ? 1 : 0};
    return tsr_kv_policy_cache_create(tsr_kv_policy_find("streaming"), &pc, &kc, kv);
}

/* One step of n tokens in every layer; the K/V rows carry their position. */
static tsr_status tsr__stream_step(tsr_kv_cache *kv, int32_t n) {
    TSR_TRY(kv->ops->reserve(kv, 0, n));
    int32_t len = kv->ops->seq_len(kv, 0);
    float k[64 * KVD_], v[64 * KVD_];
    for (int32_t i = 0; i < n * KVD_; i++) k[i] = v[i] = (float)(len + i / KVD_);
    for (int l = 0; l < kv->n_layers; l++) TSR_TRY(kvt_write(kv, l, 0, n, k, v));
    int32_t toks[64] = {0};
    return kv->ops->commit(kv, 0, toks, n);
}

/* present[p]: position p is resident in `layer`; also checks that the gathered K rows are
 * the rows written for those positions (compaction moved them intact). */
static int tsr__present(tsr_kv_cache *kv, int layer, int *present, int n) {
    tsr_kv_cache *m = tsr_kv_policy_mech(kv);
    int32_t pos[256];
    float k[256 * KVD_];
    int32_t ns = tsr_kv_paged_slots(m, layer, 0);
    memset(present, 0, (size_t)n * sizeof *present);
    if (tsr_kv_paged_read_slots(m, layer, 0, pos, NULL) != TSR_OK ||
        tsr_kv_paged_gather(m, layer, 0, NULL, ns, k, NULL) != TSR_OK)
        return -1;
    for (int32_t i = 0; i < ns; i++) {
        present[pos[i]] = 1;
        if (k[(size_t)i * KVD_] != (float)pos[i]) return -1;
    }
    return ns;
}

/* Exactly positions [0, sinks) and [len - (budget - sinks), len) in every layer. */
static void tsr__expect_sinks_n(tsr_kv_cache *kv, int32_t len, int32_t budget, int32_t sinks) {
    int present[256];
    for (int l = 0; l < kv->n_layers; l++) {
        int ns = tsr__present(kv, l, present, 256);
        ASSERT_EQ_INT(ns, len < budget ? len : budget);
        for (int32_t p = 0; p < len; p++)
            ASSERT_EQ_INT(present[p], p < sinks || p >= len - (budget - sinks) ? 1 : 0);
    }
}

static void tsr__expect_sinks_recent(tsr_kv_cache *kv, int32_t len, int32_t budget) {
    tsr__expect_sinks_n(kv, len, budget, SINKS_);
}

TSR_KV_TEST(test_sinks_and_recent_kept) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_stream(10, 2, NULL, &kv)); /* 4 sinks + 6 recent */
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__stream_step(kv, 8)); /* within the budget: nothing evicted */
    tsr__expect_sinks_recent(kv, 8, 10);
    ASSERT_OK(tsr__stream_step(kv, 5)); /* 13: the middle 4 .. 6 goes */
    tsr__expect_sinks_recent(kv, 13, 10);
    for (int i = 0; i < 20; i++) { /* decode steps slide the window past the sinks */
        ASSERT_OK(tsr__stream_step(kv, 1));
        tsr__expect_sinks_recent(kv, 14 + i, 10);
    }
    ASSERT_OK(tsr__stream_step(kv, 30)); /* a chunk longer than the window */
    tsr__expect_sinks_recent(kv, 63, 10);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 63);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.evictions, (63 - 10) * 2);
    /* 10 rows in blocks of 4: the emptied blocks went back to the pool */
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(tsr_kv_policy_mech(kv), 0, 0, NULL), 3);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&ps, "tokens_processed"), 63);
    ASSERT_EQ_INT(ps.evictions, (63 - 10) * 2);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_budget_fraction_and_tiny_budget) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_stream(0.25, 1, NULL, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    for (int step = 0; step < 4; step++) ASSERT_OK(tsr__stream_step(kv, 40));
    tsr__expect_sinks_recent(kv, 160, 40); /* 25 % of 160: 4 sinks + 36 recent */
    tsr_kv_cache_destroy(kv);
    /* A budget below the sinks keeps the first tokens only. */
    ASSERT_OK(tsr__mk_stream(3, 1, NULL, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__stream_step(kv, 12));
    int present[256];
    ASSERT_EQ_INT(tsr__present(kv, 0, present, 256), 3);
    for (int p = 0; p < 12; p++) ASSERT_EQ_INT(present[p], p < 3);
    tsr_kv_cache_destroy(kv);
}

/* --streaming-sinks: 0 is a plain sliding window, 2 keeps two sinks. */
TSR_KV_TEST(test_sinks_option) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_stream(10, 1, "0", &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__stream_step(kv, 30));
    tsr__expect_sinks_n(kv, 30, 10, 0);
    tsr_kv_cache_destroy(kv);
    ASSERT_OK(tsr__mk_stream(10, 1, "2", &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__stream_step(kv, 30));
    ASSERT_OK(tsr__stream_step(kv, 1));
    tsr__expect_sinks_n(kv, 31, 10, 2);
    tsr_kv_cache_destroy(kv);
    ASSERT_EQ_INT(tsr__mk_stream(10, 1, "-1", &kv), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--streaming-sinks -1");
}

TSR_KV_FWD_TEST(test_forward_full_budget_equals_paged) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 50 };
    int32_t tb[GEN];
    tsr__check_full_budget(m, be, "streaming", prompt, GEN);
    if (tsr_test_failed_flag) return;
    tsr_kv_cache *small = NULL;
    tsr_kv_stats s;
    /* 32 tokens: every layer ends with the 4 sinks and the 28 newest positions. */
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "streaming", 32, &small));
    ASSERT_OK(tsr__greedy(m, be, small, prompt, 48, 16, GEN, tb, NULL));
    ASSERT_EQ_INT(small->ops->seq_len(small, 0), 48 + GEN);
    tsr_kv_cache *mech = tsr_kv_policy_mech(small);
    int32_t pos[128];
    for (int l = 0; l < small->n_layers; l++) {
        ASSERT_EQ_INT(tsr_kv_paged_slots(mech, l, 0), 32);
        ASSERT_OK(tsr_kv_paged_read_slots(mech, l, 0, pos, NULL));
        int present[128] = {0};
        for (int i = 0; i < 32; i++) present[pos[i]] = 1;
        for (int p = 0; p < 48 + GEN; p++)
            ASSERT_EQ_INT(present[p], p < SINKS_ || p >= 48 + GEN - 28 ? 1 : 0);
    }
    small->ops->stats(small, &s);
    ASSERT_EQ_INT(s.evictions, (int64_t)(48 + GEN - 32) * m->cfg.n_layers);
    tsr_kv_cache_destroy(small);
}

TSR_TEST_MAIN(test_sinks_and_recent_kept, test_budget_fraction_and_tiny_budget,
              test_sinks_option, test_forward_full_budget_equals_paged)
