/* Checked allocation. Sizes are multiplied with overflow checks; failures record an error
 * line and return NULL, so callers turn them into TSR_ERR_NOMEM. */
#ifndef TSR_BASE_ALLOC_H
#define TSR_BASE_ALLOC_H

#include <stddef.h>
#include <stdbool.h>

void *tsr_malloc(size_t size);
void *tsr_calloc(size_t count, size_t size);
void *tsr_realloc(void *ptr, size_t size);
/* 64-byte aligned (SIMD loads, cache lines); free with tsr_free. */
void *tsr_malloc_aligned(size_t size);
void tsr_free(void *ptr);
char *tsr_strdup(const char *s);

/* Large, long-lived buffers that decode streams every token (weights, KV caches): an
 * anonymous mapping aligned to 2 MiB and advised MADV_HUGEPAGE before its first
 * touch, so transparent huge pages back it (THP "madvise" mode, a common default): fewer
 * TLB misses and page walks on every pass. Pages are still touched lazily. Only the
 * buffer's whole 2 MiB pages are huge: the rest of its last one is advised MADV_NOHUGEPAGE
 * (4 KiB pages), since a huge-page fault there would make up to 2 MiB resident for a few
 * bytes of buffer (peak RSS). Elsewhere (THP off) it is ordinary memory, and so is a buffer
 * under 2 MiB (no huge page fits it).
 * Sanitizer builds use tsr_malloc_aligned, to keep the checks.
 * Free with tsr_free_huge and the same size. Counted in tsr_alloc_live_bytes. */
void *tsr_malloc_huge(size_t size);
void tsr_free_huge(void *ptr, size_t size);

/* Gives the pages wholly inside [p, p + bytes) back to the kernel (MADV_DONTNEED; advice
 * only): a matrix copied or converted elsewhere is then not resident twice (peak RSS).
 * Pages of a private file mapping come back from the file if touched, anonymous ones as
 * zeros, so the range must not be read again unless it is a file's. */
void tsr_pages_drop(const void *p, size_t bytes);

/* a*b into *out; false on overflow. */
bool tsr_mul_size(size_t a, size_t b, size_t *out);

/* Bytes currently held through tsr_malloc* (for tests and --stats). */
size_t tsr_alloc_live_bytes(void);

#endif
