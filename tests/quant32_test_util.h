/* The kernel checks shared by the quantized types whose blocks are 32 columns with Q8_0's
 * activations (test_quant_q5k, test_quant_q6k): the activations of n rows, a row computed
 * exactly in double from the type's dequantization, and the case qt_variant_vs_scalar runs
 * (tests/quant_test_util.h), keyed by the type's tsr__q8_gemv_fn. */
#ifndef TSR_TESTS_QUANT32_TEST_UTIL_H
#define TSR_TESTS_QUANT32_TEST_UTIL_H

#include "kernels/cpu/quant_q8_internal.h"
#include "tests/quant_test_util.h"

/* The Q8_0 activations of n rows: codes, a scale per 32 columns, and s: per 32 columns the
 * code sum, or what sums writes from the codes (Q6_K's pairs of 16-column sums). */
typedef struct qt_qact {
    int8_t *qs;
    float *d;
    int32_t *s;
} qt_qact;

typedef void (*qt_act_sums_fn)(const int8_t *xq, int64_t cols, int32_t *xs);
typedef void (*qt_dequant_row_fn)(const void *packed, int64_t cols, int64_t r, float *out);

static inline qt_qact qt_qact_make(const float *x, int64_t n, int64_t cols, qt_act_sums_fn sums) {
    size_t nb = (size_t)(n * cols / 32);
    qt_qact a = {tsr_malloc((size_t)(n * cols)), tsr_malloc(nb * 4), tsr_malloc(nb * 4)};
    for (int64_t i = 0; i < n; i++) {
        tsr__q8_quantize_act(x + i * cols, cols, a.qs + i * cols, a.d + i * cols / 32,
                             a.s + i * cols / 32, NULL);
        if (sums) sums(a.qs + i * cols, cols, a.s + i * cols / 32);
    }
    return a;
}

static inline void qt_qact_free(qt_qact *a) {
    tsr_free(a->qs);
    tsr_free(a->d);
    tsr_free(a->s);
}

/* A kernel case: the weights, the activations and the weights' row dequantization. */
typedef struct qt_case32 {
    const tsr_tensor *w;
    const qt_qact *a;
    qt_dequant_row_fn dequant_row;
} qt_case32;

/* qt_gemv over a qt_case32; kern points at the kernel table's gemv member. */
static inline void qt_case32_gemv(const void *kern, const void *ctx, int64_t g0, int64_t g1,
                                  int nx, const int32_t *bseg, int n_parts, bool sum, float *y,
                                  int64_t ldy, int64_t ldp) {
    const qt_case32 *c = ctx;
    (*(const tsr__q8_gemv_fn *)kern)(c->w->data, c->w->cols / 32, c->w->rows, g0, g1,
                                     c->a->qs, c->a->d, c->a->s, nx, bseg, n_parts, sum, y,
                                     ldy, ldp);
}

/* qt_exact: row r for token i in double, the dequantized weights times d_x * x_q. */
static inline double qt_case32_exact(const void *ctx, int i, int64_t r, double *mag) {
    const qt_case32 *c = ctx;
    int64_t cols = c->w->cols;
    float *deq = tsr_malloc((size_t)cols * 4);
    c->dequant_row(c->w->data, cols, r, deq);
    double e = 0;
    *mag = 0;
    for (int64_t k = 0; k < cols; k++) {
        double p = (double)deq[k] * c->a->d[(i * cols + k) / 32] * c->a->qs[i * cols + k];
        e += p;
        *mag += fabs(p);
    }
    tsr_free(deq);
    return e;
}

#endif
