/* runtime/model/gguf_writer.h read back by runtime/format/gguf.h (every key type, tensor data
 * at the alignment, chunked writes, failures leaving no file), and
 * runtime/model/export_gguf.h: a model written as Q8_0 GGUF loads into the weights that
 * `--dtype q8_0` quantizes at load (block for block; rotary rows permuted as llama.cpp's). */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/test.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "base/status.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/rope_freq.h"
#include "runtime/format/gguf.h"
#include "runtime/model/export_gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/loader.h"
#include "runtime/model/quantize.h"
#include "runtime/text/tokenizer.h"
#include "base/file.h"
#include <cjson/cJSON.h>

static const char *path_of(const char *name) {
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/gguf_writer_%s", TSR_BINARY_DIR, name);
    return buf[k];
}

static bool exists(const char *p) { return access(p, F_OK) == 0; }

TSR_TEST(test_roundtrip) {
    const char *p = path_of("rt.gguf");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    remove(p);
    tsr_gguf_writer *w;
    ASSERT_OK(tsr_gguf_writer_create(p, &w));
    int32_t ints[3] = {-1, 7, 1 << 20};
    float fl[2] = {0.5f, -2.25f};
    const char *strs[3] = {"a", "\xe2\x96\x81hello", ""};
    uint64_t lens[3] = {1, 8, 0};
    ASSERT_OK(tsr_gguf_writer_add_str(w, "general.architecture", "llama"));
    ASSERT_OK(tsr_gguf_writer_add_u32(w, "k.u32", 4000000000u));
    ASSERT_OK(tsr_gguf_writer_add_i32(w, "k.i32", -5));
    ASSERT_OK(tsr_gguf_writer_add_f32(w, "k.f32", 1e-5f));
    ASSERT_OK(tsr_gguf_writer_add_bool(w, "k.bool", true));
    ASSERT_OK(tsr_gguf_writer_add_arr(w, "k.ints", TSR_GGUF_I32, ints, 3));
    ASSERT_OK(tsr_gguf_writer_add_arr(w, "k.floats", TSR_GGUF_F32, fl, 2));
    ASSERT_OK(tsr_gguf_writer_add_arr_str(w, "k.strs", strs, lens, 3));
    int64_t ne_v[1] = {5}, ne_q[2] = {32, 2}, ne_b[2] = {3, 3};
    ASSERT_OK(tsr_gguf_writer_add_tensor(w, "v", TSR_GGML_F32, 1, ne_v));
    ASSERT_OK(tsr_gguf_writer_add_tensor(w, "q", TSR_GGML_Q8_0, 2, ne_q));
    ASSERT_OK(tsr_gguf_writer_add_tensor(w, "b", TSR_GGML_BF16, 2, ne_b));
    uint8_t data[20 + 68 + 18];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 3);
    /* chunks across the tensor boundaries */
    ASSERT_OK(tsr_gguf_writer_write(w, data, 7));
    ASSERT_OK(tsr_gguf_writer_write(w, data + 7, 50));
    ASSERT_OK(tsr_gguf_writer_write(w, data + 57, sizeof data - 57));
    ASSERT_TRUE(exists(tmp) && !exists(p));
    ASSERT_OK(tsr_gguf_writer_close(w));
    ASSERT_TRUE(exists(p) && !exists(tmp));

    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(p, &g));
    ASSERT_EQ_INT(g->version, 3);
    ASSERT_EQ_INT(g->n_kv, 8);
    ASSERT_EQ_INT(g->n_tensors, 3);
    const char *s;
    int64_t v;
    double d;
    bool b;
    ASSERT_OK(tsr_gguf_get_str(g, "general.architecture", &s, NULL));
    ASSERT_STR_EQ(s, "llama");
    ASSERT_OK(tsr_gguf_get_int(g, "k.u32", &v, NULL));
    ASSERT_EQ_INT(v, 4000000000ll);
    ASSERT_OK(tsr_gguf_get_int(g, "k.i32", &v, NULL));
    ASSERT_EQ_INT(v, -5);
    ASSERT_OK(tsr_gguf_get_float(g, "k.f32", &d, NULL));
    ASSERT_TRUE((float)d == 1e-5f);
    ASSERT_OK(tsr_gguf_get_bool(g, "k.bool", &b, NULL));
    ASSERT_TRUE(b);
    const tsr_gguf_kv *kv = tsr_gguf_find(g, "k.ints");
    ASSERT_TRUE(kv && kv->elem == TSR_GGUF_I32 && kv->n == 3);
    ASSERT_EQ_INT(tsr_gguf_arr_int(kv, 2), 1 << 20);
    kv = tsr_gguf_find(g, "k.strs");
    ASSERT_TRUE(kv && kv->elem == TSR_GGUF_STRING && kv->n == 3);
    for (int i = 0; i < 3; i++) {
        uint64_t n;
        tsr_gguf_arr_str(kv, (uint64_t)i, &s, &n);
        ASSERT_EQ_INT(n, lens[i]);
        ASSERT_TRUE(memcmp(s, strs[i], n) == 0);
    }
    const tsr_gguf_tensor *t = tsr_gguf_tensor_find(g, "q");
    ASSERT_TRUE(t && t->n_dims == 2 && t->ne[0] == 32 && t->ne[1] == 2 && t->nbytes == 68);
    ASSERT_EQ_INT(t->offset % 32, 0);
    ASSERT_TRUE(memcmp(t->data, data + 20, 68) == 0);
    t = tsr_gguf_tensor_find(g, "b");
    ASSERT_TRUE(t && t->type == TSR_GGML_BF16 && memcmp(t->data, data + 88, 18) == 0);
    t = tsr_gguf_tensor_find(g, "v");
    ASSERT_TRUE(t && memcmp(t->data, data, 20) == 0);

    /* every key copied into another file reads back the same */
    const char *p2 = path_of("copy.gguf");
    ASSERT_OK(tsr_gguf_writer_create(p2, &w));
    for (uint64_t i = 0; i < g->n_kv; i++) ASSERT_OK(tsr_gguf_writer_add_kv(w, &g->kv[i]));
    ASSERT_OK(tsr_gguf_writer_close(w));
    tsr_gguf *g2;
    ASSERT_OK(tsr_gguf_open(p2, &g2));
    ASSERT_EQ_INT(g2->n_kv, g->n_kv);
    ASSERT_EQ_INT(g2->n_tensors, 0);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tsr_gguf_kv *a = &g->kv[i], *c = tsr_gguf_find(g2, a->key);
        ASSERT_TRUE(c && c->type == a->type && c->n == a->n);
    }
    kv = tsr_gguf_find(g2, "k.strs");
    uint64_t n;
    tsr_gguf_arr_str(kv, 1, &s, &n);
    ASSERT_TRUE(n == 8 && memcmp(s, strs[1], 8) == 0);
    tsr_gguf_close(g2);
    tsr_gguf_close(g);
    remove(p);
    remove(p2);
}

TSR_TEST(test_failures_leave_no_file) {
    const char *p = path_of("bad.gguf");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    remove(p);
    tsr_gguf_writer *w;
    int64_t ne[2] = {33, 2};
    ASSERT_OK(tsr_gguf_writer_create(p, &w));
    ASSERT_EQ_INT(tsr_gguf_writer_add_tensor(w, "q", TSR_GGML_Q8_0, 2, ne), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "32-value blocks");
    ASSERT_NE_INT(tsr_gguf_writer_close(w), TSR_OK); /* the failed add is remembered */
    ASSERT_TRUE(!exists(p) && !exists(tmp));

    /* a tensor short of its bytes */
    ne[0] = 4;
    ASSERT_OK(tsr_gguf_writer_create(p, &w));
    ASSERT_OK(tsr_gguf_writer_add_tensor(w, "x", TSR_GGML_F32, 2, ne));
    float f[8] = {0};
    ASSERT_OK(tsr_gguf_writer_write(w, f, 16));
    ASSERT_EQ_INT(tsr_gguf_writer_add_u32(w, "late", 1), TSR_ERR_INTERNAL);
    ASSERT_NE_INT(tsr_gguf_writer_close(w), TSR_OK);
    ASSERT_TRUE(!exists(p) && !exists(tmp));

    /* too many bytes */
    ASSERT_OK(tsr_gguf_writer_create(p, &w));
    ASSERT_OK(tsr_gguf_writer_add_tensor(w, "x", TSR_GGML_F32, 2, ne));
    ASSERT_EQ_INT(tsr_gguf_writer_write(w, f, 36), TSR_ERR_INTERNAL);
    tsr_gguf_writer_abort(w);
    ASSERT_TRUE(!exists(p) && !exists(tmp));

    /* a folder that does not exist: the error names the file */
    ASSERT_OK(tsr_gguf_writer_create(TSR_BINARY_DIR "/no/such/dir/x.gguf", &w));
    ASSERT_NE_INT(tsr_gguf_writer_close(w), TSR_OK);
    ASSERT_STR_CONTAINS(tsr_last_error(), "no/such/dir/x.gguf.tmp");
}

/* Row r of a Q8_0 or float tensor as f32. */
static void row_f32(const tsr_tensor *t, int64_t r, float *out) {
    if (t->dtype == TSR_Q8_0)
        tsr_q8_dequant_row(t->data, t->cols, r, out);
    else
        tsr_dtype_to_f32(t->dtype, tsr_tensor_row(t, r), out, (size_t)t->cols);
}

/* The GGUF's tensor g equals the quantized source q, whose rows are permuted per head
 * (heads > 0: llama.cpp's order, adjacent rotary pairs, from half rotation). */
static bool same_tensor(const tsr_tensor *q, const tsr_tensor *g, int heads) {
    if (q->rows != g->rows || q->cols != g->cols) return false;
    if (q->dtype != g->dtype) return false;
    float a[512], b[512];
    uint8_t qa[512], qb[512];
    for (int64_t r = 0; r < g->rows; r++) {
        int64_t hd = heads ? q->rows / heads : 1, h = r / hd, j = r % hd;
        int64_t sr = heads ? h * hd + (j % 2) * (hd / 2) + j / 2 : r;
        if (g->dtype == TSR_Q8_0) { /* the same blocks, byte for byte */
            tsr_q8_unpack_row(q->data, q->cols, sr, qa);
            tsr_q8_unpack_row(g->data, g->cols, r, qb);
            if (memcmp(qa, qb, (size_t)g->cols / 32 * 34) != 0) return false;
        } else {
            row_f32(q, sr, a);
            row_f32(g, r, b);
            if (memcmp(a, b, (size_t)g->cols * 4) != 0) return false;
        }
    }
    return true;
}

static void check_export(const char *spec, int q8_per_layer, int bf16_per_layer) {
    tsr_model *src, *ref, *back;
    ASSERT_OK(tsr_model_load(spec, &src));
    ASSERT_OK(tsr_model_load(spec, &ref));
    ASSERT_OK(tsr_model_quantize(ref, TSR_Q8_0)); /* what --dtype q8_0 computes with */
    const char *p = path_of("model.gguf");
    bool carried = true;
    ASSERT_OK(tsr_export_gguf(src, p, TSR_Q8_0, NULL, &carried));
    ASSERT_TRUE(!carried);
    ASSERT_OK(tsr_model_load(p, &back));
    ASSERT_EQ_INT(back->cfg.dtype, TSR_Q8_0);
    ASSERT_TRUE(back->cfg.rope_interleaved); /* llama: rows in adjacent-pair order */
    ASSERT_EQ_INT(back->cfg.n_layers, src->cfg.n_layers);
    ASSERT_EQ_INT(back->cfg.bos_id, src->cfg.bos_id);
    ASSERT_EQ_INT(back->cfg.eos_id, src->cfg.eos_id);
    ASSERT_TRUE(back->cfg.norm_eps == src->cfg.norm_eps);
    /* rope: the same parameters, so bit-identical frequencies (Llama 3 scaling included) */
    ASSERT_EQ_INT(back->cfg.rope_scaling, src->cfg.rope_scaling);
    float fa[256], fb[256];
    tsr_rope_inv_freq(&src->cfg, fa);
    tsr_rope_inv_freq(&back->cfg, fb);
    ASSERT_TRUE(memcmp(fa, fb, (size_t)(src->cfg.head_dim / 2) * 4) == 0);
    ASSERT_TRUE(same_tensor(&ref->tok_emb, &back->tok_emb, 0));
    ASSERT_TRUE(same_tensor(&ref->out_norm, &back->out_norm, 0));
    int n_q8 = 0, n_16 = 0;
    for (int l = 0; l < src->cfg.n_layers; l++) {
        const tsr_layer_weights *a = &ref->layers[l], *b = &back->layers[l];
        ASSERT_TRUE(same_tensor(&a->wq, &b->wq, src->cfg.n_heads));
        ASSERT_TRUE(same_tensor(&a->wk, &b->wk, src->cfg.n_kv_heads));
        const tsr_tensor *x[] = {&a->wv, &a->wo, &a->w_gate, &a->w_up, &a->w_down,
                                 &a->attn_norm, &a->ffn_norm};
        const tsr_tensor *y[] = {&b->wv, &b->wo, &b->w_gate, &b->w_up, &b->w_down,
                                 &b->attn_norm, &b->ffn_norm};
        for (int i = 0; i < 7; i++) {
            ASSERT_TRUE(same_tensor(x[i], y[i], 0));
            if (i < 5 && x[i]->dtype == TSR_Q8_0) n_q8++;
            else if (i < 5) n_16++;
        }
    }
    ASSERT_EQ_INT(n_q8, q8_per_layer * src->cfg.n_layers);
    ASSERT_EQ_INT(n_16, bf16_per_layer * src->cfg.n_layers);
    tsr_model_destroy(src);
    tsr_model_destroy(ref);
    tsr_model_destroy(back);
    remove(p);
}

TSR_TEST(test_export_q8_matches_load_quantization) {
    /* tiny (head_dim 8, hidden 172): wv, w_gate, w_up in Q8_0; wo, w_down not */
    check_export("synthetic:tiny", 3, 2);
    check_export("synthetic:tiny,dtype=bf16", 3, 2);
}

/* Llama 3 rope scaling goes as llama.cpp's rope_freqs.weight and comes back as the same
 * parameters (head_dim 64 at theta 500000: high, smoothed and low frequencies). */
TSR_TEST(test_export_llama3_rope) {
    char dir[4096], cfg[4200], spec[4300];
    snprintf(dir, sizeof dir, "%s/gguf_writer_llama3", TSR_BINARY_DIR);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
               "\"hidden_size\": 128, \"intermediate_size\": 256, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 256, "
               "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-5, "
               "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", "
               "\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
               "\"original_max_position_embeddings\": 8192}, \"torch_dtype\": \"float32\"}\n");
    fclose(f);
    snprintf(spec, sizeof spec, "synthetic:%s", cfg);
    check_export(spec, 5, 0); /* of wv, wo, w_gate, w_up, w_down */
    tsr_model *m;
    ASSERT_OK(tsr_model_load(spec, &m));
    ASSERT_EQ_INT(m->cfg.rope_scaling, TSR_ROPE_LLAMA3);
    tsr_model_destroy(m);
}

TSR_TEST(test_export_refusals) {
    tsr_model *m;
    ASSERT_OK(tsr_model_load("synthetic:tiny", &m));
    bool carried;
    const char *p = path_of("refused.gguf");
    ASSERT_EQ_INT(tsr_export_gguf(m, p, TSR_Q4_0, NULL, &carried), TSR_ERR_INVALID);
    m->cfg.rope_scaling = TSR_ROPE_YARN;
    ASSERT_EQ_INT(tsr_export_gguf(m, p, TSR_Q8_0, NULL, &carried), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "YaRN");
    m->cfg.rope_scaling = TSR_ROPE_LLAMA3;
    m->cfg.rope_factor = 8.0f;
    m->cfg.rope_low_freq_factor = 2.0f;
    m->cfg.rope_high_freq_factor = 4.0f;
    m->cfg.rope_original_max_pos = 8192;
    ASSERT_EQ_INT(tsr_export_gguf(m, p, TSR_Q8_0, NULL, &carried), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "low/high");
    ASSERT_TRUE(!exists(p));
    tsr_model_destroy(m);
}

/* A byte-level BPE tokenizer.json written as `gpt2` keys reads back (tessera's GGUF reader)
 * into the same tokenizer: the ids of every text of the tokenizer corpus (Qwen2: the ASCII
 * ones, as its NFC normalizer is not carried), BOS and EOS. Tokenizers GGUF cannot express as
 * read back are not carried. */
static void check_bpe(const char *family, bool expect_carried, bool ascii_only) {
    char dir[4096], cfg[4200], json[4200];
    snprintf(dir, sizeof dir, "%s/gguf_writer_bpe", TSR_BINARY_DIR);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
               "\"hidden_size\": 64, \"intermediate_size\": 64, \"num_hidden_layers\": 1, "
               "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"vocab_size\": 2560, "
               "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
               "\"torch_dtype\": \"float32\"}\n");
    fclose(f);
    char spec[4300];
    snprintf(spec, sizeof spec, "synthetic:%s", cfg);
    snprintf(json, sizeof json, "%s/tests/data/tokenizers/hf/%s.json", TSR_SOURCE_DIR, family);
    tsr_model *m;
    ASSERT_OK(tsr_model_load(spec, &m));
    const char *p = path_of("bpe.gguf");
    bool carried = false;
    tsr_status st = tsr_export_gguf(m, p, TSR_F32, json, &carried);
    tsr_model_destroy(m);
    ASSERT_OK(st);
    ASSERT_EQ_INT(carried, expect_carried);
    if (!carried) {
        remove(p);
        return;
    }
    tsr_tokenizer *a, *b;
    ASSERT_OK(tsr_tokenizer_load_bpe(json, &a));
    ASSERT_OK(tsr_tokenizer_load(p, &b));
    ASSERT_EQ_INT(b->bos_id, a->bos_id);
    ASSERT_EQ_INT(b->n_eos_ids, a->n_eos_ids);
    for (int i = 0; i < a->n_eos_ids; i++) ASSERT_EQ_INT(b->eos_ids[i], a->eos_ids[i]);
    char *text = NULL;
    size_t len = 0;
    ASSERT_OK(tsr_file_read(TSR_SOURCE_DIR "/tests/data/tokenizers/hf/corpus.json", "corpus", 0,
                            &text, &len));
    cJSON *doc = cJSON_ParseWithLength(text, len);
    tsr_free(text);
    const cJSON *it;
    int n = 0, bad = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(doc, "texts")) {
        const char *t = it->valuestring;
        bool ascii = true;
        for (const char *c = t; *c; c++) ascii &= (unsigned char)*c < 0x80;
        if (ascii_only && !ascii) continue;
        int32_t *ia, *ib;
        size_t na, nb;
        if (tsr_tokenizer_encode(a, t, strlen(t), true, false, &ia, &na) != TSR_OK ||
            tsr_tokenizer_encode(b, t, strlen(t), true, false, &ib, &nb) != TSR_OK) {
            bad++;
            continue;
        }
        bad += na != nb || memcmp(ia, ib, na * sizeof *ia) != 0;
        n++;
        tsr_free(ia);
        tsr_free(ib);
    }
    cJSON_Delete(doc);
    fprintf(stderr, "  %s: %d texts, %d differ\n", family, n, bad);
    ASSERT_TRUE(n >= 10);
    ASSERT_EQ_INT(bad, 0);
    tsr_tokenizer_destroy(a);
    tsr_tokenizer_destroy(b);
    remove(p);
}

TSR_TEST(test_bpe_tokenizer_carried) {
    check_bpe("llama3", true, false);
    check_bpe("smollm2", true, false);
    check_bpe("qwen2", true, true);
    check_bpe("gpt2_prefix", false, false); /* ByteLevel with a prefix space */
    check_bpe("llama2", false, false);      /* byte fallback */
    check_bpe("o200k", false, false);       /* a pre-tokenizer llama.cpp names otherwise */
}

TSR_TEST_MAIN(test_roundtrip, test_failures_leave_no_file, test_export_q8_matches_load_quantization,
              test_export_refusals, test_bpe_tokenizer_carried, test_export_llama3_rope)
