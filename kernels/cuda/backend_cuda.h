/* CUDA backend extras beyond the tsr_backend_ops vtable. Only meaningful in builds with
 * TSR_HAVE_CUDA.
 *
 * Pointer contract of the CUDA ops: the one of kernels/backend.h. Backend memory (from
 * buffer_alloc: device memory) holds activations, weight tensor data (tensor.data), the
 * k/v rows of tsr_kv_span and the KV layouts, key_scores and outputs. Host memory holds the
 * metadata: the tsr_attn_args struct, its spans array, span positions (tsr_kv_span.pos),
 * query positions, rope positions, embed ids, slot lists and the model config; the backend
 * stages them to the device, and the caller may reuse them as soon as the call returns
 * (pinned metadata included). Device arrays passed where host metadata is expected are
 * still used in place, for older callers. Ops, copy and memset are queued on the backend's
 * compute stream; upload/download/kv_gather/kv_scatter with stream NULL wait for their
 * bytes, synchronize() waits for everything. */
#ifndef TSR_KERNELS_CUDA_BACKEND_CUDA_H
#define TSR_KERNELS_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "kernels/backend.h"

/* Synchronous copies, ordered after the work already queued on the backend's stream: the
 * vtable's upload/download with stream NULL. Only tests/unit/test_backend_ops.c still calls
 * these; they go once it uses be->ops->upload/download. */
tsr_status tsr_backend_cuda_set(tsr_backend *be, void *dev_dst, const void *host_src, size_t bytes);
tsr_status tsr_backend_cuda_get(tsr_backend *be, void *host_dst, const void *dev_src, size_t bytes);

/* The cudaStream_t every op of `be` is queued on, so that NCCL orders its collectives with
 * the kernels (tsr_comm_enable_nccl); NULL when be is not a CUDA backend. The vtable's
 * stream_handle gives the same; this goes once runtime/forward.c and jobs/dist_cli.c use
 * that. */
void *tsr_backend_cuda_stream(const tsr_backend *be);

/* The device's name ("NVIDIA H100 80GB HBM3"), for logs and benchmarks: the vtable's
 * device_name (tests/unit/test_backend_ops.c still calls this one). */
const char *tsr_backend_cuda_device_name(const tsr_backend *be);

/* Pin hooks for tsr_host_pool_set_pinning: cudaHostRegister (portable: all devices) and
 * cudaHostUnregister of a host buffer, so host<->device copies from it can be asynchronous.
 * ctx is unused (pass the backend or NULL). The vtable's host_register/host_unregister do
 * the same; these go once jobs/dist_cli.c uses those. */
tsr_status tsr_backend_cuda_host_register(void *ctx, void *ptr, size_t bytes);
void tsr_backend_cuda_host_unregister(void *ctx, void *ptr);

#endif
