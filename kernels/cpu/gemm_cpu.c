/* matmul y[n][rows] = x[n][cols] . W^T.
 *
 * Decode (n <= TSR__CPU_MATVEC_MAX_N) is memory-bound: the SIMD matvec kernels stream W
 * once per call, for up to 4 input rows at a time, and OpenMP splits W's rows into fixed
 * blocks.
 * Prefill uses single-threaded OpenBLAS sgemm on fixed panels of W's rows, one OpenMP
 * thread per panel; BF16/F16 panels are widened to f32 into a per-thread scratch first, so
 * prefill runs at BLAS speed without an f32 copy of the whole matrix. */
#include <cblas.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/quant_q4_internal.h"
#include "kernels/cpu/quant_q4k_internal.h"
#include "kernels/cpu/quant_q5k_internal.h"
#include "kernels/cpu/quant_q6k_internal.h"
#include "kernels/cpu/quant_q8_internal.h"
#include "base/alloc.h"
#include "base/dtype.h"

/* Up to this many input rows the matvec kernels (W streamed once, each row block reused from
 * L1/L2 by every group of 4 rows: tsr__matvec_run) beat OpenBLAS sgemm, whose packing of
 * W dominated small-M calls (sgemm_incopy 41 % of a 16-sequence bulk run). bench/
 * throughput.sh, 15M, 1 thread, output tok/s against sgemm: 16 sequences 1165 vs 846, 32
 * 1415 vs 1215, 64 1434 vs 1474; 2 threads, 16: 1825 vs 1529, 32: 2292 vs 2039. */
#define TSR__CPU_MATVEC_MAX_N 32
/* Rows of W per OpenMP work item in the matvec (fixed, so splits are deterministic). */
#define TSR__CPU_ROW_BLOCK 32
/* Below this many weight elements, threads cost more than they save. */
#define TSR__CPU_PAR_MIN 32768
/* Rows of one converted f32 panel: about 1 MB, so it stays in L2 while sgemm reads it. */
#define TSR__CPU_PANEL_BYTES ((size_t)1 << 20)
/* Below this many multiply-adds a prefill matmul stays on one thread. */
#define TSR__CPU_GEMM_PAR_MIN ((int64_t)1 << 18)

static void tsr__matvec_rows(const tsr__cpu_kernels *k, const tsr_tensor *w, const float *x,
                             int nx, int64_t r0, int64_t r1, float *y) {
    switch (w->dtype) {
    case TSR_F32: k->matvec_f32(w->data, w->cols, r0, r1, x, nx, y, w->rows); break;
    case TSR_BF16: k->matvec_bf16(w->data, w->cols, r0, r1, x, nx, y, w->rows); break;
    case TSR_F16: k->matvec_f16(w->data, w->cols, r0, r1, x, nx, y, w->rows); break;
    case TSR_U8: break; /* refused by tsr__cpu_matmul */
    case TSR_Q8_0: /* tsr__qblock_run */
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_Q4_K:
    case TSR_Q5_K:
    case TSR_Q6_K:
    case TSR_MXFP4: break; /* tsr__qblock_run */
    case TSR_F8_E4M3: break; /* refused: the engine converts FP8 to Q8_0 for the CPU */
    }
}

/* x as the kernels read it: reordered into c->xpairs for BF16 kernels with bf16_pairs
 * (once per call, n rows: O(n * cols), against O(n * rows * cols) for the products). */
static tsr_status tsr__matvec_x(tsr__cpu_ctx *c, const tsr__cpu_kernels *k, const float *x,
                                int64_t n, const tsr_tensor *w, const int32_t *seg,
                                int n_parts, const float **out) {
    *out = x;
    if (w->dtype != TSR_BF16 || !k->bf16_pairs) return TSR_OK;
    TSR_TRY(tsr__cpu_scratch(&c->xpairs, &c->xpairs_cap, (size_t)n * (size_t)w->cols));
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        int nx = n - i0 < 4 ? (int)(n - i0) : 4;
        size_t off = (size_t)i0 * (size_t)w->cols;
        tsr__cpu_bf16_pairs(x + off, w->cols, nx, seg, n_parts, c->xpairs + off);
    }
    *out = c->xpairs;
    return TSR_OK;
}

static void tsr__matvec_seg_rows(const tsr__cpu_kernels *k, const tsr_tensor *w,
                                 const float *x, int nx, int64_t r0, int64_t r1,
                                 const int32_t *seg, int n_parts, bool sum, float *y,
                                 int64_t ldp) {
    switch (w->dtype) {
    case TSR_F32:
        k->matvec_seg_f32(w->data, w->cols, r0, r1, x, nx, seg, n_parts, sum, y, w->rows, ldp);
        break;
    case TSR_BF16:
        k->matvec_seg_bf16(w->data, w->cols, r0, r1, x, nx, seg, n_parts, sum, y, w->rows,
                           ldp);
        break;
    case TSR_F16:
        k->matvec_seg_f16(w->data, w->cols, r0, r1, x, nx, seg, n_parts, sum, y, w->rows,
                          ldp);
        break;
    case TSR_U8: break; /* refused by tsr__cpu_matmul_parts */
    case TSR_Q8_0: /* tsr__qblock_run */
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_Q4_K:
    case TSR_Q5_K:
    case TSR_Q6_K:
    case TSR_MXFP4: break; /* tsr__qblock_run */
    case TSR_F8_E4M3: break; /* refused: the engine converts FP8 to Q8_0 for the CPU */
    }
}

/* Rows [r0, r1) of W for all n inputs, 4 at a time. seg == NULL: the plain matvec; else
 * the segmented one (parts ldp apart, or summed). */
static void tsr__matvec_span(const tsr__cpu_kernels *k, const tsr_tensor *w, const float *x,
                             int64_t n, const int32_t *seg, int n_parts, bool sum, int64_t ldp,
                             int64_t r0, int64_t r1, float *y) {
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        int nx = n - i0 < 4 ? (int)(n - i0) : 4;
        const float *xi = x + (size_t)i0 * (size_t)w->cols;
        float *yi = y + (size_t)i0 * (size_t)w->rows;
        if (seg)
            tsr__matvec_seg_rows(k, w, xi, nx, r0, r1, seg, n_parts, sum, yi, ldp);
        else
            tsr__matvec_rows(k, w, xi, nx, r0, r1, yi);
    }
}

/* Decode and small batches (x already as the kernels read it). W's rows go in fixed blocks
 * of TSR__CPU_ROW_BLOCK, each serving every group of 4 inputs while it is in L1/L2, so W
 * streams from memory once whatever n is (before 2026-12-03 it streamed once per group);
 * the kernel calls per row and group are the same in every order, so the bits are too.
 * One thread and one group: a single call over all rows (one stream, no per-block calls).
 * Serial paths open no OpenMP region: even a serialized one costs ~0.7 us and a futex. */
static void tsr__matvec_run(tsr__cpu_ctx *c, const tsr__cpu_kernels *k, const tsr_tensor *w,
                            const float *x, int64_t n, const int32_t *seg, int n_parts,
                            bool sum, int64_t ldp, float *y) {
    int64_t rows = w->rows;
    int64_t nblk = (rows + TSR__CPU_ROW_BLOCK - 1) / TSR__CPU_ROW_BLOCK;
    int par = c->threads > 1 && rows * w->cols >= TSR__CPU_PAR_MIN && nblk > 1;
    if (!par && n <= 4) {
        tsr__matvec_span(k, w, x, n, seg, n_parts, sum, ldp, 0, rows, y);
        return;
    }
    if (!par) {
        for (int64_t r0 = 0; r0 < rows; r0 += TSR__CPU_ROW_BLOCK)
            tsr__matvec_span(k, w, x, n, seg, n_parts, sum, ldp, r0,
                             r0 + TSR__CPU_ROW_BLOCK < rows ? r0 + TSR__CPU_ROW_BLOCK : rows, y);
        return;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t r0 = b * TSR__CPU_ROW_BLOCK;
        int64_t r1 = r0 + TSR__CPU_ROW_BLOCK < rows ? r0 + TSR__CPU_ROW_BLOCK : rows;
        tsr__matvec_span(k, w, x, n, seg, n_parts, sum, ldp, r0, r1, y);
    }
}

static tsr_status tsr__matvec(tsr__cpu_ctx *c, const float *x, int64_t n, const tsr_tensor *w,
                              float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    int32_t whole[2] = {0, (int32_t)w->cols};
    TSR_TRY(tsr__matvec_x(c, k, x, n, w, whole, 1, &x));
    tsr__matvec_run(c, k, w, x, n, NULL, 0, false, 0, y);
    return TSR_OK;
}

/* Rows of one prefill panel: a function of cols only (at most ~1 MB of f32, 96 rows: as fast
 * as 128 and no padding for 288/768-row matrices), never of rows, so a row slice of W (a
 * column-parallel TP shard) sees the same panel shape. Under 256 columns, 32 rows:
 * stories260K's 32- and 64-row matrices were padded to 96 (wk, wv 18 -> 6 us a chunk of 128
 * tokens, wq 19 -> 13; the 172-row w1/w3 become 6 panels instead of 2, 37 -> 39). */
static int64_t tsr__gemm_panel_rows_wanted(int64_t cols) {
    if (cols < 256) return 32;
    int64_t p = (int64_t)(TSR__CPU_PANEL_BYTES / 4) / cols;
    p = p > 96 ? 96 : p & ~(int64_t)15;
    return p < 16 ? 16 : p;
}

/* Swaps rows 0 and j of w ([.][k]). */
static void tsr__swap_rows(float *w, int64_t j, int k) {
    for (int c = 0; c < k; c++) {
        float v = w[c];
        w[c] = w[(size_t)j * (size_t)k + (size_t)c];
        w[(size_t)j * (size_t)k + (size_t)c] = v;
    }
}

/* Whether this machine's OpenBLAS gives a row of W the same bits wherever it sits among the
 * p rows of an sgemm: it does on Zen 4 and Cooper Lake for every p here, but its Haswell and
 * Zen kernels (AVX2 CPUs) split the rows into tiles of 8, 16 and 24 computed in different
 * orders, so only p = 4, 8 and 16 qualify there (measured for n 1..512 inputs and 64..2048
 * columns). Asked with a few shapes once per p (about 10 ms for p = 96), every position
 * against the first. */
static bool tsr__gemm_rows_independent(int64_t p) {
    enum { K = 64 };
    static const int ns[] = {8, 40, 128};
    float *x = tsr_malloc((size_t)128 * K * sizeof *x), *w = tsr_malloc((size_t)p * K * sizeof *w);
    float *y = tsr_malloc((size_t)128 * (size_t)p * sizeof *y), *ref = tsr_malloc(128 * sizeof *ref);
    bool ok = x && w && y && ref;
    uint32_t r = 0x9e3779b9u;
    for (size_t i = 0; ok && i < (size_t)128 * K; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = (float)(r >> 8) * (1.0f / 16777216.0f) - 0.5f;
    }
    for (size_t i = 0; ok && i < (size_t)p * K; i++) {
        r = r * 1664525u + 1013904223u;
        w[i] = (float)(r >> 8) * (1.0f / 16777216.0f) - 0.5f;
    }
    for (size_t t = 0; ok && t < sizeof ns / sizeof ns[0]; t++) {
        int n = ns[t];
        for (int64_t j = 0; ok && j < p; j++) {
            /* row 0's values at position j (swapped in, then back) */
            tsr__swap_rows(w, j, K);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)p, K, 1.0f, x, K, w, K,
                        0.0f, y, (int)p);
            for (int i = 0; i < n; i++) {
                if (j == 0) ref[i] = y[(size_t)i * (size_t)p];
                else if (memcmp(&ref[i], &y[(size_t)i * (size_t)p + (size_t)j], sizeof *y)) ok = false;
            }
            tsr__swap_rows(w, j, K);
        }
    }
    tsr_free(x);
    tsr_free(w);
    tsr_free(y);
    tsr_free(ref);
    return ok;
}

/* The panel rows for cols: the wanted size when a row's bits do not depend on its place in
 * the panel, else the largest of 16, 8, 4 where they do not, so that a row slice of W (a TP
 * shard) and a fused matrix's parts (q/k/v, gate/up) give each row W's bits on any CPU. The
 * answers are cached per p (racing first callers compute the same). */
static int64_t tsr__gemm_panel_rows(int64_t cols) {
    static _Atomic signed char indep[97]; /* 0 not asked, 1 yes, -1 no */
    const int64_t tries[] = {tsr__gemm_panel_rows_wanted(cols), 16, 8, 4};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        int64_t p = tries[i];
        signed char v = atomic_load_explicit(&indep[p], memory_order_acquire);
        if (!v) {
            v = tsr__gemm_rows_independent(p) ? 1 : -1;
            atomic_store_explicit(&indep[p], v, memory_order_release);
        }
        if (v > 0) return p;
    }
    return 4; /* not seen: no row-slice guarantee on this BLAS */
}

/* y[.][r0 .. r0+pr) for panel b: one sgemm of exactly p rows. BF16/F16 rows are widened
 * into panel first; a last, shorter panel is zero-padded to p rows in panel and its output
 * goes through out ([n][p]). Every call thus has the same shape (n, p, cols): OpenBLAS
 * picks its kernel by shape (0.3.21 on Cooper Lake/Zen 4 uses a "small matrix" kernel with
 * other rounding when n*p*cols <= 1e6), and for a fixed shape each element's bits do not
 * depend on the row's place in the panel (tsr__gemm_panel_rows chooses a p where this
 * holds), so a row gets the same bits in W and in any row slice of W. */
static void tsr__gemm_panel(const tsr__cpu_kernels *k, const float *x, int64_t n,
                            const tsr_tensor *w, int64_t p, int64_t b, float *panel,
                            float *out, float *y) {
    int64_t rows = w->rows, cols = w->cols;
    int64_t r0 = b * p;
    int64_t pr = rows - r0 < p ? rows - r0 : p;
    const float *wp;
    if (w->dtype == TSR_F32 && pr == p) {
        wp = (const float *)w->data + (size_t)r0 * (size_t)cols;
    } else {
        size_t m = (size_t)pr * (size_t)cols;
        if (w->dtype == TSR_F32)
            memcpy(panel, (const float *)w->data + (size_t)r0 * (size_t)cols, m * 4);
        else if (w->dtype == TSR_BF16)
            k->cvt_bf16((const uint16_t *)w->data + (size_t)r0 * (size_t)cols, panel,
                        (int64_t)m);
        else
            k->cvt_f16((const uint16_t *)w->data + (size_t)r0 * (size_t)cols, panel,
                       (int64_t)m);
        if (pr < p) memset(panel + m, 0, (size_t)(p - pr) * (size_t)cols * 4);
        wp = panel;
    }
    if (pr == p) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)p, (int)cols, 1.0f,
                    x, (int)cols, wp, (int)cols, 0.0f, y + r0, (int)rows);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)p, (int)cols, 1.0f, x,
                (int)cols, wp, (int)cols, 0.0f, out, (int)p);
    for (int64_t i = 0; i < n; i++)
        memcpy(y + (size_t)(i * rows + r0), out + (size_t)(i * p), (size_t)pr * 4);
}

/* Prefill: W's rows are cut into fixed panels (their size depends on W's cols only) and
 * each panel is one single-threaded sgemm; OpenMP threads take panels dynamically, and for
 * BF16/F16 a thread first widens its panel into its own f32 scratch. Every output element
 * thus comes from the same BLAS call whatever the thread count (bitwise identical
 * results), the conversion runs in parallel, and OpenBLAS's own thread pool is never used:
 * with it (pthreads build) running between OpenMP regions whose workers spin on the same
 * cores, 2-thread f32 prefill was slower than 1 thread, and 768x768 panels ran at 20-40
 * instead of 150-180 GFLOP/s (measured on the 2-vCPU dev VM). */
static tsr_status tsr__gemm_panels(tsr__cpu_ctx *c, const float *x, int64_t n,
                                   const tsr_tensor *w, float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    int64_t rows = w->rows, cols = w->cols;
    int64_t p = tsr__gemm_panel_rows(cols);
    int64_t npan = (rows + p - 1) / p;
    bool ragged = rows % p != 0;
    int nt = c->threads < npan ? c->threads : (int)npan;
    if ((double)n * (double)rows * (double)cols < (double)TSR__CPU_GEMM_PAR_MIN) nt = 1;
    /* Per thread: a widened (or padded) panel, and the padded panel's output. */
    size_t pan = w->dtype != TSR_F32 || ragged ? (size_t)p * (size_t)cols : 0;
    size_t outn = ragged ? (size_t)n * (size_t)p : 0;
    size_t per = pan + outn;
    float *scratch = NULL;
    if (per) {
        TSR_TRY(tsr__cpu_scratch(&c->panel, &c->panel_cap, per * (size_t)nt));
        scratch = c->panel;
    }
    if (nt == 1) {
        for (int64_t b = 0; b < npan; b++)
            tsr__gemm_panel(k, x, n, w, p, b, scratch, scratch ? scratch + pan : NULL, y);
        return TSR_OK;
    }
#pragma omp parallel num_threads(nt)
    {
        float *mine = scratch ? scratch + per * (size_t)omp_get_thread_num() : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < npan; b++)
            tsr__gemm_panel(k, x, n, w, p, b, mine, mine ? mine + pan : NULL, y);
    }
    return TSR_OK;
}

/* ---- Q8_0 weights (quant_q8.h): W8A8 with GGUF's numerics, decode and prefill alike ---- */

/* Groups of 16 rows per OpenMP work item of the block-quantized matmuls (32 rows, the f32
 * row block). */
#define TSR__CPU_Q8_BLOCK_GROUPS 2
/* Part counts up to this convert their boundaries on the stack. */
#define TSR__CPU_SMALL_PARTS 64

/* Part boundaries seg[0..n_parts] (columns) in blocks of `block` columns: into `small`
 * (TSR__CPU_SMALL_PARTS + 1 entries) when they fit, else a heap array the caller frees
 * (*bseg != small). A boundary inside a block is refused: the kernels reduce whole blocks
 * (the loaders keep, convert or expand such matrices). */
static tsr_status tsr__block_parts(const int32_t *seg, int n_parts, int32_t block,
                                   const char *dtype_name, int32_t *small, int32_t **bseg) {
    int32_t *b = n_parts <= TSR__CPU_SMALL_PARTS
                     ? small
                     : tsr_malloc((size_t)(n_parts + 1) * sizeof *b);
    if (!b) return TSR_ERR_NOMEM;
    for (int p = 0; p <= n_parts; p++) {
        if (seg[p] % block) {
            if (b != small) tsr_free(b);
            return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu matmul_parts: %s part boundary %d "
                                 "is not a multiple of %d", dtype_name, (int)seg[p],
                                 (int)block);
        }
        b[p] = seg[p] / block;
    }
    *bseg = b;
    return TSR_OK;
}

/* The activations of a block-quantized matmul, quantized as its kernels read them (one
 * float scratch: int8 values, then f32 scales, int32 block sums and, for Q4_1, f32 block
 * sums), and its part boundaries in blocks. */
typedef struct tsr__qact {
    int64_t nb;   /* blocks per row */
    int64_t nsum; /* int32 sums per block: 1, or Q4_K's sub-blocks */
    int8_t *xq;
    float *xd;
    int32_t *xs;
    float *xm;
    /* the first n16 inputs again in the AMX kernel's order (tsr__q8_amx_pack_act): values,
     * scales, -128 x block sums; empty when n16 is 0 */
    int8_t *xa;
    float *xad;
    int32_t *xac;
    int64_t n16; /* inputs for the AMX kernel (a multiple of 16), or 0 */
    tsr__q8_gemm16_fn g16;
    int32_t whole[2], small[TSR__CPU_SMALL_PARTS + 1], *bseg;
    int n_parts;
    bool sum;
} tsr__qact;

static void tsr__qact_free(tsr__qact *q) {
    if (q->bseg != q->small && q->bseg != q->whole) tsr_free(q->bseg);
}

/* The preamble every block-quantized W shares: the part boundaries in blocks (seg == NULL:
 * one part, summed), the scratch, and each input row quantized per block (Q8_0 / Q4_0 /
 * Q4_1, Q5_K, Q6_K: per 32 columns as the Q8_0 weights, Q4_1 adding llama.cpp's Q8_1 block
 * sums, Q6_K replacing the block sums by 16-column pairs; Q4_K: per 256 as llama.cpp's Q8_K).
 * Rows are independent, so the thread count changes no bit. */
static tsr_status tsr__qact_begin(tsr__cpu_ctx *c, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, tsr__qact *q) {
    bool q4k = w->dtype == TSR_Q4_K, q41 = w->dtype == TSR_Q4_1;
    int32_t block = q4k ? TSR_Q4K_BLOCK : TSR_Q8_BLOCK;
    int64_t cols = w->cols;
    q->nb = cols / block;
    q->nsum = q4k ? TSR__Q4K_SUB : 1;
    q->whole[0] = 0;
    q->whole[1] = (int32_t)q->nb;
    q->bseg = q->whole;
    q->n_parts = 1;
    q->sum = true;
    if (seg) {
        TSR_TRY(tsr__block_parts(seg, n_parts, block, tsr_dtype_name(w->dtype), q->small,
                                 &q->bseg));
        q->n_parts = n_parts;
        q->sum = sum;
    }
    /* Q8_0 with 16 or more inputs: AMX tiles for each 16 (the rest 4 at a time), the same
     * bits */
    q->g16 = w->dtype == TSR_Q8_0 && n >= 16 ? tsr__q8_amx_get() : NULL;
    q->n16 = q->g16 ? n - n % 16 : 0;
    size_t nq = (size_t)n * (size_t)cols, ns = (size_t)n * (size_t)q->nb;
    size_t head = (nq + 3) / 4 + ns * (q4k ? 1 + TSR__Q4K_SUB : 3);
    tsr_status st = tsr__cpu_scratch(&c->q8x, &c->q8x_cap,
                                     head + (size_t)q->n16 * ((size_t)cols / 4 + 2 * q->nb));
    if (st != TSR_OK) {
        tsr__qact_free(q);
        return st;
    }
    q->xq = (int8_t *)c->q8x;
    q->xd = c->q8x + (nq + 3) / 4;
    q->xs = (int32_t *)(q->xd + ns);
    q->xm = q->xd + 2 * ns;
    q->xad = c->q8x + head;
    q->xac = (int32_t *)(q->xad + q->n16 * q->nb);
    q->xa = (int8_t *)(q->xac + q->n16 * q->nb);
    const tsr__q8_kernels *k = tsr__q8_kernels_get();
    int64_t nb = q->nb, nsb = q->nb * q->nsum;
    int qpar = c->threads > 1 && n >= 16;
#pragma omp parallel for num_threads(c->threads) schedule(static) if (qpar)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * (size_t)cols;
        int8_t *xqi = q->xq + (size_t)i * (size_t)cols;
        int32_t *xsi = q->xs + (size_t)i * (size_t)nsb;
        if (q4k) {
            tsr__q4k_quantize_act(xi, cols, xqi, q->xd + (size_t)i * (size_t)nb, xsi);
        } else {
            k->quant_act(xi, cols, xqi, q->xd + (size_t)i * (size_t)nb, xsi,
                         q41 ? q->xm + (size_t)i * (size_t)nb : NULL);
            if (w->dtype == TSR_Q6_K) tsr__q6k_act_sums(xqi, cols, xsi); /* per 16 */
            if (i < q->n16)
                tsr__q8_amx_pack_act(xqi, q->xd + (size_t)i * (size_t)nb, xsi, nb, i, q->xa,
                                     q->xad, q->xac);
        }
    }
    return TSR_OK;
}

/* y = x . W^T for a Q8_0, Q4_0, Q4_1, MXFP4, Q4_K, Q5_K or Q6_K W, per column part as
 * matmul_parts (seg == NULL: one part, summed): the inputs quantized first (tsr__qact_begin),
 * then W's integer kernel (kernels/cpu/quant_q8.h, quant_q4.h, quant_q4k.h, quant_q5k.h,
 * quant_q6k.h) runs over fixed blocks of row groups, each serving all inputs 4 at a time
 * while it is in L1/L2, so W streams from memory once for decode and prefill alike; each
 * output's operations do not depend on the thread count or on n. Part boundaries must be
 * multiples of the block (32, Q4_K 256; the loaders keep or expand other matrices). */
static tsr_status tsr__qblock_run(tsr__cpu_ctx *c, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, float *y) {
    tsr__qact q;
    TSR_TRY(tsr__qact_begin(c, x, n, w, seg, n_parts, sum, &q));
    int64_t rows = w->rows, cols = w->cols, nb = q.nb, nsb = q.nb * q.nsum;
    const tsr__q8_kernels *k8 = tsr__q8_kernels_get();
    tsr__q4_gemv_fn g4 = tsr_q4_grouped(w->dtype)
                             ? tsr__q4_gemv_for(tsr__q4_kernels_get(), w->dtype)
                             : NULL;
    tsr__q4k_gemv_fn gk = w->dtype == TSR_Q4_K ? tsr__q4k_kernels_get()->gemv : NULL;
    /* Q5_K and Q6_K take the Q8_0 kernels' activations and contract (quant_q5k_internal.h,
     * quant_q6k_internal.h) */
    tsr__q8_gemv_fn g8 = w->dtype == TSR_Q6_K   ? tsr__q6k_kernels_get()->gemv
                         : w->dtype == TSR_Q5_K ? tsr__q5k_kernels_get()->gemv
                                                : k8->gemv;
    /* every format packs 16-row groups (the _Static_asserts of the *_internal.h) */
    int64_t ng = (rows + TSR_Q8_GROUP - 1) / TSR_Q8_GROUP;
    int64_t nblk = (ng + TSR__CPU_Q8_BLOCK_GROUPS - 1) / TSR__CPU_Q8_BLOCK_GROUPS;
    int64_t ldp = n * rows;
    int par = c->threads > 1 && nblk > 1 &&
              (rows * cols >= TSR__CPU_PAR_MIN || n * rows * cols >= TSR__CPU_GEMM_PAR_MIN);
#pragma omp parallel for num_threads(c->threads) schedule(static) if (par)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t g0 = blk * TSR__CPU_Q8_BLOCK_GROUPS;
        int64_t g1 = g0 + TSR__CPU_Q8_BLOCK_GROUPS < ng ? g0 + TSR__CPU_Q8_BLOCK_GROUPS : ng;
        if (q.n16)
            q.g16(w->data, nb, rows, g0, g1, q.xa, q.xad, q.xac, q.n16, q.bseg, q.n_parts, q.sum,
                  y, rows, ldp);
        for (int64_t i0 = q.n16; i0 < n; i0 += 4) {
            int nx = n - i0 < 4 ? (int)(n - i0) : 4;
            const int8_t *xq = q.xq + (size_t)i0 * (size_t)cols;
            const float *xd = q.xd + (size_t)i0 * (size_t)nb;
            const int32_t *xs = q.xs + (size_t)i0 * (size_t)nsb;
            float *yi = y + (size_t)i0 * (size_t)rows;
            if (gk)
                gk(w->data, nb, rows, g0, g1, xq, xd, xs, nx, q.bseg, q.n_parts, q.sum, yi,
                   rows, ldp);
            else if (g4)
                g4(w->data, nb, rows, g0, g1, xq, xd, xs, q.xm + (size_t)i0 * (size_t)nb, nx,
                   q.bseg, q.n_parts, q.sum, yi, rows, ldp);
            else
                g8(w->data, nb, rows, g0, g1, xq, xd, xs, nx, q.bseg, q.n_parts, q.sum, yi,
                   rows, ldp);
        }
    }
    tsr__qact_free(&q);
    return TSR_OK;
}

/* Whether W runs on tsr__qblock_run: a block-quantized dtype in a shape its kernels take. */
static bool tsr__qblock_fits(const tsr_tensor *w) {
    if (w->dtype == TSR_Q8_0 || tsr_q4_grouped(w->dtype))
        return tsr_q8_fits(w->rows, w->cols);
    if (w->dtype == TSR_Q6_K) return tsr_q6k_fits(w->rows, w->cols);
    if (w->dtype == TSR_Q5_K) return tsr_q5k_fits(w->rows, w->cols);
    return w->dtype == TSR_Q4_K && tsr_q4k_fits(w->rows, w->cols);
}

static bool tsr__gemm_amx_part(const tsr_tensor *w, int64_t len);
static tsr_status tsr__gemm_parts(tsr__cpu_ctx *c, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, float *y);

tsr_status tsr__cpu_matmul(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                           float *y) {
    tsr__cpu_ctx *c = be->ctx;
    if (n < 0 || !w || w->rows <= 0 || w->cols <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "cpu matmul: bad shape (n=%lld)", (long long)n);
    if (tsr__qblock_fits(w))
        return n == 0 ? TSR_OK : tsr__qblock_run(c, x, n, w, NULL, 1, true, y);
    if (w->dtype != TSR_F32 && w->dtype != TSR_BF16 && w->dtype != TSR_F16)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu matmul: weight dtype %d",
                             (int)w->dtype);
    if (w->rows > INT32_MAX || w->cols > INT32_MAX || n > INT32_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu matmul: %lldx%lld too large for BLAS",
                             (long long)w->rows, (long long)w->cols);
    if (n == 0) return TSR_OK;
    if (n <= TSR__CPU_MATVEC_MAX_N) {
        return tsr__matvec(c, x, n, w, y);
    }
    /* BF16 on AMX tiles: the parts driver's, as one part */
    int32_t all[2] = {0, (int32_t)w->cols};
    if (tsr__gemm_amx_part(w, w->cols)) return tsr__gemm_parts(c, x, n, w, all, 1, true, y);
    return tsr__gemm_panels(c, x, n, w, y);
}

/* ---- matmul_parts: per-segment products for tensor-parallel reductions ---- */

/* Decode and small batches: tsr__matvec_run with a dot per segment. */
static tsr_status tsr__matvec_parts(tsr__cpu_ctx *c, const float *x, int64_t n,
                                    const tsr_tensor *w, const int32_t *seg, int n_parts,
                                    bool sum, float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    TSR_TRY(tsr__matvec_x(c, k, x, n, w, seg, n_parts, &x));
    tsr__matvec_run(c, k, w, x, n, seg, n_parts, sum, n * w->rows, y);
    return TSR_OK;
}

/* Rows of W per prefill work item of matmul_parts: a function of W's row count only (the
 * same for every tp, since TP slices W's columns), at most 128 so a thread's widened
 * segment panel stays small. */
static int64_t tsr__parts_panel_rows(int64_t rows) {
    int64_t p = rows >= 512 ? 128 : 64;
    return p > rows ? rows : p;
}

/* Whether gemm_short_sum takes a whole ordered sum: every part short, the row narrow. */
static bool tsr__short_sum_fits(const tsr__cpu_kernels *k, const int32_t *seg, int n_parts) {
    if (!k->gemm_short_sum || n_parts < 1 || seg[n_parts] - seg[0] > TSR__CPU_SHORT_SUM_COLS)
        return false;
    for (int p = 0; p < n_parts; p++)
        if (seg[p + 1] - seg[p] > TSR__CPU_SHORT_K || seg[p + 1] < seg[p]) return false;
    return true;
}

/* Whether a part of `len` columns of W runs on AMX tiles (gemm_amx.c): W BF16, the CPU's
 * AMX-BF16, and len a positive multiple of 32. A function of the part's own length only, so
 * a part takes the same path (and gets the same bits) in every tensor-parallel cut. */
static bool tsr__gemm_amx_part(const tsr_tensor *w, int64_t len) {
    return w->dtype == TSR_BF16 && len > 0 && len % 32 == 0 && tsr__cpu_amx() & TSR__AMX_BF16;
}

/* Prefill panel b: for each part, one sgemm of the segment block (K = segment length,
 * lda/ldb the full widths), widened to f32 first for BF16/F16; the parts go to their
 * slices of y, or are summed into y in part order through `out`. */
static void tsr__gemm_parts_panel(const tsr__cpu_kernels *k, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, int64_t ph, int64_t b, float *panel, float *out,
                                  const uint16_t *xp, uint16_t *tail, float *y) {
    int64_t rows = w->rows, cols = w->cols;
    int64_t r0 = b * ph;
    int64_t pr = rows - r0 < ph ? rows - r0 : ph;
    if (sum && w->dtype == TSR_F32 && tsr__short_sum_fits(k, seg, n_parts)) {
        k->gemm_short_sum(x, cols, n, (const float *)w->data + (size_t)r0 * (size_t)cols, cols,
                          pr, seg, n_parts, y + r0, rows);
        return;
    }
    size_t xo = 0; /* the packed x of the AMX parts before p */
    for (int p = 0; p < n_parts; p++) {
        int64_t s0 = seg[p], len = (int64_t)seg[p + 1] - seg[p];
        if (xp && tsr__gemm_amx_part(w, len)) {
            /* onto y in part order, as the sum through out below */
            tsr__gemm_amx_rows((const uint16_t *)w->data + s0, cols, r0, r0 + pr, xp + xo,
                               len / 32, 0, len / 32, n, tail, sum && p > 0,
                               sum ? y : y + (size_t)p * (size_t)(n * rows), rows);
            xo += tsr__gemm_amx_xp_elems(n, len / 32);
            continue;
        }
        /* Short segments add their product into y themselves (the same bits as the sum
         * below); others go through out. */
        bool direct = k->gemm_short && len > 0 && len <= TSR__CPU_SHORT_K;
        bool via_out = sum && p > 0 && !direct;
        float *dst = sum ? (via_out ? out : y + r0) : y + (size_t)p * (size_t)(n * rows) + r0;
        int64_t ldc = via_out ? pr : rows;
        if (len == 0) {
            for (int64_t i = 0; i < n; i++) memset(dst + (size_t)(i * ldc), 0, (size_t)pr * 4);
        } else {
            const float *wp;
            int64_t ldw;
            if (w->dtype == TSR_F32) {
                wp = (const float *)w->data + (size_t)r0 * (size_t)cols + (size_t)s0;
                ldw = cols;
            } else {
                const uint16_t *src = (const uint16_t *)w->data + (size_t)r0 * (size_t)cols +
                                      (size_t)s0;
                for (int64_t j = 0; j < pr; j++) {
                    if (w->dtype == TSR_BF16)
                        k->cvt_bf16(src + (size_t)(j * cols), panel + (size_t)(j * len), len);
                    else
                        k->cvt_f16(src + (size_t)(j * cols), panel + (size_t)(j * len), len);
                }
                wp = panel;
                ldw = len;
            }
            if (direct)
                k->gemm_short(x + s0, cols, n, wp, ldw, pr, (int)len, dst, ldc, sum && p > 0);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)pr,
                            (int)len, 1.0f, x + s0, (int)cols, wp, (int)ldw, 0.0f, dst,
                            (int)ldc);
        }
        if (via_out) {
            for (int64_t i = 0; i < n; i++) {
                float *yr = y + (size_t)(i * rows + r0);
                const float *o = out + (size_t)(i * pr);
                for (int64_t j = 0; j < pr; j++) yr[j] += o[j];
            }
        }
    }
}

static tsr_status tsr__gemm_parts(tsr__cpu_ctx *c, const float *x, int64_t n,
                                  const tsr_tensor *w, const int32_t *seg, int n_parts,
                                  bool sum, float *y) {
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    int64_t rows = w->rows, cols = w->cols;
    int64_t maxlen = 0, ng = (n + 15) / 16;
    /* AMX parts: x packed once (every AMX part's columns, in part order, into c->panel),
     * and per thread a copy of a panel's last rows (16 x maxlen bf16) */
    size_t xpe = 0;
    bool all_amx = true;
    for (int p = 0; p < n_parts; p++) {
        int64_t len = seg[p + 1] - seg[p];
        if (len > maxlen) maxlen = len;
        if (tsr__gemm_amx_part(w, len))
            xpe += tsr__gemm_amx_xp_elems(n, len / 32);
        else
            all_amx = false;
    }
    int64_t ph = tsr__parts_panel_rows(rows);
    /* Where every part is on AMX tiles (whose bits do not depend on the panels), a thread's
     * panel is its whole share of 32-row blocks: the packed x then stays in its L2 while
     * those rows stream through (with 128-row panels each panel read x from L3 again:
     * 0.75x). */
    if (all_amx) {
        int64_t nblk = (rows + 31) / 32, per_t = (nblk + c->threads - 1) / c->threads;
        ph = per_t * 32 < rows ? per_t * 32 : rows;
    }
    int64_t npan = (rows + ph - 1) / ph;
    int nt = c->threads < npan ? c->threads : (int)npan;
    if ((double)n * (double)rows * (double)cols < (double)TSR__CPU_GEMM_PAR_MIN) nt = 1;
    size_t pan = w->dtype == TSR_F32 || all_amx ? 0 : (size_t)(ph * maxlen);
    size_t outn = sum && !all_amx ? (size_t)(n * ph) : 0;
    size_t tailf = xpe ? 8 * (size_t)maxlen : 0;
    size_t per = pan + outn + tailf;
    float *scratch = NULL;
    uint16_t *xp = NULL;
    if (per) {
        TSR_TRY(tsr__cpu_scratch(&c->parts, &c->parts_cap, per * (size_t)nt));
        scratch = c->parts;
    }
    if (xpe) {
        TSR_TRY(tsr__cpu_scratch(&c->panel, &c->panel_cap, (xpe + 1) / 2));
        xp = (uint16_t *)c->panel;
    }
#pragma omp parallel num_threads(nt)
    {
        float *mine = scratch ? scratch + per * (size_t)omp_get_thread_num() : NULL;
        if (xpe) {
#pragma omp for schedule(static)
            for (int64_t g = 0; g < ng; g++) {
                size_t xo = 0;
                for (int p = 0; p < n_parts; p++) {
                    int64_t len = seg[p + 1] - seg[p];
                    if (!tsr__gemm_amx_part(w, len)) continue;
                    tsr__gemm_amx_pack(x + seg[p], cols, n, len / 32, g, xp + xo);
                    xo += tsr__gemm_amx_xp_elems(n, len / 32);
                }
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < npan; b++)
            tsr__gemm_parts_panel(k, x, n, w, seg, n_parts, sum, ph, b, mine,
                                  mine ? mine + pan : NULL, xp,
                                  xpe ? (uint16_t *)(mine + pan + outn) : NULL, y);
    }
    return TSR_OK;
}

tsr_status tsr__cpu_matmul_parts(tsr_backend *be, const float *x, int64_t n,
                                 const tsr_tensor *w, const int32_t *seg, int n_parts, bool sum,
                                 float *y) {
    tsr__cpu_ctx *c = be->ctx;
    /* cols may be 0 (a shard whose parts are all empty): the parts are then zeros. */
    if (n < 0 || !w || w->rows <= 0 || w->cols < 0 || n_parts < 1 || !seg)
        return tsr_error_set(TSR_ERR_INVALID, "cpu matmul_parts: bad shape (n=%lld, %d parts)",
                             (long long)n, n_parts);
    if (tsr__qblock_fits(w) && seg[n_parts] <= w->cols && seg[0] >= 0)
        return n == 0 ? TSR_OK : tsr__qblock_run(c, x, n, w, seg, n_parts, sum, y);
    if (w->dtype != TSR_F32 && w->dtype != TSR_BF16 && w->dtype != TSR_F16)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu matmul_parts: weight dtype %d",
                             (int)w->dtype);
    if (w->rows > INT32_MAX || w->cols > INT32_MAX || n > INT32_MAX)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "cpu matmul_parts: %lldx%lld too large for BLAS",
                             (long long)w->rows, (long long)w->cols);
    if (seg[0] < 0 || seg[n_parts] > w->cols)
        return tsr_error_set(TSR_ERR_INVALID, "cpu matmul_parts: segments [%d, %d) outside %lld "
                             "columns", (int)seg[0], (int)seg[n_parts], (long long)w->cols);
    for (int p = 0; p < n_parts; p++)
        if (seg[p + 1] < seg[p])
            return tsr_error_set(TSR_ERR_INVALID, "cpu matmul_parts: segment %d decreases "
                                 "(%d > %d)", p, (int)seg[p], (int)seg[p + 1]);
    if (n == 0) return TSR_OK;
    if (n <= TSR__CPU_MATVEC_MAX_N) {
        return tsr__matvec_parts(c, x, n, w, seg, n_parts, sum, y);
    }
    return tsr__gemm_parts(c, x, n, w, seg, n_parts, sum, y);
}
