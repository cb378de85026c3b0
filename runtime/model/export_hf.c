/* Writes a model as a Hugging Face Llama directory: config.json + model.safetensors.
 *
 * Completion protocol: an existing config.json is removed first, both files are written
 * under temporary names and renamed, model.safetensors first and config.json last. Loaders
 * need config.json, so a directory that has one is complete; an interrupted export leaves
 * none (plus, at worst, a stale *.tmp file). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "kernels/cpu/quant_blocks.h"
#include "runtime/model/fp8.h"
#include "runtime/model/loader.h"
#include "runtime/format/safetensors.h"

/* mkdir -p. */
static tsr_status tsr__mkdirs(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return tsr_error_set(TSR_ERR_INVALID, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return tsr_error_set(TSR_ERR_IO, "%s: cannot create directory: %s", path,
                                 strerror(errno));
        *p = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return tsr_error_set(TSR_ERR_IO, "%s: exists and is not a directory", dir);
    return TSR_OK;
}

static const char *tsr__torch_dtype(tsr_dtype t) {
    switch (t) {
    case TSR_F32: return "float32";
    case TSR_F16: return "float16";
    case TSR_BF16: return "bfloat16";
    case TSR_U8: return "uint8";
    case TSR_Q8_0: /* exported dequantized */
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_Q4_K:
    case TSR_Q5_K:
    case TSR_Q6_K:
    case TSR_F8_E4M3:
    case TSR_MXFP4: break;
    }
    return "float32";
}

/* The shortest decimal that reads back as the same float, as a double: 1e-5f is written
 * "1e-05", not "9.99999974737875e-06". */
static double tsr__float_json(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

static tsr_status tsr__write_config(const tsr_model *m, const char *path, tsr_dtype dtype) {
    const tsr_model_config *c = &m->cfg;
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(r, "architectures");
    static const char *const cls[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                      "Qwen3ForCausalLM", "MistralForCausalLM"};
    static const char *const type[] = {"llama", "qwen2", "qwen3", "mistral"};
    int a = (int)c->arch >= 0 && (int)c->arch < 4 ? (int)c->arch : 0;
    cJSON_AddItemToArray(arch, cJSON_CreateString(cls[a]));
    cJSON_AddStringToObject(r, "model_type", type[a]);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddNumberToObject(r, "hidden_size", c->dim);
    cJSON_AddNumberToObject(r, "intermediate_size", c->hidden_dim);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(r, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_seq_len);
    cJSON_AddNumberToObject(r, "rms_norm_eps", tsr__float_json(c->norm_eps));
    cJSON_AddNumberToObject(r, "rope_theta", tsr__float_json(c->rope_theta));
    if (c->rope_scaling == TSR_ROPE_LLAMA3) {
        cJSON *rs = cJSON_AddObjectToObject(r, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", tsr__float_json(c->rope_factor));
        cJSON_AddNumberToObject(rs, "low_freq_factor", tsr__float_json(c->rope_low_freq_factor));
        cJSON_AddNumberToObject(rs, "high_freq_factor",
                                tsr__float_json(c->rope_high_freq_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                c->rope_original_max_pos);
    } else {
        cJSON_AddNullToObject(r, "rope_scaling");
    }
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tied_embeddings);
    cJSON_AddBoolToObject(r, "attention_bias", 0);
    cJSON_AddBoolToObject(r, "mlp_bias", 0);
    cJSON_AddNumberToObject(r, "pretraining_tp", 1);
    cJSON_AddNumberToObject(r, "initializer_range", 0.02);
    cJSON_AddBoolToObject(r, "use_cache", 1);
    cJSON_AddStringToObject(r, "torch_dtype", tsr__torch_dtype(dtype));
    if (c->bos_id >= 0)
        cJSON_AddNumberToObject(r, "bos_token_id", c->bos_id);
    else
        cJSON_AddNullToObject(r, "bos_token_id");
    if (c->n_eos_ids > 1) {
        cJSON *e = cJSON_AddArrayToObject(r, "eos_token_id");
        for (int i = 0; i < c->n_eos_ids; i++)
            cJSON_AddItemToArray(e, cJSON_CreateNumber(c->eos_ids[i]));
    } else if (c->eos_id >= 0) {
        cJSON_AddNumberToObject(r, "eos_token_id", c->eos_id);
    } else {
        cJSON_AddNullToObject(r, "eos_token_id");
    }
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory building JSON", path);
    tsr_status st = TSR_OK;
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    } else {
        size_t len = strlen(text);
        bool ok = fwrite(text, 1, len, fp) == len && fputc('\n', fp) != EOF && fflush(fp) == 0 &&
                  fsync(fileno(fp)) == 0;
        if (fclose(fp) != 0) ok = false;
        if (!ok) {
            st = tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", path, strerror(errno));
            remove(path);
        }
    }
    cJSON_free(text);
    return st;
}

typedef struct tsr__export_item {
    char name[96];
    const tsr_tensor *t;
    bool vector;
    int rope_heads; /* > 0: permute rows from interleaved to half-rotation, per head */
} tsr__export_item;

/* Row `r` of the exported tensor comes from source row tsr__src_row(r). HF's
 * convert_llama_weights_to_hf.py permute() maps interleaved pair rows (2i, 2i+1) of each
 * head to rows (i, i + hd/2); this is its inverse lookup. */
static int64_t tsr__src_row(const tsr__export_item *it, int64_t r) {
    if (it->rope_heads <= 0) return r;
    int64_t hd = it->t->rows / it->rope_heads, half = hd / 2;
    int64_t head = r / hd, j = r % hd;
    return head * hd + (j < half ? 2 * j : 2 * (j - half) + 1);
}

static tsr_status tsr__write_weights(const tsr__export_item *items, int n, const char *path,
                                     tsr_dtype dtype) {
    tsr_st_entry *entries = tsr_calloc((size_t)n, sizeof *entries);
    if (!entries) return TSR_ERR_NOMEM;
    int64_t max_cols = 1;
    for (int i = 0; i < n; i++) {
        entries[i].name = items[i].name;
        entries[i].dtype = dtype;
        if (items[i].vector) {
            entries[i].n_dims = 1;
            entries[i].shape[0] = items[i].t->cols;
        } else {
            entries[i].n_dims = 2;
            entries[i].shape[0] = items[i].t->rows;
            entries[i].shape[1] = items[i].t->cols;
        }
        if (items[i].t->cols > max_cols) max_cols = items[i].t->cols;
    }
    tsr_st_writer *w = NULL;
    tsr_status st = tsr_st_writer_open(path, entries, n, &w);
    tsr_free(entries);
    if (st != TSR_OK) return st;
    float *f32 = tsr_malloc((size_t)max_cols * 4);
    void *row = tsr_malloc((size_t)max_cols * 4);
    if (!f32 || !row) {
        st = TSR_ERR_NOMEM;
        goto done;
    }
    size_t osz = tsr_dtype_size(dtype);
    for (int i = 0; i < n && st == TSR_OK; i++) {
        const tsr_tensor *t = items[i].t;
        for (int64_t r = 0; r < t->rows && st == TSR_OK; r++) {
            size_t cols = (size_t)t->cols;
            bool blocks = tsr_qblocks_is(t->dtype) || t->dtype == TSR_F8_E4M3;
            if (t->dtype == TSR_F8_E4M3) /* code * scale */
                tsr_fp8_dequant_row(t, tsr__src_row(&items[i], r), f32);
            else if (blocks) /* rows of the repacked groups, dequantized */
                tsr_qblocks_row_f32(t, tsr__src_row(&items[i], r), f32);
            const void *src = blocks ? (const void *)f32
                                     : tsr_tensor_row(t, tsr__src_row(&items[i], r));
            if (t->dtype == dtype) {
                st = tsr_st_writer_write(w, src, cols * osz);
                continue;
            }
            if (!blocks) tsr_dtype_to_f32(t->dtype, src, f32, cols);
            if (dtype == TSR_F32) {
                st = tsr_st_writer_write(w, f32, cols * 4);
                continue;
            }
            uint16_t *h = row;
            for (size_t j = 0; j < cols; j++)
                h[j] = dtype == TSR_BF16 ? tsr_f32_to_bf16(f32[j]) : tsr_f32_to_f16(f32[j]);
            st = tsr_st_writer_write(w, h, cols * 2);
        }
    }
done:
    tsr_free(f32);
    tsr_free(row);
    if (st != TSR_OK) {
        tsr_st_writer_abort(w);
        return st;
    }
    return tsr_st_writer_close(w);
}

tsr_status tsr_export_hf(const tsr_model *m, const char *dir, tsr_dtype dtype) {
    const tsr_model_config *c = &m->cfg;
    if ((int)dtype < TSR_F32 || (int)dtype > TSR_BF16)
        return tsr_error_set(TSR_ERR_INVALID, "%s: invalid export dtype", dir);
    if (c->arch == TSR_ARCH_GPT_OSS)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: exporting GPT-OSS models is not "
                             "supported", dir);
    TSR_TRY(tsr__mkdirs(dir));
    char cfg_path[4200], cfg_tmp[4220], st_path[4200], st_tmp[4220];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(cfg_tmp, sizeof cfg_tmp, "%s.tmp", cfg_path);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    snprintf(st_tmp, sizeof st_tmp, "%s.tmp", st_path);
    if (remove(cfg_path) != 0 && errno != ENOENT)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot replace: %s", cfg_path, strerror(errno));
    /* A sharded index left by an earlier export would shadow nothing (model.safetensors is
     * preferred) but would be stale; remove it too. */
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    remove(idx);

    int n = 3 + 14 * c->n_layers;
    tsr__export_item *items = tsr_calloc((size_t)n, sizeof *items);
    if (!items) return TSR_ERR_NOMEM;
    int k = 0;
#define TSR__ITEM(tensor, vec, heads, ...)                                                 \
    do {                                                                                 \
        snprintf(items[k].name, sizeof items[k].name, __VA_ARGS__);                      \
        items[k].t = (tensor);                                                           \
        items[k].vector = (vec);                                                         \
        items[k].rope_heads = (heads);                                                   \
        k++;                                                                             \
    } while (0)
    TSR__ITEM(&m->tok_emb, false, 0, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        int qh = c->rope_interleaved ? c->n_heads : 0, kh = c->rope_interleaved ? c->n_kv_heads : 0;
        TSR__ITEM(&w->attn_norm, true, 0, "model.layers.%d.input_layernorm.weight", l);
        TSR__ITEM(&w->wq, false, qh, "model.layers.%d.self_attn.q_proj.weight", l);
        TSR__ITEM(&w->wk, false, kh, "model.layers.%d.self_attn.k_proj.weight", l);
        TSR__ITEM(&w->wv, false, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        TSR__ITEM(&w->wo, false, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        TSR__ITEM(&w->ffn_norm, true, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        TSR__ITEM(&w->w_gate, false, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        TSR__ITEM(&w->w_up, false, 0, "model.layers.%d.mlp.up_proj.weight", l);
        TSR__ITEM(&w->w_down, false, 0, "model.layers.%d.mlp.down_proj.weight", l);
        if (c->qkv_bias) { /* Qwen2 */
            TSR__ITEM(&w->bq, true, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            TSR__ITEM(&w->bk, true, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            TSR__ITEM(&w->bv, true, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->qk_norm) { /* Qwen3 */
            TSR__ITEM(&w->q_norm, true, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            TSR__ITEM(&w->k_norm, true, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
    }
    TSR__ITEM(&m->out_norm, true, 0, "model.norm.weight");
    if (!c->tied_embeddings) TSR__ITEM(&m->classifier, false, 0, "lm_head.weight");
#undef TSR__ITEM

    tsr_status st = TSR_OK;
    for (int i = 0; i < k; i++) {
        if (!items[i].t->data) {
            st = tsr_error_set(TSR_ERR_INVALID, "%s: cannot export, tensor %s is missing",
                               m->source, items[i].name);
            goto done;
        }
    }
    TSR_TRY_GOTO(tsr__write_weights(items, k, st_tmp, dtype), st, done);
    if (rename(st_tmp, st_path) != 0) {
        st = tsr_error_set(TSR_ERR_IO, "%s: rename failed: %s", st_path, strerror(errno));
        remove(st_tmp);
        goto done;
    }
    TSR_TRY_GOTO(tsr__write_config(m, cfg_tmp, dtype), st, done);
    if (rename(cfg_tmp, cfg_path) != 0) {
        st = tsr_error_set(TSR_ERR_IO, "%s: rename failed: %s", cfg_path, strerror(errno));
        remove(cfg_tmp);
    }
done:
    tsr_free(items);
    return st;
}
