/* The NCCL data plane: one NCCL communicator per group, bootstrapped the way NCCL's own
 * examples do it (ncclGetUniqueId on group rank 0, MPI_Bcast of the id over the group's MPI
 * communicator, ncclCommInitRank), with every op ordered on the backend's stream. Compiled
 * to nothing unless the build has both NCCL (TSR_HAVE_NCCL, cmake/TesseraCuda.cmake) and MPI:
 * the id needs MPI to travel. */
#include "comm/comm_impl.h"

#ifdef TSR__COMM_NCCL

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <string.h>

static cudaStream_t tsr__stream(tsr_comm *c) { return (cudaStream_t)c->stream; }
static ncclComm_t tsr__nc(const tsr__comm_grp *g) { return (ncclComm_t)g->nccl; }

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

/* Chooses the device (the local rank unless told) and checks it exists: a node with more
 * ranks than GPUs is a launch mistake, said plainly. */
tsr_status tsr__comm_nccl_setup(tsr_comm *c) {
    int n_dev = 0;
    TSR__CUDA_TRY(cudaGetDeviceCount(&n_dev), "cudaGetDeviceCount");
    if (c->device < 0) c->device = c->local_rank;
    if (c->device >= n_dev)
        return tsr_error_set(TSR_ERR_CUDA, "rank %d (local rank %d) wants GPU %d, but this node "
                             "has %d; start at most %d ranks per node", c->world_rank,
                             c->local_rank, c->device, n_dev, n_dev);
    TSR__CUDA_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    return TSR_OK;
}

tsr_status tsr__comm_nccl_grp_init(tsr_comm *c, tsr__comm_grp *g, const char *what) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (g->rank == 0) TSR__NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, *(MPI_Comm *)g->mpi);
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, s, &len);
        return tsr_error_set(TSR_ERR_MPI, "MPI_Bcast of the NCCL id (%s): %s", what, s);
    }
    TSR__CUDA_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    ncclComm_t comm;
    TSR__NCCL_TRY(ncclCommInitRank(&comm, g->size, id, g->rank), "ncclCommInitRank");
    g->nccl = comm;
    return TSR_OK;
}

void tsr__comm_nccl_grp_free(tsr_comm *c, tsr__comm_grp *g) {
    if (!g->nccl) return;
    /* NCCL's teardown: drain the stream, finalize (flushes outstanding ops), destroy. */
    (void)cudaStreamSynchronize(tsr__stream(c));
    (void)ncclCommFinalize(tsr__nc(g));
    (void)ncclCommDestroy(tsr__nc(g));
    g->nccl = NULL;
}

tsr_status tsr__comm_nccl_allreduce_sum_f32(tsr_comm *c, tsr__comm_grp *g, const float *in,
                                            float *out, size_t n) {
    TSR__NCCL_TRY(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, tsr__nc(g), tsr__stream(c)),
                  "ncclAllReduce");
    return TSR_OK;
}

tsr_status tsr__comm_nccl_allgather(tsr_comm *c, tsr__comm_grp *g, const void *send,
                                    size_t bytes, void *recv) {
    TSR__NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, tsr__nc(g), tsr__stream(c)),
                  "ncclAllGather");
    return TSR_OK;
}

tsr_status tsr__comm_nccl_send(tsr_comm *c, tsr__comm_grp *g, const void *buf, size_t bytes,
                               int peer, bool wait) {
    TSR__NCCL_TRY(ncclSend(buf, bytes, ncclUint8, peer, tsr__nc(g), tsr__stream(c)), "ncclSend");
    return wait ? tsr__comm_nccl_sync(c) : TSR_OK;
}

tsr_status tsr__comm_nccl_recv(tsr_comm *c, tsr__comm_grp *g, void *buf, size_t bytes,
                               int peer, bool wait) {
    TSR__NCCL_TRY(ncclRecv(buf, bytes, ncclUint8, peer, tsr__nc(g), tsr__stream(c)), "ncclRecv");
    return wait ? tsr__comm_nccl_sync(c) : TSR_OK;
}

tsr_status tsr__comm_nccl_sync(tsr_comm *c) {
    TSR__CUDA_TRY(cudaStreamSynchronize(tsr__stream(c)), "cudaStreamSynchronize");
    return TSR_OK;
}

tsr_status tsr__comm_nccl_copy(tsr_comm *c, void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return TSR_OK;
    TSR__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tsr__stream(c)),
                  "cudaMemcpyAsync");
    return TSR_OK;
}

#else
/* ISO C wants at least one declaration in a translation unit. */
typedef int tsr__comm_nccl_unused;
#endif
