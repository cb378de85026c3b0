/* GGUF parser, dequantization, llama loader and tokenizer on the small files
 * tools/make_gguf_testdata.py wrote with the `gguf` package (tests/data/gguf/; expected values
 * from gguf.quants.dequantize), and hostile files built here byte by byte. */
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/alloc.h"
#include "base/status.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_q8.h"
#include "runtime/format/gguf.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "tests/test.h"

#define DATA TSR_SOURCE_DIR "/tests/data/gguf/"

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

TSR_TEST(test_metadata_types) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(DATA "types.gguf", &g));
    ASSERT_EQ_INT(g->version, 3);
    int64_t i;
    double d;
    bool b;
    const char *s;
    static const struct { const char *k; int64_t v; } ints[] = {
        {"m.u8", 200}, {"m.i8", -100}, {"m.u16", 60000}, {"m.i16", -30000},
        {"m.u32", 4000000000LL}, {"m.i32", -2000000000LL}, {"m.u64", 1LL << 40},
        {"m.i64", -(1LL << 40)}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        ASSERT_OK(tsr_gguf_get_int(g, ints[k].k, &i, NULL));
        ASSERT_EQ_INT(i, ints[k].v);
    }
    ASSERT_OK(tsr_gguf_get_float(g, "m.f32", &d, NULL));
    ASSERT_NEAR(d, 1.5, 0);
    ASSERT_OK(tsr_gguf_get_float(g, "m.f64", &d, NULL));
    ASSERT_NEAR(d, 2.25, 0);
    ASSERT_OK(tsr_gguf_get_bool(g, "m.bool", &b, NULL));
    ASSERT_TRUE(b);
    ASSERT_OK(tsr_gguf_get_str(g, "m.str", &s, NULL));
    ASSERT_STR_EQ(s, "h\xc3\xa9llo");
    ASSERT_EQ_INT(tsr_gguf_get_int(g, "m.str", &i, NULL), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "m.str is not an integer");
    ASSERT_EQ_INT(tsr_gguf_get_int(g, "m.absent", &i, NULL), TSR_ERR_FORMAT);
    bool present = true;
    ASSERT_OK(tsr_gguf_get_int(g, "m.absent", &i, &present));
    ASSERT_TRUE(!present);
    const tsr_gguf_kv *a = tsr_gguf_find(g, "m.arr_i32");
    ASSERT_TRUE(a && a->type == TSR_GGUF_ARRAY && a->n == 3);
    ASSERT_EQ_INT(tsr_gguf_arr_int(a, 1), -2);
    a = tsr_gguf_find(g, "m.arr_str");
    ASSERT_TRUE(a && a->elem == TSR_GGUF_STRING && a->n == 3);
    uint64_t len;
    tsr_gguf_arr_str(a, 2, &s, &len);
    ASSERT_TRUE(len == 3 && !memcmp(s, "xyz", 3));
    tsr_gguf_arr_str(a, 1, &s, &len);
    ASSERT_EQ_INT(len, 0);
    a = tsr_gguf_find(g, "m.arr_nested");
    ASSERT_TRUE(a && a->elem == TSR_GGUF_ARRAY && a->n == 2);
    tsr_gguf_close(g);
}

/* Every type against gguf.quants.dequantize, to f32 (exact up to rounding order) and to
 * bf16/f16 (their rounding of the same values). */
TSR_TEST(test_dequant_types) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(DATA "types.gguf", &g));
    size_t n;
    uint8_t *raw = slurp(DATA "types_expected.f32", &n);
    ASSERT_TRUE(raw && n == g->n_tensors * 512 * 4);
    float got[512];
    uint16_t h[512];
    for (uint64_t t = 0; t < g->n_tensors; t++) {
        const tsr_gguf_tensor *tt = &g->tensors[t];
        ASSERT_TRUE(tt->numel == 512 && tt->ne[0] == 256 && tt->ne[1] == 2);
        ASSERT_OK(tsr_gguf_dequant(g, tt, TSR_F32, got));
        float max = 0;
        for (int k = 0; k < 512; k++) {
            float e;
            memcpy(&e, raw + (t * 512 + (uint64_t)k) * 4, 4);
            float diff = fabsf(got[k] - e);
            if (diff > max) max = diff;
            if (!(diff <= 1e-6f * (1 + fabsf(e)))) {
                fprintf(stderr, "  %s[%d]: %.9g vs %.9g\n", tt->name, k, (double)got[k],
                        (double)e);
                free(raw);
                tsr_gguf_close(g);
                TSR_FAIL_("dequantized values differ");
            }
        }
        ASSERT_OK(tsr_gguf_dequant(g, tt, TSR_BF16, h));
        for (int k = 0; k < 512; k++) ASSERT_TRUE(h[k] == tsr_f32_to_bf16(got[k]));
        ASSERT_OK(tsr_gguf_dequant(g, tt, TSR_F16, h));
        for (int k = 0; k < 512; k++) ASSERT_TRUE(h[k] == tsr_f32_to_f16(got[k]));
    }
    free(raw);
    tsr_gguf_close(g);
}

/* Version 2 has the same layout as 3 (3 added big-endian files); 1 and 4 are refused. */
TSR_TEST(test_versions) {
    size_t n;
    uint8_t *b = slurp(DATA "types.gguf", &n);
    ASSERT_TRUE(b);
    tsr_gguf *g;
    b[4] = 2;
    ASSERT_OK(tsr_gguf_open_mem(b, n, "v2.gguf", &g));
    ASSERT_EQ_INT(g->version, 2);
    tsr_gguf_close(g);
    for (uint8_t v = 1; v <= 4; v += 3) {
        b[4] = v;
        ASSERT_EQ_INT(tsr_gguf_open_mem(b, n, "v.gguf", &g), TSR_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(tsr_last_error(), "v.gguf: GGUF version");
    }
    free(b);
}

/* Every prefix of a valid file that cuts into it (the last tensor's padding aside) fails
 * with one line, never a crash. */
TSR_TEST(test_truncated_everywhere) {
    size_t n;
    uint8_t *b = slurp(DATA "types.gguf", &n);
    ASSERT_TRUE(b);
    tsr_gguf *full;
    ASSERT_OK(tsr_gguf_open_mem(b, n, "full.gguf", &full));
    size_t end = 0;
    for (uint64_t i = 0; i < full->n_tensors; i++) {
        size_t e = (size_t)(full->tensors[i].data - b) + full->tensors[i].nbytes;
        if (e > end) end = e;
    }
    tsr_gguf_close(full);
    for (size_t k = 0; k < end; k++) {
        uint8_t *c = malloc(k ? k : 1); /* exact size: ASan sees any overread */
        memcpy(c, b, k);
        tsr_gguf *g = NULL;
        tsr_status st = tsr_gguf_open_mem(c, k, "cut.gguf", &g);
        free(c);
        if (st == TSR_OK) {
            tsr_gguf_close(g);
            free(b);
            TSR_FAIL_("prefix of %zu bytes was accepted", k);
        }
        const char *e = tsr_last_error();
        if (!strstr(e, "cut.gguf: ") || strchr(e, '\n')) {
            free(b);
            TSR_FAIL_("prefix %zu: bad message \"%s\"", k, e);
        }
    }
    free(b);
}

/* ---- hand-built hostile files ------------------------------------------------------------ */

typedef struct wbuf {
    uint8_t b[4096];
    size_t n;
} wbuf;

static void w_u32(wbuf *w, uint32_t v) { memcpy(w->b + w->n, &v, 4), w->n += 4; }
static void w_u64(wbuf *w, uint64_t v) { memcpy(w->b + w->n, &v, 8), w->n += 8; }
static void w_str(wbuf *w, const char *s) {
    w_u64(w, strlen(s));
    memcpy(w->b + w->n, s, strlen(s));
    w->n += strlen(s);
}

/* Header + one u32 kv (key, value) + one tensor (dims, type, offset) + 64 data bytes. */
static void build(wbuf *w, uint64_t n_kv, const char *key, uint32_t kvtype, uint32_t value,
                  uint32_t n_dims, uint64_t dim0, uint32_t type, uint64_t offset) {
    memset(w, 0, sizeof *w);
    w_u32(w, 0x46554747u);
    w_u32(w, 3);
    w_u64(w, 1);
    w_u64(w, n_kv);
    w_str(w, key);
    w_u32(w, kvtype);
    w_u32(w, value);
    w_str(w, "t");
    w_u32(w, n_dims);
    for (uint32_t i = 0; i < n_dims && i < 8; i++) w_u64(w, i ? 1 : dim0);
    w_u32(w, type);
    w_u64(w, offset);
    w->n = (w->n + 31) / 32 * 32 + 64;
}

static void expect_bad(wbuf *w, const char *needle) {
    tsr_gguf *g = NULL;
    tsr_status st = tsr_gguf_open_mem(w->b, w->n, "bad.gguf", &g);
    if (st == TSR_OK) {
        tsr_gguf_close(g);
        TSR_FAIL_("accepted a file that should fail with \"%s\"", needle);
    }
    ASSERT_STR_CONTAINS(tsr_last_error(), "bad.gguf: ");
    ASSERT_STR_CONTAINS(tsr_last_error(), needle);
}

TSR_TEST(test_hostile) {
    wbuf w;
    build(&w, 1, "general.alignment", TSR_GGUF_U32, 32, 1, 16, TSR_GGML_F32, 0);
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open_mem(w.b, w.n, "ok.gguf", &g));
    ASSERT_TRUE(g->n_tensors == 1 && g->tensors[0].nbytes == 64);
    tsr_gguf_close(g);
    build(&w, UINT64_MAX, "a", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_F32, 0);
    expect_bad(&w, "more than the file holds");
    build(&w, 1, "general.alignment", TSR_GGUF_U32, 3, 1, 16, TSR_GGML_F32, 0);
    expect_bad(&w, "not a power of two");
    build(&w, 1, "general.alignment", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_F32, 0);
    expect_bad(&w, "not a power of two");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_F32, 8);
    expect_bad(&w, "is not aligned to 32");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_F32, 32);
    expect_bad(&w, "runs past the end of the file");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_F32, (uint64_t)1 << 63);
    expect_bad(&w, "runs past the end of the file");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 1ull << 39, TSR_GGML_F32, 0);
    expect_bad(&w, "runs past the end of the file");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, UINT64_MAX, TSR_GGML_F32, 0);
    expect_bad(&w, "invalid dimension");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 16, 99, 0);
    expect_bad(&w, "unknown type 99");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_Q4_0, 0);
    expect_bad(&w, "not a multiple of Q4_0's block of 32");
    build(&w, 1, "a", TSR_GGUF_U32, 0, 5, 16, TSR_GGML_F32, 0);
    expect_bad(&w, "5 dimensions");
    build(&w, 1, "a", 13, 0, 1, 16, TSR_GGML_F32, 0);
    expect_bad(&w, "metadata a has unknown type 13");
    /* An array claiming 2^60 u32 elements. */
    build(&w, 1, "a", TSR_GGUF_ARRAY, TSR_GGUF_U32, 1, 16, TSR_GGML_F32, 0);
    memcpy(w.b + 24 + 9 + 4 + 4, &(uint64_t){1ull << 60}, 8);
    expect_bad(&w, "truncated GGUF file");
    /* Bad magic. */
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 16, TSR_GGML_F32, 0);
    w.b[0] = 'X';
    expect_bad(&w, "not a GGUF file");
    /* A valid file with an unsupported tensor type loads; dequantizing it is refused. */
    build(&w, 1, "a", TSR_GGUF_U32, 0, 1, 32, TSR_GGML_Q8_1, 0);
    ASSERT_OK(tsr_gguf_open_mem(w.b, w.n, "q81.gguf", &g));
    float out[32];
    ASSERT_EQ_INT(tsr_gguf_dequant(g, &g->tensors[0], TSR_F32, out), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "q81.gguf: tensor t has type Q8_1");
    tsr_gguf_close(g);
    /* general.file_type's names (llama.cpp's llama_ftype), the "guessed" bit ignored */
    ASSERT_TRUE(!strcmp(tsr_gguf_file_type_name(15), "Q4_K_M"));
    ASSERT_TRUE(!strcmp(tsr_gguf_file_type_name(15 | 1024), "Q4_K_M"));
    ASSERT_TRUE(!strcmp(tsr_gguf_file_type_name(7), "Q8_0"));
    ASSERT_TRUE(tsr_gguf_file_type_name(4) == NULL && tsr_gguf_file_type_name(99) == NULL &&
                tsr_gguf_file_type_name(-1) == NULL);
}

/* ---- the tiny llama model ---------------------------------------------------------------- */

static cJSON *expected(void) {
    size_t n;
    uint8_t *t = slurp(DATA "tiny_llama_expected.json", &n);
    if (!t) return NULL;
    t[n] = 0;
    cJSON *j = cJSON_Parse((const char *)t);
    free(t);
    return j;
}

static double num(const cJSON *j, const char *k) {
    return cJSON_GetObjectItem(j, k)->valuedouble;
}

/* Compares a loaded f32 tensor with the reference's first values and sum. */
static bool same_tensor(const cJSON *exp, const char *name, const tsr_tensor *t) {
    const cJSON *vals = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "tensors"), name);
    double sum_ref = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "sums"), name)->valuedouble;
    /* Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K matrices stay in their blocks (kernels/cpu/
     * quant_blocks.h): compared dequantized */
    float *deq = NULL;
    if (vals && tsr_qblocks_is(t->dtype)) {
        deq = tsr_malloc((size_t)(t->rows * t->cols) * sizeof *deq);
        for (int64_t r = 0; r < t->rows; r++) tsr_qblocks_row_f32(t, r, deq + r * t->cols);
    }
    if (!vals || (t->dtype != TSR_F32 && !deq)) return false;
    const float *d = deq ? deq : t->data;
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, vals) {
        if (fabs(d[i] - v->valuedouble) > 1e-6 * (1 + fabs(v->valuedouble))) {
            fprintf(stderr, "  %s[%d]: %.9g vs %.9g\n", name, i, (double)d[i], v->valuedouble);
            tsr_free(deq);
            return false;
        }
        i++;
    }
    double sum = 0;
    for (int64_t k = 0; k < t->rows * t->cols; k++) sum += d[k];
    tsr_free(deq);
    if (fabs(sum - sum_ref) > 1e-3 * (1 + fabs(sum_ref))) {
        fprintf(stderr, "  %s: sum %.9g vs %.9g\n", name, sum, sum_ref);
        return false;
    }
    return true;
}

TSR_TEST(test_tiny_llama) {
    cJSON *exp = expected();
    ASSERT_TRUE(exp);
    tsr_model *m;
    ASSERT_OK(tsr_model_load(DATA "tiny_llama.gguf", &m));
    const tsr_model_config *c = &m->cfg;
    ASSERT_EQ_INT(c->dim, num(exp, "dim"));
    ASSERT_EQ_INT(c->hidden_dim, num(exp, "hidden"));
    ASSERT_EQ_INT(c->n_heads, num(exp, "heads"));
    ASSERT_EQ_INT(c->n_kv_heads, num(exp, "kv_heads"));
    ASSERT_EQ_INT(c->head_dim, num(exp, "head_dim"));
    ASSERT_EQ_INT(c->vocab_size, num(exp, "vocab"));
    ASSERT_EQ_INT(c->n_layers, num(exp, "layers"));
    ASSERT_EQ_INT(c->max_seq_len, num(exp, "ctx"));
    ASSERT_NEAR(c->rope_theta, num(exp, "theta"), 0);
    ASSERT_NEAR(c->norm_eps, num(exp, "eps"), 1e-12);
    ASSERT_EQ_INT(c->bos_id, num(exp, "bos"));
    ASSERT_EQ_INT(c->eos_id, num(exp, "eos"));
    ASSERT_TRUE(c->rope_interleaved); /* llama GGUF rows are stored permuted */
    ASSERT_TRUE(c->tied_embeddings && m->classifier.data == m->tok_emb.data);
    /* most matrices load in their blocks (Q4_0/1, Q4_K, Q5_K, Q6_K): named after the type of
     * the most elements, q's Q4_K and o's Q4_1 tying (Q4_1 first) */
    ASSERT_EQ_INT(c->dtype, TSR_Q4_1);
    const tsr_layer_weights *w = &m->layers[0];
    struct { const char *name; const tsr_tensor *t; } ts[] = {
        {"token_embd.weight", &m->tok_emb},        {"output_norm.weight", &m->out_norm},
        {"blk.0.attn_norm.weight", &w->attn_norm}, {"blk.0.ffn_norm.weight", &w->ffn_norm},
        {"blk.0.attn_q.weight", &w->wq},           {"blk.0.attn_k.weight", &w->wk},
        {"blk.0.attn_v.weight", &w->wv},           {"blk.0.attn_output.weight", &w->wo},
        {"blk.0.ffn_gate.weight", &w->w_gate},     {"blk.0.ffn_up.weight", &w->w_up},
        {"blk.0.ffn_down.weight", &w->w_down},
    };
    bool ok = true;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ok &= same_tensor(exp, ts[i].name, ts[i].t);
    tsr_model_destroy(m);
    cJSON_Delete(exp);
    ASSERT_TRUE(ok);
}

/* tiny_llama's tokenizer: 256 byte tokens, merges Ġ t -> Ġt -> Ġth -> Ġthe and 1 2 -> 12,
 * control tokens <|im_start|> (bos) and <|im_end|> (eos), pre-tokenizer smollm. */
TSR_TEST(test_tiny_tokenizer) {
    tsr_tokenizer *t;
    ASSERT_OK(tsr_tokenizer_load(DATA "tiny_llama.gguf", &t));
    ASSERT_EQ_INT(t->vocab_size, 300);
    ASSERT_EQ_INT(t->bos_id, -1); /* add_bos_token false */
    ASSERT_EQ_INT(t->eos_id, 261);
    const char *text = " the 12<|im_end|>x";
    int32_t *ids;
    size_t n;
    ASSERT_OK(tsr_tokenizer_encode(t, text, strlen(text), true, false, &ids, &n));
    /* smollm's Digits step isolates 1 and 2, so the merge "1 2" never applies. */
    int32_t want[] = {258, 32, 49, 50, 261, 'x'};
    bool same = n == sizeof want / sizeof want[0];
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    char out[64];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += (size_t)tsr_tokenizer_decode(t, -1, ids[i], out + o, 64 - o);
    tsr_free(ids);
    tsr_tokenizer_destroy(t);
    ASSERT_TRUE(same);
    ASSERT_TRUE(o == strlen(text) && !memcmp(out, text, o));
}

TSR_TEST(test_model_errors_name_the_file) {
    size_t n;
    uint8_t *b = slurp(DATA "tiny_llama.gguf", &n);
    ASSERT_TRUE(b);
    char path[512];
    snprintf(path, sizeof path, "%s/gguf_cut.gguf", TSR_BINARY_DIR);
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f);
    fwrite(b, 1, n - 100, f);
    fclose(f);
    free(b);
    tsr_model *m = NULL;
    ASSERT_EQ_INT(tsr_model_load(path, &m), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "gguf_cut.gguf: tensor blk.0.ffn_down.weight");
    ASSERT_STR_CONTAINS(tsr_last_error(), "runs past the end");
    remove(path);
}

/* The SmolLM2 GGUF's ChatML template and special tokens, when models/ has it; the tiny
 * model has no template. */
TSR_TEST(test_chat_template) {
    char *tpl, *bos, *eos;
    ASSERT_OK(tsr_gguf_chat_template(DATA "tiny_llama.gguf", &tpl, &bos, &eos));
    ASSERT_TRUE(!tpl && bos && eos);
    ASSERT_STR_EQ(bos, "<|im_start|>");
    ASSERT_STR_EQ(eos, "<|im_end|>");
    tsr_free(bos);
    tsr_free(eos);
    FILE *f = fopen(TSR_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "rb");
    if (!f) return;
    fclose(f);
    ASSERT_OK(tsr_gguf_chat_template(TSR_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                                     &tpl, &bos, &eos));
    ASSERT_TRUE(tpl && strstr(tpl, "<|im_start|>") && strstr(tpl, "messages"));
    ASSERT_STR_EQ(bos, "<|im_start|>");
    ASSERT_STR_EQ(eos, "<|im_end|>");
    tsr_free(tpl);
    tsr_free(bos);
    tsr_free(eos);
}

TSR_TEST_MAIN(test_chat_template, test_metadata_types, test_dequant_types, test_versions, test_truncated_everywhere,
              test_hostile, test_tiny_llama, test_tiny_tokenizer, test_model_errors_name_the_file)
