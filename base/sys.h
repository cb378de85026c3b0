/* Small process facts every subcommand needs: a monotonic clock, the CPUs the job was
 * given, and peak resident memory. */
#ifndef TSR_BASE_SYS_H
#define TSR_BASE_SYS_H

#include <stdint.h>

/* Seconds on a monotonic clock. */
double tsr_sys_now(void);
/* CPUs this process may run on (what Slurm/cgroups/affinity gave it), at least 1. */
int tsr_sys_cpus(void);
/* Peak resident set size of the process in bytes (0 when unknown). */
int64_t tsr_sys_peak_rss(void);
/* Bytes of the process now backed by transparent huge pages (AnonHugePages of
 * /proc/self/smaps_rollup; -1 when unknown): whether the weights got the 2 MiB pages they
 * asked for (tsr_malloc_huge), which decides decode speed on the CPU. */
int64_t tsr_sys_anon_huge_bytes(void);
/* Memory the kernel could give without swapping (MemAvailable of /proc/meminfo), in bytes;
 * -1 when unknown. Lets a tool refuse a buffer that would only end in the OOM killer. */
int64_t tsr_sys_mem_available(void);
/* MemTotal in bytes (-1 when unknown). */
int64_t tsr_sys_mem_total(void);

#endif
