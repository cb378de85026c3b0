/* Quantized weights on the CUDA backend, host side (kernels/cuda/quant_gemm.h). */
#include "kernels/cuda/quant_gemm.h"

#include <cublasLt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant_launch.h"

/* cuBLASLt's workspace for the FP8 GEMMs (NVIDIA's samples use 32 MiB on Hopper). */
#define TSR__LT_WORKSPACE ((size_t)32 << 20)
/* Bytes of one bf16 weight tile of the fallback GEMM. */
#define TSR__TILE_BYTES ((size_t)64 << 20)

typedef struct tsr__qbuf {
    void *ptr;
    size_t cap;
} tsr__qbuf;

struct tsr__cuda_quant {
    int cc;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    bool lt_fp8;       /* FP8 tensor cores (sm_89+) and not turned off */
    bool warned_arch;  /* the fallback's warning was given */
    float *one;        /* device 1.0f: the A and B scale pointers */
    void *workspace;   /* TSR__LT_WORKSPACE bytes, on first use */
    tsr__qbuf x8, xs, xb, tile, part, sum;
};

/* Grows a device scratch (queued kernels may still read the old one: wait first). Graph
 * capture needs no growth: a step's first, plain run settles the sizes (backend_cuda.c). */
static tsr_status tsr__qbuf_reserve(tsr__cuda_quant *q, tsr__qbuf *b, size_t bytes) {
    if (bytes <= b->cap) return TSR_OK;
    if (b->ptr) {
        TSR_CUDA_TRY(cudaStreamSynchronize(q->stream));
        (void)cudaFree(b->ptr);
        b->ptr = NULL;
        b->cap = 0;
    }
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
    TSR_CUDA_TRY(cudaMalloc(&b->ptr, cap));
    b->cap = cap;
    return TSR_OK;
}

static void tsr__qbuf_free(tsr__qbuf *b) {
    if (b->ptr) (void)cudaFree(b->ptr);
    b->ptr = NULL;
    b->cap = 0;
}

tsr_status tsr__cuda_quant_create(int cc, cudaStream_t stream, cublasHandle_t blas,
                                  tsr__cuda_quant **out) {
    *out = NULL;
    tsr__cuda_quant *q = tsr_calloc(1, sizeof *q);
    if (!q) return TSR_ERR_NOMEM;
    q->cc = cc;
    q->stream = stream;
    q->blas = blas;
    const char *env = getenv("TSR_CUDA_FP8_GEMM");
    q->lt_fp8 = cc >= 89 && !(env && !strcmp(env, "0"));
    tsr_status st = TSR_OK;
    cublasStatus_t ls = cublasLtCreate(&q->lt);
    if (ls != CUBLAS_STATUS_SUCCESS) {
        st = tsr_error_set(TSR_ERR_CUBLAS, "cublasLt: cublasLtCreate: %s",
                           cublasGetStatusString(ls));
        q->lt = NULL;
        goto fail;
    }
    const float one = 1.0f;
    TSR_CUDA_TRY_GOTO(cudaMalloc((void **)&q->one, sizeof one), st, fail);
    TSR_CUDA_TRY_GOTO(cudaMemcpy(q->one, &one, sizeof one, cudaMemcpyHostToDevice), st, fail);
    *out = q;
    return TSR_OK;
fail:
    tsr__cuda_quant_destroy(q);
    return st;
}

void tsr__cuda_quant_destroy(tsr__cuda_quant *q) {
    if (!q) return;
    if (q->lt) (void)cublasLtDestroy(q->lt);
    if (q->one) (void)cudaFree(q->one);
    if (q->workspace) (void)cudaFree(q->workspace);
    tsr__qbuf *bufs[] = {&q->x8, &q->xs, &q->xb, &q->tile, &q->part, &q->sum};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tsr__qbuf_free(bufs[i]);
    (void)cudaGetLastError();
    tsr_free(q);
}

bool tsr__cuda_quant_takes(tsr_dtype t) { return t == TSR_F8_E4M3 || t == TSR_Q8_0; }

tsr_status tsr__cuda_quant_device_copy(const tsr_tensor *host, void **buf, size_t *bytes) {
    *buf = NULL;
    *bytes = 0;
    if (host->dtype != TSR_Q8_0 || !host->data) return TSR_OK;
    size_t row = (size_t)(host->cols / TSR_Q8_BLOCK) * TSR_Q8_BLOCK_BYTES;
    size_t n = (size_t)host->rows * row;
    uint8_t *b = tsr_malloc(n ? n : 1);
    if (!b) return tsr_error_set(TSR_ERR_NOMEM, "cuda: out of memory unpacking a Q8_0 matrix");
    for (int64_t r = 0; r < host->rows; r++)
        tsr_q8_unpack_row(host->data, host->cols, r, b + (size_t)r * row);
    *buf = b;
    *bytes = n;
    return TSR_OK;
}

/* The GGML type id of a GGUF-block dtype, as quant.cu's kernels take it. Q4_0 and Q4_1
 * (TSR__GGML_Q4_0/1) have kernels too: they join here, in tsr__cuda_quant_takes and in
 * tsr__cuda_quant_device_copy (GGUF block rows) once base/dtype.h has them. */
static int tsr__ggml_type(tsr_dtype t) {
    return t == TSR_Q8_0 ? TSR__GGML_Q8_0 : -1;
}

static const float *tsr__wscale(const tsr_tensor *w) {
    return (const float *)((const char *)w->data + tsr_fp8_scale_offset(w->rows, w->cols));
}

/* cuBLASLt FP8: y[n][rows] (ldy rows) from x quantized per token. *done false when
 * cuBLASLt offers no algorithm for the shape (the caller falls back). */
static tsr_status tsr__lt_fp8(tsr__cuda_quant *q, const float *x, int64_t n,
                              const tsr_tensor *w, int64_t k0, int64_t k, float *y,
                              bool *done) {
    *done = false;
    TSR_TRY(tsr__qbuf_reserve(q, &q->x8, (size_t)n * (size_t)k));
    TSR_TRY(tsr__qbuf_reserve(q, &q->xs, (size_t)n * sizeof(float)));
    if (!q->workspace) TSR_CUDA_TRY(cudaMalloc(&q->workspace, TSR__LT_WORKSPACE));
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    tsr_status st = TSR_OK;
    cublasStatus_t ls;
    const cublasOperation_t tn[2] = {CUBLAS_OP_T, CUBLAS_OP_N};
    size_t ws = TSR__LT_WORKSPACE;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    memset(&heur, 0, sizeof heur);
#define TSR__LT_STEP(call)                                                                 \
    do {                                                                                   \
        ls = (call);                                                                       \
        if (ls != CUBLAS_STATUS_SUCCESS) {                                                 \
            st = tsr_error_set(TSR_ERR_CUBLAS, "cublasLt: %s: %s", #call,                  \
                               cublasGetStatusString(ls));                                 \
            goto out;                                                                      \
        }                                                                                  \
    } while (0)
    TSR__LT_STEP(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    TSR__LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tn[0],
                                                sizeof tn[0]));
    TSR__LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tn[1],
                                                sizeof tn[1]));
    TSR__LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &q->one, sizeof q->one));
    TSR__LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &q->one, sizeof q->one));
    /* column-major views of the row-major matrices: W is k x rows (ld cols), op T;
     * x8 is k x n (ld k); y is rows x n (ld rows) */
    TSR__LT_STEP(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)w->rows,
                                            w->cols));
    TSR__LT_STEP(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k));
    TSR__LT_STEP(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)w->rows, (uint64_t)n,
                                            w->rows));
    TSR__LT_STEP(cublasLtMatmulPreferenceCreate(&pref));
    TSR__LT_STEP(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    ls = cublasLtMatmulAlgoGetHeuristic(q->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found);
    if (ls != CUBLAS_STATUS_SUCCESS || found < 1) goto out; /* not done: fall back */
    {
        cudaError_t ce = tsr__cuda_launch_x_fp8(x + k0, w->cols, n, k, q->x8.ptr, q->xs.ptr,
                                                q->stream);
        if (ce != cudaSuccess) {
            (void)cudaGetLastError();
            st = tsr_error_set(TSR_ERR_CUDA, "cuda: fp8 activations: %s",
                               cudaGetErrorString(ce));
            goto out;
        }
    }
    const float alpha = 1.0f, beta = 0.0f;
    TSR__LT_STEP(cublasLtMatmul(q->lt, desc, &alpha, (const uint8_t *)w->data + k0, la,
                                q->x8.ptr, lb, &beta, y, lc, y, lc, &heur.algo, q->workspace,
                                TSR__LT_WORKSPACE, q->stream));
    {
        cudaError_t ce = tsr__cuda_launch_scale_out(y, w->rows, n, w->rows, q->xs.ptr,
                                                    tsr__wscale(w), q->stream);
        if (ce != cudaSuccess) {
            (void)cudaGetLastError();
            st = tsr_error_set(TSR_ERR_CUDA, "cuda: fp8 scales: %s", cudaGetErrorString(ce));
            goto out;
        }
    }
    *done = true;
#undef TSR__LT_STEP
out:
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (lc) (void)cublasLtMatrixLayoutDestroy(lc);
    if (lb) (void)cublasLtMatrixLayoutDestroy(lb);
    if (la) (void)cublasLtMatrixLayoutDestroy(la);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
    return st;
}

/* The fallback GEMM: weight tiles dequantized to bf16, cuBLAS BF16 x BF16 -> F32. */
static tsr_status tsr__tiles(tsr__cuda_quant *q, const float *x, int64_t n, const tsr_tensor *w,
                             int64_t k0, int64_t k, float *y) {
    if (n > INT_MAX || k > INT_MAX || w->rows > INT_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda quantized matmul: %lld x %lld with %lld "
                             "rows exceeds int range", (long long)w->rows, (long long)k,
                             (long long)n);
    int64_t tr = (int64_t)(TSR__TILE_BYTES / ((size_t)k * 2));
    if (tr < 1) tr = 1;
    if (tr > w->rows) tr = w->rows;
    TSR_TRY(tsr__qbuf_reserve(q, &q->xb, (size_t)n * (size_t)k * 2));
    TSR_TRY(tsr__qbuf_reserve(q, &q->tile, (size_t)tr * (size_t)k * 2));
    TSR_CUDA_TRY(tsr__cuda_launch_x_bf16(x + k0, w->cols, n, k, q->xb.ptr, q->stream));
    int type = w->dtype == TSR_F8_E4M3 ? -1 : tsr__ggml_type(w->dtype);
    int64_t ld = w->dtype == TSR_F8_E4M3 ? w->cols : w->cols / 32;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < w->rows; r0 += tr) {
        int64_t nr = w->rows - r0 < tr ? w->rows - r0 : tr;
        TSR_CUDA_TRY(tsr__cuda_launch_dequant_bf16(w->data, type, ld, r0, nr, k0, k,
                                                   q->tile.ptr, q->stream));
        TSR_CUBLAS_TRY(cublasGemmEx(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n, (int)k,
                                    &one, q->tile.ptr, CUDA_R_16BF, (int)k, q->xb.ptr,
                                    CUDA_R_16BF, (int)k, &zero, y + r0, CUDA_R_32F,
                                    (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (w->dtype == TSR_F8_E4M3)
        TSR_CUDA_TRY(tsr__cuda_launch_scale_out(y, w->rows, n, w->rows, NULL, tsr__wscale(w),
                                                q->stream));
    return TSR_OK;
}

/* y[n][rows] = x[:, k0:k0+k] . w[:, k0:k0+k]^T (x rows cols apart, x at column 0). */
static tsr_status tsr__product(tsr__cuda_quant *q, const float *x, int64_t n,
                               const tsr_tensor *w, int64_t k0, int64_t k, float *y) {
    if (k == 0) {
        TSR_CUDA_TRY(cudaMemsetAsync(y, 0, (size_t)n * (size_t)w->rows * sizeof(float),
                                     q->stream));
        return TSR_OK;
    }
    if (n <= TSR__CUDA_GEMV_MAX_N) { /* decode: one pass over the weight bytes */
        const float *xw = x + k0;
        if (w->dtype == TSR_F8_E4M3)
            TSR_CUDA_TRY(tsr__cuda_launch_fp8_gemv(w->data, tsr__wscale(w), w->rows, w->cols,
                                                   k0, k, xw, w->cols, (int)n, y, w->rows,
                                                   q->stream));
        else
            TSR_CUDA_TRY(tsr__cuda_launch_gguf_gemv(tsr__ggml_type(w->dtype), w->data, w->rows,
                                                    w->cols / 32, k0, k, xw, w->cols, (int)n,
                                                    y, w->rows, q->stream));
        return TSR_OK;
    }
    if (w->dtype == TSR_F8_E4M3 && q->lt_fp8 && w->cols % 16 == 0 && k % 16 == 0 &&
        ((uintptr_t)((const uint8_t *)w->data + k0) & 15u) == 0) {
        bool done = false;
        TSR_TRY(tsr__lt_fp8(q, x, n, w, k0, k, y, &done));
        if (done) return TSR_OK;
        TSR_LOG_DEBUG("cuda: cuBLASLt has no FP8 algorithm for %lld x %lld x %lld: bf16 tiles",
                      (long long)w->rows, (long long)n, (long long)k);
    } else if (w->dtype == TSR_F8_E4M3 && q->cc < 89 && !q->warned_arch) {
        q->warned_arch = true;
        TSR_LOG_WARN("cuda: sm_%d has no FP8 tensor cores: FP8 prefill GEMMs dequantize weight "
                     "tiles to bf16 (decode GEMVs read FP8 as on sm_89+)", q->cc);
    }
    return tsr__tiles(q, x, n, w, k0, k, y);
}

tsr_status tsr__cuda_quant_parts(tsr__cuda_quant *q, const float *x, int64_t n,
                                 const tsr_tensor *w, const int32_t *seg, int n_parts, bool sum,
                                 bool acc, float *y) {
    if (!tsr__cuda_quant_takes(w->dtype))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda quantized matmul: weight dtype %s",
                             tsr_dtype_name(w->dtype));
    if (n <= 0) return TSR_OK;
    for (int p = 0; p < n_parts; p++)
        if (w->dtype == TSR_Q8_0 && (seg[p] % TSR_Q8_BLOCK || seg[p + 1] % TSR_Q8_BLOCK))
            return tsr_error_set(TSR_ERR_INVALID, "cuda matmul_parts: Q8_0 segment [%d, %d) "
                                 "not on 32-column blocks", (int)seg[p], (int)seg[p + 1]);
    size_t m = (size_t)n * (size_t)w->rows;
    if (!sum) {
        for (int p = 0; p < n_parts; p++)
            TSR_TRY(tsr__product(q, x, n, w, seg[p], seg[p + 1] - seg[p], y + (size_t)p * m));
        return TSR_OK;
    }
    /* ((P0 + P1) + P2) + ..., as tsr__comm_self_sum_parts; acc: then y += that sum */
    float *target = y;
    if (acc) {
        TSR_TRY(tsr__qbuf_reserve(q, &q->sum, m * sizeof(float)));
        target = q->sum.ptr;
    }
    TSR_TRY(tsr__product(q, x, n, w, seg[0], seg[1] - seg[0], target));
    if (n_parts > 1) TSR_TRY(tsr__qbuf_reserve(q, &q->part, m * sizeof(float)));
    for (int p = 1; p < n_parts; p++) {
        TSR_TRY(tsr__product(q, x, n, w, seg[p], seg[p + 1] - seg[p], q->part.ptr));
        TSR_CUDA_TRY(tsr__cuda_launch_add(target, q->part.ptr, (int64_t)m, q->stream));
    }
    if (acc) TSR_CUDA_TRY(tsr__cuda_launch_add(y, target, (int64_t)m, q->stream));
    return TSR_OK;
}

tsr_status tsr__cuda_quant_embed(tsr__cuda_quant *q, const tsr_tensor *emb, const int32_t *ids,
                                 int64_t n, float *out, int *bad_id) {
    if (emb->dtype != TSR_Q8_0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda embed: %s embedding",
                             tsr_dtype_name(emb->dtype));
    TSR_CUDA_TRY(tsr__cuda_launch_embed_gguf(tsr__ggml_type(emb->dtype), emb->data, emb->rows,
                                             emb->cols, ids, n, out, bad_id, q->stream));
    return TSR_OK;
}
