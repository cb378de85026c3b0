/* GPT-OSS's backend ops on every backend present against the CPU backend on one thread (as
 * test_backend_ops does for the rest): rope with YaRN (its attention factor on cos and sin),
 * attention with sinks and sliding windows on each path of CUDA's attn.cu (per query,
 * split-K decode with the sink in the merge, tiled prefill) and in attention_paged, sinks
 * of -inf equal to no sinks on every backend, and the mixture-of-experts op with MXFP4,
 * BF16 and F32 experts over routings where experts get 0, 1 or many rows (CUDA's grouped
 * product: several route groups of 8). Under test: cpu on 3 threads, cpu-fenced and, when
 * built and a GPU answers, cuda (tests/device/run.sh runs this file there). Inputs go
 * through backend memory as the contract says; each line prints the worst error against a
 * tolerance scaled to the op. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "tests/backend_test_util.h"
#include "tests/test.h"



static tsr_status targets_open(targets *t) {
    static const char *names[MAX_TARGETS] = {"cpu", "cpu-fenced", "cuda"};
    static const char *labels[MAX_TARGETS] = {"cpu/3", "fenced", "cuda"};
    static int noted;
    memset(t, 0, sizeof *t);
    TSR_TRY(tsr_backend_cpu_create(1, &t->ref));
    for (int i = 0; i < MAX_TARGETS; i++) {
        tsr_backend *be = NULL;
        tsr_status st = tsr_backend_create(names[i], i == 2 ? 1 : 3, &be);
        if (st == TSR_OK) {
            t->be[t->n] = be;
            t->label[t->n++] = labels[i];
            if (!noted) printf("test_backend_ops_gptoss: backend %s on %s\n", names[i],
                               be->ops->device_name ? be->ops->device_name(be) : be->ops->name);
        } else if (i == 2) {
            if (!noted) printf("test_backend_ops_gptoss: backend cuda not available (%s): "
                               "skipped\n", tsr_last_error());
        } else {
            return st;
        }
    }
    noted = 1;
    tsr_error_clear();
    return TSR_OK;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static uint32_t irand(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}

static float *rand_floats(size_t n, float scale) {
    float *p = tsr_malloc(n * sizeof(float));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* Largest |got - want| / tol; one line per comparison. */
static double compare(const char *what, const char *label, const float *got, const float *want,
                      size_t n, double tol) {
    double worst = 0, worst_abs = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        double r = e / tol;
        if (isnan(got[i]) != isnan(want[i])) r = INFINITY;
        if (r > worst) worst = r;
        if (e > worst_abs) worst_abs = e;
    }
    printf("  %-50s %-6s max abs err %.3e  (%.3f of tolerance)\n", what, label, worst_abs, worst);
    return worst;
}

/* ---- rope with YaRN ---- */

TSR_TEST(test_rope_yarn) {
    targets t;
    ASSERT_OK(targets_open(&t));
    tsr_model_config cfg = {.head_dim = 64, .rope_theta = 150000.0f,
                            .rope_scaling = TSR_ROPE_YARN, .rope_factor = 32.0f,
                            .rope_beta_fast = 32.0f, .rope_beta_slow = 1.0f,
                            .rope_original_max_pos = 4096, .rope_attn_factor = 1.3465736f};
    const int n = 6, heads = 3;
    const int32_t pos[6] = {0, 1, 127, 4096, 65535, 131071};
    size_t count = (size_t)n * heads * 64;
    float *x = rand_floats(count, 1.0f), *want = tsr_malloc(count * 4), *got = tsr_malloc(count * 4);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        float *dx = be_dup(be, x, count * 4);
        ASSERT_TRUE(dx != NULL);
        ASSERT_OK(be->ops->rope(be, dx, pos, n, heads, &cfg));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dx, count * 4));
        /* the same angles everywhere; cos/sin within an ulp or two, times the factor 1.35 */
        if (b >= 0)
            ASSERT_TRUE(compare("rope yarn hd64 pos<=131071", t.label[b], got, want, count,
                                4e-6) <= 1.0);
        be_release(be, dx);
    }
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* ---- attention with sinks and windows ---- */

typedef struct attn_case {
    const char *what;
    int n_q, n_heads, n_kv_heads, head_dim;
    int n_spans;
    int lens[3];
    int scattered; /* positions with gaps of 3 (a cache that dropped tokens) */
    int scores;
    int window;    /* 0: full attention */
    int sinks;     /* 0: none, 1: N(0, 2) logits, 2: -inf (must equal none) */
} attn_case;

/* out (and key scores) of case ac on backend be; sinks_off: run without sinks instead. */
static void run_attention(tsr_backend *be, const attn_case *ac, const float *q, float *const kv[2],
                          const int32_t *kpos, const int32_t *qpos, const float *sinks,
                          int64_t keys, int64_t stride, float *out, float *ks) {
    size_t qn = (size_t)ac->n_q * (size_t)(ac->n_heads * ac->head_dim);
    size_t ksn = (size_t)ac->n_heads * (size_t)keys;
    float *dq = be_dup(be, q, qn * 4);
    float *dk = be_dup(be, kv[0], (size_t)(keys * stride) * 4);
    float *dv = be_dup(be, kv[1], (size_t)(keys * stride) * 4);
    float *dsk = sinks ? be_dup(be, sinks, (size_t)ac->n_heads * 4) : NULL;
    float *dout = be_dup(be, NULL, qn * 4);
    float *dks = ac->scores ? be_dup(be, NULL, ksn * 4) : NULL;
    ASSERT_TRUE(dq && dk && dv && dout && (dsk || !sinks) && (dks || !ac->scores));
    if (dks) ASSERT_OK(be->ops->memset(be, dks, 0, ksn * 4));
    tsr_kv_span spans[3];
    int64_t off = 0;
    for (int s = 0; s < ac->n_spans; s++) {
        spans[s] = (tsr_kv_span){.k = dk + off * stride, .v = dv + off * stride,
                                 .pos = ac->scattered ? kpos + off : NULL,
                                 .pos0 = (int32_t)off, .n = ac->lens[s], .stride = stride};
        off += ac->lens[s];
    }
    tsr_attn_args a = {.q = dq, .q_pos = qpos, .n_q = ac->n_q, .spans = spans,
                       .n_spans = ac->n_spans, .n_heads = ac->n_heads,
                       .n_kv_heads = ac->n_kv_heads, .head_dim = ac->head_dim, .out = dout,
                       .key_scores = dks, .sinks = dsk, .window = ac->window};
    ASSERT_OK(be->ops->attention(be, &a));
    ASSERT_OK(be_read(be, out, dout, qn * 4));
    if (dks) ASSERT_OK(be_read(be, ks, dks, ksn * 4));
    be_release(be, dq);
    be_release(be, dk);
    be_release(be, dv);
    be_release(be, dsk);
    be_release(be, dout);
    be_release(be, dks);
}

static void check_attention(const attn_case *ac) {
    targets t;
    ASSERT_OK(targets_open(&t));
    const int hd = ac->head_dim;
    const int64_t stride = ac->n_kv_heads * hd + 8;
    int64_t keys = 0;
    for (int s = 0; s < ac->n_spans; s++) keys += ac->lens[s];
    size_t qn = (size_t)ac->n_q * (size_t)(ac->n_heads * hd), ksn = (size_t)ac->n_heads * keys;
    float *q = rand_floats(qn, 1.5f);
    float *kv[2] = {rand_floats((size_t)(keys * stride), 1.5f),
                    rand_floats((size_t)(keys * stride), 1.0f)};
    float *sinks = NULL;
    if (ac->sinks) {
        sinks = rand_floats((size_t)ac->n_heads, 2.0f);
        if (ac->sinks == 2)
            for (int h = 0; h < ac->n_heads; h++) sinks[h] = -INFINITY;
    }
    int32_t *kpos = tsr_malloc((size_t)keys * 4), *qpos = tsr_malloc((size_t)ac->n_q * 4);
    for (int64_t i = 0; i < keys; i++) kpos[i] = (int32_t)(ac->scattered ? 3 * i + 1 : i);
    for (int i = 0; i < ac->n_q; i++) qpos[i] = kpos[keys - ac->n_q + i];
    float *want = tsr_malloc(qn * 4), *got = tsr_malloc(qn * 4);
    float *want_ks = tsr_malloc(ksn * 4), *got_ks = tsr_malloc(ksn * 4);
    float *alt = tsr_malloc(qn * 4), *alt_ks = tsr_malloc(ksn * 4);
    char what[96];
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        run_attention(be, ac, q, kv, kpos, qpos, sinks, keys, stride, b < 0 ? want : got,
                      b < 0 ? want_ks : got_ks);
        if (b >= 0) {
            ASSERT_TRUE(compare(ac->what, t.label[b], got, want, qn, 2e-5) <= 1.0);
            if (ac->scores) {
                snprintf(what, sizeof what, "%s scores", ac->what);
                ASSERT_TRUE(compare(what, t.label[b], got_ks, want_ks, ksn, 2e-5) <= 1.0);
            }
        }
        if (ac->sinks == 2) { /* -inf sinks: what no sinks give, on the same backend (on
                               * the CPU the same bits: test_attn_cpu) */
            run_attention(be, ac, q, kv, kpos, qpos, NULL, keys, stride, alt, alt_ks);
            snprintf(what, sizeof what, "%s = no sinks", ac->what);
            ASSERT_TRUE(compare(what, b < 0 ? "cpu/1" : t.label[b], alt, b < 0 ? want : got,
                                qn, 1e-6) <= 1.0);
        }
    }
    tsr_free(q);
    tsr_free(kv[0]);
    tsr_free(kv[1]);
    tsr_free(sinks);
    tsr_free(kpos);
    tsr_free(qpos);
    tsr_free(want);
    tsr_free(got);
    tsr_free(want_ks);
    tsr_free(got_ks);
    tsr_free(alt);
    tsr_free(alt_ks);
    targets_close(&t);
}

TSR_TEST(test_attention_sinks_window) {
    /* per-(query, head) kernel: few keys */
    attn_case c1 = {"sink decode gqa4 hd64 40 keys win 16", 1, 8, 2, 64, 1, {40}, 0, 1, 16, 1};
    check_attention(&c1);
    attn_case c2 = {"sink decode hd64 scattered win 20", 1, 4, 2, 64, 2, {30, 9}, 1, 0, 20, 1};
    check_attention(&c2);
    /* split-K: the sink in the merge, chunks before the window empty */
    attn_case c3 = {"sink split-K gqa8 hd64 3000 keys win 128+sc", 1, 16, 2, 64, 1, {3000}, 0,
                    1, 128, 1};
    check_attention(&c3);
    attn_case c4 = {"sink split-K 4 q hd64 2 spans full+sc", 4, 8, 1, 64, 2, {1500, 900}, 0, 1,
                    0, 1};
    check_attention(&c4);
    attn_case c5 = {"split-K scattered win 300 no sink", 2, 8, 2, 64, 3, {400, 500, 300}, 1, 1,
                    300, 0};
    check_attention(&c5);
    /* tiled prefill (head_dim <= 128) and the per-query path for a wide head */
    attn_case c6 = {"sink prefill tiled hd64 70 q win 8+sc", 70, 8, 2, 64, 2, {50, 80}, 0, 1, 8,
                    1};
    check_attention(&c6);
    attn_case c7 = {"sink prefill hd160 12 q win 5", 12, 2, 1, 160, 1, {60}, 0, 0, 5, 1};
    check_attention(&c7);
    /* -inf sinks equal no sinks, on each path */
    attn_case c8 = {"-inf sinks decode", 1, 4, 2, 64, 1, {37}, 0, 1, 0, 2};
    check_attention(&c8);
    attn_case c9 = {"-inf sinks split-K", 1, 8, 2, 64, 1, {2000}, 0, 1, 0, 2};
    check_attention(&c9);
    attn_case c10 = {"-inf sinks prefill tiled win 8", 40, 4, 2, 64, 1, {90}, 0, 1, 8, 2};
    check_attention(&c10);
}

/* attention_paged with sinks and a window against the reference's per-sequence attention
 * over the same blocks. */
TSR_TEST(test_attention_paged_sinks) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { BS = 16, NB = 12, MB = 5, S = 2, NQ = 4, H = 8, G = 2, HD = 64, WIN = 20 };
    const int row = G * HD;
    const int32_t n_keys[S] = {37, 70}, tables[S][MB] = {{7, 2, 9, 0, 0}, {1, 11, 4, 8, 3}};
    const int32_t q_seq[NQ] = {0, 1, 1, 1}, q_pos[NQ] = {36, 67, 68, 69};
    size_t kvn = (size_t)NB * 2 * BS * row, qn = (size_t)NQ * H * HD;
    float *kv = rand_floats(kvn, 1.2f), *q = rand_floats(qn, 1.5f), *sinks = rand_floats(H, 2.0f);
    float *want = tsr_malloc(qn * 4), *got = tsr_malloc(qn * 4);
    int32_t meta[NQ + NQ + S + S * MB];
    memcpy(meta, q_pos, sizeof q_pos);
    memcpy(meta + NQ, q_seq, sizeof q_seq);
    memcpy(meta + 2 * NQ, n_keys, sizeof n_keys);
    memcpy(meta + 2 * NQ + S, tables, sizeof tables);
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        if (b >= 0 && !be->ops->attention_paged) continue;
        float *dkv = be_dup(be, kv, kvn * 4), *dq = be_dup(be, q, qn * 4);
        float *dout = be_dup(be, NULL, qn * 4), *dsk = be_dup(be, sinks, H * 4);
        int32_t *dm = be_dup(be, meta, sizeof meta);
        ASSERT_TRUE(dkv && dq && dout && dm && dsk);
        tsr_kv_layout lay = {.k = dkv, .v = dkv + BS * row, .block_stride = 2 * BS * row,
                             .block = BS, .row = row};
        if (b < 0) {
            for (int r0 = 0; r0 < NQ;) {
                int s = q_seq[r0], r1 = r0;
                while (r1 < NQ && q_seq[r1] == s) r1++;
                tsr_kv_span sp[MB];
                int nb = (n_keys[s] + BS - 1) / BS;
                for (int j = 0; j < nb; j++) {
                    int64_t at = (int64_t)tables[s][j] * lay.block_stride;
                    int left = n_keys[s] - j * BS;
                    sp[j] = (tsr_kv_span){.k = lay.k + at, .v = lay.v + at, .pos0 = j * BS,
                                          .n = left < BS ? left : BS, .stride = row};
                }
                tsr_attn_args a = {.q = dq + (size_t)r0 * H * HD, .q_pos = q_pos + r0,
                                   .n_q = r1 - r0, .spans = sp, .n_spans = nb, .n_heads = H,
                                   .n_kv_heads = G, .head_dim = HD,
                                   .out = dout + (size_t)r0 * H * HD, .sinks = dsk,
                                   .window = WIN};
                ASSERT_OK(be->ops->attention(be, &a));
                r0 = r1;
            }
        } else {
            tsr_attn_paged_args pa = {.q = dq, .out = dout, .n_q = NQ, .n_heads = H,
                                      .n_kv_heads = G, .head_dim = HD, .lay = lay,
                                      .q_pos = dm, .q_seq = dm + NQ, .n_keys = dm + 2 * NQ,
                                      .tables = dm + 2 * NQ + S, .n_seqs = S, .max_blocks = MB,
                                      .sinks = dsk, .window = WIN};
            ASSERT_OK(be->ops->attention_paged(be, &pa));
        }
        ASSERT_OK(be_read(be, b < 0 ? want : got, dout, qn * 4));
        if (b >= 0)
            ASSERT_TRUE(compare("attention_paged sinks win 20", t.label[b], got, want, qn,
                                2e-5) <= 1.0);
        be_release(be, dkv);
        be_release(be, dq);
        be_release(be, dout);
        be_release(be, dsk);
        be_release(be, dm);
    }
    tsr_free(kv);
    tsr_free(q);
    tsr_free(sinks);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

/* ---- mixture of experts ---- */

/* n experts of [rows, cols] in host memory: MXFP4 (random codes, scales around 2^-4) or
 * plain dtype dt; f32 biases. */
typedef struct host_experts {
    tsr_experts x;
    void *w, *scales, *bias;
} host_experts;

static void make_experts(host_experts *h, int n, int64_t rows, int64_t cols, int mxfp4,
                         tsr_dtype dt) {
    int64_t R = (int64_t)n * rows;
    memset(h, 0, sizeof *h);
    h->x = (tsr_experts){.n = n, .rows = rows, .cols = cols, .mxfp4 = mxfp4};
    if (mxfp4) {
        uint8_t *w = tsr_malloc((size_t)(R * cols / 2)), *s = tsr_malloc((size_t)(R * cols / 32));
        for (int64_t i = 0; i < R * cols / 2; i++) w[i] = (uint8_t)irand(256);
        for (int64_t i = 0; i < R * cols / 32; i++) s[i] = (uint8_t)(120 + irand(4));
        h->w = w;
        h->scales = s;
        h->x.w = (tsr_tensor){.dtype = TSR_U8, .rows = R, .cols = cols / 2, .data = w};
        h->x.scales = (tsr_tensor){.dtype = TSR_U8, .rows = R, .cols = cols / 32, .data = s};
    } else {
        size_t cnt = (size_t)(R * cols);
        void *w = tsr_malloc(cnt * tsr_dtype_size(dt));
        for (size_t i = 0; i < cnt; i++) {
            float v = frand() * 0.15f;
            if (dt == TSR_F32)
                ((float *)w)[i] = v;
            else
                ((uint16_t *)w)[i] = tsr_f32_to_bf16(v);
        }
        h->w = w;
        h->x.w = (tsr_tensor){.dtype = dt, .rows = R, .cols = cols, .data = w};
    }
    h->bias = rand_floats((size_t)R, 0.1f);
    h->x.bias = (tsr_tensor){.dtype = TSR_F32, .rows = n, .cols = rows, .data = h->bias};
}

static void free_experts(host_experts *h) {
    tsr_free(h->w);
    tsr_free(h->scales);
    tsr_free(h->bias);
}

/* The experts placed on be (tensors with data, copied when be is not host memory). */
static tsr_status place_experts(tsr_backend *be, const tsr_experts *h, tsr_experts *d,
                                bool copied[3]) {
    *d = *h;
    copied[0] = copied[1] = copied[2] = false;
    TSR_TRY(tsr_backend_place_tensor(be, &h->w, &d->w, &copied[0]));
    if (h->scales.data) TSR_TRY(tsr_backend_place_tensor(be, &h->scales, &d->scales, &copied[1]));
    return tsr_backend_place_tensor(be, &h->bias, &d->bias, &copied[2]);
}

static void release_experts(tsr_backend *be, tsr_experts *d, const bool copied[3]) {
    if (copied[0]) be_release(be, d->w.data);
    if (copied[1]) be_release(be, d->scales.data);
    if (copied[2]) be_release(be, d->bias.data);
}

/* n tokens routed to k of E experts each (distinct, random; expert E - 1 never, so that one
 * expert has no rows), sorted by expert as runtime/exec/moe.c does, weights summing to 1. */
static int route(int n, int E, int k, int32_t *offsets, int32_t *rows, float *weights) {
    int32_t *idx = tsr_malloc((size_t)(n * k) * 4);
    float *wt = tsr_malloc((size_t)(n * k) * 4);
    for (int t = 0; t < n; t++) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)irand((uint32_t)(E - 1));
                dup = 0;
                for (int p = 0; p < j; p++) dup |= idx[t * k + p] == e;
            } while (dup);
            idx[t * k + j] = e;
            wt[t * k + j] = 0.2f + 0.5f * (frand() + 1.0f);
            sum += wt[t * k + j];
        }
        for (int j = 0; j < k; j++) wt[t * k + j] /= sum;
    }
    memset(offsets, 0, (size_t)(E + 1) * 4);
    for (int r = 0; r < n * k; r++) offsets[idx[r] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    int32_t fill[64];
    memcpy(fill, offsets, (size_t)E * 4);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t at = fill[idx[t * k + j]]++;
            rows[at] = t;
            weights[at] = wt[t * k + j];
        }
    tsr_free(idx);
    tsr_free(wt);
    return n * k;
}

static void check_moe(int mxfp4, tsr_dtype dt, int n, int64_t H, int64_t I) {
    targets t;
    ASSERT_OK(targets_open(&t));
    enum { E = 6, K = 2 };
    host_experts gu, dn;
    make_experts(&gu, E, 2 * I, H, mxfp4, dt);
    make_experts(&dn, E, H, I, mxfp4, dt);
    int32_t offsets[E + 1], *rows = tsr_malloc((size_t)(n * K) * 4);
    float *weights = tsr_malloc((size_t)(n * K) * 4);
    route(n, E, K, offsets, rows, weights);
    size_t xn = (size_t)n * (size_t)H;
    float *x = rand_floats(xn, 1.0f), *want = tsr_malloc(xn * 4), *got = tsr_malloc(xn * 4);
    char what[96];
    snprintf(what, sizeof what, "moe %s %d rows H%lld I%lld E%d k%d",
             mxfp4 ? "mxfp4" : tsr_dtype_name(dt), n, (long long)H, (long long)I, E, K);
    double scale = 0.0;
    for (int b = -1; b < t.n && !tsr_test_failed_flag; b++) {
        tsr_backend *be = target(&t, b);
        tsr_experts dgu, ddn;
        bool cg[3], cd[3];
        ASSERT_OK(place_experts(be, &gu.x, &dgu, cg));
        ASSERT_OK(place_experts(be, &dn.x, &ddn, cd));
        float *dx = be_dup(be, x, xn * 4), *dout = be_dup(be, NULL, xn * 4);
        ASSERT_TRUE(dx && dout);
        tsr_moe_args a = {.x = dx, .n = n, .gate_up = &dgu, .down = &ddn, .offsets = offsets,
                          .rows = rows, .weights = weights, .limit = 7.0f, .alpha = 1.702f,
                          .out = dout};
        ASSERT_OK(be->ops->moe(be, &a));
        ASSERT_OK(be_read(be, b < 0 ? want : got, dout, xn * 4));
        if (b < 0) {
            for (size_t i = 0; i < xn; i++) scale = fmax(scale, fabs((double)want[i]));
        } else {
            /* products of H and I terms in another order: a few ulps of the magnitude */
            ASSERT_TRUE(compare(what, t.label[b], got, want, xn, 2e-5 * (scale + 1.0)) <= 1.0);
        }
        be_release(be, dx);
        be_release(be, dout);
        release_experts(be, &dgu, cg);
        release_experts(be, &ddn, cd);
    }
    free_experts(&gu);
    free_experts(&dn);
    tsr_free(rows);
    tsr_free(weights);
    tsr_free(x);
    tsr_free(want);
    tsr_free(got);
    targets_close(&t);
}

TSR_TEST(test_moe) {
    check_moe(1, TSR_U8, 1, 128, 96);   /* decode: one row per routed expert */
    check_moe(1, TSR_U8, 37, 256, 160); /* prefill: up to ~15 rows an expert */
    check_moe(0, TSR_BF16, 9, 96, 64);
    check_moe(0, TSR_F32, 5, 72, 40); /* widths not a multiple of 32 (plain experts) */
}

TSR_TEST_MAIN(test_rope_yarn, test_attention_sinks_window, test_attention_paged_sinks, test_moe)
