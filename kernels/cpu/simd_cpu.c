/* Runtime-dispatched SIMD kernels of the CPU backend: the scalar kernels, the BF16 pair
 * reorder, and the dispatch (CPU feature detection, the TSR_CPU_ISA cap, the cached choice).
 * The project is built for the baseline x86-64 (no -march=native), so the AVX2 (simd_avx2.c)
 * and AVX-512 (simd_avx512.c) kernels are compiled in files of their own, each under its
 * target pragma (GCC's, or clang's attribute pragma), and picked here with
 * __builtin_cpu_supports (CPUID for F16C under clang); this file has no target pragma, so
 * the scalar kernels and the dispatch run on any x86-64 (or other) CPU. Each kernel sums
 * in a fixed order per output element (independent of row ranges and of how many input rows
 * share the pass), so results do not depend on the thread count. */
#define _GNU_SOURCE /* syscall */
#include "kernels/cpu/simd_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

#ifdef TSR__X86
#include <cpuid.h>
#endif
#if defined(TSR__X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---------------------------------------------------------------- scalar ---- */

TSR__INLINE float tsr__s_load(const void *w, int64_t k, int dt) {
    if (dt == TSR__DT_F32) return ((const float *)w)[k];
    uint16_t h = ((const uint16_t *)w)[k];
    return dt == TSR__DT_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
}

TSR__INLINE void tsr__s_matvec(const void *w, int64_t cols, int64_t r0, int64_t r1,
                               const float *x, int nx, float *y, int64_t ldy, int dt) {
    size_t esz = dt == TSR__DT_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = (const char *)w + (size_t)r * (size_t)cols * esz;
        for (int i = 0; i < nx; i++) {
            const float *xi = x + (size_t)i * (size_t)cols;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            int64_t k = 0;
            for (; k + 4 <= cols; k += 4) {
                a0 += tsr__s_load(wr, k, dt) * xi[k];
                a1 += tsr__s_load(wr, k + 1, dt) * xi[k + 1];
                a2 += tsr__s_load(wr, k + 2, dt) * xi[k + 2];
                a3 += tsr__s_load(wr, k + 3, dt) * xi[k + 3];
            }
            for (; k < cols; k++) a0 += tsr__s_load(wr, k, dt) * xi[k];
            y[(size_t)i * (size_t)ldy + (size_t)r] = (a0 + a1) + (a2 + a3);
        }
    }
}

static void tsr__s_matvec_f32(const float *w, int64_t cols, int64_t r0, int64_t r1,
                              const float *x, int nx, float *y, int64_t ldy) {
    tsr__s_matvec(w, cols, r0, r1, x, nx, y, ldy, TSR__DT_F32);
}
static void tsr__s_matvec_bf16(const uint16_t *w, int64_t cols, int64_t r0, int64_t r1,
                               const float *x, int nx, float *y, int64_t ldy) {
    tsr__s_matvec(w, cols, r0, r1, x, nx, y, ldy, TSR__DT_BF16);
}
static void tsr__s_matvec_f16(const uint16_t *w, int64_t cols, int64_t r0, int64_t r1,
                              const float *x, int nx, float *y, int64_t ldy) {
    tsr__s_matvec(w, cols, r0, r1, x, nx, y, ldy, TSR__DT_F16);
}

/* Segment [s, s + len) of a row: the operations of tsr__s_matvec on a row of len. */
TSR__INLINE void tsr__s_dot_seg(const void *wr, const float *x, int64_t ldx, int64_t s,
                                int64_t len, int nx, int dt, float *d) {
    for (int i = 0; i < nx; i++) {
        const float *xi = x + (size_t)i * (size_t)ldx + s;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int64_t k = 0;
        for (; k + 4 <= len; k += 4) {
            a0 += tsr__s_load(wr, s + k, dt) * xi[k];
            a1 += tsr__s_load(wr, s + k + 1, dt) * xi[k + 1];
            a2 += tsr__s_load(wr, s + k + 2, dt) * xi[k + 2];
            a3 += tsr__s_load(wr, s + k + 3, dt) * xi[k + 3];
        }
        for (; k < len; k++) a0 += tsr__s_load(wr, s + k, dt) * xi[k];
        d[i] = (a0 + a1) + (a2 + a3);
    }
}

TSR__INLINE void tsr__s_matvec_seg(const void *w, int64_t cols, int64_t r0, int64_t r1,
                                   const float *x, int nx, const int32_t *seg, int n_parts,
                                   bool sum, float *y, int64_t ldy, int64_t ldp, int dt) {
    TSR__MATVEC_SEG_BODY(tsr__s_dot_seg)
}

TSR__MATVEC_SEG_FN(tsr__s_matvec_seg_f32, tsr__s_matvec_seg, float, TSR__DT_F32)
TSR__MATVEC_SEG_FN(tsr__s_matvec_seg_bf16, tsr__s_matvec_seg, uint16_t, TSR__DT_BF16)
TSR__MATVEC_SEG_FN(tsr__s_matvec_seg_f16, tsr__s_matvec_seg, uint16_t, TSR__DT_F16)

static void tsr__s_cvt_bf16(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tsr_bf16_to_f32(src[i]);
}
static void tsr__s_cvt_f16(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tsr_f16_to_f32(src[i]);
}

static void tsr__s_dot_rows(const float *q, const float *k, int64_t stride, int nk, int d,
                            float scale, float *out) {
    for (int j = 0; j < nk; j++) {
        const float *kj = k + (size_t)j * (size_t)stride;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int t = 0;
        for (; t + 4 <= d; t += 4) {
            a0 += q[t] * kj[t];
            a1 += q[t + 1] * kj[t + 1];
            a2 += q[t + 2] * kj[t + 2];
            a3 += q[t + 3] * kj[t + 3];
        }
        for (; t < d; t++) a0 += q[t] * kj[t];
        out[j] = ((a0 + a1) + (a2 + a3)) * scale;
    }
}

static void tsr__s_acc_rows(float *acc, float c, const float *p, const float *v,
                            int64_t stride, int nk, int d) {
    for (int t = 0; t < d; t++) acc[t] *= c;
    for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * (size_t)stride;
        float pj = p[j];
        for (int t = 0; t < d; t++) acc[t] += pj * vj[t];
    }
}

static float tsr__s_exp_sum(float *x, int n, float sub) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) {
        x[j] = expf(x[j] - sub);
        s += x[j];
    }
    return s;
}

static void tsr__s_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

static const tsr__cpu_kernels tsr__k_scalar = {
    TSR__ISA_SCALAR, "scalar", tsr__s_matvec_f32, tsr__s_matvec_bf16, tsr__s_matvec_f16,
    tsr__s_matvec_seg_f32, tsr__s_matvec_seg_bf16, tsr__s_matvec_seg_f16, tsr__s_cvt_bf16,
    tsr__s_cvt_f16, tsr__s_dot_rows, tsr__s_acc_rows, tsr__s_exp_sum,
    tsr__s_silu_mul, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL,
};

void tsr__cpu_bf16_pairs(const float *x, int64_t ldx, int nx, const int32_t *seg,
                         int n_parts, float *xp) {
    for (int i = 0; i < nx; i++) {
        const float *xi = x + (size_t)i * (size_t)ldx;
        float *pi = xp + (size_t)i * (size_t)ldx;
        for (int p = 0; p < n_parts; p++) {
            int64_t s = seg[p], len = (int64_t)seg[p + 1] - seg[p], k = 0;
            for (; k + 64 <= len; k += 64)
                for (int h = 0; h < 64; h += 32)
                    for (int j = 0; j < 16; j++) {
                        pi[s + k + h + j] = xi[s + k + h + 2 * j];
                        pi[s + k + h + 16 + j] = xi[s + k + h + 2 * j + 1];
                    }
            memcpy(pi + s + k, xi + s + k, (size_t)(len - k) * sizeof *xi);
        }
    }
}

#ifdef TSR__X86
/* clang (14, Debian 12's) rejects __builtin_cpu_supports("f16c") as an unknown feature: it
 * reads CPUID leaf 1 (ECX bit 29) itself. Asked only after AVX2, whose check covers the OS
 * saving the YMM state that F16C's instructions use. GCC keeps its builtin. */
static bool tsr__cpu_has_f16c(void) {
#ifdef __clang__
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
    return __builtin_cpu_supports("f16c");
#endif
}
#endif

const tsr__cpu_kernels *tsr__cpu_kernels_for(tsr__cpu_isa isa) {
    switch (isa) {
    case TSR__ISA_SCALAR: return &tsr__k_scalar;
#ifdef TSR__X86
    case TSR__ISA_AVX2:
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            tsr__cpu_has_f16c())
            return &tsr__cpu_k_avx2;
        return NULL;
    case TSR__ISA_AVX512:
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && tsr__cpu_kernels_for(TSR__ISA_AVX2))
            return &tsr__cpu_k_avx512;
        return NULL;
#else
    default: return NULL;
#endif
    }
    return NULL;
}

#if defined(TSR__X86) && defined(__linux__)
/* AMX's units this CPU has (CPUID leaf 7: EDX bit 24 AMX-TILE, 25 AMX-INT8, 22 AMX-BF16)
 * where the OS saves the tile state (XCR0 bits 17 and 18) and lets this process use the
 * tile data: Linux asks each process to request it (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA) before its first tile instruction, and the grant covers every thread. */
static unsigned tsr__cpu_amx_probe(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24))) return 0;
    unsigned units = (d & (1u << 25) ? TSR__AMX_INT8 : 0) | (d & (1u << 22) ? TSR__AMX_BF16 : 0);
    if (!units || !__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) == 0 ? units : 0;
}
#else
static unsigned tsr__cpu_amx_probe(void) { return 0; }
#endif

/* The AMX units of the pick (tsr__cpu_amx): written by the pick before it publishes. */
static _Atomic unsigned tsr__cpu_amx_units;
_Atomic bool tsr__cpu_intel;

#ifdef TSR__X86
static bool tsr__cpu_vendor_intel(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    /* "GenuineIntel" in EBX, EDX, ECX */
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u &&
           c == 0x6c65746eu;
}
#else
static bool tsr__cpu_vendor_intel(void) { return false; }
#endif

static const tsr__cpu_kernels *tsr__cpu_kernels_pick(void) {
    /* TSR_CPU_ISA caps the choice: scalar < avx2 < avx512 (no AMX) < everything. */
    int cap = TSR__ISA_AVX512 + 1;
    const char *env = getenv("TSR_CPU_ISA");
    if (env && !strcmp(env, "scalar")) cap = TSR__ISA_SCALAR;
    if (env && !strcmp(env, "avx2")) cap = TSR__ISA_AVX2;
    if (env && !strcmp(env, "avx512")) cap = TSR__ISA_AVX512;
    /* racing first pickers store the same values while kernels may already read them */
    atomic_store_explicit(&tsr__cpu_intel, tsr__cpu_vendor_intel(), memory_order_relaxed);
    for (int isa = cap > TSR__ISA_AVX512 ? TSR__ISA_AVX512 : cap; isa > TSR__ISA_SCALAR;
         isa--) {
        const tsr__cpu_kernels *k = tsr__cpu_kernels_for((tsr__cpu_isa)isa);
        if (!k) continue;
        /* the tile kernels' epilogues are AVX-512 */
        unsigned amx = cap > TSR__ISA_AVX512 && isa == TSR__ISA_AVX512 ? tsr__cpu_amx_probe() : 0;
        atomic_store_explicit(&tsr__cpu_amx_units, amx, memory_order_relaxed);
        return k;
    }
    return &tsr__k_scalar;
}

const tsr__cpu_kernels *tsr__cpu_kernels_get(void) {
    /* Every thread that races on the first call computes the same pointer (and AMX units). */
    static _Atomic(const tsr__cpu_kernels *) picked;
    const tsr__cpu_kernels *k = atomic_load_explicit(&picked, memory_order_acquire);
    if (!k) {
        k = tsr__cpu_kernels_pick();
        atomic_store_explicit(&picked, k, memory_order_release);
    }
    return k;
}

unsigned tsr__cpu_amx(void) {
    tsr__cpu_kernels_get(); /* the pick, which probes AMX, happens before */
    return atomic_load_explicit(&tsr__cpu_amx_units, memory_order_relaxed);
}
