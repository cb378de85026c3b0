/* base/membw.c: a pass reads every word of the buffer (its xor reaches the sink,
 * the same for 1 and 2 threads and for a length that is no multiple of the vector loop or
 * of the thread slices) and takes a positive time. */
#include <stdint.h>

#include "base/alloc.h"
#include "base/membw.h"
#include "tests/test.h"

static uint64_t tsr__xor_ref(const uint64_t *p, size_t n) {
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= p[i];
    return x;
}

TSR_TEST(test_membw_pass_reads_all) {
    /* 1 MiB + 3 words: a tail after the 16-word loop and after the slices */
    size_t n = ((size_t)1 << 17) + 3, bytes = n * sizeof(uint64_t);
    uint64_t *buf = tsr_malloc_aligned(bytes);
    ASSERT_TRUE(buf != NULL);
    tsr_membw_fill(buf, bytes, 2);
    ASSERT_TRUE(buf[1] == 0x9e3779b97f4a7c15ull && buf[n - 1] != 0);
    buf[n - 1] ^= 0x5555; /* the last word must count */
    uint64_t want = tsr__xor_ref(buf, n);
    for (int t = 1; t <= 2; t++) {
        volatile uint64_t sink = 0;
        double s = tsr_membw_pass(buf, bytes, t, &sink);
        ASSERT_TRUE(s > 0.0);
        ASSERT_TRUE(sink == want);
    }
    tsr_free(buf);
}

TSR_TEST_MAIN(test_membw_pass_reads_all)
