/* synthetic:NAME models: shapes, options, determinism, value ranges and errors. */
#include <stdint.h>

#include "base/status.h"
#include "runtime/model/loader.h"
#include "runtime/model/model.h"
#include "tests/test.h"

static float elem(const tsr_tensor *t, int64_t i) {
    float f;
    tsr_dtype_to_f32(t->dtype, (const char *)t->data + (size_t)i * tsr_dtype_size(t->dtype), &f,
                     1);
    return f;
}

TSR_TEST(test_tiny_shapes) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny", &m)); /* runs tsr_model_check too */
    const tsr_model_config *c = &m->cfg;
    ASSERT_EQ_INT(c->dim, 64);
    ASSERT_EQ_INT(c->hidden_dim, 172);
    ASSERT_EQ_INT(c->n_layers, 5);
    ASSERT_EQ_INT(c->n_heads, 8);
    ASSERT_EQ_INT(c->n_kv_heads, 4);
    ASSERT_EQ_INT(c->head_dim, 8);
    ASSERT_EQ_INT(c->vocab_size, 512);
    ASSERT_EQ_INT(c->max_seq_len, 2048);
    ASSERT_EQ_INT(c->dtype, TSR_F32);
    ASSERT_TRUE(m->classifier.data == m->tok_emb.data);
    ASSERT_STR_EQ(m->source, "synthetic:tiny");
    tsr_model_destroy(m);
}

TSR_TEST(test_options) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny,dtype=bf16,layers=2,ctx=64,seed=9", &m));
    ASSERT_EQ_INT(m->cfg.n_layers, 2);
    ASSERT_EQ_INT(m->cfg.max_seq_len, 64);
    ASSERT_EQ_INT(m->cfg.dtype, TSR_BF16);
    ASSERT_EQ_INT(m->layers[1].w_up.dtype, TSR_BF16);
    ASSERT_EQ_INT(m->layers[1].ffn_norm.dtype, TSR_F32);
    tsr_model_destroy(m);
    ASSERT_OK(tsr_model_load("synthetic:tiny,dtype=f16", &m));
    ASSERT_EQ_INT(m->tok_emb.dtype, TSR_F16);
    tsr_model_destroy(m);
}

/* Same seed -> same bits; another seed -> different; fewer layers keep the same weights. */
TSR_TEST(test_determinism) {
    tsr_model *a = NULL, *b = NULL, *c = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny,seed=5", &a));
    ASSERT_OK(tsr_model_load("synthetic:tiny,seed=5,layers=2", &b));
    ASSERT_OK(tsr_model_load("synthetic:tiny,seed=6", &c));
    bool same = !memcmp(a->layers[1].wq.data, b->layers[1].wq.data,
                        tsr_tensor_bytes(&a->layers[1].wq)) &&
                !memcmp(a->tok_emb.data, b->tok_emb.data, tsr_tensor_bytes(&a->tok_emb));
    bool differ = memcmp(a->layers[1].wq.data, c->layers[1].wq.data,
                         tsr_tensor_bytes(&a->layers[1].wq)) != 0;
    /* Distinct tensors are not copies of one another. */
    bool distinct = memcmp(a->layers[0].w_gate.data, a->layers[0].w_up.data,
                           tsr_tensor_bytes(&a->layers[0].w_up)) != 0;
    tsr_model_destroy(a);
    tsr_model_destroy(b);
    tsr_model_destroy(c);
    ASSERT_TRUE(same);
    ASSERT_TRUE(differ);
    ASSERT_TRUE(distinct);
}

/* Matrices uniform in [-1/sqrt(cols), 1/sqrt(cols)) with mean ~0; norms in 1 +- 0.05. */
TSR_TEST(test_value_ranges) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny", &m));
    const tsr_tensor *w = &m->layers[2].w_down; /* cols = 172 */
    double lim = 1.0 / sqrt((double)w->cols), sum = 0, sq = 0, maxabs = 0;
    int64_t n = w->rows * w->cols;
    for (int64_t i = 0; i < n; i++) {
        double v = elem(w, i);
        sum += v;
        sq += v * v;
        if (fabs(v) > maxabs) maxabs = fabs(v);
    }
    double mean = sum / (double)n, var = sq / (double)n;
    float nmin = 2, nmax = 0;
    for (int64_t i = 0; i < m->cfg.dim; i++) {
        float v = elem(&m->layers[0].attn_norm, i);
        nmin = v < nmin ? v : nmin;
        nmax = v > nmax ? v : nmax;
    }
    tsr_model_destroy(m);
    ASSERT_TRUE(maxabs <= lim);
    ASSERT_TRUE(maxabs > 0.9 * lim);
    ASSERT_NEAR(mean, 0.0, 0.05 * lim);
    ASSERT_NEAR(var, lim * lim / 3.0, 0.1 * lim * lim); /* uniform variance a^2/3 */
    ASSERT_TRUE(nmin >= 0.95f && nmax <= 1.05f && nmax > nmin);
}

/* A real-vocab preset, one layer (about 37 MB). */
TSR_TEST(test_stories15M) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load("synthetic:stories15M,layers=1", &m));
    ASSERT_EQ_INT(m->cfg.dim, 288);
    ASSERT_EQ_INT(m->cfg.hidden_dim, 768);
    ASSERT_EQ_INT(m->cfg.n_heads, 6);
    ASSERT_EQ_INT(m->cfg.vocab_size, 32000);
    ASSERT_EQ_INT(m->cfg.max_seq_len, 1024);
    tsr_model_destroy(m);
}

TSR_TEST(test_config_path) {
    const char *path = TSR_BINARY_DIR "/synthetic_cfg.json";
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32,"
          " \"intermediate_size\": 48, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
          " \"num_key_value_heads\": 1, \"vocab_size\": 50, \"max_position_embeddings\": 99,"
          " \"torch_dtype\": \"bfloat16\", \"tie_word_embeddings\": false}",
          f);
    fclose(f);
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load("synthetic:" TSR_BINARY_DIR "/synthetic_cfg.json,layers=2", &m));
    ASSERT_EQ_INT(m->cfg.dim, 32);
    ASSERT_EQ_INT(m->cfg.n_kv_heads, 1);
    ASSERT_EQ_INT(m->cfg.n_layers, 2);
    ASSERT_EQ_INT(m->cfg.max_seq_len, 99);
    ASSERT_EQ_INT(m->cfg.dtype, TSR_BF16);
    ASSERT_TRUE(m->classifier.data != m->tok_emb.data);
    tsr_model_destroy(m);
}

TSR_TEST(test_errors) {
    tsr_model *m = NULL;
    ASSERT_EQ_INT(tsr_model_load("synthetic:nope", &m), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "unknown model \"nope\"");
    ASSERT_TRUE(m == NULL);
    ASSERT_EQ_INT(tsr_model_load("synthetic:tiny,dtype=q4", &m), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "unknown dtype \"q4\"");
    ASSERT_EQ_INT(tsr_model_load("synthetic:tiny,layers=0", &m), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "invalid layers");
    ASSERT_EQ_INT(tsr_model_load("synthetic:tiny,seed=x", &m), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "invalid seed");
    ASSERT_EQ_INT(tsr_model_load("synthetic:tiny,colour=red", &m), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "unknown option \"colour=red\"");
    ASSERT_EQ_INT(tsr_model_load("synthetic:", &m), TSR_ERR_INVALID);
}

/* Terabytes of weights: refused up front with NOMEM, nothing allocated. */
TSR_TEST(test_too_big) {
    const char *path = TSR_BINARY_DIR "/synthetic_huge.json";
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 65536, \"intermediate_size\": 65536,"
          " \"num_hidden_layers\": 64, \"num_attention_heads\": 512, \"vocab_size\": 1000000,"
          " \"max_position_embeddings\": 4096}",
          f);
    fclose(f);
    tsr_model *m = NULL;
    ASSERT_EQ_INT(tsr_model_load("synthetic:" TSR_BINARY_DIR "/synthetic_huge.json", &m),
                  TSR_ERR_NOMEM);
    ASSERT_STR_CONTAINS(tsr_last_error(), "GiB");
    ASSERT_TRUE(m == NULL);
}

TSR_TEST_MAIN(test_tiny_shapes, test_options, test_determinism, test_value_ranges,
              test_stories15M, test_config_path, test_errors, test_too_big)
