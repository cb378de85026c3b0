/* Sampling of one row of logits with the parameters of the backend op `sample`
 * (kernels/backend.h): the arithmetic that runtime/exec/sampler.c and the CPU backends share, so
 * that the CPU op draws exactly the host sampler's tokens. Host memory only. */
#ifndef TSR_KERNELS_SAMPLE_H
#define TSR_KERNELS_SAMPLE_H

#include <stdint.h>

#include "kernels/backend.h"

/* A candidate of top-k / top-p: probability and token id. */
typedef struct tsr_sample_cand {
    float p;
    int32_t id;
} tsr_sample_cand;

/* Index of the largest of x[0 .. n) (lowest index on ties; NaN never wins, a NaN at 0 gives
 * 0): the plain `x[i] > x[best]` scan. */
int32_t tsr_sample_argmax(const float *x, int n);
/* The token for logits[0 .. n) with p (greedy when p->temperature is 0; else softmax at the
 * temperature, top-k, then top-p, and p->r picks in the kept mass). logits is overwritten
 * (the probabilities); cand has n entries of scratch. */
int32_t tsr_sample_row(float *logits, int n, const tsr_sample_params *p, tsr_sample_cand *cand);

#endif
