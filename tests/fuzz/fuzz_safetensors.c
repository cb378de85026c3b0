/* libFuzzer target: the safetensors reader (runtime/format/safetensors.c) on a file holding the
 * input. Every tensor it accepts is read end to end, so a view that the bounds checks let
 * past the map faults under ASan. */
#include "tests/fuzz/fuzz_util.h"

#include "runtime/format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tsr_fuzz_write("model.safetensors", data, size);
    tsr_st_file *f = NULL;
    if (tsr_st_open(path, &f) != TSR_OK) return 0;
    unsigned sum = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const tsr_st_tensor *t = &f->tensors[i];
        const unsigned char *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
        if (tsr_st_find(f, t->name) == NULL) abort(); /* a listed name must be found */
    }
    tsr_st_close(f);
    return (int)(sum & 0);
}
