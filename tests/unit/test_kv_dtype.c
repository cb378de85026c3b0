/* KV storage dtypes (kernels/kv_dtype.h): every E4M3 code decodes as PyTorch's
 * float8_e4m3fn (tests/data/kv/e4m3fn.txt, tools/make_e4m3_table.py); each dtype's rows go
 * through the backend's row ops within its rounding; attention over stored spans equals
 * the f32 attention over the decoded rows bit for bit (on cpu and cpu-fenced). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kv_dtype.h"
#include "memory/kv_store.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

TSR_TEST(test_e4m3_table) {
    FILE *f = fopen(TSR_SOURCE_DIR "/tests/data/kv/e4m3fn.txt", "r");
    ASSERT_TRUE(f != NULL);
    int n = 0;
    unsigned code, bits;
    while (fscanf(f, "%u %x", &code, &bits) == 2) {
        float want, got = tsr_e4m3_to_f32((uint8_t)code);
        uint32_t w = bits;
        memcpy(&want, &w, 4);
        if (isnan(want)) {
            ASSERT_TRUE(isnan(got));
        } else {
            uint32_t g;
            memcpy(&g, &got, 4);
            if (g != w) fprintf(stderr, "  code %u: %08x, torch %08x\n", code, g, w);
            ASSERT_TRUE(g == w);
            /* and encoding the value gives the code back (-0 and +0 included) */
            ASSERT_EQ_INT(tsr_f32_to_e4m3(got), (int)code);
        }
        n++;
    }
    fclose(f);
    ASSERT_EQ_INT(n, 256);
    /* rounding: half way between 1 and 1.125 goes to even (1), saturation at 448 */
    ASSERT_EQ_INT(tsr_f32_to_e4m3(1.0625f), 0x38);
    ASSERT_EQ_INT(tsr_f32_to_e4m3(1e6f), 0x7e);
    ASSERT_EQ_INT(tsr_f32_to_e4m3(-1e6f), 0xfe);
}

TSR_TEST(test_row_bytes) {
    ASSERT_EQ_INT((int)tsr_kv_row_bytes(TSR_KV_F32, 64), 256);
    ASSERT_EQ_INT((int)tsr_kv_row_bytes(TSR_KV_BF16, 64), 128);
    ASSERT_EQ_INT((int)tsr_kv_row_bytes(TSR_KV_Q8, 64), 72);
    ASSERT_EQ_INT((int)tsr_kv_row_bytes(TSR_KV_Q8, 48), 0);
    ASSERT_EQ_INT((int)tsr_kv_row_bytes(TSR_KV_FP8, 64), 68);
    ASSERT_EQ_INT(tsr_kv_dtype_parse("bf16"), TSR_KV_BF16);
    ASSERT_EQ_INT(tsr_kv_dtype_parse("f16"), -1);
}

enum { HD = 32, G = 2, H = 4, KVD = HD * G, N = 200, BS = 16, NB = (N + BS - 1) / BS };

/* Decode attention over the first n rows of store s (spans of one block each) and over f32
 * copies kg, vg of its gathered rows in the same spans: out and key scores must be equal
 * bit for bit. mode 0: plain; 1: with key scores; 2: also GPT-OSS's sinks and a window. */
static void check_attention(tsr_kv_store *s, int n, const float *q, const float *kg,
                            const float *vg, int mode) {
    const int with_scores = mode > 0;
    static float o1[H * HD], o2[H * HD], ks1[H * N], ks2[H * N];
    tsr_kv_span sp[NB], ref[NB];
    int nsp = (n + BS - 1) / BS;
    for (int b = 0; b < nsp; b++)
        sp[b] = (tsr_kv_span){.k = tsr_kv_store_block_k(s, b), .v = tsr_kv_store_block_v(s, b),
                              .pos0 = b * BS, .n = n - b * BS < BS ? n - b * BS : BS,
                              .stride = KVD, .dtype = s->lay.dtype};
    float *gk = kvt_dev(kg, n * KVD), *gv = kvt_dev(vg, n * KVD);
    for (int b = 0; b < nsp; b++) { /* the same spans, so the same tiles */
        ref[b] = sp[b];
        ref[b].k = gk + (size_t)b * BS * KVD;
        ref[b].v = gv + (size_t)b * BS * KVD;
        ref[b].dtype = TSR_KV_F32;
    }
    for (int i = 0; i < H * n; i++) ks1[i] = 0.25f; /* attention adds to them */
    const float sinks[H] = {0.5f, -1.0f, 2.0f, -INFINITY};
    float *dq = kvt_dev(q, H * HD), *out = kvt_dev(o1, H * HD), *dks = kvt_dev(ks1, H * n);
    float *dsk = kvt_dev(sinks, H);
    int32_t qp = n - 1;
    tsr_attn_args a = {.q = dq, .q_pos = &qp, .n_q = 1, .spans = sp, .n_spans = nsp,
                       .n_heads = H, .n_kv_heads = G, .head_dim = HD, .out = out,
                       .key_scores = with_scores ? dks : NULL, .sinks = mode > 1 ? dsk : NULL,
                       .window = mode > 1 ? 24 : 0};
    ASSERT_OK(kvt_be->ops->attention(kvt_be, &a));
    ASSERT_OK(kvt_read(o1, out, H * HD));
    ASSERT_OK(kvt_read(ks1, dks, H * n));
    kvt_dev_free(dks);
    for (int i = 0; i < H * n; i++) ks2[i] = 0.25f;
    dks = kvt_dev(ks2, H * n);
    a.spans = ref;
    a.key_scores = with_scores ? dks : NULL;
    ASSERT_OK(kvt_be->ops->attention(kvt_be, &a));
    ASSERT_OK(kvt_read(o2, out, H * HD));
    ASSERT_OK(kvt_read(ks2, dks, H * n));
    ASSERT_TRUE(memcmp(o1, o2, sizeof o1) == 0);
    ASSERT_TRUE(memcmp(ks1, ks2, (size_t)(H * n) * sizeof(float)) == 0);
    if (mode == 1) { /* the scores were added: each head's sum to 1 over the keys */
        double sum = 0.0;
        for (int j = 0; j < n; j++) sum += ks1[j] - 0.25f;
        ASSERT_TRUE(fabs(sum - 1.0) < 1e-4);
    }
    kvt_dev_free(gk);
    kvt_dev_free(gv);
    kvt_dev_free(dq);
    kvt_dev_free(out);
    kvt_dev_free(dks);
    kvt_dev_free(dsk);
}

/* Rows through the store of each dtype: gathered rows are within the dtype's rounding of
 * what was written, and decode attention (with and without key scores, sinks and a window,
 * over one partition of keys and several) over the store's spans equals attention over f32
 * spans of the gathered rows exactly. */
TSR_KV_TEST(test_store_and_attention) {
    static float k[N * KVD], v[N * KVD], kg[N * KVD], vg[N * KVD];
    static float q[H * HD];
    for (int i = 0; i < N * KVD; i++) {
        k[i] = sinf(0.37f * (float)i) * (1.0f + (float)(i % 7));
        v[i] = cosf(0.11f * (float)i);
    }
    for (int i = 0; i < H * HD; i++) q[i] = sinf(0.05f * (float)i);
    const float tol[] = {0.0f, 1.0f / 128, 1.0f / 127, 1.0f / 14};
    for (int dt = TSR_KV_F32; dt <= TSR_KV_FP8; dt++) {
        tsr_kv_store s;
        ASSERT_OK(tsr_kv_store_init(&s, kvt_be, NB, BS, KVD, dt, false));
        int32_t slots[N];
        for (int i = 0; i < N; i++) slots[i] = i;
        float *dk = kvt_dev(k, N * KVD), *dv = kvt_dev(v, N * KVD);
        ASSERT_OK(tsr_kv_store_write(&s, slots, N, dk, dv, 0));
        ASSERT_OK(tsr_kv_store_gather(&s, slots, N, kg, vg, NULL, NULL));
        for (int r = 0; r < N; r++) {
            float amax = 0.0f;
            for (int c = 0; c < KVD; c++) amax = fmaxf(amax, fabsf(k[r * KVD + c]));
            for (int c = 0; c < KVD; c++) {
                float e = fabsf(kg[r * KVD + c] - k[r * KVD + c]);
                float lim = dt == TSR_KV_BF16 ? fabsf(k[r * KVD + c]) * tol[dt]
                                              : amax * tol[dt];
                if (e > lim + 1e-30f) fprintf(stderr, "  %s row %d col %d: %g vs %g\n",
                                              tsr_kv_dtype_name(dt), r, c, kg[r * KVD + c],
                                              k[r * KVD + c]);
                ASSERT_TRUE(e <= lim + 1e-30f);
            }
        }
        /* 40 keys: one partition; 200: four (kernels/cpu/attn_cpu.c) */
        for (int sc = 0; sc < 3 && !tsr_test_failed_flag; sc++) {
            check_attention(&s, 40, q, kg, vg, sc);
            if (!tsr_test_failed_flag) check_attention(&s, N, q, kg, vg, sc);
        }
        kvt_dev_free(dk);
        kvt_dev_free(dv);
        tsr_kv_store_release(&s);
        if (tsr_test_failed_flag) return;
    }
}

TSR_TEST_MAIN(test_e4m3_table, test_row_bytes, test_store_and_attention)
