#include "bench/bench_time.h"

#include <stdlib.h>
#include <time.h>

static double tsr__clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tsr_bench_time_wall(void) { return tsr__clock(CLOCK_MONOTONIC); }

double tsr_bench_time_cpu(void) { return tsr__clock(CLOCK_PROCESS_CPUTIME_ID); }

static int tsr__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void tsr_bench_time_sort(double *v, int n) { qsort(v, (size_t)n, sizeof *v, tsr__cmp_double); }

double tsr_bench_time_median(double *v, int n) {
    tsr_bench_time_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
