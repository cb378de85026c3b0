/* The `streaming` policy (Xiao et al. 2024, "Efficient Streaming Language Models with
 * Attention Sinks", StreamingLLM): per layer, the first `sinks` tokens (the attention
 * sinks, --streaming-sinks, 4 by default) and the most recent ones stay, the middle is evicted as the sequence
 * grows; --kv-budget is sinks + window. Eviction runs at the end of every step (commit), so
 * a step's queries see the sinks, the window as it was before the step, and the step's own
 * tokens; after it each layer holds exactly positions [0, sinks) and [len - window, len).
 *
 * Positions: the paper re-rotates the cached keys with their positions within the cache,
 * which lets it stream past the model's trained context. tessera stores keys rotated with
 * their original positions (memory/kv_cache.h) and a sequence never exceeds the model
 * context, so the kept keys keep their text positions and nothing is re-rotated.
 *
 * The choice needs only positions (host metadata of the paged cache), no scores and no
 * K/V bytes, so it is the same on every rank of a tensor-parallel group by construction. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "base/alloc.h"

/* Its options (the declaration below) and stats. */
typedef struct tsr__stream_opts {
    int sinks; /* the first tokens, always kept */
} tsr__stream_opts;

typedef struct tsr__stream_counters {
    int64_t evictions;
    int64_t tokens_processed;
} tsr__stream_counters;

typedef struct tsr__stream {
    tsr_kv_policy_config cfg;
    tsr_kv_cache *mech;
    int32_t sinks;
    tsr__stream_counters st;
    int32_t *windows; /* GPT-OSS sliding layers: no budget there (tsr_kv_policy_windows) */
} tsr__stream;

static tsr_status tsr__stream_create(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech,
                                     void **state) {
    tsr__stream *s = tsr_calloc(1, sizeof *s);
    if (!s) return TSR_ERR_NOMEM;
    s->cfg = *cfg;
    s->mech = mech;
    s->sinks = ((const tsr__stream_opts *)cfg->opts)->sinks;
    s->windows = tsr_kv_policy_windows(cfg, mech->n_layers);
    *state = s;
    return TSR_OK;
}

static void tsr__stream_destroy(void *state) {
    tsr__stream *s = state;
    if (s) tsr_free(s->windows);
    tsr_free(s);
}

/* Evicts every slot of `layer` outside [0, sinks) and [len - window, len), where
 * sinks + window is the budget for len tokens (the sinks first when the budget is smaller). */
static tsr_status tsr__stream_evict(tsr__stream *s, int layer, int seq, int32_t len) {
    tsr_kv_cache *m = s->mech;
    int32_t n = tsr_kv_paged_slots(m, layer, seq);
    int32_t budget = tsr_kv_policy_budget(&s->cfg, len);
    if (n <= budget) return TSR_OK;
    int32_t sinks = s->sinks < budget ? s->sinks : budget;
    int32_t recent_from = len - (budget - sinks);
    int32_t *pos = tsr_malloc((size_t)n * sizeof *pos);
    int32_t *ev = tsr_malloc((size_t)n * sizeof *ev);
    tsr_status st = pos && ev ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) st = tsr_kv_paged_read_slots(m, layer, seq, pos, NULL);
    if (st == TSR_OK) {
        int32_t ne = 0;
        for (int32_t i = 0; i < n; i++)
            if (pos[i] >= sinks && pos[i] < recent_from) ev[ne++] = i;
        st = tsr_kv_paged_evict(m, layer, seq, ev, ne);
        if (st == TSR_OK) s->st.evictions += ne;
    }
    tsr_free(pos);
    tsr_free(ev);
    return st;
}

static tsr_status tsr__stream_commit(void *state, int seq, int32_t n) {
    tsr__stream *s = state;
    tsr_kv_cache *m = s->mech;
    s->st.tokens_processed += n;
    int32_t len = m->ops->seq_len(m, seq); /* the mechanism has committed the step */
    for (int l = 0; l < m->n_layers; l++)
        if (!s->windows || s->windows[l] <= 0) TSR_TRY(tsr__stream_evict(s, l, seq, len));
    return TSR_OK;
}

static void tsr__stream_stats(const void *state, void *out) {
    *(tsr__stream_counters *)out = ((const tsr__stream *)state)->st;
}

static const tsr_kv_policy_option tsr__stream_options[] = {
    {"streaming-sinks", TSR_KV_OPT_INT, offsetof(tsr__stream_opts, sinks), "N",
     "attention sinks: the first N tokens, always kept (part of the budget)", "4", 0, 65536,
     NULL},
};

static const tsr_kv_policy_stat_field tsr__stream_stat_fields[] = {
    {"evictions", TSR_KV_STAT_I64, offsetof(tsr__stream_counters, evictions)},
    {"tokens_processed", TSR_KV_STAT_I64, offsetof(tsr__stream_counters, tokens_processed)},
};

/* Positions only: reads nothing from the forward pass. */
const tsr_kv_policy_decl tsr_kv_policy_streaming = {
    .name = "streaming",
    .help = "attention sinks + recent window",
    .uses_budget = 1,
    .checkpointable = 1,
    .options = tsr__stream_options,
    .n_options = TSR_KV_COUNT(tsr__stream_options),
    .options_size = sizeof(tsr__stream_opts),
    .stat_fields = tsr__stream_stat_fields,
    .n_stats = TSR_KV_COUNT(tsr__stream_stat_fields),
    .stats_size = sizeof(tsr__stream_counters),
    .create = tsr__stream_create,
    .destroy = tsr__stream_destroy,
    .commit = tsr__stream_commit,
    .stats = tsr__stream_stats,
};
