/* What the micro-benchmarks time with: the clocks and the order statistics of repeated runs.
 * Linked as the small library tsr_bench_time (like tsr_bench_args), so tsr_sgemm keeps
 * needing nothing but OpenBLAS; programs that link tessera_core may use tsr_sys_now for the
 * wall clock as well (the same clock). */
#ifndef TSR_BENCH_TIME_H
#define TSR_BENCH_TIME_H

/* Seconds on the monotonic clock. */
double tsr_bench_time_wall(void);
/* CPU seconds of the whole process (user + system of all threads, spin waits included):
 * what a run cost when other load stretches its wall time. */
double tsr_bench_time_cpu(void);

/* Sorts v[0..n) ascending (v[n - 1] is the best of a throughput, the worst of a time). */
void tsr_bench_time_sort(double *v, int n);
/* Sorts v[0..n) and returns its median (n >= 1; the mean of the middle two for even n). */
double tsr_bench_time_median(double *v, int n);

#endif
