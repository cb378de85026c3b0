/* Helpers of the backend-op tests (test_backend_ops, test_backend_ops_gptoss,
 * test_flash_attn): a reference backend and the backends under test, and buffers in a
 * backend's memory moved only through upload and download, so that the same test runs on
 * the fenced device (whose memory host code cannot touch) and on CUDA. */
#ifndef TSR_TESTS_BACKEND_TEST_UTIL_H
#define TSR_TESTS_BACKEND_TEST_UTIL_H

#include "kernels/backend.h"

#define MAX_TARGETS 3

typedef struct targets {
    tsr_backend *ref;
    tsr_backend *be[MAX_TARGETS];
    const char *label[MAX_TARGETS];
    int n;
} targets;

static inline void targets_close(targets *t) {
    tsr_backend_destroy(t->ref);
    for (int i = 0; i < t->n; i++) tsr_backend_destroy(t->be[i]);
}

/* Backend b of the set: -1 is the reference. */
static inline tsr_backend *target(const targets *t, int b) {
    return b < 0 ? t->ref : t->be[b];
}

/* Backend memory holding a copy of `bytes` of host data (or uninitialized when src NULL). */
static inline void *be_dup(tsr_backend *be, const void *src, size_t bytes) {
    void *p = NULL;
    if (be->ops->buffer_alloc(be, bytes, &p) != TSR_OK) return NULL;
    if (src && tsr_backend_upload(be, p, src, bytes) != TSR_OK) {
        be->ops->buffer_free(be, p);
        return NULL;
    }
    return p;
}

/* Host copy of backend memory, after the backend's queued work. */
static inline tsr_status be_read(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    TSR_TRY(be->ops->synchronize(be));
    return tsr_backend_download(be, dst, src, bytes);
}

static inline void be_release(tsr_backend *be, const void *p) {
    if (p) be->ops->buffer_free(be, (void *)p);
}

#endif
