/* tsr_q8gemm: the Q8_0 product alone (the CPU backend's matmul on one random Q8_0 matrix,
 * or Q4_0/Q4_1 with --q4 0/1: the same activations and driver, the 4-bit kernels; or BF16
 * with --bf16 1: the matvec, AMX tile or sgemm path by N), for the kernel's register
 * blocking and thread split without the rest of a decode step.
 *
 * Y[N][R] = X[N][C] . W[R][C]^T with W quantized to Q8_0 at start; N inputs (1: decode, 64:
 * a batched decode step). One warm-up call, then R timed runs of >= 50 ms each. Reports the
 * median wall GMAC/s and, because this machine's wall time moves with other load, the
 * GMAC/s per second of process CPU time (user + system of all threads, spin waits
 * included). Prints one JSON line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/tensor.h"
#include "bench/bench_args.h"
#include "bench/bench_time.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_q4.h"
#include "kernels/cpu/quant_q8.h"

static void tsr__usage(FILE *f) {
    fprintf(f, "usage: tsr_q8gemm --rows R --cols C [--n N] [--threads T] [--repeat K] [--q4 0|1]\n"
               "                  [--bf16 1]\n"
               "Q8_0 matmul of N (default 64) inputs on a random R x C matrix (C %% 32 == 0)\n"
               "with T (default 1) threads; K (default 5) timed runs of >= 50 ms; --q4 0 or 1\n"
               "quantizes the matrix to Q4_0 or Q4_1 instead, --bf16 1 rounds it to BF16.\n"
               "Output: one JSON line with gmac_s (median wall) and gmac_cpu_s (per CPU\n"
               "second).\n");
}

/* Fills W (wf, rows x cols) and the n inputs x with pseudo-random values, quantizes W into
 * wq and creates the CPU backend (*be; the caller destroys it, also on failure). */
static tsr_status tsr__setup(float *wf, int rows, int cols, float *x, int n, tsr_dtype t,
                             void *wq, int threads, tsr_backend **be) {
    uint32_t s = 12345;
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) wf[i] = tsr_bench_rand(&s);
    for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) x[i] = tsr_bench_rand(&s);
    tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = cols, .data = wf};
    if (t == TSR_BF16)
        for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
            ((uint16_t *)wq)[i] = tsr_f32_to_bf16(wf[i]);
    else
        TSR_TRY(t == TSR_Q8_0 ? tsr_q8_quantize_tensor(&src, wq)
                              : tsr_q4_quantize_tensor(&src, t, wq));
    return tsr_backend_cpu_create(threads, be);
}

/* One warm-up product, then `repeat` timed runs of >= 50 ms each: GMAC/s per wall second in
 * wall[] and per second of process CPU time in cpu[]. */
static tsr_status tsr__time(tsr_backend *be, const float *x, int n, const tsr_tensor *w,
                            float *y, int repeat, double *wall, double *cpu) {
    double t0 = tsr_bench_time_wall();
    TSR_TRY(be->ops->matmul(be, x, n, w, y));
    double one = tsr_bench_time_wall() - t0;
    int iters = one > 0 ? (int)(0.05 / one) + 1 : 1000;
    double macs = (double)n * w->rows * w->cols;
    for (int r = 0; r < repeat; r++) {
        double w0 = tsr_bench_time_wall(), c0 = tsr_bench_time_cpu();
        for (int it = 0; it < iters; it++) TSR_TRY(be->ops->matmul(be, x, n, w, y));
        wall[r] = macs * iters / (tsr_bench_time_wall() - w0) * 1e-9;
        cpu[r] = macs * iters / (tsr_bench_time_cpu() - c0) * 1e-9;
    }
    return TSR_OK;
}

int main(int argc, char **argv) {
    int rows = 0, cols = 0, n = 64, threads = 1, repeat = 5, q4 = -1, bf16 = 0;
    const tsr_bench_opt opts[] = {{"--rows", &rows, 1, 1 << 20}, {"--cols", &cols, 32, 1 << 20},
                                  {"--n", &n, 1, 4096},          {"--threads", &threads, 1, 1024},
                                  {"--repeat", &repeat, 1, 1000}, {"--q4", &q4, 0, 1},
                                  {"--bf16", &bf16, 0, 1}};
    int prc = tsr_bench_parse("tsr_q8gemm", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                              tsr__usage);
    if (prc) return prc == 1 ? 0 : 2;
    if (!rows || !cols || cols % 32) {
        fprintf(stderr, "tsr_q8gemm: --rows and --cols (a multiple of 32) are required\n");
        return 2;
    }
    size_t sw = (size_t)rows * cols, sx = (size_t)n * cols, sy = (size_t)n * rows;
    float *wf = malloc(sw * sizeof *wf), *x = malloc(sx * sizeof *x), *y = malloc(sy * sizeof *y);
    double *wall = malloc((size_t)repeat * sizeof *wall), *cpu = malloc((size_t)repeat * sizeof *cpu);
    tsr_dtype t = bf16 ? TSR_BF16 : q4 < 0 ? TSR_Q8_0 : q4 == 0 ? TSR_Q4_0 : TSR_Q4_1;
    tsr_tensor w = {.dtype = t, .rows = rows, .cols = cols};
    void *wq = wf ? tsr_malloc(tsr_tensor_bytes(&w)) : NULL;
    w.data = wq;
    tsr_backend *be = NULL;
    int rc = 1; /* every exit goes through the frees below */
    if (!wf || !x || !y || !wall || !cpu || !wq) {
        fprintf(stderr, "tsr_q8gemm: out of memory (a %d x %d matrix, %d inputs)\n", rows, cols,
                n);
    } else if (tsr__setup(wf, rows, cols, x, n, t, wq, threads, &be) != TSR_OK) {
        fprintf(stderr, "tsr_q8gemm: setup failed: %s\n", tsr_last_error());
    } else if (tsr__time(be, x, n, &w, y, repeat, wall, cpu) != TSR_OK) {
        fprintf(stderr, "tsr_q8gemm: matmul failed: %s\n", tsr_last_error());
    } else {
        tsr_bench_time_sort(wall, repeat);
        tsr_bench_time_sort(cpu, repeat);
        printf("{\"bench\":\"q8gemm\",\"dtype\":\"%s\",\"rows\":%d,\"cols\":%d,\"n\":%d,\"threads\":%d,"
               "\"gmac_s\":%.2f,\"gmac_s_best\":%.2f,\"gmac_cpu_s\":%.2f}\n",
               tsr_dtype_name(t), rows, cols, n, threads, wall[repeat / 2], wall[repeat - 1], cpu[repeat / 2]);
        rc = 0;
    }
    tsr_backend_destroy(be);
    tsr_free(wq);
    free(wf);
    free(x);
    free(y);
    free(wall);
    free(cpu);
    return rc;
}
