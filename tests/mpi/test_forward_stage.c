/* The MPI data plane of the forward pass on a backend whose memory is not the host's: the
 * activations cross ranks staged through host buffers (download, send; receive, upload;
 * the row-parallel parts downloaded, summed over MPI, the sum uploaded). Under mpiexec with
 * 2 or 4 ranks, on the CPU backend flagged as such (host_memory false: its buffers are still
 * host memory, so this checks the staging's logic; cpu-fenced checks its fencing through
 * the binary), tp = W, pp = W and (4 ranks) tp 2 x pp 2 give the logits bits of one process
 * on the plain CPU for a chunked prefill and greedy decode of one sequence. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "comm/comm.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/moe.h"
#include "runtime/model/model.h"
#include "runtime/exec/parallel.h"
#include "tests/test.h"

int tsr_test_failed_flag;
static tsr_comm *C;
static int W, R;

/* TSR_TEST_MODEL overrides (the Qwen models of tests/data/arch: biases and q/k norms
 * sliced by heads). */
#define MODEL tsr__model_path()
static const char *tsr__model_path(void) {
    const char *e = getenv("TSR_TEST_MODEL");
    return e && *e ? e : TSR_SOURCE_DIR "/models/stories260K.bin";
}
enum { NP = 30, CHUNK = 16, GEN = 12, KV_TOKENS = 64 };

static tsr_backend_ops fake_ops;
static tsr_status (*cpu_upload)(tsr_backend *, void *, const void *, size_t, tsr_stream *);
static int64_t n_uploads; /* the forward uploads only what it staged */

static tsr_status counting_upload(tsr_backend *be, void *dst, const void *src, size_t bytes,
                                  tsr_stream *stream) {
    n_uploads++;
    return cpu_upload(be, dst, src, bytes, stream);
}

static tsr_status fake_device_create(tsr_backend **out) {
    TSR_TRY(tsr_backend_cpu_create(1, out));
    fake_ops = *(*out)->ops;
    fake_ops.name = "cpu-as-device";
    cpu_upload = fake_ops.upload;
    fake_ops.upload = counting_upload;
    (*out)->ops = &fake_ops;
    (*out)->host_memory = false;
    return TSR_OK;
}

/* Prefill in chunks, then GEN greedy steps; logits of every step ([GEN + 1][V]). */
static tsr_status run(tsr_model *m, tsr_backend *be, const tsr_forward_parallel *par,
                      int kv_layers, int kv_heads, const int32_t *prompt, float *all) {
    const int V = m->cfg.vocab_size;
    tsr_forward *f = NULL;
    tsr_kv_cache *kv = NULL;
    TSR_TRY(tsr_forward_create_parallel(m, be, CHUNK, par, &f));
    tsr_status st =
        tsr_kv_dense_create(be, kv_layers, kv_heads, m->cfg.head_dim, KV_TOKENS, 1, &kv);
    if (st == TSR_OK) st = kv->ops->seq_add(kv, 0);
    int rows = 0;
    for (int pos = 0; st == TSR_OK && pos < NP; pos += CHUNK) {
        int n = NP - pos < CHUNK ? NP - pos : CHUNK;
        tsr_batch_seq b = {.seq = 0, .tokens = prompt + pos, .n_tokens = n, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, all, &rows);
    }
    for (int g = 0; st == TSR_OK && g < GEN; g++) {
        const float *l = all + (size_t)g * V;
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[best]) best = i;
        tsr_batch_seq b = {.seq = 0, .tokens = &best, .n_tokens = 1, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, all + (size_t)(g + 1) * V, &rows);
    }
    tsr_kv_cache_destroy(kv);
    tsr_forward_destroy(f);
    return st;
}

/* ep: the experts spread over the TP group (expert parallelism, runtime/exec/moe.h). */
static void check_layout(int tp, int pp, bool ep) {
    tsr_model *whole = NULL, *m = NULL;
    tsr_backend *cpu = NULL, *dev = NULL;
    ASSERT_OK(tsr_model_load(MODEL, &whole));
    ASSERT_OK(tsr_model_load(MODEL, &m));
    ASSERT_OK(tsr_backend_cpu_create(1, &cpu));
    ASSERT_OK(fake_device_create(&dev));
    const tsr_model_config *c = &whole->cfg;
    const size_t V = (size_t)c->vocab_size, n = (GEN + 1) * V;
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(1 + (i * 53) % (c->vocab_size - 1));
    float *want = tsr_malloc(n * 4), *got = tsr_malloc(n * 4);
    ASSERT_TRUE(want && got);
    ASSERT_OK(run(whole, cpu, NULL, c->n_layers, c->n_kv_heads, prompt, want));

    ASSERT_OK(tsr_comm_set_layout(C, tp, pp));
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(tp, pp, W, &l));
    tsr_forward_parallel par = {.comm = C, .micro_batches = 1};
    ASSERT_OK(tsr_parallel_shard_of(&l, &m->cfg, R, MODEL, &par.shard));
    ASSERT_OK(tsr_parallel_shard_model(m, &par.shard));
    if (ep) { /* as runtime/engine/dist.c cuts them */
        tsr_parallel_shard *s = &par.shard;
        tsr_parallel_split(c->n_experts, tp, s->tp_rank, &s->expert_begin, &s->expert_end);
        for (int i = s->layer_begin; i < s->layer_end; i++) {
            ASSERT_OK(tsr_moe_shard_experts(&m->layers[i].gate_up, s->expert_begin,
                                            s->expert_end));
            ASSERT_OK(tsr_moe_shard_experts(&m->layers[i].down, s->expert_begin,
                                            s->expert_end));
        }
    }
    const tsr_parallel_shard *sh = &par.shard;
    n_uploads = 0;
    ASSERT_OK(run(m, dev, &par, sh->layer_end - sh->layer_begin,
                  sh->kv_head_end - sh->kv_head_begin, prompt, got));
    int same = memcmp(want, got, n * 4) == 0;
    if (R == 0)
        fprintf(stderr, "  tp %d x pp %d%s, staged: %s\n", tp, pp, ep ? " (ep)" : "",
                same ? "the bits of one process" : "DIFFERS from one process");
    ASSERT_TRUE(same);
    /* Every rank that receives activations (all under tp, all but the first stage under
     * pp) uploaded them from its host staging buffer. */
    if (tp > 1 || !sh->first_stage) ASSERT_TRUE(n_uploads > 0);
    tsr_free(want);
    tsr_free(got);
    tsr_backend_destroy(dev);
    tsr_backend_destroy(cpu);
    tsr_model_destroy(m);
    tsr_model_destroy(whole);
}

TSR_TEST(test_tp_staged) { check_layout(W, 1, false); }
TSR_TEST(test_pp_staged) { check_layout(1, W, false); }
TSR_TEST(test_tp_pp_staged) {
    if (W == 4) check_layout(2, 2, false);
}
/* Expert parallelism on a mixture-of-experts model (TSR_TEST_MODEL): tokens all-to-all. */
static bool tsr__has_experts(void) {
    tsr_model *m = NULL;
    if (tsr_model_load(MODEL, &m) != TSR_OK) return false;
    bool moe = m->cfg.n_experts > 0;
    tsr_model_destroy(m);
    return moe;
}
TSR_TEST(test_ep_staged) {
    if (!tsr__has_experts()) return;
    check_layout(W, 1, true);
    if (W == 4) check_layout(2, 2, true);
}

static const struct {
    const char *name;
    tsr_test_fn fn;
} tests[] = {
    {"test_tp_staged", test_tp_staged},
    {"test_pp_staged", test_pp_staged},
    {"test_tp_pp_staged", test_tp_pp_staged},
    {"test_ep_staged", test_ep_staged},
};

int main(int argc, char **argv) {
    tsr_comm_options o = {.backend = TSR_COMM_MPI, .argc = &argc, .argv = &argv};
    if (tsr_comm_init(&o, &C) != TSR_OK) {
        fprintf(stderr, "test_forward_stage: %s\n", tsr_last_error());
        return 1;
    }
    W = tsr_comm_world_size(C);
    R = tsr_comm_world_rank(C);
    int failed = 0, passed = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (argc > 1 && strcmp(argv[1], tests[i].name) != 0) continue;
        tsr_test_failed_flag = 0;
        tests[i].fn();
        /* A rank that failed may leave the others in a collective: the launcher's timeout
         * ends them; agreeing here keeps the verdicts the same when all came back. */
        int64_t f = tsr_test_failed_flag;
        if (tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, &f, 1, TSR_COMM_MAX) != TSR_OK)
            tsr_comm_abort(C, 2, tsr_last_error());
        if (f) failed++; else passed++;
        if (R == 0) fprintf(stderr, "%s %s (%d ranks)\n", f ? "FAIL" : "ok  ", tests[i].name, W);
    }
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    tsr_comm_destroy(C);
    return failed ? 1 : 0;
}
