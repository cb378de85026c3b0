#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_DONTNEED */
#include "base/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "base/status.h"
#include "base/sys.h"

/* A small header before each block records its size, so live bytes can be counted. */
#define TSR__HDR 64

static atomic_size_t tsr__live;

/* The error line of a failed allocation. Under an address-space limit (ulimit -v) it names
 * the limit and what takes the space: the allocation may be small and the culprit a
 * library's mappings. */
static void tsr__nomem(size_t size) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
        tsr_error_set(TSR_ERR_NOMEM, "out of memory allocating %zu bytes", size);
        return;
    }
    char top[256];
    tsr_sys_vm_top(top, sizeof top, 3);
    tsr_error_set(TSR_ERR_NOMEM,
                  "out of memory allocating %zu bytes: the address-space limit (ulimit -v: %.0f "
                  "MiB) has %.0f MiB in use (%s)", size, (double)rl.rlim_cur / 1048576.0,
                  (double)tsr_sys_vm_size() / 1048576.0, top[0] ? top : "users unknown");
}

static void *tsr__wrap(void *raw, size_t size) {
    if (!raw) {
        tsr__nomem(size);
        return NULL;
    }
    *(size_t *)raw = size;
    atomic_fetch_add(&tsr__live, size);
    return (char *)raw + TSR__HDR;
}

void *tsr_malloc(size_t size) {
    if (size > SIZE_MAX - TSR__HDR) return tsr__wrap(NULL, size);
    void *raw = NULL;
    if (posix_memalign(&raw, TSR__HDR, size + TSR__HDR) != 0) raw = NULL;
    return tsr__wrap(raw, size);
}

void *tsr_malloc_aligned(size_t size) { return tsr_malloc(size); }

void *tsr_calloc(size_t count, size_t size) {
    size_t total;
    if (!tsr_mul_size(count, size, &total)) {
        tsr_error_set(TSR_ERR_NOMEM, "allocation size overflow (%zu x %zu)", count, size);
        return NULL;
    }
    void *p = tsr_malloc(total);
    if (p) memset(p, 0, total);
    return p;
}

void *tsr_realloc(void *ptr, size_t size) {
    if (!ptr) return tsr_malloc(size);
    size_t old = *(size_t *)((char *)ptr - TSR__HDR);
    void *p = tsr_malloc(size);
    if (!p) return NULL;
    memcpy(p, ptr, old < size ? old : size);
    tsr_free(ptr);
    return p;
}

void tsr_free(void *ptr) {
    if (!ptr) return;
    char *raw = (char *)ptr - TSR__HDR;
    atomic_fetch_sub(&tsr__live, *(size_t *)raw);
    free(raw);
}

#if defined(__SANITIZE_ADDRESS__)
#define TSR__HUGE_MAP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TSR__HUGE_MAP 0
#endif
#endif
#ifndef TSR__HUGE_MAP
#define TSR__HUGE_MAP 1
#endif
#define TSR__HUGE ((size_t)2 << 20)

void *tsr_malloc_huge(size_t size) {
#if TSR__HUGE_MAP
    if (size < TSR__HUGE) return tsr_malloc_aligned(size); /* no huge page fits: no mapping */
    if (size > SIZE_MAX - 2 * TSR__HUGE) return tsr__wrap(NULL, size);
    size_t len = (size + TSR__HUGE - 1) & ~(TSR__HUGE - 1);
    /* Over-map by one huge page, then trim both ends to a 2 MiB-aligned range. */
    char *raw = mmap(NULL, len + TSR__HUGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return tsr__wrap(NULL, size);
    char *base = (char *)(((uintptr_t)raw + TSR__HUGE - 1) & ~(uintptr_t)(TSR__HUGE - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    size_t tail = (size_t)(raw + len + TSR__HUGE - (base + len));
    if (tail) munmap(base + len, tail);
    /* advice only: fine to fail. The tail past the last whole 2 MiB page of size is kept
     * off huge pages even where THP is "always" (alloc.h). */
    size_t whole = size & ~(TSR__HUGE - 1);
#ifdef MADV_HUGEPAGE
    (void)madvise(base, whole, MADV_HUGEPAGE);
#endif
#ifdef MADV_NOHUGEPAGE
    if (len > whole) (void)madvise(base + whole, len - whole, MADV_NOHUGEPAGE);
#endif
    atomic_fetch_add(&tsr__live, size);
    return base;
#else
    return tsr_malloc_aligned(size);
#endif
}

void tsr_free_huge(void *ptr, size_t size) {
    if (!ptr) return;
#if TSR__HUGE_MAP
    if (size < TSR__HUGE) {
        tsr_free(ptr);
        return;
    }
    atomic_fetch_sub(&tsr__live, size);
    munmap(ptr, (size + TSR__HUGE - 1) & ~(TSR__HUGE - 1));
#else
    (void)size;
    tsr_free(ptr);
#endif
}

char *tsr_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = tsr_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

bool tsr_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

size_t tsr_alloc_live_bytes(void) { return atomic_load(&tsr__live); }

void tsr_pages_drop(const void *p, size_t bytes) {
    if (!p || !bytes) return;
    uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1),
              b = ((uintptr_t)p + bytes) & ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice only */
}
