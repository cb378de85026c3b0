/* Q8_0 weights: the quantizer's bytes against the `gguf` package's (tests/data/q8, written by
 * tools/make_q8_testdata.py) on every matrix of two models and on edge cases; the lossless
 * repacking; every kernel variant against the scalar reference (bits) and the scalar
 * reference against a double-precision sum of the same integers; the cpu and cpu-fenced
 * backends' matmul and matmul_parts on Q8_0 weights. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant_q8_internal.h"
#include "runtime/format/gguf.h"
#include "runtime/model/model.h"
#include "tests/quant_test_util.h"
#include "tests/test.h"

#define Q8_DIR TSR_SOURCE_DIR "/tests/data/q8/"

static uint64_t fnv64(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The golden's hash of a matrix: FNV-1a of the sorted FNV-1a hashes of its GGUF rows. */
static uint64_t rows_hash(uint64_t *rh, int64_t rows) {
    qsort(rh, (size_t)rows, sizeof *rh, cmp_u64);
    uint64_t h = 0xCBF29CE484222325ull;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t le[8];
        for (int k = 0; k < 8; k++) le[k] = (uint8_t)(rh[r] >> (8 * k));
        h = fnv64(le, 8, h);
    }
    return h;
}

TSR_TEST(test_edge_bytes_and_repack) {
    size_t nf, nq;
    float *w = read_all(Q8_DIR "edge_f32.bin", &nf);
    uint8_t *want = read_all(Q8_DIR "edge_q8_0.bin", &nq);
    ASSERT_TRUE(w && want);
    enum { ROWS = 24, COLS = 96, NB = COLS / 32 };
    ASSERT_EQ_INT((int)nf, ROWS * COLS * 4);
    ASSERT_EQ_INT((int)nq, ROWS * NB * 34);
    uint8_t got[ROWS * NB * 34];
    for (int r = 0; r < ROWS; r++) tsr_q8_quantize_blocks(w + r * COLS, COLS, got + r * NB * 34);
    for (int i = 0; i < ROWS * NB * 34; i++)
        if (got[i] != want[i]) TSR_FAIL_("edge byte %d (row %d): %u != gguf %u", i, i / (NB * 34),
                                         got[i], want[i]);
    /* rows of 24 and of 17 (padded groups): pack, unpack and dequantize */
    for (int rows = 17; rows <= ROWS; rows += 7) {
        tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = COLS, .data = w};
        tsr_tensor q = {.dtype = TSR_Q8_0, .rows = rows, .cols = COLS};
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_OK(tsr_q8_quantize_tensor(&src, packed));
        for (int r = 0; r < rows; r++) {
            uint8_t back[NB * 34];
            float deq[COLS];
            tsr_q8_unpack_row(packed, COLS, r, back);
            ASSERT_TRUE(memcmp(back, want + r * NB * 34, sizeof back) == 0);
            tsr_q8_dequant_row(packed, COLS, r, deq);
            for (int c = 0; c < COLS; c++) {
                const uint8_t *blk = want + (r * NB + c / 32) * 34;
                float d = tsr_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                ASSERT_TRUE(deq[c] == (float)(int8_t)blk[2 + c % 32] * d);
            }
        }
        tsr_free(packed);
    }
    free(w);
    free(want);
}

static const tsr_tensor *model_matrix(const tsr_model *m, const char *name) {
    if (!strcmp(name, "tok_emb")) return &m->tok_emb;
    if (!strcmp(name, "classifier")) return &m->classifier;
    int l = atoi(name);
    const char *k = strchr(name, '.') + 1;
    const tsr_layer_weights *w = &m->layers[l];
    if (!strcmp(k, "wq")) return &w->wq;
    if (!strcmp(k, "wk")) return &w->wk;
    if (!strcmp(k, "wv")) return &w->wv;
    if (!strcmp(k, "wo")) return &w->wo;
    if (!strcmp(k, "w_gate")) return &w->w_gate;
    if (!strcmp(k, "w_up")) return &w->w_up;
    if (!strcmp(k, "w_down")) return &w->w_down;
    return NULL;
}

static void check_model(cJSON *golden, const char *key, const char *path) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(path, &m));
    cJSON *mats = cJSON_GetObjectItem(golden, key);
    ASSERT_TRUE(mats != NULL);
    int n = 0;
    for (cJSON *e = mats->child; e; e = e->next, n++) {
        const tsr_tensor *t = model_matrix(m, e->string);
        ASSERT_TRUE(t != NULL);
        ASSERT_EQ_INT((int)t->rows, cJSON_GetObjectItem(e, "rows")->valueint);
        ASSERT_EQ_INT((int)t->cols, cJSON_GetObjectItem(e, "cols")->valueint);
        int64_t nb = t->cols / 32;
        float *row = tsr_malloc((size_t)t->cols * 4);
        uint8_t *blk = tsr_malloc((size_t)nb * 34), *blk2 = tsr_malloc((size_t)nb * 34);
        uint64_t *rh = tsr_malloc((size_t)t->rows * 8);
        tsr_tensor q = {.dtype = TSR_Q8_0, .rows = t->rows, .cols = t->cols};
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_OK(tsr_q8_quantize_tensor(t, packed));
        for (int64_t r = 0; r < t->rows; r++) {
            tsr_dtype_to_f32(t->dtype, tsr_tensor_row(t, r), row, (size_t)t->cols);
            tsr_q8_quantize_blocks(row, t->cols, blk);
            tsr_q8_unpack_row(packed, t->cols, r, blk2);
            ASSERT_TRUE(memcmp(blk, blk2, (size_t)nb * 34) == 0);
            rh[r] = fnv64(blk, (size_t)nb * 34, 0xCBF29CE484222325ull);
        }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)rows_hash(rh, t->rows));
        if (strcmp(hex, cJSON_GetObjectItem(e, "hash")->valuestring))
            TSR_FAIL_("%s %s: hash %s != gguf %s", key, e->string, hex,
                      cJSON_GetObjectItem(e, "hash")->valuestring);
        tsr_free(row);
        tsr_free(blk);
        tsr_free(blk2);
        tsr_free(rh);
        tsr_free(packed);
    }
    ASSERT_TRUE(n >= 10);
    tsr_model_destroy(m);
}

TSR_TEST(test_models_equal_gguf_package) {
    char *text = read_all(Q8_DIR "quant.json", NULL);
    ASSERT_TRUE(text != NULL);
    cJSON *g = cJSON_Parse(text);
    ASSERT_TRUE(g != NULL);
    check_model(g, "synth_bf16_gqa", TSR_SOURCE_DIR "/tests/data/synth_bf16_gqa");
    check_model(g, "stories260K", TSR_SOURCE_DIR "/models/stories260K.bin");
    cJSON_Delete(g);
    free(text);
}

/* Row and column slices (the tensor-parallel shard cut of runtime/exec/parallel.c) equal
 * the slices of the GGUF rows. */
TSR_TEST(test_slice) {
    size_t nf;
    float *w = read_all(Q8_DIR "edge_f32.bin", &nf);
    ASSERT_TRUE(w != NULL);
    enum { ROWS = 24, COLS = 96, NB = COLS / 32 };
    uint8_t gg[ROWS * NB * 34];
    for (int r = 0; r < ROWS; r++) tsr_q8_quantize_blocks(w + r * COLS, COLS, gg + r * NB * 34);
    tsr_tensor q = {.dtype = TSR_Q8_0, .rows = ROWS, .cols = COLS};
    uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
    tsr_q8_pack_gguf(gg, ROWS, COLS, packed);
    q.data = packed;
    int cuts[][4] = {{0, 24, 0, 96}, {5, 22, 32, 96}, {16, 24, 0, 64}, {3, 4, 64, 96}};
    for (int k = 0; k < 4; k++) {
        int r0 = cuts[k][0], r1 = cuts[k][1], c0 = cuts[k][2], c1 = cuts[k][3];
        tsr_tensor s = {.dtype = TSR_Q8_0, .rows = r1 - r0, .cols = c1 - c0};
        uint8_t *sp = tsr_malloc(tsr_tensor_bytes(&s));
        ASSERT_OK(tsr_q8_slice(&q, r0, r1, c0, c1, sp));
        for (int r = r0; r < r1; r++) {
            uint8_t back[NB * 34];
            tsr_q8_unpack_row(sp, c1 - c0, r - r0, back);
            ASSERT_TRUE(memcmp(back, gg + (r * NB + c0 / 32) * 34, (size_t)(c1 - c0) / 32 * 34) == 0);
        }
        tsr_free(sp);
    }
    ASSERT_EQ_INT(tsr_q8_slice(&q, 0, 24, 16, 96, packed), TSR_ERR_INVALID);
    tsr_free(packed);
    free(w);
}

/* A Q8_0 GGUF loads as it is: every matrix TSR_Q8_0, each row's blocks the file's bytes. */
TSR_TEST(test_gguf_q8_native) {
    const char *path = Q8_DIR "tiny_q8_0.gguf";
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(path, &m));
    tsr_gguf *g = NULL;
    ASSERT_OK(tsr_gguf_open(path, &g));
    char name[64];
    int checked = 0;
    for (int l = -1; l < m->cfg.n_layers; l++) {
        const char *ln[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                            "ffn_down"};
        for (int i = 0; i < (l < 0 ? 2 : 7); i++) {
            const tsr_tensor *t;
            if (l < 0) {
                snprintf(name, sizeof name, i ? "output.weight" : "token_embd.weight");
                t = i ? &m->classifier : &m->tok_emb;
            } else {
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, ln[i]);
                const tsr_layer_weights *w = &m->layers[l];
                const tsr_tensor *ts[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                          &w->w_down};
                t = ts[i];
            }
            const tsr_gguf_tensor *gt = tsr_gguf_tensor_find(g, name);
            ASSERT_TRUE(gt != NULL);
            ASSERT_EQ_INT(t->dtype, TSR_Q8_0);
            size_t rb = (size_t)(t->cols / 32) * 34;
            uint8_t *row = tsr_malloc(rb);
            for (int64_t r = 0; r < t->rows; r++) {
                tsr_q8_unpack_row(t->data, t->cols, r, row);
                ASSERT_TRUE(memcmp(row, gt->data + (size_t)r * rb, rb) == 0);
            }
            tsr_free(row);
            checked++;
        }
    }
    ASSERT_EQ_INT(checked, 2 + 7 * m->cfg.n_layers);
    tsr_gguf_close(g);
    tsr_model_destroy(m);
}

/* ---- kernels ---- */

typedef struct qmat {
    tsr_tensor t;
    float *f; /* the f32 values */
} qmat;

static qmat make_qmat(int64_t rows, int64_t cols) {
    qmat q = {.t = {.dtype = TSR_Q8_0, .rows = rows, .cols = cols}};
    q.f = tsr_malloc((size_t)(rows * cols) * 4);
    for (int64_t i = 0; i < rows * cols; i++) q.f[i] = frand() * (1.0f + (float)(i % 7));
    void *p = tsr_malloc(tsr_tensor_bytes(&q.t));
    tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = cols, .data = q.f};
    tsr_q8_quantize_tensor(&src, p);
    q.t.data = p;
    return q;
}

static void free_qmat(qmat *q) {
    tsr_free((void *)q->t.data);
    tsr_free(q->f);
}

typedef struct qact {
    int8_t *qs;
    float *d;
    int32_t *s;
} qact;

static qact make_act(const float *x, int64_t n, int64_t cols) {
    qact a = {tsr_malloc((size_t)(n * cols)), tsr_malloc((size_t)(n * cols / 32) * 4),
              tsr_malloc((size_t)(n * cols / 32) * 4)};
    for (int64_t i = 0; i < n; i++)
        tsr__q8_quantize_act(x + i * cols, cols, a.qs + i * cols, a.d + i * cols / 32,
                             a.s + i * cols / 32, NULL);
    return a;
}

static void free_act(qact *a) {
    tsr_free(a->qs);
    tsr_free(a->d);
    tsr_free(a->s);
}

typedef struct gemv_case {
    const tsr_tensor *w;
    const qact *a;
} gemv_case;

static void gemv_call(const void *kern, const void *ctx, int64_t g0, int64_t g1, int nx,
                      const int32_t *bseg, int n_parts, bool sum, float *y, int64_t ldy,
                      int64_t ldp) {
    const gemv_case *c = ctx;
    ((const tsr__q8_kernels *)kern)->gemv(c->w->data, c->w->cols / 32, c->w->rows, g0, g1,
                                          c->a->qs, c->a->d, c->a->s, nx, bseg, n_parts, sum, y,
                                          ldy, ldp);
}

/* Row r for token i: the exact sum of the same quantized values' block products. */
static double exact_call(const void *ctx, int i, int64_t r, double *mag) {
    const gemv_case *c = ctx;
    int64_t cols = c->w->cols, nb = cols / 32;
    uint8_t blk[5632 / 32 * 34];
    tsr_q8_unpack_row(c->w->data, cols, r, blk);
    double e = 0;
    *mag = 0;
    for (int64_t b = 0; b < nb; b++) {
        double dw = tsr_f16_to_f32((uint16_t)(blk[b * 34] | blk[b * 34 + 1] << 8));
        long is = 0;
        for (int j = 0; j < 32; j++)
            is += (long)(int8_t)blk[b * 34 + 2 + j] * c->a->qs[i * cols + b * 32 + j];
        e += (double)is * dw * c->a->d[i * nb + b];
        *mag += fabs((double)is * dw * c->a->d[i * nb + b]);
    }
    return e;
}

TSR_TEST(test_kernels_equal_scalar) {
    const tsr__q8_kernels *ref = tsr__q8_kernels_for(TSR__Q8_SCALAR);
    /* groups 1, 1, 2, 3, 3, 5; qt_variant_vs_scalar splits them in two calls: 33's second
     * call [1, 3) is one pair of groups (the last padded), 70's [2, 5) a pair, then the
     * padded last group alone (pairs: AVX-512 for nx >= 2, AVX2 for nx 4) */
    int64_t rows_list[] = {1, 15, 17, 33, 48, 70};
    int64_t cols_list[] = {32, 96, 768, 2048, 5632};
    int tested = 0;
    for (int v = 0; v < TSR__Q8_N_VARIANTS; v++) {
        const tsr__q8_kernels *k = tsr__q8_kernels_for((tsr__q8_variant)v);
        if (!k) {
            fprintf(stderr, "  q8 variant %d: not on this CPU\n", v);
            continue;
        }
        tested++;
        { /* the activation quantizer: the scalar one's bits, ties and zero blocks included */
            enum { C = 2048 };
            float *x = tsr_malloc(C * 4);
            for (int i = 0; i < C; i++)
                x[i] = i < 32 ? 0.0f : i < 64 ? (float)(i - 48) * (127.0f / 16.0f) / 64.0f
                                              : frand() * (float)(1 + i % 5);
            int8_t q0[C], q1[C];
            float d0[C / 32], d1[C / 32], m0[C / 32], m1[C / 32], m2[C / 32];
            int32_t s0[C / 32], s1[C / 32], s2[C / 32];
            ref->quant_act(x, C, q0, d0, s0, m0);
            k->quant_act(x, C, q1, d1, s1, m1);
            if (memcmp(q0, q1, C) || memcmp(d0, d1, sizeof d0) || memcmp(s0, s1, sizeof s0) ||
                memcmp(m0, m1, sizeof m0))
                TSR_FAIL_("%s: activation quantizer differs from scalar", k->name);
            k->quant_act(x, C, q1, d1, s2, NULL); /* Q4_1's sums are optional */
            if (memcmp(s0, s2, sizeof s0))
                TSR_FAIL_("%s: activation sums differ without Q4_1's", k->name);
            /* Q4_1's sums: fp16(bsum * max|x| / 127), the scale unrounded */
            for (int b = 0; b < C / 32; b++) {
                float amax = 0.0f;
                for (int j = 0; j < 32; j++)
                    if (fabsf(x[b * 32 + j]) > amax) amax = fabsf(x[b * 32 + j]);
                m2[b] = tsr_f16_to_f32(tsr_f32_to_f16((float)s0[b] * (amax / 127.0f)));
            }
            if (memcmp(m0, m2, sizeof m0))
                TSR_FAIL_("%s: Q4_1 activation sums differ from their formula", k->name);
            tsr_free(x);
        }
        for (size_t ri = 0; ri < 6; ri++)
            for (size_t ci = 0; ci < 5; ci++) {
                int64_t rows = rows_list[ri], cols = cols_list[ci], nb = cols / 32;
                if (rows * cols > 48 * 2048 && rows > 17) continue;
                qmat w = make_qmat(rows, cols);
                float *x = tsr_malloc((size_t)(4 * cols) * 4);
                for (int64_t i = 0; i < 4 * cols; i++) x[i] = frand() * 3.0f;
                qact a = make_act(x, 4, cols);
                gemv_case gc = {&w.t, &a};
                qt_variant_vs_scalar(k->name, ref, k, gemv_call, &gc, rows, nb,
                                     v == 0 ? exact_call : NULL);
                free_act(&a);
                tsr_free(x);
                free_qmat(&w);
            }
    }
    ASSERT_TRUE(tested >= 1);
}

/* The AMX kernel (16 tokens at a time) against the scalar gemv token by token, bit for bit:
 * odd row counts (the last group padded, an odd group left after pairs), 1 to 3 token
 * blocks, one part summed, three parts apart and summed (a part of 1 block, of an odd
 * count and of 2 or more). */
TSR_TEST(test_amx_equals_scalar) {
    tsr__q8_gemm16_fn amx = tsr__q8_amx_get();
    if (!amx) {
        fprintf(stderr, "  q8 amx: not on this CPU (or not allowed)\n");
        return;
    }
    const tsr__q8_kernels *ref = tsr__q8_kernels_for(TSR__Q8_SCALAR);
    int64_t rows_list[] = {1, 17, 33, 70};
    int64_t cols_list[] = {32, 96, 768, 2048};
    for (size_t ri = 0; ri < 4; ri++)
        for (size_t ci = 0; ci < 4; ci++) {
            int64_t rows = rows_list[ri], cols = cols_list[ci], nb = cols / 32;
            int64_t ng = (rows + 15) / 16, n = 48;
            qmat w = make_qmat(rows, cols);
            float *x = tsr_malloc((size_t)(n * cols) * 4);
            for (int64_t i = 0; i < n * cols; i++) x[i] = frand() * 3.0f;
            qact a = make_act(x, n, cols);
            int8_t *xa = tsr_malloc((size_t)(n * cols));
            float *xd = tsr_malloc((size_t)(n * nb) * 4);
            int32_t *xc = tsr_malloc((size_t)(n * nb) * 4);
            for (int64_t i = 0; i < n; i++)
                tsr__q8_amx_pack_act(a.qs + i * cols, a.d + i * nb, a.s + i * nb, nb, i, xa, xd,
                                     xc);
            int32_t whole[2] = {0, (int32_t)nb};
            int32_t three[4] = {0, 1, (int32_t)(nb / 2 + (nb > 2)), (int32_t)nb};
            size_t ny = (size_t)(3 * n * rows);
            float *want = tsr_malloc(ny * 4), *got = tsr_malloc(ny * 4);
            for (int c = 0; c < 3; c++) {
                const int32_t *bseg = c == 0 ? whole : three;
                int np = c == 0 ? 1 : 3;
                bool sum = c != 1;
                for (int64_t nt = 16; nt <= n; nt += 16) {
                    memset(want, 0, ny * 4);
                    memset(got, 0xff, ny * 4);
                    for (int64_t i = 0; i < nt; i++)
                        ref->gemv(w.t.data, nb, rows, 0, ng, a.qs + i * cols, a.d + i * nb,
                                  a.s + i * nb, 1, bseg, np, sum, want + i * rows, rows,
                                  n * rows);
                    /* two calls: groups [0, 1) and [1, ng), as the matmul's blocks split */
                    amx(w.t.data, nb, rows, 0, 1, xa, xd, xc, nt, bseg, np, sum, got, rows,
                        n * rows);
                    if (ng > 1)
                        amx(w.t.data, nb, rows, 1, ng, xa, xd, xc, nt, bseg, np, sum, got, rows,
                            n * rows);
                    int planes = sum ? 1 : np;
                    for (int pl = 0; pl < planes; pl++)
                        for (int64_t i = 0; i < nt; i++) {
                            size_t o = (size_t)(pl * n * rows + i * rows);
                            if (memcmp(want + o, got + o, (size_t)rows * 4))
                                TSR_FAIL_("amx: %lldx%lld, %lld tokens, case %d: token %lld "
                                          "plane %d differs from scalar",
                                          (long long)rows, (long long)cols, (long long)nt, c,
                                          (long long)i, pl);
                        }
                }
            }
            tsr_free(want);
            tsr_free(got);
            tsr_free(xa);
            tsr_free(xd);
            tsr_free(xc);
            free_act(&a);
            tsr_free(x);
            free_qmat(&w);
        }
}

/* The backends: matmul (n 1..5 and a prefill of 40) and matmul_parts against the kernel's
 * rows computed directly; cpu-fenced gives cpu's bits. */
TSR_TEST(test_backends) {
    qt_backends bs;
    qt_backends_open(&bs);
    ASSERT_TRUE(bs.n >= 2);
    const tsr__q8_kernels *ref = tsr__q8_kernels_for(TSR__Q8_SCALAR);
    int64_t shapes[][2] = {{37, 96}, {100, 768}, {300, 256}};
    for (int si = 0; si < 3; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1], nb = cols / 32;
        qmat w = make_qmat(rows, cols);
        int ns[] = {1, 2, 3, 4, 5, 40};
        for (int ni = 0; ni < 6; ni++) {
            int64_t n = ns[ni];
            float *x = tsr_malloc((size_t)(n * cols) * 4);
            for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
            qact a = make_act(x, n, cols);
            int32_t seg[4] = {0, 32, (int32_t)(cols / 2 / 32 * 32), (int32_t)cols};
            int32_t bseg[4] = {0, 1, seg[2] / 32, (int32_t)nb};
            float *want = tsr_malloc((size_t)(n * rows) * 4), *wantp = tsr_malloc((size_t)(3 * n * rows) * 4);
            int32_t whole[2] = {0, (int32_t)nb};
            for (int64_t i = 0; i < n; i++) {
                ref->gemv(w.t.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                          a.s + i * nb, 1, whole, 1, true, want + i * rows, rows, 0);
                ref->gemv(w.t.data, nb, rows, 0, (rows + 15) / 16, a.qs + i * cols, a.d + i * nb,
                          a.s + i * nb, 1, bseg, 3, false, wantp + i * rows, rows, n * rows);
            }
            qt_backends_agree(&bs, &w.t, x, n, seg, 16, want, wantp);
            free_act(&a);
            tsr_free(want);
            tsr_free(wantp);
            tsr_free(x);
        }
        free_qmat(&w);
    }
    qt_backends_close(&bs);
}

TSR_TEST_MAIN(test_edge_bytes_and_repack, test_models_equal_gguf_package, test_slice, test_gguf_q8_native,
              test_kernels_equal_scalar, test_amx_equals_scalar, test_backends)
