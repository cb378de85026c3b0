/* Compute backends behind one vtable (the ggml-backend idea, reduced to what the forward
 * pass needs). The CPU backend is always built; the CUDA backend registers when
 * TESSERA_CUDA is on and a device answers. Activation pointers passed to ops live in
 * memory from that backend's buffer_alloc. Row-major throughout. */
#ifndef TSR_KERNELS_BACKEND_H
#define TSR_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/model_config.h"
#include "base/tensor.h"

typedef struct tsr_backend tsr_backend;

/* A run of cached keys/values for one layer: row i of k/v (kv_dim floats, `stride`
 * floats apart) holds the token at position pos ? pos[i] : pos0 + i. */
typedef struct tsr_kv_span {
    const float *k;
    const float *v;
    const int32_t *pos; /* NULL: contiguous from pos0 */
    int32_t pos0;
    int32_t n;
    int64_t stride;
} tsr_kv_span;

/* Attention geometry for one call: n_q query rows of n_heads*head_dim, GQA groups. */
typedef struct tsr_attn_args {
    const float *q;        /* [n_q][n_heads*head_dim], already rotated */
    const int32_t *q_pos;  /* [n_q] position of each query (causal mask: key pos <= q pos) */
    int n_q;
    const tsr_kv_span *spans;
    int n_spans;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    float *out;            /* [n_q][n_heads*head_dim] */
    /* Optional: per query head, per key (span order, concatenated) sum over the queries of
     * the softmax probability: [n_heads][total keys]. Added to, never materializing the
     * n_q x n_k matrix. NULL: not wanted. Per query head, not per kv head, so that a
     * consumer can add heads in one global order whatever the tensor-parallel split (a
     * replicated kv head's query group is spread over ranks). */
    float *key_scores;
} tsr_attn_args;

typedef struct tsr_backend_ops {
    const char *name;
    void (*destroy)(tsr_backend *be);
    /* Buffers for activations. */
    tsr_status (*buffer_alloc)(tsr_backend *be, size_t bytes, void **out);
    void (*buffer_free)(tsr_backend *be, void *ptr);
    tsr_status (*synchronize)(tsr_backend *be);
    /* y[n][w.rows] = x[n][w.cols] . w^T */
    tsr_status (*matmul)(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                         float *y);
    /* out[i] = x[i] / rms(x[i]) * w, for n rows of `dim` (out may equal x) */
    tsr_status (*rmsnorm)(tsr_backend *be, const float *x, const tsr_tensor *w, int64_t n,
                          int dim, float eps, float *out);
    /* In-place rotary embedding of n rows of n_heads x head_dim at positions pos[]. */
    tsr_status (*rope)(tsr_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads,
                       const tsr_model_config *cfg);
    /* gate[i] = silu(gate[i]) * up[i] for n elements */
    tsr_status (*swiglu)(tsr_backend *be, float *gate, const float *up, int64_t n);
    /* x[i] += y[i] */
    tsr_status (*add)(tsr_backend *be, float *x, const float *y, int64_t n);
    /* out[i] = emb[ids[i]] (converted to f32) */
    tsr_status (*embed)(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids, int64_t n,
                        float *out);
    tsr_status (*attention)(tsr_backend *be, const tsr_attn_args *a);
    /* Row-parallel products over column segments (tensor parallelism, runtime/parallel.h).
     * Segment p is columns [seg[p], seg[p+1]) of w and of x (x is [n][w.cols]; seg has
     * n_parts + 1 increasing entries within [0, w.cols]); P_p[n][w.rows] = x[:, seg_p] .
     * w[:, seg_p]^T. With `sum`, y[n][w.rows] = ((P_0 + P_1) + P_2) + ... in part order;
     * otherwise y holds the parts, [n_parts][n][w.rows]. Each P_p depends only on the
     * values and the length of its segment and on n, never on where the segment lies in w
     * or on w.rows, so a slice of w gives the same bits for its parts, and summing the
     * parts in order gives the bits of `sum`. Optional: NULL when the backend lacks it. */
    tsr_status (*matmul_parts)(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                               const int32_t *seg, int n_parts, bool sum, float *y);
    /* Optional (NULL: memcpy, host memory): copy between this backend's buffers. */
    tsr_status (*copy)(tsr_backend *be, void *dst, const void *src, size_t bytes);
} tsr_backend_ops;

/* Copies bytes between buffers of `be` (memcpy when the backend has no copy op). */
tsr_status tsr_backend_copy(tsr_backend *be, void *dst, const void *src, size_t bytes);

struct tsr_backend {
    const tsr_backend_ops *ops;
    void *ctx;
    int device;   /* GPU index, -1 for the CPU */
    int threads;  /* CPU threads used by kernels */
};

/* Creates a backend by name: "cpu", "cuda" or "auto" (CUDA when built and a device
 * answers, else the CPU). */
tsr_status tsr_backend_create(const char *name, int threads, tsr_backend **out);
/* The same for one rank of a node: a CUDA backend takes GPU local_rank % (visible GPUs), so
 * the ranks of a node spread over its GPUs. */
tsr_status tsr_backend_create_local(const char *name, int threads, int local_rank,
                                    tsr_backend **out);
/* GPUs this process sees (0 without CUDA), and the PCI bus id ("0000:65:00.0") of one, for
 * NUMA placement; returns -1 when unknown. */
int tsr_backend_gpu_count(void);
int tsr_backend_gpu_busid(int device, char *buf, size_t cap);
void tsr_backend_destroy(tsr_backend *be);

tsr_status tsr_backend_cpu_create(int threads, tsr_backend **out);
#ifdef TSR_HAVE_CUDA
tsr_status tsr_backend_cuda_create(int device, tsr_backend **out);
int tsr_backend_cuda_device_count(void);
int tsr_backend_cuda_busid(int device, char *buf, size_t cap);
#endif

#endif
