/* Fused q/k/v and gate/up weights at load (runtime/model/fuse.h). */
#include "runtime/model/fuse.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/cpu/quant_q8.h"

/* Whether the parts can be stacked: present, one dtype the kernels fuse, one width. */
static bool tsr__fusable(tsr_tensor *const *p, int n) {
    tsr_dtype dt = p[0]->dtype;
    if (dt != TSR_F32 && dt != TSR_BF16 && dt != TSR_F16 && dt != TSR_Q8_0) return false;
    for (int i = 0; i < n; i++)
        if (!p[i]->data || p[i]->rows <= 0 || p[i]->dtype != dt || p[i]->cols != p[0]->cols)
            return false;
    return true;
}

/* Copies n bytes from src to dst in slabs of about 1 MiB that end on src's page
 * boundaries, each slab's source given back (tsr_model_discard) once copied when drop is
 * set: the fused copy and its parts are then never resident together beyond one slab (an
 * 8B model's gate/up pair is 235 MB in BF16). */
static void tsr__copy_dropping(tsr_model *m, char *dst, const char *src, size_t n, bool drop) {
    const uintptr_t page = 4096;
    size_t done = 0;
    while (done < n) {
        uintptr_t end = ((uintptr_t)(src + done) + ((size_t)1 << 20)) & ~(page - 1);
        size_t len = end - (uintptr_t)(src + done);
        if (len > n - done) len = n - done;
        memcpy(dst + done, src + done, len);
        if (drop) tsr_model_discard(m, src + done, len);
        done += len;
    }
}

/* The parts' rows stacked into *out (model-owned). Row-major dtypes, and Q8_0 whose parts
 * but the last are whole 16-row groups: the parts' bytes back to back, the parts re-pointed
 * at their rows and their old storage dropped. Other Q8_0: each row unpacked and packed
 * into its fused row (lossless), the parts left as they are. */
static tsr_status tsr__stack(tsr_model *m, tsr_tensor *const *p, int n, tsr_tensor *out) {
    tsr_tensor f = {.dtype = p[0]->dtype, .rows = 0, .cols = p[0]->cols};
    for (int i = 0; i < n; i++) f.rows += p[i]->rows;
    bool back_to_back = true;
    if (f.dtype == TSR_Q8_0)
        for (int i = 0; i + 1 < n; i++) back_to_back &= p[i]->rows % TSR_Q8_GROUP == 0;
    void *dst;
    TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&f), &dst));
    if (back_to_back) {
        /* copied first, re-pointed after, so that every part's old storage is still there
         * to compare with */
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            size_t b = tsr_tensor_bytes(p[i]);
            bool shared = false; /* a part that views another's storage keeps it alive */
            for (int j = 0; j < n; j++) shared |= j != i && p[j]->data == p[i]->data;
            tsr__copy_dropping(m, (char *)dst + off, p[i]->data, b, !shared);
            off += b;
        }
        off = 0;
        for (int i = 0; i < n; i++) {
            p[i]->data = (char *)dst + off;
            off += tsr_tensor_bytes(p[i]);
        }
    } else {
        uint8_t *row = tsr_malloc((size_t)(f.cols / TSR_Q8_BLOCK) * TSR_Q8_BLOCK_BYTES);
        if (!row) return tsr_error_set(TSR_ERR_NOMEM, "fuse: out of memory repacking q8_0");
        tsr_q8_pack_init(dst, f.rows, f.cols);
        int64_t r0 = 0;
        for (int i = 0; i < n; i++) {
            for (int64_t r = 0; r < p[i]->rows; r++) {
                tsr_q8_unpack_row(p[i]->data, f.cols, r, row);
                tsr_q8_pack_row(dst, f.cols, r0 + r, row);
            }
            r0 += p[i]->rows;
        }
        tsr_free(row);
    }
    f.data = dst;
    *out = f;
    return TSR_OK;
}

/* The q/k/v biases, f32 [1, width] each, as one [1, total] vector; the parts become views. */
static tsr_status tsr__stack_bias(tsr_model *m, tsr_tensor *const *b, int n, tsr_tensor *out) {
    tsr_tensor f = {.dtype = TSR_F32, .rows = 1, .cols = 0};
    for (int i = 0; i < n; i++) f.cols += b[i]->cols;
    void *dst;
    TSR_TRY(tsr_model_alloc(m, (size_t)f.cols * sizeof(float), &dst));
    float *d = dst;
    for (int i = 0; i < n; i++) {
        memcpy(d, b[i]->data, (size_t)b[i]->cols * sizeof(float));
        b[i]->data = d;
        d += b[i]->cols;
    }
    f.data = dst;
    *out = f;
    return TSR_OK;
}

static bool tsr__bias_ok(tsr_tensor *const *b, const tsr_tensor *const *w, int n) {
    for (int i = 0; i < n; i++)
        if (!b[i]->data || b[i]->dtype != TSR_F32 || b[i]->rows != 1 || b[i]->cols != w[i]->rows)
            return false;
    return true;
}

tsr_status tsr_model_fuse(tsr_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        tsr_tensor *qkv[] = {&w->wq, &w->wk, &w->wv};
        tsr_tensor *bias[] = {&w->bq, &w->bk, &w->bv};
        if (!w->wqkv.data && tsr__fusable(qkv, 3) &&
            (!m->cfg.qkv_bias || tsr__bias_ok(bias, (const tsr_tensor *const *)qkv, 3))) {
            if (m->cfg.qkv_bias) TSR_TRY(tsr__stack_bias(m, bias, 3, &w->bqkv));
            TSR_TRY(tsr__stack(m, qkv, 3, &w->wqkv));
        }
        tsr_tensor *gu[] = {&w->w_gate, &w->w_up};
        if (m->cfg.n_experts == 0 && !w->w_gate_up.data && tsr__fusable(gu, 2))
            TSR_TRY(tsr__stack(m, gu, 2, &w->w_gate_up));
    }
    return TSR_OK;
}

void tsr_model_fused_count(const tsr_model *m, int *qkv, int *gate_up) {
    *qkv = *gate_up = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        *qkv += m->layers[l].wqkv.data != NULL;
        *gate_up += m->layers[l].w_gate_up.data != NULL;
    }
}
