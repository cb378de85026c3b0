/* The continuous-batching scheduler: batch invariants (sequence and token limits, decode
 * mixed with chunked prefill, each sequence at most once per step), join/finish, early
 * finish, preemption under a short KV cache, and greedy identity with solo runs on the
 * bundled model (plus a report on whether batched matmul rows are bit-identical); swap
 * preemption under a tiny pool, for every registered policy, gives the tokens of an
 * unconstrained run, also when a full host pool makes some preemptions recompute. */
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "runtime/exec/scheduler.h"
#include "runtime/text/tokenizer.h"
#include "tests/test.h"

#define VOCAB 64

/* A fake forward: checks the batch, advances the KV cache like the real one (reserve,
 * write, commit) and makes the next token (last token + 1) % VOCAB the argmax. */
typedef struct fake_ctx {
    int max_seqs, max_tokens;
    int steps, mixed_steps, max_n_seqs, max_n_tokens;
    int violations;
    int64_t tokens_seen;
} fake_ctx;

static tsr_status fake_exec(void *vctx, tsr_kv_cache *kv, const tsr_batch_seq *seqs, int n,
                            float *logits, int *n_rows) {
    fake_ctx *c = vctx;
    int T = 0, dec = 0, pre = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        T += seqs[i].n_tokens;
        if (seqs[i].n_tokens == 1) dec++; else pre++;
        for (int j = 0; j < i; j++)
            if (seqs[j].seq == seqs[i].seq) c->violations++;
        if (seqs[i].n_tokens <= 0) c->violations++;
    }
    if (n > c->max_seqs || T > c->max_tokens) c->violations++;
    if (dec && pre) c->mixed_steps++;
    if (n > c->max_n_seqs) c->max_n_seqs = n;
    if (T > c->max_n_tokens) c->max_n_tokens = T;
    c->steps++;
    c->tokens_seen += T;
    for (int i = 0; i < n; i++) {
        const tsr_batch_seq *s = &seqs[i];
        TSR_TRY(kv->ops->reserve(kv, s->seq, s->n_tokens));
        float *kb = tsr_calloc((size_t)s->n_tokens * (size_t)kv->kv_dim, sizeof(float));
        if (!kb) return TSR_ERR_NOMEM;
        for (int l = 0; l < kv->n_layers; l++)
            TSR_TRY(kv->ops->write(kv, l, s->seq, s->n_tokens, kb, kb));
        tsr_free(kb);
        TSR_TRY(kv->ops->commit(kv, s->seq, s->tokens, s->n_tokens));
        if (s->want_logits) {
            float *row = logits + (size_t)rows * VOCAB;
            for (int v = 0; v < VOCAB; v++) row[v] = 0.0f;
            row[(s->tokens[s->n_tokens - 1] + 1) % VOCAB] = 1.0f;
            rows++;
        }
    }
    *n_rows = rows;
    return TSR_OK;
}

typedef struct result {
    int32_t toks[64];
    int n;
    tsr_finish_reason fin;
    int events;
    int32_t eos; /* the finishing event's eos */
} result;

/* Runs every request to completion; results indexed by tag. */
static int drive(tsr_sched *s, result *res, int n_res, int *max_running) {
    int guard = 0;
    while (tsr_sched_has_work(s) && guard++ < 10000) {
        const tsr_sched_event *ev;
        int n_ev;
        tsr_sched_step_info info;
        if (tsr_sched_step(s, &ev, &n_ev, &info) != TSR_OK) return -1;
        if (max_running && tsr_sched_n_running(s) > *max_running)
            *max_running = tsr_sched_n_running(s);
        for (int i = 0; i < n_ev; i++) {
            if ((int)ev[i].tag >= n_res) return -2;
            result *r = &res[ev[i].tag];
            r->events++;
            if (ev[i].token >= 0 && r->n < 64) r->toks[r->n++] = ev[i].token;
            if (ev[i].finish != TSR_FINISH_NONE) r->fin = ev[i].finish;
        }
    }
    return guard;
}

static tsr_sched_config small_cfg(int max_seqs, int max_tokens, int ctx) {
    tsr_sched_config c = {.max_seqs = max_seqs, .max_tokens = max_tokens, .max_context = ctx,
                          .vocab_size = VOCAB, .n_eos = 1, .eos_ids = {0}};
    return c;
}

/* The backend of the fake-forward tests' dense caches (their rows are never written):
 * made once, kept for the process. */
static tsr_backend *fake_be(void) {
    static tsr_backend *be;
    if (!be && tsr_backend_create("cpu", 1, &be) != TSR_OK) be = NULL;
    return be;
}

TSR_TEST(test_batching_invariants_and_tokens) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_dense_create(fake_be(), 2, 1, 4, 128, 4, &kv));
    fake_ctx fc = {.max_seqs = 4, .max_tokens = 16};
    tsr_sched_config cfg = small_cfg(4, 16, 128);
    tsr_sched *s = NULL;
    ASSERT_OK(tsr_sched_create(&cfg, kv, fake_exec, &fc, &s));
    enum { N = 10 };
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 1 + i % 20; /* never 0 (EOS) by itself */
    for (int r = 0; r < N; r++) {
        tsr_sched_request q = {.tag = (uint64_t)r, .prompt = prompt, .n_prompt = 3 + 4 * r,
                               .max_new_tokens = 5 + r % 3,
                               .sampling = {.temperature = 0, .top_p = 1}};
        ASSERT_OK(tsr_sched_submit(s, &q));
    }
    ASSERT_EQ_INT(tsr_sched_n_waiting(s), N);
    result res[N];
    memset(res, 0, sizeof res);
    int maxr = 0;
    ASSERT_TRUE(drive(s, res, N, &maxr) > 0);
    ASSERT_EQ_INT(fc.violations, 0);
    ASSERT_EQ_INT(maxr, 4);                /* the running set filled up ... */
    ASSERT_EQ_INT(fc.max_n_seqs, 4);       /* ... and never overflowed */
    ASSERT_EQ_INT(fc.max_n_tokens, 16);    /* the token budget was used, not exceeded */
    ASSERT_TRUE(fc.mixed_steps > 0);       /* chunked prefill ran next to decodes */
    for (int r = 0; r < N; r++) {
        int np = 3 + 4 * r, want = 5 + r % 3;
        ASSERT_EQ_INT(res[r].fin, TSR_FINISH_LENGTH);
        ASSERT_EQ_INT(res[r].n, want);
        ASSERT_EQ_INT(res[r].events, want); /* one event per token, the last finishes */
        int32_t t = prompt[np - 1];
        for (int k = 0; k < want; k++) {
            t = (t + 1) % VOCAB;
            ASSERT_EQ_INT(res[r].toks[k], t);
        }
    }
    /* Every prompt and every fed generated token went through a step exactly once. */
    int64_t expect = 0;
    for (int r = 0; r < N; r++) expect += 3 + 4 * r + (5 + r % 3) - 1;
    ASSERT_EQ_INT(fc.tokens_seen, expect);
    tsr_kv_stats st;
    kv->ops->stats(kv, &st);
    ASSERT_EQ_INT(st.tokens_resident, 0); /* finished sequences freed their KV */
    ASSERT_EQ_INT(tsr_sched_has_work(s), 0);
    tsr_sched_destroy(s);
    tsr_kv_cache_destroy(kv);
}

TSR_TEST(test_join_finish_eos_context_and_early_stop) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_dense_create(fake_be(), 1, 1, 4, 16, 2, &kv));
    fake_ctx fc = {.max_seqs = 2, .max_tokens = 8};
    tsr_sched_config cfg = small_cfg(2, 8, 16);
    tsr_sched *s = NULL;
    ASSERT_OK(tsr_sched_create(&cfg, kv, fake_exec, &fc, &s));
    int32_t p_eos[] = {5, 62};  /* next tokens: 63, then 0 = EOS */
    int32_t p_ctx[14];          /* 14 of 16 positions: the context ends generation */
    for (int i = 0; i < 14; i++) p_ctx[i] = 1 + i;
    int32_t p_stop[] = {7};
    int32_t p_zero[] = {9};
    tsr_sched_request rq[] = {
        {.tag = 0, .prompt = p_eos, .n_prompt = 2, .max_new_tokens = 10},
        {.tag = 1, .prompt = p_ctx, .n_prompt = 14, .max_new_tokens = 10},
        {.tag = 2, .prompt = p_stop, .n_prompt = 1, .max_new_tokens = 10},
        {.tag = 3, .prompt = p_zero, .n_prompt = 1, .max_new_tokens = 0},
    };
    for (int i = 0; i < 4; i++) {
        rq[i].sampling = (tsr_sampler_params){.temperature = 0, .top_p = 1};
        ASSERT_OK(tsr_sched_submit(s, &rq[i]));
    }
    tsr_sched_request too_long = {.tag = 9, .prompt = p_ctx, .n_prompt = 16,
                                  .max_new_tokens = 1, .sampling = {.top_p = 1}};
    ASSERT_EQ_INT(tsr_sched_submit(s, &too_long), TSR_ERR_BUDGET);
    result res[4];
    memset(res, 0, sizeof res);
    int guard = 0, stopped = 0;
    while (tsr_sched_has_work(s) && guard++ < 1000) {
        const tsr_sched_event *ev;
        int n_ev;
        ASSERT_OK(tsr_sched_step(s, &ev, &n_ev, NULL));
        for (int i = 0; i < n_ev; i++) {
            result *r = &res[ev[i].tag];
            if (ev[i].token >= 0) r->toks[r->n++] = ev[i].token;
            if (ev[i].finish) {
                r->fin = ev[i].finish;
                r->eos = ev[i].eos;
            }
            /* the caller ends request 2 after its 3rd token (a stop string) */
            if (ev[i].tag == 2 && r->n == 3 && !ev[i].finish) {
                ASSERT_TRUE(tsr_sched_finish(s, 2));
                stopped = 1;
            }
        }
    }
    ASSERT_EQ_INT(stopped, 1);
    ASSERT_EQ_INT(tsr_sched_finish(s, 2), 0); /* already gone */
    ASSERT_EQ_INT(res[0].fin, TSR_FINISH_EOS);
    ASSERT_EQ_INT(res[0].n, 1);
    ASSERT_EQ_INT(res[0].toks[0], 63);
    ASSERT_EQ_INT(res[0].eos, 0); /* the EOS token that ended it (harmony: which stop) */
    ASSERT_EQ_INT(res[1].eos, -1);
    /* generate's rule: tokens until the next one would not fit; 16 - 14 + 1 = 3 */
    ASSERT_EQ_INT(res[1].fin, TSR_FINISH_CONTEXT);
    ASSERT_EQ_INT(res[1].n, 3);
    ASSERT_EQ_INT(res[2].n, 3);
    ASSERT_EQ_INT(res[3].fin, TSR_FINISH_LENGTH);
    ASSERT_EQ_INT(res[3].n, 0);
    ASSERT_EQ_INT(fc.violations, 0);
    tsr_sched_destroy(s);
    tsr_kv_cache_destroy(kv);
}

/* A KV cache that holds at most `budget` tokens over all sequences: reserve answers
 * TSR_ERR_NO_BLOCKS past it (a block pool that is short), everything else is the dense
 * cache underneath. */
typedef struct tight_kv {
    tsr_kv_cache base;
    tsr_kv_cache *inner;
    int64_t budget;
    int32_t want[8]; /* reserved length per sequence */
    tsr_kv_cache_ops ops;
} tight_kv;

static int64_t tight_used(const tight_kv *t, int except, int32_t with) {
    int64_t u = 0;
    for (int i = 0; i < 8; i++) u += i == except ? with : t->want[i];
    return u;
}
static tsr_status tight_seq_add(tsr_kv_cache *kv, int seq) {
    tight_kv *t = (tight_kv *)kv;
    /* admission needs room for at least one token */
    if (tight_used(t, -1, 0) + 1 > t->budget) return TSR_ERR_NO_BLOCKS;
    t->want[seq] = 0;
    return t->inner->ops->seq_add(t->inner, seq);
}
static void tight_seq_free(tsr_kv_cache *kv, int seq) {
    tight_kv *t = (tight_kv *)kv;
    t->want[seq] = 0;
    t->inner->ops->seq_free(t->inner, seq);
}
static int32_t tight_seq_len(const tsr_kv_cache *kv, int seq) {
    const tight_kv *t = (const tight_kv *)kv;
    return t->inner->ops->seq_len(t->inner, seq);
}
static tsr_status tight_reserve(tsr_kv_cache *kv, int seq, int32_t n) {
    tight_kv *t = (tight_kv *)kv;
    int32_t need = t->inner->ops->seq_len(t->inner, seq) + n;
    if (need > t->budget) return TSR_ERR_BUDGET;
    if (tight_used(t, seq, need) > t->budget) return TSR_ERR_NO_BLOCKS;
    TSR_TRY(t->inner->ops->reserve(t->inner, seq, n));
    t->want[seq] = need;
    return TSR_OK;
}
static tsr_status tight_write(tsr_kv_cache *kv, int layer, int seq, int32_t n, const float *k,
                              const float *v) {
    tight_kv *t = (tight_kv *)kv;
    return t->inner->ops->write(t->inner, layer, seq, n, k, v);
}
static tsr_status tight_commit(tsr_kv_cache *kv, int seq, const int32_t *tokens, int32_t n) {
    tight_kv *t = (tight_kv *)kv;
    return t->inner->ops->commit(t->inner, seq, tokens, n);
}
static tsr_status tight_spans(tsr_kv_cache *kv, int layer, int seq, const tsr_kv_span **sp,
                              int *n) {
    tight_kv *t = (tight_kv *)kv;
    return t->inner->ops->spans(t->inner, layer, seq, sp, n);
}
static void tight_stats(const tsr_kv_cache *kv, tsr_kv_stats *out) {
    const tight_kv *t = (const tight_kv *)kv;
    t->inner->ops->stats(t->inner, out);
}
static void tight_destroy(tsr_kv_cache *kv) { (void)kv; }

static void tight_init(tight_kv *t, tsr_kv_cache *inner, int64_t budget) {
    memset(t, 0, sizeof *t);
    t->inner = inner;
    t->budget = budget;
    t->ops = (tsr_kv_cache_ops){.name = "tight", .destroy = tight_destroy,
                                .seq_add = tight_seq_add, .seq_free = tight_seq_free,
                                .seq_len = tight_seq_len, .reserve = tight_reserve,
                                .write = tight_write, .spans = tight_spans,
                                .commit = tight_commit, .stats = tight_stats};
    t->base = *inner;
    t->base.ops = &t->ops;
}

TSR_TEST(test_short_kv_defers_and_preempts) {
    enum { N = 8 };
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 1 + (i * 7) % 30;
    result ref[N], got[N];
    int64_t preempt = 0;
    for (int pass = 0; pass < 2; pass++) {
        tsr_kv_cache *inner = NULL;
        ASSERT_OK(tsr_kv_dense_create(fake_be(), 1, 1, 4, 64, 4, &inner));
        tight_kv tk;
        tight_init(&tk, inner, pass == 0 ? 100000 : 40); /* 40 tokens for 4 x ~30 wanted */
        fake_ctx fc = {.max_seqs = 4, .max_tokens = 12};
        tsr_sched_config cfg = small_cfg(4, 12, 64);
        tsr_sched *s = NULL;
        ASSERT_OK(tsr_sched_create(&cfg, &tk.base, fake_exec, &fc, &s));
        for (int r = 0; r < N; r++) {
            tsr_sched_request q = {.tag = (uint64_t)r, .prompt = prompt + r, .n_prompt = 6 + r,
                                   .max_new_tokens = 12,
                                   .sampling = {.temperature = 0, .top_p = 1}};
            ASSERT_OK(tsr_sched_submit(s, &q));
        }
        result *res = pass == 0 ? ref : got;
        memset(res, 0, sizeof(result) * N);
        ASSERT_TRUE(drive(s, res, N, NULL) > 0);
        ASSERT_EQ_INT(fc.violations, 0);
        tsr_sched_totals t;
        tsr_sched_get_totals(s, &t);
        if (pass == 1) preempt = t.preemptions;
        tsr_sched_destroy(s);
        tsr_kv_cache_destroy(inner);
    }
    ASSERT_TRUE(preempt > 0); /* the short cache forced recomputation ... */
    for (int r = 0; r < N; r++) { /* ... and nobody lost or changed a token */
        ASSERT_EQ_INT(got[r].fin, TSR_FINISH_LENGTH);
        ASSERT_EQ_INT(got[r].n, ref[r].n);
        for (int k = 0; k < ref[r].n; k++) ASSERT_EQ_INT(got[r].toks[k], ref[r].toks[k]);
    }
}

/* ---- the bundled model -------------------------------------------------------------- */

static const char *model_path(void) { return TSR_SOURCE_DIR "/models/stories260K.bin"; }

static const char *const TEST_BACKENDS[] = {"cpu", "cpu-fenced"};
#define N_TEST_BACKENDS (int)(sizeof TEST_BACKENDS / sizeof TEST_BACKENDS[0])

/* false (with a note) when this build cannot create the backend (cpu-fenced until built). */
static bool backend_available(const char *name) {
    tsr_backend *be = NULL;
    tsr_status st = tsr_backend_create(name, 1, &be);
    tsr_backend_destroy(be);
    if (st == TSR_ERR_UNSUPPORTED)
        fprintf(stderr, "  note: backend %s skipped: %s\n", name, tsr_last_error());
    return st == TSR_OK;
}

/* Runs prompts through the scheduler on an engine of `backend` (the model borrowed, a dense
 * cache); tokens[r] gets request r's tokens. */
static tsr_status run_model(tsr_model *m, const char *backend, int max_seqs, int max_tokens,
                            int32_t **prompts, const int *n_prompt, int n, int max_new,
                            int32_t out[][48], int *n_out, int64_t *mixed) {
    const tsr_model_config *c = &m->cfg;
    tsr_engine *eng = NULL;
    tsr_sched *s = NULL;
    tsr_engine_spec eo = {.backend = backend, .threads = 2, .max_tokens = max_tokens,
                             .kv = {.max_seqs = max_seqs}, .dense_kv_tokens = c->max_seq_len,
                             .borrow_model = true};
    eo.model = m;
    tsr_status st = tsr_engine_create(&eo, &eng);
    tsr_sched_config cfg = {.max_seqs = max_seqs, .max_tokens = max_tokens,
                            .max_context = c->max_seq_len, .vocab_size = c->vocab_size};
    if (st == TSR_OK) st = tsr_sched_create(&cfg, eng->kv, tsr_sched_exec_forward, eng->fwd, &s);
    for (int r = 0; r < n && st == TSR_OK; r++) {
        tsr_sched_request q = {.tag = (uint64_t)r, .prompt = prompts[r],
                               .n_prompt = n_prompt[r], .max_new_tokens = max_new,
                               .sampling = {.temperature = 0, .top_p = 1}};
        st = tsr_sched_submit(s, &q);
        n_out[r] = 0;
    }
    while (st == TSR_OK && tsr_sched_has_work(s)) {
        const tsr_sched_event *ev;
        int n_ev;
        tsr_sched_step_info info;
        st = tsr_sched_step(s, &ev, &n_ev, &info);
        if (info.n_decode && info.n_prefill && mixed) (*mixed)++;
        for (int i = 0; st == TSR_OK && i < n_ev; i++)
            if (ev[i].token >= 0 && n_out[ev[i].tag] < 48)
                out[ev[i].tag][n_out[ev[i].tag]++] = ev[i].token;
    }
    tsr_sched_destroy(s);
    tsr_engine_destroy(eng);
    return st;
}

static void check_greedy_batched_equals_solo(const char *backend, tsr_model *m,
                                             int32_t **prompts, int *np, int N, int NEW) {
    static int32_t solo[16][48], batched[16][48];
    int ns[16], nb[16];
    fprintf(stderr, "  backend %s\n", backend);
    /* alone: one sequence, whole prompt in one chunk (what `tessera generate` does) */
    for (int r = 0; r < N; r++) {
        int32_t one[1][48];
        int n1[1];
        ASSERT_OK(run_model(m, backend, 1, 512, &prompts[r], &np[r], 1, NEW, one, n1, NULL));
        memcpy(solo[r], one[0], sizeof one[0]);
        ns[r] = n1[0];
    }
    /* batched with a small token budget, so prefills are chunked and mixed with decodes */
    int64_t mixed = 0;
    ASSERT_OK(run_model(m, backend, 8, 16, prompts, np, N, NEW, batched, nb, &mixed));
    ASSERT_TRUE(mixed > 0);
    for (int r = 0; r < N; r++) {
        ASSERT_EQ_INT(nb[r], ns[r]);
        for (int k = 0; k < ns[r]; k++) ASSERT_EQ_INT(batched[r][k], solo[r][k]);
    }
}

TSR_TEST(test_greedy_batched_equals_solo_on_model) {
    tsr_model *m = NULL;
    tsr_tokenizer *tok = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    ASSERT_OK(tsr_tokenizer_load(TSR_SOURCE_DIR "/models/tok512.bin", &tok));
    static const char *texts[] = {
        "Once upon a time", "The little dog", "Lily wanted to", "One day, Tom saw a big",
        "The sun was", "Sam and Mia went to the park and", "There was a", "Mom said",
        "The cat", "A bird flew over the tree and then it", "Ben had a red ball.",
        "In the forest",
    };
    enum { N = 12, NEW = 24 };
    int32_t *prompts[N];
    int np[N];
    for (int r = 0; r < N; r++) {
        size_t n = 0;
        ASSERT_OK(tsr_tokenizer_encode(tok, texts[r], strlen(texts[r]), true, false,
                                       &prompts[r], &n));
        np[r] = (int)n;
    }
    for (int b = 0; b < N_TEST_BACKENDS && !tsr_test_failed_flag; b++)
        if (backend_available(TEST_BACKENDS[b]))
            check_greedy_batched_equals_solo(TEST_BACKENDS[b], m, prompts, np, N, NEW);
    for (int r = 0; r < N; r++) tsr_free(prompts[r]);
    tsr_tokenizer_destroy(tok);
    tsr_model_destroy(m);
}

/* ---- sampling through the backend's op ------------------------------------------------ */

enum { SO_N = 8, SO_NEW = 24 };

/* SO_N requests (greedy, temperature, top-k, top-p, combinations; seeded), batched with a
 * small token budget so that prefills chunk and mix with decodes; on_device: through
 * tsr_sched_sample_last_stage (the logits stay in backend memory, the sample op draws),
 * else the logits come to the host and its sampler draws. */
static tsr_status sample_job(tsr_model *m, const char *backend, bool on_device,
                             int32_t **prompts, const int *np, int32_t out[][SO_NEW],
                             int *n_out) {
    const tsr_model_config *c = &m->cfg;
    tsr_engine_spec eo = {.backend = backend, .threads = 2, .max_tokens = 16,
                             .kv = {.max_seqs = 4}, .dense_kv_tokens = c->max_seq_len,
                             .borrow_model = true};
    tsr_engine *eng = NULL;
    tsr_sched *s = NULL;
    eo.model = m;
    tsr_status st = tsr_engine_create(&eo, &eng);
    tsr_sched_config cfg = {.max_seqs = 4, .max_tokens = 16, .max_context = c->max_seq_len,
                            .vocab_size = c->vocab_size};
    if (st == TSR_OK) st = tsr_sched_create(&cfg, eng->kv, tsr_sched_exec_forward, eng->fwd, &s);
    if (st == TSR_OK && on_device) st = tsr_sched_sample_last_stage(s, eng->fwd);
    static const tsr_sampler_params sp[SO_N] = {
        {.temperature = 0, .top_p = 1},
        {.temperature = 0.8f, .top_p = 1},
        {.temperature = 1.0f, .top_p = 1, .top_k = 5},
        {.temperature = 0.9f, .top_p = 0.8f},
        {.temperature = 1.2f, .top_p = 0.9f, .top_k = 20},
        {.temperature = 0, .top_p = 0.5f, .top_k = 3},
        {.temperature = 0.5f, .top_p = 0.95f, .top_k = 1},
        {.temperature = 1.5f, .top_p = 1, .top_k = 40},
    };
    for (int r = 0; r < SO_N && st == TSR_OK; r++) {
        tsr_sched_request q = {.tag = (uint64_t)r, .prompt = prompts[r], .n_prompt = np[r],
                               .max_new_tokens = SO_NEW, .sampling = sp[r]};
        q.sampling.seed = 11 + 3 * (uint64_t)r;
        st = tsr_sched_submit(s, &q);
        n_out[r] = 0;
    }
    while (st == TSR_OK && tsr_sched_has_work(s)) {
        const tsr_sched_event *ev;
        int n_ev;
        st = tsr_sched_step(s, &ev, &n_ev, NULL);
        for (int i = 0; st == TSR_OK && i < n_ev; i++)
            if (ev[i].token >= 0 && n_out[ev[i].tag] < SO_NEW)
                out[ev[i].tag][n_out[ev[i].tag]++] = ev[i].token;
    }
    tsr_sched_destroy(s);
    tsr_engine_destroy(eng);
    return st;
}

TSR_TEST(test_sampling_through_op_equals_host) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    int32_t buf[SO_N][20], *prompts[SO_N];
    int np[SO_N];
    for (int r = 0; r < SO_N; r++) {
        np[r] = 6 + 3 * r % 14;
        for (int j = 0; j < np[r]; j++) buf[r][j] = 1 + (r * 37 + j * 11) % (m->cfg.vocab_size - 1);
        prompts[r] = buf[r];
    }
    for (int b = 0; b < N_TEST_BACKENDS && !tsr_test_failed_flag; b++) {
        if (!backend_available(TEST_BACKENDS[b])) continue;
        fprintf(stderr, "  backend %s\n", TEST_BACKENDS[b]);
        static int32_t host[SO_N][SO_NEW], dev[SO_N][SO_NEW];
        int nh[SO_N], nd[SO_N], total = 0;
        ASSERT_OK(sample_job(m, TEST_BACKENDS[b], false, prompts, np, host, nh));
        ASSERT_OK(sample_job(m, TEST_BACKENDS[b], true, prompts, np, dev, nd));
        for (int r = 0; r < SO_N; r++) {
            ASSERT_EQ_INT(nd[r], nh[r]);
            for (int k = 0; k < nh[r]; k++) ASSERT_EQ_INT(dev[r][k], host[r][k]);
            total += nh[r];
        }
        ASSERT_TRUE(total > SO_N * 4); /* the requests did generate */
    }
    tsr_model_destroy(m);
}

/* ---- preemption by swap -------------------------------------------------------------- */

enum { SW_N = 8, SW_NEW = 40, SW_CTX = 96 };

typedef struct swap_run {
    int32_t toks[SW_N][SW_NEW];
    int n[SW_N];
    tsr_sched_totals t;
} swap_run;

/* The job on `eng` (its forward; the KV cache made here by tsr_kv_setup on its backend):
 * SW_N requests, greedy and sampled, 4 at a time, preempting by `mode`. blocks: the pool's
 * blocks per layer; host_bytes: the host pool's budget (0: unlimited). */
static tsr_status swap_job(tsr_engine *eng, const char *policy, int blocks, int64_t host_bytes,
                           tsr_sched_preempt mode, int32_t **prompts, const int *np,
                           swap_run *out) {
    const tsr_model_config *c = &eng->model->cfg;
    tsr_kv_paged_config pc = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                              .head_dim = c->head_dim, .block_size = 16, .keep_scores = 1};
    bool budgeted = strcmp(policy, "paged") != 0;
    tsr_kv_options ko = {.policy = tsr_kv_policy_find(policy), .block_size = 16, .max_seqs = 4,
                         .memory_bytes = tsr_kv_paged_block_bytes(&pc) * c->n_layers * blocks,
                         .budget = budgeted ? 0.5 : 0, .host_bytes = host_bytes,
                         .chunk_tokens = 256, .max_context = SW_CTX, .be = eng->be};
    tsr_kv_cache *kv = NULL;
    tsr_sched *s = NULL;
    tsr_status st = tsr_kv_setup(&ko, c, &kv);
    /* Every prompt prefills in one chunk in both runs (max_tokens holds them all): h2o and
     * offload decide per chunk, so only the preemptions may differ between the runs. */
    tsr_sched_config cfg = {.max_seqs = 4, .max_tokens = 256, .max_context = SW_CTX,
                            .vocab_size = c->vocab_size, .preempt = mode};
    if (st == TSR_OK) st = tsr_sched_create(&cfg, kv, tsr_sched_exec_forward, eng->fwd, &s);
    memset(out, 0, sizeof *out);
    for (int r = 0; r < SW_N && st == TSR_OK; r++) {
        tsr_sched_request q = {.tag = (uint64_t)r, .prompt = prompts[r], .n_prompt = np[r],
                               .max_new_tokens = SW_NEW,
                               .sampling = {.temperature = r % 2 ? 0.8f : 0.0f, .top_p = 0.9f,
                                            .seed = 7 + (uint64_t)r}};
        st = tsr_sched_submit(s, &q);
    }
    while (st == TSR_OK && tsr_sched_has_work(s)) {
        const tsr_sched_event *ev;
        int n_ev;
        st = tsr_sched_step(s, &ev, &n_ev, NULL);
        for (int i = 0; st == TSR_OK && i < n_ev; i++) {
            if (ev[i].finish == TSR_FINISH_ERROR)
                st = tsr_error_set(TSR_ERR_INTERNAL, "request %d failed", (int)ev[i].tag);
            if (ev[i].token >= 0 && out->n[ev[i].tag] < SW_NEW)
                out->toks[ev[i].tag][out->n[ev[i].tag]++] = ev[i].token;
        }
    }
    if (s) tsr_sched_get_totals(s, &out->t);
    tsr_sched_destroy(s);
    tsr_kv_cache_destroy(kv);
    return st;
}

static void swap_same(const swap_run *a, const swap_run *b) {
    for (int r = 0; r < SW_N; r++) {
        ASSERT_EQ_INT(a->n[r], b->n[r]);
        for (int k = 0; k < a->n[r]; k++) ASSERT_EQ_INT(a->toks[r][k], b->toks[r][k]);
    }
}

static void check_swap_on(const char *backend, tsr_model *m, int32_t **prompts, const int *np) {
    tsr_engine_spec eo = {.backend = backend, .threads = 2, .max_tokens = 256,
                             .kv = {.max_seqs = 1}, .dense_kv_tokens = 1,
                             .borrow_model = true};
    tsr_engine *eng = NULL;
    eo.model = m;
    ASSERT_OK(tsr_engine_create(&eo, &eng));
    static swap_run big, tiny, full;
    /* Every registered policy, by name, so a new one is covered without a line here. */
    const char *names = tsr_kv_policy_names();
    for (const char *p = names; *p && !tsr_test_failed_flag;) {
        size_t len = strcspn(p, "|");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        p += len + (p[len] == '|');
        if (!tsr_kv_policy_find(name)) continue;
        /* 64 blocks per layer hold all 4 running sequences; 10 hold fewer than two (6
         * under a budget of half the sequence). */
        int few = strcmp(name, "paged") ? 6 : 10;
        ASSERT_OK(swap_job(eng, name, 64, 0, TSR_PREEMPT_SWAP, prompts, np, &big));
        ASSERT_OK(swap_job(eng, name, few, 0, TSR_PREEMPT_SWAP, prompts, np, &tiny));
        fprintf(stderr, "  %s %s: %lld preemptions, %lld swapped out (%lld bytes), %lld in, "
                "%lld fallbacks\n", backend, name, (long long)tiny.t.preemptions,
                (long long)tiny.t.swaps_out, (long long)tiny.t.swap_out_bytes,
                (long long)tiny.t.swaps_in, (long long)tiny.t.swap_fallbacks);
        ASSERT_EQ_INT(big.t.preemptions, 0);
        ASSERT_TRUE(tiny.t.swaps_out > 0);
        ASSERT_EQ_INT(tiny.t.swaps_in, tiny.t.swaps_out);
        ASSERT_EQ_INT(tiny.t.swap_in_bytes, tiny.t.swap_out_bytes);
        ASSERT_EQ_INT(tiny.t.swap_fallbacks, 0);
        swap_same(&big, &tiny);
        if (strcmp(name, "paged") != 0) continue;
        /* A host pool with room for about one swapped sequence: the others recompute (the
         * host copy of offload lives there too, so only paged can run on it). */
        int64_t row = 2 * (int64_t)m->cfg.n_kv_heads * m->cfg.head_dim * 4 + 8;
        ASSERT_OK(swap_job(eng, name, 10, row * m->cfg.n_layers * 40, TSR_PREEMPT_SWAP,
                           prompts, np, &full));
        fprintf(stderr, "  %s %s, small host pool: %lld swapped out, %lld fallbacks\n",
                backend, name, (long long)full.t.swaps_out, (long long)full.t.swap_fallbacks);
        ASSERT_TRUE(full.t.swap_fallbacks > 0);
        ASSERT_TRUE(full.t.swaps_out > 0);
        swap_same(&big, &full);
    }
    tsr_engine_destroy(eng);
}

TSR_TEST(test_swap_preemption_each_policy) {
    tsr_model *m = NULL;
    tsr_tokenizer *tok = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    ASSERT_OK(tsr_tokenizer_load(TSR_SOURCE_DIR "/models/tok512.bin", &tok));
    static const char *texts[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play outside",
        "The little dog ran to the big tree and saw a bird. The bird was sad because",
        "Tom and Sam went to the beach. They built a big sand castle and then",
        "One day, a cat found a red ball in the garden. The cat wanted to play with it",
    };
    int32_t *prompts[SW_N];
    int np[SW_N];
    for (int r = 0; r < SW_N; r++) {
        size_t n = 0;
        const char *t = texts[r % 4];
        ASSERT_OK(tsr_tokenizer_encode(tok, t, strlen(t) - (size_t)(r / 4) * 6, true, false,
                                       &prompts[r], &n));
        np[r] = (int)n;
    }
    for (int b = 0; b < N_TEST_BACKENDS && !tsr_test_failed_flag; b++)
        if (backend_available(TEST_BACKENDS[b]))
            check_swap_on(TEST_BACKENDS[b], m, prompts, np);
    for (int r = 0; r < SW_N; r++) tsr_free(prompts[r]);
    tsr_tokenizer_destroy(tok);
    tsr_model_destroy(m);
}

/* Are the rows of a batched matmul bit-identical to one-row products? The forward's rows
 * are otherwise independent, so this decides whether batched logits equal solo logits
 * exactly. The answer is printed; the test asserts closeness only. A property of the CPU
 * kernels on host memory (the plain CPU backend only). */
TSR_TEST(test_matmul_rows_batched_vs_single) {
    tsr_model *m = NULL;
    tsr_backend *be = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    ASSERT_OK(tsr_backend_create("cpu", 2, &be));
    const tsr_tensor *ws[] = {&m->layers[0].wq, &m->layers[0].w_gate, &m->layers[0].w_down,
                              &m->classifier};
    enum { MAXN = 64 };
    int counts[] = {2, 4, 5, 8, 16, 64};
    size_t big = 600; /* >= every rows/cols of the model */
    float *x = tsr_malloc(MAXN * big * 4), *yb = tsr_malloc(MAXN * big * 4);
    float *y1 = tsr_malloc(big * 4);
    ASSERT_TRUE(x && yb && y1);
    uint64_t z = 12345;
    for (size_t i = 0; i < MAXN * big; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((z >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++) {
        const tsr_tensor *w = ws[wi];
        int64_t rows = w->rows, cols = w->cols;
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            int n = counts[ci];
            ASSERT_OK(be->ops->matmul(be, x, n, w, yb));
            double maxd = 0;
            int64_t differ = 0;
            for (int r = 0; r < n; r++) {
                ASSERT_OK(be->ops->matmul(be, x + (size_t)r * cols, 1, w, y1));
                for (int64_t j = 0; j < rows; j++) {
                    double d = fabs((double)yb[(size_t)r * rows + j] - (double)y1[j]);
                    if (yb[(size_t)r * rows + j] != y1[j]) differ++;
                    if (d > maxd) maxd = d;
                }
            }
            fprintf(stderr, "  matmul %lldx%lld, batch of %d rows vs 1 row: %s (%lld of %lld "
                    "values differ, max |diff| %.3g)\n", (long long)rows, (long long)cols, n,
                    differ ? "NOT bit-identical" : "bit-identical", (long long)differ,
                    (long long)(n * rows), maxd);
            ASSERT_TRUE(maxd < 1e-4);
        }
    }
    tsr_free(x);
    tsr_free(yb);
    tsr_free(y1);
    tsr_backend_destroy(be);
    tsr_model_destroy(m);
}

TSR_TEST_MAIN(test_batching_invariants_and_tokens, test_join_finish_eos_context_and_early_stop,
              test_short_kv_defers_and_preempts, test_greedy_batched_equals_solo_on_model,
              test_sampling_through_op_equals_host, test_matmul_rows_batched_vs_single,
              test_swap_preemption_each_policy)
