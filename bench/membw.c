/* tsr_membw: streaming-read bandwidth, the ceiling of a memory-bound decode step.
 *
 * Sums (xor) a buffer far larger than the last-level cache with 1..T OpenMP threads, each
 * thread reading one contiguous slice, and reports the best of R passes in GB/s (1e9
 * bytes/s); the passes are base/membw.c's, which `tessera bench --membw-mib` also
 * runs beside its decode. Prints one JSON line.
 *
 * The buffer is measured twice: in 4 KiB pages and in a 2 MiB-aligned mapping advised for
 * transparent huge pages (how tessera holds its weights, runtime/model/model.c). The hardware
 * prefetcher stops at page boundaries, so the second is usually faster; the ceiling
 * (read_gb_s_Nt) is the better of the two, and both are printed. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench/bench_args.h"
#include "base/membw.h"
#include "base/sys.h"

static void tsr__usage(FILE *f) {
    fprintf(f,
            "usage: tsr_membw [--mib N] [--repeat R] [--max-threads T]\n"
            "Streaming-read bandwidth: xor-sums an N MiB buffer (default 512) with 1..T\n"
            "OpenMP threads (default 2), each thread reading one contiguous slice; reports\n"
            "the best of R passes (default 5) per thread count as GB/s (1e9 bytes/s), in\n"
            "4 KiB pages (read4k_*) and in transparent huge pages (read2m_*; anon_huge_kb:\n"
            "how much THP backed); read_gb_s_* is the better of the two.\n"
            "Output: one JSON line {\"bench\":\"membw\",\"bytes\":..,\"simd\":..,\n"
            "\"read_gb_s_1t\":..,\"read_gb_s_2t\":..,...}.\n");
}

int main(int argc, char **argv) {
    int mib = 512, repeat = 5, max_threads = 2;
    const tsr_bench_opt opts[] = {{"--mib", &mib, 1, 65536},
                                   {"--repeat", &repeat, 1, 1000},
                                   {"--max-threads", &max_threads, 1, 1024}};
    int prc = tsr_bench_parse("tsr_membw", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                              tsr__usage);
    if (prc) return prc == 1 ? 0 : 2;

    size_t bytes = (size_t)mib << 20;
    int64_t avail;
    if (!tsr_membw_fits(bytes, &avail)) {
        fprintf(stderr, "tsr_membw: --mib %d: more than half of the %lld MiB of memory "
                "available\n", mib, (long long)(avail >> 20));
        return 2;
    }
    double best[2][1025]; /* [4k, 2m][threads] */
    long huge_kb = -1;
    for (int huge = 0; huge < 2; huge++) {
        size_t hp = (size_t)2 << 20, len = bytes + hp;
        char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) {
            fprintf(stderr, "tsr_membw: cannot map %d MiB\n", mib);
            return 1;
        }
        uint64_t *buf = (uint64_t *)(((uintptr_t)raw + hp - 1) & ~(uintptr_t)(hp - 1));
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
        (void)madvise(buf, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
        /* Touch every page (in parallel, so each thread's slice is first-touched near it). */
        tsr_membw_fill(buf, bytes, max_threads);
        if (huge) {
            int64_t hb = tsr_sys_anon_huge_bytes(); /* did THP back the buffer? */
            huge_kb = hb < 0 ? -1 : (long)(hb / 1024);
        }
        volatile uint64_t sink = 0;
        tsr_membw_pass(buf, bytes, 1, &sink); /* warm-up: page tables, frequency */
        for (int t = 1; t <= max_threads; t++) {
            best[huge][t] = 1e30;
            for (int r = 0; r < repeat; r++) {
                double dt = tsr_membw_pass(buf, bytes, t, &sink);
                if (dt < best[huge][t]) best[huge][t] = dt;
            }
        }
        munmap(raw, len);
    }
    printf("{\"bench\":\"membw\",\"bytes\":%zu,\"repeat\":%d,\"simd\":\"%s\","
           "\"anon_huge_kb\":%ld",
           bytes, repeat, tsr_membw_simd() ? "avx2" : "scalar", huge_kb);
    for (int t = 1; t <= max_threads; t++) {
        double g4 = (double)bytes / best[0][t] * 1e-9, g2 = (double)bytes / best[1][t] * 1e-9;
        printf(",\"read_gb_s_%dt\":%.2f,\"read4k_gb_s_%dt\":%.2f,\"read2m_gb_s_%dt\":%.2f", t,
               g4 > g2 ? g4 : g2, t, g4, t, g2);
    }
    printf("}\n");
    return 0;
}
