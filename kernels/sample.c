#include "kernels/sample.h"

#include <math.h>
#include <stdlib.h>

int32_t tsr_sample_argmax(const float *x, int n) {
    /* The first index of the largest value, as the plain `x[i] > x[best]` scan gives (NaN
     * never wins; a NaN at 0 stays), but the maximum first, in 8 independent chains: the
     * scan's loop-carried compare ran at ~4 cycles an element, 1.5 % of a 110M decode step
     * over a 32000 vocabulary. */
    if (n <= 1 || x[0] != x[0]) return 0;
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = x[0];
    int i = 1;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float mx = m[0];
    for (int k = 1; k < 8; k++) mx = m[k] > mx ? m[k] : mx;
    for (i = 0; i < n; i++)
        if (x[i] == mx) return i;
    return 0;
}

static int tsr__cand_desc(const void *a, const void *b) {
    const tsr_sample_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id; /* stable order on ties keeps draws reproducible */
}

int32_t tsr_sample_row(float *logits, int n, const tsr_sample_params *p, tsr_sample_cand *cand) {
    if (p->temperature == 0.0f) return tsr_sample_argmax(logits, n);
    float mx = logits[tsr_sample_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - mx) / p->temperature);
        sum += logits[i];
    }
    for (int i = 0; i < n; i++) logits[i] = (float)(logits[i] / sum);
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    float r = p->r;
    if (k == n && p->top_p >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf) return i;
        }
        return n - 1;
    }
    for (int i = 0; i < n; i++) cand[i] = (tsr_sample_cand){logits[i], i};
    qsort(cand, (size_t)n, sizeof *cand, tsr__cand_desc);
    /* Keep the top k, then the smallest prefix whose mass reaches top-p. */
    float mass = 0.0f;
    int keep = 0;
    for (; keep < k; keep++) {
        mass += cand[keep].p;
        if (mass >= p->top_p) {
            keep++;
            break;
        }
    }
    float target = r * mass, cdf = 0.0f;
    for (int i = 0; i < keep; i++) {
        cdf += cand[i].p;
        if (target < cdf) return cand[i].id;
    }
    return cand[keep - 1].id;
}
