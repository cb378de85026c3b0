/* The model's hyper-parameters, whatever file they came from. */
#ifndef TSR_RUNTIME_CONFIG_H
#define TSR_RUNTIME_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/base/dtype.h"
#include "runtime/base/status.h"

typedef enum tsr_rope_scaling {
    TSR_ROPE_NONE = 0,
    TSR_ROPE_LLAMA3 = 1, /* Llama 3.1/3.2 "rope_type": "llama3" frequency smoothing */
} tsr_rope_scaling;

typedef struct tsr_model_config {
    int dim;          /* hidden size */
    int hidden_dim;   /* MLP intermediate size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;     /* usually dim / n_heads */
    int vocab_size;
    int max_seq_len;  /* max_position_embeddings */
    float norm_eps;
    float rope_theta;
    /* llama2.c rotates interleaved pairs (x[2i], x[2i+1]); HF Llama rotates halves
     * (x[i], x[i + hd/2]). Loaders record which convention the weights use. */
    bool rope_interleaved;
    tsr_rope_scaling rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_original_max_pos;
    bool tied_embeddings; /* classifier shares the token embedding */
    tsr_dtype dtype;      /* dtype of the matrices (norms are converted to f32) */
    int bos_id;           /* -1 when unknown */
    int eos_id;           /* -1 when unknown; see also eos_ids */
    int n_eos_ids;
    int eos_ids[8];
} tsr_model_config;

/* Fills defaults (head_dim from dim, eps 1e-5, theta 10000, ...) for fields left 0. */
void tsr_config_defaults(tsr_model_config *c);

/* Checks every field for sanity; `what` names the source in the error line. */
tsr_status tsr_config_validate(const tsr_model_config *c, const char *what);

/* Parses a Hugging Face config.json (Llama family). */
tsr_status tsr_config_from_hf_json(const char *path, tsr_model_config *out);

/* Number of parameters of the matrices (for benchmarks and progress). */
int64_t tsr_config_param_count(const tsr_model_config *c);

#endif
