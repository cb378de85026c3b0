/* The NCCL data plane: one NCCL communicator per group, bootstrapped the way NCCL's own
 * examples do it (ncclGetUniqueId on group rank 0, MPI_Bcast of the id over the group's MPI
 * communicator, ncclCommInitRank), with every op ordered on the backend's stream (the data
 * plane's buffers are the backend's device memory; control-plane calls stay on MPI). Built
 * into the CUDA module, not the runtime (cmake/TesseraCuda.cmake): the module hands the table
 * at the end to comm.c when it is loaded (kernels/cuda/module.c). Compiled to nothing unless
 * the module has NCCL (TSR_HAVE_NCCL) and the build MPI: the id needs MPI to travel. */
#include "comm/comm_impl.h"

#if defined(TSR__COMM_NCCL) && defined(TSR_HAVE_NCCL)

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"

static cudaStream_t tsr__stream(tsr_comm *c) { return (cudaStream_t)c->stream; }
static ncclComm_t tsr__nc(const tsr__comm_grp *g) { return (ncclComm_t)g->nccl; }
static tsr_status tsr__nccl_sync(tsr_comm *c);

#define TSR__NCCL_TRY(call, what)                                                        \
    do {                                                                                 \
        ncclResult_t r_ = (call);                                                        \
        if (r_ != ncclSuccess)                                                           \
            return tsr_error_set(TSR_ERR_NCCL, "%s: %s", what, ncclGetErrorString(r_));  \
    } while (0)
#define TSR__CUDA_TRY(call, what)                                                        \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess)                                                           \
            return tsr_error_set(TSR_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e_));  \
    } while (0)

/* The GPU this rank uses (the local rank unless told), current from now on, and its PCI
 * bus id in `busid` ("" when there is none). Local. */
static tsr_status tsr__pick_device(tsr_comm *c, char *busid, int cap) {
    int n_dev = 0;
    TSR__CUDA_TRY(cudaGetDeviceCount(&n_dev), "cudaGetDeviceCount");
    if (c->device < 0) c->device = c->local_rank;
    if (c->device >= n_dev)
        return tsr_error_set(TSR_ERR_CUDA, "rank %d (local rank %d) wants GPU %d, but this node "
                             "has %d; start at most %d ranks per node", c->world_rank,
                             c->local_rank, c->device, n_dev, n_dev);
    TSR__CUDA_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    TSR__CUDA_TRY(cudaDeviceGetPCIBusId(busid, cap, c->device), "cudaDeviceGetPCIBusId");
    return TSR_OK;
}

/* Chooses the device and checks that no other rank of the node has the same one: NCCL
 * refuses two ranks on one GPU only inside ncclCommInitRank, where the ranks can no longer
 * agree on the error. Collective over the node (every rank takes part in the exchange even
 * when its own device failed); the caller agrees on the result over the world. */
static tsr_status tsr__nccl_setup(tsr_comm *c) {
    enum { ID = 32 };
    char mine[ID];
    memset(mine, 0, sizeof mine);
    tsr_status st = tsr__pick_device(c, mine, ID);
    if (st != TSR_OK) mine[0] = 0;
    int n = c->local_size > 0 ? c->local_size : 1;
    char *all = tsr_calloc((size_t)n, ID);
    if (!all) /* cannot take part in the exchange, and the node's ranks wait in it */
        tsr_comm_abort(c, 1, "NCCL setup: out of memory for the node's GPU ids");
    int rc = MPI_Allgather(mine, ID, MPI_CHAR, all, ID, MPI_CHAR, *(MPI_Comm *)c->mpi_node);
    if (rc != MPI_SUCCESS && st == TSR_OK) {
        char s[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, s, &len);
        st = tsr_error_set(TSR_ERR_MPI, "MPI_Allgather of the GPU ids: %s", s);
    }
    for (int r = 0; r < c->local_rank && r < n && st == TSR_OK; r++)
        if (mine[0] && strncmp(all + (size_t)r * ID, mine, ID) == 0)
            st = tsr_error_set(TSR_ERR_CUDA,
                               "local ranks %d and %d both use GPU %s; NCCL needs one GPU per "
                               "rank: start at most as many ranks per node as it has GPUs",
                               r, c->local_rank, mine);
    tsr_free(all);
    return st;
}

static tsr_status tsr__nccl_grp_init(tsr_comm *c, tsr__comm_grp *g, const char *what) {
    /* The id travels with a flag, so that a failed ncclGetUniqueId still releases the
     * group's MPI_Bcast; then the world agrees before anyone enters ncclCommInitRank. */
    struct {
        int32_t ok;
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    tsr_status st = TSR_OK;
    if (g->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        if (r == ncclSuccess) msg.ok = 1;
        else st = tsr_error_set(TSR_ERR_NCCL, "ncclGetUniqueId (%s group): %s", what,
                                ncclGetErrorString(r));
    }
    int rc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, *(MPI_Comm *)g->mpi);
    if (st == TSR_OK && rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, s, &len);
        st = tsr_error_set(TSR_ERR_MPI, "MPI_Bcast of the NCCL id (%s group): %s", what, s);
    } else if (st == TSR_OK && !msg.ok) {
        st = tsr_error_set(TSR_ERR_NCCL, "%s group: its rank 0 could not make an NCCL id", what);
    }
    if (st == TSR_OK) {
        cudaError_t e = cudaSetDevice(c->device);
        if (e != cudaSuccess)
            st = tsr_error_set(TSR_ERR_CUDA, "cudaSetDevice(%d): %s", c->device,
                               cudaGetErrorString(e));
    }
    TSR_TRY(tsr_comm_agree(c, st));
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, g->size, msg.id, g->rank);
    if (r != ncclSuccess) {
        tsr_error_set(TSR_ERR_NCCL, "ncclCommInitRank (%s group, rank %d of %d, GPU %d): %s",
                      what, g->rank, g->size, c->device, ncclGetErrorString(r));
        tsr_comm_abort(c, 1, tsr_last_error());
    }
    g->nccl = comm;
    return TSR_OK;
}

static void tsr__nccl_grp_free(tsr_comm *c, tsr__comm_grp *g) {
    if (!g->nccl) return;
    /* NCCL's teardown: finalize (completes the operations still queued), then destroy. The
     * stream is not synchronized: it may belong to a backend destroyed before us. */
    if (c->device >= 0) (void)cudaSetDevice(c->device);
    (void)ncclCommFinalize(tsr__nc(g));
    (void)ncclCommDestroy(tsr__nc(g));
    g->nccl = NULL;
}

static tsr_status tsr__nccl_allreduce_sum_f32(tsr_comm *c, tsr__comm_grp *g, const float *in,
                                            float *out, size_t n) {
    TSR__NCCL_TRY(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, tsr__nc(g), tsr__stream(c)),
                  "ncclAllReduce");
    return TSR_OK;
}

static tsr_status tsr__nccl_allgather(tsr_comm *c, tsr__comm_grp *g, const void *send,
                                    size_t bytes, void *recv) {
    TSR__NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, tsr__nc(g), tsr__stream(c)),
                  "ncclAllGather");
    return TSR_OK;
}

static tsr_status tsr__nccl_send(tsr_comm *c, tsr__comm_grp *g, const void *buf, size_t bytes,
                               int peer, bool wait) {
    TSR__NCCL_TRY(ncclSend(buf, bytes, ncclUint8, peer, tsr__nc(g), tsr__stream(c)), "ncclSend");
    return wait ? tsr__nccl_sync(c) : TSR_OK;
}

static tsr_status tsr__nccl_recv(tsr_comm *c, tsr__comm_grp *g, void *buf, size_t bytes,
                               int peer, bool wait) {
    TSR__NCCL_TRY(ncclRecv(buf, bytes, ncclUint8, peer, tsr__nc(g), tsr__stream(c)), "ncclRecv");
    return wait ? tsr__nccl_sync(c) : TSR_OK;
}

/* NCCL's point-to-point in one group call: every pair's transfer may progress at once. */
static tsr_status tsr__nccl_alltoallv(tsr_comm *c, tsr__comm_grp *g, const void *send,
                                    const size_t *send_bytes, const size_t *send_off,
                                    void *recv, const size_t *recv_bytes,
                                    const size_t *recv_off) {
    TSR__NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g->size; r++) {
        if (send_bytes[r]) {
            ncclResult_t e = ncclSend((const char *)send + send_off[r], send_bytes[r], ncclUint8,
                                      r, tsr__nc(g), tsr__stream(c));
            if (e != ncclSuccess) {
                (void)ncclGroupEnd();
                return tsr_error_set(TSR_ERR_NCCL, "ncclSend: %s", ncclGetErrorString(e));
            }
        }
        if (recv_bytes[r]) {
            ncclResult_t e = ncclRecv((char *)recv + recv_off[r], recv_bytes[r], ncclUint8, r,
                                      tsr__nc(g), tsr__stream(c));
            if (e != ncclSuccess) {
                (void)ncclGroupEnd();
                return tsr_error_set(TSR_ERR_NCCL, "ncclRecv: %s", ncclGetErrorString(e));
            }
        }
    }
    TSR__NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return TSR_OK;
}

static tsr_status tsr__nccl_sync(tsr_comm *c) {
    TSR__CUDA_TRY(cudaStreamSynchronize(tsr__stream(c)), "cudaStreamSynchronize");
    return TSR_OK;
}

static tsr_status tsr__nccl_copy(tsr_comm *c, void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return TSR_OK;
    TSR__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tsr__stream(c)),
                  "cudaMemcpyAsync");
    return TSR_OK;
}

/* kernels/cuda/module.c puts it in the module's table. */
extern const struct tsr_comm_nccl_ops tsr__comm_nccl_module_ops;
const struct tsr_comm_nccl_ops tsr__comm_nccl_module_ops = {
    .comm_size = (uint32_t)sizeof(struct tsr_comm),
    .setup = tsr__nccl_setup,
    .grp_init = tsr__nccl_grp_init,
    .grp_free = tsr__nccl_grp_free,
    .allreduce_sum_f32 = tsr__nccl_allreduce_sum_f32,
    .allgather = tsr__nccl_allgather,
    .send = tsr__nccl_send,
    .recv = tsr__nccl_recv,
    .sync = tsr__nccl_sync,
    .alltoallv = tsr__nccl_alltoallv,
    .copy = tsr__nccl_copy,
};

#else
/* ISO C wants at least one declaration in a translation unit. */
typedef int tsr__comm_nccl_unused;
#endif
