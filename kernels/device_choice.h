/* Which GPU a rank uses: pure functions of the node-local rank and the visible GPU count,
 * so that the choice is unit-tested without a GPU (tests/unit/test_device_choice.c). */
#ifndef TSR_KERNELS_DEVICE_CHOICE_H
#define TSR_KERNELS_DEVICE_CHOICE_H

#include <stdbool.h>

#include "base/status.h"

/* The GPU of node-local rank local_rank when `gpus` are visible: local_rank % gpus. A rank
 * at or past the GPU count (more ranks on the node than GPUs) is TSR_ERR_INVALID with one
 * line saying so, unless `share` (TSR_GPU_SHARE=1): then ranks share GPUs round robin.
 * gpus <= 0: *device = -1 (no GPU; not an error). */
tsr_status tsr_gpu_for_local_rank(int local_rank, int gpus, bool share, int *device);
/* The node-local rank a launcher put in the environment, read through get (getenv):
 * OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun), SLURM_LOCALID (srun), MPI_LOCALRANKID
 * (MPICH's Hydra), the first set one; -1 when none holds a non-negative integer. */
int tsr_local_rank_env(char *(*get)(const char *name));
/* The local rank a process uses: MPI's (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), the comm
 * layer) when the job has several ranks; alone (world 1: no MPI world, e.g. srun -n 4 of
 * independent processes) the launcher's env_local_rank when >= 0; else 0. */
int tsr_local_rank_pick(int mpi_local_rank, int world, int env_local_rank);
/* TSR_GPU_SHARE read through get: "1" allows more ranks than GPUs on a node. */
bool tsr_gpu_share_env(char *(*get)(const char *name));

#endif
