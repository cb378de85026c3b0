/* The CPU backend: host buffers, the vtable, and OpenMP/OpenBLAS thread setup. Kernels are
 * in gemm_cpu.c (matmul), ops_cpu.c (elementwise, norms, rope, embed), attn_cpu.c
 * (attention) and simd_cpu.c (runtime-dispatched SIMD). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/quant_q8_internal.h"
#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"

/* OpenBLAS starts in a library constructor (gotoblas_init, before main) by mapping one
 * buffer of about 129 MiB per thread it means to use (the OpenMP build: OMP_NUM_THREADS,
 * else every CPU), and when mmap fails it retries forever: under an address-space limit
 * (ulimit -v) a few such buffers past the limit spin at 100 % CPU with no message. tessera
 * runs OpenBLAS on one thread only (tsr_backend_cpu_create), so under such a limit this
 * runs first (.preinit_array: before any library's constructor) and makes OpenBLAS map
 * one buffer; when even that one cannot be mapped it ends with one line instead of the
 * hang. Without a limit nothing changes: the buffers are address space, not memory.
 *
 * The thread count can only reach OpenBLAS through the environment it reads at load, and
 * an environment changed this early does not survive libc's own start-up, so the process
 * executes itself again once with OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (tessera's
 * own parallel regions all name their thread count). */
#define TSR__BLAS_START_BYTES ((size_t)136 << 20) /* one buffer and a margin */

static const char *const tsr__blas_env[] = {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"};

static bool tsr__env_has(char **envp, const char *kv) {
    for (char **e = envp; e && *e; e++)
        if (strcmp(*e, kv) == 0) return true;
    return false;
}

/* Re-executes the process with one OpenBLAS thread in its environment; returns only when
 * that is not possible (then the probe below still gives the line instead of the hang). */
static void tsr__blas_reexec(char **argv, char **envp) {
    size_t n = 0;
    while (envp && envp[n]) n++;
    char **env = malloc((n + 3) * sizeof *env);
    if (!env) return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(envp[i], "OMP_NUM_THREADS=", 16) != 0 &&
            strncmp(envp[i], "OPENBLAS_NUM_THREADS=", 21) != 0)
            env[k++] = envp[i];
    env[k++] = (char *)tsr__blas_env[0];
    env[k++] = (char *)tsr__blas_env[1];
    env[k] = NULL;
    execve("/proc/self/exe", argv, env);
    free(env);
}

static void tsr__blas_preinit(int argc, char **argv, char **envp) {
    (void)argc;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
    if (!tsr__env_has(envp, tsr__blas_env[0]) || !tsr__env_has(envp, tsr__blas_env[1]))
        tsr__blas_reexec(argv, envp);
    void *p = mmap(NULL, TSR__BLAS_START_BYTES, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
        munmap(p, TSR__BLAS_START_BYTES);
        return;
    }
    /* what took the space (the libraries mapped before main) says what to do about it */
    char msg[640], top[256];
    tsr_sys_vm_top(top, sizeof top, 3);
    int n = snprintf(msg, sizeof msg,
                     "tessera: the address-space limit (ulimit -v: %.0f MiB, %.0f MiB in use: "
                     "%s) leaves no room for the %.0f MiB OpenBLAS maps at start-up: raise or "
                     "remove ulimit -v (limit memory with the job's --mem instead)\n",
                     (double)rl.rlim_cur / 1048576.0, (double)tsr_sys_vm_size() / 1048576.0,
                     top[0] ? top : "users unknown", (double)TSR__BLAS_START_BYTES / 1048576.0);
    if (n > 0) {
        ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    _exit(1);
}

__attribute__((section(".preinit_array"), used)) static void (*const tsr__blas_preinit_entry)(
    int, char **, char **) = tsr__blas_preinit;

tsr_status tsr__cpu_scratch(float **buf, size_t *cap, size_t n) {
    if (n <= *cap) return TSR_OK;
    size_t bytes;
    if (!tsr_mul_size(n, sizeof(float), &bytes))
        return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: scratch of %zu floats overflows", n);
    float *p = tsr_malloc_aligned(bytes);
    if (!p) return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    tsr_free(*buf);
    *buf = p;
    *cap = n;
    return TSR_OK;
}

static void tsr__cpu_destroy(tsr_backend *be) {
    if (!be) return;
    tsr__cpu_ctx *c = be->ctx;
    if (c) {
        tsr_free(c->huge); /* the buffers themselves are their owners' to free */
        tsr_free(c->panel);
        tsr_free(c->parts);
        tsr__attn_scratch_free(&c->attn);
        if (c->attn_thr)
            for (int t = 0; t < c->threads; t++) tsr__attn_scratch_free(&c->attn_thr[t]);
        tsr_free(c->attn_thr);
        tsr_free(c->xpairs);
        tsr_free(c->q8x);
        tsr_free(c->inv_freq);
        tsr_free(c->rope_cs);
        tsr_free(c->qkv_kv);
        tsr_free(c->rope_pos);
        tsr_free(c);
    }
    tsr_free(be);
}

/* From this size on a buffer is one a decode pass streams (weights, a KV store): it gets
 * transparent huge pages (tsr_malloc_huge), on which decode speed depends. */
#define TSR__CPU_HUGE_MIN ((size_t)2 << 20)

static tsr_status tsr__cpu_buffer_alloc(tsr_backend *be, size_t bytes, void **out) {
    tsr__cpu_ctx *c = be->ctx;
    *out = NULL;
    if (bytes < TSR__CPU_HUGE_MIN) {
        *out = tsr_malloc_aligned(bytes ? bytes : 1);
        if (!*out)
            return tsr_error_set(TSR_ERR_NOMEM,
                                 "cpu backend: cannot allocate a %zu-byte buffer", bytes);
        return TSR_OK;
    }
    /* Room in the record first, so that a buffer is never live without its size. */
    if (c->n_huge == c->huge_cap) {
        size_t cap = c->huge_cap ? 2 * c->huge_cap : 32;
        tsr__cpu_huge *h = tsr_realloc(c->huge, cap * sizeof *h);
        if (!h) return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot grow the buffer table");
        c->huge = h;
        c->huge_cap = cap;
    }
    void *p = tsr_malloc_huge(bytes);
    if (!p)
        return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot allocate a %zu-byte buffer",
                             bytes);
    c->huge[c->n_huge++] = (tsr__cpu_huge){p, bytes};
    *out = p;
    return TSR_OK;
}

static void tsr__cpu_buffer_free(tsr_backend *be, void *ptr) {
    tsr__cpu_ctx *c = be->ctx;
    if (!ptr) return;
    /* From the end: buffers freed soon after they were made are found first. */
    for (size_t i = c->n_huge; i-- > 0;) {
        if (c->huge[i].ptr != ptr) continue;
        tsr_free_huge(ptr, c->huge[i].bytes);
        c->huge[i] = c->huge[--c->n_huge];
        return;
    }
    tsr_free(ptr);
}

static tsr_status tsr__cpu_synchronize(tsr_backend *be) {
    (void)be;
    return TSR_OK;
}

/* Rows of one sequence up to which attention_paged runs it on one thread beside the other
 * sequences (a decode step's rows); longer runs (prefill chunks) get every thread. */
#define TSR__CPU_PAGED_SEQ_ROWS 4

/* The sequence of row r0: its rows end at *r1, and its key count fills *nb blocks of its
 * table (checked against the table). */
static tsr_status tsr__paged_seq(const tsr_attn_paged_args *a, int r0, int *r1, int32_t *nb) {
    int seq = a->q_seq[r0], e = r0 + 1;
    while (e < a->n_q && a->q_seq[e] == seq) e++;
    *r1 = e;
    int32_t nk = seq >= 0 && seq < a->n_seqs ? a->n_keys[seq] : -1;
    *nb = nk < 0 ? -1 : (nk + a->lay.block - 1) / a->lay.block;
    if (*nb < 0 || *nb > a->max_blocks)
        return tsr_error_set(TSR_ERR_INVALID, "attention_paged: row %d: sequence %d with %d "
                             "keys outside the table", r0, seq, (int)nk);
    return TSR_OK;
}

/* The nb spans of row r0's sequence (tsr__paged_seq) from its block table, into s->spans. */
static tsr_status tsr__paged_spans(const tsr_attn_paged_args *a, int r0, int32_t nb,
                                   tsr__attn_scratch *s) {
    if (s->spans_cap < a->max_blocks) {
        tsr_kv_span *ns = tsr_realloc(s->spans, (size_t)a->max_blocks * sizeof *ns);
        if (!ns) return TSR_ERR_NOMEM;
        s->spans = ns;
        s->spans_cap = a->max_blocks;
    }
    int seq = a->q_seq[r0];
    int32_t nk = a->n_keys[seq];
    const int32_t *tb = a->tables + (size_t)seq * (size_t)a->max_blocks;
    for (int32_t j = 0; j < nb; j++) {
        int64_t at = (int64_t)tb[j] * a->lay.block_stride;
        int32_t left = nk - j * a->lay.block;
        s->spans[j] = (tsr_kv_span){
            .k = tsr_kv_rows_at(a->lay.k, a->lay.dtype, a->lay.row, at),
            .v = tsr_kv_rows_at(a->lay.v, a->lay.dtype, a->lay.row, at), .pos = NULL,
            .pos0 = j * a->lay.block, .n = left < a->lay.block ? left : a->lay.block,
            .stride = a->lay.row, .dtype = a->lay.dtype};
    }
    return TSR_OK;
}

/* Rows r0 .. r1 - 1 (one sequence, its nb blocks: tsr__paged_seq) through the per-sequence
 * kernel, over the spans its block table names (tsr__paged_spans, into s). */
static tsr_status tsr__paged_run(const tsr_attn_paged_args *a, int r0, int r1, int n_spans,
                                 int threads, tsr__attn_scratch *s) {
    TSR_TRY(tsr__paged_spans(a, r0, n_spans, s));
    size_t qd = (size_t)a->n_heads * (size_t)a->head_dim;
    tsr_attn_args one = {.q = a->q + (size_t)r0 * qd, .q_pos = a->q_pos + r0, .n_q = r1 - r0,
                         .spans = s->spans, .n_spans = n_spans, .n_heads = a->n_heads,
                         .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
                         .out = a->out + (size_t)r0 * qd, .sinks = a->sinks,
                         .window = a->window};
    return tsr__cpu_attention_on(&one, threads, s);
}

/* The batch's attention over a paged layout: each sequence's consecutive rows go to the
 * per-sequence kernel with the spans its block table names (the paged cache's own spans,
 * so the bits are those of the per-sequence path, which do not depend on the threads).
 * Sequences with many rows run one after another on every thread; the short ones (decode)
 * then run side by side, a sequence per thread, when there are at least as many as
 * threads: one decode row's attention is too little work for a parallel region of its own
 * (64 sequences x the layers were that many fork-joins a step, their waits a fifth of a
 * batched decode step). Fewer run one after another on every thread. */
static tsr_status tsr__cpu_attention_paged(tsr_backend *be, const tsr_attn_paged_args *a) {
    tsr__cpu_ctx *c = be->ctx;
    if (a->n_q <= 0) return TSR_OK;
    if (a->lay.block <= 0 || a->max_blocks <= 0 || a->n_seqs <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "attention_paged: bad layout or table");
    /* the short sequences' first rows, their ends and blocks, for the parallel loop */
    int *run = tsr_malloc(3 * (size_t)a->n_q * sizeof *run);
    if (!run) return TSR_ERR_NOMEM;
    tsr_status st = TSR_OK;
    int n_short = 0;
    for (int r0 = 0, r1; r0 < a->n_q && st == TSR_OK; r0 = r1) {
        int32_t nb;
        st = tsr__paged_seq(a, r0, &r1, &nb);
        if (st == TSR_OK && r1 - r0 <= TSR__CPU_PAGED_SEQ_ROWS && c->threads > 1) {
            run[3 * n_short] = r0;
            run[3 * n_short + 1] = r1;
            run[3 * n_short + 2] = nb;
            n_short++;
        } else if (st == TSR_OK) {
            st = tsr__paged_run(a, r0, r1, nb, c->threads, &c->attn);
        }
    }
    bool side_by_side = n_short >= c->threads;
    if (st == TSR_OK && side_by_side && !c->attn_thr) {
        c->attn_thr = tsr_calloc((size_t)c->threads, sizeof *c->attn_thr);
        if (!c->attn_thr) st = TSR_ERR_NOMEM;
    }
    /* Fewer decode rows than threads (one sequence, in the usual generate): one after
     * another, each split over keys on every thread (attn_cpu.c tsr__attn_decode). */
    for (int i = 0; st == TSR_OK && !side_by_side && i < n_short; i++) {
        const int *r = run + 3 * i;
        st = tsr__paged_run(a, r[0], r[1], r[2], c->threads, &c->attn);
    }
    int n_par = st == TSR_OK && side_by_side ? n_short : 0;
    char msg[256] = ""; /* the message is per thread: carried to the caller's */
#pragma omp parallel for num_threads(c->threads) schedule(dynamic, 1) if (n_par > 1)
    for (int i = 0; i < n_par; i++) {
        tsr__attn_scratch *s = &c->attn_thr[omp_get_thread_num()];
        const int *r = run + 3 * i;
        tsr_status e = tsr__paged_run(a, r[0], r[1], r[2], 1, s);
        if (e != TSR_OK) {
#pragma omp critical(tsr__cpu_paged_err)
            if (st == TSR_OK) {
                st = e;
                snprintf(msg, sizeof msg, "%s", tsr_last_error());
            }
        }
    }
    tsr_free(run);
    if (st != TSR_OK && msg[0]) return tsr_error_set(st, "%s", msg);
    return st;
}

/* The ordered sum into a scratch, then the add: the bits of the two ops. */
static tsr_status tsr__cpu_matmul_parts_acc(tsr_backend *be, const float *x, int64_t n,
                                            const tsr_tensor *w, const int32_t *seg,
                                            int n_parts, float *y) {
    if (n <= 0) return TSR_OK;
    size_t m = (size_t)n * (size_t)w->rows;
    float *tmp = tsr_malloc(m * sizeof *tmp);
    if (!tmp) return TSR_ERR_NOMEM;
    tsr_status st = tsr__cpu_matmul_parts(be, x, n, w, seg, n_parts, true, tmp);
    if (st == TSR_OK) st = tsr__cpu_add(be, y, tmp, (int64_t)m);
    tsr_free(tmp);
    return st;
}

/* The fused calls as their two steps: the CPU's BF16 kernels read F32 rows, so there is
 * no conversion to save (kernels/backend.h). */
static tsr_status tsr__cpu_rmsnorm_matmul(tsr_backend *be, const float *x, const tsr_tensor *norm,
                                          int64_t n, int dim, float eps, float *xb,
                                          const tsr_tensor *w, float *y) {
    TSR_TRY(tsr__cpu_rmsnorm(be, x, norm, n, dim, eps, xb));
    return tsr__cpu_matmul(be, xb, n, w, y);
}

static tsr_status tsr__cpu_swiglu_matmul_acc(tsr_backend *be, const float *gu, int64_t n,
                                             int hidden, float *hb, const tsr_tensor *w,
                                             const int32_t *seg, int n_parts, float *y) {
    TSR_TRY(tsr__cpu_swiglu_fused(be, gu, n, hidden, hb));
    return tsr__cpu_matmul_parts_acc(be, hb, n, w, seg, n_parts, y);
}

static const tsr_backend_ops tsr__cpu_ops = {
    .name = "cpu",
    .destroy = tsr__cpu_destroy,
    .buffer_alloc = tsr__cpu_buffer_alloc,
    .buffer_free = tsr__cpu_buffer_free,
    .host_alloc = tsr__cpu_host_alloc,
    .host_free = tsr__cpu_host_free,
    .memory = tsr__cpu_memory,
    .synchronize = tsr__cpu_synchronize,
    .upload = tsr__cpu_upload,
    .download = tsr__cpu_upload,
    .copy = tsr__cpu_copy,
    .memset = tsr__cpu_memset,
    .stream_create = tsr__cpu_stream_create,
    .stream_destroy = tsr__cpu_stream_destroy,
    .event_create = tsr__cpu_event_create,
    .event_destroy = tsr__cpu_event_destroy,
    .event_record = tsr__cpu_event_record,
    .stream_wait = tsr__cpu_stream_wait,
    .event_sync = tsr__cpu_event_sync,
    .kv_write = tsr__cpu_kv_write,
    .kv_copy = tsr__cpu_kv_copy,
    .kv_gather = tsr__cpu_kv_gather,
    .kv_scatter = tsr__cpu_kv_scatter,
    .matmul = tsr__cpu_matmul,
    .rmsnorm = tsr__cpu_rmsnorm,
    .rope = tsr__cpu_rope,
    .swiglu = tsr__cpu_swiglu,
    .add = tsr__cpu_add,
    .embed = tsr__cpu_embed,
    .attention = tsr__cpu_attention,
    .matmul_parts = tsr__cpu_matmul_parts,
    .sample = tsr__cpu_sample,
    .bias_add = tsr__cpu_bias_add,
    .moe = tsr__cpu_moe,
    .attention_paged = tsr__cpu_attention_paged,
    .matmul_parts_acc = tsr__cpu_matmul_parts_acc,
    .qkv_rope = tsr__cpu_qkv_rope,
    .swiglu_fused = tsr__cpu_swiglu_fused,
    .rmsnorm_matmul = tsr__cpu_rmsnorm_matmul,
    .swiglu_matmul_acc = tsr__cpu_swiglu_matmul_acc,
};

tsr_status tsr_backend_cpu_create(int threads, tsr_backend **out) {
    *out = NULL;
    if (threads < 0)
        return tsr_error_set(TSR_ERR_INVALID, "cpu backend: threads must be >= 0 (got %d)",
                             threads);
    if (threads == 0) threads = 1;
    tsr_backend *be = tsr_calloc(1, sizeof *be);
    tsr__cpu_ctx *c = tsr_calloc(1, sizeof *c);
    if (!be || !c) {
        tsr_free(be);
        tsr_free(c);
        return TSR_ERR_NOMEM;
    }
    c->threads = threads;
    c->rope_n = -1;
    be->ops = &tsr__cpu_ops;
    be->ctx = c;
    be->device = -1;
    be->threads = threads;
    be->host_memory = true;
    be->mxfp4_packed = true; /* moe_cpu.c */
    be->gguf_blocks = true;  /* gemm_cpu.c, ops_cpu.c */
    /* Prefill runs single-threaded sgemm calls from OpenMP threads (gemm_cpu.c); OpenBLAS's
     * own pool would spin against them on the same cores. OpenBLAS's OpenMP build (the one
     * CMake prefers) also sets the caller's OpenMP default to 1, and on every call outside
     * a parallel region follows that default: it must stay 1, or a 1-thread prefill's
     * sgemm would wake a second thread. tessera's own regions all name their thread count. */
    openblas_set_num_threads(1);
    TSR_LOG_DEBUG("cpu backend: %d threads, %s kernels", threads,
                  tsr__cpu_kernels_get()->name);
    *out = be;
    return TSR_OK;
}

void tsr_backend_cpu_facts_get(tsr_backend_cpu_facts *out) {
    out->isa = tsr__cpu_amx() & TSR__AMX_BF16
                   ? "avx512 (BF16 matmuls of 33 or more inputs on amx tiles)"
                   : tsr__cpu_kernels_get()->name;
    out->quant = tsr__q8_amx_get() ? "avx512vnni, Q8_0 on amx tiles from 16 inputs"
                                   : tsr__q8_kernels_get()->name;
    out->blas = openblas_get_config();
}
