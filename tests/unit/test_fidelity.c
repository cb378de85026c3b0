/* runtime/eval/fidelity.h on the bundled model, on cpu and cpu-fenced: the paged cache against
 * itself is exact (agreement 1, KL 0.0, the same NLL bits), h2o at a 10 % budget is not,
 * every figure is in range, and the probe's recall reads the cache's residency. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/file.h"
#include "runtime/eval/fidelity.h"
#include "runtime/eval/needle.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

/* Positions scored per run: enough for h2o at 10 % to evict (stories of ~300 tokens), few
 * enough for the fenced device's per-call fences. */
#define TF_TOKENS 400

static tsr_model *tf_model;
static tsr_tokenizer *tf_tok;
static char *tf_text;
static size_t tf_len;

/* The model, tokenizer and text of one test (tf_free after it, also on failure). */
static void tf_load(void) {
    ASSERT_OK(tsr_model_load(TSR_SOURCE_DIR "/models/stories260K.bin", &tf_model));
    ASSERT_OK(tsr_tokenizer_load(TSR_SOURCE_DIR "/models/tok512.bin", &tf_tok));
    ASSERT_OK(tsr_file_read(TSR_SOURCE_DIR "/bench/data/heldout.txt", "text", 0, &tf_text,
                            &tf_len));
}

/* The engines borrow the test's model (several runs on one model). */
static const tsr_engine_spec *tf_spec(void) {
    static tsr_engine_spec spec;
    spec = (tsr_engine_spec){.model = tf_model, .borrow_model = true};
    return &spec;
}

static void tf_free(void) {
    tsr_model_destroy(tf_model);
    if (tf_tok) tsr_tokenizer_destroy(tf_tok);
    tsr_free(tf_text);
    tf_model = NULL;
    tf_tok = NULL;
    tf_text = NULL;
}

static tsr_fidelity_options tf_opts(const char *policy, double budget, int probe) {
    return (tsr_fidelity_options){
        .backend = kvt_be->ops->name, .threads = 1, .max_tokens = TF_TOKENS,
        .probe_length = probe, .chunk_tokens = 64,
        .kv = {.policy = tsr_kv_policy_find(policy), .budget = budget, .memory_bytes = 4 << 20,
               .block_size = 16}};
}

static void tf_in_range(const tsr_fidelity_result *r) {
    ASSERT_TRUE(r->tokens > 0 && r->tokens <= TF_TOKENS);
    ASSERT_TRUE(isfinite(r->nll) && r->nll > 0);
    ASSERT_TRUE(isfinite(r->nll_full) && r->nll_full > 0);
    ASSERT_NEAR(r->ppl, exp(r->nll), 1e-9 * r->ppl);
    ASSERT_NEAR(r->ppl_full, exp(r->nll_full), 1e-9 * r->ppl_full);
    ASSERT_TRUE(r->agreement >= 0 && r->agreement <= 1);
    ASSERT_TRUE(r->kl >= 0 && isfinite(r->kl));
    ASSERT_TRUE(r->wall_s > 0);
}

static void test_paged_against_itself_is_exact_body(void);
TSR_KV_TEST(test_paged_against_itself_is_exact) {
    tf_load();
    if (!tsr_test_failed_flag) test_paged_against_itself_is_exact_body();
    tf_free();
}

static void test_paged_against_itself_is_exact_body(void) {
    tsr_fidelity_options o = tf_opts("paged", 0, 200);
    o.gen_tokens = 8;
    tsr_fidelity_result r;
    ASSERT_OK(tsr_fidelity_run(tf_spec(), tf_tok, tf_text, tf_len, &o, &r));
    tf_in_range(&r);
    ASSERT_STR_EQ(r.policy, "paged");
    /* the greedy continuations too (the stories scored whole before TF_TOKENS ran out) */
    ASSERT_TRUE(r.gen_tokens >= 8);
    ASSERT_TRUE(r.gen_agreement == 1.0 && r.gen_kl == 0.0);
    ASSERT_EQ_INT(r.tokens, TF_TOKENS);
    ASSERT_TRUE(r.agreement == 1.0);
    ASSERT_TRUE(r.kl == 0.0);
    ASSERT_TRUE(r.nll == r.nll_full);
    /* the full cache keeps the key wherever it is */
    ASSERT_EQ_INT(r.probe_tokens, 200);
    ASSERT_TRUE(r.probe_attention_recall == 1.0);
    ASSERT_TRUE(r.probe_text_recall >= 0 && r.probe_text_recall <= 1);
    ASSERT_TRUE(r.probe_key_pos > 0 && r.probe_key_tokens > 0);
}

static void test_h2o_ten_percent_differs_body(void);
TSR_KV_TEST(test_h2o_ten_percent_differs) {
    tf_load();
    if (!tsr_test_failed_flag) test_h2o_ten_percent_differs_body();
    tf_free();
}

static void test_h2o_ten_percent_differs_body(void) {
    /* chunk 1: the probe's prompt token by token, so h2o keeps 10 % of it at every step */
    tsr_fidelity_options o = tf_opts("h2o", 0.1, 200);
    o.chunk_tokens = 1;
    tsr_fidelity_result r;
    ASSERT_OK(tsr_fidelity_run(tf_spec(), tf_tok, tf_text, tf_len, &o, &r));
    tf_in_range(&r);
    ASSERT_STR_EQ(r.policy, "h2o");
    ASSERT_TRUE(r.agreement < 1.0);
    ASSERT_TRUE(r.kl > 0.0);
    ASSERT_TRUE(r.nll > r.nll_full); /* losing 90 % of the context costs likelihood */
    ASSERT_TRUE(r.probe_attention_recall >= 0 && r.probe_attention_recall < 1.0);
    ASSERT_STR_CONTAINS(r.kv_json, "\"policy\":\"h2o\"");
}

/* prompt_tokens: each story's first tokens as one chunk. paged stays exact; snapkv, which
 * compresses at the end of a prompt, differs with one; without one it equals the full cache
 * while decoding keeps each layer under its budget + one chunk (512 here: the stories are
 * shorter), and differs once decoding reaches that bound (chunk 16) and recompresses. */
static void test_prompt_mode_body(void);
TSR_KV_TEST(test_prompt_mode) {
    tf_load();
    if (!tsr_test_failed_flag) test_prompt_mode_body();
    tf_free();
}

static void test_prompt_mode_body(void) {
    const char *pols[] = {"paged", "snapkv", "snapkv", "snapkv"};
    const int chunk[] = {48, 48, 512, 16};
    for (int i = 0; i < 4; i++) {
        tsr_fidelity_options o = tf_opts(pols[i], i ? 0.2 : 0, 0);
        o.prompt_tokens = i >= 2 ? 0 : 48;
        o.chunk_tokens = chunk[i];
        tsr_fidelity_result r;
        ASSERT_OK(tsr_fidelity_run(tf_spec(), tf_tok, tf_text, tf_len, &o, &r));
        tf_in_range(&r);
        if (i == 1 || i == 3) {
            ASSERT_TRUE(r.agreement < 1.0 && r.kl > 0.0);
        } else {
            ASSERT_TRUE(r.agreement == 1.0 && r.kl == 0.0 && r.nll == r.nll_full);
        }
    }
}

/* No text: the probe alone, made of token ids without a tokenizer (a synthetic model's
 * case); text figures and text recall are not measured. */
static void test_probe_without_tokenizer_body(void);
TSR_KV_TEST(test_probe_without_tokenizer) {
    tf_load();
    if (!tsr_test_failed_flag) test_probe_without_tokenizer_body();
    tf_free();
}

static void test_probe_without_tokenizer_body(void) {
    tsr_fidelity_options o = tf_opts("paged", 0, 100);
    tsr_fidelity_result r;
    ASSERT_OK(tsr_fidelity_run(tf_spec(), NULL, NULL, 0, &o, &r));
    ASSERT_EQ_INT(r.tokens, 0);
    ASSERT_EQ_INT(r.probe_tokens, 100);
    ASSERT_TRUE(r.probe_text_recall < 0);
    ASSERT_TRUE(r.probe_attention_recall == 1.0);
    /* a probe longer than the context is refused with one line */
    o.probe_length = tf_model->cfg.max_seq_len + 1;
    ASSERT_TRUE(tsr_fidelity_run(tf_spec(), NULL, NULL, 0, &o, &r) == TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "exceeds the context");
}

/* Tail scoring of one document: exactly tail positions scored, one window; paged stays
 * exact in prompt and decode-only mode; snapkv differs when the prefix is a prompt, and in
 * decode-only mode once the document passes budget + one chunk (40 + 64 of 200 tokens: it
 * recompresses), not before (a chunk of 256). */
static void test_document_tail_body(void);
TSR_KV_TEST(test_document_tail) {
    tf_load();
    if (!tsr_test_failed_flag) test_document_tail_body();
    tf_free();
}

static void test_document_tail_body(void) {
    const char *pols[] = {"paged", "paged", "snapkv", "snapkv", "snapkv"};
    for (int i = 0; i < 5; i++) {
        tsr_fidelity_options o = tf_opts(pols[i], i >= 2 ? 0.2 : 0, 0);
        o.document = true;
        o.doc_tokens = 200;
        o.tail_tokens = 16;
        o.chunk_tokens = i == 4 ? 256 : 64;
        o.decode_prefix = i == 1 || i >= 3;
        tsr_fidelity_result r;
        ASSERT_OK(tsr_fidelity_run(tf_spec(), tf_tok, tf_text, tf_len, &o, &r));
        tf_in_range(&r);
        ASSERT_TRUE(r.tokens == 16 && r.windows == 1);
        if (i == 2 || i == 3)
            ASSERT_TRUE(r.kl > 0.0);
        else
            ASSERT_TRUE(r.agreement == 1.0 && r.kl == 0.0 && r.nll == r.nll_full);
    }
    /* a tail as long as the document is refused */
    tsr_fidelity_options o = tf_opts("paged", 0, 0);
    o.document = true;
    o.doc_tokens = 16;
    o.tail_tokens = 16;
    tsr_fidelity_result r;
    ASSERT_TRUE(tsr_fidelity_run(tf_spec(), tf_tok, tf_text, tf_len, &o, &r) == TSR_ERR_INVALID);
}

TSR_TEST(test_needle_match) {
    ASSERT_TRUE(tsr_needle_match("The pass key is 71432.", "71432"));
    ASSERT_TRUE(tsr_needle_match("71432", "71432"));
    ASSERT_TRUE(!tsr_needle_match("The pass key is 714321.", "71432"));
    ASSERT_TRUE(!tsr_needle_match("It is 58316, not 71432.", "71432"));
    ASSERT_TRUE(!tsr_needle_match("I do not know.", "71432"));
}

TSR_TEST(test_kl_and_nll) {
    float p[4] = {1, 2, 3, 4}, q[4] = {1, 2, 3, 4}, u[4] = {0, 0, 0, 0};
    ASSERT_TRUE(tsr_fidelity_kl(p, q, 4) == 0.0);
    /* KL(softmax(p) || uniform) = sum p log p + log 4 */
    double lse = log(exp(1.0) + exp(2.0) + exp(3.0) + exp(4.0)), want = log(4.0);
    for (int i = 0; i < 4; i++) want += exp(p[i] - lse) * (p[i] - lse);
    ASSERT_NEAR(tsr_fidelity_kl(p, u, 4), want, 1e-12);
    ASSERT_NEAR(tsr_fidelity_nll(u, 4, 2), log(4.0), 1e-12);
}

TSR_TEST_MAIN(test_paged_against_itself_is_exact, test_h2o_ten_percent_differs,
              test_prompt_mode, test_probe_without_tokenizer, test_document_tail,
              test_needle_match, test_kl_and_nll)
