/* FP8 and Q8_0 weights on the CUDA backend (kernels/cuda/quant_gemm.h) against host
 * references: matmul at batch 1..8 (the GEMVs) and 37 (cuBLASLt FP8 or the bf16 tiles),
 * odd row counts, column counts that do and do not allow 16-byte loads, matmul_parts in all
 * three modes, and the Q8_0 embedding. Each path has its reference with its own input
 * rounding (f32 x for the GEMVs; x quantized per token to E4M3 for cuBLASLt; x and Q8_0
 * weights rounded to bf16 for the tiles) and a bound relative to sum |w x|: 1e-5 for f32
 * accumulation, 2e-3 for FP8 tensor cores (Hopper accumulates FP8 products in fewer bits).
 * With TSR_BENCH=1 it times the batch-1 GEMVs on Llama-3.1-8B's 14336 x 4096 matrix against
 * BF16 (tests/device/run.sh, section quant). Without a CUDA device: nothing to check, exit 0
 * after saying so. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/kv_dtype.h"
#include "runtime/model/fp8.h"
#include "tests/test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static float bf16r(float f) { return tsr_bf16_to_f32(tsr_f32_to_bf16(f)); }

/* A quantized [rows, cols] matrix: host tensor, its dequantized rows, the placed copy. */
typedef struct qmat {
    tsr_tensor host, dev;
    float *deq; /* rows * cols */
    bool copied;
} qmat;

static void qmat_make(tsr_backend *be, tsr_dtype dt, int64_t rows, int64_t cols, qmat *m) {
    memset(m, 0, sizeof *m);
    float *f = tsr_malloc((size_t)(rows * cols) * sizeof *f);
    for (int64_t i = 0; i < rows * cols; i++) f[i] = urand() * (1.0f + (float)(i % 7));
    tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = cols, .data = f};
    m->host = (tsr_tensor){.dtype = dt, .rows = rows, .cols = cols};
    void *buf = tsr_malloc(tsr_tensor_bytes(&m->host));
    if (dt == TSR_F8_E4M3)
        (void)tsr_fp8_quantize_tensor(&src, buf);
    else
        (void)tsr_q8_quantize_tensor(&src, buf);
    m->host.data = buf;
    m->deq = f; /* reused: the dequantized values replace the source */
    for (int64_t r = 0; r < rows; r++) {
        if (dt == TSR_F8_E4M3)
            tsr_fp8_dequant_row(&m->host, r, f + r * cols);
        else
            tsr_q8_dequant_row(buf, cols, r, f + r * cols);
    }
    if (tsr_backend_place_tensor(be, &m->host, &m->dev, &m->copied) != TSR_OK)
        TSR_FAIL_("placing a %s matrix: %s", tsr_dtype_name(dt), tsr_last_error());
}

static void qmat_free(tsr_backend *be, qmat *m) {
    if (m->copied) be->ops->buffer_free(be, (void *)m->dev.data);
    tsr_free((void *)m->host.data);
    tsr_free(m->deq);
}

static void *dev_copy(tsr_backend *be, const void *src, size_t bytes) {
    void *p = NULL;
    if (be->ops->buffer_alloc(be, bytes, &p) != TSR_OK) return NULL;
    if (src && tsr_backend_upload(be, p, src, bytes) != TSR_OK) return NULL;
    return p;
}

/* The inputs a path computes with: 0 f32, 1 E4M3 per token, 2 bf16 (weights too for
 * Q8_0). ref[i][r] over columns [k0, k1), and sum |w x| in mag. */
static void reference(const qmat *m, const float *x, int64_t n, int64_t k0, int64_t k1,
                      int mode, double *ref, double *mag) {
    int64_t cols = m->host.cols, rows = m->host.rows;
    float *xr = tsr_malloc((size_t)cols * sizeof *xr);
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        float amax = 0.0f;
        for (int64_t j = k0; j < k1; j++) amax = fmaxf(amax, fabsf(xi[j]));
        float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (int64_t j = k0; j < k1; j++)
            xr[j] = mode == 0 ? xi[j] : mode == 1 ? tsr_e4m3_to_f32(tsr_f32_to_e4m3(xi[j] / s)) * s
                                                  : bf16r(xi[j]);
        for (int64_t r = 0; r < rows; r++) {
            const float *w = m->deq + r * cols;
            double a = 0.0, g = 0.0;
            for (int64_t j = k0; j < k1; j++) {
                double wv = mode == 2 && m->host.dtype == TSR_Q8_0 ? bf16r(w[j]) : w[j];
                a += wv * xr[j];
                g += fabs(wv * xr[j]);
            }
            ref[i * rows + r] = a;
            mag[i * rows + r] = g;
        }
    }
    tsr_free(xr);
}

/* Worst |y - ref| / (sum |w x| + 1e-6) over n x rows. */
static double worst(const float *y, const double *ref, const double *mag, int64_t cnt) {
    double w = 0.0;
    for (int64_t i = 0; i < cnt; i++) {
        double e = fabs((double)y[i] - ref[i]) / (mag[i] + 1e-6);
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

/* matmul of one shape and batch: the GEMV (n <= 8) against f32 inputs; n > 8 against the
 * reference of the path the backend took (the one that matches; both printed). */
static void check_matmul(tsr_backend *be, const char *label, tsr_dtype dt, int64_t rows,
                         int64_t cols, int64_t n) {
    qmat m;
    qmat_make(be, dt, rows, cols, &m);
    if (tsr_test_failed_flag) return;
    float *x = tsr_malloc((size_t)(n * cols) * sizeof *x);
    for (int64_t i = 0; i < n * cols; i++) x[i] = urand();
    float *y = tsr_malloc((size_t)(n * rows) * sizeof *y);
    double *ref = tsr_malloc((size_t)(n * rows) * sizeof *ref);
    double *mag = tsr_malloc((size_t)(n * rows) * sizeof *mag);
    float *dx = dev_copy(be, x, (size_t)(n * cols) * sizeof *x);
    float *dy = dev_copy(be, NULL, (size_t)(n * rows) * sizeof *y);
    ASSERT_TRUE(dx && dy);
    ASSERT_OK(be->ops->matmul(be, dx, n, &m.dev, dy));
    ASSERT_OK(be->ops->synchronize(be));
    ASSERT_OK(tsr_backend_download(be, y, dy, (size_t)(n * rows) * sizeof *y));
    const char *path;
    double e, tol;
    if (n <= 8) {
        reference(&m, x, n, 0, cols, 0, ref, mag);
        e = worst(y, ref, mag, n * rows);
        tol = 1e-5;
        path = "gemv";
    } else {
        double e_lt = INFINITY;
        if (dt == TSR_F8_E4M3) {
            reference(&m, x, n, 0, cols, 1, ref, mag);
            e_lt = worst(y, ref, mag, n * rows);
        }
        reference(&m, x, n, 0, cols, 2, ref, mag);
        double e_tile = worst(y, ref, mag, n * rows);
        bool lt = e_lt <= 2e-3 && !(e_tile <= 1e-5);
        path = lt ? "cublasLt fp8" : "bf16 tiles";
        e = lt ? e_lt : e_tile;
        tol = lt ? 2e-3 : 1e-5;
    }
    printf("  %s %s %lldx%lld n=%lld: %s, worst %.3g of sum|wx| (tol %g)\n", label,
           tsr_dtype_name(dt), (long long)rows, (long long)cols, (long long)n, path, e, tol);
    if (!(e <= tol)) TSR_FAIL_("%s %s %lldx%lld n=%lld off", label, tsr_dtype_name(dt),
                               (long long)rows, (long long)cols, (long long)n);
    be->ops->buffer_free(be, dx);
    be->ops->buffer_free(be, dy);
    tsr_free(x);
    tsr_free(y);
    tsr_free(ref);
    tsr_free(mag);
    qmat_free(be, &m);
}

static tsr_backend *cuda_or_skip(void) {
    tsr_backend *be = NULL;
    if (tsr_backend_create("cuda", 1, &be) != TSR_OK) {
        printf("test_cuda_quant: no CUDA backend (%s): nothing to check\n", tsr_last_error());
        tsr_error_clear();
        return NULL;
    }
    printf("test_cuda_quant: backend cuda on %s\n",
           be->ops->device_name ? be->ops->device_name(be) : "?");
    return be;
}

static const int64_t batches[] = {1, 2, 3, 5, 8, 37};

TSR_TEST(test_matmul) {
    tsr_backend *be = cuda_or_skip();
    if (!be) return;
    /* FP8: 1000 columns take the one-code path, 4096 and 2064 the 16-byte one */
    static const int64_t f8[][2] = {{1001, 1000}, {1003, 4096}, {257, 2064}};
    static const int64_t q8[][2] = {{999, 1184}, {1001, 4096}};
    for (size_t b = 0; b < sizeof batches / sizeof batches[0] && !tsr_test_failed_flag; b++) {
        for (size_t s = 0; s < sizeof f8 / sizeof f8[0] && !tsr_test_failed_flag; s++)
            check_matmul(be, "cuda", TSR_F8_E4M3, f8[s][0], f8[s][1], batches[b]);
        for (size_t s = 0; s < sizeof q8 / sizeof q8[0] && !tsr_test_failed_flag; s++)
            check_matmul(be, "cuda", TSR_Q8_0, q8[s][0], q8[s][1], batches[b]);
    }
    tsr_backend_destroy(be);
    /* the fallback of archs without FP8 tensor cores, forced */
    setenv("TSR_CUDA_FP8_GEMM", "0", 1);
    be = cuda_or_skip();
    unsetenv("TSR_CUDA_FP8_GEMM");
    if (!be) return;
    check_matmul(be, "cuda FP8_GEMM=0", TSR_F8_E4M3, 1003, 4096, 37);
    tsr_backend_destroy(be);
}

/* matmul_parts: not summed, summed, accumulated, over uneven segments on 32 columns. */
TSR_TEST(test_parts) {
    tsr_backend *be = cuda_or_skip();
    if (!be) return;
    static const tsr_dtype dts[] = {TSR_F8_E4M3, TSR_Q8_0};
    const int32_t seg[4] = {0, 256, 320, 1024};
    int64_t rows = 301, cols = 1024;
    for (size_t d = 0; d < 2 && !tsr_test_failed_flag; d++) {
        for (int nb = 0; nb < 2 && !tsr_test_failed_flag; nb++) {
            int64_t n = nb ? 37 : 3;
            qmat m;
            qmat_make(be, dts[d], rows, cols, &m);
            float *x = tsr_malloc((size_t)(n * cols) * sizeof *x);
            for (int64_t i = 0; i < n * cols; i++) x[i] = urand();
            size_t pm = (size_t)(n * rows);
            float *y = tsr_malloc(3 * pm * sizeof *y), *y0 = tsr_malloc(pm * sizeof *y0);
            for (size_t i = 0; i < pm; i++) y0[i] = urand();
            double *ref = tsr_malloc(pm * sizeof *ref), *mag = tsr_malloc(pm * sizeof *mag);
            double *tot = tsr_malloc(pm * sizeof *tot), *tmag = tsr_malloc(pm * sizeof *tmag);
            float *dx = dev_copy(be, x, (size_t)(n * cols) * sizeof *x);
            float *dy = dev_copy(be, NULL, 3 * pm * sizeof *y);
            ASSERT_TRUE(dx && dy);
            double tol = n <= 8 ? 1e-5 : 2e-3;
            for (int kind = 0; kind < 3 && !tsr_test_failed_flag; kind++) {
                if (kind == 2) ASSERT_OK(tsr_backend_upload(be, dy, y0, pm * sizeof *y0));
                if (kind < 2)
                    ASSERT_OK(be->ops->matmul_parts(be, dx, n, &m.dev, seg, 3, kind == 1, dy));
                else
                    ASSERT_OK(be->ops->matmul_parts_acc(be, dx, n, &m.dev, seg, 3, dy));
                ASSERT_OK(be->ops->synchronize(be));
                ASSERT_OK(tsr_backend_download(be, y, dy, (kind ? 1 : 3) * pm * sizeof *y));
                /* n > 8: the reference of whichever path was taken (FP8 or bf16 inputs) */
                double e = INFINITY;
                for (int mode = n <= 8 ? 0 : 1; mode <= (n <= 8 ? 0 : 2); mode++) {
                    if (mode == 1 && dts[d] != TSR_F8_E4M3) continue;
                    double em = 0.0;
                    for (size_t i = 0; i < pm; i++) tot[i] = tmag[i] = 0.0;
                    for (int p = 0; p < 3; p++) {
                        reference(&m, x, n, seg[p], seg[p + 1], mode, ref, mag);
                        if (kind == 0) {
                            double ep = worst(y + p * pm, ref, mag, (int64_t)pm);
                            if (!(ep <= em)) em = ep;
                        }
                        for (size_t i = 0; i < pm; i++) {
                            tot[i] += ref[i];
                            tmag[i] += mag[i];
                        }
                    }
                    if (kind == 2)
                        for (size_t i = 0; i < pm; i++) {
                            tot[i] += y0[i];
                            tmag[i] += fabs(y0[i]);
                        }
                    if (kind > 0) em = worst(y, tot, tmag, (int64_t)pm);
                    if (em < e) e = em;
                }
                printf("  cuda %s parts %s n=%lld: worst %.3g of sum|wx| (tol %g)\n",
                       tsr_dtype_name(dts[d]), kind == 0 ? "apart" : kind == 1 ? "sum" : "acc",
                       (long long)n, e, tol);
                if (!(e <= tol)) TSR_FAIL_("parts off");
            }
            be->ops->buffer_free(be, dx);
            be->ops->buffer_free(be, dy);
            tsr_free(x);
            tsr_free(y);
            tsr_free(y0);
            tsr_free(ref);
            tsr_free(mag);
            tsr_free(tot);
            tsr_free(tmag);
            qmat_free(be, &m);
        }
    }
    tsr_backend_destroy(be);
}

/* Q8_0 embedding rows equal the host's dequantization bit for bit (q * d is exact). */
TSR_TEST(test_embed) {
    tsr_backend *be = cuda_or_skip();
    if (!be) return;
    qmat m;
    qmat_make(be, TSR_Q8_0, 333, 224, &m);
    int32_t ids[5] = {0, 332, 17, 17, 200};
    float *dout = dev_copy(be, NULL, 5 * 224 * sizeof(float));
    float out[5 * 224];
    ASSERT_TRUE(dout != NULL);
    ASSERT_OK(be->ops->embed(be, &m.dev, ids, 5, dout));
    ASSERT_OK(be->ops->synchronize(be));
    ASSERT_OK(tsr_backend_download(be, out, dout, sizeof out));
    for (int i = 0; i < 5; i++)
        ASSERT_TRUE(memcmp(out + i * 224, m.deq + (int64_t)ids[i] * 224, 224 * sizeof(float)) == 0);
    printf("  cuda q8_0 embed: 5 rows exact\n");
    be->ops->buffer_free(be, dout);
    qmat_free(be, &m);
    tsr_backend_destroy(be);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* TSR_BENCH=1: batch-1 GEMV on the 8B model's w_up shape (14336 x 4096), weight GB/s. */
TSR_TEST(test_bench) {
    if (!getenv("TSR_BENCH")) return;
    tsr_backend *be = cuda_or_skip();
    if (!be) return;
    int64_t rows = 14336, cols = 4096;
    static const tsr_dtype dts[] = {TSR_BF16, TSR_F8_E4M3, TSR_Q8_0};
    float *x = tsr_malloc((size_t)cols * 8 * sizeof *x);
    for (int64_t i = 0; i < cols * 8; i++) x[i] = urand();
    float *dx = dev_copy(be, x, (size_t)cols * 8 * sizeof *x);
    float *dy = dev_copy(be, NULL, (size_t)rows * 8 * sizeof(float));
    double t_bf16 = 0.0;
    for (size_t d = 0; d < 3; d++) {
        tsr_tensor host = {.dtype = dts[d], .rows = rows, .cols = cols};
        tsr_tensor dev;
        bool copied = false;
        void *buf = tsr_calloc(1, tsr_tensor_bytes(&host));
        if (dts[d] == TSR_BF16) {
            uint16_t *h = buf;
            for (int64_t i = 0; i < rows * cols; i++) h[i] = tsr_f32_to_bf16(urand());
        } else if (dts[d] == TSR_F8_E4M3) {
            uint8_t *c = buf;
            for (int64_t i = 0; i < rows * cols; i++) /* finite codes (0x7f is NaN) */
                c[i] = (uint8_t)((uint32_t)((urand() + 1.0f) * 127.0f) & 0x77u);
            float *s = (float *)((char *)buf + tsr_fp8_scale_offset(rows, cols));
            for (int64_t r = 0; r < rows; r++) s[r] = 1e-3f;
        } else {
            tsr_q8_pack_init(buf, rows, cols); /* zero weights: the bytes are what is timed */
        }
        host.data = buf;
        ASSERT_OK(tsr_backend_place_tensor(be, &host, &dev, &copied));
        size_t bytes = dts[d] == TSR_Q8_0 ? (size_t)(rows * (cols / 32) * 34)
                                          : tsr_tensor_bytes(&host);
        for (int n = 1; n <= 8; n *= 8) {
            double best = INFINITY;
            for (int r = 0; r < 21; r++) {
                double t0 = now_s();
                ASSERT_OK(be->ops->matmul(be, dx, n, &dev, dy));
                ASSERT_OK(be->ops->synchronize(be));
                if (r > 0 && now_s() - t0 < best) best = now_s() - t0;
            }
            if (dts[d] == TSR_BF16 && n == 1) t_bf16 = best;
            printf("quant_gemv dtype=%s rows=%lld cols=%lld n=%d us=%.1f weight_gbs=%.1f "
                   "vs_bf16=%.2f\n", tsr_dtype_name(dts[d]), (long long)rows, (long long)cols, n,
                   best * 1e6, (double)bytes / best / 1e9, n == 1 && t_bf16 > 0 ? t_bf16 / best : 0.0);
        }
        be->ops->buffer_free(be, (void *)dev.data);
        tsr_free(buf);
    }
    be->ops->buffer_free(be, dx);
    be->ops->buffer_free(be, dy);
    tsr_free(x);
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_matmul, test_parts, test_embed, test_bench)
