#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/exec/forward.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/exec/sampler.h"
#include "tests/test.h"

TSR_TEST(test_greedy_picks_argmax) {
    tsr_sampler s;
    tsr_sampler_params p = {.temperature = 0.0f, .top_p = 1.0f, .top_k = 0, .seed = 1};
    ASSERT_OK(tsr_sampler_init(&s, 5, &p));
    float logits[5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
    ASSERT_EQ_INT(tsr_sampler_sample(&s, logits), 1); /* lowest index on ties */
    tsr_sampler_free(&s);
}

/* tsr_argmax equals the plain first-maximum scan, ties, signed zeros and NaNs included. */
TSR_TEST(test_argmax_equals_scan) {
    float x[77];
    uint32_t r = 7;
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + trial % 77;
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            int v = (int)(r >> 24) % 9 - 4; /* few distinct values: many ties */
            x[i] = (float)v;
            if (v == 0 && (r & 1)) x[i] = -0.0f;
            if ((r >> 8) % 29 == 0) x[i] = NAN;
            if ((r >> 8) % 31 == 0) x[i] = -INFINITY;
        }
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[best]) best = i;
        if (tsr_argmax(x, n) != best)
            TSR_FAIL_("trial %d (n %d): argmax %d, scan %d", trial, n, tsr_argmax(x, n), best);
    }
}

static void draw(uint64_t seed, float temp, float top_p, int top_k, int32_t *out, int n) {
    tsr_sampler s;
    tsr_sampler_params p = {.temperature = temp, .top_p = top_p, .top_k = top_k, .seed = seed};
    if (tsr_sampler_init(&s, 8, &p) != TSR_OK) return;
    for (int i = 0; i < n; i++) {
        float logits[8] = {1.0f, 0.5f, 0.2f, 0.1f, 0.0f, -0.5f, -1.0f, -2.0f};
        out[i] = tsr_sampler_sample(&s, logits);
    }
    tsr_sampler_free(&s);
}

TSR_TEST(test_seeded_reproducible) {
    int32_t a[64], b[64], c[64];
    draw(7, 1.0f, 1.0f, 0, a, 64);
    draw(7, 1.0f, 1.0f, 0, b, 64);
    draw(8, 1.0f, 1.0f, 0, c, 64);
    int same = 1, differ = 0;
    for (int i = 0; i < 64; i++) {
        same &= a[i] == b[i];
        differ |= a[i] != c[i];
    }
    ASSERT_TRUE(same);
    ASSERT_TRUE(differ);
}

TSR_TEST(test_top_k_restricts) {
    int32_t a[200];
    draw(3, 1.0f, 1.0f, 2, a, 200);
    int seen[8] = {0};
    for (int i = 0; i < 200; i++) seen[a[i]]++;
    ASSERT_TRUE(seen[0] > 0 && seen[1] > 0);
    for (int i = 2; i < 8; i++) ASSERT_EQ_INT(seen[i], 0);
}

TSR_TEST(test_top_p_restricts) {
    /* softmax of the logits: p0 ~ 0.33, p1 ~ 0.20; top-p 0.3 keeps only token 0. */
    int32_t a[100];
    draw(5, 1.0f, 0.3f, 0, a, 100);
    for (int i = 0; i < 100; i++) ASSERT_EQ_INT(a[i], 0);
}

TSR_TEST(test_distribution_matches_softmax) {
    int32_t a[20000];
    draw(11, 1.0f, 1.0f, 0, a, 20000);
    float logits[8] = {1.0f, 0.5f, 0.2f, 0.1f, 0.0f, -0.5f, -1.0f, -2.0f};
    double z = 0;
    for (int i = 0; i < 8; i++) z += exp(logits[i]);
    int count0 = 0;
    for (int i = 0; i < 20000; i++) count0 += a[i] == 0;
    ASSERT_NEAR(count0 / 20000.0, exp(1.0) / z, 0.02);
}

TSR_TEST(test_rejects_bad_params) {
    tsr_sampler s;
    tsr_sampler_params p = {.temperature = -1.0f, .top_p = 1.0f};
    ASSERT_EQ_INT(tsr_sampler_init(&s, 4, &p), TSR_ERR_INVALID);
    p = (tsr_sampler_params){.temperature = 1.0f, .top_p = 0.0f};
    ASSERT_EQ_INT(tsr_sampler_init(&s, 4, &p), TSR_ERR_INVALID);
}

/* ---- the backend op `sample` against the host sampler ---- */

/* The host sampler as it was before the backends' sample op shared its arithmetic
 * (kernels/sample.c), kept here as the reference: the first-max scan, softmax, then the
 * full order of (probability desc, id asc), top-k, top-p, and r in the kept mass. */
typedef struct old_cand {
    float p;
    int32_t id;
} old_cand;

static int old_desc(const void *a, const void *b) {
    const old_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

static int32_t old_sample(float *logits, int n, float temp, float top_p, int top_k, float r,
                          old_cand *cand) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp == 0.0f) return best;
    float mx = logits[best];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - mx) / temp);
        sum += logits[i];
    }
    for (int i = 0; i < n; i++) logits[i] = (float)(logits[i] / sum);
    int k = top_k > 0 && top_k < n ? top_k : n;
    if (k == n && top_p >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf) return i;
        }
        return n - 1;
    }
    for (int i = 0; i < n; i++) cand[i] = (old_cand){logits[i], i};
    qsort(cand, (size_t)n, sizeof *cand, old_desc);
    float mass = 0.0f;
    int keep = 0;
    for (; keep < k; keep++) {
        mass += cand[keep].p;
        if (mass >= top_p) {
            keep++;
            break;
        }
    }
    float target = r * mass, cdf = 0.0f;
    for (int i = 0; i < keep; i++) {
        cdf += cand[i].p;
        if (target < cdf) return cand[i].id;
    }
    return cand[keep - 1].id;
}

enum { SV = 3000, SROWS = 24, SSTEPS = 6 };

static const tsr_sampler_params sample_cases[] = {
    {.temperature = 0.0f, .top_p = 1.0f, .top_k = 0, .seed = 1},
    {.temperature = 0.7f, .top_p = 1.0f, .top_k = 0, .seed = 2},
    {.temperature = 1.0f, .top_p = 1.0f, .top_k = 40, .seed = 3},
    {.temperature = 1.3f, .top_p = 0.9f, .top_k = 0, .seed = 4},
    {.temperature = 0.8f, .top_p = 0.95f, .top_k = 50, .seed = 5},
    {.temperature = 2.0f, .top_p = 0.5f, .top_k = SV + 5, .seed = 6},
    /* top-p alone over most of the vocabulary: the sorted prefix grows to all of it */
    {.temperature = 3.0f, .top_p = 0.999f, .top_k = 0, .seed = 7},
    {.temperature = 1.0f, .top_p = 0.97f, .top_k = 2500, .seed = 8},
};
#define N_SCASES ((int)(sizeof sample_cases / sizeof sample_cases[0]))

/* Seeded logits of row `row` at step `step` (a few ties so the id order matters). */
static void fill_logits(float *x, int row, int step) {
    uint32_t r = 2654435761u * (uint32_t)(row * 131 + step * 7 + 1);
    for (int i = 0; i < SV; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = (float)((int)(r >> 20) % 400) / 40.0f - 5.0f;
    }
}

/* Same seeds, same tokens: per row a request with its own seeded sampler (row i takes
 * sample_cases[i % N] with seed + i), SSTEPS decode steps; the host sampler, the old host
 * sampler with the uniform the sampler draws, and the backend op on cpu and cpu-fenced
 * (logits in backend memory, parameters from tsr_sampler_row_params) must pick the same. */
TSR_TEST(test_backend_sample_equals_host) {
    const char *names[] = {"cpu", "cpu-fenced"};
    float *x = tsr_malloc((size_t)SROWS * SV * sizeof(float));
    float *y = tsr_malloc((size_t)SV * sizeof(float));
    old_cand *cand = tsr_malloc((size_t)SV * sizeof *cand);
    ASSERT_TRUE(x && y && cand);
    for (int b = 0; b < 2 && !tsr_test_failed_flag; b++) {
        tsr_backend *be = NULL;
        ASSERT_OK(tsr_backend_create(names[b], 1, &be));
        ASSERT_TRUE(be->ops->sample != NULL);
        tsr_sampler host[SROWS], dev[SROWS], old[SROWS];
        for (int i = 0; i < SROWS; i++) {
            tsr_sampler_params p = sample_cases[i % N_SCASES];
            p.seed += (uint64_t)i;
            ASSERT_OK(tsr_sampler_init(&host[i], SV, &p));
            ASSERT_OK(tsr_sampler_init(&dev[i], SV, &p));
            ASSERT_OK(tsr_sampler_init(&old[i], SV, &p));
        }
        float *dx = NULL;
        ASSERT_OK(be->ops->buffer_alloc(be, (size_t)SROWS * SV * sizeof(float), (void **)&dx));
        int sampled = 0, differ_from_greedy = 0;
        for (int step = 0; step < SSTEPS && !tsr_test_failed_flag; step++) {
            tsr_sample_params par[SROWS];
            int32_t ids[SROWS], want[SROWS];
            for (int i = 0; i < SROWS; i++) {
                fill_logits(x + (size_t)i * SV, i, step);
                tsr_sampler_row_params(&dev[i], &par[i]);
                memcpy(y, x + (size_t)i * SV, SV * sizeof(float));
                want[i] = tsr_sampler_sample(&host[i], y);
                tsr_sample_params op;
                tsr_sampler_row_params(&old[i], &op);
                memcpy(y, x + (size_t)i * SV, SV * sizeof(float));
                int32_t o = old_sample(y, SV, op.temperature, op.top_p, op.top_k, op.r, cand);
                if (o != want[i])
                    TSR_FAIL_("step %d row %d: host sampler %d, old host sampler %d", step, i,
                              want[i], o);
                if (par[i].temperature != 0.0f) {
                    sampled++;
                    memcpy(y, x + (size_t)i * SV, SV * sizeof(float));
                    differ_from_greedy += tsr_argmax(y, SV) != want[i];
                }
            }
            ASSERT_OK(tsr_backend_upload(be, dx, x, (size_t)SROWS * SV * sizeof(float)));
            ASSERT_OK(be->ops->sample(be, dx, SROWS, SV, par, ids));
            for (int i = 0; i < SROWS; i++)
                if (ids[i] != want[i])
                    TSR_FAIL_("%s step %d row %d: sample op %d, host sampler %d", names[b],
                              step, i, ids[i], want[i]);
        }
        printf("  %s: %d rows x %d steps, %d sampled (%d not the argmax): sample op == host "
               "sampler == old host sampler\n",
               names[b], SROWS, SSTEPS, sampled, differ_from_greedy);
        ASSERT_TRUE(differ_from_greedy > sampled / 4); /* the draws really draw */
        be->ops->buffer_free(be, dx);
        for (int i = 0; i < SROWS; i++) {
            tsr_sampler_free(&host[i]);
            tsr_sampler_free(&dev[i]);
            tsr_sampler_free(&old[i]);
        }
        tsr_backend_destroy(be);
    }
    tsr_free(x);
    tsr_free(y);
    tsr_free(cand);
}

/* The forward pass with its logits left on the backend (tsr_forward_run with logits NULL)
 * and tsr_forward_sample: the tokens of a seeded generation equal those of host logits and
 * tsr_sampler_sample, on cpu, cpu-fenced and a CPU backend without the sample op (the
 * download fallback). Two sequences in one batch, each with its own seeded sampler. */
enum { FNP = 12, FGEN = 20 };

static tsr_backend_ops nosample_ops;

static tsr_status generate(const char *backend, tsr_model *m, bool on_device,
                           int32_t out[2][FGEN]) {
    tsr_backend *given = NULL;
    if (backend[0] == '-') { /* "-cpu": the CPU without a sample op */
        TSR_TRY(tsr_backend_cpu_create(1, &given));
        nosample_ops = *given->ops;
        nosample_ops.sample = NULL;
        given->ops = &nosample_ops;
    }
    const int V = m->cfg.vocab_size;
    tsr_engine_spec eo = {.backend = backend, .backend_given = given, .threads = 1,
                             .max_tokens = 2 * FNP,
                             .kv = {.policy = &tsr_kv_policy_paged, .block_size = 16, .max_seqs = 2,
                                    .memory_bytes = 8 << 20},
                             .borrow_model = true};
    tsr_engine *e = NULL;
    tsr_sampler smp[2] = {0};
    float *logits = tsr_malloc((size_t)2 * (size_t)V * sizeof(float));
    eo.model = m;
    tsr_status st = logits ? tsr_engine_create(&eo, &e) : TSR_ERR_NOMEM;
    tsr_kv_cache *kv = st == TSR_OK ? e->kv : NULL;
    tsr_forward *f = st == TSR_OK ? e->fwd : NULL;
    for (int s = 0; st == TSR_OK && s < 2; s++) {
        tsr_sampler_params p = {.temperature = s ? 1.1f : 0.8f, .top_p = s ? 0.9f : 1.0f,
                                .top_k = s ? 0 : 20, .seed = 42u + (uint64_t)s};
        st = tsr_sampler_init(&smp[s], V, &p);
        if (st == TSR_OK) st = kv->ops->seq_add(kv, s);
    }
    int32_t prompt[2][FNP];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < FNP; i++) prompt[s][i] = (int32_t)(1 + (i * 37 + s * 11) % (V - 1));
    tsr_batch_seq b[2];
    for (int s = 0; s < 2; s++)
        b[s] = (tsr_batch_seq){.seq = s, .tokens = prompt[s], .n_tokens = FNP, .want_logits = 1};
    for (int g = 0; st == TSR_OK && g < FGEN; g++) {
        int rows = 0;
        st = tsr_forward_run(f, kv, b, 2, on_device ? NULL : logits, &rows);
        if (st != TSR_OK) break;
        if (rows != 2) {
            st = tsr_error_set(TSR_ERR_INTERNAL, "%d logits rows, want 2", rows);
            break;
        }
        int32_t ids[2];
        if (on_device) {
            tsr_sampler *sp[2] = {&smp[0], &smp[1]};
            st = tsr_forward_sample(f, sp, 2, ids);
        } else {
            for (int s = 0; s < 2; s++)
                ids[s] = tsr_sampler_sample(&smp[s], logits + (size_t)s * (size_t)V);
        }
        for (int s = 0; s < 2; s++) {
            out[s][g] = ids[s];
            b[s] = (tsr_batch_seq){.seq = s, .tokens = &out[s][g], .n_tokens = 1,
                                   .want_logits = 1};
        }
    }
    for (int s = 0; s < 2; s++) tsr_sampler_free(&smp[s]);
    tsr_engine_destroy(e); /* the engine owns `given`, even after a failed start */
    if (!logits) tsr_backend_destroy(given);
    tsr_free(logits);
    return st;
}

TSR_TEST(test_forward_sample_on_backend) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(TSR_SOURCE_DIR "/models/stories260K.bin", &m));
    int32_t want[2][FGEN], got[2][FGEN];
    ASSERT_OK(generate("cpu", m, false, want));
    const char *names[] = {"cpu", "cpu-fenced", "-cpu"};
    for (int b = 0; b < 3 && !tsr_test_failed_flag; b++) {
        memset(got, 0xff, sizeof got);
        ASSERT_OK(generate(names[b], m, true, got));
        printf("  %-10s logits on the backend, tsr_forward_sample: %s\n", names[b],
               memcmp(got, want, sizeof got) ? "DIFFER" : "the host sampler's tokens");
        ASSERT_TRUE(memcmp(got, want, sizeof got) == 0);
    }
    tsr_model_destroy(m);
}

TSR_TEST_MAIN(test_greedy_picks_argmax, test_argmax_equals_scan, test_seeded_reproducible, test_top_k_restricts,
              test_top_p_restricts, test_distribution_matches_softmax, test_rejects_bad_params,
              test_backend_sample_equals_host, test_forward_sample_on_backend)
