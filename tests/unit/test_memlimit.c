/* base/sys.c's memory bounds, read from fake trees (TSR_PROC_ROOT, TSR_CGROUP_ROOT): cgroup
 * v2 (memory.max, "max", the tightest ancestor, usage less inactive file pages), cgroup v1
 * (memory.limit_in_bytes, "unlimited", a container whose path is not below the mount),
 * missing files, Slurm's variables, MemAvailable, RLIMIT_AS, and the least of them. */
#define _GNU_SOURCE /* mkdtemp, setenv */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/sys.h"
#include "tests/test.h"

#define MIB ((int64_t)1 << 20)

static char g_root[256];

/* mkdir -p of root/rel's directory, then writes text to root/rel. */
static int tsr__put(const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    for (char *p = path + strlen(g_root) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    return 0;
}

static void tsr__rm_rf(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", g_root);
}

static const char *const g_slurm[] = {"SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU",
                                      "SLURM_CPUS_ON_NODE"};

/* A fresh fake tree: proc/ and cg/ under a new temp dir, the env pointing at them, no
 * Slurm variables. */
static int tsr__fresh(void) {
    snprintf(g_root, sizeof g_root, "/tmp/tsr_memlimit_XXXXXX");
    if (!mkdtemp(g_root)) return -1;
    char p[400];
    snprintf(p, sizeof p, "%s/proc", g_root);
    setenv("TSR_PROC_ROOT", p, 1);
    snprintf(p, sizeof p, "%s/cg", g_root);
    setenv("TSR_CGROUP_ROOT", p, 1);
    for (size_t i = 0; i < sizeof g_slurm / sizeof g_slurm[0]; i++) unsetenv(g_slurm[i]);
    return 0;
}

static void tsr__done(void) {
    tsr__rm_rf();
    unsetenv("TSR_PROC_ROOT");
    unsetenv("TSR_CGROUP_ROOT");
}

TSR_TEST(test_cgroup_v2) {
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "0::/job/step\n");
    tsr__put("cg/job/memory.max", "max\n");
    tsr__put("cg/job/step/memory.max", "268435456\n");
    tsr__put("cg/job/step/memory.current", "20971520\n");
    tsr__put("cg/job/step/memory.stat", "anon 1000\nfile 5000\ninactive_file 4194304\n");
    tsr_sys_mem_limit l;
    bool ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(l.bound, TSR_SYS_MEM_CGROUP_V2);
    ASSERT_EQ_INT(l.limit, 256 * MIB);
    ASSERT_EQ_INT(l.used, 16 * MIB); /* 20 MiB less 4 MiB of inactive file pages */
    ASSERT_EQ_INT(l.bytes, 240 * MIB);
    ASSERT_STR_CONTAINS(l.where, "/cg/job/step/memory.max");
    ASSERT_STR_CONTAINS(tsr_sys_mem_bound_name(l.bound), "memory.max");
}

/* A parent's limit binds its children: the tightest level wins. */
TSR_TEST(test_cgroup_v2_ancestor) {
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "0::/job/step\n");
    tsr__put("cg/job/memory.max", "134217728\n");
    tsr__put("cg/job/memory.current", "104857600\n");
    tsr__put("cg/job/step/memory.max", "268435456\n");
    tsr__put("cg/job/step/memory.current", "10485760\n");
    tsr_sys_mem_limit l;
    bool ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(l.limit, 128 * MIB);
    ASSERT_EQ_INT(l.bytes, 28 * MIB);
    ASSERT_STR_CONTAINS(l.where, "/cg/job/memory.max");
}

TSR_TEST(test_cgroup_v2_max_and_missing) {
    tsr_sys_mem_limit l;
    /* "max" everywhere: no bound */
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "0::/a\n");
    tsr__put("cg/a/memory.max", "max\n");
    bool ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(!ok);
    /* no memory.max at all (a cgroup without the memory controller) */
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "0::/a\n");
    tsr__put("cg/a/cgroup.procs", "1\n");
    ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(!ok);
    /* no /proc/self/cgroup */
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("cg/memory.max", "1048576\n");
    ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(!ok);
    /* garbage in memory.max */
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "0::/\n");
    tsr__put("cg/memory.max", "lots\n");
    ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(!ok);
}

/* Without memory.current the process's own RSS counts (statm: pages). */
TSR_TEST(test_cgroup_v2_no_usage_file) {
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "0::/\n");
    tsr__put("proc/self/statm", "5000 256 10 1 0 100 0\n");
    tsr__put("cg/memory.max", "67108864\n");
    tsr_sys_mem_limit l;
    bool ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(l.used, 256 * (int64_t)sysconf(_SC_PAGESIZE));
    ASSERT_EQ_INT(l.bytes, 64 * MIB - l.used);
}

TSR_TEST(test_cgroup_v1) {
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "5:cpuacct,cpu:/slurm/job_5\n4:memory:/slurm/job_5\n0::/\n");
    tsr__put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    tsr__put("cg/memory/slurm/job_5/memory.limit_in_bytes", "536870912\n");
    tsr__put("cg/memory/slurm/job_5/memory.usage_in_bytes", "104857600\n");
    tsr__put("cg/memory/slurm/job_5/memory.stat", "cache 0\ntotal_inactive_file 0\n");
    tsr_sys_mem_limit l;
    bool ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(l.bound, TSR_SYS_MEM_CGROUP_V1);
    ASSERT_EQ_INT(l.limit, 512 * MIB);
    ASSERT_EQ_INT(l.bytes, 412 * MIB);
    ASSERT_STR_CONTAINS(l.where, "job_5/memory.limit_in_bytes");
}

/* v1 "unlimited" is the largest counter; in a container the path of /proc/self/cgroup is
 * not below the mount, whose root is the container's own cgroup. */
TSR_TEST(test_cgroup_v1_unlimited_and_container) {
    tsr_sys_mem_limit l;
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "4:memory:/docker/abc\n");
    tsr__put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    bool ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(!ok);
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/cgroup", "4:memory:/docker/abc\n");
    tsr__put("cg/memory/memory.limit_in_bytes", "67108864\n");
    tsr__put("cg/memory/memory.usage_in_bytes", "0\n");
    ok = tsr_sys_mem_cgroup(&l);
    tsr__done();
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(l.bound, TSR_SYS_MEM_CGROUP_V1);
    ASSERT_EQ_INT(l.bytes, 64 * MIB);
}

TSR_TEST(test_slurm) {
    tsr_sys_mem_limit l;
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/statm", "100 0 0 0 0 0 0\n"); /* RSS 0 */
    bool none = tsr_sys_mem_slurm(&l);
    setenv("SLURM_MEM_PER_CPU", "100", 1);
    bool half = tsr_sys_mem_slurm(&l); /* no SLURM_CPUS_ON_NODE */
    setenv("SLURM_CPUS_ON_NODE", "4", 1);
    tsr_sys_mem_limit per_cpu;
    bool pc = tsr_sys_mem_slurm(&per_cpu);
    setenv("SLURM_MEM_PER_NODE", "1024", 1); /* wins over the per-CPU form */
    tsr_sys_mem_limit per_node;
    bool pn = tsr_sys_mem_slurm(&per_node);
    setenv("SLURM_MEM_PER_NODE", "0", 1); /* "all the node's memory": no bound of its own */
    unsetenv("SLURM_MEM_PER_CPU");
    bool zero = tsr_sys_mem_slurm(&l);
    setenv("SLURM_MEM_PER_NODE", "12abc", 1);
    bool junk = tsr_sys_mem_slurm(&l);
    tsr__done();
    for (size_t i = 0; i < sizeof g_slurm / sizeof g_slurm[0]; i++) unsetenv(g_slurm[i]);
    ASSERT_TRUE(!none && !half && !zero && !junk);
    ASSERT_TRUE(pc && pn);
    ASSERT_EQ_INT(per_cpu.bound, TSR_SYS_MEM_SLURM);
    ASSERT_EQ_INT(per_cpu.limit, 400 * MIB);
    ASSERT_STR_CONTAINS(per_cpu.where, "SLURM_MEM_PER_CPU");
    ASSERT_EQ_INT(per_node.limit, 1024 * MIB);
    ASSERT_EQ_INT(per_node.bytes, 1024 * MIB);
    ASSERT_STR_EQ(per_node.where, "SLURM_MEM_PER_NODE");
}

TSR_TEST(test_meminfo_and_least) {
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/meminfo", "MemTotal: 16777216 kB\nMemFree: 100 kB\n"
                             "MemAvailable: 8388608 kB\n");
    tsr__put("proc/self/statm", "100 0 0 0 0 0 0\n");
    tsr_sys_mem_limit m, a, b, c;
    bool ok = tsr_sys_mem_meminfo(&m);
    tsr_sys_mem_headroom(&a); /* MemAvailable alone (unless ulimit -v is tighter) */
    tsr__put("proc/self/cgroup", "0::/j\n");
    tsr__put("cg/j/memory.max", "268435456\n");
    tsr__put("cg/j/memory.current", "0\n");
    tsr_sys_mem_headroom(&b); /* the cgroup is tighter */
    setenv("SLURM_MEM_PER_NODE", "100", 1);
    tsr_sys_mem_headroom(&c); /* Slurm's 100 MiB is tighter still */
    unsetenv("SLURM_MEM_PER_NODE");
    tsr__done();
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(m.bound, TSR_SYS_MEM_AVAILABLE);
    ASSERT_EQ_INT(m.bytes, 8192 * MIB);
    ASSERT_TRUE(a.bytes <= 8192 * MIB);
    ASSERT_TRUE(a.bound == TSR_SYS_MEM_AVAILABLE || a.bound == TSR_SYS_MEM_RLIMIT_AS);
    ASSERT_EQ_INT(b.bound, TSR_SYS_MEM_CGROUP_V2);
    ASSERT_EQ_INT(b.bytes, 256 * MIB);
    ASSERT_EQ_INT(c.bound, TSR_SYS_MEM_SLURM);
    ASSERT_EQ_INT(c.bytes, 100 * MIB);
}

/* Nothing readable: no bound, -1 bytes (unless this process runs under ulimit -v). */
TSR_TEST(test_nothing_known) {
    struct rlimit rl;
    ASSERT_TRUE(getrlimit(RLIMIT_AS, &rl) == 0);
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr_sys_mem_limit l;
    tsr_sys_mem_headroom(&l);
    tsr__done();
    if (rl.rlim_cur != RLIM_INFINITY) {
        fprintf(stderr, "  (under ulimit -v: only the address-space bound applies)\n");
        ASSERT_EQ_INT(l.bound, TSR_SYS_MEM_RLIMIT_AS);
        return;
    }
    ASSERT_EQ_INT(l.bound, TSR_SYS_MEM_NONE);
    ASSERT_EQ_INT(l.bytes, -1);
    ASSERT_STR_EQ(tsr_sys_mem_bound_name(l.bound), "no known bound");
}

/* ulimit -v less the address space in use (statm's first field). */
TSR_TEST(test_rlimit_as) {
    struct rlimit old;
    ASSERT_TRUE(getrlimit(RLIMIT_AS, &old) == 0);
    /* 64 GiB above what the process maps now (ASan's shadow alone is terabytes), so that
     * nothing fails while the limit is set */
    int64_t vm = tsr_sys_vm_size();
    ASSERT_TRUE(vm > 0);
    rlim_t want = (rlim_t)vm + ((rlim_t)64 << 30);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < want) {
        fprintf(stderr, "  skip: hard RLIMIT_AS too low\n");
        return;
    }
    ASSERT_TRUE(tsr__fresh() == 0);
    tsr__put("proc/self/statm", "1024 10 0 0 0 0 0\n");
    struct rlimit rl = {.rlim_cur = want, .rlim_max = old.rlim_max};
    int set = setrlimit(RLIMIT_AS, &rl);
    tsr_sys_mem_limit l;
    bool ok = tsr_sys_mem_rlimit_as(&l);
    setrlimit(RLIMIT_AS, &old);
    tsr_sys_mem_limit none;
    bool after = tsr_sys_mem_rlimit_as(&none);
    tsr__done();
    ASSERT_EQ_INT(set, 0);
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(l.bound, TSR_SYS_MEM_RLIMIT_AS);
    ASSERT_EQ_INT(l.limit, (int64_t)want);
    ASSERT_EQ_INT(l.used, 1024 * (int64_t)sysconf(_SC_PAGESIZE));
    ASSERT_TRUE(after == (old.rlim_cur != RLIM_INFINITY));
}

TSR_TEST_MAIN(test_cgroup_v2, test_cgroup_v2_ancestor, test_cgroup_v2_max_and_missing,
              test_cgroup_v2_no_usage_file, test_cgroup_v1,
              test_cgroup_v1_unlimited_and_container, test_slurm, test_meminfo_and_least,
              test_nothing_known, test_rlimit_as)
