/* KV-cache policies: one declaration each, so that a new policy is one file plus one line
 * in registry.c. A policy decides; the paged cache (memory/kv_paged.h) is the mechanism. A
 * policy decides from small host arrays (positions, scores, queries, its own host copies)
 * and never reads K/V bytes in place: those live in backend memory and reach the host only
 * through the mechanism's gathers or the backend's download.
 *
 * A policy is named once: the command line (jobs/kv_cli.c) resolves --kv-policy with
 * tsr_kv_policy_find into its tsr_kv_policy_decl, and from there on every layer asks the
 * declaration what the policy reads (queries, attention input, key scores: each a download
 * per layer and sequence on a device, made only for a policy that declares it), uses
 * (--kv-budget) and allows (prefix sharing, checkpoints, an NCCL data plane under tensor
 * parallelism). Nothing outside policies/ compares a policy's name or looks at its hooks.
 *
 * The registry wraps a paged cache into a tsr_kv_cache that calls the policy's hooks in
 * the forward pass's order: admit (seq_add) -> append (before reserve) -> attn_input ->
 * write -> queries -> select (before spans) -> observe (after attention) -> commit. */
#ifndef TSR_POLICIES_POLICY_H
#define TSR_POLICIES_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "memory/host_pool.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"
#include "base/model_config.h"
#include "base/tensor.h"

/* Host views of one layer's attention weights (this rank's heads: wq [heads*hd][dim], wk
 * [kv_heads*hd][dim], attn_norm [1][dim]), for policies that derive something from the
 * weights (offload's skew). Not owned: the data must outlive the cache. */
typedef struct tsr_kv_policy_layer {
    tsr_tensor wq, wk, attn_norm;
    /* GPT-OSS: the sink logits of this rank's query heads (f32 [1, heads]; empty: none) and
     * the layer's sliding window (0: none), for policies that recompute the attention
     * (h2o's materialize baseline), so that they compute what the kernel does. */
    tsr_tensor sinks;
    int window;
} tsr_kv_policy_layer;

typedef struct tsr_kv_policy_model {
    const tsr_model_config *cfg;
    const tsr_kv_policy_layer *layers; /* [the cache's layers] (copied at create) */
} tsr_kv_policy_model;

/* A policy option as text, the way it came: {"h2o-recent", "0.3"}; a flag's value is NULL
 * or "1". */
typedef struct tsr_kv_policy_arg {
    const char *name, *value;
} tsr_kv_policy_arg;

/* What every policy gets. The policy's own options arrive in `opts`, parsed from its
 * declaration (below). */
typedef struct tsr_kv_policy_config {
    /* --kv-budget (a common option, for policies with uses_budget): > 1 a token count; in
     * (0, 1] a fraction of the sequence (1: 100 %); 0 (or a count >= the sequence) keeps
     * everything. */
    double budget;
    /* The policy's options as given (an arg the policy does not declare is skipped: the
     * command line warns about it); tsr_kv_policy_cache_create parses them into `opts`. */
    const tsr_kv_policy_arg *args;
    int n_args;
    /* Set by tsr_kv_policy_cache_create for `create`: the policy's options struct
     * (options_size bytes: the declared defaults, then args), owned by the cache and valid
     * as long as it lives. Callers leave it NULL. */
    const void *opts;
    int n_heads;             /* query heads */
    /* Rows one step writes at most before the policy evicts (the prefill chunk: kv_setup's
     * chunk_tokens); 0: TSR_KV_POLICY_CHUNK. The pool is sized for a budgeted layer's
     * budget plus this (tsr_kv_policy_bound), which a policy that lets decode steps grow a
     * layer (snapkv) holds itself to. */
    int32_t chunk;
    int rope_interleaved;    /* rotary pairs (2i, 2i+1) rather than (i, i + hd/2) */
    tsr_host_pool *host;     /* where host copies live (offload's full KV) */
    /* Tensor parallelism: the ranks of the TP group hold different KV heads of the same
     * tokens, so score decisions sum the heads over the group (tsr_kv_policy_sum_heads)
     * and every rank evicts / selects the same tokens. NULL: one process. */
    tsr_comm *comm;
    /* TP ranks [kv_share_begin, kv_share_end) hold this rank's KV heads (several when tp
     * exceeds the KV heads and they are replicated; runtime/exec/parallel.h); each holds part of
     * their query group. Both 0: this rank alone. */
    int kv_share_begin, kv_share_end;
    int owns_host;           /* the cache destroys `host` with itself */
    /* The weights of the cache's layers (host views), for policies that derive something
     * from them at create (offload's skew mode); NULL: none. */
    const tsr_kv_policy_model *model;
} tsr_kv_policy_config;

/* ---- Declarations. A policy declares its options and stats as tables; --help, the
 * command line's checks and warnings, the checkpoint binding, --stats JSON, the metrics
 * file's kv section and tsr_quality's line are generated from them. ------------------ */

typedef enum tsr_kv_opt_kind {
    TSR_KV_OPT_DOUBLE, /* double; min..max */
    TSR_KV_OPT_INT,    /* int; min..max */
    TSR_KV_OPT_ENUM,   /* int: the index into `values` */
    TSR_KV_OPT_FLAG,   /* int: 0 or 1, takes no value on the command line */
} tsr_kv_opt_kind;

typedef struct tsr_kv_policy_option {
    const char *name;    /* the flag without "--", prefixed by the policy: "h2o-recent" */
    tsr_kv_opt_kind kind;
    size_t offset;       /* of the value in the policy's options struct (offsetof) */
    const char *metavar; /* "F", "N", "MODE" (NULL for a flag) */
    const char *help;    /* one line, without the default or range (generated) */
    const char *def;     /* the default as text: "0.5", "tiled"; NULL: 0 / the first value */
    double min, max;     /* DOUBLE and INT: the accepted range, inclusive */
    const char *const *values; /* ENUM: the accepted names, NULL-terminated */
} tsr_kv_policy_option;

typedef enum tsr_kv_stat_kind { TSR_KV_STAT_I64, TSR_KV_STAT_F64 } tsr_kv_stat_kind;

typedef struct tsr_kv_policy_stat_field {
    const char *name;    /* its JSON key; "evictions" also counts as the cache's evictions */
    tsr_kv_stat_kind kind;
    size_t offset;       /* of an int64_t or double in the policy's stats struct */
} tsr_kv_policy_stat_field;

#define TSR_KV_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* What the pool must hold of one sequence, asked of a declaration before the cache exists
 * (tsr_kv_policy_resident): the job's shape as the sizing sees it. */
typedef struct tsr_kv_policy_extent {
    double budget;         /* --kv-budget, as tsr_kv_policy_config.budget */
    const tsr_kv_policy_arg *args; /* the policy's options as text (undeclared: skipped) */
    int n_args;
    int32_t context;       /* positions one sequence may hold */
    int32_t chunk;         /* rows one step writes before the policy evicts (prefill chunk;
                            * 0: TSR_KV_POLICY_CHUNK) */
    int n_layers;          /* the cache's layers (this rank's stage) */
    /* The cache gets the model's weights (tsr_kv_policy_config.model), and whether the job
     * splits the layers into pipeline stages or replicates this rank's KV heads over TP
     * ranks: a policy's create may choose a mode from these (offload's skew). */
    int has_model;
    int pipeline;
    int kv_replicated;
} tsr_kv_policy_extent;

/* The rotated queries of the layer call in flight (from the cache's queries hook: host
 * memory), kept by policies that need them at select/observe time; valid until that
 * layer's observe. */
typedef struct tsr_kv_policy_queries {
    const float *q; /* [n][heads * head_dim]; NULL when none */
    const int32_t *pos;
    int n, layer, seq, heads;
} tsr_kv_policy_queries;

static inline void tsr_kv_policy_queries_set(tsr_kv_policy_queries *qs, int layer, int seq,
                                             const float *q, const int32_t *pos, int n,
                                             int heads) {
    *qs = (tsr_kv_policy_queries){.q = q, .pos = pos, .n = n, .layer = layer, .seq = seq,
                                  .heads = heads};
}

/* Non-zero when qs holds queries of (layer, seq). */
static inline int tsr_kv_policy_queries_for(const tsr_kv_policy_queries *qs, int layer,
                                            int seq) {
    return qs->q && qs->layer == layer && qs->seq == seq;
}

/* A policy, in one file (policies/NAME.c) plus one line in registry.c's table:
 *
 *   typedef struct { double keep; int exact; } tsr__my_opts;
 *   typedef struct { int64_t evictions; double mean; } tsr__my_counters;
 *   static const char *const tsr__my_modes[] = {"fast", "exact", NULL};
 *   static const tsr_kv_policy_option tsr__my_options[] = {
 *       {"my-keep", TSR_KV_OPT_DOUBLE, offsetof(tsr__my_opts, keep), "F",
 *        "share of the budget kept", "0.5", 0, 1, NULL},
 *       {"my-mode", TSR_KV_OPT_ENUM, offsetof(tsr__my_opts, exact), "MODE",
 *        "how to score", "fast", 0, 0, tsr__my_modes}};
 *   static const tsr_kv_policy_stat_field tsr__my_stat_fields[] = {
 *       {"evictions", TSR_KV_STAT_I64, offsetof(tsr__my_counters, evictions)},
 *       {"my_mean", TSR_KV_STAT_F64, offsetof(tsr__my_counters, mean)}};
 *   const tsr_kv_policy_decl tsr_kv_policy_my = {
 *       .name = "my", .help = "what it keeps",
 *       .uses_budget = 1, .checkpointable = 1, .reads_scores = 1, .tp_host_sums = 1,
 *       .create = ..., .observe = ..., .stats = ...,
 *       .options = tsr__my_options, .n_options = TSR_KV_COUNT(tsr__my_options),
 *       .options_size = sizeof(tsr__my_opts),
 *       .stat_fields = tsr__my_stat_fields, .n_stats = TSR_KV_COUNT(tsr__my_stat_fields),
 *       .stats_size = sizeof(tsr__my_counters)};
 *
 * create reads its options from cfg->opts (a tsr__my_opts); stats fills a zeroed
 * tsr__my_counters. Option names start with the policy's name (two policies may share a
 * name only when they mean the same thing). tests/unit/test_policy_registry.c registers
 * a policy this way. */
typedef struct tsr_kv_policy_decl {
    const char *name;
    const char *help;        /* a few words for --help: "heavy hitters + recent window" */

    /* --- what it reads: host copies the forward pass makes for it, each a download and a
     * wait per layer and sequence on a device backend, so only a policy that declares one
     * gets it. Each goes with its hook: declared, the hook is there; not declared, it is
     * NULL (tsr_kv_policy_cache_create refuses a declaration where they disagree). ----- */
    int reads_queries;       /* the layer's rotated queries: `queries` */
    int reads_attn_input;    /* the layer's attention input: `attn_input` */
    int reads_scores;        /* the attention's per-key scores: `observe` */
    /* Optional (NULL: as declared): whether, with its options (cfg->opts), it reads the
     * queries after all (h2o only for --h2o-scores materialize). */
    int (*reads_queries_with)(const void *opts);

    /* --- what it uses and allows ------------------------------------------------------ */
    int uses_budget;         /* reads the common option --kv-budget (cfg->budget) */
    int allows_prefix_cache; /* sharing blocks needs an unmodified layout (paged only) */
    /* Its state lives in the mechanism's rows (positions, scores) or is rebuilt from them,
     * so a checkpoint of the rows (tsr_kv_export_seq) restores a request: `tessera run
     * --checkpoint` takes it. 0: it keeps K/V of its own (offload's host copy). */
    int checkpointable;
    /* It sums per-head values over the TP group in host memory (tsr_kv_policy_sum_heads,
     * over MPI), so tensor parallelism on a device backend, whose data plane is NCCL,
     * cannot run it (jobs/dist_cli.c refuses with one line). */
    int tp_host_sums;

    /* --- its options and stats -------------------------------------------------------- */
    const tsr_kv_policy_option *options; /* its own options (NULL: none) */
    int n_options;
    size_t options_size;     /* of its options struct (cfg->opts) */
    const tsr_kv_policy_stat_field *stat_fields; /* what its stats hook reports (NULL: none) */
    int n_stats;
    size_t stats_size;       /* of its stats struct */

    /* --- what it holds resident (tsr_kv_policy_resident) ------------------------------- */
    /* Optional (NULL: the default below): the rows layer l of one sequence holds at most,
     * need[l] for the policy's own selection and want[l] (>= need[l]) at its peak, with
     * what it takes on top when the pool has room and does without otherwise. Called with
     * its options struct (the declared defaults, then in->args) and both arrays filled
     * with the default: the budget (at the full context) plus one chunk under a policy
     * with uses_budget and a budget, at most the context; the context otherwise. */
    void (*resident)(const void *opts, const tsr_kv_policy_extent *in, int32_t *need,
                     int32_t *want);
    /* What it does when the pool holds `need` but not `want`, for the start-up warning
     * ("dense prefill attends to ..."); NULL when want is need. */
    const char *resident_short;

    /* --- its hooks -------------------------------------------------------------------- */
    /* `mech` is the paged cache the policy steers (owned by the wrapper). */
    tsr_status (*create)(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech, void **state);
    void (*destroy)(void *state);
    /* All hooks below are optional (NULL: nothing to do). */
    tsr_status (*admit)(void *state, int seq);
    tsr_status (*append)(void *state, int seq, int32_t n);
    /* k, v: the layer's activations, backend memory (download to keep a host copy). */
    tsr_status (*write)(void *state, int layer, int seq, int32_t n, const float *k,
                        const float *v);
    /* q, q_pos: host memory (memory/kv_cache.h). With reads_queries. */
    tsr_status (*queries)(void *state, int layer, int seq, const float *q,
                          const int32_t *q_pos, int n_q, int n_heads);
    /* x: the layer's attention input, host memory ([n][dim]; memory/kv_cache.h). With
     * reads_attn_input. */
    tsr_status (*attn_input)(void *state, int layer, int seq, const float *x, int n, int dim);
    tsr_status (*select)(void *state, int layer, int seq);
    /* key_scores: host memory. With reads_scores. */
    tsr_status (*observe)(void *state, int layer, int seq, const float *key_scores);
    tsr_status (*commit)(void *state, int seq, int32_t n);
    void (*release)(void *state, int seq);
    /* Fills `out`, the policy's stats struct (stats_size bytes, zeroed by the caller). */
    void (*stats)(const void *state, void *out);
} tsr_kv_policy_decl;

/* The registry's lookup, the one place a policy's name is read: the policy named `name`,
 * or NULL. */
const tsr_kv_policy_decl *tsr_kv_policy_find(const char *name);
/* The policy a cache gets when none is named: the first of the table (paged, keep all). */
const tsr_kv_policy_decl *tsr_kv_policy_default(void);
/* "paged|h2o|offload": the registered names, for --help and error lines. */
const char *tsr_kv_policy_names(void);
/* Adds a policy after registry.c's table, for tests (a policy that ships is a line in
 * that table). Not thread-safe: call before any option table is built. */
tsr_status tsr_kv_policy_register(const tsr_kv_policy_decl *pol);
/* The registered policies, in registry order (i in [0, tsr_kv_policy_count())). */
int tsr_kv_policy_count(void);
const tsr_kv_policy_decl *tsr_kv_policy_at(int i);

/* The option `name` (without "--") pol declares, or NULL. Its help is prefixed by the
 * policy's name where listed (kv_cli), so it does not name the policy itself. */
const tsr_kv_policy_option *tsr_kv_policy_option_find(const tsr_kv_policy_decl *pol,
                                                      const char *name);
/* Checks `text` against the declaration (kind, range, values) and, when opts is not NULL,
 * stores the value at o->offset. TSR_ERR_INVALID with one line ("--h2o-recent 2: must be
 * in [0, 1]") when wrong. */
tsr_status tsr_kv_policy_option_parse(const tsr_kv_policy_option *o, const char *text,
                                      void *opts);
/* The help line of o, generated: its help, then its values or range and default. */
int tsr_kv_policy_option_help(const tsr_kv_policy_option *o, char *buf, size_t size);
/* pol's options struct (options_size bytes at opts): the defaults, then `args` in order
 * (args pol does not declare are skipped). */
tsr_status tsr_kv_policy_options_parse(const tsr_kv_policy_decl *pol,
                                       const tsr_kv_policy_arg *args, int n_args, void *opts);
/* "kv-budget=24 h2o-recent=0.5 h2o-scores=tiled": what the options of pol are (budget
 * only with uses_budget), "none" when it has none; for the checkpoint binding. */
int tsr_kv_policy_options_string(const tsr_kv_policy_decl *pol, double budget,
                                 const void *opts, char *buf, size_t size);

/* GPT-OSS: a copy of the sliding windows of the cache's n_layers layers (0: a full layer),
 * or NULL when there is none (no model weights given, or no sliding layer); the caller frees
 * it. Budgets apply to full layers only: a sliding layer keeps its window (the policy cache
 * drops the rows no later query sees, registry.c). */
int32_t *tsr_kv_policy_windows(const tsr_kv_policy_config *cfg, int n_layers);
/* The first full-attention layer after `layer` in windows (tsr_kv_policy_windows; NULL: every
 * layer is full, so layer + 1), n_layers when none: the layer a cross-layer policy (offload's
 * speculation) serves from `layer`, skipping the sliding layers between. */
int tsr_kv_policy_next_full(const int32_t *windows, int n_layers, int layer);

/* A tsr_kv_cache: a paged cache made from `kcfg`, steered by policy `pol`. The cache's
 * wants_queries, wants_attn_input and wants_scores (memory/kv_cache.h) are what pol
 * declares it reads, so the forward pass makes those host copies and no others.
 * TSR_ERR_INVALID when pol's reads_* and its hooks disagree. */
tsr_status tsr_kv_policy_cache_create(const tsr_kv_policy_decl *pol,
                                      const tsr_kv_policy_config *pcfg,
                                      const tsr_kv_paged_config *kcfg, tsr_kv_cache **out);
/* Non-zero when kv was made by tsr_kv_policy_cache_create. */
int tsr_kv_is_policy(const tsr_kv_cache *kv);
/* The paged cache underneath, and the policy's stats. */
tsr_kv_cache *tsr_kv_policy_mech(const tsr_kv_cache *kv);
/* The policy's stats as named values, in its declaration's order (zero values without a
 * policy). */
void tsr_kv_policy_get_stats(const tsr_kv_cache *kv, tsr_kv_policy_stats *out);
const char *tsr_kv_policy_name(const tsr_kv_cache *kv);

/* out[i] = sum over the heads of the whole TP group, in global head order, of parts[h][i]
 * (this rank gives n_local heads of n floats each): ((h0 + h1) + h2) + ..., so that the
 * per-token scores, and the decisions made from them, are the same bits on every rank and
 * for every tp. out may not alias parts. A policy that calls it declares tp_host_sums. */
tsr_status tsr_kv_policy_sum_heads(const tsr_kv_policy_config *cfg, const float *parts,
                                   int n_local, size_t n, float *out);

/* The budget in tokens for a sequence of `len` tokens (len when everything is kept). */
int32_t tsr_kv_policy_budget(const tsr_kv_policy_config *cfg, int32_t len);

/* The chunk a config or extent of 0 means: tessera's default prefill chunk. */
#define TSR_KV_POLICY_CHUNK 512

/* The rows one budgeted layer of a sequence of `len` tokens may hold while a step runs:
 * its budget plus one step's rows (cfg->chunk), not capped by len. At the full context
 * this is what the pool is sized for (tsr_kv_policy_resident_of's default), so a policy
 * that evicts once a layer would pass it stays within the sizing. */
int64_t tsr_kv_policy_bound(const tsr_kv_policy_config *cfg, int32_t len);

/* Rows and blocks one sequence holds at most in the paged pool under pol (its `resident`
 * hook, else the default), summed over in->n_layers layers, each layer's rows rounded up
 * to whole blocks of block_size. need: what its selection holds, the least pool it runs
 * in as specified; want: its peak, with what it takes on top when the pool has room
 * (offload's dense layers and dense prefill: docs/kv-cache.md). */
typedef struct tsr_kv_policy_resident {
    int64_t need_rows, want_rows;
    int64_t need_blocks, want_blocks;
} tsr_kv_policy_resident;
/* TSR_ERR_INVALID with one line for a bad option value or shape. */
tsr_status tsr_kv_policy_resident_of(const tsr_kv_policy_decl *pol,
                                     const tsr_kv_policy_extent *in, int block_size,
                                     tsr_kv_policy_resident *out);

/* The shipped declarations (registry.c's table), for callers that mean one of them. */
extern const tsr_kv_policy_decl tsr_kv_policy_paged;
extern const tsr_kv_policy_decl tsr_kv_policy_h2o;
extern const tsr_kv_policy_decl tsr_kv_policy_offload;
extern const tsr_kv_policy_decl tsr_kv_policy_snapkv;
extern const tsr_kv_policy_decl tsr_kv_policy_streaming;

#endif
