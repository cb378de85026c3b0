/* The MPI backend: bootstrap, group communicators and host-memory collectives. Every
 * communicator has MPI_ERRORS_RETURN, and failures become TSR_ERR_MPI lines carrying
 * MPI_Error_string's text. Compiled only with TESSERA_MPI=ON. */
#include "comm/comm_impl.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"

/* What a tsr_comm_request holds on MPI: the request and, for the watchdog's line, what it
 * waits for. */
typedef struct tsr__mpi_req {
    MPI_Request r;
    int which; /* tsr_comm_group */
    int peer;  /* group rank */
    int is_send;
} tsr__mpi_req;
_Static_assert(sizeof(tsr__mpi_req) <= sizeof(((tsr_comm_request *)0)->impl),
               "tsr_comm_request too small for an MPI request");

static tsr_status tsr__mpi_err(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return tsr_error_set(TSR_ERR_MPI, "%s: %s", what, s);
}

#define TSR__MPI_TRY(call, what)                                                         \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != MPI_SUCCESS) return tsr__mpi_err(rc_, what);                          \
    } while (0)

static double tsr__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls before the first clock read and the first pause: most waits of a running job end
 * within microseconds (the peer is already there), and those must cost what MPI_Wait did. */
enum { TSR__FAST_POLLS = 64 };
#define TSR__SPIN_S 50e-6         /* then tests without pause for this long */
#define TSR__MAX_PAUSE_NS 1000000 /* pauses grow from 1 us up to 1 ms ... */
#define TSR__PAUSE_SHARE 16       /* ... and at most 1/16 of the wait so far */
#define TSR__CHECK_S 0.1          /* the peers' liveness, this often */
#define TSR__GAP_S 1.0            /* a longer gap between two tests: we were not running */

/* Completes *r (the watchdog, see tsr_comm_set_timeout): MPI_Test in a loop with a pause
 * that backs off, the node's peers checked every TSR__CHECK_S, and the job ended when the
 * wait outlasts the timeout. `what` names the MPI call in error lines, `op` and `peer`
 * (group rank, -1 for a collective) the operation in the watchdog's. */
static tsr_status tsr__wait(tsr__comm_grp *g, MPI_Request *r, MPI_Status *s, const char *what,
                            const char *op, int peer) {
    tsr_comm *c = g->owner;
    if (!c || c->timeout_s <= 0) {
        TSR__MPI_TRY(MPI_Wait(r, s), what);
        return TSR_OK;
    }
    int done = 0;
    for (int i = 0; i < TSR__FAST_POLLS; i++) {
        TSR__MPI_TRY(MPI_Test(r, &done, s), what);
        if (done) return TSR_OK;
    }
    double t0 = tsr__now(), checked = t0, prev = t0;
    long pause = 0;
    for (;;) {
        TSR__MPI_TRY(MPI_Test(r, &done, s), what);
        if (done) return TSR_OK;
        double t = tsr__now();
        /* A gap far longer than any pause: this rank itself did not run (stopped, a
         * suspended job, e.g. scontrol suspend stops every rank). That time is nobody's lack
         * of progress; without this, a resumed job would abort at once. */
        if (t - prev > TSR__GAP_S) t0 += t - prev;
        prev = t;
        double waited = t - t0;
        if (waited < TSR__SPIN_S) continue;
        if (t - checked >= TSR__CHECK_S) {
            checked = t;
            tsr__comm_check_peers(g, op, peer); /* returns only while they all live */
        }
        if (waited >= c->timeout_s) tsr__comm_stuck(g, op, peer, waited);
        pause = pause ? 2 * pause : 1000;
        double cap = waited * 1e9 / TSR__PAUSE_SHARE;
        if (cap > TSR__MAX_PAUSE_NS) cap = TSR__MAX_PAUSE_NS;
        if ((double)pause > cap) pause = (long)cap;
        struct timespec ts = {0, pause};
        nanosleep(&ts, NULL);
    }
}

static tsr_status tsr__count(size_t bytes, const char *what, int *out) {
    if (bytes > (size_t)INT_MAX)
        return tsr_error_set(TSR_ERR_INVALID, "%s: %zu bytes exceed MPI's int count", what,
                             bytes);
    *out = (int)bytes;
    return TSR_OK;
}

/* Takes ownership of `comm` into a heap handle with MPI_ERRORS_RETURN. */
static tsr_status tsr__wrap(MPI_Comm comm, const char *what, void **out) {
    TSR__MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), what);
    MPI_Comm *h = tsr_malloc(sizeof *h);
    if (!h) {
        MPI_Comm_free(&comm);
        return TSR_ERR_NOMEM;
    }
    *h = comm;
    *out = h;
    return TSR_OK;
}

static MPI_Comm tsr__mc(const tsr__comm_grp *g) { return *(MPI_Comm *)g->mpi; }

/* The group's internal twin communicator (see tsr__comm_grp.mpi_internal). */
static tsr_status tsr__dup_internal(tsr__comm_grp *g, const char *what) {
    MPI_Comm d;
    TSR__MPI_TRY(MPI_Comm_dup(tsr__mc(g), &d), what);
    return tsr__wrap(d, what, &g->mpi_internal);
}

tsr_status tsr__comm_mpi_init(tsr_comm *c, const tsr_comm_options *o) {
    c->backend = TSR_COMM_MPI;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return tsr_error_set(TSR_ERR_MPI, "MPI was already finalized");
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(o->argc, o->argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return tsr__mpi_err(rc, "MPI_Init_thread");
        c->owns_mpi = true;
        if (provided < MPI_THREAD_FUNNELED)
            return tsr_error_set(TSR_ERR_MPI, "MPI_Init_thread: MPI_THREAD_FUNNELED not "
                                 "provided (got level %d)", provided);
    }
    TSR__MPI_TRY(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                 "MPI_Comm_set_errhandler(world)");
    /* Our own duplicate, so that tessera's messages never match another library's. */
    MPI_Comm world;
    TSR__MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup(world)");
    TSR_TRY(tsr__wrap(world, "world communicator", &c->grp[TSR_COMM_WORLD].mpi));
    TSR_TRY(tsr__dup_internal(&c->grp[TSR_COMM_WORLD], "world communicator"));
    TSR__MPI_TRY(MPI_Comm_rank(world, &c->world_rank), "MPI_Comm_rank");
    TSR__MPI_TRY(MPI_Comm_size(world, &c->world_size), "MPI_Comm_size");
    c->grp[TSR_COMM_WORLD].rank = c->world_rank;
    c->grp[TSR_COMM_WORLD].size = c->world_size;
    c->grp[TSR_COMM_WORLD].owner = c;
    c->grp[TSR_COMM_WORLD].which = TSR_COMM_WORLD;

    MPI_Comm node;
    TSR__MPI_TRY(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, c->world_rank, MPI_INFO_NULL,
                                     &node),
                 "MPI_Comm_split_type(SHARED)");
    TSR_TRY(tsr__wrap(node, "node communicator", &c->mpi_node));
    TSR__MPI_TRY(MPI_Comm_rank(node, &c->local_rank), "MPI_Comm_rank(node)");
    TSR__MPI_TRY(MPI_Comm_size(node, &c->local_size), "MPI_Comm_size(node)");

    /* The node's ranks and their pids: the watchdog tells a dead or stopped peer from a
     * slow one by looking at the process. */
    int mine[2] = {c->world_rank, (int)getpid()};
    int *all = tsr_malloc(2 * (size_t)c->local_size * sizeof *all);
    if (!all) return TSR_ERR_NOMEM;
    int rc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, node);
    if (rc != MPI_SUCCESS) {
        tsr_free(all);
        return tsr__mpi_err(rc, "MPI_Allgather(node pids)");
    }
    if (c->local_size > 1) {
        c->peers = tsr_calloc((size_t)c->local_size - 1, sizeof *c->peers);
        if (!c->peers) {
            tsr_free(all);
            return TSR_ERR_NOMEM;
        }
    }
    for (int i = 0; i < c->local_size; i++)
        if (all[2 * i] != c->world_rank)
            c->peers[c->n_peers++] = (tsr__comm_peer){all[2 * i], all[2 * i + 1]};
    tsr_free(all);
    return TSR_OK;
}

static void tsr__free_handle(void **h) {
    if (!*h) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free((MPI_Comm *)*h);
    tsr_free(*h);
    *h = NULL;
}

void tsr__comm_mpi_grp_free(tsr__comm_grp *g) {
    tsr__free_handle(&g->mpi_internal);
    tsr__free_handle(&g->mpi);
}

void tsr__comm_mpi_finalize(tsr_comm *c) {
    tsr__comm_grp node = {.mpi = c->mpi_node};
    tsr__comm_mpi_grp_free(&node);
    c->mpi_node = NULL;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->owns_mpi && !finalized) MPI_Finalize();
    c->owns_mpi = false;
}

tsr_status tsr__comm_mpi_split(tsr_comm *c, int color, int key, tsr__comm_grp *out,
                               const char *what) {
    MPI_Comm sub;
    TSR__MPI_TRY(MPI_Comm_split(tsr__mc(&c->grp[TSR_COMM_WORLD]), color, key, &sub), what);
    TSR_TRY(tsr__wrap(sub, what, &out->mpi));
    TSR__MPI_TRY(MPI_Comm_rank(sub, &out->rank), what);
    TSR__MPI_TRY(MPI_Comm_size(sub, &out->size), what);
    out->owner = c;
    out->which = (int)(out - c->grp);
    return tsr__dup_internal(out, what);
}

/* Rank r's part of the running sum, chunk by chunk: receive ((...) + last part of rank
 * r - 1) from r - 1, add my parts in order, pass it to r + 1. Per element this is exactly
 * the left-to-right sum over the global list; chunking only pipelines the hops (rank r
 * adds chunk k while r - 1 works on chunk k + 1). The last rank then broadcasts. */
tsr_status tsr__comm_mpi_chain_sum_f32(tsr__comm_grp *g, const float *parts, int n_local,
                                       size_t n, float *out, float *scratch, size_t chunk,
                                       tsr_comm_stats *st) {
    MPI_Comm ic = *(MPI_Comm *)g->mpi_internal;
    int r = g->rank, last = g->size - 1;
    for (size_t lo = 0; lo < n; lo += chunk) {
        size_t m = n - lo < chunk ? n - lo : chunk;
        int cnt = (int)m; /* chunk <= INT_MAX floats: the caller's constant */
        float *o = out + lo;
        const float *p0 = parts + lo;
        if (r == 0) {
            if (o != p0) memcpy(o, p0, m * sizeof(float));
        } else {
            MPI_Request q;
            TSR__MPI_TRY(MPI_Irecv(scratch, cnt, MPI_FLOAT, r - 1, 0, ic, &q), "chain sum recv");
            TSR_TRY(tsr__wait(g, &q, MPI_STATUS_IGNORE, "chain sum recv", "allreduce", r - 1));
            for (size_t i = 0; i < m; i++) o[i] = scratch[i] + p0[i];
            st->bytes_recv += (int64_t)(m * sizeof(float));
            st->messages++;
        }
        for (int p = 1; p < n_local; p++) {
            const float *src = parts + (size_t)p * n + lo;
            for (size_t i = 0; i < m; i++) o[i] += src[i];
        }
        if (r < last) {
            MPI_Request q;
            TSR__MPI_TRY(MPI_Isend(o, cnt, MPI_FLOAT, r + 1, 0, ic, &q), "chain sum send");
            TSR_TRY(tsr__wait(g, &q, MPI_STATUS_IGNORE, "chain sum send", "allreduce", r + 1));
            st->bytes_sent += (int64_t)(m * sizeof(float));
            st->messages++;
        }
    }
    size_t bytes = n * sizeof(float);
    int nb = 0;
    TSR_TRY(tsr__count(bytes, "chain sum MPI_Bcast", &nb));
    MPI_Request q;
    TSR__MPI_TRY(MPI_Ibcast(out, nb, MPI_BYTE, last, ic, &q), "chain sum MPI_Ibcast");
    TSR_TRY(tsr__wait(g, &q, MPI_STATUS_IGNORE, "chain sum MPI_Ibcast", "allreduce", -1));
    tsr__comm_tally_bcast(st, r, g->size, last, bytes);
    return TSR_OK;
}

tsr_status tsr__comm_mpi_allgather(tsr__comm_grp *g, const void *send, size_t bytes,
                                   void *recv) {
    int n = 0;
    TSR_TRY(tsr__count(bytes, "MPI_Allgather", &n));
    MPI_Request q;
    TSR__MPI_TRY(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, tsr__mc(g), &q),
                 "MPI_Iallgather");
    return tsr__wait(g, &q, MPI_STATUS_IGNORE, "MPI_Iallgather", "allgather", -1);
}

tsr_status tsr__comm_mpi_alltoallv(tsr__comm_grp *g, const void *send, const size_t *send_bytes,
                                   const size_t *send_off, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_off) {
    int n = g->size;
    int *v = tsr_malloc((size_t)4 * (size_t)n * sizeof(int));
    if (!v) return TSR_ERR_NOMEM;
    int *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    tsr_status st = TSR_OK;
    for (int r = 0; r < n && st == TSR_OK; r++) {
        st = tsr__count(send_bytes[r], "MPI_Alltoallv", &sc[r]);
        if (st == TSR_OK) st = tsr__count(send_off[r], "MPI_Alltoallv", &sd[r]);
        if (st == TSR_OK) st = tsr__count(recv_bytes[r], "MPI_Alltoallv", &rc[r]);
        if (st == TSR_OK) st = tsr__count(recv_off[r], "MPI_Alltoallv", &rd[r]);
    }
    MPI_Request q;
    int rc_mpi = MPI_SUCCESS;
    if (st == TSR_OK) {
        rc_mpi = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, tsr__mc(g), &q);
        if (rc_mpi != MPI_SUCCESS) st = tsr__mpi_err(rc_mpi, "MPI_Ialltoallv");
    }
    if (st == TSR_OK)
        st = tsr__wait(g, &q, MPI_STATUS_IGNORE, "MPI_Ialltoallv", "alltoallv", -1);
    tsr_free(v);
    return st;
}

tsr_status tsr__comm_mpi_bcast(tsr__comm_grp *g, void *buf, size_t bytes, int root) {
    int n = 0;
    TSR_TRY(tsr__count(bytes, "MPI_Bcast", &n));
    MPI_Request q;
    TSR__MPI_TRY(MPI_Ibcast(buf, n, MPI_BYTE, root, tsr__mc(g), &q), "MPI_Ibcast");
    return tsr__wait(g, &q, MPI_STATUS_IGNORE, "MPI_Ibcast", "bcast", -1);
}

tsr_status tsr__comm_mpi_allreduce_i64(tsr__comm_grp *g, int64_t *buf, size_t n,
                                       tsr_comm_op op) {
    int cnt = 0;
    TSR_TRY(tsr__count(n, "MPI_Allreduce", &cnt));
    MPI_Op mop = op == TSR_COMM_MIN ? MPI_MIN : op == TSR_COMM_MAX ? MPI_MAX : MPI_SUM;
    MPI_Request q;
    TSR__MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, buf, cnt, MPI_INT64_T, mop, tsr__mc(g), &q),
                 "MPI_Iallreduce");
    return tsr__wait(g, &q, MPI_STATUS_IGNORE, "MPI_Iallreduce", "control allreduce", -1);
}

tsr_status tsr__comm_mpi_barrier(tsr__comm_grp *g) {
    MPI_Request q;
    TSR__MPI_TRY(MPI_Ibarrier(tsr__mc(g), &q), "MPI_Ibarrier");
    return tsr__wait(g, &q, MPI_STATUS_IGNORE, "MPI_Ibarrier", "barrier", -1);
}

tsr_status tsr__comm_mpi_send(tsr__comm_grp *g, const void *buf, size_t bytes, int peer,
                              int tag) {
    int n = 0;
    TSR_TRY(tsr__count(bytes, "MPI_Send", &n));
    MPI_Request q;
    TSR__MPI_TRY(MPI_Isend(buf, n, MPI_BYTE, peer, tag, tsr__mc(g), &q), "MPI_Send");
    return tsr__wait(g, &q, MPI_STATUS_IGNORE, "MPI_Send", "send", peer);
}

tsr_status tsr__comm_mpi_recv(tsr__comm_grp *g, void *buf, size_t bytes, int peer, int tag) {
    int n = 0, got = 0;
    MPI_Status s;
    TSR_TRY(tsr__count(bytes, "MPI_Recv", &n));
    MPI_Request q;
    TSR__MPI_TRY(MPI_Irecv(buf, n, MPI_BYTE, peer, tag, tsr__mc(g), &q), "MPI_Recv");
    TSR_TRY(tsr__wait(g, &q, &s, "MPI_Recv", "recv", peer));
    MPI_Get_count(&s, MPI_BYTE, &got);
    if (got != n)
        return tsr_error_set(TSR_ERR_MPI, "MPI_Recv from rank %d (tag %d): %d bytes, expected %d",
                             peer, tag, got, n);
    return TSR_OK;
}

tsr_status tsr__comm_mpi_isend(tsr__comm_grp *g, const void *buf, size_t bytes, int peer,
                               int tag, tsr_comm_request *req) {
    int n = 0;
    tsr__mpi_req r = {.which = g->which, .peer = peer, .is_send = 1};
    TSR_TRY(tsr__count(bytes, "MPI_Isend", &n));
    TSR__MPI_TRY(MPI_Isend(buf, n, MPI_BYTE, peer, tag, tsr__mc(g), &r.r), "MPI_Isend");
    memcpy(req->impl.bytes, &r, sizeof r);
    req->kind = TSR__REQ_MPI;
    return TSR_OK;
}

tsr_status tsr__comm_mpi_irecv(tsr__comm_grp *g, void *buf, size_t bytes, int peer, int tag,
                               tsr_comm_request *req) {
    int n = 0;
    tsr__mpi_req r = {.which = g->which, .peer = peer, .is_send = 0};
    TSR_TRY(tsr__count(bytes, "MPI_Irecv", &n));
    TSR__MPI_TRY(MPI_Irecv(buf, n, MPI_BYTE, peer, tag, tsr__mc(g), &r.r), "MPI_Irecv");
    memcpy(req->impl.bytes, &r, sizeof r);
    req->kind = TSR__REQ_MPI;
    return TSR_OK;
}

tsr_status tsr__comm_mpi_wait(tsr_comm *c, tsr_comm_request *req) {
    tsr__mpi_req r;
    memcpy(&r, req->impl.bytes, sizeof r);
    req->kind = TSR__REQ_NONE;
    if (r.which < 0 || r.which >= TSR_COMM_GROUP_COUNT)
        return tsr_error_set(TSR_ERR_INVALID, "wait: a request of unknown group %d", r.which);
    return tsr__wait(&c->grp[r.which], &r.r, MPI_STATUS_IGNORE, "MPI_Wait",
                     r.is_send ? "isend" : "irecv", r.peer);
}

_Noreturn void tsr__comm_mpi_abort(int code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

bool tsr_comm_mpi_library(char *buf, size_t cap) {
    if (!cap) return true;
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS || len <= 0) {
        snprintf(buf, cap, "MPI (library version unknown)");
        return true;
    }
    v[len < MPI_MAX_LIBRARY_VERSION_STRING ? len : MPI_MAX_LIBRARY_VERSION_STRING - 1] = '\0';
    v[strcspn(v, ",\n")] = '\0'; /* Open MPI: "Open MPI v4.1.4, package: ..., ident: ..." */
    snprintf(buf, cap, "%s", v);
    return true;
}
