/* What one decode step moves between host and device for each KV policy, counted on the
 * fenced CPU device (its op `counters`): the forward pass makes host copies of the queries,
 * the attention input and the key scores only for a policy whose declaration reads them
 * (policies/policy.h). paged and streaming read none, so their step downloads nothing and
 * waits once (the sampled ids); h2o gets its scores, and its queries
 * only to materialize; snapkv its queries; offload its queries and attention input, plus
 * its own host copy's traffic. The counts per layer are printed (docs/perf.md), and paged's
 * backend calls are pinned: 6 per layer with the fused weights. */
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "policies/policy.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "runtime/exec/sampler.h"
#include "tests/test.h"

enum { NP = 40, MAX_B = 2 };

static const char *model_path(void) { return TSR_SOURCE_DIR "/models/stories260K.bin"; }

/* `batch` sequences of NP prompt tokens on the fenced device under `pol`, one decode step
 * as generate and run take it (logits kept on the device, ids sampled there); *c: the
 * counters of that step alone. */
static tsr_status decode_step(tsr_model *m, const tsr_kv_policy_decl *pol,
                              const tsr_kv_policy_arg *args, int n_args, int batch,
                              tsr_backend_counters *c) {
    tsr_backend *dev = NULL;
    TSR_TRY(tsr_backend_fenced_create(1, (size_t)256 << 20, &dev));
    if (!dev->ops->counters) {
        tsr_backend_destroy(dev);
        return tsr_error_set(TSR_ERR_INTERNAL, "cpu-fenced keeps no counters");
    }
    const int V = m->cfg.vocab_size;
    tsr_engine_spec eo = {
        .backend_given = dev, .threads = 1, .max_tokens = MAX_B * NP,
        .kv = {.policy = pol, .block_size = 16, .max_seqs = MAX_B, .memory_bytes = 8 << 20,
               .budget = pol->uses_budget ? 0.5 : 0, .policy_args = args,
               .n_policy_args = n_args},
        .borrow_model = true};
    tsr_engine *e = NULL;
    eo.model = m;
    tsr_status st = tsr_engine_create(&eo, &e); /* owns dev from here on */
    tsr_sampler smp[MAX_B] = {0};
    tsr_sampler *sp[MAX_B];
    int32_t prompt[MAX_B][NP], ids[MAX_B];
    tsr_batch_seq b[MAX_B];
    for (int s = 0; st == TSR_OK && s < batch; s++) {
        tsr_sampler_params p = {.temperature = 0, .top_p = 1, .seed = 1};
        st = tsr_sampler_init(&smp[s], V, &p);
        sp[s] = &smp[s];
        if (st == TSR_OK) st = e->kv->ops->seq_add(e->kv, s);
        for (int i = 0; i < NP; i++) prompt[s][i] = (int32_t)(1 + (i * 37 + s * 5) % (V - 1));
        b[s] = (tsr_batch_seq){.seq = s, .tokens = prompt[s], .n_tokens = NP, .want_logits = 1};
    }
    int rows = 0;
    if (st == TSR_OK) st = tsr_forward_run(e->fwd, e->kv, b, batch, NULL, &rows);
    if (st == TSR_OK) st = tsr_forward_sample(e->fwd, sp, rows, ids);
    for (int s = 0; s < batch; s++) b[s] = (tsr_batch_seq){.seq = s, .tokens = &ids[s],
                                                           .n_tokens = 1, .want_logits = 1};
    tsr_backend_counters none;
    if (st == TSR_OK) e->be->ops->counters(e->be, &none, true); /* the step alone */
    if (st == TSR_OK) st = tsr_forward_run(e->fwd, e->kv, b, batch, NULL, &rows);
    if (st == TSR_OK) st = tsr_forward_sample(e->fwd, sp, rows, ids);
    if (st == TSR_OK) e->be->ops->counters(e->be, c, false);
    for (int s = 0; s < batch; s++) tsr_sampler_free(&smp[s]);
    if (e) tsr_engine_destroy(e);
    else tsr_backend_destroy(dev);
    return st;
}

static void print_counts(const char *what, int batch, int layers, const tsr_backend_counters *c) {
    printf("  %-17s batch %d: %lld downloads (%lld B), %lld uploads (%lld B), %lld waits, "
           "%lld host arrays (%lld B), %lld ops; per layer %.1f downloads, %.1f ops\n",
           what, batch, (long long)c->downloads, (long long)c->download_bytes,
           (long long)c->uploads, (long long)c->upload_bytes, (long long)c->syncs,
           (long long)c->host_args, (long long)c->host_arg_bytes, (long long)c->ops,
           (double)c->downloads / layers, (double)c->ops / layers);
}

/* paged and streaming: no query (or any) download in a decode step, at batch 1 and 2; the
 * host waits for the ids only. */
TSR_TEST(test_reads_nothing_downloads_nothing) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    const tsr_kv_policy_decl *pols[] = {&tsr_kv_policy_paged, &tsr_kv_policy_streaming};
    for (size_t p = 0; p < 2 && !tsr_test_failed_flag; p++)
        for (int batch = 1; batch <= MAX_B; batch++) {
            tsr_backend_counters c;
            ASSERT_OK(decode_step(m, pols[p], NULL, 0, batch, &c));
            print_counts(pols[p]->name, batch, m->cfg.n_layers, &c);
            ASSERT_EQ_INT(c.downloads, 0);
            ASSERT_EQ_INT(c.download_bytes, 0);
            /* paged: the step's metadata, one pinned upload (streaming: none, its ops
             * stage their arguments) */
            ASSERT_EQ_INT(c.uploads, p == 0 ? 1 : 0);
            ASSERT_EQ_INT(c.syncs, 1);
            if (p == 0) ASSERT_EQ_INT(c.pageable, 0);
            ASSERT_TRUE(c.ops > 0);
            /* paged, whatever the batch: per layer 6 calls (norm + the q/k/v product,
             * qkv_rope with the K/V write, attention_paged, wo + residual, norm + the
             * gate/up product, SwiGLU + w_down + residual: runtime/model/fuse.h), and the
             * step's own 4 (embedding, final norm, classifier, sampling) */
            if (p == 0) ASSERT_EQ_INT(c.ops, 4 + 6 * m->cfg.n_layers);
        }
    tsr_model_destroy(m);
}

/* The others get what they declare, per layer and sequence: h2o its key scores (and its
 * queries only with --h2o-scores materialize), snapkv its queries, offload its queries and
 * attention input (and the downloads of its own host copy). */
TSR_TEST(test_readers_get_what_they_declare) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(model_path(), &m));
    const tsr_model_config *mc = &m->cfg;
    const int L = mc->n_layers;
    const int64_t qb = (int64_t)mc->n_heads * mc->head_dim * 4, xb = (int64_t)mc->dim * 4;
    tsr_backend_counters c;

    ASSERT_OK(decode_step(m, &tsr_kv_policy_h2o, NULL, 0, 1, &c));
    print_counts("h2o", 1, L, &c);
    ASSERT_EQ_INT(c.downloads, L); /* the scores, no queries */
    ASSERT_EQ_INT(c.syncs, 1 + L);
    tsr_backend_counters tiled = c;

    /* materialize: the queries too, and its gathers of the keys it multiplies them with */
    static const tsr_kv_policy_arg mat[] = {{"h2o-scores", "materialize"}};
    ASSERT_OK(decode_step(m, &tsr_kv_policy_h2o, mat, 1, 1, &c));
    print_counts("h2o materialize", 1, L, &c);
    ASSERT_TRUE(c.downloads >= tiled.downloads + L);
    ASSERT_TRUE(c.download_bytes >= tiled.download_bytes + L * qb);

    ASSERT_OK(decode_step(m, &tsr_kv_policy_snapkv, NULL, 0, 1, &c));
    print_counts("snapkv", 1, L, &c);
    ASSERT_EQ_INT(c.downloads, L);
    ASSERT_EQ_INT(c.download_bytes, L * qb); /* one query row per layer */

    ASSERT_OK(decode_step(m, &tsr_kv_policy_offload, NULL, 0, 1, &c));
    print_counts("offload", 1, L, &c);
    ASSERT_TRUE(c.downloads >= 2 * L);
    ASSERT_TRUE(c.download_bytes >= L * (qb + xb));

    ASSERT_OK(decode_step(m, &tsr_kv_policy_snapkv, NULL, 0, 2, &c));
    print_counts("snapkv", 2, L, &c);
    ASSERT_EQ_INT(c.downloads, 2 * L); /* per layer and sequence */
    tsr_model_destroy(m);
}

/* The counters themselves: a synchronous download counts its bytes and a wait, an async
 * one no wait; reset starts again from zero. */
TSR_TEST(test_fenced_counters) {
    tsr_backend *be = NULL;
    ASSERT_OK(tsr_backend_fenced_create(1, (size_t)16 << 20, &be));
    float host[64] = {0};
    void *buf = NULL;
    ASSERT_OK(be->ops->buffer_alloc(be, sizeof host, &buf));
    tsr_backend_counters c;
    be->ops->counters(be, &c, true);
    ASSERT_OK(tsr_backend_upload(be, buf, host, sizeof host));
    ASSERT_OK(tsr_backend_download(be, host, buf, 128));
    tsr_stream *s = NULL;
    ASSERT_OK(be->ops->stream_create(be, &s));
    ASSERT_OK(be->ops->download(be, host, buf, 64, s));
    ASSERT_OK(be->ops->memset(be, buf, 0, sizeof host));
    ASSERT_OK(be->ops->synchronize(be));
    be->ops->counters(be, &c, true);
    ASSERT_EQ_INT(c.uploads, 1);
    ASSERT_EQ_INT(c.upload_bytes, (int64_t)sizeof host);
    ASSERT_EQ_INT(c.downloads, 2);
    ASSERT_EQ_INT(c.download_bytes, 192);
    ASSERT_EQ_INT(c.syncs, 3); /* upload, download, synchronize */
    ASSERT_EQ_INT(c.ops, 1);
    ASSERT_EQ_INT(c.pageable, 3); /* host[] is plain memory */
    /* from pinned memory: no pageable copy */
    float *pin = NULL;
    ASSERT_OK(be->ops->host_alloc(be, sizeof host, true, (void **)&pin));
    ASSERT_OK(be->ops->upload(be, buf, pin, sizeof host, s));
    be->ops->counters(be, &c, true);
    ASSERT_EQ_INT(c.uploads, 1);
    ASSERT_EQ_INT(c.syncs, 0);
    ASSERT_EQ_INT(c.pageable, 0);
    ASSERT_EQ_INT(c.stream_copies, 1);
    /* a copy stream's copies run when waited for, not before: the destination keeps its
     * old bytes until then, and the host source is read at the wait */
    for (int i = 0; i < 64; i++) pin[i] = (float)i;
    float back[64];
    ASSERT_OK(tsr_backend_download(be, back, buf, sizeof back));
    ASSERT_TRUE(back[5] == 0.0f);
    tsr_event *ev = NULL;
    ASSERT_OK(be->ops->event_create(be, &ev));
    ASSERT_OK(be->ops->event_record(be, ev, s));
    ASSERT_OK(be->ops->stream_wait(be, NULL, ev));
    ASSERT_OK(tsr_backend_download(be, back, buf, sizeof back));
    ASSERT_TRUE(back[5] == 5.0f);
    /* an event recorded before a copy does not cover it */
    ASSERT_OK(be->ops->event_record(be, ev, s));
    ASSERT_OK(be->ops->download(be, back, buf, sizeof back, s));
    back[7] = -1.0f;
    ASSERT_OK(be->ops->event_sync(be, ev));
    ASSERT_TRUE(back[7] == -1.0f);
    ASSERT_OK(be->ops->event_record(be, ev, s));
    ASSERT_OK(be->ops->event_sync(be, ev));
    ASSERT_TRUE(back[7] == 7.0f);
    be->ops->event_destroy(be, ev);
    be->ops->counters(be, &c, true);
    be->ops->host_free(be, pin);
    /* a graph's work may not wait or copy pageable memory (a CUDA Graph could not record
     * it): graph_end says so */
    bool replayed = true;
    ASSERT_OK(be->ops->graph_begin(be, 1, &replayed));
    ASSERT_TRUE(!replayed);
    ASSERT_OK(be->ops->memset(be, buf, 0, sizeof host));
    ASSERT_OK(be->ops->graph_end(be));
    ASSERT_OK(be->ops->graph_begin(be, 1, &replayed));
    ASSERT_OK(be->ops->synchronize(be));
    ASSERT_EQ_INT(be->ops->graph_end(be), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "waited 1 times");
    be->ops->counters(be, &c, true);
    be->ops->counters(be, &c, false);
    ASSERT_EQ_INT(c.downloads + c.uploads + c.syncs + c.ops, 0);
    be->ops->stream_destroy(be, s);
    be->ops->buffer_free(be, buf);
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_reads_nothing_downloads_nothing, test_readers_get_what_they_declare,
              test_fenced_counters)
