/* tp x pp layout checks and per-rank shard ranges. */
#include "runtime/exec/parallel.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cpu/quant_blocks.h"
#include "runtime/model/fp8.h"

tsr_status tsr_parallel_layout_init(int tp, int pp, int world_size, tsr_parallel_layout *out) {
    if (tp < 1 || pp < 1)
        return tsr_error_set(TSR_ERR_INVALID, "layout --tp %d x --pp %d: both must be >= 1", tp,
                             pp);
    long long need = (long long)tp * pp;
    if (need > 1 << 20)
        return tsr_error_set(TSR_ERR_INVALID, "layout --tp %d x --pp %d: too many ranks", tp, pp);
    if (world_size > 0 && need != world_size)
        return tsr_error_set(TSR_ERR_INVALID,
                             "layout --tp %d x --pp %d needs %lld ranks, but the job has %d "
                             "(world size must equal tp x pp)", tp, pp, need, world_size);
    out->tp = tp;
    out->pp = pp;
    out->world_size = (int)need;
    return TSR_OK;
}

int tsr_parallel_tp_rank(const tsr_parallel_layout *l, int rank) { return rank % l->tp; }
int tsr_parallel_pp_rank(const tsr_parallel_layout *l, int rank) { return rank / l->tp; }
int tsr_parallel_world_rank(const tsr_parallel_layout *l, int tp_rank, int pp_rank) {
    return pp_rank * l->tp + tp_rank;
}

void tsr_parallel_split(int n, int parts, int i, int *begin, int *end) {
    int base = n / parts, extra = n % parts;
    *begin = i * base + (i < extra ? i : extra);
    *end = *begin + base + (i < extra ? 1 : 0);
}

/* Whole units of TSR_PARALLEL_HIDDEN_UNIT columns where every chunk gets at least one: each
 * chunk then starts on a 64-byte boundary of a BF16 w_down row (128 bytes for F32) and has
 * no 16-column tail in the decode kernel. Measured on stories110M (2048 over 12 parts: 192
 * x 4 + 160 x 8 instead of 171 x 8 + 170 x 4), per w_down call, 1 thread, the two splits
 * alternating layer by layer in one run: 3-6 % faster in F32, 5-9 % in BF16. Chunks then
 * differ by up to one unit; models whose hidden_dim / n_heads is a multiple of 32 (every
 * Llama 2/3 size) split exactly evenly either way. */
void tsr_parallel_hidden_chunk(int hidden, int n_parts, int i, int *begin, int *end) {
    int units = hidden / TSR_PARALLEL_HIDDEN_UNIT;
    if (units < n_parts) {
        tsr_parallel_split(hidden, n_parts, i, begin, end);
        return;
    }
    tsr_parallel_split(units, n_parts, i, begin, end);
    *begin *= TSR_PARALLEL_HIDDEN_UNIT;
    *end = i == n_parts - 1 ? hidden : *end * TSR_PARALLEL_HIDDEN_UNIT;
}

tsr_status tsr_parallel_validate(const tsr_parallel_layout *l, const tsr_model_config *c,
                                 const char *what) {
    if (!what) what = "the model";
    int tp = l->tp, pp = l->pp;
    if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_layers <= 0 || c->hidden_dim <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "%s: config has no heads/layers to split", what);
    if (c->n_heads % tp != 0)
        return tsr_error_set(TSR_ERR_INVALID, "--tp %d does not divide the %d attention heads "
                             "of %s", tp, c->n_heads, what);
    if (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0)
        return tsr_error_set(TSR_ERR_INVALID, "--tp %d neither divides the %d KV heads of %s "
                             "nor is a multiple of them (needed to replicate them)", tp,
                             c->n_kv_heads, what);
    if (c->n_heads % c->n_kv_heads != 0)
        return tsr_error_set(TSR_ERR_INVALID, "%s: %d heads are not a multiple of %d KV heads",
                             what, c->n_heads, c->n_kv_heads);
    if (c->hidden_dim < c->n_heads)
        return tsr_error_set(TSR_ERR_INVALID, "%s: %d MLP columns cannot form a chunk for each of "
                             "the %d heads (tensor-parallel reduction parts)", what,
                             c->hidden_dim, c->n_heads);
    if (pp > c->n_layers)
        return tsr_error_set(TSR_ERR_INVALID, "--pp %d exceeds the %d layers of %s "
                             "(each stage needs at least one layer)", pp, c->n_layers, what);
    return TSR_OK;
}

tsr_status tsr_parallel_shard_of(const tsr_parallel_layout *l, const tsr_model_config *c,
                                 int rank, const char *what, tsr_parallel_shard *out) {
    TSR_TRY(tsr_parallel_validate(l, c, what));
    if (rank < 0 || rank >= l->world_size)
        return tsr_error_set(TSR_ERR_INVALID, "rank %d outside a layout of %d ranks", rank,
                             l->world_size);
    tsr_parallel_shard s = {0};
    s.rank = rank;
    s.tp_rank = tsr_parallel_tp_rank(l, rank);
    s.pp_rank = tsr_parallel_pp_rank(l, rank);
    int hpr = c->n_heads / l->tp;
    s.head_begin = s.tp_rank * hpr;
    s.head_end = s.head_begin + hpr;
    if (c->n_kv_heads % l->tp == 0) {
        int kpr = c->n_kv_heads / l->tp;
        s.kv_head_begin = s.tp_rank * kpr;
        s.kv_head_end = s.kv_head_begin + kpr;
        s.kv_replicated = false;
        s.kv_share_begin = s.tp_rank;
        s.kv_share_end = s.tp_rank + 1;
    } else {
        /* tp = m * n_kv_heads: m consecutive ranks share one KV head; their query heads
         * all belong to its group because hpr divides the group size n_heads/n_kv. */
        int group = c->n_heads / c->n_kv_heads;
        s.kv_head_begin = s.head_begin / group;
        s.kv_head_end = s.kv_head_begin + 1;
        s.kv_replicated = true;
        int m = l->tp / c->n_kv_heads;
        s.kv_share_begin = s.tp_rank - s.tp_rank % m;
        s.kv_share_end = s.kv_share_begin + m;
    }
    s.n_parts = c->n_heads;
    s.part_begin = s.head_begin;
    s.part_end = s.head_end;
    int unused;
    tsr_parallel_hidden_chunk(c->hidden_dim, s.n_parts, s.part_begin, &s.hidden_begin, &unused);
    tsr_parallel_hidden_chunk(c->hidden_dim, s.n_parts, s.part_end - 1, &unused, &s.hidden_end);
    tsr_parallel_split(c->n_layers, l->pp, s.pp_rank, &s.layer_begin, &s.layer_end);
    s.expert_end = c->n_experts; /* expert parallelism narrows it (runtime/engine/dist.c) */
    s.first_stage = s.pp_rank == 0;
    s.last_stage = s.pp_rank == l->pp - 1;
    *out = s;
    return TSR_OK;
}

int tsr_parallel_shard_format(const tsr_parallel_shard *s, char *buf, int cap) {
    return snprintf(buf, (size_t)(cap > 0 ? cap : 0),
                    "rank %d (tp %d, pp %d): heads %d-%d, kv heads %d-%d%s, hidden cols %d-%d, "
                    "layers %d-%d%s%s",
                    s->rank, s->tp_rank, s->pp_rank, s->head_begin, s->head_end - 1,
                    s->kv_head_begin, s->kv_head_end - 1, s->kv_replicated ? " (replicated)" : "",
                    s->hidden_begin, s->hidden_end - 1, s->layer_begin, s->layer_end - 1,
                    s->first_stage ? ", embeds" : "", s->last_stage ? ", classifier" : "");
}

tsr_status tsr_parallel_shard_whole(const tsr_model_config *c, tsr_parallel_shard *out) {
    tsr_parallel_layout l;
    TSR_TRY(tsr_parallel_layout_init(1, 1, 1, &l));
    return tsr_parallel_shard_of(&l, c, 0, NULL, out);
}

void tsr_parallel_shard_segments(const tsr_parallel_shard *s, const tsr_model_config *c,
                                 int32_t *wo_seg, int32_t *down_seg) {
    int n = s->part_end - s->part_begin;
    for (int i = 0; i <= n; i++) {
        if (wo_seg) wo_seg[i] = i * c->head_dim;
        if (down_seg) {
            /* part i starts where chunk part_begin + i starts; the last entry is the end */
            int b, e;
            tsr_parallel_hidden_chunk(c->hidden_dim, s->n_parts,
                                      s->part_begin + (i < n ? i : n - 1), &b, &e);
            down_seg[i] = (i < n ? b : e) - s->hidden_begin;
        }
    }
}

/* Rows [r0, r1) of t, as a view (the GGUF-block dtypes, kernels/cpu/quant_blocks.h: a view
 * of whole 16-row groups, else a repacked copy). */
static tsr_status tsr__rows(tsr_model *m, tsr_tensor *t, int64_t r0, int64_t r1) {
    if (t->dtype == TSR_F8_E4M3 && t->data) return tsr_fp8_slice(m, t, r0, r1, 0, t->cols);
    if (tsr_qblocks_is(t->dtype) && t->data) {
        tsr_tensor s = {.dtype = t->dtype, .rows = r1 - r0, .cols = t->cols};
        if (r0 % TSR_QBLOCKS_GROUP == 0) {
            s.data = (const char *)t->data + (size_t)(r0 / TSR_QBLOCKS_GROUP) *
                                                 tsr_qblocks_group_bytes(t->dtype, t->cols);
        } else {
            void *dst;
            TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&s), &dst));
            TSR_TRY(tsr_qblocks_slice(t, r0, r1, 0, t->cols, dst));
            s.data = dst;
        }
        *t = s;
        return TSR_OK;
    }
    t->data = tsr_tensor_row(t, r0);
    t->rows = r1 - r0;
    return TSR_OK;
}

/* Columns [c0, c1) of t, copied into model-owned memory. */
static tsr_status tsr__cols(tsr_model *m, tsr_tensor *t, int64_t c0, int64_t c1) {
    if (t->dtype == TSR_F8_E4M3 && t->data) return tsr_fp8_slice(m, t, 0, t->rows, c0, c1);
    if (tsr_qblocks_is(t->dtype) && t->data) { /* c0, c1 on the type's blocks: the loaders' */
        tsr_tensor s = {.dtype = t->dtype, .rows = t->rows, .cols = c1 - c0};
        void *dst;
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&s), &dst));
        TSR_TRY(tsr_qblocks_slice(t, 0, t->rows, c0, c1, dst));
        s.data = dst;
        *t = s;
        return TSR_OK;
    }
    size_t es = tsr_dtype_size(t->dtype), w = (size_t)(c1 - c0) * es;
    void *dst;
    TSR_TRY(tsr_model_alloc(m, (size_t)t->rows * w, &dst));
    for (int64_t r = 0; r < t->rows; r++)
        memcpy((char *)dst + (size_t)r * w, (const char *)tsr_tensor_row(t, r) + (size_t)c0 * es,
               w);
    t->data = dst;
    t->cols = c1 - c0;
    return TSR_OK;
}

tsr_status tsr_parallel_shard_model(tsr_model *m, const tsr_parallel_shard *s) {
    const tsr_model_config *c = &m->cfg;
    int hd = c->head_dim;
    bool split = s->head_begin != 0 || s->head_end != c->n_heads;
    for (int l = 0; l < c->n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        if (l < s->layer_begin || l >= s->layer_end) {
            memset(w, 0, sizeof *w); /* another stage's layer: never read */
            continue;
        }
        if (!split) continue;
        /* fused tensors (runtime/model/fuse.h) hold every head: the rank fuses its own rows
         * again after the cut; the parts are views of them, so they stay valid */
        w->wqkv = w->bqkv = w->w_gate_up = (tsr_tensor){0};
        TSR_TRY(tsr__rows(m, &w->wq, (int64_t)s->head_begin * hd, (int64_t)s->head_end * hd));
        TSR_TRY(tsr__rows(m, &w->wk, (int64_t)s->kv_head_begin * hd, (int64_t)s->kv_head_end * hd));
        TSR_TRY(tsr__rows(m, &w->wv, (int64_t)s->kv_head_begin * hd, (int64_t)s->kv_head_end * hd));
        if (c->qkv_bias) { /* [1, width] vectors: the head slice is a view into the row */
            w->bq.data = (float *)w->bq.data + (int64_t)s->head_begin * hd;
            w->bq.cols = (int64_t)(s->head_end - s->head_begin) * hd;
            w->bk.data = (float *)w->bk.data + (int64_t)s->kv_head_begin * hd;
            w->bk.cols = (int64_t)(s->kv_head_end - s->kv_head_begin) * hd;
            w->bv.data = (float *)w->bv.data + (int64_t)s->kv_head_begin * hd;
            w->bv.cols = w->bk.cols;
        }
        TSR_TRY(tsr__cols(m, &w->wo, (int64_t)s->head_begin * hd, (int64_t)s->head_end * hd));
        if (c->n_experts > 0) continue; /* GPT-OSS: router and experts replicated per rank */
        TSR_TRY(tsr__rows(m, &w->w_gate, s->hidden_begin, s->hidden_end));
        TSR_TRY(tsr__rows(m, &w->w_up, s->hidden_begin, s->hidden_end));
        TSR_TRY(tsr__cols(m, &w->w_down, s->hidden_begin, s->hidden_end));
    }
    return TSR_OK;
}
