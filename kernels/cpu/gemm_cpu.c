/* matmul y[n][rows] = x[n][cols] . W^T.
 *
 * Decode (n <= TSR__CPU_MATVEC_MAX_N) is memory-bound: the SIMD matvec kernels stream W
 * once per call for up to 4 input rows, and OpenMP splits W's rows into fixed blocks.
 * Prefill uses OpenBLAS sgemm; BF16/F16 weights are widened to f32 one panel of rows at a
 * time into a context scratch buffer, so prefill runs at BLAS speed without an f32 copy
 * of the whole matrix. */
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
#pragma omp parallel for num_threads(c->threads) schedule(static) if (par)
        for (int64_t b = 0; b < nblk; b++) {
            int64_t r0 = b * TSR__CPU_ROW_BLOCK;
            int64_t r1 = r0 + TSR__CPU_ROW_BLOCK < rows ? r0 + TSR__CPU_ROW_BLOCK : rows;
            tsr__matvec_rows(k, w, xi, nx, r0, r1, yi);
        }
    }
}

/* Each OpenMP thread widens its own panels (static schedule) and multiplies them with a
 * single-threaded sgemm: conversion runs in parallel, no tiny multi-threaded BLAS calls, and
 * every output element comes from the same single-threaded call whatever the thread count. */
static tsr_status tsr__gemm_panels(tsr__cpu_ctx *c, const float *x, int64_t n,
                                   const tsr_tensor *w, float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    int64_t rows = w->rows, cols = w->cols;
    int64_t p = (int64_t)(TSR__CPU_PANEL_BYTES / 4) / cols;
    p = p < 64 ? 64 : p > 256 ? 256 : p;
    p = p > rows ? rows : p;
    int64_t npan = (rows + p - 1) / p;
    int nt = c->threads < npan ? c->threads : (int)npan;
    size_t per = (size_t)p * (size_t)cols;
    TSR_TRY(tsr__cpu_scratch(&c->panel, &c->panel_cap, per * (size_t)nt));
    const uint16_t *wd = w->data;
    if (nt > 1) openblas_set_num_threads(1);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *panel = c->panel + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t b = 0; b < npan; b++) {
            int64_t r0 = b * p;
            int64_t pr = rows - r0 < p ? rows - r0 : p;
            const uint16_t *src = wd + (size_t)r0 * (size_t)cols;
            if (w->dtype == TSR_BF16)
                k->cvt_bf16(src, panel, pr * cols);
            else
                k->cvt_f16(src, panel, pr * cols);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)pr, (int)cols,
                        1.0f, x, (int)cols, panel, (int)cols, 0.0f, y + r0, (int)rows);
        }
    }
    if (nt > 1) openblas_set_num_threads(c->threads);
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
    if (w->dtype == TSR_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)w->rows,
                    (int)w->cols, 1.0f, x, (int)w->cols, w->data, (int)w->cols, 0.0f, y,
                    (int)w->rows);
        return TSR_OK;
    }
    return tsr__gemm_panels(c, x, n, w, y);
}
