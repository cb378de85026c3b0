/* Q5_K: repacking, the scalar reference kernel and the choice of variant (quant_q5k.h,
 * quant_q5k_internal.h). No target pragma here: this file runs on any CPU. */
#include "kernels/cpu/quant_q5k_internal.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/quant_blocks.h"

bool tsr_q5k_fits(int64_t rows, int64_t cols) {
    return rows > 0 && cols > 0 && cols % TSR_Q5K_BLOCK == 0;
}

/* The group block of row r and block b (cols / 32 blocks a row); r's slot is r % 16. */
static uint8_t *tsr__q5k_gb(const void *packed, int64_t cols, int64_t r, int64_t b) {
    int64_t nb = cols / TSR_Q5K_BLOCK;
    return (uint8_t *)packed +
           ((size_t)(r / TSR_Q5K_GROUP) * (size_t)nb + (size_t)b) * TSR__Q5K_GBB;
}

/* One row's block in plain form: the 32 codes (0..31), scale, min, fp16 d and dmin. */
typedef struct {
    uint8_t code[TSR_Q5K_BLOCK];
    uint8_t sc, m;
    uint16_t d, dmin;
} tsr__q5k_row;

static void tsr__q5k_put(uint8_t *gb, int j, const tsr__q5k_row *v) {
    gb[2 * j] = (uint8_t)v->d;
    gb[2 * j + 1] = (uint8_t)(v->d >> 8);
    gb[TSR__Q5K_DMIN + 2 * j] = (uint8_t)v->dmin;
    gb[TSR__Q5K_DMIN + 2 * j + 1] = (uint8_t)(v->dmin >> 8);
    gb[TSR__Q5K_SC + j] = v->sc;
    gb[TSR__Q5K_M + j] = v->m;
    for (int e = 0; e < 4; e++) {
        uint8_t h = 0;
        for (int s = 0; s < 4; s++) {
            uint8_t a = v->code[4 * s + e], b = v->code[16 + 4 * s + e];
            gb[TSR__Q5K_QL + 64 * s + 4 * j + e] = (uint8_t)((a & 15) | (b & 15) << 4);
            h |= (uint8_t)((a >> 4 & 1) << s | (b >> 4 & 1) << (4 + s));
        }
        gb[TSR__Q5K_QH + 4 * j + e] = h;
    }
}

static void tsr__q5k_get(const uint8_t *gb, int j, tsr__q5k_row *v) {
    v->d = (uint16_t)(gb[2 * j] | gb[2 * j + 1] << 8);
    v->dmin = (uint16_t)(gb[TSR__Q5K_DMIN + 2 * j] | gb[TSR__Q5K_DMIN + 2 * j + 1] << 8);
    v->sc = gb[TSR__Q5K_SC + j];
    v->m = gb[TSR__Q5K_M + j];
    for (int e = 0; e < 4; e++) {
        uint8_t h = gb[TSR__Q5K_QH + 4 * j + e];
        for (int s = 0; s < 4; s++) {
            uint8_t l = gb[TSR__Q5K_QL + 64 * s + 4 * j + e];
            v->code[4 * s + e] = (uint8_t)((l & 15) | (h >> s & 1) << 4);
            v->code[16 + 4 * s + e] = (uint8_t)((l >> 4) | (h >> (4 + s) & 1) << 4);
        }
    }
}

/* Scale and min of sub-block j from the 12 packed bytes (ggml's get_scale_min_k4). */
static void tsr__q5k_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 15) | (q[j - 4] >> 6) << 4);
        *m = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

void tsr_q5k_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed) {
    tsr_tensor q = {.dtype = TSR_Q5_K, .rows = rows, .cols = cols};
    memset(packed, 0, tsr_tensor_bytes(&q)); /* padding rows: d = dmin = 0, they add nothing */
    int64_t ns = cols / TSR_Q5K_GGUF_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t sb = 0; sb < ns; sb++) {
            const uint8_t *src = blocks + ((size_t)r * (size_t)ns + (size_t)sb) *
                                              TSR_Q5K_GGUF_BLOCK_BYTES;
            const uint8_t *qh = src + 16, *qs = src + 48;
            tsr__q5k_row v = {.d = (uint16_t)(src[0] | src[1] << 8),
                              .dmin = (uint16_t)(src[2] | src[3] << 8)};
            for (int u = 0; u < TSR_Q5K_GGUF_BLOCK / TSR_Q5K_BLOCK; u++) {
                tsr__q5k_scale_min(src + 4, u, &v.sc, &v.m);
                for (int l = 0; l < 32; l++) {
                    uint8_t nib = (uint8_t)(qs[32 * (u / 2) + l] >> 4 * (u % 2) & 15);
                    v.code[l] = (uint8_t)(nib | (qh[l] >> u & 1) << 4);
                }
                int64_t b = sb * (TSR_Q5K_GGUF_BLOCK / TSR_Q5K_BLOCK) + u;
                tsr__q5k_put(tsr__q5k_gb(packed, cols, r, b), (int)(r % TSR_Q5K_GROUP), &v);
            }
        }
    }
}

void tsr_q5k_pack_q5(const uint8_t *blocks, bool with_min, int64_t rows, int64_t cols,
                     void *packed) {
    tsr_tensor q = {.dtype = TSR_Q5_K, .rows = rows, .cols = cols};
    memset(packed, 0, tsr_tensor_bytes(&q));
    size_t bb = with_min ? TSR_Q5_1_BLOCK_BYTES : TSR_Q5_0_BLOCK_BYTES;
    int64_t nb = cols / TSR_Q5K_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *src = blocks + ((size_t)r * (size_t)nb + (size_t)b) * bb;
            uint16_t d = (uint16_t)(src[0] | src[1] << 8);
            /* d q - dmin m: Q5_0's d (q - 16) as dmin = d, m = 16; Q5_1's d q + min as
             * dmin = -min (the fp16 sign flipped), m = 1 */
            tsr__q5k_row v = {.d = d, .sc = 1, .dmin = d, .m = 16};
            if (with_min) {
                v.dmin = (uint16_t)((src[2] | src[3] << 8) ^ 0x8000);
                v.m = 1;
            }
            const uint8_t *qh = src + (with_min ? 4 : 2), *qs = qh + 4;
            uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                         (uint32_t)qh[3] << 24;
            for (int l = 0; l < 16; l++) {
                v.code[l] = (uint8_t)((qs[l] & 15) | (h >> l & 1) << 4);
                v.code[16 + l] = (uint8_t)((qs[l] >> 4) | (h >> (16 + l) & 1) << 4);
            }
            tsr__q5k_put(tsr__q5k_gb(packed, cols, r, b), (int)(r % TSR_Q5K_GROUP), &v);
        }
    }
}

void tsr_q5k_dequant_row(const void *packed, int64_t cols, int64_t r, float *out) {
    for (int64_t b = 0; b < cols / TSR_Q5K_BLOCK; b++) {
        tsr__q5k_row v;
        tsr__q5k_get(tsr__q5k_gb(packed, cols, r, b), (int)(r % TSR_Q5K_GROUP), &v);
        float dl = tsr_f16_to_f32(v.d) * (float)v.sc, ml = tsr_f16_to_f32(v.dmin) * (float)v.m;
        for (int k = 0; k < TSR_Q5K_BLOCK; k++)
            out[b * TSR_Q5K_BLOCK + k] = dl * (float)v.code[k] - ml;
    }
}

/* The layout of quant_q5k.h plane by plane, for the shared slicer. */
static const tsr_qplanes tsr__q5k_planes = {
    .dtype = TSR_Q5_K,
    .gbb = TSR__Q5K_GBB,
    .n = 9,
    .p = {{0, 2}, {TSR__Q5K_DMIN, 2}, {TSR__Q5K_SC, 1}, {TSR__Q5K_M, 1}, {TSR__Q5K_QL, 4},
          {TSR__Q5K_QL + 64, 4}, {TSR__Q5K_QL + 128, 4}, {TSR__Q5K_QL + 192, 4},
          {TSR__Q5K_QH, 4}},
};

tsr_status tsr_q5k_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         void *dst) {
    return tsr_qplanes_slice(&tsr__q5k_planes, src, r0, r1, c0, c1, dst);
}

/* ---------------------------------------------------------------- scalar ---- */

typedef struct {
    float v[16];
} tsr__q5k_acc16;

/* Block b of a group for nx tokens: per row the exact sums of quant_q5k.h and two fmas. */
static inline void tsr__q5k_s_block(const uint8_t *wb, const int8_t *xq, const float *xd,
                                    const int32_t *xs, int64_t nb, int64_t b, int nx,
                                    tsr__q5k_acc16 *acc) {
    for (int j = 0; j < 16; j++) {
        tsr__q5k_row v;
        tsr__q5k_get(wb, j, &v);
        float dw = tsr_f16_to_f32(v.d), mw = tsr_f16_to_f32(v.dmin);
        for (int i = 0; i < nx; i++) {
            size_t k = (size_t)i * (size_t)nb + (size_t)b;
            const int8_t *x = xq + k * TSR_Q5K_BLOCK;
            int32_t isum = 0;
            for (int c = 0; c < TSR_Q5K_BLOCK; c++) isum += (int32_t)v.code[c] * x[c];
            float a = fmaf((float)((int32_t)v.sc * isum), dw * xd[k], acc[i].v[j]);
            acc[i].v[j] = fmaf((float)((int32_t)v.m * xs[k]), -(mw * xd[k]), a);
        }
    }
}

#define TSR__Q5K_S_STORE(dst, a) memcpy(dst, (a).v, sizeof(a).v)
#define TSR__Q5K_S_ZERO ((tsr__q5k_acc16){{0}})

static inline void tsr__q5k_s_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                      int64_t g1, const int8_t *xq, const float *xd,
                                      const int32_t *xs, int nx, const int32_t *bseg,
                                      int n_parts, bool sum, float *y, int64_t ldy,
                                      int64_t ldp) {
    TSR__QGEMV_BODY(nx, TSR__Q5K_GBB, tsr__q5k_s_block, tsr__q5k_acc16, TSR__Q5K_S_ZERO,
                    TSR__Q5K_S_STORE)
}

TSR__Q8_GEMV_FN(tsr__q5k_s_gemv, tsr__q5k_s_gemv_nx)

static const tsr__q5k_kernels tsr__q5k_k_scalar = {TSR__Q8_SCALAR, "scalar", tsr__q5k_s_gemv};

const tsr__q5k_kernels *tsr__q5k_kernels_for(tsr__q8_variant v) {
    if (v == TSR__Q8_SCALAR) return &tsr__q5k_k_scalar;
#if defined(__x86_64__) || defined(__i386__)
    /* the Q8_0 variant's CPU check; AVX-VNNI runs the AVX2 kernel (it includes AVX2) */
    if (!tsr__q8_kernels_for(v)) return NULL;
    return v == TSR__Q8_AVX512VNNI ? &tsr__q5k_k_avx512vnni : &tsr__q5k_k_avx2;
#else
    return NULL;
#endif
}

const tsr__q5k_kernels *tsr__q5k_kernels_get(void) {
    const tsr__q5k_kernels *k = tsr__q5k_kernels_for(tsr__q8_kernels_get()->variant);
    return k ? k : &tsr__q5k_k_scalar;
}
