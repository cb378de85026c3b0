/* The model's hyper-parameters as a plain type, below every folder: kernels take it (rope
 * reads the rotary settings) without depending on the runtime that parses config files
 * (runtime/model/config.h). */
#ifndef TSR_BASE_MODEL_CONFIG_H
#define TSR_BASE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

typedef enum tsr_rope_scaling {
    TSR_ROPE_NONE = 0,
    TSR_ROPE_LLAMA3 = 1, /* Llama 3.1/3.2 "rope_type": "llama3" frequency smoothing */
    TSR_ROPE_YARN = 2,   /* "rope_type": "yarn" (GPT-OSS): ramped interpolation, and cos/sin
                          * scaled by rope_attn_factor */
} tsr_rope_scaling;

/* The model family, for messages and for the few places the families differ. */
typedef enum tsr_arch {
    TSR_ARCH_LLAMA = 0,
    TSR_ARCH_QWEN2 = 1,   /* Llama + q/k/v projection biases */
    TSR_ARCH_QWEN3 = 2,   /* Llama + per-head RMSNorm of q and k before the rotation */
    TSR_ARCH_MISTRAL = 3, /* Llama's computation (a sliding window bounds the context) */
    TSR_ARCH_GPT_OSS = 4, /* biases, sinks, sliding layers, YaRN, mixture of experts */
} tsr_arch;

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
    tsr_arch arch;
    bool qkv_bias; /* q/k/v projections add a bias (layer weights bq, bk, bv) */
    bool qk_norm;  /* per-head RMSNorm of q and k (weights q_norm, k_norm) before rope */
    /* YaRN (TSR_ROPE_YARN; rope_factor and rope_original_max_pos as above) */
    float rope_beta_fast, rope_beta_slow;
    bool rope_truncate;     /* floor/ceil the correction range (HF's default: true) */
    float rope_attn_factor; /* cos and sin are multiplied by it (1 for other ropes) */
    /* GPT-OSS */
    bool o_bias;        /* o projection bias (layer weight bo) */
    bool attn_sinks;    /* a learned logit per query head joins the softmax (sinks) */
    int sliding_window; /* keys of a sliding layer: q_pos - k_pos < sliding_window */
    /* bit l set: layer l is a sliding_attention layer (n_layers <= 1024) */
    uint64_t sliding_layers[16];
    int n_experts;      /* 0: dense SwiGLU MLP */
    int n_experts_used; /* top-k per token */
    float swiglu_limit, swiglu_alpha;
} tsr_model_config;

/* The sliding window of layer l: 0 when the layer attends to every earlier key. */
static inline int tsr_config_layer_window(const tsr_model_config *c, int l) {
    if (c->sliding_window <= 0 || l < 0 || l >= 1024) return 0;
    return (c->sliding_layers[l / 64] >> (l % 64)) & 1u ? c->sliding_window : 0;
}

#endif
