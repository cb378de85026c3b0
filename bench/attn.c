/* tsr_attn: the CPU backend's decode attention over a cold KV cache, against a plain read.
 *
 * A decode step reads every cached K and V row of every layer once, and between two visits
 * of a layer the weights of all the others stream through the caches, so the rows come
 * from DRAM: decode attention is memory-bound, and the kernel's access pattern (how many
 * row streams it keeps in flight, whether the prefetchers follow them) decides how close
 * it gets to a plain streaming read of the same bytes. This benchmark models that: per
 * token and per layer it streams --flush-mib MiB of a separate 256 MiB buffer (a new
 * offset each time) and then times ONE attention call (one query at the end of the
 * context); a second pass does the same with a plain read of exactly the K and V bytes of
 * the layer instead. Both are summed over the layers; the medians over the timed tokens
 * are reported as us per token and GB/s (1e9 bytes/s of K+V), and ratio = attn / read.
 * K and V live in 2 MiB transparent huge pages as the KV caches hold them (memory/kv_paged.c,
 * kv_dense.c); --small-pages 1 uses 4 KiB pages. --paged B cuts each layer into spans of B
 * rows (a paged pool's blocks); by default each block's V rows follow its K rows in one
 * store, as the paged pool lays them out, and --pair 0 puts all K in one store and all V in
 * another (kv_dense's layout, and the pool's before 2026-12-03); --interleave 1 puts block
 * b of every layer before block b + 1, as a pool that all layers fill together would.
 * Prints one JSON line. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_args.h"
#include "bench/bench_time.h"
#include "kernels/backend.h"
#include "base/alloc.h"
#include "base/sys.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TSR_ATTN_X86 1
#endif

/* A run of floats to read: one K or V block, or a piece of the flush buffer. */
typedef struct tsr__region {
    const float *p;
    size_t n;
} tsr__region;

static float tsr__sum_plain(const float *p, size_t n) {
    float a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) a += p[i], b += p[i + 1], c += p[i + 2], d += p[i + 3];
    for (; i < n; i++) a += p[i];
    return (a + b) + (c + d);
}

#ifdef TSR_ATTN_X86
/* Four independent 32-byte loads per iteration, as in membw.c (unaligned: blocks and
 * thread slices start anywhere on a float). */
__attribute__((target("avx2"))) static float tsr__sum_avx2(const float *p, size_t n) {
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
        b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
        c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
        d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    return tsr__sum_plain(lanes, 8) + tsr__sum_plain(p + i, n - i);
}
#endif

static int g_avx2;

static float tsr__sum(const float *p, size_t n) {
#ifdef TSR_ATTN_X86
    if (g_avx2) return tsr__sum_avx2(p, n);
#endif
    return tsr__sum_plain(p, n);
}

/* Reads the regions, taken as one sequence, with `threads` threads, each a contiguous
 * share (cut at 16-float cache-line multiples); returns seconds. */
static double tsr__read(const tsr__region *r, int nr, int threads, volatile float *sink) {
    size_t total = 0;
    for (int i = 0; i < nr; i++) total += r[i].n;
    float sum = 0;
    double t0 = tsr_sys_now();
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    {
        size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        size_t per = (total / nt) & ~(size_t)15, lo = per * id;
        size_t hi = id == nt - 1 ? total : lo + per, off = 0;
        for (int i = 0; i < nr && off < hi; off += r[i].n, i++) {
            size_t a = lo > off ? lo - off : 0, b = hi - off < r[i].n ? hi - off : r[i].n;
            if (a < b) sum += tsr__sum(r[i].p + a, b - a);
        }
    }
    double dt = tsr_sys_now() - t0;
    *sink += sum;
    return dt;
}

/* Evicts the caches the way the weights of the other layers do: streams the next `step`
 * floats of the flush buffer (n floats; wrapping), so every flush reads new lines. */
static void tsr__flush(const float *fl, size_t n, size_t step, size_t *off, int threads,
                       volatile float *sink) {
    if (!fl) return;
    size_t n1 = n - *off < step ? n - *off : step;
    tsr__region f[2] = {{fl + *off, n1}, {fl, step - n1}};
    tsr__read(f, 2, threads, sink);
    *off = (*off + step) % n;
}

static void *tsr__alloc(size_t bytes) {
    void *p = tsr_malloc_aligned(bytes);
    if (!p) {
        fprintf(stderr, "tsr_attn: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static void tsr__fill(float *p, size_t n, uint32_t *r) {
    for (size_t i = 0; i < n; i++) p[i] = tsr_bench_rand(r);
}

static void tsr__usage(FILE *f) {
    fprintf(f,
            "usage: tsr_attn [--ctx N] [--heads H] [--kv-heads G] [--head-dim D] [--layers L]\n"
            "                [--repeat R] [--threads T] [--flush-mib M] [--paged B]\n"
            "                [--small-pages 0|1] [--interleave 0|1] [--pair 0|1]\n"
            "Decode attention (one query at position N-1) of the CPU backend over a KV cache\n"
            "of N keys x G kv heads x D per layer (defaults 256, 12, 64; H = 12 query heads,\n"
            "L = 12 layers), cold in the caches: before each layer's call M MiB (default 16;\n"
            "0: warm caches) of a 256 MiB buffer are streamed. Compared with a plain read of\n"
            "the same K and V bytes after the same flush. Medians over R tokens (default 30,\n"
            "after 2 warm-up tokens) with T threads (default 1). --paged B: spans of B rows\n"
            "(0: one span per layer, the default); --interleave 1 lays the blocks out as a\n"
            "pool that all layers fill together does: block b of every layer, then b + 1.\n"
            "--pair 1 (default): a block's V rows follow its K rows, as in the paged pool;\n"
            "--pair 0: one store of K and one of V. K and V are in 2 MiB transparent huge\n"
            "pages, as the KV caches hold them; --small-pages 1: 4 KiB pages.\n"
            "Output: one JSON line {\"bench\":\"attn\",...,\"attn_us_per_token\":..,\n"
            "\"attn_gb_s\":..,\"read_us_per_token\":..,\"read_gb_s\":..,\"ratio\":..}.\n");
}

int main(int argc, char **argv) {
    int ctx = 256, heads = 12, kv_heads = 12, head_dim = 64, layers = 12, repeat = 30;
    int threads = 1, flush_mib = 16, paged = 0, small_pages = 0, interleave = 0, pair = 1;
    const tsr_bench_opt opts[] = {
        {"--ctx", &ctx, 1, 1 << 22},         {"--heads", &heads, 1, 1024},
        {"--kv-heads", &kv_heads, 1, 1024},  {"--head-dim", &head_dim, 1, 512},
        {"--layers", &layers, 1, 1024},      {"--repeat", &repeat, 1, 100000},
        {"--threads", &threads, 1, 1024},    {"--flush-mib", &flush_mib, 0, 256},
        {"--paged", &paged, 0, 1 << 22},     {"--small-pages", &small_pages, 0, 1},
        {"--interleave", &interleave, 0, 1}, {"--pair", &pair, 0, 1}};
    int prc = tsr_bench_parse("tsr_attn", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                              tsr__usage);
    if (prc) return prc == 1 ? 0 : 2;
    if (heads % kv_heads) {
        fprintf(stderr, "tsr_attn: --heads %d is not a multiple of --kv-heads %d\n", heads,
                kv_heads);
        return 2;
    }
#ifdef TSR_ATTN_X86
    g_avx2 = __builtin_cpu_supports("avx2");
#endif

    /* KV: store_n floats of K and as many of V, layer after layer; per layer nb spans of up
     * to bs rows. */
    size_t kvd = (size_t)kv_heads * (size_t)head_dim, qd = (size_t)heads * (size_t)head_dim;
    int bs = paged ? paged : ctx, nb = (ctx + bs - 1) / bs;
    uint32_t rng = 42;
    size_t store_n = (size_t)layers * (size_t)nb * (size_t)bs * kvd;
    float *kv = small_pages ? tsr_malloc_aligned(2 * store_n * sizeof(float))
                            : tsr_malloc_huge(2 * store_n * sizeof(float));
    if (!kv) {
        fprintf(stderr, "tsr_attn: cannot allocate 2 x %zu bytes of KV\n",
                store_n * sizeof(float));
        return 1;
    }
    tsr__fill(kv, 2 * store_n, &rng);
    tsr_kv_span *spans = tsr__alloc((size_t)layers * (size_t)nb * sizeof *spans);
    tsr__region *regs = tsr__alloc((size_t)layers * (size_t)nb * 2 * sizeof *regs);
    for (int l = 0; l < layers; l++)
        for (int b = 0; b < nb; b++) {
            int rows = ctx - b * bs < bs ? ctx - b * bs : bs;
            /* --interleave: block b of every layer, then block b + 1 (a pool's order) */
            size_t blk = interleave ? (size_t)b * (size_t)layers + (size_t)l
                                    : (size_t)l * (size_t)nb + (size_t)b;
            size_t n = (size_t)rows * kvd, at = blk * (size_t)bs * kvd;
            float *k = pair ? kv + 2 * at : kv + at;
            float *v = pair ? k + (size_t)bs * kvd : kv + store_n + at;
            size_t s = (size_t)l * (size_t)nb + (size_t)b;
            spans[s] = (tsr_kv_span){.k = k, .v = v, .pos = NULL, .pos0 = b * bs, .n = rows,
                                     .stride = (int64_t)kvd};
            regs[2 * s] = (tsr__region){k, n};
            regs[2 * s + 1] = (tsr__region){v, n};
        }
    float *q = tsr__alloc(qd * sizeof(float)), *out = tsr__alloc(qd * sizeof(float));
    tsr__fill(q, qd, &rng);
    int32_t q_pos = ctx - 1;

    /* The flush buffer stands for the weights: huge pages, touched (not the zero page). */
    size_t fl_n = ((size_t)256 << 20) / sizeof(float);
    size_t fl_step = ((size_t)flush_mib << 20) / sizeof(float), fl_off = 0;
    float *fl = NULL;
    if (flush_mib) {
        fl = tsr_malloc_huge(fl_n * sizeof(float));
        if (!fl) {
            fprintf(stderr, "tsr_attn: cannot allocate the 256 MiB flush buffer\n");
            return 1;
        }
        for (size_t i = 0; i < fl_n; i++) fl[i] = (float)(i & 1023);
    }

    tsr_backend *be = NULL;
    if (tsr_backend_cpu_create(threads, &be) != TSR_OK) {
        fprintf(stderr, "tsr_attn: cpu backend: %s\n", tsr_last_error());
        return 1;
    }
    double *attn_t = tsr__alloc((size_t)repeat * sizeof(double));
    double *read_t = tsr__alloc((size_t)repeat * sizeof(double));
    volatile float sink = 0;
    for (int r = -2; r < repeat; r++) { /* two untimed warm-up tokens */
        double ta = 0, tr = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int l = 0; l < layers; l++) {
                tsr__flush(fl, fl_n, fl_step, &fl_off, threads, &sink);
                if (pass == 1) { /* the read baseline: the same K and V bytes */
                    tr += tsr__read(regs + (size_t)l * (size_t)nb * 2, 2 * nb, threads, &sink);
                    continue;
                }
                tsr_attn_args a = {.q = q, .q_pos = &q_pos, .n_q = 1,
                                   .spans = spans + (size_t)l * (size_t)nb, .n_spans = nb,
                                   .n_heads = heads, .n_kv_heads = kv_heads,
                                   .head_dim = head_dim, .out = out};
                double t0 = tsr_sys_now();
                tsr_status st = be->ops->attention(be, &a);
                ta += tsr_sys_now() - t0;
                if (st != TSR_OK) {
                    fprintf(stderr, "tsr_attn: attention: %s\n", tsr_last_error());
                    return 1;
                }
                sink += out[0];
            }
        if (r >= 0) attn_t[r] = ta, read_t[r] = tr;
    }
    double bytes = 2.0 * (double)ctx * (double)kvd * sizeof(float) * layers;
    double ta = tsr_bench_time_median(attn_t, repeat), tr = tsr_bench_time_median(read_t, repeat);
    printf("{\"bench\":\"attn\",\"ctx\":%d,\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,"
           "\"layers\":%d,\"threads\":%d,\"flush_mib\":%d,\"paged\":%d,\"small_pages\":%d,"
           "\"pair\":%d,"
           "\"repeat\":%d,"
           "\"attn_us_per_token\":%.1f,\"attn_gb_s\":%.2f,\"read_us_per_token\":%.1f,"
           "\"read_gb_s\":%.2f,\"ratio\":%.3f}\n",
           ctx, heads, kv_heads, head_dim, layers, threads, flush_mib, paged, small_pages, pair,
           repeat,
           ta * 1e6, bytes / ta * 1e-9, tr * 1e6, bytes / tr * 1e-9, tr / ta);
    tsr_backend_destroy(be);
    if (small_pages)
        tsr_free(kv);
    else
        tsr_free_huge(kv, 2 * store_n * sizeof(float));
    if (fl) tsr_free_huge(fl, fl_n * sizeof(float));
    tsr_free(spans), tsr_free(regs), tsr_free(q), tsr_free(out);
    tsr_free(attn_t), tsr_free(read_t);
    return 0;
}
