/* CUDA backend, host side: device and stream setup, the memory contract of kernels/backend.h
 * (device buffers, pinned host staging, copies, copy streams and events, KV rows by slot),
 * cuBLAS GEMMs, staging of host metadata (positions, ids, slot lists) to the device, and
 * the vtable. Kernels live in ops.cu, attn.cu and kv.cu (launch.h). One device per backend;
 * the calling thread's current device is set at create.
 *
 * Pointer contract: the one of kernels/backend.h. Backend memory (device memory from
 * buffer_alloc) holds activations, placed weights, K/V rows, key scores and outputs; host
 * metadata (the attention args and spans, span and query positions, rope positions, embed
 * ids, slot lists, the model config) is staged to the device, and the caller may reuse it
 * as soon as a call returns. Ops, copy and memset are queued on the compute stream;
 * upload/download/kv_gather/kv_scatter with stream NULL wait for their bytes. Everything
 * else about this backend goes through its vtable and the module's table (module.c): the
 * runtime reaches it only through the registry (kernels/backend.h). */
#include "kernels/backend.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attn.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant_gemm.h"
#include "kernels/rope_freq.h"
#include "base/alloc.h"
#include "base/log.h"

/* A device scratch buffer that grows. Each one is used on one stream only, so stream order
 * makes its reuse across calls safe. */
typedef struct tsr__cuda_scratch {
    void *ptr;
    size_t cap;
} tsr__cuda_scratch;

/* A host buffer that grows (pageable: plain malloc). */
typedef struct tsr__host_buf {
    void *ptr;
    size_t cap;
} tsr__host_buf;

/* What tsr_stream points at on this backend: a non-blocking CUDA stream with its own
 * staging scratch for the KV row copies queued on it (the compute stream's scratch cannot
 * serve another stream: the two run concurrently). */
typedef struct tsr__cuda_stream {
    cudaStream_t s;
    tsr__cuda_scratch slots;
    tsr__cuda_scratch rows;
} tsr__cuda_stream;

#define TSR__CUDA_GRAPHS 8

typedef struct tsr__cuda_ctx {
    int device;
    char name[256];
    cudaStream_t stream; /* the compute stream: every op, and the copies with stream NULL */
    cublasHandle_t blas;
    tsr__cuda_quant *quant;   /* FP8 and Q8_0 weights (quant_gemm.h) */
    tsr__cuda_scratch xconv;  /* x converted to the weight dtype for BF16/F16 GEMMs */
    tsr__cuda_scratch part;   /* matmul_parts sum mode: the part being added */
    tsr__cuda_scratch accsum; /* matmul_parts_acc with uneven segments: the sum */
    tsr__cuda_scratch ints;   /* host integer arrays (ids, positions) staged to the device */
    tsr__cuda_scratch spans;  /* tsr__cuda_span array of the current attention call */
    tsr__cuda_scratch kpos;   /* the host span positions of the current attention call */
    tsr__cuda_scratch slots;  /* slot list of a KV op on the compute stream (kv_copy: dst) */
    tsr__cuda_scratch slots2; /* kv_copy's src list */
    tsr__cuda_scratch rows;   /* host K/V rows of kv_gather / kv_scatter on the compute stream */
    tsr__cuda_scratch attn;   /* split-K attention partials (tsr__cuda_attention_work) */
    tsr__cuda_scratch fa;     /* flash prefill packing / split-K decode partials (flash_attn.h) */
    /* The tensor-core kernels (flash_attn.h) serve attention: sm_80 or newer and not
     * TSR_CUDA_ATTN=reference (which keeps attn.cu and attn_paged.cu, to compare). */
    bool attn_flash;
    tsr__cuda_scratch spar;   /* sample: the rows' parameters */
    tsr__cuda_scratch sids;   /* sample: the drawn ids */
    tsr__cuda_scratch swork;  /* sample: sort keys and cub's storage (tsr__cuda_sample_work) */
    tsr__host_buf spar_host;  /* sample: the parameters converted for the kernels */
    tsr__cuda_scratch moe_meta; /* moe: the routing arrays (tsr__cuda_moe) */
    tsr__cuda_scratch moe_work; /* moe: gathered inputs, gate/up, activations, outputs */
    tsr__host_buf moe_host;     /* moe: the routing arrays built on the host */
    int sm_count;             /* multiprocessors: sizes the split-K chunks */
    tsr__cuda_span *host_spans;
    int64_t *span_pos_off; /* per span: offset of its positions in kpos_host, or -1 */
    int host_spans_cap;
    tsr__host_buf kpos_host; /* span positions gathered on the host for one copy */
    tsr__host_buf bounce;    /* pageable copy of pinned host metadata (tsr__stage) */
    int *bad_id; /* device flag set by the embed kernel */
    /* An embed of device ids (the step's metadata) ran since the last synchronize: its
     * flag is read there, not with a wait inside the step (the forward pass checked the
     * ids on the host before uploading them). */
    bool bad_id_pending;
    /* Step graphs (graph_begin/graph_end), a few keys round robin: a key's first step runs
     * plainly (its scratch buffers settle), the second is captured and launched, later
     * ones replay. TSR_CUDA_GRAPHS=0 turns them off (every step runs plainly). */
    struct {
        uint64_t key;
        int seen; /* 0: free */
        cudaGraphExec_t exec;
    } graphs[TSR__CUDA_GRAPHS];
    int graph_next;
    int capturing; /* the slot being captured, or -1 */
    bool graphs_off;
    /* TSR_CUDA_GEMV=1: a BF16 matmul of one row runs the GEMV kernel (ops.cu) instead of
     * cuBLAS; off until the device check's backend-ops bench says it is faster. */
    bool gemv;
    /* rmsnorm_matmul / swiglu_matmul_acc: xconv already holds the GEMM's BF16 input (the
     * first step wrote it), so the GEMM inside the same call converts nothing. */
    bool xconv_ready;
    /* rope: inverse frequencies of the last config seen, on the device */
    float *inv_freq;
    float *inv_freq_host;
    int inv_hd;
    float inv_key[8];
    int inv_scaling;
    int inv_orig;
} tsr__cuda_ctx;

static tsr__cuda_ctx *tsr__ctx(tsr_backend *be) {
    return (tsr__cuda_ctx *)be->ctx;
}

static tsr_status tsr__scratch_reserve(tsr__cuda_scratch *s, size_t bytes, cudaStream_t st) {
    if (bytes <= s->cap) return TSR_OK;
    if (s->ptr) {
        /* queued kernels may still read the old buffer */
        TSR_CUDA_TRY(cudaStreamSynchronize(st));
        (void)cudaFree(s->ptr);
        s->ptr = NULL;
        s->cap = 0;
    }
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
    TSR_CUDA_TRY(cudaMalloc(&s->ptr, cap));
    s->cap = cap;
    return TSR_OK;
}

static void tsr__scratch_release(tsr__cuda_scratch *s) {
    if (s->ptr) (void)cudaFree(s->ptr);
    s->ptr = NULL;
    s->cap = 0;
}

static tsr_status tsr__host_reserve(tsr__host_buf *b, size_t bytes) {
    if (bytes <= b->cap) return TSR_OK;
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
    void *p = tsr_realloc(b->ptr, cap);
    if (!p)
        return tsr_error_set(TSR_ERR_NOMEM, "cuda: cannot grow a host staging buffer to %zu "
                             "bytes", cap);
    b->ptr = p;
    b->cap = cap;
    return TSR_OK;
}

/* Where a pointer handed to the backend lives, as far as staging cares. */
typedef enum tsr__ptr_kind {
    TSR__PTR_PAGEABLE = 0, /* plain host memory (or unknown to CUDA) */
    TSR__PTR_PINNED = 1,   /* page-locked host memory (cudaHostAlloc, cudaHostRegister) */
    TSR__PTR_DEVICE = 2,   /* device or managed memory: kernels read it in stream order */
} tsr__ptr_kind;

static tsr__ptr_kind tsr__ptr_kind_of(const void *p) {
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* older runtimes fail on pageable memory */
        return TSR__PTR_PAGEABLE;
    }
    switch (at.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged: return TSR__PTR_DEVICE;
    case cudaMemoryTypeHost: return TSR__PTR_PINNED;
    default: return TSR__PTR_PAGEABLE;
    }
}

/* A device pointer holding `bytes` of the host array p (metadata: slot lists, positions,
 * ids), queued on `st` through the device scratch `dev`; valid for work queued on `st`
 * after this call, until the next staging through `dev`. The caller may reuse p as soon as
 * this returns, as on the CPU backend:
 * - pageable p: cudaMemcpyAsync from pageable memory returns once the bytes are in the
 *   driver's staging memory (CUDA's documented API synchronization behaviour);
 * - pinned p: that copy would read p later, so the bytes go through the pageable bounce
 *   buffer first (a memcpy of a few KiB), which brings us back to the first case;
 * - device p (not in the contract, which says host; the older callers and tests pass
 *   device arrays): used as is, in stream order. */
static tsr_status tsr__stage(tsr__cuda_ctx *c, tsr__cuda_scratch *dev, const void *p,
                             size_t bytes, cudaStream_t st, const void **out) {
    *out = NULL;
    if (!bytes) return TSR_OK;
    tsr__ptr_kind kind = tsr__ptr_kind_of(p);
    if (kind == TSR__PTR_DEVICE) {
        *out = p;
        return TSR_OK;
    }
    const void *src = p;
    if (kind == TSR__PTR_PINNED) {
        TSR_TRY(tsr__host_reserve(&c->bounce, bytes));
        memcpy(c->bounce.ptr, p, bytes);
        src = c->bounce.ptr;
    }
    TSR_TRY(tsr__scratch_reserve(dev, bytes, st));
    TSR_CUDA_TRY(cudaMemcpyAsync(dev->ptr, src, bytes, cudaMemcpyHostToDevice, st));
    *out = dev->ptr;
    return TSR_OK;
}

/* The compute stream's int32 staging (ids, rope positions, query positions). *staged:
 * whether p was host memory (copied) rather than device memory (used in place). */
static tsr_status tsr__stage_i32(tsr__cuda_ctx *c, const int32_t *p, int64_t n, const int32_t **out,
                                 bool *staged) {
    const void *d = NULL;
    TSR_TRY(tsr__stage(c, &c->ints, p, (size_t)n * sizeof(int32_t), c->stream, &d));
    *staged = d != (const void *)p;
    *out = d;
    return TSR_OK;
}

/* ---- buffers and sync ---- */

static tsr_status tsr__cuda_buffer_alloc(tsr_backend *be, size_t bytes, void **out) {
    (void)be;
    *out = NULL;
    cudaError_t ce = cudaMalloc(out, bytes ? bytes : 1);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return tsr_error_set(TSR_ERR_NOMEM, "cuda: cudaMalloc of %zu bytes: %s", bytes,
                             cudaGetErrorString(ce));
    }
    return TSR_OK;
}

static void tsr__cuda_buffer_free(tsr_backend *be, void *ptr) {
    (void)be;
    if (ptr) (void)cudaFree(ptr);
}

static tsr_status tsr__cuda_synchronize(tsr_backend *be) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
    if (c->bad_id_pending) {
        int bad = 0;
        c->bad_id_pending = false;
        TSR_CUDA_TRY(
            cudaMemcpyAsync(&bad, c->bad_id, sizeof bad, cudaMemcpyDeviceToHost, c->stream));
        TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
        if (bad) {
            TSR_CUDA_TRY(cudaMemsetAsync(c->bad_id, 0, sizeof(int), c->stream));
            return tsr_error_set(TSR_ERR_INVALID, "embed: a token id was out of range");
        }
    }
    return TSR_OK;
}

/* ---- host staging memory ---- */

/* host_free must know whether a buffer was page-locked (cudaFreeHost) or not (free), and a
 * plain buffer may have been cudaHostRegister'ed since, so the pointer's CUDA attributes
 * cannot tell. A small header in front of the caller's bytes records it; 64 bytes keep the
 * caller's pointer 64-byte aligned (pinned memory is page-aligned, tsr_malloc_aligned
 * 64-aligned). */
#define TSR__HOST_HDR 64
#define TSR__HOST_MAGIC 0x74737248u /* "tsrH" */

typedef struct tsr__host_hdr {
    uint32_t magic;
    uint32_t pinned;
} tsr__host_hdr;

static tsr_status tsr__cuda_host_alloc(tsr_backend *be, size_t bytes, bool pinned, void **out) {
    (void)be;
    *out = NULL;
    if (bytes > SIZE_MAX - TSR__HOST_HDR)
        return tsr_error_set(TSR_ERR_NOMEM, "cuda: host buffer of %zu bytes is too large", bytes);
    size_t total = bytes + TSR__HOST_HDR;
    void *base = NULL;
    if (pinned) {
        /* portable: page-locked for every device of the process, not just this one */
        cudaError_t ce = cudaHostAlloc(&base, total, cudaHostAllocPortable);
        if (ce != cudaSuccess) {
            (void)cudaGetLastError();
            return tsr_error_set(TSR_ERR_NOMEM, "cuda: cudaHostAlloc of %zu bytes: %s", bytes,
                                 cudaGetErrorString(ce));
        }
    } else {
        base = tsr_malloc_aligned(total);
        if (!base)
            return tsr_error_set(TSR_ERR_NOMEM, "cuda: cannot allocate %zu bytes of host "
                                 "staging memory", bytes);
    }
    tsr__host_hdr *h = base;
    h->magic = TSR__HOST_MAGIC;
    h->pinned = pinned ? 1u : 0u;
    *out = (char *)base + TSR__HOST_HDR;
    return TSR_OK;
}

static void tsr__cuda_host_free(tsr_backend *be, void *ptr) {
    (void)be;
    if (!ptr) return;
    tsr__host_hdr *h = (tsr__host_hdr *)(void *)((char *)ptr - TSR__HOST_HDR);
    /* Not from host_alloc: freeing it would corrupt the heap; leaking it is the lesser
     * harm, and free has no way to report. (Clearing the magic below also makes a second
     * free of a still-mapped buffer a no-op, but nothing can catch every double free.) */
    if (h->magic != TSR__HOST_MAGIC) return;
    h->magic = 0;
    if (h->pinned) {
        if (cudaFreeHost(h) != cudaSuccess) (void)cudaGetLastError();
    } else {
        tsr_free(h);
    }
}

/* The device's free and total memory (the current device: the one set at create). */
static tsr_status tsr__cuda_memory(tsr_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    size_t fb = 0, tb = 0;
    TSR_CUDA_TRY(cudaMemGetInfo(&fb, &tb));
    *free_bytes = fb;
    *total_bytes = tb;
    return TSR_OK;
}

/* ---- copies, streams and events ---- */

/* tsr_stream is a tsr__cuda_stream; NULL selects the compute stream. */
static cudaStream_t tsr__queue(tsr__cuda_ctx *c, tsr_stream *stream) {
    return stream ? ((tsr__cuda_stream *)(void *)stream)->s : c->stream;
}

/* One host<->device copy: queued on `stream`, or with stream NULL queued on the compute
 * stream (after every op queued before it) and waited for, so the bytes are in place when
 * it returns. */
static tsr_status tsr__cuda_transfer(tsr_backend *be, void *dst, const void *src, size_t bytes,
                                     enum cudaMemcpyKind kind, tsr_stream *stream) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (!bytes) return TSR_OK;
    cudaStream_t st = tsr__queue(c, stream);
    TSR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, st));
    if (!stream) TSR_CUDA_TRY(cudaStreamSynchronize(st));
    return TSR_OK;
}

static tsr_status tsr__cuda_upload(tsr_backend *be, void *dst, const void *src, size_t bytes,
                                   tsr_stream *stream) {
    return tsr__cuda_transfer(be, dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

static tsr_status tsr__cuda_download(tsr_backend *be, void *dst, const void *src, size_t bytes,
                                     tsr_stream *stream) {
    return tsr__cuda_transfer(be, dst, src, bytes, cudaMemcpyDeviceToHost, stream);
}

/* Within device memory, queued on the compute stream like an op and not waited for: every
 * later op, and every synchronous download or event recorded on the compute stream, comes
 * after it, so no caller can see the bytes before they are in place, and the forward's row
 * copies do not stall the GPU. */
static tsr_status tsr__cuda_copy(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return TSR_OK;
    TSR_CUDA_TRY(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tsr__ctx(be)->stream));
    return TSR_OK;
}

/* Queued on the compute stream, like copy. */
static tsr_status tsr__cuda_memset(tsr_backend *be, void *dst, int byte, size_t bytes) {
    if (!bytes) return TSR_OK;
    TSR_CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, tsr__ctx(be)->stream));
    return TSR_OK;
}

/* Non-blocking, like the compute stream: no implicit ordering against the legacy default
 * stream, so only events order the copy streams against the compute stream. */
static tsr_status tsr__cuda_stream_create(tsr_backend *be, tsr_stream **out) {
    (void)be;
    *out = NULL;
    tsr__cuda_stream *s = tsr_calloc(1, sizeof *s);
    if (!s) return tsr_error_set(TSR_ERR_NOMEM, "cuda: cannot allocate a stream");
    cudaError_t ce = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        tsr_free(s);
        return tsr_error_set(TSR_ERR_CUDA, "cuda: cudaStreamCreateWithFlags: %s (%s)",
                             cudaGetErrorString(ce), cudaGetErrorName(ce));
    }
    *out = (tsr_stream *)(void *)s;
    return TSR_OK;
}

static void tsr__cuda_stream_destroy(tsr_backend *be, tsr_stream *stream) {
    (void)be;
    if (!stream) return;
    tsr__cuda_stream *s = (tsr__cuda_stream *)(void *)stream;
    /* its queued copies may still use the scratch: let them finish before freeing it */
    if (cudaStreamSynchronize(s->s) != cudaSuccess) (void)cudaGetLastError();
    tsr__scratch_release(&s->slots);
    tsr__scratch_release(&s->rows);
    if (cudaStreamDestroy(s->s) != cudaSuccess) (void)cudaGetLastError();
    tsr_free(s);
}

/* tsr_event is the cudaEvent_t itself. Timing off: these events only order work, and
 * timing-enabled events make cudaStreamWaitEvent and cudaEventSynchronize slower. */
static tsr_status tsr__cuda_event_create(tsr_backend *be, tsr_event **out) {
    (void)be;
    *out = NULL;
    cudaEvent_t ev = NULL;
    TSR_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = (tsr_event *)(void *)ev;
    return TSR_OK;
}

static void tsr__cuda_event_destroy(tsr_backend *be, tsr_event *ev) {
    (void)be;
    if (ev && cudaEventDestroy((cudaEvent_t)(void *)ev) != cudaSuccess) (void)cudaGetLastError();
}

static tsr_status tsr__cuda_event_record(tsr_backend *be, tsr_event *ev, tsr_stream *stream) {
    if (!ev) return tsr_error_set(TSR_ERR_INVALID, "cuda: event_record of a NULL event");
    TSR_CUDA_TRY(cudaEventRecord((cudaEvent_t)(void *)ev, tsr__queue(tsr__ctx(be), stream)));
    return TSR_OK;
}

static tsr_status tsr__cuda_stream_wait(tsr_backend *be, tsr_stream *stream, tsr_event *ev) {
    if (!ev) return tsr_error_set(TSR_ERR_INVALID, "cuda: stream_wait on a NULL event");
    TSR_CUDA_TRY(
        cudaStreamWaitEvent(tsr__queue(tsr__ctx(be), stream), (cudaEvent_t)(void *)ev, 0));
    return TSR_OK;
}

static tsr_status tsr__cuda_event_sync(tsr_backend *be, tsr_event *ev) {
    (void)be;
    if (!ev) return tsr_error_set(TSR_ERR_INVALID, "cuda: event_sync on a NULL event");
    TSR_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)(void *)ev));
    return TSR_OK;
}

/* A timing event (offload's hidden-fraction measurement): the same cudaEvent_t, with
 * timing on. */
static tsr_status tsr__cuda_event_create_timed(tsr_backend *be, tsr_event **out) {
    (void)be;
    *out = NULL;
    cudaEvent_t ev = NULL;
    TSR_CUDA_TRY(cudaEventCreate(&ev));
    *out = (tsr_event *)(void *)ev;
    return TSR_OK;
}

static tsr_status tsr__cuda_event_elapsed(tsr_backend *be, tsr_event *start, tsr_event *end,
                                          float *ms) {
    (void)be;
    if (!start || !end)
        return tsr_error_set(TSR_ERR_INVALID, "cuda: event_elapsed of a NULL event");
    TSR_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)(void *)start, (cudaEvent_t)(void *)end));
    return TSR_OK;
}

/* Portable registration: the pinning holds for every device, so the host pool may be
 * shared by the backends of one process. */
static tsr_status tsr__cuda_host_register(tsr_backend *be, void *ptr, size_t bytes) {
    (void)be;
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tsr_error_set(TSR_ERR_CUDA, "cuda: cudaHostRegister(%zu bytes): %s (%s)", bytes,
                             cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return TSR_OK;
}

static void tsr__cuda_host_unregister(tsr_backend *be, void *ptr) {
    (void)be;
    /* Nothing to report at free time: an unregistered pointer is harmless to free. */
    if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static void *tsr__cuda_stream_handle(tsr_backend *be) {
    return (void *)tsr__ctx(be)->stream;
}

static const char *tsr__cuda_device_name(tsr_backend *be) {
    return tsr__ctx(be)->name;
}

/* ---- KV rows by slot (kv.cu) ---- */

static tsr_status tsr__kv_check(const char *op, const tsr_kv_layout *lay, int64_t n) {
    if (n < 0 || lay->block <= 0 || lay->row < 0 || lay->block_stride < 0)
        return tsr_error_set(TSR_ERR_INVALID, "cuda %s: bad layout or count (n=%lld, block %d, "
                             "row %d, block_stride %lld)", op, (long long)n, (int)lay->block,
                             (int)lay->row, (long long)lay->block_stride);
    return TSR_OK;
}

static tsr__cuda_kv tsr__kv_of(const tsr_kv_layout *lay) {
    return (tsr__cuda_kv){.k = lay->k,
                          .v = lay->v,
                          .block_stride = lay->block_stride,
                          .block = lay->block,
                          .row = lay->row,
                          .dtype = lay->dtype};
}

/* An op like the others: queued on the compute stream (k and v are device rows). */
static tsr_status tsr__cuda_kv_write(tsr_backend *be, const tsr_kv_layout *lay,
                                     const int32_t *slots, int64_t n, const float *k,
                                     const float *v) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    TSR_TRY(tsr__kv_check("kv_write", lay, n));
    if (n == 0 || lay->row == 0) return TSR_OK;
    const void *ds = NULL;
    TSR_TRY(tsr__stage(c, &c->slots, slots, (size_t)n * sizeof(int32_t), c->stream, &ds));
    tsr__cuda_kv l = tsr__kv_of(lay);
    TSR_CUDA_TRY(tsr__cuda_launch_kv_put(&l, ds, n, k, v, c->stream));
    return TSR_OK;
}

/* Queued on the compute stream; the pairs apply in list order (kv.cu, one block). */
static tsr_status tsr__cuda_kv_copy(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *dst,
                                    const int32_t *src, int64_t n) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    TSR_TRY(tsr__kv_check("kv_copy", lay, n));
    if (n == 0 || lay->row == 0) return TSR_OK;
    const void *dd = NULL, *dsrc = NULL;
    size_t bytes = (size_t)n * sizeof(int32_t);
    TSR_TRY(tsr__stage(c, &c->slots, dst, bytes, c->stream, &dd));
    TSR_TRY(tsr__stage(c, &c->slots2, src, bytes, c->stream, &dsrc));
    tsr__cuda_kv l = tsr__kv_of(lay);
    TSR_CUDA_TRY(tsr__cuda_launch_kv_copy(&l, dd, dsrc, n, c->stream));
    return TSR_OK;
}

/* Where a KV row transfer runs: the compute stream and its scratch (stream NULL), or a copy
 * stream and that stream's own scratch. */
typedef struct tsr__kv_queue {
    cudaStream_t st;
    tsr__cuda_scratch *slots;
    tsr__cuda_scratch *rows;
} tsr__kv_queue;

static tsr__kv_queue tsr__kv_queue_of(tsr__cuda_ctx *c, tsr_stream *stream) {
    if (!stream) return (tsr__kv_queue){.st = c->stream, .slots = &c->slots, .rows = &c->rows};
    tsr__cuda_stream *s = (tsr__cuda_stream *)(void *)stream;
    return (tsr__kv_queue){.st = s->s, .slots = &s->slots, .rows = &s->rows};
}

/* Slots -> host rows: the kernel gathers the rows into device scratch ([n][row] for K,
 * then for V), one copy per half brings them to the host. stream NULL: waited for. */
static tsr_status tsr__cuda_kv_gather(tsr_backend *be, const tsr_kv_layout *lay,
                                      const int32_t *slots, int64_t n, float *k, float *v,
                                      tsr_stream *stream) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    TSR_TRY(tsr__kv_check("kv_gather", lay, n));
    if (n == 0 || lay->row == 0 || (!k && !v)) return TSR_OK;
    tsr__kv_queue q = tsr__kv_queue_of(c, stream);
    size_t half = (size_t)n * (size_t)lay->row * sizeof(float);
    const void *ds = NULL;
    TSR_TRY(tsr__stage(c, q.slots, slots, (size_t)n * sizeof(int32_t), q.st, &ds));
    TSR_TRY(tsr__scratch_reserve(q.rows, 2 * half, q.st));
    float *rk = k ? q.rows->ptr : NULL;
    float *rv = v ? (float *)((char *)q.rows->ptr + half) : NULL;
    tsr__cuda_kv l = tsr__kv_of(lay);
    TSR_CUDA_TRY(tsr__cuda_launch_kv_get(&l, ds, n, rk, rv, q.st));
    if (k) TSR_CUDA_TRY(cudaMemcpyAsync(k, rk, half, cudaMemcpyDeviceToHost, q.st));
    if (v) TSR_CUDA_TRY(cudaMemcpyAsync(v, rv, half, cudaMemcpyDeviceToHost, q.st));
    if (!stream) TSR_CUDA_TRY(cudaStreamSynchronize(q.st));
    return TSR_OK;
}

/* Host rows -> slots: one copy per half into device scratch, then the kernel scatters the
 * rows (NULL k or v: that half is left alone). stream NULL: waited for. */
static tsr_status tsr__cuda_kv_scatter(tsr_backend *be, const tsr_kv_layout *lay,
                                       const int32_t *slots, int64_t n, const float *k,
                                       const float *v, tsr_stream *stream) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    TSR_TRY(tsr__kv_check("kv_scatter", lay, n));
    if (n == 0 || lay->row == 0 || (!k && !v)) return TSR_OK;
    tsr__kv_queue q = tsr__kv_queue_of(c, stream);
    size_t half = (size_t)n * (size_t)lay->row * sizeof(float);
    const void *ds = NULL;
    TSR_TRY(tsr__stage(c, q.slots, slots, (size_t)n * sizeof(int32_t), q.st, &ds));
    TSR_TRY(tsr__scratch_reserve(q.rows, 2 * half, q.st));
    float *rk = k ? q.rows->ptr : NULL;
    float *rv = v ? (float *)((char *)q.rows->ptr + half) : NULL;
    if (k) TSR_CUDA_TRY(cudaMemcpyAsync(rk, k, half, cudaMemcpyHostToDevice, q.st));
    if (v) TSR_CUDA_TRY(cudaMemcpyAsync(rv, v, half, cudaMemcpyHostToDevice, q.st));
    tsr__cuda_kv l = tsr__kv_of(lay);
    TSR_CUDA_TRY(tsr__cuda_launch_kv_put(&l, ds, n, rk, rv, q.st));
    if (!stream) TSR_CUDA_TRY(cudaStreamSynchronize(q.st));
    return TSR_OK;
}

/* ---- GEMM ---- */

/* y[n][rows] = x[n][cols] . w^T. cuBLAS is column-major: the row-major w is a cols x rows
 * column-major matrix, so y^T = op_T(w) * x^T with lda = ldb = cols, ldc = rows. F32
 * weights use an FP32 GEMM (no TF32, to stay near the CPU); BF16/F16 weights take x
 * rounded to the weight type and accumulate in FP32 (CUBLAS_COMPUTE_32F), output FP32. */
static tsr_status tsr__cuda_matmul(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                                   float *y) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    if (n > INT_MAX || w->rows > INT_MAX || w->cols > INT_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cuda matmul: %lld x %lld weight with %lld rows exceeds int range",
                             (long long)w->rows, (long long)w->cols, (long long)n);
    if (tsr__cuda_quant_takes(w->dtype)) { /* one part: [0, cols) */
        const int32_t whole[2] = {0, (int32_t)w->cols};
        return tsr__cuda_quant_parts(c->quant, x, n, w, whole, 1, false, false, y);
    }
    if (n == 1 && w->dtype == TSR_BF16 && c->gemv) { /* x read as f32: no conversion */
        TSR_CUDA_TRY(tsr__cuda_launch_gemv_bf16(w->data, w->rows, w->cols, x, y, c->stream));
        return TSR_OK;
    }
    const float one = 1.0f, zero = 0.0f;
    const void *b = x;
    cudaDataType_t t = CUDA_R_32F;
    if (w->dtype == TSR_BF16 || w->dtype == TSR_F16) {
        t = w->dtype == TSR_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        size_t elems = (size_t)n * (size_t)w->cols;
        if (!c->xconv_ready) {
            TSR_TRY(tsr__scratch_reserve(&c->xconv, elems * 2, c->stream));
            TSR_CUDA_TRY(tsr__cuda_launch_convert_f32(c->xconv.ptr, (int)w->dtype, x,
                                                      (int64_t)elems, c->stream));
        }
        b = c->xconv.ptr;
    } else if (w->dtype != TSR_F32) {
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda matmul: no CUDA kernel for %s weights "
                             "(TSR_GGUF_DEQUANT=1 expands a GGUF's)", tsr_dtype_name(w->dtype));
    }
    TSR_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n,
                                (int)w->cols, &one, w->data, t, (int)w->cols, b, t, (int)w->cols,
                                &zero, y, CUDA_R_32F, (int)w->rows, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    return TSR_OK;
}

/* Row-parallel products over column segments (kernels/backend.h; seg is host memory). Per
 * part one GEMM on the strided segment: A = w + seg[p] and B = x + seg[p] (x rounded to
 * the weight type first for BF16/F16, as in matmul) with lda = ldb = cols, k = the
 * segment length, FP32 accumulation. sum: part 0 goes to y, each later part to a scratch
 * that the add kernel adds to y, so y = ((P0 + P1) + P2) + ... in part order, the
 * arithmetic of tsr__comm_self_sum_parts. Stream order keeps the scratch reuse safe. A
 * part's bits come from cuBLAS's kernel for (rows, n, len); cuBLAS may choose kernels by
 * pointer alignment and leading dimension too, so bitwise equality with a column slice of
 * w (another tp) is expected but unverified on a GPU. */
static tsr_status tsr__cuda_parts(tsr_backend *be, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, bool acc, float *y);

static tsr_status tsr__cuda_matmul_parts(tsr_backend *be, const float *x, int64_t n,
                                         const tsr_tensor *w, const int32_t *seg, int n_parts,
                                         bool sum, float *y) {
    return tsr__cuda_parts(be, x, n, w, seg, n_parts, sum, false, y);
}

/* y += the ordered sum (kernels/backend.h): the parts into the scratch, summed and added
 * by one kernel (a single part: its GEMM with beta = 1, the same bits as y + P_0). */
static tsr_status tsr__cuda_matmul_parts_acc(tsr_backend *be, const float *x, int64_t n,
                                             const tsr_tensor *w, const int32_t *seg,
                                             int n_parts, float *y) {
    return tsr__cuda_parts(be, x, n, w, seg, n_parts, true, true, y);
}

/* matmul_parts, and with acc the epilogue of matmul_parts_acc. */
static tsr_status tsr__cuda_parts(tsr_backend *be, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, bool acc, float *y) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n < 0 || n_parts < 1 || !seg || w->rows <= 0 || w->cols < 0)
        return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: bad shape (n=%lld, %d parts)",
                             (long long)n, n_parts);
    if (n > INT_MAX || w->rows > INT_MAX || w->cols > INT_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cuda matmul_parts: %lld x %lld weight with %lld rows exceeds int "
                             "range", (long long)w->rows, (long long)w->cols, (long long)n);
    if (seg[0] < 0 || seg[n_parts] > w->cols)
        return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: segments [%d, %d) outside "
                             "%lld columns", (int)seg[0], (int)seg[n_parts], (long long)w->cols);
    for (int p = 0; p < n_parts; p++)
        if (seg[p + 1] < seg[p])
            return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: segment %d decreases "
                                 "(%d > %d)", p, (int)seg[p], (int)seg[p + 1]);
    if (n == 0) return TSR_OK;
    if (tsr__cuda_quant_takes(w->dtype))
        return tsr__cuda_quant_parts(c->quant, x, n, w, seg, n_parts, sum, acc, y);
    const float one = 1.0f, zero = 0.0f;
    const void *b = x;
    size_t es = 4;
    cudaDataType_t t = CUDA_R_32F;
    if (w->dtype == TSR_BF16 || w->dtype == TSR_F16) {
        t = w->dtype == TSR_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        es = 2;
        size_t elems = (size_t)n * (size_t)w->cols;
        if (c->xconv_ready) {
            b = c->xconv.ptr;
        } else if (elems) {
            TSR_TRY(tsr__scratch_reserve(&c->xconv, elems * 2, c->stream));
            TSR_CUDA_TRY(tsr__cuda_launch_convert_f32(c->xconv.ptr, (int)w->dtype, x,
                                                      (int64_t)elems, c->stream));
            b = c->xconv.ptr;
        }
    } else if (w->dtype != TSR_F32) {
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda matmul_parts: no CUDA kernel for %s "
                             "weights (TSR_GGUF_DEQUANT=1 expands a GGUF's)",
                             tsr_dtype_name(w->dtype));
    }
    size_t m = (size_t)n * (size_t)w->rows; /* floats of one part */
    int len0 = seg[1] - seg[0];
    bool uniform = len0 > 0;
    if (acc && n_parts == 1 && len0 > 0) {
        const float beta = 1.0f;
        const char *a = (const char *)w->data + (size_t)seg[0] * es;
        const char *bp = (const char *)b + (size_t)seg[0] * es;
        TSR_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n,
                                    len0, &one, a, t, (int)w->cols, bp, t, (int)w->cols, &beta,
                                    y, CUDA_R_32F, (int)w->rows, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        return TSR_OK;
    }
    for (int p = 1; p < n_parts && uniform; p++) uniform = seg[p + 1] - seg[p] == len0;
    if (uniform && (n_parts > 1 || acc)) {
        /* Equal adjacent segments (heads, the hidden split): one strided-batched GEMM for
         * all parts, then, for sum, one ordered sum: two launches where the loop makes
         * 2 * n_parts - 1. Each part is the same (rows, n, len) product as in the loop. */
        float *dst = y;
        if (sum) {
            TSR_TRY(tsr__scratch_reserve(&c->part, (size_t)n_parts * m * sizeof(float),
                                         c->stream));
            dst = c->part.ptr;
        }
        const char *a = (const char *)w->data + (size_t)seg[0] * es;
        const char *bp = (const char *)b + (size_t)seg[0] * es;
        TSR_CUBLAS_TRY(cublasGemmStridedBatchedEx(
            c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n, len0, &one, a, t,
            (int)w->cols, (long long)len0, bp, t, (int)w->cols, (long long)len0, &zero, dst,
            CUDA_R_32F, (int)w->rows, (long long)m, n_parts, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
        if (sum)
            TSR_CUDA_TRY(tsr__cuda_launch_sum_parts(y, dst, n_parts, (int64_t)m, acc ? 1 : 0,
                                                    c->stream));
        return TSR_OK;
    }
    float *yacc = NULL; /* uneven segments: the loop's sum into a scratch, then one add */
    if (acc) {
        TSR_TRY(tsr__scratch_reserve(&c->accsum, m * sizeof(float), c->stream));
        yacc = y;
        y = c->accsum.ptr;
    }
    float *tmp = NULL;
    if (sum && n_parts > 1) {
        TSR_TRY(tsr__scratch_reserve(&c->part, m * sizeof(float), c->stream));
        tmp = c->part.ptr;
    }
    for (int p = 0; p < n_parts; p++) {
        int len = seg[p + 1] - seg[p];
        float *dst = !sum ? y + (size_t)p * m : p == 0 ? y : tmp;
        if (len == 0) {
            TSR_CUDA_TRY(cudaMemsetAsync(dst, 0, m * sizeof(float), c->stream));
        } else {
            const char *a = (const char *)w->data + (size_t)seg[p] * es;
            const char *bp = (const char *)b + (size_t)seg[p] * es;
            TSR_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n,
                                        len, &one, a, t, (int)w->cols, bp, t, (int)w->cols,
                                        &zero, dst, CUDA_R_32F, (int)w->rows,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        if (sum && p > 0)
            TSR_CUDA_TRY(tsr__cuda_launch_add(y, tmp, (int64_t)m, c->stream));
    }
    if (yacc) TSR_CUDA_TRY(tsr__cuda_launch_add(yacc, y, (int64_t)m, c->stream));
    return TSR_OK;
}

/* ---- fused ops ---- */

static tsr_status tsr__cuda_rmsnorm(tsr_backend *be, const float *x, const tsr_tensor *w, int64_t n,
                                    int dim, float eps, float *out) {
    if (w->rows * w->cols < dim)
        return tsr_error_set(TSR_ERR_INVALID, "cuda rmsnorm: weight has %lld values, dim %d",
                             (long long)(w->rows * w->cols), dim);
    TSR_CUDA_TRY(tsr__cuda_launch_rmsnorm(x, w->data, (int)w->dtype, n, dim, eps, out,
                                          tsr__ctx(be)->stream));
    return TSR_OK;
}

/* Keeps the device table of inverse frequencies in step with cfg. */
static tsr_status tsr__rope_table(tsr__cuda_ctx *c, const tsr_model_config *cfg) {
    const float key[8] = {cfg->rope_theta,          cfg->rope_factor,
                          cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                          cfg->rope_beta_fast,       cfg->rope_beta_slow,
                          (float)cfg->rope_truncate, 0.0f};
    if (c->inv_freq && c->inv_hd == cfg->head_dim && c->inv_scaling == (int)cfg->rope_scaling &&
        c->inv_orig == cfg->rope_original_max_pos && !memcmp(c->inv_key, key, sizeof key))
        return TSR_OK;
    if (c->inv_freq && c->inv_hd < cfg->head_dim) {
        TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
        (void)cudaFree(c->inv_freq);
        tsr_free(c->inv_freq_host);
        c->inv_freq = NULL;
        c->inv_freq_host = NULL;
    }
    if (!c->inv_freq) {
        tsr_free(c->inv_freq_host); /* left by a failed cudaMalloc below */
        c->inv_freq_host = tsr_malloc((size_t)cfg->head_dim / 2 * sizeof(float));
        if (!c->inv_freq_host) return TSR_ERR_NOMEM;
        TSR_CUDA_TRY(cudaMalloc((void **)&c->inv_freq, (size_t)cfg->head_dim / 2 * sizeof(float)));
    }
    /* the CPU backend's table, bit for bit: at large positions one ulp of a frequency moves
     * the angle visibly, so both backends start from the same numbers (rope_freq.c) */
    tsr_rope_inv_freq(cfg, c->inv_freq_host);
    /* On the compute stream, so that rope kernels queued before read the old table and
     * those after the new one; inv_freq_host is pageable, so reusable once this returns
     * (a plain cudaMemcpy would run on the legacy stream, unordered with the compute
     * stream, which is non-blocking). */
    TSR_CUDA_TRY(cudaMemcpyAsync(c->inv_freq, c->inv_freq_host,
                                 (size_t)cfg->head_dim / 2 * sizeof(float),
                                 cudaMemcpyHostToDevice, c->stream));
    c->inv_hd = cfg->head_dim;
    c->inv_scaling = (int)cfg->rope_scaling;
    c->inv_orig = cfg->rope_original_max_pos;
    memcpy(c->inv_key, key, sizeof key);
    return TSR_OK;
}

static tsr_status tsr__cuda_rope(tsr_backend *be, float *x, const int32_t *pos, int64_t n,
                                 int n_heads, const tsr_model_config *cfg) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2)
        return tsr_error_set(TSR_ERR_INVALID, "cuda rope: head_dim %d must be even and > 0",
                             cfg->head_dim);
    if (cfg->rope_scaling == TSR_ROPE_LLAMA3 &&
        (cfg->rope_factor <= 0 || cfg->rope_original_max_pos <= 0 ||
         cfg->rope_high_freq_factor == cfg->rope_low_freq_factor))
        return tsr_error_set(TSR_ERR_INVALID, "cuda rope: bad llama3 scaling parameters");
    if (cfg->rope_scaling == TSR_ROPE_YARN &&
        (cfg->rope_factor <= 0 || cfg->rope_original_max_pos <= 0))
        return tsr_error_set(TSR_ERR_INVALID, "cuda rope: bad yarn scaling parameters");
    TSR_TRY(tsr__rope_table(c, cfg));
    const int32_t *dpos;
    bool staged;
    TSR_TRY(tsr__stage_i32(c, pos, n, &dpos, &staged));
    TSR_CUDA_TRY(tsr__cuda_launch_rope(x, dpos, n, n_heads, cfg->head_dim, c->inv_freq,
                                       cfg->rope_interleaved ? 1 : 0, tsr_rope_cos_scale(cfg),
                                       c->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_swiglu(tsr_backend *be, float *gate, const float *up, int64_t n) {
    TSR_CUDA_TRY(tsr__cuda_launch_swiglu(gate, up, n, tsr__ctx(be)->stream));
    return TSR_OK;
}

/* kernels/backend.h's qkv_rope, one launch (kv.cu): host positions and slots are staged as
 * rope's and kv_write's; the step's metadata is read in place. */
static tsr_status tsr__cuda_qkv_rope(tsr_backend *be, const tsr_qkv_rope_args *a) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    const tsr_model_config *cfg = a->cfg;
    if (a->n <= 0) return TSR_OK;
    if (!a->q_norm != !a->k_norm || (a->bias && a->bias->dtype != TSR_F32) ||
        (a->q_norm && (a->q_norm->dtype != TSR_F32 || a->k_norm->dtype != TSR_F32)))
        return tsr_error_set(TSR_ERR_INVALID, "cuda qkv_rope: the bias and q/k norms must be "
                             "f32, the norms both or neither");
    TSR_TRY(tsr__rope_table(c, cfg));
    const int32_t *dpos, *dslots = NULL;
    bool staged;
    TSR_TRY(tsr__stage_i32(c, a->pos, a->n, &dpos, &staged));
    tsr__cuda_kv l = {0};
    if (a->lay) {
        TSR_TRY(tsr__kv_check("qkv_rope", a->lay, a->n));
        const void *ds = NULL;
        TSR_TRY(tsr__stage(c, &c->slots, a->slots, (size_t)a->n * sizeof(int32_t), c->stream,
                           &ds));
        dslots = ds;
        l = tsr__kv_of(a->lay);
    }
    TSR_CUDA_TRY(tsr__cuda_launch_qkv_rope(
        a->qkv, a->n, a->n_heads, a->n_kv_heads, cfg->head_dim, dpos, c->inv_freq,
        tsr_rope_cos_scale(cfg), cfg->rope_interleaved ? 1 : 0,
        a->bias ? (const float *)a->bias->data : NULL, a->q_norm ? a->q_norm->data : NULL,
        a->k_norm ? a->k_norm->data : NULL, a->q_norm ? (int)a->q_norm->dtype : 0,
        cfg->norm_eps, a->q, a->lay ? &l : NULL, dslots, a->k, a->v, c->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_swiglu_fused(tsr_backend *be, const float *gu, int64_t n, int hidden,
                                         float *out) {
    TSR_CUDA_TRY(tsr__cuda_launch_swiglu_fused(gu, n, hidden, out, TSR_F32,
                                               tsr__ctx(be)->stream));
    return TSR_OK;
}

/* kernels/backend.h's rmsnorm_matmul: for BF16 weights the norm kernel writes xb and the
 * GEMM's BF16 input at once (no conversion launch); otherwise the two ops. */
static tsr_status tsr__cuda_rmsnorm_matmul(tsr_backend *be, const float *x, const tsr_tensor *norm,
                                           int64_t n, int dim, float eps, float *xb,
                                           const tsr_tensor *w, float *y) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (w->dtype != TSR_BF16 || w->cols != dim || n <= 0 || (n == 1 && c->gemv)) {
        TSR_TRY(tsr__cuda_rmsnorm(be, x, norm, n, dim, eps, xb));
        return tsr__cuda_matmul(be, xb, n, w, y);
    }
    if (norm->rows * norm->cols < dim)
        return tsr_error_set(TSR_ERR_INVALID, "cuda rmsnorm_matmul: norm has %lld values, dim %d",
                             (long long)(norm->rows * norm->cols), dim);
    TSR_TRY(tsr__scratch_reserve(&c->xconv, (size_t)n * (size_t)dim * 2, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_rmsnorm_bf16(x, norm->data, (int)norm->dtype, n, dim, eps, xb,
                                               c->xconv.ptr, c->stream));
    c->xconv_ready = true;
    tsr_status st = tsr__cuda_matmul(be, xb, n, w, y);
    c->xconv_ready = false;
    return st;
}

/* kernels/backend.h's swiglu_matmul_acc: for BF16 weights the SwiGLU kernel writes the
 * GEMM's BF16 input only (hb is not needed); otherwise the two ops. */
static tsr_status tsr__cuda_swiglu_matmul_acc(tsr_backend *be, const float *gu, int64_t n,
                                              int hidden, float *hb, const tsr_tensor *w,
                                              const int32_t *seg, int n_parts, float *y) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (w->dtype != TSR_BF16 || w->cols != hidden || n <= 0) {
        TSR_TRY(tsr__cuda_swiglu_fused(be, gu, n, hidden, hb));
        return tsr__cuda_matmul_parts_acc(be, hb, n, w, seg, n_parts, y);
    }
    TSR_TRY(tsr__scratch_reserve(&c->xconv, (size_t)n * (size_t)hidden * 2, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_swiglu_fused(gu, n, hidden, c->xconv.ptr, TSR_BF16,
                                               c->stream));
    c->xconv_ready = true;
    tsr_status st = tsr__cuda_matmul_parts_acc(be, hb, n, w, seg, n_parts, y);
    c->xconv_ready = false;
    return st;
}

static tsr_status tsr__cuda_add(tsr_backend *be, float *x, const float *y, int64_t n) {
    TSR_CUDA_TRY(tsr__cuda_launch_add(x, y, n, tsr__ctx(be)->stream));
    return TSR_OK;
}

/* One broadcasting launch for all n rows (moe.cu): GPT-OSS adds four biases per layer and
 * the router's, over every row of a prefill chunk. */
static tsr_status tsr__cuda_bias_add(tsr_backend *be, float *x, const tsr_tensor *b,
                                     int64_t n) {
    if (b->dtype != TSR_F32 || b->rows != 1)
        return tsr_error_set(TSR_ERR_INVALID, "bias_add: the bias must be an f32 [1, width]");
    TSR_CUDA_TRY(tsr__cuda_launch_bias_rows(x, b->data, n, b->cols, tsr__ctx(be)->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_embed(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids,
                                  int64_t n, float *out) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    const int32_t *dids;
    bool staged;
    TSR_TRY(tsr__stage_i32(c, ids, n, &dids, &staged));
    if (staged) { /* host ids: check them here, no round trip */
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= emb->rows)
                return tsr_error_set(TSR_ERR_INVALID, "embed: token id %d out of range [0, %lld)",
                                     (int)ids[i], (long long)emb->rows);
    }
    if (emb->dtype == TSR_Q8_0)
        TSR_TRY(tsr__cuda_quant_embed(c->quant, emb, dids, n, out, c->bad_id));
    else
        TSR_CUDA_TRY(tsr__cuda_launch_embed(emb->data, (int)emb->dtype, emb->rows, emb->cols,
                                            dids, n, out, c->bad_id, c->stream));
    /* device ids (the step's metadata): the kernel flags bad ones (zero rows) and
     * synchronize reports them; no wait inside the step */
    if (!staged) c->bad_id_pending = true;
    return TSR_OK;
}

/* The tensor-core kernels' scratch (flash_attn.h). Step graphs bake in its address: growing
 * it (never inside a capture: the wait in the reserve would end it) drops them, and the
 * next steps capture again. */
static tsr_status tsr__cuda_fa_reserve(tsr__cuda_ctx *c, size_t bytes) {
    if (bytes > c->fa.cap && c->capturing < 0 && c->fa.ptr) {
        TSR_CUDA_TRY(cudaStreamSynchronize(c->stream)); /* no replay still reads it */
        for (int i = 0; i < TSR__CUDA_GRAPHS; i++) {
            if (c->graphs[i].exec) (void)cudaGraphExecDestroy(c->graphs[i].exec);
            c->graphs[i].exec = NULL;
            c->graphs[i].seen = 0;
        }
    }
    return tsr__scratch_reserve(&c->fa, bytes, c->stream);
}

static tsr_status tsr__cuda_attention(tsr_backend *be, const tsr_attn_args *a) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (a->n_q <= 0) return TSR_OK;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim > TSR__CUDA_MAX_HEAD_DIM || a->n_heads > 65535 || a->n_spans < 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cuda attention: heads %d, kv heads %d, head_dim %d (max %d)",
                             a->n_heads, a->n_kv_heads, a->head_dim, TSR__CUDA_MAX_HEAD_DIM);
    if (a->n_spans > c->host_spans_cap) {
        tsr_free(c->host_spans);
        tsr_free(c->span_pos_off);
        c->host_spans_cap = 0;
        c->host_spans = tsr_malloc((size_t)a->n_spans * sizeof *c->host_spans);
        c->span_pos_off = tsr_malloc((size_t)a->n_spans * sizeof *c->span_pos_off);
        if (!c->host_spans || !c->span_pos_off) return TSR_ERR_NOMEM;
        c->host_spans_cap = a->n_spans;
    }
    /* Span positions are host memory (kernels/backend.h): those of all spans are gathered
     * into one host array and go to the device in one copy; the spans then point into it.
     * Device arrays, as older callers pass, are used in place; the first span's array
     * tells which kind the call passes (one pointer query per call, not per span: a paged
     * cache has a span per block). */
    int64_t keys = 0, host_pos = 0;
    int monotone = 1, dq = 0; /* dq: some span is not f32 (attn.cu converts) */
    int pos_on_device = -1; /* unknown until the first span with positions */
    for (int s = 0; s < a->n_spans; s++) {
        const tsr_kv_span *sp = &a->spans[s];
        if (sp->n < 0)
            return tsr_error_set(TSR_ERR_INVALID, "cuda attention: span %d has %d keys", s,
                                 (int)sp->n);
        c->span_pos_off[s] = -1;
        const int32_t *pos = NULL;
        if (sp->pos && sp->n > 0) {
            if (pos_on_device < 0)
                pos_on_device = tsr__ptr_kind_of(sp->pos) == TSR__PTR_DEVICE;
            if (pos_on_device) {
                pos = sp->pos;
            } else {
                size_t need = (size_t)(host_pos + sp->n) * sizeof(int32_t);
                TSR_TRY(tsr__host_reserve(&c->kpos_host, need));
                memcpy((int32_t *)c->kpos_host.ptr + host_pos, sp->pos,
                       (size_t)sp->n * sizeof(int32_t));
                c->span_pos_off[s] = host_pos;
                host_pos += sp->n;
            }
        }
        c->host_spans[s] = (tsr__cuda_span){.k = sp->k,
                                            .v = sp->v,
                                            .pos = pos,
                                            .stride = sp->stride,
                                            .key_off = keys,
                                            .pos0 = sp->pos0,
                                            .n = sp->n,
                                            .dtype = sp->dtype};
        dq |= sp->dtype != TSR_KV_F32;
        if (sp->pos ||
            (s > 0 && (int64_t)sp->pos0 < (int64_t)a->spans[s - 1].pos0 + a->spans[s - 1].n))
            monotone = 0;
        keys += sp->n;
    }
    if (host_pos > 0) {
        /* kpos_host is ours and pageable: reusable once the copy call returns (tsr__stage) */
        const void *dpos = NULL;
        TSR_TRY(tsr__stage(c, &c->kpos, c->kpos_host.ptr, (size_t)host_pos * sizeof(int32_t),
                           c->stream, &dpos));
        for (int s = 0; s < a->n_spans; s++)
            if (c->span_pos_off[s] >= 0)
                c->host_spans[s].pos = (const int32_t *)dpos + c->span_pos_off[s];
    }
    tsr__cuda_attn k = {.q = a->q,
                        .n_q = a->n_q,
                        .n_spans = a->n_spans,
                        .n_keys = keys,
                        .monotone = monotone,
                        .n_heads = a->n_heads,
                        .n_kv_heads = a->n_kv_heads,
                        .head_dim = a->head_dim,
                        .scale = 1.0f / sqrtf((float)a->head_dim),
                        .out = a->out,
                        .key_scores = a->key_scores,
                        .sm_count = c->sm_count,
                        .dq = dq,
                        .sinks = a->sinks,
                        .window = a->window > 0 ? a->window : 0};
    if (a->n_spans > 0) {
        size_t bytes = (size_t)a->n_spans * sizeof(tsr__cuda_span);
        TSR_TRY(tsr__scratch_reserve(&c->spans, bytes, c->stream));
        TSR_CUDA_TRY(
            cudaMemcpyAsync(c->spans.ptr, c->host_spans, bytes, cudaMemcpyHostToDevice, c->stream));
        k.spans = c->spans.ptr;
    }
    bool staged;
    TSR_TRY(tsr__stage_i32(c, a->q_pos, a->n_q, &k.q_pos, &staged));
    if (c->attn_flash && tsr__cuda_flash_prefill_fits(&k)) {
        /* BF16 tensor-core prefill (flash_attn.cu); it packs every KV dtype itself */
        TSR_TRY(tsr__cuda_fa_reserve(c, tsr__cuda_flash_prefill_work(&k)));
        TSR_CUDA_TRY(tsr__cuda_flash_prefill(&k, a->sinks, a->window, c->fa.ptr, c->stream));
        return TSR_OK;
    }
    size_t work = tsr__cuda_attention_work(&k);
    if (work > 0) {
        TSR_TRY(tsr__scratch_reserve(&c->attn, work * sizeof(float), c->stream));
        k.work = c->attn.ptr;
    }
    TSR_CUDA_TRY(tsr__cuda_launch_attention(&k, c->stream));
    return TSR_OK;
}

/* The experts of a mixture-of-experts layer (tsr_moe_args): the routing (host memory) goes
 * up in one copy, as the active experts' list (expert, first route, routes), the route
 * rows, each token's routes in expert order and the route weights; then gather, gate/up
 * projection of every active expert in one launch (mxfp4.cu), the clamped gate, the down
 * projection, and the weighted sum per token (moe.cu). Five launches per layer whatever
 * the number of experts. */
static tsr_status tsr__cuda_moe(tsr_backend *be, const tsr_moe_args *a) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    const tsr_experts *gu = a->gate_up, *dn = a->down;
    if (gu->n != dn->n || gu->rows != 2 * dn->cols || gu->cols != dn->rows || gu->n <= 0 ||
        gu->mxfp4 != dn->mxfp4 || (gu->mxfp4 && (gu->cols % 32 || dn->cols % 32)) ||
        (!gu->mxfp4 && gu->w.dtype != TSR_F32 && gu->w.dtype != TSR_BF16 &&
         gu->w.dtype != TSR_F16) ||
        (!dn->mxfp4 && dn->w.dtype != TSR_F32 && dn->w.dtype != TSR_BF16 &&
         dn->w.dtype != TSR_F16))
        return tsr_error_set(TSR_ERR_INVALID, "cuda moe: experts of [%lld, %lld] and [%lld, "
                             "%lld] do not chain (or an unsupported dtype)",
                             (long long)gu->rows, (long long)gu->cols, (long long)dn->rows,
                             (long long)dn->cols);
    if (a->n <= 0) return TSR_OK;
    const int E = gu->n;
    const int64_t H = dn->rows, I = dn->cols, I2 = gu->rows, n = a->n;
    const int32_t nr = a->offsets[E];
    if (nr <= 0) {
        TSR_CUDA_TRY(cudaMemsetAsync(a->out, 0, (size_t)n * (size_t)H * sizeof(float), c->stream));
        return TSR_OK;
    }
    if (n > 0x7fffffffLL / 2)
        return tsr_error_set(TSR_ERR_INVALID, "cuda moe: %lld rows", (long long)n);
    /* host layout, int32: list [3 * E], rows [nr], tok_off [n + 1], tok_routes [nr],
     * weights [nr] (f32 bits) */
    size_t words = 3 * (size_t)E + (size_t)nr + (size_t)n + 1 + 2 * (size_t)nr;
    TSR_TRY(tsr__host_reserve(&c->moe_host, words * sizeof(int32_t)));
    int32_t *list = c->moe_host.ptr, *rows = list + 3 * (size_t)E, *tok_off = rows + nr,
            *tok_routes = tok_off + n + 1;
    float *wts = (float *)(tok_routes + nr);
    int active = 0;
    for (int e = 0; e < E; e++) {
        int32_t r0 = a->offsets[e], cnt = a->offsets[e + 1] - r0;
        if (r0 < 0 || cnt < 0 || a->offsets[e + 1] > nr)
            return tsr_error_set(TSR_ERR_INVALID, "cuda moe: offsets not increasing at expert %d", e);
        if (cnt == 0) continue;
        list[3 * active] = e;
        list[3 * active + 1] = r0;
        list[3 * active + 2] = cnt;
        active++;
    }
    memset(tok_off, 0, (size_t)(n + 1) * sizeof(int32_t));
    for (int32_t r = 0; r < nr; r++) {
        if (a->rows[r] < 0 || a->rows[r] >= n)
            return tsr_error_set(TSR_ERR_INVALID, "cuda moe: route %d names row %d of %lld",
                                 (int)r, (int)a->rows[r], (long long)n);
        rows[r] = a->rows[r];
        wts[r] = a->weights[r];
        tok_off[a->rows[r] + 1]++;
    }
    for (int64_t t = 0; t < n; t++) tok_off[t + 1] += tok_off[t];
    /* each token's routes in route order, which is expert order (the CPU's sum order) */
    int32_t *fill = tsr_malloc((size_t)n * sizeof *fill);
    if (!fill) return TSR_ERR_NOMEM;
    memcpy(fill, tok_off, (size_t)n * sizeof *fill);
    for (int32_t r = 0; r < nr; r++) tok_routes[fill[rows[r]]++] = r;
    tsr_free(fill);
    const void *dmeta = NULL;
    TSR_TRY(tsr__stage(c, &c->moe_meta, c->moe_host.ptr, words * sizeof(int32_t), c->stream,
                       &dmeta));
    const int32_t *d_list = dmeta, *d_rows = d_list + 3 * (size_t)E, *d_off = d_rows + nr,
                  *d_routes = d_off + n + 1;
    const float *d_wts = (const float *)(d_routes + nr);
    /* four arrays, each starting 16-byte aligned (mxfp4.cu reads rows as float4) */
    size_t sz[4] = {(size_t)nr * (size_t)H, (size_t)nr * (size_t)I2, (size_t)nr * (size_t)I,
                    (size_t)nr * (size_t)H},
           at[4], total = 0;
    for (int i = 0; i < 4; i++) {
        at[i] = total;
        total += (sz[i] + 3) / 4 * 4;
    }
    TSR_TRY(tsr__scratch_reserve(&c->moe_work, total * sizeof(float), c->stream));
    float *base = c->moe_work.ptr;
    float *xg = base + at[0], *g = base + at[1], *act = base + at[2], *y = base + at[3];
    tsr__cuda_experts wg = {.w = gu->w.data, .scales = gu->scales.data, .bias = gu->bias.data,
                            .rows = I2, .cols = H, .dtype = (int)gu->w.dtype, .mxfp4 = gu->mxfp4};
    tsr__cuda_experts wd = {.w = dn->w.data, .scales = dn->scales.data, .bias = dn->bias.data,
                            .rows = H, .cols = I, .dtype = (int)dn->w.dtype, .mxfp4 = dn->mxfp4};
    TSR_CUDA_TRY(tsr__cuda_launch_moe_gather(a->x, H, d_rows, nr, xg, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_experts_matmul(&wg, d_list, active, xg, g, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_moe_act(g, nr, I, a->limit, a->alpha, act, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_experts_matmul(&wd, d_list, active, act, y, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_moe_combine(y, H, d_off, d_routes, d_wts, n, a->out, c->stream));
    return TSR_OK;
}

/* Sampling on the device: the parameters go up (host memory by the contract), the kernels
 * of sample.cu draw, and only the n ids come back. */
static tsr_status tsr__cuda_sample(tsr_backend *be, float *logits, int64_t n, int vocab,
                                   const tsr_sample_params *params, int32_t *ids) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    if (vocab <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "cuda sample: vocabulary of %d tokens", vocab);
    if (n > 0x7fffffffLL)
        return tsr_error_set(TSR_ERR_INVALID, "cuda sample: %lld rows", (long long)n);
    TSR_TRY(tsr__host_reserve(&c->spar_host, (size_t)n * sizeof(tsr__cuda_sample_row)));
    tsr__cuda_sample_row *hp = c->spar_host.ptr;
    int sorts = 0;
    for (int64_t i = 0; i < n; i++) {
        const tsr_sample_params *p = &params[i];
        hp[i] = (tsr__cuda_sample_row){.temperature = p->temperature,
                                       .top_p = p->top_p,
                                       .top_k = p->top_k,
                                       .r = p->r};
        int k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
        if (p->temperature != 0.0f && !(k == vocab && p->top_p >= 1.0f)) sorts = 1;
    }
    const void *dpar = NULL;
    TSR_TRY(tsr__stage(c, &c->spar, hp, (size_t)n * sizeof *hp, c->stream, &dpar));
    TSR_TRY(tsr__scratch_reserve(&c->sids, (size_t)n * sizeof(int32_t), c->stream));
    size_t work = tsr__cuda_sample_work(n, vocab, sorts);
    if (work > 0) TSR_TRY(tsr__scratch_reserve(&c->swork, work, c->stream));
    TSR_CUDA_TRY(tsr__cuda_launch_sample(logits, n, vocab, dpar, sorts, c->sids.ptr,
                                         work > 0 ? c->swork.ptr : NULL, c->stream));
    TSR_CUDA_TRY(cudaMemcpyAsync(ids, c->sids.ptr, (size_t)n * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, c->stream));
    TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return TSR_OK;
}

/* The batch's attention over a paged layout, every array already in device memory (the
 * step's metadata): one launch, nothing staged. */
static tsr_status tsr__cuda_attention_paged(tsr_backend *be, const tsr_attn_paged_args *a) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (a->n_q <= 0) return TSR_OK;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim > TSR__CUDA_MAX_HEAD_DIM || a->n_heads > 65535 || a->lay.block <= 0 ||
        a->max_blocks <= 0 || a->n_seqs <= 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda attention_paged: heads %d, kv heads "
                             "%d, head_dim %d (max %d), block %d", a->n_heads, a->n_kv_heads,
                             a->head_dim, TSR__CUDA_MAX_HEAD_DIM, (int)a->lay.block);
    tsr__cuda_attn_paged d = {
        .q = a->q, .out = a->out, .n_q = a->n_q, .n_heads = a->n_heads,
        .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
        .scale = 1.0f / sqrtf((float)a->head_dim),
        .lay = {.k = a->lay.k, .v = a->lay.v, .block_stride = a->lay.block_stride,
                .block = a->lay.block, .row = a->lay.row, .dtype = a->lay.dtype},
        .q_pos = a->q_pos, .q_seq = a->q_seq, .n_keys = a->n_keys, .tables = a->tables,
        .n_seqs = a->n_seqs, .max_blocks = a->max_blocks, .sinks = a->sinks,
        .window = a->window > 0 ? a->window : 0};
    if (c->attn_flash && tsr__cuda_flash_paged_fits(&d)) { /* a prefill chunk: tensor cores */
        TSR_TRY(tsr__cuda_fa_reserve(c, tsr__cuda_flash_paged_work(&d)));
        TSR_CUDA_TRY(tsr__cuda_flash_prefill_paged(&d, d.sinks, d.window, c->fa.ptr, c->stream));
        return TSR_OK;
    }
    if (c->attn_flash && tsr__cuda_decode_fits(&d)) { /* split-K over the batch */
        tsr__cuda_decode_plan plan = tsr__cuda_decode_plan_for(&d, c->sm_count);
        TSR_TRY(tsr__cuda_fa_reserve(c, tsr__cuda_decode_work(&d, plan)));
        TSR_CUDA_TRY(tsr__cuda_decode_paged(&d, d.sinks, d.window, plan, c->fa.ptr, c->stream));
        return TSR_OK;
    }
    TSR_CUDA_TRY(tsr__cuda_launch_attention_paged(&d, c->stream));
    return TSR_OK;
}

/* ---- step graphs ---- */

static tsr_status tsr__cuda_graph_begin(tsr_backend *be, uint64_t key, bool *replayed) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    *replayed = false;
    if (c->capturing >= 0)
        return tsr_error_set(TSR_ERR_INVALID, "cuda: graph_begin inside a graph");
    if (c->graphs_off) return TSR_OK;
    int i = 0;
    while (i < TSR__CUDA_GRAPHS && !(c->graphs[i].seen && c->graphs[i].key == key)) i++;
    if (i == TSR__CUDA_GRAPHS) { /* first time: run plainly, remember the key */
        i = c->graph_next;
        c->graph_next = (c->graph_next + 1) % TSR__CUDA_GRAPHS;
        if (c->graphs[i].exec) (void)cudaGraphExecDestroy(c->graphs[i].exec);
        c->graphs[i].exec = NULL;
        c->graphs[i].key = key;
        c->graphs[i].seen = 1;
        return TSR_OK;
    }
    if (c->graphs[i].exec) {
        TSR_CUDA_TRY(cudaGraphLaunch(c->graphs[i].exec, c->stream));
        *replayed = true;
        return TSR_OK;
    }
    /* ThreadLocal: another thread's CUDA calls are not this capture's business */
    TSR_CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = i;
    return TSR_OK;
}

/* Ends a capture: instantiates the graph and launches it (the captured ops did not run).
 * A capture that failed (an op the stream cannot record) turns graphs off for this
 * backend with one warning, and the step fails rather than be lost silently. */
static tsr_status tsr__cuda_graph_end(tsr_backend *be) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    int i = c->capturing;
    if (i < 0) return TSR_OK; /* the step ran plainly */
    c->capturing = -1;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    cudaGraphExec_t exec = NULL;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
    if (g) (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        c->graphs_off = true;
        c->graphs[i].seen = 0;
        TSR_LOG_WARN("cuda: a step could not be captured as a graph (%s); graphs off",
                     cudaGetErrorString(e));
        return tsr_error_set(TSR_ERR_INTERNAL, "cuda: step capture failed: %s",
                             cudaGetErrorString(e));
    }
    c->graphs[i].exec = exec;
    TSR_CUDA_TRY(cudaGraphLaunch(exec, c->stream));
    return TSR_OK;
}

/* ---- lifecycle ---- */

static void tsr__cuda_destroy(tsr_backend *be) {
    if (!be) return;
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (c) {
        if (c->stream) (void)cudaStreamSynchronize(c->stream);
        for (int i = 0; i < TSR__CUDA_GRAPHS; i++)
            if (c->graphs[i].exec) (void)cudaGraphExecDestroy(c->graphs[i].exec);
        tsr__cuda_quant_destroy(c->quant);
        if (c->blas) (void)cublasDestroy(c->blas);
        tsr__scratch_release(&c->xconv);
        tsr__scratch_release(&c->part);
        tsr__scratch_release(&c->accsum);
        tsr__scratch_release(&c->ints);
        tsr__scratch_release(&c->spans);
        tsr__scratch_release(&c->kpos);
        tsr__scratch_release(&c->slots);
        tsr__scratch_release(&c->slots2);
        tsr__scratch_release(&c->rows);
        tsr__scratch_release(&c->attn);
        tsr__scratch_release(&c->fa);
        tsr__scratch_release(&c->spar);
        tsr__scratch_release(&c->sids);
        tsr__scratch_release(&c->swork);
        tsr__scratch_release(&c->moe_meta);
        tsr__scratch_release(&c->moe_work);
        if (c->bad_id) (void)cudaFree(c->bad_id);
        if (c->inv_freq) (void)cudaFree(c->inv_freq);
        if (c->stream) (void)cudaStreamDestroy(c->stream);
        (void)cudaGetLastError(); /* nothing to report at teardown */
        tsr_free(c->inv_freq_host);
        tsr_free(c->host_spans);
        tsr_free(c->span_pos_off);
        tsr_free(c->kpos_host.ptr);
        tsr_free(c->bounce.ptr);
        tsr_free(c->spar_host.ptr);
        tsr_free(c->moe_host.ptr);
        tsr_free(c);
    }
    tsr_free(be);
}

/* Weights in the device layout (quant_gemm.h: Q8_0 as GGUF blocks), else byte for byte. */
static tsr_status tsr__cuda_place_tensor(tsr_backend *be, const tsr_tensor *host,
                                         tsr_tensor *dev, bool *copied) {
    *dev = *host;
    *copied = false;
    if (!host->data) return TSR_OK;
    void *tmp = NULL;
    size_t bytes = 0;
    TSR_TRY(tsr__cuda_quant_device_copy(host, &tmp, &bytes));
    const void *src = tmp ? tmp : host->data;
    if (!tmp) bytes = tsr_tensor_bytes(host);
    void *p = NULL;
    tsr_status st = tsr__cuda_buffer_alloc(be, bytes, &p);
    if (st == TSR_OK) st = tsr__cuda_upload(be, p, src, bytes, NULL);
    tsr_free(tmp);
    if (st != TSR_OK) {
        if (p) tsr__cuda_buffer_free(be, p);
        return st;
    }
    dev->data = p;
    *copied = true;
    return TSR_OK;
}

static const tsr_backend_ops tsr__cuda_ops = {
    .name = "cuda",
    .destroy = tsr__cuda_destroy,
    .buffer_alloc = tsr__cuda_buffer_alloc,
    .buffer_free = tsr__cuda_buffer_free,
    .host_alloc = tsr__cuda_host_alloc,
    .host_free = tsr__cuda_host_free,
    .memory = tsr__cuda_memory,
    .synchronize = tsr__cuda_synchronize,
    .upload = tsr__cuda_upload,
    .download = tsr__cuda_download,
    .copy = tsr__cuda_copy,
    .memset = tsr__cuda_memset,
    .stream_create = tsr__cuda_stream_create,
    .stream_destroy = tsr__cuda_stream_destroy,
    .event_create = tsr__cuda_event_create,
    .event_destroy = tsr__cuda_event_destroy,
    .event_record = tsr__cuda_event_record,
    .stream_wait = tsr__cuda_stream_wait,
    .event_sync = tsr__cuda_event_sync,
    .event_create_timed = tsr__cuda_event_create_timed,
    .event_elapsed = tsr__cuda_event_elapsed,
    .host_register = tsr__cuda_host_register,
    .host_unregister = tsr__cuda_host_unregister,
    .stream_handle = tsr__cuda_stream_handle,
    .device_name = tsr__cuda_device_name,
    .kv_write = tsr__cuda_kv_write,
    .kv_copy = tsr__cuda_kv_copy,
    .kv_gather = tsr__cuda_kv_gather,
    .kv_scatter = tsr__cuda_kv_scatter,
    .matmul = tsr__cuda_matmul,
    .rmsnorm = tsr__cuda_rmsnorm,
    .rope = tsr__cuda_rope,
    .swiglu = tsr__cuda_swiglu,
    .add = tsr__cuda_add,
    .embed = tsr__cuda_embed,
    .attention = tsr__cuda_attention,
    .matmul_parts = tsr__cuda_matmul_parts,
    .sample = tsr__cuda_sample,
    .bias_add = tsr__cuda_bias_add,
    .moe = tsr__cuda_moe,
    .attention_paged = tsr__cuda_attention_paged,
    .matmul_parts_acc = tsr__cuda_matmul_parts_acc,
    .qkv_rope = tsr__cuda_qkv_rope,
    .swiglu_fused = tsr__cuda_swiglu_fused,
    .rmsnorm_matmul = tsr__cuda_rmsnorm_matmul,
    .swiglu_matmul_acc = tsr__cuda_swiglu_matmul_acc,
    .graph_begin = tsr__cuda_graph_begin,
    .graph_end = tsr__cuda_graph_end,
    .place_tensor = tsr__cuda_place_tensor,
};

tsr_gpu_probe tsr__cuda_probe(int *count, char *detail, size_t cap) {
    *count = 0;
    if (cap) detail[0] = 0;
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (ce == cudaSuccess && n > 0) {
        *count = n;
        return TSR_GPU_PRESENT;
    }
    if (cap) snprintf(detail, cap, "%s", ce == cudaSuccess ? "0 devices" : cudaGetErrorString(ce));
    /* No driver library, or one older than the runtime: the same advice. */
    if (ce == cudaErrorInsufficientDriver) return TSR_GPU_NO_DRIVER;
    if (ce == cudaSuccess || ce == cudaErrorNoDevice) return TSR_GPU_NO_DEVICE;
    return TSR_GPU_FAILED;
}

int tsr__cuda_busid(int device, char *buf, size_t cap) {
    if (cap == 0) return -1;
    buf[0] = 0;
    if (cudaDeviceGetPCIBusId(buf, (int)cap, device) != cudaSuccess) {
        (void)cudaGetLastError();
        buf[0] = 0;
        return -1;
    }
    return 0;
}

tsr_status tsr__cuda_device_info(int device, char *name, size_t cap, size_t *memory_bytes) {
    struct cudaDeviceProp prop;
    cudaError_t ce = cudaGetDeviceProperties(&prop, device);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return tsr_error_set(TSR_ERR_CUDA, "cuda device %d: %s", device, cudaGetErrorString(ce));
    }
    if (cap) snprintf(name, cap, "%s", prop.name);
    *memory_bytes = prop.totalGlobalMem;
    return TSR_OK;
}

tsr_status tsr__cuda_create(int device, tsr_backend **out) {
    *out = NULL;
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return tsr_error_set(TSR_ERR_CUDA, "cuda device %d: no CUDA device answers (%s)", device,
                             ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    }
    if (device < 0 || device >= count)
        return tsr_error_set(TSR_ERR_CUDA, "cuda device %d: out of range (%d devices visible)",
                             device, count);
    tsr_status st = TSR_OK;
    tsr_backend *be = tsr_calloc(1, sizeof *be);
    tsr__cuda_ctx *c = tsr_calloc(1, sizeof *c);
    if (!be || !c) {
        tsr_free(be);
        tsr_free(c);
        return TSR_ERR_NOMEM;
    }
    be->ops = &tsr__cuda_ops;
    be->ctx = c;
    be->device = device;
    be->threads = 1;
    be->host_memory = false; /* device memory: never usable in place by the host */
    be->fp8_weights = true;  /* quant_gemm.h */
    be->gguf_blocks = false; /* no 3- to 6-bit GGUF kernels: the engine requantizes to Q8_0 */
    c->device = device;
    TSR_CUDA_TRY_GOTO(cudaSetDevice(device), st, fail);
    struct cudaDeviceProp prop;
    TSR_CUDA_TRY_GOTO(cudaGetDeviceProperties(&prop, device), st, fail);
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    c->sm_count = prop.multiProcessorCount;
    TSR_CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), st, fail);
    TSR_CUBLAS_TRY_GOTO(cublasCreate(&c->blas), st, fail);
    TSR_CUBLAS_TRY_GOTO(cublasSetStream(c->blas, c->stream), st, fail);
    st = tsr__cuda_quant_create(prop.major * 10 + prop.minor, c->stream, c->blas, &c->quant);
    if (st != TSR_OK) goto fail;
    c->capturing = -1;
    {
        const char *gv = getenv("TSR_CUDA_GRAPHS");
        c->graphs_off = gv && !strcmp(gv, "0");
        const char *av = getenv("TSR_CUDA_ATTN");
        c->attn_flash = prop.major >= 8 && !(av && !strcmp(av, "reference"));
        const char *gm = getenv("TSR_CUDA_GEMV");
        c->gemv = gm && !strcmp(gm, "1");
    }
    TSR_CUDA_TRY_GOTO(cudaMalloc((void **)&c->bad_id, sizeof(int)), st, fail);
    TSR_CUDA_TRY_GOTO(cudaMemsetAsync(c->bad_id, 0, sizeof(int), c->stream), st, fail);
    *out = be;
    return TSR_OK;
fail:
    tsr__cuda_destroy(be);
    return st;
}
