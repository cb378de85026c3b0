#include "runtime/exec/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "kernels/sample.h"

tsr_status tsr_sampler_init(tsr_sampler *s, int vocab_size, const tsr_sampler_params *p) {
    if (p->temperature < 0.0f || !(p->top_p > 0.0f && p->top_p <= 1.0f) || p->top_k < 0)
        return tsr_error_set(TSR_ERR_INVALID,
                             "sampler: need temperature >= 0, 0 < top-p <= 1, top-k >= 0");
    s->p = *p;
    /* xorshift64* must not start at 0; mix the seed so nearby seeds diverge. */
    uint64_t z = p->seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s->rng = (z ^ (z >> 31)) | 1u;
    s->vocab_size = vocab_size;
    s->cand = tsr_calloc((size_t)vocab_size, sizeof *s->cand);
    return s->cand ? TSR_OK : TSR_ERR_NOMEM;
}

void tsr_sampler_free(tsr_sampler *s) {
    tsr_free(s->cand);
    s->cand = NULL;
}

static float tsr__rand01(tsr_sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((s->rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

int32_t tsr_argmax(const float *x, int n) {
    return tsr_sample_argmax(x, n);
}

void tsr_sampler_skip(tsr_sampler *s) {
    if (s->p.temperature != 0.0f) (void)tsr__rand01(s);
}

void tsr_sampler_row_params(tsr_sampler *s, tsr_sample_params *out) {
    *out = (tsr_sample_params){.temperature = s->p.temperature,
                               .top_p = s->p.top_p,
                               .top_k = s->p.top_k,
                               .r = s->p.temperature != 0.0f ? tsr__rand01(s) : 0.0f};
}

int32_t tsr_sampler_sample(tsr_sampler *s, float *logits) {
    /* The draw does not depend on the logits, so taking it first changes nothing; the
     * arithmetic is the backends' sample op's on the CPU (kernels/sample.c). */
    tsr_sample_params p;
    tsr_sampler_row_params(s, &p);
    return tsr_sample_row(logits, s->vocab_size, &p, s->cand);
}
