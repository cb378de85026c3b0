#include "base/dtype.h"

#include <strings.h>

size_t tsr_dtype_size(tsr_dtype t) {
    switch (t) {
    case TSR_F32: return 4;
    case TSR_U8:
    case TSR_Q8_0:
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_Q4_K:
    case TSR_Q5_K:
    case TSR_Q6_K:
    case TSR_F8_E4M3:
    case TSR_MXFP4: return 1;
    default: return 2;
    }
}

const char *tsr_dtype_name(tsr_dtype t) {
    switch (t) {
    case TSR_F32: return "f32";
    case TSR_F16: return "f16";
    case TSR_BF16: return "bf16";
    case TSR_U8: return "u8";
    case TSR_Q8_0: return "q8_0";
    case TSR_F8_E4M3: return "fp8";
    case TSR_Q4_0: return "q4_0";
    case TSR_Q4_1: return "q4_1";
    case TSR_Q4_K: return "q4_k";
    case TSR_Q5_K: return "q5_k";
    case TSR_Q6_K: return "q6_k";
    case TSR_MXFP4: return "mxfp4";
    }
    return "?";
}

int tsr_dtype_parse(const char *s) {
    if (!strcasecmp(s, "f32") || !strcasecmp(s, "float32") || !strcasecmp(s, "float"))
        return TSR_F32;
    if (!strcasecmp(s, "f16") || !strcasecmp(s, "float16") || !strcasecmp(s, "half"))
        return TSR_F16;
    if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16")) return TSR_BF16;
    if (!strcasecmp(s, "q8_0") || !strcasecmp(s, "q8")) return TSR_Q8_0;
    if (!strcasecmp(s, "fp8") || !strcasecmp(s, "f8_e4m3")) return TSR_F8_E4M3;
    if (!strcasecmp(s, "q4_0")) return TSR_Q4_0;
    if (!strcasecmp(s, "q4_1")) return TSR_Q4_1;
    return -1;
}

float tsr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t tsr_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)half;
}

void tsr_dtype_to_f32(tsr_dtype t, const void *src, float *dst, size_t n) {
    switch (t) {
    case TSR_F32: memcpy(dst, src, n * 4); break;
    case TSR_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = tsr_bf16_to_f32(s[i]);
        break;
    }
    case TSR_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = tsr_f16_to_f32(s[i]);
        break;
    }
    case TSR_U8: { /* raw bytes as their values (MXFP4 codes are decoded by their kernel) */
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    case TSR_Q8_0: /* blocks, not elements: kernels/cpu/quant_q8.h dequantizes rows */
    case TSR_F8_E4M3: /* scaled rows: runtime/model/fp8.h dequantizes them */
    case TSR_Q4_0: /* and kernels/cpu/quant_q4.h */
    case TSR_Q4_1:
    case TSR_Q4_K: /* and kernels/cpu/quant_q4k.h */
    case TSR_Q5_K: /* and kernels/cpu/quant_q5k.h */
    case TSR_Q6_K: /* and kernels/cpu/quant_q6k.h */
    case TSR_MXFP4:
        memset(dst, 0, n * sizeof *dst);
        break;
    }
}
