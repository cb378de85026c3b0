/* Q4_K: repacking, the Q8_K activation quantizer, the scalar reference kernel and the choice
 * of variant (quant_q4k.h, quant_q4k_internal.h). No target pragma here: this file runs on
 * any CPU. */
#include "kernels/cpu/quant_q4k_internal.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"

bool tsr_q4k_fits(int64_t rows, int64_t cols) {
    return rows > 0 && cols > 0 && cols % TSR_Q4K_BLOCK == 0;
}

/* Super-block b of the group holding row r; row r's slot within it is r % 16. */
static uint8_t *tsr__q4k_gb(const void *packed, int64_t cols, int64_t r, int64_t b) {
    int64_t nb = cols / TSR_Q4K_BLOCK;
    return (uint8_t *)packed +
           ((size_t)(r / TSR_Q4K_GROUP) * (size_t)nb + (size_t)b) * TSR__Q4K_GBB;
}

/* The GGUF block's parts and their places in a group block, for row slot j: d, dmin, the
 * 3 scale words, the 32 code words. */
static void tsr__q4k_pack_row(void *packed, int64_t cols, int64_t r, const uint8_t *blocks) {
    int j = (int)(r % TSR_Q4K_GROUP);
    for (int64_t b = 0; b < cols / TSR_Q4K_BLOCK; b++) {
        uint8_t *gb = tsr__q4k_gb(packed, cols, r, b);
        const uint8_t *src = blocks + (size_t)b * TSR_Q4K_BLOCK_BYTES;
        memcpy(gb + 2 * j, src, 2);
        memcpy(gb + TSR__Q4K_DMIN + 2 * j, src + 2, 2);
        for (int w = 0; w < 3; w++)
            memcpy(gb + TSR__Q4K_SCALES + w * 64 + 4 * j, src + 4 + 4 * w, 4);
        for (int s = 0; s < 32; s++)
            memcpy(gb + TSR__Q4K_CODES + s * 64 + 4 * j, src + 16 + 4 * s, 4);
    }
}

void tsr_q4k_unpack_row(const void *packed, int64_t cols, int64_t r, uint8_t *blocks) {
    int j = (int)(r % TSR_Q4K_GROUP);
    for (int64_t b = 0; b < cols / TSR_Q4K_BLOCK; b++) {
        const uint8_t *gb = tsr__q4k_gb(packed, cols, r, b);
        uint8_t *o = blocks + (size_t)b * TSR_Q4K_BLOCK_BYTES;
        memcpy(o, gb + 2 * j, 2);
        memcpy(o + 2, gb + TSR__Q4K_DMIN + 2 * j, 2);
        for (int w = 0; w < 3; w++)
            memcpy(o + 4 + 4 * w, gb + TSR__Q4K_SCALES + w * 64 + 4 * j, 4);
        for (int s = 0; s < 32; s++)
            memcpy(o + 16 + 4 * s, gb + TSR__Q4K_CODES + s * 64 + 4 * j, 4);
    }
}

static inline float tsr__q4k_h(const uint8_t *p) {
    return tsr_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static inline uint32_t tsr__q4k_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* sc[8] and m[8] of row slot j of group block gb: ggml's unpacking of the three words
 * (the SIMD kernels do the same per 32-bit lane). */
static void tsr__q4k_scales(const uint8_t *gb, int j, int32_t *sc, int32_t *m) {
    uint32_t u0 = tsr__q4k_u32(gb + TSR__Q4K_SCALES + 4 * j);
    uint32_t u1 = tsr__q4k_u32(gb + TSR__Q4K_SCALES + 64 + 4 * j);
    uint32_t u2 = tsr__q4k_u32(gb + TSR__Q4K_SCALES + 128 + 4 * j);
    uint32_t s0 = u0 & 0x3f3f3f3fu, s1 = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    uint32_t m0 = u1 & 0x3f3f3f3fu, m1 = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
    for (int k = 0; k < 4; k++) {
        sc[k] = (int32_t)(s0 >> 8 * k & 0xff);
        sc[k + 4] = (int32_t)(s1 >> 8 * k & 0xff);
        m[k] = (int32_t)(m0 >> 8 * k & 0xff);
        m[k + 4] = (int32_t)(m1 >> 8 * k & 0xff);
    }
}

/* Code of column k (0..255) of row slot j in group block gb. */
static inline int tsr__q4k_code(const uint8_t *gb, int j, int k) {
    int c = k / 64, l = k % 32, hi = (k / 32) % 2, byte = 32 * c + l;
    uint8_t v = gb[TSR__Q4K_CODES + (byte / 4) * 64 + 4 * j + byte % 4];
    return hi ? v >> 4 : v & 0x0f;
}

void tsr_q4k_dequant_row(const void *packed, int64_t cols, int64_t r, float *out) {
    int j = (int)(r % TSR_Q4K_GROUP);
    for (int64_t b = 0; b < cols / TSR_Q4K_BLOCK; b++) {
        const uint8_t *gb = tsr__q4k_gb(packed, cols, r, b);
        float d = tsr__q4k_h(gb + 2 * j), dmin = tsr__q4k_h(gb + TSR__Q4K_DMIN + 2 * j);
        int32_t sc[8], m[8];
        tsr__q4k_scales(gb, j, sc, m);
        float *o = out + b * TSR_Q4K_BLOCK;
        for (int k = 0; k < TSR_Q4K_BLOCK; k++) {
            float dl = d * (float)sc[k / 32], ml = dmin * (float)m[k / 32];
            float v = dl * (float)tsr__q4k_code(gb, j, k);
            o[k] = v - ml;
        }
    }
}

bool tsr_q4k_to_q4_1(const uint8_t *blocks, int64_t cols, uint8_t *out) {
    uint8_t gb[TSR__Q4K_GBB]; /* one row in slot 0 of a group block: the unpacking above */
    for (int64_t b = 0; b < cols / TSR_Q4K_BLOCK; b++) {
        const uint8_t *src = blocks + (size_t)b * TSR_Q4K_BLOCK_BYTES;
        memset(gb, 0, sizeof gb);
        memcpy(gb, src, 2);
        memcpy(gb + TSR__Q4K_DMIN, src + 2, 2);
        for (int w = 0; w < 3; w++) memcpy(gb + TSR__Q4K_SCALES + w * 64, src + 4 + 4 * w, 4);
        for (int s = 0; s < 32; s++) memcpy(gb + TSR__Q4K_CODES + s * 64, src + 16 + 4 * s, 4);
        float d = tsr__q4k_h(gb), dmin = tsr__q4k_h(gb + TSR__Q4K_DMIN);
        int32_t sc[8], m[8];
        tsr__q4k_scales(gb, 0, sc, m);
        for (int j = 0; j < TSR__Q4K_SUB; j++) {
            uint8_t *o = out + ((size_t)b * TSR__Q4K_SUB + (size_t)j) * 20;
            float dj = d * (float)sc[j], mj = -(dmin * (float)m[j]);
            uint16_t hd = tsr_f32_to_f16(dj), hm = tsr_f32_to_f16(mj);
            if ((hd & 0x7c00) == 0x7c00 || (hm & 0x7c00) == 0x7c00) return false;
            o[0] = (uint8_t)hd;
            o[1] = (uint8_t)(hd >> 8);
            o[2] = (uint8_t)hm;
            o[3] = (uint8_t)(hm >> 8);
            for (int k = 0; k < 16; k++)
                o[4 + k] = (uint8_t)(tsr__q4k_code(gb, 0, 32 * j + k) |
                                     tsr__q4k_code(gb, 0, 32 * j + k + 16) << 4);
        }
    }
    return true;
}

/* Zero-fills the whole tensor: padding rows get d = dmin = 0 and add nothing. */
static void tsr__q4k_pack_init(void *packed, int64_t rows, int64_t cols) {
    tsr_tensor q = {.dtype = TSR_Q4_K, .rows = rows, .cols = cols};
    memset(packed, 0, tsr_tensor_bytes(&q));
}

void tsr_q4k_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed) {
    size_t rb = (size_t)(cols / TSR_Q4K_BLOCK) * TSR_Q4K_BLOCK_BYTES;
    tsr__q4k_pack_init(packed, rows, cols);
    for (int64_t r = 0; r < rows; r++) tsr__q4k_pack_row(packed, cols, r, blocks + (size_t)r * rb);
}

tsr_status tsr_q4k_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         void *dst) {
    if (src->dtype != TSR_Q4_K || r0 < 0 || r1 > src->rows || r1 <= r0 || c0 < 0 ||
        c1 > src->cols || c1 <= c0 || c0 % TSR_Q4K_BLOCK || c1 % TSR_Q4K_BLOCK)
        return tsr_error_set(TSR_ERR_INVALID, "q4_k: cannot slice rows [%lld, %lld) columns "
                             "[%lld, %lld) of a %lldx%lld %s matrix (columns on 256-value "
                             "super-blocks)", (long long)r0, (long long)r1, (long long)c0,
                             (long long)c1, (long long)src->rows, (long long)src->cols,
                             tsr_dtype_name(src->dtype));
    uint8_t *row = tsr_malloc((size_t)(src->cols / TSR_Q4K_BLOCK) * TSR_Q4K_BLOCK_BYTES);
    if (!row) return tsr_error_set(TSR_ERR_NOMEM, "q4_k: out of memory slicing a matrix");
    tsr__q4k_pack_init(dst, r1 - r0, c1 - c0);
    for (int64_t r = r0; r < r1; r++) {
        tsr_q4k_unpack_row(src->data, src->cols, r, row);
        tsr__q4k_pack_row(dst, c1 - c0, r - r0,
                          row + (size_t)(c0 / TSR_Q4K_BLOCK) * TSR_Q4K_BLOCK_BYTES);
    }
    tsr_free(row);
    return TSR_OK;
}

/* ggml's nearest_int: round half to even through the f32 adder (|v| < 2^22). */
static inline int tsr__q4k_nearest(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void tsr__q4k_quantize_act(const float *x, int64_t cols, int8_t *qs, float *d, int32_t *bsum) {
    for (int64_t b = 0; b < cols / TSR_Q4K_BLOCK; b++) {
        const float *v = x + b * TSR_Q4K_BLOCK;
        int8_t *q = qs + b * TSR_Q4K_BLOCK;
        float amax = 0.0f, max = 0.0f;
        for (int k = 0; k < TSR_Q4K_BLOCK; k++)
            if (fabsf(v[k]) > amax) {
                amax = fabsf(v[k]);
                max = v[k];
            }
        if (amax == 0.0f) { /* ggml: d 0, codes 0 */
            d[b] = 0.0f;
            memset(q, 0, TSR_Q4K_BLOCK);
        } else {
            float iscale = -127.0f / max;
            for (int k = 0; k < TSR_Q4K_BLOCK; k++) {
                int c = tsr__q4k_nearest(iscale * v[k]);
                q[k] = (int8_t)(c < 127 ? c : 127);
            }
            d[b] = 1.0f / iscale;
        }
        for (int s = 0; s < TSR__Q4K_SUB; s++) {
            int32_t t = 0;
            for (int k = 0; k < 32; k++) t += q[32 * s + k];
            bsum[b * TSR__Q4K_SUB + s] = t;
        }
    }
}

/* ---------------------------------------------------------------- scalar ---- */

typedef struct {
    float v[16];
} tsr__q4k_acc16;

static inline void tsr__q4k_s_block(const uint8_t *wb, const int8_t *xq, const float *xd,
                                    const int32_t *xs, int64_t nb, int64_t b, int nx,
                                    tsr__q4k_acc16 *acc) {
    for (int j = 0; j < 16; j++) {
        float dw = tsr__q4k_h(wb + 2 * j), mw = tsr__q4k_h(wb + TSR__Q4K_DMIN + 2 * j);
        int32_t sc[8], m[8];
        tsr__q4k_scales(wb, j, sc, m);
        for (int i = 0; i < nx; i++) {
            size_t k = (size_t)i * (size_t)nb + (size_t)b;
            const int8_t *x = xq + k * TSR_Q4K_BLOCK;
            /* code step s holds bytes 4s..4s+3: columns 64c + 4(s % 8) + t in the low
             * nibbles (sub-block 2c, c = s / 8), 32 further in the high ones */
            int32_t dot[TSR__Q4K_SUB] = {0};
            for (int s = 0; s < 32; s++) {
                const uint8_t *cb = wb + TSR__Q4K_CODES + s * 64 + 4 * j;
                int c = s / 8, col = 64 * c + 4 * (s % 8);
                for (int t = 0; t < 4; t++) {
                    dot[2 * c] += (int32_t)(cb[t] & 0x0f) * x[col + t];
                    dot[2 * c + 1] += (int32_t)(cb[t] >> 4) * x[col + 32 + t];
                }
            }
            int32_t isum = 0, msum = 0;
            for (int s = 0; s < TSR__Q4K_SUB; s++) {
                isum += sc[s] * dot[s];
                msum += m[s] * xs[k * TSR__Q4K_SUB + (size_t)s];
            }
            float a = fmaf((float)isum, dw * xd[k], acc[i].v[j]);
            acc[i].v[j] = fmaf((float)msum, -(mw * xd[k]), a);
        }
    }
}

#define TSR__Q4K_S_STORE(dst, a) memcpy(dst, (a).v, sizeof(a).v)
#define TSR__Q4K_S_ZERO ((tsr__q4k_acc16){{0}})

TSR__Q4K_GEMV_DEF(tsr__q4k_s, tsr__q4k_s_block, tsr__q4k_acc16, TSR__Q4K_S_ZERO,
                  TSR__Q4K_S_STORE)

static const tsr__q4k_kernels tsr__q4k_k_scalar = {TSR__Q8_SCALAR, "scalar", tsr__q4k_s_gemv};

/* ---------------------------------------------------------------- dispatch ---- */

const tsr__q4k_kernels *tsr__q4k_kernels_for(tsr__q8_variant v) {
    if (v == TSR__Q8_SCALAR) return &tsr__q4k_k_scalar;
#if defined(__x86_64__) || defined(__i386__)
    /* the Q8_0 variant's availability is the instructions' */
    if (!tsr__q8_kernels_for(v)) return NULL;
    switch (v) {
    case TSR__Q8_AVX2: return &tsr__q4k_k_avx2;
    case TSR__Q8_AVXVNNI: return &tsr__q4k_k_avxvnni;
    case TSR__Q8_AVX512VNNI: return &tsr__q4k_k_avx512vnni;
    default: return NULL;
    }
#else
    return NULL;
#endif
}

const tsr__q4k_kernels *tsr__q4k_kernels_get(void) {
    const tsr__q4k_kernels *k = tsr__q4k_kernels_for(tsr__q8_kernels_get()->variant);
    return k ? k : &tsr__q4k_k_scalar;
}
