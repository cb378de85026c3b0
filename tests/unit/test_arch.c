/* Architectures beyond Llama against Hugging Face transformers: tiny random Qwen2 (q/k/v
 * biases), Qwen3 (per-head q/k RMSNorm) and Mistral models in F32 and BF16, written with
 * their reference outputs by tools/make_arch_testdata.py (tests/data/arch/,
 * tests/data/golden/arch_*.json). Each model runs on cpu and cpu-fenced, its prompts whole
 * and in chunks of 7, then greedy decode (the bf16 Qwen models also as GGUF files): logits within TOL (docs/correctness.md) at the
 * stored prompt positions and the last decode step, greedy tokens exactly. Then the
 * config.json rules: unsupported architectures and biases refused by name, a sliding window
 * bounding the context. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/model/config.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/model/export_gguf.h"
#include "runtime/model/loader.h"
#include "runtime/model/model.h"
#include "tests/test.h"

/* f32 math against the f32 reference (bf16 weights upcast on both sides): the summation
 * order is the only difference. */
#define TOL 1e-4
#define MAX_PROMPTS 4
#define STEP_TOKENS 128
#define KV_TOKENS 128
#define CHUNK 7
/* A failure that lets the caller go on (TSR_FAIL_ returns from the function). */
#define NOTE_FAIL(...)                                                                    \
    do {                                                                                  \
        fprintf(stderr, "  " __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                              \
        tsr_test_failed_flag = 1;                                                         \
    } while (0)

typedef struct ref_prompt {
    int32_t ids[64], greedy[32], rows[8];
    int n, n_greedy, n_rows;
    float *logits; /* [n_rows][vocab] */
    float *last;   /* [vocab]: the row the last greedy token was taken from */
} ref_prompt;

static int ints(const cJSON *a, int32_t *out, int cap) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (n < cap) out[n] = (int32_t)e->valuedouble;
        n++;
    }
    return n <= cap ? n : -1;
}

static float *floats(const cJSON *a, int want) {
    if (cJSON_GetArraySize(a) != want) return NULL;
    float *v = tsr_malloc((size_t)want * sizeof *v);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) v[i++] = (float)e->valuedouble;
    return v;
}

/* Returns the prompt count, or -1 (with a failure) when the file is unreadable. */
static int load_ref(const char *path, int vocab, ref_prompt *p) {
    char *text = NULL;
    if (tsr_file_read(path, "golden", (size_t)1 << 26, &text, NULL) != TSR_OK) {
        NOTE_FAIL("cannot read %s: %s", path, tsr_last_error());
        return -1;
    }
    cJSON *root = cJSON_Parse(text);
    tsr_free(text);
    int n = 0;
    const cJSON *pr;
    if (!root || cJSON_GetObjectItem(root, "vocab_size")->valueint != vocab) {
        cJSON_Delete(root);
        NOTE_FAIL("%s: not JSON, or vocab differs from the model's %d", path, vocab);
        return -1;
    }
    cJSON_ArrayForEach(pr, cJSON_GetObjectItem(root, "prompts")) {
        if (n == MAX_PROMPTS) break;
        ref_prompt *q = &p[n++];
        q->n = ints(cJSON_GetObjectItem(pr, "ids"), q->ids, 64);
        q->n_greedy = ints(cJSON_GetObjectItem(pr, "greedy"), q->greedy, 32);
        q->n_rows = ints(cJSON_GetObjectItem(pr, "rows"), q->rows, 8);
        q->logits = q->n_rows > 0
                        ? floats(cJSON_GetObjectItem(pr, "logits"), q->n_rows * vocab)
                        : NULL;
        q->last = floats(cJSON_GetObjectItem(pr, "step_logits_last"), vocab);
        if (q->n <= 0 || q->n_greedy <= 0 || !q->logits || !q->last) {
            cJSON_Delete(root);
            NOTE_FAIL("%s: prompt %d malformed", path, n - 1);
            return -1;
        }
    }
    cJSON_Delete(root);
    return n;
}

static double max_abs(const float *a, const float *b, int n) {
    double m = 0.0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN: a failure */
    }
    return m;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* One prompt in chunks of `chunk`, then greedy decode; compared as the header says. */
static tsr_status run_prompt(tsr_engine *e, const ref_prompt *p, int vocab, int chunk,
                             float *logits, const char *what, double *worst) {
    size_t V = (size_t)vocab;
    e->kv->ops->seq_free(e->kv, 0);
    TSR_TRY(e->kv->ops->seq_add(e->kv, 0));
    float *row = tsr_malloc(V * sizeof(float));
    if (!row) return TSR_ERR_NOMEM;
    tsr_status st = TSR_OK;
    for (int off = 0; off < p->n && st == TSR_OK; off += chunk) {
        int n = p->n - off < chunk ? p->n - off : chunk, rows = 0;
        tsr_batch_seq s = {.seq = 0, .tokens = (int32_t *)p->ids + off, .n_tokens = n,
                           .want_logits = true, .all_logits = true};
        st = tsr_forward_run(e->fwd, e->kv, &s, 1, logits, &rows);
        for (int r = 0; st == TSR_OK && r < p->n_rows; r++) {
            if (p->rows[r] < off || p->rows[r] >= off + n) continue;
            double d = max_abs(logits + (size_t)(p->rows[r] - off) * V,
                               p->logits + (size_t)r * V, vocab);
            if (!(d <= *worst)) *worst = d;
            if (!(d <= TOL))
                NOTE_FAIL("%s: prompt position %d: max abs diff %.3g > %g", what, p->rows[r],
                          d, TOL);
        }
        if (st == TSR_OK && off + n == p->n) memcpy(row, logits + (size_t)(n - 1) * V, V * 4);
    }
    for (int i = 0; st == TSR_OK && i < p->n_greedy; i++) {
        int32_t tok = argmax(row, vocab);
        if (tok != p->greedy[i]) {
            NOTE_FAIL("%s: greedy token %d is %d, transformers %d", what, i, tok, p->greedy[i]);
            break;
        }
        if (i + 1 == p->n_greedy) {
            double d = max_abs(row, p->last, vocab);
            if (!(d <= *worst)) *worst = d;
            if (!(d <= TOL))
                NOTE_FAIL("%s: decode step %d: max abs diff %.3g > %g", what, i, d, TOL);
            break;
        }
        int rows = 0;
        tsr_batch_seq s = {.seq = 0, .tokens = &tok, .n_tokens = 1, .want_logits = true};
        st = tsr_forward_run(e->fwd, e->kv, &s, 1, logits, &rows);
        if (st == TSR_OK) memcpy(row, logits, V * 4);
    }
    tsr_free(row);
    return st;
}

/* file: the model under tests/data/arch/; golden: tests/data/golden/arch_<golden>.json. */
static void check_file(const char *name, const char *file, const char *golden, tsr_arch arch,
                       bool bias, bool qk_norm, tsr_dtype dtype) {
    char dir[512], gold[512];
    if (file[0] == '/')
        snprintf(dir, sizeof dir, "%s", file);
    else
        snprintf(dir, sizeof dir, "%s/tests/data/arch/%s", TSR_SOURCE_DIR, file);
    snprintf(gold, sizeof gold, "%s/tests/data/golden/arch_%s.json", TSR_SOURCE_DIR, golden);
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(dir, &m));
    ASSERT_EQ_INT(m->cfg.arch, arch);
    ASSERT_EQ_INT(m->cfg.qkv_bias, bias);
    ASSERT_EQ_INT(m->cfg.qk_norm, qk_norm);
    ASSERT_EQ_INT(m->cfg.dtype, dtype);
    ref_prompt p[MAX_PROMPTS];
    memset(p, 0, sizeof p);
    int np = load_ref(gold, m->cfg.vocab_size, p);
    float *logits = tsr_malloc((size_t)STEP_TOKENS * (size_t)m->cfg.vocab_size * 4);
    const char *backends[] = {"cpu", "cpu-fenced"};
    for (int b = 0; b < 2 && np > 0 && !tsr_test_failed_flag; b++) {
        tsr_engine_spec spec = {.backend = backends[b], .threads = 1, .max_tokens = STEP_TOKENS,
                                .kv = {.max_seqs = 1}, .dense_kv_tokens = KV_TOKENS,
                                .borrow_model = true, .model = m};
        tsr_engine *e = NULL;
        tsr_status st = tsr_engine_create(&spec, &e);
        if (st == TSR_ERR_UNSUPPORTED) {
            fprintf(stderr, "  note: backend %s skipped: %s\n", backends[b], tsr_last_error());
            continue;
        }
        double worst = 0.0;
        for (int i = 0; st == TSR_OK && i < np && !tsr_test_failed_flag; i++) {
            int chunks[2] = {p[i].n, CHUNK};
            for (int c = 0; c < 2 && st == TSR_OK && !tsr_test_failed_flag; c++) {
                char what[160];
                snprintf(what, sizeof what, "%s [%s] prompt %d chunk %d", name, backends[b], i,
                         chunks[c]);
                st = run_prompt(e, &p[i], m->cfg.vocab_size, chunks[c], logits, what, &worst);
            }
        }
        if (st != TSR_OK) TSR_FAIL_("%s [%s]: %s", name, backends[b], tsr_last_error());
        else
            fprintf(stderr, "  %s [%s]: max abs logit diff vs transformers %.3g (tol %g)\n",
                    name, backends[b], worst, TOL);
        tsr_engine_destroy(e);
    }
    for (int i = 0; i < MAX_PROMPTS; i++) {
        tsr_free(p[i].logits);
        tsr_free(p[i].last);
    }
    tsr_free(logits);
    tsr_model_destroy(m);
}

static void check_arch(const char *name, tsr_arch arch, bool bias, bool qk_norm,
                       tsr_dtype dtype) {
    check_file(name, name, name, arch, bias, qk_norm, dtype);
}

TSR_TEST(test_qwen2_f32) { check_arch("qwen2_f32", TSR_ARCH_QWEN2, true, false, TSR_F32); }
TSR_TEST(test_qwen2_bf16) { check_arch("qwen2_bf16", TSR_ARCH_QWEN2, true, false, TSR_BF16); }
TSR_TEST(test_qwen3_f32) { check_arch("qwen3_f32", TSR_ARCH_QWEN3, false, true, TSR_F32); }
TSR_TEST(test_qwen3_bf16) { check_arch("qwen3_bf16", TSR_ARCH_QWEN3, false, true, TSR_BF16); }
TSR_TEST(test_mistral_f32) {
    check_arch("mistral_f32", TSR_ARCH_MISTRAL, false, false, TSR_F32);
}
TSR_TEST(test_mistral_bf16) {
    check_arch("mistral_bf16", TSR_ARCH_MISTRAL, false, false, TSR_BF16);
}

/* The bf16 Qwen models as GGUF files (llama.cpp's qwen2/qwen3 keys and tensor names): the
 * same weights, so the same reference. */
TSR_TEST(test_qwen2_gguf) {
    check_file("qwen2_bf16.gguf", "qwen2_bf16.gguf", "qwen2_bf16", TSR_ARCH_QWEN2, true, false,
               TSR_BF16);
}
TSR_TEST(test_qwen3_gguf) {
    check_file("qwen3_bf16.gguf", "qwen3_bf16.gguf", "qwen3_bf16", TSR_ARCH_QWEN3, false, true,
               TSR_BF16);
}

/* tessera convert: a GGUF Qwen model exported as an HF directory (f32) keeps its family,
 * biases and q/k norms, and loads back to the same logits. */
static void check_export(const char *gguf, const char *golden, tsr_arch arch, bool bias,
                         bool qk_norm) {
    char src[512], out[512];
    snprintf(src, sizeof src, "%s/tests/data/arch/%s", TSR_SOURCE_DIR, gguf);
    snprintf(out, sizeof out, "%s/test_arch_export_%s", TSR_BINARY_DIR, golden);
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(src, &m));
    tsr_status st = tsr_export_hf(m, out, TSR_F32);
    tsr_model_destroy(m);
    ASSERT_OK(st);
    check_file(out, out, golden, arch, bias, qk_norm, TSR_F32);
}

TSR_TEST(test_export_roundtrip) {
    check_export("qwen2_bf16.gguf", "qwen2_bf16", TSR_ARCH_QWEN2, true, false);
    if (!tsr_test_failed_flag)
        check_export("qwen3_bf16.gguf", "qwen3_bf16", TSR_ARCH_QWEN3, false, true);
}

/* tessera convert --output X.gguf: the f32 models written as GGUF (Mistral as llama.cpp's
 * llama, its q/k rows permuted to adjacent pairs) load back to transformers' logits. */
static void check_gguf_export(const char *name, tsr_arch arch, bool bias, bool qk_norm) {
    char src[512], out[512];
    snprintf(src, sizeof src, "%s/tests/data/arch/%s", TSR_SOURCE_DIR, name);
    snprintf(out, sizeof out, "%s/test_arch_export_%s.gguf", TSR_BINARY_DIR, name);
    tsr_model *m = NULL;
    bool carried;
    ASSERT_OK(tsr_model_load(src, &m));
    tsr_status st = tsr_export_gguf(m, out, TSR_F32, NULL, &carried);
    tsr_model_destroy(m);
    ASSERT_OK(st);
    check_file(out, out, name, arch, bias, qk_norm, TSR_F32);
}

TSR_TEST(test_export_gguf) {
    check_gguf_export("mistral_f32", TSR_ARCH_LLAMA, false, false);
    if (!tsr_test_failed_flag) check_gguf_export("qwen2_f32", TSR_ARCH_QWEN2, true, false);
    if (!tsr_test_failed_flag) check_gguf_export("qwen3_f32", TSR_ARCH_QWEN3, false, true);
}

/* A GGUF file of another family is refused by name: qwen2_bf16.gguf with its
 * general.architecture value rewritten (same length, so every offset holds). */
TSR_TEST(test_gguf_unknown_architecture) {
    char src[512], dst[512], *data = NULL;
    size_t len = 0;
    snprintf(src, sizeof src, "%s/tests/data/arch/qwen2_bf16.gguf", TSR_SOURCE_DIR);
    snprintf(dst, sizeof dst, "%s/test_arch_gemma.gguf", TSR_BINARY_DIR);
    ASSERT_OK(tsr_file_read(src, "gguf", (size_t)1 << 24, &data, &len));
    static const char key[] = "general.architecture";
    char *at = NULL;
    for (size_t i = 0; i + sizeof key + 12 + 5 < len && !at; i++)
        if (!memcmp(data + i, key, sizeof key - 1)) at = data + i + (sizeof key - 1) + 4 + 8;
    bool ok = at && !memcmp(at, "qwen2", 5);
    if (ok) memcpy(at, "gemma", 5);
    FILE *f = ok ? fopen(dst, "wb") : NULL;
    ok = f && fwrite(data, 1, len, f) == len;
    if (f) ok = (fclose(f) == 0) && ok;
    tsr_free(data);
    ASSERT_TRUE(ok);
    tsr_model *m = NULL;
    ASSERT_EQ_INT(tsr_model_load(dst, &m), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "unsupported architecture \"gemma\"");
}

/* ---- config.json rules ------------------------------------------------------------------ */

static const char *CFG_BASE =
    "\"hidden_size\": 64, \"intermediate_size\": 64, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 256, "
    "\"max_position_embeddings\": 4096";

static tsr_status parse_cfg(const char *extra, tsr_model_config *c) {
    char path[512], text[1024];
    snprintf(path, sizeof path, "%s/test_arch_config.json", TSR_BINARY_DIR);
    snprintf(text, sizeof text, "{%s, %s}", CFG_BASE, extra);
    FILE *f = fopen(path, "w");
    if (!f) return tsr_error_set(TSR_ERR_IO, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    return tsr_config_from_hf_json(path, c);
}

TSR_TEST(test_config_rules) {
    tsr_model_config c;
    /* unsupported architectures are refused by name */
    ASSERT_EQ_INT(parse_cfg("\"architectures\": [\"GemmaForCausalLM\"]", &c),
                  TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "GemmaForCausalLM");
    ASSERT_EQ_INT(parse_cfg("\"model_type\": \"phi3\"", &c), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "phi3");
    /* the model_type alone names a family */
    ASSERT_OK(parse_cfg("\"model_type\": \"qwen2\"", &c));
    ASSERT_EQ_INT(c.arch, TSR_ARCH_QWEN2);
    ASSERT_TRUE(c.qkv_bias && !c.qk_norm);
    ASSERT_OK(parse_cfg("\"architectures\": [\"Qwen3ForCausalLM\"]", &c));
    ASSERT_TRUE(!c.qkv_bias && c.qk_norm);
    /* biases tessera does not compute are refused, not dropped */
    ASSERT_EQ_INT(parse_cfg("\"model_type\": \"llama\", \"attention_bias\": true", &c),
                  TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "attention_bias");
    ASSERT_EQ_INT(parse_cfg("\"model_type\": \"qwen3\", \"attention_bias\": true", &c),
                  TSR_ERR_UNSUPPORTED);
    ASSERT_EQ_INT(parse_cfg("\"model_type\": \"mistral\", \"mlp_bias\": true", &c),
                  TSR_ERR_UNSUPPORTED);
    /* a sliding window bounds the context; none, or a longer one, leaves it */
    ASSERT_OK(parse_cfg("\"model_type\": \"mistral\", \"sliding_window\": 1024", &c));
    ASSERT_EQ_INT(c.max_seq_len, 1024);
    ASSERT_OK(parse_cfg("\"model_type\": \"mistral\", \"sliding_window\": null", &c));
    ASSERT_EQ_INT(c.max_seq_len, 4096);
    ASSERT_OK(parse_cfg("\"model_type\": \"mistral\", \"sliding_window\": 32768", &c));
    ASSERT_EQ_INT(c.max_seq_len, 4096);
    /* Qwen's window applies only when switched on */
    ASSERT_OK(parse_cfg("\"model_type\": \"qwen2\", \"sliding_window\": 512, "
                        "\"use_sliding_window\": false", &c));
    ASSERT_EQ_INT(c.max_seq_len, 4096);
    ASSERT_OK(parse_cfg("\"model_type\": \"qwen2\", \"sliding_window\": 512, "
                        "\"use_sliding_window\": true", &c));
    ASSERT_EQ_INT(c.max_seq_len, 512);
    ASSERT_OK(parse_cfg("\"model_type\": \"qwen3\", \"sliding_window\": 256, "
                        "\"layer_types\": [\"full_attention\", \"sliding_attention\"]", &c));
    ASSERT_EQ_INT(c.max_seq_len, 256);
    ASSERT_EQ_INT(parse_cfg("\"model_type\": \"mistral\", \"sliding_window\": 0", &c),
                  TSR_ERR_FORMAT);
}

TSR_TEST_MAIN(test_qwen2_f32, test_qwen2_bf16, test_qwen3_f32, test_qwen3_bf16,
              test_mistral_f32, test_mistral_bf16, test_qwen2_gguf, test_qwen3_gguf,
              test_export_roundtrip, test_export_gguf, test_gguf_unknown_architecture,
              test_config_rules)
