/* Shared by fuzz_tokenizer_json.c and fuzz_tokenizer_bin.c: a tokenizer that loads is run
 * on a fixed text (plain, spaces, digits, a special token's spelling, invalid UTF-8) and
 * every id it gives, and every id of the vocabulary, is decoded. */
#ifndef TSR_TESTS_FUZZ_TOKENIZER_LOAD_H
#define TSR_TESTS_FUZZ_TOKENIZER_LOAD_H

#include "base/alloc.h"
#include "runtime/text/tokenizer.h"

static inline void tsr_fuzz_tokenizer_exercise(const tsr_tokenizer *t) {
    static const char text[] = "Hello  world 123, <|begin_of_text|>\xff\xfe \xe2\x82 caf\xc3\xa9\n";
    int32_t *ids = NULL;
    size_t n = 0;
    char buf[512];
    if (tsr_tokenizer_encode(t, text, sizeof text - 1, true, true, &ids, &n) == TSR_OK) {
        int32_t prev = -1;
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= t->vocab_size) abort(); /* encode made a bad id */
            (void)tsr_tokenizer_decode(t, prev, ids[i], buf, sizeof buf);
            prev = ids[i];
        }
        tsr_free(ids);
    }
    for (int id = 0; id < t->vocab_size && id < 4096; id++) {
        (void)tsr_tokenizer_decode(t, -1, id, buf, sizeof buf);
        (void)tsr_tokenizer_decode(t, id, id, buf, 4);
    }
    (void)tsr_tokenizer_is_eos(t, 0);
}

#endif
