/* Communication between ranks: bootstrap (MPI or a single process), the tensor- and
 * pipeline-parallel groups of a tp x pp layout, collectives and stage-to-stage messages.
 *
 * Rank layout (Megatron order): world rank = pp_rank * tp + tp_rank, so the ranks of one
 * tensor-parallel group are consecutive (the same node, the fastest links) and a pipeline
 * group strides by tp. runtime/exec/parallel.h uses the same mapping.
 *
 * Backends. A job launched by mpirun/srun (detected from the launcher's environment) runs
 * over MPI; anything else is a single process that needs no MPI at all (world size 1, no
 * MPI_Init). With the CUDA module (built with NCCL) loaded, tsr_comm_enable_nccl (or
 * tsr_comm_options.nccl at init) puts the data plane of each group on NCCL, on the
 * backend's device and stream.
 *
 * Two families of operations:
 *  - data plane (allreduce_sum_f32*, allgather, alltoallv, send/recv/isend/irecv): buffers
 *    live in the backend's memory, host memory on CPU, device memory when the comm uses
 *    NCCL;
 *  - control plane (bcast, allreduce_i64, barrier, agree, abort): host memory, always MPI.
 *
 * Determinism: on the MPI/CPU path allreduce_sum_f32 sums in group-rank order,
 * ((p0 + p1) + p2) + ..., along a chain (rank 0 sends its vector to rank 1, which adds its
 * own and passes the running sum on; the last rank broadcasts the result), so the result
 * does not depend on the MPI library's reduction tree and each rank moves O(n) floats.
 * allreduce_sum_f32_parts extends this to a canonical list of partial sums that does not
 * depend on tp at all (see its comment). NCCL sums in its own order (see docs/scaling.md
 * for the GPU tolerance).
 *
 * Every MPI communicator uses MPI_ERRORS_RETURN; MPI failures come back as TSR_ERR_MPI with
 * MPI_Error_string's text. Calls on a group are collective over that group unless said
 * otherwise. One control thread per rank (MPI_THREAD_FUNNELED). */
#ifndef TSR_COMM_COMM_H
#define TSR_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tsr_comm tsr_comm;

typedef enum tsr_comm_group {
    TSR_COMM_WORLD = 0,
    TSR_COMM_TP = 1, /* the ranks sharing my pipeline stage: same pp_rank */
    TSR_COMM_PP = 2, /* the stages of my tensor slice: same tp_rank */
    TSR_COMM_GROUP_COUNT
} tsr_comm_group;

typedef enum tsr_comm_backend {
    TSR_COMM_AUTO = 0, /* MPI when launched by mpirun/srun (and built with MPI), else self */
    TSR_COMM_SELF = 1, /* one process, no MPI */
    TSR_COMM_MPI = 2,  /* MPI even without a launcher (a singleton MPI job) */
} tsr_comm_backend;

typedef struct tsr_comm_options {
    tsr_comm_backend backend;
    /* NCCL for the data plane (needs NCCL loaded, tsr_comm_nccl_built; an error otherwise).
     * Ignored by the self backend: a single process keeps its data plane local, where only
     * allreduce_sum_f32 (a no-op) is safe on device buffers. */
    bool nccl;
    bool set_device;   /* use `device` for NCCL; else the GPU is the local rank */
    int device;
    void *cuda_stream; /* cudaStream_t the NCCL ops are ordered on; NULL: the default stream */
    int *argc;         /* passed to MPI_Init_thread; may be NULL */
    char ***argv;
} tsr_comm_options;

/* Bootstraps the job: MPI_Init_thread when the backend is MPI (unless MPI was already
 * initialized by the caller), world and node-local ranks (MPI_Comm_split_type SHARED).
 * The TP and PP groups exist only after tsr_comm_set_layout. opt may be NULL (AUTO).
 * The environment variable TSR_COMM=self|mpi overrides AUTO. */
tsr_status tsr_comm_init(const tsr_comm_options *opt, tsr_comm **out);

/* Builds the TP and PP groups of a tp x pp layout (collective over the world). Checks
 * tp >= 1, pp >= 1 and tp * pp == world size, with an error line naming the numbers. On
 * failure the comm stays usable for world operations (agree, abort) and destroy. May be
 * called again to replace the layout. With NCCL on, creates one NCCL communicator per
 * multi-rank group (ncclGetUniqueId on group rank 0, MPI_Bcast, ncclCommInitRank; see
 * tsr_comm_enable_nccl for how failures end). */
tsr_status tsr_comm_set_layout(tsr_comm *c, int tp, int pp);

/* Tears down NCCL (finalize, which completes outstanding operations, then destroy; the
 * stream is not touched, so the backend that owns it may be gone already), then the MPI
 * communicators, then MPI_Finalize when tsr_comm_init called MPI_Init. NULL is accepted. */
void tsr_comm_destroy(tsr_comm *c);

/* The watchdog. Every wait of an MPI operation (collectives, send/recv, tsr_comm_wait)
 * polls its request instead of blocking: first without pause (a fast collective costs
 * what it did), then sleeping with a backoff up to 1 ms so that a waiting rank does not
 * burn a core. While it waits it checks, every 100 ms, that the other ranks of this node
 * are alive: one that died (kill -9, a crash) ends the job at once with
 *   "tessera: rank R: rank P (pid N) died (killed, crashed or aborted) while this rank
 *    waited in OP (G group); aborting".
 * When an operation makes no progress for `seconds`, the job ends with
 *   "tessera: rank R: no progress for S s in OP (G group[, waiting for rank P])[; rank Q
 *    (pid N) is stopped]; aborting"
 * (P: the peer of a point-to-point transfer or of the chain sum's hop; Q: a rank of this
 * node found stopped, e.g. by SIGSTOP). Both call MPI_Abort (exit code 1). Ranks are world
 * ranks. 0 turns the watchdog off (plain blocking MPI waits). Default
 * TSR_COMM_DEFAULT_TIMEOUT. Local; each rank sets its own. NCCL operations are not
 * watched. */
#define TSR_COMM_DEFAULT_TIMEOUT 600.0
void tsr_comm_set_timeout(tsr_comm *c, double seconds);
double tsr_comm_timeout(const tsr_comm *c);

/* The MPI library this build links (tessera --version): the first line of
 * MPI_Get_library_version ("Open MPI v4.1.4, ..." up to the comma), callable before any
 * comm exists; false, with buf empty, in a build without MPI (TESSERA_MPI=OFF). */
bool tsr_comm_mpi_library(char *buf, size_t cap);

/* "self" or "mpi", and whether the data plane is on NCCL. */
const char *tsr_comm_backend_name(const tsr_comm *c);
bool tsr_comm_uses_nccl(const tsr_comm *c);
/* Whether the data plane can go on NCCL: an MPI build into which the CUDA module (built
 * with NCCL) has been loaded, i.e. once a CUDA backend exists. */
bool tsr_comm_nccl_built(void);
/* The NCCL data plane, handed over by the CUDA module when kernels/backend.c loads it (the
 * table is comm/comm_impl.h's; comm itself never loads anything). TSR_ERR_UNSUPPORTED when
 * this build has no MPI or the table comes from another build. Start-up only, before any
 * comm uses NCCL; a second call with the same table is a no-op. */
struct tsr_comm_nccl_ops;
tsr_status tsr_comm_provide_nccl(const struct tsr_comm_nccl_ops *ops);
/* The cudaStream_t the NCCL operations are ordered on; NULL without NCCL (or for the
 * default stream). */
void *tsr_comm_cuda_stream(const tsr_comm *c);

/* Moves the data plane of every multi-rank group to NCCL, on GPU `device` (-1: the local
 * rank) with every operation ordered on `cuda_stream` (a cudaStream_t; NULL: the default
 * stream). Meant for a comm bootstrapped without NCCL: the compute backend, whose device
 * and stream NCCL must share, can only be made once the local rank is known. Collective
 * over the world. Without NCCL loaded: TSR_ERR_UNSUPPORTED. The self backend keeps
 * its data plane local and returns TSR_OK. The device setup (which also refuses two local
 * ranks on one GPU) and the NCCL ids are agreed over the world: such a failure gives every
 * rank the same line and leaves the comm on MPI. A failure inside NCCL's own collective
 * initialization cannot be agreed on (the other ranks wait inside NCCL), so it ends the
 * job (tsr_comm_abort). With a layout set, its groups are connected now; otherwise
 * tsr_comm_set_layout connects them. The stream must stay valid while data-plane
 * operations run; teardown does not use it. Calling it again with the same stream is a
 * no-op. */
tsr_status tsr_comm_enable_nccl(tsr_comm *c, int device, void *cuda_stream);

int tsr_comm_world_rank(const tsr_comm *c);
int tsr_comm_world_size(const tsr_comm *c);
/* Rank among the ranks of this node, and their number (rank -> GPU mapping, pinning). */
int tsr_comm_local_rank(const tsr_comm *c);
int tsr_comm_local_size(const tsr_comm *c);
/* Layout: 0 before tsr_comm_set_layout. */
int tsr_comm_tp(const tsr_comm *c);
int tsr_comm_pp(const tsr_comm *c);
int tsr_comm_tp_rank(const tsr_comm *c);
int tsr_comm_pp_rank(const tsr_comm *c);
/* My rank in / the size of a group; -1 / 0 when the group does not exist yet. */
int tsr_comm_rank(const tsr_comm *c, tsr_comm_group g);
int tsr_comm_size(const tsr_comm *c, tsr_comm_group g);
/* The group's MPI communicator (an MPI_Comm *, valid while c lives), for a library that
 * does its own MPI I/O on the job's ranks (parallel HDF5 checkpoints); NULL without MPI or
 * for a group of one rank. Collectives on it are not watched (tsr_comm_set_timeout). */
const void *tsr_comm_mpi_handle(const tsr_comm *c, tsr_comm_group g);

/* ---- data plane ---------------------------------------------------------------------- */

/* In place: buf[i] = sum over group ranks r, in rank order, of rank r's buf[i]. */
tsr_status tsr_comm_allreduce_sum_f32(tsr_comm *c, tsr_comm_group g, float *buf, size_t n);

/* Sums a canonical list of partial vectors. Each rank contributes n_local parts of n floats
 * (parts[p * n + i]); all ranks give the same n_local. The global list is rank 0's parts,
 * then rank 1's, ...; out[i] = ((P0[i] + P1[i]) + P2[i]) + ... over that list. When the
 * parts are per-shard partial products with a fixed shard count S, tp = 1 (n_local = S),
 * tp = 2 (S/2) and tp = 4 (S/4) give bit-identical results. out may not alias parts.
 * On a group of size 1 this is the local sum, so single-process code calls it too. */
tsr_status tsr_comm_allreduce_sum_f32_parts(tsr_comm *c, tsr_comm_group g, const float *parts,
                                            int n_local, size_t n, float *out);

/* recv[r * bytes .. (r+1) * bytes) = rank r's send (bytes each). */
tsr_status tsr_comm_allgather(tsr_comm *c, tsr_comm_group g, const void *send, size_t bytes,
                              void *recv);

/* Personalized exchange (expert parallelism): to group rank r this rank sends send_bytes[r]
 * bytes from send + send_off[r], and from group rank r it receives recv_bytes[r] bytes into
 * recv + recv_off[r]. The receive ranges must not overlap; send ranges may (one block sent
 * to every rank). Every rank's send_bytes[r] must equal rank r's recv_bytes[me]. Counts are
 * the caller's to agree on (tessera derives them from the routing every rank computes).
 * MPI: MPI_Ialltoallv (each count must fit an int); NCCL: grouped ncclSend/ncclRecv on the
 * stream; a group of one rank copies. */
tsr_status tsr_comm_alltoallv(tsr_comm *c, tsr_comm_group g, const void *send,
                              const size_t *send_bytes, const size_t *send_off, void *recv,
                              const size_t *recv_bytes, const size_t *recv_off);

/* Blocking point-to-point within a group (peer = group rank). Tags are >= 0. */
tsr_status tsr_comm_send(tsr_comm *c, tsr_comm_group g, const void *buf, size_t bytes,
                         int peer, int tag);
tsr_status tsr_comm_recv(tsr_comm *c, tsr_comm_group g, void *buf, size_t bytes, int peer,
                         int tag);

/* A pending non-blocking operation, embedded by the caller (no allocation per message). */
typedef struct tsr_comm_request {
    int kind; /* 0: none/complete; internal otherwise */
    union {
        void *p;
        int64_t i;
        unsigned char bytes[32];
    } impl;
} tsr_comm_request;

/* Non-blocking send/recv: the buffer must stay untouched until tsr_comm_wait. With NCCL
 * they are enqueued on the stream (wait then synchronizes it). */
tsr_status tsr_comm_isend(tsr_comm *c, tsr_comm_group g, const void *buf, size_t bytes,
                          int peer, int tag, tsr_comm_request *req);
tsr_status tsr_comm_irecv(tsr_comm *c, tsr_comm_group g, void *buf, size_t bytes, int peer,
                          int tag, tsr_comm_request *req);
/* Completes a request (a completed or zeroed one returns at once). */
tsr_status tsr_comm_wait(tsr_comm *c, tsr_comm_request *req);

/* ---- traffic counters ------------------------------------------------------------------ */

/* What this rank's data-plane operations (allreduce_sum_f32*, allgather, alltoallv,
 * send/recv/isend/irecv) and bcast moved since tsr_comm_init or the last reset, over all
 * groups.
 *  - MPI point-to-point (send/recv, and the chain sum's own messages) and alltoallv (MPI
 *    and NCCL): exact bytes and messages (alltoallv: one per non-empty block to or from
 *    another rank); isend/irecv count when posted.
 *  - MPI collectives are counted with the textbook algorithm, not whatever the MPI library
 *    picks: MPI_Bcast as a binomial tree (a non-root rank receives the buffer once and
 *    sends it to each of its children; the root sends to ceil(log2 size) children at
 *    most), MPI_Allgather as a ring ((size - 1) x bytes each way).
 *  - NCCL: the analytic ring volume (all-reduce 2 (size - 1) / size x bytes each way,
 *    all-gather (size - 1) x bytes each way, send/recv their bytes).
 *  - one-rank groups: nothing. Control-plane allreduce_i64, barrier and agree (including
 *    its internal bcast): not counted.
 * messages counts sends plus receives of this rank (a collective: of its algorithm). */
typedef struct tsr_comm_stats {
    int64_t bytes_sent, bytes_recv, messages;
} tsr_comm_stats;

void tsr_comm_get_stats(const tsr_comm *c, tsr_comm_stats *out);
void tsr_comm_reset_stats(tsr_comm *c);

/* ---- control plane (host memory, MPI) ------------------------------------------------ */

tsr_status tsr_comm_bcast(tsr_comm *c, tsr_comm_group g, void *buf, size_t bytes, int root);

typedef enum tsr_comm_op { TSR_COMM_SUM = 0, TSR_COMM_MIN = 1, TSR_COMM_MAX = 2 } tsr_comm_op;
/* In place over n int64 values (admission headroom MIN, counters SUM, digests MAX). */
tsr_status tsr_comm_allreduce_i64(tsr_comm *c, tsr_comm_group g, int64_t *buf, size_t n,
                                  tsr_comm_op op);

tsr_status tsr_comm_barrier(tsr_comm *c, tsr_comm_group g);

/* Collective over the world: every rank passes its own status and gets the same answer.
 * TSR_OK when all ranks passed TSR_OK; else the status of the lowest failing rank, and on
 * every rank the error line becomes that rank's line, prefixed "rank R: " unless every rank
 * failed, so that rank 0 can print the reason and all ranks take the same exit. In a
 * single process it returns st unchanged. If the agreement itself fails: TSR_ERR_MPI. */
tsr_status tsr_comm_agree(tsr_comm *c, tsr_status st);

/* Ends the whole job now: prints "tessera: rank R: msg" to stderr and calls MPI_Abort
 * (exit(code) in a single process). For failures that cannot be agreed on. c may be NULL. */
_Noreturn void tsr_comm_abort(tsr_comm *c, int code, const char *msg);

/* True when the environment says a launcher started us (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
 * PMIX_RANK, SLURM_PROCID, ...). Sets *n_ranks to the launcher's world size when known
 * (else 0). */
bool tsr_comm_launched_by_mpi(int *n_ranks);

#endif
