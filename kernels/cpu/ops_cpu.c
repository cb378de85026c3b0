/* Row-wise and elementwise ops: rmsnorm, rope (incl. Llama-3.1 scaling), swiglu, add,
 * embed. They follow PyTorch's float32 arithmetic step by step (same rounding points, no
 * fused multiply-adds) so that outputs match a Hugging Face reference closely. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/kv_dtype.h"
#include "kernels/rope_freq.h"
#include "base/alloc.h"

/* Elementwise loops shorter than this stay on one thread (a 2-thread OpenMP region costs
 * a few us; 15M prefill rows of 128 x 288 = 36K elements gain from 2 threads). */
#define TSR__CPU_EW_PAR_MIN 16384
/* Elements per OpenMP work item in the SIMD elementwise loops. */
#define TSR__CPU_EW_CHUNK 4096

static float tsr__w_at(const tsr_tensor *w, int64_t i) {
    switch (w->dtype) {
    case TSR_F32: return ((const float *)w->data)[i];
    case TSR_BF16: return tsr_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case TSR_F16: return tsr_f16_to_f32(((const uint16_t *)w->data)[i]);
    case TSR_U8: return (float)((const uint8_t *)w->data)[i];
    case TSR_Q8_0: /* matrices only; norm weights are f32 */
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_Q4_K:
    case TSR_Q5_K:
    case TSR_Q6_K:
    case TSR_F8_E4M3:
    case TSR_MXFP4: break;
    }
    return 0.0f;
}

/* One row of rmsnorm. */
static void tsr__rmsnorm_row(const tsr__cpu_kernels *k, const float *xr, const tsr_tensor *w,
                             int dim, float eps, float *o) {
    const float *wf = w->dtype == TSR_F32 ? w->data : NULL;
    if (wf && k->rmsnorm_f32) {
        k->rmsnorm_f32(xr, wf, dim, eps, o);
        return;
    }
    /* Sum of squares in double: the correctly rounded f32 mean, which is what torch's
     * pairwise f32 reduction approximates. */
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= dim; i += 4) {
        s0 += (double)xr[i] * xr[i];
        s1 += (double)xr[i + 1] * xr[i + 1];
        s2 += (double)xr[i + 2] * xr[i + 2];
        s3 += (double)xr[i + 3] * xr[i + 3];
    }
    for (; i < dim; i++) s0 += (double)xr[i] * xr[i];
    float var = (float)(((s0 + s1) + (s2 + s3)) / dim);
    float rs = 1.0f / sqrtf(var + eps);
    if (wf) {
        for (i = 0; i < dim; i++) o[i] = (xr[i] * rs) * wf[i];
    } else {
        for (i = 0; i < dim; i++) o[i] = (xr[i] * rs) * tsr__w_at(w, i);
    }
}

tsr_status tsr__cpu_rmsnorm(tsr_backend *be, const float *x, const tsr_tensor *w, int64_t n,
                            int dim, float eps, float *out) {
    tsr__cpu_ctx *c = be->ctx;
    if (dim <= 0 || n < 0 || !w || w->rows * w->cols < dim)
        return tsr_error_set(TSR_ERR_INVALID, "cpu rmsnorm: bad shape (dim=%d)", dim);
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    /* Serial loops stay outside OpenMP: even a region with if(0) costs ~0.7 us and a futex
     * call; a 260K-model decode step has ~80 such calls. */
    if (!(c->threads > 1 && n * dim >= TSR__CPU_EW_PAR_MIN)) {
        for (int64_t r = 0; r < n; r++)
            tsr__rmsnorm_row(k, x + (size_t)r * (size_t)dim, w, dim, eps,
                             out + (size_t)r * (size_t)dim);
        return TSR_OK;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t r = 0; r < n; r++)
        tsr__rmsnorm_row(k, x + (size_t)r * (size_t)dim, w, dim, eps,
                         out + (size_t)r * (size_t)dim);
    return TSR_OK;
}

/* inv_freq cached per rope parameters (the forward calls rope twice per layer). */
static tsr_status tsr__rope_table(tsr__cpu_ctx *c, const tsr_model_config *cfg,
                                  const float **out) {
    float params[7] = {cfg->rope_factor,    cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                       cfg->rope_beta_fast, cfg->rope_beta_slow,       tsr_rope_cos_scale(cfg),
                       (float)cfg->rope_truncate};
    int scaling = (int)cfg->rope_scaling;
    if (!c->inv_freq || c->inv_freq_hd != cfg->head_dim ||
        c->inv_freq_theta != cfg->rope_theta || c->inv_freq_scaling != scaling ||
        (scaling && (memcmp(params, c->inv_freq_params, sizeof params) != 0 ||
                     c->inv_freq_orig != cfg->rope_original_max_pos))) {
        TSR_TRY(tsr__cpu_scratch(&c->inv_freq, &c->inv_freq_cap, (size_t)cfg->head_dim));
        tsr_rope_inv_freq(cfg, c->inv_freq);
        c->inv_freq_hd = cfg->head_dim;
        c->inv_freq_theta = cfg->rope_theta;
        c->inv_freq_scaling = scaling;
        memcpy(c->inv_freq_params, params, sizeof params);
        c->inv_freq_orig = cfg->rope_original_max_pos;
        c->rope_n = -1; /* the angles follow inv_freq */
    }
    *out = c->inv_freq;
    return TSR_OK;
}

/* cos and sin of pos[r] * inv_freq[j] for n positions, [n][half] each, kept for the next
 * call at the same positions: the forward ropes q and k of every layer at one position
 * list, and cosf/sinf were ~2 % of a stories260K prefill. Same values as computing them
 * per call. */
static void tsr__rope_angle_row(float *t, const int32_t *pos, int64_t r, int half,
                                const float *inv_freq, float sc) {
    float *cr = t + (size_t)r * (size_t)half * 2, *sr = cr + half;
    float p = (float)pos[r];
    for (int j = 0; j < half; j++) { /* sc: YaRN's attention factor, else 1 (exact) */
        float a = p * inv_freq[j];
        cr[j] = cosf(a) * sc;
        sr[j] = sinf(a) * sc;
    }
}

static tsr_status tsr__rope_angles(tsr__cpu_ctx *c, const int32_t *pos, int64_t n, int half,
                                   const float *inv_freq, float sc, const float **cs) {
    if (c->rope_n == n && c->rope_half == half &&
        (n == 0 || memcmp(c->rope_pos, pos, (size_t)n * sizeof *pos) == 0)) {
        *cs = c->rope_cs;
        return TSR_OK;
    }
    c->rope_n = -1;
    TSR_TRY(tsr__cpu_scratch(&c->rope_cs, &c->rope_cs_cap, (size_t)n * (size_t)half * 2));
    if (n > c->rope_pos_cap) {
        int32_t *np = tsr_realloc(c->rope_pos, (size_t)n * sizeof *np);
        if (!np) return TSR_ERR_NOMEM;
        c->rope_pos = np;
        c->rope_pos_cap = n;
    }
    float *t = c->rope_cs;
    if (c->threads > 1 && n * half >= TSR__CPU_EW_PAR_MIN / 8) { /* cosf + sinf: ~8x an add */
#pragma omp parallel for num_threads(c->threads) schedule(static)
        for (int64_t r = 0; r < n; r++) tsr__rope_angle_row(t, pos, r, half, inv_freq, sc);
    } else {
        for (int64_t r = 0; r < n; r++) tsr__rope_angle_row(t, pos, r, half, inv_freq, sc);
    }
    if (n) memcpy(c->rope_pos, pos, (size_t)n * sizeof *pos);
    c->rope_n = n;
    c->rope_half = half;
    *cs = t;
    return TSR_OK;
}

/* rope of one row (n_heads heads) with its angles' cos cs[0..half) and sin sn[0..half). */
static void tsr__rope_row(float *xr, const float *cs, const float *sn, int n_heads, int hd,
                          int inter) {
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = xr + (size_t)h * (size_t)hd;
        if (inter) {
            for (int j = 0; j < half; j++) {
                float a = v[2 * j], b = v[2 * j + 1];
                v[2 * j] = a * cs[j] - b * sn[j];
                v[2 * j + 1] = a * sn[j] + b * cs[j];
            }
        } else {
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * cs[j] - b * sn[j];
                v[j + half] = b * cs[j] + a * sn[j];
            }
        }
    }
}

tsr_status tsr__cpu_rope(tsr_backend *be, float *x, const int32_t *pos, int64_t n,
                         int n_heads, const tsr_model_config *cfg) {
    tsr__cpu_ctx *c = be->ctx;
    int hd = cfg->head_dim;
    if (hd <= 0 || (hd & 1) || hd > TSR__CPU_MAX_HEAD_DIM || n_heads <= 0 || n < 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu rope: head_dim %d (even, <= %d)", hd,
                             TSR__CPU_MAX_HEAD_DIM);
    if (cfg->rope_scaling == TSR_ROPE_LLAMA3 &&
        (cfg->rope_factor <= 0 || cfg->rope_original_max_pos <= 0 ||
         cfg->rope_high_freq_factor == cfg->rope_low_freq_factor))
        return tsr_error_set(TSR_ERR_INVALID, "cpu rope: bad llama3 scaling parameters");
    const float *inv_freq, *cs;
    TSR_TRY(tsr__rope_table(c, cfg, &inv_freq));
    int inter = cfg->rope_interleaved, half = hd / 2;
    TSR_TRY(tsr__rope_angles(c, pos, n, half, inv_freq, tsr_rope_cos_scale(cfg), &cs));
    size_t ld = (size_t)n_heads * (size_t)hd;
    if (!(c->threads > 1 && n * n_heads * hd >= TSR__CPU_EW_PAR_MIN)) {
        for (int64_t r = 0; r < n; r++) {
            const float *cr = cs + (size_t)r * (size_t)half * 2;
            tsr__rope_row(x + (size_t)r * ld, cr, cr + half, n_heads, hd, inter);
        }
        return TSR_OK;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const float *cr = cs + (size_t)r * (size_t)half * 2;
        tsr__rope_row(x + (size_t)r * ld, cr, cr + half, n_heads, hd, inter);
    }
    return TSR_OK;
}

/* One token of qkv_rope: the steps of bias_add, rmsnorm per head, rope and kv_write on the
 * row's copies, each with the function those ops use, so the same bits. */
static void tsr__qkv_rope_row(const tsr__cpu_kernels *k, const tsr_qkv_rope_args *a,
                              const float *cs, float *kvrow, int64_t r) {
    const tsr_model_config *cfg = a->cfg;
    const int hd = cfg->head_dim, half = hd / 2;
    const size_t qd = (size_t)a->n_heads * (size_t)hd, kvd = (size_t)a->n_kv_heads * (size_t)hd;
    const float *src = a->qkv + (size_t)r * (qd + 2 * kvd);
    float *qo = a->q + (size_t)r * qd;
    float *ko = a->lay ? kvrow : a->k + (size_t)r * kvd;
    float *vo = a->lay ? kvrow + kvd : a->v + (size_t)r * kvd;
    memcpy(qo, src, qd * sizeof *qo);
    memcpy(ko, src + qd, kvd * sizeof *ko);
    memcpy(vo, src + qd + kvd, kvd * sizeof *vo);
    if (a->bias) {
        const float *b = a->bias->data;
#pragma omp simd
        for (size_t j = 0; j < qd; j++) qo[j] += b[j];
#pragma omp simd
        for (size_t j = 0; j < kvd; j++) ko[j] += b[qd + j];
#pragma omp simd
        for (size_t j = 0; j < kvd; j++) vo[j] += b[qd + kvd + j];
    }
    if (a->q_norm) {
        for (int h = 0; h < a->n_heads; h++)
            tsr__rmsnorm_row(k, qo + (size_t)h * hd, a->q_norm, hd, cfg->norm_eps,
                             qo + (size_t)h * hd);
        for (int h = 0; h < a->n_kv_heads; h++)
            tsr__rmsnorm_row(k, ko + (size_t)h * hd, a->k_norm, hd, cfg->norm_eps,
                             ko + (size_t)h * hd);
    }
    const float *cr = cs + (size_t)r * (size_t)half * 2;
    tsr__rope_row(qo, cr, cr + half, a->n_heads, hd, cfg->rope_interleaved);
    tsr__rope_row(ko, cr, cr + half, a->n_kv_heads, hd, cfg->rope_interleaved);
    if (a->lay) {
        const tsr_kv_layout *lay = a->lay;
        tsr_kv_rows_encode(lay->dtype, ko, lay->row, tsr_kv_layout_row(lay, 0, a->slots[r]), 1,
                           lay->row);
        tsr_kv_rows_encode(lay->dtype, vo, lay->row, tsr_kv_layout_row(lay, 1, a->slots[r]), 1,
                           lay->row);
    }
}

tsr_status tsr__cpu_qkv_rope(tsr_backend *be, const tsr_qkv_rope_args *a) {
    tsr__cpu_ctx *c = be->ctx;
    const tsr_model_config *cfg = a->cfg;
    int hd = cfg->head_dim;
    if (hd <= 0 || (hd & 1) || hd > TSR__CPU_MAX_HEAD_DIM || a->n_heads <= 0 ||
        a->n_kv_heads <= 0 || a->n < 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu qkv_rope: head_dim %d (even, <= %d)", hd,
                             TSR__CPU_MAX_HEAD_DIM);
    int64_t kvd = (int64_t)a->n_kv_heads * hd, ld = (int64_t)a->n_heads * hd + 2 * kvd;
    if (a->bias && (a->bias->dtype != TSR_F32 || a->bias->rows != 1 || a->bias->cols != ld))
        return tsr_error_set(TSR_ERR_INVALID, "qkv_rope: the bias must be an f32 [1, %lld]",
                             (long long)ld);
    if (!a->q_norm != !a->k_norm)
        return tsr_error_set(TSR_ERR_INVALID, "qkv_rope: q_norm and k_norm come together");
    if (a->lay && (a->lay->row != kvd || !a->slots))
        return tsr_error_set(TSR_ERR_INVALID, "qkv_rope: KV rows of %d, the heads make %lld",
                             (int)a->lay->row, (long long)kvd);
    if (cfg->rope_scaling == TSR_ROPE_LLAMA3 &&
        (cfg->rope_factor <= 0 || cfg->rope_original_max_pos <= 0 ||
         cfg->rope_high_freq_factor == cfg->rope_low_freq_factor))
        return tsr_error_set(TSR_ERR_INVALID, "cpu qkv_rope: bad llama3 scaling parameters");
    if (a->n == 0) return TSR_OK;
    const float *inv_freq, *cs;
    TSR_TRY(tsr__rope_table(c, cfg, &inv_freq));
    TSR_TRY(tsr__rope_angles(c, a->pos, a->n, hd / 2, inv_freq, tsr_rope_cos_scale(cfg), &cs));
    float *kv = NULL;
    if (a->lay) {
        TSR_TRY(tsr__cpu_scratch(&c->qkv_kv, &c->qkv_kv_cap, (size_t)a->n * 2 * (size_t)kvd));
        kv = c->qkv_kv;
    }
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    if (!(c->threads > 1 && a->n * ld >= TSR__CPU_EW_PAR_MIN)) {
        for (int64_t r = 0; r < a->n; r++)
            tsr__qkv_rope_row(k, a, cs, kv ? kv + (size_t)r * 2 * (size_t)kvd : NULL, r);
        return TSR_OK;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t r = 0; r < a->n; r++)
        tsr__qkv_rope_row(k, a, cs, kv ? kv + (size_t)r * 2 * (size_t)kvd : NULL, r);
    return TSR_OK;
}

/* Row by row: the gate half copied out, then the kernel swiglu runs (elementwise, so the
 * bits of swiglu on the whole halves). */
tsr_status tsr__cpu_swiglu_fused(tsr_backend *be, const float *gu, int64_t n, int hidden,
                                 float *out) {
    tsr__cpu_ctx *c = be->ctx;
    if (n < 0 || hidden <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "swiglu_fused: bad shape (hidden %d)", hidden);
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    size_t h = (size_t)hidden;
    if (!(c->threads > 1 && n * hidden >= TSR__CPU_EW_PAR_MIN && n > 1)) {
        for (int64_t r = 0; r < n; r++) {
            memcpy(out + (size_t)r * h, gu + (size_t)r * 2 * h, h * sizeof *out);
            k->silu_mul(out + (size_t)r * h, gu + (size_t)r * 2 * h + h, hidden);
        }
        return TSR_OK;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        memcpy(out + (size_t)r * h, gu + (size_t)r * 2 * h, h * sizeof *out);
        k->silu_mul(out + (size_t)r * h, gu + (size_t)r * 2 * h + h, hidden);
    }
    return TSR_OK;
}

tsr_status tsr__cpu_swiglu(tsr_backend *be, float *gate, const float *up, int64_t n) {
    tsr__cpu_ctx *c = be->ctx;
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    /* Fixed chunks: the result does not depend on the split, and the chunks keep SIMD. */
    int64_t nch = (n + TSR__CPU_EW_CHUNK - 1) / TSR__CPU_EW_CHUNK;
    if (!(c->threads > 1 && n >= TSR__CPU_EW_PAR_MIN && nch > 1)) {
        k->silu_mul(gate, up, n); /* elementwise: the same values as the chunked loop */
        return TSR_OK;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t b = 0; b < nch; b++) {
        int64_t i0 = b * TSR__CPU_EW_CHUNK;
        int64_t m = n - i0 < TSR__CPU_EW_CHUNK ? n - i0 : TSR__CPU_EW_CHUNK;
        k->silu_mul(gate + i0, up + i0, m);
    }
    return TSR_OK;
}

/* `omp simd`: GCC's -O2 cost model leaves this loop scalar (x and y might overlap), which
 * made the residual adds ~4 % of a stories260K prefill. Elementwise, so the same values. */
tsr_status tsr__cpu_add(tsr_backend *be, float *x, const float *y, int64_t n) {
    tsr__cpu_ctx *c = be->ctx;
    if (!(c->threads > 1 && n >= TSR__CPU_EW_PAR_MIN)) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) x[i] += y[i];
        return TSR_OK;
    }
#pragma omp parallel for simd num_threads(c->threads) schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
    return TSR_OK;
}

tsr_status tsr__cpu_bias_add(tsr_backend *be, float *x, const tsr_tensor *b, int64_t n) {
    (void)be; /* a bias is a few thousand floats a row: one thread keeps up */
    if (b->dtype != TSR_F32 || b->rows != 1)
        return tsr_error_set(TSR_ERR_INVALID, "bias_add: the bias must be an f32 [1, width]");
    const float *bb = b->data;
    int64_t w = b->cols;
    for (int64_t r = 0; r < n; r++) {
        float *xr = x + r * w;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) xr[j] += bb[j];
    }
    return TSR_OK;
}

tsr_status tsr__cpu_embed(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids,
                          int64_t n, float *out) {
    (void)be;
    const tsr__cpu_kernels *k = tsr__cpu_kernels_get();
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= emb->rows)
            return tsr_error_set(TSR_ERR_INVALID, "cpu embed: token id %d out of range [0, %lld)",
                                 (int)ids[i], (long long)emb->rows);
    }
    int64_t d = emb->cols;
    for (int64_t i = 0; i < n; i++) {
        float *o = out + (size_t)i * (size_t)d;
        switch (emb->dtype) {
        case TSR_F32: memcpy(o, tsr_tensor_row(emb, ids[i]), (size_t)d * 4); break;
        case TSR_BF16: k->cvt_bf16(tsr_tensor_row(emb, ids[i]), o, d); break;
        case TSR_F16: k->cvt_f16(tsr_tensor_row(emb, ids[i]), o, d); break;
        case TSR_U8: tsr_dtype_to_f32(TSR_U8, tsr_tensor_row(emb, ids[i]), o, (size_t)d); break;
        case TSR_Q8_0:
        case TSR_Q4_0:
        case TSR_Q4_1:
        case TSR_Q4_K:
        case TSR_Q5_K:
        case TSR_Q6_K: /* GGUF's dequantization of the row from its repacked groups */
            tsr_qblocks_row_f32(emb, ids[i], o);
            break;
        case TSR_F8_E4M3: /* never an embedding (runtime/model/fp8.h) */
        case TSR_MXFP4: break; /* experts only */
        }
    }
    return TSR_OK;
}
