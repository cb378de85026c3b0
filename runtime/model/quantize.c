#include "runtime/model/quantize.h"

#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/log.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_q4.h"
#include "kernels/cpu/quant_q8.h"

bool tsr_model_q8_eligible(const tsr_model_config *c, const char *which, int64_t cols) {
    if (cols <= 0 || cols % TSR_Q8_BLOCK) return false;
    /* matmul_parts sums wo over heads and w_down over hidden chunks (runtime/exec/
     * parallel.h): whole 32-column units only when head_dim is one and there are at least
     * n_heads units of the hidden width */
    if (!strcmp(which, "wo")) return c->head_dim % TSR_Q8_BLOCK == 0;
    if (!strcmp(which, "w_down"))
        return c->hidden_dim % TSR_Q8_BLOCK == 0 && c->hidden_dim / TSR_Q8_BLOCK >= c->n_heads;
    return true;
}

/* One matrix into qt (Q8_0, Q4_0 or Q4_1), or into BF16 when not eligible (kept as it is if
 * already 16-bit). */
static tsr_status tsr__quantize(tsr_model *m, tsr_tensor *t, bool q8, tsr_dtype qt) {
    /* Q8_0 stays; so do a GGUF's 4-, 5- and 6-bit matrices (fewer bytes, their own kernels) */
    if (!t->data || t->rows <= 0 || t->cols <= 0 || t->dtype == TSR_Q8_0 ||
        t->dtype == TSR_Q4_0 || t->dtype == TSR_Q4_1 || t->dtype == TSR_Q4_K ||
        t->dtype == TSR_Q5_K || t->dtype == TSR_Q6_K)
        return TSR_OK;
    if (q8) {
        tsr_tensor q = {.dtype = qt, .rows = t->rows, .cols = t->cols};
        void *dst;
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &dst));
        /* in slabs of whole 16-row groups, each slab's source dropped once quantized, so
         * that at the end only the quantized weights are resident */
        size_t row_bytes = (size_t)t->cols * tsr_dtype_size(t->dtype);
        int64_t slab = (int64_t)(((size_t)1 << 20) / row_bytes / TSR_Q8_GROUP + 1) * TSR_Q8_GROUP;
        for (int64_t r0 = 0; r0 < t->rows; r0 += slab) {
            int64_t n = t->rows - r0 < slab ? t->rows - r0 : slab;
            tsr_tensor src = {.dtype = t->dtype, .rows = n, .cols = t->cols,
                              .data = tsr_tensor_row(t, r0)};
            tsr_tensor part = {.dtype = qt, .rows = r0, .cols = t->cols};
            void *out = (char *)dst + tsr_tensor_bytes(&part);
            TSR_TRY(qt == TSR_Q8_0 ? tsr_q8_quantize_tensor(&src, out)
                                   : tsr_q4_quantize_tensor(&src, qt, out));
            tsr_pages_drop(src.data, (size_t)n * row_bytes);
        }
        q.data = dst;
        *t = q;
        return TSR_OK;
    }
    if (t->dtype != TSR_F32) return TSR_OK;
    uint16_t *dst;
    size_t n = (size_t)t->rows * (size_t)t->cols;
    TSR_TRY(tsr_model_alloc(m, n * 2, (void **)&dst));
    const float *src = t->data;
    for (size_t i = 0; i < n; i++) dst[i] = tsr_f32_to_bf16(src[i]);
    tsr_pages_drop(src, n * sizeof *src);
    t->data = dst;
    t->dtype = TSR_BF16;
    return TSR_OK;
}

tsr_status tsr_model_quantize(tsr_model *m, tsr_dtype dt) {
    const tsr_model_config *c = &m->cfg;
    if (dt != TSR_Q8_0 && dt != TSR_Q4_0 && dt != TSR_Q4_1)
        return tsr_error_set(TSR_ERR_INVALID, "quantize: %s is no quantized dtype",
                             tsr_dtype_name(dt));
    bool tied = m->classifier.data && m->classifier.data == m->tok_emb.data;
    TSR_TRY(tsr__quantize(m, &m->tok_emb, tsr_model_q8_eligible(c, "tok_emb", m->tok_emb.cols),
                          TSR_Q8_0));
    if (tied)
        m->classifier = m->tok_emb;
    else
        TSR_TRY(tsr__quantize(m, &m->classifier,
                              tsr_model_q8_eligible(c, "classifier", m->classifier.cols),
                              TSR_Q8_0));
    for (int l = 0; l < c->n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        tsr_tensor *ts[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        const char *names[] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            TSR_TRY(tsr__quantize(m, ts[i], tsr_model_q8_eligible(c, names[i], ts[i]->cols),
                                  dt));
    }
    m->cfg.dtype = dt;
    return TSR_OK;
}

tsr_status tsr_model_quantize_q8(tsr_model *m) { return tsr_model_quantize(m, TSR_Q8_0); }

static bool tsr__gguf_block(tsr_dtype t) {
    return t == TSR_Q4_0 || t == TSR_Q4_1 || t == TSR_Q4_K || t == TSR_Q5_K || t == TSR_Q6_K;
}

/* One such matrix into Q8_0 (q8) or BF16 through f32 rows, 16-row groups at a time, the
 * source's pages given back at the end. */
static tsr_status tsr__requant(tsr_model *m, tsr_tensor *t, bool q8) {
    tsr_tensor q = {.dtype = q8 ? TSR_Q8_0 : TSR_BF16, .rows = t->rows, .cols = t->cols};
    void *dst;
    TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &dst));
    enum { SLAB = 4 * TSR_Q8_GROUP };
    float *rows = tsr_malloc((size_t)SLAB * (size_t)t->cols * sizeof *rows);
    if (!rows) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory requantizing a matrix",
                                    m->source);
    tsr_status st = TSR_OK;
    for (int64_t r0 = 0; r0 < t->rows && st == TSR_OK; r0 += SLAB) {
        int64_t n = t->rows - r0 < SLAB ? t->rows - r0 : SLAB;
        for (int64_t r = 0; r < n; r++) tsr_qblocks_row_f32(t, r0 + r, rows + r * t->cols);
        if (q8) {
            tsr_tensor src = {.dtype = TSR_F32, .rows = n, .cols = t->cols, .data = rows};
            tsr_tensor part = {.dtype = TSR_Q8_0, .rows = r0, .cols = t->cols};
            st = tsr_q8_quantize_tensor(&src, (char *)dst + tsr_tensor_bytes(&part));
        } else {
            uint16_t *o = (uint16_t *)dst + (size_t)r0 * (size_t)t->cols;
            for (int64_t i = 0; i < n * t->cols; i++) o[i] = tsr_f32_to_bf16(rows[i]);
        }
    }
    tsr_free(rows);
    TSR_TRY(st);
    tsr_model_discard(m, t->data, tsr_tensor_bytes(t)); /* never read again */
    q.data = dst;
    *t = q;
    return TSR_OK;
}

/* t requantized if it is in GGUF blocks; counted in n[0] (Q8_0) or n[1] (BF16). */
static tsr_status tsr__requant_if(tsr_model *m, tsr_tensor *t, const char *which, int n[2]) {
    if (!t->data || t->rows <= 0 || t->cols <= 0 || !tsr__gguf_block(t->dtype)) return TSR_OK;
    bool q8 = tsr_model_q8_eligible(&m->cfg, which, t->cols);
    TSR_TRY(tsr__requant(m, t, q8));
    n[!q8]++;
    return TSR_OK;
}

tsr_status tsr_model_blocks_to_q8(tsr_model *m, const char *why) {
    int n[2] = {0, 0};
    bool tied = m->classifier.data && m->classifier.data == m->tok_emb.data;
    TSR_TRY(tsr__requant_if(m, &m->tok_emb, "tok_emb", n));
    if (tied)
        m->classifier = m->tok_emb;
    else
        TSR_TRY(tsr__requant_if(m, &m->classifier, "classifier", n));
    static const char *const names[7] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        tsr_tensor *ts[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++) TSR_TRY(tsr__requant_if(m, ts[i], names[i], n));
    }
    if (!n[0] && !n[1]) return TSR_OK;
    if (tsr__gguf_block(m->cfg.dtype)) m->cfg.dtype = TSR_Q8_0;
    TSR_LOG_WARN("%s: 3- to 6-bit GGUF matrices run as Q8_0 (%s): %d requantized (8.5 bits "
                 "a weight; Q8_0's rounding on top of the file's), %d expanded to bf16",
                 m->source, why, n[0], n[1]);
    return TSR_OK;
}

/* One expert projection: expert by expert into the packed tensor, each expert's source
 * bytes given back once packed (as tsr__quantize's slabs). */
static tsr_status tsr__pack_experts(tsr_model *m, tsr_experts *x) {
    if (!x->mxfp4 || !x->w.data || x->n <= 0 || x->rows % TSR_Q4_GROUP || x->cols % TSR_Q4_BLOCK)
        return TSR_OK;
    tsr_tensor q = {.dtype = TSR_MXFP4, .rows = (int64_t)x->n * x->rows, .cols = x->cols};
    tsr_tensor one = {.dtype = TSR_MXFP4, .rows = x->rows, .cols = x->cols};
    size_t per = tsr_tensor_bytes(&one);
    size_t bb = (size_t)x->rows * (size_t)(x->cols / 2), sb = (size_t)x->rows * (size_t)(x->cols / 32);
    void *dst;
    TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &dst));
    for (int e = 0; e < x->n; e++) {
        const uint8_t *blocks = (const uint8_t *)x->w.data + (size_t)e * bb;
        const uint8_t *scales = (const uint8_t *)x->scales.data + (size_t)e * sb;
        tsr_q4_pack_mxfp4(blocks, scales, x->rows, x->cols, (char *)dst + (size_t)e * per);
        tsr_pages_drop(blocks, bb);
        tsr_pages_drop(scales, sb);
    }
    q.data = dst;
    x->w = q;
    x->scales = (tsr_tensor){.dtype = TSR_U8};
    x->mxfp4 = 0;
    return TSR_OK;
}

tsr_status tsr_model_pack_experts(tsr_model *m) {
    int packed = 0, kept = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_experts *x[2] = {&m->layers[l].gate_up, &m->layers[l].down};
        for (int i = 0; i < 2; i++) {
            bool was = x[i]->mxfp4 && x[i]->w.data;
            TSR_TRY(tsr__pack_experts(m, x[i]));
            packed += was && !x[i]->mxfp4;
            kept += was && x[i]->mxfp4;
        }
    }
    if (packed || kept)
        TSR_LOG_INFO("%s: MXFP4 experts with 8-bit activations: %d projections repacked, %d "
                     "kept on the f32 kernel (rows not whole 16-row groups per expert, or "
                     "columns not 32-column blocks)", m->source, packed, kept);
    return TSR_OK;
}
