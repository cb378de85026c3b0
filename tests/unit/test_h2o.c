#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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


/* A policy stat by its declared name. */
#define TSR__PS(name) ((int64_t)tsr_kv_policy_stat(&ps, name))
#define G_ 2
#define HD_ 4
#define KVD_ (G_ * HD_)

static tsr_status tsr__mk_h2o(double budget, double recent, int materialize, int64_t limit,
                              tsr_kv_cache **kv) {
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = G_, .head_dim = HD_,
                              .block_size = 4, .max_seqs = 1, .max_seq_len = 4096,
                              .be = kvt_be, .kv_dtype = kvt_dtype()};
    kc.memory_bytes = 64 * tsr_kv_paged_block_bytes(&kc) * 2;
    char rtext[32], ltext[32];
    snprintf(rtext, sizeof rtext, "%.17g", recent);
    snprintf(ltext, sizeof ltext, "%lld", (long long)limit);
    tsr_kv_policy_arg args[] = {{"h2o-recent", rtext},
                                {"h2o-scores", materialize ? "materialize" : "tiled"},
                                {"h2o-materialize-limit", ltext}};
    tsr_kv_policy_config pc = {.budget = budget, .args = args, .n_args = 3, .n_heads = 2 * G_};
    return tsr_kv_policy_cache_create(tsr_kv_policy_find("h2o"), &pc, &kc, kv);
}

/* One step of n tokens with hand-built key scores for the spans' keys (in span order,
 * looked up by position through score_of_pos, split over the four query heads). */
static tsr_status tsr__h2o_step(tsr_kv_cache *kv, int32_t n, const float *score_of_pos) {
    TSR_TRY(kv->ops->reserve(kv, 0, n));
    int32_t len = kv->ops->seq_len(kv, 0);
    float k[64 * KVD_], v[64 * KVD_];
    for (int32_t i = 0; i < n * KVD_; i++) k[i] = v[i] = (float)(len + i / KVD_);
    TSR_TRY(kvt_write(kv, 0, 0, n, k, v));
    const tsr_kv_span *sp;
    int ns;
    TSR_TRY(kv->ops->spans(kv, 0, 0, &sp, &ns));
    int32_t total = 0;
    for (int j = 0; j < ns; j++) total += sp[j].n;
    float ks[2 * G_ * 256];
    static const float share[2 * G_] = {0.125f, 0.125f, 0.375f, 0.375f};
    int32_t t = 0;
    for (int j = 0; j < ns; j++)
        for (int32_t i = 0; i < sp[j].n; i++, t++) {
            int32_t pos = sp[j].pos ? sp[j].pos[i] : sp[j].pos0 + i;
            for (int h = 0; h < 2 * G_; h++)
                ks[(size_t)h * (size_t)total + (size_t)t] = share[h] * score_of_pos[pos];
        }
    TSR_TRY(kv->ops->observe(kv, 0, 0, ks));
    int32_t toks[64] = {0};
    return kv->ops->commit(kv, 0, toks, n);
}

static void tsr__resident(tsr_kv_cache *kv, int *present, int n) {
    tsr_kv_cache *m = tsr_kv_policy_mech(kv);
    int32_t pos[256];
    int32_t ns = tsr_kv_paged_slots(m, 0, 0);
    tsr_kv_paged_read_slots(m, 0, 0, pos, NULL);
    memset(present, 0, (size_t)n * sizeof *present);
    for (int32_t i = 0; i < ns; i++) present[pos[i]] = 1;
}

TSR_KV_TEST(test_heavy_hitters_and_recent_kept) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_h2o(6, 0.5, 0, 0, &kv)); /* 3 recent + 3 heavy */
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    float sc[64] = {0};
    for (int i = 0; i < 64; i++) sc[i] = 0.01f * (float)(i % 5);
    sc[1] = 5.0f;
    sc[4] = 3.0f;
    sc[2] = 4.0f;
    sc[8] = 9.0f; /* recent anyway */
    ASSERT_OK(tsr__h2o_step(kv, 10, sc));
    int present[64];
    tsr__resident(kv, present, 64);
    int expect[10] = {0, 1, 1, 0, 1, 0, 0, 1, 1, 1};
    for (int i = 0; i < 10; i++) ASSERT_EQ_INT(present[i], expect[i]);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.evictions, 4);
    ASSERT_EQ_INT(s.tokens_resident, 6);
    /* Eviction order: with 3 more tokens the window moves to 10..12; among the heavy
     * candidates (1, 2, 4 and the aged-out 7, 8, 9) the accumulated sums decide: 8 has 9.0,
     * then 1 (5.0) and 2 (4.0); 4 (3.0) and 7, 9 go. */
    memset(sc, 0, sizeof sc);
    ASSERT_OK(tsr__h2o_step(kv, 3, sc));
    tsr__resident(kv, present, 64);
    int expect2[13] = {0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1};
    for (int i = 0; i < 13; i++) ASSERT_EQ_INT(present[i], expect2[i]);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 13);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_budget_fraction_and_blocks_freed) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_h2o(0.25, 0.5, 0, 0, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    float sc[256] = {0};
    for (int step = 0; step < 4; step++) ASSERT_OK(tsr__h2o_step(kv, 40, sc));
    tsr_kv_cache *m = tsr_kv_policy_mech(kv);
    ASSERT_EQ_INT(tsr_kv_paged_slots(m, 0, 0), 40); /* 25 % of 160 */
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(m, 0, 0, NULL), 10);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.evictions, 120);
    /* With no scores at all the recent window and then the newest others are kept. */
    int present[256];
    tsr__resident(kv, present, 256);
    for (int i = 140; i < 160; i++) ASSERT_EQ_INT(present[i], 1);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_materialize_fails_cleanly) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_h2o(0, 0.5, 1, 1000, &kv)); /* matrix may take 1000 bytes */
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    float sc[256] = {0};
    ASSERT_OK(tsr__h2o_step(kv, 7, sc)); /* 4 heads x 7 x 7 x 4 = 784 bytes fit */
    tsr_kv_cache_destroy(kv);
    ASSERT_OK(tsr__mk_h2o(0, 0.5, 1, 1000, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    /* 4 heads x 8 x 8 x 4 = 1024 > 1000: refused before any work, nothing reserved. */
    ASSERT_EQ_INT(kv->ops->reserve(kv, 0, 8), TSR_ERR_NOMEM);
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(tsr_kv_policy_mech(kv), 0, 0, NULL), 0);
    ASSERT_STR_CONTAINS(tsr_last_error(), "materialize");
    ASSERT_STR_CONTAINS(tsr_last_error(), "score matrix");
    tsr_kv_cache_destroy(kv);
}

/* The kernel's tiled per-key sums equal the naive n x n matrix (materialize) sums. */
TSR_KV_TEST(test_tiled_scores_equal_materialized) {
    tsr_backend *be = kvt_be;
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_h2o(0, 0.5, 1, 0, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    enum { N = 150, H = 2 * G_ };
    static float q[N * H * HD_], k[N * KVD_], v[N * KVD_], out[N * H * HD_], ks[H * N];
    int32_t qpos[N], toks[N] = {0};
    uint32_t r = 12345;
    for (int i = 0; i < N * H * HD_; i++) {
        r = r * 1664525u + 1013904223u;
        q[i] = (float)((r >> 8) % 2000) / 500.0f - 2.0f;
    }
    for (int i = 0; i < N * KVD_; i++) {
        r = r * 1664525u + 1013904223u;
        k[i] = (float)((r >> 8) % 2000) / 500.0f - 2.0f;
        v[i] = k[i] * 0.5f;
    }
    for (int i = 0; i < N; i++) qpos[i] = i;
    ASSERT_OK(kv->ops->reserve(kv, 0, N));
    ASSERT_OK(kvt_write(kv, 0, 0, N, k, v));
    ASSERT_OK(kv->ops->queries(kv, 0, 0, q, qpos, N, H)); /* host queries */
    const tsr_kv_span *sp;
    int ns;
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
    /* Attention on the backend (q, out, key scores in its memory), as the forward runs
     * it; the scores come back to the host for observe. */
    memset(ks, 0, sizeof ks);
    float *dq = kvt_dev(q, N * H * HD_), *dout = kvt_dev(out, N * H * HD_);
    float *dks = kvt_dev(ks, H * N);
    ASSERT_TRUE(dq && dout && dks);
    tsr_attn_args a = {.q = dq, .q_pos = qpos, .n_q = N, .spans = sp, .n_spans = ns,
                       .n_heads = H, .n_kv_heads = G_, .head_dim = HD_, .out = dout,
                       .key_scores = dks};
    tsr_status ast = be->ops->attention(be, &a);
    if (ast == TSR_OK) ast = kvt_read(ks, dks, H * N);
    kvt_dev_free(dq);
    kvt_dev_free(dout);
    kvt_dev_free(dks);
    ASSERT_OK(ast);
    ASSERT_OK(kv->ops->observe(kv, 0, 0, ks)); /* stores the materialized sums */
    ASSERT_OK(kv->ops->commit(kv, 0, toks, N));
    float slot_scores[N];
    int32_t pos[N];
    ASSERT_OK(tsr_kv_paged_read_slots(tsr_kv_policy_mech(kv), 0, 0, pos, slot_scores));
    double total = 0;
    for (int i = 0; i < N; i++) {
        ASSERT_EQ_INT(pos[i], i);
        double want = 0;
        for (int h = 0; h < H; h++) want += ks[h * N + i];
        ASSERT_NEAR(slot_scores[i], want, 1e-3 * (1 + fabs(slot_scores[i])));
        total += slot_scores[i];
    }
    ASSERT_NEAR(total, (double)N * H, 1e-2); /* every query row's probabilities sum to 1 */
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT(TSR__PS("score_matrix_bytes_peak"), (int64_t)H * N * N * 4);
    tsr_kv_cache_destroy(kv);
}

/* One case of tests/data/h2o/ (tools/h2o_ref.py --write-testdata, the reference's own
 * eviction function): decode steps of one token with given per-position scores; after each
 * step the kept positions and their accumulated scores must be the reference's. Block size
 * 4, so evictions compact rows across blocks: a score that stayed in a slot instead of
 * following its token, a wrong recent-window rounding, budget or tie order shows here. */
static void tsr__h2o_case(const char *name) {
    char path[1024], line[8192];
    snprintf(path, sizeof path, "%s/tests/data/h2o/%s.txt", TSR_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int steps = 0;
    double budget = 0, recent = 0;
    ASSERT_TRUE(fgets(line, sizeof line, f) && sscanf(line, "%d %lf %lf", &steps, &budget,
                                                      &recent) == 3);
    ASSERT_TRUE(steps > 0 && steps <= 200);
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk_h2o(budget, recent, 0, 0, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    tsr_kv_cache *m = tsr_kv_policy_mech(kv);
    for (int i = 0; i < steps && !tsr_test_failed_flag; i++) {
        float sc[256] = {0};
        int32_t want_pos[256], pos[256];
        float want_sc[256], got_sc[256];
        int n_sc = 0, n_kept = 0, n_acc = 0, part = 0, step = -1;
        ASSERT_TRUE(fgets(line, sizeof line, f) != NULL);
        for (char *t = strtok(line, " \n"); t; t = strtok(NULL, " \n")) {
            if (!strcmp(t, "|")) part++;
            else if (step < 0) step = atoi(t);
            else if (part == 0 && n_sc < 256) sc[n_sc++] = (float)atoi(t) / 64.0f;
            else if (part == 1 && n_kept < 256) want_pos[n_kept++] = atoi(t);
            else if (part == 2 && n_acc < 256) want_sc[n_acc++] = (float)atoi(t) / 64.0f;
        }
        ASSERT_EQ_INT(step, i);
        ASSERT_EQ_INT(n_sc, i + 1);
        ASSERT_EQ_INT(n_acc, n_kept);
        ASSERT_OK(tsr__h2o_step(kv, 1, sc));
        int32_t n = tsr_kv_paged_slots(m, 0, 0);
        ASSERT_EQ_INT(n, n_kept);
        ASSERT_OK(tsr_kv_paged_read_slots(m, 0, 0, pos, got_sc));
        /* slot order is not position order after compaction: match by position */
        for (int32_t j = 0; j < n; j++) {
            int at = -1;
            for (int32_t w = 0; w < n_kept; w++)
                if (want_pos[w] == pos[j]) at = w;
            if (at < 0) fprintf(stderr, "%s step %d: position %d kept, not the reference's\n",
                                name, i, pos[j]);
            ASSERT_TRUE(at >= 0);
            ASSERT_NEAR(got_sc[j], want_sc[at], 1e-6);
        }
    }
    fclose(f);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_steps_match_reference) {
    tsr__h2o_case("steps_b050_r050");
    tsr__h2o_case("steps_b030_r050");
    tsr__h2o_case("steps_b020_r025");
}

TSR_KV_FWD_TEST(test_forward_full_budget_equals_paged) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 50 };
    int32_t tb[GEN];
    tsr__check_full_budget(m, be, "h2o", prompt, GEN);
    if (tsr_test_failed_flag) return;
    tsr_kv_cache *small = NULL;
    tsr_kv_stats s;
    /* A 32-token budget holds the resident set at 32 per layer (+ the step in flight). */
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "h2o", 32, &small));
    ASSERT_OK(tsr__greedy(m, be, small, prompt, 48, 16, GEN, tb, NULL));
    small->ops->stats(small, &s);
    ASSERT_EQ_INT(s.tokens_resident, 32);
    ASSERT_EQ_INT(small->ops->seq_len(small, 0), 48 + GEN);
    ASSERT_EQ_INT(s.evictions, (int64_t)(48 + GEN - 32) * m->cfg.n_layers);
    tsr_kv_cache_destroy(small);
}

/* --h2o-scores=materialize through the forward pass: the n x n matrix is rebuilt from the
 * queries the forward gives (one per layer and step), and at a 100 % budget the tokens are
 * paged's. */
TSR_KV_FWD_TEST(test_forward_materialize_uses_queries) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 20 };
    int32_t tp[GEN], tm[GEN], th[GEN];
    tsr_kv_cache *paged = NULL, *mat = NULL, *half = NULL;
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "paged", 0, &paged));
    static const tsr_kv_policy_arg mat_args[] = {{"h2o-scores", "materialize"}};
    tsr_kv_options o = {.policy = &tsr_kv_policy_h2o, .memory_bytes = 8 << 20, .block_size = 16,
                        .budget = 0, .max_seqs = 1, .policy_args = mat_args,
                        .n_policy_args = 1, .be = be, .kv_dtype = kvt_dtype_name()};
    ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &mat));
    o.budget = 0.5;
    ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &half));
    ASSERT_OK(tsr__greedy(m, be, paged, prompt, 48, 16, GEN, tp, NULL));
    ASSERT_OK(tsr__greedy(m, be, mat, prompt, 48, 16, GEN, tm, NULL));
    ASSERT_OK(tsr__greedy(m, be, half, prompt, 48, 16, GEN, th, NULL));
    for (int g = 0; g < GEN; g++) ASSERT_EQ_INT(tp[g], tm[g]);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(mat, &ps);
    ASSERT_EQ_INT(TSR__PS("score_matrix_rebuilds"), (int64_t)(3 + GEN) * m->cfg.n_layers);
    /* the largest: the last 16-query chunk over 48 keys */
    ASSERT_EQ_INT(TSR__PS("score_matrix_bytes_peak"), (int64_t)m->cfg.n_heads * 16 * 48 * 4);
    tsr_kv_policy_get_stats(half, &ps);
    ASSERT_EQ_INT(TSR__PS("score_matrix_rebuilds"), (int64_t)(3 + GEN) * m->cfg.n_layers);
    ASSERT_TRUE(TSR__PS("evictions") > 0);
    tsr_kv_cache_destroy(paged);
    tsr_kv_cache_destroy(mat);
    tsr_kv_cache_destroy(half);
}

TSR_TEST_MAIN(test_heavy_hitters_and_recent_kept, test_budget_fraction_and_blocks_freed,
              test_materialize_fails_cleanly, test_tiled_scores_equal_materialized,
              test_steps_match_reference, test_forward_full_budget_equals_paged, test_forward_materialize_uses_queries)
