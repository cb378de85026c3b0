/* libFuzzer target: the llama2.c checkpoint loader (runtime/model/loader_llama2c.c): header and
 * size checks, and the weight views of a file that passes them. */
#include "tests/fuzz/fuzz_util.h"

#include "runtime/model/loader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tsr_fuzz_write("model.bin", data, size);
    tsr_model *m = NULL;
    if (tsr_loader_llama2c(path, &m) == TSR_OK) {
        (void)tsr_model_check(m);
        tsr_model_destroy(m);
    }
    return 0;
}
