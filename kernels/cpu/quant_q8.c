/* Q8_0 quantizer, repacking, the scalar reference kernel and the choice of kernel variant
 * (quant_q8.h, quant_q8_internal.h). No target pragma here: this file runs on any CPU. */
#include "kernels/cpu/quant_q8_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#define TSR__Q8_X86 1
#include <cpuid.h>
#endif

/* One block as ggml's quantize_row_q8_0_ref: d = amax / 127 in f32, id = 1 / d (0 for an
 * all-zero block), q = roundf(x * id) (half away from zero), fp16(d) stored. */
/* Returns the block's scale before fp16 rounding, max |x| / 127 (Q4_1's activation sums use it). */
static float tsr__q8_block(const float *x, int8_t *q, uint16_t *dh) {
    float amax = 0.0f;
    for (int j = 0; j < TSR_Q8_BLOCK; j++) {
        float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    /* roundf without the libm call: |v| <= 127.5, so the truncation i and v - i are exact,
     * and a fraction of at least one half rounds away from zero as roundf does */
    for (int j = 0; j < TSR_Q8_BLOCK; j++) {
        float v = x[j] * id;
        int i = (int)v;
        float f = v - (float)i;
        i += (f >= 0.5f) - (f <= -0.5f);
        q[j] = (int8_t)i;
    }
    *dh = tsr_f32_to_f16(d);
    return d;
}

void tsr_q8_quantize_blocks(const float *x, int64_t n, uint8_t *blocks) {
    for (int64_t b = 0; b < n / TSR_Q8_BLOCK; b++) {
        uint8_t *o = blocks + (size_t)b * TSR_Q8_BLOCK_BYTES;
        uint16_t dh;
        int8_t q[TSR_Q8_BLOCK];
        tsr__q8_block(x + (size_t)b * TSR_Q8_BLOCK, q, &dh);
        o[0] = (uint8_t)(dh & 0xff); /* little-endian fp16, as GGUF stores it */
        o[1] = (uint8_t)(dh >> 8);
        memcpy(o + 2, q, TSR_Q8_BLOCK);
    }
}

void tsr__q8_quantize_act(const float *x, int64_t cols, int8_t *qs, float *d, int32_t *bsum,
                          float *xm) {
    for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
        uint16_t dh;
        const float *xb = x + (size_t)b * TSR_Q8_BLOCK;
        int8_t *q = qs + (size_t)b * TSR_Q8_BLOCK;
        float dd = tsr__q8_block(xb, q, &dh);
        int32_t s = 0;
        for (int j = 0; j < TSR_Q8_BLOCK; j++) s += q[j];
        d[b] = tsr_f16_to_f32(dh);
        bsum[b] = s;
        if (xm) xm[b] = tsr_f16_to_f32(tsr_f32_to_f16((float)s * dd));
    }
}

bool tsr_q8_fits(int64_t rows, int64_t cols) {
    return rows > 0 && cols > 0 && cols % TSR_Q8_BLOCK == 0;
}

/* Block b of row r's group; row r's slot j within it. */
static uint8_t *tsr__q8_group_block(uint8_t *packed, int64_t cols, int64_t r, int64_t b) {
    int64_t nb = cols / TSR_Q8_BLOCK;
    return packed + ((size_t)(r / TSR_Q8_GROUP) * (size_t)nb + (size_t)b) *
                        TSR_Q8_GROUP_BLOCK_BYTES;
}

void tsr_q8_pack_row(uint8_t *packed, int64_t cols, int64_t r, const uint8_t *blocks) {
    int j = (int)(r % TSR_Q8_GROUP);
    for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
        uint8_t *gb = tsr__q8_group_block(packed, cols, r, b);
        const uint8_t *src = blocks + (size_t)b * TSR_Q8_BLOCK_BYTES;
        gb[2 * j] = src[0];
        gb[2 * j + 1] = src[1];
        for (int s = 0; s < 8; s++)
            for (int t = 0; t < 4; t++)
                gb[32 + s * 64 + j * 4 + t] = (uint8_t)((int)(int8_t)src[2 + s * 4 + t] + 128);
    }
}

void tsr_q8_pack_init(uint8_t *packed, int64_t rows, int64_t cols) {
    /* A padding row: scale 0 and every weight q = 0 (stored 128), so it adds nothing. */
    int64_t rpad = (rows + TSR_Q8_GROUP - 1) / TSR_Q8_GROUP * TSR_Q8_GROUP;
    for (int64_t r = rows; r < rpad; r++) {
        int j = (int)(r % TSR_Q8_GROUP);
        for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
            uint8_t *gb = tsr__q8_group_block(packed, cols, r, b);
            gb[2 * j] = gb[2 * j + 1] = 0;
            for (int s = 0; s < 8; s++) memset(gb + 32 + s * 64 + j * 4, 128, 4);
        }
    }
}

void tsr_q8_unpack_row(const uint8_t *packed, int64_t cols, int64_t r, uint8_t *blocks) {
    int j = (int)(r % TSR_Q8_GROUP);
    for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
        const uint8_t *gb = tsr__q8_group_block((uint8_t *)packed, cols, r, b);
        uint8_t *o = blocks + (size_t)b * TSR_Q8_BLOCK_BYTES;
        o[0] = gb[2 * j];
        o[1] = gb[2 * j + 1];
        for (int s = 0; s < 8; s++)
            for (int t = 0; t < 4; t++)
                o[2 + s * 4 + t] = (uint8_t)(int8_t)((int)gb[32 + s * 64 + j * 4 + t] - 128);
    }
}

void tsr_q8_dequant_row(const uint8_t *packed, int64_t cols, int64_t r, float *out) {
    int j = (int)(r % TSR_Q8_GROUP);
    for (int64_t b = 0; b < cols / TSR_Q8_BLOCK; b++) {
        const uint8_t *gb = tsr__q8_group_block((uint8_t *)packed, cols, r, b);
        float d = tsr_f16_to_f32((uint16_t)(gb[2 * j] | gb[2 * j + 1] << 8));
        for (int s = 0; s < 8; s++)
            for (int t = 0; t < 4; t++)
                out[b * TSR_Q8_BLOCK + s * 4 + t] =
                    (float)((int)gb[32 + s * 64 + j * 4 + t] - 128) * d;
    }
}

void tsr_q8_pack_gguf(const uint8_t *blocks, int64_t rows, int64_t cols, void *packed) {
    size_t rb = (size_t)(cols / TSR_Q8_BLOCK) * TSR_Q8_BLOCK_BYTES;
    tsr_q8_pack_init(packed, rows, cols);
    for (int64_t r = 0; r < rows; r++) tsr_q8_pack_row(packed, cols, r, blocks + (size_t)r * rb);
}

tsr_status tsr_q8_slice(const tsr_tensor *src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        void *dst) {
    if (src->dtype != TSR_Q8_0 || r0 < 0 || r1 > src->rows || r1 <= r0 || c0 < 0 ||
        c1 > src->cols || c1 <= c0 || c0 % TSR_Q8_BLOCK || c1 % TSR_Q8_BLOCK)
        return tsr_error_set(TSR_ERR_INVALID, "q8_0: cannot slice rows [%lld, %lld) columns "
                             "[%lld, %lld) of a %lldx%lld matrix", (long long)r0, (long long)r1,
                             (long long)c0, (long long)c1, (long long)src->rows,
                             (long long)src->cols);
    uint8_t *row = tsr_malloc((size_t)(src->cols / TSR_Q8_BLOCK) * TSR_Q8_BLOCK_BYTES);
    if (!row) return tsr_error_set(TSR_ERR_NOMEM, "q8_0: out of memory slicing a matrix");
    tsr_q8_pack_init(dst, r1 - r0, c1 - c0);
    for (int64_t r = r0; r < r1; r++) {
        tsr_q8_unpack_row(src->data, src->cols, r, row);
        tsr_q8_pack_row(dst, c1 - c0, r - r0,
                        row + (size_t)(c0 / TSR_Q8_BLOCK) * TSR_Q8_BLOCK_BYTES);
    }
    tsr_free(row);
    return TSR_OK;
}

tsr_status tsr_q8_quantize_tensor(const tsr_tensor *src, void *packed) {
    if (!tsr_q8_fits(src->rows, src->cols) || src->dtype == TSR_Q8_0)
        return tsr_error_set(TSR_ERR_INVALID, "q8_0: cannot quantize a %lldx%lld %s matrix",
                             (long long)src->rows, (long long)src->cols,
                             tsr_dtype_name(src->dtype));
    float *row = tsr_malloc((size_t)src->cols * sizeof *row);
    uint8_t *blocks = tsr_malloc((size_t)(src->cols / TSR_Q8_BLOCK) * TSR_Q8_BLOCK_BYTES);
    tsr_status st = TSR_OK;
    if (!row || !blocks) {
        st = tsr_error_set(TSR_ERR_NOMEM, "q8_0: out of memory quantizing a matrix");
    } else {
        tsr_q8_pack_init(packed, src->rows, src->cols);
        for (int64_t r = 0; r < src->rows; r++) {
            tsr_dtype_to_f32(src->dtype, tsr_tensor_row(src, r), row, (size_t)src->cols);
            tsr_q8_quantize_blocks(row, src->cols, blocks);
            tsr_q8_pack_row(packed, src->cols, r, blocks);
        }
    }
    tsr_free(row);
    tsr_free(blocks);
    return st;
}

/* ---------------------------------------------------------------- scalar ---- */

typedef struct {
    float v[16];
} tsr__q8_acc16;

static inline void tsr__q8_s_block(const uint8_t *wb, const int8_t *xq, const float *xd,
                                   const int32_t *xs, int64_t nb, int64_t b, int nx,
                                   tsr__q8_acc16 *acc) {
    (void)xs;
    for (int j = 0; j < 16; j++) {
        float dw = tsr_f16_to_f32((uint16_t)(wb[2 * j] | wb[2 * j + 1] << 8));
        for (int i = 0; i < nx; i++) {
            const int8_t *x = xq + ((size_t)i * (size_t)nb + (size_t)b) * TSR_Q8_BLOCK;
            int32_t isum = 0;
            for (int s = 0; s < 8; s++)
                for (int t = 0; t < 4; t++)
                    isum += ((int32_t)wb[32 + s * 64 + j * 4 + t] - 128) * x[s * 4 + t];
            float dd = dw * xd[(size_t)i * (size_t)nb + (size_t)b];
            acc[i].v[j] = fmaf((float)isum, dd, acc[i].v[j]);
        }
    }
}

#define TSR__Q8_S_STORE(dst, a) memcpy(dst, (a).v, sizeof(a).v)
#define TSR__Q8_S_ZERO ((tsr__q8_acc16){{0}})

static inline void tsr__q8_s_gemv_nx(const uint8_t *w, int64_t nb, int64_t rows, int64_t g0,
                                     int64_t g1, const int8_t *xq, const float *xd,
                                     const int32_t *xs, int nx, const int32_t *bseg,
                                     int n_parts, bool sum, float *y, int64_t ldy,
                                     int64_t ldp) {
    TSR__Q8_GEMV_BODY(nx, tsr__q8_s_block, tsr__q8_acc16, TSR__Q8_S_ZERO, TSR__Q8_S_STORE)
}

TSR__Q8_GEMV_FN(tsr__q8_s_gemv, tsr__q8_s_gemv_nx)

static const tsr__q8_kernels tsr__q8_k_scalar = {TSR__Q8_SCALAR, "scalar", tsr__q8_s_gemv,
                                                 tsr__q8_quantize_act};

/* ---------------------------------------------------------------- dispatch ---- */

#ifdef TSR__Q8_X86
/* AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4 (clang 14 has no __builtin_cpu_supports name
 * for it). Asked only after AVX2, whose check covers the OS saving the YMM state. */
static bool tsr__q8_has_avxvnni(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}
#endif

const tsr__q8_kernels *tsr__q8_kernels_for(tsr__q8_variant v) {
    switch (v) {
    case TSR__Q8_SCALAR: return &tsr__q8_k_scalar;
#ifdef TSR__Q8_X86
    case TSR__Q8_AVX2:
        return tsr__cpu_kernels_for(TSR__ISA_AVX2) ? &tsr__q8_k_avx2 : NULL;
    case TSR__Q8_AVXVNNI:
        return tsr__cpu_kernels_for(TSR__ISA_AVX2) && tsr__q8_has_avxvnni()
                   ? &tsr__q8_k_avxvnni
                   : NULL;
    case TSR__Q8_AVX512VNNI:
        __builtin_cpu_init();
        return tsr__cpu_kernels_for(TSR__ISA_AVX512) && __builtin_cpu_supports("avx512vnni")
                   ? &tsr__q8_k_avx512vnni
                   : NULL;
#endif
    default: return NULL;
    }
}

static const tsr__q8_kernels *tsr__q8_kernels_pick(void) {
    tsr__cpu_isa cap = tsr__cpu_kernels_get()->isa;
    tsr__q8_variant top = cap == TSR__ISA_AVX512 ? TSR__Q8_AVX512VNNI
                          : cap == TSR__ISA_AVX2 ? TSR__Q8_AVXVNNI
                                                 : TSR__Q8_SCALAR;
    for (int v = top; v > TSR__Q8_SCALAR; v--) {
        const tsr__q8_kernels *k = tsr__q8_kernels_for((tsr__q8_variant)v);
        if (k) return k;
    }
    return &tsr__q8_k_scalar;
}

const tsr__q8_kernels *tsr__q8_kernels_get(void) {
    /* Picked once: every quantized matmul asks (two or three times), and the AVX-VNNI check
     * is a CPUID instruction, which a virtual machine traps (7 % of a Q4_1 decode profile
     * on an AVX2 VM when it was asked every time). The pick follows tsr__cpu_kernels_get's,
     * itself made once; racing first callers compute the same pointer. */
    static _Atomic(const tsr__q8_kernels *) picked;
    const tsr__q8_kernels *k = atomic_load_explicit(&picked, memory_order_acquire);
    if (!k) {
        k = tsr__q8_kernels_pick();
        atomic_store_explicit(&picked, k, memory_order_release);
    }
    return k;
}
