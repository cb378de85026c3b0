/* The fenced CPU device ("cpu-fenced"): the CPU kernels running on memory that host code
 * cannot touch, so that CI catches every host dereference of backend memory as a segfault
 * instead of a silent read that only breaks on a GPU.
 *
 * - Backend memory is one arena: a single mmap reservation (PROT_NONE, MAP_NORESERVE), so a
 *   large arena costs nothing until its pages are used. An allocator inside it hands out
 *   4096-byte-aligned blocks (first fit over a sorted free list, coalescing on free); its
 *   bookkeeping lives in ordinary host memory, never in the arena. memory() reports the
 *   arena's free and total bytes, so everything sized from the "device" (the KV pool)
 *   follows the arena.
 * - The fence: the arena is PROT_NONE except inside this backend's own calls. Every op
 *   opens it (PROT_READ|WRITE over the used extent), runs the inner CPU backend's op, and
 *   closes it on every return path. A depth counter under a mutex makes nesting and calls
 *   from several threads harmless: the arena closes when the last call leaves.
 * - Contract checks: the pointers backend.h calls backend memory must lie inside one live
 *   arena buffer, and the ones it calls host memory (positions, ids, slot lists, spans, the
 *   upload source, the download destination) must lie outside the arena; either mistake is
 *   a TSR_ERR_INVALID with one line naming the op and the argument.
 * - Counters (the op `counters`, tsr_backend_counters): uploads, downloads, host waits,
 *   host arrays handed to ops, op calls, and which transfers touch pageable host memory
 *   (not host_alloc(pinned), not registered), counted as a GPU backend would pay them (a
 *   copy with stream NULL waits, as the CUDA backend's cudaStreamSynchronize after it), and
 *   the copies queued on copy streams, so that a CPU run shows what a step moves and how
 *   often it stops the host.
 * - Copy streams queue their copies until something waits for them (see "copy streams and
 *   events" below), so that a missing wait changes a CPU run's results.
 *
 * Arena size: the arena_bytes given to tsr_backend_fenced_create, or, when that is 0, the
 * environment variable TSR_FENCED_MEMORY (bytes, with an optional K, M, G or T suffix,
 * powers of 1024; anything else is an error naming the variable), or else 4 GiB capped at
 * half of the host's MemAvailable. Rounded up to whole 4096-byte pages. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE, MADV_DONTNEED */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"
#include "kernels/backend.h"

#define TSR__FENCE_PAGE ((size_t)4096)
#define TSR__FENCE_DEFAULT ((size_t)4 << 30)

/* A run of arena bytes [off, off + len); for a live buffer, `asked` of them were asked
 * for (the contract checks hold ops to those, not to the page-rounded length). */
typedef struct tsr__range {
    size_t off, len;
    size_t asked;
} tsr__range;

/* Ranges sorted by offset, never overlapping. */
typedef struct tsr__ranges {
    tsr__range *v;
    size_t n, cap;
} tsr__ranges;

/* The counters (tsr_backend_counters' fields, in its order). */
enum {
    TSR__CNT_UP, TSR__CNT_UP_BYTES, TSR__CNT_DOWN, TSR__CNT_DOWN_BYTES, TSR__CNT_SYNC,
    TSR__CNT_ARGS, TSR__CNT_ARG_BYTES, TSR__CNT_OPS, TSR__CNT_PAGEABLE, TSR__CNT_STREAM,
    TSR__CNT_N
};

/* Host memory a GPU could copy asynchronously: host_alloc(pinned) buffers and registered
 * ranges, so that the counters tell a pinned staging copy from a pageable one. */
typedef struct tsr__pinned {
    const char *p;
    size_t bytes;
} tsr__pinned;

typedef struct tsr__fenced {
    tsr_backend *inner; /* the CPU backend whose ops run inside the open fence */
    const tsr_backend *self; /* its flags (gguf_blocks) */
    char *base;
    size_t size;
    tsr__ranges free_list; /* free runs, coalesced: no two touch */
    tsr__ranges used;      /* live buffers */
    size_t free_bytes;
    /* The fence: open while depth > 0, over [base, base + opened). */
    pthread_mutex_t lock;
    int depth;
    size_t opened;
    bool bad_free_reported;
    tsr__pinned *pinned; /* under lock */
    /* graph_begin .. graph_end: the waits and pageable copies counted at graph_begin */
    bool in_graph;
    int64_t graph_syncs, graph_pageable;
    size_t n_pinned, pinned_cap;
    /* TSR__CNT_*; atomic: ops may run on several threads */
    _Atomic int64_t cnt[TSR__CNT_N];
} tsr__fenced;

static void tsr__count(tsr__fenced *f, int what, int64_t n) {
    atomic_fetch_add_explicit(&f->cnt[what], n, memory_order_relaxed);
}

/* [p, p + bytes) lies inside one pinned host buffer. */
static bool tsr__is_pinned(tsr__fenced *f, const void *p, size_t bytes) {
    const char *c = p;
    bool in = false;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_pinned && !in; i++)
        in = c >= f->pinned[i].p && (size_t)(c - f->pinned[i].p) <= f->pinned[i].bytes &&
             bytes <= f->pinned[i].bytes - (size_t)(c - f->pinned[i].p);
    pthread_mutex_unlock(&f->lock);
    return in;
}

/* One transfer of `bytes` (up or down) from or to host memory `host`; stream NULL: the
 * host waits for it, else one copy queued on a copy stream. */
static void tsr__count_copy(tsr__fenced *f, bool up, size_t bytes, const void *host,
                            const tsr_stream *stream) {
    tsr__count(f, up ? TSR__CNT_UP : TSR__CNT_DOWN, 1);
    tsr__count(f, up ? TSR__CNT_UP_BYTES : TSR__CNT_DOWN_BYTES, (int64_t)bytes);
    tsr__count(f, stream ? TSR__CNT_STREAM : TSR__CNT_SYNC, 1);
    if (!tsr__is_pinned(f, host, bytes)) tsr__count(f, TSR__CNT_PAGEABLE, 1);
}

/* ---- the arena's bookkeeping ---- */

static bool tsr__ranges_reserve(tsr__ranges *r, size_t n) {
    if (n <= r->cap) return true;
    size_t cap = r->cap ? r->cap : 16;
    while (cap < n) cap *= 2;
    tsr__range *v = tsr_realloc(r->v, cap * sizeof *v);
    if (!v) return false;
    r->v = v;
    r->cap = cap;
    return true;
}

/* Index of the first range whose offset is > off (n when none). */
static size_t tsr__ranges_upper(const tsr__ranges *r, size_t off) {
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->v[mid].off <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Capacity was reserved by the caller. */
static void tsr__ranges_insert(tsr__ranges *r, size_t at, tsr__range x) {
    memmove(r->v + at + 1, r->v + at, (r->n - at) * sizeof *r->v);
    r->v[at] = x;
    r->n++;
}

static void tsr__ranges_remove(tsr__ranges *r, size_t at) {
    memmove(r->v + at, r->v + at + 1, (r->n - at - 1) * sizeof *r->v);
    r->n--;
}

/* End of the last live buffer: the part of the arena an op may touch. */
static size_t tsr__fenced_extent(const tsr__fenced *f) {
    return f->used.n ? f->used.v[f->used.n - 1].off + f->used.v[f->used.n - 1].len : 0;
}

/* ---- the fence ---- */

static tsr_status tsr__fence_open(tsr__fenced *f) {
    tsr_status st = TSR_OK;
    pthread_mutex_lock(&f->lock);
    size_t want = tsr__fenced_extent(f);
    /* Nested or concurrent calls share one open window; a buffer allocated while it is
     * open widens it. */
    if (want > (f->depth > 0 ? f->opened : 0)) {
        if (mprotect(f->base, want, PROT_READ | PROT_WRITE) != 0)
            st = tsr_error_set(TSR_ERR_IO, "cpu-fenced: cannot open the arena (mprotect: %s)",
                               strerror(errno));
        else
            f->opened = want;
    }
    if (st == TSR_OK) f->depth++;
    pthread_mutex_unlock(&f->lock);
    return st;
}

static tsr_status tsr__fence_close(tsr__fenced *f) {
    tsr_status st = TSR_OK;
    pthread_mutex_lock(&f->lock);
    if (--f->depth == 0 && f->opened) {
        if (mprotect(f->base, f->opened, PROT_NONE) != 0)
            st = tsr_error_set(TSR_ERR_IO, "cpu-fenced: cannot close the arena (mprotect: %s)",
                               strerror(errno));
        f->opened = 0;
    }
    pthread_mutex_unlock(&f->lock);
    return st;
}

/* Closes the fence after an op; the op's own failure wins over the close's. */
static tsr_status tsr__fence_end(tsr__fenced *f, tsr_status op_status) {
    tsr_status st = tsr__fence_close(f);
    return op_status != TSR_OK ? op_status : st;
}

/* ---- contract checks ---- */

/* a * b * c, saturating at SIZE_MAX (which no buffer holds); negative counts saturate too. */
static size_t tsr__bytes3(int64_t a, int64_t b, int64_t c) {
    if (a < 0 || b < 0 || c < 0) return SIZE_MAX;
    size_t ab, abc;
    if (!tsr_mul_size((size_t)a, (size_t)b, &ab) || !tsr_mul_size(ab, (size_t)c, &abc))
        return SIZE_MAX;
    return abc;
}

static bool tsr__in_arena(const tsr__fenced *f, const void *p) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)f->base;
    return a >= b && a - b < f->size;
}

/* [p, p + bytes) must lie inside one live buffer (nothing to check when bytes is 0). */
static tsr_status tsr__dev(tsr__fenced *f, const char *op, const char *arg, const void *p,
                           size_t bytes) {
    if (bytes == 0) return TSR_OK;
    if (!p || !tsr__in_arena(f, p))
        return tsr_error_set(TSR_ERR_INVALID,
                             "cpu-fenced: %s: %s is not device memory (host pointer passed to "
                             "a device op)",
                             op, arg);
    size_t off = (size_t)((const char *)p - f->base);
    bool ok = false;
    pthread_mutex_lock(&f->lock);
    size_t i = tsr__ranges_upper(&f->used, off);
    if (i > 0) {
        const tsr__range *b = &f->used.v[i - 1];
        ok = off - b->off < b->asked && bytes <= b->asked - (off - b->off);
    }
    pthread_mutex_unlock(&f->lock);
    if (!ok)
        return tsr_error_set(TSR_ERR_INVALID,
                             "cpu-fenced: %s: %s (%zu bytes at arena offset %zu) is not inside "
                             "a live device buffer (freed, or past its end)",
                             op, arg, bytes, off);
    return TSR_OK;
}

/* [p, p + bytes) is host memory by the contract: it must not touch the arena. NULL passes
 * (optional arguments; a required one fails in the op itself). */
static tsr_status tsr__host(const tsr__fenced *f, const char *op, const char *arg,
                            const void *p, size_t bytes) {
    if (!p || bytes == 0) return TSR_OK;
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)f->base;
    bool overlaps = a < b + f->size && (a >= b || b - a < bytes);
    if (overlaps)
        return tsr_error_set(TSR_ERR_INVALID,
                             "cpu-fenced: %s: %s is device memory where the contract wants host "
                             "memory (device pointer passed as host data)",
                             op, arg);
    return TSR_OK;
}

/* A host array an op reads besides its data (positions, ids, slots, spans, ...): checked
 * as host memory, and counted, since a device backend stages it with a copy. */
static tsr_status tsr__arg(tsr__fenced *f, const char *op, const char *arg, const void *p,
                           size_t bytes) {
    TSR_TRY(tsr__host(f, op, arg, p, bytes));
    if (p && bytes && bytes != SIZE_MAX) {
        tsr__count(f, TSR__CNT_ARGS, 1);
        tsr__count(f, TSR__CNT_ARG_BYTES, (int64_t)bytes);
        if (!tsr__is_pinned(f, p, bytes)) tsr__count(f, TSR__CNT_PAGEABLE, 1);
    }
    return TSR_OK;
}

/* The step's metadata (backend.h: rope positions, embed ids, kv_write slots): a host
 * array as tsr__arg, or backend memory inside a live buffer, which nothing stages or
 * counts. */
static tsr_status tsr__meta(tsr__fenced *f, const char *op, const char *arg, const void *p,
                            size_t bytes) {
    if (p && tsr__in_arena(f, p)) return tsr__dev(f, op, arg, p, bytes);
    return tsr__arg(f, op, arg, p, bytes);
}

/* Every K and V row the slots name lies inside the layout's live buffer. */
static tsr_status tsr__dev_slots(tsr__fenced *f, const char *op, const tsr_kv_layout *lay,
                                 const int32_t *slots, int64_t n) {
    if (n <= 0) return TSR_OK;
    if (lay->block <= 0 || lay->row <= 0 || lay->block_stride < 0)
        return tsr_error_set(TSR_ERR_INVALID,
                             "cpu-fenced: %s: bad KV layout (block %d, row %d, block stride "
                             "%lld)",
                             op, (int)lay->block, (int)lay->row, (long long)lay->block_stride);
    TSR_TRY(tsr__dev(f, op, "layout k", lay->k, 1));
    TSR_TRY(tsr__dev(f, op, "layout v", lay->v, 1));
    size_t rb = tsr_kv_row_bytes(lay->dtype, lay->row);
    if (rb == 0)
        return tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: %s: KV dtype %s cannot store rows "
                             "of %d", op, tsr_kv_dtype_name(lay->dtype), (int)lay->row);
    for (int64_t i = 0; i < n; i++) {
        int32_t s = slots[i];
        if (s < 0)
            return tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: %s: negative slot %d", op,
                                 (int)s);
        TSR_TRY(tsr__dev(f, op, "layout k row of a slot", tsr_kv_layout_row(lay, 0, s), rb));
        TSR_TRY(tsr__dev(f, op, "layout v row of a slot", tsr_kv_layout_row(lay, 1, s), rb));
    }
    return TSR_OK;
}

#define TSR__INNER(be) (((tsr__fenced *)(be)->ctx)->inner)
#define TSR__F(be) ((tsr__fenced *)(be)->ctx)

/* ---- memory ---- */

static tsr_status tsr__fenced_buffer_alloc(tsr_backend *be, size_t bytes, void **out) {
    tsr__fenced *f = TSR__F(be);
    *out = NULL;
    size_t need = bytes ? bytes : 1;
    if (need > SIZE_MAX - TSR__FENCE_PAGE) need = SIZE_MAX - TSR__FENCE_PAGE;
    need = (need + TSR__FENCE_PAGE - 1) & ~(TSR__FENCE_PAGE - 1);
    tsr_status st = TSR_OK;
    pthread_mutex_lock(&f->lock);
    /* Room for the new buffer and for a later free that splits nothing: the free list
     * never holds more runs than there are live buffers + 1, so freeing needs no memory. */
    if (!tsr__ranges_reserve(&f->used, f->used.n + 1) ||
        !tsr__ranges_reserve(&f->free_list, f->used.n + 2)) {
        st = tsr_error_set(TSR_ERR_NOMEM, "cpu-fenced: cannot grow the allocator's tables");
        goto done;
    }
    size_t i = 0;
    while (i < f->free_list.n && f->free_list.v[i].len < need) i++;
    if (i == f->free_list.n) {
        st = tsr_error_set(TSR_ERR_NOMEM,
                           "cpu-fenced: out of device memory: %zu bytes asked, %zu free of %zu",
                           bytes, f->free_bytes, f->size);
        goto done;
    }
    tsr__range blk = {f->free_list.v[i].off, need, bytes};
    if (f->free_list.v[i].len == need) {
        tsr__ranges_remove(&f->free_list, i);
    } else {
        f->free_list.v[i].off += need;
        f->free_list.v[i].len -= need;
    }
    tsr__ranges_insert(&f->used, tsr__ranges_upper(&f->used, blk.off), blk);
    f->free_bytes -= need;
    *out = f->base + blk.off;
done:
    pthread_mutex_unlock(&f->lock);
    return st;
}

static void tsr__fenced_buffer_free(tsr_backend *be, void *ptr) {
    tsr__fenced *f = TSR__F(be);
    if (!ptr) return;
    pthread_mutex_lock(&f->lock);
    size_t off = tsr__in_arena(f, ptr) ? (size_t)((char *)ptr - f->base) : SIZE_MAX;
    size_t i = off == SIZE_MAX ? 0 : tsr__ranges_upper(&f->used, off);
    if (off == SIZE_MAX || i == 0 || f->used.v[i - 1].off != off) {
        /* Not a live buffer of this arena (a host pointer, or a second free): ignoring it
         * keeps the allocator whole; one line says the caller has a bug. */
        if (!f->bad_free_reported)
            TSR_LOG_WARN("cpu-fenced: buffer_free of %p, which is not a live device buffer "
                         "(double free or foreign pointer): ignored; further ones silently",
                         ptr);
        f->bad_free_reported = true;
        pthread_mutex_unlock(&f->lock);
        return;
    }
    tsr__range blk = f->used.v[i - 1];
    tsr__ranges_remove(&f->used, i - 1);
    /* The pages go back to the host; the next owner gets zeros (contents are undefined
     * anyway). Advice only: failing leaves them resident, nothing worse. */
    (void)madvise(f->base + blk.off, blk.len, MADV_DONTNEED);
    f->free_bytes += blk.len;
    tsr__ranges *fl = &f->free_list;
    size_t j = tsr__ranges_upper(fl, blk.off);
    bool prev = j > 0 && fl->v[j - 1].off + fl->v[j - 1].len == blk.off;
    bool next = j < fl->n && blk.off + blk.len == fl->v[j].off;
    if (prev && next) {
        fl->v[j - 1].len += blk.len + fl->v[j].len;
        tsr__ranges_remove(fl, j);
    } else if (prev) {
        fl->v[j - 1].len += blk.len;
    } else if (next) {
        fl->v[j].off = blk.off;
        fl->v[j].len += blk.len;
    } else {
        tsr__ranges_insert(fl, j, blk); /* capacity reserved at allocation */
    }
    pthread_mutex_unlock(&f->lock);
}

/* Remembers [p, p + bytes) as pinned (for the counters only). */
static tsr_status tsr__pin_add(tsr__fenced *f, const void *p, size_t bytes) {
    tsr_status st = TSR_OK;
    pthread_mutex_lock(&f->lock);
    if (f->n_pinned == f->pinned_cap) {
        size_t cap = f->pinned_cap ? 2 * f->pinned_cap : 8;
        tsr__pinned *v = tsr_realloc(f->pinned, cap * sizeof *v);
        if (v) {
            f->pinned = v;
            f->pinned_cap = cap;
        } else {
            st = TSR_ERR_NOMEM;
        }
    }
    if (st == TSR_OK) f->pinned[f->n_pinned++] = (tsr__pinned){p, bytes};
    pthread_mutex_unlock(&f->lock);
    return st;
}

static void tsr__pin_remove(tsr__fenced *f, const void *p) {
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_pinned; i++)
        if (f->pinned[i].p == p) {
            f->pinned[i] = f->pinned[--f->n_pinned];
            break;
        }
    pthread_mutex_unlock(&f->lock);
}

static tsr_status tsr__fenced_host_alloc(tsr_backend *be, size_t bytes, bool pinned,
                                         void **out) {
    TSR_TRY(TSR__INNER(be)->ops->host_alloc(TSR__INNER(be), bytes, pinned, out));
    tsr_status st = pinned ? tsr__pin_add(TSR__F(be), *out, bytes) : TSR_OK;
    if (st != TSR_OK) {
        TSR__INNER(be)->ops->host_free(TSR__INNER(be), *out);
        *out = NULL;
    }
    return st;
}

static void tsr__fenced_host_free(tsr_backend *be, void *ptr) {
    if (!ptr) return;
    tsr__pin_remove(TSR__F(be), ptr);
    TSR__INNER(be)->ops->host_free(TSR__INNER(be), ptr);
}

/* Host memory made elsewhere (the host pool) counts as pinned once registered. */
static tsr_status tsr__fenced_host_register(tsr_backend *be, void *ptr, size_t bytes) {
    return tsr__pin_add(TSR__F(be), ptr, bytes);
}

static void tsr__fenced_host_unregister(tsr_backend *be, void *ptr) {
    tsr__pin_remove(TSR__F(be), ptr);
}

static tsr_status tsr__fenced_memory(tsr_backend *be, size_t *free_bytes,
                                     size_t *total_bytes) {
    tsr__fenced *f = TSR__F(be);
    pthread_mutex_lock(&f->lock);
    *free_bytes = f->free_bytes;
    *total_bytes = f->size;
    pthread_mutex_unlock(&f->lock);
    return TSR_OK;
}

static tsr_status tsr__fenced_synchronize(tsr_backend *be) {
    tsr__count(TSR__F(be), TSR__CNT_SYNC, 1);
    return TSR__INNER(be)->ops->synchronize(TSR__INNER(be));
}

/* ---- copy streams and events ----
 * A copy queued on a stream does not run at once: it waits in the stream's queue until
 * something needs it, as on a GPU, where it runs at some point between the call and the
 * first wait on it. Queued copies run, in order, when an event recorded after them is
 * waited for (stream_wait by another stream, event_sync), when their stream is destroyed,
 * and never earlier. So a caller that reads a copy's destination without waiting reads the
 * old bytes, and one that rewrites a copy's host source before the wait sends the new
 * ones: on a CPU run, either shows up as different results instead of a race that only a
 * GPU would lose. The compute stream (NULL) runs synchronously: an event recorded on it
 * is complete at once, and a copy stream that waits for it has nothing to wait for. The
 * contract checks and the counters act at the call, the copy itself when it runs. */
enum { TSR__Q_UP, TSR__Q_DOWN, TSR__Q_GATHER, TSR__Q_SCATTER };

typedef struct tsr__qcopy {
    int kind;
    void *dst;
    const void *src;
    size_t bytes;
    tsr_kv_layout lay;
    int32_t *slots; /* the call's slot list, copied: the caller may reuse its array */
    int64_t n;
    float *k, *v;          /* gather destinations */
    const float *ck, *cv;  /* scatter sources */
} tsr__qcopy;

struct tsr_stream {
    tsr__qcopy *q; /* pending copies, oldest first */
    size_t n, cap;
    uint64_t issued, done; /* copies queued and run since creation */
};

struct tsr_event {
    tsr_stream *s; /* NULL: recorded on the compute stream (complete) or never recorded */
    uint64_t at;   /* complete once s->done >= at */
};

/* Runs the oldest pending copies of s until `upto` of its copies have run. */
static tsr_status tsr__stream_run(tsr__fenced *f, tsr_stream *s, uint64_t upto) {
    tsr_status st = TSR_OK;
    while (s->done < upto && s->n > 0 && st == TSR_OK) {
        tsr__qcopy c = s->q[0];
        memmove(s->q, s->q + 1, (s->n - 1) * sizeof *s->q);
        s->n--;
        s->done++;
        st = tsr__fence_open(f);
        if (st != TSR_OK) {
            tsr_free(c.slots);
            break;
        }
        tsr_backend *in = f->inner;
        switch (c.kind) {
        case TSR__Q_UP: st = in->ops->upload(in, c.dst, c.src, c.bytes, NULL); break;
        case TSR__Q_DOWN: st = in->ops->download(in, c.dst, c.src, c.bytes, NULL); break;
        case TSR__Q_GATHER:
            st = in->ops->kv_gather(in, &c.lay, c.slots, c.n, c.k, c.v, NULL);
            break;
        default: st = in->ops->kv_scatter(in, &c.lay, c.slots, c.n, c.ck, c.cv, NULL); break;
        }
        st = tsr__fence_end(f, st);
        tsr_free(c.slots);
    }
    return st;
}

/* Queues c on s (the slot list copied). */
static tsr_status tsr__stream_push(tsr_stream *s, tsr__qcopy c, const int32_t *slots) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        tsr__qcopy *q = tsr_realloc(s->q, cap * sizeof *q);
        if (!q) return TSR_ERR_NOMEM;
        s->q = q;
        s->cap = cap;
    }
    if (slots && c.n > 0) {
        c.slots = tsr_malloc((size_t)c.n * sizeof *c.slots);
        if (!c.slots) return TSR_ERR_NOMEM;
        memcpy(c.slots, slots, (size_t)c.n * sizeof *c.slots);
    }
    s->q[s->n++] = c;
    s->issued++;
    return TSR_OK;
}

static tsr_status tsr__fenced_stream_create(tsr_backend *be, tsr_stream **out) {
    (void)be;
    *out = tsr_calloc(1, sizeof **out);
    return *out ? TSR_OK : TSR_ERR_NOMEM;
}

/* A stream's pending copies complete before it goes (cudaStreamDestroy lets them). */
static void tsr__fenced_stream_destroy(tsr_backend *be, tsr_stream *stream) {
    if (!stream) return;
    if (tsr__stream_run(TSR__F(be), stream, stream->issued) != TSR_OK)
        TSR_LOG_WARN("cpu-fenced: a queued copy failed at stream_destroy: %s",
                     tsr_last_error());
    for (size_t i = 0; i < stream->n; i++) tsr_free(stream->q[i].slots);
    tsr_free(stream->q);
    tsr_free(stream);
}

static tsr_status tsr__fenced_event_create(tsr_backend *be, tsr_event **out) {
    (void)be;
    *out = tsr_calloc(1, sizeof **out);
    return *out ? TSR_OK : TSR_ERR_NOMEM;
}

static void tsr__fenced_event_destroy(tsr_backend *be, tsr_event *ev) {
    (void)be;
    tsr_free(ev);
}

static tsr_status tsr__fenced_event_record(tsr_backend *be, tsr_event *ev, tsr_stream *stream) {
    (void)be;
    ev->s = stream;
    ev->at = stream ? stream->issued : 0;
    return TSR_OK;
}

/* The waiting stream's later work follows ev: the copies before ev run now (the compute
 * stream runs its ops at once; a copy stream waiting on another could run them later, but
 * now is a schedule a GPU may pick too). */
static tsr_status tsr__fenced_stream_wait(tsr_backend *be, tsr_stream *stream, tsr_event *ev) {
    tsr__fenced *f = TSR__F(be);
    return ev->s && ev->s != stream ? tsr__stream_run(f, ev->s, ev->at) : TSR_OK;
}

static tsr_status tsr__fenced_event_sync(tsr_backend *be, tsr_event *ev) {
    tsr__count(TSR__F(be), TSR__CNT_SYNC, 1);
    return ev->s ? tsr__stream_run(TSR__F(be), ev->s, ev->at) : TSR_OK;
}

static tsr_status tsr__fenced_upload(tsr_backend *be, void *dst, const void *src, size_t bytes,
                                     tsr_stream *stream) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "upload", "dst", dst, bytes));
    TSR_TRY(tsr__host(f, "upload", "src", src, bytes));
    tsr__count_copy(f, true, bytes, src, stream);
    if (stream)
        return tsr__stream_push(stream, (tsr__qcopy){.kind = TSR__Q_UP, .dst = dst, .src = src,
                                                     .bytes = bytes}, NULL);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->upload(f->inner, dst, src, bytes, stream));
}

static tsr_status tsr__fenced_download(tsr_backend *be, void *dst, const void *src,
                                       size_t bytes, tsr_stream *stream) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "download", "src", src, bytes));
    TSR_TRY(tsr__host(f, "download", "dst", dst, bytes));
    tsr__count_copy(f, false, bytes, dst, stream);
    if (stream)
        return tsr__stream_push(stream, (tsr__qcopy){.kind = TSR__Q_DOWN, .dst = dst,
                                                     .src = src, .bytes = bytes}, NULL);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->download(f->inner, dst, src, bytes, stream));
}

static tsr_status tsr__fenced_copy(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "copy", "dst", dst, bytes));
    TSR_TRY(tsr__dev(f, "copy", "src", src, bytes));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->copy(f->inner, dst, src, bytes));
}

static tsr_status tsr__fenced_memset(tsr_backend *be, void *dst, int byte, size_t bytes) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "memset", "dst", dst, bytes));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->memset(f->inner, dst, byte, bytes));
}

static const char *tsr__fenced_device_name(tsr_backend *be) {
    (void)be;
    return "cpu-fenced (CPU kernels on a host-inaccessible arena)";
}

/* ---- KV rows by slot ---- */

static size_t tsr__rows_bytes(const tsr_kv_layout *lay, int64_t n) {
    return tsr__bytes3(n, lay->row, (int64_t)sizeof(float));
}

static tsr_status tsr__fenced_kv_write(tsr_backend *be, const tsr_kv_layout *lay,
                                       const int32_t *slots, int64_t n, const float *k,
                                       const float *v) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__meta(f, "kv_write", "slots", slots, tsr__bytes3(n, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev(f, "kv_write", "k", k, tsr__rows_bytes(lay, n)));
    TSR_TRY(tsr__dev(f, "kv_write", "v", v, tsr__rows_bytes(lay, n)));
    tsr__count(f, TSR__CNT_OPS, 1);
    /* device slots are readable only inside the fence: checked there */
    TSR_TRY(tsr__fence_open(f));
    tsr_status st = tsr__dev_slots(f, "kv_write", lay, slots, n);
    if (st == TSR_OK) st = f->inner->ops->kv_write(f->inner, lay, slots, n, k, v);
    return tsr__fence_end(f, st);
}

static tsr_status tsr__fenced_kv_copy(tsr_backend *be, const tsr_kv_layout *lay,
                                      const int32_t *dst, const int32_t *src, int64_t n) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__arg(f, "kv_copy", "dst slots", dst, tsr__bytes3(n, 1, sizeof(int32_t))));
    TSR_TRY(tsr__arg(f, "kv_copy", "src slots", src, tsr__bytes3(n, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev_slots(f, "kv_copy", lay, dst, n));
    TSR_TRY(tsr__dev_slots(f, "kv_copy", lay, src, n));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->kv_copy(f->inner, lay, dst, src, n));
}

static tsr_status tsr__fenced_kv_gather(tsr_backend *be, const tsr_kv_layout *lay,
                                        const int32_t *slots, int64_t n, float *k, float *v,
                                        tsr_stream *stream) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__arg(f, "kv_gather", "slots", slots, tsr__bytes3(n, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev_slots(f, "kv_gather", lay, slots, n));
    TSR_TRY(tsr__host(f, "kv_gather", "k", k, tsr__rows_bytes(lay, n)));
    TSR_TRY(tsr__host(f, "kv_gather", "v", v, tsr__rows_bytes(lay, n)));
    tsr__count_copy(f, false, tsr__rows_bytes(lay, n) * ((k != NULL) + (v != NULL)),
                    k ? (const void *)k : v, stream);
    if (stream)
        return tsr__stream_push(stream, (tsr__qcopy){.kind = TSR__Q_GATHER, .lay = *lay,
                                                     .n = n, .k = k, .v = v}, slots);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->kv_gather(f->inner, lay, slots, n, k, v, stream));
}

static tsr_status tsr__fenced_kv_scatter(tsr_backend *be, const tsr_kv_layout *lay,
                                         const int32_t *slots, int64_t n, const float *k,
                                         const float *v, tsr_stream *stream) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__arg(f, "kv_scatter", "slots", slots, tsr__bytes3(n, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev_slots(f, "kv_scatter", lay, slots, n));
    TSR_TRY(tsr__host(f, "kv_scatter", "k", k, tsr__rows_bytes(lay, n)));
    TSR_TRY(tsr__host(f, "kv_scatter", "v", v, tsr__rows_bytes(lay, n)));
    tsr__count_copy(f, true, tsr__rows_bytes(lay, n) * ((k != NULL) + (v != NULL)),
                    k ? (const void *)k : v, stream);
    if (stream)
        return tsr__stream_push(stream, (tsr__qcopy){.kind = TSR__Q_SCATTER, .lay = *lay,
                                                     .n = n, .ck = k, .cv = v}, slots);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->kv_scatter(f->inner, lay, slots, n, k, v, stream));
}

/* ---- compute ---- */

static tsr_status tsr__dev_tensor(tsr__fenced *f, const char *op, const char *arg,
                                  const tsr_tensor *w) {
    bool gguf = w->dtype == TSR_Q4_0 || w->dtype == TSR_Q4_1 || w->dtype == TSR_Q4_K ||
                w->dtype == TSR_Q5_K || w->dtype == TSR_Q6_K;
    if (gguf && !f->self->gguf_blocks) /* as a device without their kernels would */
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu-fenced %s: %s %s without gguf_blocks",
                             op, tsr_dtype_name(w->dtype), arg);
    if (gguf || w->dtype == TSR_Q8_0 || w->dtype == TSR_MXFP4) /* scales, padding */
        return tsr__dev(f, op, arg, w->data, w->rows > 0 && w->cols > 0 ? tsr_tensor_bytes(w) : 0);
    return tsr__dev(f, op, arg, w->data, tsr__bytes3(w->rows, w->cols,
                                                     (int64_t)tsr_dtype_size(w->dtype)));
}

static tsr_status tsr__fenced_matmul(tsr_backend *be, const float *x, int64_t n,
                                     const tsr_tensor *w, float *y) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev_tensor(f, "matmul", "weight", w));
    TSR_TRY(tsr__dev(f, "matmul", "x", x, tsr__bytes3(n, w->cols, sizeof(float))));
    TSR_TRY(tsr__dev(f, "matmul", "y", y, tsr__bytes3(n, w->rows, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->matmul(f->inner, x, n, w, y));
}

static tsr_status tsr__fenced_matmul_parts(tsr_backend *be, const float *x, int64_t n,
                                           const tsr_tensor *w, const int32_t *seg,
                                           int n_parts, bool sum, float *y) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev_tensor(f, "matmul_parts", "weight", w));
    TSR_TRY(tsr__dev(f, "matmul_parts", "x", x, tsr__bytes3(n, w->cols, sizeof(float))));
    TSR_TRY(tsr__dev(f, "matmul_parts", "y", y,
                     tsr__bytes3(sum ? 1 : n_parts, n * w->rows, sizeof(float))));
    /* Host memory, but launch geometry, not metadata: a device backend reads the segments
     * on the host to place its GEMMs and copies nothing, so they are no host array. */
    TSR_TRY(tsr__host(f, "matmul_parts", "seg", seg,
                      tsr__bytes3(n_parts + 1, 1, sizeof(int32_t))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f,
                          f->inner->ops->matmul_parts(f->inner, x, n, w, seg, n_parts, sum, y));
}

static tsr_status tsr__fenced_matmul_parts_acc(tsr_backend *be, const float *x, int64_t n,
                                               const tsr_tensor *w, const int32_t *seg,
                                               int n_parts, float *y) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev_tensor(f, "matmul_parts_acc", "weight", w));
    TSR_TRY(tsr__dev(f, "matmul_parts_acc", "x", x, tsr__bytes3(n, w->cols, sizeof(float))));
    TSR_TRY(tsr__dev(f, "matmul_parts_acc", "y", y, tsr__bytes3(n, w->rows, sizeof(float))));
    TSR_TRY(tsr__host(f, "matmul_parts_acc", "seg", seg,
                      tsr__bytes3(n_parts + 1, 1, sizeof(int32_t))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f,
                          f->inner->ops->matmul_parts_acc(f->inner, x, n, w, seg, n_parts, y));
}

static tsr_status tsr__fenced_sample(tsr_backend *be, float *logits, int64_t n, int vocab,
                                     const tsr_sample_params *params, int32_t *ids) {
    tsr__fenced *f = TSR__F(be);
    if (n <= 0) return TSR_OK;
    TSR_TRY(tsr__dev(f, "sample", "logits", logits, tsr__bytes3(n, vocab, sizeof(float))));
    TSR_TRY(tsr__arg(f, "sample", "params", params, tsr__bytes3(n, 1, sizeof *params)));
    TSR_TRY(tsr__host(f, "sample", "ids", ids, tsr__bytes3(n, 1, sizeof(int32_t))));
    tsr__count(f, TSR__CNT_OPS, 1);
    tsr__count(f, TSR__CNT_SYNC, 1); /* the ids come back */
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->sample(f->inner, logits, n, vocab, params, ids));
}

static tsr_status tsr__fenced_rmsnorm(tsr_backend *be, const float *x, const tsr_tensor *w,
                                      int64_t n, int dim, float eps, float *out) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev_tensor(f, "rmsnorm", "weight", w));
    TSR_TRY(tsr__dev(f, "rmsnorm", "x", x, tsr__bytes3(n, dim, sizeof(float))));
    TSR_TRY(tsr__dev(f, "rmsnorm", "out", out, tsr__bytes3(n, dim, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->rmsnorm(f->inner, x, w, n, dim, eps, out));
}

static tsr_status tsr__fenced_rope(tsr_backend *be, float *x, const int32_t *pos, int64_t n,
                                   int n_heads, const tsr_model_config *cfg) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "rope", "x", x,
                     tsr__bytes3(n, (int64_t)n_heads * cfg->head_dim, sizeof(float))));
    TSR_TRY(tsr__meta(f, "rope", "pos", pos, tsr__bytes3(n, 1, sizeof(int32_t))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->rope(f->inner, x, pos, n, n_heads, cfg));
}

static tsr_status tsr__fenced_swiglu(tsr_backend *be, float *gate, const float *up, int64_t n) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "swiglu", "gate", gate, tsr__bytes3(n, 1, sizeof(float))));
    TSR_TRY(tsr__dev(f, "swiglu", "up", up, tsr__bytes3(n, 1, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->swiglu(f->inner, gate, up, n));
}

static tsr_status tsr__fenced_add(tsr_backend *be, float *x, const float *y, int64_t n) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "add", "x", x, tsr__bytes3(n, 1, sizeof(float))));
    TSR_TRY(tsr__dev(f, "add", "y", y, tsr__bytes3(n, 1, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->add(f->inner, x, y, n));
}

static tsr_status tsr__fenced_bias_add(tsr_backend *be, float *x, const tsr_tensor *b,
                                       int64_t n) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev_tensor(f, "bias_add", "bias", b));
    TSR_TRY(tsr__dev(f, "bias_add", "x", x, tsr__bytes3(n, b->cols, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->bias_add(f->inner, x, b, n));
}

static tsr_status tsr__fenced_embed(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids,
                                    int64_t n, float *out) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev_tensor(f, "embed", "weight", emb));
    TSR_TRY(tsr__meta(f, "embed", "ids", ids, tsr__bytes3(n, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev(f, "embed", "out", out, tsr__bytes3(n, emb->cols, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->embed(f->inner, emb, ids, n, out));
}

static tsr_status tsr__fenced_attention(tsr_backend *be, const tsr_attn_args *a) {
    tsr__fenced *f = TSR__F(be);
    const char *op = "attention";
    int64_t q_row = (int64_t)a->n_heads * a->head_dim;
    int64_t kv_dim = (int64_t)a->n_kv_heads * a->head_dim;
    TSR_TRY(tsr__host(f, op, "args", a, sizeof *a));
    TSR_TRY(tsr__dev(f, op, "q", a->q, tsr__bytes3(a->n_q, q_row, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "out", a->out, tsr__bytes3(a->n_q, q_row, sizeof(float))));
    TSR_TRY(tsr__arg(f, op, "q_pos", a->q_pos, tsr__bytes3(a->n_q, 1, sizeof(int32_t))));
    TSR_TRY(tsr__arg(f, op, "spans", a->spans,
                      tsr__bytes3(a->n_spans, 1, sizeof(tsr_kv_span))));
    int64_t keys = 0;
    for (int s = 0; s < a->n_spans; s++) {
        const tsr_kv_span *sp = &a->spans[s];
        if (sp->n <= 0) continue;
        /* the last row is kv_dim floats, the others stride apart; other dtypes: n whole
         * stored rows of kv_dim */
        size_t bytes = tsr__bytes3(sp->n - 1, sp->stride, sizeof(float));
        size_t last = tsr__bytes3(kv_dim, 1, sizeof(float));
        bytes = bytes > SIZE_MAX - last ? SIZE_MAX : bytes + last;
        if (sp->dtype != TSR_KV_F32)
            bytes = tsr__bytes3(sp->n, (int64_t)tsr_kv_row_bytes(sp->dtype, kv_dim), 1);
        TSR_TRY(tsr__dev(f, op, "span k", sp->k, bytes));
        TSR_TRY(tsr__dev(f, op, "span v", sp->v, bytes));
        TSR_TRY(tsr__arg(f, op, "span pos", sp->pos, tsr__bytes3(sp->n, 1, sizeof(int32_t))));
        keys += sp->n;
    }
    if (a->key_scores)
        TSR_TRY(tsr__dev(f, op, "key_scores", a->key_scores,
                         tsr__bytes3(a->n_heads, keys, sizeof(float))));
    if (a->sinks)
        TSR_TRY(tsr__dev(f, op, "sinks", a->sinks, tsr__bytes3(a->n_heads, 1, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->attention(f->inner, a));
}

/* GPT-OSS: the experts' tensors and the activations are device memory, the routing is host
 * metadata. */
static tsr_status tsr__fenced_moe(tsr_backend *be, const tsr_moe_args *a) {
    tsr__fenced *f = TSR__F(be);
    const char *op = "moe";
    const tsr_experts *ex[2] = {a->gate_up, a->down};
    TSR_TRY(tsr__host(f, op, "args", a, sizeof *a));
    for (int i = 0; i < 2; i++) {
        TSR_TRY(tsr__host(f, op, "experts", ex[i], sizeof *ex[i]));
        TSR_TRY(tsr__dev_tensor(f, op, "experts", &ex[i]->w));
        TSR_TRY(tsr__dev_tensor(f, op, "expert bias", &ex[i]->bias));
        if (ex[i]->mxfp4) TSR_TRY(tsr__dev_tensor(f, op, "expert scales", &ex[i]->scales));
    }
    int ne = a->gate_up->n;
    TSR_TRY(tsr__arg(f, op, "offsets", a->offsets, tsr__bytes3(ne + 1, 1, sizeof(int32_t))));
    int64_t routes = a->offsets[ne];
    TSR_TRY(tsr__arg(f, op, "rows", a->rows, tsr__bytes3(routes, 1, sizeof(int32_t))));
    TSR_TRY(tsr__arg(f, op, "weights", a->weights, tsr__bytes3(routes, 1, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "x", a->x, tsr__bytes3(a->n, a->gate_up->cols, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "out", a->out, tsr__bytes3(a->n, a->down->rows, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->moe(f->inner, a));
}

/* Everything is backend memory; the tables are checked by the inner op, inside the fence,
 * against n_seqs and max_blocks, and every block they name against the layout here. */
static tsr_status tsr__fenced_attention_paged(tsr_backend *be, const tsr_attn_paged_args *a) {
    tsr__fenced *f = TSR__F(be);
    const char *op = "attention_paged";
    if (a->n_q <= 0) return TSR_OK;
    int64_t q_row = (int64_t)a->n_heads * a->head_dim;
    TSR_TRY(tsr__host(f, op, "args", a, sizeof *a));
    TSR_TRY(tsr__dev(f, op, "q", a->q, tsr__bytes3(a->n_q, q_row, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "out", a->out, tsr__bytes3(a->n_q, q_row, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "q_pos", a->q_pos, tsr__bytes3(a->n_q, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev(f, op, "q_seq", a->q_seq, tsr__bytes3(a->n_q, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev(f, op, "n_keys", a->n_keys, tsr__bytes3(a->n_seqs, 1, sizeof(int32_t))));
    TSR_TRY(tsr__dev(f, op, "tables", a->tables,
                     tsr__bytes3(a->n_seqs, a->max_blocks, sizeof(int32_t))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    tsr_status st = TSR_OK;
    for (int s = 0; s < a->n_seqs && st == TSR_OK; s++) {
        int32_t nk = a->n_keys[s];
        int32_t nb = a->lay.block > 0 && nk > 0 ? (nk + a->lay.block - 1) / a->lay.block : 0;
        if (nb > a->max_blocks) {
            st = tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: %s: sequence %d has %d keys, "
                               "more than its table holds", op, s, (int)nk);
            break;
        }
        /* the table's blocks, as slots: each block's first row (the rows follow it) */
        for (int32_t j = 0; j < nb && st == TSR_OK; j++) {
            int32_t slot = a->tables[(size_t)s * (size_t)a->max_blocks + (size_t)j] *
                           a->lay.block;
            int32_t last = slot + a->lay.block - 1;
            st = tsr__dev_slots(f, op, &a->lay, &slot, 1);
            if (st == TSR_OK) st = tsr__dev_slots(f, op, &a->lay, &last, 1);
        }
    }
    if (st == TSR_OK) st = f->inner->ops->attention_paged(f->inner, a);
    return tsr__fence_end(f, st);
}

static tsr_status tsr__fenced_qkv_rope(tsr_backend *be, const tsr_qkv_rope_args *a) {
    tsr__fenced *f = TSR__F(be);
    const char *op = "qkv_rope";
    if (a->n <= 0) return TSR_OK;
    int64_t hd = a->cfg->head_dim, qd = a->n_heads * hd, kvd = a->n_kv_heads * hd;
    TSR_TRY(tsr__host(f, op, "args", a, sizeof *a));
    TSR_TRY(tsr__dev(f, op, "qkv", a->qkv, tsr__bytes3(a->n, qd + 2 * kvd, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "q", a->q, tsr__bytes3(a->n, qd, sizeof(float))));
    TSR_TRY(tsr__meta(f, op, "pos", a->pos, tsr__bytes3(a->n, 1, sizeof(int32_t))));
    if (a->bias) TSR_TRY(tsr__dev_tensor(f, op, "bias", a->bias));
    if (a->q_norm) TSR_TRY(tsr__dev_tensor(f, op, "q_norm", a->q_norm));
    if (a->k_norm) TSR_TRY(tsr__dev_tensor(f, op, "k_norm", a->k_norm));
    if (a->lay) {
        TSR_TRY(tsr__meta(f, op, "slots", a->slots, tsr__bytes3(a->n, 1, sizeof(int32_t))));
    } else {
        TSR_TRY(tsr__dev(f, op, "k", a->k, tsr__bytes3(a->n, kvd, sizeof(float))));
        TSR_TRY(tsr__dev(f, op, "v", a->v, tsr__bytes3(a->n, kvd, sizeof(float))));
    }
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    /* device slots are readable only inside the fence: checked there */
    tsr_status st = a->lay ? tsr__dev_slots(f, op, a->lay, a->slots, a->n) : TSR_OK;
    if (st == TSR_OK) st = f->inner->ops->qkv_rope(f->inner, a);
    return tsr__fence_end(f, st);
}

static tsr_status tsr__fenced_swiglu_fused(tsr_backend *be, const float *gu, int64_t n,
                                           int hidden, float *out) {
    tsr__fenced *f = TSR__F(be);
    TSR_TRY(tsr__dev(f, "swiglu_fused", "gu", gu, tsr__bytes3(n, 2 * (int64_t)hidden, 4)));
    TSR_TRY(tsr__dev(f, "swiglu_fused", "out", out, tsr__bytes3(n, hidden, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->swiglu_fused(f->inner, gu, n, hidden, out));
}

static tsr_status tsr__fenced_rmsnorm_matmul(tsr_backend *be, const float *x,
                                             const tsr_tensor *norm, int64_t n, int dim,
                                             float eps, float *xb, const tsr_tensor *w,
                                             float *y) {
    tsr__fenced *f = TSR__F(be);
    const char *op = "rmsnorm_matmul";
    TSR_TRY(tsr__dev_tensor(f, op, "norm", norm));
    TSR_TRY(tsr__dev_tensor(f, op, "weight", w));
    TSR_TRY(tsr__dev(f, op, "x", x, tsr__bytes3(n, dim, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "xb", xb, tsr__bytes3(n, dim, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "y", y, tsr__bytes3(n, w->rows, sizeof(float))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->rmsnorm_matmul(f->inner, x, norm, n, dim, eps, xb,
                                                           w, y));
}

static tsr_status tsr__fenced_swiglu_matmul_acc(tsr_backend *be, const float *gu, int64_t n,
                                                int hidden, float *hb, const tsr_tensor *w,
                                                const int32_t *seg, int n_parts, float *y) {
    tsr__fenced *f = TSR__F(be);
    const char *op = "swiglu_matmul_acc";
    TSR_TRY(tsr__dev_tensor(f, op, "weight", w));
    TSR_TRY(tsr__dev(f, op, "gu", gu, tsr__bytes3(n, 2 * (int64_t)hidden, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "hb", hb, tsr__bytes3(n, hidden, sizeof(float))));
    TSR_TRY(tsr__dev(f, op, "y", y, tsr__bytes3(n, w->rows, sizeof(float))));
    TSR_TRY(tsr__host(f, op, "seg", seg, tsr__bytes3(n_parts + 1, 1, sizeof(int32_t))));
    tsr__count(f, TSR__CNT_OPS, 1);
    TSR_TRY(tsr__fence_open(f));
    return tsr__fence_end(f, f->inner->ops->swiglu_matmul_acc(f->inner, gu, n, hidden, hb, w,
                                                              seg, n_parts, y));
}

/* ---- graphs: nothing recorded; the sequence checked ---- */

static tsr_status tsr__fenced_graph_begin(tsr_backend *be, uint64_t key, bool *replayed) {
    tsr__fenced *f = TSR__F(be);
    (void)key;
    *replayed = false;
    if (f->in_graph)
        return tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: graph_begin inside a graph");
    f->in_graph = true;
    f->graph_syncs = atomic_load(&f->cnt[TSR__CNT_SYNC]);
    f->graph_pageable = atomic_load(&f->cnt[TSR__CNT_PAGEABLE]);
    return TSR_OK;
}

static tsr_status tsr__fenced_graph_end(tsr_backend *be) {
    tsr__fenced *f = TSR__F(be);
    if (!f->in_graph)
        return tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: graph_end without graph_begin");
    f->in_graph = false;
    int64_t w = atomic_load(&f->cnt[TSR__CNT_SYNC]) - f->graph_syncs;
    int64_t pg = atomic_load(&f->cnt[TSR__CNT_PAGEABLE]) - f->graph_pageable;
    if (w || pg)
        return tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: the graph's work waited %lld "
                             "times and copied pageable memory %lld times: a CUDA Graph "
                             "cannot record that", (long long)w, (long long)pg);
    return TSR_OK;
}

/* ---- counters ---- */

static void tsr__fenced_counters(tsr_backend *be, tsr_backend_counters *out, bool reset) {
    tsr__fenced *f = TSR__F(be);
    int64_t v[TSR__CNT_N];
    for (int i = 0; i < TSR__CNT_N; i++)
        v[i] = reset ? atomic_exchange_explicit(&f->cnt[i], 0, memory_order_relaxed)
                     : atomic_load_explicit(&f->cnt[i], memory_order_relaxed);
    *out = (tsr_backend_counters){
        .uploads = v[TSR__CNT_UP], .upload_bytes = v[TSR__CNT_UP_BYTES],
        .downloads = v[TSR__CNT_DOWN], .download_bytes = v[TSR__CNT_DOWN_BYTES],
        .syncs = v[TSR__CNT_SYNC], .host_args = v[TSR__CNT_ARGS],
        .host_arg_bytes = v[TSR__CNT_ARG_BYTES], .ops = v[TSR__CNT_OPS],
        .pageable = v[TSR__CNT_PAGEABLE], .stream_copies = v[TSR__CNT_STREAM]};
}

/* ---- creation ---- */

static void tsr__fenced_destroy(tsr_backend *be) {
    if (!be) return;
    tsr__fenced *f = be->ctx;
    if (f) {
        if (f->base) munmap(f->base, f->size);
        tsr_backend_destroy(f->inner);
        tsr_free(f->free_list.v);
        tsr_free(f->used.v);
        tsr_free(f->pinned);
        pthread_mutex_destroy(&f->lock);
        tsr_free(f);
    }
    tsr_free(be);
}

static const tsr_backend_ops tsr__fenced_ops = {
    .name = "cpu-fenced",
    .destroy = tsr__fenced_destroy,
    .buffer_alloc = tsr__fenced_buffer_alloc,
    .buffer_free = tsr__fenced_buffer_free,
    .host_alloc = tsr__fenced_host_alloc,
    .host_free = tsr__fenced_host_free,
    .memory = tsr__fenced_memory,
    .synchronize = tsr__fenced_synchronize,
    .upload = tsr__fenced_upload,
    .download = tsr__fenced_download,
    .copy = tsr__fenced_copy,
    .memset = tsr__fenced_memset,
    .stream_create = tsr__fenced_stream_create,
    .stream_destroy = tsr__fenced_stream_destroy,
    .event_create = tsr__fenced_event_create,
    .event_destroy = tsr__fenced_event_destroy,
    .event_record = tsr__fenced_event_record,
    .stream_wait = tsr__fenced_stream_wait,
    .event_sync = tsr__fenced_event_sync,
    .host_register = tsr__fenced_host_register,
    .host_unregister = tsr__fenced_host_unregister,
    .device_name = tsr__fenced_device_name,
    .kv_write = tsr__fenced_kv_write,
    .kv_copy = tsr__fenced_kv_copy,
    .kv_gather = tsr__fenced_kv_gather,
    .kv_scatter = tsr__fenced_kv_scatter,
    .matmul = tsr__fenced_matmul,
    .rmsnorm = tsr__fenced_rmsnorm,
    .rope = tsr__fenced_rope,
    .swiglu = tsr__fenced_swiglu,
    .add = tsr__fenced_add,
    .embed = tsr__fenced_embed,
    .attention = tsr__fenced_attention,
    .matmul_parts = tsr__fenced_matmul_parts,
    .sample = tsr__fenced_sample,
    .counters = tsr__fenced_counters,
    .bias_add = tsr__fenced_bias_add,
    .moe = tsr__fenced_moe,
    .attention_paged = tsr__fenced_attention_paged,
    .matmul_parts_acc = tsr__fenced_matmul_parts_acc,
    .graph_begin = tsr__fenced_graph_begin,
    .graph_end = tsr__fenced_graph_end,
    .qkv_rope = tsr__fenced_qkv_rope,
    .swiglu_fused = tsr__fenced_swiglu_fused,
    .rmsnorm_matmul = tsr__fenced_rmsnorm_matmul,
    .swiglu_matmul_acc = tsr__fenced_swiglu_matmul_acc,
};

/* TSR_FENCED_MEMORY: digits with an optional K/M/G/T suffix (powers of 1024). */
static tsr_status tsr__fenced_env_size(const char *s, size_t *out) {
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    if (!isdigit((unsigned char)*p)) goto bad;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno) goto bad;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++; /* "4G" or "4GB" */
    while (isspace((unsigned char)*end)) end++;
    if (*end || v == 0 || v > (SIZE_MAX >> shift)) goto bad;
    *out = (size_t)v << shift;
    return TSR_OK;
bad:
    return tsr_error_set(TSR_ERR_INVALID,
                         "cpu-fenced: TSR_FENCED_MEMORY='%s' is not a size (a positive number "
                         "of bytes, optionally with a K, M, G or T suffix)",
                         s);
}

static tsr_status tsr__fenced_default_size(size_t *out) {
    const char *env = getenv("TSR_FENCED_MEMORY");
    if (env) return tsr__fenced_env_size(env, out);
    size_t size = TSR__FENCE_DEFAULT;
    int64_t avail = tsr_sys_mem_available();
    if (avail > 0 && (uint64_t)avail / 2 < size) size = (size_t)(avail / 2);
    *out = size;
    return TSR_OK;
}

tsr_status tsr_backend_fenced_create(int threads, size_t arena_bytes, tsr_backend **out) {
    *out = NULL;
    size_t size = arena_bytes;
    if (size == 0) TSR_TRY(tsr__fenced_default_size(&size));
    if (size > SIZE_MAX - TSR__FENCE_PAGE)
        return tsr_error_set(TSR_ERR_INVALID, "cpu-fenced: arena of %zu bytes is too large",
                             size);
    size = (size + TSR__FENCE_PAGE - 1) & ~(TSR__FENCE_PAGE - 1);
    tsr_backend *inner = NULL;
    TSR_TRY(tsr_backend_cpu_create(threads, &inner));
    tsr_backend *be = tsr_calloc(1, sizeof *be);
    tsr__fenced *f = tsr_calloc(1, sizeof *f);
    if (!be || !f || !tsr__ranges_reserve(&f->free_list, 2) ||
        !tsr__ranges_reserve(&f->used, 1)) {
        if (f) {
            tsr_free(f->free_list.v);
            tsr_free(f->used.v);
        }
        tsr_free(be);
        tsr_free(f);
        tsr_backend_destroy(inner);
        return TSR_ERR_NOMEM;
    }
    void *base = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        tsr_status st = tsr_error_set(TSR_ERR_NOMEM,
                                      "cpu-fenced: cannot reserve an arena of %zu bytes (mmap: "
                                      "%s); set TSR_FENCED_MEMORY smaller",
                                      size, strerror(errno));
        tsr_free(f->free_list.v);
        tsr_free(f->used.v);
        tsr_free(f);
        tsr_free(be);
        tsr_backend_destroy(inner);
        return st;
    }
    pthread_mutex_init(&f->lock, NULL);
    f->inner = inner;
    f->self = be;
    f->base = base;
    f->size = size;
    f->free_list.v[0] = (tsr__range){0, size, 0};
    f->free_list.n = 1;
    f->free_bytes = size;
    be->ops = &tsr__fenced_ops;
    be->ctx = f;
    be->device = -1;
    be->threads = inner->threads;
    be->host_memory = false;
    be->mxfp4_packed = inner->mxfp4_packed; /* its moe is the inner backend's */
    /* its matmul and embed are the inner's; a test clears it to stand in for a device
     * without those kernels (then they refuse the types, tsr__dev_tensor) */
    be->gguf_blocks = inner->gguf_blocks;
    TSR_LOG_DEBUG("cpu-fenced: %d threads, arena of %zu MiB", be->threads, size >> 20);
    *out = be;
    return TSR_OK;
}
