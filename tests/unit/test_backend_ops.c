/* Every op of the backend interface on every backend present, against the CPU backend
 * (llama.cpp's test-backend-ops). The reference is the CPU backend on one thread; the
 * backends under test are the CPU on three threads, the fenced CPU device ("cpu-fenced":
 * its memory faults on a host read) and, when built and a device answers, CUDA. A backend
 * that is not there is skipped with a line saying so.
 *
 * The test is device-correct by construction, reference included: inputs go to backend
 * memory with upload (weights with tsr_backend_place_tensor), results come back with
 * download, and only the metadata the contract calls host memory (positions, ids, slot
 * lists, spans) stays on the host. Inputs are seeded pseudo-random; each comparison prints
 * its worst error against a tolerance scaled to the op's magnitudes (memory and KV row ops:
 * bit-exact). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/kv_dtype.h"
#include "kernels/sample.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "tests/backend_test_util.h"
#include "tests/test.h"


/* ---- backends: the reference and the ones under test ---- */


static int notes_printed;

/* The calls every backend implements (backend.h): a missing one is a failure here, not a
 * NULL call later. */
static tsr_status check_vtable(const tsr_backend *be) {
    const tsr_backend_ops *o = be->ops;
#define REQ(op) {#op, o->op != NULL}
    const struct {
        const char *name;
        int present;
    } req[] = {REQ(destroy),       REQ(buffer_alloc), REQ(buffer_free),    REQ(host_alloc),
               REQ(host_free),     REQ(memory),       REQ(synchronize),    REQ(upload),
               REQ(download),      REQ(copy),         REQ(memset),         REQ(stream_create),
               REQ(stream_destroy), REQ(event_create), REQ(event_destroy), REQ(event_record),
               REQ(stream_wait),   REQ(event_sync),   REQ(kv_write),       REQ(kv_copy),
               REQ(kv_gather),     REQ(kv_scatter),   REQ(matmul),         REQ(rmsnorm),
               REQ(rope),          REQ(swiglu),       REQ(add),            REQ(embed),
               REQ(attention),     REQ(bias_add)};
#undef REQ
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (!req[i].present)
            return tsr_error_set(TSR_ERR_INTERNAL, "backend %s: no %s in its vtable", o->name,
                                 req[i].name);
    if (!o->graph_begin != !o->graph_end)
        return tsr_error_set(TSR_ERR_INTERNAL, "backend %s: graph_begin without graph_end "
                             "(or the reverse)", o->name);
    if (!o->host_register != !o->host_unregister)
        return tsr_error_set(TSR_ERR_INTERNAL, "backend %s: host_register without "
                             "host_unregister (or the reverse)", o->name);
    return TSR_OK;
}

static tsr_status targets_open(targets *t) {
    static const struct {
        const char *name;
        const char *label;
        int threads;
        int optional; /* any failure to create is a skip (no GPU), not only UNSUPPORTED */
    } tried[MAX_TARGETS] = {{"cpu", "cpu/3", 3, 0},
                            {"cpu-fenced", "fenced", 3, 0},
                            {"cuda", "cuda", 1, 1}};
    memset(t, 0, sizeof *t);
    TSR_TRY(tsr_backend_cpu_create(1, &t->ref));
    TSR_TRY(check_vtable(t->ref));
    for (int i = 0; i < MAX_TARGETS; i++) {
        tsr_backend *be = NULL;
        tsr_status st = tsr_backend_create(tried[i].name, tried[i].threads, &be);
        if (st == TSR_OK) {
            t->be[t->n] = be;
            t->label[t->n++] = tried[i].label;
            TSR_TRY(check_vtable(be));
            if (!notes_printed)
                printf("test_backend_ops: backend %s on %s\n", tried[i].name,
                       be->ops->device_name ? be->ops->device_name(be) : be->ops->name);
        } else if (st == TSR_ERR_UNSUPPORTED || tried[i].optional) {
            if (!notes_printed)
                printf("test_backend_ops: backend %s not available (%s): skipped\n",
                       tried[i].name, tsr_last_error());
        } else {
            return st;
        }
    }
    notes_printed = 1;
    tsr_error_clear();
    return TSR_OK;
}

/* A weight as the forward pass hands it to the ops: placed in backend memory. */
typedef struct placed {
    tsr_tensor t;
    bool copied;
} placed;

static tsr_status be_tensor(tsr_backend *be, const tsr_tensor *host, placed *out) {
    return tsr_backend_place_tensor(be, host, &out->t, &out->copied);
}

static void be_tensor_release(tsr_backend *be, placed *p) {
    if (p->copied) be_release(be, p->t.data);
}

/* ---- inputs and comparison ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *rand_floats(size_t n, float scale) {
    float *p = tsr_malloc(n * sizeof(float));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* A host tensor of dtype t with values from f (rounded to t), owning its data. */
static tsr_tensor make_tensor(tsr_dtype t, int64_t rows, int64_t cols, const float *f) {
    tsr_tensor w = {.dtype = t, .rows = rows, .cols = cols};
    size_t n = (size_t)(rows * cols);
    void *d = tsr_malloc(n * tsr_dtype_size(t));
    if (d)
        for (size_t i = 0; i < n; i++) {
            if (t == TSR_F32)
                ((float *)d)[i] = f[i];
            else if (t == TSR_BF16)
                ((uint16_t *)d)[i] = tsr_f32_to_bf16(f[i]);
            else
                ((uint16_t *)d)[i] = tsr_f32_to_f16(f[i]);
        }
    w.data = d;
    return w;
}

/* Largest |got - want| / tol[i] (tol NULL: a constant tol0); prints one figure line. */
static double compare(const char *what, const char *label, const float *got, const float *want,
                      size_t n, const float *tol, double tol0) {
    double worst = 0, worst_abs = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        double r = e / (tol ? (double)tol[i] : tol0);
        if (isnan(got[i]) != isnan(want[i])) r = INFINITY;
        if (r > worst) worst = r;
        if (e > worst_abs) worst_abs = e;
    }
    printf("  %-44s %-6s max abs err %.3e  (%.3f of tolerance)\n", what, label, worst_abs, worst);
    return worst;
}

/* Bit-exact comparison (memory and KV row ops move bytes, they compute nothing). */
static int same_bytes(const char *what, const char *label, const void *got, const void *want,
                      size_t bytes) {
    const unsigned char *g = got, *w = want;
    size_t first = bytes;
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != w[i]) {
            first = i;
            break;
        }
    if (first == bytes)
        printf("  %-44s %-6s %zu bytes identical\n", what, label, bytes);
    else
        printf("  %-44s %-6s FIRST DIFFERENCE at byte %zu of %zu\n", what, label, first, bytes);
    return first == bytes;
}

/* ---- memory ---- */

/* buffer_alloc/free (small and huge-page sized), host_alloc/free (pinned and plain),
 * memory(), host_register, stream_handle and device_name on one backend. */
static void check_memory_calls(tsr_backend *be, const char *label) {
    size_t fr0 = 0, total = 0, fr1 = 0, total1 = 0;
    ASSERT_OK(be->ops->memory(be, &fr0, &total));
    ASSERT_TRUE(total > 0 && fr0 <= total);
    /* 3 MiB: the CPU backend's huge-page path; a pattern round-trips through it */
    const size_t big = (size_t)3 << 20;
    unsigned char *pat = NULL, *back = NULL;
    ASSERT_OK(be->ops->host_alloc(be, big, true, (void **)&pat));
    ASSERT_OK(be->ops->host_alloc(be, big, false, (void **)&back));
    for (size_t i = 0; i < big; i++) pat[i] = (unsigned char)(i * 131 + (i >> 12));
    void *d = NULL, *small = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, big, &d));
    ASSERT_OK(be->ops->buffer_alloc(be, 100, &small));
    ASSERT_TRUE(((uintptr_t)d & 63) == 0 && ((uintptr_t)small & 63) == 0);
    ASSERT_OK(be->ops->memory(be, &fr1, &total1));
    ASSERT_EQ_INT(total1, total);
    /* Device memory is the backend's own: the big buffer shows (the CPU's figure is the
     * host's MemAvailable, which moves with everything else on the machine). */
    if (!be->host_memory) ASSERT_TRUE(fr1 + big <= fr0);
    ASSERT_OK(tsr_backend_upload(be, d, pat, big));
    ASSERT_OK(tsr_backend_upload(be, small, pat + 7, 100));
    memset(back, 0, big);
    ASSERT_OK(be_read(be, back, d, big));
    ASSERT_TRUE(same_bytes("buffer 3 MiB upload/download", label, back, pat, big));
    ASSERT_OK(be_read(be, back, small, 100));
    ASSERT_TRUE(same_bytes("buffer 100 B upload/download", label, back, pat + 7, 100));
    be->ops->buffer_free(be, d);
    be->ops->buffer_free(be, small);
    be->ops->buffer_free(be, NULL); /* a no-op, as free(NULL) */
    if (!be->host_memory) {
        ASSERT_OK(be->ops->memory(be, &fr1, &total1));
        ASSERT_TRUE(fr1 + big / 2 >= fr0); /* given back */
    }
    /* host_register (optional): a buffer made elsewhere, pinned, copied from on a stream */
    if (be->ops->host_register) {
        unsigned char *h = tsr_malloc(4096);
        ASSERT_TRUE(h != NULL);
        memcpy(h, pat, 4096);
        ASSERT_OK(be->ops->host_register(be, h, 4096));
        tsr_stream *s = NULL;
        ASSERT_OK(be->ops->stream_create(be, &s));
        ASSERT_OK(be->ops->buffer_alloc(be, 4096, &d));
        ASSERT_OK(be->ops->upload(be, d, h, 4096, s));
        tsr_event *ev = NULL;
        ASSERT_OK(be->ops->event_create(be, &ev));
        ASSERT_OK(be->ops->event_record(be, ev, s));
        ASSERT_OK(be->ops->event_sync(be, ev));
        ASSERT_OK(be_read(be, back, d, 4096));
        ASSERT_TRUE(same_bytes("host_register + stream upload", label, back, pat, 4096));
        be->ops->event_destroy(be, ev);
        be->ops->stream_destroy(be, s);
        be->ops->buffer_free(be, d);
        be->ops->host_unregister(be, h);
        tsr_free(h);
    }
    if (be->ops->stream_handle) (void)be->ops->stream_handle(be);
    if (be->ops->device_name) ASSERT_TRUE(strlen(be->ops->device_name(be)) > 0);
    be->ops->host_free(be, pat);
    be->ops->host_free(be, back);
}

TSR_TEST(test_memory) {
    targets t;
    ASSERT_OK(targets_open(&t));
    for (int b = -1; b < t.n; b++) {
        if (tsr_test_failed_flag) break;
        check_memory_calls(target(&t, b), b < 0 ? "cpu/1" : t.label[b]);
    }
    targets_close(&t);
}

/* One sequence of copies: sync and stream uploads, a stream ordered after another by an
 * event, copy, memset, then downloads on a stream and sync. out gets 3 x n floats. */
static void copy_sequence(tsr_backend *be, const float *src, size_t n, float *out) {
    size_t bytes = n * sizeof(float);
    float *pinned = NULL, *back = NULL;
    ASSERT_OK(be->ops->host_alloc(be, bytes, true, (void **)&pinned));
    ASSERT_OK(be->ops->host_alloc(be, 3 * bytes, true, (void **)&back));
    memcpy(pinned, src, bytes);
    float *a = be_dup(be, NULL, bytes), *b = be_dup(be, NULL, bytes), *c = be_dup(be, NULL, bytes);
    ASSERT_TRUE(a && b && c);
    tsr_stream *s1 = NULL, *s2 = NULL;
    tsr_event *up = NULL, *done = NULL;
    ASSERT_OK(be->ops->stream_create(be, &s1));
    ASSERT_OK(be->ops->stream_create(be, &s2));
    ASSERT_OK(be->ops->event_create(be, &up));
    ASSERT_OK(be->ops->event_create(be, &done));
    /* a <- src on stream 1; the compute stream waits for it, then copies and sets */
    ASSERT_OK(be->ops->upload(be, a, pinned, bytes, s1));
    ASSERT_OK(be->ops->event_record(be, up, s1));
    ASSERT_OK(be->ops->stream_wait(be, NULL, up));
    ASSERT_OK(tsr_backend_copy(be, b, a, bytes));
    ASSERT_OK(be->ops->memset(be, b + n / 3, 0x41, (n / 3) * sizeof(float) + 2));
    /* c <- src shifted, synchronous upload of an odd byte count at an odd offset */
    ASSERT_OK(be->ops->memset(be, c, 0, bytes));
    ASSERT_OK(tsr_backend_upload(be, (char *)c + 5, (const char *)src + 3, bytes - 17));
    ASSERT_OK(tsr_backend_copy(be, c + n / 2, a + 3, (n / 4) * sizeof(float)));
    /* downloads: b on stream 2 after the compute stream's work (an event recorded on the
     * compute stream), a and c synchronously */
    ASSERT_OK(be->ops->event_record(be, done, NULL));
    ASSERT_OK(be->ops->stream_wait(be, s2, done));
    ASSERT_OK(be->ops->download(be, back + n, b, bytes, s2));
    ASSERT_OK(be->ops->event_record(be, done, s2));
    ASSERT_OK(be->ops->event_sync(be, done));
    ASSERT_OK(tsr_backend_download(be, back, a, bytes));
    ASSERT_OK(tsr_backend_download(be, back + 2 * n, c, bytes));
    memcpy(out, back, 3 * bytes);
    be->ops->event_destroy(be, up);
    be->ops->event_destroy(be, done);
    be->ops->stream_destroy(be, s1);
    be->ops->stream_destroy(be, s2);
    be_release(be, a);
    be_release(be, b);
    be_release(be, c);
    be->ops->host_free(be, pinned);
    be->ops->host_free(be, back);
}

TSR_TEST(test_copies) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const size_t n = 50000;
    float *src = rand_floats(n, 3.0f);
    float *want = tsr_malloc(3 * n * sizeof(float)), *got = tsr_malloc(3 * n * sizeof(float));
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        copy_sequence(target(&t, b), src, n, b < 0 ? want : got);
        if (b >= 0)
            ASSERT_TRUE(same_bytes("upload/copy/memset/download, streams", t.label[b], got, want,
                                   3 * n * sizeof(float)));
    }
    /* and the reference itself did what the sequence says */
    ASSERT_TRUE(memcmp(want, src, n * sizeof(float)) == 0);
    unsigned char set[4];
    memcpy(set, &want[n + n / 3], 4);
    ASSERT_TRUE(set[0] == 0x41 && set[3] == 0x41);
    tsr_free(src);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* ---- KV rows by slot ---- */

/* A store of n_slots slots: paged (blocks of `block` slots, K rows then V rows of a block
 * side by side) or dense (block = n_slots, K and V in two buffers). */
typedef struct kv_store {
    float *k_buf, *v_buf; /* backend memory (v_buf NULL when paged) */
    size_t floats;        /* per buffer */
    tsr_kv_layout lay;
} kv_store;

static tsr_status kv_store_make(tsr_backend *be, int paged, int32_t n_slots, int32_t block,
                                int32_t row, kv_store *s) {
    memset(s, 0, sizeof *s);
    if (paged) {
        int32_t blocks = (n_slots + block - 1) / block;
        s->floats = (size_t)blocks * 2 * (size_t)block * (size_t)row;
        s->k_buf = be_dup(be, NULL, s->floats * sizeof(float));
        if (!s->k_buf) return TSR_ERR_NOMEM;
        s->lay = (tsr_kv_layout){.k = s->k_buf,
                                 .v = s->k_buf + (size_t)block * (size_t)row,
                                 .block_stride = 2 * (int64_t)block * row,
                                 .block = block,
                                 .row = row};
    } else {
        s->floats = (size_t)n_slots * (size_t)row;
        s->k_buf = be_dup(be, NULL, s->floats * sizeof(float));
        s->v_buf = be_dup(be, NULL, s->floats * sizeof(float));
        if (!s->k_buf || !s->v_buf) return TSR_ERR_NOMEM;
        s->lay = (tsr_kv_layout){.k = s->k_buf, .v = s->v_buf, .block_stride = 0,
                                 .block = n_slots, .row = row};
    }
    TSR_TRY(be->ops->memset(be, s->k_buf, 0, s->floats * sizeof(float)));
    if (s->v_buf) TSR_TRY(be->ops->memset(be, s->v_buf, 0, s->floats * sizeof(float)));
    return TSR_OK;
}

static void kv_store_free(tsr_backend *be, kv_store *s) {
    be_release(be, s->k_buf);
    be_release(be, s->v_buf);
}

enum { KV_SLOTS = 22, KV_ROW = 24, KV_BLOCK = 4, KV_N = 9 };

/* kv_write of KV_N rows, kv_copy of a compaction (tail rows into holes, in order, one a
 * no-op), kv_scatter (sync and on a stream), kv_gather (K and V, K only, V only, on a
 * stream); out gets the store (K then V buffer) and the gathered rows, *count floats. */
static void kv_sequence(tsr_backend *be, int paged, const float *rows_k, const float *rows_v,
                        float *out, size_t *count) {
    kv_store s;
    size_t at = 0;
    ASSERT_OK(kv_store_make(be, paged, KV_SLOTS, KV_BLOCK, KV_ROW, &s));
    const size_t rb = KV_N * KV_ROW * sizeof(float);
    float *dk = be_dup(be, rows_k, rb), *dv = be_dup(be, rows_v, rb);
    ASSERT_TRUE(dk && dv);
    /* slots 0..20 with holes; several blocks, unordered */
    const int32_t wslots[KV_N] = {0, 5, 2, 9, 13, 17, 18, 20, 11};
    ASSERT_OK(be->ops->kv_write(be, &s.lay, wslots, KV_N, dk, dv));
    /* compaction: the tail (20, 18, 17) moves into holes (1, 3, 4); 9 stays; then a row
     * is copied onward from a slot this same call has just filled (4 <- 17, 6 <- 4) */
    const int32_t cdst[5] = {1, 3, 4, 9, 6}, csrc[5] = {20, 18, 17, 9, 4};
    ASSERT_OK(be->ops->kv_copy(be, &s.lay, cdst, csrc, 5));
    /* scatter host rows: two synchronously, two on a stream */
    const int32_t sslots[4] = {21, 7, 12, 15};
    ASSERT_OK(be->ops->kv_scatter(be, &s.lay, sslots, 2, rows_v, rows_k, NULL));
    tsr_stream *st = NULL;
    tsr_event *ev = NULL;
    ASSERT_OK(be->ops->stream_create(be, &st));
    ASSERT_OK(be->ops->event_create(be, &ev));
    float *pin = NULL;
    ASSERT_OK(be->ops->host_alloc(be, 4 * rb, true, (void **)&pin));
    memcpy(pin, rows_k + 2 * KV_ROW, 2 * KV_ROW * sizeof(float));
    memcpy(pin + 2 * KV_ROW, rows_v + 5 * KV_ROW, 2 * KV_ROW * sizeof(float));
    ASSERT_OK(be->ops->kv_scatter(be, &s.lay, sslots + 2, 2, pin, pin + 2 * KV_ROW, st));
    ASSERT_OK(be->ops->event_record(be, ev, st));
    ASSERT_OK(be->ops->stream_wait(be, NULL, ev));
    ASSERT_OK(be->ops->event_sync(be, ev));
    /* the whole store */
    ASSERT_OK(be_read(be, out + at, s.k_buf, s.floats * sizeof(float)));
    at += s.floats;
    if (s.v_buf) {
        ASSERT_OK(be_read(be, out + at, s.v_buf, s.floats * sizeof(float)));
        at += s.floats;
    }
    /* gathers into host rows: both, K only, V only (the other NULL), on a stream */
    const int32_t gslots[6] = {1, 3, 6, 21, 15, 0};
    ASSERT_OK(be->ops->kv_gather(be, &s.lay, gslots, 6, out + at, out + at + 6 * KV_ROW, NULL));
    at += 12 * KV_ROW;
    ASSERT_OK(be->ops->kv_gather(be, &s.lay, gslots, 3, out + at, NULL, NULL));
    at += 3 * KV_ROW;
    ASSERT_OK(be->ops->kv_gather(be, &s.lay, gslots + 3, 3, NULL, out + at, NULL));
    at += 3 * KV_ROW;
    memset(pin, 0, 4 * rb);
    ASSERT_OK(be->ops->kv_gather(be, &s.lay, gslots, 6, pin, NULL, st));
    ASSERT_OK(be->ops->event_record(be, ev, st));
    ASSERT_OK(be->ops->event_sync(be, ev));
    memcpy(out + at, pin, 6 * KV_ROW * sizeof(float));
    at += 6 * KV_ROW;
    be->ops->host_free(be, pin);
    be->ops->event_destroy(be, ev);
    be->ops->stream_destroy(be, st);
    be_release(be, dk);
    be_release(be, dv);
    kv_store_free(be, &s);
    *count = at;
}

TSR_TEST(test_kv_rows) {
    targets t;
    ASSERT_OK(targets_open(&t));
    float *rk = rand_floats(KV_N * KV_ROW, 1.0f), *rv = rand_floats(KV_N * KV_ROW, 2.0f);
    const size_t cap = 2 * 8 * KV_BLOCK * KV_ROW + 64 * KV_ROW;
    float *want = tsr_calloc(cap, sizeof(float)), *got = tsr_calloc(cap, sizeof(float));
    for (int paged = 0; paged < 2; paged++) {
        size_t nw = 0;
        for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
            size_t ng = 0;
            kv_sequence(target(&t, b), paged, rk, rv, b < 0 ? want : got, &ng);
            if (b < 0) {
                nw = ng;
                continue;
            }
            ASSERT_EQ_INT(ng, nw);
            ASSERT_TRUE(same_bytes(paged ? "kv_write/copy/scatter/gather paged"
                                         : "kv_write/copy/scatter/gather dense",
                                   t.label[b], got, want, nw * sizeof(float)));
        }
        if (tsr_test_failed_flag) break;
        /* the reference against the rows it was given: slot 6 got written slot 4's row via
         * slot 17 (written from row 5 of the input) */
        const float *k6 = paged ? want + (1 * 2 * KV_BLOCK + 2) * KV_ROW : want + 6 * KV_ROW;
        ASSERT_TRUE(memcmp(k6, rk + 5 * KV_ROW, KV_ROW * sizeof(float)) == 0);
        /* gathered K of slot 21: scattered from rows_v's row 0 */
        size_t gather0 = paged ? 2 * 6 * KV_BLOCK * KV_ROW : 2 * KV_SLOTS * KV_ROW;
        ASSERT_TRUE(memcmp(want + gather0 + 3 * KV_ROW, rv, KV_ROW * sizeof(float)) == 0);
    }
    tsr_free(rk);
    tsr_free(rv);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* ---- compute ---- */

static void check_matmul(tsr_dtype dt, int64_t n, int64_t rows, int64_t cols) {
    targets t;
    ASSERT_OK(targets_open(&t));
    float *wf = rand_floats((size_t)(rows * cols), 0.5f);
    float *x = rand_floats((size_t)(n * cols), 1.0f);
    float *want = tsr_malloc((size_t)(n * rows) * sizeof(float));
    float *got = tsr_malloc((size_t)(n * rows) * sizeof(float));
    float *tol = tsr_malloc((size_t)(n * rows) * sizeof(float));
    tsr_tensor w = make_tensor(dt, rows, cols, wf);
    /* Bound per output: sum |w||x| times the rounding of the GEMM's inputs. F32 runs in
     * FP32 everywhere; BF16/F16 GEMMs on the GPU round x to the weight type first. */
    double eps = dt == TSR_F32 ? 2e-6 : dt == TSR_BF16 ? 8e-3 : 1.5e-3;
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += fabs(wf[r * cols + c] * x[i * cols + c]);
            tol[i * rows + r] = (float)(eps * s + 1e-6);
        }
    char what[64];
    snprintf(what, sizeof what, "matmul %s n=%lld %lldx%lld", tsr_dtype_name(dt), (long long)n,
             (long long)rows, (long long)cols);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        placed wd;
        ASSERT_OK(be_tensor(be, &w, &wd));
        float *dx = be_dup(be, x, (size_t)(n * cols) * sizeof(float));
        float *dy = be_dup(be, NULL, (size_t)(n * rows) * sizeof(float));
        ASSERT_TRUE(dx && dy);
        ASSERT_OK(be->ops->matmul(be, dx, n, &wd.t, dy));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dy, (size_t)(n * rows) * sizeof(float)));
        if (b >= 0)
            ASSERT_TRUE(compare(what, t.label[b], got, want, (size_t)(n * rows), tol, 0) <= 1.0);
        be_release(be, dx);
        be_release(be, dy);
        be_tensor_release(be, &wd);
    }
    tsr_free((void *)w.data);
    tsr_free(wf);
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    tsr_free(tol);
    targets_close(&t);
}

TSR_TEST(test_matmul_f32) {
    check_matmul(TSR_F32, 1, 64, 96);
    check_matmul(TSR_F32, 17, 130, 72);
}

TSR_TEST(test_matmul_bf16) {
    check_matmul(TSR_BF16, 1, 96, 64);
    check_matmul(TSR_BF16, 9, 64, 200);
}

TSR_TEST(test_matmul_f16) {
    check_matmul(TSR_F16, 5, 48, 64);
}

/* matmul_parts over 3 segments that do not cover all of w's columns: parts against the
 * reference's parts, sum against its sum, and on every backend the sum equal to its own
 * parts added in order (the contract's bitwise promise). n * rows is a multiple of 64, so
 * every part's output starts on a 256-byte boundary, as the sum's scratch does: a GPU BLAS
 * may pick its kernel by the output's alignment, and the promise is about the order of the
 * adds, not about which kernel a misaligned pointer gets. */
static void check_matmul_parts(tsr_dtype dt, int64_t n, int64_t rows, int64_t cols) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { P = 3 };
    const int32_t seg[P + 1] = {3, (int32_t)(cols / 3), (int32_t)(cols / 2 + 5),
                                (int32_t)(cols - 2)};
    size_t yn = (size_t)(n * rows);
    ASSERT_TRUE(yn % 64 == 0);
    float *wf = rand_floats((size_t)(rows * cols), 0.5f);
    float *x = rand_floats((size_t)(n * cols), 1.0f);
    float *want = tsr_malloc((P + 1) * yn * sizeof(float));
    float *got = tsr_malloc((P + 1) * yn * sizeof(float));
    float *tol = tsr_calloc((P + 1) * yn, sizeof(float));
    tsr_tensor w = make_tensor(dt, rows, cols, wf);
    double eps = dt == TSR_F32 ? 2e-6 : dt == TSR_BF16 ? 8e-3 : 1.5e-3;
    for (int p = 0; p < P; p++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < rows; r++) {
                double s = 0;
                for (int64_t c = seg[p]; c < seg[p + 1]; c++)
                    s += fabs(wf[r * cols + c] * x[i * cols + c]);
                tol[(size_t)p * yn + (size_t)(i * rows + r)] = (float)(eps * s + 1e-6);
                tol[(size_t)P * yn + (size_t)(i * rows + r)] += (float)(eps * s + 1e-6);
            }
    char what[80];
    snprintf(what, sizeof what, "matmul_parts %s n=%lld %lldx%lld", tsr_dtype_name(dt),
             (long long)n, (long long)rows, (long long)cols);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        if (!be->ops->matmul_parts) {
            printf("  %-44s %-6s (no matmul_parts: skipped)\n", what, t.label[b]);
            continue;
        }
        float *out = b < 0 ? want : got;
        placed wd;
        ASSERT_OK(be_tensor(be, &w, &wd));
        float *dx = be_dup(be, x, (size_t)(n * cols) * sizeof(float));
        float *dy = be_dup(be, NULL, (P + 1) * yn * sizeof(float));
        ASSERT_TRUE(dx && dy);
        ASSERT_OK(be->ops->matmul_parts(be, dx, n, &wd.t, seg, P, false, dy));
        ASSERT_OK(be->ops->matmul_parts(be, dx, n, &wd.t, seg, P, true, dy + P * yn));
        ASSERT_OK(be_read(be, out, dy, (P + 1) * yn * sizeof(float)));
        for (size_t i = 0; i < yn; i++) {
            float s = out[i];
            for (int p = 1; p < P; p++) s += out[(size_t)p * yn + i];
            if (memcmp(&s, &out[P * yn + i], sizeof s) != 0)
                TSR_FAIL_("%s on %s: sum[%zu] = %.9g, the parts add to %.9g", what,
                          b < 0 ? "cpu/1" : t.label[b], i, out[P * yn + i], s);
        }
        if (b >= 0)
            ASSERT_TRUE(compare(what, t.label[b], got, want, (P + 1) * yn, tol, 0) <= 1.0);
        be_release(be, dx);
        be_release(be, dy);
        be_tensor_release(be, &wd);
    }
    tsr_free((void *)w.data);
    tsr_free(wf);
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    tsr_free(tol);
    targets_close(&t);
}

TSR_TEST(test_matmul_parts) {
    check_matmul_parts(TSR_F32, 1, 64, 100);
    check_matmul_parts(TSR_BF16, 1, 64, 130);
    check_matmul_parts(TSR_BF16, 32, 50, 96);
    check_matmul_parts(TSR_F16, 64, 33, 70);
}

static void check_rmsnorm(tsr_dtype dt, int64_t n, int dim, int in_place) {
    targets t;
    ASSERT_OK(targets_open(&t));
    float *x = rand_floats((size_t)(n * dim), 2.0f);
    float *wf = rand_floats((size_t)dim, 1.0f);
    float *want = tsr_malloc((size_t)(n * dim) * sizeof(float));
    float *got = tsr_malloc((size_t)(n * dim) * sizeof(float));
    tsr_tensor w = make_tensor(dt, 1, dim, wf);
    char what[64];
    snprintf(what, sizeof what, "rmsnorm %s n=%lld dim=%d%s", tsr_dtype_name(dt), (long long)n, dim,
             in_place ? " in place" : "");
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        placed wd;
        ASSERT_OK(be_tensor(be, &w, &wd));
        float *dx = be_dup(be, x, (size_t)(n * dim) * sizeof(float));
        float *dy = in_place ? dx : be_dup(be, NULL, (size_t)(n * dim) * sizeof(float));
        ASSERT_TRUE(dx && dy);
        ASSERT_OK(be->ops->rmsnorm(be, dx, &wd.t, n, dim, 1e-5f, dy));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dy, (size_t)(n * dim) * sizeof(float)));
        if (b >= 0)
            ASSERT_TRUE(compare(what, t.label[b], got, want, (size_t)(n * dim), NULL, 2e-5) <=
                        1.0);
        if (!in_place) be_release(be, dy);
        be_release(be, dx);
        be_tensor_release(be, &wd);
    }
    tsr_free((void *)w.data);
    tsr_free(x);
    tsr_free(wf);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_rmsnorm) {
    check_rmsnorm(TSR_F32, 5, 64, 0);
    check_rmsnorm(TSR_F32, 3, 1000, 1);
    check_rmsnorm(TSR_BF16, 2, 100, 0);
}

static void check_rope(int interleaved, int llama3, int head_dim, int n_heads, int max_pos) {
    targets t;
    ASSERT_OK(targets_open(&t));
    tsr_model_config cfg = {.head_dim = head_dim,
                            .rope_theta = llama3 ? 500000.0f : 10000.0f,
                            .rope_interleaved = interleaved,
                            .rope_scaling = llama3 ? TSR_ROPE_LLAMA3 : TSR_ROPE_NONE,
                            .rope_factor = 32.0f,
                            .rope_low_freq_factor = 1.0f,
                            .rope_high_freq_factor = 4.0f,
                            .rope_original_max_pos = 8192};
    const int64_t n = 7;
    size_t count = (size_t)(n * n_heads * head_dim);
    const int32_t pos[7] = {0, 1, 2, 17, 255, max_pos / 2, max_pos}; /* host memory */
    float *x = rand_floats(count, 1.0f);
    float *want = tsr_malloc(count * sizeof(float));
    float *got = tsr_malloc(count * sizeof(float));
    char what[64];
    snprintf(what, sizeof what, "rope %s%s hd=%d pos<=%d", interleaved ? "interleaved" : "halves",
             llama3 ? " llama3" : "", head_dim, max_pos);
    /* The angle pos * inv_freq is the same float on every backend; cos/sin of it may differ
     * by an ulp or two, of the result's magnitude (|x| < 1.5 here). */
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        float *dx = be_dup(be, x, count * sizeof(float));
        ASSERT_TRUE(dx != NULL);
        ASSERT_OK(be->ops->rope(be, dx, pos, n, n_heads, &cfg));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dx, count * sizeof(float)));
        if (b >= 0) ASSERT_TRUE(compare(what, t.label[b], got, want, count, NULL, 2e-6) <= 1.0);
        be_release(be, dx);
    }
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_rope) {
    check_rope(1, 0, 64, 3, 511);
    check_rope(0, 0, 64, 2, 4095);
    check_rope(0, 1, 128, 2, 131071);
    check_rope(1, 1, 32, 4, 100000);
}

TSR_TEST(test_swiglu_add) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int64_t n = 70000; /* over the CPU's threading threshold */
    const size_t bytes = (size_t)n * sizeof(float);
    float *g = rand_floats((size_t)n, 6.0f);
    float *u = rand_floats((size_t)n, 2.0f);
    float *want_s = tsr_malloc(bytes), *want_a = tsr_malloc(bytes), *got = tsr_malloc(bytes);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        float *dg = be_dup(be, g, bytes), *da = be_dup(be, g, bytes), *du = be_dup(be, u, bytes);
        ASSERT_TRUE(dg && da && du);
        ASSERT_OK(be->ops->swiglu(be, dg, du, n));
        ASSERT_OK(be->ops->add(be, da, du, n));
        ASSERT_OK(be_read(be, b < 0 ? want_s : got, dg, bytes));
        if (b >= 0)
            ASSERT_TRUE(compare("swiglu n=70000", t.label[b], got, want_s, (size_t)n, NULL,
                                1e-5) <= 1.0);
        ASSERT_OK(be_read(be, b < 0 ? want_a : got, da, bytes));
        if (b >= 0)
            ASSERT_TRUE(compare("add n=70000", t.label[b], got, want_a, (size_t)n, NULL,
                                0.5e-6) <= 1.0);
        be_release(be, dg);
        be_release(be, da);
        be_release(be, du);
    }
    tsr_free(g);
    tsr_free(u);
    tsr_free(want_s);
    tsr_free(want_a);
    tsr_free(got);
    targets_close(&t);
}

/* Qwen2's q/k/v biases: x[i][j] += b[j], exact (one add per element), on a width that is
 * not a multiple of any vector length and over more rows than a decode step has. */
TSR_TEST(test_bias_add) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int64_t n = 37, w = 200;
    const size_t bytes = (size_t)(n * w) * sizeof(float);
    float *x = rand_floats((size_t)(n * w), 3.0f), *bias = rand_floats((size_t)w, 1.0f);
    float *want = tsr_malloc(bytes), *got = tsr_malloc(bytes);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < w; j++) want[i * w + j] = x[i * w + j] + bias[j];
    tsr_tensor hb = {.dtype = TSR_F32, .rows = 1, .cols = w, .data = bias};
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        placed pb;
        float *dx = be_dup(be, x, bytes);
        ASSERT_TRUE(dx != NULL);
        ASSERT_OK(be_tensor(be, &hb, &pb));
        ASSERT_OK(be->ops->bias_add(be, dx, &pb.t, n));
        ASSERT_OK(be_read(be, got, dx, bytes));
        ASSERT_TRUE(compare("bias_add 37x200", b < 0 ? "cpu/1" : t.label[b], got, want,
                            (size_t)(n * w), NULL, 0.0) <= 1.0);
        be_tensor_release(be, &pb);
        be_release(be, dx);
    }
    tsr_free(x);
    tsr_free(bias);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_embed) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int64_t vocab = 50, dim = 72, n = 6;
    const int32_t ids[6] = {0, 49, 7, 7, 23, 1}; /* host memory, as the contract says */
    const int32_t bad[2] = {3, 50};
    float *tab = rand_floats((size_t)(vocab * dim), 1.0f);
    float *want = tsr_malloc((size_t)(n * dim) * sizeof(float));
    float *got = tsr_malloc((size_t)(n * dim) * sizeof(float));
    tsr_dtype dts[3] = {TSR_F32, TSR_BF16, TSR_F16};
    for (int d = 0; d < 3; d++) {
        tsr_tensor emb = make_tensor(dts[d], vocab, dim, tab);
        char what[64];
        snprintf(what, sizeof what, "embed %s n=%lld dim=%lld", tsr_dtype_name(dts[d]),
                 (long long)n, (long long)dim);
        for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
            tsr_backend *be = target(&t, b);
            placed ed;
            ASSERT_OK(be_tensor(be, &emb, &ed));
            float *dout = be_dup(be, NULL, (size_t)(n * dim) * sizeof(float));
            ASSERT_TRUE(dout != NULL);
            ASSERT_OK(be->ops->embed(be, &ed.t, ids, n, dout));
            ASSERT_OK(be_read(be, b < 0 ? want : got, dout, (size_t)(n * dim) * sizeof(float)));
            if (b >= 0)
                ASSERT_TRUE(compare(what, t.label[b], got, want, (size_t)(n * dim), NULL,
                                    1e-30) <= 1.0);
            /* an id past the vocabulary is an error */
            ASSERT_EQ_INT(be->ops->embed(be, &ed.t, bad, 2, dout), TSR_ERR_INVALID);
            ASSERT_STR_CONTAINS(tsr_last_error(), "out of range");
            be_release(be, dout);
            be_tensor_release(be, &ed);
        }
        tsr_free((void *)emb.data);
    }
    tsr_free(tab);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* ---- attention ---- */

/* One attention case: spans of `lens` keys each (positions contiguous, or scattered through a
 * pos array when `scattered`), queries at the last n_q positions. */
typedef struct attn_case {
    const char *what;
    int n_q, n_heads, n_kv_heads, head_dim;
    int n_spans;
    int lens[4];
    int scattered;
    int scores;
} attn_case;

static void check_attention(const attn_case *ac) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int hd = ac->head_dim, kv_dim = ac->n_kv_heads * hd;
    const int64_t stride = kv_dim + 8; /* padded rows: strides are honoured */
    int64_t keys = 0;
    for (int s = 0; s < ac->n_spans; s++) keys += ac->lens[s];
    size_t qn = (size_t)ac->n_q * (size_t)(ac->n_heads * hd);
    float *q = rand_floats(qn, 1.5f);
    float *kv[2] = {rand_floats((size_t)(keys * stride), 1.5f),
                    rand_floats((size_t)(keys * stride), 1.0f)};
    /* positions are host memory (contract): span pos and query pos stay here */
    int32_t *kpos = tsr_malloc((size_t)keys * sizeof(int32_t));
    int32_t *qpos = tsr_malloc((size_t)ac->n_q * sizeof(int32_t));
    /* Scattered: a cache that dropped tokens keeps their original positions (gaps of 3). */
    for (int64_t i = 0; i < keys; i++) kpos[i] = (int32_t)(ac->scattered ? 3 * i + 1 : i);
    for (int i = 0; i < ac->n_q; i++) qpos[i] = kpos[keys - ac->n_q + i];
    size_t ksn = (size_t)(ac->n_heads * keys); /* per query head */
    float *want = tsr_malloc(qn * sizeof(float)), *got = tsr_malloc(qn * sizeof(float));
    float *want_ks = tsr_malloc(ksn * sizeof(float)), *got_ks = tsr_malloc(ksn * sizeof(float));
    tsr_kv_span spans[4];
    tsr_attn_args a = {.q_pos = qpos,
                       .n_q = ac->n_q,
                       .spans = spans,
                       .n_spans = ac->n_spans,
                       .n_heads = ac->n_heads,
                       .n_kv_heads = ac->n_kv_heads,
                       .head_dim = hd};
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        float *dq = be_dup(be, q, qn * sizeof(float));
        float *dk = be_dup(be, kv[0], (size_t)(keys * stride) * sizeof(float));
        float *dv = be_dup(be, kv[1], (size_t)(keys * stride) * sizeof(float));
        float *dout = be_dup(be, NULL, qn * sizeof(float));
        float *dks = ac->scores ? be_dup(be, NULL, ksn * sizeof(float)) : NULL;
        ASSERT_TRUE(dq && dk && dv && dout && (dks || !ac->scores));
        if (dks) ASSERT_OK(be->ops->memset(be, dks, 0, ksn * sizeof(float)));
        int64_t off = 0;
        for (int s = 0; s < ac->n_spans; s++) {
            spans[s] = (tsr_kv_span){.k = dk + off * stride,
                                     .v = dv + off * stride,
                                     .pos = ac->scattered ? kpos + off : NULL,
                                     .pos0 = (int32_t)off,
                                     .n = ac->lens[s],
                                     .stride = stride};
            off += ac->lens[s];
        }
        a.q = dq;
        a.out = dout;
        a.key_scores = dks;
        ASSERT_OK(be->ops->attention(be, &a));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dout, qn * sizeof(float)));
        if (dks) ASSERT_OK(be_read(be, b < 0 ? want_ks : got_ks, dks, ksn * sizeof(float)));
        if (b >= 0) {
            ASSERT_TRUE(compare(ac->what, t.label[b], got, want, qn, NULL, 2e-5) <= 1.0);
            if (dks) {
                char what[80];
                snprintf(what, sizeof what, "%s scores", ac->what);
                ASSERT_TRUE(compare(what, t.label[b], got_ks, want_ks, ksn, NULL, 2e-5) <= 1.0);
            }
        }
        be_release(be, dq);
        be_release(be, dk);
        be_release(be, dv);
        be_release(be, dout);
        be_release(be, dks);
    }
    tsr_free(q);
    tsr_free(kv[0]);
    tsr_free(kv[1]);
    tsr_free(kpos);
    tsr_free(qpos);
    tsr_free(want);
    tsr_free(got);
    tsr_free(want_ks);
    tsr_free(got_ks);
    targets_close(&t);
}

TSR_TEST(test_attention_decode) {
    attn_case c1 = {"attn decode gqa4 hd64 1 span", 1, 8, 2, 64, 1, {37}, 0, 0};
    check_attention(&c1);
    attn_case c2 = {"attn decode hd128 3 spans+scores", 1, 4, 4, 128, 3, {16, 16, 300}, 0, 1};
    check_attention(&c2);
    attn_case c3 = {"attn decode hd64 scattered 2 spans", 1, 4, 2, 64, 2, {40, 9}, 1, 0};
    check_attention(&c3);
    /* Long enough for CUDA's split-K path (kernels/cuda/attn.cu: at most 8 queries, 256
     * keys or more): chunks of the key range merged, query heads of a group in one block. */
    attn_case c4 = {"attn split-K gqa4 hd128 4000 keys+scores", 1, 16, 4, 128, 1, {4000}, 0, 1};
    check_attention(&c4);
    attn_case c5 = {"attn split-K gqa8 hd64 scattered 3 spans+sc", 1, 8, 1, 64, 3,
                    {700, 900, 513}, 1, 1};
    check_attention(&c5);
    attn_case c6 = {"attn split-K 4 queries gqa2 hd96 2 spans+sc", 4, 4, 2, 96, 2, {1000, 600},
                    0, 1};
    check_attention(&c6);
}

TSR_TEST(test_attention_prefill) {
    attn_case c1 = {"attn prefill gqa2 hd64 300 keys", 40, 4, 2, 64, 1, {300}, 0, 1};
    check_attention(&c1);
    attn_case c2 = {"attn prefill hd48 4 spans", 25, 6, 3, 48, 4, {5, 130, 1, 20}, 0, 0};
    check_attention(&c2);
    attn_case c3 = {"attn prefill hd160 scattered+scores", 12, 2, 1, 160, 2, {90, 60}, 1, 1};
    check_attention(&c3);
    /* CUDA's tiled prefill (head_dim <= 128): several query tiles, a ragged last one. */
    attn_case c4 = {"attn prefill tiled gqa4 hd128 100 q+scores", 100, 8, 2, 128, 3,
                    {64, 300, 36}, 0, 1};
    check_attention(&c4);
    attn_case c5 = {"attn prefill tiled hd80 scattered 33 q", 33, 4, 4, 80, 2, {50, 70}, 1, 0};
    check_attention(&c5);
}

/* attention_paged (optional) against the reference's per-sequence attention over the same
 * keys: three sequences of a paged layout (blocks of 16, K rows then V rows, the tables out
 * of order, one block used twice), 1, 5 and 1 query rows (decode, a short chunk, and a
 * decode row over 150 keys: the CPU splits it into 3 partitions of 64 keys on its 3
 * threads, since 2 decode rows are fewer than its threads). */
TSR_TEST(test_attention_paged) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { BS = 16, NB = 12, MB = 10, S = 3, NQ = 7, H = 8, G = 2, HD = 64 };
    const int row = G * HD;
    const int32_t n_keys[S] = {37, 70, 150},
                  tables[S][MB] = {{7, 2, 9}, {1, 11, 4, 8, 3}, {5, 6, 10, 0, 3, 2, 9, 1, 4, 8}};
    const int32_t q_seq[NQ] = {0, 1, 1, 1, 1, 1, 2}, q_pos[NQ] = {36, 65, 66, 67, 68, 69, 149};
    size_t kvn = (size_t)NB * 2 * BS * row, qn = (size_t)NQ * H * HD;
    float *kv = rand_floats(kvn, 1.2f), *q = rand_floats(qn, 1.5f);
    float *want = tsr_malloc(qn * sizeof(float)), *got = tsr_malloc(qn * sizeof(float));
    int32_t meta[NQ + NQ + S + S * MB];
    memcpy(meta, q_pos, sizeof q_pos);
    memcpy(meta + NQ, q_seq, sizeof q_seq);
    memcpy(meta + 2 * NQ, n_keys, sizeof n_keys);
    memcpy(meta + 2 * NQ + S, tables, sizeof tables);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        if (b >= 0 && !be->ops->attention_paged) continue;
        float *dkv = be_dup(be, kv, kvn * sizeof(float)), *dq = be_dup(be, q, qn * sizeof(float));
        float *dout = be_dup(be, NULL, qn * sizeof(float));
        int32_t *dm = be_dup(be, meta, sizeof meta);
        ASSERT_TRUE(dkv && dq && dout && dm);
        tsr_kv_layout lay = {.k = dkv, .v = dkv + BS * row, .block_stride = 2 * BS * row,
                             .block = BS, .row = row};
        if (b < 0) { /* the reference: per sequence, the spans the tables name */
            for (int r0 = 0; r0 < NQ;) {
                int s = q_seq[r0], r1 = r0;
                while (r1 < NQ && q_seq[r1] == s) r1++;
                tsr_kv_span sp[MB];
                int nb = (n_keys[s] + BS - 1) / BS;
                for (int j = 0; j < nb; j++) {
                    int64_t at = (int64_t)tables[s][j] * lay.block_stride;
                    int left = n_keys[s] - j * BS;
                    sp[j] = (tsr_kv_span){.k = lay.k + at, .v = lay.v + at, .pos0 = j * BS,
                                          .n = left < BS ? left : BS, .stride = row};
                }
                tsr_attn_args a = {.q = dq + (size_t)r0 * H * HD, .q_pos = q_pos + r0,
                                   .n_q = r1 - r0, .spans = sp, .n_spans = nb, .n_heads = H,
                                   .n_kv_heads = G, .head_dim = HD,
                                   .out = dout + (size_t)r0 * H * HD};
                ASSERT_OK(be->ops->attention(be, &a));
                r0 = r1;
            }
        } else {
            tsr_attn_paged_args pa = {.q = dq, .out = dout, .n_q = NQ, .n_heads = H,
                                      .n_kv_heads = G, .head_dim = HD, .lay = lay,
                                      .q_pos = dm, .q_seq = dm + NQ, .n_keys = dm + 2 * NQ,
                                      .tables = dm + 2 * NQ + S, .n_seqs = S, .max_blocks = MB};
            ASSERT_OK(be->ops->attention_paged(be, &pa));
        }
        ASSERT_OK(be_read(be, b < 0 ? want : got, dout, qn * sizeof(float)));
        if (b >= 0)
            ASSERT_TRUE(compare("attention_paged 3 seqs gqa4 hd64", t.label[b], got, want, qn,
                                NULL, 2e-5) <= 1.0);
        be_release(be, dkv);
        be_release(be, dq);
        be_release(be, dout);
        be_release(be, dm);
    }
    tsr_free(kv);
    tsr_free(q);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* matmul_parts_acc (optional): y + the ordered sum, the bits of matmul_parts(sum) then add
 * on the CPU backends (the forward pass's tp contract), within rounding on a GPU. */
TSR_TEST(test_matmul_parts_acc) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { N = 3, ROWS = 48, COLS = 64, P = 4 };
    const int32_t seg[P + 1] = {0, 16, 32, 48, 64}, useg[P + 1] = {0, 10, 32, 40, 64};
    float *x = rand_floats(N * COLS, 1.0f), *wf = rand_floats(ROWS * COLS, 0.5f);
    float *y0 = rand_floats(N * ROWS, 1.0f);
    float want[N * ROWS], got[N * ROWS];
    tsr_tensor wh = make_tensor(TSR_F32, ROWS, COLS, wf);
    for (int u = 0; u < 2; u++) {
        const int32_t *sg = u ? useg : seg;
        for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
            tsr_backend *be = target(&t, b);
            if (b >= 0 && !be->ops->matmul_parts_acc) continue;
            placed w;
            ASSERT_OK(be_tensor(be, &wh, &w));
            float *dx = be_dup(be, x, sizeof(float) * N * COLS);
            float *dy = be_dup(be, y0, sizeof(float) * N * ROWS);
            float *dt = be_dup(be, NULL, sizeof(float) * N * ROWS);
            ASSERT_TRUE(dx && dy && dt);
            if (b < 0) {
                ASSERT_OK(be->ops->matmul_parts(be, dx, N, &w.t, sg, P, true, dt));
                ASSERT_OK(be->ops->add(be, dy, dt, N * ROWS));
            } else {
                ASSERT_OK(be->ops->matmul_parts_acc(be, dx, N, &w.t, sg, P, dy));
            }
            ASSERT_OK(be_read(be, b < 0 ? want : got, dy, sizeof want));
            if (b >= 0 && be->device < 0)
                ASSERT_TRUE(same_bytes(u ? "matmul_parts_acc uneven" : "matmul_parts_acc",
                                       t.label[b], got, want, sizeof want));
            else if (b >= 0)
                ASSERT_TRUE(compare("matmul_parts_acc", t.label[b], got, want, N * ROWS, NULL,
                                    1e-4) <= 1.0);
            be_release(be, dx);
            be_release(be, dy);
            be_release(be, dt);
            be_tensor_release(be, &w);
        }
    }
    tsr_free(x);
    tsr_free(wf);
    tsr_free(y0);
    tsr_free((void *)wh.data);
    targets_close(&t);
}

/* ---- sampling ---- */

/* The sample op (optional) against the host arithmetic (kernels/sample.c, which the CPU op
 * runs): greedy rows must give the same id everywhere; a sampled row must too unless its
 * draw is fragile (r moved by 1e-4 either way changes the host's token: a GPU's parallel
 * sums may then fall on the other side). Rows: greedy, plain temperature, top-k, top-p,
 * both, top-k above the vocabulary; a large vocabulary (two passes of the device's chunked
 * scans) and a small one. */
static void check_sample(int vocab, int rows) {
    targets t;
    ASSERT_OK(targets_open(&t));
    size_t nf = (size_t)rows * (size_t)vocab;
    float *x = rand_floats(nf, 4.0f), *y = tsr_malloc((size_t)vocab * sizeof(float));
    tsr_sample_cand *cand = tsr_malloc((size_t)vocab * sizeof *cand);
    tsr_sample_params *par = tsr_malloc((size_t)rows * sizeof *par);
    int32_t *want = tsr_malloc((size_t)rows * sizeof(int32_t));
    int32_t *got = tsr_malloc((size_t)rows * sizeof(int32_t));
    int *fragile = tsr_malloc((size_t)rows * sizeof(int));
    ASSERT_TRUE(x && y && cand && par && want && got && fragile);
    static const tsr_sample_params kinds[] = {{0.0f, 1.0f, 0, 0.0f},  {0.8f, 1.0f, 0, 0.0f},
                                              {1.0f, 1.0f, 40, 0.0f}, {1.2f, 0.9f, 0, 0.0f},
                                              {0.7f, 0.95f, 50, 0.0f}, {1.5f, 0.6f, 1 << 30, 0.0f}};
    for (int i = 0; i < rows; i++) {
        par[i] = kinds[i % 6];
        par[i].r = 0.5f * (frand() + 1.0f);
        if (i % 5 == 0) x[(size_t)i * vocab + (size_t)(i * 7 % vocab)] = 9.0f; /* a clear max */
        int32_t ids3[3];
        for (int d = -1; d <= 1; d++) {
            tsr_sample_params q = par[i];
            q.r += 1e-4f * (float)d;
            q.r = q.r < 0.0f ? 0.0f : q.r >= 1.0f ? 0.99999f : q.r;
            memcpy(y, x + (size_t)i * vocab, (size_t)vocab * sizeof(float));
            ids3[d + 1] = tsr_sample_row(y, vocab, &q, cand);
        }
        want[i] = ids3[1];
        fragile[i] = par[i].temperature != 0.0f && (ids3[0] != ids3[1] || ids3[2] != ids3[1]);
    }
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        const char *label = b < 0 ? "cpu/1" : t.label[b];
        if (!be->ops->sample) {
            printf("  sample vocab %-6d %-6s no sample op: the host samples\n", vocab, label);
            continue;
        }
        float *dx = be_dup(be, x, nf * sizeof(float));
        ASSERT_TRUE(dx != NULL);
        ASSERT_OK(be->ops->sample(be, dx, rows, vocab, par, got));
        int same = 0, skipped = 0;
        for (int i = 0; i < rows; i++) {
            if (got[i] == want[i]) {
                same++;
            } else if (fragile[i]) {
                skipped++;
            } else {
                TSR_FAIL_("sample vocab %d %s row %d (T %.2f top-k %d top-p %.2f r %.5f): id %d, "
                          "host %d", vocab, label, i, (double)par[i].temperature, par[i].top_k,
                          (double)par[i].top_p, (double)par[i].r, got[i], want[i]);
            }
        }
        printf("  sample vocab %-6d rows %-3d %-6s %d ids as the host, %d fragile draws "
               "differ\n", vocab, rows, label, same, skipped);
        be_release(be, dx);
    }
    tsr_free(x);
    tsr_free(y);
    tsr_free(cand);
    tsr_free(par);
    tsr_free(want);
    tsr_free(got);
    tsr_free(fragile);
    targets_close(&t);
}

TSR_TEST(test_sample) {
    check_sample(50000, 30);
    check_sample(37, 12);
}

/* ---- the fused ops: qkv_rope and swiglu_fused against the ops they replace ---- */

/* qkv_rope on every target against bias_add, the heads' rmsnorm, two ropes and kv_write
 * on the reference (cpu/1), over the fused rows split on the host: q, and K/V read back by
 * kv_gather from a paged store of kv_dtype (lay) or the k and v outputs. */
static void check_qkv_rope(int kv_dtype, int with_lay, int norms, int bias) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { N = 5, NH = 4, NKV = 2, HD = 64, QD = NH * HD, KVD = NKV * HD, LD = QD + 2 * KVD };
    tsr_model_config cfg = {.head_dim = HD, .rope_theta = 500000.0f, .norm_eps = 1e-5f,
                            .rope_scaling = TSR_ROPE_LLAMA3, .rope_factor = 8.0f,
                            .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                            .rope_original_max_pos = 8192};
    const int32_t pos[N] = {0, 3, 17, 300, 4095}, slots[N] = {0, 5, 2, 9, 13};
    float *qkv = rand_floats(N * LD, 1.0f), *bv = rand_floats(LD, 0.5f);
    float *qn = rand_floats(HD, 0.2f), *kn = rand_floats(HD, 0.2f);
    for (int i = 0; i < HD; i++) qn[i] += 1.0f, kn[i] += 1.0f;
    float *hq = tsr_malloc(N * QD * sizeof(float)), *hk = tsr_malloc(N * KVD * sizeof(float));
    float *hv = tsr_malloc(N * KVD * sizeof(float));
    for (int r = 0; r < N; r++) {
        memcpy(hq + r * QD, qkv + r * LD, QD * sizeof(float));
        memcpy(hk + r * KVD, qkv + r * LD + QD, KVD * sizeof(float));
        memcpy(hv + r * KVD, qkv + r * LD + QD + KVD, KVD * sizeof(float));
    }
    tsr_tensor tb = {.dtype = TSR_F32, .rows = 1, .cols = LD, .data = bv};
    tsr_tensor tbq = {.dtype = TSR_F32, .rows = 1, .cols = QD, .data = bv};
    tsr_tensor tbk = {.dtype = TSR_F32, .rows = 1, .cols = KVD, .data = bv + QD};
    tsr_tensor tbv = {.dtype = TSR_F32, .rows = 1, .cols = KVD, .data = bv + QD + KVD};
    tsr_tensor tqn = {.dtype = TSR_F32, .rows = 1, .cols = HD, .data = qn};
    tsr_tensor tkn = {.dtype = TSR_F32, .rows = 1, .cols = HD, .data = kn};
    const size_t outn = N * QD + 2 * N * KVD;
    float *want = tsr_malloc(outn * sizeof(float)), *got = tsr_malloc(outn * sizeof(float));
    char what[96];
    snprintf(what, sizeof what, "qkv_rope %s%s%s", with_lay ? tsr_kv_dtype_name(kv_dtype) : "k/v out",
             norms ? " q/k norms" : "", bias ? " bias" : "");
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        placed pb, pbq, pbk, pbv, pqn, pkn;
        ASSERT_OK(be_tensor(be, &tb, &pb));
        ASSERT_OK(be_tensor(be, &tbq, &pbq));
        ASSERT_OK(be_tensor(be, &tbk, &pbk));
        ASSERT_OK(be_tensor(be, &tbv, &pbv));
        ASSERT_OK(be_tensor(be, &tqn, &pqn));
        ASSERT_OK(be_tensor(be, &tkn, &pkn));
        kv_store s;
        ASSERT_OK(kv_store_make(be, 1, KV_SLOTS, KV_BLOCK, KVD, &s));
        s.lay.dtype = kv_dtype; /* the f32-sized buffer holds any dtype's rows */
        s.lay.v = tsr_kv_rows_at(s.lay.k, kv_dtype, KVD, (int64_t)KV_BLOCK * KVD);
        float *dq = be_dup(be, NULL, N * QD * sizeof(float));
        float *dk = be_dup(be, hk, N * KVD * sizeof(float));
        float *dv = be_dup(be, hv, N * KVD * sizeof(float));
        ASSERT_TRUE(dq && dk && dv);
        if (b < 0) { /* the unfused sequence */
            ASSERT_OK(tsr_backend_upload(be, dq, hq, N * QD * sizeof(float)));
            if (bias) {
                ASSERT_OK(be->ops->bias_add(be, dq, &pbq.t, N));
                ASSERT_OK(be->ops->bias_add(be, dk, &pbk.t, N));
                ASSERT_OK(be->ops->bias_add(be, dv, &pbv.t, N));
            }
            if (norms) {
                ASSERT_OK(be->ops->rmsnorm(be, dq, &pqn.t, N * NH, HD, cfg.norm_eps, dq));
                ASSERT_OK(be->ops->rmsnorm(be, dk, &pkn.t, N * NKV, HD, cfg.norm_eps, dk));
            }
            ASSERT_OK(be->ops->rope(be, dq, pos, N, NH, &cfg));
            ASSERT_OK(be->ops->rope(be, dk, pos, N, NKV, &cfg));
            if (with_lay) ASSERT_OK(be->ops->kv_write(be, &s.lay, slots, N, dk, dv));
        } else {
            float *dqkv = be_dup(be, qkv, N * LD * sizeof(float));
            ASSERT_TRUE(dqkv != NULL);
            tsr_qkv_rope_args a = {.qkv = dqkv, .n = N, .n_heads = NH, .n_kv_heads = NKV,
                                   .cfg = &cfg, .pos = pos, .bias = bias ? &pb.t : NULL,
                                   .q_norm = norms ? &pqn.t : NULL,
                                   .k_norm = norms ? &pkn.t : NULL, .q = dq,
                                   .lay = with_lay ? &s.lay : NULL, .slots = slots,
                                   .k = dk, .v = dv};
            ASSERT_OK(be->ops->qkv_rope(be, &a));
            be_release(be, dqkv);
        }
        float *out = b < 0 ? want : got;
        ASSERT_OK(be_read(be, out, dq, N * QD * sizeof(float)));
        if (with_lay) {
            ASSERT_OK(be->ops->kv_gather(be, &s.lay, slots, N, out + N * QD,
                                         out + N * QD + N * KVD, NULL));
        } else {
            ASSERT_OK(be_read(be, out + N * QD, dk, N * KVD * sizeof(float)));
            ASSERT_OK(be_read(be, out + N * QD + N * KVD, dv, N * KVD * sizeof(float)));
        }
        /* the CPU backends give the bits; a GPU rounds sin/cos and the norms' sums its own
         * way (|x| < 4 here), and a bf16, q8 or fp8 store may round such a value to the
         * neighbouring code */
        static const double dev_tol[] = {1e-5, 2e-2, 5e-2, 0.3}; /* f32, bf16, q8, fp8 */
        double tol = b >= 0 && be->device >= 0 ? dev_tol[with_lay ? kv_dtype : 0] : 0.0;
        if (b >= 0) ASSERT_TRUE(compare(what, t.label[b], got, want, outn, NULL, tol) <= 1.0);
        be_release(be, dq);
        be_release(be, dk);
        be_release(be, dv);
        kv_store_free(be, &s);
        be_tensor_release(be, &pb);
        be_tensor_release(be, &pbq);
        be_tensor_release(be, &pbk);
        be_tensor_release(be, &pbv);
        be_tensor_release(be, &pqn);
        be_tensor_release(be, &pkn);
    }
    tsr_free(qkv);
    tsr_free(bv);
    tsr_free(qn);
    tsr_free(kn);
    tsr_free(hq);
    tsr_free(hk);
    tsr_free(hv);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_qkv_rope) {
    check_qkv_rope(TSR_KV_F32, 1, 0, 0);
    check_qkv_rope(TSR_KV_BF16, 1, 1, 1);
    check_qkv_rope(TSR_KV_F32, 0, 1, 1);
    check_qkv_rope(TSR_KV_Q8, 1, 0, 1);
    check_qkv_rope(TSR_KV_FP8, 1, 1, 0);
}

/* swiglu_fused against swiglu on the two halves, split on the host. */
TSR_TEST(test_swiglu_fused) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { N = 9, H = 3000 }; /* over the CPU's threading threshold */
    float *gu = rand_floats(N * 2 * H, 6.0f);
    float *g = tsr_malloc(N * H * sizeof(float)), *u = tsr_malloc(N * H * sizeof(float));
    for (int r = 0; r < N; r++) {
        memcpy(g + r * H, gu + r * 2 * H, H * sizeof(float));
        memcpy(u + r * H, gu + r * 2 * H + H, H * sizeof(float));
    }
    float *want = tsr_malloc(N * H * sizeof(float)), *got = tsr_malloc(N * H * sizeof(float));
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        float *dout = be_dup(be, g, N * H * sizeof(float));
        float *dgu = be_dup(be, gu, N * 2 * H * sizeof(float));
        float *du = be_dup(be, u, N * H * sizeof(float));
        ASSERT_TRUE(dout && dgu && du);
        if (b < 0)
            ASSERT_OK(be->ops->swiglu(be, dout, du, N * H));
        else
            ASSERT_OK(be->ops->swiglu_fused(be, dgu, N, H, dout));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dout, N * H * sizeof(float)));
        if (b >= 0)
            ASSERT_TRUE(compare("swiglu_fused 9x3000", t.label[b], got, want, N * H, NULL,
                                be->device >= 0 ? 1e-5 : 0.0) <= 1.0);
        be_release(be, dout);
        be_release(be, dgu);
        be_release(be, du);
    }
    tsr_free(gu);
    tsr_free(g);
    tsr_free(u);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* rmsnorm_matmul and swiglu_matmul_acc against their two steps on the reference: xb and
 * y (the residual y += for the second). On CUDA with BF16 weights the GEMM's input is the
 * rows rounded to BF16 either way, written by the norm / SwiGLU kernel instead of a
 * conversion: within the BF16 GEMM's tolerance of the CPU. */
static void check_norm_swiglu_matmul(tsr_dtype dt, int64_t n) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { DIM = 256, HID = 384, PARTS = 4 };
    const int32_t seg[PARTS + 1] = {0, 96, 192, 288, 384};
    float *x = rand_floats((size_t)(n * DIM), 2.0f), *nw = rand_floats(DIM, 0.2f);
    for (int i = 0; i < DIM; i++) nw[i] += 1.0f;
    float *w1f = rand_floats(2 * HID * DIM, 0.1f), *w2f = rand_floats(DIM * HID, 0.1f);
    float *gu = rand_floats((size_t)(n * 2 * HID), 3.0f), *res = rand_floats((size_t)(n * DIM), 1.0f);
    tsr_tensor tn = {.dtype = TSR_F32, .rows = 1, .cols = DIM, .data = nw};
    tsr_tensor w1 = make_tensor(dt, 2 * HID, DIM, w1f), w2 = make_tensor(dt, DIM, HID, w2f);
    const size_t outn = (size_t)(n * DIM + n * 2 * HID + n * DIM);
    float *want = tsr_malloc(outn * sizeof(float)), *got = tsr_malloc(outn * sizeof(float));
    char what[80];
    snprintf(what, sizeof what, "rmsnorm_matmul+swiglu_matmul_acc %s n=%lld",
             tsr_dtype_name(dt), (long long)n);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        placed pn, p1, p2;
        ASSERT_OK(be_tensor(be, &tn, &pn));
        ASSERT_OK(be_tensor(be, &w1, &p1));
        ASSERT_OK(be_tensor(be, &w2, &p2));
        float *dx = be_dup(be, x, (size_t)(n * DIM) * sizeof(float));
        float *dxb = be_dup(be, NULL, (size_t)(n * DIM) * sizeof(float));
        float *dy = be_dup(be, NULL, (size_t)(n * 2 * HID) * sizeof(float));
        float *dgu = be_dup(be, gu, (size_t)(n * 2 * HID) * sizeof(float));
        float *dhb = be_dup(be, NULL, (size_t)(n * HID) * sizeof(float));
        float *dres = be_dup(be, res, (size_t)(n * DIM) * sizeof(float));
        ASSERT_TRUE(dx && dxb && dy && dgu && dhb && dres);
        if (b < 0) {
            ASSERT_OK(be->ops->rmsnorm(be, dx, &pn.t, n, DIM, 1e-5f, dxb));
            ASSERT_OK(be->ops->matmul(be, dxb, n, &p1.t, dy));
            ASSERT_OK(be->ops->swiglu_fused(be, dgu, n, HID, dhb));
            ASSERT_OK(be->ops->matmul_parts_acc(be, dhb, n, &p2.t, seg, PARTS, dres));
        } else {
            ASSERT_OK(be->ops->rmsnorm_matmul(be, dx, &pn.t, n, DIM, 1e-5f, dxb, &p1.t, dy));
            ASSERT_OK(be->ops->swiglu_matmul_acc(be, dgu, n, HID, dhb, &p2.t, seg, PARTS, dres));
        }
        float *out = b < 0 ? want : got;
        ASSERT_OK(be_read(be, out, dxb, (size_t)(n * DIM) * sizeof(float)));
        ASSERT_OK(be_read(be, out + n * DIM, dy, (size_t)(n * 2 * HID) * sizeof(float)));
        ASSERT_OK(be_read(be, out + n * DIM + n * 2 * HID, dres, (size_t)(n * DIM) * sizeof(float)));
        if (b >= 0)
            ASSERT_TRUE(compare(what, t.label[b], got, want, outn, NULL,
                                be->device >= 0 ? 0.2 : 0.0) <= 1.0);
        be_release(be, dx);
        be_release(be, dxb);
        be_release(be, dy);
        be_release(be, dgu);
        be_release(be, dhb);
        be_release(be, dres);
        be_tensor_release(be, &pn);
        be_tensor_release(be, &p1);
        be_tensor_release(be, &p2);
    }
    tsr_free(x);
    tsr_free(nw);
    tsr_free(w1f);
    tsr_free(w2f);
    tsr_free(gu);
    tsr_free(res);
    tsr_free((void *)w1.data);
    tsr_free((void *)w2.data);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_norm_swiglu_matmul) {
    check_norm_swiglu_matmul(TSR_BF16, 1);
    check_norm_swiglu_matmul(TSR_BF16, 40);
    check_norm_swiglu_matmul(TSR_F32, 3);
}

/* ---- timings (TSR_BENCH=1; tests/device/run.sh) ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of matmul on `be` (best of `reps` after a warm-up). */
static double time_matmul(tsr_backend *be, tsr_dtype dt, int64_t n, int64_t rows, int64_t cols,
                          int reps) {
    size_t wn = (size_t)(rows * cols);
    float *wf = rand_floats(wn, 0.1f);
    tsr_tensor w = make_tensor(dt, rows, cols, wf);
    placed wd;
    tsr_free(wf);
    double best = INFINITY;
    float *x = rand_floats((size_t)(n * cols), 1.0f);
    float *dx = be_dup(be, x, (size_t)(n * cols) * sizeof(float));
    float *dy = be_dup(be, NULL, (size_t)(n * rows) * sizeof(float));
    if (dx && dy && be_tensor(be, &w, &wd) == TSR_OK) {
        for (int r = 0; r <= reps; r++) {
            double t0 = now_s();
            if (be->ops->matmul(be, dx, n, &wd.t, dy) != TSR_OK) break;
            if (be->ops->synchronize(be) != TSR_OK) break;
            if (r > 0 && now_s() - t0 < best) best = now_s() - t0;
        }
        be_tensor_release(be, &wd);
    }
    be_release(be, dx);
    be_release(be, dy);
    tsr_free(x);
    tsr_free((void *)w.data);
    return best;
}

/* Seconds of one causal attention call: n_q queries at the end of n_k contiguous keys. */
static double time_attention(tsr_backend *be, int n_q, int n_k, int n_heads, int n_kv_heads,
                             int hd, int reps) {
    size_t qn = (size_t)n_q * (size_t)(n_heads * hd), kn = (size_t)n_k * (size_t)(n_kv_heads * hd);
    float *q = rand_floats(qn, 1.0f), *k = rand_floats(kn, 1.0f);
    int32_t *qpos = tsr_malloc((size_t)n_q * sizeof(int32_t));
    for (int i = 0; i < n_q; i++) qpos[i] = n_k - n_q + i;
    float *dq = be_dup(be, q, qn * sizeof(float)), *dk = be_dup(be, k, kn * sizeof(float));
    float *dv = be_dup(be, k, kn * sizeof(float)), *dout = be_dup(be, NULL, qn * sizeof(float));
    double best = INFINITY;
    if (dq && dk && dv && dout) {
        tsr_kv_span sp = {.k = dk, .v = dv, .n = n_k, .stride = n_kv_heads * hd};
        tsr_attn_args a = {.q = dq, .q_pos = qpos, .n_q = n_q, .spans = &sp, .n_spans = 1,
                           .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = hd,
                           .out = dout};
        for (int r = 0; r <= reps; r++) {
            double t0 = now_s();
            if (be->ops->attention(be, &a) != TSR_OK) break;
            if (be->ops->synchronize(be) != TSR_OK) break;
            if (r > 0 && now_s() - t0 < best) best = now_s() - t0;
        }
    }
    be_release(be, dq);
    be_release(be, dk);
    be_release(be, dv);
    be_release(be, dout);
    tsr_free(q);
    tsr_free(k);
    tsr_free(qpos);
    return best;
}

/* Decode at batch 1 with BF16 weights: cuBLAS at n = 1 (be) against the GEMV kernel (gv,
 * a CUDA backend made under TSR_CUDA_GEMV=1), each checked against the CPU reference
 * (which multiplies f32 inputs, as the kernel does; cuBLAS rounds them to BF16 first), and
 * the weights' bytes per second of each. Issue 24 item 2 takes the kernel by default when
 * cuBLAS stays below 85 % of the HBM bandwidth (tsr_membw's figure) and the kernel does
 * better. */
static void bench_gemv(tsr_backend *ref, tsr_backend *be, tsr_backend *gv, int64_t rows,
                       int64_t cols) {
    float *wf = rand_floats((size_t)(rows * cols), 0.1f), *x = rand_floats((size_t)cols, 1.0f);
    tsr_tensor w = make_tensor(TSR_BF16, rows, cols, wf);
    float *want = tsr_malloc((size_t)rows * sizeof(float)), *got = tsr_malloc((size_t)rows * sizeof(float));
    tsr_backend *bs[3] = {ref, be, gv};
    double err[3] = {0}, best[3] = {INFINITY, INFINITY, INFINITY};
    for (int b = 0; b < 3 && want && got; b++) {
        placed pw;
        float *dx = be_dup(bs[b], x, (size_t)cols * sizeof(float));
        float *dy = be_dup(bs[b], NULL, (size_t)rows * sizeof(float));
        if (!dx || !dy || be_tensor(bs[b], &w, &pw) != TSR_OK) break;
        for (int r = 0; r <= (b ? 20 : 0); r++) {
            double t0 = now_s();
            if (bs[b]->ops->matmul(bs[b], dx, 1, &pw.t, dy) != TSR_OK) break;
            if (bs[b]->ops->synchronize(bs[b]) != TSR_OK) break;
            if (r > 0 && now_s() - t0 < best[b]) best[b] = now_s() - t0;
        }
        if (be_read(bs[b], b ? got : want, dy, (size_t)rows * sizeof(float)) == TSR_OK && b)
            for (int64_t i = 0; i < rows; i++)
                if (fabs((double)got[i] - want[i]) > err[b]) err[b] = fabs((double)got[i] - want[i]);
        be_tensor_release(bs[b], &pw);
        be_release(bs[b], dx);
        be_release(bs[b], dy);
    }
    double gb = (double)(rows * cols) * 2.0 * 1e-9;
    printf("  gemv bf16 n=1 %6lldx%-5lld: cuBLAS %7.3f ms %7.1f GB/s (err %.1e), kernel %7.3f ms "
           "%7.1f GB/s (err %.1e): kernel %.2fx\n", (long long)rows, (long long)cols,
           best[1] * 1e3, gb / best[1], err[1], best[2] * 1e3, gb / best[2], err[2],
           best[1] / best[2]);
    tsr_free(wf);
    tsr_free(x);
    tsr_free((void *)w.data);
    tsr_free(want);
    tsr_free(got);
}

TSR_TEST(test_bench) {
    if (!getenv("TSR_BENCH")) return;
    targets t;
    ASSERT_OK(targets_open(&t));
    tsr_backend *be = t.be[t.n - 1]; /* CUDA when present, else the last CPU kind */
    printf("bench on %s (best of 5; Llama-3-8B-like shapes)\n", t.label[t.n - 1]);
    struct {
        tsr_dtype dt;
        int64_t n, rows, cols;
    } mm[] = {{TSR_BF16, 1, 14336, 4096}, {TSR_BF16, 512, 4096, 4096},
              {TSR_F32, 512, 4096, 4096}, {TSR_BF16, 4096, 14336, 4096}};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        if (be->device < 0 && mm[i].n > 512) continue; /* minutes on a CPU */
        double s = time_matmul(be, mm[i].dt, mm[i].n, mm[i].rows, mm[i].cols, 5);
        double flop = 2.0 * (double)mm[i].n * (double)mm[i].rows * (double)mm[i].cols;
        double bytes = (double)(mm[i].rows * mm[i].cols) * (double)tsr_dtype_size(mm[i].dt);
        printf("  matmul %-4s n=%-5lld %lldx%lld: %9.3f ms  %8.1f TFLOP/s  %7.1f GB/s weights\n",
               tsr_dtype_name(mm[i].dt), (long long)mm[i].n, (long long)mm[i].rows,
               (long long)mm[i].cols, s * 1e3, flop / s * 1e-12, bytes / s * 1e-9);
    }
    if (be->device >= 0) { /* the 8B shape's decode products, q/k/v and gate/up fused */
        setenv("TSR_CUDA_GEMV", "1", 1);
        tsr_backend *gv = NULL;
        tsr_status gst = tsr_backend_create("cuda", 1, &gv);
        unsetenv("TSR_CUDA_GEMV");
        const int64_t gs[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
        for (size_t i = 0; gst == TSR_OK && i < sizeof gs / sizeof gs[0]; i++)
            bench_gemv(t.ref, be, gv, gs[i][0], gs[i][1]);
        if (gst != TSR_OK) printf("  gemv: no second cuda backend (%s)\n", tsr_last_error());
        tsr_backend_destroy(gv);
    }
    struct {
        int n_q, n_k;
    } at[] = {{1, 32768}, {1, 131072}, {2048, 2048}, {8192, 8192}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        if (be->device < 0 && at[i].n_q > 2048) continue;
        double s = time_attention(be, at[i].n_q, at[i].n_k, 32, 8, 128, 3);
        /* causal pairs: queries at the end see n_k - n_q + 1 .. n_k keys */
        double pairs = (double)at[i].n_q * ((double)at[i].n_k - (double)at[i].n_q / 2.0);
        double flop = 4.0 * pairs * 32 * 128;
        double kvbytes = 2.0 * (double)at[i].n_k * 8 * 128 * 4;
        printf("  attention n_q=%-5d n_k=%-6d 32/8 heads hd128: %9.3f ms  %6.2f TFLOP/s  "
               "%7.1f GB/s KV\n",
               at[i].n_q, at[i].n_k, s * 1e3, flop / s * 1e-12, kvbytes / s * 1e-9);
    }
    /* the sample op on a Llama-3 vocabulary: greedy, and top-k 50 + top-p 0.9 (the sort) */
    if (be->ops->sample) {
        const int V = 128256, rows[2] = {1, 64};
        for (int ri = 0; ri < 2; ri++) {
            for (int kind = 0; kind < 2; kind++) {
                const int n = rows[ri];
                if (be->device < 0 && n > 1 && kind) continue; /* the host's qsort: seconds */
                float *x = rand_floats((size_t)n * V, 4.0f);
                tsr_sample_params *par = tsr_malloc((size_t)n * sizeof *par);
                int32_t *ids = tsr_malloc((size_t)n * sizeof(int32_t));
                float *dx = be_dup(be, NULL, (size_t)n * V * sizeof(float));
                double best = INFINITY;
                for (int i = 0; par && i < n; i++)
                    par[i] = kind ? (tsr_sample_params){0.8f, 0.9f, 50, 0.5f}
                                  : (tsr_sample_params){0.0f, 1.0f, 0, 0.0f};
                for (int r = 0; x && par && ids && dx && r <= 3; r++) {
                    /* the op overwrites its logits: fresh ones each time, outside the timing */
                    if (tsr_backend_upload(be, dx, x, (size_t)n * V * sizeof(float)) != TSR_OK)
                        break;
                    double t0 = now_s();
                    if (be->ops->sample(be, dx, n, V, par, ids) != TSR_OK) break;
                    if (r > 0 && now_s() - t0 < best) best = now_s() - t0;
                }
                printf("  sample %-2d rows x %d vocab %-18s: %9.3f ms (ids on the host)\n", n, V,
                       kind ? "top-k 50 top-p 0.9" : "greedy", best * 1e3);
                be_release(be, dx);
                tsr_free(x);
                tsr_free(par);
                tsr_free(ids);
            }
        }
    }
    targets_close(&t);
}

TSR_TEST(test_backend_select) {
    tsr_backend *be = NULL;
    ASSERT_OK(tsr_backend_create("auto", 1, &be));
    printf("  backend auto -> %s\n", be->ops->name);
    tsr_backend_destroy(be);
    be = NULL;
    tsr_status st = tsr_backend_create("cuda", 1, &be);
    if (st == TSR_OK) {
        ASSERT_STR_EQ(be->ops->name, "cuda");
        tsr_backend_destroy(be);
    } else {
        /* no device (TSR_ERR_CUDA) or no CUDA in this build: a clear line either way */
        ASSERT_TRUE(st == TSR_ERR_CUDA || st == TSR_ERR_UNSUPPORTED);
        ASSERT_TRUE(be == NULL);
        ASSERT_TRUE(strlen(tsr_last_error()) > 0);
        printf("  backend cuda -> %s: %s\n", tsr_strerror(st), tsr_last_error());
    }
    be = NULL;
    ASSERT_OK(tsr_backend_create_local("cpu-fenced", 1, 3, &be));
    ASSERT_STR_EQ(be->ops->name, "cpu-fenced");
    ASSERT_TRUE(!be->host_memory && be->device == -1);
    tsr_backend_destroy(be);
    be = NULL;
    ASSERT_EQ_INT(tsr_backend_create("tpu", 1, &be), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "cpu-fenced");
}

TSR_TEST_MAIN(test_memory, test_copies, test_kv_rows, test_matmul_f32, test_matmul_bf16,
              test_matmul_f16, test_matmul_parts, test_rmsnorm, test_rope, test_swiglu_add, test_bias_add,
              test_embed, test_attention_decode, test_attention_prefill, test_attention_paged,
              test_matmul_parts_acc, test_sample, test_qkv_rope, test_swiglu_fused,
              test_norm_swiglu_matmul,
              test_backend_select,
              test_bench)
