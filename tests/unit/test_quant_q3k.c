/* GGUF's Q3_K and IQ4_NL, which tessera loads into its Q6_K and Q8_0 layouts (the same
 * values in more bits; runtime/model/gguf_loader.c): tests/data/q3k (tools/
 * make_q3k_testdata.py) dequantized by the GGUF reader and, for Q3_K, repacked as Q6_K, to
 * the `gguf` package's values bit for bit; every matrix of a tiny Q3_K_M-like llama loaded
 * to the reader's values; that llama natively against its f32 expansion. The Q6_K and Q8_0
 * kernels themselves are test_quant_q6k's and test_quant_q8's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_q6k.h"
#include "runtime/format/gguf.h"
#include "runtime/model/model.h"
#include "tests/quant_test_util.h"
#include "tests/test.h"

#define DATA TSR_SOURCE_DIR "/tests/data/q3k/"

/* The reader's dequantization of `blocks` ([rows, cols] of type t) into out. */
static tsr_status reader_dequant(uint32_t t, const uint8_t *blocks, size_t n, int64_t rows,
                                 int64_t cols, float *out) {
    tsr_gguf fake = {.path = "w.bin"};
    tsr_gguf_tensor tt = {.name = "w", .n_dims = 2, .ne = {cols, rows, 1, 1}, .type = t,
                          .nbytes = n, .numel = rows * cols, .data = blocks};
    return tsr_gguf_dequant(&fake, &tt, TSR_F32, out);
}

/* w_q3k.bin: repacked into the Q6_K layout (rows 17 and 37: padded last groups) and read
 * by the reader, both to the package's values bit for bit. */
TSR_TEST(test_q3k_values) {
    enum { R = 37, C = 512 };
    size_t nq, nd;
    uint8_t *blocks = read_all(DATA "w_q3k.bin", &nq);
    float *deq = read_all(DATA "w_q3k.f32", &nd);
    ASSERT_TRUE(blocks && deq);
    ASSERT_EQ_INT((int)nq, R * (C / 256) * TSR_Q3K_GGUF_BLOCK_BYTES);
    ASSERT_EQ_INT((int)nd, R * C * 4);
    float *viar = tsr_malloc((size_t)R * C * 4);
    ASSERT_OK(reader_dequant(TSR_GGML_Q3_K, blocks, nq, R, C, viar));
    ASSERT_TRUE(!memcmp(viar, deq, (size_t)R * C * 4));
    for (int rows = 17; rows <= R; rows += 20) {
        tsr_tensor q = {.dtype = TSR_Q6_K, .rows = rows, .cols = C};
        uint8_t *packed = tsr_malloc(tsr_tensor_bytes(&q));
        ASSERT_TRUE(packed);
        tsr_q6k_pack_q3k(blocks, rows, C, packed);
        for (int r = 0; r < rows; r++) {
            float got[C];
            tsr_q6k_dequant_row(packed, C, r, got);
            for (int k = 0; k < C; k++)
                if (memcmp(&got[k], &deq[r * C + k], 4))
                    TSR_FAIL_("row %d col %d: %.9g vs gguf %.9g", r, k, (double)got[k],
                              (double)deq[r * C + k]);
        }
        tsr_free(packed);
    }
    tsr_free(viar);
    free(blocks);
    free(deq);
}

/* w_iq4nl.bin read by the reader to the package's values bit for bit. */
TSR_TEST(test_iq4nl_values) {
    enum { R = 37, C = 160 };
    size_t nq, nd;
    uint8_t *blocks = read_all(DATA "w_iq4nl.bin", &nq);
    float *deq = read_all(DATA "w_iq4nl.f32", &nd);
    ASSERT_TRUE(blocks && deq);
    ASSERT_EQ_INT((int)nq, R * (C / 32) * 18);
    ASSERT_EQ_INT((int)nd, R * C * 4);
    float *viar = tsr_malloc((size_t)R * C * 4);
    ASSERT_OK(reader_dequant(TSR_GGML_IQ4_NL, blocks, nq, R, C, viar));
    for (int i = 0; i < R * C; i++)
        if (memcmp(&viar[i], &deq[i], 4))
            TSR_FAIL_("value %d: %.9g vs gguf %.9g", i, (double)viar[i], (double)deq[i]);
    tsr_free(viar);
    free(blocks);
    free(deq);
}

/* Every matrix of the tiny llama as loaded (Q3_K as Q6_K, IQ4_NL as Q8_0) against the
 * reader's values of the file's tensor, bit for bit. */
static void loaded_equals_file(const tsr_model *m, const tsr_tensor *t, const char *name) {
    tsr_gguf *g;
    ASSERT_OK(tsr_gguf_open(DATA "tiny_q3k.gguf", &g));
    const tsr_gguf_tensor *ft = tsr_gguf_tensor_find(g, name);
    ASSERT_TRUE(ft != NULL);
    float *want = tsr_malloc((size_t)ft->numel * 4), *got = tsr_malloc((size_t)t->cols * 4);
    ASSERT_OK(tsr_gguf_dequant(g, ft, TSR_F32, want));
    ASSERT_EQ_INT(t->rows * t->cols, ft->numel);
    for (int64_t r = 0; r < t->rows; r++) {
        tsr_qblocks_row_f32(t, r, got);
        if (memcmp(got, want + r * t->cols, (size_t)t->cols * 4))
            TSR_FAIL_("%s row %lld differs from the file's values", name, (long long)r);
    }
    tsr_free(want);
    tsr_free(got);
    tsr_gguf_close(g);
    (void)m;
}

/* A Q3_K_M-like mix: Q3_K (the embedding and the untied output too) and IQ4_NL. */
TSR_TEST(test_q3k_model) {
    tsr_model *m;
    ASSERT_OK(tsr_model_load(DATA "tiny_q3k.gguf", &m));
    qt_expect_dtypes(DATA "tiny_q3k.gguf", TSR_Q6_K, TSR_Q6_K, TSR_Q6_K, TSR_Q6_K, TSR_Q6_K,
                     TSR_Q8_0, TSR_Q8_0);
    loaded_equals_file(m, &m->tok_emb, "token_embd.weight");
    loaded_equals_file(m, &m->classifier, "output.weight");
    loaded_equals_file(m, &m->layers[0].wq, "blk.0.attn_q.weight");
    loaded_equals_file(m, &m->layers[0].wv, "blk.0.attn_v.weight");
    loaded_equals_file(m, &m->layers[0].w_down, "blk.0.ffn_down.weight");
    tsr_model_destroy(m);
    /* 8-bit activations against f32 ones on the same weight values (as test_quant_q6k):
     * measured 15 % of the logits' rms, top-1 16/16; a broken layout moves logits by their
     * whole size */
    qt_native_vs_expanded(DATA "tiny_q3k.gguf", "tiny Q3_K/IQ4_NL llama", 0.2);
}

TSR_TEST_MAIN(test_q3k_values, test_iq4nl_values, test_q3k_model)
