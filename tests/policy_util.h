/* Helpers shared by the KV-policy tests: greedy generation through the real forward pass
 * on one sequence, so a policy's tokens can be compared with the paged baseline. */
#ifndef TSR_TESTS_POLICY_UTIL_H
#define TSR_TESTS_POLICY_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "memory/host_pool.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"

/* Greedy generation through the forward pass: prefill in chunks of `chunk`, then `gen`
 * decode steps; returns the tokens and the logits of the last step. m's weights are in
 * be's memory (kvt_eng->weights). */
static tsr_status tsr__greedy(const tsr_model *m, tsr_backend *be, tsr_kv_cache *kv,
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

/* A policy cache for one sequence of the model, in an 8 MiB pool on `be`. */
static tsr_status tsr__policy_kv(tsr_backend *be, const tsr_model_config *c,
                                 const char *policy, double budget, tsr_kv_cache **kv) {
    static const tsr_kv_policy_arg recall[] = {{"offload-recall", "1"}};
    tsr_kv_options o = {.policy = tsr_kv_policy_find(policy), .memory_bytes = 8 << 20,
                        .block_size = 16,
                        .budget = budget, .max_seqs = 1, .policy_args = recall,
                        .n_policy_args = 1, .be = be,
                        .kv_dtype = getenv("TSR_TEST_KV_DTYPE")}; /* kv_test_util.h */
    return tsr_kv_setup(&o, c, kv);
}

/* `policy` at a 100 % budget gives paged's greedy tokens and evicts nothing: `prompt` (48
 * tokens, in 16-token chunks), then `gen` tokens (at most 64). Needs tests/test.h. */
static inline void tsr__check_full_budget(const tsr_model *m, tsr_backend *be, const char *policy,
                                          const int32_t *prompt, int gen) {
    int32_t tp[64], ts[64];
    tsr_kv_cache *paged = NULL, *full = NULL;
    ASSERT_TRUE(gen <= 64);
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "paged", 0, &paged));
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, policy, 1.0, &full));
    ASSERT_OK(tsr__greedy(m, be, paged, prompt, 48, 16, gen, tp, NULL));
    ASSERT_OK(tsr__greedy(m, be, full, prompt, 48, 16, gen, ts, NULL));
    for (int g = 0; g < gen; g++) ASSERT_EQ_INT(tp[g], ts[g]);
    tsr_kv_stats s;
    full->ops->stats(full, &s);
    ASSERT_EQ_INT(s.evictions, 0);
    tsr_kv_cache_destroy(paged);
    tsr_kv_cache_destroy(full);
}

#endif
