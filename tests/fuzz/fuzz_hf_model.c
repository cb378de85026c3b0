/* libFuzzer target: a Hugging Face model directory (runtime/model/loader_hf.c through
 * tsr_model_load): the input is [uint16 LE n][n bytes of config.json][model.safetensors],
 * written to a directory of its own; a model that loads is checked and destroyed. */
#include "tests/fuzz/fuzz_util.h"

#include "runtime/model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *cfg, *st;
    size_t cfg_len, st_len;
    tsr_fuzz_split(data, size, &cfg, &cfg_len, &st, &st_len);
    tsr_fuzz_write("config.json", cfg, cfg_len);
    tsr_fuzz_write("model.safetensors", st, st_len);
    tsr_model *m = NULL;
    if (tsr_model_load(tsr_fuzz_dir(), &m) == TSR_OK) {
        (void)tsr_model_check(m);
        (void)tsr_model_weight_bytes(m);
        tsr_model_destroy(m);
    }
    return 0;
}
