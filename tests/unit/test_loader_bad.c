/* Bad inputs for every loader: each case asserts the status and that the error line names
 * the file and the problem. Fixtures are derived at test time (under TSR_BINARY_DIR) from a
 * synthetic model exported to HF and from models/stories260K.bin. */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/status.h"
#include "runtime/model/loader.h"
#include "runtime/model/model.h"
#include "runtime/format/safetensors.h"
#include "tests/test.h"

#define BAD TSR_BINARY_DIR "/loader_bad"

static void mk(const char *d) {
    mkdir(BAD, 0755);
    if (mkdir(d, 0755) != 0 && errno != EEXIST) fprintf(stderr, "mkdir %s failed\n", d);
}

static bool write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = tsr_malloc((size_t)len);
    *n = fread(buf, 1, (size_t)len, f);
    fclose(f);
    return buf;
}

/* A valid 1-layer HF directory at `dir`. */
static tsr_status good_hf(const char *dir) {
    mk(dir);
    tsr_model *m = NULL;
    TSR_TRY(tsr_model_load("synthetic:tiny,layers=1", &m));
    tsr_status st = tsr_export_hf(m, dir, TSR_F32);
    tsr_model_destroy(m);
    return st;
}

/* A safetensors file from a raw header string and `data_len` zero bytes of data. */
static bool raw_st(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header), n = 8 + hl + data_len;
    uint8_t *buf = tsr_calloc(1, n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    bool ok = write_bytes(path, buf, n);
    tsr_free(buf);
    return ok;
}

#define ASSERT_FAILS(expr, status, ...)                                                  \
    do {                                                                                 \
        int got_ = (int)(expr);                                                          \
        if (got_ != (int)(status))                                                       \
            TSR_FAIL_("%s: status %d, expected %d (%s)", #expr, got_, (int)(status),     \
                      tsr_last_error());                                                 \
        const char *needles_[] = {__VA_ARGS__};                                          \
        for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++)             \
            ASSERT_STR_CONTAINS(tsr_last_error(), needles_[i_]);                         \
    } while (0)

static tsr_status load(const char *spec) {
    tsr_model *m = NULL;
    tsr_status st = tsr_model_load(spec, &m);
    tsr_model_destroy(m);
    if (st == TSR_OK) tsr_error_set(TSR_OK, "loaded without error");
    return st;
}

static tsr_status open_st(const char *path) {
    tsr_st_file *f = NULL;
    tsr_status st = tsr_st_open(path, &f);
    tsr_st_close(f);
    return st;
}

/* ---- Hugging Face ---------------------------------------------------------------------- */

TSR_TEST(test_hf_truncated) {
    const char *dir = BAD "/hf_trunc";
    ASSERT_OK(good_hf(dir));
    ASSERT_TRUE(truncate(BAD "/hf_trunc/model.safetensors", 4000) == 0);
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, BAD "/hf_trunc/model.safetensors",
                 "exceed the data region");
    ASSERT_TRUE(truncate(BAD "/hf_trunc/model.safetensors", 5) == 0);
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, BAD "/hf_trunc/model.safetensors", "too short");
}

TSR_TEST(test_hf_header_longer_than_file) {
    const char *dir = BAD "/hf_hdr";
    ASSERT_OK(good_hf(dir));
    const char *path = BAD "/hf_hdr/model.safetensors";
    size_t n = 0;
    uint8_t *buf = read_bytes(path, &n);
    ASSERT_TRUE(buf != NULL);
    uint64_t big = (uint64_t)n * 4;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(big >> (8 * i));
    bool ok = write_bytes(path, buf, n);
    tsr_free(buf);
    ASSERT_TRUE(ok);
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, path, "header length", "exceeds the file size");
    /* 2^64 - 1: no overflow in the bounds check. */
    ASSERT_TRUE(raw_st(BAD "/hdr_max.safetensors", "{}", 0));
    buf = read_bytes(BAD "/hdr_max.safetensors", &n);
    memset(buf, 0xff, 8);
    ok = write_bytes(BAD "/hdr_max.safetensors", buf, n);
    tsr_free(buf);
    ASSERT_TRUE(ok);
    ASSERT_FAILS(open_st(BAD "/hdr_max.safetensors"), TSR_ERR_FORMAT, "hdr_max.safetensors",
                 "exceeds the file size");
}

TSR_TEST(test_hf_offset_out_of_bounds) {
    const char *path = BAD "/oob.safetensors";
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], "
                             "\"data_offsets\": [1000, 1016]}}", 16));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "tensor w", "exceed the data region");
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], "
                             "\"data_offsets\": [16, 0]}}", 16));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "tensor w", "invalid data_offsets");
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], "
                             "\"data_offsets\": [-8, 8]}}", 16));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "tensor w", "invalid data_offsets");
}

TSR_TEST(test_hf_shape_size_mismatch) {
    const char *path = BAD "/mismatch.safetensors";
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4, 4], "
                             "\"data_offsets\": [0, 32]}}", 64));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "tensor w", "has 32 bytes", "need 64");
    /* Overflowing shape products are caught, not wrapped. */
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"BF16\", \"shape\": [4294967296, 4294967296],"
                             " \"data_offsets\": [0, 0]}}", 0));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "tensor w", "too large");
}

TSR_TEST(test_hf_bad_header_json) {
    const char *path = BAD "/badjson.safetensors";
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"F32\", ", 8));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "not a valid JSON object");
    ASSERT_TRUE(raw_st(path, "{\"w\": {\"dtype\": \"Q4\", \"shape\": [2], "
                             "\"data_offsets\": [0, 8]}}", 8));
    ASSERT_FAILS(open_st(path), TSR_ERR_FORMAT, path, "tensor w", "unknown dtype");
}

/* Rewrites dir/model.safetensors: `drop` left out, `as_i32` relabelled I32, `reshape`
 * given its transposed shape. */
static tsr_status rewrite(const char *dir, const char *drop, const char *as_i32,
                          const char *reshape) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.new", path);
    tsr_st_file *f;
    TSR_TRY(tsr_st_open(path, &f));
    tsr_st_entry e[64];
    const void *d[64];
    int k = 0;
    for (int i = 0; i < f->n_tensors && k < 64; i++) {
        const tsr_st_tensor *t = &f->tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        e[k] = (tsr_st_entry){.name = t->name, .dtype = t->dtype, .n_dims = t->n_dims};
        memcpy(e[k].shape, t->shape, sizeof e[k].shape);
        if (reshape && !strcmp(t->name, reshape)) { /* same bytes, transposed shape */
            e[k].shape[0] = t->shape[1];
            e[k].shape[1] = t->shape[0];
        }
        d[k++] = t->data;
    }
    tsr_status st = tsr_st_write_file(tmp, e, d, k);
    tsr_st_close(f);
    if (st != TSR_OK) return st;
    if (as_i32) {
        /* The writer knows only tessera dtypes: patch the header text ("F32" -> "I32",
         * same width, so sizes and offsets stay valid). */
        size_t n = 0;
        char *buf = read_bytes(tmp, &n);
        char key[160];
        snprintf(key, sizeof key, "\"%s\":{", as_i32);
        char *p = strstr(buf + 8, key);
        char *q = p ? strstr(p, "\"F32\"") : NULL;
        if (q) q[1] = 'I';
        write_bytes(tmp, buf, n);
        tsr_free(buf);
    }
    return rename(tmp, path) == 0 ? TSR_OK : TSR_ERR_IO;
}

TSR_TEST(test_hf_missing_tensor) {
    const char *dir = BAD "/hf_missing";
    ASSERT_OK(good_hf(dir));
    ASSERT_OK(rewrite(dir, "model.layers.0.mlp.up_proj.weight", NULL, NULL));
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, BAD "/hf_missing/model.safetensors",
                 "missing tensor model.layers.0.mlp.up_proj.weight");
}

TSR_TEST(test_hf_unsupported_dtype) {
    const char *dir = BAD "/hf_i32";
    ASSERT_OK(good_hf(dir));
    ASSERT_OK(rewrite(dir, NULL, "model.norm.weight", NULL));
    ASSERT_FAILS(load(dir), TSR_ERR_UNSUPPORTED, BAD "/hf_i32/model.safetensors",
                 "model.norm.weight", "dtype I32");
}

TSR_TEST(test_hf_wrong_shape) {
    const char *dir = BAD "/hf_shape";
    ASSERT_OK(good_hf(dir));
    ASSERT_OK(rewrite(dir, NULL, NULL, "model.layers.0.mlp.down_proj.weight"));
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, BAD "/hf_shape/model.safetensors",
                 "model.layers.0.mlp.down_proj.weight has shape [172, 64], expected [64, 172]");
}

static void write_text(const char *path, const char *text) {
    write_bytes(path, text, strlen(text));
}

TSR_TEST(test_hf_unknown_architecture) {
    const char *dir = BAD "/hf_arch";
    mk(dir);
    write_text(BAD "/hf_arch/config.json",
               "{\"architectures\": [\"GemmaForCausalLM\"], \"model_type\": \"gemma\","
               " \"hidden_size\": 64}");
    ASSERT_FAILS(load(dir), TSR_ERR_UNSUPPORTED, BAD "/hf_arch/config.json",
                 "unsupported architecture GemmaForCausalLM",
                 "tessera supports LlamaForCausalLM");
}

TSR_TEST(test_hf_config_missing_field) {
    const char *dir = BAD "/hf_nohidden";
    mk(dir);
    write_text(BAD "/hf_nohidden/config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"intermediate_size\": 172,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 8, \"vocab_size\": 512,"
               " \"max_position_embeddings\": 64}");
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, BAD "/hf_nohidden/config.json",
                 "missing required field hidden_size");
    write_text(BAD "/hf_nohidden/config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"64\"}");
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, "config.json", "hidden_size is not an integer");
    write_text(BAD "/hf_nohidden/config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
               " \"intermediate_size\": 172, \"num_hidden_layers\": 1,"
               " \"num_attention_heads\": 8, \"vocab_size\": 512, \"max_position_embeddings\": 64,"
               " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}");
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, "config.json",
                 "missing required field rope_scaling.low_freq_factor");
}

TSR_TEST(test_hf_invalid_json) {
    const char *dir = BAD "/hf_json";
    mk(dir);
    write_text(BAD "/hf_json/config.json", "{\"architectures\": [\"LlamaForCausalLM\",");
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, BAD "/hf_json/config.json", "invalid JSON");
}

TSR_TEST(test_hf_no_weights) {
    const char *dir = BAD "/hf_noweights";
    ASSERT_OK(good_hf(dir));
    remove(BAD "/hf_noweights/model.safetensors");
    ASSERT_FAILS(load(dir), TSR_ERR_IO, dir, "no model.safetensors");
}

TSR_TEST(test_hf_bad_index) {
    const char *dir = BAD "/hf_index";
    ASSERT_OK(good_hf(dir));
    remove(BAD "/hf_index/model.safetensors");
    write_text(BAD "/hf_index/model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    ASSERT_FAILS(load(dir), TSR_ERR_IO, BAD "/hf_index/model-00001-of-00002.safetensors",
                 "cannot open");
    write_text(BAD "/hf_index/model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}");
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, "model.safetensors.index.json", "invalid shard name");
    write_text(BAD "/hf_index/model.safetensors.index.json", "{\"metadata\": {}}");
    ASSERT_FAILS(load(dir), TSR_ERR_FORMAT, "model.safetensors.index.json", "no weight_map");
}

/* ---- llama2.c ---------------------------------------------------------------------------- */

#define STORIES TSR_SOURCE_DIR "/models/stories260K.bin"

/* Writes the first `keep` bytes of stories260K.bin (0: all) with header int `field` set. */
static bool l2c_fixture(const char *path, size_t keep, int field, int32_t value) {
    size_t n = 0;
    uint8_t *buf = read_bytes(STORIES, &n);
    if (!buf) return false;
    if (field >= 0) memcpy(buf + 4 * field, &value, 4);
    bool ok = write_bytes(path, buf, keep ? keep : n);
    tsr_free(buf);
    return ok;
}

TSR_TEST(test_l2c_truncated) {
    mk(BAD "/l2c");
    const char *p = BAD "/l2c/truncated.bin";
    ASSERT_TRUE(l2c_fixture(p, 100000, -1, 0));
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "disagree with the file size");
    ASSERT_TRUE(l2c_fixture(p, 20, -1, 0));
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "truncated");
}

TSR_TEST(test_l2c_sizes_disagree) {
    mk(BAD "/l2c");
    const char *p = BAD "/l2c/disagree.bin";
    ASSERT_TRUE(l2c_fixture(p, 0, 1, 344)); /* hidden_dim 172 -> 344 */
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "disagree with the file size");
    ASSERT_TRUE(l2c_fixture(p, 0, 2, 6)); /* 6 layers, file holds 5 */
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "disagree with the file size");
}

TSR_TEST(test_l2c_bad_dims) {
    mk(BAD "/l2c");
    const char *p = BAD "/l2c/dims.bin";
    ASSERT_TRUE(l2c_fixture(p, 0, 0, 0)); /* dim 0 */
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "dim 0");
    ASSERT_TRUE(l2c_fixture(p, 0, 3, -8)); /* negative heads */
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "heads -8");
    ASSERT_TRUE(l2c_fixture(p, 0, 2, -5)); /* negative layers */
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "layer count -5");
    ASSERT_TRUE(l2c_fixture(p, 0, 6, 0)); /* seq_len 0 */
    ASSERT_FAILS(load(p), TSR_ERR_FORMAT, p, "max sequence length 0");
}

TSR_TEST_MAIN(test_hf_truncated, test_hf_header_longer_than_file, test_hf_offset_out_of_bounds,
              test_hf_shape_size_mismatch, test_hf_bad_header_json, test_hf_missing_tensor,
              test_hf_unsupported_dtype, test_hf_wrong_shape, test_hf_unknown_architecture,
              test_hf_config_missing_field, test_hf_invalid_json, test_hf_no_weights,
              test_hf_bad_index, test_l2c_truncated, test_l2c_sizes_disagree, test_l2c_bad_dims)
