/* Builds the KV cache `tessera generate` and the benches use, from command-line options:
 * policy, pool memory, block size, budget. One call, one cache; the cache owns its host
 * pool.
 *
 * Pool size without --kv-memory:
 * - host-memory backends (the plain CPU) and no backend: memory_fraction (default 0.5) of
 *   what the job may still take from the host, less the prefill workspace. That is the
 *   least of MemAvailable, the cgroup's memory.max / memory.limit_in_bytes less its
 *   usage, Slurm's allocation less the RSS and ulimit -v less the address space in use
 *   (tsr_sys_mem_headroom), divided among the ranks of the node; --verbose logs which
 *   bound won;
 * - other backends (cpu-fenced, CUDA): memory_fraction (default 0.9) of the backend memory
 *   still free (be->ops->memory), less the prefill workspace and one logits row per
 *   sequence. The weights are already placed when this runs (runtime/engine/engine.c places them
 *   first), so "free" excludes them; the forward's workspace is allocated after the pool,
 *   hence subtracted. The 10 % left is the safety margin for allocator rounding and the
 *   buffers the forward grows on demand (all-logits rows, the per-key score buffer). Their
 *   host pool (swap, offload's host copy) gets, unless host_bytes is set, half of what the
 *   host bounds leave the rank.
 * On the host the pool is then capped at twice max_seqs sequences of the full context at
 * the policy's peak; with fit_seqs it is exactly fit_seqs of them.
 * Whatever its size, the pool must hold one sequence of the full context (max_context, or
 * the model's) in the rows the policy declares its selection holds (tsr_kv_policy_resident_of:
 * under a policy that uses --kv-budget and is given one, the budget plus one chunk per
 * layer, decode steps included (the policy gets the same chunk: tsr_kv_policy_config.chunk);
 * offload's dense layers whole): otherwise tsr_kv_setup refuses with TSR_ERR_BUDGET
 * and one line, as vLLM checks max_model_len against its pool. A pool that holds that but
 * not the policy's peak (offload's dense prefill) gets one warning line saying what the
 * policy does without it and what pool avoids it. Every request that fits the context then
 * runs, preempting others when the pool is short (runtime/exec/scheduler.h). */
#ifndef TSR_RUNTIME_KV_SETUP_H
#define TSR_RUNTIME_KV_SETUP_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "memory/host_pool.h"
#include "memory/kv_cache.h"
#include "policies/policy.h"
#include "runtime/model/config.h"
#include "runtime/exec/parallel.h"

typedef struct tsr_kv_options {
    /* --kv-policy, resolved once by the registry's lookup (tsr_kv_policy_find, jobs/kv_cli.c)
     * into its declaration, which is all this layer asks (NULL: tsr_kv_policy_default). */
    const tsr_kv_policy_decl *policy;
    int64_t memory_bytes;    /* --kv-memory BYTES for the block pool; 0: a fraction of free
                              * memory, less the prefill workspace */
    double memory_fraction;  /* used when memory_bytes is 0 (0: 0.5) */
    int block_size;          /* --block-size (0: 16) */
    double budget;           /* --kv-budget: tokens (> 1) or fraction (<= 1); 0: keep all */
    /* The policy's own options as text ({"h2o-recent", "0.3"}), checked against its
     * declaration (policies/policy.h); ones it does not declare are skipped. */
    const tsr_kv_policy_arg *policy_args;
    int n_policy_args;
    int max_seqs;            /* concurrent sequences (0: 1) */
    int no_prefix_cache;     /* disable prefix sharing (paged) */
    int64_t host_bytes;      /* host pool budget for swap and offload (0: unlimited) */
    /* Host weights of the model (this rank's shard), for policies that read them at
     * create (offload's skew mode); must outlive the cache. NULL: none. */
    const struct tsr_model *model;
    int chunk_tokens;        /* prefill chunk (workspace budgeting; 0: 512) */
    int max_context;         /* positions one sequence may hold: --max-context, checked
                              * against the pool at setup (0: the model's context) */
    /* > 0 and memory_bytes 0: the pool is what this many sequences of the full context
     * hold at the policy's declared peak (tsr_kv_policy_resident_of), whatever the memory
     * (benches that measure what a policy uses). */
    int fit_seqs;
    /* Distributed jobs: this rank's layers and KV heads, and the comm whose world agrees
     * on capacity and admission (memory/kv_dist.h). NULL: the whole model, one process. */
    const tsr_parallel_shard *shard;
    tsr_comm *comm;
    /* Where the host pool (swap, offload's host tier) lives: the rank's NUMA node
     * (memory/topology.h); NULL: unplaced malloc. pin/unpin (optional) register the pool's
     * memory with the device (cudaHostRegister) so copies from it are asynchronous. */
    const tsr_topology *topo;
    const tsr_placement *place;
    tsr_host_pool_pin_fn pin;
    tsr_host_pool_unpin_fn unpin;
    /* Where the K/V rows live (tsr_kv_paged_config.be, not owned); its memory query sizes
     * the pool of a device backend, and its host_register (when pin is NULL) pins the host
     * pool. NULL: host memory, no pinning. */
    tsr_backend *be;
    /* --kv-dtype: "f32", "bf16", "q8" or "fp8" (kernels/kv_dtype.h); NULL: the backend's
     * default (tsr_kv_dtype_resolve). */
    const char *kv_dtype;
} tsr_kv_options;

/* The KV storage dtype of opt->kv_dtype, or when NULL the default for opt->be: bf16 on a
 * GPU (half the bytes attention streams), f32 on the CPU backends (the conversion costs CPU
 * attention time and there the KV is rarely what fills memory). TSR_ERR_INVALID with one
 * line for an unknown name. */
tsr_status tsr_kv_dtype_resolve(const tsr_kv_options *opt, int *dtype);

/* Bytes of transient prefill workspace for one chunk: forward activations, attention
 * scratch and the per-key score buffer. Counted against the memory budget at setup. */
size_t tsr_kv_workspace_bytes(const tsr_model_config *cfg, int chunk_tokens);

/* Under a multi-rank comm this is collective: every rank's pool gets the same number of
 * blocks per layer (the least any rank can hold), and the cache is wrapped in the
 * distributed block manager. */
tsr_status tsr_kv_setup(const tsr_kv_options *opt, const tsr_model_config *cfg,
                        tsr_kv_cache **out);

/* One JSON object (no newline) of KV stats: policy, blocks used/total/peak, peak bytes,
 * evictions, prefix hits, then the policy's declared stats. Returns the length it needs
 * (as snprintf). */
int tsr_kv_stats_json(const tsr_kv_cache *kv, char *buf, size_t size);

/* KV bytes per token by layer type, for the whole model (every KV head once, every layer)
 * in the storage opt gives (dtype, block size, host scores): a full-attention layer keeps
 * every token, a sliding-window layer (GPT-OSS) at most its window plus the step in flight
 * per sequence, whatever the context (in every policy cache but offload's and the dense
 * cache's, which keep every row). A model without sliding layers has sliding_layers 0. */
typedef struct tsr_kv_layer_bytes {
    int full_layers, sliding_layers;
    int window;             /* the sliding layers' (the largest, when they differ) */
    double full_per_token;  /* bytes of one token in all full layers together */
    double sliding_per_token;
} tsr_kv_layer_bytes;
tsr_status tsr_kv_layer_bytes_of(const tsr_kv_options *opt, const tsr_model_config *cfg,
                                 tsr_kv_layer_bytes *out);
/* {"full_layers":..,"full_bytes_per_token":..,"sliding_layers":..,
 *  "sliding_bytes_per_token":..,"window":..} (no newline); the length it needs. */
int tsr_kv_layer_bytes_json(const tsr_kv_layer_bytes *b, char *buf, size_t size);
/* "KV 1.0 KiB/token in 12 full layers, 1.0 KiB/token in 12 sliding layers (window 128:
 * 127 tokens a sequence between steps)"; the length it needs. */
int tsr_kv_layer_bytes_line(const tsr_kv_layer_bytes *b, char *buf, size_t size);

#endif
