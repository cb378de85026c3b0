/* The AVX2 kernels of the CPU backend (AVX2, FMA, F16C: 8 floats a vector), table
 * tsr__cpu_k_avx2, which simd_cpu.c hands out only on CPUs with those extensions. The whole
 * file is under one target pragma (GCC's, or clang's attribute pragma) and has nothing else in
 * it, so the compiler may use these instructions here and nowhere else: the scalar kernels and
 * the dispatch (simd_cpu.c) stay baseline x86-64, and an AVX2 kernel cannot pick up AVX-512
 * instructions. */
#include "kernels/cpu/simd_internal.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"

#ifdef TSR__X86

/* clang has no GCC target pragma; its attribute pragma gives every function below the same
 * target (the always-inline helpers included), which is what the GCC pragma does. */
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

TSR__INLINE __m256 tsr__y_load(const void *w, int64_t k, int dt) {
    if (dt == TSR__DT_F32) return _mm256_loadu_ps((const float *)w + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    if (dt == TSR__DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The last rem (< 8) elements, zero padded. */
TSR__INLINE __m256 tsr__y_load_tail(const void *w, int64_t k, int rem, int dt) {
    if (dt == TSR__DT_F32) {
        float buf[8] = {0};
        memcpy(buf, (const float *)w + k, (size_t)rem * 4);
        return _mm256_loadu_ps(buf);
    }
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)w + k, (size_t)rem * 2);
    return tsr__y_load(buf, 0, dt);
}

TSR__INLINE float tsr__y_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Bytes ahead of the weight stream the 2-byte (BF16, F16) matvec prefetches: on an
 * AVX2-only EPYC (Zen 1) the hardware prefetchers fell behind that stream (`tessera bench
 * --model synthetic:stories110M --dtype bf16`, decode without and with, alternated: 1
 * thread 37.0-37.1 and 43.1-45.2 tok/s, 2 threads 62.1-65.2 and 75.2-78.9), as they did
 * behind the quantized kernels' (quant_q8_internal.h tsr__qprefetch). f32, near the read
 * already, gained nothing (25.6-26.4 either way at 1 thread, 39.6-43.0 at 2) and goes
 * without. The rows are stored one after another, so these are the bytes of a later step
 * or row; x86 prefetches never fault, so lines past the matrix may be named (as an
 * integer address). */
#define TSR__Y_PREFETCH_BYTES 4096

TSR__INLINE void tsr__y_matvec(const void *w, int64_t cols, int64_t r0, int64_t r1,
                               const float *x, const int nx, float *y, int64_t ldy,
                               const int dt) {
    size_t esz = dt == TSR__DT_F32 ? 4 : 2;
    int rem = (int)(cols & 7);
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = (const char *)w + (size_t)r * (size_t)cols * esz;
        __m256 acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            acc[i][0] = _mm256_setzero_ps();
            acc[i][1] = _mm256_setzero_ps();
            acc[i][2] = _mm256_setzero_ps();
            acc[i][3] = _mm256_setzero_ps();
        }
        int64_t k = 0;
        for (; k + 32 <= cols; k += 32) {
            if (dt != TSR__DT_F32) /* a step is one cache line (dt is a constant) */
                __builtin_prefetch(
                    (const void *)((uintptr_t)wr + (uintptr_t)k * 2 + TSR__Y_PREFETCH_BYTES));
            __m256 w0 = tsr__y_load(wr, k, dt), w1 = tsr__y_load(wr, k + 8, dt);
            __m256 w2 = tsr__y_load(wr, k + 16, dt), w3 = tsr__y_load(wr, k + 24, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++) {
                const float *xi = x + (size_t)i * (size_t)cols + k;
                acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xi), acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), acc[i][1]);
                acc[i][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xi + 16), acc[i][2]);
                acc[i][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xi + 24), acc[i][3]);
            }
        }
        for (; k + 8 <= cols; k += 8) {
            __m256 w0 = tsr__y_load(wr, k, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                acc[i][0] = _mm256_fmadd_ps(
                    w0, _mm256_loadu_ps(x + (size_t)i * (size_t)cols + k), acc[i][0]);
        }
        if (rem) {
            __m256 w0 = tsr__y_load_tail(wr, k, rem, dt);
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++) {
                __m256 xv = tsr__y_load_tail(x + (size_t)i * (size_t)cols, k, rem,
                                             TSR__DT_F32);
                acc[i][1] = _mm256_fmadd_ps(w0, xv, acc[i][1]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256 s = _mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]),
                                     _mm256_add_ps(acc[i][2], acc[i][3]));
            y[(size_t)i * (size_t)ldy + (size_t)r] = tsr__y_hsum(s);
        }
    }
}

#define TSR__Y_MATVEC(NAME, T, DT)                                                       \
    static void NAME(const T *w, int64_t cols, int64_t r0, int64_t r1, const float *x,   \
                     int nx, float *y, int64_t ldy) {                                    \
        switch (nx) {                                                                    \
        case 1: tsr__y_matvec(w, cols, r0, r1, x, 1, y, ldy, DT); break;                 \
        case 2: tsr__y_matvec(w, cols, r0, r1, x, 2, y, ldy, DT); break;                 \
        case 3: tsr__y_matvec(w, cols, r0, r1, x, 3, y, ldy, DT); break;                 \
        default: tsr__y_matvec(w, cols, r0, r1, x, 4, y, ldy, DT); break;                \
        }                                                                                \
    }
TSR__Y_MATVEC(tsr__y_matvec_f32, float, TSR__DT_F32)
TSR__Y_MATVEC(tsr__y_matvec_bf16, uint16_t, TSR__DT_BF16)
TSR__Y_MATVEC(tsr__y_matvec_f16, uint16_t, TSR__DT_F16)

/* Segment [s, s + len) of a row: the operations of tsr__y_matvec on a row of len. */
TSR__INLINE void tsr__y_dot_seg(const void *wr, const float *x, int64_t ldx, int64_t s,
                                int64_t len, const int nx, const int dt, float *d) {
    int rem = (int)(len & 7);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        acc[i][0] = _mm256_setzero_ps();
        acc[i][1] = _mm256_setzero_ps();
        acc[i][2] = _mm256_setzero_ps();
        acc[i][3] = _mm256_setzero_ps();
    }
    const float *xs = x + s;
    int64_t k = 0;
    for (; k + 32 <= len; k += 32) {
        __m256 w0 = tsr__y_load(wr, s + k, dt), w1 = tsr__y_load(wr, s + k + 8, dt);
        __m256 w2 = tsr__y_load(wr, s + k + 16, dt), w3 = tsr__y_load(wr, s + k + 24, dt);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            const float *xi = xs + (size_t)i * (size_t)ldx + k;
            acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xi), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), acc[i][1]);
            acc[i][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xi + 16), acc[i][2]);
            acc[i][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xi + 24), acc[i][3]);
        }
    }
    for (; k + 8 <= len; k += 8) {
        __m256 w0 = tsr__y_load(wr, s + k, dt);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++)
            acc[i][0] = _mm256_fmadd_ps(
                w0, _mm256_loadu_ps(xs + (size_t)i * (size_t)ldx + k), acc[i][0]);
    }
    if (rem) {
        __m256 w0 = tsr__y_load_tail(wr, s + k, rem, dt);
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            __m256 xv = tsr__y_load_tail(xs + (size_t)i * (size_t)ldx, k, rem, TSR__DT_F32);
            acc[i][1] = _mm256_fmadd_ps(w0, xv, acc[i][1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
        __m256 v = _mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]),
                                 _mm256_add_ps(acc[i][2], acc[i][3]));
        d[i] = tsr__y_hsum(v);
    }
}

TSR__INLINE void tsr__y_matvec_seg(const void *w, int64_t cols, int64_t r0, int64_t r1,
                                   const float *x, const int nx, const int32_t *seg,
                                   int n_parts, bool sum, float *y, int64_t ldy, int64_t ldp,
                                   const int dt) {
    TSR__MATVEC_SEG_BODY(tsr__y_dot_seg)
}
TSR__MATVEC_SEG_FN(tsr__y_matvec_seg_f32, tsr__y_matvec_seg, float, TSR__DT_F32)
TSR__MATVEC_SEG_FN(tsr__y_matvec_seg_bf16, tsr__y_matvec_seg, uint16_t, TSR__DT_BF16)
TSR__MATVEC_SEG_FN(tsr__y_matvec_seg_f16, tsr__y_matvec_seg, uint16_t, TSR__DT_F16)

static void tsr__y_cvt_bf16(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, tsr__y_load(src, i, TSR__DT_BF16));
    for (; i < n; i++) dst[i] = tsr_bf16_to_f32(src[i]);
}
static void tsr__y_cvt_f16(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, tsr__y_load(src, i, TSR__DT_F16));
    for (; i < n; i++) dst[i] = tsr_f16_to_f32(src[i]);
}

/* Four items' dot products from their two accumulators each (a0[u] + a1[u]), reduced
 * together and scaled: item u's sum in lane u, through per-item adds only (halves, then
 * pairs), so an item's bits depend on its own accumulators, never on its neighbours. */
TSR__INLINE __m128 tsr__y_reduce4(const __m256 *a0, const __m256 *a1, __m128 sv) {
    __m256 v0 = _mm256_add_ps(a0[0], a1[0]), v1 = _mm256_add_ps(a0[1], a1[1]);
    __m256 v2 = _mm256_add_ps(a0[2], a1[2]), v3 = _mm256_add_ps(a0[3], a1[3]);
    /* lo + hi: x0 = [item 0 | item 1], x1 = [item 2 | item 3], four sums each. */
    __m256 x0 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20),
                              _mm256_permute2f128_ps(v0, v1, 0x31));
    __m256 x1 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20),
                              _mm256_permute2f128_ps(v2, v3, 0x31));
    /* (s0 + s2, s1 + s3), then their sum: lanes [i0 i2 . . | i1 i3 . .]. */
    __m256 y = _mm256_add_ps(_mm256_shuffle_ps(x0, x1, 0x44), _mm256_shuffle_ps(x0, x1, 0xEE));
    __m256 z = _mm256_add_ps(_mm256_shuffle_ps(y, y, 0x88), _mm256_shuffle_ps(y, y, 0xDD));
    __m128 r = _mm_unpacklo_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
    return _mm_mul_ps(r, sv);
}

/* Four keys at a time, reduced together: the same per-key operations as one reduction per
 * key (two accumulators, halves, then pairs), with the shuffles shared by four keys. Keys
 * past nk reuse q as a dummy row, so every key's value goes through the same operations
 * whatever nk is (the score pass and the main pass then agree bitwise). */
static void tsr__y_dot_rows(const float *q, const float *k, int64_t stride, int nk, int d,
                            float scale, float *out) {
    int rem = d & 7;
    __m256 qt = rem ? tsr__y_load_tail(q, d - rem, rem, TSR__DT_F32) : _mm256_setzero_ps();
    __m128 sv = _mm_set1_ps(scale);
    for (int j = 0; j < nk; j += 4) {
        const float *kr[4];
        for (int u = 0; u < 4; u++)
            kr[u] = j + u < nk ? k + (size_t)(j + u) * (size_t)stride : q;
        __m256 a0[4], a1[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
        int t = 0;
        for (; t + 16 <= d; t += 16) {
            __m256 q0 = _mm256_loadu_ps(q + t), q1 = _mm256_loadu_ps(q + t + 8);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                a0[u] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kr[u] + t), a0[u]);
                a1[u] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kr[u] + t + 8), a1[u]);
            }
        }
        for (; t + 8 <= d; t += 8) {
            __m256 q0 = _mm256_loadu_ps(q + t);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                a0[u] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kr[u] + t), a0[u]);
        }
        if (rem) {
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                a1[u] = _mm256_fmadd_ps(qt, tsr__y_load_tail(kr[u], t, rem, TSR__DT_F32),
                                        a1[u]);
        }
        __m128 r = tsr__y_reduce4(a0, a1, sv);
        if (nk - j >= 4) {
            _mm_storeu_ps(out + j, r);
        } else {
            float buf[4];
            _mm_storeu_ps(buf, r);
            memcpy(out + j, buf, (size_t)(nk - j) * 4);
        }
    }
}

/* Keys outer, 32 columns at a time in registers: four independent FMA chains instead of
 * one chain per column block. Each element still sums acc * c, then the keys in order, so
 * a key run split into tiles differently gives the same sums whenever c is 1. */
static void tsr__y_acc_rows(float *acc, float c, const float *p, const float *v,
                            int64_t stride, int nk, int d) {
    __m256 cv = _mm256_set1_ps(c);
    int t = 0;
    for (; t + 32 <= d; t += 32) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) a[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + t + 8 * u), cv);
        for (int j = 0; j < nk; j++) {
            const float *vj = v + (size_t)j * (size_t)stride + t;
            __m256 pj = _mm256_set1_ps(p[j]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * u), a[u]);
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(acc + t + 8 * u, a[u]);
    }
    for (; t + 8 <= d; t += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + t), cv);
        for (int j = 0; j < nk; j++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),
                                _mm256_loadu_ps(v + (size_t)j * (size_t)stride + t), a);
        _mm256_storeu_ps(acc + t, a);
    }
    for (; t < d; t++) {
        float a = acc[t] * c;
        for (int j = 0; j < nk; j++)
            a = __builtin_fmaf(p[j], v[(size_t)j * (size_t)stride + t], a);
        acc[t] = a;
    }
}

/* The factor tsr__y_kv_ld applies to an FP8 row's decoded codes: 256 times its scale, read
 * once per row (in acc_heads the stores to the accumulators could alias the row, so the
 * compiler would reload it per vector). 0 for the other dtypes. */
TSR__INLINE float tsr__y_kv_rs(const void *k, const int dt) {
    float d = 0.0f;
    if (dt == TSR_KV_FP8) memcpy(&d, k, 4);
    return d * 256.0f;
}

/* Eight elements from e of a stored K/V row, decoded as tsr_kv_rows_decode does, so with
 * its bits: BF16 widened (exact); Q8 d * q of e's block (e is a multiple of 8 inside a
 * head of whole blocks, so the eight share it); FP8 d * e4m3. An E4M3 code's bits, less
 * the sign, shifted left by 7 are the FP16 of its value / 256 (the exponent biases differ
 * by 8, subnormals included), so vcvtph2ps decodes it exactly and d * v equals v * rs,
 * rs = 256 d (tsr__y_kv_rs: exact, as d = amax / 448); the NaN codes 0x7f and 0xff become
 * NaN first. */
TSR__INLINE __m256 tsr__y_kv_ld(const void *k, int64_t e, float rs, const int dt) {
    const uint8_t *r = k;
    switch (dt) {
    case TSR_KV_F32: return _mm256_loadu_ps((const float *)k + e);
    case TSR_KV_BF16: return tsr__y_load(k, e, TSR__DT_BF16);
    case TSR_KV_Q8: {
        r += (size_t)(e / TSR_KV_Q8_BLOCK) * TSR_KV_Q8_BLOCK_BYTES;
        float d;
        memcpy(&d, r, 4);
        __m128i q = _mm_loadl_epi64((const __m128i *)(r + 4 + e % TSR_KV_Q8_BLOCK));
        return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    default: {
        __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(r + 4 + e)));
        __m128i mag = _mm_and_si128(c, _mm_set1_epi16(0x7f));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(mag, 7));
        /* FP16's quiet NaN 0x7e00 widens to 0x7fc00000, the table's NaN */
        h = _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00),
                            _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(rs));
    }
    }
}

/* The last rem (< 8) elements from e, decoded one by one, zero padded. */
TSR__INLINE __m256 tsr__y_kv_ld_tail(const void *k, int64_t e, int rem, const int dt) {
    float buf[8] = {0};
    for (int i = 0; i < rem; i++) buf[i] = tsr_kv_elem_decode(dt, k, e + i);
    return _mm256_loadu_ps(buf);
}

/* One key row, four query heads at a time: the per-item operations of tsr__y_dot_rows
 * (two accumulators over the columns in order, tsr__y_reduce4, the scale) with heads in
 * place of its four keys, so a (head, key) score has the same bits whichever computed it.
 * Head by head along the row, so its bytes are loaded in address order (the order DRAM
 * streams best; dot_rows keeps each head's strip down 16 rows). k is an f32 row, or a
 * stored row of dtype dt decoded as it is loaded (tsr__y_kv_ld). */
TSR__INLINE void tsr__y_dot_heads_dt(const float *q, const void *k, const int32_t *koff,
                                     int nh, int d, float scale, float *out, int64_t out_ld,
                                     const int dt) {
    int rem = d & 7;
    __m128 sv = _mm_set1_ps(scale);
    const float rs = tsr__y_kv_rs(k, dt);
    for (int h0 = 0; h0 < nh; h0 += 4) {
        int n = nh - h0 < 4 ? nh - h0 : 4;
        __m256 a0[4], a1[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            if (u >= n) break; /* absent heads reduce zeros, which touch no other lane */
            const float *qu = q + (size_t)(h0 + u) * (size_t)d;
            int64_t ku = koff[h0 + u];
            int t = 0;
            for (; t + 16 <= d; t += 16) {
                a0[u] = _mm256_fmadd_ps(_mm256_loadu_ps(qu + t),
                                        tsr__y_kv_ld(k, ku + t, rs, dt), a0[u]);
                a1[u] = _mm256_fmadd_ps(_mm256_loadu_ps(qu + t + 8),
                                        tsr__y_kv_ld(k, ku + t + 8, rs, dt), a1[u]);
            }
            for (; t + 8 <= d; t += 8)
                a0[u] = _mm256_fmadd_ps(_mm256_loadu_ps(qu + t),
                                        tsr__y_kv_ld(k, ku + t, rs, dt), a0[u]);
            if (rem)
                a1[u] = _mm256_fmadd_ps(tsr__y_load_tail(qu, t, rem, TSR__DT_F32),
                                        tsr__y_kv_ld_tail(k, ku + t, rem, dt), a1[u]);
        }
        float r[4];
        _mm_storeu_ps(r, tsr__y_reduce4(a0, a1, sv));
        for (int u = 0; u < n; u++) out[(size_t)(h0 + u) * (size_t)out_ld] = r[u];
    }
}

static void tsr__y_dot_heads(const float *q, const float *k, const int32_t *koff, int nh,
                             int d, float scale, float *out, int64_t out_ld) {
    tsr__y_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_F32);
}

static void tsr__y_dot_heads_stored(const float *q, const void *k, int dtype,
                                    const int32_t *koff, int nh, int d, float scale,
                                    float *out, int64_t out_ld) {
    switch (dtype) { /* one copy per dtype, its decoding inlined */
    case TSR_KV_BF16:
        tsr__y_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_BF16);
        break;
    case TSR_KV_Q8: tsr__y_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_Q8); break;
    default: tsr__y_dot_heads_dt(q, k, koff, nh, d, scale, out, out_ld, TSR_KV_FP8); break;
    }
}

/* Keys outer, heads inner, each head's accumulator through L1: the rows are read front to
 * back. Per element: acc, then + p * v for each key in order, each an fma, as in
 * tsr__y_acc_rows after its scaling. v is f32 or stored as dt, as in dot_heads; rows
 * row_bytes apart. */
TSR__INLINE void tsr__y_acc_heads_dt(float *acc, const float *p, int64_t p_ld, const void *v,
                                     int64_t row_bytes, const int32_t *koff, int nk, int nh,
                                     int d, const int dt) {
    for (int j = 0; j < nk; j++) {
        const void *vj = (const uint8_t *)v + (size_t)j * (size_t)row_bytes;
        float rs = tsr__y_kv_rs(vj, dt);
        for (int hh = 0; hh < nh; hh++) {
            float *ah = acc + (size_t)hh * (size_t)d;
            int64_t vh = koff[hh];
            float pf = p[(size_t)hh * (size_t)p_ld + (size_t)j];
            __m256 pj = _mm256_set1_ps(pf);
            int t = 0;
#pragma GCC unroll 4
            for (; t + 8 <= d; t += 8)
                _mm256_storeu_ps(ah + t, _mm256_fmadd_ps(pj, tsr__y_kv_ld(vj, vh + t, rs, dt),
                                                         _mm256_loadu_ps(ah + t)));
            for (; t < d; t++)
                ah[t] = __builtin_fmaf(pf, tsr_kv_elem_decode(dt, vj, vh + t), ah[t]);
        }
    }
}

static void tsr__y_acc_heads(float *acc, const float *p, int64_t p_ld, const float *v,
                             int64_t stride, const int32_t *koff, int nk, int nh, int d) {
    tsr__y_acc_heads_dt(acc, p, p_ld, v, stride * 4, koff, nk, nh, d, TSR_KV_F32);
}

static void tsr__y_acc_heads_stored(float *acc, const float *p, int64_t p_ld, const void *v,
                                    int64_t row_bytes, int dtype, const int32_t *koff, int nk,
                                    int nh, int d) {
    switch (dtype) {
    case TSR_KV_BF16:
        tsr__y_acc_heads_dt(acc, p, p_ld, v, row_bytes, koff, nk, nh, d, TSR_KV_BF16);
        break;
    case TSR_KV_Q8:
        tsr__y_acc_heads_dt(acc, p, p_ld, v, row_bytes, koff, nk, nh, d, TSR_KV_Q8);
        break;
    default: tsr__y_acc_heads_dt(acc, p, p_ld, v, row_bytes, koff, nk, nh, d, TSR_KV_FP8); break;
    }
}

TSR__INLINE __m256 tsr__y_exp(__m256 x) {
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(TSR__EXP_LO)),
                              _mm256_set1_ps(TSR__EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(TSR__EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(TSR__EXP_C1), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(TSR__EXP_C2), r);
    __m256 p = _mm256_set1_ps(TSR__EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TSR__EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TSR__EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TSR__EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TSR__EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TSR__EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n as 2^h * 2^(n-h), h = n/2: n spans -126..128 and 2^128 or 2^-127 alone would
     * not fit the exponent field. */
    __m256i ni = _mm256_cvtps_epi32(n), hi = _mm256_srai_epi32(ni, 1);
    __m256i b = _mm256_set1_epi32(127);
    __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(hi, b), 23));
    __m256 e2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, hi), b), 23));
    p = _mm256_mul_ps(_mm256_mul_ps(p, e1), e2);
    p = _mm256_blendv_ps(p, _mm256_setzero_ps(),
                         _mm256_cmp_ps(x, _mm256_set1_ps(TSR__EXP_LO), _CMP_LT_OQ));
    p = _mm256_blendv_ps(p, _mm256_set1_ps(INFINITY),
                         _mm256_cmp_ps(x, _mm256_set1_ps(TSR__EXP_HI), _CMP_GT_OQ));
    return _mm256_blendv_ps(p, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static float tsr__y_exp_sum(float *x, int n, float sub) {
    __m256 sv = _mm256_set1_ps(sub), acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = tsr__y_exp(_mm256_sub_ps(_mm256_loadu_ps(x + j), sv));
        _mm256_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) {
        float buf[8] = {0};
        memcpy(buf, x + j, (size_t)(n - j) * 4);
        _mm256_storeu_ps(buf, tsr__y_exp(_mm256_sub_ps(_mm256_loadu_ps(buf), sv)));
        memcpy(x + j, buf, (size_t)(n - j) * 4);
        for (int t = n - j; t < 8; t++) buf[t] = 0.0f;
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(buf));
    }
    return tsr__y_hsum(acc);
}

static void tsr__y_silu_mul(float *g, const float *u, int64_t n) {
    __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = tsr__y_exp(_mm256_sub_ps(zero, gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        float gb[8] = {0}, ub[8] = {0};
        memcpy(gb, g + i, (size_t)(n - i) * 4);
        memcpy(ub, u + i, (size_t)(n - i) * 4);
        tsr__y_silu_mul(gb, ub, 8);
        memcpy(g + i, gb, (size_t)(n - i) * 4);
    }
}

const tsr__cpu_kernels tsr__cpu_k_avx2 = {
    TSR__ISA_AVX2, "avx2", tsr__y_matvec_f32, tsr__y_matvec_bf16, tsr__y_matvec_f16,
    tsr__y_matvec_seg_f32, tsr__y_matvec_seg_bf16, tsr__y_matvec_seg_f16, tsr__y_cvt_bf16,
    tsr__y_cvt_f16, tsr__y_dot_rows, tsr__y_acc_rows, tsr__y_exp_sum,
    tsr__y_silu_mul, false, tsr__y_dot_heads, tsr__y_acc_heads, NULL, NULL, NULL, NULL, NULL,
    (1u << TSR_KV_BF16) | (1u << TSR_KV_Q8) | (1u << TSR_KV_FP8), tsr__y_dot_heads_stored,
    tsr__y_acc_heads_stored,
};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* TSR__X86 */
