/* Rotary-embedding frequencies (rope_freq.h). */
#include "kernels/rope_freq.h"

#include <math.h>

/* HF _compute_yarn_parameters (transformers 5.25) in its f32 steps: the correction range
 * [low, high] in double (floored/ceiled only with truncate), clamped to [0, hd - 1] as HF
 * does; ramp over the hd/2 frequencies; inv = interp * (1 - ef) + extrap * ef with
 * ef = 1 - ramp, interp = 1 / (factor * p), extrap = 1 / p. */
static void tsr__rope_yarn(const tsr_model_config *cfg, float *inv_freq) {
    int hd = cfg->head_dim, half = hd / 2;
    double base = (double)cfg->rope_theta, orig = (double)cfg->rope_original_max_pos;
    const double two_pi = 2.0 * 3.14159265358979323846;
    double low = hd * log(orig / ((double)cfg->rope_beta_fast * two_pi)) / (2.0 * log(base));
    double high = hd * log(orig / ((double)cfg->rope_beta_slow * two_pi)) / (2.0 * log(base));
    if (cfg->rope_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > (double)(hd - 1)) high = (double)(hd - 1);
    if (low == high) high += 0.001; /* HF: prevent a singularity */
    float span = (float)(high - low), lowf = (float)low;
    for (int j = 0; j < half; j++) {
        float p = (float)pow(base, (double)((float)(2 * j) / (float)hd));
        float extrap = 1.0f / p;
        float interp = 1.0f / (cfg->rope_factor * p);
        float ramp = ((float)j - lowf) / span;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp;
        inv_freq[j] = interp * (1.0f - ef) + extrap * ef;
    }
}

void tsr_rope_inv_freq(const tsr_model_config *cfg, float *inv_freq) {
    int hd = cfg->head_dim;
    int half = hd / 2;
    /* HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in float32. */
    for (int j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)hd;
        float p = (float)pow((double)cfg->rope_theta, (double)e);
        inv_freq[j] = 1.0f / p;
    }
    if (cfg->rope_scaling == TSR_ROPE_YARN) {
        tsr__rope_yarn(cfg, inv_freq);
        return;
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
