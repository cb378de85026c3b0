/* Element types of weights and activations, and scalar conversions. */
#ifndef TSR_BASE_DTYPE_H
#define TSR_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum tsr_dtype {
    TSR_F32 = 0,
    TSR_F16 = 1,
    TSR_BF16 = 2,
    /* Raw bytes: MXFP4 blocks and E8M0 scales (tsr_experts); no kernel takes them as a
     * plain matrix. */
    TSR_U8 = 3,
    /* Q8_0 (GGUF's numerics: blocks of 32 int8 along a row with an fp16 scale), stored as
     * kernels/cpu/quant_q8.h's repacked 16-row groups; matrices only (cols % 32 == 0). */
    TSR_Q8_0 = 4,
    /* GGUF's 4-bit Q4_0 and Q4_1 (32-value blocks: fp16 d, and for Q4_1 fp16 m, then 4-bit
     * codes), stored as kernels/cpu/quant_q4.h's repacked 16-row groups; matrices only. */
    TSR_Q4_0 = 5,
    TSR_Q4_1 = 6,
    /* GGUF's Q4_K (256-value super-blocks: fp16 d and dmin, 6-bit scales and mins of 8
     * sub-blocks of 32, 4-bit codes), stored as kernels/cpu/quant_q4k.h's repacked 16-row
     * groups; matrices only (cols % 256 == 0), loaded from GGUF files (no quantizer). */
    TSR_Q4_K = 7,
    /* FP8 E4M3 (float8_e4m3fn) weights with one f32 scale per row (compressed-tensors'
     * per-channel strategy; a per-tensor scale is stored once per row): the rows * cols
     * codes row-major, then at tsr_fp8_scale_offset the rows scales. Matrices only;
     * runtime/model/fp8.h loads and converts them. */
    TSR_F8_E4M3 = 8,
    /* MXFP4 experts (GPT-OSS) repacked for the CPU's integer kernels (kernels/cpu/quant_q4.h:
     * 16-row groups, per 32-column block the 16 rows' E8M0 scale bytes, then the 4-bit codes
     * in Q4_0's layout). Only a tsr_experts' w holds it; the plain form is TSR_U8 blocks and
     * scales. */
    TSR_MXFP4 = 9,
    /* GGUF's Q6_K (256-value blocks: 6-bit codes, int8 scales per 16 values, fp16 d), stored
     * as kernels/cpu/quant_q6k.h's repacked 16-row groups of 32-column blocks (d repeated per
     * block); matrices only, loaded from GGUF files (no quantizer). */
    TSR_Q6_K = 10,
    /* GGUF's Q5_K (256-value blocks: fp16 d and dmin, 6-bit scales and mins per 32 values,
     * 5-bit codes), stored as kernels/cpu/quant_q5k.h's repacked 16-row groups of 32-column
     * blocks; matrices only, loaded from GGUF files (no quantizer). */
    TSR_Q5_K = 11,
} tsr_dtype;

/* Bytes per element; Q8_0, Q4_*, Q5_K, Q6_K, F8_E4M3 and MXFP4: 1 (their scales are counted by
 * tsr_tensor_bytes). */
size_t tsr_dtype_size(tsr_dtype t);
const char *tsr_dtype_name(tsr_dtype t);
/* Parses "f32"/"float32"/"F32", "f16"/"float16", "bf16"/"bfloat16", "q8_0"/"q8", "q4_0",
 * "q4_1", "fp8"/"f8_e4m3"; -1 when unknown. */
int tsr_dtype_parse(const char *s);

static inline float tsr_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet (the same rounding as torch). */
static inline uint16_t tsr_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tsr_f16_to_f32(uint16_t h);
uint16_t tsr_f32_to_f16(float f);

/* Converts n elements of type `t` at `src` to f32. */
void tsr_dtype_to_f32(tsr_dtype t, const void *src, float *dst, size_t n);

#endif
