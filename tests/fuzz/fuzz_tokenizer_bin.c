/* libFuzzer target: the llama2.c / SentencePiece tokenizer.bin loader
 * (runtime/text/tokenizer_spm.c); a tokenizer that loads is exercised
 * (tests/fuzz/fuzz_tokenizer_load.h). */
#include "tests/fuzz/fuzz_util.h"

#include "tests/fuzz/fuzz_tokenizer_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tsr_fuzz_write("tokenizer.bin", data, size);
    tsr_tokenizer *t = NULL;
    if (tsr_tokenizer_load_spm(path, &t) != TSR_OK) return 0;
    tsr_fuzz_tokenizer_exercise(t);
    tsr_tokenizer_destroy(t);
    return 0;
}
