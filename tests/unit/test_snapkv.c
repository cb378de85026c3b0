/* The snapkv policy (policies/snapkv.c): keys that the observation window's queries attend
 * to survive a prefill compression together with their pooling neighbourhood (kernel 7)
 * and the window (32 tokens), also when the window's queries came over several calls and
 * when the keys span several gather tiles; decode steps append up to budget + chunk rows and
 * are compressed again there, the window then made of decode queries; at a budget covering
 * the sequence it generates what paged generates. */
#include <math.h>
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
#define H_ (2 * G_)
#define HD_ 4
#define KVD_ (G_ * HD_)
#define WIN_ 32
#define MAXN_ 640

/* args: snapkv's options (n of them), e.g. {"snapkv-pool", "max"}; chunk: the rows a step
 * writes at most (0: the default, 512), which with the budget bounds a layer in decode. */
static tsr_status tsr__mk_snap_chunk(double budget, int32_t chunk, const tsr_kv_policy_arg *args,
                                     int n, tsr_kv_cache **kv) {
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = G_, .head_dim = HD_,
                              .block_size = 4, .max_seqs = 1, .max_seq_len = 4096,
                              .be = kvt_be, .kv_dtype = kvt_dtype()};
    kc.memory_bytes = (MAXN_ / 4 + 8) * tsr_kv_paged_block_bytes(&kc);
    tsr_kv_policy_config pc = {.budget = budget, .n_heads = H_, .args = args, .n_args = n,
                               .chunk = chunk};
    return tsr_kv_policy_cache_create(tsr_kv_policy_find("snapkv"), &pc, &kc, kv);
}

static tsr_status tsr__mk_snap_with(double budget, const tsr_kv_policy_arg *args, int n,
                                    tsr_kv_cache **kv) {
    return tsr__mk_snap_chunk(budget, 0, args, n, kv);
}

/* The defaults: window 32, kernel 7, average pooling. */
static tsr_status tsr__mk_snap(double budget, tsr_kv_cache **kv) {
    return tsr__mk_snap_with(budget, NULL, 0, kv);
}

static int tsr__is_planted(int32_t p, const int32_t *planted, int n_planted) {
    for (int i = 0; i < n_planted; i++)
        if (planted[i] == p) return 1;
    return 0;
}

/* Rows of positions [from, from + n): keys small pseudo-random, the planted ones large
 * along (1, 1, 1, 1) in both KV heads; queries of positions >= qfrom along (1, 1, 1, 1)
 * in every head, the others zero. */
static void tsr__rows(int32_t from, int32_t n, const int32_t *planted, int n_planted,
                      int32_t qfrom, float *k, float *v, float *q, int32_t *qpos) {
    for (int32_t i = 0; i < n; i++) {
        int32_t p = from + i;
        uint32_t r = 2654435761u * (uint32_t)(p + 1);
        for (int c = 0; c < KVD_; c++) {
            r = r * 1664525u + 1013904223u;
            float noise = (float)((r >> 8) % 200) / 1000.0f - 0.1f;
            k[(size_t)i * KVD_ + c] = tsr__is_planted(p, planted, n_planted) ? 3.0f : noise;
            v[(size_t)i * KVD_ + c] = (float)p;
        }
        for (int c = 0; c < H_ * HD_; c++) q[(size_t)i * H_ * HD_ + c] = p >= qfrom ? 2.0f : 0.0f;
        qpos[i] = p;
    }
}

/* One step of n tokens (the forward's order: reserve, write, queries, spans, commit). */
static tsr_status tsr__snap_step(tsr_kv_cache *kv, int32_t n, const int32_t *planted,
                                 int n_planted, int32_t qfrom) {
    static float k[MAXN_ * KVD_], v[MAXN_ * KVD_], q[MAXN_ * H_ * HD_];
    int32_t qpos[MAXN_], toks[MAXN_] = {0};
    TSR_TRY(kv->ops->reserve(kv, 0, n));
    int32_t len = kv->ops->seq_len(kv, 0);
    tsr__rows(len, n, planted, n_planted, qfrom, k, v, q, qpos);
    TSR_TRY(kvt_write(kv, 0, 0, n, k, v));
    TSR_TRY(kv->ops->queries(kv, 0, 0, q, qpos, n, H_));
    const tsr_kv_span *sp;
    int ns;
    TSR_TRY(kv->ops->spans(kv, 0, 0, &sp, &ns));
    return kv->ops->commit(kv, 0, toks, n);
}

/* present[p] for the resident positions; the V rows (which carry the position) must have
 * moved with their slots. Returns the resident count, -1 on a mismatch. */
static int tsr__present(tsr_kv_cache *kv, int *present, int n) {
    tsr_kv_cache *m = tsr_kv_policy_mech(kv);
    static int32_t pos[MAXN_];
    static float v[MAXN_ * KVD_];
    int32_t ns = tsr_kv_paged_slots(m, 0, 0);
    memset(present, 0, (size_t)n * sizeof *present);
    if (tsr_kv_paged_read_slots(m, 0, 0, pos, NULL) != TSR_OK ||
        tsr_kv_paged_gather(m, 0, 0, NULL, ns, NULL, v) != TSR_OK)
        return -1;
    for (int32_t i = 0; i < ns; i++) {
        present[pos[i]] = 1;
        if (v[(size_t)i * KVD_] != kvt_round((float)pos[i])) return -1;
    }
    return ns;
}

/* After a compression of len tokens: the window [len - win, len) and the 7-neighbourhood
 * of every planted key, nothing else. */
static void tsr__expect_kept_w(tsr_kv_cache *kv, int32_t len, const int32_t *planted,
                               int n_planted, int32_t win) {
    static int present[MAXN_];
    ASSERT_EQ_INT(tsr__present(kv, present, MAXN_), win + 7 * n_planted);
    for (int32_t p = 0; p < len; p++) {
        int want = p >= len - win;
        for (int i = 0; i < n_planted; i++)
            if (p >= planted[i] - 3 && p <= planted[i] + 3) want = 1;
        if (present[p] != want) fprintf(stderr, "  position %d of %d\n", p, len);
        ASSERT_EQ_INT(present[p], want);
    }
}

static void tsr__expect_kept(tsr_kv_cache *kv, int32_t len, const int32_t *planted,
                             int n_planted) {
    tsr__expect_kept_w(kv, len, planted, n_planted, WIN_);
}

/* One 96-token prefill: two planted keys, a budget of window + two pooling kernels. Only
 * pooling keeps the planted keys' neighbours, whose own scores are the noise's. */
TSR_KV_TEST(test_planted_keys_survive_with_pooling) {
    tsr_kv_cache *kv = NULL;
    const int32_t planted[2] = {10, 40};
    ASSERT_OK(tsr__mk_snap(WIN_ + 14, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 96, planted, 2, 96 - WIN_));
    tsr__expect_kept(kv, 96, planted, 2);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.evictions, 96 - 46);
    /* Decode steps append, nothing is evicted. */
    for (int i = 0; i < 5; i++) ASSERT_OK(tsr__snap_step(kv, 1, planted, 2, 0));
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), 46 + 5);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 101);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&ps, "snapkv_compressions"), 1);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&ps, "snapkv_unscored"), 0);
    ASSERT_EQ_INT(ps.evictions, 50);
    tsr_kv_cache_destroy(kv);
}

/* 600 keys (three gather tiles), planted keys in each tile. */
TSR_KV_TEST(test_planted_keys_across_tiles) {
    tsr_kv_cache *kv = NULL;
    const int32_t planted[3] = {100, 300, 520};
    ASSERT_OK(tsr__mk_snap(WIN_ + 21, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 600, planted, 3, 600 - WIN_));
    tsr__expect_kept(kv, 600, planted, 3);
    tsr_kv_cache_destroy(kv);
}

/* The window's queries come from 16 decode steps and a 16-token chunk: the policy keeps the
 * last 32 it was given, whatever the calls. The decode steps compress nothing. */
TSR_KV_TEST(test_window_over_several_calls) {
    tsr_kv_cache *kv = NULL;
    const int32_t planted[2] = {10, 40};
    ASSERT_OK(tsr__mk_snap(WIN_ + 14, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    for (int i = 0; i < 80; i++) ASSERT_OK(tsr__snap_step(kv, 1, planted, 2, 96 - WIN_));
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), 80);
    ASSERT_OK(tsr__snap_step(kv, 16, planted, 2, 96 - WIN_));
    tsr__expect_kept(kv, 96, planted, 2);
    tsr_kv_cache_destroy(kv);
}

/* --snapkv-pool max keeps the same neighbourhoods (a planted key is its neighbours' max);
 * --snapkv-kernel 1 (no pooling) keeps the planted keys but not their neighbours;
 * --snapkv-window 16 moves the window; an even kernel is refused. */
TSR_KV_TEST(test_options) {
    tsr_kv_cache *kv = NULL;
    const int32_t planted[2] = {10, 40};
    static const tsr_kv_policy_arg maxpool[] = {{"snapkv-pool", "max"}};
    ASSERT_OK(tsr__mk_snap_with(WIN_ + 14, maxpool, 1, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 96, planted, 2, 96 - WIN_));
    tsr__expect_kept(kv, 96, planted, 2);
    tsr_kv_cache_destroy(kv);

    static const tsr_kv_policy_arg nopool[] = {{"snapkv-kernel", "1"}};
    ASSERT_OK(tsr__mk_snap_with(WIN_ + 14, nopool, 1, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 96, planted, 2, 96 - WIN_));
    static int present[MAXN_];
    ASSERT_EQ_INT(tsr__present(kv, present, MAXN_), WIN_ + 14);
    ASSERT_EQ_INT(present[10], 1);
    ASSERT_EQ_INT(present[40], 1);
    int neighbours = 0;
    for (int d = 1; d <= 3; d++)
        neighbours += present[10 - d] + present[10 + d] + present[40 - d] + present[40 + d];
    ASSERT_TRUE(neighbours < 12);
    tsr_kv_cache_destroy(kv);

    static const tsr_kv_policy_arg win16[] = {{"snapkv-window", "16"}};
    ASSERT_OK(tsr__mk_snap_with(16 + 14, win16, 1, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 96, planted, 2, 96 - 16));
    tsr__expect_kept_w(kv, 96, planted, 2, 16);
    tsr_kv_cache_destroy(kv);

    static const tsr_kv_policy_arg even[] = {{"snapkv-kernel", "6"}};
    ASSERT_EQ_INT(tsr__mk_snap_with(46, even, 1, &kv), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--snapkv-kernel 6: must be odd");
}

/* A budget smaller than the window keeps the newest tokens. */
TSR_KV_TEST(test_budget_below_window) {
    tsr_kv_cache *kv = NULL;
    const int32_t planted[1] = {10};
    ASSERT_OK(tsr__mk_snap(20, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 64, planted, 1, 64 - WIN_));
    static int present[MAXN_];
    ASSERT_EQ_INT(tsr__present(kv, present, MAXN_), 20);
    for (int p = 0; p < 64; p++) ASSERT_EQ_INT(present[p], p >= 44);
    tsr_kv_cache_destroy(kv);
}

/* n decode steps (queries along the planted keys), each ending with the layer under its
 * bound (budget + chunk: the next step's row fits what the pool is sized for); asserts that
 * `compressions` of them compressed it, to `budget`. */
static void tsr__decode_bounded(tsr_kv_cache *kv, int n, const int32_t *planted, int n_planted,
                                int32_t budget, int32_t chunk, int compressions) {
    tsr_kv_cache *m = tsr_kv_policy_mech(kv);
    int compressed = 0;
    for (int i = 0; i < n; i++) {
        int32_t before = tsr_kv_paged_slots(m, 0, 0);
        ASSERT_OK(tsr__snap_step(kv, 1, planted, n_planted, 0));
        int32_t after = tsr_kv_paged_slots(m, 0, 0);
        ASSERT_TRUE(before + 1 <= budget + chunk); /* what the step held */
        ASSERT_TRUE(after < budget + chunk);
        if (after == before + 1) continue;
        ASSERT_EQ_INT(before + 1, budget + chunk); /* only the step that reached the bound */
        ASSERT_EQ_INT(after, budget);
        compressed++;
    }
    ASSERT_EQ_INT(compressed, compressions);
}

/* Decode steps grow a layer up to budget + chunk (what tsr_kv_policy_resident_of sizes the
 * pool for) and no further: the step that reaches it ends with the layer compressed to its
 * budget by the prompt's selection, its window the last 32 queries (decode queries now), so
 * the planted keys' neighbourhoods and the newest 32 positions stay. */
TSR_KV_TEST(test_decode_recompresses_at_bound) {
    enum { CHUNK = 16, BUDGET = WIN_ + 14 };
    tsr_kv_cache *kv = NULL;
    const int32_t planted[2] = {10, 40};
    ASSERT_OK(tsr__mk_snap_chunk(BUDGET, CHUNK, NULL, 0, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 96, planted, 2, 96 - WIN_));
    tsr__expect_kept(kv, 96, planted, 2);
    /* 15 steps stay under the bound (the paper's append), the 16th reaches it */
    tsr__decode_bounded(kv, CHUNK - 1, planted, 2, BUDGET, CHUNK, 0);
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), BUDGET + CHUNK - 1);
    tsr__decode_bounded(kv, 1, planted, 2, BUDGET, CHUNK, 1);
    tsr__expect_kept(kv, 96 + CHUNK, planted, 2);
    /* and so on every CHUNK steps, for as long as it generates */
    tsr__decode_bounded(kv, 5 * CHUNK, planted, 2, BUDGET, CHUNK, 5);
    tsr__expect_kept(kv, 96 + 6 * CHUNK, planted, 2);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&ps, "snapkv_compressions"), 7);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&ps, "snapkv_decode_compressions"), 6);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&ps, "snapkv_unscored"), 0);
    ASSERT_EQ_INT(ps.evictions, (96 - BUDGET) + 6 * CHUNK);
    tsr_kv_cache_destroy(kv);
}

/* A prompt shorter than the budget is not compressed; decoding then grows it to budget +
 * chunk, not to the context, and that compression keeps what the decode window attends to. */
TSR_KV_TEST(test_short_prompt_bounded_in_decode) {
    enum { CHUNK = 8, BUDGET = WIN_ + 7 };
    tsr_kv_cache *kv = NULL;
    const int32_t planted[1] = {10};
    ASSERT_OK(tsr__mk_snap_chunk(BUDGET, CHUNK, NULL, 0, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 20, planted, 1, 0));
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), 20);
    tsr__decode_bounded(kv, BUDGET + CHUNK - 20, planted, 1, BUDGET, CHUNK, 1);
    tsr__expect_kept(kv, BUDGET + CHUNK, planted, 1);
    /* without a chunk in the config, the default 512 */
    tsr_kv_cache_destroy(kv);
    ASSERT_OK(tsr__mk_snap(BUDGET, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__snap_step(kv, 20, planted, 1, 0));
    tsr__decode_bounded(kv, MAXN_ - 20 - 1, planted, 1, BUDGET, 512, 1);
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), MAXN_ - 1 - 512);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_FWD_TEST(test_forward_full_budget_equals_paged) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 50 };
    int32_t tb[GEN];
    tsr__check_full_budget(m, be, "snapkv", prompt, GEN);
    if (tsr_test_failed_flag) return;
    tsr_kv_cache *small = NULL;
    tsr_kv_stats s;
    /* 40 tokens: the third 16-token chunk (48 > 40) compresses every layer to 40, whose
     * newest 32 are the window; the decode steps then append. */
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "snapkv", 40, &small));
    ASSERT_OK(tsr__greedy(m, be, small, prompt, 48, 16, GEN, tb, NULL));
    ASSERT_EQ_INT(small->ops->seq_len(small, 0), 48 + GEN);
    tsr_kv_cache *mech = tsr_kv_policy_mech(small);
    int32_t pos[128];
    for (int l = 0; l < small->n_layers; l++) {
        ASSERT_EQ_INT(tsr_kv_paged_slots(mech, l, 0), 40 + GEN);
        ASSERT_OK(tsr_kv_paged_read_slots(mech, l, 0, pos, NULL));
        int present[128] = {0};
        for (int i = 0; i < 40 + GEN; i++) present[pos[i]] = 1;
        for (int p = 48 - WIN_; p < 48 + GEN; p++) ASSERT_EQ_INT(present[p], 1);
    }
    small->ops->stats(small, &s);
    ASSERT_EQ_INT(s.evictions, (int64_t)8 * m->cfg.n_layers);
    tsr_kv_cache_destroy(small);
}

TSR_TEST_MAIN(test_planted_keys_survive_with_pooling, test_planted_keys_across_tiles,
              test_window_over_several_calls, test_options, test_budget_below_window,
              test_decode_recompresses_at_bound, test_short_prompt_bounded_in_decode,
              test_forward_full_budget_equals_paged)
