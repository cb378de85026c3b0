/* Per-format model loaders behind tsr_model_load (runtime/model/model.c dispatches). */
#ifndef TSR_RUNTIME_LOADER_H
#define TSR_RUNTIME_LOADER_H

#include "runtime/model/model.h"

/* llama2.c checkpoint (legacy "version 0": 7 x int32 header, f32 weights). */
tsr_status tsr_loader_llama2c(const char *path, tsr_model **out);

/* Hugging Face directory: config.json + model.safetensors or model.safetensors.index.json. */
tsr_status tsr_loader_hf(const char *dir, tsr_model **out);

/* GGUF file (v2/v3, llama architecture); tensors dequantized to f32/f16/bf16 at load. */
tsr_status tsr_loader_gguf(const char *path, tsr_model **out);

/* "synthetic:NAME" without the prefix: NAME is a known shape (tiny, llama-3.2-1b,
 * llama-3.1-8b, stories15M, stories110M, ...) or a path to a config.json.
 * Optional ",dtype=bf16" and ",seed=N" suffixes select dtype and seed. */
tsr_status tsr_synthetic_create(const char *name, tsr_model **out);

/* Writes `m` as a Hugging Face directory (config.json + model.safetensors) in `dtype`.
 * Rotary weights are permuted to the HF half-rotation layout when the model uses the
 * interleaved (llama2.c) one. */
tsr_status tsr_export_hf(const tsr_model *m, const char *dir, tsr_dtype dtype);

#endif
