/* The backend registry: the built-in CPU backends, the GPU backend loaded from its module,
 * and `auto`. See kernels/backend.h for the contract and the module ABI. */
#include "kernels/backend.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/module.h"
#include "base/sys.h"
#include "comm/comm.h"
#include "kernels/device_choice.h"

/* The file of the CUDA module (cmake/TesseraCuda.cmake names it the same). */
#define TSR__CUDA_MODULE "libtessera-cuda.so"

/* `auto` takes the first GPU entry that runs, else "cpu". */
static const tsr_backend_info tsr__backends[] = {
    {"cpu", "the host's cores, OpenBLAS", TSR_BACKEND_CAP_HOST_MEMORY, NULL},
    {"cpu-fenced", "the CPU kernels on memory host code may not touch (tests)",
     TSR_BACKEND_CAP_FENCED, NULL},
    {"cuda", "NVIDIA GPU (the CUDA module, " TSR__CUDA_MODULE ")",
     TSR_BACKEND_CAP_GPU | TSR_BACKEND_CAP_MODULE, TSR__CUDA_MODULE},
};
enum { TSR__N_BACKENDS = (int)(sizeof tsr__backends / sizeof tsr__backends[0]) };

const tsr_backend_info *tsr_backend_info_at(int i) {
    return i >= 0 && i < TSR__N_BACKENDS ? &tsr__backends[i] : NULL;
}

const tsr_backend_info *tsr_backend_find(const char *name) {
    for (int i = 0; name && i < TSR__N_BACKENDS; i++)
        if (!strcmp(tsr__backends[i].name, name)) return &tsr__backends[i];
    return NULL;
}

const char *tsr_backend_names(void) {
    /* Built once from the table: "auto, " then the names, the last after "or". Start-up is
     * single-threaded (option tables are built before any worker exists). */
    static char buf[256];
    if (!buf[0]) {
        size_t at = (size_t)snprintf(buf, sizeof buf, "auto");
        for (int i = 0; i < TSR__N_BACKENDS && at < sizeof buf; i++)
            at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%s",
                                   i + 1 == TSR__N_BACKENDS ? " or " : ", ",
                                   tsr__backends[i].name);
    }
    return buf;
}

/* --- modules ---------------------------------------------------------------------------- */

/* One module's state for the process: tried at most once (a module is never unloaded: the
 * CUDA libraries it pulls in do not support it), the failure kept as its line. */
typedef struct tsr__module_slot {
    const tsr_backend_info *info;
    bool tried;
    tsr_status st;
    const tsr_backend_module *mod;
    char path[PATH_MAX];
    char err[768];
} tsr__module_slot;

static tsr__module_slot tsr__slots[TSR__N_BACKENDS];

static tsr_status tsr__slot_fail(tsr__module_slot *s, tsr_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tsr_status tsr__slot_fail(tsr__module_slot *s, tsr_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    s->st = st;
    return st;
}

static tsr_status tsr__module_open(tsr__module_slot *s) {
    const tsr_backend_info *b = s->info;
    char looked[1024];
    if (!tsr_module_find(b->module, s->path, sizeof s->path, looked, sizeof looked))
        return tsr__slot_fail(s, TSR_ERR_UNSUPPORTED,
                              "backend '%s': its module %s is not installed (looked in %s): "
                              "use a tessera built with -DTESSERA_CUDA=ON, set TSR_MODULE_DIR "
                              "to the module's directory, or run with --backend cpu",
                              b->name, b->module, looked);
    /* RTLD_NOW: a missing library or symbol is this error, never a crash mid-run. */
    void *h = dlopen(s->path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return tsr__slot_fail(s, TSR_ERR_UNSUPPORTED,
                              "backend '%s': cannot load %s (%s): the CUDA libraries it needs "
                              "are out of reach; load the site's CUDA module or add its lib "
                              "directory to LD_LIBRARY_PATH, or run with --backend cpu",
                              b->name, s->path, why ? why : "?");
    }
    tsr_backend_module_entry_fn entry = (tsr_backend_module_entry_fn)dlsym(h, TSR_BACKEND_MODULE_ENTRY);
    const tsr_backend_module *m = entry ? entry() : NULL;
    if (!m || m->abi != TSR_BACKEND_MODULE_ABI || m->ops_size != sizeof(tsr_backend_ops) ||
        m->backend_size != sizeof(tsr_backend) || !m->name || strcmp(m->name, b->name)) {
        tsr__slot_fail(s, TSR_ERR_UNSUPPORTED,
                       "backend '%s': %s is not a module of this tessera build (%s%u, this "
                       "binary's %u): install the module built with this binary",
                       b->name, s->path, m ? "module ABI " : "no entry point, ABI ",
                       m ? m->abi : 0u, (unsigned)TSR_BACKEND_MODULE_ABI);
        dlclose(h);
        return s->st;
    }
    if (m->nccl && tsr_comm_provide_nccl(m->nccl) != TSR_OK) {
        tsr__slot_fail(s, TSR_ERR_UNSUPPORTED, "backend '%s': %s: %s", b->name, s->path,
                       tsr_last_error());
        dlclose(h);
        return s->st;
    }
    s->mod = m;
    TSR_LOG_DEBUG("backend %s: module %s", b->name, s->path);
    return TSR_OK;
}

/* The module of a registry entry, loaded on first use; the failure as the last error. */
static tsr_status tsr__module(const tsr_backend_info *b, const tsr_backend_module **out) {
    *out = NULL;
    tsr__module_slot *s = &tsr__slots[b - tsr__backends];
    if (!s->tried) {
        s->tried = true;
        s->info = b;
        s->st = TSR_OK;
        (void)tsr__module_open(s);
    }
    if (s->st != TSR_OK) return tsr_error_set(s->st, "%s", s->err);
    *out = s->mod;
    return TSR_OK;
}

/* Whether an NVIDIA kernel driver is on this node, from its device and proc files: what
 * `auto` and the GPU count look at before loading anything, so that a CPU node or a CPU
 * run never maps the CUDA libraries. */
static bool tsr__nvidia_driver_present(void) {
    return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
}

/* The GPUs of a module backend: the module loaded and probed. Errors are the one line a
 * user sees for --backend NAME. */
static tsr_status tsr__gpu_probe(const tsr_backend_info *b, const tsr_backend_module **mod,
                                 int *count) {
    *count = 0;
    TSR_TRY(tsr__module(b, mod));
    char detail[256] = "";
    tsr_gpu_probe p = (*mod)->probe(count, detail, sizeof detail);
    switch (p) {
    case TSR_GPU_PRESENT:
        if (*count > 0) return TSR_OK;
        /* fall through */
    case TSR_GPU_NO_DEVICE:
        return tsr_error_set(TSR_ERR_CUDA,
                             "backend '%s': the NVIDIA driver sees no GPU on this node%s%s%s: "
                             "run on a GPU node (check CUDA_VISIBLE_DEVICES and the job's GPU "
                             "request), or run with --backend cpu",
                             b->name, detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
    case TSR_GPU_NO_DRIVER:
        return tsr_error_set(TSR_ERR_CUDA,
                             "backend '%s': no usable NVIDIA driver on this node (%s): run on "
                             "a GPU node with a driver at least as new as the CUDA runtime, "
                             "or run with --backend cpu",
                             b->name, detail[0] ? detail : "none found");
    case TSR_GPU_FAILED:
    default:
        return tsr_error_set(TSR_ERR_CUDA, "backend '%s': the CUDA runtime cannot start (%s): "
                             "check the node's driver and GPUs (nvidia-smi), or run with "
                             "--backend cpu", b->name, detail[0] ? detail : "?");
    }
}

/* The first GPU backend of the table, for `auto` and the GPU count. */
static const tsr_backend_info *tsr__gpu_backend(void) {
    for (int i = 0; i < TSR__N_BACKENDS; i++)
        if (tsr__backends[i].caps & TSR_BACKEND_CAP_GPU) return &tsr__backends[i];
    return NULL;
}

int tsr_backend_gpu_count(void) {
    const tsr_backend_info *b = tsr__gpu_backend();
    if (!b || !tsr__nvidia_driver_present()) return 0;
    const tsr_backend_module *m = NULL;
    int n = 0;
    if (tsr__gpu_probe(b, &m, &n) != TSR_OK) return 0;
    return n;
}

int tsr_backend_gpu_busid(int device, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    const tsr_backend_info *b = tsr__gpu_backend();
    const tsr_backend_module *m = NULL;
    int n = 0;
    if (!b || !tsr__nvidia_driver_present() || tsr__gpu_probe(b, &m, &n) != TSR_OK) return -1;
    return m->busid(device, buf, cap);
}

/* A built-in backend by registry entry. */
static tsr_status tsr__create_builtin(const tsr_backend_info *b, int threads,
                                      tsr_backend **out) {
    if (b->caps & TSR_BACKEND_CAP_FENCED) return tsr_backend_fenced_create(threads, 0, out);
    return tsr_backend_cpu_create(threads, out);
}

/* A module backend on the GPU of this local rank. */
static tsr_status tsr__create_gpu(const tsr_backend_info *b, int local_rank, tsr_backend **out) {
    const tsr_backend_module *m = NULL;
    int gpus = 0, dev = 0;
    TSR_TRY(tsr__gpu_probe(b, &m, &gpus));
    /* more ranks than GPUs on the node: an error unless TSR_GPU_SHARE=1 */
    TSR_TRY(tsr_gpu_for_local_rank(local_rank, gpus, tsr_gpu_share_env(getenv), &dev));
    return m->create(dev, out);
}

/* auto: the GPU backend when the node has a driver, its module loads and a GPU answers;
 * else the CPU, with the reason at info level (--verbose). */
static tsr_status tsr__create_auto(int threads, int local_rank, tsr_backend **out) {
    const tsr_backend_info *g = tsr__gpu_backend();
    if (g && !tsr__nvidia_driver_present()) {
        TSR_LOG_INFO("backend auto: cpu (no NVIDIA driver on this node)");
    } else if (g) {
        tsr_status st = tsr__create_gpu(g, local_rank, out);
        if (st == TSR_OK) return TSR_OK;
        /* More ranks than GPUs stays an error: silently running some ranks on the CPU
         * would split the job between two kinds of backend. */
        if (st == TSR_ERR_INVALID) return st;
        TSR_LOG_INFO("backend auto: cpu (%s)", tsr_last_error());
    }
    return tsr_backend_cpu_create(threads, out);
}

tsr_status tsr_backend_create(const char *name, int threads, tsr_backend **out) {
    return tsr_backend_create_local(name, threads, 0, out);
}

tsr_status tsr_backend_create_local(const char *name, int threads, int local_rank,
                                    tsr_backend **out) {
    *out = NULL;
    if (!name || !strcmp(name, "auto")) return tsr__create_auto(threads, local_rank, out);
    const tsr_backend_info *b = tsr_backend_find(name);
    if (!b)
        return tsr_error_set(TSR_ERR_INVALID, "unknown backend '%s' (expected %s)", name,
                             tsr_backend_names());
    if (b->caps & TSR_BACKEND_CAP_MODULE) return tsr__create_gpu(b, local_rank, out);
    return tsr__create_builtin(b, threads, out);
}

tsr_status tsr_backend_devices(const char *name, tsr_device_info *out, int cap, int *n) {
    *n = 0;
    const tsr_backend_info *b = tsr_backend_find(name);
    if (!b)
        return tsr_error_set(TSR_ERR_INVALID, "unknown backend '%s' (expected %s)",
                             name ? name : "(none)", tsr_backend_names());
    if (!(b->caps & TSR_BACKEND_CAP_MODULE)) {
        if (cap > 0) {
            memset(&out[0], 0, sizeof out[0]);
            out[0].backend = b->name;
            out[0].index = -1;
            snprintf(out[0].name, sizeof out[0].name, "host");
            int64_t total = tsr_sys_mem_total();
            out[0].memory_bytes = total > 0 ? (size_t)total : 0;
        }
        *n = 1;
        return TSR_OK;
    }
    const tsr_backend_module *m = NULL;
    int gpus = 0;
    TSR_TRY(tsr__gpu_probe(b, &m, &gpus));
    for (int i = 0; i < gpus && i < cap; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].backend = b->name;
        out[i].index = i;
        TSR_TRY(m->device_info(i, out[i].name, sizeof out[i].name, &out[i].memory_bytes));
    }
    *n = gpus;
    return TSR_OK;
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
    if (be->ops->place_tensor) return be->ops->place_tensor(be, host, dev, copied);
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
