/* KV storage element types (see kv_dtype.h). */
#include "kernels/kv_dtype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"

static const char *const tsr__kv_names[] = {"f32", "bf16", "q8", "fp8"};

const char *tsr_kv_dtype_name(int dtype) {
    return dtype >= 0 && dtype <= TSR_KV_FP8 ? tsr__kv_names[dtype] : "?";
}

int tsr_kv_dtype_parse(const char *s) {
    if (!s) return -1;
    for (int i = 0; i <= TSR_KV_FP8; i++)
        if (!strcmp(s, tsr__kv_names[i])) return i;
    return -1;
}

size_t tsr_kv_row_bytes(int dtype, int64_t row) {
    if (row <= 0) return 0;
    switch (dtype) {
    case TSR_KV_F32: return (size_t)row * 4;
    case TSR_KV_BF16: return (size_t)row * 2;
    case TSR_KV_Q8:
        if (row % TSR_KV_Q8_BLOCK) return 0;
        return (size_t)(row / TSR_KV_Q8_BLOCK) * TSR_KV_Q8_BLOCK_BYTES;
    case TSR_KV_FP8: return 4 + (size_t)row;
    default: return 0;
    }
}

int tsr_kv_dtype_fits(int dtype, int head_dim) {
    if (dtype < 0 || dtype > TSR_KV_FP8 || head_dim <= 0) return 0;
    return dtype != TSR_KV_Q8 || head_dim % TSR_KV_Q8_BLOCK == 0;
}

/* E4M3 (float8_e4m3fn) by code: bit 7 the sign, then e (4 bits) and m (3 bits); a normal
 * is (1 + m/8) 2^(e-7), e = 0 the subnormal m 2^-9, 0x7f and 0xff NaN (no infinities).
 * A table rather than arithmetic: attention decodes every fp8 key and value of a span
 * through it, and a libm call per element (ldexpf) made an fp8 cache several times slower
 * than q8. test_kv_dtype checks all 256 entries against PyTorch's float8_e4m3fn. */
static const float tsr__e4m3_lut[256] = {
    0.0f, 0x1p-9f, 0x1p-8f, 0x1.8p-8f, 0x1p-7f, 0x1.4p-7f, 0x1.8p-7f, 0x1.cp-7f,
    0x1p-6f, 0x1.2p-6f, 0x1.4p-6f, 0x1.6p-6f, 0x1.8p-6f, 0x1.ap-6f, 0x1.cp-6f, 0x1.ep-6f,
    0x1p-5f, 0x1.2p-5f, 0x1.4p-5f, 0x1.6p-5f, 0x1.8p-5f, 0x1.ap-5f, 0x1.cp-5f, 0x1.ep-5f,
    0x1p-4f, 0x1.2p-4f, 0x1.4p-4f, 0x1.6p-4f, 0x1.8p-4f, 0x1.ap-4f, 0x1.cp-4f, 0x1.ep-4f,
    0x1p-3f, 0x1.2p-3f, 0x1.4p-3f, 0x1.6p-3f, 0x1.8p-3f, 0x1.ap-3f, 0x1.cp-3f, 0x1.ep-3f,
    0x1p-2f, 0x1.2p-2f, 0x1.4p-2f, 0x1.6p-2f, 0x1.8p-2f, 0x1.ap-2f, 0x1.cp-2f, 0x1.ep-2f,
    0x1p-1f, 0x1.2p-1f, 0x1.4p-1f, 0x1.6p-1f, 0x1.8p-1f, 0x1.ap-1f, 0x1.cp-1f, 0x1.ep-1f,
    0x1p+0f, 0x1.2p+0f, 0x1.4p+0f, 0x1.6p+0f, 0x1.8p+0f, 0x1.ap+0f, 0x1.cp+0f, 0x1.ep+0f,
    0x1p+1f, 0x1.2p+1f, 0x1.4p+1f, 0x1.6p+1f, 0x1.8p+1f, 0x1.ap+1f, 0x1.cp+1f, 0x1.ep+1f,
    0x1p+2f, 0x1.2p+2f, 0x1.4p+2f, 0x1.6p+2f, 0x1.8p+2f, 0x1.ap+2f, 0x1.cp+2f, 0x1.ep+2f,
    0x1p+3f, 0x1.2p+3f, 0x1.4p+3f, 0x1.6p+3f, 0x1.8p+3f, 0x1.ap+3f, 0x1.cp+3f, 0x1.ep+3f,
    0x1p+4f, 0x1.2p+4f, 0x1.4p+4f, 0x1.6p+4f, 0x1.8p+4f, 0x1.ap+4f, 0x1.cp+4f, 0x1.ep+4f,
    0x1p+5f, 0x1.2p+5f, 0x1.4p+5f, 0x1.6p+5f, 0x1.8p+5f, 0x1.ap+5f, 0x1.cp+5f, 0x1.ep+5f,
    0x1p+6f, 0x1.2p+6f, 0x1.4p+6f, 0x1.6p+6f, 0x1.8p+6f, 0x1.ap+6f, 0x1.cp+6f, 0x1.ep+6f,
    0x1p+7f, 0x1.2p+7f, 0x1.4p+7f, 0x1.6p+7f, 0x1.8p+7f, 0x1.ap+7f, 0x1.cp+7f, 0x1.ep+7f,
    0x1p+8f, 0x1.2p+8f, 0x1.4p+8f, 0x1.6p+8f, 0x1.8p+8f, 0x1.ap+8f, 0x1.cp+8f, NAN,
    -0.0f, -0x1p-9f, -0x1p-8f, -0x1.8p-8f, -0x1p-7f, -0x1.4p-7f, -0x1.8p-7f, -0x1.cp-7f,
    -0x1p-6f, -0x1.2p-6f, -0x1.4p-6f, -0x1.6p-6f, -0x1.8p-6f, -0x1.ap-6f, -0x1.cp-6f, -0x1.ep-6f,
    -0x1p-5f, -0x1.2p-5f, -0x1.4p-5f, -0x1.6p-5f, -0x1.8p-5f, -0x1.ap-5f, -0x1.cp-5f, -0x1.ep-5f,
    -0x1p-4f, -0x1.2p-4f, -0x1.4p-4f, -0x1.6p-4f, -0x1.8p-4f, -0x1.ap-4f, -0x1.cp-4f, -0x1.ep-4f,
    -0x1p-3f, -0x1.2p-3f, -0x1.4p-3f, -0x1.6p-3f, -0x1.8p-3f, -0x1.ap-3f, -0x1.cp-3f, -0x1.ep-3f,
    -0x1p-2f, -0x1.2p-2f, -0x1.4p-2f, -0x1.6p-2f, -0x1.8p-2f, -0x1.ap-2f, -0x1.cp-2f, -0x1.ep-2f,
    -0x1p-1f, -0x1.2p-1f, -0x1.4p-1f, -0x1.6p-1f, -0x1.8p-1f, -0x1.ap-1f, -0x1.cp-1f, -0x1.ep-1f,
    -0x1p+0f, -0x1.2p+0f, -0x1.4p+0f, -0x1.6p+0f, -0x1.8p+0f, -0x1.ap+0f, -0x1.cp+0f, -0x1.ep+0f,
    -0x1p+1f, -0x1.2p+1f, -0x1.4p+1f, -0x1.6p+1f, -0x1.8p+1f, -0x1.ap+1f, -0x1.cp+1f, -0x1.ep+1f,
    -0x1p+2f, -0x1.2p+2f, -0x1.4p+2f, -0x1.6p+2f, -0x1.8p+2f, -0x1.ap+2f, -0x1.cp+2f, -0x1.ep+2f,
    -0x1p+3f, -0x1.2p+3f, -0x1.4p+3f, -0x1.6p+3f, -0x1.8p+3f, -0x1.ap+3f, -0x1.cp+3f, -0x1.ep+3f,
    -0x1p+4f, -0x1.2p+4f, -0x1.4p+4f, -0x1.6p+4f, -0x1.8p+4f, -0x1.ap+4f, -0x1.cp+4f, -0x1.ep+4f,
    -0x1p+5f, -0x1.2p+5f, -0x1.4p+5f, -0x1.6p+5f, -0x1.8p+5f, -0x1.ap+5f, -0x1.cp+5f, -0x1.ep+5f,
    -0x1p+6f, -0x1.2p+6f, -0x1.4p+6f, -0x1.6p+6f, -0x1.8p+6f, -0x1.ap+6f, -0x1.cp+6f, -0x1.ep+6f,
    -0x1p+7f, -0x1.2p+7f, -0x1.4p+7f, -0x1.6p+7f, -0x1.8p+7f, -0x1.ap+7f, -0x1.cp+7f, -0x1.ep+7f,
    -0x1p+8f, -0x1.2p+8f, -0x1.4p+8f, -0x1.6p+8f, -0x1.8p+8f, -0x1.ap+8f, -0x1.cp+8f, NAN,
};

float tsr_e4m3_to_f32(uint8_t b) { return tsr__e4m3_lut[b]; }

uint8_t tsr_f32_to_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e; /* saturate (no infinity in e4m3fn) */
    if (a < ldexpf(1.0f, -6)) {
        /* subnormals step by 2^-9; rintf rounds half to even */
        int m = (int)rintf(a * 512.0f);
        return sign | (uint8_t)m; /* m == 8 is the smallest normal's code */
    }
    int e;
    (void)frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1): exponent e - 1 */
    int ub = e - 1;      /* unbiased, -6 .. 8 */
    int q = (int)rintf(ldexpf(a, 3 - ub)); /* 8 .. 16 */
    if (q == 16) {
        q = 8;
        ub++;
    }
    int code = ((ub + 7) << 3) | (q - 8);
    if (code > 0x7e) code = 0x7e;
    return sign | (uint8_t)code;
}

static float tsr__amax(const float *x, int64_t n) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        a = v > a ? v : a;
    }
    return a;
}

void tsr_kv_rows_encode(int dtype, const float *src, int64_t src_ld, void *dst, int64_t n,
                        int64_t row) {
    size_t rb = tsr_kv_row_bytes(dtype, row);
    for (int64_t i = 0; i < n; i++) {
        const float *x = src + i * src_ld;
        uint8_t *o = (uint8_t *)dst + (size_t)i * rb;
        switch (dtype) {
        case TSR_KV_F32: memcpy(o, x, rb); break;
        case TSR_KV_BF16:
            for (int64_t c = 0; c < row; c++) {
                uint16_t h = tsr_f32_to_bf16(x[c]);
                memcpy(o + 2 * c, &h, 2);
            }
            break;
        case TSR_KV_Q8:
            for (int64_t b = 0; b < row / TSR_KV_Q8_BLOCK; b++) {
                const float *xb = x + b * TSR_KV_Q8_BLOCK;
                uint8_t *ob = o + b * TSR_KV_Q8_BLOCK_BYTES;
                float d = tsr__amax(xb, TSR_KV_Q8_BLOCK) / 127.0f;
                float id = d > 0.0f ? 1.0f / d : 0.0f;
                memcpy(ob, &d, 4);
                for (int c = 0; c < TSR_KV_Q8_BLOCK; c++)
                    ob[4 + c] = (uint8_t)(int8_t)lrintf(xb[c] * id);
            }
            break;
        case TSR_KV_FP8: {
            float d = tsr__amax(x, row) / 448.0f;
            float id = d > 0.0f ? 1.0f / d : 0.0f;
            memcpy(o, &d, 4);
            for (int64_t c = 0; c < row; c++) o[4 + c] = tsr_f32_to_e4m3(x[c] * id);
            break;
        }
        default: break;
        }
    }
}

float tsr_kv_elem_decode(int dtype, const void *row, int64_t e) {
    const uint8_t *r = row;
    float d;
    switch (dtype) {
    case TSR_KV_BF16: {
        uint16_t h;
        memcpy(&h, r + 2 * e, 2);
        return tsr_bf16_to_f32(h);
    }
    case TSR_KV_Q8:
        r += (size_t)(e / TSR_KV_Q8_BLOCK) * TSR_KV_Q8_BLOCK_BYTES;
        memcpy(&d, r, 4);
        return d * (float)(int8_t)r[4 + e % TSR_KV_Q8_BLOCK];
    case TSR_KV_FP8:
        memcpy(&d, r, 4);
        return d * tsr__e4m3_lut[r[4 + e]];
    default: {
        float f;
        memcpy(&f, r + 4 * e, 4);
        return f;
    }
    }
}

void tsr_kv_rows_decode(int dtype, const void *src, float *dst, int64_t dst_ld, int64_t n,
                        int64_t row) {
    size_t rb = tsr_kv_row_bytes(dtype, row);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *x = (const uint8_t *)src + (size_t)i * rb;
        float *o = dst + i * dst_ld;
        switch (dtype) {
        case TSR_KV_F32: memcpy(o, x, rb); break;
        case TSR_KV_BF16:
            for (int64_t c = 0; c < row; c++) {
                uint16_t h;
                memcpy(&h, x + 2 * c, 2);
                o[c] = tsr_bf16_to_f32(h);
            }
            break;
        case TSR_KV_Q8:
            for (int64_t b = 0; b < row / TSR_KV_Q8_BLOCK; b++) {
                const uint8_t *xb = x + b * TSR_KV_Q8_BLOCK_BYTES;
                float d;
                memcpy(&d, xb, 4);
                for (int c = 0; c < TSR_KV_Q8_BLOCK; c++)
                    o[b * TSR_KV_Q8_BLOCK + c] = d * (float)(int8_t)xb[4 + c];
            }
            break;
        case TSR_KV_FP8: {
            float d;
            memcpy(&d, x, 4);
            for (int64_t c = 0; c < row; c++) o[c] = d * tsr__e4m3_lut[x[4 + c]];
            break;
        }
        default: break;
        }
    }
}
