/* The CUDA backend's calls for its module table (module.c); nothing outside kernels/cuda
 * includes this: the runtime reaches the backend through the registry (kernels/backend.h). */
#ifndef TSR_KERNELS_CUDA_BACKEND_CUDA_H
#define TSR_KERNELS_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "kernels/backend.h"

/* The visible GPUs, classified (no driver, no GPU, other failure) with the runtime's words. */
tsr_gpu_probe tsr__cuda_probe(int *count, char *detail, size_t cap);
/* The PCI bus id of a GPU ("0000:65:00.0"); -1 when unknown. */
int tsr__cuda_busid(int device, char *buf, size_t cap);
/* A GPU's name and total memory. */
tsr_status tsr__cuda_device_info(int device, char *name, size_t cap, size_t *memory_bytes);
/* A backend on GPU `device` (current on the calling thread from now on). */
tsr_status tsr__cuda_create(int device, tsr_backend **out);

#endif
