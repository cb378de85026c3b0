/* What each shipped policy declares one sequence holds resident at most
 * (tsr_kv_policy_resident_of, policies/policy.h), against counts worked out by hand from
 * docs/kv-cache.md: a budgeted policy its budget at the full context plus one chunk per
 * layer; paged the context; offload's skew (the default, with the weights) its dense
 * layers whole, and with dense prefill one more layer of the whole context at its peak.
 *
 * The shape: a context of 1000, chunks of 64, 6 layers, a 20 % budget (200 tokens), blocks
 * of 16 rows: a budgeted layer 264 rows (17 blocks), a whole layer 1000 (63 blocks). */
#include "policies/policy.h"
#include "base/status.h"
#include "tests/test.h"

enum { CTX = 1000, CHUNK = 64, LAYERS = 6, BS = 16, BUD = 264, BUD_B = 17, ALL_B = 63 };

typedef struct {
    int64_t need_rows, want_rows, need_blocks, want_blocks;
} tsr__want;

/* The counts for `dense` whole layers, `budgeted` budgeted ones and, with `extra`, one
 * budgeted layer whole at the peak. */
static tsr__want tsr__mix(int dense, int budgeted, int extra) {
    tsr__want w = {.need_rows = (int64_t)dense * CTX + (int64_t)budgeted * BUD,
                   .need_blocks = (int64_t)dense * ALL_B + (int64_t)budgeted * BUD_B};
    w.want_rows = w.need_rows + (extra ? CTX - BUD : 0);
    w.want_blocks = w.need_blocks + (extra ? ALL_B - BUD_B : 0);
    return w;
}

/* Asserts that pol with args, budget, weights and stages declares w. */
static void tsr__check(const tsr_kv_policy_decl *pol, const tsr_kv_policy_arg *args,
                       int n_args, double budget, int has_model, int pipeline, tsr__want w) {
    tsr_kv_policy_extent in = {.budget = budget, .args = args, .n_args = n_args,
                               .context = CTX, .chunk = CHUNK, .n_layers = LAYERS,
                               .has_model = has_model, .pipeline = pipeline};
    tsr_kv_policy_resident r;
    ASSERT_OK(tsr_kv_policy_resident_of(pol, &in, BS, &r));
    ASSERT_EQ_INT(r.need_rows, w.need_rows);
    ASSERT_EQ_INT(r.want_rows, w.want_rows);
    ASSERT_EQ_INT(r.need_blocks, w.need_blocks);
    ASSERT_EQ_INT(r.want_blocks, w.want_blocks);
}

TSR_TEST(test_budgeted_policies_hold_budget_plus_chunk) {
    tsr__check(&tsr_kv_policy_paged, NULL, 0, 0.2, 1, 0, tsr__mix(LAYERS, 0, 0));
    tsr__check(&tsr_kv_policy_h2o, NULL, 0, 0.2, 1, 0, tsr__mix(0, LAYERS, 0));
    tsr__check(&tsr_kv_policy_snapkv, NULL, 0, 0.2, 1, 0, tsr__mix(0, LAYERS, 0));
    tsr__check(&tsr_kv_policy_streaming, NULL, 0, 0.2, 1, 0, tsr__mix(0, LAYERS, 0));
    /* a token budget: 200 tokens as a count */
    tsr__check(&tsr_kv_policy_h2o, NULL, 0, 200, 1, 0, tsr__mix(0, LAYERS, 0));
    /* no budget: everything */
    tsr__check(&tsr_kv_policy_h2o, NULL, 0, 0, 1, 0, tsr__mix(LAYERS, 0, 0));
    /* a budget plus a chunk over the context: the context */
    tsr_kv_policy_extent in = {.budget = 0.95, .context = CTX, .chunk = CHUNK,
                               .n_layers = LAYERS, .has_model = 1};
    tsr_kv_policy_resident r;
    ASSERT_OK(tsr_kv_policy_resident_of(&tsr_kv_policy_streaming, &in, BS, &r));
    ASSERT_EQ_INT(r.need_rows, (int64_t)LAYERS * CTX);
    ASSERT_EQ_INT(r.want_blocks, (int64_t)LAYERS * ALL_B);
}

TSR_TEST(test_offload_dense_layers_and_prefill) {
    /* the default: skew, 2 dense layers, dense prefill on */
    tsr__check(&tsr_kv_policy_offload, NULL, 0, 0.2, 1, 0, tsr__mix(2, 4, 1));
    tsr_kv_policy_arg off = {"offload-dense-prefill", "off"};
    tsr__check(&tsr_kv_policy_offload, &off, 1, 0.2, 1, 0, tsr__mix(2, 4, 0));
    tsr_kv_policy_arg three = {"offload-dense-layers", "3"};
    tsr__check(&tsr_kv_policy_offload, &three, 1, 0.2, 1, 0, tsr__mix(3, 3, 1));
    tsr_kv_policy_arg none = {"offload-dense-layers", "0"};
    tsr__check(&tsr_kv_policy_offload, &none, 1, 0.2, 1, 0, tsr__mix(0, 6, 1));
    /* every layer dense: nothing on top */
    tsr_kv_policy_arg all = {"offload-dense-layers", "6"};
    tsr__check(&tsr_kv_policy_offload, &all, 1, 0.2, 1, 0, tsr__mix(6, 0, 0));
    /* warmup has no dense layers, only dense prefill: asked for, without the weights (what
     * skew runs then) or under pipeline stages */
    tsr_kv_policy_arg warm = {"offload-mode", "warmup"};
    tsr__check(&tsr_kv_policy_offload, &warm, 1, 0.2, 1, 0, tsr__mix(0, 6, 1));
    tsr__check(&tsr_kv_policy_offload, NULL, 0, 0.2, 0, 0, tsr__mix(0, 6, 1));
    tsr__check(&tsr_kv_policy_offload, NULL, 0, 0.2, 1, 1, tsr__mix(0, 6, 1));
    tsr_kv_policy_arg warm_off[] = {{"offload-mode", "warmup"}, {"offload-dense-prefill", "off"}};
    tsr__check(&tsr_kv_policy_offload, warm_off, 2, 0.2, 1, 0, tsr__mix(0, 6, 0));
    /* no budget: every layer whole, nothing on top */
    tsr__check(&tsr_kv_policy_offload, NULL, 0, 0, 1, 0, tsr__mix(6, 0, 0));
}

TSR_TEST(test_bad_shape_and_option_refused) {
    tsr_kv_policy_extent in = {.budget = 0.2, .context = 0, .chunk = CHUNK, .n_layers = LAYERS};
    tsr_kv_policy_resident r;
    ASSERT_EQ_INT(tsr_kv_policy_resident_of(&tsr_kv_policy_h2o, &in, BS, &r), TSR_ERR_INVALID);
    in.context = CTX;
    ASSERT_EQ_INT(tsr_kv_policy_resident_of(&tsr_kv_policy_h2o, &in, 0, &r), TSR_ERR_INVALID);
    tsr_kv_policy_arg bad = {"offload-dense-prefill", "sometimes"};
    in.args = &bad;
    in.n_args = 1;
    ASSERT_EQ_INT(tsr_kv_policy_resident_of(&tsr_kv_policy_offload, &in, BS, &r),
                  TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "offload-dense-prefill");
}

TSR_TEST_MAIN(test_budgeted_policies_hold_budget_plus_chunk,
              test_offload_dense_layers_and_prefill, test_bad_shape_and_option_refused)
