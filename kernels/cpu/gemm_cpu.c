/* matmul y[n][rows] = x[n][cols] . W^T.
 *
 * Decode (n <= TSR__CPU_MATVEC_MAX_N) is memory-bound: the SIMD matvec kernels stream W
 * once per call for up to 4 input rows, and OpenMP splits W's rows into fixed blocks.
 * Prefill uses single-threaded OpenBLAS sgemm on fixed panels of W's rows, one OpenMP
 * thread per panel; BF16/F16 panels are widened to f32 into a per-thread scratch first, so
 * prefill runs at BLAS speed without an f32 copy of the whole matrix. */
#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/cpu_internal.h"

/* Up to this many input rows, streaming W once per 4 rows beats OpenBLAS sgemm, which is
 * slow for small M (measured on Zen 4: 3 matvec passes at n = 12 still win). */
#define TSR__CPU_MATVEC_MAX_N 12
/* Rows of W per OpenMP work item in the matvec (fixed, so splits are deterministic). */
#define TSR__CPU_ROW_BLOCK 32
/* Below this many weight elements, threads cost more than they save. */
#define TSR__CPU_PAR_MIN 32768
/* Rows of one converted f32 panel: about 1 MB, so it stays in L2 while sgemm reads it. */
#define TSR__CPU_PANEL_BYTES ((size_t)1 << 20)
/* Below this many multiply-adds a prefill matmul stays on one thread. */
#define TSR__CPU_GEMM_PAR_MIN ((int64_t)1 << 18)

static void tsr__matvec_rows(const tsr__cpu_kernels *k, const tsr_tensor *w, const float *x,
                             int nx, int64_t r0, int64_t r1, float *y) {
    switch (w->dtype) {
    case TSR_F32: k->matvec_f32(w->data, w->cols, r0, r1, x, nx, y, w->rows); break;
    case TSR_BF16: k->matvec_bf16(w->data, w->cols, r0, r1, x, nx, y, w->rows); break;
    case TSR_F16: k->matvec_f16(w->data, w->cols, r0, r1, x, nx, y, w->rows); break;
    }
}

static void tsr__matvec(const tsr__cpu_ctx *c, const float *x, int64_t n, const tsr_tensor *w,
                        float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    int64_t rows = w->rows, cols = w->cols;
    int64_t nblk = (rows + TSR__CPU_ROW_BLOCK - 1) / TSR__CPU_ROW_BLOCK;
    int par = c->threads > 1 && rows * cols >= TSR__CPU_PAR_MIN && nblk > 1;
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        int nx = n - i0 < 4 ? (int)(n - i0) : 4;
        const float *xi = x + (size_t)i0 * (size_t)cols;
        float *yi = y + (size_t)i0 * (size_t)rows;
        if (!par) { /* no OpenMP region: even a serialized one costs ~0.7 us and a futex */
            tsr__matvec_rows(k, w, xi, nx, 0, rows, yi);
            continue;
        }
#pragma omp parallel for num_threads(c->threads) schedule(static)
        for (int64_t b = 0; b < nblk; b++) {
            int64_t r0 = b * TSR__CPU_ROW_BLOCK;
            int64_t r1 = r0 + TSR__CPU_ROW_BLOCK < rows ? r0 + TSR__CPU_ROW_BLOCK : rows;
            tsr__matvec_rows(k, w, xi, nx, r0, r1, yi);
        }
    }
}

/* y[.][r0 .. r0+p) for panel b of p rows; BF16/F16 rows are widened into panel first. */
static void tsr__gemm_panel(const tsr__cpu_kernels *k, const float *x, int64_t n,
                            const tsr_tensor *w, int64_t p, int64_t b, float *panel, float *y) {
    int64_t rows = w->rows, cols = w->cols;
    int64_t r0 = b * p;
    int64_t pr = rows - r0 < p ? rows - r0 : p;
    const float *wp;
    if (w->dtype == TSR_F32) {
        wp = (const float *)w->data + (size_t)r0 * (size_t)cols;
    } else {
        const uint16_t *src = (const uint16_t *)w->data + (size_t)r0 * (size_t)cols;
        if (w->dtype == TSR_BF16)
            k->cvt_bf16(src, panel, pr * cols);
        else
            k->cvt_f16(src, panel, pr * cols);
        wp = panel;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)pr, (int)cols, 1.0f, x,
                (int)cols, wp, (int)cols, 0.0f, y + r0, (int)rows);
}

/* Prefill: W's rows are cut into fixed panels (their size depends on W's shape only) and
 * each panel is one single-threaded sgemm; OpenMP threads take panels dynamically, and for
 * BF16/F16 a thread first widens its panel into its own f32 scratch. Every output element
 * thus comes from the same BLAS call whatever the thread count (bitwise identical
 * results), the conversion runs in parallel, and OpenBLAS's own thread pool is never used:
 * with it (pthreads build) running between OpenMP regions whose workers spin on the same
 * cores, 2-thread f32 prefill was slower than 1 thread, and 768x768 panels ran at 20-40
 * instead of 150-180 GFLOP/s (measured on the 2-vCPU dev VM). */
static tsr_status tsr__gemm_panels(tsr__cpu_ctx *c, const float *x, int64_t n,
                                   const tsr_tensor *w, float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    int64_t rows = w->rows, cols = w->cols;
    /* 128 rows (64 for small W, so 2+ threads get balanced shares) and at most ~1 MB of
     * f32: 1-thread speed equals one whole-matrix sgemm within noise at N = 288..2048. */
    int64_t p = (int64_t)(TSR__CPU_PANEL_BYTES / 4) / cols;
    int64_t pmax = rows >= 512 ? 128 : 64;
    p = p < 16 ? 16 : p > pmax ? pmax : p;
    p = p > rows ? rows : p;
    int64_t npan = (rows + p - 1) / p;
    int nt = c->threads < npan ? c->threads : (int)npan;
    if ((double)n * (double)rows * (double)cols < (double)TSR__CPU_GEMM_PAR_MIN) nt = 1;
    size_t per = (size_t)p * (size_t)cols;
    float *scratch = NULL;
    if (w->dtype != TSR_F32) {
        TSR_TRY(tsr__cpu_scratch(&c->panel, &c->panel_cap, per * (size_t)nt));
        scratch = c->panel;
    }
    if (nt == 1) {
        for (int64_t b = 0; b < npan; b++) tsr__gemm_panel(k, x, n, w, p, b, scratch, y);
        return TSR_OK;
    }
#pragma omp parallel num_threads(nt)
    {
        float *panel = scratch ? scratch + per * (size_t)omp_get_thread_num() : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < npan; b++) tsr__gemm_panel(k, x, n, w, p, b, panel, y);
    }
    return TSR_OK;
}

tsr_status tsr__cpu_matmul(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                           float *y) {
    tsr__cpu_ctx *c = be->ctx;
    if (n < 0 || !w || w->rows <= 0 || w->cols <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "cpu matmul: bad shape (n=%lld)", (long long)n);
    if (w->dtype != TSR_F32 && w->dtype != TSR_BF16 && w->dtype != TSR_F16)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu matmul: weight dtype %d",
                             (int)w->dtype);
    if (w->rows > INT32_MAX || w->cols > INT32_MAX || n > INT32_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu matmul: %lldx%lld too large for BLAS",
                             (long long)w->rows, (long long)w->cols);
    if (n == 0) return TSR_OK;
    if (n <= TSR__CPU_MATVEC_MAX_N) {
        tsr__matvec(c, x, n, w, y);
        return TSR_OK;
    }
    return tsr__gemm_panels(c, x, n, w, y);
}
