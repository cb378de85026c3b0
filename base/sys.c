#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/sys.h"

#include <sched.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

double tsr_sys_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tsr_sys_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Bytes of the first line of `path` that `fmt` ("Key: %lld kB") matches; -1 when the file
 * or the line is missing. */
static int64_t tsr__proc_kb(const char *path, const char *fmt) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

int64_t tsr_sys_anon_huge_bytes(void) {
    return tsr__proc_kb("/proc/self/smaps_rollup", "AnonHugePages: %lld kB");
}

int64_t tsr_sys_mem_available(void) {
    return tsr__proc_kb("/proc/meminfo", "MemAvailable: %lld kB");
}

int64_t tsr_sys_mem_total(void) {
    return tsr__proc_kb("/proc/meminfo", "MemTotal: %lld kB");
}

int64_t tsr_sys_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}
