/* KV cache construction from options, and the --stats JSON line. */
#include "runtime/exec/kv_setup.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"
#include "memory/host_pool.h"
#include "memory/kv_dist.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"

size_t tsr_kv_workspace_bytes(const tsr_model_config *cfg, int chunk_tokens) {
    size_t chunk = chunk_tokens > 0 ? (size_t)chunk_tokens : 512;
    size_t ws = tsr_forward_workspace_bytes(cfg, (int)chunk);
    ws += 2 * chunk * (size_t)cfg->n_heads * 4;             /* attention max/sum per row */
    ws += (size_t)cfg->n_kv_heads * (size_t)cfg->max_seq_len * 4; /* per-key scores */
    return ws;
}

/* What this rank may still take from the host: the least of the job's bounds
 * (base/sys.h), shared by the ranks of this node (every bound is the node's or the job's
 * cgroup's, which they share). Falls back to the free pages when no bound is readable. */
static void tsr__host_headroom(const tsr_kv_options *opt, tsr_sys_mem_limit *lim,
                               int *share) {
    tsr_sys_mem_headroom(lim);
    if (lim->bound == TSR_SYS_MEM_NONE) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        lim->bytes = lim->limit = pages > 0 && psz > 0 ? (int64_t)pages * psz : 0;
        snprintf(lim->where, sizeof lim->where, "free pages");
    }
    *share = opt->comm ? tsr_comm_local_size(opt->comm) : 1;
    if (*share < 1) *share = 1;
}

static double tsr__mib(int64_t b) { return (double)b / 1048576.0; }

/* "1.2 GiB", "3.4 MiB" or "219.4 KiB": a size for a message, in the largest unit it fills. */
static void tsr__size(int64_t b, char *buf, size_t size) {
    if (b >= (1LL << 30)) snprintf(buf, size, "%.1f GiB", (double)b / (1LL << 30));
    else if (b >= (1LL << 20)) snprintf(buf, size, "%.1f MiB", tsr__mib(b));
    else snprintf(buf, size, "%.1f KiB", (double)b / 1024.0);
}

/* The pool's bytes when --kv-memory is not given (kv_setup.h says how); *src names the
 * bound for messages. */
static tsr_status tsr__pool_bytes(const tsr_kv_options *opt, const tsr_model_config *cfg,
                                  int64_t *mem, char *src, size_t src_size) {
    tsr_backend *be = opt->be;
    int64_t ws = (int64_t)tsr_kv_workspace_bytes(cfg, opt->chunk_tokens);
    if (!be || be->host_memory) {
        tsr_sys_mem_limit lim;
        int share = 1;
        tsr__host_headroom(opt, &lim, &share);
        double frac = opt->memory_fraction > 0 ? opt->memory_fraction : 0.5;
        int64_t mine = lim.bytes / share;
        *mem = (int64_t)((double)mine * frac) - ws;
        const char *shared = share > 1 ? ", shared by this node's ranks" : "";
        if (lim.used > 0)
            snprintf(src, src_size, "%s (%s: %.1f MiB, %.1f MiB in use%s)",
                     tsr_sys_mem_bound_name(lim.bound), lim.where, tsr__mib(lim.limit),
                     tsr__mib(lim.used), shared);
        else
            snprintf(src, src_size, "%s (%s%s)", tsr_sys_mem_bound_name(lim.bound), lim.where,
                     shared);
        if (*mem <= 0)
            return tsr_error_set(TSR_ERR_BUDGET,
                                 "KV cache: %s leaves %.1f MiB for this process, not enough "
                                 "for the prefill workspace (%.1f MiB) and one sequence's KV: "
                                 "give the job more memory (--mem) or set --kv-memory",
                                 src, tsr__mib(mine), tsr__mib(ws));
        TSR_LOG_INFO("KV pool: %.1f MiB = %.0f %% of %.1f MiB left under %s, less %.1f MiB "
                     "of prefill workspace", tsr__mib(*mem), frac * 100.0, tsr__mib(mine),
                     src, tsr__mib(ws));
        return TSR_OK;
    }
    size_t free_b = 0, total_b = 0;
    TSR_TRY(be->ops->memory(be, &free_b, &total_b));
    double frac = opt->memory_fraction > 0 ? opt->memory_fraction : 0.9;
    int64_t seqs = opt->max_seqs > 0 ? opt->max_seqs : 1;
    ws += seqs * (int64_t)cfg->vocab_size * 4; /* one logits row per sequence */
    *mem = (int64_t)((double)free_b * frac) - ws;
    snprintf(src, src_size, "the %s backend's free memory (%.1f MiB of %.1f MiB)",
             be->ops->name, tsr__mib((int64_t)free_b), tsr__mib((int64_t)total_b));
    if (*mem <= 0)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: %s does not cover the prefill workspace (%.1f MiB)",
                             src, tsr__mib(ws));
    TSR_LOG_INFO("KV pool: %.1f MiB = %.0f %% of %s, less %.1f MiB of prefill workspace",
                 tsr__mib(*mem), frac * 100.0, src, tsr__mib(ws));
    return TSR_OK;
}

/* A device backend's pool follows the device, but the host pool (swap, offload's host
 * copy) is host memory: unless host_bytes is given it gets half of what the host bounds
 * leave this rank, so that it ends in an error rather than the OOM killer. */
static int64_t tsr__host_pool_bytes(const tsr_kv_options *opt) {
    if (opt->host_bytes > 0 || !opt->be || opt->be->host_memory) return opt->host_bytes;
    tsr_sys_mem_limit lim;
    int share = 1;
    tsr__host_headroom(opt, &lim, &share);
    int64_t b = lim.bytes / share / 2;
    if (b <= 0) return opt->host_bytes;
    TSR_LOG_INFO("KV host pool: %.1f MiB = 50 %% of what %s (%s) leaves this rank",
                 tsr__mib(b), tsr_sys_mem_bound_name(lim.bound), lim.where);
    return b;
}

/* The context one sequence may hold: --max-context, at most the model's. */
static int tsr__context(const tsr_kv_options *opt, const tsr_model_config *cfg) {
    return opt->max_context > 0 && opt->max_context < cfg->max_seq_len ? opt->max_context
                                                                        : cfg->max_seq_len;
}

/* Rows one step of a sequence writes at most: the prefill chunk. The sizing
 * (tsr__resident) and the policy (tsr_kv_policy_config.chunk) must see the same one: a
 * budgeted policy holds a layer to its budget plus this (tsr_kv_policy_bound). */
static int32_t tsr__chunk(const tsr_kv_options *opt) {
    return opt->chunk_tokens > 0 ? opt->chunk_tokens : TSR_KV_POLICY_CHUNK;
}

/* What one sequence of the full context holds at most under the policy, in blocks of
 * every layer of this rank's cache, as the policy declares it (tsr_kv_policy_resident_of:
 * its budgeted selection, and its peak with what it takes on top when there is room). */
static tsr_status tsr__resident(const tsr_kv_options *opt, const tsr_kv_policy_decl *pol,
                                const tsr_model_config *cfg, const tsr_kv_paged_config *kc,
                                tsr_kv_policy_resident *out) {
    int pp = opt->comm ? tsr_comm_size(opt->comm, TSR_COMM_PP) : 1;
    const tsr_parallel_shard *sh = opt->shard;
    tsr_kv_policy_extent in = {.budget = opt->budget, .args = opt->policy_args,
                               .n_args = opt->n_policy_args,
                               .context = tsr__context(opt, cfg),
                               .chunk = tsr__chunk(opt),
                               .n_layers = kc->n_layers, .has_model = opt->model != NULL,
                               .pipeline = pp > 1,
                               .kv_replicated = sh && sh->kv_share_end - sh->kv_share_begin > 1};
    return tsr_kv_policy_resident_of(pol, &in, kc->block_size > 0 ? kc->block_size : 16, out);
}

/* vLLM's check of max_model_len against the pool: one sequence of the full context must
 * fit what the policy's selection holds (res.need_blocks), or the job refuses to start; from
 * then on every request that fits the context runs (the scheduler preempts others to make
 * room). A pool between that and the policy's peak (res.want_blocks) runs, the policy doing
 * without what it takes on top (its declaration's resident_short): one warning says so and
 * what pool avoids it. A pool of no block at all is left to the cache's own error. */
static tsr_status tsr__check_context(const tsr_kv_options *opt, const tsr_kv_policy_decl *pol,
                                     const tsr_model_config *cfg, const tsr_kv_paged_config *kc,
                                     const tsr_kv_policy_resident *res, const char *src) {
    int ctx = tsr__context(opt, cfg);
    tsr_kv_paged_config c = *kc;
    if (c.block_size <= 0) c.block_size = 16;
    int64_t bb = tsr_kv_paged_block_bytes(&c);
    int64_t have = c.memory_bytes / bb;
    if (have < 1) return TSR_OK;
    if (have < res->need_blocks)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "KV cache: one sequence of the full context (%d tokens%s) needs "
                             "%.1f MiB of KV, the pool holds %.1f MiB (from %s): %s or lower "
                             "--max-context",
                             ctx,
                             res->need_rows < (int64_t)ctx * c.n_layers
                                 ? ", of which the policy keeps its budget"
                                 : "",
                             tsr__mib(res->need_blocks * bb), tsr__mib(have * bb), src,
                             opt->memory_bytes > 0 ? "raise --kv-memory"
                                                   : "give the job more memory");
    if (have < res->want_blocks && pol->resident_short &&
        (!opt->comm || tsr_comm_world_rank(opt->comm) == 0)) {
        /* the pool this rank's layers want, as --kv-memory counts it (every rank alike),
         * rounded up to what one writes: whole MiB from 1 GiB on, else whole KiB */
        int64_t want = res->want_blocks * bb;
        char h[32], w[32], arg[32];
        tsr__size(have * bb, h, sizeof h);
        tsr__size(want, w, sizeof w);
        if (want >= (1LL << 30))
            snprintf(arg, sizeof arg, "%lldM", (long long)((want + (1 << 20) - 1) >> 20));
        else
            snprintf(arg, sizeof arg, "%lldK", (long long)((want + 1023) >> 10));
        TSR_LOG_WARN("KV pool: %s (from %s) holds one sequence of the full context (%d "
                     "tokens) under %s but not its peak (%s): %s; --kv-memory %s or more "
                     "avoids it",
                     h, src, ctx, pol->name, w, pol->resident_short, arg);
    }
    return TSR_OK;
}

/* The host pool's pin hooks from the backend's optional host_register (ctx: the backend). */
static tsr_status tsr__pin(void *ctx, void *ptr, size_t bytes) {
    tsr_backend *be = ctx;
    return be->ops->host_register(be, ptr, bytes);
}

static void tsr__unpin(void *ctx, void *ptr) {
    tsr_backend *be = ctx;
    if (be->ops->host_unregister) be->ops->host_unregister(be, ptr);
}

tsr_status tsr_kv_dtype_resolve(const tsr_kv_options *opt, int *dtype) {
    if (opt->kv_dtype) {
        *dtype = tsr_kv_dtype_parse(opt->kv_dtype);
        if (*dtype < 0)
            return tsr_error_set(TSR_ERR_INVALID, "--kv-dtype %s: unknown (use f32, bf16, q8 "
                                 "or fp8)", opt->kv_dtype);
        return TSR_OK;
    }
    const char *name = opt->be ? opt->be->ops->name : NULL;
    *dtype = name && !strncmp(name, "cuda", 4) ? TSR_KV_BF16 : TSR_KV_F32;
    return TSR_OK;
}

tsr_status tsr_kv_setup(const tsr_kv_options *opt, const tsr_model_config *cfg,
                        tsr_kv_cache **out) {
    *out = NULL;
    int kv_dtype;
    TSR_TRY(tsr_kv_dtype_resolve(opt, &kv_dtype));
    const tsr_kv_policy_decl *pol = opt->policy ? opt->policy : tsr_kv_policy_default();
    if (opt->budget < 0) return tsr_error_set(TSR_ERR_INVALID, "--kv-budget must be >= 0");
    /* Bad policy options are refused before any memory is sized or allocated. */
    for (int i = 0; i < opt->n_policy_args; i++) {
        const tsr_kv_policy_option *o = tsr_kv_policy_option_find(pol, opt->policy_args[i].name);
        if (o) TSR_TRY(tsr_kv_policy_option_parse(o, opt->policy_args[i].value, NULL));
    }
    bool dist = opt->comm && tsr_comm_world_size(opt->comm) > 1;
    int64_t mem = opt->memory_bytes;
    tsr_status mst = TSR_OK;
    char src[768] = "--kv-memory";
    if (mem <= 0 && opt->fit_seqs > 0) snprintf(src, sizeof src, "the policy's peak");
    else if (mem <= 0) mst = tsr__pool_bytes(opt, cfg, &mem, src, sizeof src);
    /* free memory is this rank's: agree before the collective sizing below */
    if (dist) mst = tsr_comm_agree(opt->comm, mst);
    TSR_TRY(mst);
    tsr_parallel_shard whole;
    const tsr_parallel_shard *sh = opt->shard;
    if (!sh) {
        TSR_TRY(tsr_parallel_shard_whole(cfg, &whole));
        sh = &whole;
    }
    int layers = sh->layer_end - sh->layer_begin;
    tsr_kv_paged_config kc = {.n_layers = layers,
                              .n_kv_heads = sh->kv_head_end - sh->kv_head_begin,
                              .head_dim = cfg->head_dim, .block_size = opt->block_size,
                              .memory_bytes = mem,
                              .max_seqs = opt->max_seqs > 0 ? opt->max_seqs : 1,
                              .max_seq_len = cfg->max_seq_len,
                              .prefix_caching = !opt->no_prefix_cache,
                              .keep_scores = pol->reads_scores, .be = opt->be,
                              .kv_dtype = kv_dtype};
    tsr_kv_policy_resident res;
    TSR_TRY(tsr__resident(opt, pol, cfg, &kc, &res));
    /* a sequence's peak rounded up to whole blocks per layer: a multi-rank pool is cut to
     * the same blocks per layer on every rank below, which must not fall under it */
    int64_t peak_blocks = (res.want_blocks + layers - 1) / layers * layers;
    if (opt->memory_bytes <= 0 && opt->fit_seqs > 0) {
        /* what fit_seqs sequences hold at the policy's peak, whatever the memory */
        kc.memory_bytes = mem = (int64_t)opt->fit_seqs * peak_blocks *
                                tsr_kv_paged_block_bytes(&kc);
        TSR_LOG_INFO("KV pool: %.1f MiB, what %d sequences of the full context hold at the "
                     "policy's peak", tsr__mib(mem), opt->fit_seqs);
    } else if (opt->memory_bytes <= 0 && (!opt->be || opt->be->host_memory)) {
        /* On the host the default pool is at most what the job's sequences can use: twice
         * max_seqs sequences of the full context at the policy's peak (room for prefix-cache
         * hits). Half the free memory for a small model costs tens of MB of block records
         * written up front, and the rest of the machine's memory belongs to other jobs. */
        int64_t need = 2 * (int64_t)kc.max_seqs * peak_blocks * tsr_kv_paged_block_bytes(&kc);
        if (need < kc.memory_bytes) {
            TSR_LOG_INFO("KV pool: %.1f MiB, what %d sequences of %d tokens can use (twice)",
                         tsr__mib(need), kc.max_seqs, tsr__context(opt, cfg));
            kc.memory_bytes = mem = need;
        }
    }
    if (dist) {
        /* One logical cache: the same blocks per layer on every rank (the least any rank
         * can hold), so a stage with more layers gets a proportionally larger pool and the
         * ranks' admission answers coincide. */
        if (kc.block_size <= 0) kc.block_size = 16;
        int64_t bb = tsr_kv_paged_block_bytes(&kc);
        int64_t per_layer = mem / bb / layers;
        TSR_TRY(tsr_comm_allreduce_i64(opt->comm, TSR_COMM_WORLD, &per_layer, 1, TSR_COMM_MIN));
        kc.memory_bytes = per_layer * layers * bb;
    }
    /* Every rank's pool has the same blocks per layer here: the ranks answer alike. */
    TSR_TRY(tsr__check_context(opt, pol, cfg, &kc, &res, src));
    int64_t host_bytes = tsr__host_pool_bytes(opt);
    tsr_host_pool *host = NULL;
    if (opt->topo && opt->place)
        TSR_TRY(tsr_host_pool_create_placed(host_bytes, opt->topo, opt->place, &host));
    else
        TSR_TRY(tsr_host_pool_create(host_bytes, &host));
    tsr_host_pool_pin_fn pin = opt->pin;
    tsr_host_pool_unpin_fn unpin = opt->unpin;
    void *pin_ctx = NULL;
    if (!pin && opt->be && opt->be->ops->host_register) {
        pin = tsr__pin;
        unpin = tsr__unpin;
        pin_ctx = opt->be;
    }
    if (pin) {
        tsr_status pst = tsr_host_pool_set_pinning(host, pin, unpin, pin_ctx);
        if (pst != TSR_OK) {
            tsr_host_pool_destroy(host);
            return pst;
        }
    }
    kc.host = host;
    /* Host views of this stage's weights, for policies that read them at create
     * (offload's skew mode reads Wq/Wk; they copy what they keep). */
    tsr_kv_policy_layer *pl = NULL;
    tsr_kv_policy_model pm = {.cfg = cfg};
    if (opt->model) {
        pl = tsr_calloc((size_t)(layers > 0 ? layers : 1), sizeof *pl);
        if (!pl) {
            tsr_host_pool_destroy(host);
            return TSR_ERR_NOMEM;
        }
        for (int l = 0; l < layers; l++) {
            const tsr_layer_weights *w = &opt->model->layers[sh->layer_begin + l];
            pl[l] = (tsr_kv_policy_layer){.wq = w->wq, .wk = w->wk, .attn_norm = w->attn_norm,
                                          .window = tsr_config_layer_window(cfg,
                                                                            sh->layer_begin + l)};
            if (w->sinks.data) /* this rank's query heads */
                pl[l].sinks = (tsr_tensor){.dtype = TSR_F32, .rows = 1,
                                           .cols = sh->head_end - sh->head_begin,
                                           .data = (const float *)w->sinks.data +
                                                   sh->head_begin};
        }
        pm.layers = pl;
    }
    tsr_kv_policy_config pc = {.budget = opt->budget, .args = opt->policy_args,
                               .n_args = opt->n_policy_args, .model = pl ? &pm : NULL,
                               .n_heads = sh->head_end - sh->head_begin,
                               .chunk = tsr__chunk(opt),
                               .rope_interleaved = cfg->rope_interleaved, .host = host,
                               .owns_host = 1, .comm = opt->comm,
                               .kv_share_begin = sh->kv_share_begin,
                               .kv_share_end = sh->kv_share_end};
    tsr_kv_cache *kv = NULL;
    tsr_status st = tsr_kv_policy_cache_create(pol, &pc, &kc, &kv);
    tsr_free(pl);
    if (st != TSR_OK) {
        tsr_host_pool_destroy(host);
        return st;
    }
    if (!dist) {
        *out = kv;
        return TSR_OK;
    }
    st = tsr_kv_dist_create(kv, opt->comm, out);
    if (st != TSR_OK) tsr_kv_cache_destroy(kv);
    return st;
}

int tsr_kv_stats_json(const tsr_kv_cache *kv, char *buf, size_t size) {
    tsr_kv_detail d;
    tsr_kv_cache_detail(kv, &d);
    return tsr_kv_detail_json(&d, buf, size);
}

tsr_status tsr_kv_layer_bytes_of(const tsr_kv_options *opt, const tsr_model_config *cfg,
                                 tsr_kv_layer_bytes *out) {
    memset(out, 0, sizeof *out);
    int kv_dtype;
    TSR_TRY(tsr_kv_dtype_resolve(opt, &kv_dtype));
    const tsr_kv_policy_decl *pol = opt->policy ? opt->policy : tsr_kv_policy_default();
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = cfg->n_kv_heads,
                              .head_dim = cfg->head_dim,
                              .block_size = opt->block_size > 0 ? opt->block_size : 16,
                              .max_seqs = 1, .max_seq_len = cfg->max_seq_len,
                              .keep_scores = pol->reads_scores, .be = opt->be,
                              .kv_dtype = kv_dtype};
    /* one layer's block over its tokens: K, V and what the host keeps per position */
    double per_layer = (double)tsr_kv_paged_block_bytes(&kc) / (double)kc.block_size;
    for (int l = 0; l < cfg->n_layers; l++) {
        int w = tsr_config_layer_window(cfg, l);
        if (w > 0) {
            out->sliding_layers++;
            out->window = w > out->window ? w : out->window;
        } else {
            out->full_layers++;
        }
    }
    out->full_per_token = per_layer * out->full_layers;
    out->sliding_per_token = per_layer * out->sliding_layers;
    return TSR_OK;
}

int tsr_kv_layer_bytes_json(const tsr_kv_layer_bytes *b, char *buf, size_t size) {
    return snprintf(buf, size,
                    "{\"full_layers\":%d,\"full_bytes_per_token\":%.0f,\"sliding_layers\":%d,"
                    "\"sliding_bytes_per_token\":%.0f,\"window\":%d}",
                    b->full_layers, b->full_per_token, b->sliding_layers, b->sliding_per_token,
                    b->window);
}

int tsr_kv_layer_bytes_line(const tsr_kv_layer_bytes *b, char *buf, size_t size) {
    return snprintf(buf, size,
                    "KV %.1f KiB/token in %d full layer%s, %.1f KiB/token in %d sliding "
                    "layer%s (window %d: %d tokens a sequence between steps)",
                    b->full_per_token / 1024.0, b->full_layers, b->full_layers == 1 ? "" : "s",
                    b->sliding_per_token / 1024.0, b->sliding_layers,
                    b->sliding_layers == 1 ? "" : "s", b->window, b->window - 1);
}
