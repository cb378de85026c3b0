#include "runtime/model/fp8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/log.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/kv_dtype.h"
#include "runtime/model/quantize.h"

/* One config group's "weights" scheme: 8-bit float, tensor or channel strategy. */
static tsr_status tsr__check_scheme(const cJSON *g, const char *path, const char *group) {
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
    if (!cJSON_IsObject(w)) return TSR_OK; /* a group quantizing only activations or KV */
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(w, "type");
    const cJSON *strat = cJSON_GetObjectItemCaseSensitive(w, "strategy");
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 8 || !cJSON_IsString(type) ||
        strcmp(type->valuestring, "float") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: quantization_config group %s: weights of %g-bit %.16s are not "
                             "supported (tessera reads 8-bit float, FP8 E4M3)",
                             path, group, cJSON_IsNumber(bits) ? bits->valuedouble : 0.0,
                             cJSON_IsString(type) ? type->valuestring : "?");
    if (cJSON_IsString(strat) && strcmp(strat->valuestring, "tensor") != 0 &&
        strcmp(strat->valuestring, "channel") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: quantization_config group %s: FP8 strategy \"%.16s\" is not "
                             "supported (tessera reads tensor and channel scales)",
                             path, group, strat->valuestring);
    return TSR_OK;
}

tsr_status tsr_fp8_check_config(const void *cjson_root, const char *path) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive((const cJSON *)cjson_root,
                                                      "quantization_config");
    if (!q || cJSON_IsNull(q)) return TSR_OK;
    const cJSON *qm = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsString(qm) || strcmp(qm->valuestring, "compressed-tensors") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: quantization_config.quant_method \"%.32s\" is not supported "
                             "(tessera reads compressed-tensors FP8)",
                             path, cJSON_IsString(qm) ? qm->valuestring : "(none)");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(q, "format");
    if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, "float-quantized") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: compressed-tensors format \"%.32s\" is not supported (tessera "
                             "reads float-quantized)", path, fmt->valuestring);
    const cJSON *g, *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    cJSON_ArrayForEach(g, groups) TSR_TRY(tsr__check_scheme(g, path, g->string ? g->string : "?"));
    return TSR_OK;
}

/* Scale i of a weight_scale tensor as f32. */
static float tsr__scale_at(const tsr_st_tensor *s, int64_t i) {
    float f;
    size_t es = tsr_dtype_size(s->dtype);
    const uint8_t *p = (const uint8_t *)s->data + (size_t)i * es;
    if (s->dtype == TSR_F32) {
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return s->dtype == TSR_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
}

tsr_status tsr_fp8_from_st(tsr_model *m, const char *file, const tsr_st_tensor *w,
                           const tsr_st_tensor *scale, tsr_tensor *dst) {
    if (w->n_dims != 2 || strcmp(w->st_dtype, "F8_E4M3") != 0)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is not an F8_E4M3 matrix", file,
                             w->name);
    int64_t rows = w->shape[0], cols = w->shape[1];
    if (!scale)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: FP8 tensor %s has no %s_scale", file, w->name,
                             w->name);
    if (!scale->supported)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has dtype %s (F32, F16 or BF16 "
                             "expected)", file, scale->name, scale->st_dtype);
    bool per_tensor = scale->numel == 1;
    bool per_row = scale->numel == rows &&
                   (scale->n_dims == 1 || (scale->n_dims == 2 && scale->shape[1] == 1));
    if (!per_tensor && !per_row)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: tensor %s has %lld values; tessera reads FP8 scales per tensor "
                             "(1) or per output channel (%lld)", file, scale->name,
                             (long long)scale->numel, (long long)rows);
    tsr_tensor t = {.dtype = TSR_F8_E4M3, .rows = rows, .cols = cols};
    void *buf;
    TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&t), &buf));
    memcpy(buf, w->data, (size_t)rows * (size_t)cols);
    float *sc = (float *)((char *)buf + tsr_fp8_scale_offset(rows, cols));
    for (int64_t r = 0; r < rows; r++) {
        float s = tsr__scale_at(scale, per_tensor ? 0 : r);
        if (!isfinite(s) || s < 0.0f)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s holds the scale %g (finite and "
                                 "not negative expected)", file, scale->name, (double)s);
        sc[r] = s;
    }
    t.data = buf;
    *dst = t;
    return TSR_OK;
}

tsr_status tsr_fp8_quantize_tensor(const tsr_tensor *src, void *dst) {
    if (src->dtype != TSR_F32 && src->dtype != TSR_BF16 && src->dtype != TSR_F16)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "fp8: cannot quantize a %s matrix",
                             tsr_dtype_name(src->dtype));
    uint8_t *codes = dst;
    float *sc = (float *)((char *)dst + tsr_fp8_scale_offset(src->rows, src->cols));
    int nomem = 0;
    /* rows in parallel (an 8B model has 7e9 weights to quantize at load) */
#pragma omp parallel reduction(| : nomem)
    {
        float *row = tsr_malloc((size_t)src->cols * sizeof *row);
        nomem |= !row;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < src->rows; r++) {
            if (!row) continue;
            tsr_dtype_to_f32(src->dtype, tsr_tensor_row(src, r), row, (size_t)src->cols);
            float amax = 0.0f;
            for (int64_t c = 0; c < src->cols; c++) amax = fmaxf(amax, fabsf(row[c]));
            /* a division, as torch's (x / scale).to(float8_e4m3fn), not a reciprocal product */
            float s = amax > 0.0f ? amax / TSR_FP8_MAX : 1.0f;
            uint8_t *o = codes + (size_t)r * (size_t)src->cols;
            for (int64_t c = 0; c < src->cols; c++) o[c] = tsr_f32_to_e4m3(row[c] / s);
            sc[r] = s;
        }
        tsr_free(row);
    }
    if (nomem) return tsr_error_set(TSR_ERR_NOMEM, "fp8: out of memory quantizing a matrix");
    return TSR_OK;
}

void tsr_fp8_dequant_row(const tsr_tensor *t, int64_t r, float *out) {
    const uint8_t *codes = (const uint8_t *)t->data + (size_t)r * (size_t)t->cols;
    float s = tsr_fp8_scales(t)[r];
    for (int64_t c = 0; c < t->cols; c++) out[c] = tsr_e4m3_to_f32(codes[c]) * s;
}

tsr_status tsr_fp8_dequantize(tsr_model *m, tsr_tensor *t, tsr_dtype dt) {
    if (t->dtype != TSR_F8_E4M3 || (dt != TSR_F32 && dt != TSR_BF16 && dt != TSR_F16))
        return tsr_error_set(TSR_ERR_INVALID, "fp8: cannot turn a %s tensor into %s",
                             tsr_dtype_name(t->dtype), tsr_dtype_name(dt));
    void *dst;
    size_t es = tsr_dtype_size(dt);
    TSR_TRY(tsr_model_alloc(m, (size_t)t->rows * (size_t)t->cols * es, &dst));
    float *row = tsr_malloc((size_t)t->cols * sizeof *row);
    if (!row) return tsr_error_set(TSR_ERR_NOMEM, "fp8: out of memory dequantizing a matrix");
    for (int64_t r = 0; r < t->rows; r++) {
        tsr_fp8_dequant_row(t, r, row);
        char *o = (char *)dst + (size_t)r * (size_t)t->cols * es;
        for (int64_t c = 0; c < t->cols; c++) {
            if (dt == TSR_F32) {
                memcpy(o + 4 * c, &row[c], 4);
            } else {
                uint16_t h = dt == TSR_BF16 ? tsr_f32_to_bf16(row[c]) : tsr_f32_to_f16(row[c]);
                memcpy(o + 2 * c, &h, 2);
            }
        }
    }
    tsr_free(row);
    t->data = dst;
    t->dtype = dt;
    return TSR_OK;
}

tsr_status tsr_fp8_slice(tsr_model *m, tsr_tensor *t, int64_t r0, int64_t r1, int64_t c0,
                         int64_t c1) {
    if (t->dtype != TSR_F8_E4M3 || r0 < 0 || r1 > t->rows || r1 < r0 || c0 < 0 ||
        c1 > t->cols || c1 < c0)
        return tsr_error_set(TSR_ERR_INVALID, "fp8 slice: rows [%lld, %lld), columns [%lld, "
                             "%lld) of a %lld x %lld %s tensor", (long long)r0, (long long)r1,
                             (long long)c0, (long long)c1, (long long)t->rows,
                             (long long)t->cols, tsr_dtype_name(t->dtype));
    tsr_tensor s = {.dtype = TSR_F8_E4M3, .rows = r1 - r0, .cols = c1 - c0};
    void *buf;
    TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&s), &buf));
    for (int64_t r = r0; r < r1; r++)
        memcpy((uint8_t *)buf + (size_t)(r - r0) * (size_t)s.cols,
               (const uint8_t *)t->data + (size_t)r * (size_t)t->cols + c0, (size_t)s.cols);
    memcpy((char *)buf + tsr_fp8_scale_offset(s.rows, s.cols), tsr_fp8_scales(t) + r0,
           (size_t)s.rows * sizeof(float));
    s.data = buf;
    *t = s;
    return TSR_OK;
}

/* The projection matrices of layer l, and their names for tsr_model_q8_eligible. */
#define TSR__N_MATS 7
static void tsr__layer_mats(tsr_layer_weights *w, tsr_tensor *ts[TSR__N_MATS]) {
    tsr_tensor *all[TSR__N_MATS] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                    &w->w_down};
    memcpy(ts, all, sizeof all);
}
static const char *const tsr__mat_names[TSR__N_MATS] = {"wq",     "wk",   "wv",    "wo",
                                                        "w_gate", "w_up", "w_down"};

bool tsr_model_has_fp8(const tsr_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_tensor *ts[TSR__N_MATS];
        tsr__layer_mats(&m->layers[l], ts);
        for (int i = 0; i < TSR__N_MATS; i++)
            if (ts[i]->dtype == TSR_F8_E4M3 && ts[i]->data) return true;
    }
    return false;
}

tsr_status tsr_model_quantize_fp8(tsr_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_tensor *ts[TSR__N_MATS];
        tsr__layer_mats(&m->layers[l], ts);
        for (int i = 0; i < TSR__N_MATS; i++) {
            tsr_tensor *t = ts[i];
            if (!t->data || t->rows <= 0 || t->cols <= 0 || t->dtype == TSR_F8_E4M3) continue;
            tsr_tensor q = {.dtype = TSR_F8_E4M3, .rows = t->rows, .cols = t->cols};
            void *dst;
            TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &dst));
            TSR_TRY(tsr_fp8_quantize_tensor(t, dst));
            q.data = dst;
            *t = q;
        }
    }
    m->cfg.dtype = TSR_F8_E4M3;
    return TSR_OK;
}

/* One FP8 matrix into Q8_0 (q8) or f32, rows in parallel (each row writes its own bytes of
 * the repacked groups), through per-thread f32 rows and GGUF blocks. */
static tsr_status tsr__to_q8(tsr_model *m, tsr_tensor *t, bool q8) {
    tsr_tensor o = {.dtype = q8 ? TSR_Q8_0 : TSR_F32, .rows = t->rows, .cols = t->cols};
    void *dst;
    TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&o), &dst));
    if (q8) tsr_q8_pack_init(dst, o.rows, o.cols);
    int nomem = 0;
#pragma omp parallel reduction(| : nomem)
    {
        float *row = q8 ? tsr_malloc((size_t)t->cols * sizeof *row) : NULL;
        uint8_t *blocks = q8 ? tsr_malloc((size_t)(t->cols / TSR_Q8_BLOCK + 1) *
                                          TSR_Q8_BLOCK_BYTES) : NULL;
        bool ok = !q8 || (row && blocks);
        nomem |= !ok;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < t->rows; r++) {
            if (!ok) continue;
            float *out = q8 ? row : (float *)dst + (size_t)r * (size_t)t->cols;
            tsr_fp8_dequant_row(t, r, out);
            if (!q8) continue;
            tsr_q8_quantize_blocks(row, t->cols, blocks);
            tsr_q8_pack_row(dst, t->cols, r, blocks);
        }
        tsr_free(row);
        tsr_free(blocks);
    }
    if (nomem)
        return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory converting FP8 weights",
                             m->source);
    o.data = dst;
    *t = o;
    return TSR_OK;
}

tsr_status tsr_model_fp8_to_q8(tsr_model *m, const char *why) {
    if (!tsr_model_has_fp8(m)) return TSR_OK;
    int n_q8 = 0, n_f32 = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_tensor *ts[TSR__N_MATS];
        tsr__layer_mats(&m->layers[l], ts);
        for (int i = 0; i < TSR__N_MATS; i++) {
            tsr_tensor *t = ts[i];
            if (t->dtype != TSR_F8_E4M3 || !t->data || t->rows <= 0) continue;
            bool q8 = tsr_model_q8_eligible(&m->cfg, tsr__mat_names[i], t->cols);
            TSR_TRY(tsr__to_q8(m, t, q8));
            n_q8 += q8;
            n_f32 += !q8;
        }
    }
    if (n_q8) m->cfg.dtype = TSR_Q8_0;
    TSR_LOG_WARN("%s: FP8 weights run as Q8_0 (%s): %d matrices requantized (FP8's rounding, "
                 "then Q8_0's), %d kept in f32 where Q8_0 does not fit",
                 m->source, why, n_q8, n_f32);
    return TSR_OK;
}
