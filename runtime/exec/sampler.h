/* Sampling: greedy, temperature, top-k, top-p. The RNG state is plain data so that a
 * checkpoint can save it and a resumed job draws the same tokens. */
#ifndef TSR_RUNTIME_SAMPLER_H
#define TSR_RUNTIME_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "kernels/backend.h"

typedef struct tsr_sampler_params {
    float temperature; /* 0: greedy */
    float top_p;       /* 1: off */
    int top_k;         /* 0: off */
    uint64_t seed;
} tsr_sampler_params;

typedef struct tsr_sampler {
    tsr_sampler_params p;
    uint64_t rng; /* xorshift64* state */
    int vocab_size;
    /* scratch for top-k/top-p sorting, vocab_size entries */
    struct tsr_sample_cand *cand;
} tsr_sampler;

tsr_status tsr_sampler_init(tsr_sampler *s, int vocab_size, const tsr_sampler_params *p);
void tsr_sampler_free(tsr_sampler *s);
/* Draws a token from logits (modified in place: scaled and softmaxed when sampling). */
int32_t tsr_sampler_sample(tsr_sampler *s, float *logits);
/* Advances the RNG as one tsr_sampler_sample does (one draw when sampling, none when
 * greedy: the draws do not depend on the logits), for a rank that gets the token from
 * the rank that has the logits (pipeline parallelism, runtime/exec/forward.h). */
void tsr_sampler_skip(tsr_sampler *s);
/* Row i's parameters for the backend op `sample` (kernels/backend.h), the device-side
 * tsr_sampler_sample: advances the RNG exactly as tsr_sampler_sample does (the uniform is
 * drawn here, on the host, from the request's seeded state), so that a backend that samples
 * draws the tokens the host would. */
void tsr_sampler_row_params(tsr_sampler *s, tsr_sample_params *out);
/* Index of the largest logit (lowest index on ties). */
int32_t tsr_argmax(const float *x, int n);

#endif
