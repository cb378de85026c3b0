/* Internals of the CPU backend shared by its files: the context, the per-op entry points
 * the vtable points at, and the runtime-dispatched SIMD kernels (simd_cpu.c). */
#ifndef TSR_KERNELS_CPU_CPU_INTERNAL_H
#define TSR_KERNELS_CPU_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/kv_dtype.h"

/* Largest head_dim the attention and rope kernels keep on the stack. */
#define TSR__CPU_MAX_HEAD_DIM 512

/* A buffer_alloc buffer from tsr_malloc_huge: tsr_free_huge needs its size back. */
typedef struct tsr__cpu_huge {
    void *ptr;
    size_t bytes;
} tsr__cpu_huge;

/* Scratch of one attention call (attn_cpu.c): per (query, head) log-sum-exp for the
 * key-score pass; for non-f32 KV (kernels/kv_dtype.h) the call's K/V rows in f32 and the
 * spans that point at them; attention_paged's spans of one sequence. */
typedef struct tsr__attn_scratch {
    float *lse;
    size_t lse_cap;
    float *kvdq;
    size_t kvdq_cap;
    tsr_kv_span *dqspan;
    int dqspan_cap;
    tsr_kv_span *spans;
    int spans_cap;
    float *part; /* a partitioned decode row's shares (attn_cpu.c tsr__attn_decode) */
    size_t part_cap;
} tsr__attn_scratch;

typedef struct tsr__cpu_ctx {
    int threads;
    /* Live huge-page buffers (buffer_alloc of >= 2 MiB: weights, KV stores), unordered. */
    tsr__cpu_huge *huge;
    size_t n_huge, huge_cap;
    /* Prefill scratch: a panel of BF16/F16 weight rows converted to f32. */
    float *panel;
    size_t panel_cap; /* floats */
    /* matmul_parts prefill scratch: per thread a widened segment panel and a part's output. */
    float *parts;
    size_t parts_cap;
    /* Decode scratch: x reordered for BF16 kernels with bf16_pairs (tsr__cpu_bf16_pairs). */
    float *xpairs;
    size_t xpairs_cap;
    /* Q8_0 matmuls: the input rows quantized per token (gemm_cpu.c, quant_q8.h). */
    float *q8x;
    size_t q8x_cap;
    /* Attention scratch of calls on the caller's thread, and one per OpenMP thread for
     * attention_paged's sequences run side by side (attn_thr[threads], made at first use). */
    tsr__attn_scratch attn;
    tsr__attn_scratch *attn_thr;
    /* rope: inv_freq of the last config seen (recomputed when the parameters change). */
    float *inv_freq;
    size_t inv_freq_cap;
    int inv_freq_hd;
    float inv_freq_theta;
    int inv_freq_scaling;
    float inv_freq_params[7];
    int inv_freq_orig;
    /* rope: cos and sin of the last position list seen, [n][hd/2] each (the forward ropes
     * q and k of every layer at the same positions, so one table serves 2 * n_layers
     * calls); rope_n < 0: none. */
    float *rope_cs;
    size_t rope_cs_cap;
    int32_t *rope_pos;
    int64_t rope_pos_cap;
    int64_t rope_n;
    int rope_half;
    /* qkv_rope with a KV layout: the call's rotated K and V rows, [n][2][kv width]. */
    float *qkv_kv;
    size_t qkv_kv_cap;
} tsr__cpu_ctx;

/* Memory calls (mem_cpu.c): host memory, memcpy, streams that are the caller's thread. */
tsr_status tsr__cpu_host_alloc(tsr_backend *be, size_t bytes, bool pinned, void **out);
void tsr__cpu_host_free(tsr_backend *be, void *ptr);
tsr_status tsr__cpu_memory(tsr_backend *be, size_t *free_bytes, size_t *total_bytes);
/* download is the same memcpy as upload */
tsr_status tsr__cpu_upload(tsr_backend *be, void *dst, const void *src, size_t bytes,
                           tsr_stream *stream);
tsr_status tsr__cpu_copy(tsr_backend *be, void *dst, const void *src, size_t bytes);
tsr_status tsr__cpu_memset(tsr_backend *be, void *dst, int byte, size_t bytes);
tsr_status tsr__cpu_stream_create(tsr_backend *be, tsr_stream **out);
void tsr__cpu_stream_destroy(tsr_backend *be, tsr_stream *stream);
tsr_status tsr__cpu_event_create(tsr_backend *be, tsr_event **out);
void tsr__cpu_event_destroy(tsr_backend *be, tsr_event *ev);
tsr_status tsr__cpu_event_record(tsr_backend *be, tsr_event *ev, tsr_stream *stream);
tsr_status tsr__cpu_stream_wait(tsr_backend *be, tsr_stream *stream, tsr_event *ev);
tsr_status tsr__cpu_event_sync(tsr_backend *be, tsr_event *ev);
tsr_status tsr__cpu_kv_write(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                             int64_t n, const float *k, const float *v);
tsr_status tsr__cpu_kv_copy(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *dst,
                            const int32_t *src, int64_t n);
tsr_status tsr__cpu_kv_gather(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                              int64_t n, float *k, float *v, tsr_stream *stream);
tsr_status tsr__cpu_kv_scatter(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                               int64_t n, const float *k, const float *v, tsr_stream *stream);

/* Grows a float scratch buffer to at least n floats. */
tsr_status tsr__cpu_scratch(float **buf, size_t *cap, size_t n);

tsr_status tsr__cpu_matmul(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                           float *y);
tsr_status tsr__cpu_matmul_parts(tsr_backend *be, const float *x, int64_t n,
                                 const tsr_tensor *w, const int32_t *seg, int n_parts, bool sum,
                                 float *y);
tsr_status tsr__cpu_rmsnorm(tsr_backend *be, const float *x, const tsr_tensor *w, int64_t n,
                            int dim, float eps, float *out);
tsr_status tsr__cpu_rope(tsr_backend *be, float *x, const int32_t *pos, int64_t n,
                         int n_heads, const tsr_model_config *cfg);
tsr_status tsr__cpu_swiglu(tsr_backend *be, float *gate, const float *up, int64_t n);
tsr_status tsr__cpu_qkv_rope(tsr_backend *be, const tsr_qkv_rope_args *a);
tsr_status tsr__cpu_swiglu_fused(tsr_backend *be, const float *gu, int64_t n, int hidden,
                                 float *out);
tsr_status tsr__cpu_add(tsr_backend *be, float *x, const float *y, int64_t n);
tsr_status tsr__cpu_bias_add(tsr_backend *be, float *x, const tsr_tensor *b, int64_t n);
tsr_status tsr__cpu_embed(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids,
                          int64_t n, float *out);
tsr_status tsr__cpu_attention(tsr_backend *be, const tsr_attn_args *a);
/* The same on `threads` threads with the scratch s (tsr__cpu_attention: c->threads and
 * c->attn); the bits do not depend on the thread count. */
tsr_status tsr__cpu_attention_on(const tsr_attn_args *a, int threads, tsr__attn_scratch *s);
/* Frees what s holds. */
void tsr__attn_scratch_free(tsr__attn_scratch *s);
/* The experts of a mixture-of-experts layer (moe_cpu.c). */
tsr_status tsr__cpu_moe(tsr_backend *be, const tsr_moe_args *a);
/* MXFP4 (kernels/cpu/mxfp4_cpu.c): row r of an MXFP4 matrix of `cols` inputs (blocks of 16
 * bytes, one E8M0 scale byte per 32 inputs) as f32; and y[i][r] = x[i] . W[r] for rows
 * [0, rows) and nx inputs x ([nx][cols]), y [nx][rows]; each weight row is decoded once. */
void tsr__mxfp4_row(const uint8_t *blocks, const uint8_t *scales, int64_t cols, float *out);
void tsr__mxfp4_matmul(const uint8_t *blocks, const uint8_t *scales, int64_t rows, int64_t cols,
                       const float *x, int64_t nx, float *y, int threads);
tsr_status tsr__cpu_sample(tsr_backend *be, float *logits, int64_t n, int vocab,
                           const tsr_sample_params *params, int32_t *ids);


/* --- SIMD kernels, chosen once at runtime (AVX-512F, AVX2+FMA+F16C, or scalar) --- */
/* simd_cpu.c: dispatch and the scalar kernels; simd_avx2.c, simd_avx512.c: one ISA's kernels
 * each, under that file's target pragma; simd_internal.h: what those files share. */

typedef enum tsr__cpu_isa {
    TSR__ISA_SCALAR = 0,
    TSR__ISA_AVX2 = 1,
    TSR__ISA_AVX512 = 2,
} tsr__cpu_isa;

typedef struct tsr__cpu_kernels {
    tsr__cpu_isa isa;
    const char *name;
    /* y[r*ldy + i] = dot(w row r, x[i]) for rows r in [r0, r1), i < nx (nx <= 4): one pass
     * over the weight rows serves all nx input rows. w rows are `cols` elements of the
     * kernel's dtype. The per-element summation order does not depend on nx or r0/r1. */
    void (*matvec_f32)(const float *w, int64_t cols, int64_t r0, int64_t r1, const float *x,
                       int nx, float *y, int64_t ldy);
    void (*matvec_bf16)(const uint16_t *w, int64_t cols, int64_t r0, int64_t r1,
                        const float *x, int nx, float *y, int64_t ldy);
    void (*matvec_f16)(const uint16_t *w, int64_t cols, int64_t r0, int64_t r1,
                       const float *x, int nx, float *y, int64_t ldy);
    /* Segmented matvec (matmul_parts): for rows r in [r0, r1) and i < nx (nx <= 4), d_p =
     * dot of columns [seg[p], seg[p+1]) of w row r and of x[i] (rows of x are `cols`
     * apart), each with fresh accumulators and the operations matvec applies to a row of
     * that length, so d_p's bits depend on the segment's values and length only (not on
     * seg[p], r or nx). sum: y[i*ldy + r] = ((d_0 + d_1) + d_2) + ...; else
     * y[p*ldp + i*ldy + r] = d_p. */
    void (*matvec_seg_f32)(const float *w, int64_t cols, int64_t r0, int64_t r1,
                           const float *x, int nx, const int32_t *seg, int n_parts, bool sum,
                           float *y, int64_t ldy, int64_t ldp);
    void (*matvec_seg_bf16)(const uint16_t *w, int64_t cols, int64_t r0, int64_t r1,
                            const float *x, int nx, const int32_t *seg, int n_parts, bool sum,
                            float *y, int64_t ldy, int64_t ldp);
    void (*matvec_seg_f16)(const uint16_t *w, int64_t cols, int64_t r0, int64_t r1,
                           const float *x, int nx, const int32_t *seg, int n_parts, bool sum,
                           float *y, int64_t ldy, int64_t ldp);
    /* dst[i] = f32(src[i]) */
    void (*cvt_bf16)(const uint16_t *src, float *dst, int64_t n);
    void (*cvt_f16)(const uint16_t *src, float *dst, int64_t n);
    /* out[j] = dot(q, k + j*stride) * scale for j < nk, over d elements. */
    void (*dot_rows)(const float *q, const float *k, int64_t stride, int nk, int d,
                     float scale, float *out);
    /* acc[0..d) = acc * c + sum_j p[j] * v[j*stride .. +d) (j in order). */
    void (*acc_rows)(float *acc, float c, const float *p, const float *v, int64_t stride,
                     int nk, int d);
    /* x[j] = exp(x[j] - sub) for j < n; returns their sum (fixed order for a given n).
     * The SIMD variants use a polynomial exp (<= 2 ulp); scalar uses libm expf. */
    float (*exp_sum)(float *x, int n, float sub);
    /* g[i] = g[i] / (1 + exp(-g[i])) * u[i] (SiLU(gate) * up), same exp as exp_sum. */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* The BF16 matvec and segmented matvec take x in tsr__cpu_bf16_pairs order. */
    bool bf16_pairs;
    /* Optional (NULL: attention uses dot_rows/acc_rows over 16-row chunks): one key row for
     * all query heads of a task, so that decode reads each K/V row front to back. Query head
     * hh of nh reads q + hh*d and the row's floats from koff[hh] (its kv head) on. */
    /* out[hh*out_ld] = dot_rows's score of q head hh against row k: the same bits. */
    void (*dot_heads)(const float *q, const float *k, const int32_t *koff, int nh, int d,
                      float scale, float *out, int64_t out_ld);
    /* acc[hh*d ..+d) += p[hh*p_ld + j] * (v + j*stride + koff[hh]) for keys j < nk in order:
     * the per-element operations of acc_rows after its scaling by c (the same bits). */
    void (*acc_heads)(float *acc, const float *p, int64_t p_ld, const float *v,
                      int64_t stride, const int32_t *koff, int nk, int nh, int d);
    /* Optional (NULL: per-row tasks), for heads with TSR__CPU_QBLOCK_FITS(d): attention of
     * nq <= 16 query rows for one head with the queries in the lanes of a vector, so no
     * score needs a horizontal sum (for tiny heads the sums cost more than the dots). Row
     * i: q + i*q_ld (d floats), position qpos[i]; the head's keys and values from `koff` of
     * each span row; key tiles of `tile` rows with the online softmax of the row tasks,
     * per lane. Writes out + i*q_ld (d floats) and the final max and sum of row i to
     * ml[i*ml_ld], ml[i*ml_ld + 1]. */
    void (*attn_qblock)(const float *q, int64_t q_ld, const int32_t *qpos, int nq, int d,
                        float scale, const tsr_kv_span *spans, int n_spans, int koff, int tile,
                        float *out, float *ml, int64_t ml_ld);
    /* Optional (NULL: sgemm): P[i][r] = sum over k < len of x[i*ldx + k] * w[r*ldw + k] for
     * i < n, r < nr, one fma chain per element in k order, for the short segments of
     * matmul_parts (len <= TSR__CPU_SHORT_K), where an sgemm call costs more than its
     * arithmetic. y[i*ldy + r] = P[i][r], or with add y[i*ldy + r] + P[i][r]. */
    void (*gemm_short)(const float *x, int64_t ldx, int64_t n, const float *w, int64_t ldw,
                       int64_t nr, int len, float *y, int64_t ldy, bool add);
    /* Optional (NULL: the scalar loop of ops_cpu.c): one rmsnorm row with f32 weights, the
     * rounding points of the scalar loop (sum of squares in double, mean rounded to f32,
     * 1/sqrtf, (x * r) * w in f32); the double sum in another order. */
    void (*rmsnorm_f32)(const float *x, const float *w, int dim, float eps, float *o);
    /* Optional (NULL: gemm_short part by part): matmul_parts' ordered sum over all parts
     * [seg[p], seg[p+1]) of w's columns, each at most TSR__CPU_SHORT_K long and
     * seg[n_parts] - seg[0] <= TSR__CPU_SHORT_SUM_COLS: y[i*ldy + r] = ((P_0 + P_1) + P_2)
     * + ..., P_p gemm_short's chain over part p (+0 for an empty part), so the bits of
     * gemm_short called part by part. */
    void (*gemm_short_sum)(const float *x, int64_t ldx, int64_t n, const float *w,
                           int64_t ldw, int64_t nr, const int32_t *seg, int n_parts, float *y,
                           int64_t ldy);
    /* Optional (NULL: dot_rows per query row): the key-score pass of one query head over
     * keys [j0, j0 + nt) of span sp (nt <= TSR__CPU_QBLOCK_MAX_TILE), for all nq query rows
     * 16 at a time in the lanes of a vector. Row i: q + i*q_ld (d floats, d <=
     * TSR__CPU_QBLOCK_WIDE_MAX_D), position qpos[i], final max and sum ml[i*ml_ld],
     * ml[i*ml_ld + 1] (rows whose sum is not > 0 add nothing). Adds to ks[j - j0] the sum
     * over the rows that see key j of exp(s - m) / l, s = q.k * scale with attn_qblock's
     * arithmetic (so s - m is exactly its main pass's). The rows' terms are summed in
     * lanes, block after block, then across the lanes: fixed, thread-independent order. */
    void (*attn_scores_qblock)(const float *q, int64_t q_ld, const int32_t *qpos, int nq,
                               int d, float scale, const tsr_kv_span *sp, int64_t j0, int nt,
                               int koff, const float *ml, int64_t ml_ld, float *ks);
    /* Stored K/V dtypes (bit 1u << dtype, kernels/kv_dtype.h) that dot_heads_kv and
     * acc_heads_kv read as they are (0: none; attention converts such rows to f32 scratch
     * first). They are dot_heads and acc_heads over stored rows: k and v point at a stored
     * row (v at key 0's, rows row_bytes apart), koff are element offsets into a row, and
     * each element is decoded as it is loaded with tsr_kv_rows_decode's arithmetic (BF16
     * widened, Q8 d * q, FP8 d * e4m3: exact or one rounding each), so the bits are those
     * of dot_heads and acc_heads over the converted rows, without the scratch's writes and
     * second read. Q8 heads are whole blocks (head_dim a multiple of TSR_KV_Q8_BLOCK, as
     * tsr_kv_dtype_fits asks). */
    unsigned kv_rows;
    void (*dot_heads_kv)(const float *q, const void *k, int dtype, const int32_t *koff,
                         int nh, int d, float scale, float *out, int64_t out_ld);
    void (*acc_heads_kv)(float *acc, const float *p, int64_t p_ld, const void *v,
                         int64_t row_bytes, int dtype, const int32_t *koff, int nk, int nh,
                         int d);
} tsr__cpu_kernels;

/* Longest segment that matmul_parts prefill gives to gemm_short. */
#define TSR__CPU_SHORT_K 32
/* Widest row (all parts) that gemm_short_sum transposes on its stack (16 KiB). */
#define TSR__CPU_SHORT_SUM_COLS 256

/* Head sizes attn_qblock keeps in registers (one vector per dimension for the queries and
 * one for the outputs). */
#define TSR__CPU_QBLOCK_MAX_D 16
/* Wider heads that take attn_qblock: multiples of 16 up to this (queries and outputs of a
 * task on the stack). */
#define TSR__CPU_QBLOCK_WIDE_MAX_D 256
/* Head sizes attn_qblock accepts. */
#define TSR__CPU_QBLOCK_FITS(d) \
    ((d) <= TSR__CPU_QBLOCK_MAX_D || ((d) % 16 == 0 && (d) <= TSR__CPU_QBLOCK_WIDE_MAX_D))
/* Largest key tile attn_qblock accepts (its scores live on the stack). */
#define TSR__CPU_QBLOCK_MAX_TILE 64

/* xp = x with, in every segment [seg[p], seg[p+1]) and every full 64-column block of it
 * (from the segment's start), each 32-column half reordered as its 16 even then its 16 odd
 * columns; the rest copied. nx rows, ldx apart (also xp's). For kernels with bf16_pairs;
 * a plain matvec is one segment {0, cols}. */
void tsr__cpu_bf16_pairs(const float *x, int64_t ldx, int nx, const int32_t *seg,
                         int n_parts, float *xp);

/* The kernels for this CPU (cached after the first call). TSR_CPU_ISA=scalar|avx2|avx512 in
 * the environment caps the choice (tests and benchmarks compare the paths). */
const tsr__cpu_kernels *tsr__cpu_kernels_get(void);
/* The kernels for one ISA, or NULL when this CPU lacks it. */
const tsr__cpu_kernels *tsr__cpu_kernels_for(tsr__cpu_isa isa);

/* AMX (Intel's tile unit): the units this process may use, a mask of TSR__AMX_*; 0 unless
 * the picked kernels are AVX-512 (the tile kernels' epilogues are) and TSR_CPU_ISA does not
 * cap the choice at avx512 or below. The OS's permission is asked once, at the pick. */
enum { TSR__AMX_INT8 = 1, TSR__AMX_BF16 = 2 };
unsigned tsr__cpu_amx(void);
/* Whether the CPU is Intel's (CPUID vendor), set by the pick before any kernel is chosen:
 * some kernels' weight prefetch pays there only (quant_q8_internal.h). */
extern _Atomic bool tsr__cpu_intel;
/* The LDTILECFG operand (palette 1): per tile register its rows and bytes a row. */
typedef struct tsr__amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tsr__amx_cfg;
#if defined(__x86_64__)
/* LDTILECFG of the whole of *cfg. Not _tile_loadconfig: GCC 12's declares its operand as
 * the first 8 bytes only, so the stores of the rows and widths could be dropped as dead (a
 * fault on a garbage configuration, seen when a caller's stores were moved). */
static inline void tsr__amx_load_cfg(const tsr__amx_cfg *cfg) {
    __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
}
#endif

/* BF16 prefill on AMX-BF16 tiles (gemm_amx.c): y = x . W^T for BF16 W, over columns in K
 * steps of 32. x's columns are packed first, 16 tokens (group g) per tsr__gemm_amx_pack call:
 * ns steps (32 * ns columns from x, rows ldx apart) into xp, which holds
 * tsr__gemm_amx_xp_elems(n, ns) elements. tsr__gemm_amx_rows then writes (add: adds onto)
 * rows [r0, r1) of every token's y (ldy apart) from W's rows (w, ldw apart: w points at the
 * first column of the product) and the packed steps [sx, sx + ns) of xp, packed with nsx
 * steps; `tail` is a scratch of 16 * 32 * ns elements. */
size_t tsr__gemm_amx_xp_elems(int64_t n, int64_t ns);
void tsr__gemm_amx_pack(const float *x, int64_t ldx, int64_t n, int64_t ns, int64_t g,
                        uint16_t *xp);
void tsr__gemm_amx_rows(const uint16_t *w, int64_t ldw, int64_t r0, int64_t r1,
                        const uint16_t *xp, int64_t nsx, int64_t sx, int64_t ns, int64_t n,
                        uint16_t *tail, bool add, float *y, int64_t ldy);

#endif
