/* Hugging Face loader, safetensors writer/reader, export round trips. Fixture directories are
 * built at test time under TSR_BINARY_DIR with tessera's own safetensors writer. */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/status.h"
#include "runtime/model/config.h"
#include "runtime/model/loader.h"
#include "runtime/model/model.h"
#include "runtime/format/safetensors.h"
#include "tests/test.h"

/* dim 16, hidden 24, 2 layers, 4 heads of 4, 2 kv heads, vocab 32. */
enum { DIM = 16, HID = 24, LAYERS = 2, HEADS = 4, KVH = 2, HD = 4, VOCAB = 32 };

typedef struct fx_tensor {
    char name[96];
    int64_t rows, cols; /* rows == 0: a vector of cols */
} fx_tensor;

static int fx_list(fx_tensor *t, bool tied) {
    int n = 0;
#define FX(r, c, ...)                                                                    \
    do {                                                                                 \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                              \
        t[n].rows = (r);                                                                 \
        t[n].cols = (c);                                                                 \
        n++;                                                                             \
    } while (0)
    FX(VOCAB, DIM, "model.embed_tokens.weight");
    for (int l = 0; l < LAYERS; l++) {
        FX(0, DIM, "model.layers.%d.input_layernorm.weight", l);
        FX(HEADS * HD, DIM, "model.layers.%d.self_attn.q_proj.weight", l);
        FX(KVH * HD, DIM, "model.layers.%d.self_attn.k_proj.weight", l);
        FX(KVH * HD, DIM, "model.layers.%d.self_attn.v_proj.weight", l);
        FX(DIM, HEADS * HD, "model.layers.%d.self_attn.o_proj.weight", l);
        FX(0, DIM, "model.layers.%d.post_attention_layernorm.weight", l);
        FX(HID, DIM, "model.layers.%d.mlp.gate_proj.weight", l);
        FX(HID, DIM, "model.layers.%d.mlp.up_proj.weight", l);
        FX(DIM, HID, "model.layers.%d.mlp.down_proj.weight", l);
    }
    FX(0, DIM, "model.norm.weight");
    if (!tied) FX(VOCAB, DIM, "lm_head.weight");
#undef FX
    return n;
}

/* k/64 with |k| <= 48: exact in f32, f16 and bf16, so every dtype round-trips exactly. */
static float fx_value(int tensor, int64_t i) {
    return (float)((tensor * 131 + i * 7) % 97 - 48) / 64.0f;
}

static void *fx_data(int ti, const fx_tensor *t, tsr_dtype dt) {
    int64_t n = (t->rows ? t->rows : 1) * t->cols;
    void *buf = tsr_malloc((size_t)n * tsr_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        float v = fx_value(ti, i);
        if (dt == TSR_F32) ((float *)buf)[i] = v;
        else if (dt == TSR_BF16) ((uint16_t *)buf)[i] = tsr_f32_to_bf16(v);
        else ((uint16_t *)buf)[i] = tsr_f32_to_f16(v);
    }
    return buf;
}

static void fx_mkdir(const char *d) {
    if (mkdir(d, 0755) != 0 && errno != EEXIST) fprintf(stderr, "mkdir %s failed\n", d);
}

static void fx_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void fx_config(const char *dir, bool tied, const char *extra) {
    char path[512], text[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(text, sizeof text,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
             " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,\n"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d,\n"
             " \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-05,\n"
             " \"tie_word_embeddings\": %s, \"bos_token_id\": 1, \"eos_token_id\": 2%s}\n",
             DIM, HID, LAYERS, HEADS, KVH, VOCAB, tied ? "true" : "false", extra ? extra : "");
    fx_write_text(path, text);
}

/* Writes a tiny HF directory; n_shards > 1 splits tensors round-robin with an index.
 * `mixed`: the first q_proj is stored as BF16 while the rest use `dt`. `skip`: a tensor name
 * left out. */
static tsr_status fx_write_dir(const char *dir, tsr_dtype dt, bool tied, int n_shards,
                               bool mixed, const char *skip) {
    fx_mkdir(dir);
    fx_config(dir, tied, NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    remove(path);
    fx_tensor ts[64];
    int n = fx_list(ts, tied);
    tsr_status st = TSR_OK;
    char index[8192];
    size_t il = (size_t)snprintf(index, sizeof index, "{\"metadata\": {}, \"weight_map\": {");
    bool first = true;
    for (int s = 0; s < n_shards && st == TSR_OK; s++) {
        tsr_st_entry e[64];
        void *data[64];
        int k = 0;
        for (int i = s; i < n; i += n_shards) {
            if (skip && !strcmp(ts[i].name, skip)) continue;
            bool odd = mixed && strstr(ts[i].name, "layers.0.self_attn.q_proj");
            tsr_dtype tdt = odd ? TSR_BF16 : dt;
            e[k] = (tsr_st_entry){.name = ts[i].name, .dtype = tdt,
                                  .n_dims = ts[i].rows ? 2 : 1};
            if (ts[i].rows) {
                e[k].shape[0] = ts[i].rows;
                e[k].shape[1] = ts[i].cols;
            } else {
                e[k].shape[0] = ts[i].cols;
            }
            data[k] = fx_data(i, &ts[i], tdt);
            k++;
        }
        char shard[64];
        if (n_shards == 1)
            snprintf(shard, sizeof shard, "model.safetensors");
        else
            snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        st = tsr_st_write_file(path, e, (const void *const *)data, k);
        for (int i = 0; i < k; i++) {
            tsr_free(data[i]);
            il += (size_t)snprintf(index + il, sizeof index - il, "%s\"%s\": \"%s\"",
                                   first ? "" : ", ", e[i].name, shard);
            first = false;
        }
    }
    if (n_shards > 1) {
        snprintf(index + il, sizeof index - il, "}}\n");
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        fx_write_text(path, index);
    }
    return st;
}

static float elem(const tsr_tensor *t, int64_t i) {
    float f;
    tsr_dtype_to_f32(t->dtype, (const char *)t->data + (size_t)i * tsr_dtype_size(t->dtype), &f,
                     1);
    return f;
}

/* Compares a loaded tensor with the fixture values of tensor index ti. Returns mismatches. */
static int fx_check(const tsr_tensor *t, int ti, const fx_tensor *ft) {
    int64_t rows = ft->rows ? ft->rows : 1;
    if (t->rows != rows || t->cols != ft->cols) return 1000000;
    int bad = 0;
    for (int64_t i = 0; i < rows * ft->cols; i++)
        if (elem(t, i) != fx_value(ti, i)) bad++;
    return bad;
}

/* Checks every tensor of a loaded fixture model. */
static int fx_check_model(const tsr_model *m, bool tied) {
    fx_tensor ts[64];
    int n = fx_list(ts, tied), k = 0, bad = 0;
    bad += fx_check(&m->tok_emb, k, &ts[k]);
    k++;
    for (int l = 0; l < LAYERS; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        const tsr_tensor *order[] = {&w->attn_norm, &w->wq,     &w->wk,   &w->wv,    &w->wo,
                                     &w->ffn_norm,  &w->w_gate, &w->w_up, &w->w_down};
        for (int j = 0; j < 9; j++, k++) bad += fx_check(order[j], k, &ts[k]);
    }
    bad += fx_check(&m->out_norm, k, &ts[k]);
    k++;
    if (!tied) bad += fx_check(&m->classifier, k, &ts[k]);
    else if (m->classifier.data != m->tok_emb.data) bad += 1;
    (void)n;
    return bad;
}

static void load_and_check(const char *dir, tsr_dtype dt, bool tied, int shards) {
    tsr_model *m = NULL;
    tsr_status st = fx_write_dir(dir, dt, tied, shards, false, NULL);
    ASSERT_OK(st);
    ASSERT_OK(tsr_model_load(dir, &m));
    ASSERT_EQ_INT(m->cfg.dtype, dt);
    ASSERT_EQ_INT(m->cfg.dim, DIM);
    ASSERT_EQ_INT(m->cfg.n_kv_heads, KVH);
    ASSERT_EQ_INT(m->cfg.head_dim, HD);
    ASSERT_EQ_INT(m->cfg.tied_embeddings, tied);
    ASSERT_EQ_INT(m->cfg.rope_interleaved, 0);
    ASSERT_EQ_INT(m->layers[0].attn_norm.dtype, TSR_F32);
    ASSERT_EQ_INT(m->layers[1].wq.dtype, dt);
    int bad = fx_check_model(m, tied);
    tsr_model_destroy(m);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_load_f32_untied) { load_and_check(TSR_BINARY_DIR "/hf_f32", TSR_F32, false, 1); }
TSR_TEST(test_load_f16_tied) { load_and_check(TSR_BINARY_DIR "/hf_f16", TSR_F16, true, 1); }
TSR_TEST(test_load_bf16_tied) { load_and_check(TSR_BINARY_DIR "/hf_bf16", TSR_BF16, true, 1); }
TSR_TEST(test_load_bf16_untied) {
    load_and_check(TSR_BINARY_DIR "/hf_bf16u", TSR_BF16, false, 1);
}
TSR_TEST(test_load_sharded) { load_and_check(TSR_BINARY_DIR "/hf_shard", TSR_BF16, false, 3); }

/* Matrices view the mmap: the q_proj pointer lies inside the file's data, not a copy. */
TSR_TEST(test_matrices_are_views) {
    const char *dir = TSR_BINARY_DIR "/hf_view";
    ASSERT_OK(fx_write_dir(dir, TSR_BF16, true, 1, false, NULL));
    size_t before = tsr_alloc_live_bytes();
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(dir, &m));
    /* Only norms (f32 copies) and bookkeeping are allocated: far less than the matrices. */
    size_t grew = tsr_alloc_live_bytes() - before;
    size_t mats = tsr_model_weight_bytes(m);
    tsr_model_destroy(m);
    ASSERT_TRUE(grew < mats / 2);
}

/* Mixed dtypes unify to the majority (here f32); the BF16 matrix is converted exactly. */
TSR_TEST(test_mixed_dtypes) {
    const char *dir = TSR_BINARY_DIR "/hf_mixed";
    ASSERT_OK(fx_write_dir(dir, TSR_F32, false, 1, true, NULL));
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(dir, &m));
    ASSERT_EQ_INT(m->cfg.dtype, TSR_F32);
    ASSERT_EQ_INT(m->layers[0].wq.dtype, TSR_F32);
    int bad = fx_check_model(m, false);
    tsr_model_destroy(m);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_safetensors_roundtrip) {
    const char *path = TSR_BINARY_DIR "/st_roundtrip.safetensors";
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {tsr_f32_to_bf16(0.5f), tsr_f32_to_bf16(-2.0f), tsr_f32_to_bf16(7.0f)};
    tsr_st_entry e[2] = {{.name = "a", .dtype = TSR_F32, .n_dims = 2, .shape = {2, 3}},
                         {.name = "b", .dtype = TSR_BF16, .n_dims = 1, .shape = {3}}};
    const void *d[2] = {a, b};
    ASSERT_OK(tsr_st_write_file(path, e, d, 2));
    tsr_st_file *f = NULL;
    ASSERT_OK(tsr_st_open(path, &f));
    ASSERT_EQ_INT(f->n_tensors, 2);
    /* Data region 8-byte aligned (spec convention). */
    uint64_t n = 0;
    memcpy(&n, f->map, 8);
    ASSERT_EQ_INT((8 + n) % 8, 0);
    const tsr_st_tensor *ta = tsr_st_find(f, "a"), *tb = tsr_st_find(f, "b");
    ASSERT_TRUE(ta && tb && !tsr_st_find(f, "c"));
    ASSERT_EQ_INT(ta->shape[0], 2);
    ASSERT_EQ_INT(ta->shape[1], 3);
    ASSERT_EQ_INT(tb->dtype, TSR_BF16);
    ASSERT_TRUE(memcmp(ta->data, a, sizeof a) == 0);
    ASSERT_TRUE(memcmp(tb->data, b, sizeof b) == 0);
    tsr_st_close(f);
}

TSR_TEST(test_config_llama3) {
    const char *dir = TSR_BINARY_DIR "/hf_cfg_l3";
    fx_mkdir(dir);
    fx_write_text(TSR_BINARY_DIR "/hf_cfg_l3/config.json",
                  "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 2048,"
                  " \"intermediate_size\": 8192, \"num_hidden_layers\": 16,"
                  " \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 64,"
                  " \"vocab_size\": 128256, \"max_position_embeddings\": 131072,"
                  " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
                  " \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,"
                  " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
                  " \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true,"
                  " \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 128000,"
                  " \"eos_token_id\": [128001, 128008, 128009]}");
    tsr_model_config c;
    ASSERT_OK(tsr_config_from_hf_json(TSR_BINARY_DIR "/hf_cfg_l3/config.json", &c));
    ASSERT_EQ_INT(c.dim, 2048);
    ASSERT_EQ_INT(c.n_kv_heads, 8);
    ASSERT_EQ_INT(c.head_dim, 64);
    ASSERT_EQ_INT(c.rope_scaling, TSR_ROPE_LLAMA3);
    ASSERT_NEAR(c.rope_factor, 32.0, 0);
    ASSERT_NEAR(c.rope_high_freq_factor, 4.0, 0);
    ASSERT_EQ_INT(c.rope_original_max_pos, 8192);
    ASSERT_NEAR(c.rope_theta, 500000.0, 0);
    ASSERT_EQ_INT(c.tied_embeddings, 1);
    ASSERT_EQ_INT(c.dtype, TSR_BF16);
    ASSERT_EQ_INT(c.bos_id, 128000);
    ASSERT_EQ_INT(c.n_eos_ids, 3);
    ASSERT_EQ_INT(c.eos_ids[2], 128009);
    ASSERT_EQ_INT(c.eos_id, 128001);
    ASSERT_EQ_INT(c.rope_interleaved, 0);
}

/* transformers >= 5 spelling: "dtype" and "rope_parameters" holding rope_theta. Defaults:
 * kv heads = heads, theta 10000, untied. */
TSR_TEST(test_config_v5_and_defaults) {
    const char *path = TSR_BINARY_DIR "/hf_cfg_v5.json";
    fx_write_text(path, "{\"model_type\": \"llama\", \"hidden_size\": 64,"
                        " \"intermediate_size\": 160, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 4, \"vocab_size\": 300,"
                        " \"max_position_embeddings\": 1024, \"dtype\": \"float16\","
                        " \"rope_parameters\": {\"rope_type\": \"default\","
                        " \"rope_theta\": 250000.0}, \"eos_token_id\": 7}");
    tsr_model_config c;
    ASSERT_OK(tsr_config_from_hf_json(path, &c));
    ASSERT_EQ_INT(c.n_kv_heads, 4);
    ASSERT_EQ_INT(c.head_dim, 16);
    ASSERT_NEAR(c.rope_theta, 250000.0, 0);
    ASSERT_EQ_INT(c.rope_scaling, TSR_ROPE_NONE);
    ASSERT_EQ_INT(c.dtype, TSR_F16);
    ASSERT_EQ_INT(c.tied_embeddings, 0);
    ASSERT_EQ_INT(c.bos_id, -1);
    ASSERT_EQ_INT(c.eos_id, 7);
    ASSERT_EQ_INT(c.n_eos_ids, 1);
    fx_write_text(path, "{\"model_type\": \"llama\", \"hidden_size\": 64,"
                        " \"intermediate_size\": 160, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 4, \"vocab_size\": 300,"
                        " \"max_position_embeddings\": 1024,"
                        " \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4.0}}");
    ASSERT_EQ_INT(tsr_config_from_hf_json(path, &c), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "dynamic");
    ASSERT_STR_CONTAINS(tsr_last_error(), path);
}

static int compare_tensor(const tsr_tensor *a, const tsr_tensor *b, tsr_dtype rounding) {
    if (a->rows != b->rows || a->cols != b->cols) return 1000000;
    int bad = 0;
    for (int64_t i = 0; i < a->rows * a->cols; i++) {
        float x = elem(a, i), y = elem(b, i);
        if (rounding == TSR_BF16) x = tsr_bf16_to_f32(tsr_f32_to_bf16(x));
        if (rounding == TSR_F16) x = tsr_f16_to_f32(tsr_f32_to_f16(x));
        if (x != y) bad++;
    }
    return bad;
}

static int compare_models(const tsr_model *a, const tsr_model *b, tsr_dtype rounding) {
    int bad = compare_tensor(&a->tok_emb, &b->tok_emb, rounding) +
              compare_tensor(&a->classifier, &b->classifier, rounding) +
              compare_tensor(&a->out_norm, &b->out_norm, rounding);
    for (int l = 0; l < a->cfg.n_layers; l++) {
        const tsr_layer_weights *x = &a->layers[l], *y = &b->layers[l];
        bad += compare_tensor(&x->attn_norm, &y->attn_norm, rounding) +
               compare_tensor(&x->wq, &y->wq, rounding) + compare_tensor(&x->wk, &y->wk, rounding) +
               compare_tensor(&x->wv, &y->wv, rounding) + compare_tensor(&x->wo, &y->wo, rounding) +
               compare_tensor(&x->ffn_norm, &y->ffn_norm, rounding) +
               compare_tensor(&x->w_gate, &y->w_gate, rounding) +
               compare_tensor(&x->w_up, &y->w_up, rounding) +
               compare_tensor(&x->w_down, &y->w_down, rounding);
    }
    return bad;
}

static void export_roundtrip(const char *spec, const char *dir, tsr_dtype dt, tsr_dtype rounding) {
    tsr_model *a = NULL, *b = NULL;
    ASSERT_OK(tsr_model_load(spec, &a));
    tsr_status st = tsr_export_hf(a, dir, dt);
    if (st != TSR_OK) tsr_model_destroy(a);
    ASSERT_OK(st);
    st = tsr_model_load(dir, &b);
    if (st != TSR_OK) tsr_model_destroy(a);
    ASSERT_OK(st);
    const tsr_model_config *x = &a->cfg, *y = &b->cfg;
    int bad = compare_models(a, b, rounding);
    bool same = x->dim == y->dim && x->hidden_dim == y->hidden_dim &&
                x->n_layers == y->n_layers && x->n_heads == y->n_heads &&
                x->n_kv_heads == y->n_kv_heads && x->head_dim == y->head_dim &&
                x->vocab_size == y->vocab_size && x->max_seq_len == y->max_seq_len &&
                x->norm_eps == y->norm_eps && x->rope_theta == y->rope_theta &&
                x->rope_scaling == y->rope_scaling && x->rope_factor == y->rope_factor &&
                x->rope_low_freq_factor == y->rope_low_freq_factor &&
                x->rope_high_freq_factor == y->rope_high_freq_factor &&
                x->rope_original_max_pos == y->rope_original_max_pos &&
                x->tied_embeddings == y->tied_embeddings && y->dtype == dt &&
                x->bos_id == y->bos_id && x->eos_id == y->eos_id && x->n_eos_ids == y->n_eos_ids;
    tsr_model_destroy(a);
    tsr_model_destroy(b);
    ASSERT_TRUE(same);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_export_synthetic_f32) {
    export_roundtrip("synthetic:tiny,seed=7", TSR_BINARY_DIR "/hf_exp_tiny", TSR_F32, TSR_F32);
}

/* A Llama-3-shaped (rope_scaling llama3, eos list, untied) small model in bf16. */
TSR_TEST(test_export_synthetic_bf16_llama3) {
    fx_write_text(TSR_BINARY_DIR "/hf_l3_small.json",
                  "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                  " \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                  " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
                  " \"vocab_size\": 100, \"max_position_embeddings\": 4096,"
                  " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
                  " \"rope_scaling\": {\"factor\": 8.0, \"high_freq_factor\": 4.0,"
                  " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 64,"
                  " \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": false,"
                  " \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 98,"
                  " \"eos_token_id\": [99, 97]}");
    export_roundtrip("synthetic:" TSR_BINARY_DIR "/hf_l3_small.json,seed=3",
                     TSR_BINARY_DIR "/hf_exp_l3", TSR_BF16, TSR_BF16); /* norms round */
}

TSR_TEST(test_export_convert_dtype) {
    export_roundtrip("synthetic:tiny", TSR_BINARY_DIR "/hf_exp_tiny_bf16", TSR_BF16, TSR_BF16);
    export_roundtrip("synthetic:tiny", TSR_BINARY_DIR "/hf_exp_tiny_f16", TSR_F16, TSR_F16);
}

/* Interleaved (llama2.c) rotary layout: exported q/k rows follow HF's permute(), i.e. row
 * h*hd + i comes from 2i and row h*hd + hd/2 + i from 2i + 1; other tensors are unchanged. */
TSR_TEST(test_export_permutes_rope) {
    const char *dir = TSR_BINARY_DIR "/hf_exp_perm";
    tsr_model *a = NULL, *b = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny,layers=2", &a));
    a->cfg.rope_interleaved = true;
    tsr_status st = tsr_export_hf(a, dir, TSR_F32);
    if (st == TSR_OK) st = tsr_model_load(dir, &b);
    if (st != TSR_OK) tsr_model_destroy(a);
    ASSERT_OK(st);
    int bad = 0;
    int hd = a->cfg.head_dim;
    for (int l = 0; l < 2; l++) {
        const tsr_tensor *src[2] = {&a->layers[l].wq, &a->layers[l].wk};
        const tsr_tensor *dst[2] = {&b->layers[l].wq, &b->layers[l].wk};
        for (int t = 0; t < 2; t++) {
            for (int64_t r = 0; r < dst[t]->rows; r++) {
                int64_t head = r / hd, j = r % hd;
                int64_t from = head * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
                if (memcmp(tsr_tensor_row(dst[t], r), tsr_tensor_row(src[t], from),
                           (size_t)dst[t]->cols * 4) != 0)
                    bad++;
            }
        }
        bad += compare_tensor(&a->layers[l].wv, &b->layers[l].wv, TSR_F32);
    }
    ASSERT_EQ_INT(b->cfg.rope_interleaved, 0);
    tsr_model_destroy(a);
    tsr_model_destroy(b);
    ASSERT_EQ_INT(bad, 0);
}

/* Re-export over an existing directory replaces it; no temporary files remain. */
TSR_TEST(test_export_overwrite) {
    const char *dir = TSR_BINARY_DIR "/hf_exp_over";
    tsr_model *a = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny,layers=1", &a));
    tsr_status st = tsr_export_hf(a, dir, TSR_F32);
    if (st == TSR_OK) st = tsr_export_hf(a, dir, TSR_BF16);
    tsr_model_destroy(a);
    ASSERT_OK(st);
    ASSERT_TRUE(access(TSR_BINARY_DIR "/hf_exp_over/config.json", F_OK) == 0);
    ASSERT_TRUE(access(TSR_BINARY_DIR "/hf_exp_over/config.json.tmp", F_OK) != 0);
    ASSERT_TRUE(access(TSR_BINARY_DIR "/hf_exp_over/model.safetensors.tmp", F_OK) != 0);
    tsr_model *b = NULL;
    ASSERT_OK(tsr_model_load(dir, &b));
    ASSERT_EQ_INT(b->cfg.dtype, TSR_BF16);
    tsr_model_destroy(b);
}

/* stories260K (llama2.c, tied) -> HF -> reload: untouched tensors equal bit for bit. */
TSR_TEST(test_export_stories260K) {
    const char *dir = TSR_BINARY_DIR "/hf_exp_stories";
    tsr_model *a = NULL, *b = NULL;
    ASSERT_OK(tsr_model_load(TSR_SOURCE_DIR "/models/stories260K.bin", &a));
    tsr_status st = tsr_export_hf(a, dir, TSR_F32);
    if (st == TSR_OK) st = tsr_model_load(dir, &b);
    if (st != TSR_OK) tsr_model_destroy(a);
    ASSERT_OK(st);
    int bad = compare_tensor(&a->tok_emb, &b->tok_emb, TSR_F32) +
              compare_tensor(&a->out_norm, &b->out_norm, TSR_F32);
    for (int l = 0; l < a->cfg.n_layers; l++)
        bad += compare_tensor(&a->layers[l].wv, &b->layers[l].wv, TSR_F32) +
               compare_tensor(&a->layers[l].w_up, &b->layers[l].w_up, TSR_F32) +
               compare_tensor(&a->layers[l].w_down, &b->layers[l].w_down, TSR_F32);
    bool tied = b->cfg.tied_embeddings && b->classifier.data == b->tok_emb.data;
    tsr_model_destroy(a);
    tsr_model_destroy(b);
    ASSERT_TRUE(tied);
    ASSERT_EQ_INT(bad, 0);
}

/* Untied llama2.c (negative vocab in the header, classifier appended): lm_head.weight is
 * exported and tie_word_embeddings is false. */
TSR_TEST(test_export_untied_llama2c) {
    const char *bin = TSR_BINARY_DIR "/stories260K_untied.bin";
    const char *dir = TSR_BINARY_DIR "/hf_exp_untied";
    FILE *in = fopen(TSR_SOURCE_DIR "/models/stories260K.bin", "rb");
    ASSERT_TRUE(in != NULL);
    fseek(in, 0, SEEK_END);
    size_t n = (size_t)ftell(in);
    fseek(in, 0, SEEK_SET);
    char *buf = tsr_malloc(n);
    size_t got = fread(buf, 1, n, in);
    fclose(in);
    int32_t hdr[7];
    memcpy(hdr, buf, sizeof hdr);
    size_t emb = (size_t)hdr[5] * (size_t)hdr[0];
    hdr[5] = -hdr[5];
    memcpy(buf, hdr, sizeof hdr);
    FILE *out = fopen(bin, "wb");
    bool ok = out && got == n && fwrite(buf, 1, n, out) == n;
    /* Classifier: the embedding negated, so that it differs from tok_emb. */
    for (size_t i = 0; ok && i < emb; i++) {
        float v;
        memcpy(&v, buf + 28 + 4 * i, 4);
        v = -v;
        ok = fwrite(&v, 4, 1, out) == 1;
    }
    if (out) fclose(out);
    tsr_free(buf);
    ASSERT_TRUE(ok);
    tsr_model *a = NULL, *b = NULL;
    ASSERT_OK(tsr_model_load(bin, &a));
    tsr_status st = tsr_export_hf(a, dir, TSR_F32);
    if (st == TSR_OK) st = tsr_model_load(dir, &b);
    if (st != TSR_OK) tsr_model_destroy(a);
    ASSERT_OK(st);
    int bad = compare_tensor(&a->classifier, &b->classifier, TSR_F32) +
              compare_tensor(&a->tok_emb, &b->tok_emb, TSR_F32);
    bool untied = !a->cfg.tied_embeddings && !b->cfg.tied_embeddings &&
                  elem(&b->classifier, 5) == -elem(&b->tok_emb, 5) && elem(&b->tok_emb, 5) != 0;
    tsr_model_destroy(a);
    tsr_model_destroy(b);
    ASSERT_TRUE(untied);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST_MAIN(test_load_f32_untied, test_load_f16_tied, test_load_bf16_tied,
              test_load_bf16_untied, test_load_sharded, test_matrices_are_views,
              test_mixed_dtypes, test_safetensors_roundtrip, test_config_llama3,
              test_config_v5_and_defaults, test_export_synthetic_f32,
              test_export_synthetic_bf16_llama3, test_export_convert_dtype,
              test_export_permutes_rope, test_export_overwrite, test_export_stories260K,
              test_export_untied_llama2c)
