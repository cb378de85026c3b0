/* FP8 weights (runtime/model/fp8.h): the per-channel quantizer's codes and scales against
 * torch's (tests/data/fp8, tools/make_fp8_testdata.py), the compressed-tensors checkpoint
 * tests/data/fp8_synth (per-channel scales in layer 0, per-tensor in layer 1) read back as
 * the file holds it, slices (and the tensor-parallel cut), dequantization, the CPU's conversion to Q8_0, the config
 * checks, and `--dtype fp8` through the engine on the CPU (FP8, then Q8_0). The logits of
 * the checkpoint are checked by tests/unit/test_golden.c (test_fp8_synth). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/kv_dtype.h"
#include "runtime/exec/parallel.h"
#include "runtime/format/safetensors.h"
#include "runtime/model/fp8.h"
#include "runtime/model/model.h"
#include "tests/quant_test_util.h"
#include "tests/test.h"

#define FP8_DIR TSR_SOURCE_DIR "/tests/data/fp8/"
#define FP8_MODEL TSR_SOURCE_DIR "/tests/data/fp8_synth"

/* tsr_fp8_quantize_tensor equals torch's per-channel FP8 bit for bit (codes and scales). */
TSR_TEST(test_quantize_matches_torch) {
    size_t nx, nc, ns;
    float *x = read_all(FP8_DIR "quant_f32.bin", &nx);
    uint8_t *codes = read_all(FP8_DIR "quant_codes.bin", &nc);
    float *scales = read_all(FP8_DIR "quant_scales.bin", &ns);
    ASSERT_TRUE(x && codes && scales);
    int64_t rows = 16, cols = 96;
    ASSERT_TRUE(nx == (size_t)(rows * cols * 4) && nc == (size_t)(rows * cols) &&
                ns == (size_t)rows * 4);
    tsr_tensor src = {.dtype = TSR_F32, .rows = rows, .cols = cols, .data = x};
    tsr_tensor q = {.dtype = TSR_F8_E4M3, .rows = rows, .cols = cols};
    void *dst = tsr_malloc(tsr_tensor_bytes(&q));
    ASSERT_TRUE(dst != NULL);
    ASSERT_OK(tsr_fp8_quantize_tensor(&src, dst));
    q.data = dst;
    int bad = 0;
    for (int64_t i = 0; i < rows * cols; i++)
        if (((const uint8_t *)dst)[i] != codes[i] && bad++ < 5)
            fprintf(stderr, "  code %lld: %02x, torch %02x (x %g)\n", (long long)i,
                    ((const uint8_t *)dst)[i], codes[i], (double)x[i]);
    for (int64_t r = 0; r < rows; r++)
        if (memcmp(&tsr_fp8_scales(&q)[r], &scales[r], 4) != 0 && bad++ < 10)
            fprintf(stderr, "  scale %lld: %g, torch %g\n", (long long)r,
                    (double)tsr_fp8_scales(&q)[r], (double)scales[r]);
    ASSERT_EQ_INT(bad, 0);
    /* dequantized: within half an E4M3 step (2^-4 relative) of x, or of the subnormal step */
    float row[96];
    for (int64_t r = 0; r < rows; r++) {
        tsr_fp8_dequant_row(&q, r, row);
        float s = tsr_fp8_scales(&q)[r];
        for (int64_t c = 0; c < cols; c++) {
            float e = fabsf(row[c] - x[r * cols + c]);
            ASSERT_TRUE(e <= fabsf(x[r * cols + c]) / 16.0f + s * ldexpf(1.0f, -10));
        }
    }
    tsr_free(dst);
    free(x);
    free(codes);
    free(scales);
}

/* The checkpoint's matrices load as F8_E4M3 with the file's codes, and their scales per row:
 * layer 0 per channel (one per row), layer 1 per tensor (the same value in every row). */
TSR_TEST(test_checkpoint_layout) {
    tsr_model *m = NULL;
    ASSERT_OK(tsr_model_load(FP8_MODEL, &m));
    ASSERT_EQ_INT(m->cfg.dtype, TSR_F8_E4M3);
    ASSERT_TRUE(tsr_model_has_fp8(m));
    ASSERT_EQ_INT(m->tok_emb.dtype, TSR_BF16);
    ASSERT_EQ_INT(m->classifier.dtype, TSR_BF16);
    tsr_st_file *f = NULL;
    ASSERT_OK(tsr_st_open(FP8_MODEL "/model.safetensors", &f));
    const tsr_st_tensor *w0 = tsr_st_find(f, "model.layers.0.mlp.down_proj.weight");
    const tsr_st_tensor *s0 = tsr_st_find(f, "model.layers.0.mlp.down_proj.weight_scale");
    const tsr_st_tensor *s1 = tsr_st_find(f, "model.layers.1.self_attn.q_proj.weight_scale");
    ASSERT_TRUE(w0 && s0 && s1);
    const tsr_tensor *d0 = &m->layers[0].w_down, *q1 = &m->layers[1].wq;
    ASSERT_EQ_INT(d0->dtype, TSR_F8_E4M3);
    ASSERT_EQ_INT(d0->rows, w0->shape[0]);
    ASSERT_EQ_INT(d0->cols, w0->shape[1]);
    ASSERT_TRUE(memcmp(d0->data, w0->data, w0->nbytes) == 0);
    ASSERT_EQ_INT(s0->n_dims, 2);
    for (int64_t r = 0; r < d0->rows; r++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)s0->data + 2 * r, 2);
        ASSERT_TRUE(tsr_fp8_scales(d0)[r] == tsr_bf16_to_f32(h));
    }
    ASSERT_EQ_INT(s1->numel, 1);
    uint16_t h1;
    memcpy(&h1, s1->data, 2);
    for (int64_t r = 0; r < q1->rows; r++) ASSERT_TRUE(tsr_fp8_scales(q1)[r] == tsr_bf16_to_f32(h1));
    tsr_st_close(f);

    /* a slice keeps codes and scales of its rows and columns */
    tsr_tensor s = *d0;
    ASSERT_OK(tsr_fp8_slice(m, &s, 3, 40, 32, 96));
    float a[160], b[160];
    for (int64_t r = 0; r < s.rows; r++) {
        tsr_fp8_dequant_row(d0, r + 3, a);
        tsr_fp8_dequant_row(&s, r, b);
        ASSERT_TRUE(memcmp(a + 32, b, 64 * sizeof(float)) == 0);
    }
    /* dequantized to f32: exactly code * scale */
    tsr_tensor f32 = *q1;
    ASSERT_OK(tsr_fp8_dequantize(m, &f32, TSR_F32));
    for (int64_t r = 0; r < q1->rows; r += 7) {
        tsr_fp8_dequant_row(q1, r, a);
        ASSERT_TRUE(memcmp(a, (const float *)f32.data + r * q1->cols, (size_t)q1->cols * 4) == 0);
    }
    /* to Q8_0 where it fits (head_dim 16: o_proj stays f32), the rows GGUF's Q8_0 of the
     * dequantized FP8 rows */
    tsr_layer_weights before = m->layers[0];
    ASSERT_OK(tsr_model_fp8_to_q8(m, "test"));
    ASSERT_TRUE(!tsr_model_has_fp8(m));
    ASSERT_EQ_INT(m->cfg.dtype, TSR_Q8_0);
    ASSERT_EQ_INT(m->layers[0].wq.dtype, TSR_Q8_0);
    ASSERT_EQ_INT(m->layers[0].wo.dtype, TSR_F32);
    uint8_t blocks[5 * 34], back[5 * 34];
    for (int64_t r = 0; r < before.wq.rows; r++) {
        tsr_fp8_dequant_row(&before.wq, r, a);
        tsr_q8_quantize_blocks(a, before.wq.cols, blocks);
        tsr_q8_unpack_row(m->layers[0].wq.data, before.wq.cols, r, back);
        ASSERT_TRUE(memcmp(blocks, back, (size_t)(before.wq.cols / 32) * 34) == 0);
    }
    tsr_model_destroy(m);
}

/* The tensor-parallel cut of an FP8 checkpoint (runtime/exec/parallel.c): rank 1 of tp 2
 * holds its q rows and its wo / w_down columns, each row with the whole row's scale. */
TSR_TEST(test_tp_cut) {
    tsr_model *whole = NULL, *m = NULL;
    ASSERT_OK(tsr_model_load(FP8_MODEL, &whole));
    ASSERT_OK(tsr_model_load(FP8_MODEL, &m));
    tsr_parallel_layout lay;
    tsr_parallel_shard sh;
    ASSERT_OK(tsr_parallel_layout_init(2, 1, 2, &lay));
    ASSERT_OK(tsr_parallel_shard_of(&lay, &m->cfg, 1, "fp8_synth", &sh));
    ASSERT_OK(tsr_parallel_shard_model(m, &sh));
    int hd = m->cfg.head_dim;
    float a[160], b[160];
    for (int l = 0; l < 2; l++) {
        const tsr_layer_weights *w = &whole->layers[l], *s = &m->layers[l];
        ASSERT_EQ_INT(s->wq.dtype, TSR_F8_E4M3);
        ASSERT_EQ_INT(s->wq.rows, (int64_t)(sh.head_end - sh.head_begin) * hd);
        for (int64_t r = 0; r < s->wq.rows; r++) {
            tsr_fp8_dequant_row(&w->wq, sh.head_begin * hd + r, a);
            tsr_fp8_dequant_row(&s->wq, r, b);
            ASSERT_TRUE(memcmp(a, b, (size_t)s->wq.cols * 4) == 0);
        }
        ASSERT_EQ_INT(s->wo.cols, (int64_t)(sh.head_end - sh.head_begin) * hd);
        for (int64_t r = 0; r < s->wo.rows; r++) {
            tsr_fp8_dequant_row(&w->wo, r, a);
            tsr_fp8_dequant_row(&s->wo, r, b);
            ASSERT_TRUE(memcmp(a + sh.head_begin * hd, b, (size_t)s->wo.cols * 4) == 0);
        }
        ASSERT_EQ_INT(s->w_down.cols, sh.hidden_end - sh.hidden_begin);
        for (int64_t r = 0; r < s->w_down.rows; r++) {
            tsr_fp8_dequant_row(&w->w_down, r, a);
            tsr_fp8_dequant_row(&s->w_down, r, b);
            ASSERT_TRUE(memcmp(a + sh.hidden_begin, b, (size_t)s->w_down.cols * 4) == 0);
        }
    }
    tsr_model_destroy(m);
    tsr_model_destroy(whole);
}

/* Quantization configs tessera cannot read are refused with one line naming what. */
TSR_TEST(test_config_refusals) {
    static const char *bad[] = {
        "{\"quantization_config\":{\"quant_method\":\"gptq\"}}",
        "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
        "\"format\":\"pack-quantized\"}}",
        "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
        "\"format\":\"float-quantized\",\"config_groups\":{\"g\":{\"weights\":"
        "{\"num_bits\":4,\"type\":\"int\"}}}}}",
        "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
        "\"format\":\"float-quantized\",\"config_groups\":{\"g\":{\"weights\":"
        "{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"block\"}}}}}",
    };
    static const char *words[] = {"gptq", "pack-quantized", "4-bit int", "block"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *root = cJSON_Parse(bad[i]);
        ASSERT_TRUE(root != NULL);
        tsr_status st = tsr_fp8_check_config(root, "config.json");
        cJSON_Delete(root);
        ASSERT_EQ_INT(st, TSR_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(tsr_last_error(), words[i]);
    }
    cJSON *ok = cJSON_Parse("{\"quantization_config\":null}");
    ASSERT_OK(tsr_fp8_check_config(ok, "config.json"));
    cJSON_Delete(ok);
}

TSR_TEST_MAIN(test_quantize_matches_torch, test_checkpoint_layout, test_tp_cut, test_config_refusals)
