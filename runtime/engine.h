/* The engine: one place that turns options into a running model, for `tessera generate`,
 * `tessera run` and `tessera bench` (and tests). From a loaded model (already cut to this
 * rank's shard in a distributed job) it makes, in order:
 *   1. the backend (tsr_backend_create_local: the local rank picks the GPU);
 *   2. whatever the caller must do once the backend exists (on_backend: the job's data-plane
 *      choice, jobs/dist_cli.h);
 *   3. host-memory backends: the weights leave the file mapping for huge pages
 *      (tsr_model_pack, when asked);
 *   4. the weights in backend memory, once (tsr_backend_place_tensor: a copy only when the
 *      backend's memory is not the host's; the stored dtype is kept);
 *   5. the KV cache (runtime/kv_setup.h), its pool sized from the backend's memory query for
 *      a device backend (after the weights, so they are not counted twice), from the job's
 *      host bounds (cgroup, Slurm, ulimit -v, MemAvailable) otherwise; the start fails with
 *      one line when the pool cannot hold one sequence of the context (kv.max_context);
 *   6. the forward pass over the placed weights.
 * Every fallible step is agreed over the ranks of par.comm (tsr_comm_agree), so a failure on
 * any rank fails every rank with the same message and nobody hangs in a later collective.
 * tsr_engine_destroy undoes it in reverse: forward, KV cache, placed weights, backend,
 * model. */
#ifndef TSR_RUNTIME_ENGINE_H
#define TSR_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/forward.h"
#include "runtime/kv_setup.h"
#include "runtime/model.h"

typedef struct tsr_engine_options {
    const char *backend;  /* auto, cpu, cpu-fenced or cuda (NULL: auto) */
    /* Tests: this backend (a fake device) instead of one made from `backend`; the engine
     * takes it over (destroyed with the engine, or at once when the start fails). */
    tsr_backend *backend_given;
    int threads;          /* CPU kernel threads */
    int local_rank;       /* this rank's index on its node (0: one process) */
    int max_tokens;       /* tokens one forward call may carry (prefill chunk, batch) */
    /* The KV cache: policy, sizes, and for a distributed job shard, comm and host-pool
     * placement. The engine sets kv.be. */
    tsr_kv_options kv;
    /* > 0: a dense cache of this many tokens for kv.max_seqs sequences instead of
     * tsr_kv_setup (bench --kv dense). */
    int dense_kv_tokens;
    /* Where this rank stands; par.comm NULL: one process, the whole model. */
    tsr_forward_parallel par;
    /* Host-memory backends only: tsr_model_pack (huge pages; logged at info level). */
    bool pack_weights;
    /* The caller keeps the model (tests that run one model on several engines): the
     * engine neither destroys it nor packs it. */
    bool borrow_model;
    /* Optional: called once the backend exists, before anything is placed. In a
     * distributed job it must return the same status on every rank (it is not agreed). */
    tsr_status (*on_backend)(void *ctx, tsr_backend *be);
    void *on_backend_ctx;
} tsr_engine_options;

typedef struct tsr_engine {
    tsr_model *model;         /* the host model (config, owned); its tensors may be views of
                               * the file: never hand it to backend ops */
    tsr_backend *be;
    const tsr_model *weights; /* the model the forward runs: every tensor in backend memory
                               * (the host model itself when be->host_memory) */
    tsr_kv_cache *kv;
    tsr_forward *fwd;
    size_t placed_bytes;      /* weight bytes copied into backend memory */
    /* private */
    int64_t device_base_;     /* backend memory in use when the backend was made */
    tsr_model placed_;
    void **bufs_;
    int n_bufs_, cap_bufs_;
    bool borrowed_;
} tsr_engine;

/* Takes ownership of `model` whatever the outcome (destroyed on failure), unless
 * o->borrow_model. Collective when o->par.comm spans several ranks. */
tsr_status tsr_engine_create(tsr_model *model, const tsr_engine_options *o, tsr_engine **out);
void tsr_engine_destroy(tsr_engine *e);

/* Backend (device) memory in use now, in bytes, from the backend's memory query, less what
 * was in use when the engine made the backend: on cpu-fenced the arena's allocated buffers
 * (weights, KV pool, workspace; page-rounded); on CUDA cudaMemGetInfo's used memory less the
 * CUDA context and what other processes held at the start (so this process's buffers and
 * allocator rounding, plus any growth of other processes on the device). 0 on the plain
 * CPU backend, whose buffers are host memory (peak RSS counts them). */
int64_t tsr_engine_device_bytes(const tsr_engine *e);

/* The device's name for logs (ops->device_name, else the backend's name). */
const char *tsr_engine_device_name(const tsr_engine *e);

#endif
