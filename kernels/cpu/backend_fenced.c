/* The fenced CPU device: placeholder until the arena is written (returns UNSUPPORTED). */
#include "kernels/backend.h"

tsr_status tsr_backend_fenced_create(int threads, size_t arena_bytes, tsr_backend **out) {
    (void)threads;
    (void)arena_bytes;
    *out = NULL;
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "backend 'cpu-fenced': not built yet");
}
