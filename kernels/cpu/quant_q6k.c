/* Q6_K: repacking, the scalar reference kernel and the choice of variant (quant_q6k.h,
 * quant_q6k_internal.h). No target pragma here: this file runs on any CPU. */
#include "kernels/cpu/quant_q6k_internal.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/quant_blocks.h"

bool tsr_q6k_fits(int64_t rows, int64_t cols) {
    return rows > 0 && cols > 0 && cols % TSR_Q6K_BLOCK == 0;
}

/* The group block of row r and block b (cols / 32 blocks a row); r's slot is r % 16. */
static uint8_t *tsr__q6k_gb(const void *packed, int64_t cols, int64_t r, int64_t b) {
    int64_t nb = cols / TSR_Q6K_BLOCK;
    return (uint8_t *)packed +
           ((size_t)(r / TSR_Q6K_GROUP) * (size_t)nb + (size_t)b) * TSR__Q6K_GBB;
}

/* One row's block in plain form: the 32 codes (q + 32, 0..63), the two scales, fp16 d. */
typedef struct {
    uint8_t code[TSR_Q6K_BLOCK];
    int8_t sc[2];
    uint16_t d;
} tsr__q6k_row;

static void tsr__q6k_put(uint8_t *gb, int j, const tsr__q6k_row *v) {
    gb[2 * j] = (uint8_t)v->d;
    gb[2 * j + 1] = (uint8_t)(v->d >> 8);
    gb[TSR__Q6K_SC + 2 * j] = (uint8_t)v->sc[0];
    gb[TSR__Q6K_SC + 2 * j + 1] = (uint8_t)v->sc[1];
    for (int e = 0; e < 4; e++) {
        uint8_t ha = 0, hb = 0;
        for (int s = 0; s < 4; s++) {
            uint8_t a = v->code[4 * s + e], b = v->code[16 + 4 * s + e];
            gb[TSR__Q6K_QL + 64 * s + 4 * j + e] = (uint8_t)((a & 15) | (b & 15) << 4);
            ha |= (uint8_t)((a >> 4 & 3) << 2 * s);
            hb |= (uint8_t)((b >> 4 & 3) << 2 * s);
        }
        gb[TSR__Q6K_QHA + 4 * j + e] = ha;
        gb[TSR__Q6K_QHB + 4 * j + e] = hb;
    }
}

static void tsr__q6k_get(const uint8_t *gb, int j, tsr__q6k_row *v) {
    v->d = (uint16_t)(gb[2 * j] | gb[2 * j + 1] << 8);
    v->sc[0] = (int8_t)gb[TSR__Q6K_SC + 2 * j];
    v->sc[1] = (int8_t)gb[TSR__Q6K_SC + 2 * j + 1];
    for (int e = 0; e < 4; e++) {
        uint8_t ha = gb[TSR__Q6K_QHA + 4 * j + e], hb = gb[TSR__Q6K_QHB + 4 * j + e];
        for (int s = 0; s < 4; s++) {
            uint8_t l = gb[TSR__Q6K_QL + 64 * s + 4 * j + e];
            v->code[4 * s + e] = (uint8_t)((l & 15) | (ha >> 2 * s & 3) << 4);
            v->code[16 + 4 * s + e] = (uint8_t)((l >> 4) | (hb >> 2 * s & 3) << 4);
        }
    }
}

void tsr_q6k_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed) {
    tsr_tensor q = {.dtype = TSR_Q6_K, .rows = rows, .cols = cols};
    memset(packed, 0, tsr_tensor_bytes(&q)); /* padding rows: d = 0, they add nothing */
    int64_t ns = cols / TSR_Q6K_GGUF_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t sb = 0; sb < ns; sb++) {
            const uint8_t *src = blocks + ((size_t)r * (size_t)ns + (size_t)sb) *
                                              TSR_Q6K_GGUF_BLOCK_BYTES;
            const uint8_t *ql = src, *qh = src + 128;
            const int8_t *sc = (const int8_t *)(src + 192);
            uint8_t code[TSR_Q6K_GGUF_BLOCK];
            for (int n = 0; n < 2; n++) {
                for (int l = 0; l < 32; l++) {
                    uint8_t a = ql[64 * n + l], b = ql[64 * n + 32 + l], h = qh[32 * n + l];
                    code[128 * n + l] = (uint8_t)((a & 15) | (h & 3) << 4);
                    code[128 * n + 32 + l] = (uint8_t)((b & 15) | (h >> 2 & 3) << 4);
                    code[128 * n + 64 + l] = (uint8_t)((a >> 4) | (h >> 4 & 3) << 4);
                    code[128 * n + 96 + l] = (uint8_t)((b >> 4) | (h >> 6 & 3) << 4);
                }
            }
            tsr__q6k_row v = {.d = (uint16_t)(src[208] | src[209] << 8)};
            for (int u = 0; u < TSR_Q6K_GGUF_BLOCK / TSR_Q6K_BLOCK; u++) {
                memcpy(v.code, code + TSR_Q6K_BLOCK * u, TSR_Q6K_BLOCK);
                v.sc[0] = sc[2 * u];
                v.sc[1] = sc[2 * u + 1];
                int64_t b = sb * (TSR_Q6K_GGUF_BLOCK / TSR_Q6K_BLOCK) + u;
                tsr__q6k_put(tsr__q6k_gb(packed, cols, r, b), (int)(r % TSR_Q6K_GROUP), &v);
            }
        }
    }
}

void tsr_q6k_pack_q3k(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed) {
    tsr_tensor q = {.dtype = TSR_Q6_K, .rows = rows, .cols = cols};
    memset(packed, 0, tsr_tensor_bytes(&q));
    int64_t ns = cols / TSR_Q6K_GGUF_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t sb = 0; sb < ns; sb++) {
            const uint8_t *src = blocks + ((size_t)r * (size_t)ns + (size_t)sb) *
                                              TSR_Q3K_GGUF_BLOCK_BYTES;
            const uint8_t *hm = src, *qs = src + 32, *sc = src + 96;
            tsr__q6k_row v = {.d = (uint16_t)(src[108] | src[109] << 8)};
            for (int u = 0; u < TSR_Q6K_GGUF_BLOCK / TSR_Q6K_BLOCK; u++) {
                for (int k = 0; k < 2; k++) { /* the scales of sub-blocks 2u and 2u + 1 */
                    int j = 2 * u + k;
                    int lo = sc[j % 8] >> (4 * (j / 8)) & 15;
                    int hi = sc[8 + j % 4] >> (2 * (j / 4)) & 3;
                    v.sc[k] = (int8_t)((lo | hi << 4) - 32);
                }
                for (int e = 0; e < TSR_Q6K_BLOCK; e++) { /* code q - 4 h' as q + 32 */
                    int c = TSR_Q6K_BLOCK * u + e, h = c / 128, s = c / 32 % 4, l = c % 32;
                    int q3 = (qs[32 * h + l] >> (2 * s) & 3) - (hm[l] >> (4 * h + s) & 1 ? 0 : 4);
                    v.code[e] = (uint8_t)(q3 + 32);
                }
                int64_t b = sb * (TSR_Q6K_GGUF_BLOCK / TSR_Q6K_BLOCK) + u;
                tsr__q6k_put(tsr__q6k_gb(packed, cols, r, b), (int)(r % TSR_Q6K_GROUP), &v);
            }
        }
    }
}

void tsr_q6k_dequant_row(const void *packed, int64_t cols, int64_t r, float *out) {
    for (int64_t b = 0; b < cols / TSR_Q6K_BLOCK; b++) {
        tsr__q6k_row v;
        tsr__q6k_get(tsr__q6k_gb(packed, cols, r, b), (int)(r % TSR_Q6K_GROUP), &v);
        float d = tsr_f16_to_f32(v.d);
        for (int k = 0; k < TSR_Q6K_BLOCK; k++)
            out[b * TSR_Q6K_BLOCK + k] = (d * (float)v.sc[k / 16]) * (float)(v.code[k] - 32);
    }
}

/* The layout of quant_q6k.h plane by plane, for the shared slicer. */
static const tsr_qplanes tsr__q6k_planes = {
    .dtype = TSR_Q6_K,
    .gbb = TSR__Q6K_GBB,
    .n = 8,
    .p = {{0, 2}, {TSR__Q6K_SC, 2}, {TSR__Q6K_QL, 4}, {TSR__Q6K_QL + 64, 4},
          {TSR__Q6K_QL + 128, 4}, {TSR__Q6K_QL + 192, 4}, {TSR__Q6K_QHA, 4}, {TSR__Q6K_QHB, 4}},
};

tsr_status tsr_q6k_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         void *dst) {
    return tsr_qplanes_slice(&tsr__q6k_planes, src, r0, r1, c0, c1, dst);
}

void tsr__q6k_act_sums(const int8_t *xq, int64_t cols, int32_t *xs) {
    for (int64_t b = 0; b < cols / TSR_Q6K_BLOCK; b++) {
        int32_t s[2] = {0, 0};
        for (int k = 0; k < TSR_Q6K_BLOCK; k++) s[k / 16] += xq[b * TSR_Q6K_BLOCK + k];
        xs[b] = (int32_t)(((uint32_t)s[0] & 0xffffu) | (uint32_t)s[1] << 16);
    }
}

/* ---------------------------------------------------------------- scalar ---- */

typedef struct {
    float v[16];
} tsr__q6k_acc16;

/* Block b of a group for nx tokens: per row the exact isum of quant_q6k.h (from the signed
 * codes: the reference needs no xs) and one fma. */
static inline void tsr__q6k_s_block(const uint8_t *wb, const int8_t *xq, const float *xd,
                                    const int32_t *xs, int64_t nb, int64_t b, int nx,
                                    tsr__q6k_acc16 *acc) {
    (void)xs;
    for (int j = 0; j < 16; j++) {
        tsr__q6k_row v;
        tsr__q6k_get(wb, j, &v);
        float dw = tsr_f16_to_f32(v.d);
        for (int i = 0; i < nx; i++) {
            const int8_t *x = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q6K_BLOCK;
            int32_t half[2] = {0, 0};
            for (int k = 0; k < TSR_Q6K_BLOCK; k++)
                half[k / 16] += ((int32_t)v.code[k] - 32) * x[k];
            int32_t isum = v.sc[0] * half[0] + v.sc[1] * half[1];
            float dd = dw * xd[(size_t)i * (size_t)nb + (size_t)b];
            acc[i].v[j] = fmaf((float)isum, dd, acc[i].v[j]);
        }
    }
}

#define TSR__Q6K_S_STORE(dst, a) memcpy(dst, (a).v, sizeof(a).v)
#define TSR__Q6K_S_ZERO ((tsr__q6k_acc16){{0}})

static inline void tsr__q6k_s_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                      int64_t g1, const int8_t *xq, const float *xd,
                                      const int32_t *xs, int nx, const int32_t *bseg,
                                      int n_parts, bool sum, float *y, int64_t ldy,
                                      int64_t ldp) {
    TSR__QGEMV_BODY(nx, TSR__Q6K_GBB, tsr__q6k_s_block, tsr__q6k_acc16, TSR__Q6K_S_ZERO,
                    TSR__Q6K_S_STORE)
}

TSR__Q8_GEMV_FN(tsr__q6k_s_gemv, tsr__q6k_s_gemv_nx)

static const tsr__q6k_kernels tsr__q6k_k_scalar = {TSR__Q8_SCALAR, "scalar", tsr__q6k_s_gemv};

const tsr__q6k_kernels *tsr__q6k_kernels_for(tsr__q8_variant v) {
    if (v == TSR__Q8_SCALAR) return &tsr__q6k_k_scalar;
#if defined(__x86_64__) || defined(__i386__)
    /* the Q8_0 variant's CPU check; AVX-VNNI runs the AVX2 kernel (it includes AVX2) */
    if (!tsr__q8_kernels_for(v)) return NULL;
    return v == TSR__Q8_AVX512VNNI ? &tsr__q6k_k_avx512vnni : &tsr__q6k_k_avx2;
#else
    return NULL;
#endif
}

const tsr__q6k_kernels *tsr__q6k_kernels_get(void) {
    const tsr__q6k_kernels *k = tsr__q6k_kernels_for(tsr__q8_kernels_get()->variant);
    return k ? k : &tsr__q6k_k_scalar;
}
