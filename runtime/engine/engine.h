/* The engine: the whole start-up of a job, for `tessera generate`, `run`, `bench`,
 * `fidelity`, the benches and tests. From one spec it makes, in order:
 *   1. the job (runtime/engine/dist.h) when spec.distributed: MPI when a launcher started us, else
 *      one process;
 *   2. the model, loaded from spec.model_path (or the caller's, spec.model), checked
 *      against the context the job needs (spec.min_context), its tokenizer
 *      (spec.load_tokenizer) and the prompt's ids (spec.prompt), one agreed step;
 *   3. the tp x pp layout and the cut of the model to this rank's shard (distributed);
 *      the shard's matrices converted to spec.weights_dtype (spec.convert_weights);
 *   4. the placement of the node's ranks, and binding to their cores (spec.dist.bind);
 *   5. the backend (tsr_backend_create_local: the local rank picks the GPU);
 *   6. the activations' data plane (distributed: MPI, NCCL, or local);
 *      then q/k/v and gate/up fused into one matrix each (runtime/model/fuse.h);
 *   7. host-memory backends: the weights leave the file mapping for huge pages
 *      (tsr_model_pack, when asked);
 *   8. the weights in backend memory, once (tsr_backend_place_tensor: a copy only when the
 *      backend's memory is not the host's; the stored dtype is kept);
 *   9. the KV cache (runtime/exec/kv_setup.h), its pool sized from the backend's memory query for
 *      a device backend (after the weights, so they are not counted twice), from the job's
 *      host bounds (cgroup, Slurm, ulimit -v, MemAvailable) otherwise; the start fails with
 *      one line when the pool cannot hold one sequence of the context (kv.max_context);
 *  10. the forward pass over the placed weights; then the job's start-up is over
 *      (tsr_dist_ready: the --comm-timeout watchdog runs from here on).
 * Every fallible step is agreed over the ranks, so a failure on any rank fails every rank
 * with the same message and nobody hangs in a later collective. tsr_engine_destroy undoes
 * it in reverse: forward, KV cache, placed weights, backend, tokenizer, model, placement,
 * comm. */
#ifndef TSR_RUNTIME_ENGINE_H
#define TSR_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "runtime/engine/dist.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

/* A single-prompt job (generate): the engine reads and encodes the prompt with the
 * model's tokenizer in step 2, before anything is sized, and holds the prefill chunk
 * (max_tokens, kv.chunk_tokens) to the prompt's length. */
typedef struct tsr_engine_prompt {
    const char *text; /* the prompt, or NULL */
    const char *file; /* or read from this file ('-': stdin) */
    bool no_bos;      /* do not prepend the tokenizer's BOS */
    /* The text is one user message, rendered with the model's chat template
     * (tsr_model_chat_template, generation prompt on) and encoded without an added BOS
     * (the template writes the tokens it wants). A model without a template is an error. */
    bool chat;
} tsr_engine_prompt;

typedef struct tsr_engine_spec {
    /* The model: loaded from model_path (llama2.c .bin, Hugging Face directory or
     * synthetic:NAME), or the caller's (tests, benches), which the engine takes over
     * whatever the outcome (destroyed with the engine, or at once when the start fails),
     * unless borrow_model (tests that run one model on several engines: the engine neither
     * destroys it nor packs it). */
    const char *model_path;
    tsr_model *model;
    bool borrow_model;
    /* The tokenizer (tokenizer_path, or NULL: found next to model_path). */
    bool load_tokenizer;
    const char *tokenizer_path;
    tsr_engine_prompt prompt; /* needs load_tokenizer */
    /* A job of one or several ranks (runtime/engine/dist.h): the engine starts the comm, lays out
     * dist.tp x dist.pp, cuts the model to this rank's shard and places the rank. Without
     * it: one process, or the caller's comm and shard in `par` (tests). */
    bool distributed;
    tsr_dist_options dist;
    tsr_forward_parallel par; /* not distributed; par.comm NULL: the whole model */
    const char *backend;  /* auto, cpu, cpu-fenced or cuda (NULL: auto) */
    /* Tests: this backend (a fake device) instead of one made from `backend`; the engine
     * takes it over (destroyed with the engine, or at once when the start fails). */
    tsr_backend *backend_given;
    int threads;          /* CPU kernel threads; 0 (distributed): the node's CPUs over its
                           * ranks */
    int local_rank;       /* not distributed: this rank's index on its node (0: one
                           * process) */
    int max_tokens;       /* tokens one forward call may carry (prefill chunk, batch) */
    /* One sequence at a time (generate, fidelity): max_tokens and kv.chunk_tokens are held
     * to the context (and to the prompt's length, spec.prompt implies it). */
    bool one_sequence;
    /* The KV cache: policy, sizes, and for a distributed job shard, comm and host-pool
     * placement (set by the engine). The engine sets kv.be and kv.model; kv.max_context 0
     * or above the model's: the model's (tsr_engine.ctx). */
    tsr_kv_options kv;
    /* > 0: a dense cache of this many tokens for kv.max_seqs sequences instead of
     * tsr_kv_setup (bench --kv dense). */
    int dense_kv_tokens;
    /* > 0: the paged pool (kv.memory_bytes) holds this many blocks of kv.block_size rows
     * per layer, as the policy's pool stores them (K and V of this rank's KV heads, the
     * positions, the policy's scores): a pool sized in tokens, whatever the model's shape
     * (benches). */
    int64_t kv_blocks;
    /* > 0: the model must hold this many positions (a prompt and the tokens generated
     * after it, in one sequence); a model with fewer fails the start with TSR_ERR_BUDGET
     * and one line, right after the load, before anything is sized. */
    int min_context;
    /* The weights in weights_dtype (f32, f16 or bf16): a synthetic model_path is made in
     * it (",dtype=" appended when the path names none), any other model has its matrices
     * converted in host memory after the shard cut and before packing (norms stay f32, as
     * every loader keeps them). Not for a borrowed model. */
    bool convert_weights;
    tsr_dtype weights_dtype;
    /* Host-memory backends only: tsr_model_pack (huge pages; logged at info level). */
    bool pack_weights;
    /* Leave wq/wk/wv and w_gate/w_up apart (tests comparing against the fused weights;
     * a model fused before stays fused). Otherwise, when the backend has the fused ops
     * (qkv_rope, swiglu_fused), each is fused into one matrix after the conversion, a
     * borrowed model's too, since the values and the parts' views stay
     * (runtime/model/fuse.h). */
    bool no_fuse;
    /* Optional: this rank's index in the job, set as soon as the comm is up (0 before),
     * so that a failed start still knows that rank 0 prints its message. */
    int *rank_out;
    /* Optional: the model's config as loaded, set as soon as the model is (zeroed before),
     * so that a start refused for min_context can be reported in the caller's words. */
    tsr_model_config *config_out;
    /* Optional: called on every rank once the model is loaded, before it is cut to the
     * rank's shard or converted: the whole model as the file holds it (tensors in host
     * memory or file views), so that what is derived from it does not depend on the
     * layout (a checkpoint's model identity). */
    void (*model_loaded)(void *ctx, const tsr_model *m);
    void *model_loaded_ctx;
} tsr_engine_spec;

/* A command's --dtype: NULL keeps the weights as loaded; a name (one tsr_dtype_parse
 * takes: the command checked it, jobs/cli.h) sets convert_weights and weights_dtype. */
void tsr_engine_spec_dtype(tsr_engine_spec *spec, const char *dtype);

typedef struct tsr_engine {
    tsr_dist dist;            /* the job (distributed: comm, layout, shard, placement); one
                               * process otherwise (rank 0, world 1, comm NULL) */
    tsr_model *model;         /* the host model (config, owned); its tensors may be views of
                               * the file: never hand it to backend ops */
    tsr_tokenizer *tok;       /* spec.load_tokenizer, else NULL */
    int32_t *prompt_ids;      /* spec.prompt encoded, else NULL */
    size_t n_prompt;
    int ctx;                  /* context in tokens: kv.max_context held to the model's */
    int max_tokens;           /* tokens one forward call carries (spec.max_tokens, held to
                               * the prompt) */
    int threads;              /* CPU kernel threads asked of the backend */
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
    bool borrowed_, dist_started_;
    tsr_forward_parallel par_;
} tsr_engine;

/* Collective over the job's ranks (distributed) or over spec->par.comm. On failure every
 * rank gets the same status and message, and everything made so far is undone (the comm
 * included). */
tsr_status tsr_engine_create(const tsr_engine_spec *spec, tsr_engine **out);
void tsr_engine_destroy(tsr_engine *e);

/* Agreement over the engine's ranks (tsr_dist_agree / tsr_comm_agree): a command's own
 * fallible step after the start-up, before its next collective one. */
tsr_status tsr_engine_agree(tsr_engine *e, tsr_status st);

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
