/* tsr_comm: backend choice, the tp x pp layout and dispatch of every operation to the
 * local path (one-rank groups), NCCL (data plane when on) or MPI. */
#include "comm/comm.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "comm/comm_impl.h"
#include "base/alloc.h"
#include "base/log.h"

static const char *const tsr__group_names[TSR_COMM_GROUP_COUNT] = {"world", "tp", "pp"};

static int tsr__env_int(const char *name, bool *found) {
    const char *v = getenv(name);
    *found = v && *v;
    return *found ? atoi(v) : 0;
}

/* The NCCL data plane once the CUDA module has provided it; NULL before (and always in a
 * build without MPI). */
static const struct tsr_comm_nccl_ops *tsr__nccl;

static tsr_status tsr__no_nccl(void) {
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "NCCL requested, but %s",
#ifdef TSR_HAVE_MPI
                         "no NCCL is loaded: it comes with the CUDA module (a CUDA backend "
                         "loads it), built with -DTESSERA_CUDA=ON -DTESSERA_NCCL=ON"
#else
                         "this tessera was built without MPI, which NCCL needs "
                         "(configure with -DTESSERA_MPI=ON)"
#endif
    );
}

bool tsr_comm_nccl_built(void) { return tsr__nccl != NULL; }

tsr_status tsr_comm_provide_nccl(const struct tsr_comm_nccl_ops *ops) {
#ifdef TSR__COMM_NCCL
    if (!ops || ops->comm_size != sizeof(struct tsr_comm))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "its NCCL data plane is from another tessera "
                             "build (comm struct of %u bytes, this binary's %zu)",
                             ops ? ops->comm_size : 0u, sizeof(struct tsr_comm));
    tsr__nccl = ops;
    return TSR_OK;
#else
    (void)ops;
    return tsr__no_nccl();
#endif
}

bool tsr_comm_launched_by_mpi(int *n_ranks) {
    /* Size variables first (they give the world size), then rank-only markers. */
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                        "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS",
                                        "PMIX_SIZE"};
    bool found = false;
    if (n_ranks) *n_ranks = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int n = tsr__env_int(sizes[i], &found);
        /* SLURM_STEP_NUM_TASKS is only meaningful inside an srun step (SLURM_PROCID set);
         * a batch script's own shell has neither and runs single-process. */
        if (found && strcmp(sizes[i], "SLURM_STEP_NUM_TASKS") == 0 && !getenv("SLURM_PROCID"))
            found = false;
        if (found) {
            if (n_ranks) *n_ranks = n;
            return true;
        }
    }
    if (getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("OMPI_COMM_WORLD_RANK")) return true;
    return false;
}

tsr_status tsr_comm_init(const tsr_comm_options *opt, tsr_comm **out) {
    tsr_comm_options o = {0};
    if (opt) o = *opt;
    if (!o.set_device) o.device = -1;
    *out = NULL;

    const char *env = getenv("TSR_COMM");
    if (o.backend == TSR_COMM_AUTO && env && *env) {
        if (strcmp(env, "self") == 0) o.backend = TSR_COMM_SELF;
        else if (strcmp(env, "mpi") == 0) o.backend = TSR_COMM_MPI;
        else if (strcmp(env, "auto") != 0)
            return tsr_error_set(TSR_ERR_INVALID, "TSR_COMM=%s: expected self, mpi or auto", env);
    }
    int launched_n = 0;
    bool launched = tsr_comm_launched_by_mpi(&launched_n);
    if (o.backend == TSR_COMM_AUTO) o.backend = launched ? TSR_COMM_MPI : TSR_COMM_SELF;
#ifndef TSR_HAVE_MPI
    if (o.backend == TSR_COMM_MPI) {
        if (launched && launched_n <= 1) {
            o.backend = TSR_COMM_SELF; /* mpirun -np 1 of an MPI-less build: fine */
        } else if (launched) {
            return tsr_error_set(TSR_ERR_UNSUPPORTED,
                                 "launched as %d ranks, but this tessera was built with "
                                 "TESSERA_MPI=OFF (rebuild with MPI)", launched_n);
        } else {
            return tsr_error_set(TSR_ERR_UNSUPPORTED,
                                 "MPI requested, but this tessera was built with TESSERA_MPI=OFF");
        }
    }
#endif
    if (o.backend == TSR_COMM_SELF && launched && launched_n > 1)
        return tsr_error_set(TSR_ERR_INVALID, "launched as %d ranks, but TSR_COMM=self asks for "
                             "a single process", launched_n);
    if (o.nccl && !tsr__nccl) return tsr__no_nccl();

    tsr_comm *c = tsr_calloc(1, sizeof *c);
    if (!c) return TSR_ERR_NOMEM;
    c->device = o.device;
    c->stream = o.cuda_stream;
    c->timeout_s = TSR_COMM_DEFAULT_TIMEOUT;
    c->nccl = o.nccl;
    tsr_status st = TSR_OK;
    if (o.backend == TSR_COMM_SELF) {
        /* One process has nobody to talk to over NCCL: the data plane stays local. */
        c->nccl = false;
        tsr__comm_self_init(c);
    } else {
#ifdef TSR_HAVE_MPI
        st = tsr__comm_mpi_init(c, &o);
#endif
    }
#ifdef TSR__COMM_NCCL
    /* Collective (it compares the node's GPUs): agreed, so that no rank goes on alone. */
    if (st == TSR_OK && c->nccl && c->backend == TSR_COMM_MPI)
        st = tsr_comm_agree(c, tsr__nccl->setup(c));
#endif
    if (st != TSR_OK) {
        tsr_comm_destroy(c);
        return st;
    }
    if (c->world_size > 1) tsr_log_set_rank(c->world_rank);
    *out = c;
    return TSR_OK;
}

static void tsr__grp_free(tsr_comm *c, tsr__comm_grp *g) {
#ifdef TSR__COMM_NCCL
    if (g->nccl) tsr__nccl->grp_free(c, g);
#endif
#ifdef TSR_HAVE_MPI
    if (g->mpi) tsr__comm_mpi_grp_free(g);
#endif
    (void)c;
    memset(g, 0, sizeof *g);
}

#ifdef TSR__COMM_NCCL
/* NCCL communicators for the groups of more than one rank that have none yet, in the same
 * order on every rank (world, tp, pp), since each one is collective over its group and
 * agreed over the world. */
static tsr_status tsr__nccl_connect(tsr_comm *c) {
    for (int g = 0; g < TSR_COMM_GROUP_COUNT; g++)
        if (c->grp[g].size > 1 && !c->grp[g].nccl)
            TSR_TRY(tsr__nccl->grp_init(c, &c->grp[g], tsr__group_names[g]));
    return TSR_OK;
}
#endif

tsr_status tsr_comm_enable_nccl(tsr_comm *c, int device, void *cuda_stream) {
#ifndef TSR__COMM_NCCL
    (void)c, (void)device, (void)cuda_stream;
    return tsr__no_nccl();
#else
    if (!tsr__nccl) return tsr__no_nccl();
    /* One process has nobody to talk to: device buffers stay local (see options.nccl). */
    if (c->backend != TSR_COMM_MPI) return TSR_OK;
    if (c->nccl) {
        if (c->stream == cuda_stream && (device < 0 || device == c->device)) return TSR_OK;
        return tsr_error_set(TSR_ERR_INVALID, "NCCL is already on GPU %d with another stream",
                             c->device);
    }
    c->device = device < 0 ? -1 : device;
    c->stream = cuda_stream;
    tsr_status st = tsr_comm_agree(c, tsr__nccl->setup(c));
    if (st == TSR_OK) {
        c->nccl = true;
        st = tsr__nccl_connect(c);
    }
    if (st != TSR_OK) { /* back to MPI entirely: no group keeps a half-made NCCL side */
        for (int g = 0; g < TSR_COMM_GROUP_COUNT; g++)
            if (c->grp[g].nccl) tsr__nccl->grp_free(c, &c->grp[g]);
        c->nccl = false;
        c->stream = NULL;
    }
    return st;
#endif
}

tsr_status tsr_comm_set_layout(tsr_comm *c, int tp, int pp) {
    if (tp < 1 || pp < 1)
        return tsr_error_set(TSR_ERR_INVALID, "layout --tp %d x --pp %d: both must be >= 1", tp,
                             pp);
    if ((long long)tp * pp != c->world_size)
        return tsr_error_set(TSR_ERR_INVALID,
                             "layout --tp %d x --pp %d needs %lld ranks, but the job has %d "
                             "(world size must equal tp x pp)",
                             tp, pp, (long long)tp * pp, c->world_size);
    tsr__grp_free(c, &c->grp[TSR_COMM_TP]);
    tsr__grp_free(c, &c->grp[TSR_COMM_PP]);
    c->tp = c->pp = c->tp_rank = c->pp_rank = 0;

    int tp_rank = c->world_rank % tp, pp_rank = c->world_rank / tp;
    tsr_status st = TSR_OK;
    if (c->backend == TSR_COMM_SELF) {
        c->grp[TSR_COMM_TP] = (tsr__comm_grp){.rank = 0, .size = 1};
        c->grp[TSR_COMM_PP] = (tsr__comm_grp){.rank = 0, .size = 1};
    } else {
#ifdef TSR_HAVE_MPI
        st = tsr__comm_mpi_split(c, pp_rank, tp_rank, &c->grp[TSR_COMM_TP], "tp group");
        if (st == TSR_OK)
            st = tsr__comm_mpi_split(c, tp_rank, pp_rank, &c->grp[TSR_COMM_PP], "pp group");
#endif
    }
#ifdef TSR__COMM_NCCL
    if (st == TSR_OK && c->nccl && c->backend == TSR_COMM_MPI) st = tsr__nccl_connect(c);
#endif
    if (st != TSR_OK) {
        tsr__grp_free(c, &c->grp[TSR_COMM_TP]);
        tsr__grp_free(c, &c->grp[TSR_COMM_PP]);
        return st;
    }
    c->tp = tp;
    c->pp = pp;
    c->tp_rank = tp_rank;
    c->pp_rank = pp_rank;
    return TSR_OK;
}

void tsr_comm_destroy(tsr_comm *c) {
    if (!c) return;
    /* NCCL communicators first (finalize completes their operations), all before MPI
     * goes away; the stream may belong to a backend destroyed already, so it is left be. */
    for (int g = TSR_COMM_GROUP_COUNT - 1; g >= 0; g--) tsr__grp_free(c, &c->grp[g]);
#ifdef TSR_HAVE_MPI
    if (c->backend == TSR_COMM_MPI) tsr__comm_mpi_finalize(c);
#endif
    tsr_free(c->scratch);
    tsr_free(c->peers);
    tsr_free(c);
}

void tsr_comm_set_timeout(tsr_comm *c, double seconds) { c->timeout_s = seconds > 0 ? seconds : 0; }
double tsr_comm_timeout(const tsr_comm *c) { return c->timeout_s; }

/* ---- the watchdog ---------------------------------------------------------------------- */

/* The state of a process: /proc/<pid>/stat's letter on Linux ('T' stopped, 'Z' a zombie
 * not yet reaped by the launcher), 0 when it is gone, '?' when alive but unknown. */
static char tsr__proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill((pid_t)pid, 0) == 0 || errno == EPERM ? '?' : 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* A group rank as a world rank (Megatron order, see the top of comm.h). */
static int tsr__world_of(const tsr_comm *c, int which, int grank) {
    int tp = c->grp[TSR_COMM_TP].size > 0 ? c->grp[TSR_COMM_TP].size : 1;
    if (which == TSR_COMM_TP) return c->world_rank - c->world_rank % tp + grank;
    if (which == TSR_COMM_PP) return grank * tp + c->world_rank % tp;
    return grank;
}

static const char *tsr__wname(int which) {
    return which >= 0 && which < TSR_COMM_GROUP_COUNT ? tsr__group_names[which] : "?";
}

void tsr__comm_check_peers(tsr__comm_grp *g, const char *op, int peer) {
    tsr_comm *c = g->owner;
    (void)peer;
    for (int i = 0; c && i < c->n_peers; i++) {
        char st = tsr__proc_state(c->peers[i].pid);
        if (st != 0 && st != 'Z' && st != 'X') continue;
        char msg[300];
        snprintf(msg, sizeof msg, "rank %d (pid %d) died (killed, crashed or aborted) while "
                 "this rank waited in %s (%s group); aborting", c->peers[i].world_rank, c->peers[i].pid, op,
                 tsr__wname(g->which));
        tsr_comm_abort(c, 1, msg);
    }
}

_Noreturn void tsr__comm_stuck(tsr__comm_grp *g, const char *op, int peer, double waited) {
    tsr_comm *c = g->owner;
    char who[64] = "", stopped[160] = "", msg[400];
    if (peer >= 0)
        snprintf(who, sizeof who, ", waiting for rank %d", tsr__world_of(c, g->which, peer));
    size_t k = 0;
    for (int i = 0; i < c->n_peers && k < sizeof stopped - 48; i++) {
        char st = tsr__proc_state(c->peers[i].pid);
        if (st == 'T' || st == 't') {
            k += (size_t)snprintf(stopped + k, sizeof stopped - k, "; rank %d (pid %d) is stopped",
                                  c->peers[i].world_rank, c->peers[i].pid);
            /* The job ends here: the launcher's SIGCONT would otherwise wake the stopped
             * rank, which then finds this rank gone and adds a misleading "rank 0 died"
             * line after this one. */
            kill((pid_t)c->peers[i].pid, SIGKILL);
        }
    }
    snprintf(msg, sizeof msg, "no progress for %.0f s in %s (%s group%s)%s; aborting", waited,
             op, tsr__wname(g->which), who, stopped);
    tsr_comm_abort(c, 1, msg);
}

const char *tsr_comm_backend_name(const tsr_comm *c) {
    return c->backend == TSR_COMM_MPI ? "mpi" : "self";
}
bool tsr_comm_uses_nccl(const tsr_comm *c) { return c->nccl; }
void *tsr_comm_cuda_stream(const tsr_comm *c) { return c->nccl ? c->stream : NULL; }
int tsr_comm_world_rank(const tsr_comm *c) { return c->world_rank; }
int tsr_comm_world_size(const tsr_comm *c) { return c->world_size; }
int tsr_comm_local_rank(const tsr_comm *c) { return c->local_rank; }
int tsr_comm_local_size(const tsr_comm *c) { return c->local_size; }
int tsr_comm_tp(const tsr_comm *c) { return c->tp; }
int tsr_comm_pp(const tsr_comm *c) { return c->pp; }
int tsr_comm_tp_rank(const tsr_comm *c) { return c->tp_rank; }
int tsr_comm_pp_rank(const tsr_comm *c) { return c->pp_rank; }

int tsr_comm_rank(const tsr_comm *c, tsr_comm_group g) {
    if ((int)g < 0 || g >= TSR_COMM_GROUP_COUNT || c->grp[g].size == 0) return -1;
    return c->grp[g].rank;
}
int tsr_comm_size(const tsr_comm *c, tsr_comm_group g) {
    if ((int)g < 0 || g >= TSR_COMM_GROUP_COUNT) return 0;
    return c->grp[g].size;
}
const void *tsr_comm_mpi_handle(const tsr_comm *c, tsr_comm_group g) {
    if (!c || (int)g < 0 || g >= TSR_COMM_GROUP_COUNT || c->grp[g].size < 2) return NULL;
    return c->grp[g].mpi;
}

/* The group, or an error line when it does not exist (no layout yet, bad enum). */
static tsr_status tsr__grp(tsr_comm *c, tsr_comm_group g, const char *op, tsr__comm_grp **out) {
    if ((int)g < 0 || g >= TSR_COMM_GROUP_COUNT)
        return tsr_error_set(TSR_ERR_INVALID, "%s: no communicator group %d", op, (int)g);
    if (c->grp[g].size == 0)
        return tsr_error_set(TSR_ERR_INVALID, "%s on the %s group: no layout set yet "
                             "(call tsr_comm_set_layout)", op, tsr__group_names[g]);
    *out = &c->grp[g];
    return TSR_OK;
}

static tsr_status tsr__peer_check(tsr__comm_grp *g, tsr_comm_group which, int peer, int tag,
                                  const char *op) {
    if (peer < 0 || peer >= g->size || peer == g->rank)
        return tsr_error_set(TSR_ERR_INVALID, "%s on the %s group (rank %d of %d): bad peer %d",
                             op, tsr__group_names[which], g->rank, g->size, peer);
    if (tag < 0) return tsr_error_set(TSR_ERR_INVALID, "%s: negative tag %d", op, tag);
    return TSR_OK;
}

/* ---- traffic counters ---------------------------------------------------------------- */

void tsr_comm_get_stats(const tsr_comm *c, tsr_comm_stats *out) { *out = c->stats; }
void tsr_comm_reset_stats(tsr_comm *c) { memset(&c->stats, 0, sizeof c->stats); }

/* Binomial tree over virtual ranks v = (rank - root) mod size: v != 0 receives from
 * v - lowbit(v); v sends to v + m for every power of two m below lowbit(v) (below size
 * for the root) with v + m < size. Sums over ranks: (size - 1) sends = (size - 1) recvs. */
void tsr__comm_tally_bcast(tsr_comm_stats *st, int rank, int size, int root, size_t bytes) {
    if (size < 2 || bytes == 0) return;
    int v = (rank - root + size) % size;
    int low = v ? (v & -v) : size;
    int64_t children = 0;
    for (int m = 1; m < low && v + m < size; m <<= 1) children++;
    if (v != 0) {
        st->bytes_recv += (int64_t)bytes;
        st->messages++;
    }
    st->bytes_sent += children * (int64_t)bytes;
    st->messages += children;
}

#ifdef TSR_HAVE_MPI
/* Only multi-rank groups move bytes, and they exist only with MPI (NCCL needs it too). */
static void tsr__tally(tsr_comm *c, int64_t sent, int64_t recv, int64_t messages) {
    c->stats.bytes_sent += sent;
    c->stats.bytes_recv += recv;
    c->stats.messages += messages;
}

/* A ring all-gather: size - 1 steps of one send and one receive of `bytes`. */
static void tsr__tally_ring_allgather(tsr_comm *c, const tsr__comm_grp *g, size_t bytes) {
    int64_t steps = g->size - 1;
    tsr__tally(c, steps * (int64_t)bytes, steps * (int64_t)bytes, 2 * steps);
}
#endif

#ifdef TSR__COMM_NCCL
/* NCCL's ring all-reduce: reduce-scatter then all-gather, 2 (size - 1) steps of one send
 * and one receive of bytes / size each. */
static void tsr__tally_nccl_allreduce(tsr_comm *c, const tsr__comm_grp *g, size_t bytes) {
    int64_t steps = 2 * (int64_t)(g->size - 1);
    int64_t vol = steps * (int64_t)bytes / g->size;
    tsr__tally(c, vol, vol, 2 * steps);
}
#endif

/* ---- data plane ---------------------------------------------------------------------- */

#ifdef TSR_HAVE_MPI
/* Chunk of the chain sum: big enough that a hop's latency is amortized, small enough that
 * the hops pipeline and the receive buffer stays small. Must fit MPI's int count. */
enum { TSR__CHAIN_CHUNK = 1 << 16 };

static tsr_status tsr__chain(tsr_comm *c, tsr__comm_grp *g, const float *parts, int n_local,
                             size_t n, float *out) {
    size_t chunk = n < (size_t)TSR__CHAIN_CHUNK ? n : (size_t)TSR__CHAIN_CHUNK;
    if (chunk > c->scratch_cap) {
        float *p = tsr_realloc(c->scratch, chunk * sizeof(float));
        if (!p)
            return tsr_error_set(TSR_ERR_NOMEM, "allreduce: out of memory for a %zu-float "
                                 "receive buffer", chunk);
        c->scratch = p;
        c->scratch_cap = chunk;
    }
    return tsr__comm_mpi_chain_sum_f32(g, parts, n_local, n, out, c->scratch, chunk,
                                       &c->stats);
}
#endif

tsr_status tsr_comm_allreduce_sum_f32_parts(tsr_comm *c, tsr_comm_group which,
                                            const float *parts, int n_local, size_t n,
                                            float *out) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "allreduce_sum_f32_parts", &g));
    if (n_local < 1)
        return tsr_error_set(TSR_ERR_INVALID, "allreduce_sum_f32_parts: %d parts", n_local);
    if (n == 0) return TSR_OK;
#ifdef TSR__COMM_NCCL
    /* With NCCL the buffers are device memory, including in one-rank groups. */
    if (c->nccl && c->backend == TSR_COMM_MPI) {
        if (n_local != 1)
            return tsr_error_set(TSR_ERR_UNSUPPORTED, "allreduce_sum_f32_parts on NCCL: sum the "
                                 "%d local parts on the device first", n_local);
        if (g->size == 1) return tsr__nccl->copy(c, out, parts, n * sizeof(float));
        TSR_TRY(tsr__nccl->allreduce_sum_f32(c, g, parts, out, n));
        tsr__tally_nccl_allreduce(c, g, n * sizeof(float));
        return TSR_OK;
    }
#endif
    if (g->size == 1) {
        tsr__comm_self_sum_parts(parts, n_local, n, out);
        return TSR_OK;
    }
#ifdef TSR_HAVE_MPI
    size_t total;
    if (!tsr_mul_size((size_t)n_local, n, &total) || !tsr_mul_size(total, sizeof(float), &total))
        return tsr_error_set(TSR_ERR_NOMEM, "allreduce_sum_f32_parts: size overflow");
    return tsr__chain(c, g, parts, n_local, n, out);
#else
    return tsr_error_set(TSR_ERR_INTERNAL, "allreduce: a %d-rank group without MPI", g->size);
#endif
}

tsr_status tsr_comm_allreduce_sum_f32(tsr_comm *c, tsr_comm_group which, float *buf, size_t n) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "allreduce_sum_f32", &g));
    if (g->size == 1 || n == 0) return TSR_OK;
#ifdef TSR__COMM_NCCL
    if (g->nccl) {
        TSR_TRY(tsr__nccl->allreduce_sum_f32(c, g, buf, buf, n));
        tsr__tally_nccl_allreduce(c, g, n * sizeof(float));
        return TSR_OK;
    }
#endif
#ifdef TSR_HAVE_MPI
    /* One part per rank, summed in place: the chain gives ((p0 + p1) + p2) + .... */
    return tsr__chain(c, g, buf, 1, n, buf);
#else
    (void)buf;
    return tsr_error_set(TSR_ERR_INTERNAL, "allreduce: a %d-rank group without MPI", g->size);
#endif
}

tsr_status tsr_comm_allgather(tsr_comm *c, tsr_comm_group which, const void *send, size_t bytes,
                              void *recv) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "allgather", &g));
    if (bytes == 0) return TSR_OK;
#ifdef TSR__COMM_NCCL
    if (g->nccl) {
        TSR_TRY(tsr__nccl->allgather(c, g, send, bytes, recv));
        tsr__tally_ring_allgather(c, g, bytes);
        return TSR_OK;
    }
    if (c->nccl && c->backend == TSR_COMM_MPI) return tsr__nccl->copy(c, recv, send, bytes);
#endif
    if (g->size == 1) {
        if (recv != send) memmove(recv, send, bytes);
        return TSR_OK;
    }
#ifdef TSR_HAVE_MPI
    TSR_TRY(tsr__comm_mpi_allgather(g, send, bytes, recv));
    tsr__tally_ring_allgather(c, g, bytes);
    return TSR_OK;
#else
    return tsr_error_set(TSR_ERR_INTERNAL, "allgather: a %d-rank group without MPI", g->size);
#endif
}

tsr_status tsr_comm_alltoallv(tsr_comm *c, tsr_comm_group which, const void *send,
                              const size_t *send_bytes, const size_t *send_off, void *recv,
                              const size_t *recv_bytes, const size_t *recv_off) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "alltoallv", &g));
    int me = g->rank;
    if (send_bytes[me] != recv_bytes[me])
        return tsr_error_set(TSR_ERR_INVALID, "alltoallv: %zu bytes to this rank itself but %zu "
                             "expected from it", send_bytes[me], recv_bytes[me]);
#ifdef TSR_HAVE_MPI
    int64_t sent = 0, got = 0, msgs = 0;
    for (int r = 0; r < g->size; r++) {
        if (r == me) continue;
        sent += (int64_t)send_bytes[r];
        got += (int64_t)recv_bytes[r];
        msgs += (send_bytes[r] > 0) + (recv_bytes[r] > 0);
    }
#endif
#ifdef TSR__COMM_NCCL
    if (g->nccl) {
        TSR_TRY(tsr__nccl->alltoallv(c, g, send, send_bytes, send_off, recv, recv_bytes,
                                     recv_off));
        tsr__tally(c, sent, got, msgs);
        return TSR_OK;
    }
    if (c->nccl && c->backend == TSR_COMM_MPI)
        return tsr__nccl->copy(c, (char *)recv + recv_off[me],
                               (const char *)send + send_off[me], send_bytes[me]);
#endif
    if (g->size == 1) {
        if (send_bytes[0])
            memmove((char *)recv + recv_off[0], (const char *)send + send_off[0], send_bytes[0]);
        return TSR_OK;
    }
#ifdef TSR_HAVE_MPI
    TSR_TRY(tsr__comm_mpi_alltoallv(g, send, send_bytes, send_off, recv, recv_bytes, recv_off));
    tsr__tally(c, sent, got, msgs);
    return TSR_OK;
#else
    return tsr_error_set(TSR_ERR_INTERNAL, "alltoallv: a %d-rank group without MPI", g->size);
#endif
}

tsr_status tsr_comm_send(tsr_comm *c, tsr_comm_group which, const void *buf, size_t bytes,
                         int peer, int tag) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "send", &g));
    TSR_TRY(tsr__peer_check(g, which, peer, tag, "send"));
    tsr_status st;
#ifdef TSR__COMM_NCCL
    if (g->nccl) st = tsr__nccl->send(c, g, buf, bytes, peer, true);
    else
#endif
#ifdef TSR_HAVE_MPI
        st = tsr__comm_mpi_send(g, buf, bytes, peer, tag);
    if (st == TSR_OK) tsr__tally(c, (int64_t)bytes, 0, 1);
    return st;
#else
    (void)st;
    (void)buf, (void)bytes;
    return TSR_ERR_INTERNAL; /* unreachable: peer_check rejects every peer of a 1-rank group */
#endif
}

tsr_status tsr_comm_recv(tsr_comm *c, tsr_comm_group which, void *buf, size_t bytes, int peer,
                         int tag) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "recv", &g));
    TSR_TRY(tsr__peer_check(g, which, peer, tag, "recv"));
    tsr_status st;
#ifdef TSR__COMM_NCCL
    if (g->nccl) st = tsr__nccl->recv(c, g, buf, bytes, peer, true);
    else
#endif
#ifdef TSR_HAVE_MPI
        st = tsr__comm_mpi_recv(g, buf, bytes, peer, tag);
    if (st == TSR_OK) tsr__tally(c, 0, (int64_t)bytes, 1);
    return st;
#else
    (void)st;
    (void)buf, (void)bytes;
    return TSR_ERR_INTERNAL;
#endif
}

tsr_status tsr_comm_isend(tsr_comm *c, tsr_comm_group which, const void *buf, size_t bytes,
                          int peer, int tag, tsr_comm_request *req) {
    tsr__comm_grp *g = NULL;
    memset(req, 0, sizeof *req);
    TSR_TRY(tsr__grp(c, which, "isend", &g));
    TSR_TRY(tsr__peer_check(g, which, peer, tag, "isend"));
    tsr_status st;
#ifdef TSR__COMM_NCCL
    if (g->nccl) {
        req->kind = TSR__REQ_NCCL;
        st = tsr__nccl->send(c, g, buf, bytes, peer, false);
    } else
#endif
#ifdef TSR_HAVE_MPI
        st = tsr__comm_mpi_isend(g, buf, bytes, peer, tag, req);
    if (st == TSR_OK) tsr__tally(c, (int64_t)bytes, 0, 1);
    return st;
#else
    (void)st;
    (void)buf, (void)bytes;
    return TSR_ERR_INTERNAL;
#endif
}

tsr_status tsr_comm_irecv(tsr_comm *c, tsr_comm_group which, void *buf, size_t bytes, int peer,
                          int tag, tsr_comm_request *req) {
    tsr__comm_grp *g = NULL;
    memset(req, 0, sizeof *req);
    TSR_TRY(tsr__grp(c, which, "irecv", &g));
    TSR_TRY(tsr__peer_check(g, which, peer, tag, "irecv"));
    tsr_status st;
#ifdef TSR__COMM_NCCL
    if (g->nccl) {
        req->kind = TSR__REQ_NCCL;
        st = tsr__nccl->recv(c, g, buf, bytes, peer, false);
    } else
#endif
#ifdef TSR_HAVE_MPI
        st = tsr__comm_mpi_irecv(g, buf, bytes, peer, tag, req);
    if (st == TSR_OK) tsr__tally(c, 0, (int64_t)bytes, 1);
    return st;
#else
    (void)st;
    (void)buf, (void)bytes;
    return TSR_ERR_INTERNAL;
#endif
}

tsr_status tsr_comm_wait(tsr_comm *c, tsr_comm_request *req) {
    (void)c; /* unused in a build without MPI */
    switch (req->kind) {
    case TSR__REQ_NONE:
        return TSR_OK;
#ifdef TSR_HAVE_MPI
    case TSR__REQ_MPI:
        return tsr__comm_mpi_wait(c, req);
#endif
#ifdef TSR__COMM_NCCL
    case TSR__REQ_NCCL:
        req->kind = TSR__REQ_NONE;
        return tsr__nccl->sync(c);
#endif
    default:
        return tsr_error_set(TSR_ERR_INVALID, "wait: unknown request kind %d", req->kind);
    }
}

/* count: false for agree's own bcast, which is control plane. */
static tsr_status tsr__bcast(tsr_comm *c, tsr_comm_group which, void *buf, size_t bytes,
                             int root, bool count) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "bcast", &g));
    if (root < 0 || root >= g->size)
        return tsr_error_set(TSR_ERR_INVALID, "bcast on the %s group: root %d of %d ranks",
                             tsr__group_names[which], root, g->size);
    if (g->size == 1 || bytes == 0) return TSR_OK;
#ifdef TSR_HAVE_MPI
    TSR_TRY(tsr__comm_mpi_bcast(g, buf, bytes, root));
    if (count) tsr__comm_tally_bcast(&c->stats, g->rank, g->size, root, bytes);
    return TSR_OK;
#else
    (void)buf, (void)count;
    return TSR_ERR_INTERNAL;
#endif
}

tsr_status tsr_comm_bcast(tsr_comm *c, tsr_comm_group which, void *buf, size_t bytes, int root) {
    return tsr__bcast(c, which, buf, bytes, root, true);
}

tsr_status tsr_comm_allreduce_i64(tsr_comm *c, tsr_comm_group which, int64_t *buf, size_t n,
                                  tsr_comm_op op) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "allreduce_i64", &g));
    if (op != TSR_COMM_SUM && op != TSR_COMM_MIN && op != TSR_COMM_MAX)
        return tsr_error_set(TSR_ERR_INVALID, "allreduce_i64: unknown op %d", (int)op);
    if (g->size == 1 || n == 0) return TSR_OK;
#ifdef TSR_HAVE_MPI
    return tsr__comm_mpi_allreduce_i64(g, buf, n, op);
#else
    (void)buf;
    return TSR_ERR_INTERNAL;
#endif
}

tsr_status tsr_comm_barrier(tsr_comm *c, tsr_comm_group which) {
    tsr__comm_grp *g = NULL;
    TSR_TRY(tsr__grp(c, which, "barrier", &g));
    if (g->size == 1) return TSR_OK;
#ifdef TSR_HAVE_MPI
    return tsr__comm_mpi_barrier(g);
#else
    return TSR_ERR_INTERNAL;
#endif
}

/* What the failing rank sends to everyone: its status and its error line. */
typedef struct tsr__agree_msg {
    int32_t status;
    char line[500];
} tsr__agree_msg;

tsr_status tsr_comm_agree(tsr_comm *c, tsr_status st) {
    if (c->world_size == 1) return st;
    /* One MAX over {-rank of the failing ranks, "I passed"} finds the lowest failing rank
     * (or none) and whether every rank failed. */
    int64_t v[2] = {st != TSR_OK ? -(int64_t)c->world_rank : INT64_MIN, st == TSR_OK};
    char mine[sizeof(((tsr__agree_msg *)0)->line)];
    snprintf(mine, sizeof mine, "%s", tsr_last_error());
    if (tsr_comm_allreduce_i64(c, TSR_COMM_WORLD, v, 2, TSR_COMM_MAX) != TSR_OK)
        return TSR_ERR_MPI;
    if (v[0] == INT64_MIN) return TSR_OK;
    int root = (int)-v[0];
    tsr__agree_msg m;
    memset(&m, 0, sizeof m);
    if (root == c->world_rank) {
        m.status = (int32_t)st;
        snprintf(m.line, sizeof m.line, "%s", *mine ? mine : tsr_strerror(st));
    }
    if (tsr__bcast(c, TSR_COMM_WORLD, &m, sizeof m, root, false) != TSR_OK) return TSR_ERR_MPI;
    tsr_status agreed = (m.status > TSR_OK && m.status < TSR_STATUS_COUNT) ? (tsr_status)m.status
                                                                         : TSR_ERR_INTERNAL;
    /* All ranks failed (a bad layout, a bad model file): the same reason everywhere, which
     * needs no rank to be named. */
    if (v[1] == 0) return tsr_error_set(agreed, "%s", m.line);
    return tsr_error_set(agreed, "rank %d: %s", root, m.line);
}

_Noreturn void tsr_comm_abort(tsr_comm *c, int code, const char *msg) {
    if (code == 0) code = 1;
    if (c && c->world_size > 1)
        fprintf(stderr, "tessera: rank %d: %s\n", c->world_rank, msg ? msg : "aborted");
    else
        fprintf(stderr, "tessera: %s\n", msg ? msg : "aborted");
    fflush(stderr);
#ifdef TSR_HAVE_MPI
    if (c && c->backend == TSR_COMM_MPI) tsr__comm_mpi_abort(code);
#endif
    exit(code);
}

#ifndef TSR_HAVE_MPI
bool tsr_comm_mpi_library(char *buf, size_t cap) {
    if (cap) buf[0] = '\0';
    return false;
}
#endif
