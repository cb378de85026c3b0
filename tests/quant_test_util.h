/* Helpers of the quantized-weight tests (test_quant_q8, test_quant_q4, test_quant_q4k,
 * test_quant_q3k, test_quant_q5k, test_quant_q6k, test_fp8, test_gguf_blocks_q8): a
 * whole-file reader for the reference data, the tests' deterministic random numbers, the
 * check every integer gemv variant passes against the scalar one, the backends (cpu,
 * cpu-fenced) and their matmul against the scalar kernel's rows, an engine on a whole tiny
 * model with its teacher-forced logits, and a GGUF model natively against its f32
 * expansion. */
#ifndef TSR_TESTS_QUANT_TEST_UTIL_H
#define TSR_TESTS_QUANT_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "tests/test.h"

/* The whole file (NUL-terminated, so JSON reads as a string; free()), or NULL. */
static inline void *read_all(const char *path, size_t *len) {
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n < 0 ? NULL : malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

/* xorshift64, the same sequence in every test file (each has its own state). */
static uint64_t rng_state = 88172645463325252ull;
static inline uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* Uniform in [-1, 1). */
static inline float frand(void) {
    return (float)((double)(rng_next() >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}
static inline uint32_t urand(void) { return (uint32_t)(rng_next() >> 32); }

/* One call of a gemv kernel family (its own argument list inside): the variant table `kern`
 * over row groups [g0, g1) of the test's matrix for nx <= 4 of its quantized inputs, parts
 * bseg[0..n_parts] in blocks, as the *_internal.h gemv contracts. */
typedef void (*qt_gemv)(const void *kern, const void *ctx, int64_t g0, int64_t g1, int nx,
                        const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                        int64_t ldp);
/* Row r of input i computed in double from the same quantized values; *mag: sum of |terms|. */
typedef double (*qt_exact)(const void *ctx, int i, int64_t r, double *mag);

/* Variant `kern` against the scalar `ref` on a matrix of `rows` rows and nb blocks, for nx 1..4
 * inputs and three part layouts (one part; three uneven with one empty, summed; the same
 * apart): the variant, called in two row ranges (the same bits as one call), gives the
 * scalar's bits. exact (non-NULL): the scalar's one-part rows lie within 1e-6 of their
 * magnitude of exact's. */
static inline void qt_variant_vs_scalar(const char *name, const void *ref, const void *kern,
                                        qt_gemv gemv, const void *ctx, int64_t rows, int64_t nb,
                                        qt_exact exact) {
    int64_t ng = (rows + 15) / 16;
    int32_t one[2] = {0, (int32_t)nb};
    int32_t three[4] = {0, (int32_t)(nb / 3), (int32_t)(nb / 3), (int32_t)nb};
    for (int nx = 1; nx <= 4; nx++)
        for (int mode = 0; mode < 3; mode++) {
            const int32_t *bs = mode == 0 ? one : three;
            int np = mode == 0 ? 1 : 3;
            bool sum = mode != 2;
            size_t ny = (size_t)(np * 4 * rows);
            float *y0 = tsr_calloc(ny, 4), *y1 = tsr_calloc(ny, 4);
            if (!y0 || !y1) {
                tsr_free(y0);
                tsr_free(y1);
                TSR_FAIL_("out of memory");
            }
            gemv(ref, ctx, 0, ng, nx, bs, np, sum, y0, rows, 4 * rows);
            gemv(kern, ctx, 0, ng / 2, nx, bs, np, sum, y1, rows, 4 * rows);
            gemv(kern, ctx, ng / 2, ng, nx, bs, np, sum, y1, rows, 4 * rows);
            bool same = !memcmp(y0, y1, ny * 4);
            int bad_i = -1;
            int64_t bad_r = 0;
            double bad_g = 0, bad_e = 0, bad_mag = 0;
            if (exact && mode == 0)
                for (int i = 0; i < nx && bad_i < 0; i++)
                    for (int64_t r = 0; r < rows; r++) {
                        double mag, e = exact(ctx, i, r, &mag), g = y0[i * rows + r];
                        if (fabs(g - e) > 1e-6 * mag + 1e-30) {
                            bad_i = i;
                            bad_r = r;
                            bad_g = g;
                            bad_e = e;
                            bad_mag = mag;
                            break;
                        }
                    }
            tsr_free(y0);
            tsr_free(y1);
            if (!same)
                TSR_FAIL_("%s: rows %lld blocks %lld nx %d mode %d differ from scalar", name,
                          (long long)rows, (long long)nb, nx, mode);
            if (bad_i >= 0)
                TSR_FAIL_("scalar: rows %lld blocks %lld input %d row %lld: %g vs exact %g "
                          "(mag %g)", (long long)rows, (long long)nb, bad_i, (long long)bad_r,
                          bad_g, bad_e, bad_mag);
        }
}

/* The backends a quantized matmul must agree on: cpu with 1 and 2 threads, then the fenced
 * device (be[n - 1] == fen) where it starts (else a note, and n is 2). */
typedef struct qt_backends {
    tsr_backend *be[3];
    int n;
    tsr_backend *fen;
} qt_backends;

static inline void qt_backends_open(qt_backends *b) {
    memset(b, 0, sizeof *b);
    for (int threads = 1; threads <= 2; threads++) {
        ASSERT_OK(tsr_backend_cpu_create(threads, &b->be[b->n]));
        b->n++;
    }
    if (tsr_backend_fenced_create(2, 64u << 20, &b->fen) == TSR_OK)
        b->be[b->n++] = b->fen;
    else
        fprintf(stderr, "  cpu-fenced: %s\n", tsr_last_error());
}

static inline void qt_backends_close(qt_backends *b) {
    for (int i = 0; i < b->n; i++) tsr_backend_destroy(b->be[i]);
    memset(b, 0, sizeof *b);
}

/* The backends of bs (on the fenced device: W placed, x and y in its memory) give the scalar
 * kernel's bits: matmul of w (n inputs x) equals want [n, rows], matmul_parts over the three
 * parts seg[0..3] apart equals wantp [3, n, rows]; a part boundary at column `bad` (inside a
 * block) is refused, naming the dtype. */
static inline void qt_backends_agree(const qt_backends *bs, const tsr_tensor *w, const float *x,
                                     int64_t n, const int32_t *seg, int32_t bad,
                                     const float *want, const float *wantp) {
    int64_t rows = w->rows, cols = w->cols;
    const tsr_backend *fen = bs->fen;
    for (int b = 0; b < bs->n; b++) {
        tsr_backend *be = bs->be[b];
        tsr_tensor dw = *w;
        float *dx = (float *)x, *dy = NULL, *hy = tsr_malloc((size_t)(3 * n * rows) * 4);
        bool copied = false;
        if (be == fen) {
            ASSERT_OK(tsr_backend_place_tensor(be, w, &dw, &copied));
            ASSERT_OK(be->ops->buffer_alloc(be, (size_t)(n * cols) * 4, (void **)&dx));
            ASSERT_OK(tsr_backend_upload(be, dx, x, (size_t)(n * cols) * 4));
            ASSERT_OK(be->ops->buffer_alloc(be, (size_t)(3 * n * rows) * 4, (void **)&dy));
        } else {
            dy = hy;
        }
        ASSERT_OK(be->ops->matmul(be, dx, n, &dw, dy));
        if (be == fen) ASSERT_OK(tsr_backend_download(be, hy, dy, (size_t)(n * rows) * 4));
        if (memcmp(hy, want, (size_t)(n * rows) * 4))
            TSR_FAIL_("backend %d: matmul %lldx%lld n %lld differs", b, (long long)rows,
                      (long long)cols, (long long)n);
        ASSERT_OK(be->ops->matmul_parts(be, dx, n, &dw, seg, 3, false, dy));
        if (be == fen) ASSERT_OK(tsr_backend_download(be, hy, dy, (size_t)(3 * n * rows) * 4));
        if (memcmp(hy, wantp, (size_t)(3 * n * rows) * 4))
            TSR_FAIL_("backend %d: matmul_parts n %lld differs", b, (long long)n);
        int32_t cut[3] = {0, bad, (int32_t)cols};
        ASSERT_EQ_INT(be->ops->matmul_parts(be, dx, n, &dw, cut, 2, true, dy),
                      TSR_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(tsr_last_error(), tsr_dtype_name(w->dtype));
        if (be == fen) {
            be->ops->buffer_free(be, dx);
            be->ops->buffer_free(be, dy);
            if (copied) be->ops->buffer_free(be, (void *)dw.data);
        }
        tsr_free(hy);
    }
}

/* ---- whole tiny models (test_quant_q4k, test_quant_q6k) ---- */

/* A cpu engine (2 threads, one sequence, dense KV for max_n tokens) borrowing m. */
static inline tsr_engine *qt_engine(tsr_model *m, int max_n) {
    tsr_engine_spec eo = {.backend = "cpu", .threads = 2, .max_tokens = 512,
                          .kv = {.max_seqs = 1}, .dense_kv_tokens = max_n + 8,
                          .borrow_model = true};
    eo.model = m;
    tsr_engine *e = NULL;
    if (tsr_engine_create(&eo, &e) != TSR_OK) return NULL;
    return e;
}

static inline int32_t qt_argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Teacher-forced logits of ids (every position) from a fresh sequence 0. */
static inline tsr_status qt_all_logits(tsr_engine *e, const int32_t *ids, int n, float *out) {
    e->kv->ops->seq_free(e->kv, 0);
    TSR_TRY(e->kv->ops->seq_add(e->kv, 0));
    tsr_batch_seq s = {.seq = 0, .tokens = ids, .n_tokens = n, .want_logits = true,
                       .all_logits = true};
    int got = 0;
    return tsr_forward_run(e->fwd, e->kv, &s, 1, out, &got);
}

/* The GGUF model at path loads with these dtypes: the model's name, the embedding, the
 * classifier and layer 0's wq, wo, wv and w_down. */
static inline void qt_expect_dtypes(const char *path, tsr_dtype model, tsr_dtype emb,
                                    tsr_dtype cls, tsr_dtype wq, tsr_dtype wo, tsr_dtype wv,
                                    tsr_dtype w_down) {
    tsr_model *m;
    ASSERT_OK(tsr_model_load(path, &m));
    const tsr_layer_weights *l = &m->layers[0];
    tsr_dtype got[7] = {m->cfg.dtype, m->tok_emb.dtype, m->classifier.dtype, l->wq.dtype,
                        l->wo.dtype, l->wv.dtype, l->w_down.dtype};
    tsr_dtype want[7] = {model, emb, cls, wq, wo, wv, w_down};
    static const char *const what[7] = {"model", "embedding", "classifier", "wq", "wo", "wv",
                                        "w_down"};
    tsr_model_destroy(m);
    for (int i = 0; i < 7; i++)
        if (got[i] != want[i])
            TSR_FAIL_("%s: %s is %s, expected %s", path, what[i], tsr_dtype_name(got[i]),
                      tsr_dtype_name(want[i]));
}

/* The largest logit of x less the second largest. */
static inline double qt_top2_margin(const float *x, int n) {
    int32_t b = qt_argmax(x, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return (double)x[b] - second;
}

/* got against ref, N rows of V logits: the largest |difference| (*worst), ref's rms, the rows
 * whose argmax agrees (*top1) and the disagreements that are no near-tie (*real: ref's own
 * top-2 margin above twice *worst). */
static inline void qt_compare_logits(const float *ref, const float *got, int N, int V,
                                     double *worst, double *rms, int *top1, int *real) {
    double w = 0, var = 0;
    for (int i = 0; i < N * V; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= w)) w = d;
        var += (double)ref[i] * ref[i];
    }
    *top1 = *real = 0;
    for (int r = 0; r < N; r++) {
        bool same = qt_argmax(got + r * V, V) == qt_argmax(ref + r * V, V);
        *top1 += same;
        *real += !same && qt_top2_margin(ref + r * V, V) > 2 * w;
    }
    *worst = w;
    *rms = sqrt(var / ((double)N * V));
}

/* A GGUF file natively and expanded to f32 (TSR_GGUF_DEQUANT=1: the same weight values,
 * f32 activations), teacher-forced over 16 tokens. Passes when the largest |logit diff| is
 * at most tol times the expansion's logit rms and every top-1 disagreement is a near-tie
 * (the expansion's own top-2 margin at most twice that largest difference): the cost of
 * 8-bit activations passes, a broken kernel or layout (differences the logits' whole size)
 * does not. `what` names the model in the line printed. */
static inline void qt_native_vs_expanded(const char *path, const char *what, double tol) {
    tsr_model *mq, *mf;
    ASSERT_OK(tsr_model_load(path, &mq));
    setenv("TSR_GGUF_DEQUANT", "1", 1);
    tsr_status ls = tsr_model_load(path, &mf);
    unsetenv("TSR_GGUF_DEQUANT");
    ASSERT_OK(ls);
    ASSERT_EQ_INT(mf->layers[0].w_down.dtype, TSR_F32);
    int V = mq->cfg.vocab_size, N = 16;
    tsr_engine *eq = qt_engine(mq, N), *ef = qt_engine(mf, N);
    ASSERT_TRUE(eq && ef);
    int32_t ids[16] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104};
    float *lq = tsr_malloc((size_t)N * (size_t)V * 4), *lf = tsr_malloc((size_t)N * (size_t)V * 4);
    ASSERT_OK(qt_all_logits(eq, ids, N, lq));
    ASSERT_OK(qt_all_logits(ef, ids, N, lf));
    double worst, rms;
    int top1, real;
    qt_compare_logits(lf, lq, N, V, &worst, &rms, &top1, &real);
    double ratio = worst / rms;
    fprintf(stderr, "  %s, native vs f32 expansion: max abs logit diff %.3g, logit rms %.3g, "
            "ratio %.3g (tol %g), top-1 %d/%d, %d disagreeing beyond a near-tie\n", what,
            worst, rms, ratio, tol, top1, N, real);
    tsr_free(lq);
    tsr_free(lf);
    tsr_engine_destroy(eq);
    tsr_engine_destroy(ef);
    tsr_model_destroy(mq);
    tsr_model_destroy(mf);
    ASSERT_TRUE(ratio <= tol);
    ASSERT_EQ_INT(real, 0);
}

#endif
