/* Rotary-embedding frequencies (rope_freq.h). */
#include "kernels/rope_freq.h"

#include <math.h>

void tsr_rope_inv_freq(const tsr_model_config *cfg, float *inv_freq) {
    int hd = cfg->head_dim;
    int half = hd / 2;
    /* HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in float32. */
    for (int j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)hd;
        float p = (float)pow((double)cfg->rope_theta, (double)e);
        inv_freq[j] = 1.0f / p;
    }
    if (cfg->rope_scaling != TSR_ROPE_LLAMA3) return;
    /* HF _compute_llama3_parameters, with torch's f32 rounding: `scalar / tensor` is
     * tensor.reciprocal() * scalar, every other op is a plain f32 op. */
    float factor = cfg->rope_factor;
    float low_ff = cfg->rope_low_freq_factor;
    float high_ff = cfg->rope_high_freq_factor;
    double old_ctx = (double)cfg->rope_original_max_pos;
    double low_wavelen = old_ctx / (double)low_ff;
    double high_wavelen = old_ctx / (double)high_ff;
    float two_pi = (float)(2.0 * 3.14159265358979323846);
    float ff_span = (float)((double)high_ff - (double)low_ff);
    for (int j = 0; j < half; j++) {
        float f = inv_freq[j];
        float wavelen = (1.0f / f) * two_pi;
        float g = (double)wavelen > low_wavelen ? f / factor : f;
        float smooth = ((1.0f / wavelen) * (float)old_ctx - low_ff) / ff_span;
        float smoothed = ((1.0f - smooth) * g) / factor + smooth * g;
        int medium = !((double)wavelen < high_wavelen) && !((double)wavelen > low_wavelen);
        inv_freq[j] = medium ? smoothed : g;
    }
}
