/* The backend memory contract (kernels/backend.h) on every backend this process has, one
 * scenario each: host staging, sync and stream copies, memset, events, KV rows by slot,
 * and attention with host-memory positions. Written for the CUDA backend (no other test
 * reaches its memory calls), run on "cpu" and "cpu-fenced" too so that all backends are
 * held to the same expectations. Backends that this build or machine lacks are skipped
 * with a line saying so (no GPU: the CUDA half is skipped; tests/device/run.sh runs it on
 * one). Backend memory is only ever reached through the backend's calls; every check reads
 * host copies. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "tests/test.h"

/* Fails the scenario: prints where and why, then runs its cleanup. */
#define CHECK(c)                                                                        \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "  %s:%d: [%s] expected %s (%s)\n", __FILE__, __LINE__,     \
                    be->ops->name, #c, tsr_last_error());                               \
            ok = 0;                                                                     \
            goto done;                                                                  \
        }                                                                               \
    } while (0)
#define CHECK_OK(expr) CHECK((expr) == TSR_OK)

/* Opens backend `name`, or says why it is skipped and returns NULL. */
static tsr_backend *open_backend(const char *name) {
    tsr_backend *be = NULL;
    tsr_status st = tsr_backend_create(name, 1, &be);
    if (st == TSR_OK) return be;
    /* A module backend: its module missing or not loading says unsupported, a machine
     * without a driver or GPU gives a CUDA error; both are skips. */
    const tsr_backend_info *info = tsr_backend_find(name);
    if (st == TSR_ERR_UNSUPPORTED || (info && (info->caps & TSR_BACKEND_CAP_MODULE))) {
        printf("  %s: skipped (%s)\n", name, tsr_last_error());
        tsr_error_clear();
        return NULL;
    }
    fprintf(stderr, "  %s: create failed: %s\n", name, tsr_last_error());
    tsr_test_failed_flag = 1;
    return NULL;
}

/* Every backend of the registry (kernels/backend.h); a module backend that cannot run here
 * (no module, driver or GPU) is skipped. */
static int n_backends(void) {
    int n = 0;
    while (tsr_backend_info_at(n)) n++;
    return n;
}
#define N_BACKENDS n_backends()
#define BACKEND_NAME(b) (tsr_backend_info_at(b)->name)

/* ---- copies, memset, memory query, streams and events ---- */

static int scenario_copies(tsr_backend *be) {
    enum { N = 1000 };
    const size_t bytes = N * sizeof(float);
    int ok = 1;
    float *dev = NULL, *dev2 = NULL, *plain = NULL, *pinned = NULL, *pinned2 = NULL;
    tsr_stream *s = NULL;
    tsr_event *ev = NULL, *ev2 = NULL;
    CHECK_OK(be->ops->buffer_alloc(be, bytes, (void **)&dev));
    CHECK_OK(be->ops->buffer_alloc(be, bytes, (void **)&dev2));
    CHECK_OK(be->ops->host_alloc(be, bytes, false, (void **)&plain));
    CHECK_OK(be->ops->host_alloc(be, bytes, true, (void **)&pinned));
    CHECK_OK(be->ops->host_alloc(be, bytes, true, (void **)&pinned2));

    size_t free_b = 0, total_b = 0;
    CHECK_OK(be->ops->memory(be, &free_b, &total_b));
    CHECK(total_b > 0 && free_b <= total_b);

    /* synchronous round trip: plain host -> backend -> pinned host */
    for (int i = 0; i < N; i++) plain[i] = (float)i * 0.5f - 7.0f;
    CHECK_OK(tsr_backend_upload(be, dev, plain, bytes));
    memset(plain, 0, bytes); /* the upload is complete: the source may change */
    CHECK_OK(tsr_backend_download(be, pinned, dev, bytes));
    for (int i = 0; i < N; i++) CHECK(pinned[i] == (float)i * 0.5f - 7.0f);

    /* memset and copy, queued like ops, seen by the next synchronous download */
    CHECK_OK(be->ops->memset(be, dev + 100, 0, 200 * sizeof(float)));
    CHECK_OK(tsr_backend_copy(be, dev + 500, dev, 50 * sizeof(float)));
    CHECK_OK(tsr_backend_download(be, plain, dev, bytes));
    for (int i = 0; i < N; i++) {
        float want = (float)i * 0.5f - 7.0f;
        if (i >= 100 && i < 300) want = 0.0f;
        if (i >= 500 && i < 550) want = (float)(i - 500) * 0.5f - 7.0f;
        CHECK(plain[i] == want);
    }

    /* a copy stream: its upload, then the compute stream waits for it and copies */
    CHECK_OK(be->ops->stream_create(be, &s));
    CHECK_OK(be->ops->event_create(be, &ev));
    CHECK_OK(be->ops->event_create(be, &ev2));
    for (int i = 0; i < N; i++) pinned2[i] = (float)(3 * i + 1);
    CHECK_OK(be->ops->upload(be, dev2, pinned2, bytes, s));
    CHECK_OK(be->ops->event_record(be, ev, s));
    CHECK_OK(be->ops->stream_wait(be, NULL, ev));
    CHECK_OK(tsr_backend_copy(be, dev, dev2, bytes));
    CHECK_OK(tsr_backend_download(be, plain, dev, bytes));
    for (int i = 0; i < N; i++) CHECK(plain[i] == (float)(3 * i + 1));

    /* the other way: compute-stream memset, the copy stream waits, downloads; host waits */
    CHECK_OK(be->ops->memset(be, dev, 0, bytes));
    CHECK_OK(be->ops->event_record(be, ev2, NULL));
    CHECK_OK(be->ops->stream_wait(be, s, ev2));
    for (int i = 0; i < N; i++) pinned[i] = 1.0f;
    CHECK_OK(be->ops->download(be, pinned, dev, bytes, s));
    CHECK_OK(be->ops->event_record(be, ev, s));
    CHECK_OK(be->ops->event_sync(be, ev));
    for (int i = 0; i < N; i++) CHECK(pinned[i] == 0.0f);

    /* optional calls answer when present */
    if (be->ops->device_name) CHECK(be->ops->device_name(be) != NULL);
    if (be->device >= 0) {
        CHECK(!be->host_memory);
        CHECK(be->ops->stream_handle && be->ops->stream_handle(be) != NULL);
    }
    if (be->ops->host_register) {
        /* whole pages of their own, like the host pool's buffers: no page shared with
         * another allocation that might be registered already */
        void *page = NULL;
        CHECK(posix_memalign(&page, 4096, 2 * 4096) == 0);
        tsr_status st = be->ops->host_register(be, page, 2 * 4096);
        if (st == TSR_OK) be->ops->host_unregister(be, page);
        free(page);
        CHECK_OK(st);
    }
done:
    if (ev) be->ops->event_destroy(be, ev);
    if (ev2) be->ops->event_destroy(be, ev2);
    if (s) be->ops->stream_destroy(be, s);
    if (pinned2) be->ops->host_free(be, pinned2);
    if (pinned) be->ops->host_free(be, pinned);
    if (plain) be->ops->host_free(be, plain);
    if (dev2) be->ops->buffer_free(be, dev2);
    if (dev) be->ops->buffer_free(be, dev);
    return ok;
}

TSR_TEST(test_copies_streams_events) {
    for (int b = 0; b < N_BACKENDS; b++) {
        tsr_backend *be = open_backend(BACKEND_NAME(b));
        if (!be) continue;
        if (!scenario_copies(be)) tsr_test_failed_flag = 1;
        tsr_backend_destroy(be);
    }
}

/* ---- KV rows by slot ---- */

/* A paged store of 3 blocks of 4 slots, rows of 6 floats, K rows then V rows per block;
 * `mk`/`mv` model it on the host, slot by slot. */
enum { BLK = 4, NBLK = 3, ROW = 6, SLOTS = BLK * NBLK };

static void model_put(float mk[SLOTS][ROW], float mv[SLOTS][ROW], int32_t slot, const float *k,
                      const float *v) {
    if (k) memcpy(mk[slot], k, sizeof mk[slot]);
    if (v) memcpy(mv[slot], v, sizeof mv[slot]);
}

static int scenario_kv(tsr_backend *be) {
    int ok = 1;
    float *store = NULL, *drows = NULL;
    int32_t *pslots = NULL;
    float *prows = NULL;
    tsr_stream *s = NULL;
    tsr_event *ev = NULL;
    static float mk[SLOTS][ROW], mv[SLOTS][ROW];
    float hk[SLOTS * ROW], hv[SLOTS * ROW], rows[2 * 5 * ROW];
    const size_t store_bytes = (size_t)NBLK * 2 * BLK * ROW * sizeof(float);
    CHECK_OK(be->ops->buffer_alloc(be, store_bytes, (void **)&store));
    CHECK_OK(be->ops->buffer_alloc(be, sizeof rows, (void **)&drows));
    CHECK_OK(be->ops->host_alloc(be, 8 * sizeof(int32_t), true, (void **)&pslots));
    CHECK_OK(be->ops->host_alloc(be, 2 * 2 * ROW * sizeof(float), true, (void **)&prows));
    CHECK_OK(be->ops->memset(be, store, 0, store_bytes));
    memset(mk, 0, sizeof mk);
    memset(mv, 0, sizeof mv);
    tsr_kv_layout lay = {.k = store, .v = store + BLK * ROW, .block_stride = 2 * BLK * ROW,
                         .block = BLK, .row = ROW};

    /* kv_write: 5 device rows into scattered slots; the slot list is overwritten as soon
     * as the call returns (the backend must have taken its own copy) */
    for (int i = 0; i < 5 * ROW; i++) {
        rows[i] = (float)(100 + i);
        rows[5 * ROW + i] = (float)(-100 - i);
    }
    CHECK_OK(tsr_backend_upload(be, drows, rows, sizeof rows));
    int32_t slots[5] = {7, 0, 11, 4, 5};
    CHECK_OK(be->ops->kv_write(be, &lay, slots, 5, drows, drows + 5 * ROW));
    for (int i = 0; i < 5; i++) model_put(mk, mv, slots[i], rows + i * ROW, rows + (5 + i) * ROW);
    for (int i = 0; i < 5; i++) slots[i] = -1;

    /* kv_copy, a chain that only the list order resolves: 1 <- 7, 7 <- 11, 2 <- 1 (the new
     * 1, i.e. the old 7), plus a no-op pair; pinned lists, overwritten at once */
    const int32_t dst[4] = {1, 7, 3, 2}, src[4] = {7, 11, 3, 1};
    memcpy(pslots, dst, sizeof dst);
    memcpy(pslots + 4, src, sizeof src);
    CHECK_OK(be->ops->kv_copy(be, &lay, pslots, pslots + 4, 4));
    for (int i = 0; i < 8; i++) pslots[i] = -1;
    for (int i = 0; i < 4; i++) {
        memcpy(mk[dst[i]], mk[src[i]], sizeof mk[0]);
        memcpy(mv[dst[i]], mv[src[i]], sizeof mv[0]);
    }

    /* kv_scatter on a copy stream from pinned rows (K and V of slots 9 and 6) */
    for (int i = 0; i < 2 * ROW; i++) {
        prows[i] = (float)(1000 + i);
        prows[2 * ROW + i] = (float)(2000 + i);
    }
    const int32_t sc[2] = {9, 6};
    CHECK_OK(be->ops->stream_create(be, &s));
    CHECK_OK(be->ops->event_create(be, &ev));
    /* the scatter's stream must come after the kv_write/kv_copy queued on the compute
     * stream, which touch other slots but the same store */
    CHECK_OK(be->ops->event_record(be, ev, NULL));
    CHECK_OK(be->ops->stream_wait(be, s, ev));
    CHECK_OK(be->ops->kv_scatter(be, &lay, sc, 2, prows, prows + 2 * ROW, s));
    CHECK_OK(be->ops->event_record(be, ev, s));
    CHECK_OK(be->ops->event_sync(be, ev));
    for (int i = 0; i < 2; i++)
        model_put(mk, mv, sc[i], prows + i * ROW, prows + (2 + i) * ROW);

    /* kv_gather on the copy stream, K only, back into the pinned rows */
    const int32_t gs[2] = {2, 9};
    CHECK_OK(be->ops->kv_gather(be, &lay, gs, 2, prows, NULL, s));
    CHECK_OK(be->ops->event_record(be, ev, s));
    CHECK_OK(be->ops->event_sync(be, ev));
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < ROW; c++) CHECK(prows[i * ROW + c] == mk[gs[i]][c]);

    /* the whole store, synchronously, against the model */
    int32_t all[SLOTS];
    for (int i = 0; i < SLOTS; i++) all[i] = SLOTS - 1 - i; /* any order */
    CHECK_OK(be->ops->kv_gather(be, &lay, all, SLOTS, hk, hv, NULL));
    for (int i = 0; i < SLOTS; i++)
        for (int c = 0; c < ROW; c++) {
            CHECK(hk[i * ROW + c] == mk[all[i]][c]);
            CHECK(hv[i * ROW + c] == mv[all[i]][c]);
        }
done:
    if (ev) be->ops->event_destroy(be, ev);
    if (s) be->ops->stream_destroy(be, s);
    if (prows) be->ops->host_free(be, prows);
    if (pslots) be->ops->host_free(be, pslots);
    if (drows) be->ops->buffer_free(be, drows);
    if (store) be->ops->buffer_free(be, store);
    return ok;
}

TSR_TEST(test_kv_rows_by_slot) {
    for (int b = 0; b < N_BACKENDS; b++) {
        tsr_backend *be = open_backend(BACKEND_NAME(b));
        if (!be) continue;
        if (!scenario_kv(be)) tsr_test_failed_flag = 1;
        tsr_backend_destroy(be);
    }
}

/* ---- attention with host positions ---- */

enum { NQ = 3, NH = 4, NKV = 2, HD = 8, NK0 = 5, NK1 = 4, NKEYS = NK0 + NK1 };

/* Attention of fixed inputs on `be`: span 0 has scattered host positions, span 1 is
 * contiguous; q_pos and the span positions are host arrays, overwritten as soon as the
 * call returns. Writes the output and the key scores (host copies). */
static int attention_on(tsr_backend *be, float *out, float *scores) {
    int ok = 1;
    float *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dks = NULL;
    float q[NQ * NH * HD], k[NKEYS * NKV * HD], v[NKEYS * NKV * HD];
    for (int i = 0; i < NQ * NH * HD; i++) q[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < NKEYS * NKV * HD; i++) {
        k[i] = (float)((i * 53) % 23) / 23.0f - 0.5f;
        v[i] = (float)((i * 29) % 19) / 19.0f - 0.5f;
    }
    CHECK_OK(be->ops->buffer_alloc(be, sizeof q, (void **)&dq));
    CHECK_OK(be->ops->buffer_alloc(be, sizeof k, (void **)&dk));
    CHECK_OK(be->ops->buffer_alloc(be, sizeof v, (void **)&dv));
    CHECK_OK(be->ops->buffer_alloc(be, sizeof q, (void **)&dout));
    CHECK_OK(be->ops->buffer_alloc(be, NH * NKEYS * sizeof(float), (void **)&dks));
    CHECK_OK(tsr_backend_upload(be, dq, q, sizeof q));
    CHECK_OK(tsr_backend_upload(be, dk, k, sizeof k));
    CHECK_OK(tsr_backend_upload(be, dv, v, sizeof v));
    CHECK_OK(be->ops->memset(be, dks, 0, NH * NKEYS * sizeof(float)));
    int32_t kpos[NK0] = {0, 2, 4, 6, 8};
    int32_t qpos[NQ] = {3, 8, 12};
    const int64_t stride = NKV * HD;
    tsr_kv_span spans[2] = {
        {.k = dk, .v = dv, .pos = kpos, .pos0 = 0, .n = NK0, .stride = stride},
        {.k = dk + NK0 * stride, .v = dv + NK0 * stride, .pos = NULL, .pos0 = 9, .n = NK1,
         .stride = stride},
    };
    tsr_attn_args a = {.q = dq, .q_pos = qpos, .n_q = NQ, .spans = spans, .n_spans = 2,
                       .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .out = dout,
                       .key_scores = dks};
    CHECK_OK(be->ops->attention(be, &a));
    for (int i = 0; i < NK0; i++) kpos[i] = 1 << 30; /* would hide every key */
    for (int i = 0; i < NQ; i++) qpos[i] = -1;
    CHECK_OK(tsr_backend_download(be, out, dout, sizeof q));
    CHECK_OK(tsr_backend_download(be, scores, dks, NH * NKEYS * sizeof(float)));
done:
    if (dks) be->ops->buffer_free(be, dks);
    if (dout) be->ops->buffer_free(be, dout);
    if (dv) be->ops->buffer_free(be, dv);
    if (dk) be->ops->buffer_free(be, dk);
    if (dq) be->ops->buffer_free(be, dq);
    return ok;
}

TSR_TEST(test_attention_host_positions) {
    float ref_out[NQ * NH * HD], ref_ks[NH * NKEYS], out[NQ * NH * HD], ks[NH * NKEYS];
    tsr_backend *ref = NULL;
    ASSERT_OK(tsr_backend_cpu_create(1, &ref));
    int ref_ok = attention_on(ref, ref_out, ref_ks);
    tsr_backend_destroy(ref);
    ASSERT_TRUE(ref_ok);
    /* the reference itself: every key score row sums to the queries' visible mass (each
     * query that sees a key adds a distribution summing to 1) */
    for (int h = 0; h < NH; h++) {
        double sum = 0;
        for (int j = 0; j < NKEYS; j++) sum += ref_ks[h * NKEYS + j];
        ASSERT_NEAR(sum, (double)NQ, 1e-4);
    }
    for (int b = 0; b < N_BACKENDS; b++) {
        tsr_backend *be = open_backend(BACKEND_NAME(b));
        if (!be) continue;
        int ok = attention_on(be, out, ks);
        double worst = 0;
        for (int i = 0; ok && i < NQ * NH * HD; i++)
            worst = fmax(worst, fabs((double)out[i] - (double)ref_out[i]));
        for (int i = 0; ok && i < NH * NKEYS; i++)
            worst = fmax(worst, fabs((double)ks[i] - (double)ref_ks[i]));
        printf("  %s: attention with host positions, worst error %.3g\n", BACKEND_NAME(b), worst);
        tsr_backend_destroy(be);
        ASSERT_TRUE(ok);
        ASSERT_TRUE(worst <= 1e-5);
    }
}

TSR_TEST_MAIN(test_copies_streams_events, test_kv_rows_by_slot, test_attention_host_positions)
