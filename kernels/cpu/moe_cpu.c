/* The experts of a mixture-of-experts layer on the CPU (kernels/backend.h tsr_moe_args):
 * expert by expert, its rows gathered, both projections over all of them (each expert's
 * weights read once), the clamped GPT-OSS gate, and the weighted rows added to out in
 * expert order (transformers' index_add_ order, so a token's sum does not depend on the
 * other tokens of the batch). */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/cpu/cpu_internal.h"

/* y[c][w.rows] = x[c][w.cols] . W_e^T */
static tsr_status tsr__moe_proj(tsr_backend *be, const tsr_experts *w, int e, const float *x,
                                int64_t c, float *y) {
    tsr__cpu_ctx *ctx = be->ctx;
    size_t re = (size_t)e * (size_t)w->rows;
    if (w->mxfp4) {
        tsr__mxfp4_matmul((const uint8_t *)w->w.data + re * (size_t)(w->cols / 2),
                          (const uint8_t *)w->scales.data + re * (size_t)(w->cols / 32),
                          w->rows, w->cols, x, c, y, ctx->threads);
        return TSR_OK;
    }
    /* plain rows, or the repacked MXFP4 (its rows whole 16-row groups per expert, so expert
     * e's bytes start at those of the e * rows rows before it): the integer kernels */
    tsr_tensor before = {.dtype = w->w.dtype, .rows = (int64_t)re, .cols = w->cols};
    tsr_tensor v = {.dtype = w->w.dtype, .rows = w->rows, .cols = w->cols,
                    .data = (const char *)w->w.data + tsr_tensor_bytes(&before)};
    return tsr__cpu_matmul(be, x, c, &v, y);
}

static void tsr__moe_bias(float *y, const float *b, int64_t c, int64_t width) {
    for (int64_t i = 0; i < c; i++)
        for (int64_t j = 0; j < width; j++) y[(size_t)i * (size_t)width + (size_t)j] += b[j];
}

tsr_status tsr__cpu_moe(tsr_backend *be, const tsr_moe_args *a) {
    const tsr_experts *gu = a->gate_up, *dn = a->down;
    if (gu->n != dn->n || gu->rows != 2 * dn->cols || gu->cols != dn->rows || gu->n <= 0 ||
        (gu->mxfp4 && (gu->cols % 32 || dn->cols % 32)))
        return tsr_error_set(TSR_ERR_INVALID, "cpu moe: experts of [%lld, %lld] and [%lld, "
                             "%lld] do not chain", (long long)gu->rows, (long long)gu->cols,
                             (long long)dn->rows, (long long)dn->cols);
    const int64_t H = dn->rows, I = dn->cols, I2 = gu->rows;
    memset(a->out, 0, (size_t)a->n * (size_t)H * sizeof(float));
    int64_t most = 0;
    for (int e = 0; e < gu->n; e++) {
        int64_t c = a->offsets[e + 1] - a->offsets[e];
        most = c > most ? c : most;
    }
    if (most == 0) return TSR_OK;
    size_t per = (size_t)H + (size_t)I2 + (size_t)I + (size_t)H;
    float *buf = tsr_malloc((size_t)most * per * sizeof(float));
    if (!buf) return TSR_ERR_NOMEM;
    float *xe = buf, *g = xe + (size_t)most * (size_t)H, *act = g + (size_t)most * (size_t)I2,
          *y = act + (size_t)most * (size_t)I;
    tsr_status st = TSR_OK;
    for (int e = 0; e < gu->n && st == TSR_OK; e++) {
        int32_t r0 = a->offsets[e];
        int64_t c = a->offsets[e + 1] - r0;
        if (c <= 0) continue;
        for (int64_t i = 0; i < c; i++)
            memcpy(xe + (size_t)i * (size_t)H, a->x + (size_t)a->rows[r0 + i] * (size_t)H,
                   (size_t)H * sizeof(float));
        st = tsr__moe_proj(be, gu, e, xe, c, g);
        if (st != TSR_OK) break;
        tsr__moe_bias(g, (const float *)gu->bias.data + (size_t)e * (size_t)I2, c, I2);
        for (int64_t i = 0; i < c; i++) {
            const float *gi = g + (size_t)i * (size_t)I2;
            float *ai = act + (size_t)i * (size_t)I;
            for (int64_t j = 0; j < I; j++) {
                float gate = gi[2 * j], up = gi[2 * j + 1];
                gate = gate > a->limit ? a->limit : gate;
                up = up > a->limit ? a->limit : up < -a->limit ? -a->limit : up;
                float glu = gate * (1.0f / (1.0f + expf(-(gate * a->alpha))));
                ai[j] = (up + 1.0f) * glu;
            }
        }
        st = tsr__moe_proj(be, dn, e, act, c, y);
        if (st != TSR_OK) break;
        tsr__moe_bias(y, (const float *)dn->bias.data + (size_t)e * (size_t)H, c, H);
        for (int64_t i = 0; i < c; i++) {
            float wgt = a->weights[r0 + i];
            float *o = a->out + (size_t)a->rows[r0 + i] * (size_t)H;
            const float *yi = y + (size_t)i * (size_t)H;
            for (int64_t j = 0; j < H; j++) o[j] += yi[j] * wgt;
        }
    }
    tsr_free(buf);
    return st;
}
