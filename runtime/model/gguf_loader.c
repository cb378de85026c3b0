/* GGUF model files (llama.cpp's format): the architecture's metadata keys give the config, the
 * tensors are copied at load into model-owned memory, so the file is closed afterwards. Q8_0,
 * Q4_0, Q4_1, Q4_K, Q5_K and Q6_K matrices stay in their blocks (repacked for the CPU
 * kernels, kernels/cpu/quant_q8.h, quant_q4.h, quant_q4k.h, quant_q5k.h and quant_q6k.h;
 * Q5_0 and Q5_1, the K-quant files' type for widths not a multiple of 256, as Q5_K; Q3_K
 * as Q6_K and IQ4_NL as Q8_0, the same values in more bits)
 * where the forward can run them (runtime/model/quantize.h; Q4_K where its 256-column
 * super-blocks never cross a reduction part, tsr__q4k_eligible, else rewritten as Q4_1 per
 * 32-column sub-block; Q5_K and Q6_K in 32-column blocks wherever Q8_0 runs); where not,
 * they are dequantized to f32 (bf16 for large models), and runtime/format/gguf.h refuses the
 * types it does not read (Q2_K, IQ4_XS, the other IQ types, ...) by name. TSR_GGUF_DEQUANT=1
 * in the environment dequantizes the 3- to 6-bit matrices (and such a file's Q8_0 ones) too,
 * the way every quantized type was loaded before those had kernels (for comparisons).
 *
 * Rotary layout: llama.cpp's converter permutes the rows of attn_q/attn_k of `llama` models
 * inside each head so that HF's half rotation (x[i], x[i + hd/2]) becomes a rotation of
 * adjacent pairs (x[2i], x[2i+1]). Tessera's rope has both conventions, so such files run
 * with rope_interleaved = true on the rows as stored (q.k is unchanged by the same per-head
 * permutation of q and k rows). qwen2/qwen3 files are not permuted (llama.cpp's NEOX rope). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/model/config.h"
#include "runtime/format/gguf.h"
#include "runtime/model/loader.h"
#include "runtime/model/quantize.h"
#include "base/log.h"
#include "kernels/cpu/quant_q4.h"
#include "kernels/cpu/quant_q4k.h"
#include "kernels/cpu/quant_q5k.h"
#include "kernels/cpu/quant_q6k.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/rope_freq.h"

/* Weights above this many f32 bytes are dequantized to bf16 instead (memory). */
#define TSR__F32_LIMIT ((int64_t)8 << 30)

typedef struct tsr__ggctx {
    tsr_gguf *g;
    const char *arch;
    char key[160];
    bool q8_native; /* most matrix weights are Q8_0: those stay Q8_0 (tsr__load) */
    bool native;    /* Q4_0/Q4_1/Q4_K/Q5_K/Q6_K (and Q8_0) matrices stay in their blocks */
    int64_t n4[5];  /* elements loaded as Q4_0, Q4_1, Q4_K, Q6_K, Q5_K (Q5_0/Q5_1 too) */
    int n4k_q41;      /* Q4_K matrices run as Q4_1 (tsr__q4k_eligible false) */
    int n4k_expanded; /* ... and dequantized (a scale past fp16's range) */
    int n5_01;        /* Q5_0/Q5_1 matrices run as Q5_K (quant_q5k.h: the same values) */
    int n_q3k;        /* Q3_K matrices run as Q6_K (quant_q6k.h: the same values) */
    int n_iq4nl;      /* IQ4_NL matrices run as Q8_0 (the same values) */
    int64_t n_mat;  /* elements of all matrices in the file */
} tsr__ggctx;

static const char *tsr__k(tsr__ggctx *x, const char *suffix) {
    snprintf(x->key, sizeof x->key, "%s.%s", x->arch, suffix);
    return x->key;
}

/* Integer key into an int (range checked); required when present == NULL. */
static tsr_status tsr__int(tsr__ggctx *x, const char *suffix, int *out, bool *present) {
    int64_t v;
    bool have = false;
    const char *key = tsr__k(x, suffix);
    TSR_TRY(tsr_gguf_get_int(x->g, key, &v, present ? &have : NULL));
    if (present) *present = have;
    if (present && !have) return TSR_OK;
    if (v < 0 || v > (1 << 30))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: metadata %s = %lld is out of range",
                             x->g->path, key, (long long)v);
    *out = (int)v;
    return TSR_OK;
}

static tsr_status tsr__float(tsr__ggctx *x, const char *suffix, float *out) {
    double v;
    bool have;
    TSR_TRY(tsr_gguf_get_float(x->g, tsr__k(x, suffix), &v, &have));
    if (have) *out = (float)v;
    return TSR_OK;
}

/* Llama 3 rope scaling as llama.cpp stores it: rope_freqs.weight holds per frequency the
 * divisor of the unscaled one. The parameters are recovered: factor is the last
 * (lowest-frequency) divisor, the original context rope.scaling.original_context_length
 * (8192 when absent), the low/high frequency factors Llama 3.1's 1 and 4; the tensor must
 * equal the divisors those give (1e-4 relative), else the file is refused. All ones: no
 * scaling. */
static tsr_status tsr__rope_freqs(tsr__ggctx *x, tsr_model_config *c, const tsr_gguf_tensor *t) {
    int half = c->head_dim / 2, orig = 8192;
    float got[512], base[512], want[512];
    if (t->type != TSR_GGML_F32 || t->n_dims != 1 || t->ne[0] != half || half < 1 || half > 512)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: rope_freqs.weight is not %d f32 values",
                             x->g->path, half);
    memcpy(got, t->data, (size_t)half * 4);
    bool have, ones = true;
    TSR_TRY(tsr__int(x, "rope.scaling.original_context_length", &orig, &have));
    for (int j = 0; j < half; j++) ones &= got[j] == 1.0f;
    if (ones) return TSR_OK;
    tsr_model_config s = *c;
    s.rope_scaling = TSR_ROPE_NONE;
    tsr_rope_inv_freq(&s, base);
    s.rope_scaling = TSR_ROPE_LLAMA3;
    s.rope_factor = got[half - 1];
    s.rope_low_freq_factor = 1.0f;
    s.rope_high_freq_factor = 4.0f;
    s.rope_original_max_pos = orig;
    bool ok = s.rope_factor > 1.0f && orig > 0;
    if (ok) tsr_rope_inv_freq(&s, want);
    for (int j = 0; ok && j < half; j++) {
        float d = base[j] / want[j];
        ok = fabsf(d - got[j]) <= 1e-4f * d;
    }
    if (!ok)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: rope_freqs.weight is not Llama 3 rope scaling with low/high "
                             "frequency factors 1 and 4 and original context %d (other "
                             "per-frequency factors are not supported)", x->g->path, orig);
    c->rope_scaling = TSR_ROPE_LLAMA3;
    c->rope_factor = s.rope_factor;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_pos = orig;
    return TSR_OK;
}

static tsr_status tsr__config(tsr__ggctx *x, tsr_model_config *c) {
    tsr_gguf *g = x->g;
    bool have;
    memset(c, 0, sizeof *c);
    TSR_TRY(tsr_gguf_get_str(g, "general.architecture", &x->arch, NULL));
    bool llama = !strcmp(x->arch, "llama"), qwen2 = !strcmp(x->arch, "qwen2"),
         qwen3 = !strcmp(x->arch, "qwen3");
    if (!llama && !qwen2 && !qwen3)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: unsupported architecture \"%.64s\" (tessera reads llama, "
                             "qwen2 and qwen3 GGUF files)", g->path, x->arch);
    c->arch = qwen2 ? TSR_ARCH_QWEN2 : qwen3 ? TSR_ARCH_QWEN3 : TSR_ARCH_LLAMA;
    TSR_TRY(tsr__int(x, "embedding_length", &c->dim, NULL));
    TSR_TRY(tsr__int(x, "feed_forward_length", &c->hidden_dim, NULL));
    TSR_TRY(tsr__int(x, "block_count", &c->n_layers, NULL));
    TSR_TRY(tsr__int(x, "attention.head_count", &c->n_heads, NULL));
    TSR_TRY(tsr__int(x, "attention.head_count_kv", &c->n_kv_heads, &have));
    TSR_TRY(tsr__int(x, "attention.key_length", &c->head_dim, &have));
    int vlen = 0;
    TSR_TRY(tsr__int(x, "attention.value_length", &vlen, &have));
    TSR_TRY(tsr__int(x, "context_length", &c->max_seq_len, NULL));
    c->norm_eps = 1e-5f;
    TSR_TRY(tsr__float(x, "attention.layer_norm_rms_epsilon", &c->norm_eps));
    c->rope_theta = 10000.0f;
    TSR_TRY(tsr__float(x, "rope.freq_base", &c->rope_theta));
    tsr_config_defaults(c);
    if (have && vlen != c->head_dim)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: value head size %d differs from key head size %d", g->path,
                             vlen, c->head_dim);
    int rope_dims = c->head_dim;
    TSR_TRY(tsr__int(x, "rope.dimension_count", &rope_dims, &have));
    if (rope_dims != c->head_dim)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: partial rotary embedding (%d of %d dimensions) is not "
                             "supported", g->path, rope_dims, c->head_dim);
    const char *scaling = NULL;
    TSR_TRY(tsr_gguf_get_str(g, tsr__k(x, "rope.scaling.type"), &scaling, &have));
    float factor = 1.0f;
    TSR_TRY(tsr__float(x, "rope.scaling.factor", &factor));
    if (scaling && strcmp(scaling, "none") != 0 && factor != 1.0f)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: rope scaling \"%.32s\" (factor %g) is not supported",
                             g->path, scaling, (double)factor);
    /* Llama 3.1-style scaling is stored as per-frequency factors in a tensor. */
    const tsr_gguf_tensor *rf = tsr_gguf_tensor_find(g, "rope_freqs.weight");
    if (rf) TSR_TRY(tsr__rope_freqs(x, c, rf));
    c->rope_interleaved = llama;
    /* llama.cpp's qwen2 has q/k/v biases and qwen3 per-head q/k norms; either may show up
     * in a file of the other family's name, so the tensors decide. An o-projection bias
     * (some llama-named conversions) is refused rather than dropped. */
    c->qkv_bias = tsr_gguf_tensor_find(g, "blk.0.attn_q.bias") != NULL;
    c->qk_norm = tsr_gguf_tensor_find(g, "blk.0.attn_q_norm.weight") != NULL;
    if (llama && (c->qkv_bias || c->qk_norm))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: a llama file with q/k/v biases or q/k norms (their order "
                             "under llama.cpp's rotary row permutation is not defined)", g->path);
    if (tsr_gguf_tensor_find(g, "blk.0.attn_output.bias"))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: blk.0.attn_output.bias (an output projection bias) is not "
                             "supported", g->path);
    /* A sliding window is honoured exactly by bounding the context to it. */
    int window = 0;
    TSR_TRY(tsr__int(x, "attention.sliding_window", &window, &have));
    if (have && window > 0 && window < c->max_seq_len) c->max_seq_len = window;
    const tsr_gguf_tensor *emb = tsr_gguf_tensor_find(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: missing 2-D tensor token_embd.weight",
                             g->path);
    if (emb->ne[1] > (1 << 24))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid vocab size %lld", g->path,
                             (long long)emb->ne[1]);
    c->vocab_size = (int)emb->ne[1];
    c->tied_embeddings = tsr_gguf_tensor_find(g, "output.weight") == NULL;
    int64_t v;
    c->bos_id = c->eos_id = -1;
    TSR_TRY(tsr_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v, &have));
    if (have && v >= 0 && v < c->vocab_size) c->bos_id = (int)v;
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < sizeof eos_keys / sizeof eos_keys[0]; i++) {
        TSR_TRY(tsr_gguf_get_int(g, eos_keys[i], &v, &have));
        if (!have || v < 0 || v >= c->vocab_size) continue;
        bool dup = false;
        for (int k = 0; k < c->n_eos_ids; k++) dup |= c->eos_ids[k] == v;
        if (!dup) c->eos_ids[c->n_eos_ids++] = (int)v;
    }
    if (c->n_eos_ids) c->eos_id = c->eos_ids[0];
    TSR_TRY(tsr_config_validate(c, g->path));
    /* One dtype for every matrix: float files keep theirs, quantized ones become f32 (bf16
     * past TSR__F32_LIMIT). Counted over all tensors; norms are f32 regardless. */
    int64_t per[3] = {0, 0, 0}, quant = 0, q8 = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tsr_gguf_tensor *t = &g->tensors[i];
        if (t->n_dims < 2) continue;
        if (t->type == TSR_GGML_F32) per[TSR_F32] += t->numel;
        else if (t->type == TSR_GGML_F16) per[TSR_F16] += t->numel;
        else if (t->type == TSR_GGML_BF16) per[TSR_BF16] += t->numel;
        else quant += t->numel;
        if (t->type == TSR_GGML_Q8_0) q8 += t->numel;
    }
    /* A Q8_0 file keeps its blocks; so does a file of 4-bit types (its Q8_0 embedding too),
     * unless TSR_GGUF_DEQUANT=1 asks for the expansion. */
    x->q8_native = 2 * q8 > quant + per[0] + per[1] + per[2];
    x->n_mat = quant + per[0] + per[1] + per[2];
    const char *dq = getenv("TSR_GGUF_DEQUANT");
    x->native = !(dq && !strcmp(dq, "1"));
    c->dtype = TSR_F32;
    if (quant >= per[0] && quant >= per[1] && quant >= per[2]) {
        if (tsr_config_param_count(c) * 4 > TSR__F32_LIMIT) c->dtype = TSR_BF16;
    } else {
        for (int d = 1; d < 3; d++)
            if (per[d] > per[c->dtype]) c->dtype = (tsr_dtype)d;
    }
    return TSR_OK;
}

/* Whether a Q4_K matrix `which` (tsr_model_q8_eligible's names) stays Q4_K: its columns
 * whole 256-value super-blocks, and for the row-parallel wo and w_down every reduction part
 * of runtime/exec/parallel.h too (query heads: head_dim % 256 == 0; hidden chunks, whole
 * 32-column units split evenly over n_heads: hidden_dim % (256 * n_heads) == 0), so that
 * every tp cuts the matrix and the activations on super-block boundaries and computes the
 * same products. A config property, never tp's, like tsr_model_q8_eligible. */
static bool tsr__q4k_eligible(const tsr_model_config *c, const char *which, int64_t cols) {
    if (cols <= 0 || cols % TSR_Q4K_BLOCK) return false;
    if (!strcmp(which, "wo")) return c->head_dim % TSR_Q4K_BLOCK == 0;
    if (!strcmp(which, "w_down"))
        return c->n_heads > 0 && c->hidden_dim % (TSR_Q4K_BLOCK * c->n_heads) == 0;
    return true;
}

/* Tensor t (`name`; ne = {cols, rows}, or {cols} for a vector) into dst, repacked or
 * dequantized into model memory. */
static tsr_status tsr__load_tensor(tsr_model *m, tsr__ggctx *x, const tsr_gguf_tensor *t,
                                   const char *name, int64_t rows, int64_t cols, bool vector,
                                   tsr_tensor *dst) {
    bool ok = vector ? (t->n_dims == 1 && t->ne[0] == cols)
                     : (t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == rows);
    if (!ok)
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: tensor %s has shape [%lld, %lld] (ggml order), expected "
                             "[%lld, %lld]", x->g->path, name, (long long)t->ne[0],
                             (long long)t->ne[1], (long long)cols, (long long)(vector ? 1 : rows));
    /* Q8_0, Q4_0 and Q4_1 matrices stay in their blocks, repacked, where the forward can run
     * them (runtime/model/quantize.h: the same 32-column conditions); the others are
     * dequantized. */
    const char *which = strstr(name, "attn_output") ? "wo" : strstr(name, "ffn_down") ? "w_down"
                                                                                    : name;
    bool eligible = !vector && tsr_model_q8_eligible(&m->cfg, which, cols);
    if (eligible && x->native && (t->type == TSR_GGML_Q4_0 || t->type == TSR_GGML_Q4_1)) {
        tsr_dtype qt = t->type == TSR_GGML_Q4_0 ? TSR_Q4_0 : TSR_Q4_1;
        tsr_tensor q = {.dtype = qt, .rows = rows, .cols = cols};
        void *pk;
        if (t->nbytes < (uint64_t)(rows * (cols / TSR_Q4_BLOCK)) * tsr_q4_block_bytes(qt))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
        tsr_q4_pack_gguf(qt, t->data, rows, cols, pk);
        q.data = pk;
        *dst = q;
        x->n4[qt == TSR_Q4_1] += rows * cols;
        return TSR_OK;
    }
    if (eligible && x->native && t->type == TSR_GGML_Q4_K) {
        size_t nb = (size_t)(cols / TSR_Q4K_BLOCK);
        if (t->nbytes < (uint64_t)rows * nb * TSR_Q4K_BLOCK_BYTES)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        if (tsr__q4k_eligible(&m->cfg, which, cols)) {
            tsr_tensor q = {.dtype = TSR_Q4_K, .rows = rows, .cols = cols};
            void *pk;
            TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
            tsr_q4k_pack_gguf(t->data, rows, cols, pk);
            q.data = pk;
            *dst = q;
            x->n4[2] += rows * cols;
            return TSR_OK;
        }
        /* Q4_1 of the sub-blocks (tsr_q4k_to_q4_1: fp16 d * sc and dmin * m), whose
         * 32-column blocks every reduction part keeps whole, rather than f32 */
        size_t rb = (size_t)(cols / TSR_Q4_BLOCK) * tsr_q4_block_bytes(TSR_Q4_1);
        uint8_t *b41 = tsr_malloc((size_t)rows * rb);
        if (!b41) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory converting %s",
                                       x->g->path, name);
        bool fits = true;
        for (int64_t r = 0; r < rows && fits; r++)
            fits = tsr_q4k_to_q4_1(
                (const uint8_t *)t->data + (size_t)r * nb * TSR_Q4K_BLOCK_BYTES, cols,
                b41 + (size_t)r * rb);
        if (fits) {
            tsr_tensor q = {.dtype = TSR_Q4_1, .rows = rows, .cols = cols};
            void *pk;
            tsr_status st = tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk);
            if (st == TSR_OK) tsr_q4_pack_gguf(TSR_Q4_1, b41, rows, cols, pk);
            tsr_free(b41);
            TSR_TRY(st);
            q.data = pk;
            *dst = q;
            x->n4[2] += rows * cols;
            x->n4k_q41++;
            return TSR_OK;
        }
        tsr_free(b41);
        x->n4k_expanded++;
    }
    if (eligible && x->native && (t->type == TSR_GGML_Q6_K || t->type == TSR_GGML_Q5_K) &&
        cols % TSR_Q6K_GGUF_BLOCK == 0) {
        bool q6 = t->type == TSR_GGML_Q6_K;
        if (t->nbytes < (uint64_t)rows * (uint64_t)(cols / TSR_Q6K_GGUF_BLOCK) *
                            (q6 ? TSR_Q6K_GGUF_BLOCK_BYTES : TSR_Q5K_GGUF_BLOCK_BYTES))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        tsr_tensor q = {.dtype = q6 ? TSR_Q6_K : TSR_Q5_K, .rows = rows, .cols = cols};
        void *pk;
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
        if (q6) tsr_q6k_pack_gguf(t->data, rows, cols, pk);
        else tsr_q5k_pack_gguf(t->data, rows, cols, pk);
        q.data = pk;
        *dst = q;
        x->n4[q6 ? 3 : 4] += rows * cols;
        return TSR_OK;
    }
    if (eligible && x->native && (t->type == TSR_GGML_Q5_0 || t->type == TSR_GGML_Q5_1)) {
        bool q51 = t->type == TSR_GGML_Q5_1;
        if (t->nbytes < (uint64_t)rows * (uint64_t)(cols / TSR_Q5K_BLOCK) *
                            (q51 ? TSR_Q5_1_BLOCK_BYTES : TSR_Q5_0_BLOCK_BYTES))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        tsr_tensor q = {.dtype = TSR_Q5_K, .rows = rows, .cols = cols};
        void *pk;
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
        tsr_q5k_pack_q5(t->data, q51, rows, cols, pk);
        q.data = pk;
        *dst = q;
        x->n4[4] += rows * cols;
        x->n5_01++;
        return TSR_OK;
    }
    if (eligible && x->native && t->type == TSR_GGML_Q3_K && cols % TSR_Q6K_GGUF_BLOCK == 0) {
        if (t->nbytes < (uint64_t)rows * (uint64_t)(cols / TSR_Q6K_GGUF_BLOCK) *
                            TSR_Q3K_GGUF_BLOCK_BYTES)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        tsr_tensor q = {.dtype = TSR_Q6_K, .rows = rows, .cols = cols};
        void *pk;
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
        tsr_q6k_pack_q3k(t->data, rows, cols, pk);
        q.data = pk;
        *dst = q;
        x->n4[3] += rows * cols;
        x->n_q3k++;
        return TSR_OK;
    }
    if (eligible && x->native && t->type == TSR_GGML_IQ4_NL) {
        /* d * value[code], value an int8: a Q8_0 block of the same values */
        size_t nb = (size_t)(cols / TSR_Q8_BLOCK);
        if (t->nbytes < (uint64_t)rows * nb * 18)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        tsr_tensor q = {.dtype = TSR_Q8_0, .rows = rows, .cols = cols};
        void *pk;
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
        uint8_t *row = tsr_malloc(nb * TSR_Q8_BLOCK_BYTES);
        if (!row) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory converting %s",
                                       x->g->path, name);
        tsr_q8_pack_init(pk, rows, cols);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * nb * 18;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *s = src + 18 * b;
                uint8_t *o = row + TSR_Q8_BLOCK_BYTES * b;
                o[0] = s[0];
                o[1] = s[1];
                for (int j = 0; j < 16; j++) {
                    o[2 + j] = (uint8_t)tsr_iq4nl_values[s[2 + j] & 15];
                    o[18 + j] = (uint8_t)tsr_iq4nl_values[s[2 + j] >> 4];
                }
            }
            tsr_q8_pack_row(pk, cols, r, row);
        }
        tsr_free(row);
        q.data = pk;
        *dst = q;
        x->n_iq4nl++;
        return TSR_OK;
    }
    if (eligible && (x->q8_native || x->native) && t->type == TSR_GGML_Q8_0) {
        tsr_tensor q = {.dtype = TSR_Q8_0, .rows = rows, .cols = cols};
        void *pk;
        if (t->nbytes < (uint64_t)(rows * (cols / TSR_Q8_BLOCK)) * TSR_Q8_BLOCK_BYTES)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s is short", x->g->path, name);
        TSR_TRY(tsr_model_alloc(m, tsr_tensor_bytes(&q), &pk));
        tsr_q8_pack_gguf(t->data, rows, cols, pk);
        q.data = pk;
        *dst = q;
        return TSR_OK;
    }
    tsr_dtype dt = vector ? TSR_F32 : m->cfg.dtype;
    /* a Q8_0 file's 16-bit matrices (where --dtype q8_0 keeps BF16: tessera convert writes
     * them so) stay 16-bit: the weights --dtype q8_0 computes with, half of f32's bytes */
    if (!vector && x->q8_native && (t->type == TSR_GGML_BF16 || t->type == TSR_GGML_F16))
        dt = t->type == TSR_GGML_BF16 ? TSR_BF16 : TSR_F16;
    void *buf;
    TSR_TRY(tsr_model_alloc(m, (size_t)t->numel * tsr_dtype_size(dt), &buf));
    TSR_TRY(tsr_gguf_dequant(x->g, t, dt, buf));
    *dst = (tsr_tensor){.dtype = dt, .rows = vector ? 1 : rows, .cols = cols, .data = buf};
    return TSR_OK;
}

/* Tensor `name` into dst (tsr__load_tensor); then the mapped file's pages of it go back,
 * so the file and its copy in model memory are not resident together (peak RSS); they come
 * back from the file if it is read again. */
static tsr_status tsr__load(tsr_model *m, tsr__ggctx *x, const char *name, int64_t rows,
                            int64_t cols, bool vector, tsr_tensor *dst) {
    const tsr_gguf_tensor *t = tsr_gguf_tensor_find(x->g, name);
    if (!t) return tsr_error_set(TSR_ERR_FORMAT, "%s: missing tensor %s", x->g->path, name);
    TSR_TRY(tsr__load_tensor(m, x, t, name, rows, cols, vector, dst));
    if (x->g->mapped) tsr_pages_drop(t->data, (size_t)t->nbytes);
    return TSR_OK;
}

static tsr_status tsr__weights(tsr_model *m, tsr__ggctx *x) {
    const tsr_model_config *c = &m->cfg;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    TSR_TRY(tsr__load(m, x, "token_embd.weight", c->vocab_size, c->dim, false, &m->tok_emb));
    if (c->tied_embeddings)
        m->classifier = m->tok_emb;
    else
        TSR_TRY(tsr__load(m, x, "output.weight", c->vocab_size, c->dim, false, &m->classifier));
    TSR_TRY(tsr__load(m, x, "output_norm.weight", 1, c->dim, true, &m->out_norm));
    int64_t sizes[4] = {c->dim, q, kv, c->hidden_dim};
    static const struct {
        const char *name;
        size_t off;
        int rows, cols; /* 0 dim, 1 q, 2 kv, 3 hidden; rows -1: a norm vector */
    } spec[] = {
        {"attn_norm", offsetof(tsr_layer_weights, attn_norm), -1, 0},
        {"ffn_norm", offsetof(tsr_layer_weights, ffn_norm), -1, 0},
        {"attn_q", offsetof(tsr_layer_weights, wq), 1, 0},
        {"attn_k", offsetof(tsr_layer_weights, wk), 2, 0},
        {"attn_v", offsetof(tsr_layer_weights, wv), 2, 0},
        {"attn_output", offsetof(tsr_layer_weights, wo), 0, 1},
        {"ffn_gate", offsetof(tsr_layer_weights, w_gate), 3, 0},
        {"ffn_up", offsetof(tsr_layer_weights, w_up), 3, 0},
        {"ffn_down", offsetof(tsr_layer_weights, w_down), 0, 3},
    };
    char name[96];
    for (int l = 0; l < c->n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, spec[i].name);
            tsr_tensor *dst = (tsr_tensor *)((char *)w + spec[i].off);
            bool vec = spec[i].rows < 0;
            TSR_TRY(tsr__load(m, x, name, vec ? 1 : sizes[spec[i].rows], sizes[spec[i].cols],
                              vec, dst));
        }
        if (c->qkv_bias) {
            const char *proj[3] = {"q", "k", "v"};
            tsr_tensor *b[3] = {&w->bq, &w->bk, &w->bv};
            for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof name, "blk.%d.attn_%s.bias", l, proj[i]);
                TSR_TRY(tsr__load(m, x, name, 1, i ? kv : q, true, b[i]));
            }
        }
        if (c->qk_norm) {
            snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", l);
            TSR_TRY(tsr__load(m, x, name, 1, c->head_dim, true, &w->q_norm));
            snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", l);
            TSR_TRY(tsr__load(m, x, name, 1, c->head_dim, true, &w->k_norm));
        }
    }
    return TSR_OK;
}

tsr_status tsr_loader_gguf(const char *path, tsr_model **out) {
    *out = NULL;
    tsr__ggctx x = {0};
    TSR_TRY(tsr_gguf_open(path, &x.g));
    tsr_model_config cfg;
    tsr_model *m = NULL;
    tsr_status st = tsr__config(&x, &cfg);
    if (st == TSR_OK) st = tsr_model_create(path, &cfg, &m);
    if (st == TSR_OK) {
        int64_t ft;
        bool have = false;
        /* for messages only: a malformed value is ignored */
        const char *ftn = tsr_gguf_get_int(x.g, "general.file_type", &ft, &have) == TSR_OK &&
                                  have ? tsr_gguf_file_type_name(ft) : NULL;
        if (ftn) snprintf(m->file_type, sizeof m->file_type, "%s", ftn);
    }
    if (st == TSR_OK) st = tsr__weights(m, &x);
    /* named as most of its matrices are stored (else the dtype the others expand to) */
    if (st == TSR_OK && x.q8_native) m->cfg.dtype = TSR_Q8_0;
    else if (st == TSR_OK && 2 * (x.n4[0] + x.n4[1] + x.n4[2] + x.n4[3] + x.n4[4]) > x.n_mat) {
        /* the type of most of them; of a tie the first in this order */
        const int order[5] = {1, 0, 2, 3, 4};
        const tsr_dtype types[5] = {TSR_Q4_0, TSR_Q4_1, TSR_Q4_K, TSR_Q6_K, TSR_Q5_K};
        int most = order[0];
        for (int k = 1; k < 5; k++) most = x.n4[order[k]] > x.n4[most] ? order[k] : most;
        m->cfg.dtype = types[most];
    }
    if (st == TSR_OK && (x.n4k_q41 || x.n4k_expanded))
        TSR_LOG_INFO("%s: %d Q4_K matri%s run as Q4_1 (fp16 d * scale and dmin * min per 32 "
                     "columns) and %d dequantized to %s: their 256-column super-blocks would "
                     "cross the reduction parts of wo (head_dim %d) or w_down (hidden %d over "
                     "%d heads)", path, x.n4k_q41, x.n4k_q41 == 1 ? "x" : "ces", x.n4k_expanded,
                     tsr_dtype_name(cfg.dtype), cfg.head_dim, cfg.hidden_dim, cfg.n_heads);
    if (st == TSR_OK && (x.n_q3k || x.n_iq4nl))
        TSR_LOG_INFO("%s: %d Q3_K matri%s run in Q6_K's blocks and %d IQ4_NL in Q8_0's (the "
                     "same values; 7 and 8.5 bits a weight against the file's 3.44 and 4.5: "
                     "tessera has no kernels of their own for them)", path, x.n_q3k,
                     x.n_q3k == 1 ? "x" : "ces", x.n_iq4nl);
    if (st == TSR_OK && x.n5_01)
        TSR_LOG_INFO("%s: %d Q5_0/Q5_1 matri%s run in Q5_K's 32-column blocks (the same "
                     "values: scale 1, min 16 d or the block's min)", path, x.n5_01,
                     x.n5_01 == 1 ? "x" : "ces");
    tsr_gguf_close(x.g);
    if (st != TSR_OK) {
        tsr_model_destroy(m);
        return st;
    }
    *out = m;
    return TSR_OK;
}
