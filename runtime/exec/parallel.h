/* The tp x pp parallel layout and what each rank holds of a model.
 *
 * Rank mapping (the same as comm/comm.h): world rank = pp_rank * tp + tp_rank; the ranks
 * of one tensor-parallel group are consecutive.
 *
 * Tensor parallelism (Megatron): query heads split evenly (tp must divide n_heads); KV
 * heads split when tp divides n_kv_heads, else each KV head is replicated on the tp /
 * n_kv_heads ranks whose query heads use it (tp must then be a multiple of n_kv_heads).
 * The MLP splits by hidden columns: w1/w3 rows and w2 columns [hidden_begin, hidden_end).
 *
 * Reduction parts (bit-identical results for every tp): both row-parallel matmuls (wo after
 * attention, w2 after the MLP) are summed over a canonical list of n_parts = n_heads partial
 * vectors that does not depend on tp: part i is query head i for wo, and hidden chunk i
 * (tsr_parallel_hidden_chunk(hidden_dim, n_heads, i)) for w2. A rank owns parts
 * [part_begin, part_end), which are exactly its heads and, for the MLP, its hidden columns:
 * the hidden range is a union of whole chunks, so hidden_dim need not be a multiple of tp
 * (stories260K: hidden 172 in 8 chunks of 22,22,22,22,21,21,21,21, fewer than 8 units of
 * 32 columns; tp 2 -> 88 + 84. stories110M: 2048 in 12 chunks of 192 x 4, 160 x 8).
 * Computing each part's product and calling tsr_comm_allreduce_sum_f32_parts gives the
 * same bits for tp = 1 (one process, all parts), 2, 4, ...
 *
 * Embedding, norms and classifier are replicated on every rank of a stage.
 *
 * Pipeline parallelism: contiguous layer ranges, as even as possible; the first
 * n_layers % pp stages take one layer more (the last stage also runs the classifier). */
#ifndef TSR_RUNTIME_PARALLEL_H
#define TSR_RUNTIME_PARALLEL_H

#include <stdbool.h>

#include "base/status.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"

typedef struct tsr_parallel_layout {
    int tp, pp;
    int world_size; /* tp * pp */
} tsr_parallel_layout;

/* What one rank computes. Ranges are [begin, end). */
typedef struct tsr_parallel_shard {
    int rank, tp_rank, pp_rank;
    int head_begin, head_end;       /* query heads */
    int kv_head_begin, kv_head_end; /* KV heads held (and computed) by this rank */
    bool kv_replicated;             /* the KV heads are also held by other TP ranks */
    int kv_share_begin, kv_share_end; /* the TP ranks holding these KV heads (this one alone
                                       * unless replicated) */
    int hidden_begin, hidden_end;   /* MLP intermediate columns (whole chunks) */
    int expert_begin, expert_end;   /* experts held: all, or this TP rank's share under
                                     * expert parallelism (runtime/exec/moe.h) */
    int n_parts;                    /* canonical reduction parts (= n_heads) */
    int part_begin, part_end;       /* my parts: = my heads, and my hidden chunks */
    int layer_begin, layer_end;     /* this stage's layers */
    bool first_stage, last_stage;   /* embeds the tokens / runs the classifier */
} tsr_parallel_shard;

/* Checks tp >= 1, pp >= 1 and, when world_size > 0, tp * pp == world_size (world_size
 * <= 0: taken as tp * pp). */
tsr_status tsr_parallel_layout_init(int tp, int pp, int world_size, tsr_parallel_layout *out);

int tsr_parallel_tp_rank(const tsr_parallel_layout *l, int rank);
int tsr_parallel_pp_rank(const tsr_parallel_layout *l, int rank);
int tsr_parallel_world_rank(const tsr_parallel_layout *l, int tp_rank, int pp_rank);

/* Checks the layout against a model; `what` (the model path) names it in the error line:
 * "--tp 3 does not divide the 8 attention heads of models/stories260K.bin". */
tsr_status tsr_parallel_validate(const tsr_parallel_layout *l, const tsr_model_config *c,
                                 const char *what);

/* The shard of `rank` (validates first). */
tsr_status tsr_parallel_shard_of(const tsr_parallel_layout *l, const tsr_model_config *c,
                                 int rank, const char *what, tsr_parallel_shard *out);

/* [*begin, *end) of part `i` of `n` items split in `parts` contiguous ranges, the first
 * n % parts ranges one longer. */
void tsr_parallel_split(int n, int parts, int i, int *begin, int *end);
/* [begin, end) of hidden chunk i of n_parts: whole TSR_PARALLEL_HIDDEN_UNIT-column units
 * (the last chunk also takes hidden % unit) when there are at least n_parts units, else
 * tsr_parallel_split. */
#define TSR_PARALLEL_HIDDEN_UNIT 32
void tsr_parallel_hidden_chunk(int hidden, int n_parts, int i, int *begin, int *end);

/* The whole model as the shard of a one-rank layout (tp = pp = 1). */
tsr_status tsr_parallel_shard_whole(const tsr_model_config *c, tsr_parallel_shard *out);

/* Local widths of a shard: query and KV rows (heads x head_dim), MLP columns, layers. */
static inline int tsr_parallel_shard_qdim(const tsr_parallel_shard *s, const tsr_model_config *c) {
    return (s->head_end - s->head_begin) * c->head_dim;
}
static inline int tsr_parallel_shard_kvdim(const tsr_parallel_shard *s,
                                           const tsr_model_config *c) {
    return (s->kv_head_end - s->kv_head_begin) * c->head_dim;
}
static inline int tsr_parallel_shard_hidden(const tsr_parallel_shard *s) {
    return s->hidden_end - s->hidden_begin;
}

/* Column boundaries of the local reduction parts, rebased to the shard (n_local + 1
 * entries each): wo's parts are the local heads, w_down's the local hidden chunks. */
void tsr_parallel_shard_segments(const tsr_parallel_shard *s, const tsr_model_config *c,
                                 int32_t *wo_seg, int32_t *down_seg);

/* Cuts a loaded model down to a shard, in place: wq/wk/wv and w_gate/w_up become views of
 * the shard's rows (so an mmap'ed file is only read where the shard lies), wo and w_down
 * get copies of the shard's columns in model-owned memory, and the layers of other stages
 * are dropped (empty tensors). Embedding, norms and classifier stay whole (replicated).
 * m->cfg keeps the global shapes; the forward pass reads the local ones from the shard. A
 * whole-model shard changes nothing; a cut drops fused tensors (runtime/model/fuse.h), to
 * be fused again from the shard's rows. */
tsr_status tsr_parallel_shard_model(tsr_model *m, const tsr_parallel_shard *s);

/* One line describing a shard ("rank 1 (tp 1/2, pp 0/1): heads 4-7, kv heads 2-3, ..."). */
int tsr_parallel_shard_format(const tsr_parallel_shard *s, char *buf, int cap);

#endif
