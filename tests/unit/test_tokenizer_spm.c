/* tokenizer.bin (SentencePiece BPE, llama2.c format) against sentencepiece's own ids.
 * Golden data: tests/data/tokenizers/spm_cases.json from tools/ref_tokenizers.py. tok512 has
 * no SentencePiece model anywhere, so its ids come from that script's Python encoder, which
 * the script checks against sentencepiece on every Llama-2 case. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <time.h>

#include "base/alloc.h"
#include "base/status.h"
#include "runtime/text/tokenizer.h"
#include "tests/test.h"

#define LLAMA2_TOK TSR_SOURCE_DIR "/models/tokenizer.bin"
#define TOK512 TSR_SOURCE_DIR "/models/tok512.bin"
#define CASES TSR_SOURCE_DIR "/tests/data/tokenizers/spm_cases.json"

#include "tests/tokenizer_cases.h"


/* Checks every case of cases[] (text_b64, ids, optional decoded_b64) against t. */
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
        /* With BOS: the same ids after it; decoding drops the dummy-prefix space. */
        int32_t *bids = NULL;
        size_t bn = 0;
        if (tsr_tokenizer_encode(t, text, tn, true, true, &bids, &bn) != TSR_OK || bn != n + 2 ||
            bids[0] != t->bos_id || bids[bn - 1] != t->eos_id ||
            (n && memcmp(bids + 1, ids, n * sizeof *ids) != 0)) {
            fprintf(stderr, "  case %s: encode with bos/eos is not BOS + ids + EOS\n", name);
            bad++;
        }
        const cJSON *dec = cJSON_GetObjectItem(c, "decoded_b64");
        size_t en = tn;
        char *expect = dec ? b64dec(dec->valuestring, &en) : NULL;
        size_t gn = 0;
        char *got = bids ? decode_all(t, bids, bn, &gn) : NULL;
        const char *e = expect ? expect : text;
        if (!got || gn != en || memcmp(got, e, en) != 0) {
            fprintf(stderr, "  case %s: decode gives \"%s\", want \"%s\"\n", name,
                    got ? got : "(null)", e);
            bad++;
        }
        free(got);
        free(expect);
        tsr_free(bids);
        tsr_free(ids);
        free(text);
    }
    return bad;
}

TSR_TEST(test_llama2_matches_sentencepiece) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(LLAMA2_TOK, &t));
    ASSERT_EQ_INT(t->vocab_size, 32000);
    ASSERT_EQ_INT(t->bos_id, cJSON_GetObjectItem(doc, "bos_id")->valueint);
    ASSERT_EQ_INT(t->eos_id, cJSON_GetObjectItem(doc, "eos_id")->valueint);
    ASSERT_STR_EQ(t->ops->name, "spm");
    int bad = check_cases(t, cJSON_GetObjectItem(doc, "cases"));
    ASSERT_TRUE(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "cases")) >= 30);
    tsr_tokenizer_destroy(t);
    cJSON_Delete(doc);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_llama2_known_prompt) {
    /* llama2.c test.c's expectation, independent of the golden file. */
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(LLAMA2_TOK, &t));
    const char *s = "I believe the meaning of life is";
    int32_t *ids = NULL;
    size_t n = 0;
    ASSERT_OK(tsr_tokenizer_encode(t, s, strlen(s), true, false, &ids, &n));
    const int32_t want[] = {1, 306, 4658, 278, 6593, 310, 2834, 338};
    ASSERT_EQ_INT(n, 8);
    for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(ids[i], want[i]);
    tsr_free(ids);
    /* Empty text: no dummy prefix, only the requested specials. */
    ASSERT_OK(tsr_tokenizer_encode(t, "", 0, true, true, &ids, &n));
    ASSERT_EQ_INT(n, 2);
    ASSERT_EQ_INT(ids[0], 1);
    ASSERT_EQ_INT(ids[1], 2);
    tsr_free(ids);
    ASSERT_OK(tsr_tokenizer_encode(t, "", 0, false, false, &ids, &n));
    ASSERT_EQ_INT(n, 0);
    tsr_free(ids);
    char buf[16];
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, 1, buf, sizeof buf), 0);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, 2, buf, sizeof buf), 0);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, 3 + 'A', buf, sizeof buf), 1);
    ASSERT_EQ_INT(buf[0], 'A');
    /* 15043 is " Hello": keeps its space unless it follows BOS. */
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, 306, 15043, buf, sizeof buf), 6);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, 1, 15043, buf, sizeof buf), 5);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, 1, 15043, buf, 3), -1);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, 32000, buf, sizeof buf), 0);
    ASSERT_TRUE(tsr_tokenizer_is_eos(t, 2));
    ASSERT_TRUE(!tsr_tokenizer_is_eos(t, 1));
    tsr_tokenizer_destroy(t);
}

TSR_TEST(test_invalid_utf8_round_trip) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    const char *paths[] = {LLAMA2_TOK, TOK512};
    int bad = 0;
    for (int p = 0; p < 2; p++) {
        tsr_tokenizer *t = NULL;
        ASSERT_OK(tsr_tokenizer_load(paths[p], &t));
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "roundtrip_b64")) {
            size_t tn;
            char *text = b64dec(c->valuestring, &tn);
            int32_t *ids = NULL;
            size_t n = 0;
            ASSERT_OK(tsr_tokenizer_encode(t, text, tn, true, false, &ids, &n));
            size_t gn = 0;
            char *got = decode_all(t, ids, n, &gn);
            if (!got || gn != tn || memcmp(got, text, tn) != 0) {
                fprintf(stderr, "  %s: round trip of %zu bytes failed\n", paths[p], tn);
                bad++;
            }
            /* Every byte >= 0x80 that is not valid UTF-8 must come out as its byte token. */
            if (tn == 1 && (uint8_t)text[0] == 0xff && !(n == 3 && ids[2] == 3 + 0xff)) {
                fprintf(stderr, "  %s: \\xff did not use byte fallback\n", paths[p]);
                bad++;
            }
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= t->vocab_size || ids[i] == 0) bad++;
            free(got);
            tsr_free(ids);
            free(text);
        }
        tsr_tokenizer_destroy(t);
    }
    cJSON_Delete(doc);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_tok512) {
    cJSON *doc = load_cases(CASES);
    ASSERT_TRUE(doc != NULL);
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(TOK512, &t));
    ASSERT_EQ_INT(t->vocab_size, 512);
    ASSERT_EQ_INT(t->bos_id, 1);
    ASSERT_EQ_INT(t->eos_id, 2);
    /* Stable ids for "Once upon a time" and friends, plus decode round trips. */
    int bad = check_cases(t, cJSON_GetObjectItem(doc, "tok512"));
    char buf[16];
    /* tok512's control pieces are "\n<s>\n" / "\n</s>\n": they decode to nothing. */
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, 1, buf, sizeof buf), 0);
    ASSERT_EQ_INT(tsr_tokenizer_decode(t, -1, 2, buf, sizeof buf), 0);
    tsr_tokenizer_destroy(t);
    cJSON_Delete(doc);
    ASSERT_EQ_INT(bad, 0);
}

TSR_TEST(test_encode_is_fast) {
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(LLAMA2_TOK, &t));
    /* 1 MB of text, including a 64 KB word with no spaces: near-linear encode. */
    size_t n = 1 << 20;
    char *text = malloc(n);
    const char *words[] = {"tessera ", "distributed ", "inference ", "\xe4\xbd\xa0\xe5\xa5\xbd ",
                           "42 ", "runtime\n", "\xf0\x9f\x98\x80 ", "caf\xc3\xa9 "};
    size_t o = 0;
    unsigned r = 1;
    while (o < n - 65536) {
        r = r * 1103515245u + 12345u;
        const char *w = words[(r >> 16) % 8];
        size_t wl = strlen(w);
        memcpy(text + o, w, wl);
        o += wl;
    }
    memset(text + o, 'a', n - o);
    /* this thread's CPU time, not wall time: other processes on the machine (a parallel
     * ctest, builds) stretch the wall clock several times over; a quadratic encode would
     * take minutes of CPU on the 64 KB word alone */
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    int32_t *ids = NULL;
    size_t nid = 0;
    ASSERT_OK(tsr_tokenizer_encode(t, text, n, true, false, &ids, &nid));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "  encoded 1 MB into %zu ids in %.3f s of CPU time\n", nid, s);
    ASSERT_TRUE(nid > 100000);
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

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

TSR_TEST(test_bad_files) {
    size_t n = 0;
    char *good = read_all(TOK512, &n);
    ASSERT_TRUE(good != NULL && n > 100);
    tsr_tokenizer *t = NULL;
    const char *trunc = TSR_BINARY_DIR "/tok_truncated.bin";
    /* Cut inside the last piece's bytes, then inside an entry header. */
    write_file(trunc, good, n - 1);
    ASSERT_EQ_INT(tsr_tokenizer_load(trunc, &t), TSR_ERR_FORMAT);
    ASSERT_TRUE(t == NULL);
    ASSERT_STR_CONTAINS(tsr_last_error(), trunc);
    ASSERT_STR_CONTAINS(tsr_last_error(), "past the end");
    write_file(trunc, good, 4 + 8 + 5 + 3); /* max_len, <unk> entry, 3 header bytes */
    ASSERT_EQ_INT(tsr_tokenizer_load(trunc, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), trunc);
    ASSERT_STR_CONTAINS(tsr_last_error(), "truncated");
    write_file(trunc, good, 2);
    ASSERT_EQ_INT(tsr_tokenizer_load(trunc, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), trunc);
    write_file(trunc, good, 4); /* header only */
    ASSERT_EQ_INT(tsr_tokenizer_load(trunc, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), trunc);

    /* A length field far past EOF (and a negative one) in the middle of the file. */
    const char *badlen = TSR_BINARY_DIR "/tok_badlen.bin";
    int32_t huge = 1 << 30, neg = -5;
    memcpy(good + 4 + 4, &huge, 4);
    write_file(badlen, good, n);
    ASSERT_EQ_INT(tsr_tokenizer_load(badlen, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), badlen);
    ASSERT_STR_CONTAINS(tsr_last_error(), "entry 0");
    memcpy(good + 4 + 4, &neg, 4);
    write_file(badlen, good, n);
    ASSERT_EQ_INT(tsr_tokenizer_load(badlen, &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), badlen);
    free(good);

    const char *missing = TSR_BINARY_DIR "/no_such_tokenizer.bin";
    ASSERT_EQ_INT(tsr_tokenizer_load(missing, &t), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), missing);
    ASSERT_EQ_INT(tsr_alloc_live_bytes(), 0);
}

TSR_TEST(test_find) {
    char buf[4096];
    ASSERT_OK(tsr_tokenizer_find(TSR_SOURCE_DIR "/models/stories260K.bin", 512, buf, sizeof buf));
    ASSERT_STR_CONTAINS(buf, "/models/tok512.bin");
    ASSERT_OK(tsr_tokenizer_find(TSR_SOURCE_DIR "/models/stories260K.bin", 32000, buf,
                                 sizeof buf));
    ASSERT_STR_CONTAINS(buf, "/models/tokenizer.bin");
    ASSERT_OK(tsr_tokenizer_find(TSR_SOURCE_DIR "/tests/data/tokenizers/bpe_llama3", 0, buf,
                                 sizeof buf));
    ASSERT_STR_CONTAINS(buf, "/bpe_llama3/tokenizer.json");
    ASSERT_OK(tsr_tokenizer_find(TSR_SOURCE_DIR "/tests/data/tokenizers/bpe_llama3/", 0, buf,
                                 sizeof buf));
    ASSERT_STR_CONTAINS(buf, "/bpe_llama3/tokenizer.json");
    ASSERT_TRUE(strstr(buf, "//") == NULL);
    ASSERT_EQ_INT(tsr_tokenizer_find(TSR_SOURCE_DIR "/tests/unit", 0, buf, sizeof buf),
                  TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), "tests/unit");
    ASSERT_EQ_INT(tsr_tokenizer_find(TSR_SOURCE_DIR "/tests/unit/test_tokenizer_spm.c", 7, buf,
                                     sizeof buf), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), "tok7.bin");
    ASSERT_EQ_INT(tsr_tokenizer_find("/nonexistent/model.bin", 512, buf, sizeof buf),
                  TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), "/nonexistent/model.bin");
    /* Found paths load through the dispatcher. */
    ASSERT_OK(tsr_tokenizer_find(TSR_SOURCE_DIR "/models/stories260K.bin", 512, buf, sizeof buf));
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(buf, &t));
    ASSERT_EQ_INT(t->vocab_size, 512);
    tsr_tokenizer_destroy(t);
    tsr_tokenizer_destroy(NULL);
}

TSR_TEST_MAIN(test_llama2_matches_sentencepiece, test_llama2_known_prompt,
              test_invalid_utf8_round_trip, test_tok512, test_encode_is_fast, test_bad_files,
              test_find)
