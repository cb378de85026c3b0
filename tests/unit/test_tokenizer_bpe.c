/* tokenizer.json (byte-level BPE, Llama-3 pre-tokenizer) against HF tokenizers' own ids.
 * Golden data from tools/ref_tokenizers.py: a small BPE trained with HF tokenizers
 * (tests/data/tokenizers/bpe_llama3, and the same with "a b" string merges in
 * bpe_llama3_legacy) and bpe_cases.json. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <time.h>

#include "base/alloc.h"
#include "base/status.h"
#include "runtime/text/tokenizer.h"
#include "tests/test.h"

#define DATA TSR_SOURCE_DIR "/tests/data/tokenizers"
#define BPE_JSON DATA "/bpe_llama3/tokenizer.json"
#define BPE_LEGACY DATA "/bpe_llama3_legacy/tokenizer.json"
#define CASES DATA "/bpe_cases.json"

#include "tests/tokenizer_cases.h"

static int check_cases(const tsr_tokenizer *t, const cJSON *cases) {
    int bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        size_t tn;
        char *text = b64dec(cJSON_GetObjectItem(c, "text_b64")->valuestring, &tn);
        size_t n = 0;
        int32_t *ids = encode_and_compare(t, c, name, text, tn, &n, &bad);
        if (!ids) {
            free(text);
            continue;
        }
        size_t gn = 0;
        char *got = decode_all(t, ids, n, &gn);
        if (!got || gn != tn || memcmp(got, text, tn) != 0) {
            fprintf(stderr, "  case %s: decode gives \"%s\", want \"%s\"\n", name,
                    got ? got : "(null)", text);
            bad++;
        }
        free(got);
        tsr_free(ids);
        free(text);
    }
    return bad;
}

TSR_TEST(test_bpe_matches_hf) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(BPE_JSON, &t));
    ASSERT_STR_EQ(t->ops->name, "bpe");
    ASSERT_EQ_INT(t->vocab_size, cJSON_GetObjectItem(doc, "vocab_size")->valueint);
    ASSERT_EQ_INT(t->bos_id, cJSON_GetObjectItem(doc, "bos_id")->valueint);
    const cJSON *eos = cJSON_GetObjectItem(doc, "eos_ids");
    ASSERT_EQ_INT(t->n_eos_ids, 2);
    ASSERT_EQ_INT(t->eos_ids[0], cJSON_GetArrayItem(eos, 0)->valueint);
    ASSERT_EQ_INT(t->eos_ids[1], cJSON_GetArrayItem(eos, 1)->valueint);
    ASSERT_EQ_INT(t->eos_id, t->eos_ids[0]);
    ASSERT_TRUE(tsr_tokenizer_is_eos(t, t->eos_ids[1]));
    ASSERT_TRUE(!tsr_tokenizer_is_eos(t, t->bos_id));
    ASSERT_TRUE(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "cases")) >= 35);
    int bad = check_cases(t, cJSON_GetObjectItem(doc, "cases"));
    tsr_tokenizer_destroy(t);
    cJSON_Delete(doc);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_bpe_legacy_merges) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(BPE_LEGACY, &t));
    int bad = check_cases(t, cJSON_GetObjectItem(doc, "cases"));
    tsr_tokenizer_destroy(t);
    cJSON_Delete(doc);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_bpe_specials) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(BPE_JSON, &t));
    char buf[64];
    const cJSON *sp;
    cJSON_ArrayForEach(sp, cJSON_GetObjectItem(doc, "specials")) {
        /* Each special alone encodes to its id and decodes to its text. */
        int32_t *ids = NULL;
        size_t n = 0;
        ASSERT_OK(tsr_tokenizer_encode(t, sp->string, strlen(sp->string), false, false, &ids,
                                       &n));
        ASSERT_EQ_INT(n, 1);
        ASSERT_EQ_INT(ids[0], sp->valueint);
        tsr_free(ids);
        int k = tsr_tokenizer_decode(t, -1, sp->valueint, buf, sizeof buf);
        ASSERT_EQ_INT(k, (int)strlen(sp->string));
        ASSERT_TRUE(memcmp(buf, sp->string, (size_t)k) == 0);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    ASSERT_OK(tsr_tokenizer_encode(t, "Hi", 2, true, true, &ids, &n));
    ASSERT_TRUE(n >= 3);
    ASSERT_EQ_INT(ids[0], t->bos_id);
    ASSERT_EQ_INT(ids[n - 1], t->eos_id);
    tsr_free(ids);
    ASSERT_OK(tsr_tokenizer_encode(t, "", 0, true, false, &ids, &n));
    ASSERT_EQ_INT(n, 1);
    tsr_free(ids);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, t->bos_id, buf, 4), -1);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, t->vocab_size, buf, sizeof buf), 0);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, -3, buf, sizeof buf), 0);
    tsr_tokenizer_destroy(t);
    cJSON_Delete(doc);
}

TSR_TEST(test_bpe_invalid_utf8_round_trip) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(BPE_JSON, &t));
    int bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "roundtrip_b64")) {
        size_t tn;
        char *text = b64dec(c->valuestring, &tn);
        int32_t *ids = NULL;
        size_t n = 0;
        ASSERT_OK(tsr_tokenizer_encode(t, text, tn, false, false, &ids, &n));
        ASSERT_TRUE(n > 0);
        size_t gn = 0;
        char *got = decode_all(t, ids, n, &gn);
        if (!got || gn != tn || memcmp(got, text, tn) != 0) {
            fprintf(stderr, "  round trip of %zu bytes failed\n", tn);
            bad++;
        }
        free(got);
        tsr_free(ids);
        free(text);
    }
    tsr_tokenizer_destroy(t);
    cJSON_Delete(doc);
    ASSERT_EQ_INT(bad, 0);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* A hand-made model whose ids tokenizers itself gives as (checked once with tokenizers
 * 0.23): vocab a b c ab bc abc, merges "b c" then "a b", no regex pre-tokenizer. */
static const char *tiny_json(bool ignore_merges) {
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"added_tokens\":[{\"id\":6,\"content\":\"<|eot_id|>\",\"special\":true}],"
             "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\","
             "\"add_prefix_space\":false,\"use_regex\":false},"
             "\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,"
             "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5},"
             "\"merges\":[\"b c\",[\"a\",\"b\"]]}}",
             ignore_merges ? "true" : "false");
    return buf;
}

static int encode_cmp(const tsr_tokenizer *t, const char *s, const int32_t *want, size_t wn) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (tsr_tokenizer_encode(t, s, strlen(s), false, false, &ids, &n) != TSR_OK) return 1;
    int bad = n != wn || (n && memcmp(ids, want, n * sizeof *ids) != 0);
    if (bad) print_ids(s, ids, n);
    tsr_free(ids);
    return bad;
}

TSR_TEST(test_bpe_ignore_merges_and_tiny_model) {
    const char *path = TSR_BINARY_DIR "/tok_tiny.json";
    tsr_tokenizer *t = NULL;
    write_file(path, tiny_json(false));
    ASSERT_OK(tsr_tokenizer_load(path, &t));
    ASSERT_EQ_INT(t->vocab_size, 7);
    ASSERT_EQ_INT(t->bos_id, -1);
    ASSERT_EQ_INT(t->n_eos_ids, 1);
    ASSERT_EQ_INT(encode_cmp(t, "abc", (const int32_t[]){0, 4}, 2), 0);
    ASSERT_EQ_INT(encode_cmp(t, "abcab<|eot_id|>ab", (const int32_t[]){0, 4, 3, 6, 3}, 5), 0);
    /* The space has no byte token and there is no unk: dropped before merging. */
    ASSERT_EQ_INT(encode_cmp(t, "ab c", (const int32_t[]){0, 4}, 2), 0);
    tsr_tokenizer_destroy(t);
    /* Content sniffing: a JSON tokenizer without the .json suffix still loads as BPE. */
    const char *nosuffix = TSR_BINARY_DIR "/tok_tiny_json.txt";
    write_file(nosuffix, tiny_json(false));
    ASSERT_OK(tsr_tokenizer_load(nosuffix, &t));
    ASSERT_STR_EQ(t->ops->name, "bpe");
    tsr_tokenizer_destroy(t);
    write_file(path, tiny_json(true));
    ASSERT_OK(tsr_tokenizer_load(path, &t));
    ASSERT_EQ_INT(encode_cmp(t, "abc", (const int32_t[]){5}, 1), 0);
    ASSERT_EQ_INT(encode_cmp(t, "abcab<|eot_id|>ab", (const int32_t[]){0, 4, 3, 6, 3}, 5), 0);
    tsr_tokenizer_destroy(t);
}

TSR_TEST(test_bpe_encode_is_fast) {
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(BPE_JSON, &t));
    size_t n = 1 << 20;
    char *text = malloc(n);
    const char *words[] = {"tessera ", "distributed ", "<|eot_id|>", "\xe4\xbd\xa0\xe5\xa5\xbd ",
                           "1234567 ", "runtime\n\n", "\xf0\x9f\x98\x80 ", "it's    "};
    size_t o = 0;
    unsigned r = 1;
    while (o < n - 65536) {
        r = r * 1103515245u + 12345u;
        const char *w = words[(r >> 16) % 8];
        size_t wl = strlen(w);
        memcpy(text + o, w, wl);
        o += wl;
    }
    /* A long word and a long whitespace run. */
    memset(text + o, 'a', 32768);
    memset(text + o + 32768, ' ', n - o - 32768);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int32_t *ids = NULL;
    size_t nid = 0;
    ASSERT_OK(tsr_tokenizer_encode(t, text, n, false, false, &ids, &nid));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "  encoded 1 MB into %zu ids in %.3f s\n", nid, s);
    ASSERT_TRUE(s < 5.0);
    size_t gn = 0;
    char *got = decode_all(t, ids, nid, &gn);
    ASSERT_TRUE(got != NULL);
    ASSERT_EQ_INT(gn, n);
    ASSERT_TRUE(memcmp(got, text, n) == 0);
    free(got);
    tsr_free(ids);
    free(text);
    tsr_tokenizer_destroy(t);
}

TSR_TEST(test_bpe_bad_files) {
    tsr_tokenizer *t = NULL;
    const char *p = TSR_BINARY_DIR "/tok_bad.json";
    write_file(p, "{\"model\": {\"vocab\": {\"a\": 0,,}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_TRUE(t == NULL);
    ASSERT_STR_CONTAINS(tsr_last_error(), p);
    ASSERT_STR_CONTAINS(tsr_last_error(), "not valid JSON");
    write_file(p, "");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), p);
    write_file(p, "{\"model\": {\"type\": \"BPE\", \"merges\": []}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), p);
    ASSERT_STR_CONTAINS(tsr_last_error(), "model.vocab");
    write_file(p, "[1, 2, 3]");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "model.vocab");
    write_file(p, "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), p);
    ASSERT_STR_CONTAINS(tsr_last_error(), "merges[0]");
    write_file(p, "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "merges[0]");
    write_file(p, "{\"model\": {\"vocab\": {\"a\": -4}}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), p);
    write_file(p, "{\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "added_tokens[0]");
    write_file(p, "{\"model\": {\"type\": \"Unigram\", \"vocab\": {\"a\": 0}}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), p);
    write_file(p, "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}},"
                  "\"model\": {\"vocab\": {\"a\": 0}}}");
    ASSERT_EQ_INT(tsr_tokenizer_load(p, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "regex");
    const char *missing = TSR_BINARY_DIR "/no_such_tokenizer.json";
    ASSERT_EQ_INT(tsr_tokenizer_load(missing, &t), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), missing);
    ASSERT_EQ_INT(tsr_alloc_live_bytes(), 0);
}

TSR_TEST_MAIN(test_bpe_matches_hf, test_bpe_legacy_merges, test_bpe_specials,
              test_bpe_invalid_utf8_round_trip, test_bpe_ignore_merges_and_tiny_model,
              test_bpe_encode_is_fast, test_bpe_bad_files)
