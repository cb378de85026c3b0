/* The GGUF `llama` (SentencePiece) tokenizer: tests/data/gguf/tok512_spm.gguf holds
 * models/tok512.bin's vocabulary as llama.cpp's converter writes it (tools/spm_gguf.py:
 * U+2581 for spaces, scores, token types, special ids). Read from the GGUF, it must encode
 * and decode exactly as the .bin does (which test_tokenizer_spm checks against
 * sentencepiece's ids), on the SentencePiece cases and the whole tokenizer corpus. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/alloc.h"
#include "base/status.h"
#include "runtime/text/tokenizer.h"
#include "tests/test.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* shared helpers not all used here */
#include "tests/tokenizer_cases.h"

#define GGUF TSR_SOURCE_DIR "/tests/data/gguf/tok512_spm.gguf"
#define TOK512 TSR_SOURCE_DIR "/models/tok512.bin"
#define CASES TSR_SOURCE_DIR "/tests/data/tokenizers/spm_cases.json"
#define CORPUS TSR_SOURCE_DIR "/tests/data/tokenizers/hf/corpus.json"

/* Encodes text with both tokenizers; counts a difference in ids or decoded text. */
static int same(const tsr_tokenizer *a, const tsr_tokenizer *b, const char *what,
                const char *text, size_t n) {
    int32_t *ia = NULL, *ib = NULL;
    size_t na = 0, nb = 0;
    if (tsr_tokenizer_encode(a, text, n, true, false, &ia, &na) != TSR_OK ||
        tsr_tokenizer_encode(b, text, n, true, false, &ib, &nb) != TSR_OK) {
        fprintf(stderr, "  %s: encode failed: %s\n", what, tsr_last_error());
        tsr_free(ia);
        tsr_free(ib);
        return 1;
    }
    size_t i = 0;
    while (i < na && i < nb && ia[i] == ib[i]) i++;
    int bad = 0;
    if (i < na || i < nb) {
        fprintf(stderr, "  %s: first difference at token %zu: gguf %d, bin %d\n", what, i,
                i < na ? (int)ia[i] : -1, i < nb ? (int)ib[i] : -1);
        bad = 1;
    } else {
        size_t la = 0, lb = 0;
        char *da = decode_all(a, ia, na, &la), *db = decode_all(b, ib, nb, &lb);
        if (!da || !db || la != lb || memcmp(da, db, la) != 0) {
            fprintf(stderr, "  %s: decode differs\n", what);
            bad = 1;
        }
        free(da);
        free(db);
    }
    tsr_free(ia);
    tsr_free(ib);
    return bad;
}

TSR_TEST(test_gguf_spm_matches_bin) {
    tsr_tokenizer *g = NULL, *b = NULL;
    ASSERT_OK(tsr_tokenizer_load(GGUF, &g));
    ASSERT_OK(tsr_tokenizer_load(TOK512, &b));
    ASSERT_STR_EQ(g->ops->name, "spm");
    ASSERT_EQ_INT(g->vocab_size, b->vocab_size);
    ASSERT_EQ_INT(g->bos_id, 1);
    ASSERT_EQ_INT(g->eos_id, 2);
    ASSERT_TRUE(tsr_tokenizer_is_eos(g, 2));
    int bad = 0, n = 0;
    cJSON *cases = load_cases(CASES);
    ASSERT_TRUE(cases);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "cases")) {
        size_t tn;
        char *text = b64dec(cJSON_GetObjectItem(c, "text_b64")->valuestring, &tn);
        bad += same(g, b, cJSON_GetObjectItem(c, "name")->valuestring, text, tn);
        free(text);
        n++;
    }
    cJSON_Delete(cases);
    cJSON *corpus = load_cases(CORPUS);
    ASSERT_TRUE(corpus);
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(corpus, "texts")) {
        char what[32];
        snprintf(what, sizeof what, "corpus text %d", n);
        bad += same(g, b, what, c->valuestring, strlen(c->valuestring));
        n++;
    }
    cJSON_Delete(corpus);
    fprintf(stderr, "  %d texts, %d differ\n", n, bad);
    ASSERT_EQ_INT(bad, 0);
    tsr_tokenizer_destroy(g);
    tsr_tokenizer_destroy(b);
}

TSR_TEST_MAIN(test_gguf_spm_matches_bin)
