/* The CPU backend's memory calls: backend memory is host memory, so every copy is a memcpy
 * and every stream is the caller's thread (a copy is complete when its call returns, so an
 * event is always reached). The fenced device (backend_fenced.c) runs these same calls
 * inside its unfenced window. */
#include <string.h>

#include "base/alloc.h"
#include "base/sys.h"
#include "kernels/cpu/cpu_internal.h"

/* Streams and events carry nothing on the CPU; one static object each stands for all. */
struct tsr_stream {
    int unused;
};
struct tsr_event {
    int unused;
};
static tsr_stream tsr__cpu_stream;
static tsr_event tsr__cpu_event;

tsr_status tsr__cpu_host_alloc(tsr_backend *be, size_t bytes, bool pinned, void **out) {
    (void)be;
    (void)pinned; /* host memory is what the CPU computes on: nothing to pin */
    *out = tsr_malloc_aligned(bytes ? bytes : 1);
    if (!*out)
        return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of host "
                             "staging memory", bytes);
    return TSR_OK;
}

void tsr__cpu_host_free(tsr_backend *be, void *ptr) {
    (void)be;
    tsr_free(ptr);
}

tsr_status tsr__cpu_memory(tsr_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    int64_t avail = tsr_sys_mem_available();
    int64_t total = tsr_sys_mem_total();
    if (avail < 0 || total < 0)
        return tsr_error_set(TSR_ERR_IO, "cpu backend: cannot read the host's memory size "
                             "(/proc/meminfo)");
    *free_bytes = (size_t)avail;
    *total_bytes = (size_t)total;
    return TSR_OK;
}

tsr_status tsr__cpu_upload(tsr_backend *be, void *dst, const void *src, size_t bytes,
                           tsr_stream *stream) {
    (void)be;
    (void)stream;
    if (bytes) memcpy(dst, src, bytes);
    return TSR_OK;
}

tsr_status tsr__cpu_copy(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return TSR_OK;
}

tsr_status tsr__cpu_memset(tsr_backend *be, void *dst, int byte, size_t bytes) {
    (void)be;
    if (bytes) memset(dst, byte, bytes);
    return TSR_OK;
}

tsr_status tsr__cpu_stream_create(tsr_backend *be, tsr_stream **out) {
    (void)be;
    *out = &tsr__cpu_stream;
    return TSR_OK;
}

void tsr__cpu_stream_destroy(tsr_backend *be, tsr_stream *stream) {
    (void)be;
    (void)stream;
}

tsr_status tsr__cpu_event_create(tsr_backend *be, tsr_event **out) {
    (void)be;
    *out = &tsr__cpu_event;
    return TSR_OK;
}

void tsr__cpu_event_destroy(tsr_backend *be, tsr_event *ev) {
    (void)be;
    (void)ev;
}

tsr_status tsr__cpu_event_record(tsr_backend *be, tsr_event *ev, tsr_stream *stream) {
    (void)be;
    (void)ev;
    (void)stream;
    return TSR_OK;
}

tsr_status tsr__cpu_stream_wait(tsr_backend *be, tsr_stream *stream, tsr_event *ev) {
    (void)be;
    (void)stream;
    (void)ev;
    return TSR_OK;
}

tsr_status tsr__cpu_event_sync(tsr_backend *be, tsr_event *ev) {
    (void)be;
    (void)ev;
    return TSR_OK;
}

/* KV rows in the layout's dtype: f32 rows in, f32 rows out (kernels/kv_dtype.h). */
tsr_status tsr__cpu_kv_write(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                             int64_t n, const float *k, const float *v) {
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        tsr_kv_rows_encode(lay->dtype, k + i * lay->row, lay->row,
                           tsr_kv_layout_row(lay, 0, slots[i]), 1, lay->row);
        tsr_kv_rows_encode(lay->dtype, v + i * lay->row, lay->row,
                           tsr_kv_layout_row(lay, 1, slots[i]), 1, lay->row);
    }
    return TSR_OK;
}

tsr_status tsr__cpu_kv_copy(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *dst,
                            const int32_t *src, int64_t n) {
    (void)be;
    size_t rb = tsr_kv_row_bytes(lay->dtype, lay->row);
    for (int64_t i = 0; i < n; i++) {
        if (dst[i] == src[i]) continue;
        memcpy(tsr_kv_layout_row(lay, 0, dst[i]), tsr_kv_layout_row(lay, 0, src[i]), rb);
        memcpy(tsr_kv_layout_row(lay, 1, dst[i]), tsr_kv_layout_row(lay, 1, src[i]), rb);
    }
    return TSR_OK;
}

tsr_status tsr__cpu_kv_gather(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                              int64_t n, float *k, float *v, tsr_stream *stream) {
    (void)be;
    (void)stream;
    for (int64_t i = 0; i < n; i++) {
        if (k)
            tsr_kv_rows_decode(lay->dtype, tsr_kv_layout_row(lay, 0, slots[i]),
                               k + i * lay->row, lay->row, 1, lay->row);
        if (v)
            tsr_kv_rows_decode(lay->dtype, tsr_kv_layout_row(lay, 1, slots[i]),
                               v + i * lay->row, lay->row, 1, lay->row);
    }
    return TSR_OK;
}

tsr_status tsr__cpu_kv_scatter(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                               int64_t n, const float *k, const float *v, tsr_stream *stream) {
    (void)stream;
    return tsr__cpu_kv_write(be, lay, slots, n, k, v);
}
