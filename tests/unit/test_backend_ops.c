/* Every op of every built backend against the CPU backend (llama.cpp's test-backend-ops).
 * The reference is the CPU backend on one thread; the backends under test are the CPU on
 * three threads and, when built and a device answers, CUDA. Without a GPU the CUDA half is
 * skipped with a line saying so. Inputs are seeded pseudo-random; each comparison prints
 * its worst error against a tolerance scaled to the op's magnitudes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "tests/test.h"
#ifdef TSR_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

#define MAX_TARGETS 2

/* ---- backends: the reference and the ones under test ---- */

typedef struct targets {
    tsr_backend *ref;
    tsr_backend *be[MAX_TARGETS];
    const char *label[MAX_TARGETS];
    int n;
} targets;

static int cuda_note_printed;

static tsr_status targets_open(targets *t) {
    memset(t, 0, sizeof *t);
    TSR_TRY(tsr_backend_cpu_create(1, &t->ref));
    TSR_TRY(tsr_backend_cpu_create(3, &t->be[t->n]));
    t->label[t->n++] = "cpu/3";
#ifdef TSR_HAVE_CUDA
    if (tsr_backend_cuda_create(0, &t->be[t->n]) == TSR_OK) {
        t->label[t->n++] = "cuda";
        if (!cuda_note_printed++)
            printf("test_backend_ops: CUDA backend on %s\n",
                   tsr_backend_cuda_device_name(t->be[t->n - 1]));
    } else if (!cuda_note_printed++) {
        printf("test_backend_ops: CUDA backend not available (%s): skipped CUDA\n",
               tsr_last_error());
    }
#else
    if (!cuda_note_printed++)
        printf("test_backend_ops: built without CUDA (TESSERA_CUDA=OFF): skipped CUDA\n");
#endif
    tsr_error_clear();
    return TSR_OK;
}

static void targets_close(targets *t) {
    tsr_backend_destroy(t->ref);
    for (int i = 0; i < t->n; i++) tsr_backend_destroy(t->be[i]);
}

static int on_device(const tsr_backend *be) {
    return be->device >= 0;
}

/* Backend memory holding a copy of `bytes` of host data (or uninitialized when src NULL). */
static void *be_dup(tsr_backend *be, const void *src, size_t bytes) {
    void *p = NULL;
    if (be->ops->buffer_alloc(be, bytes, &p) != TSR_OK) return NULL;
    if (!src) return p;
#ifdef TSR_HAVE_CUDA
    if (on_device(be)) {
        if (tsr_backend_cuda_set(be, p, src, bytes) != TSR_OK) {
            be->ops->buffer_free(be, p);
            return NULL;
        }
        return p;
    }
#endif
    memcpy(p, src, bytes);
    return p;
}

static tsr_status be_read(tsr_backend *be, void *dst, const void *src, size_t bytes) {
    TSR_TRY(be->ops->synchronize(be));
#ifdef TSR_HAVE_CUDA
    if (on_device(be)) return tsr_backend_cuda_get(be, dst, src, bytes);
#endif
    memcpy(dst, src, bytes);
    return TSR_OK;
}

static void be_release(tsr_backend *be, const void *p) {
    if (p) be->ops->buffer_free(be, (void *)p);
}

/* The tensor as the backend reads weights: host tensors for the CPU, uploaded otherwise. */
static tsr_status be_tensor(tsr_backend *be, const tsr_tensor *host, tsr_tensor *out) {
    *out = *host;
    if (!on_device(be)) return TSR_OK;
    void *p = be_dup(be, host->data, tsr_tensor_bytes(host));
    if (!p) return tsr_error_set(TSR_ERR_NOMEM, "test: cannot place a weight on %s", be->ops->name);
    out->data = p;
    return TSR_OK;
}

static void be_tensor_release(tsr_backend *be, tsr_tensor *t) {
    if (on_device(be)) be_release(be, t->data);
}

/* ---- inputs and comparison ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *rand_floats(size_t n, float scale) {
    float *p = tsr_malloc(n * sizeof(float));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* A host tensor of dtype t with values from f (rounded to t), owning its data. */
static tsr_tensor make_tensor(tsr_dtype t, int64_t rows, int64_t cols, const float *f) {
    tsr_tensor w = {.dtype = t, .rows = rows, .cols = cols};
    size_t n = (size_t)(rows * cols);
    void *d = tsr_malloc(n * tsr_dtype_size(t));
    if (d)
        for (size_t i = 0; i < n; i++) {
            if (t == TSR_F32)
                ((float *)d)[i] = f[i];
            else if (t == TSR_BF16)
                ((uint16_t *)d)[i] = tsr_f32_to_bf16(f[i]);
            else
                ((uint16_t *)d)[i] = tsr_f32_to_f16(f[i]);
        }
    w.data = d;
    return w;
}

/* Largest |got - want| / tol[i] (tol NULL: a constant tol0); prints one figure line. */
static double compare(const char *what, const char *label, const float *got, const float *want,
                      size_t n, const float *tol, double tol0) {
    double worst = 0, worst_abs = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        double r = e / (tol ? (double)tol[i] : tol0);
        if (isnan(got[i]) != isnan(want[i])) r = INFINITY;
        if (r > worst) worst = r;
        if (e > worst_abs) worst_abs = e;
    }
    printf("  %-44s %-6s max abs err %.3e  (%.3f of tolerance)\n", what, label, worst_abs, worst);
    return worst;
}

/* ---- ops ---- */

static void check_matmul(tsr_dtype dt, int64_t n, int64_t rows, int64_t cols) {
    targets t;
    ASSERT_OK(targets_open(&t));
    float *wf = rand_floats((size_t)(rows * cols), 0.5f);
    float *x = rand_floats((size_t)(n * cols), 1.0f);
    float *want = tsr_malloc((size_t)(n * rows) * sizeof(float));
    float *got = tsr_malloc((size_t)(n * rows) * sizeof(float));
    float *tol = tsr_malloc((size_t)(n * rows) * sizeof(float));
    tsr_tensor w = make_tensor(dt, rows, cols, wf);
    ASSERT_OK(t.ref->ops->matmul(t.ref, x, n, &w, want));
    /* Bound per output: sum |w||x| times the rounding of the GEMM's inputs. F32 runs in
     * FP32 everywhere; BF16/F16 GEMMs on the GPU round x to the weight type first. */
    double eps = dt == TSR_F32 ? 2e-6 : dt == TSR_BF16 ? 8e-3 : 1.5e-3;
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += fabs(wf[r * cols + c] * x[i * cols + c]);
            tol[i * rows + r] = (float)(eps * s + 1e-6);
        }
    char what[64];
    snprintf(what, sizeof what, "matmul %s n=%lld %lldx%lld", tsr_dtype_name(dt), (long long)n,
             (long long)rows, (long long)cols);
    for (int b = 0; b < t.n; b++) {
        tsr_backend *be = t.be[b];
        tsr_tensor wd;
        ASSERT_OK(be_tensor(be, &w, &wd));
        float *dx = be_dup(be, x, (size_t)(n * cols) * sizeof(float));
        float *dy = be_dup(be, NULL, (size_t)(n * rows) * sizeof(float));
        ASSERT_TRUE(dx && dy);
        ASSERT_OK(be->ops->matmul(be, dx, n, &wd, dy));
        ASSERT_OK(be_read(be, got, dy, (size_t)(n * rows) * sizeof(float)));
        ASSERT_TRUE(compare(what, t.label[b], got, want, (size_t)(n * rows), tol, 0) <= 1.0);
        be_release(be, dx);
        be_release(be, dy);
        be_tensor_release(be, &wd);
    }
    tsr_free((void *)w.data);
    tsr_free(wf);
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    tsr_free(tol);
    targets_close(&t);
}

TSR_TEST(test_matmul_f32) {
    check_matmul(TSR_F32, 1, 64, 96);
    check_matmul(TSR_F32, 17, 130, 72);
}

TSR_TEST(test_matmul_bf16) {
    check_matmul(TSR_BF16, 1, 96, 64);
    check_matmul(TSR_BF16, 9, 64, 200);
}

TSR_TEST(test_matmul_f16) {
    check_matmul(TSR_F16, 5, 48, 64);
}

static void check_rmsnorm(tsr_dtype dt, int64_t n, int dim, int in_place) {
    targets t;
    ASSERT_OK(targets_open(&t));
    float *x = rand_floats((size_t)(n * dim), 2.0f);
    float *wf = rand_floats((size_t)dim, 1.0f);
    float *want = tsr_malloc((size_t)(n * dim) * sizeof(float));
    float *got = tsr_malloc((size_t)(n * dim) * sizeof(float));
    tsr_tensor w = make_tensor(dt, 1, dim, wf);
    ASSERT_OK(t.ref->ops->rmsnorm(t.ref, x, &w, n, dim, 1e-5f, want));
    char what[64];
    snprintf(what, sizeof what, "rmsnorm %s n=%lld dim=%d%s", tsr_dtype_name(dt), (long long)n, dim,
             in_place ? " in place" : "");
    for (int b = 0; b < t.n; b++) {
        tsr_backend *be = t.be[b];
        tsr_tensor wd;
        ASSERT_OK(be_tensor(be, &w, &wd));
        float *dx = be_dup(be, x, (size_t)(n * dim) * sizeof(float));
        float *dy = in_place ? dx : be_dup(be, NULL, (size_t)(n * dim) * sizeof(float));
        ASSERT_TRUE(dx && dy);
        ASSERT_OK(be->ops->rmsnorm(be, dx, &wd, n, dim, 1e-5f, dy));
        ASSERT_OK(be_read(be, got, dy, (size_t)(n * dim) * sizeof(float)));
        ASSERT_TRUE(compare(what, t.label[b], got, want, (size_t)(n * dim), NULL, 2e-5) <= 1.0);
        if (!in_place) be_release(be, dy);
        be_release(be, dx);
        be_tensor_release(be, &wd);
    }
    tsr_free((void *)w.data);
    tsr_free(x);
    tsr_free(wf);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_rmsnorm) {
    check_rmsnorm(TSR_F32, 5, 64, 0);
    check_rmsnorm(TSR_F32, 3, 1000, 1);
    check_rmsnorm(TSR_BF16, 2, 100, 0);
}

static void check_rope(int interleaved, int llama3, int head_dim, int n_heads, int max_pos) {
    targets t;
    ASSERT_OK(targets_open(&t));
    tsr_model_config cfg = {.head_dim = head_dim,
                            .rope_theta = llama3 ? 500000.0f : 10000.0f,
                            .rope_interleaved = interleaved,
                            .rope_scaling = llama3 ? TSR_ROPE_LLAMA3 : TSR_ROPE_NONE,
                            .rope_factor = 32.0f,
                            .rope_low_freq_factor = 1.0f,
                            .rope_high_freq_factor = 4.0f,
                            .rope_original_max_pos = 8192};
    const int64_t n = 7;
    size_t count = (size_t)(n * n_heads * head_dim);
    int32_t pos[7] = {0, 1, 2, 17, 255, max_pos / 2, max_pos};
    float *x = rand_floats(count, 1.0f);
    float *want = tsr_malloc(count * sizeof(float));
    float *got = tsr_malloc(count * sizeof(float));
    memcpy(want, x, count * sizeof(float));
    ASSERT_OK(t.ref->ops->rope(t.ref, want, pos, n, n_heads, &cfg));
    char what[64];
    snprintf(what, sizeof what, "rope %s%s hd=%d pos<=%d", interleaved ? "interleaved" : "halves",
             llama3 ? " llama3" : "", head_dim, max_pos);
    /* The angle pos * inv_freq is the same float on every backend; cos/sin of it may differ
     * by an ulp or two, of the result's magnitude (|x| < 1.5 here). */
    for (int b = 0; b < t.n; b++) {
        tsr_backend *be = t.be[b];
        float *dx = be_dup(be, x, count * sizeof(float));
        int32_t *dpos = be_dup(be, pos, sizeof pos);
        ASSERT_TRUE(dx && dpos);
        ASSERT_OK(be->ops->rope(be, dx, dpos, n, n_heads, &cfg));
        ASSERT_OK(be_read(be, got, dx, count * sizeof(float)));
        ASSERT_TRUE(compare(what, t.label[b], got, want, count, NULL, 2e-6) <= 1.0);
        be_release(be, dx);
        /* positions in host memory are accepted too (staged by device backends) */
        dx = be_dup(be, x, count * sizeof(float));
        ASSERT_TRUE(dx != NULL);
        ASSERT_OK(be->ops->rope(be, dx, pos, n, n_heads, &cfg));
        ASSERT_OK(be_read(be, got, dx, count * sizeof(float)));
        ASSERT_TRUE(compare("  (host positions)", t.label[b], got, want, count, NULL, 2e-6) <= 1.0);
        be_release(be, dx);
        be_release(be, dpos);
    }
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_rope) {
    check_rope(1, 0, 64, 3, 511);
    check_rope(0, 0, 64, 2, 4095);
    check_rope(0, 1, 128, 2, 131071);
    check_rope(1, 1, 32, 4, 100000);
}

TSR_TEST(test_swiglu_add) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int64_t n = 70000; /* over the CPU's threading threshold */
    float *g = rand_floats((size_t)n, 6.0f);
    float *u = rand_floats((size_t)n, 2.0f);
    float *want_s = tsr_malloc((size_t)n * sizeof(float));
    float *want_a = tsr_malloc((size_t)n * sizeof(float));
    float *got = tsr_malloc((size_t)n * sizeof(float));
    memcpy(want_s, g, (size_t)n * sizeof(float));
    memcpy(want_a, g, (size_t)n * sizeof(float));
    ASSERT_OK(t.ref->ops->swiglu(t.ref, want_s, u, n));
    ASSERT_OK(t.ref->ops->add(t.ref, want_a, u, n));
    for (int b = 0; b < t.n; b++) {
        tsr_backend *be = t.be[b];
        float *dg = be_dup(be, g, (size_t)n * sizeof(float));
        float *da = be_dup(be, g, (size_t)n * sizeof(float));
        float *du = be_dup(be, u, (size_t)n * sizeof(float));
        ASSERT_TRUE(dg && da && du);
        ASSERT_OK(be->ops->swiglu(be, dg, du, n));
        ASSERT_OK(be->ops->add(be, da, du, n));
        ASSERT_OK(be_read(be, got, dg, (size_t)n * sizeof(float)));
        ASSERT_TRUE(compare("swiglu n=70000", t.label[b], got, want_s, (size_t)n, NULL, 1e-5) <=
                    1.0);
        ASSERT_OK(be_read(be, got, da, (size_t)n * sizeof(float)));
        ASSERT_TRUE(compare("add n=70000", t.label[b], got, want_a, (size_t)n, NULL, 0.5e-6) <=
                    1.0);
        be_release(be, dg);
        be_release(be, da);
        be_release(be, du);
    }
    tsr_free(g);
    tsr_free(u);
    tsr_free(want_s);
    tsr_free(want_a);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_embed) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int64_t vocab = 50, dim = 72, n = 6;
    int32_t ids[6] = {0, 49, 7, 7, 23, 1};
    int32_t bad[2] = {3, 50};
    float *tab = rand_floats((size_t)(vocab * dim), 1.0f);
    float *want = tsr_malloc((size_t)(n * dim) * sizeof(float));
    float *got = tsr_malloc((size_t)(n * dim) * sizeof(float));
    tsr_dtype dts[3] = {TSR_F32, TSR_BF16, TSR_F16};
    for (int d = 0; d < 3; d++) {
        tsr_tensor emb = make_tensor(dts[d], vocab, dim, tab);
        ASSERT_OK(t.ref->ops->embed(t.ref, &emb, ids, n, want));
        char what[64];
        snprintf(what, sizeof what, "embed %s n=%lld dim=%lld", tsr_dtype_name(dts[d]),
                 (long long)n, (long long)dim);
        for (int b = 0; b < t.n; b++) {
            tsr_backend *be = t.be[b];
            tsr_tensor ed;
            ASSERT_OK(be_tensor(be, &emb, &ed));
            int32_t *dids = be_dup(be, ids, sizeof ids);
            int32_t *dbad = be_dup(be, bad, sizeof bad);
            float *dout = be_dup(be, NULL, (size_t)(n * dim) * sizeof(float));
            ASSERT_TRUE(dids && dbad && dout);
            ASSERT_OK(be->ops->embed(be, &ed, dids, n, dout));
            ASSERT_OK(be_read(be, got, dout, (size_t)(n * dim) * sizeof(float)));
            ASSERT_TRUE(compare(what, t.label[b], got, want, (size_t)(n * dim), NULL, 1e-30) <=
                        1.0);
            /* an id past the vocabulary is an error, from backend or host memory alike */
            ASSERT_EQ_INT(be->ops->embed(be, &ed, dbad, 2, dout), TSR_ERR_INVALID);
            ASSERT_EQ_INT(be->ops->embed(be, &ed, bad, 2, dout), TSR_ERR_INVALID);
            ASSERT_STR_CONTAINS(tsr_last_error(), "out of range");
            be_release(be, dids);
            be_release(be, dbad);
            be_release(be, dout);
            be_tensor_release(be, &ed);
        }
        tsr_free((void *)emb.data);
    }
    tsr_free(tab);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* ---- attention ---- */

/* One attention case: spans of `lens` keys each (positions contiguous, or scattered through a
 * pos array when `scattered`), queries at the last n_q positions. */
typedef struct attn_case {
    const char *what;
    int n_q, n_heads, n_kv_heads, head_dim;
    int n_spans;
    int lens[4];
    int scattered;
    int scores;
} attn_case;

static void check_attention(const attn_case *ac) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int hd = ac->head_dim, kv_dim = ac->n_kv_heads * hd;
    const int64_t stride = kv_dim + 8; /* padded rows: strides are honoured */
    int64_t keys = 0;
    for (int s = 0; s < ac->n_spans; s++) keys += ac->lens[s];
    size_t qn = (size_t)ac->n_q * (size_t)(ac->n_heads * hd);
    float *q = rand_floats(qn, 1.5f);
    float *kv[2] = {rand_floats((size_t)(keys * stride), 1.5f),
                    rand_floats((size_t)(keys * stride), 1.0f)};
    int32_t *kpos = tsr_malloc((size_t)keys * sizeof(int32_t));
    int32_t *qpos = tsr_malloc((size_t)ac->n_q * sizeof(int32_t));
    /* Scattered: a cache that dropped tokens keeps their original positions (gaps of 3). */
    for (int64_t i = 0; i < keys; i++) kpos[i] = (int32_t)(ac->scattered ? 3 * i + 1 : i);
    for (int i = 0; i < ac->n_q; i++) qpos[i] = kpos[keys - ac->n_q + i];
    size_t ksn = (size_t)(ac->n_heads * keys); /* per query head */
    float *want = tsr_malloc(qn * sizeof(float)), *got = tsr_malloc(qn * sizeof(float));
    float *want_ks = tsr_malloc(ksn * sizeof(float)), *got_ks = tsr_malloc(ksn * sizeof(float));
    float *zeros = tsr_calloc(ksn, sizeof(float));
    tsr_kv_span spans[4];
    tsr_attn_args a = {.n_q = ac->n_q,
                       .spans = spans,
                       .n_spans = ac->n_spans,
                       .n_heads = ac->n_heads,
                       .n_kv_heads = ac->n_kv_heads,
                       .head_dim = hd};
    for (int b = -1; b < t.n; b++) {
        tsr_backend *be = b < 0 ? t.ref : t.be[b];
        float *dq = be_dup(be, q, qn * sizeof(float));
        float *dk = be_dup(be, kv[0], (size_t)(keys * stride) * sizeof(float));
        float *dv = be_dup(be, kv[1], (size_t)(keys * stride) * sizeof(float));
        int32_t *dkpos = be_dup(be, kpos, (size_t)keys * sizeof(int32_t));
        int32_t *dqpos = be_dup(be, qpos, (size_t)ac->n_q * sizeof(int32_t));
        float *dout = be_dup(be, NULL, qn * sizeof(float));
        float *dks = ac->scores ? be_dup(be, zeros, ksn * sizeof(float)) : NULL;
        ASSERT_TRUE(dq && dk && dv && dkpos && dqpos && dout && (dks || !ac->scores));
        int64_t off = 0;
        for (int s = 0; s < ac->n_spans; s++) {
            spans[s] = (tsr_kv_span){.k = dk + off * stride,
                                     .v = dv + off * stride,
                                     .pos = ac->scattered ? dkpos + off : NULL,
                                     .pos0 = (int32_t)off,
                                     .n = ac->lens[s],
                                     .stride = stride};
            off += ac->lens[s];
        }
        a.q = dq;
        a.q_pos = dqpos;
        a.out = dout;
        a.key_scores = dks;
        ASSERT_OK(be->ops->attention(be, &a));
        if (b < 0) {
            ASSERT_OK(be_read(be, want, dout, qn * sizeof(float)));
            if (dks) ASSERT_OK(be_read(be, want_ks, dks, ksn * sizeof(float)));
        } else {
            ASSERT_OK(be_read(be, got, dout, qn * sizeof(float)));
            ASSERT_TRUE(compare(ac->what, t.label[b], got, want, qn, NULL, 2e-5) <= 1.0);
            if (dks) {
                char what[80];
                snprintf(what, sizeof what, "%s scores", ac->what);
                ASSERT_OK(be_read(be, got_ks, dks, ksn * sizeof(float)));
                ASSERT_TRUE(compare(what, t.label[b], got_ks, want_ks, ksn, NULL, 2e-5) <= 1.0);
            }
        }
        be_release(be, dq);
        be_release(be, dk);
        be_release(be, dv);
        be_release(be, dkpos);
        be_release(be, dqpos);
        be_release(be, dout);
        be_release(be, dks);
    }
    tsr_free(q);
    tsr_free(kv[0]);
    tsr_free(kv[1]);
    tsr_free(kpos);
    tsr_free(qpos);
    tsr_free(want);
    tsr_free(got);
    tsr_free(want_ks);
    tsr_free(got_ks);
    tsr_free(zeros);
    targets_close(&t);
}

TSR_TEST(test_attention_decode) {
    attn_case c1 = {"attn decode gqa4 hd64 1 span", 1, 8, 2, 64, 1, {37}, 0, 0};
    check_attention(&c1);
    attn_case c2 = {"attn decode hd128 3 spans+scores", 1, 4, 4, 128, 3, {16, 16, 300}, 0, 1};
    check_attention(&c2);
}

TSR_TEST(test_attention_prefill) {
    attn_case c1 = {"attn prefill gqa2 hd64 300 keys", 40, 4, 2, 64, 1, {300}, 0, 1};
    check_attention(&c1);
    attn_case c2 = {"attn prefill hd48 4 spans", 25, 6, 3, 48, 4, {5, 130, 1, 20}, 0, 0};
    check_attention(&c2);
    attn_case c3 = {"attn prefill hd160 scattered+scores", 12, 2, 1, 160, 2, {90, 60}, 1, 1};
    check_attention(&c3);
}

/* ---- timings (TSR_BENCH=1; tests/device/run.sh) ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of matmul on `be` (best of `reps` after a warm-up). */
static double time_matmul(tsr_backend *be, tsr_dtype dt, int64_t n, int64_t rows, int64_t cols,
                          int reps) {
    size_t wn = (size_t)(rows * cols);
    float *wf = rand_floats(wn, 0.1f);
    tsr_tensor w = make_tensor(dt, rows, cols, wf), wd;
    tsr_free(wf);
    double best = INFINITY;
    float *x = rand_floats((size_t)(n * cols), 1.0f);
    float *dx = be_dup(be, x, (size_t)(n * cols) * sizeof(float));
    float *dy = be_dup(be, NULL, (size_t)(n * rows) * sizeof(float));
    if (dx && dy && be_tensor(be, &w, &wd) == TSR_OK) {
        for (int r = 0; r <= reps; r++) {
            double t0 = now_s();
            if (be->ops->matmul(be, dx, n, &wd, dy) != TSR_OK) break;
            if (be->ops->synchronize(be) != TSR_OK) break;
            if (r > 0 && now_s() - t0 < best) best = now_s() - t0;
        }
        be_tensor_release(be, &wd);
    }
    be_release(be, dx);
    be_release(be, dy);
    tsr_free(x);
    tsr_free((void *)w.data);
    return best;
}

/* Seconds of one causal attention call: n_q queries at the end of n_k contiguous keys. */
static double time_attention(tsr_backend *be, int n_q, int n_k, int n_heads, int n_kv_heads,
                             int hd, int reps) {
    size_t qn = (size_t)n_q * (size_t)(n_heads * hd), kn = (size_t)n_k * (size_t)(n_kv_heads * hd);
    float *q = rand_floats(qn, 1.0f), *k = rand_floats(kn, 1.0f);
    int32_t *qpos = tsr_malloc((size_t)n_q * sizeof(int32_t));
    for (int i = 0; i < n_q; i++) qpos[i] = n_k - n_q + i;
    float *dq = be_dup(be, q, qn * sizeof(float)), *dk = be_dup(be, k, kn * sizeof(float));
    float *dv = be_dup(be, k, kn * sizeof(float)), *dout = be_dup(be, NULL, qn * sizeof(float));
    int32_t *dqpos = be_dup(be, qpos, (size_t)n_q * sizeof(int32_t));
    double best = INFINITY;
    if (dq && dk && dv && dout && dqpos) {
        tsr_kv_span sp = {.k = dk, .v = dv, .n = n_k, .stride = n_kv_heads * hd};
        tsr_attn_args a = {.q = dq, .q_pos = dqpos, .n_q = n_q, .spans = &sp, .n_spans = 1,
                           .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = hd,
                           .out = dout};
        for (int r = 0; r <= reps; r++) {
            double t0 = now_s();
            if (be->ops->attention(be, &a) != TSR_OK) break;
            if (be->ops->synchronize(be) != TSR_OK) break;
            if (r > 0 && now_s() - t0 < best) best = now_s() - t0;
        }
    }
    be_release(be, dq);
    be_release(be, dk);
    be_release(be, dv);
    be_release(be, dout);
    be_release(be, dqpos);
    tsr_free(q);
    tsr_free(k);
    tsr_free(qpos);
    return best;
}

TSR_TEST(test_bench) {
    if (!getenv("TSR_BENCH")) return;
    targets t;
    ASSERT_OK(targets_open(&t));
    tsr_backend *be = t.be[t.n - 1]; /* CUDA when present, else the CPU */
    printf("bench on %s (best of 5; Llama-3-8B-like shapes)\n", t.label[t.n - 1]);
    struct {
        tsr_dtype dt;
        int64_t n, rows, cols;
    } mm[] = {{TSR_BF16, 1, 14336, 4096}, {TSR_BF16, 512, 4096, 4096},
              {TSR_F32, 512, 4096, 4096}, {TSR_BF16, 4096, 14336, 4096}};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        if (be->device < 0 && mm[i].n > 512) continue; /* minutes on a CPU */
        double s = time_matmul(be, mm[i].dt, mm[i].n, mm[i].rows, mm[i].cols, 5);
        double flop = 2.0 * (double)mm[i].n * (double)mm[i].rows * (double)mm[i].cols;
        double bytes = (double)(mm[i].rows * mm[i].cols) * (double)tsr_dtype_size(mm[i].dt);
        printf("  matmul %-4s n=%-5lld %lldx%lld: %9.3f ms  %8.1f TFLOP/s  %7.1f GB/s weights\n",
               tsr_dtype_name(mm[i].dt), (long long)mm[i].n, (long long)mm[i].rows,
               (long long)mm[i].cols, s * 1e3, flop / s * 1e-12, bytes / s * 1e-9);
    }
    struct {
        int n_q, n_k;
    } at[] = {{1, 32768}, {1, 131072}, {2048, 2048}, {8192, 8192}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        if (be->device < 0 && at[i].n_q > 2048) continue;
        double s = time_attention(be, at[i].n_q, at[i].n_k, 32, 8, 128, 3);
        /* causal pairs: queries at the end see n_k - n_q + 1 .. n_k keys */
        double pairs = (double)at[i].n_q * ((double)at[i].n_k - (double)at[i].n_q / 2.0);
        double flop = 4.0 * pairs * 32 * 128;
        double kvbytes = 2.0 * (double)at[i].n_k * 8 * 128 * 4;
        printf("  attention n_q=%-5d n_k=%-6d 32/8 heads hd128: %9.3f ms  %6.2f TFLOP/s  "
               "%7.1f GB/s KV\n",
               at[i].n_q, at[i].n_k, s * 1e3, flop / s * 1e-12, kvbytes / s * 1e-9);
    }
    targets_close(&t);
}

TSR_TEST(test_backend_select) {
    tsr_backend *be = NULL;
    ASSERT_OK(tsr_backend_create("auto", 1, &be));
    printf("  backend auto -> %s\n", be->ops->name);
    tsr_backend_destroy(be);
    be = NULL;
    tsr_status st = tsr_backend_create("cuda", 1, &be);
    if (st == TSR_OK) {
        ASSERT_STR_EQ(be->ops->name, "cuda");
        tsr_backend_destroy(be);
    } else {
        /* no device (TSR_ERR_CUDA) or no CUDA in this build: a clear line either way */
        ASSERT_TRUE(st == TSR_ERR_CUDA || st == TSR_ERR_UNSUPPORTED);
        ASSERT_TRUE(be == NULL);
        ASSERT_TRUE(strlen(tsr_last_error()) > 0);
        printf("  backend cuda -> %s: %s\n", tsr_strerror(st), tsr_last_error());
    }
    ASSERT_EQ_INT(tsr_backend_create("tpu", 1, &be), TSR_ERR_INVALID);
}

TSR_TEST_MAIN(test_matmul_f32, test_matmul_bf16, test_matmul_f16, test_rmsnorm, test_rope,
              test_swiglu_add, test_embed, test_attention_decode, test_attention_prefill,
              test_backend_select, test_bench)
