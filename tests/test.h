/* A tiny test runner: TSR_TEST(name) functions registered in a table, typed asserts that
 * print both sides, and a closing "N passed, N failed" line. */
#ifndef TSR_TESTS_TEST_H
#define TSR_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*tsr_test_fn)(void);

extern int tsr_test_failed_flag;

#define TSR_FAIL_(...)                                                                  \
    do {                                                                                \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                               \
        fprintf(stderr, __VA_ARGS__);                                                   \
        fprintf(stderr, "\n");                                                          \
        tsr_test_failed_flag = 1;                                                       \
        return;                                                                         \
    } while (0)

#define ASSERT_TRUE(c)                                                                  \
    do {                                                                                \
        if (!(c)) TSR_FAIL_("expected true: %s", #c);                                   \
    } while (0)
#define ASSERT_EQ_INT(a, b)                                                             \
    do {                                                                                \
        long long a_ = (long long)(a), b_ = (long long)(b);                             \
        if (a_ != b_) TSR_FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_);              \
    } while (0)
#define ASSERT_NE_INT(a, b)                                                             \
    do {                                                                                \
        long long a_ = (long long)(a), b_ = (long long)(b);                             \
        if (a_ == b_) TSR_FAIL_("%s != %s: both %lld", #a, #b, a_);                     \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                          \
    do {                                                                                \
        double a_ = (double)(a), b_ = (double)(b);                                      \
        if (!(fabs(a_ - b_) <= (tol)))                                                  \
            TSR_FAIL_("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, (double)(tol)); \
    } while (0)
#define ASSERT_STR_EQ(a, b)                                                             \
    do {                                                                                \
        const char *a_ = (a), *b_ = (b);                                                \
        if (strcmp(a_, b_) != 0) TSR_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, a_, b_); \
    } while (0)
#define ASSERT_STR_CONTAINS(hay, needle)                                                \
    do {                                                                                \
        const char *h_ = (hay), *n_ = (needle);                                         \
        if (!strstr(h_, n_)) TSR_FAIL_("\"%s\" does not contain \"%s\"", h_, n_);       \
    } while (0)
/* st is a tsr_status; prints the last error line on failure. */
#define ASSERT_OK(expr)                                                                 \
    do {                                                                                \
        int st_ = (int)(expr);                                                          \
        if (st_ != 0) TSR_FAIL_("%s failed (%d): %s", #expr, st_, tsr_last_error());    \
    } while (0)

typedef struct tsr_test_case {
    const char *name;
    tsr_test_fn fn;
} tsr_test_case;

#define TSR_TEST(name) static void name(void)

/* Each test file ends with:
 *   TSR_TEST_MAIN(test_a, test_b, ...)
 * argv[1], when given, runs only the named test. TSR_SOURCE_DIR is the repo root. */
#define TSR_TEST_MAIN(...)                                                              \
    int tsr_test_failed_flag;                                                           \
    int main(int argc, char **argv) {                                                   \
        tsr_test_fn fns[] = {__VA_ARGS__};                                              \
        const char *names_ = #__VA_ARGS__;                                              \
        int n = (int)(sizeof fns / sizeof fns[0]), passed = 0, failed = 0;              \
        char buf[4096];                                                                 \
        snprintf(buf, sizeof buf, "%s", names_);                                        \
        char *save = NULL, *tok = strtok_r(buf, ", \n\t", &save);                       \
        for (int i = 0; i < n && tok; i++, tok = strtok_r(NULL, ", \n\t", &save)) {     \
            if (argc > 1 && strcmp(argv[1], tok) != 0) continue;                        \
            tsr_test_failed_flag = 0;                                                   \
            fns[i]();                                                                   \
            fprintf(stderr, "%s %s\n", tsr_test_failed_flag ? "FAIL" : "ok  ", tok);    \
            if (tsr_test_failed_flag) failed++; else passed++;                          \
        }                                                                               \
        printf("%d passed, %d failed\n", passed, failed);                               \
        return failed ? 1 : 0;                                                          \
    }

#endif
