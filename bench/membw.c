/* tsr_membw: streaming-read bandwidth, the ceiling of a memory-bound decode step.
 *
 * Sums (xor) a buffer far larger than the last-level cache with 1..T OpenMP threads, each
 * thread reading one contiguous slice, and reports the best of R passes in GB/s (1e9
 * bytes/s). AVX2 loads with four independent accumulators when the CPU has AVX2, else a
 * plain 64-bit loop the compiler may vectorize. Prints one JSON line.
 *
 * The buffer is measured twice: in 4 KiB pages and in a 2 MiB-aligned mapping advised for
 * transparent huge pages (how tessera holds its weights, runtime/model.c). The hardware
 * prefetcher stops at page boundaries, so the second is usually faster; the ceiling
 * (read_gb_s_Nt) is the better of the two, and both are printed. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench/bench_args.h"
#include "runtime/base/sys.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TSR_MEMBW_X86 1
#endif

static uint64_t tsr__xor_plain(const uint64_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a ^= p[i];
        b ^= p[i + 1];
        c ^= p[i + 2];
        d ^= p[i + 3];
    }
    for (; i < n; i++) a ^= p[i];
    return a ^ b ^ c ^ d;
}

#ifdef TSR_MEMBW_X86
/* Four 32-byte loads per iteration: enough independent loads in flight to saturate the
 * memory system from one core (hardware prefetch does the rest). */
__attribute__((target("avx2"))) static uint64_t tsr__xor_avx2(const uint64_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 4)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 8)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a);
    return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3] ^ tsr__xor_plain(p + i, n - i);
}
#endif

static int tsr__have_avx2(void) {
#ifdef TSR_MEMBW_X86
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static uint64_t tsr__xor(const uint64_t *p, size_t n, int avx2) {
#ifdef TSR_MEMBW_X86
    if (avx2) return tsr__xor_avx2(p, n);
#endif
    (void)avx2;
    return tsr__xor_plain(p, n);
}

/* One pass over the whole buffer with `threads` threads; returns seconds. */
static double tsr__pass(const uint64_t *buf, size_t n, int threads, int avx2,
                        volatile uint64_t *sink) {
    uint64_t total = 0;
    double t0 = tsr_sys_now();
#pragma omp parallel num_threads(threads) reduction(^ : total)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        /* slices rounded to 16 words so every thread's loads stay 32-byte aligned */
        size_t per = (n / (size_t)nt) & ~(size_t)15;
        size_t lo = per * (size_t)id, hi = id == nt - 1 ? n : lo + per;
        total ^= tsr__xor(buf + lo, hi - lo, avx2);
    }
    double dt = tsr_sys_now() - t0;
    *sink ^= total;
    return dt;
}

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

    size_t bytes = (size_t)mib << 20, n = bytes / sizeof(uint64_t);
    int avx2 = tsr__have_avx2();
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
#pragma omp parallel for num_threads(max_threads) schedule(static)
        for (size_t i = 0; i < n; i++) buf[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
        if (huge) {
            int64_t hb = tsr_sys_anon_huge_bytes(); /* did THP back the buffer? */
            huge_kb = hb < 0 ? -1 : (long)(hb / 1024);
        }
        volatile uint64_t sink = 0;
        tsr__pass(buf, n, 1, avx2, &sink); /* warm-up: page tables, frequency */
        for (int t = 1; t <= max_threads; t++) {
            best[huge][t] = 1e30;
            for (int r = 0; r < repeat; r++) {
                double dt = tsr__pass(buf, n, t, avx2, &sink);
                if (dt < best[huge][t]) best[huge][t] = dt;
            }
        }
        munmap(raw, len);
    }
    printf("{\"bench\":\"membw\",\"bytes\":%zu,\"repeat\":%d,\"simd\":\"%s\","
           "\"anon_huge_kb\":%ld",
           bytes, repeat, avx2 ? "avx2" : "scalar", huge_kb);
    for (int t = 1; t <= max_threads; t++) {
        double g4 = (double)bytes / best[0][t] * 1e-9, g2 = (double)bytes / best[1][t] * 1e-9;
        printf(",\"read_gb_s_%dt\":%.2f,\"read4k_gb_s_%dt\":%.2f,\"read2m_gb_s_%dt\":%.2f", t,
               g4 > g2 ? g4 : g2, t, g4, t, g2);
    }
    printf("}\n");
    return 0;
}
