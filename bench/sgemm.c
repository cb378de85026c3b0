/* tsr_sgemm: OpenBLAS cblas_sgemm throughput at one shape, the reference a batched
 * prefill is measured against.
 *
 * The shape is the one the forward uses: Y[M][N] = X[M][K] . W[N][K]^T, with M = prompt
 * tokens, N = out features, K = in features (row-major, W transposed as a linear layer
 * stores it). One warm-up call, then R timed runs of enough calls to last >= 50 ms each;
 * reports the median and best GFLOP/s (2*M*N*K flops per call). Prints one JSON line. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_args.h"
#include "bench/bench_time.h"

static void tsr__usage(FILE *f) {
    fprintf(f,
            "usage: tsr_sgemm --m M --n N --k K [--threads T] [--repeat R]\n"
            "OpenBLAS cblas_sgemm GFLOP/s for Y[M][N] = X[M][K] . W[N][K]^T (row-major; M =\n"
            "prompt tokens, N = out features, K = in features), T OpenBLAS threads (default\n"
            "1). One warm-up call, then R (default 5) timed runs of >= 50 ms each; flops =\n"
            "2*M*N*K per call. Output: one JSON line {\"bench\":\"sgemm\",\"m\":..,\"n\":..,\n"
            "\"k\":..,\"threads\":..,\"gflops\":<median>,\"gflops_best\":..}.\n");
}

int main(int argc, char **argv) {
    int m = 0, n = 0, k = 0, threads = 1, repeat = 5;
    const tsr_bench_opt opts[] = {{"--m", &m, 1, 1 << 20},        {"--n", &n, 1, 1 << 20},
                                   {"--k", &k, 1, 1 << 20},        {"--threads", &threads, 1, 1024},
                                   {"--repeat", &repeat, 1, 1000}};
    int prc = tsr_bench_parse("tsr_sgemm", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                              tsr__usage);
    if (prc) return prc == 1 ? 0 : 2;
    if (!m || !n || !k) {
        fprintf(stderr, "tsr_sgemm: --m, --n and --k are required (see --help)\n");
        return 2;
    }
    if ((double)m * k + (double)n * k + (double)m * n > 1e9) {
        fprintf(stderr, "tsr_sgemm: shape %dx%dx%d needs more than 4 GB\n", m, n, k);
        return 2;
    }

    size_t sx = (size_t)m * k, sw = (size_t)n * k, sy = (size_t)m * n;
    float *x = malloc(sx * sizeof *x), *w = malloc(sw * sizeof *w), *y = malloc(sy * sizeof *y);
    double *gf = malloc((size_t)repeat * sizeof *gf);
    if (!x || !w || !y || !gf) {
        fprintf(stderr, "tsr_sgemm: out of memory\n");
        return 1;
    }
    uint32_t s = 12345;
    for (size_t i = 0; i < sx; i++) x[i] = tsr_bench_rand(&s);
    for (size_t i = 0; i < sw; i++) w[i] = tsr_bench_rand(&s);

    openblas_set_num_threads(threads);
    double flops = 2.0 * m * n * k;
    double t0 = tsr_bench_time_wall();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
    double one = tsr_bench_time_wall() - t0;
    int iters = one > 0 ? (int)(0.05 / one) + 1 : 1000;
    for (int r = 0; r < repeat; r++) {
        t0 = tsr_bench_time_wall();
        for (int it = 0; it < iters; it++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f,
                        y, n);
        gf[r] = flops * iters / (tsr_bench_time_wall() - t0) * 1e-9;
    }
    tsr_bench_time_sort(gf, repeat);
    printf("{\"bench\":\"sgemm\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":%d,\"repeat\":%d,"
           "\"gflops\":%.2f,\"gflops_best\":%.2f,\"check\":%.4g}\n",
           m, n, k, threads, repeat, gf[repeat / 2], gf[repeat - 1], (double)y[sy / 2]);
    free(x);
    free(w);
    free(y);
    free(gf);
    return 0;
}
