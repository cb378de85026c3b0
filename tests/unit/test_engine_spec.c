/* What the engine's spec asks of the start-up beyond placing and sizing by default
 * (runtime/engine/engine.h): weights converted to a dtype at load (a synthetic shape made in it),
 * a context the model must hold (refused with the model's config given back), and a paged
 * pool sized in blocks per layer whatever the model's shape. `tessera bench` and the bench
 * drivers start this way instead of loading the model themselves. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "memory/kv_cache.h"
#include "policies/policy.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "tests/test.h"

#define MODEL TSR_SOURCE_DIR "/models/stories260K.bin"

/* One prefill of a few ids; the last row's logits are finite. */
static void check_runs(tsr_engine *e) {
    int V = e->model->cfg.vocab_size;
    float *logits = tsr_malloc((size_t)V * sizeof *logits);
    ASSERT_TRUE(logits != NULL);
    int32_t ids[4] = {1, 20, 30, 40};
    ASSERT_OK(e->kv->ops->seq_add(e->kv, 0));
    tsr_batch_seq b = {.seq = 0, .tokens = ids, .n_tokens = 4, .want_logits = true};
    int rows = 0;
    ASSERT_OK(tsr_forward_run(e->fwd, e->kv, &b, 1, logits, &rows));
    e->kv->ops->seq_free(e->kv, 0);
    ASSERT_EQ_INT(rows, 1);
    for (int i = 0; i < V; i++) ASSERT_TRUE(isfinite(logits[i]));
    tsr_free(logits);
}

/* A stored f32 model comes up in bf16: matrices converted (rounded as tsr_f32_to_bf16
 * rounds), norms kept f32, a tied classifier still tied. */
TSR_TEST(test_convert_file) {
    tsr_model *ref = NULL;
    ASSERT_OK(tsr_model_load(MODEL, &ref));
    ASSERT_EQ_INT(ref->cfg.dtype, TSR_F32);
    tsr_engine_spec spec = {.model_path = MODEL, .backend = "cpu", .threads = 1,
                            .max_tokens = 8, .kv = {.max_seqs = 1}, .dense_kv_tokens = 16,
                            .convert_weights = true, .weights_dtype = TSR_BF16,
                            .pack_weights = true};
    tsr_engine *e = NULL;
    ASSERT_OK(tsr_engine_create(&spec, &e));
    const tsr_model *m = e->model;
    ASSERT_EQ_INT(m->cfg.dtype, TSR_BF16);
    ASSERT_EQ_INT(m->layers[0].wq.dtype, TSR_BF16);
    ASSERT_EQ_INT(m->tok_emb.dtype, TSR_BF16);
    ASSERT_EQ_INT(m->layers[0].attn_norm.dtype, TSR_F32);
    ASSERT_EQ_INT(m->out_norm.dtype, TSR_F32);
    ASSERT_EQ_INT(ref->classifier.data == ref->tok_emb.data, m->classifier.data == m->tok_emb.data);
    const float *w = ref->layers[1].w_down.data;
    const uint16_t *h = m->layers[1].w_down.data;
    size_t n = (size_t)ref->layers[1].w_down.rows * (size_t)ref->layers[1].w_down.cols;
    for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(h[i], tsr_f32_to_bf16(w[i]));
    ASSERT_TRUE(tsr_model_weight_bytes(m) < tsr_model_weight_bytes(ref));
    check_runs(e);
    tsr_engine_destroy(e);
    tsr_model_destroy(ref);
}

/* A synthetic shape is made in the dtype (no conversion), and the config comes back. */
TSR_TEST(test_convert_synthetic) {
    tsr_model_config cfg;
    tsr_engine_spec spec = {.model_path = "synthetic:tiny,layers=2", .backend = "cpu",
                            .threads = 1, .max_tokens = 8, .kv = {.max_seqs = 1},
                            .dense_kv_tokens = 16, .convert_weights = true,
                            .weights_dtype = TSR_BF16, .config_out = &cfg};
    tsr_engine *e = NULL;
    ASSERT_OK(tsr_engine_create(&spec, &e));
    ASSERT_STR_CONTAINS(e->model->source, "dtype=bf16");
    ASSERT_EQ_INT(e->model->cfg.dtype, TSR_BF16);
    ASSERT_EQ_INT(cfg.n_layers, 2);
    ASSERT_EQ_INT(cfg.dtype, TSR_BF16);
    check_runs(e);
    tsr_engine_destroy(e);
}

/* A model shorter than the job needs is refused after the load, with its config. */
TSR_TEST(test_min_context) {
    tsr_model_config cfg;
    tsr_engine_spec spec = {.model_path = MODEL, .backend = "cpu", .threads = 1,
                            .max_tokens = 8, .kv = {.max_seqs = 1}, .dense_kv_tokens = 16,
                            .min_context = 513, .config_out = &cfg};
    tsr_engine *e = NULL;
    ASSERT_EQ_INT(tsr_engine_create(&spec, &e), TSR_ERR_BUDGET);
    ASSERT_TRUE(e == NULL);
    ASSERT_EQ_INT(cfg.max_seq_len, 512);
    ASSERT_STR_CONTAINS(tsr_last_error(), "holds 512 positions, fewer than the 513");
    spec.min_context = 512;
    ASSERT_OK(tsr_engine_create(&spec, &e));
    tsr_engine_destroy(e);
    /* No model loaded: the config stays zero. */
    spec.model_path = TSR_SOURCE_DIR "/models/no-such-model.bin";
    ASSERT_EQ_INT(tsr_engine_create(&spec, &e), TSR_ERR_IO);
    ASSERT_EQ_INT(cfg.max_seq_len, 0);
}

/* kv_blocks: exactly that many blocks per layer, as the policy's pool stores them. */
static int blocks_total(tsr_kv_cache *kv) {
    char json[2048];
    tsr_kv_stats_json(kv, json, sizeof json);
    const char *p = strstr(json, "\"blocks_total\":");
    return p ? atoi(p + strlen("\"blocks_total\":")) : -1;
}

TSR_TEST(test_kv_blocks) {
    const tsr_kv_policy_decl *pols[] = {&tsr_kv_policy_paged, &tsr_kv_policy_h2o};
    for (int i = 0; i < 2; i++) {
        tsr_engine_spec spec = {.model_path = MODEL, .backend = "cpu", .threads = 1,
                                .max_tokens = 16, .kv_blocks = 7,
                                .kv = {.policy = pols[i], .block_size = 16, .max_seqs = 1,
                                       .max_context = 64, .chunk_tokens = 16,
                                       .no_prefix_cache = 1}};
        tsr_engine *e = NULL;
        ASSERT_OK(tsr_engine_create(&spec, &e));
        ASSERT_EQ_INT(blocks_total(e->kv), 7 * e->model->cfg.n_layers);
        check_runs(e);
        tsr_engine_destroy(e);
    }
}

/* A borrowed model is the caller's: never converted. */
TSR_TEST(test_borrowed_not_converted) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(MODEL, &m));
    tsr_engine_spec spec = {.model = m, .borrow_model = true, .backend = "cpu", .threads = 1,
                            .max_tokens = 8, .kv = {.max_seqs = 1}, .dense_kv_tokens = 16,
                            .convert_weights = true, .weights_dtype = TSR_BF16};
    tsr_engine *e = NULL;
    ASSERT_EQ_INT(tsr_engine_create(&spec, &e), TSR_ERR_INVALID);
    ASSERT_EQ_INT(m->cfg.dtype, TSR_F32);
    spec.weights_dtype = TSR_F32; /* already so: nothing to do */
    ASSERT_OK(tsr_engine_create(&spec, &e));
    tsr_engine_destroy(e);
    tsr_model_destroy(m);
}

TSR_TEST_MAIN(test_convert_file, test_convert_synthetic, test_min_context, test_kv_blocks,
              test_borrowed_not_converted)
