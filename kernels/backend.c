#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/device_choice.h"

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
    bool gpu_wanted = !name || !strcmp(name, "auto") || !strcmp(name, "cuda");
    int gpus = gpu_wanted ? tsr_backend_gpu_count() : 0;
    int dev = 0;
    if (gpus > 0) /* more ranks than GPUs on the node: an error unless TSR_GPU_SHARE=1 */
        TSR_TRY(tsr_gpu_for_local_rank(local_rank, gpus, tsr_gpu_share_env(getenv), &dev));
    (void)dev;
    if (!name || !strcmp(name, "auto")) {
#ifdef TSR_HAVE_CUDA
        if (gpus > 0 && tsr_backend_cuda_create(dev, out) == TSR_OK) return TSR_OK;
#endif
        return tsr_backend_cpu_create(threads, out);
    }
    if (!strcmp(name, "cpu")) return tsr_backend_cpu_create(threads, out);
    if (!strcmp(name, "cpu-fenced")) return tsr_backend_fenced_create(threads, 0, out);
    if (!strcmp(name, "cuda")) {
#ifdef TSR_HAVE_CUDA
        return tsr_backend_cuda_create(dev, out);
#else
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "backend 'cuda': this build has no CUDA (configure with "
                             "-DTESSERA_CUDA=ON)");
#endif
    }
    return tsr_error_set(TSR_ERR_INVALID,
                         "unknown backend '%s' (expected auto, cpu, cpu-fenced or cuda)", name);
}

void tsr_backend_destroy(tsr_backend *be) {
    if (be) be->ops->destroy(be);
}

tsr_status tsr_backend_copy(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->copy(be, dst, src, bytes);
}

tsr_status tsr_backend_upload(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->upload(be, dst, src, bytes, NULL);
}

tsr_status tsr_backend_download(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->download(be, dst, src, bytes, NULL);
}

tsr_status tsr_backend_place_tensor(tsr_backend *be, const tsr_tensor *host, tsr_tensor *dev,
                                    bool *copied) {
    *dev = *host;
    *copied = false;
    if (be->host_memory || !host->data) return TSR_OK;
    size_t bytes = tsr_tensor_bytes(host);
    void *p = NULL;
    TSR_TRY(be->ops->buffer_alloc(be, bytes, &p));
    tsr_status st = tsr_backend_upload(be, p, host->data, bytes);
    if (st != TSR_OK) {
        be->ops->buffer_free(be, p);
        return st;
    }
    dev->data = p;
    *copied = true;
    return TSR_OK;
}
