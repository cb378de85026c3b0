#include "kernels/sample.h"

#include <math.h>
#include <stdbool.h>
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

/* a comes before b in the order above (probability descending, lowest id first). */
static inline bool tsr__before(float pa, int32_t ia, float pb, int32_t ib) {
    return pa > pb || (pa == pb && ia < ib);
}

/* Restores the heap below i: h[0] is the candidate that comes last in the order. */
static void tsr__sift_down(tsr_sample_cand *h, int m, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && tsr__before(h[w].p, h[w].id, h[l].p, h[l].id)) w = l;
        if (r < m && tsr__before(h[w].p, h[w].id, h[r].p, h[r].id)) w = r;
        if (w == i) return;
        tsr_sample_cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* cand[0 .. m) = the first m of p[0 .. n) in the order above, sorted: the same prefix a
 * full sort gives (the order is total), in O(n log m) and a sort of m instead of n. */
static void tsr__top_m(const float *p, int n, int m, tsr_sample_cand *cand) {
    for (int i = 0; i < m; i++) cand[i] = (tsr_sample_cand){p[i], i};
    if (m < n) {
        for (int i = m / 2 - 1; i >= 0; i--) tsr__sift_down(cand, m, i);
        for (int i = m; i < n; i++)
            if (tsr__before(p[i], i, cand[0].p, cand[0].id)) {
                cand[0] = (tsr_sample_cand){p[i], i};
                tsr__sift_down(cand, m, 0);
            }
    }
    qsort(cand, (size_t)m, sizeof *cand, tsr__cand_desc);
}

/* Candidates sorted first: top-k needs k of them; top-p alone starts with this many and
 * grows eightfold until the kept mass is inside them. */
#define TSR__TOP_P_FIRST 1024

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
    /* Keep the top k, then the smallest prefix whose mass reaches top-p. Only that prefix
     * of the full order matters, so only it is sorted: the k first, or for top-p alone
     * a first m that grows until the prefix ends inside it (the same sums, in the same
     * order, as over the whole sorted vocabulary). */
    int m = k < n ? k : n < TSR__TOP_P_FIRST ? n : TSR__TOP_P_FIRST;
    float mass;
    int keep;
    for (;;) {
        tsr__top_m(logits, n, m, cand);
        mass = 0.0f;
        keep = 0;
        bool reached = false;
        for (; keep < m; keep++) {
            mass += cand[keep].p;
            if (mass >= p->top_p) {
                keep++;
                reached = true;
                break;
            }
        }
        if (reached || m == k || m == n) break;
        m = m > n / 8 ? n : 8 * m;
    }
    float target = r * mass, cdf = 0.0f;
    for (int i = 0; i < keep; i++) {
        cdf += cand[i].p;
        if (target < cdf) return cand[i].id;
    }
    return cand[keep - 1].id;
}
