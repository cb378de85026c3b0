/* What the micro-benchmarks (tsr_membw, tsr_sgemm, tsr_attn) share: their integer options
 * and their pseudo-random fill. Linked as the small library tsr_bench_args, so tsr_sgemm
 * keeps needing nothing but OpenBLAS. */
#ifndef TSR_BENCH_ARGS_H
#define TSR_BENCH_ARGS_H

#include <stdint.h>
#include <stdio.h>

/* --name INT with INT in [lo, hi], stored in *dst (which holds the default). */
typedef struct tsr_bench_opt {
    const char *name;
    int *dst;
    int lo, hi;
} tsr_bench_opt;

/* Parses argv[1..] against opts. --help or -h prints usage(stdout) and returns 1; an unknown
 * option or a bad value prints "PROG: ..." (one line) to stderr and returns 2; else 0. */
int tsr_bench_parse(const char *prog, int argc, char **argv, const tsr_bench_opt *opts,
                    int n_opts, void (*usage)(FILE *));

/* Uniform in [-0.5, 0.5) from an LCG state: values that neither overflow nor go denormal. */
float tsr_bench_rand(uint32_t *s);

#endif
