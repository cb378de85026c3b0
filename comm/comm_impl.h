/* Internals shared by comm.c and its backends (comm_self.c, comm_mpi.c, comm_nccl.c).
 * comm.c dispatches: a group of one rank is handled locally (comm_self.c), a group with an
 * NCCL communicator runs its data plane there, everything else goes to MPI. */
#ifndef TSR_COMM_COMM_IMPL_H
#define TSR_COMM_COMM_IMPL_H

#include "comm/comm.h"

typedef struct tsr__comm_grp {
    int rank, size; /* size 0: not created */
    void *mpi;      /* MPI_Comm * (heap), NULL without MPI */
    /* A duplicate of `mpi` for tessera's own point-to-point traffic (the chain sum), so
     * that its messages can never match the caller's sends and receives, whatever tags. */
    void *mpi_internal;
    void *nccl;     /* ncclComm_t, NULL without NCCL */
    struct tsr_comm *owner; /* for the watchdog: timeout, rank names, peers */
    int which;              /* tsr_comm_group */
} tsr__comm_grp;

/* A rank of this node, for the watchdog's liveness check (a dead or stopped peer). */
typedef struct tsr__comm_peer {
    int world_rank;
    int pid;
} tsr__comm_peer;

struct tsr_comm {
    tsr_comm_backend backend; /* resolved: SELF or MPI */
    int world_rank, world_size;
    int local_rank, local_size;
    int tp, pp, tp_rank, pp_rank; /* 0 before set_layout */
    tsr__comm_grp grp[TSR_COMM_GROUP_COUNT];
    void *mpi_node; /* MPI_Comm * of the ranks on this node */
    bool owns_mpi;  /* we called MPI_Init, so we call MPI_Finalize */
    bool nccl;      /* data plane on NCCL */
    int device;
    void *stream;
    float *scratch; /* one received chunk of the chain sum */
    size_t scratch_cap;
    tsr_comm_stats stats; /* data plane and bcast of this rank (tsr_comm_get_stats) */
    double timeout_s;      /* watchdog (tsr_comm_set_timeout); 0: plain blocking waits */
    tsr__comm_peer *peers; /* the other ranks of this node */
    int n_peers;
};

enum { TSR__REQ_NONE = 0, TSR__REQ_MPI = 1, TSR__REQ_NCCL = 2 };

/* comm_self.c: world size 1, no MPI; and the local paths of one-rank groups. */
void tsr__comm_self_init(tsr_comm *c);
void tsr__comm_self_sum_parts(const float *parts, int n_parts, size_t n, float *out);

/* comm.c: adds to *st what a binomial-tree broadcast of `bytes` from `root` moves for
 * `rank` of `size` (the model tsr_comm_stats documents). */
void tsr__comm_tally_bcast(tsr_comm_stats *st, int rank, int size, int root, size_t bytes);

/* comm.c, the watchdog (see tsr_comm_set_timeout). `op` names the operation, `peer` the
 * group rank waited for (-1: a collective, unknown). check_peers ends the job with one line
 * when a rank of this node has died; stuck ends it after `waited` seconds without progress,
 * naming the operation, the group, the peer and any stopped rank of this node. */
void tsr__comm_check_peers(tsr__comm_grp *g, const char *op, int peer);
_Noreturn void tsr__comm_stuck(tsr__comm_grp *g, const char *op, int peer, double waited);

#ifdef TSR_HAVE_MPI
/* comm_mpi.c */
tsr_status tsr__comm_mpi_init(tsr_comm *c, const tsr_comm_options *o);
void tsr__comm_mpi_finalize(tsr_comm *c);
tsr_status tsr__comm_mpi_split(tsr_comm *c, int color, int key, tsr__comm_grp *out,
                               const char *what);
void tsr__comm_mpi_grp_free(tsr__comm_grp *g);
tsr_status tsr__comm_mpi_allgather(tsr__comm_grp *g, const void *send, size_t bytes,
                                   void *recv);
/* The chain sum over the group (see tsr_comm_allreduce_sum_f32_parts): n_local parts of
 * n floats in, their sum over the global list out; out may equal parts when n_local == 1.
 * Adds what it moved to *st. scratch holds `chunk` floats. */
tsr_status tsr__comm_mpi_chain_sum_f32(tsr__comm_grp *g, const float *parts, int n_local,
                                       size_t n, float *out, float *scratch, size_t chunk,
                                       tsr_comm_stats *st);
tsr_status tsr__comm_mpi_alltoallv(tsr__comm_grp *g, const void *send, const size_t *send_bytes,
                                   const size_t *send_off, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_off);
tsr_status tsr__comm_mpi_bcast(tsr__comm_grp *g, void *buf, size_t bytes, int root);
tsr_status tsr__comm_mpi_allreduce_i64(tsr__comm_grp *g, int64_t *buf, size_t n,
                                       tsr_comm_op op);
tsr_status tsr__comm_mpi_barrier(tsr__comm_grp *g);
tsr_status tsr__comm_mpi_send(tsr__comm_grp *g, const void *buf, size_t bytes, int peer,
                              int tag);
tsr_status tsr__comm_mpi_recv(tsr__comm_grp *g, void *buf, size_t bytes, int peer, int tag);
tsr_status tsr__comm_mpi_isend(tsr__comm_grp *g, const void *buf, size_t bytes, int peer,
                               int tag, tsr_comm_request *req);
tsr_status tsr__comm_mpi_irecv(tsr__comm_grp *g, void *buf, size_t bytes, int peer, int tag,
                               tsr_comm_request *req);
tsr_status tsr__comm_mpi_wait(tsr_comm *c, tsr_comm_request *req);
_Noreturn void tsr__comm_mpi_abort(int code);
#endif

#ifdef TSR_HAVE_MPI
/* NCCL can carry the data plane: it comes at run time with the CUDA module (comm_nccl.c is
 * built into libtessera-cuda.so), which hands this table over through tsr_comm_provide_nccl
 * when kernels/backend.c loads it. NCCL bootstraps over MPI, hence only in MPI builds. */
#define TSR__COMM_NCCL 1
#endif

/* comm_nccl.c: one NCCL communicator per group, ops ordered on c->stream. */
struct tsr_comm_nccl_ops {
    uint32_t comm_size; /* sizeof(struct tsr_comm) where the table was built */
    tsr_status (*setup)(tsr_comm *c);
    tsr_status (*grp_init)(tsr_comm *c, tsr__comm_grp *g, const char *what);
    void (*grp_free)(tsr_comm *c, tsr__comm_grp *g);
    tsr_status (*allreduce_sum_f32)(tsr_comm *c, tsr__comm_grp *g, const float *in, float *out,
                                    size_t n);
    tsr_status (*allgather)(tsr_comm *c, tsr__comm_grp *g, const void *send, size_t bytes,
                            void *recv);
    tsr_status (*send)(tsr_comm *c, tsr__comm_grp *g, const void *buf, size_t bytes, int peer,
                       bool wait);
    tsr_status (*recv)(tsr_comm *c, tsr__comm_grp *g, void *buf, size_t bytes, int peer,
                       bool wait);
    tsr_status (*sync)(tsr_comm *c);
    /* tsr_comm_alltoallv on the stream (the block to this rank itself included). */
    tsr_status (*alltoallv)(tsr_comm *c, tsr__comm_grp *g, const void *send,
                            const size_t *send_bytes, const size_t *send_off, void *recv,
                            const size_t *recv_bytes, const size_t *recv_off);
    /* Device-to-device copy on the stream: the one-rank group paths of device buffers. */
    tsr_status (*copy)(tsr_comm *c, void *dst, const void *src, size_t bytes);
};

#endif
