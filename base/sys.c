#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/sys.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <fcntl.h>
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

/* The roots of /proc and of the cgroup file system (tests point them at fake trees). */
static const char *tsr__root(const char *env, const char *dflt) {
    const char *r = getenv(env);
    return r && *r ? r : dflt;
}

static const char *tsr__proc_root(void) { return tsr__root("TSR_PROC_ROOT", "/proc"); }
static const char *tsr__cgroup_root(void) {
    return tsr__root("TSR_CGROUP_ROOT", "/sys/fs/cgroup");
}

/* Bytes of the first line of /proc/`rel` that `fmt` ("Key: %lld kB") matches; -1 when the
 * file or the line is missing. */
static int64_t tsr__proc_kb(const char *rel, const char *fmt) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tsr__proc_root(), rel);
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
    return tsr__proc_kb("self/smaps_rollup", "AnonHugePages: %lld kB");
}

int64_t tsr_sys_mem_available(void) {
    return tsr__proc_kb("meminfo", "MemAvailable: %lld kB");
}

int64_t tsr_sys_mem_total(void) {
    return tsr__proc_kb("meminfo", "MemTotal: %lld kB");
}

int64_t tsr_sys_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

/* Field `i` (0: size, 1: resident) of /proc/self/statm, in bytes; -1 when unknown. */
static int64_t tsr__statm(int i) {
    char path[512];
    snprintf(path, sizeof path, "%s/self/statm", tsr__proc_root());
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v[2] = {-1, -1};
    int n = fscanf(f, "%lld %lld", &v[0], &v[1]);
    fclose(f);
    long psz = sysconf(_SC_PAGESIZE);
    if (n != 2 || v[i] < 0 || psz <= 0) return -1;
    return (int64_t)v[i] * psz;
}

int64_t tsr_sys_rss(void) { return tsr__statm(1); }
int64_t tsr_sys_vm_size(void) { return tsr__statm(0); }

const char *tsr_sys_mem_bound_name(tsr_sys_mem_bound b) {
    switch (b) {
    case TSR_SYS_MEM_AVAILABLE: return "MemAvailable";
    case TSR_SYS_MEM_CGROUP_V2: return "cgroup v2 memory.max";
    case TSR_SYS_MEM_CGROUP_V1: return "cgroup v1 memory.limit_in_bytes";
    case TSR_SYS_MEM_SLURM: return "Slurm's memory allocation";
    case TSR_SYS_MEM_RLIMIT_AS: return "ulimit -v (RLIMIT_AS)";
    case TSR_SYS_MEM_NONE: break;
    }
    return "no known bound";
}

static void tsr__set(tsr_sys_mem_limit *o, tsr_sys_mem_bound b, int64_t limit, int64_t used,
                     const char *where) {
    if (used < 0) used = 0;
    o->bound = b;
    o->limit = limit;
    o->used = used;
    o->bytes = limit > used ? limit - used : 0;
    size_t n = strlen(where);
    if (n >= sizeof o->where) n = sizeof o->where - 1;
    memcpy(o->where, where, n);
    o->where[n] = 0;
}

bool tsr_sys_mem_meminfo(tsr_sys_mem_limit *out) {
    int64_t a = tsr_sys_mem_available();
    if (a < 0) return false;
    char where[512];
    snprintf(where, sizeof where, "%s/meminfo", tsr__proc_root());
    tsr__set(out, TSR_SYS_MEM_AVAILABLE, a, 0, where);
    return true;
}

/* A decimal byte count alone on the first line of a file: >= 0, or -1 when the file is
 * missing or holds something else ("max" included). */
static int64_t tsr__read_bytes(const char *dir, const char *name) {
    char path[1536], line[128];
    int pn = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (pn < 0 || (size_t)pn >= sizeof path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (!ok) return -1;
    char *end = NULL;
    long long v = strtoll(line, &end, 10);
    if (end == line || v < 0 || (*end && *end != '\n')) return -1;
    return (int64_t)v;
}

/* The value of `key` in a memory.stat file (-1 when missing). */
static int64_t tsr__stat_key(const char *dir, const char *key) {
    char path[1536], line[256];
    int pn = snprintf(path, sizeof path, "%s/memory.stat", dir);
    if (pn < 0 || (size_t)pn >= sizeof path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t kl = strlen(key);
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ' ') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* The process's cgroup path for the memory controller: v1 when a line names "memory" in
 * its controller list, else the v2 line ("0::"). Returns 1 or 2, 0 when none is found. */
static int tsr__cgroup_path(char *path, size_t size) {
    char file[512], line[1024];
    snprintf(file, sizeof file, "%s/self/cgroup", tsr__proc_root());
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    int version = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *ctl = c1 + 1, *p = c2 + 1;
        bool mem = false;
        for (const char *t = ctl; *t;) {
            size_t n = strcspn(t, ",");
            if (n == 6 && strncmp(t, "memory", 6) == 0) mem = true;
            t += n + (t[n] == ',');
        }
        if (mem) {
            snprintf(path, size, "%s", p);
            version = 1;
            break; /* the memory controller's own hierarchy wins over the unified one */
        }
        if (*ctl == 0 && c1 == line + 1 && line[0] == '0') {
            snprintf(path, size, "%s", p);
            version = 2;
        }
    }
    fclose(f);
    return version;
}

bool tsr_sys_mem_cgroup(tsr_sys_mem_limit *out) {
    char rel[512];
    int v = tsr__cgroup_path(rel, sizeof rel);
    if (!v) return false;
    /* v1 mounts the memory controller at <root>/memory; v2 has one tree at <root>. */
    char base[600], dir[1200];
    snprintf(base, sizeof base, "%s%s", tsr__cgroup_root(), v == 1 ? "/memory" : "");
    snprintf(dir, sizeof dir, "%s%s", base, rel);
    const char *lim_name = v == 1 ? "memory.limit_in_bytes" : "memory.max";
    const char *use_name = v == 1 ? "memory.usage_in_bytes" : "memory.current";
    const char *inactive = v == 1 ? "total_inactive_file" : "inactive_file";
    bool found = false;
    /* From the process's cgroup up to the root of the mount: in a container the path of
     * /proc/self/cgroup may not exist below the mount (its root is the container's
     * cgroup), so missing levels are skipped; the tightest level wins. */
    size_t blen = strlen(base);
    for (;;) {
        int64_t lim = tsr__read_bytes(dir, lim_name);
        /* v1 writes "unlimited" as the largest page-aligned counter (~2^63) */
        if (lim >= 0 && lim < ((int64_t)1 << 60)) {
            int64_t used = tsr__read_bytes(dir, use_name);
            if (used < 0) used = tsr_sys_rss();
            int64_t ina = tsr__stat_key(dir, inactive);
            if (used > 0 && ina > 0) used = ina < used ? used - ina : 0;
            int64_t left = lim > used ? lim - used : 0;
            if (!found || left < out->bytes) {
                char where[1300];
                snprintf(where, sizeof where, "%s/%s", dir, lim_name);
                tsr__set(out, v == 1 ? TSR_SYS_MEM_CGROUP_V1 : TSR_SYS_MEM_CGROUP_V2, lim,
                         used, where);
                found = true;
            }
        }
        size_t len = strlen(dir);
        if (len <= blen) break;
        char *slash = strrchr(dir + blen, '/');
        if (!slash) break;
        *slash = 0;
    }
    return found;
}

/* A positive decimal environment variable, or -1. */
static int64_t tsr__env_pos(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return -1;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    /* Slurm may suffix a unit letter in some versions: only M (its default) is taken */
    if (end == s || v <= 0 || (*end && strcmp(end, "M") != 0)) return -1;
    return (int64_t)v;
}

bool tsr_sys_mem_slurm(tsr_sys_mem_limit *out) {
    int64_t mib = tsr__env_pos("SLURM_MEM_PER_NODE");
    const char *where = "SLURM_MEM_PER_NODE";
    if (mib < 0) {
        int64_t per_cpu = tsr__env_pos("SLURM_MEM_PER_CPU");
        int64_t cpus = tsr__env_pos("SLURM_CPUS_ON_NODE");
        if (per_cpu < 0 || cpus < 0) return false;
        mib = per_cpu * cpus;
        where = "SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE";
    }
    if (mib > ((int64_t)1 << 40)) return false;
    tsr__set(out, TSR_SYS_MEM_SLURM, mib << 20, tsr_sys_rss(), where);
    return true;
}

bool tsr_sys_mem_rlimit_as(tsr_sys_mem_limit *out) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return false;
    int64_t lim = rl.rlim_cur > (rlim_t)INT64_MAX ? INT64_MAX : (int64_t)rl.rlim_cur;
    tsr__set(out, TSR_SYS_MEM_RLIMIT_AS, lim, tsr_sys_vm_size(), "RLIMIT_AS");
    return true;
}

void tsr_sys_mem_headroom(tsr_sys_mem_limit *out) {
    memset(out, 0, sizeof *out);
    out->bytes = -1;
    bool (*readers[])(tsr_sys_mem_limit *) = {tsr_sys_mem_meminfo, tsr_sys_mem_cgroup,
                                              tsr_sys_mem_slurm, tsr_sys_mem_rlimit_as};
    for (size_t i = 0; i < sizeof readers / sizeof readers[0]; i++) {
        tsr_sys_mem_limit b;
        memset(&b, 0, sizeof b);
        if (!readers[i](&b)) continue;
        if (out->bound == TSR_SYS_MEM_NONE || b.bytes < out->bytes) *out = b;
    }
}

/* One user of the address space in tsr_sys_vm_top. */
typedef struct tsr__vm_user {
    char name[64];
    uint64_t bytes;
} tsr__vm_user;

/* Adds one mapping line of /proc/self/maps ("lo-hi perms off dev inode   path") to u[]. */
static void tsr__vm_add(tsr__vm_user *u, int *n, int cap, const char *line, size_t len) {
    uint64_t lo = 0, hi = 0;
    size_t i = 0;
    for (; i < len && line[i] != '-'; i++) {
        char c = line[i];
        lo = lo * 16 + (uint64_t)(c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    for (i++; i < len && line[i] != ' '; i++) {
        char c = line[i];
        hi = hi * 16 + (uint64_t)(c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    if (hi <= lo) return;
    /* the path is the sixth field; anonymous mappings have none */
    int field = 1;
    while (i < len && field < 6) {
        while (i < len && line[i] == ' ') i++;
        if (i < len) field++;
        if (field < 6)
            while (i < len && line[i] != ' ') i++;
    }
    const char *name = "anonymous";
    size_t nl = 9;
    if (field == 6 && i < len) {
        const char *path = line + i;
        size_t pl = len - i;
        const char *base = path;
        for (size_t k = 0; k < pl; k++)
            if (path[k] == '/') base = path + k + 1;
        name = base;
        nl = pl - (size_t)(base - path);
    }
    if (nl >= sizeof u[0].name) nl = sizeof u[0].name - 1;
    for (int k = 0; k < *n; k++)
        if (strlen(u[k].name) == nl && memcmp(u[k].name, name, nl) == 0) {
            u[k].bytes += hi - lo;
            return;
        }
    if (*n < cap - 1) {
        memcpy(u[*n].name, name, nl);
        u[*n].name[nl] = '\0';
        u[(*n)++].bytes = hi - lo;
        return;
    }
    /* past the table: the last entry holds the rest */
    memcpy(u[cap - 1].name, "other", 6);
    u[cap - 1].bytes += hi - lo;
    *n = cap;
}

void tsr_sys_vm_top(char *buf, size_t cap, int top) {
    if (cap == 0) return;
    buf[0] = '\0';
    enum { TSR__VM_USERS = 64 };
    tsr__vm_user u[TSR__VM_USERS];
    memset(u, 0, sizeof u);
    int n = 0;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char chunk[4096], line[512];
    size_t ll = 0;
    ssize_t got;
    while ((got = read(fd, chunk, sizeof chunk)) > 0) {
        for (ssize_t i = 0; i < got; i++) {
            if (chunk[i] != '\n') {
                if (ll < sizeof line - 1) line[ll++] = chunk[i];
                continue;
            }
            tsr__vm_add(u, &n, TSR__VM_USERS, line, ll);
            ll = 0;
        }
    }
    close(fd);
    if (ll) tsr__vm_add(u, &n, TSR__VM_USERS, line, ll);
    size_t l = 0;
    for (int t = 0; t < top; t++) {
        int best = -1;
        for (int k = 0; k < n; k++)
            if (u[k].bytes && (best < 0 || u[k].bytes > u[best].bytes)) best = k;
        if (best < 0) break;
        int w = snprintf(buf + l, cap - l, "%s%s %.0f MiB", l ? ", " : "", u[best].name,
                         (double)u[best].bytes / 1048576.0);
        if (w < 0 || (size_t)w >= cap - l) break;
        l += (size_t)w;
        u[best].bytes = 0;
    }
}
