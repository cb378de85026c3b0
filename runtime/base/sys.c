#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "runtime/base/sys.h"

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

int64_t tsr_sys_anon_huge_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

int64_t tsr_sys_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

int64_t tsr_sys_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}
