/* libFuzzer target: config.json (runtime/model/config.c, tsr_config_from_hf_json); an accepted
 * config is validated and its parameter count taken, as a model load would. */
#include "tests/fuzz/fuzz_util.h"

#include "runtime/model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tsr_fuzz_write("config.json", data, size);
    tsr_model_config c;
    if (tsr_config_from_hf_json(path, &c) != TSR_OK) return 0;
    tsr_config_defaults(&c);
    if (tsr_config_validate(&c, "fuzz") == TSR_OK) (void)tsr_config_param_count(&c);
    return 0;
}
