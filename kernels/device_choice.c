#include "kernels/device_choice.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

tsr_status tsr_gpu_for_local_rank(int local_rank, int gpus, bool share, int *device) {
    *device = -1;
    if (gpus <= 0) return TSR_OK;
    if (local_rank < 0)
        return tsr_error_set(TSR_ERR_INVALID, "device choice: local rank %d", local_rank);
    if (local_rank >= gpus && !share)
        return tsr_error_set(TSR_ERR_INVALID,
                             "local rank %d would share one of this node's %d GPU%s: start at "
                             "most %d rank%s per node (or set TSR_GPU_SHARE=1 to share GPUs "
                             "round robin)",
                             local_rank, gpus, gpus == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
    *device = local_rank % gpus;
    return TSR_OK;
}

/* A non-negative decimal integer that fits an int, else -1. */
static int tsr__nonneg(const char *s) {
    if (!s || !*s) return -1;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > INT_MAX || s[0] == '-' || s[0] == '+' || s[0] == ' ') return -1;
    return (int)v;
}

int tsr_local_rank_env(char *(*get)(const char *name)) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = get(vars[i]);
        if (v && *v) return tsr__nonneg(v);
    }
    return -1;
}

int tsr_local_rank_pick(int mpi_local_rank, int world, int env_local_rank) {
    if (world > 1) return mpi_local_rank > 0 ? mpi_local_rank : 0;
    return env_local_rank > 0 ? env_local_rank : 0;
}

bool tsr_gpu_share_env(char *(*get)(const char *name)) {
    const char *v = get("TSR_GPU_SHARE");
    return v && strcmp(v, "1") == 0;
}
