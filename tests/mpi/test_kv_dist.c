/* The distributed block manager under mpirun (tp = world / PP, PP stages):
 *  - ranks given different --kv-memory agree on the smallest pool (blocks per layer);
 *  - a scheduler run with more requests than the pool holds (admission deferred,
 *    preemption: asserted > 0) keeps identical block-table digests in every TP group and the
 *    same sequence lengths on every rank after every step;
 *  - without injection, every rank's local answer matched the agreed one (no disagreement);
 *  - with `inject`: a shortage on one rank, injected (tsr_kv_dist_test_fail_rank) or real
 *    (blocks taken on that rank alone), makes seq_add and reserve fail on every rank and
 *    leaves every cache as it was, for each rank in turn; then the job runs with a shortage
 *    injected on a different rank every few steps (more preemption, deferred admission);
 *  - the tokens of each request are the same on every rank and equal a one-rank run of the
 *    same job (all-reduced, and TSR_EXPECT_SUM from kv_dist.sh). With `inject` the one-rank
 *    run wraps its cache in the dist manager too and gets the same shortages at the same
 *    steps: an agreed failure must give the schedule (preemptions, deferrals) of one
 *    process. (Not fewer shortages: h2o and offload evict per prefill chunk, so a different
 *    schedule may give different tokens; paged would not.)
 * The weights and the K/V live in the memory of the backend given with --backend (default
 * cpu; kv_dist.sh compares a cpu-fenced job with one cpu process, so the fenced device must
 * also give the plain CPU's tokens). Exits 77 (skipped) where this build lacks the backend.
 *  - with `swap`: the scheduler preempts by swap (runtime/exec/scheduler.h); every rank swaps
 *    the same sequences out and in at the same steps (equal counts, identical tables after
 *    every step) and no swap falls back; with `swapfull` rank 1's host pool (rank 0's in
 *    one process) holds about one short sequence, so its shortage makes every rank fall
 *    back to recompute for those sequences (equal fallback counts, > 0).
 * Usage: test_kv_dist [--backend NAME] POLICY [PP [inject|swap|swapfull]]
 *        (POLICY: paged | h2o | offload) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "memory/kv_dist.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "runtime/exec/parallel.h"
#include "runtime/exec/scheduler.h"

static tsr_comm *g_comm;
static int g_rank;
static bool g_paged; /* policy paged: every layer of a sequence holds the same blocks */
static int g_swap;   /* 1: preempt by swap; 2: and a small host pool on one rank */

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "test_kv_dist: rank %d: ", g_rank);                            \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, " (%s)\n", tsr_last_error());                                   \
            tsr_comm_abort(g_comm, 1, "check failed");                                      \
        }                                                                                   \
    } while (0)

enum { N_REQ = 12, MAX_SEQS = 4, GEN = 24, BLOCKS = 7 };

/* True when v is the same on every rank of group g (collective). */
static bool tsr__same(tsr_comm_group g, int64_t v) {
    int64_t b[2] = {v, -v};
    CHECK(tsr_comm_allreduce_i64(g_comm, g, b, 2, TSR_COMM_MAX) == TSR_OK, "all-reduce");
    return b[0] == -b[1];
}

static int64_t tsr__sum(int64_t v) {
    CHECK(tsr_comm_allreduce_i64(g_comm, TSR_COMM_WORLD, &v, 1, TSR_COMM_SUM) == TSR_OK,
          "all-reduce");
    return v;
}

static uint64_t tsr__fnv(uint64_t h, uint64_t x) { return (h ^ x) * 1099511628211ull; }

/* Free blocks of the pool under the wrappers, through the interface (detail). */
static int32_t tsr__free_blocks(const tsr_kv_cache *kv) {
    tsr_kv_detail d;
    tsr_kv_cache_detail(kv, &d);
    CHECK(d.blocks.blocks_total > 0, "no block pool under the wrapper");
    return d.blocks.blocks_total - d.blocks.blocks_used;
}

/* Identical caches: the same block tables in every TP group (same heads, same layers) and
 * the same sequence lengths on every rank (every stage); under paged, where every layer of
 * a sequence holds as many blocks, also the same free blocks per layer on every rank. */
static void tsr__check_same(tsr_kv_cache *kv, const char *when) {
    CHECK(tsr__same(TSR_COMM_TP, (int64_t)(tsr_kv_dist_tables_digest(kv, MAX_SEQS) >> 1)),
          "block tables differ in the TP group %s", when);
    uint64_t h = 1469598103934665603ull;
    for (int s = 0; s < MAX_SEQS; s++) h = tsr__fnv(h, (uint64_t)kv->ops->seq_len(kv, s));
    CHECK(tsr__same(TSR_COMM_WORLD, (int64_t)(h >> 1)), "sequence lengths differ %s", when);
    if (g_paged)
        CHECK(tsr__same(TSR_COMM_WORLD, tsr__free_blocks(kv) / kv->n_layers),
              "free blocks per layer differ %s", when);
}

/* Blocks of seq in every local layer (equal across layers here: nothing is evicted). */
static int32_t tsr__seq_blocks(tsr_kv_cache *kv, int seq) {
    int32_t nb = kv->ops->seq_blocks(kv, 0, seq, NULL);
    for (int l = 1; l < kv->n_layers; l++)
        CHECK(kv->ops->seq_blocks(kv, l, seq, NULL) == nb, "layers differ");
    return nb;
}

/* One rank short of blocks, every rank fails, and no cache changes. The rank is short by
 * injection, or for real: it alone holds another sequence that fills its pool. */
static void tsr__agreement(tsr_kv_cache *kv, int world) {
    tsr_kv_cache *in = tsr_kv_dist_inner(kv);
    int32_t total = tsr__free_blocks(kv), per_layer = total / kv->n_layers;
    CHECK(per_layer == BLOCKS && tsr__same(TSR_COMM_WORLD, per_layer), "%d blocks per layer",
          per_layer);
    for (int r = 0; r < world; r++) {
        /* admission: the ranks that added the sequence drop it again */
        tsr_kv_dist_test_fail_rank(kv, r, 1);
        tsr_status st = kv->ops->seq_add(kv, 0);
        CHECK(st == TSR_ERR_NO_BLOCKS, "seq_add with rank %d short gave %s", r,
              tsr_strerror(st));
        CHECK(kv->ops->seq_add(kv, 0) == TSR_OK, "seq_add after a failed one (rank %d)", r);
        CHECK(kv->ops->reserve(kv, 0, 20) == TSR_OK, "reserve 20");
        CHECK(tsr__seq_blocks(kv, 0) == 2, "2 blocks per layer");
        /* growth: injected shortage */
        tsr_kv_dist_test_fail_rank(kv, r, 1);
        st = kv->ops->reserve(kv, 0, 40);
        CHECK(st == TSR_ERR_NO_BLOCKS, "reserve with rank %d short gave %s", r,
              tsr_strerror(st));
        CHECK(tsr__seq_blocks(kv, 0) == 2 && tsr__free_blocks(kv) == total - 2 *
              kv->n_layers, "a failed reserve kept blocks");
        tsr__check_same(kv, "after an injected shortage");
        /* growth: rank r really short (another sequence, on r alone, takes the rest) */
        int32_t rest = (per_layer - 2) * 16;
        if (g_rank == r) {
            CHECK(in->ops->seq_add(in, 1) == TSR_OK && in->ops->reserve(in, 1, rest) == TSR_OK,
                  "filling rank %d", r);
            CHECK(tsr__free_blocks(kv) == 0, "rank %d not full", r);
        }
        st = kv->ops->reserve(kv, 0, 40);
        CHECK(st == TSR_ERR_NO_BLOCKS, "reserve with rank %d full gave %s", r, tsr_strerror(st));
        CHECK(tsr__seq_blocks(kv, 0) == 2, "a failed reserve kept blocks");
        if (g_rank == r) in->ops->seq_free(in, 1);
        CHECK(tsr__same(TSR_COMM_WORLD, tsr__free_blocks(kv) / kv->n_layers),
              "free blocks differ");
        tsr__check_same(kv, "after a real shortage");
        /* the shortage gone, the same reserve succeeds everywhere */
        CHECK(kv->ops->reserve(kv, 0, 40) == TSR_OK, "reserve 40");
        CHECK(tsr__seq_blocks(kv, 0) == 3, "3 blocks per layer");
        tsr__check_same(kv, "after growth");
        kv->ops->seq_free(kv, 0);
        CHECK(tsr__free_blocks(kv) == total, "blocks leaked");
    }
    tsr_kv_dist_stats ds;
    tsr_kv_dist_get_stats(kv, &ds);
    /* per round: 2 injected answers on r, 3 where the others' answers were overruled */
    CHECK(tsr__sum(ds.injected) == 2 * world, "%lld injected", (long long)ds.injected);
    CHECK(tsr__sum(ds.disagreements) == 3 * (int64_t)world * (world - 1), "disagreements");
}

/* Runs the job on the cache; returns a checksum of every request's tokens (per request, so
 * independent of the order in which requests progress). */
static uint64_t tsr__job(tsr_kv_cache *kv, tsr_forward *f, const tsr_model_config *mc,
                         bool inject, int world, tsr_sched_totals *tot) {
    tsr_sched_config sc = {.max_seqs = MAX_SEQS, .max_tokens = 32, .max_context = 256,
                           .vocab_size = mc->vocab_size,
                           .preempt = g_swap ? TSR_PREEMPT_SWAP : TSR_PREEMPT_RECOMPUTE};
    tsr_sched *s = NULL;
    CHECK(tsr_sched_create(&sc, kv, tsr_sched_exec_forward, f, &s) == TSR_OK, "sched");
    int32_t prompts[N_REQ][20];
    uint64_t req_sum[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        req_sum[i] = 1469598103934665603ull;
        for (int j = 0; j < 20; j++) prompts[i][j] = 1 + (i * 31 + j * 7) % (mc->vocab_size - 1);
        tsr_sched_request q = {.tag = (uint64_t)i, .prompt = prompts[i], .n_prompt = 12 + i % 8,
                               .max_new_tokens = GEN,
                               .sampling = {.temperature = 0.8f, .top_p = 0.9f,
                                            .seed = 100 + (uint64_t)i}};
        CHECK(tsr_sched_submit(s, &q) == TSR_OK, "submit");
    }
    for (int step = 0; tsr_sched_has_work(s); step++) {
        /* One failed answer with >= 2 running never ends a request (the scheduler preempts
         * or defers), so the tokens stay those of one process. */
        if (inject && step % 3 == 1 && tsr_sched_n_running(s) >= 2)
            tsr_kv_dist_test_fail_rank(kv, (step / 3) % world, 1);
        const tsr_sched_event *ev;
        int n;
        CHECK(tsr_sched_step(s, &ev, &n, NULL) == TSR_OK, "step");
        tsr_kv_dist_test_fail_rank(kv, 0, 0);
        for (int i = 0; i < n; i++) {
            CHECK(ev[i].finish != TSR_FINISH_ERROR, "request %llu failed",
                  (unsigned long long)ev[i].tag);
            uint64_t *h = &req_sum[ev[i].tag];
            *h = tsr__fnv(*h, (uint64_t)(int64_t)ev[i].token);
            *h = tsr__fnv(*h, (uint64_t)ev[i].finish);
        }
        tsr__check_same(kv, "after a step");
    }
    tsr_sched_get_totals(s, tot);
    tsr_sched_destroy(s);
    uint64_t sum = 1469598103934665603ull;
    for (int i = 0; i < N_REQ; i++) sum = tsr__fnv(sum, req_sum[i]);
    return sum;
}

/* What the run gave. */
typedef struct tsr__result {
    uint64_t sum;
    int64_t preemptions, agreements, disagreements, swaps, fallbacks;
} tsr__result;

/* The test on `backend`: an engine over the model (this rank's shard, its weights placed in
 * the backend's memory; the engine's own cache, one dense token, goes unused) and
 * tsr_kv_setup's cache on the engine's backend (the distributed one: the same blocks per
 * layer on every rank, the least any rank offers). False when this build lacks the backend
 * (on every rank: the engine agrees). */
static bool tsr__run_on(const char *backend, tsr_model *m, const tsr_parallel_shard *sh,
                        const char *policy, bool inject, int world, tsr__result *r) {
    tsr_comm *c = g_comm;
    /* One micro-batch: the same row counts as one process, so the same bits. */
    tsr_engine_spec eo = {.backend = backend, .threads = 1, .max_tokens = 32,
                             .kv = {.max_seqs = 1}, .dense_kv_tokens = 1,
                             .par = {.comm = c, .shard = *sh, .micro_batches = 1}};
    tsr_engine *eng = NULL;
    eo.model = m;
    tsr_status st = tsr_engine_create(&eo, &eng); /* takes the model */
    if (st == TSR_ERR_UNSUPPORTED) {
        if (g_rank == 0) printf("skipped: backend %s: %s\n", backend, tsr_last_error());
        return false;
    }
    CHECK(st == TSR_OK, "engine on %s", backend);
    const tsr_model_config *mc = &eng->model->cfg;
    /* A pool too small for MAX_SEQS full sequences (BLOCKS per layer, as in one process);
     * rank 1 offers even less than the others. */
    int kvd = (sh->kv_head_end - sh->kv_head_begin) * mc->head_dim;
    int64_t block = 16 * (2 * (int64_t)kvd * 4 + 8);
    int blocks = g_rank == 1 || world == 1 ? BLOCKS : BLOCKS + 2;
    tsr_kv_options ko = {.policy = tsr_kv_policy_find(policy), .block_size = 16,
                         .max_seqs = MAX_SEQS,
                         .memory_bytes = block * (sh->layer_end - sh->layer_begin) * blocks,
                         .budget = strcmp(policy, "paged") ? 0.5 : 0, .chunk_tokens = 32,
                         .shard = sh, .comm = c, .be = eng->be,
                         /* the longest request (20 prompt + GEN tokens): what the start-up
                          * check must find room for, not the model's whole context */
                         .max_context = 48};
    /* swapfull: room for about 20 tokens of one sequence on one rank */
    if (g_swap == 2 && g_rank == (world > 1 ? 1 : 0))
        ko.host_bytes = (2 * (int64_t)kvd * 4 + 8) * (sh->layer_end - sh->layer_begin) * 20;
    tsr_kv_cache *kv = NULL;
    CHECK(tsr_kv_setup(&ko, mc, &kv) == TSR_OK, "kv cache on %s", backend);
    CHECK((world > 1) == tsr_kv_is_dist(kv), "dist wrapper");
    if (inject && world == 1) { /* the reference for injected runs: the same shortages */
        tsr_kv_cache *w = NULL;
        CHECK(tsr_kv_dist_create(kv, c, &w) == TSR_OK, "dist wrapper");
        kv = w;
    }
    tsr_kv_stats ks;
    kv->ops->stats(kv, &ks);
    CHECK(tsr__same(TSR_COMM_TP, ks.bytes_capacity), "pools differ in the TP group");
    CHECK(tsr__same(TSR_COMM_WORLD, tsr__free_blocks(kv) / (sh->layer_end - sh->layer_begin)),
          "blocks per layer differ");
    if (inject) tsr__agreement(kv, world);
    tsr_kv_dist_stats before;
    tsr_kv_dist_get_stats(kv, &before);
    tsr_sched_totals tot;
    r->sum = tsr__job(kv, eng->fwd, mc, inject, world, &tot);
    r->preemptions = tot.preemptions;
    r->swaps = tot.swaps_out;
    r->fallbacks = tot.swap_fallbacks;
    /* The scheduler's decisions are the same on every rank: so are its counts. */
    CHECK(tsr__same(TSR_COMM_WORLD, tot.preemptions), "preemptions differ between ranks");
    CHECK(tsr__same(TSR_COMM_WORLD, tot.swaps_out) && tsr__same(TSR_COMM_WORLD, tot.swaps_in),
          "swaps differ between ranks");
    CHECK(tsr__same(TSR_COMM_WORLD, tot.swap_fallbacks), "swap fallbacks differ between ranks");
    CHECK(tot.swaps_in == tot.swaps_out, "%lld swapped out, %lld in", (long long)tot.swaps_out,
          (long long)tot.swaps_in);
    if (g_swap)
        CHECK(tot.swaps_out > 0 && (g_swap == 2) == (tot.swap_fallbacks > 0),
              "%lld swaps, %lld fallbacks", (long long)tot.swaps_out,
              (long long)tot.swap_fallbacks);
    else
        CHECK(tot.swaps_out == 0 && tot.swap_fallbacks == 0, "swapped under recompute");
    tsr_kv_dist_stats ds;
    tsr_kv_dist_get_stats(kv, &ds);
    r->disagreements = tsr__sum(ds.disagreements - before.disagreements);
    r->agreements = ds.agreements - before.agreements;
    int64_t inj = tsr__sum(ds.injected - before.injected);
    if (inject) /* the ranks not short were overruled */
        CHECK(inj > 0 && (r->disagreements > 0) == (world > 1), "%lld shortages injected, "
              "%lld disagreements", (long long)inj, (long long)r->disagreements);
    else if (g_swap == 2 && world > 1) /* rank 1's host pool overruled the others */
        CHECK(r->disagreements > 0, "no disagreement with a small host pool on rank 1");
    else
        CHECK(r->disagreements == 0, "%lld local answers differed from the agreed ones",
              (long long)r->disagreements);
    /* The pool holds fewer blocks than MAX_SEQS sequences need: decodes must preempt. */
    CHECK(r->preemptions > 0, "no preemption");
    CHECK(tsr__same(TSR_COMM_WORLD, (int64_t)(r->sum >> 1)), "tokens differ between ranks");
    tsr_kv_cache_destroy(kv);
    tsr_engine_destroy(eng);
    return true;
}

int main(int argc, char **argv) {
    tsr_comm_options o = {.backend = TSR_COMM_AUTO, .argc = &argc, .argv = &argv};
    if (tsr_comm_init(&o, &g_comm) != TSR_OK) {
        fprintf(stderr, "test_kv_dist: %s\n", tsr_last_error());
        return 1;
    }
    const char *backend = "cpu";
    int a = 1;
    if (argc > 2 && strcmp(argv[1], "--backend") == 0) {
        backend = argv[2];
        a = 3;
    }
    const char *policy = argc > a ? argv[a] : "paged";
    int pp = argc > a + 1 ? atoi(argv[a + 1]) : 1;
    bool inject = argc > a + 2 && strcmp(argv[a + 2], "inject") == 0;
    if (argc > a + 2 && strcmp(argv[a + 2], "swap") == 0) g_swap = 1;
    if (argc > a + 2 && strcmp(argv[a + 2], "swapfull") == 0) g_swap = 2;
    g_paged = strcmp(policy, "paged") == 0;
    tsr_comm *c = g_comm;
    g_rank = tsr_comm_world_rank(c);
    int world = tsr_comm_world_size(c);
    CHECK(pp >= 1 && world % pp == 0, "PP %d does not divide %d ranks", pp, world);
    int tp = world / pp;
    CHECK(tsr_comm_set_layout(c, tp, pp) == TSR_OK, "layout");
    tsr_model *m = NULL;
    CHECK(tsr_model_load(TSR_SOURCE_DIR "/models/stories260K.bin", &m) == TSR_OK, "load");
    tsr_parallel_layout l;
    tsr_parallel_shard sh;
    CHECK(tsr_parallel_layout_init(tp, pp, world, &l) == TSR_OK, "layout init");
    CHECK(tsr_parallel_shard_of(&l, &m->cfg, g_rank, "stories260K", &sh) == TSR_OK, "shard");
    CHECK(tsr_parallel_shard_model(m, &sh) == TSR_OK, "cut");
    tsr__result r;
    if (!tsr__run_on(backend, m, &sh, policy, inject, world, &r)) {
        tsr_comm_destroy(c);
        return 77;
    }
    if (g_rank == 0) {
        printf("policy %s on %s, %d ranks (tp %d x pp %d)%s: token checksum %016llx, %lld "
               "preemptions (%lld swapped, %lld fallbacks), %lld agreements, %lld "
               "disagreements\n",
               policy, backend, world, tp, pp,
               inject ? ", injected shortages" : g_swap == 2 ? ", swap, small host pool"
                                                 : g_swap ? ", swap" : "",
               (unsigned long long)r.sum, (long long)r.preemptions, (long long)r.swaps,
               (long long)r.fallbacks, (long long)r.agreements, (long long)r.disagreements);
        const char *want = getenv("TSR_EXPECT_SUM");
        if (want && strtoull(want, NULL, 16) != r.sum) {
            fprintf(stderr, "test_kv_dist: checksum %016llx, one cpu process gave %s\n",
                    (unsigned long long)r.sum, want);
            tsr_comm_abort(c, 1, "tokens differ from one process");
        }
    }
    tsr_comm_destroy(c);
    return 0;
}
