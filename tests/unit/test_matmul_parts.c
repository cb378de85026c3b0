/* matmul_parts (tensor-parallel reductions, runtime/exec/parallel.h) and the TP slicing
 * properties of matmul, bitwise: (a) the parts of a column slice of W equal the same parts
 * of the whole W; (b) sum mode equals the parts summed in order (out = P0; out += P1 ...);
 * the parts do not depend on the thread count or, for decode, on the SIMD path's row
 * ranges; and matmul gives each output row the same bits when W is replaced by a
 * contiguous row slice (column-parallel wq/wk/wv/w1/w3). F32/BF16/F16, decode and
 * prefill sizes, odd segment lengths, every SIMD path this CPU has. */
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "tests/test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static const tsr_dtype kDtypes[3] = {TSR_F32, TSR_BF16, TSR_F16};

/* A weight matrix in dtype dt with its exact f32 values. */
typedef struct wmat {
    tsr_tensor t;
    void *data;
    float *f;
} wmat;

static void wmat_make(wmat *w, tsr_dtype dt, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (size_t)cols;
    w->f = tsr_malloc(n * 4);
    w->data = tsr_malloc(n * tsr_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (dt == TSR_F32) {
            ((float *)w->data)[i] = v;
        } else if (dt == TSR_BF16) {
            uint16_t h = tsr_f32_to_bf16(v);
            ((uint16_t *)w->data)[i] = h;
            v = tsr_bf16_to_f32(h);
        } else {
            uint16_t h = tsr_f32_to_f16(v);
            ((uint16_t *)w->data)[i] = h;
            v = tsr_f16_to_f32(h);
        }
        w->f[i] = v;
    }
    w->t = (tsr_tensor){.dtype = dt, .rows = rows, .cols = cols, .data = w->data};
}

/* Columns [c0, c1) of w as a new contiguous matrix (a row-parallel TP shard). */
static void wmat_cols(const wmat *w, int64_t c0, int64_t c1, wmat *out) {
    size_t es = tsr_dtype_size(w->t.dtype);
    int64_t rows = w->t.rows, cols = w->t.cols, nc = c1 - c0;
    out->f = tsr_malloc((size_t)(rows * nc) * 4);
    out->data = tsr_malloc((size_t)(rows * nc) * es);
    for (int64_t r = 0; r < rows; r++) {
        memcpy((char *)out->data + (size_t)(r * nc) * es,
               (const char *)w->data + (size_t)(r * cols + c0) * es, (size_t)nc * es);
        memcpy(out->f + r * nc, w->f + r * cols + c0, (size_t)nc * 4);
    }
    out->t = (tsr_tensor){.dtype = w->t.dtype, .rows = rows, .cols = nc, .data = out->data};
}

/* Rows [r0, r1) of w (a column-parallel TP shard): a view. */
static tsr_tensor wmat_rows(const wmat *w, int64_t r0, int64_t r1) {
    tsr_tensor t = w->t;
    t.rows = r1 - r0;
    t.data = tsr_tensor_row(&w->t, r0);
    return t;
}

static void wmat_free(wmat *w) {
    tsr_free(w->f);
    tsr_free(w->data);
}

/* Columns [c0, c1) of the n rows of x ([n][cols]). */
static float *x_cols(const float *x, int64_t n, int64_t cols, int64_t c0, int64_t c1) {
    float *o = tsr_malloc((size_t)(n * (c1 - c0)) * 4 + 4);
    for (int64_t i = 0; i < n; i++)
        memcpy(o + i * (c1 - c0), x + i * cols + c0, (size_t)(c1 - c0) * 4);
    return o;
}

static float *x_make(int64_t n, int64_t cols) {
    float *x = tsr_malloc((size_t)(n * cols) * 4 + 4);
    for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
    return x;
}

/* A segment layout: n lengths, cumulative offsets in seg[0..n]. */
typedef struct layout {
    int rows;
    int n;
    int32_t seg[16];
} layout;

static layout layout_make(int rows, int n, const int *lens) {
    layout l = {.rows = rows, .n = n};
    for (int p = 0; p < n; p++) l.seg[p + 1] = l.seg[p] + lens[p];
    return l;
}

static const int kLensA[5] = {8, 22, 21, 22, 21};
static const int kLensB[12] = {171, 171, 171, 171, 171, 171, 171, 171, 170, 170, 170, 170};
static const int kLensC[4] = {64, 64, 64, 0};
/* 3 parts: a last, partial group of parts in the reduction; 64-, 16-column blocks and tail. */
static const int kLensD[3] = {100, 7, 33};
/* Short parts only (the fused short-sum kernel on AVX-512), with an empty one in between. */
static const int kLensE[4] = {8, 0, 22, 5};
/* BF16 parts of 32k columns run on AMX tiles where the CPU has them, the others on sgemm:
 * both in one call */
static const int kLensF[4] = {64, 40, 32, 96};

static layout layout_get(int i) {
    if (i == 0) return layout_make(40, 5, kLensA);
    if (i == 1) return layout_make(24, 12, kLensB);
    if (i == 2) return layout_make(150, 4, kLensC);
    if (i == 3) return layout_make(37, 3, kLensD);
    if (i == 4) return layout_make(19, 4, kLensE);
    return layout_make(70, 4, kLensF);
}
#define N_LAYOUTS 6

/* The ordered sum of parts [n_parts][m] (the comm_self arithmetic). */
static void sum_parts(const float *parts, int n_parts, size_t m, float *out) {
    memcpy(out, parts, m * 4);
    for (int p = 1; p < n_parts; p++)
        for (size_t i = 0; i < m; i++) out[i] += parts[(size_t)p * m + i];
}

static int bits_eq(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * 4); }

static void (*seg_fn(const tsr__cpu_kernels *k, tsr_dtype dt))(void) {
    if (dt == TSR_F32) return (void (*)(void))k->matvec_seg_f32;
    if (dt == TSR_BF16) return (void (*)(void))k->matvec_seg_bf16;
    return (void (*)(void))k->matvec_seg_f16;
}

static void seg_call_raw(const tsr__cpu_kernels *k, const tsr_tensor *w, int64_t r0,
                         int64_t r1, const float *x, int nx, const int32_t *seg, int np,
                         bool sum, float *y, int64_t ldy, int64_t ldp);

/* x as kernel k reads it for w (tsr__cpu_bf16_pairs order for BF16 when k wants it);
 * a fresh buffer the caller frees. */
static float *x_for(const tsr__cpu_kernels *k, const tsr_tensor *w, const float *x, int nx,
                    const int32_t *seg, int np) {
    size_t n = (size_t)nx * (size_t)w->cols;
    float *xp = tsr_malloc(n * 4 + 4);
    if (w->dtype == TSR_BF16 && k->bf16_pairs)
        tsr__cpu_bf16_pairs(x, w->cols, nx, seg, np, xp);
    else
        memcpy(xp, x, n * 4);
    return xp;
}

static void seg_call(const tsr__cpu_kernels *k, const tsr_tensor *w, int64_t r0, int64_t r1,
                     const float *x0, int nx, const int32_t *seg, int np, bool sum, float *y,
                     int64_t ldy, int64_t ldp) {
    float *x = x_for(k, w, x0, nx, seg, np);
    seg_call_raw(k, w, r0, r1, x, nx, seg, np, sum, y, ldy, ldp);
    tsr_free(x);
}

static void seg_call_raw(const tsr__cpu_kernels *k, const tsr_tensor *w, int64_t r0,
                         int64_t r1, const float *x, int nx, const int32_t *seg, int np,
                         bool sum, float *y, int64_t ldy, int64_t ldp) {
    if (w->dtype == TSR_F32)
        k->matvec_seg_f32(w->data, w->cols, r0, r1, x, nx, seg, np, sum, y, ldy, ldp);
    else if (w->dtype == TSR_BF16)
        k->matvec_seg_bf16(w->data, w->cols, r0, r1, x, nx, seg, np, sum, y, ldy, ldp);
    else
        k->matvec_seg_f16(w->data, w->cols, r0, r1, x, nx, seg, np, sum, y, ldy, ldp);
}

/* Every SIMD path's segmented matvec, called directly (TSR_CPU_ISA is read once): (a),
 * (b), row-range independence, and a one-segment call equals the plain matvec. */
TSR_TEST(test_seg_kernels_every_isa) {
    for (int isa = TSR__ISA_SCALAR; isa <= TSR__ISA_AVX512; isa++) {
        const tsr__cpu_kernels *k = tsr__cpu_kernels_for((tsr__cpu_isa)isa);
        if (!k) continue;
        for (int di = 0; di < 3; di++) {
            for (int li = 0; li < N_LAYOUTS; li++) {
                layout l = layout_get(li);
                int64_t rows = l.rows, cols = l.seg[l.n];
                wmat w;
                wmat_make(&w, kDtypes[di], rows, cols);
                ASSERT_TRUE(seg_fn(k, kDtypes[di]) != NULL);
                for (int nx = 1; nx <= 4; nx++) {
                    float *x = x_make(nx, cols);
                    size_t m = (size_t)(nx * rows);
                    float *parts = tsr_malloc(m * (size_t)l.n * 4);
                    float *sum = tsr_malloc(m * 4), *ref = tsr_malloc(m * 4);
                    seg_call(k, &w.t, 0, rows, x, nx, l.seg, l.n, false, parts, rows,
                             (int64_t)m);
                    /* Row ranges 0..7, 7..rows: same bits. */
                    seg_call(k, &w.t, 0, 7, x, nx, l.seg, l.n, true, sum, rows, 0);
                    seg_call(k, &w.t, 7, rows, x, nx, l.seg, l.n, true, sum, rows, 0);
                    sum_parts(parts, l.n, m, ref);
                    if (!bits_eq(sum, ref, m))
                        TSR_FAIL_("%s dt %d layout %d nx %d: sum != ordered parts", k->name,
                                  di, li, nx);
                    /* Close to a double reference. */
                    for (int i = 0; i < nx; i++)
                        for (int64_t r = 0; r < rows; r++) {
                            double d = 0, a = 0;
                            for (int64_t c = 0; c < cols; c++) {
                                d += (double)w.f[r * cols + c] * x[i * cols + c];
                                a += fabs((double)w.f[r * cols + c] * x[i * cols + c]);
                            }
                            ASSERT_NEAR(sum[i * rows + r], d, 1e-5 * a + 1e-30);
                        }
                    /* (a): columns of parts [1, n-1) as their own matrix. */
                    int a0 = 1, a1 = l.n - 1;
                    wmat ws;
                    wmat_cols(&w, l.seg[a0], l.seg[a1], &ws);
                    float *xs = x_cols(x, nx, cols, l.seg[a0], l.seg[a1]);
                    int32_t sseg[16];
                    for (int p = a0; p <= a1; p++) sseg[p - a0] = l.seg[p] - l.seg[a0];
                    float *sp = tsr_malloc(m * (size_t)(a1 - a0) * 4);
                    seg_call(k, &ws.t, 0, rows, xs, nx, sseg, a1 - a0, false, sp, rows,
                             (int64_t)m);
                    if (!bits_eq(sp, parts + m * (size_t)a0, m * (size_t)(a1 - a0)))
                        TSR_FAIL_("%s dt %d layout %d nx %d: slice parts differ", k->name, di,
                                  li, nx);
                    /* One segment over all columns: the plain matvec's bits. */
                    int32_t one[2] = {0, (int32_t)cols};
                    seg_call(k, &w.t, 0, rows, x, nx, one, 1, true, sum, rows, 0);
                    float *xm = x_for(k, &w.t, x, nx, one, 1);
                    if (w.t.dtype == TSR_F32)
                        k->matvec_f32(w.data, cols, 0, rows, xm, nx, ref, rows);
                    else if (w.t.dtype == TSR_BF16)
                        k->matvec_bf16(w.data, cols, 0, rows, xm, nx, ref, rows);
                    else
                        k->matvec_f16(w.data, cols, 0, rows, xm, nx, ref, rows);
                    tsr_free(xm);
                    if (!bits_eq(sum, ref, m))
                        TSR_FAIL_("%s dt %d layout %d nx %d: one segment != matvec", k->name,
                                  di, li, nx);
                    tsr_free(sp);
                    tsr_free(xs);
                    wmat_free(&ws);
                    tsr_free(parts);
                    tsr_free(sum);
                    tsr_free(ref);
                    tsr_free(x);
                }
                wmat_free(&w);
            }
        }
    }
}

/* Through the backend (decode and prefill paths), 1 and 2 threads. */
TSR_TEST(test_parts_backend) {
    static const int64_t ns[4] = {1, 3, 13, 40};
    tsr_backend *be[2];
    ASSERT_OK(tsr_backend_cpu_create(1, &be[0]));
    ASSERT_OK(tsr_backend_cpu_create(2, &be[1]));
    ASSERT_TRUE(be[0]->ops->matmul_parts != NULL);
    for (int di = 0; di < 3; di++) {
        for (int li = 0; li < N_LAYOUTS; li++) {
            layout l = layout_get(li);
            int64_t rows = l.rows, cols = l.seg[l.n];
            wmat w;
            wmat_make(&w, kDtypes[di], rows, cols);
            for (int ni = 0; ni < 4; ni++) {
                int64_t n = ns[ni];
                size_t m = (size_t)(n * rows);
                float *x = x_make(n, cols);
                float *parts[2], *sum[2];
                float *ref = tsr_malloc(m * 4), *mm = tsr_malloc(m * 4);
                for (int t = 0; t < 2; t++) {
                    parts[t] = tsr_malloc(m * (size_t)l.n * 4);
                    sum[t] = tsr_malloc(m * 4);
                    ASSERT_OK(be[t]->ops->matmul_parts(be[t], x, n, &w.t, l.seg, l.n, false,
                                                       parts[t]));
                    ASSERT_OK(be[t]->ops->matmul_parts(be[t], x, n, &w.t, l.seg, l.n, true,
                                                       sum[t]));
                }
                if (!bits_eq(parts[0], parts[1], m * (size_t)l.n) ||
                    !bits_eq(sum[0], sum[1], m))
                    TSR_FAIL_("dt %d layout %d n %lld: 1 vs 2 threads differ", di, li,
                              (long long)n);
                sum_parts(parts[0], l.n, m, ref);
                if (!bits_eq(sum[0], ref, m))
                    TSR_FAIL_("dt %d layout %d n %lld: sum != ordered parts", di, li,
                              (long long)n);
                /* Close to the plain matmul. */
                ASSERT_OK(be[0]->ops->matmul(be[0], x, n, &w.t, mm));
                for (int64_t i = 0; i < n; i++)
                    for (int64_t r = 0; r < rows; r++) {
                        double a = 0;
                        for (int64_t c = 0; c < cols; c++)
                            a += fabs((double)w.f[r * cols + c] * x[i * cols + c]);
                        ASSERT_NEAR(sum[0][i * rows + r], mm[i * rows + r], 1e-5 * a + 1e-30);
                    }
                /* (a) for tp-like shards: parts [a0, a1) of halves and quarters. */
                int cuts[5] = {0, l.n / 4, l.n / 2, (3 * l.n) / 4, l.n};
                for (int s = 0; s < 4; s++) {
                    int a0 = cuts[s], a1 = cuts[s + 1];
                    if (a1 <= a0) continue;
                    wmat ws;
                    wmat_cols(&w, l.seg[a0], l.seg[a1], &ws);
                    float *xs = x_cols(x, n, cols, l.seg[a0], l.seg[a1]);
                    int32_t sseg[16];
                    for (int p = a0; p <= a1; p++) sseg[p - a0] = l.seg[p] - l.seg[a0];
                    float *sp = tsr_malloc(m * (size_t)(a1 - a0) * 4);
                    for (int t = 0; t < 2; t++) {
                        ASSERT_OK(be[t]->ops->matmul_parts(be[t], xs, n, &ws.t, sseg, a1 - a0,
                                                           false, sp));
                        if (!bits_eq(sp, parts[0] + m * (size_t)a0, m * (size_t)(a1 - a0)))
                            TSR_FAIL_("dt %d layout %d n %lld parts [%d,%d) threads %d: slice "
                                      "parts differ", di, li, (long long)n, a0, a1, t + 1);
                    }
                    tsr_free(sp);
                    tsr_free(xs);
                    wmat_free(&ws);
                }
                for (int t = 0; t < 2; t++) {
                    tsr_free(parts[t]);
                    tsr_free(sum[t]);
                }
                tsr_free(ref);
                tsr_free(mm);
                tsr_free(x);
            }
            wmat_free(&w);
        }
    }
    tsr_backend_destroy(be[0]);
    tsr_backend_destroy(be[1]);
}

/* matmul on a contiguous row slice of W gives the rows' bits of the whole W (matvec and
 * sgemm panel paths), 1 and 2 threads. */
TSR_TEST(test_matmul_row_slice) {
    static const int64_t ns[6] = {1, 3, 12, 13, 40, 130};
    static const int64_t shapes[3][2] = {{172, 64}, {300, 96}, {640, 160}};
    tsr_backend *be[2];
    ASSERT_OK(tsr_backend_cpu_create(1, &be[0]));
    ASSERT_OK(tsr_backend_cpu_create(2, &be[1]));
    for (int di = 0; di < 3; di++) {
        for (int si = 0; si < 3; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            wmat w;
            wmat_make(&w, kDtypes[di], rows, cols);
            /* tp 2 and 4 shards, and uneven ones (hidden chunks of 172: 88 + 84). */
            int64_t cuts[][2] = {{0, rows / 2},      {rows / 2, rows}, {rows / 4, rows / 2},
                                 {3 * rows / 4, rows}, {0, 88},        {88, 172},
                                 {5, 21}};
            for (int ni = 0; ni < 6; ni++) {
                int64_t n = ns[ni];
                float *x = x_make(n, cols);
                float *y = tsr_malloc((size_t)(n * rows) * 4);
                float *ys = tsr_malloc((size_t)(n * rows) * 4);
                ASSERT_OK(be[0]->ops->matmul(be[0], x, n, &w.t, y));
                for (int t = 0; t < 2; t++) {
                    for (int ci = 0; ci < 7; ci++) {
                        int64_t r0 = cuts[ci][0], r1 = cuts[ci][1];
                        if (r1 > rows) continue;
                        tsr_tensor s = wmat_rows(&w, r0, r1);
                        ASSERT_OK(be[t]->ops->matmul(be[t], x, n, &s, ys));
                        for (int64_t i = 0; i < n; i++)
                            if (!bits_eq(ys + i * (r1 - r0), y + i * rows + r0,
                                         (size_t)(r1 - r0)))
                                TSR_FAIL_("dt %d %lldx%lld n %lld rows [%lld,%lld) threads %d: "
                                          "slice differs", di, (long long)rows, (long long)cols,
                                          (long long)n, (long long)r0, (long long)r1, t + 1);
                    }
                }
                tsr_free(y);
                tsr_free(ys);
                tsr_free(x);
            }
            wmat_free(&w);
        }
    }
    tsr_backend_destroy(be[0]);
    tsr_backend_destroy(be[1]);
}

TSR_TEST_MAIN(test_seg_kernels_every_isa, test_parts_backend, test_matmul_row_slice)
