/* libFuzzer target: encode and decode of the repository's tokenizers (runtime/text/tokenizer*.c)
 * on arbitrary bytes. The first input byte picks the tokenizer (bits 0-1: the Llama-3 BPE
 * tokenizer.json, its legacy variant, models/tokenizer.bin, models/tok512.bin), BOS (bit 2)
 * and EOS (bit 3), and the mode (bit 4): encode the rest and decode every id it gives, or
 * decode the rest read as little-endian 16-bit ids (mod the vocabulary). */
#include "tests/fuzz/fuzz_util.h"

#include "base/alloc.h"
#include "runtime/text/tokenizer.h"

static tsr_tokenizer *tsr__tok[4];

static const tsr_tokenizer *tsr__get(int which) {
    static const char *files[4] = {"tests/data/tokenizers/bpe_llama3/tokenizer.json",
                                   "tests/data/tokenizers/bpe_llama3_legacy/tokenizer.json",
                                   "models/tokenizer.bin", "models/tok512.bin"};
    if (!tsr__tok[which]) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", TSR_SOURCE_DIR, files[which]);
        if (tsr_tokenizer_load(path, &tsr__tok[which]) != TSR_OK) {
            fprintf(stderr, "fuzz_tokenize: %s\n", tsr_last_error());
            abort();
        }
    }
    return tsr__tok[which];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const tsr_tokenizer *t = tsr__get(data[0] & 3);
    bool bos = data[0] & 4, eos = data[0] & 8;
    char buf[1024];
    if (data[0] & 16) {
        int32_t prev = -1;
        for (size_t k = 1; k + 1 < size; k += 2) {
            int32_t id = (int32_t)((data[k] | data[k + 1] << 8) % t->vocab_size);
            if (tsr_tokenizer_decode(t, prev, id, buf, sizeof buf) < 0) abort();
            prev = id;
        }
        return 0;
    }
    char *text = tsr_fuzz_copy(data + 1, size - 1);
    int32_t *ids = NULL;
    size_t n = 0;
    if (tsr_tokenizer_encode(t, text, size - 1, bos, eos, &ids, &n) == TSR_OK) {
        int32_t prev = -1;
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= t->vocab_size) abort(); /* an id outside the vocab */
            if (tsr_tokenizer_decode(t, prev, ids[i], buf, sizeof buf) < 0) abort();
            prev = ids[i];
        }
        tsr_free(ids);
    }
    free(text);
    return 0;
}
