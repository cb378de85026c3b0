/* base/alloc.c: tsr_malloc_huge gives 2 MiB-aligned mappings from 2 MiB on and plain
 * aligned memory below (no huge page fits there), both writable, counted in the live bytes
 * and returned by tsr_free_huge with the same size. */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
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

TSR_TEST_MAIN(test_malloc_huge_sizes)
