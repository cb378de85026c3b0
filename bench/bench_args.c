#include "bench/bench_args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int tsr__parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int tsr_bench_parse(const char *prog, int argc, char **argv, const tsr_bench_opt *opts,
                    int n_opts, void (*usage)(FILE *)) {
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 1;
        }
        int o = 0;
        while (o < n_opts && strcmp(argv[i], opts[o].name)) o++;
        if (o == n_opts) {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", prog, argv[i]);
            return 2;
        }
        if (i + 1 >= argc || tsr__parse_int(argv[i + 1], opts[o].lo, opts[o].hi, opts[o].dst)) {
            fprintf(stderr, "%s: %s needs an integer in [%d, %d]\n", prog, argv[i], opts[o].lo,
                    opts[o].hi);
            return 2;
        }
    }
    return 0;
}

float tsr_bench_rand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) * 0x1p-24f - 0.5f;
}
