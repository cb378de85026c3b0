/* Streaming-read passes (base/membw.h). */
#include "base/membw.h"

#include <omp.h>

#include "base/sys.h"

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

static uint64_t tsr__xor(const uint64_t *p, size_t n, int avx2) {
#ifdef TSR_MEMBW_X86
    if (avx2) return tsr__xor_avx2(p, n);
#endif
    (void)avx2;
    return tsr__xor_plain(p, n);
}

int tsr_membw_fits(size_t bytes, int64_t *avail) {
    *avail = tsr_sys_mem_available();
    return *avail <= 0 || (int64_t)bytes <= *avail / 2;
}

int tsr_membw_simd(void) {
#ifdef TSR_MEMBW_X86
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* Thread id's slice [lo, hi) of n words, rounded to 16 words so every thread's loads stay
 * 32-byte aligned. */
static void tsr__slice(size_t n, int nt, int id, size_t *lo, size_t *hi) {
    size_t per = (n / (size_t)nt) & ~(size_t)15;
    *lo = per * (size_t)id;
    *hi = id == nt - 1 ? n : *lo + per;
}

void tsr_membw_fill(void *buf, size_t bytes, int threads) {
    uint64_t *p = buf;
    size_t n = bytes / sizeof *p;
#pragma omp parallel num_threads(threads)
    {
        size_t lo, hi;
        tsr__slice(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        for (size_t i = lo; i < hi; i++) p[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    }
}

double tsr_membw_pass(const void *buf, size_t bytes, int threads, volatile uint64_t *sink) {
    const uint64_t *p = buf;
    size_t n = bytes / sizeof *p;
    int avx2 = tsr_membw_simd();
    uint64_t total = 0;
    double t0 = tsr_sys_now();
    if (threads <= 1) { /* no OpenMP region on one thread (its own cost and a futex) */
        total = tsr__xor(p, n, avx2);
    } else {
#pragma omp parallel num_threads(threads) reduction(^ : total)
        {
            size_t lo, hi;
            tsr__slice(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
            total ^= tsr__xor(p + lo, hi - lo, avx2);
        }
    }
    double dt = tsr_sys_now() - t0;
    *sink ^= total;
    return dt;
}
