/* CUDA backend, host side: device and stream setup, cuBLAS GEMMs, buffers, staging of host
 * integer arrays, and the vtable. Kernels live in ops.cu and attn.cu (launch.h). One device
 * per backend; the calling thread's current device is set at create. */
#include "kernels/cuda/backend_cuda.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/rope_freq.h"
#include "base/alloc.h"

/* A device scratch buffer that grows (stream order makes reuse across calls safe). */
typedef struct tsr__cuda_scratch {
    void *ptr;
    size_t cap;
} tsr__cuda_scratch;

typedef struct tsr__cuda_ctx {
    int device;
    char name[256];
    cudaStream_t stream;
    cublasHandle_t blas;
    tsr__cuda_scratch xconv; /* x converted to the weight dtype for BF16/F16 GEMMs */
    tsr__cuda_scratch part;  /* matmul_parts sum mode: the part being added */
    tsr__cuda_scratch ints;  /* host integer arrays (ids, positions) staged to the device */
    tsr__cuda_scratch spans; /* tsr__cuda_span array of the current attention call */
    tsr__cuda_span *host_spans;
    int host_spans_cap;
    int *bad_id; /* device flag set by the embed kernel */
    /* rope: inverse frequencies of the last config seen, on the device */
    float *inv_freq;
    float *inv_freq_host;
    int inv_hd;
    float inv_key[5];
    int inv_scaling;
    int inv_orig;
} tsr__cuda_ctx;

static tsr__cuda_ctx *tsr__ctx(tsr_backend *be) {
    return (tsr__cuda_ctx *)be->ctx;
}

static tsr_status tsr__scratch_reserve(tsr__cuda_scratch *s, size_t bytes, cudaStream_t st) {
    if (bytes <= s->cap) return TSR_OK;
    if (s->ptr) {
        /* queued kernels may still read the old buffer */
        TSR_CUDA_TRY(cudaStreamSynchronize(st));
        (void)cudaFree(s->ptr);
        s->ptr = NULL;
        s->cap = 0;
    }
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
    TSR_CUDA_TRY(cudaMalloc(&s->ptr, cap));
    s->cap = cap;
    return TSR_OK;
}

/* The device address of p when the device can read it (device, managed or mapped pinned
 * memory), else NULL. */
static const void *tsr__device_view(const void *p) {
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    if (at.type == cudaMemoryTypeUnregistered) return NULL;
    return at.devicePointer;
}

/* A device pointer holding the n int32 values of p: p itself when the device can read it,
 * else a staged copy (valid for work queued after this call, until the next staging). */
static tsr_status tsr__stage_i32(tsr__cuda_ctx *c, const int32_t *p, int64_t n, const int32_t **out,
                                 bool *staged) {
    const void *dv = tsr__device_view(p);
    *staged = dv == NULL;
    if (dv) {
        *out = dv;
        return TSR_OK;
    }
    TSR_TRY(tsr__scratch_reserve(&c->ints, (size_t)n * sizeof(int32_t), c->stream));
    TSR_CUDA_TRY(cudaMemcpyAsync(c->ints.ptr, p, (size_t)n * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, c->stream));
    *out = c->ints.ptr;
    return TSR_OK;
}

/* ---- buffers and sync ---- */

static tsr_status tsr__cuda_buffer_alloc(tsr_backend *be, size_t bytes, void **out) {
    (void)be;
    *out = NULL;
    cudaError_t ce = cudaMalloc(out, bytes ? bytes : 1);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return tsr_error_set(TSR_ERR_NOMEM, "cuda: cudaMalloc of %zu bytes: %s", bytes,
                             cudaGetErrorString(ce));
    }
    return TSR_OK;
}

static void tsr__cuda_buffer_free(tsr_backend *be, void *ptr) {
    (void)be;
    if (ptr) (void)cudaFree(ptr);
}

/* Any direction (device, pinned or pageable host), ordered on the backend's stream. */
static tsr_status tsr__cuda_copy(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return TSR_OK;
    TSR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, tsr__ctx(be)->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_synchronize(tsr_backend *be) {
    TSR_CUDA_TRY(cudaStreamSynchronize(tsr__ctx(be)->stream));
    return TSR_OK;
}

/* ---- GEMM ---- */

/* y[n][rows] = x[n][cols] . w^T. cuBLAS is column-major: the row-major w is a cols x rows
 * column-major matrix, so y^T = op_T(w) * x^T with lda = ldb = cols, ldc = rows. F32
 * weights use an FP32 GEMM (no TF32, to stay near the CPU); BF16/F16 weights take x
 * rounded to the weight type and accumulate in FP32 (CUBLAS_COMPUTE_32F), output FP32. */
static tsr_status tsr__cuda_matmul(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                                   float *y) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    if (n > INT_MAX || w->rows > INT_MAX || w->cols > INT_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cuda matmul: %lld x %lld weight with %lld rows exceeds int range",
                             (long long)w->rows, (long long)w->cols, (long long)n);
    const float one = 1.0f, zero = 0.0f;
    const void *b = x;
    cudaDataType_t t = CUDA_R_32F;
    if (w->dtype == TSR_BF16 || w->dtype == TSR_F16) {
        t = w->dtype == TSR_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        size_t elems = (size_t)n * (size_t)w->cols;
        TSR_TRY(tsr__scratch_reserve(&c->xconv, elems * 2, c->stream));
        TSR_CUDA_TRY(tsr__cuda_launch_convert_f32(c->xconv.ptr, (int)w->dtype, x, (int64_t)elems,
                                                  c->stream));
        b = c->xconv.ptr;
    } else if (w->dtype != TSR_F32) {
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda matmul: weight dtype %d", (int)w->dtype);
    }
    TSR_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n,
                                (int)w->cols, &one, w->data, t, (int)w->cols, b, t, (int)w->cols,
                                &zero, y, CUDA_R_32F, (int)w->rows, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    return TSR_OK;
}

/* Row-parallel products over column segments (kernels/backend.h; seg is host memory). Per
 * part one GEMM on the strided segment: A = w + seg[p] and B = x + seg[p] (x rounded to
 * the weight type first for BF16/F16, as in matmul) with lda = ldb = cols, k = the
 * segment length, FP32 accumulation. sum: part 0 goes to y, each later part to a scratch
 * that the add kernel adds to y, so y = ((P0 + P1) + P2) + ... in part order, the
 * arithmetic of tsr__comm_self_sum_parts. Stream order keeps the scratch reuse safe. A
 * part's bits come from cuBLAS's kernel for (rows, n, len); cuBLAS may choose kernels by
 * pointer alignment and leading dimension too, so bitwise equality with a column slice of
 * w (another tp) is expected but unverified on a GPU. */
static tsr_status tsr__cuda_matmul_parts(tsr_backend *be, const float *x, int64_t n,
                                         const tsr_tensor *w, const int32_t *seg, int n_parts,
                                         bool sum, float *y) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n < 0 || n_parts < 1 || !seg || w->rows <= 0 || w->cols < 0)
        return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: bad shape (n=%lld, %d parts)",
                             (long long)n, n_parts);
    if (n > INT_MAX || w->rows > INT_MAX || w->cols > INT_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cuda matmul_parts: %lld x %lld weight with %lld rows exceeds int "
                             "range", (long long)w->rows, (long long)w->cols, (long long)n);
    if (seg[0] < 0 || seg[n_parts] > w->cols)
        return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: segments [%d, %d) outside "
                             "%lld columns", (int)seg[0], (int)seg[n_parts], (long long)w->cols);
    for (int p = 0; p < n_parts; p++)
        if (seg[p + 1] < seg[p])
            return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: segment %d decreases "
                                 "(%d > %d)", p, (int)seg[p], (int)seg[p + 1]);
    if (n == 0) return TSR_OK;
    const float one = 1.0f, zero = 0.0f;
    const void *b = x;
    size_t es = 4;
    cudaDataType_t t = CUDA_R_32F;
    if (w->dtype == TSR_BF16 || w->dtype == TSR_F16) {
        t = w->dtype == TSR_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        es = 2;
        size_t elems = (size_t)n * (size_t)w->cols;
        if (elems) {
            TSR_TRY(tsr__scratch_reserve(&c->xconv, elems * 2, c->stream));
            TSR_CUDA_TRY(tsr__cuda_launch_convert_f32(c->xconv.ptr, (int)w->dtype, x,
                                                      (int64_t)elems, c->stream));
            b = c->xconv.ptr;
        }
    } else if (w->dtype != TSR_F32) {
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda matmul_parts: weight dtype %d",
                             (int)w->dtype);
    }
    size_t m = (size_t)n * (size_t)w->rows; /* floats of one part */
    float *tmp = NULL;
    if (sum && n_parts > 1) {
        TSR_TRY(tsr__scratch_reserve(&c->part, m * sizeof(float), c->stream));
        tmp = c->part.ptr;
    }
    for (int p = 0; p < n_parts; p++) {
        int len = seg[p + 1] - seg[p];
        float *dst = !sum ? y + (size_t)p * m : p == 0 ? y : tmp;
        if (len == 0) {
            TSR_CUDA_TRY(cudaMemsetAsync(dst, 0, m * sizeof(float), c->stream));
        } else {
            const char *a = (const char *)w->data + (size_t)seg[p] * es;
            const char *bp = (const char *)b + (size_t)seg[p] * es;
            TSR_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n,
                                        len, &one, a, t, (int)w->cols, bp, t, (int)w->cols,
                                        &zero, dst, CUDA_R_32F, (int)w->rows,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        if (sum && p > 0)
            TSR_CUDA_TRY(tsr__cuda_launch_add(y, tmp, (int64_t)m, c->stream));
    }
    return TSR_OK;
}

/* ---- fused ops ---- */

static tsr_status tsr__cuda_rmsnorm(tsr_backend *be, const float *x, const tsr_tensor *w, int64_t n,
                                    int dim, float eps, float *out) {
    if (w->rows * w->cols < dim)
        return tsr_error_set(TSR_ERR_INVALID, "cuda rmsnorm: weight has %lld values, dim %d",
                             (long long)(w->rows * w->cols), dim);
    TSR_CUDA_TRY(tsr__cuda_launch_rmsnorm(x, w->data, (int)w->dtype, n, dim, eps, out,
                                          tsr__ctx(be)->stream));
    return TSR_OK;
}

/* Keeps the device table of inverse frequencies in step with cfg. */
static tsr_status tsr__rope_table(tsr__cuda_ctx *c, const tsr_model_config *cfg) {
    const float key[5] = {cfg->rope_theta, cfg->rope_factor, cfg->rope_low_freq_factor,
                          cfg->rope_high_freq_factor, 0.0f};
    if (c->inv_freq && c->inv_hd == cfg->head_dim && c->inv_scaling == (int)cfg->rope_scaling &&
        c->inv_orig == cfg->rope_original_max_pos && !memcmp(c->inv_key, key, sizeof key))
        return TSR_OK;
    if (c->inv_freq && c->inv_hd < cfg->head_dim) {
        TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
        (void)cudaFree(c->inv_freq);
        tsr_free(c->inv_freq_host);
        c->inv_freq = NULL;
        c->inv_freq_host = NULL;
    }
    if (!c->inv_freq) {
        c->inv_freq_host = tsr_malloc((size_t)cfg->head_dim / 2 * sizeof(float));
        if (!c->inv_freq_host) return TSR_ERR_NOMEM;
        TSR_CUDA_TRY(cudaMalloc((void **)&c->inv_freq, (size_t)cfg->head_dim / 2 * sizeof(float)));
    } else {
        /* the previous table may still be read by queued rope kernels */
        TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
    }
    /* the CPU backend's table, bit for bit: at large positions one ulp of a frequency moves
     * the angle visibly, so both backends start from the same numbers (rope_freq.c) */
    tsr_rope_inv_freq(cfg, c->inv_freq_host);
    TSR_CUDA_TRY(cudaMemcpy(c->inv_freq, c->inv_freq_host,
                            (size_t)cfg->head_dim / 2 * sizeof(float), cudaMemcpyHostToDevice));
    c->inv_hd = cfg->head_dim;
    c->inv_scaling = (int)cfg->rope_scaling;
    c->inv_orig = cfg->rope_original_max_pos;
    memcpy(c->inv_key, key, sizeof key);
    return TSR_OK;
}

static tsr_status tsr__cuda_rope(tsr_backend *be, float *x, const int32_t *pos, int64_t n,
                                 int n_heads, const tsr_model_config *cfg) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2)
        return tsr_error_set(TSR_ERR_INVALID, "cuda rope: head_dim %d must be even and > 0",
                             cfg->head_dim);
    if (cfg->rope_scaling == TSR_ROPE_LLAMA3 &&
        (cfg->rope_factor <= 0 || cfg->rope_original_max_pos <= 0 ||
         cfg->rope_high_freq_factor == cfg->rope_low_freq_factor))
        return tsr_error_set(TSR_ERR_INVALID, "cuda rope: bad llama3 scaling parameters");
    TSR_TRY(tsr__rope_table(c, cfg));
    const int32_t *dpos;
    bool staged;
    TSR_TRY(tsr__stage_i32(c, pos, n, &dpos, &staged));
    TSR_CUDA_TRY(tsr__cuda_launch_rope(x, dpos, n, n_heads, cfg->head_dim, c->inv_freq,
                                       cfg->rope_interleaved ? 1 : 0, c->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_swiglu(tsr_backend *be, float *gate, const float *up, int64_t n) {
    TSR_CUDA_TRY(tsr__cuda_launch_swiglu(gate, up, n, tsr__ctx(be)->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_add(tsr_backend *be, float *x, const float *y, int64_t n) {
    TSR_CUDA_TRY(tsr__cuda_launch_add(x, y, n, tsr__ctx(be)->stream));
    return TSR_OK;
}

static tsr_status tsr__cuda_embed(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids,
                                  int64_t n, float *out) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (n <= 0) return TSR_OK;
    const int32_t *dids;
    bool staged;
    TSR_TRY(tsr__stage_i32(c, ids, n, &dids, &staged));
    if (staged) { /* host ids: check them here, no round trip */
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= emb->rows)
                return tsr_error_set(TSR_ERR_INVALID, "embed: token id %d out of range [0, %lld)",
                                     (int)ids[i], (long long)emb->rows);
    }
    TSR_CUDA_TRY(tsr__cuda_launch_embed(emb->data, (int)emb->dtype, emb->rows, emb->cols, dids, n,
                                        out, c->bad_id, c->stream));
    if (!staged) { /* device ids: the kernel flags bad ones; read the flag back */
        int bad = 0;
        TSR_CUDA_TRY(
            cudaMemcpyAsync(&bad, c->bad_id, sizeof bad, cudaMemcpyDeviceToHost, c->stream));
        TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
        if (bad) {
            TSR_CUDA_TRY(cudaMemsetAsync(c->bad_id, 0, sizeof(int), c->stream));
            return tsr_error_set(TSR_ERR_INVALID, "embed: a token id is out of range [0, %lld)",
                                 (long long)emb->rows);
        }
    }
    return TSR_OK;
}

static tsr_status tsr__cuda_attention(tsr_backend *be, const tsr_attn_args *a) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (a->n_q <= 0) return TSR_OK;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim > TSR__CUDA_MAX_HEAD_DIM || a->n_heads > 65535 || a->n_spans < 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cuda attention: heads %d, kv heads %d, head_dim %d (max %d)",
                             a->n_heads, a->n_kv_heads, a->head_dim, TSR__CUDA_MAX_HEAD_DIM);
    if (a->n_spans > c->host_spans_cap) {
        tsr_free(c->host_spans);
        c->host_spans_cap = 0;
        c->host_spans = tsr_malloc((size_t)a->n_spans * sizeof *c->host_spans);
        if (!c->host_spans) return TSR_ERR_NOMEM;
        c->host_spans_cap = a->n_spans;
    }
    int64_t keys = 0;
    int monotone = 1;
    for (int s = 0; s < a->n_spans; s++) {
        const tsr_kv_span *sp = &a->spans[s];
        c->host_spans[s] = (tsr__cuda_span){.k = sp->k,
                                            .v = sp->v,
                                            .pos = sp->pos,
                                            .stride = sp->stride,
                                            .key_off = keys,
                                            .pos0 = sp->pos0,
                                            .n = sp->n};
        if (sp->pos ||
            (s > 0 && (int64_t)sp->pos0 < (int64_t)a->spans[s - 1].pos0 + a->spans[s - 1].n))
            monotone = 0;
        keys += sp->n;
    }
    tsr__cuda_attn k = {.q = a->q,
                        .n_q = a->n_q,
                        .n_spans = a->n_spans,
                        .n_keys = keys,
                        .monotone = monotone,
                        .n_heads = a->n_heads,
                        .n_kv_heads = a->n_kv_heads,
                        .head_dim = a->head_dim,
                        .scale = 1.0f / sqrtf((float)a->head_dim),
                        .out = a->out,
                        .key_scores = a->key_scores};
    if (a->n_spans > 0) {
        size_t bytes = (size_t)a->n_spans * sizeof(tsr__cuda_span);
        TSR_TRY(tsr__scratch_reserve(&c->spans, bytes, c->stream));
        TSR_CUDA_TRY(
            cudaMemcpyAsync(c->spans.ptr, c->host_spans, bytes, cudaMemcpyHostToDevice, c->stream));
        k.spans = c->spans.ptr;
    }
    bool staged;
    TSR_TRY(tsr__stage_i32(c, a->q_pos, a->n_q, &k.q_pos, &staged));
    TSR_CUDA_TRY(tsr__cuda_launch_attention(&k, c->stream));
    return TSR_OK;
}

/* ---- lifecycle ---- */

static void tsr__cuda_destroy(tsr_backend *be) {
    if (!be) return;
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (c) {
        if (c->stream) (void)cudaStreamSynchronize(c->stream);
        if (c->blas) (void)cublasDestroy(c->blas);
        if (c->xconv.ptr) (void)cudaFree(c->xconv.ptr);
        if (c->part.ptr) (void)cudaFree(c->part.ptr);
        if (c->ints.ptr) (void)cudaFree(c->ints.ptr);
        if (c->spans.ptr) (void)cudaFree(c->spans.ptr);
        if (c->bad_id) (void)cudaFree(c->bad_id);
        if (c->inv_freq) (void)cudaFree(c->inv_freq);
        if (c->stream) (void)cudaStreamDestroy(c->stream);
        tsr_free(c->inv_freq_host);
        tsr_free(c->host_spans);
        tsr_free(c);
    }
    tsr_free(be);
}

static const tsr_backend_ops tsr__cuda_ops = {
    .name = "cuda",
    .destroy = tsr__cuda_destroy,
    .buffer_alloc = tsr__cuda_buffer_alloc,
    .buffer_free = tsr__cuda_buffer_free,
    .synchronize = tsr__cuda_synchronize,
    .matmul = tsr__cuda_matmul,
    .rmsnorm = tsr__cuda_rmsnorm,
    .rope = tsr__cuda_rope,
    .swiglu = tsr__cuda_swiglu,
    .add = tsr__cuda_add,
    .embed = tsr__cuda_embed,
    .attention = tsr__cuda_attention,
    .matmul_parts = tsr__cuda_matmul_parts,
    .copy = tsr__cuda_copy,
};

int tsr_backend_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

int tsr_backend_cuda_busid(int device, char *buf, size_t cap) {
    if (cap == 0) return -1;
    buf[0] = 0;
    if (cudaDeviceGetPCIBusId(buf, (int)cap, device) != cudaSuccess) {
        (void)cudaGetLastError();
        buf[0] = 0;
        return -1;
    }
    return 0;
}

tsr_status tsr_backend_cuda_create(int device, tsr_backend **out) {
    *out = NULL;
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return tsr_error_set(TSR_ERR_CUDA, "cuda device %d: no CUDA device answers (%s)", device,
                             ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    }
    if (device < 0 || device >= count)
        return tsr_error_set(TSR_ERR_CUDA, "cuda device %d: out of range (%d devices visible)",
                             device, count);
    tsr_status st = TSR_OK;
    tsr_backend *be = tsr_calloc(1, sizeof *be);
    tsr__cuda_ctx *c = tsr_calloc(1, sizeof *c);
    if (!be || !c) {
        tsr_free(be);
        tsr_free(c);
        return TSR_ERR_NOMEM;
    }
    be->ops = &tsr__cuda_ops;
    be->ctx = c;
    be->device = device;
    be->threads = 1;
    c->device = device;
    TSR_CUDA_TRY_GOTO(cudaSetDevice(device), st, fail);
    struct cudaDeviceProp prop;
    TSR_CUDA_TRY_GOTO(cudaGetDeviceProperties(&prop, device), st, fail);
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    TSR_CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), st, fail);
    TSR_CUBLAS_TRY_GOTO(cublasCreate(&c->blas), st, fail);
    TSR_CUBLAS_TRY_GOTO(cublasSetStream(c->blas, c->stream), st, fail);
    TSR_CUDA_TRY_GOTO(cudaMalloc((void **)&c->bad_id, sizeof(int)), st, fail);
    TSR_CUDA_TRY_GOTO(cudaMemsetAsync(c->bad_id, 0, sizeof(int), c->stream), st, fail);
    *out = be;
    return TSR_OK;
fail:
    tsr__cuda_destroy(be);
    return st;
}

tsr_status tsr_backend_cuda_upload(tsr_backend *be, const tsr_tensor *host, tsr_tensor *dev) {
    size_t bytes = tsr_tensor_bytes(host);
    void *p = NULL;
    TSR_TRY(tsr__cuda_buffer_alloc(be, bytes, &p));
    tsr_status st = tsr_backend_cuda_set(be, p, host->data, bytes);
    if (st != TSR_OK) {
        tsr__cuda_buffer_free(be, p);
        return st;
    }
    *dev = *host;
    dev->data = p;
    return TSR_OK;
}

tsr_status tsr_backend_cuda_set(tsr_backend *be, void *dev_dst, const void *host_src,
                                size_t bytes) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (!bytes) return TSR_OK;
    TSR_CUDA_TRY(cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream));
    TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return TSR_OK;
}

tsr_status tsr_backend_cuda_get(tsr_backend *be, void *host_dst, const void *dev_src,
                                size_t bytes) {
    tsr__cuda_ctx *c = tsr__ctx(be);
    if (!bytes) return TSR_OK;
    TSR_CUDA_TRY(cudaMemcpyAsync(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, c->stream));
    TSR_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return TSR_OK;
}

void *tsr_backend_cuda_stream(const tsr_backend *be) {
    if (!be || be->ops != &tsr__cuda_ops || !be->ctx) return NULL;
    return (void *)((const tsr__cuda_ctx *)be->ctx)->stream;
}

const char *tsr_backend_cuda_device_name(const tsr_backend *be) {
    return ((const tsr__cuda_ctx *)be->ctx)->name;
}

/* ---- page-locking host memory (host pool pin hooks) ---------------------------------- */

/* Portable: the pinning holds for every device, so the hook needs no backend (ctx unused;
 * the host pool passes what it was given). */
tsr_status tsr_backend_cuda_host_register(void *ctx, void *ptr, size_t bytes) {
    (void)ctx;
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tsr_error_set(TSR_ERR_CUDA, "cuda: cudaHostRegister(%zu bytes): %s (%s)", bytes,
                             cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return TSR_OK;
}

void tsr_backend_cuda_host_unregister(void *ctx, void *ptr) {
    (void)ctx;
    /* Nothing to report at free time: an unregistered pointer is harmless to free. */
    if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}
