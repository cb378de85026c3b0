/* The forward pass and the KV setup on a backend whose memory is not the host's
 * (be->host_memory false), before any such device is built here: the CPU backend with its
 * memory flag cleared and a fixed memory query. Its buffers are still host memory, so this
 * checks the device paths' logic, not their fencing (the golden and scheduler tests run on
 * cpu-fenced for that once it is built): logits, key scores and queries brought back by
 * download give the plain CPU's bits for every KV policy, and the pool is sized from the
 * backend's memory query. */
#include <string.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "tests/test.h"

#define FAKE_TOTAL ((size_t)128 << 20)
#define FAKE_FREE ((size_t)96 << 20)

static tsr_backend_ops fake_ops;
static tsr_status (*cpu_alloc)(tsr_backend *, size_t, void **);
static void (*cpu_free)(tsr_backend *, void *);
static int64_t n_live; /* backend buffers allocated and not freed */

static tsr_status counting_alloc(tsr_backend *be, size_t bytes, void **out) {
    TSR_TRY(cpu_alloc(be, bytes, out));
    n_live++;
    return TSR_OK;
}

static void counting_free(tsr_backend *be, void *ptr) {
    if (ptr) n_live--;
    cpu_free(be, ptr);
}

static tsr_status fake_memory(tsr_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = FAKE_FREE;
    *total_bytes = FAKE_TOTAL;
    return TSR_OK;
}

/* The CPU backend, flagged as keeping its memory apart from the host's. */
static tsr_status fake_device_create(tsr_backend **out) {
    TSR_TRY(tsr_backend_cpu_create(1, out));
    fake_ops = *(*out)->ops;
    fake_ops.name = "cpu-as-device";
    fake_ops.memory = fake_memory;
    cpu_alloc = fake_ops.buffer_alloc;
    cpu_free = fake_ops.buffer_free;
    fake_ops.buffer_alloc = counting_alloc;
    fake_ops.buffer_free = counting_free;
    (*out)->ops = &fake_ops;
    (*out)->host_memory = false;
    return TSR_OK;
}

static const char *model_path(void) { return TSR_SOURCE_DIR "/models/stories260K.bin"; }

enum { NP = 40, GEN = 24, CHUNK = 16 };

/* Greedy: the prompt in chunks, then GEN one-token steps; the last step's logits. */
static tsr_status greedy_with(tsr_forward *f, tsr_kv_cache *kv, int V, const int32_t *prompt,
                              int32_t *toks, float *logits) {
    tsr_status st = kv->ops->seq_add(kv, 0);
    int rows = 0;
    for (int pos = 0; st == TSR_OK && pos < NP; pos += CHUNK) {
        int n = NP - pos < CHUNK ? NP - pos : CHUNK;
        tsr_batch_seq b = {.seq = 0, .tokens = prompt + pos, .n_tokens = n, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
    }
    for (int g = 0; st == TSR_OK && g < GEN; g++) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        toks[g] = best;
        tsr_batch_seq b = {.seq = 0, .tokens = &toks[g], .n_tokens = 1, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
    }
    return st;
}

static tsr_status greedy(tsr_model *m, tsr_backend *be, tsr_kv_cache *kv,
                         const int32_t *prompt, int32_t *toks, float *logits) {
    tsr_forward *f = NULL;
    TSR_TRY(tsr_forward_create(m, be, CHUNK, &f));
    tsr_status st = greedy_with(f, kv, m->cfg.vocab_size, prompt, toks, logits);
    tsr_forward_destroy(f);
    return st;
}

static void greedy_on(tsr_model *m, tsr_backend *be, const char *policy, double budget,
                      const int32_t *prompt, int32_t *toks, float *logits) {
    tsr_kv_options o = {.policy = tsr_kv_policy_find(policy), .memory_bytes = 8 << 20,
                        .block_size = 16,
                        .budget = budget, .max_seqs = 1, .be = be};
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &kv));
    tsr_status st = greedy(m, be, kv, prompt, toks, logits);
    tsr_kv_cache_destroy(kv);
    ASSERT_OK(st);
}

/* paged, h2o (key scores: memset, attention, download, observe) and offload (queries
 * downloaded for the hook) give the same tokens and logits bits as the plain CPU. */
TSR_TEST(test_policies_bit_identical) {
    tsr_model *m = NULL;
    tsr_backend *cpu = NULL, *dev = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    ASSERT_OK(tsr_backend_cpu_create(1, &cpu));
    ASSERT_OK(fake_device_create(&dev));
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(1 + (i * 37) % (m->cfg.vocab_size - 1));
    const size_t V = (size_t)m->cfg.vocab_size;
    float *la = tsr_malloc(V * 4), *lb = tsr_malloc(V * 4);
    ASSERT_TRUE(la && lb);
    struct {
        const char *policy;
        double budget;
    } cases[] = {{"paged", 0}, {"h2o", 0.5}, {"offload", 0.5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && !tsr_test_failed_flag; c++) {
        int32_t ta[GEN], tb[GEN];
        greedy_on(m, cpu, cases[c].policy, cases[c].budget, prompt, ta, la);
        greedy_on(m, dev, cases[c].policy, cases[c].budget, prompt, tb, lb);
        fprintf(stderr, "  %s: %s\n", cases[c].policy,
                memcmp(ta, tb, sizeof ta) || memcmp(la, lb, V * 4) ? "DIFFER" : "same bits");
        ASSERT_TRUE(memcmp(ta, tb, sizeof ta) == 0);
        ASSERT_TRUE(memcmp(la, lb, V * 4) == 0);
    }
    tsr_free(la);
    tsr_free(lb);
    tsr_backend_destroy(dev);
    tsr_backend_destroy(cpu);
    tsr_model_destroy(m);
}

/* Without --kv-memory the pool comes from the backend's free memory (90 %, less the
 * workspace), not from the host's. */
TSR_TEST(test_pool_follows_backend_memory) {
    tsr_model *m = NULL;
    tsr_backend *dev = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    ASSERT_OK(fake_device_create(&dev));
    tsr_kv_options o = {.policy = &tsr_kv_policy_paged, .block_size = 16, .max_seqs = 4, .be = dev};
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &kv));
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    fprintf(stderr, "  pool %lld bytes of %zu free\n", (long long)s.bytes_capacity, FAKE_FREE);
    ASSERT_TRUE(s.bytes_capacity > (int64_t)(FAKE_FREE / 2));
    ASSERT_TRUE(s.bytes_capacity <= (int64_t)(FAKE_FREE * 9 / 10));
    tsr_kv_cache_destroy(kv);
    tsr_backend_destroy(dev);
    tsr_model_destroy(m);
}

/* The engine on such a backend: the weights placed in backend buffers (the forward runs on
 * them, not on the model's), the pool sized from the memory query, the plain CPU engine's
 * bits, and every backend buffer freed by tsr_engine_destroy. */
TSR_TEST(test_engine_places_weights) {
    tsr_model *m = NULL;
    tsr_backend *dev = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    const size_t V = (size_t)m->cfg.vocab_size;
    int32_t prompt[NP], ta[GEN], tb[GEN];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(1 + (i * 29) % (m->cfg.vocab_size - 1));
    float *la = tsr_malloc(V * 4), *lb = tsr_malloc(V * 4);
    ASSERT_TRUE(la && lb);
    tsr_engine_spec eo = {.backend = "cpu", .threads = 1, .max_tokens = CHUNK,
                             .kv = {.policy = &tsr_kv_policy_h2o, .budget = 0.5, .block_size = 16,
                                    .max_seqs = 1, .memory_bytes = 8 << 20},
                             .borrow_model = true};
    tsr_engine *e = NULL;
    eo.model = m;
    ASSERT_OK(tsr_engine_create(&eo, &e));
    ASSERT_TRUE(e->weights == m && e->placed_bytes == 0); /* host memory: nothing copied */
    ASSERT_OK(greedy_with(e->fwd, e->kv, (int)V, prompt, ta, la));
    tsr_engine_destroy(e);

    n_live = 0;
    ASSERT_OK(fake_device_create(&dev));
    eo.backend_given = dev;
    eo.kv.memory_bytes = 0; /* from the memory query */
    eo.model = m;
    ASSERT_OK(tsr_engine_create(&eo, &e));
    ASSERT_TRUE(e->weights != m && e->placed_bytes > 0);
    ASSERT_TRUE(e->weights->layers[0].wq.data != m->layers[0].wq.data);
    ASSERT_TRUE(e->weights->tok_emb.data != m->tok_emb.data);
    tsr_kv_stats s;
    e->kv->ops->stats(e->kv, &s);
    ASSERT_TRUE(s.bytes_capacity > (int64_t)(FAKE_FREE / 2));
    ASSERT_OK(greedy_with(e->fwd, e->kv, (int)V, prompt, tb, lb));
    fprintf(stderr, "  engine: %zu weight bytes placed, %lld KV bytes; %s\n", e->placed_bytes,
            (long long)s.bytes_capacity,
            memcmp(ta, tb, sizeof ta) || memcmp(la, lb, V * 4) ? "DIFFER" : "same bits");
    ASSERT_TRUE(memcmp(ta, tb, sizeof ta) == 0 && memcmp(la, lb, V * 4) == 0);
    tsr_engine_destroy(e);
    ASSERT_EQ_INT(n_live, 0);
    tsr_free(la);
    tsr_free(lb);
    tsr_model_destroy(m);
}

TSR_TEST_MAIN(test_policies_bit_identical, test_pool_follows_backend_memory,
              test_engine_places_weights)
