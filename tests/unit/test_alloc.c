/* base/alloc.c: tsr_malloc_huge gives 2 MiB-aligned mappings from 2 MiB on and plain
 * aligned memory below (no huge page fits there), both writable, counted in the live bytes
 * and returned by tsr_free_huge with the same size; the part past the last whole 2 MiB page
 * is not a huge page. Under an address-space limit a failed
 * allocation's line names the limit and what takes the space. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/status.h"
#include "base/sys.h"
#include "tests/test.h"

TSR_TEST(test_malloc_huge_sizes) {
    static const size_t sizes[] = {1, 4096, ((size_t)2 << 20) - 64, (size_t)2 << 20,
                                   ((size_t)5 << 20) + 123};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i], live = tsr_alloc_live_bytes();
        unsigned char *p = tsr_malloc_huge(n);
        ASSERT_TRUE(p != NULL);
        ASSERT_TRUE((uintptr_t)p % 64 == 0);
        ASSERT_TRUE(tsr_alloc_live_bytes() >= live + n);
        memset(p, 0xa5, n); /* every byte writable */
        ASSERT_TRUE(p[0] == 0xa5 && p[n - 1] == 0xa5);
        tsr_free_huge(p, n);
        ASSERT_TRUE(tsr_alloc_live_bytes() == live);
    }
    tsr_free_huge(NULL, 123); /* a no-op, like free(NULL) */
}

/* A buffer a little over 2 MiB, written whole: its whole 2 MiB page may be huge, the rest
 * is 4 KiB pages (a huge page there would make 2 MiB resident for 8 KiB). */
TSR_TEST(test_malloc_huge_tail) {
    size_t n = ((size_t)2 << 20) + 8192;
    int64_t before = tsr_sys_rss();
    unsigned char *p = tsr_malloc_huge(n);
    ASSERT_TRUE(p != NULL);
    memset(p, 0x3c, n);
    int64_t after = tsr_sys_rss();
    if (before > 0 && after > 0) {
        printf("  2 MiB + 8 KiB written: RSS +%lld KiB\n", (long long)(after - before) / 1024);
        ASSERT_TRUE(after - before < (int64_t)(n + ((size_t)512 << 10)));
    }
    tsr_free_huge(p, n);
}

/* In a child (the limit stays there): 1 GiB under a limit of the space in use + 256 MiB. */
TSR_TEST(test_nomem_names_the_space) {
#if defined(__SANITIZE_ADDRESS__)
    return; /* ASan's allocator reserves its own space and ends the process instead */
#endif
    char top[256];
    tsr_sys_vm_top(top, sizeof top, 3);
    ASSERT_STR_CONTAINS(top, " MiB");
    int fds[2];
    ASSERT_EQ_INT(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        int64_t used = tsr_sys_vm_size();
        struct rlimit rl = {(rlim_t)used + (256u << 20), (rlim_t)used + (256u << 20)};
        if (used <= 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
        void *p = tsr_malloc((size_t)1 << 30);
        const char *msg = p ? "allocated" : tsr_last_error();
        ssize_t w = write(fds[1], msg, strlen(msg));
        _exit(w > 0 ? 0 : 3);
    }
    close(fds[1]);
    char msg[1024] = "";
    ssize_t n = read(fds[0], msg, sizeof msg - 1);
    close(fds[0]);
    int wst = 0;
    waitpid(pid, &wst, 0);
    ASSERT_TRUE(n > 0);
    msg[n > 0 ? n : 0] = '\0';
    ASSERT_STR_CONTAINS(msg, "out of memory allocating 1073741824 bytes: the address-space "
                             "limit (ulimit -v: ");
    ASSERT_STR_CONTAINS(msg, " MiB in use (");
}

TSR_TEST_MAIN(test_malloc_huge_sizes, test_malloc_huge_tail, test_nomem_names_the_space)
