/* CUDA backend extras beyond the tsr_backend_ops vtable: moving weights and activations
 * between host and device. Only meaningful in builds with TSR_HAVE_CUDA.
 *
 * Pointer contract of the CUDA ops: activations, weight tensor data (tensor.data), the
 * k/v/pos arrays of tsr_kv_span, key_scores and outputs are device pointers (from the
 * backend's buffer_alloc or tsr_backend_cuda_upload). The tsr_attn_args struct, its spans
 * array and the model config are host memory. Integer inputs (embed ids, rope positions,
 * attention q_pos) may be host or device memory: host arrays are staged to the device.
 * Ops are asynchronous on the backend's stream; synchronize() waits for them. */
#ifndef TSR_KERNELS_CUDA_BACKEND_CUDA_H
#define TSR_KERNELS_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "kernels/backend.h"

/* Copies a host tensor to device memory: *dev becomes the same tensor with data on the
 * device. Free dev->data with be->ops->buffer_free(be, (void *)dev->data). */
tsr_status tsr_backend_cuda_upload(tsr_backend *be, const tsr_tensor *host, tsr_tensor *dev);

/* Synchronous copies, ordered after the work already queued on the backend's stream. */
tsr_status tsr_backend_cuda_set(tsr_backend *be, void *dev_dst, const void *host_src, size_t bytes);
tsr_status tsr_backend_cuda_get(tsr_backend *be, void *host_dst, const void *dev_src, size_t bytes);

/* The cudaStream_t every op of `be` is queued on, so that NCCL orders its collectives with
 * the kernels (tsr_comm_enable_nccl); NULL when be is not a CUDA backend. */
void *tsr_backend_cuda_stream(const tsr_backend *be);

/* The device's name ("NVIDIA H100 80GB HBM3"), for logs and benchmarks. */
const char *tsr_backend_cuda_device_name(const tsr_backend *be);

/* Pin hooks for tsr_host_pool_set_pinning: cudaHostRegister (portable: all devices) and
 * cudaHostUnregister of a host buffer, so host<->device copies from it can be asynchronous.
 * ctx is unused (pass the backend or NULL). */
tsr_status tsr_backend_cuda_host_register(void *ctx, void *ptr, size_t bytes);
void tsr_backend_cuda_host_unregister(void *ctx, void *ptr);

#endif
