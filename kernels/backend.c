#include "kernels/backend.h"

#include <string.h>

tsr_status tsr_backend_create(const char *name, int threads, tsr_backend **out) {
    return tsr_backend_create_local(name, threads, 0, out);
}

int tsr_backend_gpu_count(void) {
#ifdef TSR_HAVE_CUDA
    return tsr_backend_cuda_device_count();
#else
    return 0;
#endif
}

int tsr_backend_gpu_busid(int device, char *buf, size_t cap) {
#ifdef TSR_HAVE_CUDA
    return tsr_backend_cuda_busid(device, buf, cap);
#else
    (void)device;
    if (cap) buf[0] = 0;
    return -1;
#endif
}

tsr_status tsr_backend_create_local(const char *name, int threads, int local_rank,
                                    tsr_backend **out) {
    *out = NULL;
    int gpus = tsr_backend_gpu_count();
    int dev = gpus > 0 && local_rank > 0 ? local_rank % gpus : 0;
    (void)dev;
    if (!name || !strcmp(name, "auto")) {
#ifdef TSR_HAVE_CUDA
        if (gpus > 0 && tsr_backend_cuda_create(dev, out) == TSR_OK) return TSR_OK;
#endif
        return tsr_backend_cpu_create(threads, out);
    }
    if (!strcmp(name, "cpu")) return tsr_backend_cpu_create(threads, out);
    if (!strcmp(name, "cuda")) {
#ifdef TSR_HAVE_CUDA
        return tsr_backend_cuda_create(dev, out);
#else
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "backend 'cuda': this build has no CUDA (configure with "
                             "-DTESSERA_CUDA=ON)");
#endif
    }
    return tsr_error_set(TSR_ERR_INVALID, "unknown backend '%s' (expected auto, cpu or cuda)",
                         name);
}

void tsr_backend_destroy(tsr_backend *be) {
    if (be) be->ops->destroy(be);
}

tsr_status tsr_backend_copy(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    if (be->ops->copy) return be->ops->copy(be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return TSR_OK;
}
