#include "runtime/base/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

/* A small header before each block records its size, so live bytes can be counted. */
#define TSR__HDR 64

static atomic_size_t tsr__live;

static void *tsr__wrap(void *raw, size_t size) {
    if (!raw) {
        tsr_error_set(TSR_ERR_NOMEM, "out of memory allocating %zu bytes", size);
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
