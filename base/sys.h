/* Small process facts every subcommand needs: a monotonic clock, the CPUs the job was
 * given, peak resident memory, and how much more memory the job may take (the least of
 * MemAvailable, the cgroup's limit, Slurm's allocation and the address-space limit).
 *
 * The /proc and cgroup readers take their roots from TSR_PROC_ROOT (default /proc) and
 * TSR_CGROUP_ROOT (default /sys/fs/cgroup), so that tests can hand them a fake tree. */
#ifndef TSR_BASE_SYS_H
#define TSR_BASE_SYS_H

#include <stdbool.h>
#include <stddef.h>
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
/* Resident and virtual size of the process now (/proc/self/statm), in bytes; -1 when
 * unknown. */
int64_t tsr_sys_rss(void);
int64_t tsr_sys_vm_size(void);
/* What takes the address space: the `top` largest users of /proc/self/maps, by file (its
 * base name, "libcublasLt.so.12") or "anonymous", as "NAME N MiB, ..." in buf ("" when
 * unknown). Uses no heap (callable where allocation just failed, or before main). */
void tsr_sys_vm_top(char *buf, size_t cap, int top);

/* Where the memory a process may still take is bounded. */
typedef enum tsr_sys_mem_bound {
    TSR_SYS_MEM_NONE = 0,    /* nothing known */
    TSR_SYS_MEM_AVAILABLE,   /* MemAvailable of /proc/meminfo (the whole machine) */
    TSR_SYS_MEM_CGROUP_V2,   /* memory.max less memory.current, on the cgroup's path */
    TSR_SYS_MEM_CGROUP_V1,   /* memory.limit_in_bytes less memory.usage_in_bytes */
    TSR_SYS_MEM_SLURM,       /* SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU x
                              * SLURM_CPUS_ON_NODE (MiB), less this process's RSS */
    TSR_SYS_MEM_RLIMIT_AS,   /* ulimit -v less the address space in use */
} tsr_sys_mem_bound;

typedef struct tsr_sys_mem_limit {
    int64_t bytes;           /* what is left: limit - used; -1 when no bound is known */
    int64_t limit, used;     /* of that bound (used: what counts against it now) */
    tsr_sys_mem_bound bound;
    char where[512];         /* the file or variable it was read from */
} tsr_sys_mem_limit;

/* Short name of a bound for messages ("cgroup v2 memory.max", "ulimit -v", ...). */
const char *tsr_sys_mem_bound_name(tsr_sys_mem_bound b);

/* Each reader fills *out with its own bound and returns true, or returns false when that
 * bound does not apply (file or variable missing, "max", unlimited). */
/* The cgroup of this process (/proc/self/cgroup): v1 when a hierarchy names the memory
 * controller, else v2. The tightest of the cgroup and its ancestors (a parent's limit
 * binds its children): limit less usage, where usage leaves out inactive file pages
 * (page cache the kernel reclaims before it would OOM-kill). */
bool tsr_sys_mem_cgroup(tsr_sys_mem_limit *out);
/* Slurm's memory for this node; what the job already holds is not known from the
 * variables, so this process's RSS is subtracted. */
bool tsr_sys_mem_slurm(tsr_sys_mem_limit *out);
bool tsr_sys_mem_rlimit_as(tsr_sys_mem_limit *out);
bool tsr_sys_mem_meminfo(tsr_sys_mem_limit *out);
/* The least of all the bounds above (out->bound NONE and bytes -1 when none applies). A
 * bound already exceeded leaves 0. */
void tsr_sys_mem_headroom(tsr_sys_mem_limit *out);

#endif
