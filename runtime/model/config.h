/* The model's hyper-parameters, whatever file they came from. */
#ifndef TSR_RUNTIME_CONFIG_H
#define TSR_RUNTIME_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/model_config.h"
#include "base/status.h"

/* Fills defaults (head_dim from dim, eps 1e-5, theta 10000, ...) for fields left 0. */
void tsr_config_defaults(tsr_model_config *c);

/* Checks every field for sanity; `what` names the source in the error line. */
tsr_status tsr_config_validate(const tsr_model_config *c, const char *what);

/* Parses a Hugging Face config.json: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM (others are refused by name). */
tsr_status tsr_config_from_hf_json(const char *path, tsr_model_config *out);

/* Number of parameters of the matrices (for benchmarks and progress). */
int64_t tsr_config_param_count(const tsr_model_config *c);

#endif
