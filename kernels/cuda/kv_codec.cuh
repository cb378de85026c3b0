// Device side of the KV storage dtypes (kernels/kv_dtype.h: the byte formats and why):
// f32, bf16, q8 (blocks of 32: an f32 scale, then 32 int8) and fp8 (an f32 scale per row,
// then E4M3 bytes). Rows are addressed whole: element offsets are multiples of the row.
#ifndef TSR_KERNELS_CUDA_KV_CODEC_CUH
#define TSR_KERNELS_CUDA_KV_CODEC_CUH

#include <stdint.h>

namespace tsr_kv {

enum { F32 = 0, BF16 = 1, Q8 = 2, FP8 = 3, Q8_BLOCK = 32 };

__host__ __device__ __forceinline__ int64_t row_bytes(int dtype, int64_t row) {
    switch (dtype) {
    case BF16: return row * 2;
    case Q8: return row / Q8_BLOCK * (4 + Q8_BLOCK);
    case FP8: return 4 + row;
    default: return row * 4;
    }
}

// The stored row `elems` elements (a multiple of row) from base.
__host__ __device__ __forceinline__ const uint8_t *row_at(const void *base, int dtype, int64_t row,
                                                          int64_t elems) {
    return static_cast<const uint8_t *>(base) + elems / row * row_bytes(dtype, row);
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    v = e == 0 ? ldexpf(static_cast<float>(m), -9) : ldexpf(static_cast<float>(8 + m), e - 10);
    return (b & 0x80) ? -v : v;
}

__device__ __forceinline__ uint8_t f32_to_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < ldexpf(1.0f, -6)) return sign | static_cast<uint8_t>(rintf(a * 512.0f));
    int e;
    frexpf(a, &e);
    int ub = e - 1;
    int q = static_cast<int>(rintf(ldexpf(a, 3 - ub)));
    if (q == 16) {
        q = 8;
        ub++;
    }
    int code = ((ub + 7) << 3) | (q - 8);
    return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

// Element c of the stored row r (row elements).
__device__ __forceinline__ float load(const uint8_t *r, int dtype, int64_t c) {
    switch (dtype) {
    case BF16: {
        const uint16_t h = reinterpret_cast<const uint16_t *>(r)[c];
        return __uint_as_float(static_cast<uint32_t>(h) << 16);
    }
    case Q8: {
        const uint8_t *b = r + c / Q8_BLOCK * (4 + Q8_BLOCK);
        float d;
        memcpy(&d, b, 4);
        return d * static_cast<float>(static_cast<int8_t>(b[4 + c % Q8_BLOCK]));
    }
    case FP8: {
        float d;
        memcpy(&d, r, 4);
        return d * e4m3_to_f32(r[4 + c]);
    }
    default: return reinterpret_cast<const float *>(r)[c];
    }
}

__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

} // namespace tsr_kv

#endif
