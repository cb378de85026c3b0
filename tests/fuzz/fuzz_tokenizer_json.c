/* libFuzzer target: the Hugging Face tokenizer.json loader (runtime/text/tokenizer_bpe.c); a
 * tokenizer that loads is exercised (tests/fuzz/fuzz_tokenizer_load.h). */
#include "tests/fuzz/fuzz_util.h"

#include "tests/fuzz/fuzz_tokenizer_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tsr_fuzz_write("tokenizer.json", data, size);
    tsr_tokenizer *t = NULL;
    if (tsr_tokenizer_load_bpe(path, &t) != TSR_OK) return 0;
    tsr_fuzz_tokenizer_exercise(t);
    tsr_tokenizer_destroy(t);
    return 0;
}
