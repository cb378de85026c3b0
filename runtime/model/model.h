/* tsr_model: configuration plus weight views. It knows nothing of files: loaders fill it
 * and register what must be released (mmaps, buffers) through tsr_model_own_*. */
#ifndef TSR_RUNTIME_MODEL_H
#define TSR_RUNTIME_MODEL_H

#include "runtime/text/chat_template.h"
#include "runtime/model/config.h"
#include "base/tensor.h"

typedef struct tsr_layer_weights {
    tsr_tensor attn_norm; /* [1, dim] f32 */
    tsr_tensor wq;        /* [n_heads*head_dim, dim] */
    tsr_tensor wk;        /* [n_kv_heads*head_dim, dim] */
    tsr_tensor wv;        /* [n_kv_heads*head_dim, dim] */
    tsr_tensor wo;        /* [dim, n_heads*head_dim] */
    tsr_tensor ffn_norm;  /* [1, dim] f32 */
    tsr_tensor w_gate;    /* [hidden, dim] (llama2.c w1) */
    tsr_tensor w_up;      /* [hidden, dim] (llama2.c w3) */
    tsr_tensor w_down;    /* [dim, hidden] (llama2.c w2) */
    tsr_tensor bq, bk, bv;       /* cfg.qkv_bias: [1, q width] / [1, kv width] f32 */
    tsr_tensor q_norm, k_norm;   /* cfg.qk_norm: [1, head_dim] f32, shared by the heads */
    /* GPT-OSS (cfg.n_experts > 0: no w_gate/w_up/w_down) */
    tsr_tensor bo;               /* cfg.o_bias: [1, dim] f32 */
    tsr_tensor sinks;            /* cfg.attn_sinks: [1, n_heads] f32 */
    tsr_tensor router;           /* [n_experts, dim] */
    tsr_tensor router_b;         /* [1, n_experts] f32 */
    tsr_experts gate_up;         /* n_experts of [2 * hidden, dim], gate/up rows interleaved */
    tsr_experts down;            /* n_experts of [dim, hidden] */
    /* Fused at load (runtime/model/fuse.h; data NULL: not fused): wq, wk and wv's rows
     * stacked, [q width + 2 * kv width, dim], with their biases as one [1, that width]
     * vector, and w_gate's rows then w_up's, [2 * hidden, dim]. The parts are views of
     * them where their storage allows (fuse.h). */
    tsr_tensor wqkv, bqkv, w_gate_up;
} tsr_layer_weights;

typedef struct tsr_model_resource tsr_model_resource;

typedef struct tsr_model {
    tsr_model_config cfg;
    char *source;          /* path or synthetic name, for messages */
    /* A GGUF file's quantization as llama.cpp names it (general.file_type: "Q4_K_M", ...),
     * for messages: cfg.dtype names the layout most weights run in, which for a K-quant
     * file is not the file's name for itself. Empty otherwise. */
    char file_type[12];
    tsr_tensor tok_emb;    /* [vocab, dim] */
    tsr_layer_weights *layers;
    tsr_tensor out_norm;   /* [1, dim] f32 */
    tsr_tensor classifier; /* [vocab, dim]; same data as tok_emb when tied */
    tsr_model_resource *resources;
    /* Weight arena: large tensors are carved from 2 MiB-aligned anonymous mappings
     * advised for transparent huge pages (see tsr_model_alloc). */
    char *arena_next;
    size_t arena_left;
} tsr_model;

/* Opens a model: a llama2.c .bin file, a GGUF file, a Hugging Face directory (config.json +
 * model.safetensors[.index.json]), or "synthetic:NAME" (see runtime/model/synthetic.h). */
tsr_status tsr_model_load(const char *spec, tsr_model **out);
/* The chat template a model carries: a GGUF file's tokenizer.chat_template, or a Hugging
 * Face directory's tokenizer_config.json (tsr_chat_template_detect). None: kind
 * TSR_CHAT_NONE and TSR_OK. Free with tsr_chat_template_free. */
tsr_status tsr_model_chat_template(const char *path, tsr_chat_template *out);

/* Creates an empty model whose fields the caller fills (loaders, tests). */
tsr_status tsr_model_create(const char *source, const tsr_model_config *cfg, tsr_model **out);
void tsr_model_destroy(tsr_model *m);

/* Resources released by tsr_model_destroy. */
tsr_status tsr_model_own_mmap(tsr_model *m, void *addr, size_t len);
tsr_status tsr_model_own_buffer(tsr_model *m, void *ptr); /* freed with tsr_free */

/* Allocates `bytes` owned by the model (64-byte aligned). */
tsr_status tsr_model_alloc(tsr_model *m, size_t bytes, void **out);

/* Gives back the pages of the weight arena past its last tensor (a huge-page fault
 * brought them in; peak RSS): call when the weights are in place. */
void tsr_model_trim(tsr_model *m);

/* Drops the pages of [p, p + bytes) when it is a tsr_model_alloc weight-arena allocation
 * or part of a mapped model file that nothing views any more (a matrix copied elsewhere,
 * runtime/model/fuse.c); anything else is left alone. The range must never be read again
 * (a file mapping's pages would come back from the file). */
void tsr_model_discard(tsr_model *m, const void *p, size_t bytes);

/* Copies every tensor that views a model file into model-owned memory (the 2 MiB-page
 * weight arena for matrices) and unmaps the files. Decode streams all weights once per
 * token: huge pages read faster than the page cache's 4 KiB pages (docs/perf.md), and a
 * rank keeps only its shard (call after tsr_parallel_shard_model). */
tsr_status tsr_model_pack(tsr_model *m);

/* Checks that every tensor is present with the shape the config demands. */
tsr_status tsr_model_check(const tsr_model *m);

/* Total bytes of weights a decode step reads (benchmarks). */
size_t tsr_model_weight_bytes(const tsr_model *m);

#endif
