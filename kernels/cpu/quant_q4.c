/* Q4_0 / Q4_1: quantizers, repacking, the scalar reference kernels and the choice of variant
 * (quant_q4.h, quant_q4_internal.h). No target pragma here: this file runs on any CPU. */
#include "kernels/cpu/quant_q4_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/cpu/quant_q8.h"

bool tsr_q4_is(tsr_dtype t) { return t == TSR_Q4_0 || t == TSR_Q4_1; }

bool tsr_q4_grouped(tsr_dtype t) { return tsr_q4_is(t) || t == TSR_MXFP4; }

size_t tsr_q4_block_bytes(tsr_dtype t) { return t == TSR_Q4_1 ? 20 : 18; }

size_t tsr_q4_group_block_bytes(tsr_dtype t) {
    return t == TSR_Q4_1 ? TSR__Q4_1_GBB : t == TSR_MXFP4 ? TSR__MX_GBB : TSR__Q4_0_GBB;
}

bool tsr_q4_fits(int64_t rows, int64_t cols) {
    return rows > 0 && cols > 0 && cols % TSR_Q4_BLOCK == 0;
}

static void tsr__q4_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff); /* little-endian fp16, as GGUF stores it */
    p[1] = (uint8_t)(v >> 8);
}

void tsr_q4_quantize_blocks(tsr_dtype t, const float *x, int64_t n, uint8_t *blocks) {
    size_t bb = tsr_q4_block_bytes(t);
    for (int64_t b = 0; b < n / TSR_Q4_BLOCK; b++) {
        const float *v = x + (size_t)b * TSR_Q4_BLOCK;
        uint8_t *o = blocks + (size_t)b * bb, *qs = o + bb - 16;
        float id, off;
        if (t == TSR_Q4_0) { /* ggml: the signed value of largest magnitude maps to -8 */
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < TSR_Q4_BLOCK; j++)
                if (amax < fabsf(v[j])) {
                    amax = fabsf(v[j]);
                    max = v[j];
                }
            float d = max / -8.0f;
            id = d != 0.0f ? 1.0f / d : 0.0f;
            tsr__q4_put16(o, tsr_f32_to_f16(d));
            off = 0.0f;
        } else { /* ggml: min .. max over 15 steps */
            float mn = FLT_MAX, mx = -FLT_MAX;
            for (int j = 0; j < TSR_Q4_BLOCK; j++) {
                if (v[j] < mn) mn = v[j];
                if (v[j] > mx) mx = v[j];
            }
            float d = (mx - mn) / 15.0f;
            id = d != 0.0f ? 1.0f / d : 0.0f;
            tsr__q4_put16(o, tsr_f32_to_f16(d));
            tsr__q4_put16(o + 2, tsr_f32_to_f16(mn));
            off = mn;
        }
        float bias = t == TSR_Q4_0 ? 8.5f : 0.5f;
        for (int j = 0; j < 16; j++) {
            int lo = (int)((v[j] - off) * id + bias), hi = (int)((v[j + 16] - off) * id + bias);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* Group block b of row r; row r's slot within it is r % 16. */
static uint8_t *tsr__q4_gb(tsr_dtype t, const void *packed, int64_t cols, int64_t r,
                           int64_t b) {
    int64_t nb = cols / TSR_Q4_BLOCK;
    return (uint8_t *)packed +
           ((size_t)(r / TSR_Q4_GROUP) * (size_t)nb + (size_t)b) * tsr_q4_group_block_bytes(t);
}

/* Offset of the code bytes in a group block. */
static size_t tsr__q4_codes(tsr_dtype t) { return t == TSR_Q4_1 ? 64 : t == TSR_MXFP4 ? 16 : 32; }

static void tsr__q4_pack_row(tsr_dtype t, void *packed, int64_t cols, int64_t r,
                             const uint8_t *blocks) {
    int j = (int)(r % TSR_Q4_GROUP);
    size_t bb = tsr_q4_block_bytes(t), co = tsr__q4_codes(t);
    for (int64_t b = 0; b < cols / TSR_Q4_BLOCK; b++) {
        uint8_t *gb = tsr__q4_gb(t, packed, cols, r, b);
        const uint8_t *src = blocks + (size_t)b * bb;
        memcpy(gb + 2 * j, src, 2);                           /* d */
        if (t == TSR_Q4_1) memcpy(gb + 32 + 2 * j, src + 2, 2); /* m */
        for (int s = 0; s < 4; s++) memcpy(gb + co + s * 64 + j * 4, src + bb - 16 + 4 * s, 4);
    }
}

void tsr_q4_unpack_row(tsr_dtype t, const void *packed, int64_t cols, int64_t r,
                       uint8_t *blocks) {
    int j = (int)(r % TSR_Q4_GROUP);
    size_t bb = tsr_q4_block_bytes(t), co = tsr__q4_codes(t);
    for (int64_t b = 0; b < cols / TSR_Q4_BLOCK; b++) {
        const uint8_t *gb = tsr__q4_gb(t, packed, cols, r, b);
        uint8_t *o = blocks + (size_t)b * bb;
        memcpy(o, gb + 2 * j, 2);
        if (t == TSR_Q4_1) memcpy(o + 2, gb + 32 + 2 * j, 2);
        for (int s = 0; s < 4; s++) memcpy(o + bb - 16 + 4 * s, gb + co + s * 64 + j * 4, 4);
    }
}

/* Twice the E2M1 values: the MXFP4 code table of the kernels without their offset 12. */
static const int8_t tsr__mx_v2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void tsr_q4_dequant_row(tsr_dtype t, const void *packed, int64_t cols, int64_t r, float *out) {
    int j = (int)(r % TSR_Q4_GROUP);
    size_t co = tsr__q4_codes(t);
    for (int64_t b = 0; b < cols / TSR_Q4_BLOCK; b++) {
        const uint8_t *gb = tsr__q4_gb(t, packed, cols, r, b);
        if (t == TSR_MXFP4) { /* v2 * 2^(e - 128): exact, as the f32 decode */
            float sc = tsr__mx_scale(gb[j]);
            for (int k = 0; k < 16; k++) {
                uint8_t c = gb[co + (k / 4) * 64 + j * 4 + k % 4];
                out[b * TSR_Q4_BLOCK + k] = (float)tsr__mx_v2[c & 0x0f] * sc;
                out[b * TSR_Q4_BLOCK + k + 16] = (float)tsr__mx_v2[c >> 4] * sc;
            }
            continue;
        }
        float d = tsr_f16_to_f32((uint16_t)(gb[2 * j] | gb[2 * j + 1] << 8));
        float m = t == TSR_Q4_1 ? tsr_f16_to_f32((uint16_t)(gb[32 + 2 * j] | gb[33 + 2 * j] << 8))
                                : 0.0f;
        float *o = out + b * TSR_Q4_BLOCK;
        for (int k = 0; k < 16; k++) {
            uint8_t c = gb[co + (k / 4) * 64 + j * 4 + k % 4];
            int lo = c & 0x0f, hi = c >> 4;
            if (t == TSR_Q4_0) {
                o[k] = (float)(lo - 8) * d;
                o[k + 16] = (float)(hi - 8) * d;
            } else {
                o[k] = (float)lo * d + m;
                o[k + 16] = (float)hi * d + m;
            }
        }
    }
}

/* Zero-fills the whole tensor: padding rows get scale 0 (and m 0) and code 0, so they add
 * nothing (a Q4_0 code 0 is -8, times d = 0). */
static void tsr__q4_pack_init(tsr_dtype t, void *packed, int64_t rows, int64_t cols) {
    tsr_tensor q = {.dtype = t, .rows = rows, .cols = cols};
    memset(packed, 0, tsr_tensor_bytes(&q));
}

void tsr_q4_pack_gguf(tsr_dtype t, const uint8_t *blocks, int64_t rows, int64_t cols,
                      void *packed) {
    size_t rb = (size_t)(cols / TSR_Q4_BLOCK) * tsr_q4_block_bytes(t);
    tsr__q4_pack_init(t, packed, rows, cols);
    for (int64_t r = 0; r < rows; r++)
        tsr__q4_pack_row(t, packed, cols, r, blocks + (size_t)r * rb);
}

void tsr_q4_pack_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t rows,
                       int64_t cols, void *packed) {
    int64_t nb = cols / TSR_Q4_BLOCK;
    tsr__q4_pack_init(TSR_MXFP4, packed, rows, cols);
    for (int64_t r = 0; r < rows; r++) {
        int j = (int)(r % TSR_Q4_GROUP);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *q = blocks + ((size_t)r * (size_t)nb + (size_t)b) * 16;
            uint8_t *gb = tsr__q4_gb(TSR_MXFP4, packed, cols, r, b);
            gb[j] = scales[(size_t)r * (size_t)nb + (size_t)b];
            /* code of element i: byte i / 2, low nibble for even i; byte k here pairs
             * elements k and k + 16, as a GGUF 4-bit block does */
            for (int k = 0; k < 16; k++) {
                int c0 = (q[k / 2] >> (4 * (k & 1))) & 0x0f;
                int c1 = (q[(k + 16) / 2] >> (4 * (k & 1))) & 0x0f;
                gb[16 + (k / 4) * 64 + j * 4 + k % 4] = (uint8_t)(c0 | c1 << 4);
            }
        }
    }
}

tsr_status tsr_q4_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        void *dst) {
    tsr_dtype t = src->dtype;
    if (!tsr_q4_is(t) || r0 < 0 || r1 > src->rows || r1 <= r0 || c0 < 0 || c1 > src->cols ||
        c1 <= c0 || c0 % TSR_Q4_BLOCK || c1 % TSR_Q4_BLOCK)
        return tsr_error_set(TSR_ERR_INVALID, "%s: cannot slice rows [%lld, %lld) columns "
                             "[%lld, %lld) of a %lldx%lld matrix", tsr_dtype_name(t),
                             (long long)r0, (long long)r1, (long long)c0, (long long)c1,
                             (long long)src->rows, (long long)src->cols);
    size_t bb = tsr_q4_block_bytes(t);
    uint8_t *row = tsr_malloc((size_t)(src->cols / TSR_Q4_BLOCK) * bb);
    if (!row) return tsr_error_set(TSR_ERR_NOMEM, "q4: out of memory slicing a matrix");
    tsr__q4_pack_init(t, dst, r1 - r0, c1 - c0);
    for (int64_t r = r0; r < r1; r++) {
        tsr_q4_unpack_row(t, src->data, src->cols, r, row);
        tsr__q4_pack_row(t, dst, c1 - c0, r - r0, row + (size_t)(c0 / TSR_Q4_BLOCK) * bb);
    }
    tsr_free(row);
    return TSR_OK;
}

tsr_status tsr_q4_quantize_tensor(const tsr_tensor *src, tsr_dtype t, void *packed) {
    if (!tsr_q4_is(t) || !tsr_q4_fits(src->rows, src->cols) ||
        (src->dtype != TSR_F32 && src->dtype != TSR_BF16 && src->dtype != TSR_F16))
        return tsr_error_set(TSR_ERR_INVALID, "q4: cannot quantize a %lldx%lld %s matrix",
                             (long long)src->rows, (long long)src->cols,
                             tsr_dtype_name(src->dtype));
    float *row = tsr_malloc((size_t)src->cols * sizeof *row);
    uint8_t *blocks = tsr_malloc((size_t)(src->cols / TSR_Q4_BLOCK) * tsr_q4_block_bytes(t));
    tsr_status st = TSR_OK;
    if (!row || !blocks) {
        st = tsr_error_set(TSR_ERR_NOMEM, "q4: out of memory quantizing a matrix");
    } else {
        tsr__q4_pack_init(t, packed, src->rows, src->cols);
        for (int64_t r = 0; r < src->rows; r++) {
            tsr_dtype_to_f32(src->dtype, tsr_tensor_row(src, r), row, (size_t)src->cols);
            tsr_q4_quantize_blocks(t, row, src->cols, blocks);
            tsr__q4_pack_row(t, packed, src->cols, r, blocks);
        }
    }
    tsr_free(row);
    tsr_free(blocks);
    return st;
}

/* ---------------------------------------------------------------- scalar ---- */

typedef struct {
    float v[16];
} tsr__q4_acc16;

static inline float tsr__q4_h(const uint8_t *p) {
    return tsr_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* sum(q * x_q) of row j of the group block's codes at `codes` and activation block x */
static inline int32_t tsr__q4_s_dot(const uint8_t *codes, int j, const int8_t *x) {
    int32_t isum = 0;
    for (int k = 0; k < 16; k++) {
        uint8_t c = codes[(k / 4) * 64 + j * 4 + k % 4];
        isum += (int32_t)(c & 0x0f) * x[k] + (int32_t)(c >> 4) * x[k + 16];
    }
    return isum;
}

static inline void tsr__q4_s_block0(const uint8_t *wb, const int8_t *xq, const float *xd,
                                    const int32_t *xs, const float *xm, int64_t nb, int64_t b,
                                    int nx, tsr__q4_acc16 *acc) {
    (void)xm;
    for (int j = 0; j < 16; j++) {
        float dw = tsr__q4_h(wb + 2 * j);
        for (int i = 0; i < nx; i++) {
            size_t k = (size_t)i * (size_t)nb + (size_t)b;
            int32_t isum = tsr__q4_s_dot(wb + 32, j, xq + k * TSR_Q4_BLOCK) - 8 * xs[k];
            acc[i].v[j] = fmaf((float)isum, dw * xd[k], acc[i].v[j]);
        }
    }
}

static inline void tsr__q4_s_block1(const uint8_t *wb, const int8_t *xq, const float *xd,
                                    const int32_t *xs, const float *xm, int64_t nb, int64_t b,
                                    int nx, tsr__q4_acc16 *acc) {
    (void)xs;
    for (int j = 0; j < 16; j++) {
        float dw = tsr__q4_h(wb + 2 * j), mw = tsr__q4_h(wb + 32 + 2 * j);
        for (int i = 0; i < nx; i++) {
            size_t k = (size_t)i * (size_t)nb + (size_t)b;
            int32_t isum = tsr__q4_s_dot(wb + 64, j, xq + k * TSR_Q4_BLOCK);
            float a = fmaf((float)isum, dw * xd[k], acc[i].v[j]);
            acc[i].v[j] = fmaf(mw, xm[k], a);
        }
    }
}

static inline void tsr__q4_s_blockm(const uint8_t *wb, const int8_t *xq, const float *xd,
                                    const int32_t *xs, const float *xm, int64_t nb, int64_t b,
                                    int nx, tsr__q4_acc16 *acc) {
    (void)xm;
    static const uint8_t lut[16] = {TSR__MX_LUT12};
    for (int j = 0; j < 16; j++) {
        float dw = tsr__mx_scale(wb[j]);
        for (int i = 0; i < nx; i++) {
            size_t k = (size_t)i * (size_t)nb + (size_t)b;
            const int8_t *x = xq + k * TSR_Q4_BLOCK;
            int32_t isum = 0;
            for (int c = 0; c < 16; c++) {
                uint8_t q = wb[16 + (c / 4) * 64 + j * 4 + c % 4];
                isum += (int32_t)lut[q & 0x0f] * x[c] + (int32_t)lut[q >> 4] * x[c + 16];
            }
            isum -= 12 * xs[k];
            acc[i].v[j] = fmaf((float)isum, dw * xd[k], acc[i].v[j]);
        }
    }
}

#define TSR__Q4_S_STORE(dst, a) memcpy(dst, (a).v, sizeof(a).v)
#define TSR__Q4_S_ZERO ((tsr__q4_acc16){{0}})

TSR__Q4_GEMV_PAIR(tsr__q4_s, tsr__q4_acc16, TSR__Q4_S_ZERO, TSR__Q4_S_STORE)

static const tsr__q4_kernels tsr__q4_k_scalar = {TSR__Q8_SCALAR, "scalar", tsr__q4_s_gemv0,
                                                 tsr__q4_s_gemv1, tsr__q4_s_gemvm};

/* ---------------------------------------------------------------- dispatch ---- */

const tsr__q4_kernels *tsr__q4_kernels_for(tsr__q8_variant v) {
    if (v == TSR__Q8_SCALAR) return &tsr__q4_k_scalar;
#if defined(__x86_64__) || defined(__i386__)
    /* the Q8_0 variant's availability is the instructions' */
    if (!tsr__q8_kernels_for(v)) return NULL;
    switch (v) {
    case TSR__Q8_AVX2: return &tsr__q4_k_avx2;
    case TSR__Q8_AVXVNNI: return &tsr__q4_k_avxvnni;
    case TSR__Q8_AVX512VNNI: return &tsr__q4_k_avx512vnni;
    default: return NULL;
    }
#else
    return NULL;
#endif
}

const tsr__q4_kernels *tsr__q4_kernels_get(void) {
    const tsr__q4_kernels *k = tsr__q4_kernels_for(tsr__q8_kernels_get()->variant);
    return k ? k : &tsr__q4_k_scalar;
}

tsr__q4_gemv_fn tsr__q4_gemv_for(const tsr__q4_kernels *k, tsr_dtype t) {
    if (t != TSR_MXFP4) return t == TSR_Q4_1 ? k->gemv_q4_1 : k->gemv_q4_0;
#if defined(__x86_64__) || defined(__i386__)
    /* a variant without its own MXFP4 kernel (every one has one today) runs on a CPU with
     * AVX2 */
    if (!k->gemv_mxfp4) return tsr__q4_k_avx2.gemv_mxfp4;
#endif
    return k->gemv_mxfp4;
}
