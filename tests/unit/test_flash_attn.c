/* The tensor-core attention kernels (kernels/cuda/flash_attn.cu, attn_decode.cu) against the
 * reference CUDA kernels (attn.cu, attn_paged.cu: a second CUDA backend created with
 * TSR_CUDA_ATTN=reference) and the CPU backend, on seeded random shapes: odd lengths, GQA
 * 1/4/8, head_dim 64/128, several and scattered spans, sliding windows, sinks, h2o key
 * scores, f32 and bf16 KV. Without a CUDA device (every CI machine) it prints that and
 * passes: the device check (tests/device/run.sh, section flash_attn) runs it on a GPU.
 *
 * Tolerances: the flash prefill rounds Q, K, V and P to BF16 (FP32 accumulation), so it
 * meets the CPU within 2e-2 absolute on outputs of magnitude <= 1 and 2e-2 relative on the
 * key scores; the split-K decode is FP32 throughout (5e-5), and so is the reference (2e-5).
 * attention_paged of one sequence with a prefill chunk goes to the flash prefill (BF16).
 * The flash prefill runs twice per case: outputs and key scores must repeat bit for bit.
 *
 * TSR_FLASH_LONG=N (the device check sets it) adds the timing: one layer of an N-token
 * prefill on the Llama-3.1-8B attention shape (32 query heads, 8 kv heads, head_dim 128,
 * bf16 KV), flash with and without key scores, and both kernels at 8K tokens; TFLOP/s
 * against the BF16 tensor-core peak (TSR_BF16_PEAK_TFLOPS, default 989: H100/H200 SXM
 * dense). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/sys.h"
#include "kernels/backend.h"
#include "tests/backend_test_util.h"
#include "tests/test.h"

typedef struct gpus {
    tsr_backend *cpu, *flash, *ref;
} gpus;

/* The CPU reference and the two CUDA backends, or false (printed) without a device. */
static bool gpus_open(gpus *g) {
    memset(g, 0, sizeof *g);
    if (tsr_backend_create("cuda", 1, &g->flash) != TSR_OK) {
        printf("test_flash_attn: no CUDA backend (%s): skipped\n", tsr_last_error());
        tsr_error_clear();
        return false;
    }
    const char *old = getenv("TSR_CUDA_ATTN");
    char *keep = old ? strdup(old) : NULL;
    setenv("TSR_CUDA_ATTN", "reference", 1);
    tsr_status st = tsr_backend_create("cuda", 1, &g->ref);
    if (keep) {
        setenv("TSR_CUDA_ATTN", keep, 1);
        free(keep);
    } else {
        unsetenv("TSR_CUDA_ATTN");
    }
    if (st != TSR_OK || tsr_backend_cpu_create(4, &g->cpu) != TSR_OK) {
        printf("test_flash_attn: backends: %s\n", tsr_last_error());
        tsr_backend_destroy(g->flash);
        tsr_backend_destroy(g->ref);
        return false;
    }
    printf("test_flash_attn: cuda on %s\n",
           g->flash->ops->device_name ? g->flash->ops->device_name(g->flash) : "?");
    return true;
}

static void gpus_close(gpus *g) {
    tsr_backend_destroy(g->cpu);
    tsr_backend_destroy(g->flash);
    tsr_backend_destroy(g->ref);
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t urand(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}

static float frand(void) { /* uniform in [-1, 1) */
    return (float)urand(1u << 24) / 8388608.0f - 1.0f;
}

/* max |got - want| / (abs + rel * |want|), printed; NaN on one side only is a failure */
static double worst(const char *what, const char *label, const float *got, const float *want,
                    size_t n, double abs, double rel) {
    double w = 0, wa = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        double r = e / (abs + rel * fabs((double)want[i]));
        if (isnan(got[i]) != isnan(want[i]) || isnan(e)) r = INFINITY;
        if (r > w) w = r;
        if (e > wa) wa = e;
    }
    printf("  %-58s %-5s max abs err %.3e (%.3f of tolerance)\n", what, label, wa, w);
    return w;
}

/* ---- prefill: the span-based op ---- */

typedef struct pcase {
    int n_q, keys, n_heads, n_kv, hd, n_spans, scattered, window, sinks, scores, bf16;
} pcase;

static void describe(const pcase *c, char *buf, size_t n) {
    snprintf(buf, n, "prefill q%d k%d h%d/%d hd%d sp%d%s%s%s%s%s", c->n_q, c->keys, c->n_heads,
             c->n_kv, c->hd, c->n_spans, c->scattered ? " scat" : "", c->window ? " win" : "",
             c->sinks ? " sink" : "", c->scores ? " h2o" : "", c->bf16 ? " bf16" : "");
}

/* One case on one backend: out (and key scores) into host arrays. UNSUPPORTED (the
 * reference before it had sinks and windows) is returned, not failed. */
static tsr_status run_prefill(tsr_backend *be, const pcase *c, const float *q, const void *k,
                              const void *v, size_t kv_bytes, const int32_t *kpos,
                              const int32_t *qpos, const float *sinks, float *out, float *ks) {
    const int hd = c->hd, kvd = c->n_kv * hd;
    size_t qn = (size_t)c->n_q * c->n_heads * hd, ksn = (size_t)c->n_heads * c->keys;
    float *dq = be_dup(be, q, qn * sizeof(float)), *dout = be_dup(be, NULL, qn * sizeof(float));
    char *dk = be_dup(be, k, kv_bytes), *dv = be_dup(be, v, kv_bytes);
    float *dsink = c->sinks ? be_dup(be, sinks, (size_t)c->n_heads * sizeof(float)) : NULL;
    float *dks = c->scores ? be_dup(be, NULL, ksn * sizeof(float)) : NULL;
    tsr_status st = TSR_ERR_NOMEM;
    if (!dq || !dout || !dk || !dv || (c->sinks && !dsink) || (c->scores && !dks)) goto out;
    if (dks && (st = be->ops->memset(be, dks, 0, ksn * sizeof(float))) != TSR_OK) goto out;
    tsr_kv_span sp[4];
    size_t row_bytes = c->bf16 ? (size_t)kvd * 2 : (size_t)kvd * 4;
    int per = c->keys / c->n_spans, off = 0;
    for (int s = 0; s < c->n_spans; s++) {
        int n = s == c->n_spans - 1 ? c->keys - off : per;
        sp[s] = (tsr_kv_span){.k = (const float *)(dk + (size_t)off * row_bytes),
                              .v = (const float *)(dv + (size_t)off * row_bytes),
                              .pos = c->scattered ? kpos + off : NULL,
                              .pos0 = off,
                              .n = n,
                              .stride = kvd,
                              .dtype = c->bf16 ? TSR_KV_BF16 : TSR_KV_F32};
        off += n;
    }
    tsr_attn_args a = {.q = dq, .q_pos = qpos, .n_q = c->n_q, .spans = sp,
                       .n_spans = c->n_spans, .n_heads = c->n_heads, .n_kv_heads = c->n_kv,
                       .head_dim = hd, .out = dout, .key_scores = dks, .sinks = dsink,
                       .window = c->window};
    if ((st = be->ops->attention(be, &a)) != TSR_OK) goto out;
    if ((st = be_read(be, out, dout, qn * sizeof(float))) != TSR_OK) goto out;
    if (dks) st = be_read(be, ks, dks, ksn * sizeof(float));
out:
    be_release(be, dq);
    be_release(be, dout);
    be_release(be, dk);
    be_release(be, dv);
    be_release(be, dsink);
    be_release(be, dks);
    return st;
}

static void check_prefill(gpus *g, const pcase *c) {
    const int hd = c->hd, kvd = c->n_kv * hd;
    size_t qn = (size_t)c->n_q * c->n_heads * hd, ksn = (size_t)c->n_heads * c->keys;
    size_t kvn = (size_t)c->keys * kvd;
    float *q = tsr_malloc(qn * sizeof(float));
    float *kf = tsr_malloc(kvn * sizeof(float)), *vf = tsr_malloc(kvn * sizeof(float));
    uint16_t *kh = tsr_malloc(kvn * 2), *vh = tsr_malloc(kvn * 2);
    int32_t *kpos = tsr_malloc((size_t)c->keys * sizeof(int32_t));
    int32_t *qpos = tsr_malloc((size_t)c->n_q * sizeof(int32_t));
    float *sinks = tsr_malloc((size_t)c->n_heads * sizeof(float));
    float *out[3], *ks[3];
    for (int i = 0; i < 3; i++) {
        out[i] = tsr_malloc(qn * sizeof(float));
        ks[i] = tsr_calloc(ksn, sizeof(float));
    }
    for (size_t i = 0; i < qn; i++) q[i] = 2.0f * frand();
    for (size_t i = 0; i < kvn; i++) {
        kf[i] = 2.0f * frand();
        vf[i] = frand();
        kh[i] = tsr_f32_to_bf16(kf[i]);
        vh[i] = tsr_f32_to_bf16(vf[i]);
    }
    /* scattered: a pruned cache keeps the original positions (gaps of 1 or 2) */
    for (int i = 0, p = 0; i < c->keys; i++, p += c->scattered ? 1 + (int)urand(2) : 1) kpos[i] = p;
    for (int i = 0; i < c->n_q; i++) qpos[i] = kpos[c->keys - c->n_q + i];
    for (int h = 0; h < c->n_heads; h++) sinks[h] = 2.0f * frand();
    const void *k = c->bf16 ? (const void *)kh : (const void *)kf;
    const void *v = c->bf16 ? (const void *)vh : (const void *)vf;
    size_t kv_bytes = kvn * (c->bf16 ? 2 : 4);
    char what[96];
    describe(c, what, sizeof what);
    tsr_backend *bes[3] = {g->cpu, g->flash, g->ref};
    const char *labels[3] = {"cpu", "flash", "ref"};
    for (int b = 0; b < 3 && !tsr_test_failed_flag; b++) {
        tsr_status st = run_prefill(bes[b], c, q, k, v, kv_bytes, kpos, qpos, sinks, out[b], ks[b]);
        if (b == 2 && st == TSR_ERR_UNSUPPORTED) {
            printf("  %-58s ref   unsupported here (%s)\n", what, tsr_last_error());
            tsr_error_clear();
            continue;
        }
        ASSERT_OK(st);
        if (b == 0) continue;
        double abs = b == 1 ? 2e-2 : 2e-5;
        ASSERT_TRUE(worst(what, labels[b], out[b], out[0], qn, abs, 0.0) <= 1.0);
        if (c->scores) {
            char w2[112];
            snprintf(w2, sizeof w2, "%s scores", what);
            ASSERT_TRUE(worst(w2, labels[b], ks[b], ks[0], ksn, abs, abs) <= 1.0);
        }
        if (b == 1) { /* the flash kernels are deterministic: a second run, the same bytes */
            float *o2 = tsr_malloc(qn * sizeof(float)), *k2 = tsr_calloc(ksn, sizeof(float));
            ASSERT_TRUE(o2 && k2);
            ASSERT_OK(run_prefill(bes[b], c, q, k, v, kv_bytes, kpos, qpos, sinks, o2, k2));
            ASSERT_TRUE(!memcmp(o2, out[b], qn * sizeof(float)));
            ASSERT_TRUE(!c->scores || !memcmp(k2, ks[b], ksn * sizeof(float)));
            tsr_free(o2);
            tsr_free(k2);
        }
    }
    for (int i = 0; i < 3; i++) {
        tsr_free(out[i]);
        tsr_free(ks[i]);
    }
    tsr_free(q);
    tsr_free(kf);
    tsr_free(vf);
    tsr_free(kh);
    tsr_free(vh);
    tsr_free(kpos);
    tsr_free(qpos);
    tsr_free(sinks);
}

TSR_TEST(test_flash_prefill) {
    gpus g;
    if (!gpus_open(&g)) return;
    /* fixed cases: each feature alone and together */
    const pcase fixed[] = {
        {77, 77, 8, 8, 64, 1, 0, 0, 0, 1, 0},      /* GQA 1, odd, h2o */
        {131, 300, 16, 4, 128, 3, 0, 0, 1, 1, 0},  /* GQA 4, a cached prefix, sinks */
        {65, 65, 32, 4, 128, 1, 0, 19, 1, 1, 0},   /* GQA 8, window, sinks */
        {200, 457, 8, 1, 64, 2, 1, 50, 0, 1, 1},   /* scattered positions, window, bf16 KV */
        {33, 1001, 4, 1, 128, 4, 0, 0, 0, 0, 1},   /* few queries, long cache, bf16 */
        {513, 513, 8, 2, 128, 1, 0, 128, 0, 1, 0}, /* several query and key tiles, window */
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && !tsr_test_failed_flag; i++)
        check_prefill(&g, &fixed[i]);
    /* random shapes */
    static const int groups[3] = {1, 4, 8};
    for (int i = 0; i < 8 && !tsr_test_failed_flag; i++) {
        pcase c;
        int grp = groups[urand(3)];
        c.n_kv = 1 + (int)urand(3);
        c.n_heads = c.n_kv * grp;
        c.hd = urand(2) ? 128 : 64;
        c.n_q = (64 + grp - 1) / grp + (int)urand(600);
        c.keys = c.n_q + (int)urand(400);
        c.n_spans = 1 + (int)urand(4);
        c.scattered = urand(3) == 0;
        c.window = urand(2) ? 1 + (int)urand((uint32_t)c.keys) : 0;
        c.sinks = (int)urand(2);
        c.scores = (int)urand(2);
        c.bf16 = (int)urand(2);
        check_prefill(&g, &c);
    }
    gpus_close(&g);
}

/* ---- decode: attention_paged ---- */

typedef struct dcase {
    int n_seqs, n_heads, n_kv, hd, max_keys, chunk, bf16;
} dcase;

static void check_decode(gpus *g, const dcase *c) {
    enum { BS = 16 };
    const int hd = c->hd, row = c->n_kv * hd, S = c->n_seqs;
    const int mb = (c->max_keys + BS - 1) / BS, nb = S * mb + 3;
    int32_t *n_keys = tsr_malloc((size_t)S * sizeof(int32_t));
    int32_t *tables = tsr_malloc((size_t)S * mb * sizeof(int32_t));
    /* the blocks dealt out of order: a permutation of 0 .. nb - 1 */
    int32_t *perm = tsr_malloc((size_t)nb * sizeof(int32_t));
    for (int i = 0; i < nb; i++) perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)urand((uint32_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int n_q = 0;
    for (int s = 0; s < S; s++) {
        n_keys[s] = 1 + (int)urand((uint32_t)c->max_keys);
        n_q += s == 0 && c->chunk > 1 ? (c->chunk < n_keys[s] ? c->chunk : n_keys[s]) : 1;
        for (int j = 0; j < mb; j++) tables[s * mb + j] = perm[s * mb + j];
    }
    int32_t *q_seq = tsr_malloc((size_t)n_q * sizeof(int32_t));
    int32_t *q_pos = tsr_malloc((size_t)n_q * sizeof(int32_t));
    for (int s = 0, r = 0; s < S; s++) {
        int m = s == 0 && c->chunk > 1 ? (c->chunk < n_keys[s] ? c->chunk : n_keys[s]) : 1;
        for (int i = 0; i < m; i++, r++) {
            q_seq[r] = s;
            q_pos[r] = n_keys[s] - m + i;
        }
    }
    size_t rows = (size_t)nb * 2 * BS; /* per block: BS K rows, then BS V rows */
    size_t eb = c->bf16 ? 2 : 4, qn = (size_t)n_q * c->n_heads * hd;
    unsigned char *kv = tsr_malloc(rows * row * eb);
    for (size_t i = 0; i < rows * row; i++) {
        float x = frand();
        if (c->bf16)
            ((uint16_t *)kv)[i] = tsr_f32_to_bf16(x);
        else
            ((float *)kv)[i] = x;
    }
    float *q = tsr_malloc(qn * sizeof(float));
    for (size_t i = 0; i < qn; i++) q[i] = 2.0f * frand();
    float *out[3];
    for (int i = 0; i < 3; i++) out[i] = tsr_malloc(qn * sizeof(float));
    size_t meta_n = (size_t)2 * n_q + S + (size_t)S * mb;
    int32_t *meta = tsr_malloc(meta_n * sizeof(int32_t));
    memcpy(meta, q_pos, (size_t)n_q * 4);
    memcpy(meta + n_q, q_seq, (size_t)n_q * 4);
    memcpy(meta + 2 * n_q, n_keys, (size_t)S * 4);
    memcpy(meta + 2 * n_q + S, tables, (size_t)S * mb * 4);
    char what[96];
    snprintf(what, sizeof what, "decode seqs%d rows%d h%d/%d hd%d keys<=%d%s", S, n_q,
             c->n_heads, c->n_kv, hd, c->max_keys, c->bf16 ? " bf16" : "");
    tsr_backend *bes[3] = {g->cpu, g->flash, g->ref};
    const char *labels[3] = {"cpu", "flash", "ref"};
    for (int b = 0; b < 3 && !tsr_test_failed_flag; b++) {
        tsr_backend *be = bes[b];
        unsigned char *dkv = be_dup(be, kv, rows * row * eb);
        float *dq = be_dup(be, q, qn * sizeof(float)), *dout = be_dup(be, NULL, qn * sizeof(float));
        int32_t *dm = be_dup(be, meta, meta_n * sizeof(int32_t));
        ASSERT_TRUE(dkv && dq && dout && dm);
        /* element offsets: a block is 2 * BS rows, V after the BS K rows */
        tsr_kv_layout lay = {.k = (float *)dkv, .v = (float *)(dkv + (size_t)BS * row * eb),
                             .block_stride = 2 * BS * row, .block = BS, .row = row,
                             .dtype = c->bf16 ? TSR_KV_BF16 : TSR_KV_F32};
        if (b == 0) { /* the CPU: per sequence, over the spans its table names */
            tsr_kv_span *sp = tsr_malloc((size_t)mb * sizeof *sp);
            for (int r0 = 0; r0 < n_q;) {
                int s = q_seq[r0], r1 = r0;
                while (r1 < n_q && q_seq[r1] == s) r1++;
                int nbk = (n_keys[s] + BS - 1) / BS;
                for (int j = 0; j < nbk; j++) {
                    int left = n_keys[s] - j * BS;
                    sp[j] = (tsr_kv_span){
                        .k = tsr_kv_rows_at(lay.k, lay.dtype, row, (int64_t)tables[s * mb + j] * lay.block_stride),
                        .v = tsr_kv_rows_at(lay.v, lay.dtype, row, (int64_t)tables[s * mb + j] * lay.block_stride),
                        .pos0 = j * BS, .n = left < BS ? left : BS, .stride = row,
                        .dtype = lay.dtype};
                }
                tsr_attn_args a = {.q = dq + (size_t)r0 * c->n_heads * hd, .q_pos = q_pos + r0,
                                   .n_q = r1 - r0, .spans = sp, .n_spans = nbk,
                                   .n_heads = c->n_heads, .n_kv_heads = c->n_kv, .head_dim = hd,
                                   .out = dout + (size_t)r0 * c->n_heads * hd};
                ASSERT_OK(be->ops->attention(be, &a));
                r0 = r1;
            }
            tsr_free(sp);
        } else {
            ASSERT_TRUE(be->ops->attention_paged != NULL);
            tsr_attn_paged_args pa = {.q = dq, .out = dout, .n_q = n_q, .n_heads = c->n_heads,
                                      .n_kv_heads = c->n_kv, .head_dim = hd, .lay = lay,
                                      .q_pos = dm, .q_seq = dm + n_q, .n_keys = dm + 2 * n_q,
                                      .tables = dm + 2 * n_q + S, .n_seqs = S, .max_blocks = mb};
            ASSERT_OK(be->ops->attention_paged(be, &pa));
        }
        ASSERT_OK(be_read(be, out[b], dout, qn * sizeof(float)));
        /* one sequence with a tile's worth of rows: the flash prefill over the table (BF16) */
        bool tc = S == 1 && n_q * (c->n_heads / c->n_kv) >= 64 && (hd == 64 || hd == 128);
        if (b > 0)
            ASSERT_TRUE(worst(what, labels[b], out[b], out[0], qn, b == 1 && tc ? 2e-2 : 5e-5,
                              0.0) <= 1.0);
        be_release(be, dkv);
        be_release(be, dq);
        be_release(be, dout);
        be_release(be, dm);
    }
    for (int i = 0; i < 3; i++) tsr_free(out[i]);
    tsr_free(kv);
    tsr_free(q);
    tsr_free(meta);
    tsr_free(q_seq);
    tsr_free(q_pos);
    tsr_free(n_keys);
    tsr_free(tables);
    tsr_free(perm);
}

TSR_TEST(test_flash_decode) {
    gpus g;
    if (!gpus_open(&g)) return;
    const dcase fixed[] = {
        {1, 32, 8, 128, 4001, 1, 1},  /* batch 1, the 8B shape, bf16: many partitions */
        {5, 8, 8, 64, 777, 1, 0},     /* GQA 1 */
        {64, 32, 4, 128, 300, 1, 1},  /* batch 64, GQA 8 */
        {3, 16, 4, 64, 2049, 7, 0},   /* a chunk of 7 rows in the first sequence */
        {2, 12, 4, 96, 500, 1, 0},    /* GQA 3 (one head per block), head_dim 96 */
        {1, 32, 8, 128, 3000, 301, 1}, /* a prefill chunk of one sequence: flash over the table */
        {1, 8, 2, 64, 900, 100, 0},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && !tsr_test_failed_flag; i++)
        check_decode(&g, &fixed[i]);
    static const int groups[3] = {1, 4, 8};
    for (int i = 0; i < 6 && !tsr_test_failed_flag; i++) {
        dcase c;
        int grp = groups[urand(3)];
        c.n_kv = 1 + (int)urand(8);
        c.n_heads = c.n_kv * grp;
        c.hd = urand(2) ? 128 : 64;
        c.n_seqs = 1 + (int)urand(40);
        c.max_keys = 1 + (int)urand(3000);
        c.chunk = urand(4) == 0 ? 2 + (int)urand(9) : 1;
        c.bf16 = (int)urand(2);
        check_decode(&g, &c);
    }
    gpus_close(&g);
}

/* ---- timing (TSR_FLASH_LONG) ---- */

/* Seconds of the best of `reps` runs of one prefill over n keys (one bf16 span), after one
 * untimed run when `warm` (scratch, kernel attributes). */
static tsr_status time_prefill(tsr_backend *be, int n, int scores, int warm, int reps,
                               double *best) {
    enum { H = 32, KV = 8, HD = 128 };
    size_t qn = (size_t)n * H * HD, kvn = (size_t)n * KV * HD, ksn = (size_t)H * n;
    /* inputs from a repeated random pattern: generating gigabytes on the host is slow */
    enum { PAT = 1 << 22 };
    float *pat = tsr_malloc(PAT * sizeof(float));
    uint16_t *pat16 = tsr_malloc(PAT * sizeof(uint16_t));
    int32_t *qpos = tsr_malloc((size_t)n * sizeof(int32_t));
    if (!pat || !pat16 || !qpos) return TSR_ERR_NOMEM;
    for (int i = 0; i < PAT; i++) {
        pat[i] = frand();
        pat16[i] = tsr_f32_to_bf16(frand());
    }
    for (int i = 0; i < n; i++) qpos[i] = i;
    float *dq = be_dup(be, NULL, qn * sizeof(float)), *dout = be_dup(be, NULL, qn * sizeof(float));
    uint16_t *dk = be_dup(be, NULL, kvn * 2), *dv = be_dup(be, NULL, kvn * 2);
    float *dks = scores ? be_dup(be, NULL, ksn * sizeof(float)) : NULL;
    tsr_status st = TSR_ERR_NOMEM;
    if (!dq || !dout || !dk || !dv || (scores && !dks)) goto out;
    for (size_t o = 0; o < qn; o += PAT)
        if ((st = tsr_backend_upload(be, dq + o, pat, (qn - o < PAT ? qn - o : PAT) * 4)) != TSR_OK) goto out;
    for (size_t o = 0; o < kvn; o += PAT) {
        size_t m = (kvn - o < PAT ? kvn - o : PAT) * 2;
        if ((st = tsr_backend_upload(be, dk + o, pat16, m)) != TSR_OK) goto out;
        if ((st = tsr_backend_upload(be, dv + o, pat16, m)) != TSR_OK) goto out;
    }
    tsr_kv_span sp = {.k = (const float *)dk, .v = (const float *)dv, .pos0 = 0, .n = n,
                      .stride = KV * HD, .dtype = TSR_KV_BF16};
    tsr_attn_args a = {.q = dq, .q_pos = qpos, .n_q = n, .spans = &sp, .n_spans = 1,
                       .n_heads = H, .n_kv_heads = KV, .head_dim = HD, .out = dout,
                       .key_scores = dks};
    *best = INFINITY;
    for (int r = warm ? 0 : 1; r <= reps; r++) { /* run 0: the warm-up */
        if (dks && (st = be->ops->memset(be, dks, 0, ksn * sizeof(float))) != TSR_OK) goto out;
        if ((st = be->ops->synchronize(be)) != TSR_OK) goto out;
        double t0 = tsr_sys_now();
        if ((st = be->ops->attention(be, &a)) != TSR_OK) goto out;
        if ((st = be->ops->synchronize(be)) != TSR_OK) goto out;
        double t = tsr_sys_now() - t0;
        if (r > 0 && t < *best) *best = t;
    }
out:
    be_release(be, dq);
    be_release(be, dout);
    be_release(be, dk);
    be_release(be, dv);
    be_release(be, dks);
    tsr_free(pat);
    tsr_free(pat16);
    tsr_free(qpos);
    return st;
}

static void report(const char *what, int n, double s, double extra_flops_per_pair) {
    const char *pk = getenv("TSR_BF16_PEAK_TFLOPS");
    double peak = pk ? atof(pk) : 989.0;
    /* causal: sum over queries of the visible keys, 4 * head_dim flops per (query head,
     * key) for QK^T and PV, plus the scores pass's 2 * head_dim when there is one */
    double pairs = (double)n * (n + 1) / 2 * 32;
    double flops = pairs * 128 * (4 + extra_flops_per_pair);
    printf("flash_timing %s n=%d heads=32/8 hd=128 seconds=%.4f tflops=%.1f of_peak=%.1f%%\n",
           what, n, s, flops / s / 1e12, 100 * flops / s / 1e12 / peak);
}

TSR_TEST(test_flash_timing) {
    const char *ln = getenv("TSR_FLASH_LONG");
    if (!ln || atoi(ln) <= 0) {
        printf("test_flash_attn: TSR_FLASH_LONG unset: no timing\n");
        return;
    }
    gpus g;
    if (!gpus_open(&g)) return;
    int n = atoi(ln);
    double s;
    /* the long runs are not warmed up: the 8K ones set the kernels up, and a cold first
     * run costs only its scratch allocation, a small part of seconds */
    ASSERT_OK(time_prefill(g.flash, 8192, 0, 1, 2, &s));
    report("flash", 8192, s, 0);
    ASSERT_OK(time_prefill(g.ref, 8192, 0, 1, 1, &s));
    report("reference", 8192, s, 0);
    ASSERT_OK(time_prefill(g.flash, n, 0, 0, 1, &s));
    report("flash", n, s, 0);
    double s_plain = s;
    ASSERT_OK(time_prefill(g.flash, n, 1, 0, 1, &s));
    report("flash+h2o", n, s, 2);
    printf("NOTE flash prefill %d tokens: %.3f s per layer (%.3f s with h2o scores)\n", n,
           s_plain, s);
    gpus_close(&g);
}

TSR_TEST_MAIN(test_flash_prefill, test_flash_decode, test_flash_timing)
