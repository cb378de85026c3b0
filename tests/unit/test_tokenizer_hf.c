/* Hugging Face tokenizer.json families against HF `tokenizers`, token for token, on the
 * tokenizer corpus (tests/data/tokenizers/hf, written by tools/tokenizer_corpus.py): Llama 3
 * (Split + ByteLevel), Qwen2 (NFC + Split + ByteLevel), SmolLM2 (Digits + ByteLevel with its
 * regex), GPT-2 with add_prefix_space, and Llama 2 / Mistral's SentencePiece as BPE (Prepend and
 * Replace normalizers, byte fallback, Replace/ByteFallback/Fuse/Strip decoders, or a Metaspace
 * pre-tokenizer and decoder). Each text is encoded without BOS/EOS and compared
 * with the stored ids; the first mismatch is printed with the text around it. Decoding the
 * ids gives the text back (or, where HF's decode differs from the input, HF's decode). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <time.h>

#include "base/alloc.h"
#include "base/status.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_nfc.h"
#include "tests/test.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* shared helpers not all used here */
#include "tests/tokenizer_cases.h"

#define HF TSR_SOURCE_DIR "/tests/data/tokenizers/hf"

static cJSON *g_corpus;

/* The stored ids of one text: two base64 digits per id (tools/tokenizer_corpus.py). */
static int32_t *ref_ids(const cJSON *s, size_t *n) {
    size_t len = cJSON_IsString(s) ? strlen(s->valuestring) : 0;
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    *n = len / 2;
    for (size_t i = 0; i < *n; i++)
        ids[i] = b64val(s->valuestring[2 * i]) * 64 + b64val(s->valuestring[2 * i + 1]);
    return ids;
}

static const cJSON *corpus_texts(void) {
    if (!g_corpus) g_corpus = load_cases(HF "/corpus.json");
    return g_corpus ? cJSON_GetObjectItem(g_corpus, "texts") : NULL;
}

/* Prints the tokens around position i of both encodings and the text they cover. */
static void show_mismatch(const tsr_tokenizer *t, const char *family, int text_i,
                          const int32_t *got, size_t n_got, const int32_t *want, size_t nw,
                          size_t i) {
    char buf[4096];
    size_t o = 0;
    size_t from = i > 4 ? i - 4 : 0;
    for (size_t k = from; k < i && o < 2048; k++) {
        int w = tsr_tokenizer_decode(t, -1, got[k], buf + o, sizeof buf - o - 1);
        if (w > 0) o += (size_t)w;
    }
    buf[o] = '\0';
    fprintf(stderr, "  %s text %d: first mismatch at token %zu (after \"%s\")\n", family, text_i,
            i, buf);
    fprintf(stderr, "    tessera:");
    for (size_t k = i; k < i + 8 && k < n_got; k++) {
        int w = tsr_tokenizer_decode(t, -1, got[k], buf, sizeof buf - 1);
        buf[w > 0 ? w : 0] = '\0';
        fprintf(stderr, " %d\"%s\"", (int)got[k], buf);
    }
    fprintf(stderr, "\n    tokenizers:");
    for (size_t k = i; k < i + 8 && k < nw; k++) {
        int id = want[k];
        int w = tsr_tokenizer_decode(t, -1, id, buf, sizeof buf - 1);
        buf[w > 0 ? w : 0] = '\0';
        fprintf(stderr, " %d\"%s\"", id, buf);
    }
    fprintf(stderr, "\n");
}

static void check_family(const char *family) {
    char path[512], ids_path[512];
    snprintf(path, sizeof path, HF "/%s.json", family);
    snprintf(ids_path, sizeof ids_path, HF "/%s.ids.json", family);
    const cJSON *texts = corpus_texts();
    cJSON *ref = load_cases(ids_path);
    ASSERT_TRUE(texts && ref);
    const cJSON *all_ids = cJSON_GetObjectItem(ref, "ids");
    const cJSON *decoded = cJSON_GetObjectItem(ref, "decoded");
    ASSERT_EQ_INT(cJSON_GetArraySize(all_ids), cJSON_GetArraySize(texts));
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(path, &t));
    int bad = 0, n_texts = 0;
    size_t n_tokens = 0, n_bytes = 0;
    double secs = 0;
    const cJSON *text;
    cJSON_ArrayForEach(text, texts) {
        const char *s = text->valuestring;
        size_t len = strlen(s);
        size_t nw = 0;
        int32_t *want = ref_ids(cJSON_GetArrayItem(all_ids, n_texts), &nw);
        int32_t *ids = NULL;
        size_t n = 0;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        tsr_status st = tsr_tokenizer_encode(t, s, len, false, false, &ids, &n);
        clock_gettime(CLOCK_MONOTONIC, &b);
        secs += (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        if (st != TSR_OK) {
            fprintf(stderr, "  %s text %d: encode failed: %s\n", family, n_texts,
                    tsr_last_error());
            bad++;
            n_texts++;
            free(want);
            continue;
        }
        size_t i = 0;
        while (i < n && i < nw && ids[i] == want[i]) i++;
        if (i < n || i < nw) {
            if (bad < 5) show_mismatch(t, family, n_texts, ids, n, want, nw, i);
            fprintf(stderr, "  %s text %d: %zu ids, tokenizers gives %zu\n", family, n_texts, n,
                    nw);
            bad++;
        } else {
            char key[16];
            snprintf(key, sizeof key, "%d", n_texts);
            const cJSON *d = cJSON_GetObjectItem(decoded, key);
            const char *expect = cJSON_IsString(d) ? d->valuestring : s;
            size_t gn = 0;
            char *got = decode_all(t, ids, n, &gn);
            if (!got || gn != strlen(expect) || memcmp(got, expect, gn) != 0) {
                size_t j = 0;
                while (got && j < gn && expect[j] && got[j] == expect[j]) j++;
                fprintf(stderr, "  %s text %d: decode differs at byte %zu\n", family, n_texts, j);
                bad++;
            }
            free(got);
        }
        n_tokens += n;
        n_bytes += len;
        tsr_free(ids);
        free(want);
        n_texts++;
    }
    fprintf(stderr, "  %s: %d texts, %zu bytes, %zu tokens, %d differ (%.1f MB/s)\n", family,
            n_texts, n_bytes, n_tokens, bad, secs > 0 ? (double)n_bytes / secs / 1e6 : 0.0);
    ASSERT_EQ_INT(bad, 0);
    ASSERT_TRUE(n_bytes >= 200000);
    tsr_tokenizer_destroy(t);
    cJSON_Delete(ref);
}

TSR_TEST(test_llama3) { check_family("llama3"); }
TSR_TEST(test_qwen2) { check_family("qwen2"); }
TSR_TEST(test_smollm2) { check_family("smollm2"); }
TSR_TEST(test_gpt2_prefix) { check_family("gpt2_prefix"); }
TSR_TEST(test_llama2) { check_family("llama2"); }
TSR_TEST(test_metaspace) { check_family("metaspace"); }
/* GPT-OSS: o200k's split regex (case-aware letter runs, contractions, digits in threes,
 * "[\r\n/]*" after punctuation) and the harmony special tokens */
TSR_TEST(test_o200k) { check_family("o200k"); }

/* The strings where o200k's regex differs from Llama 3's, and a harmony message (each
 * special token one id), against `tokenizers` on o200k.json (ids printed by it). */
TSR_TEST(test_o200k_cases) {
    static const struct {
        const char *text;
        int n;
        int32_t ids[16];
    } cases[] = {
        {"\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6", 12,
         {170, 126, 265, 172, 254, 239, 171, 265, 255, 173, 115, 109}},
        {"I'M", 3, {50, 16, 54}},
        {"it's", 1, {335}},
        {"12345678", 5, {640, 28, 1589, 31, 1001}},
        {"\r\n\r\n", 1, {390}},
        {"  x", 2, {230, 432}},
        {"a/b\n", 4, {74, 24, 75, 208}},
        {"HELLOWorld", 8, {49, 46, 333, 56, 64, 294, 85, 77}},
        {"<|start|>assistant<|channel|>final<|message|>Hi<|return|>", 13,
         {5, 708, 565, 451, 93, 4, 79, 281, 308, 7, 49, 82, 2}},
    };
    tsr_tokenizer *t = NULL;
    ASSERT_OK(tsr_tokenizer_load(HF "/o200k.json", &t));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ASSERT_OK(tsr_tokenizer_encode(t, cases[i].text, strlen(cases[i].text), false, false,
                                       &ids, &n));
        bool same = (int)n == cases[i].n;
        for (size_t k = 0; same && k < n; k++) same = ids[k] == cases[i].ids[k];
        if (!same) TSR_FAIL_("o200k case %zu (\"%s\"): %zu ids differ", i, cases[i].text, n);
        tsr_free(ids);
    }
    tsr_tokenizer_destroy(t);
}

/* NFC on its own: composed, decomposed, reordered marks, exclusions, Hangul, bad bytes. */
TSR_TEST(test_nfc) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"abc", "abc"},
        {"e\xCC\x81", "\xC3\xA9"},                           /* e + acute -> é */
        {"\xE1\xBA\xA1\xCC\x82", "\xE1\xBA\xAD"},            /* ạ + circumflex -> ậ */
        {"a\xCC\x81\xCC\xA3", "\xE1\xBA\xA1\xCC\x81"},       /* marks reordered, then ạ */
        {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},        /* U+0958: an exclusion */
        {"\xE2\x84\xAB", "\xC3\x85"},                        /* U+212B angstrom -> Å */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* L V T -> 각 */
        {"\xFF" "e\xCC\x81", "\xFF\xC3\xA9"},                /* a bad byte kept */
        {"e\xFF\xCC\x81", "e\xFF\xCC\x81"},                  /* ... blocks composition */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        size_t n = 0;
        ASSERT_OK(tsr_nfc(cases[i].in, strlen(cases[i].in), &out, &n));
        if (n != strlen(cases[i].out) || memcmp(out, cases[i].out, n) != 0) {
            fprintf(stderr, "  nfc case %zu differs\n", i);
            tsr_test_failed_flag = 1;
        }
        tsr_free(out);
    }
}

/* A tokenizer.json with steps tessera does not implement is refused with one line. */
TSR_TEST(test_refused) {
    const char *json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                       "\"normalizer\":{\"type\":\"NFKC\"}}";
    char path[256];
    snprintf(path, sizeof path, "%s/tok_hf_refused.json", TSR_BINARY_DIR);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f);
    fputs(json, f);
    fclose(f);
    tsr_tokenizer *t = NULL;
    ASSERT_TRUE(tsr_tokenizer_load(path, &t) != TSR_OK);
    ASSERT_STR_CONTAINS(tsr_last_error(), "normalizer NFKC");
    remove(path);
}

static void cleanup(void) { cJSON_Delete(g_corpus); }
TSR_TEST(test_done) { cleanup(); }

TSR_TEST_MAIN(test_nfc, test_llama3, test_o200k, test_o200k_cases, test_qwen2, test_smollm2, test_gpt2_prefix, test_llama2,
              test_metaspace, test_refused,
              test_done)
