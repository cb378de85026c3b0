/* Rotary-embedding frequencies, shared by every backend: each builds its rope tables from
 * these numbers so that all backends rotate by bit-identical angles (at large positions one
 * ulp of a frequency moves the angle visibly). */
#ifndef TSR_KERNELS_ROPE_FREQ_H
#define TSR_KERNELS_ROPE_FREQ_H

#include "base/model_config.h"

/* Computes the f32 inverse frequencies of rope for cfg (head_dim/2 values) the way Hugging
 * Face does in float32, including Llama-3.1 smoothing and YaRN (whose cos and sin are then
 * multiplied by cfg->rope_attn_factor: tsr_rope_cos_scale). */
void tsr_rope_inv_freq(const tsr_model_config *cfg, float *inv_freq);

/* What cos and sin are multiplied by: YaRN's attention factor, else 1. */
static inline float tsr_rope_cos_scale(const tsr_model_config *cfg) {
    return cfg->rope_scaling == TSR_ROPE_YARN && cfg->rope_attn_factor > 0.0f
               ? cfg->rope_attn_factor
               : 1.0f;
}

#endif
