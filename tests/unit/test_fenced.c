/* The fenced CPU device: a host read of its memory faults, its ops and copies work and
 * round-trip bytes, memory() follows the arena it was given, its allocator reuses and
 * coalesces blocks and survives bad frees, and its contract checks reject host pointers
 * passed where backend memory belongs (and the reverse). */
#define _DEFAULT_SOURCE /* setenv, unsetenv */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "kernels/backend.h"
#include "tests/test.h"

#define MiB ((size_t)1 << 20)

/* Whether a read of *p in a forked child dies of SIGSEGV. ASan installs its own SIGSEGV
 * handler (a report and exit 1): the child puts back the default before reading, and
 * writes no core file. */
static int read_faults(const void *p) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        (void)setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGSEGV, SIG_DFL);
        volatile const float *vp = p;
        float x = *vp;
        _exit(x == 12345.0f ? 2 : 0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

static tsr_backend *fenced(size_t arena) {
    tsr_backend *be = NULL;
    tsr_status st = tsr_backend_fenced_create(1, arena, &be);
    if (st != TSR_OK) {
        fprintf(stderr, "  cpu-fenced: %s\n", tsr_last_error());
        return NULL;
    }
    return be;
}

TSR_TEST(test_host_read_faults) {
    tsr_backend *be = fenced(4 * MiB);
    ASSERT_TRUE(be != NULL);
    ASSERT_STR_EQ(be->ops->name, "cpu-fenced");
    ASSERT_TRUE(!be->host_memory);
    ASSERT_EQ_INT(be->device, -1);
    float *buf = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, 1024 * sizeof(float), (void **)&buf));
    float ones[1024];
    for (int i = 0; i < 1024; i++) ones[i] = 1.0f;
    ASSERT_OK(tsr_backend_upload(be, buf, ones, sizeof ones));
    /* closed after an upload, after a compute op, and after an op that failed */
    ASSERT_EQ_INT(read_faults(buf), 1);
    ASSERT_OK(be->ops->add(be, buf, buf, 1024));
    ASSERT_EQ_INT(read_faults(buf + 1000), 1);
    ASSERT_EQ_INT(be->ops->add(be, buf, ones, 1024), TSR_ERR_INVALID);
    ASSERT_EQ_INT(read_faults(buf), 1);
    /* the control: a host buffer reads fine in the same child */
    ASSERT_EQ_INT(read_faults(ones), 0);
    float back[1024];
    ASSERT_OK(tsr_backend_download(be, back, buf, sizeof back));
    for (int i = 0; i < 1024; i++) ASSERT_TRUE(back[i] == 2.0f);
    be->ops->buffer_free(be, buf);
    tsr_backend_destroy(be);
}

TSR_TEST(test_roundtrip_and_ops) {
    tsr_backend *be = fenced(8 * MiB), *cpu = NULL;
    ASSERT_TRUE(be != NULL);
    ASSERT_OK(tsr_backend_cpu_create(1, &cpu));
    enum { N = 3, ROWS = 40, COLS = 56 };
    float x[N * COLS], w[ROWS * COLS], want[N * ROWS], got[N * ROWS];
    for (int i = 0; i < N * COLS; i++) x[i] = (float)((i * 37) % 19) / 7.0f - 1.0f;
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)((i * 11) % 23) / 11.0f - 1.0f;
    tsr_tensor hw = {.dtype = TSR_F32, .rows = ROWS, .cols = COLS, .data = w}, dw;
    ASSERT_OK(cpu->ops->matmul(cpu, x, N, &hw, want));

    bool copied = false;
    ASSERT_OK(tsr_backend_place_tensor(be, &hw, &dw, &copied));
    ASSERT_TRUE(copied && dw.data != hw.data);
    float *dx = NULL, *dy = NULL, *dz = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof x, (void **)&dx));
    ASSERT_OK(tsr_backend_upload(be, dx, x, sizeof x));
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof want, (void **)&dy));
    ASSERT_OK(be->ops->matmul(be, dx, N, &dw, dy));
    ASSERT_OK(tsr_backend_download(be, got, dy, sizeof got));
    ASSERT_TRUE(memcmp(got, want, sizeof got) == 0); /* the same kernels: the same bits */

    /* a buffer made after the fence last opened lies past the old extent: still reachable */
    ASSERT_OK(be->ops->buffer_alloc(be, 3 * MiB, (void **)&dz));
    ASSERT_OK(tsr_backend_copy(be, dz + MiB / sizeof(float), dy, sizeof got));
    ASSERT_OK(be->ops->memset(be, dy, 0, sizeof got));
    ASSERT_OK(tsr_backend_download(be, got, dz + MiB / sizeof(float), sizeof got));
    ASSERT_TRUE(memcmp(got, want, sizeof got) == 0);
    ASSERT_OK(tsr_backend_download(be, got, dy, sizeof got));
    for (int i = 0; i < N * ROWS; i++) ASSERT_TRUE(got[i] == 0.0f);

    /* staged copies on a stream, ordered by an event, from pinned host memory */
    tsr_stream *s = NULL;
    tsr_event *ev = NULL;
    float *pinned = NULL;
    ASSERT_OK(be->ops->host_alloc(be, sizeof want, true, (void **)&pinned));
    ASSERT_EQ_INT(read_faults(pinned), 0); /* host memory: outside the fence */
    memcpy(pinned, want, sizeof want);
    ASSERT_OK(be->ops->stream_create(be, &s));
    ASSERT_OK(be->ops->event_create(be, &ev));
    ASSERT_OK(be->ops->upload(be, dy, pinned, sizeof want, s));
    ASSERT_OK(be->ops->event_record(be, ev, s));
    ASSERT_OK(be->ops->stream_wait(be, NULL, ev));
    ASSERT_OK(be->ops->event_sync(be, ev));
    memset(pinned, 0, sizeof want);
    ASSERT_OK(be->ops->download(be, pinned, dy, sizeof want, s));
    ASSERT_OK(be->ops->event_record(be, ev, s));
    ASSERT_OK(be->ops->event_sync(be, ev));
    ASSERT_OK(be->ops->synchronize(be));
    ASSERT_TRUE(memcmp(pinned, want, sizeof want) == 0);
    be->ops->event_destroy(be, ev);
    be->ops->stream_destroy(be, s);
    be->ops->host_free(be, pinned);

    be->ops->buffer_free(be, dz);
    be->ops->buffer_free(be, dy);
    be->ops->buffer_free(be, dx);
    be->ops->buffer_free(be, (void *)dw.data);
    size_t fr = 0, total = 0;
    ASSERT_OK(be->ops->memory(be, &fr, &total));
    ASSERT_EQ_INT(fr, total);
    tsr_backend_destroy(be);
    tsr_backend_destroy(cpu);
}

TSR_TEST(test_memory_follows_arena) {
    tsr_backend *be = fenced(MiB + 100); /* rounded up to whole pages */
    ASSERT_TRUE(be != NULL);
    size_t fr = 0, total = 0;
    ASSERT_OK(be->ops->memory(be, &fr, &total));
    ASSERT_EQ_INT(total, MiB + 4096);
    ASSERT_EQ_INT(fr, total);
    void *a = NULL, *b = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, MiB / 2, &a));
    ASSERT_OK(be->ops->memory(be, &fr, &total));
    ASSERT_EQ_INT(fr, MiB / 2 + 4096);
    ASSERT_EQ_INT(be->ops->buffer_alloc(be, MiB, &b), TSR_ERR_NOMEM);
    ASSERT_TRUE(b == NULL);
    ASSERT_STR_CONTAINS(tsr_last_error(), "cpu-fenced: out of device memory: 1048576 bytes asked, "
                                          "528384 free of 1052672");
    be->ops->buffer_free(be, a);
    ASSERT_OK(be->ops->buffer_alloc(be, MiB + 1, &b)); /* all of it, once coalesced */
    be->ops->buffer_free(be, b);
    tsr_backend_destroy(be);

    /* TSR_FENCED_MEMORY sizes the arena of tsr_backend_create("cpu-fenced") */
    const char *old = getenv("TSR_FENCED_MEMORY");
    char *saved = old ? tsr_strdup(old) : NULL;
    struct {
        const char *v;
        size_t bytes;
    } ok[] = {{"3M", 3 * MiB}, {"2097152", 2 * MiB}, {"64k", 64 * 1024}, {"1G", 1024 * MiB},
              {"8MB", 8 * MiB}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        setenv("TSR_FENCED_MEMORY", ok[i].v, 1);
        be = NULL;
        ASSERT_OK(tsr_backend_create("cpu-fenced", 1, &be));
        ASSERT_STR_EQ(be->ops->name, "cpu-fenced");
        ASSERT_OK(be->ops->memory(be, &fr, &total));
        ASSERT_EQ_INT(total, ok[i].bytes);
        tsr_backend_destroy(be);
    }
    const char *bad[] = {"lots", "12Q", "-4M", "0", "", "4M extra"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TSR_FENCED_MEMORY", bad[i], 1);
        be = NULL;
        ASSERT_EQ_INT(tsr_backend_create("cpu-fenced", 1, &be), TSR_ERR_INVALID);
        ASSERT_TRUE(be == NULL);
        ASSERT_STR_CONTAINS(tsr_last_error(), "TSR_FENCED_MEMORY");
    }
    /* an explicit size wins over the variable (still set to a bad value here) */
    be = fenced(2 * MiB);
    ASSERT_TRUE(be != NULL);
    tsr_backend_destroy(be);
    /* unset: 4 GiB at most (half of MemAvailable on a small host) */
    unsetenv("TSR_FENCED_MEMORY");
    be = NULL;
    ASSERT_OK(tsr_backend_create("cpu-fenced", 1, &be));
    ASSERT_OK(be->ops->memory(be, &fr, &total));
    ASSERT_TRUE(total > 0 && total <= ((size_t)4 << 30));
    printf("  default arena: %zu MiB\n", total >> 20);
    tsr_backend_destroy(be);
    if (saved) setenv("TSR_FENCED_MEMORY", saved, 1);
    tsr_free(saved);
}

TSR_TEST(test_allocator) {
    tsr_backend *be = fenced(64 * 4096);
    ASSERT_TRUE(be != NULL);
    char *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, 3 * 4096, (void **)&a));
    ASSERT_OK(be->ops->buffer_alloc(be, 1, (void **)&b)); /* one page */
    ASSERT_OK(be->ops->buffer_alloc(be, 0, (void **)&c)); /* one page, still distinct */
    ASSERT_TRUE(((uintptr_t)a & 4095) == 0 && ((uintptr_t)b & 4095) == 0);
    ASSERT_TRUE(b == a + 3 * 4096 && c == b + 4096);
    /* first fit: a hole is reused by what fits in it */
    be->ops->buffer_free(be, a);
    ASSERT_OK(be->ops->buffer_alloc(be, 2 * 4096, (void **)&d));
    ASSERT_TRUE(d == a);
    ASSERT_OK(be->ops->buffer_alloc(be, 2 * 4096, (void **)&e)); /* the hole's rest is short */
    ASSERT_TRUE(e == c + 4096);
    /* double free and foreign pointers change nothing */
    size_t fr0 = 0, fr1 = 0, total = 0;
    be->ops->buffer_free(be, b);
    ASSERT_OK(be->ops->memory(be, &fr0, &total));
    be->ops->buffer_free(be, b);
    be->ops->buffer_free(be, d + 4096); /* inside a buffer, not its start */
    int local = 0;
    be->ops->buffer_free(be, &local);
    ASSERT_OK(be->ops->memory(be, &fr1, &total));
    ASSERT_EQ_INT(fr1, fr0);
    /* the freed page is not a live buffer any more: ops refuse it */
    float one = 1.0f;
    ASSERT_EQ_INT(tsr_backend_upload(be, b, &one, sizeof one), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "not inside a live device buffer");
    /* and a range running past its buffer's end too */
    ASSERT_EQ_INT(be->ops->memset(be, d, 0, 2 * 4096 + 1), TSR_ERR_INVALID);
    be->ops->buffer_free(be, c);
    be->ops->buffer_free(be, e);
    be->ops->buffer_free(be, d);
    ASSERT_OK(be->ops->memory(be, &fr1, &total));
    ASSERT_EQ_INT(fr1, total);
    /* coalesced back into one run: the whole arena in one buffer */
    ASSERT_OK(be->ops->buffer_alloc(be, 64 * 4096, (void **)&a));
    ASSERT_TRUE(a == d);
    be->ops->buffer_free(be, a);
    /* many buffers freed in a scattered order coalesce as well */
    char *p[64];
    for (int i = 0; i < 64; i++) ASSERT_OK(be->ops->buffer_alloc(be, 4096, (void **)&p[i]));
    for (int i = 0; i < 64; i++) be->ops->buffer_free(be, p[(i * 37) % 64]);
    ASSERT_OK(be->ops->buffer_alloc(be, 64 * 4096, (void **)&a));
    be->ops->buffer_free(be, a);
    tsr_backend_destroy(be);
}

TSR_TEST(test_contract_checks) {
    tsr_backend *be = fenced(4 * MiB);
    ASSERT_TRUE(be != NULL);
    enum { N = 2, D = 32 };
    float hx[N * D] = {0}, hw[D * D] = {0};
    int32_t pos[N] = {0, 1}, ids[N] = {0, 1}, slots[N] = {0, 1};
    float *dx = NULL, *dy = NULL, *dw = NULL;
    int32_t *dpos = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof hx, (void **)&dx));
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof hx, (void **)&dy));
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof hw, (void **)&dw));
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof pos, (void **)&dpos));
    ASSERT_OK(be->ops->memset(be, dx, 0, sizeof hx));
    ASSERT_OK(be->ops->memset(be, dw, 0, sizeof hw));
    tsr_tensor host_w = {.dtype = TSR_F32, .rows = D, .cols = D, .data = hw};
    tsr_tensor dev_w = host_w;
    dev_w.data = dw;

    /* a host activation */
    ASSERT_EQ_INT(be->ops->add(be, dx, hx, N * D), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(),
                        "cpu-fenced: add: y is not device memory (host pointer passed to a "
                        "device op)");
    ASSERT_EQ_INT(be->ops->matmul(be, hx, N, &dev_w, dy), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "matmul: x is not device memory");
    /* a weight left in host memory (the file mapping) */
    ASSERT_EQ_INT(be->ops->matmul(be, dx, N, &host_w, dy), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "matmul: weight is not device memory");
    ASSERT_EQ_INT(be->ops->rmsnorm(be, dx, &host_w, 1, D, 1e-5f, dy), TSR_ERR_INVALID);
    ASSERT_EQ_INT(be->ops->embed(be, &host_w, ids, N, dy), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "embed: weight is not device memory");
    /* the right arguments pass */
    ASSERT_OK(be->ops->matmul(be, dx, N, &dev_w, dy));
    ASSERT_OK(be->ops->embed(be, &dev_w, ids, N, dy));

    /* the step's metadata (rope positions, embed ids, kv_write slots) may be backend
     * memory inside a live buffer (dpos: zeros, a valid position, id and slot) */
    tsr_model_config cfg = {.head_dim = D, .rope_theta = 10000.0f};
    ASSERT_OK(be->ops->rope(be, dx, dpos, N, 1, &cfg));
    ASSERT_EQ_INT(be->ops->rope(be, dx, dpos + 1, N, 1, &cfg), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "rope: pos (");
    ASSERT_OK(be->ops->rope(be, dx, pos, N, 1, &cfg));
    ASSERT_OK(be->ops->embed(be, &dev_w, dpos, N, dy));
    ASSERT_EQ_INT(tsr_backend_upload(be, dy, dx, sizeof hx), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "upload: src is device memory");
    ASSERT_EQ_INT(tsr_backend_download(be, dy, dx, sizeof hx), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "download: dst is device memory");
    ASSERT_EQ_INT(tsr_backend_upload(be, hx, hx, sizeof hx), TSR_ERR_INVALID);
    ASSERT_EQ_INT(tsr_backend_download(be, hx, hx, sizeof hx), TSR_ERR_INVALID);
    ASSERT_EQ_INT(tsr_backend_copy(be, dy, hx, sizeof hx), TSR_ERR_INVALID);
    ASSERT_EQ_INT(be->ops->memset(be, hx, 0, sizeof hx), TSR_ERR_INVALID);

    /* KV rows: the layout must be backend memory, the slots and the gathered rows host */
    tsr_kv_layout lay = {.k = dx, .v = dx + D, .block_stride = 2 * D, .block = 1, .row = D};
    tsr_kv_layout host_lay = {.k = hx, .v = hx + D, .block_stride = 2 * D, .block = 1,
                              .row = D};
    float rows[N * D] = {0};
    ASSERT_OK(be->ops->kv_write(be, &lay, slots, 1, dy, dy));
    ASSERT_EQ_INT(be->ops->kv_write(be, &host_lay, slots, 1, dy, dy), TSR_ERR_INVALID);
    ASSERT_EQ_INT(be->ops->kv_write(be, &lay, slots, 1, rows, dy), TSR_ERR_INVALID);
    ASSERT_OK(be->ops->kv_write(be, &lay, dpos, 1, dy, dy)); /* device slots: metadata */
    ASSERT_EQ_INT(be->ops->kv_write(be, &lay, slots, 2, dy, dy), TSR_ERR_INVALID); /* slot 1 */
    ASSERT_STR_CONTAINS(tsr_last_error(), "not inside a live device buffer");
    ASSERT_OK(be->ops->kv_gather(be, &lay, slots, 1, rows, NULL, NULL));
    ASSERT_EQ_INT(be->ops->kv_gather(be, &lay, slots, 1, dy, NULL, NULL), TSR_ERR_INVALID);
    ASSERT_EQ_INT(be->ops->kv_scatter(be, &lay, slots, 1, NULL, dy, NULL), TSR_ERR_INVALID);
    ASSERT_EQ_INT(be->ops->kv_copy(be, &host_lay, slots, slots, 1), TSR_ERR_INVALID);

    /* attention: q, out, key scores and span rows backend, positions and spans host */
    tsr_kv_span sp = {.k = dx, .v = dx, .n = N, .stride = D};
    tsr_attn_args a = {.q = dx, .q_pos = pos, .n_q = N, .spans = &sp, .n_spans = 1,
                       .n_heads = 1, .n_kv_heads = 1, .head_dim = D, .out = dy};
    ASSERT_OK(be->ops->attention(be, &a));
    a.q = hx;
    ASSERT_EQ_INT(be->ops->attention(be, &a), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "attention: q is not device memory");
    a.q = dx;
    sp.k = hx;
    ASSERT_EQ_INT(be->ops->attention(be, &a), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "attention: span k is not device memory");
    sp.k = dx;
    a.q_pos = dpos;
    ASSERT_EQ_INT(be->ops->attention(be, &a), TSR_ERR_INVALID);
    a.q_pos = pos;
    a.key_scores = hx;
    ASSERT_EQ_INT(be->ops->attention(be, &a), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "attention: key_scores is not device memory");

    be->ops->buffer_free(be, dx);
    be->ops->buffer_free(be, dy);
    be->ops->buffer_free(be, dw);
    be->ops->buffer_free(be, dpos);
    tsr_backend_destroy(be);
}

/* Two threads using the device at once, one of them allocating as it goes (each new
 * buffer lies past the extent the other thread's window opened): the shared fence stays
 * open while either is inside an op, and every op sees its bytes. */
typedef struct worker {
    tsr_backend *be;
    int allocate;
    int errors;
} worker;

static void *worker_run(void *arg) {
    worker *w = arg;
    enum { N = 4096 };
    static _Thread_local float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    float *keep = NULL;
    if (w->be->ops->buffer_alloc(w->be, sizeof host, (void **)&keep) != TSR_OK) {
        w->errors++;
        return NULL;
    }
    for (int it = 0; it < 200; it++) {
        float *d = keep;
        if (w->allocate && w->be->ops->buffer_alloc(w->be, sizeof host + (size_t)it * 4096,
                                                    (void **)&d) != TSR_OK) {
            w->errors++;
            break;
        }
        if (tsr_backend_upload(w->be, d, host, sizeof host) != TSR_OK ||
            w->be->ops->add(w->be, d, d, N) != TSR_OK ||
            tsr_backend_download(w->be, back, d, sizeof back) != TSR_OK)
            w->errors++;
        for (int i = 0; i < N; i++)
            if (back[i] != 2.0f * (float)i) {
                w->errors++;
                break;
            }
        if (d != keep) w->be->ops->buffer_free(w->be, d);
    }
    w->be->ops->buffer_free(w->be, keep);
    return NULL;
}

TSR_TEST(test_threads) {
    tsr_backend *be = fenced(256 * MiB);
    ASSERT_TRUE(be != NULL);
    worker w[2] = {{be, 0, 0}, {be, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) ASSERT_EQ_INT(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    ASSERT_EQ_INT(w[0].errors, 0);
    ASSERT_EQ_INT(w[1].errors, 0);
    size_t fr = 0, total = 0;
    ASSERT_OK(be->ops->memory(be, &fr, &total));
    ASSERT_EQ_INT(fr, total);
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_host_read_faults, test_roundtrip_and_ops, test_memory_follows_arena,
              test_allocator, test_contract_checks, test_threads)
