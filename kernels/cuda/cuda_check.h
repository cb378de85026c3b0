/* Error translation for the CUDA backend's host code: a failed CUDA runtime or cuBLAS call
 * becomes a tsr_status with one error line naming the call and the library's own string.
 * Like NCCL's checks.h inside the library, these return; nothing here exits or prints. */
#ifndef TSR_KERNELS_CUDA_CUDA_CHECK_H
#define TSR_KERNELS_CUDA_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "base/status.h"

/* cuBLAS status name (cublasGetStatusString exists only from 11.4 on; keep one place). */
static inline const char *tsr__cublas_str(cublasStatus_t s) {
    return cublasGetStatusString(s);
}

/* Returns TSR_ERR_CUDA from the enclosing function when `call` fails. */
#define TSR_CUDA_TRY(call)                                                                         \
    do {                                                                                           \
        cudaError_t tsr__ce = (call);                                                              \
        if (tsr__ce != cudaSuccess) {                                                              \
            (void)cudaGetLastError(); /* clear a non-sticky error for later calls */               \
            return tsr_error_set(TSR_ERR_CUDA, "cuda: %s: %s (%s)", #call,                         \
                                 cudaGetErrorString(tsr__ce), cudaGetErrorName(tsr__ce));          \
        }                                                                                          \
    } while (0)

/* Sets `st` and jumps to `label` when `call` fails (one cleanup path per function). */
#define TSR_CUDA_TRY_GOTO(call, st, label)                                                         \
    do {                                                                                           \
        cudaError_t tsr__ce = (call);                                                              \
        if (tsr__ce != cudaSuccess) {                                                              \
            (void)cudaGetLastError();                                                              \
            (st) = tsr_error_set(TSR_ERR_CUDA, "cuda: %s: %s (%s)", #call,                         \
                                 cudaGetErrorString(tsr__ce), cudaGetErrorName(tsr__ce));          \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Returns TSR_ERR_CUBLAS from the enclosing function when `call` fails. */
#define TSR_CUBLAS_TRY(call)                                                                       \
    do {                                                                                           \
        cublasStatus_t tsr__bs = (call);                                                           \
        if (tsr__bs != CUBLAS_STATUS_SUCCESS)                                                      \
            return tsr_error_set(TSR_ERR_CUBLAS, "cublas: %s: %s", #call,                          \
                                 tsr__cublas_str(tsr__bs));                                        \
    } while (0)

#define TSR_CUBLAS_TRY_GOTO(call, st, label)                                                       \
    do {                                                                                           \
        cublasStatus_t tsr__bs = (call);                                                           \
        if (tsr__bs != CUBLAS_STATUS_SUCCESS) {                                                    \
            (st) =                                                                                 \
                tsr_error_set(TSR_ERR_CUBLAS, "cublas: %s: %s", #call, tsr__cublas_str(tsr__bs));  \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#endif
