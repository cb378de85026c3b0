/* The AVX-512 kernels of the CPU backend (AVX-512 F/BW/VL on top of AVX2, FMA, F16C: 16 floats
 * a vector, masked loads and stores), table tsr__cpu_k_avx512, which simd_cpu.c hands out only
 * on CPUs with those extensions. The whole file is under one target pragma (GCC's, or clang's
 * attribute pragma) and has nothing else in it, so the compiler may use these instructions
 * here and nowhere else (the scalar kernels and the dispatch in simd_cpu.c stay baseline
 * x86-64). */
#include "kernels/cpu/simd_internal.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"

#ifdef TSR__X86

/* clang has no GCC target pragma; its attribute pragma gives every function below the same
 * target (the always-inline helpers included), which is what the GCC pragma does. */
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

TSR__INLINE __m512 tsr__z_cvt16(__m256i h, int dt) {
    if (dt == TSR__DT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

TSR__INLINE __m512 tsr__z_load(const void *w, int64_t k, int dt) {
    if (dt == TSR__DT_F32) return _mm512_loadu_ps((const float *)w + k);
    return tsr__z_cvt16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k)), dt);
}

/* The last rem (< 16) elements, zero padded, with masked loads (no over-read). */
TSR__INLINE __m512 tsr__z_load_tail(const void *w, int64_t k, int rem, int dt) {
    __mmask16 m = (__mmask16)((1u << rem) - 1u);
    if (dt == TSR__DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + k);
    return tsr__z_cvt16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + k), dt);
}

/* The four W vectors of 64 columns [k, k + 64) in the order the x vectors come. BF16:
 * two 512-bit loads of 32 weights each; a weight pair (2c, 2c+1) shares a 32-bit lane,
 * so a shift gives the even columns' f32 and a mask the odd ones' without widening
 * shuffles (the BF16 matvec was bound by vpmovzxwd: 17-20 GB/s against 30 for f32 on the
 * same bytes). x must then be in tsr__cpu_bf16_pairs order. */
TSR__INLINE void tsr__z_load64(const void *w, int64_t k, const int dt, const int reg,
                               __m512 *q) {
    if (dt == TSR__DT_BF16) {
        const uint16_t *p = (const uint16_t *)w + k;
        __m512i a = _mm512_loadu_si512((const void *)p);
        __m512i b = _mm512_loadu_si512((const void *)(p + 32));
        /* reg: keep a and b in registers (GCC otherwise folds each load into both the
         * shift and the mask, loading the line twice). Measured per decode call of
         * stories110M, 1 thread: the segmented matvec (wo, w_down) 6-8 % faster with it,
         * the plain matvec 8-12 % slower, so only the former asks for it. */
        if (reg) __asm__("" : "+v"(a), "+v"(b));
        __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
        q[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
        q[1] = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
        q[2] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
        q[3] = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
        return;
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) q[j] = tsr__z_load(w, k + 16 * j, dt);
}

/* F32 columns [0, 64 * n64) of a row w against one input x: acc[q] gains the 16-column
 * chunks c with c % 4 == q in order, the arithmetic of the 64-column steps
 * below, but with ONE W load per step into a rotating set of four accumulators (after
 * every 4 steps the rotation is back where it started), so the bits are those of the
 * unrolled steps. Unrolled, the four loads of a step are four load instructions each
 * striding 256 bytes, and a cold f32 matvec streamed at 0.72-0.81 of a plain read of the
 * same bytes; one load instruction walking the row 64 bytes at a time, 0.84-0.93 (Zen 4,
 * 2048 x 768, one matrix per call out of 256 MiB, alternating with the read;
 * docs/kernels-cpu.md). One input only: with 2-4 the W block is often in L1/L2 (several
 * groups of inputs share it, gemm_cpu.c) and the moves of the rotation cost compute (a
 * 16-sequence bulk run 14 % slower). BF16 measured slower this way (its 64-column step is
 * two loads). The empty asm keeps GCC from unrolling the rotation away. */
TSR__INLINE void tsr__z_f32_chunks(const float *w, const float *x, int64_t n64,
                                   __m512 *acc) {
#pragma GCC unroll 1
    for (int64_t c = 0; c < 4 * n64; c++) {
        __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(w + 16 * c), _mm512_loadu_ps(x + 16 * c),
                                   acc[0]);
        acc[0] = acc[1];
        acc[1] = acc[2];
        acc[2] = acc[3];
        acc[3] = t;
        __asm__("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
    }
}

TSR__INLINE void tsr__z_matvec(const void *w, int64_t cols, int64_t r0, int64_t r1,
                               const float *x, const int nx, float *y, int64_t ldy,
                               const int dt) {
    size_t esz = dt == TSR__DT_F32 ? 4 : 2;
    int rem = (int)(cols & 15);
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = (const char *)w + (size_t)r * (size_t)cols * esz;
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            acc[i][0] = _mm512_setzero_ps();
            acc[i][1] = _mm512_setzero_ps();
            acc[i][2] = _mm512_setzero_ps();
            acc[i][3] = _mm512_setzero_ps();
        }
        int64_t k = 0;
        if (dt == TSR__DT_F32 && nx == 1) {
            tsr__z_f32_chunks((const float *)wr, x, cols / 64, acc[0]);
            k = cols / 64 * 64;
        }
        /* Each W vector is consumed right after its load: with all four loads first, GCC
         * schedules the widening loads in a burst and cold-cache bf16 runs 10-20 % slower
         * (measured on Zen 4). Same arithmetic either way. */
        for (; k + 64 <= cols; k += 64) {
            __m512 wv[4];
            tsr__z_load64(wr, k, dt, 0, wv);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
#pragma GCC unroll 4
                for (int i = 0; i < nx; i++)
                    acc[i][q] = _mm512_fmadd_ps(
                        wv[q], _mm512_loadu_ps(x + (size_t)i * (size_t)cols + k + 16 * q),
                        acc[i][q]);
            }
        }
        for (; k + 16 <= cols; k += 16) {
            __m512 w0 = tsr__z_load(wr, k, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                acc[i][0] = _mm512_fmadd_ps(
                    w0, _mm512_loadu_ps(x + (size_t)i * (size_t)cols + k), acc[i][0]);
        }
        if (rem) {
            __m512 w0 = tsr__z_load_tail(wr, k, rem, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++) {
                __m512 xv = tsr__z_load_tail(x + (size_t)i * (size_t)cols, k, rem,
                                             TSR__DT_F32);
                acc[i][1] = _mm512_fmadd_ps(w0, xv, acc[i][1]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m512 s = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]),
                                     _mm512_add_ps(acc[i][2], acc[i][3]));
            y[(size_t)i * (size_t)ldy + (size_t)r] = _mm512_reduce_add_ps(s);
        }
    }
}

#define TSR__Z_MATVEC(NAME, T, DT)                                                       \
    static void NAME(const T *w, int64_t cols, int64_t r0, int64_t r1, const float *x,   \
                     int nx, float *y, int64_t ldy) {                                    \
        switch (nx) {                                                                    \
        case 1: tsr__z_matvec(w, cols, r0, r1, x, 1, y, ldy, DT); break;                 \
        case 2: tsr__z_matvec(w, cols, r0, r1, x, 2, y, ldy, DT); break;                 \
        case 3: tsr__z_matvec(w, cols, r0, r1, x, 3, y, ldy, DT); break;                 \
        default: tsr__z_matvec(w, cols, r0, r1, x, 4, y, ldy, DT); break;                \
        }                                                                                \
    }
TSR__Z_MATVEC(tsr__z_matvec_f32, float, TSR__DT_F32)
TSR__Z_MATVEC(tsr__z_matvec_bf16, uint16_t, TSR__DT_BF16)
TSR__Z_MATVEC(tsr__z_matvec_f16, uint16_t, TSR__DT_F16)

/* Segment [s, s + len) of a row: the operations of tsr__z_matvec on a row of len, up to
 * the vector (acc0 + acc1) + (acc2 + acc3) before its horizontal sum. */
TSR__INLINE void tsr__z_dot_seg(const void *wr, const float *x, int64_t ldx, int64_t s,
                                int64_t len, const int nx, const int dt, __m512 *d) {
    int rem = (int)(len & 15);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        acc[i][0] = _mm512_setzero_ps();
        acc[i][1] = _mm512_setzero_ps();
        acc[i][2] = _mm512_setzero_ps();
        acc[i][3] = _mm512_setzero_ps();
    }
    const float *xs = x + s;
    int64_t k = 0;
    for (; k + 64 <= len; k += 64) {
        __m512 wv[4];
        tsr__z_load64(wr, s + k, dt, 1, wv);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                acc[i][q] = _mm512_fmadd_ps(
                    wv[q], _mm512_loadu_ps(xs + (size_t)i * (size_t)ldx + k + 16 * q), acc[i][q]);
        }
    }
    for (; k + 16 <= len; k += 16) {
        __m512 w0 = tsr__z_load(wr, s + k, dt);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++)
            acc[i][0] = _mm512_fmadd_ps(
                w0, _mm512_loadu_ps(xs + (size_t)i * (size_t)ldx + k), acc[i][0]);
    }
    if (rem) {
        __m512 w0 = tsr__z_load_tail(wr, s + k, rem, dt);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m512 xv = tsr__z_load_tail(xs + (size_t)i * (size_t)ldx, k, rem, TSR__DT_F32);
            acc[i][1] = _mm512_fmadd_ps(w0, xv, acc[i][1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++)
        d[i] = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]),
                             _mm512_add_ps(acc[i][2], acc[i][3]));
}

/* One level of the transposing reduction with the pairings of GCC's _mm512_reduce_add_ps:
 * level 0 adds 256-bit halves of a and b, 1 their 128-bit quarters, 2 and 3 pairs within
 * 128-bit lanes. Sixteen vectors through levels 0..3 (8 + 4 + 2 + 1 steps) give each
 * vector's reduce_add bits in one lane (the tree of tsr__z_dot_rows). */
TSR__INLINE __m512 tsr__z_tree(__m512 a, __m512 b, const int level) {
    switch (level) {
    case 0:
        return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    case 1:
        return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
    case 2: return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
    default: return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
    }
}

/* The 16-leaf tree of tsr__z_tree; leaf j's sum lands in lane (j % 4) * 4 + j / 4. */
TSR__INLINE __m512 tsr__z_tree16(const __m512 *a) {
    __m512 b[8], c[4];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) b[u] = tsr__z_tree(a[2 * u], a[2 * u + 1], 0);
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) c[u] = tsr__z_tree(b[2 * u], b[2 * u + 1], 1);
    return tsr__z_tree(tsr__z_tree(c[0], c[1], 2), tsr__z_tree(c[2], c[3], 2), 3);
}

/* One segment [s, s + len) of R rows (wr[u]) for nx inputs (R * nx <= 4): the operations
 * of tsr__z_matvec on a row of len, up to each row's (acc0 + acc1) + (acc2 + acc3) in
 * v[i * R + u]. Each x vector is loaded once for the R rows. */
TSR__INLINE void tsr__z_dot_seg_rows(const char *const *wr, const float *x, int64_t ldx,
                                     int64_t s, int64_t len, const int nx, const int dt,
                                     const int R, size_t pf, __m512 *v) {
    size_t esz = dt == TSR__DT_F32 ? 4 : 2;
    int rem = (int)(len & 15);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 4 * R * nx; j++) acc[j] = _mm512_setzero_ps();
    const float *xs = x + s;
    const char *ws[4];
#pragma GCC unroll 4
    for (int u = 0; u < R; u++) ws[u] = wr[u] + (size_t)s * esz;
    int64_t k = 0;
    for (; k + 64 <= len; k += 64) {
#pragma GCC unroll 4
        for (int u = 0; u < R; u++) {
            if (pf) {
                _mm_prefetch(ws[u] + pf + (size_t)k * esz, _MM_HINT_T0);
                _mm_prefetch(ws[u] + pf + (size_t)k * esz + 64, _MM_HINT_T0);
                if (dt == TSR__DT_F32) {
                    _mm_prefetch(ws[u] + pf + (size_t)k * esz + 128, _MM_HINT_T0);
                    _mm_prefetch(ws[u] + pf + (size_t)k * esz + 192, _MM_HINT_T0);
                }
            }
            __m512 wv[4];
            tsr__z_load64(ws[u], k, dt, 0, wv);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
#pragma GCC unroll 4
                for (int i = 0; i < nx; i++)
                    acc[(i * R + u) * 4 + q] = _mm512_fmadd_ps(
                        wv[q], _mm512_loadu_ps(xs + (size_t)i * (size_t)ldx + k + 16 * q),
                        acc[(i * R + u) * 4 + q]);
        }
    }
    for (; k + 16 <= len; k += 16) {
        __m512 xv[4];
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) xv[i] = _mm512_loadu_ps(xs + (size_t)i * (size_t)ldx + k);
#pragma GCC unroll 4
        for (int u = 0; u < R; u++) {
            if (pf) _mm_prefetch(ws[u] + pf + (size_t)k * esz, _MM_HINT_T0);
            __m512 w0 = tsr__z_load(ws[u], k, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                acc[(i * R + u) * 4] = _mm512_fmadd_ps(w0, xv[i], acc[(i * R + u) * 4]);
        }
    }
    if (rem) {
        __m512 xv[4];
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++)
            xv[i] = tsr__z_load_tail(xs + (size_t)i * (size_t)ldx, k, rem, TSR__DT_F32);
#pragma GCC unroll 4
        for (int u = 0; u < R; u++) {
            __m512 w0 = tsr__z_load_tail(ws[u], k, rem, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                acc[(i * R + u) * 4 + 1] = _mm512_fmadd_ps(w0, xv[i], acc[(i * R + u) * 4 + 1]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < R * nx; j++)
        v[j] = _mm512_add_ps(_mm512_add_ps(acc[4 * j], acc[4 * j + 1]),
                             _mm512_add_ps(acc[4 * j + 2], acc[4 * j + 3]));
}

/* R rows (R * nx <= 4) at a time, 16/R parts per transposing reduction: leaf j of the tree
 * is row j % R's part p0 + j / R, so each row reads its parts left to right (R sequential
 * streams, not one per part and row), x is loaded once per R rows, and one reduction serves
 * 16 dots. Lane
 * group s of the result, permuted to lanes 0..R-1, is part p0 + s of the R rows: added to
 * the running sum in part order, or stored. */
TSR__INLINE void tsr__z_matvec_seg_r(const void *w, int64_t cols, int64_t r0, int64_t r1,
                                     const float *x, const int nx, const int32_t *seg,
                                     int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp,
                                     const int dt, const int R) {
    const int S = 16 / R;
    size_t rs = (size_t)cols * (dt == TSR__DT_F32 ? 4 : 2);
    /* The tree leaves leaf j in lane (j % 4) * 4 + j / 4; idx[s] gathers leaves s*R.. */
    __m512i idx[16];
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int s = 0; s < S; s++) {
        __m512i j = _mm512_and_si512(_mm512_add_epi32(iota, _mm512_set1_epi32(s * R)),
                                     _mm512_set1_epi32(15));
        idx[s] = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(j, _mm512_set1_epi32(3)), 2),
                                 _mm512_srli_epi32(j, 2));
    }
    for (int64_t rb = r0; rb < r1; rb += R) {
        int nr = r1 - rb < R ? (int)(r1 - rb) : R;
        __mmask16 m = (__mmask16)((1u << nr) - 1u);
        const char *wr[4];
#pragma GCC unroll 4
        for (int u = 0; u < R; u++) /* rows past r1 recompute row rb, never stored */
            wr[u] = (const char *)w + (size_t)(u < nr ? rb + u : rb) * rs;
        /* Prefetch the next block's rows at the same offset, one line per W vector (a
         * stream per row; rows past r1 are not touched). Measured on Zen 4 with W in DRAM:
         * a few % better, within noise in cache. */
        size_t pf = rb + 2 * R <= r1 ? (size_t)R * rs : 0;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int p0 = 0; p0 < n_parts; p0 += S) {
            int g = n_parts - p0 < S ? n_parts - p0 : S;
            __m512 r[4];
            if (R == 4 && nx == 1) {
                /* The decode case: the tree folded in registers as each part's 4 rows
                 * arrive (segment s is node s of level 2). */
                __m512 c[4];
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++) {
                    __m512 v[4];
                    if (s < g) {
                        tsr__z_dot_seg_rows(wr, x, cols, seg[p0 + s],
                                            (int64_t)seg[p0 + s + 1] - seg[p0 + s], nx, dt, R,
                                            pf, v);
                    } else {
                        v[0] = v[1] = v[2] = v[3] = _mm512_setzero_ps();
                    }
                    c[s] = tsr__z_tree(tsr__z_tree(v[0], v[1], 0), tsr__z_tree(v[2], v[3], 0), 1);
                }
                r[0] = tsr__z_tree(tsr__z_tree(c[0], c[1], 2), tsr__z_tree(c[2], c[3], 2), 3);
            } else {
                /* Leaves in L1 (a compact loop: 16 inlined dots for nx > 1 spill anyway). */
                __m512 leaf[4][16];
                for (int s = 0; s < S; s++) {
                    __m512 v[4];
                    if (s < g) {
                        tsr__z_dot_seg_rows(wr, x, cols, seg[p0 + s],
                                            (int64_t)seg[p0 + s + 1] - seg[p0 + s], nx, dt, R,
                                            pf, v);
                    } else {
#pragma GCC unroll 4
                        for (int j = 0; j < R * nx; j++) v[j] = _mm512_setzero_ps();
                    }
#pragma GCC unroll 4
                    for (int i = 0; i < nx; i++)
#pragma GCC unroll 4
                        for (int u = 0; u < R; u++) leaf[i][s * R + u] = v[i * R + u];
                }
#pragma GCC unroll 4
                for (int i = 0; i < nx; i++) r[i] = tsr__z_tree16(leaf[i]);
            }
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++) {
                for (int s = 0; s < g; s++) {
                    __m512 d = _mm512_permutexvar_ps(idx[s], r[i]);
                    if (!sum)
                        _mm512_mask_storeu_ps(y + (size_t)(p0 + s) * (size_t)ldp +
                                                  (size_t)i * (size_t)ldy + (size_t)rb,
                                              m, d);
                    else
                        acc[i] = p0 + s == 0 ? d : _mm512_add_ps(acc[i], d);
                }
            }
        }
        if (sum) {
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                _mm512_mask_storeu_ps(y + (size_t)i * (size_t)ldy + (size_t)rb, m, acc[i]);
        }
    }
}

TSR__INLINE void tsr__z_dot_seg_s(const void *wr, const float *x, int64_t ldx, int64_t s,
                                  int64_t len, const int nx, const int dt, float *d) {
    __m512 v[4];
    tsr__z_dot_seg(wr, x, ldx, s, len, nx, dt, v);
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) d[i] = _mm512_reduce_add_ps(v[i]);
}

TSR__INLINE void tsr__z_matvec_seg(const void *w, int64_t cols, int64_t r0, int64_t r1,
                                   const float *x, const int nx, const int32_t *seg,
                                   int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp,
                                   const int dt) {
    /* Parts of >= 32 columns on average (every real model's heads): one row at a time,
     * each part a matvec-shaped dot and its own horizontal sum, the access pattern of
     * matmul (one sequential stream). Measured 1 thread, W in DRAM with 2 MiB pages:
     * 768 x 2048 bf16 in 12 parts 32 GB/s, the 4-row tree kernel below 15-17, matmul 29.
     * Tiny parts (stories260K: 8 columns) amortize the reductions better in the tree. */
    if (cols >= 32 * (int64_t)n_parts) {
        TSR__MATVEC_SEG_BODY(tsr__z_dot_seg_s)
        return;
    }
    /* As many rows as keep R * nx * 4 accumulators in registers. */
    if (nx == 1)
        tsr__z_matvec_seg_r(w, cols, r0, r1, x, nx, seg, n_parts, sum, y, ldy, ldp, dt, 4);
    else if (nx == 2)
        tsr__z_matvec_seg_r(w, cols, r0, r1, x, nx, seg, n_parts, sum, y, ldy, ldp, dt, 2);
    else
        tsr__z_matvec_seg_r(w, cols, r0, r1, x, nx, seg, n_parts, sum, y, ldy, ldp, dt, 1);
}
TSR__MATVEC_SEG_FN(tsr__z_matvec_seg_f32, tsr__z_matvec_seg, float, TSR__DT_F32)
TSR__MATVEC_SEG_FN(tsr__z_matvec_seg_bf16, tsr__z_matvec_seg, uint16_t, TSR__DT_BF16)
TSR__MATVEC_SEG_FN(tsr__z_matvec_seg_f16, tsr__z_matvec_seg, uint16_t, TSR__DT_F16)

static void tsr__z_cvt_bf16(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, tsr__z_load(src, i, TSR__DT_BF16));
    for (; i < n; i++) dst[i] = tsr_bf16_to_f32(src[i]);
}
static void tsr__z_cvt_f16(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, tsr__z_load(src, i, TSR__DT_F16));
    for (; i < n; i++) dst[i] = tsr_f16_to_f32(src[i]);
}

/* tsr__z_tree16 with item u's sum in lane u: an item's bits depend on its own accumulator
 * only, never on its lane or its neighbours. */
TSR__INLINE __m512 tsr__z_tree16_lanes(const __m512 *a) {
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11,
                                           15);
    return _mm512_permutexvar_ps(perm, tsr__z_tree16(a));
}

/* Sixteen keys at a time, one accumulator each, reduced together by tsr__z_tree16_lanes. Keys
 * past nk reuse q as a dummy row, so every key's value goes through the same operations
 * whatever nk is (the score pass and the main pass then agree bitwise). */
static void tsr__z_dot_rows(const float *q, const float *k, int64_t stride, int nk, int d,
                            float scale, float *out) {
    int rem = d & 15;
    __mmask16 tm = (__mmask16)((1u << rem) - 1u);
    __m512 sv = _mm512_set1_ps(scale);
    for (int j = 0; j < nk; j += 16) {
        const float *kr[16];
        for (int u = 0; u < 16; u++)
            kr[u] = j + u < nk ? k + (size_t)(j + u) * (size_t)stride : q;
        __m512 a[16];
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) a[u] = _mm512_setzero_ps();
        int t = 0;
        for (; t + 16 <= d; t += 16) {
            __m512 qv = _mm512_loadu_ps(q + t);
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++)
                a[u] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kr[u] + t), a[u]);
        }
        if (rem) {
            __m512 qv = _mm512_maskz_loadu_ps(tm, q + t);
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++)
                a[u] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tm, kr[u] + t), a[u]);
        }
        __m512 r = _mm512_mul_ps(tsr__z_tree16_lanes(a), sv);
        int n = nk - j < 16 ? nk - j : 16;
        _mm512_mask_storeu_ps(out + j, (__mmask16)((1u << n) - 1u), r);
    }
}

/* The factor tsr__z_kv_ld applies to an FP8 row's decoded codes: 256 times its scale, read
 * once per row (as tsr__y_kv_rs). 0 for the other dtypes. */
TSR__INLINE float tsr__z_kv_rs(const void *k, const int dt) {
    float d = 0.0f;
    if (dt == TSR_KV_FP8) memcpy(&d, k, 4);
    return d * 256.0f;
}

/* E4M3 codes (u16 lanes) to the FP16 of their value / 256: the code less its sign, shifted
 * left by 7, with the sign on top and the NaN codes 0x7f / 0xff as FP16's quiet NaN
 * (tsr__y_kv_ld has the reasons; exact). */
TSR__INLINE __m512 tsr__z_e4m3_div256(__m256i c) {
    __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8),
                                _mm256_slli_epi16(mag, 7));
    h = _mm256_mask_mov_epi16(h, _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f)),
                              _mm256_set1_epi16(0x7e00));
    return _mm512_cvtph_ps(h);
}

/* Sixteen elements from e of a K/V row, f32 or stored as dt and decoded as
 * tsr_kv_rows_decode does, so with its bits: BF16 widened (exact: the 16 bits become the
 * high half); Q8 d * q of e's block (e is a multiple of 16 inside a head of whole 32-value
 * blocks, so the sixteen share it); FP8 d * e4m3 as v * rs (tsr__z_kv_rs). */
TSR__INLINE __m512 tsr__z_kv_ld(const void *k, int64_t e, float rs, const int dt) {
    const uint8_t *r = k;
    switch (dt) {
    case TSR_KV_F32: return _mm512_loadu_ps((const float *)k + e);
    case TSR_KV_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)k + e))),
            16));
    case TSR_KV_Q8: {
        r += (size_t)(e / TSR_KV_Q8_BLOCK) * TSR_KV_Q8_BLOCK_BYTES;
        float d;
        memcpy(&d, r, 4);
        __m128i q = _mm_loadu_si128((const __m128i *)(r + 4 + e % TSR_KV_Q8_BLOCK));
        return _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    default: {
        __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(r + 4 + e)));
        return _mm512_mul_ps(tsr__z_e4m3_div256(c), _mm512_set1_ps(rs));
    }
    }
}
/* The same for the lanes of m only (the others 0): a head's last d % 16 elements (Q8 heads
 * are whole blocks, so never Q8). */
TSR__INLINE __m512 tsr__z_kv_ld_mask(__mmask16 m, const void *k, int64_t e, float rs,
                                     const int dt) {
    const uint8_t *r = k;
    switch (dt) {
    case TSR_KV_F32: return _mm512_maskz_loadu_ps(m, (const float *)k + e);
    case TSR_KV_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)k + e)), 16));
    default: {
        __m256i c = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, r + 4 + e));
        return _mm512_maskz_mul_ps(m, tsr__z_e4m3_div256(c), _mm512_set1_ps(rs));
    }
    }
}

/* One key row, sixteen query heads at a time: the per-item operations of tsr__z_dot_rows
 * (fma(q, k) over the columns in order, then the tree, then the scale), so a (head, key)
 * score has the same bits whichever of the two computed it. Head by head along the row,
 * so its bytes are loaded in address order: interleaving the heads column by column, or
 * keeping each head's strip down 16 rows as dot_rows does, measured 1.3-2x slower from
 * DRAM (bench/attn.c). k is f32, or stored as dt and decoded as it is loaded
 * (tsr__z_kv_ld: the same bits as the f32 kernel over the converted row). */
TSR__INLINE void tsr__z_dot_heads_dt(const float *q, const void *k, const int32_t *koff,
                                     int nh, int d, float scale, float *out, int64_t out_ld,
                                     const int dt) {
    int rem = d & 15;
    __mmask16 tm = (__mmask16)((1u << rem) - 1u);
    __m512 sv = _mm512_set1_ps(scale);
    const float rs = tsr__z_kv_rs(k, dt);
    for (int h0 = 0; h0 < nh; h0 += 16) {
        int n = nh - h0 < 16 ? nh - h0 : 16;
        __m512 a[16];
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) a[u] = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) {
            if (u >= n) break;
            const float *qu = q + (size_t)(h0 + u) * (size_t)d;
            int64_t ku = koff[h0 + u];
            int t = 0;
            for (; t + 16 <= d; t += 16)
                a[u] = _mm512_fmadd_ps(_mm512_loadu_ps(qu + t), tsr__z_kv_ld(k, ku + t, rs, dt),
                                       a[u]);
            if (rem)
                a[u] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tm, qu + t),
                                       tsr__z_kv_ld_mask(tm, k, ku + t, rs, dt), a[u]);
        }
        float r[16];
        _mm512_storeu_ps(r, _mm512_mul_ps(tsr__z_tree16_lanes(a), sv));
        for (int u = 0; u < n; u++) out[(size_t)(h0 + u) * (size_t)out_ld] = r[u];
    }
}

static void tsr__z_dot_heads(const float *q, const float *k, const int32_t *koff, int nh,
                             int d, float scale, float *out, int64_t out_ld) {
    tsr__z_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_F32);
}

static void tsr__z_dot_heads_stored(const float *q, const void *k, int dtype,
                                    const int32_t *koff, int nh, int d, float scale, float *out,
                                    int64_t out_ld) {
    switch (dtype) { /* one copy per dtype, its decoding inlined */
    case TSR_KV_BF16:
        tsr__z_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_BF16);
        break;
    case TSR_KV_Q8: tsr__z_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_Q8); break;
    default: tsr__z_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_FP8); break;
    }
}

/* Keys outer, heads inner, each head's accumulator through L1: the rows are read front to
 * back. Per element: acc, then + p * v for each key in order, each an fma, as in
 * tsr__z_acc_rows after its scaling. (Two or four keys per pass over the accumulator read
 * the rows interleaved and measured slower.) v is f32 or stored as dt, as in dot_heads;
 * rows row_bytes apart. */
TSR__INLINE void tsr__z_acc_heads_dt(float *acc, const float *p, int64_t p_ld, const void *v,
                                     int64_t row_bytes, const int32_t *koff, int nk, int nh,
                                     int d, const int dt) {
    int rem = d & 15;
    __mmask16 tm = (__mmask16)((1u << rem) - 1u);
    for (int j = 0; j < nk; j++) {
        const void *vj = (const uint8_t *)v + (size_t)j * (size_t)row_bytes;
        const float rs = tsr__z_kv_rs(vj, dt);
        for (int hh = 0; hh < nh; hh++) {
            float *ah = acc + (size_t)hh * (size_t)d;
            int64_t vh = koff[hh];
            __m512 pj = _mm512_set1_ps(p[(size_t)hh * (size_t)p_ld + (size_t)j]);
            int t = 0;
#pragma GCC unroll 4
            for (; t + 16 <= d; t += 16)
                _mm512_storeu_ps(ah + t, _mm512_fmadd_ps(pj, tsr__z_kv_ld(vj, vh + t, rs, dt),
                                                         _mm512_loadu_ps(ah + t)));
            if (rem)
                _mm512_mask_storeu_ps(
                    ah + t, tm,
                    _mm512_fmadd_ps(pj, tsr__z_kv_ld_mask(tm, vj, vh + t, rs, dt),
                                    _mm512_maskz_loadu_ps(tm, ah + t)));
        }
    }
}

static void tsr__z_acc_heads(float *acc, const float *p, int64_t p_ld, const float *v,
                             int64_t stride, const int32_t *koff, int nk, int nh, int d) {
    tsr__z_acc_heads_dt(acc, p, p_ld, v, stride * 4, koff, nk, nh, d, TSR_KV_F32);
}

static void tsr__z_acc_heads_stored(float *acc, const float *p, int64_t p_ld, const void *v,
                                    int64_t row_bytes, int dtype, const int32_t *koff, int nk,
                                    int nh, int d) {
    switch (dtype) {
    case TSR_KV_BF16:
        tsr__z_acc_heads_dt(acc, p, p_ld, v, row_bytes, koff, nk, nh, d, TSR_KV_BF16);
        break;
    case TSR_KV_Q8:
        tsr__z_acc_heads_dt(acc, p, p_ld, v, row_bytes, koff, nk, nh, d, TSR_KV_Q8);
        break;
    default: tsr__z_acc_heads_dt(acc, p, p_ld, v, row_bytes, koff, nk, nh, d, TSR_KV_FP8); break;
    }
}

/* Keys outer, 64 columns at a time in registers: four independent FMA chains instead of
 * one chain per column block. Each element still sums acc * c, then the keys in order, so
 * a key run split into tiles differently gives the same sums whenever c is 1. */
static void tsr__z_acc_rows(float *acc, float c, const float *p, const float *v,
                            int64_t stride, int nk, int d) {
    __m512 cv = _mm512_set1_ps(c);
    for (int t = 0; t < d; t += 64) {
        __mmask16 m[4];
        for (int u = 0; u < 4; u++) {
            int r = d - t - 16 * u;
            r = r < 0 ? 0 : r > 16 ? 16 : r;
            m[u] = (__mmask16)((1u << r) - 1u);
        }
        __m512 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            a[u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[u], acc + t + 16 * u), cv);
        for (int j = 0; j < nk; j++) {
            const float *vj = v + (size_t)j * (size_t)stride + t;
            __m512 pj = _mm512_set1_ps(p[j]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                a[u] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(m[u], vj + 16 * u), a[u]);
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(acc + t + 16 * u, m[u], a[u]);
    }
}

TSR__INLINE __m512 tsr__z_exp(__m512 x) {
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(TSR__EXP_LO)),
                              _mm512_set1_ps(TSR__EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(TSR__EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(TSR__EXP_C1), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(TSR__EXP_C2), r);
    __m512 p = _mm512_set1_ps(TSR__EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TSR__EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TSR__EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TSR__EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TSR__EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TSR__EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i ni = _mm512_cvtps_epi32(n), hi = _mm512_srai_epi32(ni, 1);
    __m512i b = _mm512_set1_epi32(127);
    __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(hi, b), 23));
    __m512 e2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, hi), b), 23));
    p = _mm512_mul_ps(_mm512_mul_ps(p, e1), e2);
    p = _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(x, _mm512_set1_ps(TSR__EXP_LO), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    p = _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(x, _mm512_set1_ps(TSR__EXP_HI), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

static float tsr__z_exp_sum(float *x, int n, float sub) {
    __m512 sv = _mm512_set1_ps(sub), acc = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        int rem = n - j < 16 ? n - j : 16;
        __mmask16 m = (__mmask16)((1u << rem) - 1u);
        __m512 e = tsr__z_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), sv));
        _mm512_mask_storeu_ps(x + j, m, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    }
    return _mm512_reduce_add_ps(acc);
}

static void tsr__z_silu_mul(float *g, const float *u, int64_t n) {
    __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        int rem = n - i < 16 ? (int)(n - i) : 16;
        __mmask16 m = (__mmask16)((1u << rem) - 1u);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = tsr__z_exp(_mm512_sub_ps(zero, gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* The query lanes' online-softmax step for a key tile of nt scores s (mt: their max per
 * lane): s becomes exp(s - mn), l = l * corr + sum, m = mn for the lanes that saw a key,
 * which it returns (0: none, the tile is skipped); *corr scales the earlier outputs. */
TSR__INLINE __mmask16 tsr__z_qblock_softmax(__m512 *s, int nt, __m512 mt, __m512 *m,
                                            __m512 *l, __m512 *corr) {
    __mmask16 vis = _mm512_cmp_ps_mask(mt, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    if (!vis) return 0;
    __m512 mn = _mm512_max_ps(mt, *m);
    *corr = tsr__z_exp(_mm512_sub_ps(*m, mn)); /* 0 on the first visible tile */
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nt; j++) {
        s[j] = tsr__z_exp(_mm512_sub_ps(s[j], mn));
        sum = _mm512_add_ps(sum, s[j]);
    }
    *l = _mm512_mask_add_ps(*l, vis, _mm512_mul_ps(*l, *corr), sum);
    *m = _mm512_mask_mov_ps(*m, vis, mn);
    return vis;
}

/* The query lanes' results: ob[t * 16 + i] (d dimensions) divided by l (0 where l is 0)
 * into the nq rows of out, and each row's final max and sum into ml. */
static void tsr__z_qblock_store(float *ob, int d, __m512 m, __m512 l, int nq, float *out,
                                int64_t q_ld, float *ml, int64_t ml_ld) {
    __mmask16 pos = _mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_GT_OQ);
    __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(1.0f), l);
    for (int t = 0; t < d; t++)
        _mm512_storeu_ps(ob + t * 16, _mm512_mul_ps(_mm512_loadu_ps(ob + t * 16), inv));
    float mv[16], lv[16];
    _mm512_storeu_ps(mv, m);
    _mm512_storeu_ps(lv, l);
    for (int i = 0; i < nq; i++) {
        for (int t = 0; t < d; t++) out[(size_t)i * (size_t)q_ld + t] = ob[t * 16 + i];
        ml[(size_t)i * (size_t)ml_ld] = mv[i];
        ml[(size_t)i * (size_t)ml_ld + 1] = lv[i];
    }
}

/* A block's queries: lane i's position in qp (INT32_MIN for lanes past nq: they see no
 * key) and its d dimensions in qt[t * 16 + i] (zeros past nq). Returns the block's last
 * position. */
static int32_t tsr__z_qblock_load(const float *q, int64_t q_ld, const int32_t *qpos, int nq,
                                  int d, float *qt, int32_t *qp) {
    int32_t qmax = INT32_MIN;
    for (int i = 0; i < 16; i++) {
        qp[i] = i < nq ? qpos[i] : INT32_MIN;
        if (i < nq && qpos[i] > qmax) qmax = qpos[i];
        for (int t = 0; t < d; t++) qt[t * 16 + i] = i < nq ? q[(size_t)i * (size_t)q_ld + t] : 0;
    }
    return qmax;
}

/* Lane scores a (q.k) of key j of span sp, scaled and -inf in the lanes whose query comes
 * before the key; *mt keeps the lanes' max (a NaN score leaves it alone). */
TSR__INLINE __m512 tsr__z_qblock_score(__m512 a, __m512 sv, const tsr_kv_span *sp, int64_t j,
                                       __m512i qpv, __m512 *mt) {
    int32_t kp = sp->pos ? sp->pos[j] : sp->pos0 + (int32_t)j;
    a = _mm512_mask_mov_ps(_mm512_mul_ps(a, sv),
                           _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(kp), qpv),
                           _mm512_set1_ps(-INFINITY));
    *mt = _mm512_max_ps(a, *mt);
    return a;
}

/* Keys of span sp a block whose last query is at qmax can see: contiguous spans stop there. */
static int64_t tsr__z_qblock_limit(const tsr_kv_span *sp, int32_t qmax) {
    if (sp->pos) return sp->n;
    int64_t e = (int64_t)qmax - sp->pos0 + 1;
    return e < 0 ? 0 : e < sp->n ? e : sp->n;
}

/* Queries in lanes (see attn_qblock in cpu_internal.h). Per lane the arithmetic of a row
 * task on its own: a score is q.k summed over t in order (one fma chain) times scale; per
 * key tile the max, the correction exp(m - mn), the sum of exp(s - mn) over the keys in
 * order, and the output rows scaled by the correction then given p * v key by key. Lanes
 * whose query sees no key of a tile keep their state (masked ops), as the row tasks skip
 * such a head. */
TSR__INLINE void tsr__z_attn_qblock_d(const float *q, int64_t q_ld, const int32_t *qpos,
                                      int nq, const int d, float scale,
                                      const tsr_kv_span *spans, int n_spans, int koff, int tile,
                                      float *out, float *ml, int64_t ml_ld) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sv = _mm512_set1_ps(scale);
    int32_t qp[16];
    float buf[TSR__CPU_QBLOCK_MAX_D * 16];
    int32_t qmax = tsr__z_qblock_load(q, q_ld, qpos, nq, d, buf, qp);
    const __m512i qpv = _mm512_loadu_si512((const void *)qp);
    __m512 qt[TSR__CPU_QBLOCK_MAX_D], o[TSR__CPU_QBLOCK_MAX_D];
#pragma GCC unroll 16
    for (int t = 0; t < TSR__CPU_QBLOCK_MAX_D; t++) {
        qt[t] = t < d ? _mm512_loadu_ps(buf + t * 16) : _mm512_setzero_ps();
        o[t] = _mm512_setzero_ps();
    }
    __m512 m = ninf, l = _mm512_setzero_ps();
    __m512 s[TSR__CPU_QBLOCK_MAX_TILE];
    for (int sp_i = 0; sp_i < n_spans; sp_i++) {
        const tsr_kv_span *sp = &spans[sp_i];
        int64_t lim = tsr__z_qblock_limit(sp, qmax);
        for (int64_t j0 = 0; j0 < lim; j0 += tile) {
            int nt = lim - j0 < tile ? (int)(lim - j0) : tile;
            __m512 mt = ninf;
            for (int j = 0; j < nt; j++) {
                const float *kr = sp->k + (size_t)(j0 + j) * (size_t)sp->stride + koff;
                __m512 a = _mm512_mul_ps(qt[0], _mm512_set1_ps(kr[0]));
#pragma GCC unroll 16
                for (int t = 1; t < d; t++) a = _mm512_fmadd_ps(qt[t], _mm512_set1_ps(kr[t]), a);
                s[j] = tsr__z_qblock_score(a, sv, sp, j0 + j, qpv, &mt);
            }
            __m512 corr;
            __mmask16 vis = tsr__z_qblock_softmax(s, nt, mt, &m, &l, &corr);
            if (!vis) continue;
#pragma GCC unroll 16
            for (int t = 0; t < d; t++) o[t] = _mm512_mask_mul_ps(o[t], vis, o[t], corr);
            for (int j = 0; j < nt; j++) {
                const float *vr = sp->v + (size_t)(j0 + j) * (size_t)sp->stride + koff;
#pragma GCC unroll 16
                for (int t = 0; t < d; t++)
                    o[t] = _mm512_mask3_fmadd_ps(s[j], _mm512_set1_ps(vr[t]), o[t], vis);
            }
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < d; t++) _mm512_storeu_ps(buf + t * 16, o[t]);
    tsr__z_qblock_store(buf, d, m, l, nq, out, q_ld, ml, ml_ld);
}

/* attn_scores_qblock (cpu_internal.h). Per lane the score of tsr__z_attn_qblock_d (q.k as
 * one fma chain over t in order, times scale; the queries' dimensions from the stack),
 * then exp(s - m) with the vector exp of the main pass, times 1/l; lanes whose query
 * comes before the key, past nq, or with l <= 0 add 0. Each key's lanes accumulate over
 * the query blocks and are summed across the lanes once at the end. */
static void tsr__z_attn_scores_qblock(const float *q, int64_t q_ld, const int32_t *qpos,
                                      int nq, int d, float scale, const tsr_kv_span *sp,
                                      int64_t j0, int nt, int koff, const float *ml,
                                      int64_t ml_ld, float *ks) {
    const __m512 sv = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
    __m512 acc[TSR__CPU_QBLOCK_MAX_TILE];
    int32_t kp[TSR__CPU_QBLOCK_MAX_TILE], kmin = INT32_MAX;
    for (int j = 0; j < nt; j++) {
        acc[j] = zero;
        kp[j] = sp->pos ? sp->pos[j0 + j] : sp->pos0 + (int32_t)(j0 + j);
        kmin = kp[j] < kmin ? kp[j] : kmin;
    }
    float qt[TSR__CPU_QBLOCK_WIDE_MAX_D * 16];
    for (int i0 = 0; i0 < nq; i0 += 16) {
        int n = nq - i0 < 16 ? nq - i0 : 16;
        int32_t qp[16];
        float mv[16], iv[16];
        int32_t qmax = tsr__z_qblock_load(q + (size_t)i0 * (size_t)q_ld, q_ld, qpos + i0, n, d,
                                          qt, qp);
        if (qmax < kmin) continue; /* no row of the block sees a key of the tile */
        for (int i = 0; i < 16; i++) {
            float l = i < n ? ml[(size_t)(i0 + i) * (size_t)ml_ld + 1] : 0.0f;
            mv[i] = i < n ? ml[(size_t)(i0 + i) * (size_t)ml_ld] : 0.0f;
            iv[i] = l > 0.0f ? 1.0f / l : 0.0f;
        }
        const __m512i qpv = _mm512_loadu_si512((const void *)qp);
        const __m512 m = _mm512_loadu_ps(mv), inv = _mm512_loadu_ps(iv);
        __mmask16 live = _mm512_cmp_ps_mask(inv, zero, _CMP_GT_OQ);
        for (int j = 0; j < nt; j++) {
            const float *kr = sp->k + (size_t)(j0 + j) * (size_t)sp->stride + koff;
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qt), _mm512_set1_ps(kr[0]));
            for (int t = 1; t < d; t++)
                a = _mm512_fmadd_ps(_mm512_loadu_ps(qt + t * 16), _mm512_set1_ps(kr[t]), a);
            __mmask16 sees =
                live & (__mmask16)~_mm512_cmpgt_epi32_mask(_mm512_set1_epi32(kp[j]), qpv);
            if (!sees) continue;
            __m512 e = tsr__z_exp(_mm512_sub_ps(_mm512_mul_ps(a, sv), m));
            acc[j] = _mm512_mask_add_ps(acc[j], sees, acc[j], _mm512_mul_ps(e, inv));
        }
    }
    for (int j = 0; j < nt; j++) ks[j] += _mm512_reduce_add_ps(acc[j]);
}

/* attn_qblock for heads of 32..TSR__CPU_QBLOCK_WIDE_MAX_D dims in steps of 16: the scores
 * of 16 keys at a time in 16 registers (lanes = queries; the queries' dimension t is one
 * vector from the stack, the keys' values are broadcast), the outputs 16 dimensions at a
 * time through the stack. Per lane the arithmetic of tsr__z_attn_qblock_d (the same
 * bits). */
static void tsr__z_attn_qblock_wide(const float *q, int64_t q_ld, const int32_t *qpos,
                                    int nq, int d, float scale, const tsr_kv_span *spans,
                                    int n_spans, int koff, int tile, float *out, float *ml,
                                    int64_t ml_ld) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sv = _mm512_set1_ps(scale);
    int32_t qp[16];
    float qt[TSR__CPU_QBLOCK_WIDE_MAX_D * 16], ob[TSR__CPU_QBLOCK_WIDE_MAX_D * 16];
    int32_t qmax = tsr__z_qblock_load(q, q_ld, qpos, nq, d, qt, qp);
    memset(ob, 0, (size_t)d * 16 * sizeof(float));
    const __m512i qpv = _mm512_loadu_si512((const void *)qp);
    __m512 m = ninf, l = _mm512_setzero_ps();
    __m512 s[TSR__CPU_QBLOCK_MAX_TILE];
    for (int sp_i = 0; sp_i < n_spans; sp_i++) {
        const tsr_kv_span *sp = &spans[sp_i];
        int64_t lim = tsr__z_qblock_limit(sp, qmax);
        for (int64_t j0 = 0; j0 < lim; j0 += tile) {
            int nt = lim - j0 < tile ? (int)(lim - j0) : tile;
            __m512 mt = ninf;
            for (int jb = 0; jb < nt; jb += 16) {
                int nb = nt - jb < 16 ? nt - jb : 16;
                const float *kr[16];
                for (int u = 0; u < 16; u++) /* keys past nt repeat the last, never kept */
                    kr[u] = sp->k + (size_t)(j0 + jb + (u < nb ? u : nb - 1)) *
                                        (size_t)sp->stride + (size_t)koff;
                __m512 a[16];
                __m512 qv = _mm512_loadu_ps(qt);
#pragma GCC unroll 16
                for (int u = 0; u < 16; u++) a[u] = _mm512_mul_ps(qv, _mm512_set1_ps(kr[u][0]));
                for (int t = 1; t < d; t++) {
                    qv = _mm512_loadu_ps(qt + t * 16);
#pragma GCC unroll 16
                    for (int u = 0; u < 16; u++)
                        a[u] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kr[u][t]), a[u]);
                }
                for (int u = 0; u < nb; u++)
                    s[jb + u] = tsr__z_qblock_score(a[u], sv, sp, j0 + jb + u, qpv, &mt);
            }
            __m512 corr;
            __mmask16 vis = tsr__z_qblock_softmax(s, nt, mt, &m, &l, &corr);
            if (!vis) continue;
            for (int c = 0; c < d; c += 16) {
                __m512 oc[16];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) {
                    __m512 ov = _mm512_loadu_ps(ob + (c + t) * 16);
                    oc[t] = _mm512_mask_mul_ps(ov, vis, ov, corr);
                }
                for (int j = 0; j < nt; j++) {
                    const float *vr = sp->v + (size_t)(j0 + j) * (size_t)sp->stride +
                                      (size_t)koff + (size_t)c;
#pragma GCC unroll 16
                    for (int t = 0; t < 16; t++)
                        oc[t] = _mm512_mask3_fmadd_ps(s[j], _mm512_set1_ps(vr[t]), oc[t], vis);
                }
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) _mm512_storeu_ps(ob + (c + t) * 16, oc[t]);
            }
        }
    }
    tsr__z_qblock_store(ob, d, m, l, nq, out, q_ld, ml, ml_ld);
}

/* attn_qblock with the head size a constant where it is common, so the query and output
 * vectors stay in registers. */
static void tsr__z_attn_qblock(const float *q, int64_t q_ld, const int32_t *qpos, int nq,
                               int d, float scale, const tsr_kv_span *spans, int n_spans,
                               int koff, int tile, float *out, float *ml, int64_t ml_ld) {
#define TSR__QB(D) tsr__z_attn_qblock_d(q, q_ld, qpos, nq, D, scale, spans, n_spans, koff, \
                                        tile, out, ml, ml_ld)
    if (d > TSR__CPU_QBLOCK_MAX_D) {
        tsr__z_attn_qblock_wide(q, q_ld, qpos, nq, d, scale, spans, n_spans, koff, tile, out,
                                ml, ml_ld);
        return;
    }
    switch (d) {
    case 4: TSR__QB(4); break;
    case 8: TSR__QB(8); break;
    case 16: TSR__QB(16); break;
    default: TSR__QB(d); break;
    }
#undef TSR__QB
}

/* wt[k][u] = w[u][k] for k < len, u < 16 (rows past m are 0): 16 rows of w transposed, so
 * an output is a vector of 16 rows and x is broadcast (no horizontal sums). */
static void tsr__z_short_wt(const float *w, int64_t ldw, int m, int len, float *wt) {
    for (int k = 0; k < len; k++)
        for (int u = 0; u < 16; u++)
            wt[k * 16 + u] = u < m ? w[(size_t)u * (size_t)ldw + (size_t)k] : 0.0f;
}

/* a[u] = one fma chain over k < len of x row u's column k times wt[k], for 8 rows of x
 * (8 independent chains: one chain, latency-bound, was slower than sgemm). */
TSR__INLINE void tsr__z_short_chain(const float *const *xi, const float *wt, int len,
                                    __m512 *a) {
    __m512 w0 = _mm512_loadu_ps(wt);
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) a[u] = _mm512_mul_ps(_mm512_set1_ps(xi[u][0]), w0);
    for (int k = 1; k < len; k++) {
        __m512 wk = _mm512_loadu_ps(wt + k * 16);
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) a[u] = _mm512_fmadd_ps(_mm512_set1_ps(xi[u][k]), wk, a[u]);
    }
}

/* Row pointers of x rows i0..i0+7; rows past n repeat the last (computed, never stored). */
static int tsr__z_short_rows(const float *x, int64_t ldx, int64_t n, int64_t i0,
                             const float **xi) {
    int ni = n - i0 < 8 ? (int)(n - i0) : 8;
    for (int u = 0; u < 8; u++) xi[u] = x + (size_t)(i0 + (u < ni ? u : ni - 1)) * (size_t)ldx;
    return ni;
}

static void tsr__z_gemm_short(const float *x, int64_t ldx, int64_t n, const float *w,
                              int64_t ldw, int64_t nr, int len, float *y, int64_t ldy,
                              bool add) {
    float wt[TSR__CPU_SHORT_K * 16];
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        int m = nr - r0 < 16 ? (int)(nr - r0) : 16;
        __mmask16 mk = (__mmask16)((1u << m) - 1u);
        tsr__z_short_wt(w + (size_t)r0 * (size_t)ldw, ldw, m, len, wt);
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            const float *xi[8];
            int ni = tsr__z_short_rows(x, ldx, n, i0, xi);
            __m512 a[8];
            tsr__z_short_chain(xi, wt, len, a);
            for (int u = 0; u < ni; u++) {
                float *yr = y + (size_t)(i0 + u) * (size_t)ldy + (size_t)r0;
                if (add) a[u] = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yr), a[u]);
                _mm512_mask_storeu_ps(yr, mk, a[u]);
            }
        }
    }
}

/* Every part at once (each at most TSR__CPU_SHORT_K columns, all of them within
 * TSR__CPU_SHORT_SUM_COLS): part 0's chain, then + each later part's chain in part order,
 * as gemm_short part by part with add, but the running sum stays in registers instead of
 * going through y after every part, and the call and transposition happen once. An empty
 * part adds +0 (the bits of the sgemm path's memset and add). */
static void tsr__z_gemm_short_sum(const float *x, int64_t ldx, int64_t n, const float *w,
                                  int64_t ldw, int64_t nr, const int32_t *seg, int n_parts,
                                  float *y, int64_t ldy) {
    float wt[TSR__CPU_SHORT_SUM_COLS * 16];
    int c0 = seg[0], cols = seg[n_parts] - c0;
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        int m = nr - r0 < 16 ? (int)(nr - r0) : 16;
        __mmask16 mk = (__mmask16)((1u << m) - 1u);
        tsr__z_short_wt(w + (size_t)r0 * (size_t)ldw + (size_t)c0, ldw, m, cols, wt);
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            const float *xi[8], *xp[8];
            int ni = tsr__z_short_rows(x, ldx, n, i0, xi);
            __m512 tot[8], a[8];
            for (int p = 0; p < n_parts; p++) {
                int s0 = seg[p] - c0, len = seg[p + 1] - seg[p];
                if (len > 0) {
                    for (int u = 0; u < 8; u++) xp[u] = xi[u] + c0 + s0;
                    tsr__z_short_chain(xp, wt + (size_t)s0 * 16, len, a);
                } else {
                    for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
                }
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++) tot[u] = p ? _mm512_add_ps(tot[u], a[u]) : a[u];
            }
            for (int u = 0; u < ni; u++)
                _mm512_mask_storeu_ps(y + (size_t)(i0 + u) * (size_t)ldy + (size_t)r0, mk,
                                      tot[u]);
        }
    }
}

/* Squares of f32 are exact in double, so each fma below is the add of the scalar loop; only
 * the order of the double additions differs (16 lanes, then a tree). */
static void tsr__z_rmsnorm_f32(const float *x, const float *w, int dim, float eps, float *o) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int i = 0;
    for (; i + 16 <= dim; i += 16) {
        __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < dim; i++) ss += (double)x[i] * x[i];
    float rs = 1.0f / sqrtf((float)(ss / dim) + eps);
    __m512 rv = _mm512_set1_ps(rs);
    for (i = 0; i < dim; i += 16) {
        int rem = dim - i < 16 ? dim - i : 16;
        __mmask16 m = (__mmask16)((1u << rem) - 1u);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv);
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

const tsr__cpu_kernels tsr__cpu_k_avx512 = {
    TSR__ISA_AVX512, "avx512", tsr__z_matvec_f32, tsr__z_matvec_bf16, tsr__z_matvec_f16,
    tsr__z_matvec_seg_f32, tsr__z_matvec_seg_bf16, tsr__z_matvec_seg_f16, tsr__z_cvt_bf16,
    tsr__z_cvt_f16, tsr__z_dot_rows, tsr__z_acc_rows, tsr__z_exp_sum,
    tsr__z_silu_mul, true, tsr__z_dot_heads, tsr__z_acc_heads, tsr__z_attn_qblock,
    tsr__z_gemm_short, tsr__z_rmsnorm_f32, tsr__z_gemm_short_sum, tsr__z_attn_scores_qblock,
    1u << TSR_KV_BF16 | 1u << TSR_KV_Q8 | 1u << TSR_KV_FP8, tsr__z_dot_heads_stored,
    tsr__z_acc_heads_stored,
};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* TSR__X86 */
