/* MXFP4 (OCP microscaling FP4, the GPT-OSS expert format; base/tensor.h tsr_experts): the
 * decode of a row and a matrix product that decodes each weight row once for all inputs,
 * so an expert's 4-bit weights are read once per step however many tokens it serves.
 * Decode: E2M1 code (bit 3 the sign) of the 16-entry table below, times the f32 2^(scale -
 * 127), as transformers' torch.ldexp does in float32: exact for every code and scale byte
 * (scale 0 gives subnormals; 255 is 2^128 = inf in f32, so its zero codes give NaN).
 * The product has AVX2 and AVX-512 variants (mxfp4_avx2.c, mxfp4_avx512.c) with the scalar
 * kernel's bits, chosen by the CPU backend's ISA (mxfp4_internal.h). */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/mxfp4_internal.h"

static const float tsr__fp4[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* 2^(s - 127) in f32: the byte as the exponent field (s = 0: the subnormal 2^-127; s = 255:
 * inf). */
static inline float tsr__e8m0(uint8_t s) {
    uint32_t u = s ? (uint32_t)s << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void tsr__mxfp4_row(const uint8_t *blocks, const uint8_t *scales, int64_t cols, float *out) {
    for (int64_t b = 0; b < cols / 32; b++) {
        float sc = tsr__e8m0(scales[b]);
        const uint8_t *q = blocks + (size_t)b * 16;
        float *o = out + (size_t)b * 32;
        for (int j = 0; j < 16; j++) { /* element 2j: low nibble; 2j + 1: high nibble */
            o[2 * j] = tsr__fp4[q[j] & 15] * sc;
            o[2 * j + 1] = tsr__fp4[q[j] >> 4] * sc;
        }
    }
}

static void tsr__mxfp4_rows_scalar(const uint8_t *blocks, const uint8_t *scales, int64_t r0,
                            int64_t r1, int64_t rows, int64_t cols, const float *x, int64_t nx,
                            float *y, float *w) {
    for (int64_t r = r0; r < r1; r++) {
        tsr__mxfp4_row(blocks + (size_t)r * (size_t)(cols / 2),
                       scales + (size_t)r * (size_t)(cols / 32), cols, w);
        for (int64_t i = 0; i < nx; i++) {
            /* 32 running sums, one per block position (cols is a multiple of 32): the
             * compiler keeps them in vector lanes; fixed order, so the result depends only
             * on the row and the input (mxfp4_internal.h) */
            const float *xi = x + (size_t)i * (size_t)cols;
            float acc[32] = {0};
            for (int64_t c = 0; c < cols; c += 32)
                for (int k = 0; k < 32; k++) acc[k] += w[c + k] * xi[c + k];
            y[(size_t)i * (size_t)rows + (size_t)r] = tsr__mxfp4_fold32(acc);
        }
    }
}

tsr__mxfp4_rows_fn tsr__mxfp4_rows_for(tsr__cpu_isa isa) {
    switch (isa) {
    case TSR__ISA_SCALAR: return tsr__mxfp4_rows_scalar;
#if defined(__x86_64__) || defined(__i386__)
    case TSR__ISA_AVX2: return tsr__cpu_kernels_for(TSR__ISA_AVX2) ? tsr__mxfp4_rows_avx2 : NULL;
    case TSR__ISA_AVX512:
        return tsr__cpu_kernels_for(TSR__ISA_AVX512) ? tsr__mxfp4_rows_avx512 : NULL;
#endif
    default: return NULL;
    }
}

void tsr__mxfp4_matmul(const uint8_t *blocks, const uint8_t *scales, int64_t rows, int64_t cols,
                       const float *x, int64_t nx, float *y, int threads) {
    /* the CPU backend's ISA (cached there; TSR_CPU_ISA caps it) */
    tsr__mxfp4_rows_fn rows_fn = tsr__mxfp4_rows_for(tsr__cpu_kernels_get()->isa);
    if (!rows_fn) rows_fn = tsr__mxfp4_rows_scalar;
    int nt = threads > 1 && rows * cols * nx >= 65536 ? threads : 1;
    if (nt == 1) {
        float stack[4096];
        float *w = cols <= 4096 ? stack : tsr_malloc((size_t)cols * sizeof *w);
        if (!w) return; /* unreachable in practice: cols is a model width */
        rows_fn(blocks, scales, 0, rows, rows, cols, x, nx, y, w);
        if (w != stack) tsr_free(w);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        float stack[4096];
        float *w = cols <= 4096 ? stack : tsr_malloc((size_t)cols * sizeof *w);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            if (w) rows_fn(blocks, scales, r, r + 1, rows, cols, x, nx, y, w);
        if (w != stack) tsr_free(w);
    }
}
