#include <stdio.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "base/status.h"
#include "runtime/forward.h"
#include "runtime/kv_setup.h"
#include "runtime/model.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

#include "tests/policy_util.h"


/* A policy stat by its declared name. */
#define TSR__PS(name) ((int64_t)tsr_kv_policy_stat(&ps, name))
#define TSR__PSD(name) tsr_kv_policy_stat(&ps, name)
#define HD_ 8

/* One layer, one KV head, two query heads; keys are small noise except `hot` positions,
 * which point along the query direction: the speculative score must find them. */
TSR_KV_TEST(test_speculative_selection_and_bytes) {
    tsr_host_pool *host = NULL;
    ASSERT_OK(tsr_host_pool_create(0, &host));
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = HD_,
                              .block_size = 4, .max_seqs = 1, .max_seq_len = 4096,
                              .be = kvt_be};
    kc.memory_bytes = 32 * tsr_kv_paged_block_bytes(&kc);
    static const tsr_kv_policy_arg args[] = {{"offload-pairs", "2"}, {"offload-recall", "1"}};
    tsr_kv_policy_config pc = {.budget = 12, .args = args, .n_args = 2,
                               .n_heads = 2, .rope_interleaved = 1, .host = host,
                               .owns_host = 1};
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_policy_cache_create(tsr_kv_policy_find("offload"), &pc, &kc, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    enum { N = 100 };
    static float k[N * HD_], v[N * HD_];
    int hot[6] = {3, 17, 42, 55, 71, 90};
    uint32_t r = 7;
    for (int i = 0; i < N * HD_; i++) {
        r = r * 1664525u + 1013904223u;
        k[i] = ((float)((r >> 8) % 1000) / 1000.0f - 0.5f) * 0.2f;
        v[i] = (float)(i / HD_);
    }
    for (int h = 0; h < 6; h++) {
        k[hot[h] * HD_ + 2] = 4.0f; /* channel pair (2, 3): the high-energy pair */
        k[hot[h] * HD_ + 3] = 4.0f;
    }
    int32_t toks[N] = {0};
    ASSERT_OK(kv->ops->reserve(kv, 0, N));
    ASSERT_OK(kvt_write(kv, 0, 0, N, k, v));
    const tsr_kv_span *sp;
    int ns;
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns)); /* prefill: all current tokens resident */
    ASSERT_OK(kv->ops->commit(kv, 0, toks, N));
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT(TSR__PS("bytes_offloaded"), N * HD_ * 8);
    /* Decode one token whose queries align with the hot keys. */
    float q[2 * HD_] = {0}, k1[HD_] = {0}, v1[HD_] = {0};
    q[2] = q[3] = 1.0f;
    q[HD_ + 2] = q[HD_ + 3] = 1.0f;
    int32_t qpos = N;
    ASSERT_OK(kv->ops->reserve(kv, 0, 1));
    ASSERT_OK(kvt_write(kv, 0, 0, 1, k1, v1));
    ASSERT_OK(kv->ops->queries(kv, 0, 0, q, &qpos, 1, 2));
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
    int present[N + 1] = {0}, total = 0;
    for (int j = 0; j < ns; j++)
        for (int32_t i = 0; i < sp[j].n; i++, total++) {
            int32_t pos = sp[j].pos ? sp[j].pos[i] : sp[j].pos0 + i;
            present[pos] = 1;
            float v0; /* the fetched rows came back through the scatter */
            ASSERT_OK(kvt_read(&v0, sp[j].v + i * sp[j].stride, 1));
            ASSERT_NEAR(v0, pos < N ? (float)pos : 0.0f, 0);
        }
    ASSERT_EQ_INT(total, 12); /* budget: 11 prior + the new token */
    for (int h = 0; h < 6; h++) ASSERT_EQ_INT(present[hot[h]], 1);
    ASSERT_EQ_INT(present[N], 1);
    ASSERT_OK(kv->ops->commit(kv, 0, toks, 1));
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT(TSR__PS("spec_selections"), 1);
    ASSERT_TRUE(TSR__PS("spec_recall_n") == 1 && TSR__PSD("spec_recall") >= 6.0 / 11.0);
    ASSERT_EQ_INT(TSR__PS("evictions"), N - 11);
    ASSERT_EQ_INT(TSR__PS("bytes_fetched"), 0); /* all 11 were resident from the prefill */
    /* Next step with queries pointing elsewhere: some tokens must be fetched back. */
    float q2[2 * HD_] = {0};
    q2[0] = q2[1] = 1.0f;
    q2[HD_] = q2[HD_ + 1] = 1.0f;
    for (int i = 0; i < 8; i++) k[10 * HD_ + i] = 0.0f;
    qpos = N + 1;
    ASSERT_OK(kv->ops->reserve(kv, 0, 1));
    ASSERT_OK(kvt_write(kv, 0, 0, 1, k1, v1));
    ASSERT_OK(kv->ops->queries(kv, 0, 0, q2, &qpos, 1, 2));
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
    ASSERT_OK(kv->ops->commit(kv, 0, toks, 1));
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_TRUE(TSR__PS("bytes_fetched") > 0 && TSR__PS("bytes_fetched") % (HD_ * 8) == 0);
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), 12);
    ASSERT_TRUE(host->used >= (N + 2) * HD_ * 8);
    char json[1024];
    tsr_kv_detail d;
    tsr_kv_cache_detail(kv, &d);
    ASSERT_TRUE(tsr_kv_detail_json(&d, json, sizeof json) > 0);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&d.pol, "bytes_fetched"), TSR__PS("bytes_fetched"));
    ASSERT_EQ_INT(d.blocks.block_size, 4);
    ASSERT_STR_CONTAINS(json, "\"policy\":\"offload\"");
    ASSERT_STR_CONTAINS(json, "\"bytes_fetched\":");
    tsr_kv_cache_destroy(kv);
}

TSR_KV_FWD_TEST(test_forward_full_budget_equals_paged) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 50 };
    int32_t tp[GEN], to[GEN], tb[GEN];
    float *lp = tsr_malloc((size_t)m->cfg.vocab_size * 4);
    float *lo = tsr_malloc((size_t)m->cfg.vocab_size * 4);
    tsr_kv_cache *paged = NULL, *off = NULL, *small = NULL;
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "paged", 0, &paged));
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "offload", 1.0, &off));
    ASSERT_OK(tsr__greedy(m, be, paged, prompt, 48, 16, GEN, tp, lp));
    ASSERT_OK(tsr__greedy(m, be, off, prompt, 48, 16, GEN, to, lo));
    for (int g = 0; g < GEN; g++) ASSERT_EQ_INT(tp[g], to[g]);
    for (int i = 0; i < m->cfg.vocab_size; i++) ASSERT_NEAR(lp[i], lo[i], 1e-5);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(off, &ps);
    ASSERT_EQ_INT(TSR__PS("bytes_offloaded"),
                  (int64_t)(48 + GEN) * m->cfg.n_layers * m->cfg.n_kv_heads * m->cfg.head_dim * 8);
    ASSERT_EQ_INT(TSR__PS("evictions"), 0);
    /* 24-token budget: the resident set stays bounded, the host copy holds everything. */
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "offload", 24, &small));
    ASSERT_OK(tsr__greedy(m, be, small, prompt, 48, 16, GEN, tb, NULL));
    tsr_kv_stats s;
    small->ops->stats(small, &s);
    ASSERT_TRUE(s.tokens_resident <= 24);
    ASSERT_EQ_INT(small->ops->seq_len(small, 0), 48 + GEN);
    tsr_kv_cache_destroy(paged);
    tsr_kv_cache_destroy(off);
    tsr_kv_cache_destroy(small);
    tsr_free(lp);
    tsr_free(lo);
}

/* Through the forward pass (which gives the `queries` hook): decode with a 25 % budget must
 * use the speculative selection, never the recent-window fallback; with every channel pair
 * the speculation is exact (recall 1), and the resident set is not just the newest tokens. */
TSR_KV_FWD_TEST(test_forward_uses_speculation) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = 1 + (i * 37) % (m->cfg.vocab_size - 1);
    enum { GEN = 80 };
    int32_t toks[GEN];
    for (int exact = 0; exact < 2; exact++) {
        char pairs[16];
        snprintf(pairs, sizeof pairs, "%d", exact ? m->cfg.head_dim / 2 : 1);
        tsr_kv_policy_arg args[] = {{"offload-pairs", pairs}, {"offload-recall", "1"}};
        tsr_kv_options o = {.policy = "offload", .memory_bytes = 8 << 20, .block_size = 16,
                            .budget = 0.25, .max_seqs = 1, .policy_args = args,
                            .n_policy_args = 2, .be = be};
        tsr_kv_cache *kv = NULL;
        ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &kv));
        ASSERT_OK(tsr__greedy(m, be, kv, prompt, 8, 1, GEN, toks, NULL));
        tsr_kv_policy_stats ps;
        tsr_kv_policy_get_stats(kv, &ps);
        ASSERT_TRUE(TSR__PS("spec_selections") > 0);
        ASSERT_EQ_INT(TSR__PS("spec_fallbacks"), 0);
        ASSERT_TRUE(TSR__PS("spec_recall_n") > 0);
        double recall = TSR__PSD("spec_recall");
        if (exact) ASSERT_NEAR(recall, 1.0, 1e-9);
        else ASSERT_TRUE(recall > 0.2 && recall < 1.0);
        ASSERT_TRUE(TSR__PS("bytes_fetched") > 0);
        /* Some layer keeps a token older than the budget's recent window. */
        tsr_kv_cache *mech = tsr_kv_policy_mech(kv);
        int32_t len = kv->ops->seq_len(kv, 0), budget = (len + 3) / 4, old = 0;
        int32_t pos[64];
        for (int l = 0; l < m->cfg.n_layers; l++) {
            int32_t ns = tsr_kv_paged_slots(mech, l, 0);
            ASSERT_TRUE(ns <= budget && ns <= 64);
            ASSERT_OK(tsr_kv_paged_read_slots(mech, l, 0, pos, NULL));
            for (int32_t i = 0; i < ns; i++) old += pos[i] < len - budget;
        }
        ASSERT_TRUE(old > 0);
        tsr_kv_cache_destroy(kv);
    }
}

TSR_TEST_MAIN(test_speculative_selection_and_bytes, test_forward_full_budget_equals_paged,
              test_forward_uses_speculation)
