/* The entry point of libtessera-cuda.so: the table kernels/backend.c reads after dlopen
 * (kernels/backend.h, "the module ABI"). The only symbol the loader looks up. */
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"

/* The same condition under which comm/comm_nccl.c defines the table. */
#if defined(TSR_HAVE_NCCL) && defined(TSR_HAVE_MPI)
extern const struct tsr_comm_nccl_ops tsr__comm_nccl_module_ops; /* comm/comm_nccl.c */
#define TSR__MODULE_NCCL (&tsr__comm_nccl_module_ops)
#else
#define TSR__MODULE_NCCL NULL
#endif

static const tsr_backend_module tsr__cuda_module = {
    .abi = TSR_BACKEND_MODULE_ABI,
    .ops_size = (uint32_t)sizeof(tsr_backend_ops),
    .backend_size = (uint32_t)sizeof(tsr_backend),
    .name = "cuda",
    .probe = tsr__cuda_probe,
    .busid = tsr__cuda_busid,
    .device_info = tsr__cuda_device_info,
    .create = tsr__cuda_create,
    .nccl = TSR__MODULE_NCCL,
};

const tsr_backend_module *tsr_backend_module_entry(void);
const tsr_backend_module *tsr_backend_module_entry(void) { return &tsr__cuda_module; }
