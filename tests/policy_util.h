/* Helpers shared by the KV-policy tests: greedy generation through the real forward pass
 * on one sequence, so a policy's tokens can be compared with the paged baseline. */
#ifndef TSR_TESTS_POLICY_UTIL_H
#define TSR_TESTS_POLICY_UTIL_H

#include <string.h>

#include "kernels/backend.h"
#include "memory/host_pool.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "runtime/forward.h"
#include "runtime/kv_setup.h"
#include "runtime/model.h"

/* Greedy generation through the forward pass: prefill in chunks of `chunk`, then `gen`
 * decode steps; returns the tokens and the logits of the last step. */
static tsr_status tsr__greedy(tsr_model *m, tsr_backend *be, tsr_kv_cache *kv,
                              const int32_t *prompt, int np, int chunk, int gen,
                              int32_t *out_toks, float *last_logits) {
    tsr_forward *f = NULL;
    const int V = m->cfg.vocab_size;
    TSR_TRY(tsr_forward_create(m, be, chunk, &f));
    float *logits = tsr_malloc((size_t)V * 4);
    tsr_status st = kv->ops->seq_add(kv, 0);
    int32_t cur[1];
    int pos = 0, rows = 0;
    while (st == TSR_OK && pos < np) {
        int n = np - pos < chunk ? np - pos : chunk;
        tsr_batch_seq b = {.seq = 0, .tokens = prompt + pos, .n_tokens = n, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
        pos += n;
    }
    for (int g = 0; st == TSR_OK && g < gen; g++) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        out_toks[g] = best;
        cur[0] = best;
        tsr_batch_seq b = {.seq = 0, .tokens = cur, .n_tokens = 1, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
    }
    if (st == TSR_OK && last_logits) memcpy(last_logits, logits, (size_t)V * 4);
    tsr_free(logits);
    tsr_forward_destroy(f);
    return st;
}

/* tsr_kv_setup's one-process cache from options, with the K/V store on `be`: made here
 * because tsr_kv_options has no backend yet (runtime/kv_setup.c is the engine's to
 * change); then these helpers go back to tsr_kv_setup. */
static tsr_status tsr__policy_kv_opts(tsr_backend *be, const tsr_model_config *c,
                                      const tsr_kv_options *o, tsr_kv_cache **kv) {
    const tsr_kv_policy_ops *pol = tsr_kv_policy_find(o->policy ? o->policy : "paged");
    if (!pol) return tsr_error_set(TSR_ERR_INVALID, "test: unknown policy");
    tsr_kv_paged_config kc = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                              .head_dim = c->head_dim, .block_size = o->block_size,
                              .memory_bytes = o->memory_bytes,
                              .max_seqs = o->max_seqs > 0 ? o->max_seqs : 1,
                              .max_seq_len = c->max_seq_len,
                              .prefix_caching = !o->no_prefix_cache,
                              .keep_scores = pol->wants_scores, .be = be};
    tsr_host_pool *host = NULL;
    TSR_TRY(tsr_host_pool_create(o->host_bytes, &host));
    kc.host = host;
    tsr_kv_policy_config pc = {
        .budget = o->budget, .recent = o->recent,
        .scores_materialize = o->h2o_scores && strcmp(o->h2o_scores, "materialize") == 0,
        .spec_pairs = o->spec_pairs, .measure_recall = o->measure_recall,
        .n_heads = c->n_heads, .rope_interleaved = c->rope_interleaved, .host = host,
        .owns_host = 1};
    tsr_status st = tsr_kv_policy_cache_create(pol, &pc, &kc, kv);
    if (st != TSR_OK) tsr_host_pool_destroy(host);
    return st;
}

/* A policy cache for one sequence of the model, in an 8 MiB pool on `be`. */
static tsr_status tsr__policy_kv(tsr_backend *be, const tsr_model_config *c,
                                 const char *policy, double budget, tsr_kv_cache **kv) {
    tsr_kv_options o = {.policy = policy, .memory_bytes = 8 << 20, .block_size = 16,
                        .budget = budget, .max_seqs = 1, .measure_recall = 1};
    return tsr__policy_kv_opts(be, c, &o, kv);
}

#endif
