/* The BF16 prefill on AMX tiles (kernels/cpu/gemm_amx.c) against a double-precision product
 * of the same BF16 weights and the f32 activations: within 2e-5 of sum |w x| per output,
 * which x rounded to bf16 alone (no lo part) misses by two orders of magnitude; infinities
 * and NaN as f32 gives them; odd row counts (a padded last row block, one of 16 rows, an
 * odd one after pairs), token counts from 1 to 3 groups plus a remainder, a column slice,
 * and sums onto y. Through the backend's matmul too (n > 32 takes this path). Skipped on a
 * CPU without AMX-BF16 (test_matmul_parts checks the slicing bits on every CPU). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "tests/test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static bool amx_here(void) {
    if (tsr__cpu_amx() & TSR__AMX_BF16) return true;
    fprintf(stderr, "  bf16 amx: not on this CPU (or not allowed)\n");
    return false;
}

/* Whether y[i][r] (ldy apart) is within 2e-5 * sum |w x| of the double product over columns
 * [c0, c0 + len) of w (ldw apart), plus base[i][r] when base. */
static bool close_to_ref(const uint16_t *w, int64_t ldw, int64_t rows, const float *x,
                         int64_t ldx, int64_t n, int64_t c0, int64_t len, const float *base,
                         const float *y, int64_t ldy, double *worst) {
    *worst = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (int64_t k = c0; k < c0 + len; k++) {
                double p = (double)tsr_bf16_to_f32(w[r * ldw + k]) * x[i * ldx + k];
                s += p;
                a += fabs(p);
            }
            if (base) {
                s += base[i * ldy + r];
                a += fabs(base[i * ldy + r]);
            }
            double e = fabs(y[i * ldy + r] - s) / (a + 1e-30);
            if (e > *worst) *worst = e;
            if (!(e <= 2e-5)) return false;
        }
    return true;
}

static uint16_t *make_w(int64_t rows, int64_t cols) {
    uint16_t *w = tsr_malloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) w[i] = tsr_f32_to_bf16(frand());
    return w;
}

static float *make_x(int64_t n, int64_t cols) {
    float *x = tsr_malloc((size_t)(n * cols) * 4);
    /* magnitudes over several binades, so lo carries bits of every size */
    for (int64_t i = 0; i < n * cols; i++) x[i] = frand() * ldexpf(1.0f, (int)(i % 7) - 3);
    return x;
}

/* pack + rows directly: every token count 1..3 groups and a remainder, row ranges with
 * padded tails, a column slice (steps [sx, sx + ns) of the packed x) and add. */
TSR_TEST(test_amx_rows_match_double) {
    if (!amx_here()) return;
    static const int64_t ns_list[] = {1, 2, 5, 48};
    static const int64_t rows_list[] = {1, 16, 17, 37, 70};
    static const int64_t n_list[] = {1, 5, 16, 17, 33, 48};
    for (int ci = 0; ci < 4; ci++)
        for (int ri = 0; ri < 5; ri++)
            for (int ni = 0; ni < 6; ni++) {
                int64_t nsx = ns_list[ci], cols = nsx * 32, rows = rows_list[ri], n = n_list[ni];
                uint16_t *w = make_w(rows, cols);
                float *x = make_x(n, cols);
                uint16_t *xp = tsr_malloc(tsr__gemm_amx_xp_elems(n, nsx) * 2);
                uint16_t *tail = tsr_malloc((size_t)(16 * cols) * 2);
                float *y = tsr_malloc((size_t)(n * rows) * 4);
                float *base = tsr_malloc((size_t)(n * rows) * 4);
                for (int64_t g = 0; g < (n + 15) / 16; g++)
                    tsr__gemm_amx_pack(x, cols, n, nsx, g, xp);
                /* whole product, rows in two ranges (the second from an odd row) */
                int64_t mid = rows > 5 ? 5 : rows;
                tsr__gemm_amx_rows(w, cols, 0, mid, xp, nsx, 0, nsx, n, tail, false, y, rows);
                tsr__gemm_amx_rows(w, cols, mid, rows, xp, nsx, 0, nsx, n, tail, false, y, rows);
                double worst;
                if (!close_to_ref(w, cols, rows, x, cols, n, 0, cols, NULL, y, rows, &worst))
                    TSR_FAIL_("%lldx%lld n %lld: relative error %.3g", (long long)rows,
                              (long long)cols, (long long)n, worst);
                /* the last steps only, added onto y */
                if (nsx > 1) {
                    memcpy(base, y, (size_t)(n * rows) * 4);
                    int64_t sx = nsx / 2;
                    tsr__gemm_amx_rows(w + sx * 32, cols, 0, rows, xp, nsx, sx, nsx - sx, n,
                                       tail, true, y, rows);
                    if (!close_to_ref(w, cols, rows, x, cols, n, sx * 32, cols - sx * 32, base,
                                      y, rows, &worst))
                        TSR_FAIL_("%lldx%lld n %lld, steps from %lld added: relative error "
                                  "%.3g", (long long)rows, (long long)cols, (long long)n,
                                  (long long)sx, worst);
                }
                tsr_free(w);
                tsr_free(x);
                tsr_free(xp);
                tsr_free(tail);
                tsr_free(y);
                tsr_free(base);
            }
}

/* Infinities and NaN in x give what the f32 product gives: +-inf and NaN, never a NaN from
 * inf - inf inside the split. */
TSR_TEST(test_amx_nonfinite_inputs) {
    if (!amx_here()) return;
    int64_t cols = 64, rows = 16, n = 3;
    uint16_t *w = tsr_malloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) w[i] = tsr_f32_to_bf16(0.5f);
    float x[3 * 64];
    for (int i = 0; i < 3 * 64; i++) x[i] = 1.0f;
    x[7] = INFINITY;         /* token 0: +inf */
    x[64 + 40] = -INFINITY;  /* token 1: -inf */
    x[128 + 3] = NAN;        /* token 2: NaN */
    uint16_t *xp = tsr_malloc(tsr__gemm_amx_xp_elems(n, 2) * 2);
    uint16_t tail[16 * 64];
    float y[3 * 16];
    tsr__gemm_amx_pack(x, cols, n, 2, 0, xp);
    tsr__gemm_amx_rows(w, cols, 0, rows, xp, 2, 0, 2, n, tail, false, y, rows);
    for (int r = 0; r < rows; r++) {
        ASSERT_TRUE(isinf(y[r]) && y[r] > 0);
        ASSERT_TRUE(isinf(y[16 + r]) && y[16 + r] < 0);
        ASSERT_TRUE(isnan(y[32 + r]));
    }
    tsr_free(w);
    tsr_free(xp);
}

/* The backend's matmul and matmul_parts with BF16 W and more than 32 inputs: the AMX path,
 * 1 and 2 threads with the same bits, close to the double product; the cpu-fenced device (W,
 * x and y in its memory, which host code cannot touch) gives cpu's bits. */
TSR_TEST(test_amx_backend_matmul) {
    if (!amx_here()) return;
    int64_t rows = 83, cols = 192, n = 70;
    uint16_t *w = make_w(rows, cols);
    float *x = make_x(n, cols);
    tsr_tensor t = {.dtype = TSR_BF16, .rows = rows, .cols = cols, .data = w};
    float *y[2], *yp = tsr_malloc((size_t)(n * rows) * 4);
    for (int th = 0; th < 2; th++) {
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(th + 1, &be));
        y[th] = tsr_malloc((size_t)(n * rows) * 4);
        ASSERT_OK(be->ops->matmul(be, x, n, &t, y[th]));
        if (th == 1) { /* two parts summed: the same product to rounding */
            int32_t seg[3] = {0, 96, 192};
            ASSERT_OK(be->ops->matmul_parts(be, x, n, &t, seg, 2, true, yp));
        }
        tsr_backend_destroy(be);
    }
    tsr_backend *fen;
    if (tsr_backend_fenced_create(2, 16u << 20, &fen) == TSR_OK) {
        tsr_tensor dw;
        bool copied = false;
        float *dx, *dy, *yf = tsr_malloc((size_t)(n * rows) * 4);
        ASSERT_OK(tsr_backend_place_tensor(fen, &t, &dw, &copied));
        ASSERT_OK(fen->ops->buffer_alloc(fen, (size_t)(n * cols) * 4, (void **)&dx));
        ASSERT_OK(fen->ops->buffer_alloc(fen, (size_t)(n * rows) * 4, (void **)&dy));
        ASSERT_OK(tsr_backend_upload(fen, dx, x, (size_t)(n * cols) * 4));
        ASSERT_OK(fen->ops->matmul(fen, dx, n, &dw, dy));
        ASSERT_OK(tsr_backend_download(fen, yf, dy, (size_t)(n * rows) * 4));
        ASSERT_TRUE(!memcmp(yf, y[0], (size_t)(n * rows) * 4));
        int32_t seg[3] = {0, 96, 192};
        ASSERT_OK(fen->ops->matmul_parts(fen, dx, n, &dw, seg, 2, true, dy));
        ASSERT_OK(tsr_backend_download(fen, yf, dy, (size_t)(n * rows) * 4));
        ASSERT_TRUE(!memcmp(yf, yp, (size_t)(n * rows) * 4));
        fen->ops->buffer_free(fen, dx);
        fen->ops->buffer_free(fen, dy);
        if (copied) fen->ops->buffer_free(fen, (void *)dw.data);
        tsr_backend_destroy(fen);
        tsr_free(yf);
    } else {
        fprintf(stderr, "  cpu-fenced: %s\n", tsr_last_error());
    }
    double worst;
    ASSERT_TRUE(!memcmp(y[0], y[1], (size_t)(n * rows) * 4));
    ASSERT_TRUE(close_to_ref(w, cols, rows, x, cols, n, 0, cols, NULL, y[0], rows, &worst));
    ASSERT_TRUE(close_to_ref(w, cols, rows, x, cols, n, 0, cols, NULL, yp, rows, &worst));
    tsr_free(w);
    tsr_free(x);
    tsr_free(y[0]);
    tsr_free(y[1]);
    tsr_free(yp);
}

TSR_TEST_MAIN(test_amx_rows_match_double, test_amx_nonfinite_inputs, test_amx_backend_matmul)
