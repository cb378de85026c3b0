/* Hugging Face directories (Llama, Mistral, Qwen2, Qwen3): config.json (cJSON) and safetensors weights, single file or
 * sharded through model.safetensors.index.json. Matrices stay views into the mmaps; norm
 * vectors are converted to f32 copies. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/file.h"
#include "runtime/model/config.h"
#include "runtime/model/fp8.h"
#include "runtime/model/loader.h"
#include "runtime/format/safetensors.h"


static tsr_status tsr__read_json(const char *path, cJSON **out) {
    char *text;
    *out = NULL;
    TSR_TRY(tsr_file_read(path, "JSON file", (size_t)1 << 30, &text, NULL));
    cJSON *root = cJSON_Parse(text);
    tsr_free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid JSON (expected an object)", path);
    }
    *out = root;
    return TSR_OK;
}

/* ---- config.json ----------------------------------------------------------------------- */

/* Integer field: absent -> *present = false; not an in-range integer -> format error. */
static tsr_status tsr__json_int(const cJSON *obj, const char *key, const char *path,
                                const char *prefix, int *out, bool *present) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *present = v && !cJSON_IsNull(v);
    if (!*present) return TSR_OK;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d) || d < -2147483648.0 || d > 2147483647.0)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: field %s%s is not an integer", path, prefix,
                             key);
    *out = (int)d;
    return TSR_OK;
}

static tsr_status tsr__json_req_int(const cJSON *obj, const char *key, const char *path,
                                    const char *prefix, int *out) {
    bool present;
    TSR_TRY(tsr__json_int(obj, key, path, prefix, out, &present));
    if (!present)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: missing required field %s%s", path, prefix,
                             key);
    return TSR_OK;
}

static tsr_status tsr__json_float(const cJSON *obj, const char *key, const char *path,
                                  const char *prefix, float *out, bool required) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: missing required field %s%s", path,
                                 prefix, key);
        return TSR_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: field %s%s is not a number", path, prefix,
                             key);
    *out = (float)v->valuedouble;
    return TSR_OK;
}

/* The family from "architectures" (first match) or else "model_type"; *what names what was
 * found for the refusal when nothing matches. */
static bool tsr__arch(const cJSON *root, tsr_arch *arch, const char **what) {
    static const struct {
        const char *cls, *type;
        tsr_arch arch;
    } known[] = {{"LlamaForCausalLM", "llama", TSR_ARCH_LLAMA},
                 {"Qwen2ForCausalLM", "qwen2", TSR_ARCH_QWEN2},
                 {"Qwen3ForCausalLM", "qwen3", TSR_ARCH_QWEN3},
                 {"MistralForCausalLM", "mistral", TSR_ARCH_MISTRAL},
                 {"GptOssForCausalLM", "gpt_oss", TSR_ARCH_GPT_OSS}};
    const size_t n = sizeof known / sizeof known[0];
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    *what = NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, archs) {
        if (!cJSON_IsString(a)) continue;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(a->valuestring, known[i].cls)) {
                *arch = known[i].arch;
                return true;
            }
        if (!*what) *what = a->valuestring;
    }
    if (cJSON_IsString(mt)) {
        for (size_t i = 0; i < n; i++)
            if (!strcmp(mt->valuestring, known[i].type)) {
                *arch = known[i].arch;
                return true;
            }
        if (!*what) *what = mt->valuestring;
    }
    if (!*what) *what = "(none given)";
    return false;
}

/* What the families add to Llama's computation, and what tessera refuses: biases beyond
 * Qwen2's q/k/v (o_proj, MLP) and a sliding window shorter than the context. A window is
 * honoured exactly by bounding the context to it (every key a query may see lies inside
 * the window then). */
/* GPT-OSS: q/k/v/o biases, sinks, sliding layers (config.layer_types, default: even layers
 * sliding), experts and their gate, MXFP4 as the only quantization. Both spellings of the
 * keys: 5.x num_local_experts / num_experts_per_tok, 4.x num_experts / experts_per_token. */
static tsr_status tsr__gpt_oss_features(const cJSON *root, const char *path,
                                        tsr_model_config *c) {
    bool present;
    c->qkv_bias = c->o_bias = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(root,
                                                                              "attention_bias"));
    c->attn_sinks = true;
    TSR_TRY(tsr__json_int(root, "num_local_experts", path, "", &c->n_experts, &present));
    if (!present) TSR_TRY(tsr__json_req_int(root, "num_experts", path, "", &c->n_experts));
    TSR_TRY(tsr__json_int(root, "num_experts_per_tok", path, "", &c->n_experts_used, &present));
    if (!present)
        TSR_TRY(tsr__json_req_int(root, "experts_per_token", path, "", &c->n_experts_used));
    if (c->n_experts <= 0 || c->n_experts > 4096 || c->n_experts_used <= 0 ||
        c->n_experts_used > c->n_experts || c->n_experts_used > 64)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid experts: %d, %d per token", path,
                             c->n_experts, c->n_experts_used);
    c->swiglu_limit = 7.0f;
    c->swiglu_alpha = 1.702f;
    TSR_TRY(tsr__json_float(root, "swiglu_limit", path, "", &c->swiglu_limit, false));
    TSR_TRY(tsr__json_float(root, "swiglu_alpha", path, "", &c->swiglu_alpha, false));
    TSR_TRY(tsr__json_int(root, "sliding_window", path, "", &c->sliding_window, &present));
    if (!present) c->sliding_window = 0;
    if (c->sliding_window < 0)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid sliding_window %d", path,
                             c->sliding_window);
    if (c->n_layers > 1024)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: %d layers (at most 1024)", path, c->n_layers);
    memset(c->sliding_layers, 0, sizeof c->sliding_layers);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (cJSON_IsArray(types)) {
        if (cJSON_GetArraySize(types) != c->n_layers)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: layer_types has %d entries for %d layers",
                                 path, cJSON_GetArraySize(types), c->n_layers);
        int l = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, types) {
            bool sw = cJSON_IsString(t) && !strcmp(t->valuestring, "sliding_attention");
            if (!sw && !(cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")))
                return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: layer_types[%d] is not "
                                     "sliding_attention or full_attention", path, l);
            if (sw) c->sliding_layers[l / 64] |= (uint64_t)1 << (l % 64);
            l++;
        }
    } else {
        for (int l = 0; l < c->n_layers; l += 2) c->sliding_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        const cJSON *qm = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
        if (!cJSON_IsString(qm) || strcmp(qm->valuestring, "mxfp4") != 0)
            return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: quantization_config.quant_method "
                                 "\"%.32s\" is not supported (tessera reads mxfp4)", path,
                                 cJSON_IsString(qm) ? qm->valuestring : "(none)");
    }
    return TSR_OK;
}

static tsr_status tsr__arch_features(const cJSON *root, const char *path, tsr_model_config *c) {
    if (c->arch == TSR_ARCH_GPT_OSS) return tsr__gpt_oss_features(root, path, c);
    TSR_TRY(tsr_fp8_check_config(root, path)); /* compressed-tensors FP8 (runtime/model/fp8.h) */
    c->qkv_bias = c->arch == TSR_ARCH_QWEN2;
    c->qk_norm = c->arch == TSR_ARCH_QWEN3;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias")))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: attention_bias (biases on q/k/v/o projections) is not "
                             "supported", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "mlp_bias")))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: mlp_bias is not supported", path);
    bool windowed = false;
    if (c->arch == TSR_ARCH_MISTRAL) {
        windowed = true; /* MistralForCausalLM applies sliding_window whenever it is set */
    } else if (c->arch == TSR_ARCH_QWEN2 || c->arch == TSR_ARCH_QWEN3) {
        windowed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window"));
        const cJSON *lt, *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
        cJSON_ArrayForEach(lt, types) windowed |= cJSON_IsString(lt) &&
                                                  !strcmp(lt->valuestring, "sliding_attention");
    }
    if (!windowed) return TSR_OK;
    int window = 0;
    bool present;
    TSR_TRY(tsr__json_int(root, "sliding_window", path, "", &window, &present));
    if (!present) return TSR_OK;
    if (window <= 0)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid sliding_window %d", path, window);
    if (window < c->max_seq_len) c->max_seq_len = window;
    return TSR_OK;
}

/* YaRN as transformers 5.25 reads it: factor and original_max_position_embeddings required
 * (GPT-OSS 4.x files may give initial_context_length at the top level instead), beta_fast 32
 * and beta_slow 1 by default, truncate true by default, attention_factor given or
 * 0.1 * ln(factor) + 1 (with mscale / mscale_all_dim: their ratio of that form). */
static tsr_status tsr__parse_yarn(const cJSON *rs, const char *path, tsr_model_config *c) {
    const char *pre = "rope_scaling.";
    c->rope_scaling = TSR_ROPE_YARN;
    TSR_TRY(tsr__json_float(rs, "factor", path, pre, &c->rope_factor, true));
    bool present;
    TSR_TRY(tsr__json_int(rs, "original_max_position_embeddings", path, pre,
                          &c->rope_original_max_pos, &present));
    if (!present && c->rope_original_max_pos <= 0)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: missing required field "
                             "rope_scaling.original_max_position_embeddings", path);
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    TSR_TRY(tsr__json_float(rs, "beta_fast", path, pre, &c->rope_beta_fast, false));
    TSR_TRY(tsr__json_float(rs, "beta_slow", path, pre, &c->rope_beta_slow, false));
    c->rope_truncate = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(rs, "truncate"));
    float af = -1.0f, ms = 0.0f, msa = 0.0f;
    TSR_TRY(tsr__json_float(rs, "attention_factor", path, pre, &af, false));
    TSR_TRY(tsr__json_float(rs, "mscale", path, pre, &ms, false));
    TSR_TRY(tsr__json_float(rs, "mscale_all_dim", path, pre, &msa, false));
    if (!(c->rope_factor > 0.0f) || !(c->rope_beta_fast > 0.0f) || !(c->rope_beta_slow > 0.0f) ||
        c->rope_original_max_pos <= 0)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid yarn rope_scaling parameters (factor "
                             "%g, beta_fast %g, beta_slow %g, original_max_position_embeddings "
                             "%d)", path, (double)c->rope_factor, (double)c->rope_beta_fast,
                             (double)c->rope_beta_slow, c->rope_original_max_pos);
    double f = (double)c->rope_factor;
    if (af > 0.0f) {
        c->rope_attn_factor = af;
    } else if (ms != 0.0f && msa != 0.0f && f > 1.0) {
        c->rope_attn_factor = (float)((0.1 * ms * log(f) + 1.0) / (0.1 * msa * log(f) + 1.0));
    } else {
        c->rope_attn_factor = f > 1.0 ? (float)(0.1 * log(f) + 1.0) : 1.0f;
    }
    return TSR_OK;
}

static tsr_status tsr__parse_rope_scaling(const cJSON *rs, bool params, const char *path,
                                          tsr_model_config *c) {
    if (!rs || cJSON_IsNull(rs)) return TSR_OK;
    if (!cJSON_IsObject(rs))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: rope_scaling is not an object", path);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(type)) {
        if (params) return TSR_OK; /* rope_parameters may hold only rope_theta */
        return tsr_error_set(TSR_ERR_FORMAT, "%s: rope_scaling has no rope_type", path);
    }
    if (!strcmp(type->valuestring, "default")) return TSR_OK;
    if (!strcmp(type->valuestring, "yarn")) return tsr__parse_yarn(rs, path, c);
    if (strcmp(type->valuestring, "llama3") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: unsupported rope_scaling type \"%.32s\" (tessera supports "
                             "llama3 and yarn)",
                             path, type->valuestring);
    c->rope_scaling = TSR_ROPE_LLAMA3;
    TSR_TRY(tsr__json_float(rs, "factor", path, "rope_scaling.", &c->rope_factor, true));
    TSR_TRY(tsr__json_float(rs, "low_freq_factor", path, "rope_scaling.",
                            &c->rope_low_freq_factor, true));
    TSR_TRY(tsr__json_float(rs, "high_freq_factor", path, "rope_scaling.",
                            &c->rope_high_freq_factor, true));
    return tsr__json_req_int(rs, "original_max_position_embeddings", path, "rope_scaling.",
                             &c->rope_original_max_pos);
}

static tsr_status tsr__config_from_json(const cJSON *root, const char *path,
                                        tsr_model_config *c) {
    const char *arch;
    if (!tsr__arch(root, &c->arch, &arch))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: unsupported architecture %.64s (tessera supports "
                             "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                             "Qwen3ForCausalLM, GptOssForCausalLM)",
                             path, arch);
    bool present;
    TSR_TRY(tsr__json_req_int(root, "hidden_size", path, "", &c->dim));
    TSR_TRY(tsr__json_req_int(root, "intermediate_size", path, "", &c->hidden_dim));
    TSR_TRY(tsr__json_req_int(root, "num_hidden_layers", path, "", &c->n_layers));
    TSR_TRY(tsr__json_req_int(root, "num_attention_heads", path, "", &c->n_heads));
    TSR_TRY(tsr__json_req_int(root, "vocab_size", path, "", &c->vocab_size));
    TSR_TRY(tsr__json_req_int(root, "max_position_embeddings", path, "", &c->max_seq_len));
    TSR_TRY(tsr__json_int(root, "num_key_value_heads", path, "", &c->n_kv_heads, &present));
    if (!present) c->n_kv_heads = c->n_heads;
    TSR_TRY(tsr__json_int(root, "head_dim", path, "", &c->head_dim, &present));
    TSR_TRY(tsr__arch_features(root, path, c));
    /* HF LlamaConfig defaults: eps 1e-6, theta 10000. */
    c->norm_eps = 1e-6f;
    TSR_TRY(tsr__json_float(root, "rms_norm_eps", path, "", &c->norm_eps, false));
    c->rope_theta = 10000.0f;
    TSR_TRY(tsr__json_float(root, "rope_theta", path, "", &c->rope_theta, false));
    /* transformers >= 5 writes "rope_parameters" (rope_type, rope_theta, scaling fields)
     * instead of "rope_scaling" + top-level "rope_theta"; accept both spellings. */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    bool params = false;
    if ((!rs || cJSON_IsNull(rs)) && cJSON_IsObject(rp)) {
        rs = rp;
        params = true;
        if (!cJSON_GetObjectItemCaseSensitive(root, "rope_theta"))
            TSR_TRY(tsr__json_float(rp, "rope_theta", path, "rope_parameters.", &c->rope_theta,
                                    false));
    }
    TSR_TRY(tsr__json_int(root, "initial_context_length", path, "", &c->rope_original_max_pos,
                          &present));
    TSR_TRY(tsr__parse_rope_scaling(rs, params, path, c));
    c->rope_interleaved = false;

    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    c->tied_embeddings = cJSON_IsTrue(tie);

    /* The file's own dtype wins when weights are loaded; this is what synthetic models use. */
    c->dtype = TSR_F32;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (cJSON_IsString(dt)) {
        int d = tsr_dtype_parse(dt->valuestring);
        if (d >= 0) c->dtype = (tsr_dtype)d;
    }

    c->bos_id = -1;
    TSR_TRY(tsr__json_int(root, "bos_token_id", path, "", &c->bos_id, &present));
    if (!present) c->bos_id = -1;
    c->eos_id = -1;
    c->n_eos_ids = 0;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
                e->valuedouble < 0 || e->valuedouble > 2147483647.0)
                return tsr_error_set(TSR_ERR_FORMAT, "%s: eos_token_id has a non-integer entry",
                                     path);
            if (c->n_eos_ids < (int)(sizeof c->eos_ids / sizeof c->eos_ids[0]))
                c->eos_ids[c->n_eos_ids++] = (int)e->valuedouble;
        }
        if (c->n_eos_ids) c->eos_id = c->eos_ids[0];
    } else {
        TSR_TRY(tsr__json_int(root, "eos_token_id", path, "", &c->eos_id, &present));
        if (present) {
            c->eos_ids[0] = c->eos_id;
            c->n_eos_ids = 1;
        } else {
            c->eos_id = -1;
        }
    }
    /* GPT-OSS with the o200k_harmony vocabulary: generation stops at <|return|> (200002)
     * and <|call|> (200012), the harmony format's two stop tokens, whatever config.json
     * lists (the real file names only 200002) */
    static const int harmony_stops[2] = {200002, 200012};
    for (int i = 0; c->arch == TSR_ARCH_GPT_OSS && c->vocab_size > 200012 && i < 2; i++) {
        bool have = false;
        for (int j = 0; j < c->n_eos_ids; j++) have |= c->eos_ids[j] == harmony_stops[i];
        if (!have && c->n_eos_ids < (int)(sizeof c->eos_ids / sizeof c->eos_ids[0]))
            c->eos_ids[c->n_eos_ids++] = harmony_stops[i];
        if (c->eos_id < 0) c->eos_id = c->eos_ids[0];
    }
    return TSR_OK;
}

tsr_status tsr_config_from_hf_json(const char *path, tsr_model_config *out) {
    tsr_model_config c;
    memset(&c, 0, sizeof c);
    cJSON *root;
    TSR_TRY(tsr__read_json(path, &root));
    tsr_status st = tsr__config_from_json(root, path, &c);
    cJSON_Delete(root);
    if (st != TSR_OK) return st;
    tsr_config_defaults(&c);
    TSR_TRY(tsr_config_validate(&c, path));
    *out = c;
    return TSR_OK;
}

/* ---- weights --------------------------------------------------------------------------- */

typedef struct tsr__hf_src {
    const char *dir;
    char single_path[4096]; /* model.safetensors, or the index when sharded */
    bool sharded;
    cJSON *weight_map;      /* name -> shard file name (owned by index_root) */
    cJSON *index_root;
    int n_files;
    tsr_st_file **files;
    char **file_names;      /* shard file names (index spelling) */
} tsr__hf_src;

/* A matrix found in a file, before dtype unification. */
typedef struct tsr__hf_mat {
    tsr_tensor *dst;
    const tsr_st_tensor *src;
    const char *file;
} tsr__hf_mat;

static void tsr__hf_src_free(tsr__hf_src *s) {
    for (int i = 0; i < s->n_files; i++) {
        tsr_st_close(s->files[i]);
        if (s->file_names) tsr_free(s->file_names[i]);
    }
    tsr_free(s->files);
    tsr_free(s->file_names);
    cJSON_Delete(s->index_root);
}

/* Opens a file and moves its mapping into the model at once, so that the model's destroy is
 * the only cleanup path for maps. */
static tsr_status tsr__hf_open_file(tsr__hf_src *s, tsr_model *m, const char *path,
                                    const char *name) {
    tsr_st_file *f;
    TSR_TRY(tsr_st_open(path, &f));
    void *addr;
    size_t len;
    tsr_st_take_map(f, &addr, &len);
    tsr_status st = tsr_model_own_mmap(m, addr, len);
    if (st != TSR_OK) {
        f->owns_map = true;
        tsr_st_close(f);
        return st;
    }
    s->files[s->n_files] = f;
    s->file_names[s->n_files] = tsr_strdup(name);
    s->n_files++;
    return s->file_names[s->n_files - 1] ? TSR_OK : TSR_ERR_NOMEM;
}

static tsr_status tsr__hf_open(tsr__hf_src *s, tsr_model *m) {
    char path[4096];
    struct stat sb;
    snprintf(s->single_path, sizeof s->single_path, "%s/model.safetensors", s->dir);
    if (stat(s->single_path, &sb) == 0) {
        s->files = tsr_calloc(1, sizeof *s->files);
        s->file_names = tsr_calloc(1, sizeof *s->file_names);
        if (!s->files || !s->file_names) return TSR_ERR_NOMEM;
        return tsr__hf_open_file(s, m, s->single_path, "model.safetensors");
    }
    snprintf(s->single_path, sizeof s->single_path, "%s/model.safetensors.index.json", s->dir);
    if (stat(s->single_path, &sb) != 0)
        return tsr_error_set(TSR_ERR_IO,
                             "%s: no model.safetensors or model.safetensors.index.json", s->dir);
    s->sharded = true;
    TSR_TRY(tsr__read_json(s->single_path, &s->index_root));
    s->weight_map = cJSON_GetObjectItemCaseSensitive(s->index_root, "weight_map");
    if (!cJSON_IsObject(s->weight_map))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: no weight_map object", s->single_path);
    int n = cJSON_GetArraySize(s->weight_map);
    s->files = tsr_calloc((size_t)(n ? n : 1), sizeof *s->files);
    s->file_names = tsr_calloc((size_t)(n ? n : 1), sizeof *s->file_names);
    if (!s->files || !s->file_names) return TSR_ERR_NOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, s->weight_map) {
        if (!cJSON_IsString(e))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: weight_map entry %s is not a file name",
                                 s->single_path, e->string);
        const char *shard = e->valuestring;
        bool seen = false;
        for (int i = 0; i < s->n_files && !seen; i++) seen = !strcmp(s->file_names[i], shard);
        if (seen) continue;
        /* Shards are plain names next to the index; refuse paths that leave the folder. */
        if (!*shard || shard[0] == '/' || strstr(shard, ".."))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid shard name \"%.64s\"",
                                 s->single_path, shard);
        snprintf(path, sizeof path, "%s/%s", s->dir, shard);
        TSR_TRY(tsr__hf_open_file(s, m, path, shard));
    }
    return TSR_OK;
}

/* Finds `name` whatever its dtype; *file is the path to blame in messages. NULL tensor +
 * error when missing and required. */
static tsr_status tsr__hf_locate(const tsr__hf_src *s, const char *name, bool required,
                                 const tsr_st_tensor **out, const char **file) {
    *out = NULL;
    *file = s->single_path;
    if (!s->sharded) {
        *out = tsr_st_find(s->files[0], name);
        *file = s->files[0]->path;
    } else {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(s->weight_map, name);
        if (cJSON_IsString(e)) {
            for (int i = 0; i < s->n_files; i++) {
                if (strcmp(s->file_names[i], e->valuestring) != 0) continue;
                *file = s->files[i]->path;
                *out = tsr_st_find(s->files[i], name);
                if (!*out && required)
                    return tsr_error_set(TSR_ERR_FORMAT,
                                         "%s: missing tensor %s (the index lists it there)",
                                         *file, name);
            }
        }
    }
    if (!*out && required)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: missing tensor %s", *file, name);
    return TSR_OK;
}

/* tsr__hf_locate for a float tensor (F32, F16, BF16). */
static tsr_status tsr__hf_find(const tsr__hf_src *s, const char *name, bool required,
                               const tsr_st_tensor **out, const char **file) {
    TSR_TRY(tsr__hf_locate(s, name, required, out, file));
    if (*out && !(*out)->supported)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: tensor %s has dtype %s (tessera supports F32, F16, BF16)",
                             *file, name, (*out)->st_dtype);
    return TSR_OK;
}

static tsr_status tsr__hf_shape(const char *file, const tsr_st_tensor *t, int64_t rows,
                                int64_t cols, bool vector) {
    bool ok = vector ? (t->n_dims == 1 && t->shape[0] == cols)
                     : (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (ok) return TSR_OK;
    char got[96] = "";
    size_t len = 0;
    for (int i = 0; i < t->n_dims && len < sizeof got - 24; i++)
        len += (size_t)snprintf(got + len, sizeof got - len, "%s%lld", i ? ", " : "",
                                (long long)t->shape[i]);
    if (vector)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has shape [%s], expected [%lld]",
                             file, t->name, got, (long long)cols);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has shape [%s], expected [%lld, %lld]",
                         file, t->name, got, (long long)rows, (long long)cols);
}

/* A vector of `width` floats (norm weights, biases), as an f32 copy. */
static tsr_status tsr__hf_vector_n(tsr_model *m, const tsr__hf_src *s, const char *name,
                                   int64_t width, tsr_tensor *dst) {
    const tsr_st_tensor *t;
    const char *file;
    TSR_TRY(tsr__hf_find(s, name, true, &t, &file));
    TSR_TRY(tsr__hf_shape(file, t, 1, width, true));
    float *buf;
    TSR_TRY(tsr_model_alloc(m, (size_t)width * sizeof(float), (void **)&buf));
    /* memcpy-based conversion: the view may be unaligned. */
    if (t->dtype == TSR_F32) {
        memcpy(buf, t->data, (size_t)width * 4);
    } else {
        const uint8_t *p = t->data;
        for (int64_t i = 0; i < width; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * (size_t)i, 2);
            buf[i] = t->dtype == TSR_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
        }
    }
    *dst = (tsr_tensor){.dtype = TSR_F32, .rows = 1, .cols = width, .data = buf};
    return TSR_OK;
}

static tsr_status tsr__hf_vector(tsr_model *m, const tsr__hf_src *s, const char *name,
                                 tsr_tensor *dst) {
    return tsr__hf_vector_n(m, s, name, m->cfg.dim, dst);
}

/* Converts one element of src (dtype a) to dtype b at dst (both may be unaligned). */
static void tsr__convert(tsr_dtype a, const void *src, tsr_dtype b, void *dst, size_t n) {
    const uint8_t *s = src;
    uint8_t *d = dst;
    size_t sa = tsr_dtype_size(a), sb = tsr_dtype_size(b);
    for (size_t i = 0; i < n; i++) {
        float f;
        if (a == TSR_F32) {
            memcpy(&f, s + i * sa, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + i * sa, 2);
            f = a == TSR_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
        }
        if (b == TSR_F32) {
            memcpy(d + i * sb, &f, 4);
        } else {
            uint16_t h = b == TSR_BF16 ? tsr_f32_to_bf16(f) : tsr_f32_to_f16(f);
            memcpy(d + i * sb, &h, 2);
        }
    }
}

/* Points dst at the view, or at an aligned copy in `dtype` when the file's dtype differs or
 * its offset is misaligned for the element type. */
static tsr_status tsr__hf_bind(tsr_model *m, const tsr__hf_mat *mm, tsr_dtype dtype) {
    const tsr_st_tensor *t = mm->src;
    size_t esz = tsr_dtype_size(t->dtype);
    tsr_tensor *dst = mm->dst;
    dst->dtype = dtype;
    dst->rows = t->shape[0];
    dst->cols = t->shape[1];
    if (t->dtype == dtype && ((uintptr_t)t->data % esz) == 0) {
        dst->data = t->data;
        return TSR_OK;
    }
    void *buf;
    TSR_TRY(tsr_model_alloc(m, (size_t)t->numel * tsr_dtype_size(dtype), &buf));
    if (t->dtype == dtype)
        memcpy(buf, t->data, t->nbytes);
    else
        tsr__convert(t->dtype, t->data, dtype, buf, (size_t)t->numel);
    dst->data = buf;
    return TSR_OK;
}

/* f32 value i of a float tensor (the view may be unaligned). */
static float tsr__hf_elem(const tsr_st_tensor *t, size_t i) {
    float f;
    tsr__convert(t->dtype, (const uint8_t *)t->data + i * tsr_dtype_size(t->dtype), TSR_F32, &f,
                 1);
    return f;
}

static tsr_status tsr__hf_dims(const char *file, const tsr_st_tensor *t, int n,
                               const int64_t *want) {
    bool ok = t->n_dims == n;
    for (int i = 0; ok && i < n; i++) ok = t->shape[i] == want[i];
    if (ok) return TSR_OK;
    char got[96] = "", exp[96] = "";
    size_t a = 0, b = 0;
    for (int i = 0; i < t->n_dims && a < sizeof got - 24; i++)
        a += (size_t)snprintf(got + a, sizeof got - a, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    for (int i = 0; i < n && b < sizeof exp - 24; i++)
        b += (size_t)snprintf(exp + b, sizeof exp - b, "%s%lld", i ? ", " : "",
                              (long long)want[i]);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has shape [%s], expected [%s]", file,
                         t->name, got, exp);
}

/* GPT-OSS experts `model.layers.L.mlp.experts.NAME`: n experts of [rows, cols] (out, in).
 * MXFP4 files: NAME_blocks U8 [E, rows, cols/32, 16] and NAME_scales U8 [E, rows, cols/32],
 * viewed as they are (4-bit in memory; the kernel decodes). Float files (save_pretrained):
 * NAME [E, cols, rows], i.e. [in, out], transposed here per expert into [E * rows, cols] in
 * the file's dtype. NAME_bias [E, rows] becomes f32. */
static tsr_status tsr__hf_experts(tsr_model *m, const tsr__hf_src *s, int l, const char *nm,
                                  int64_t rows, int64_t cols, tsr_experts *x) {
    const int64_t E = m->cfg.n_experts;
    char name[192];
    const tsr_st_tensor *t, *sc;
    const char *file;
    *x = (tsr_experts){.n = (int)E, .rows = rows, .cols = cols};
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s_blocks", l, nm);
    TSR_TRY(tsr__hf_locate(s, name, false, &t, &file));
    if (t) {
        if (cols % 32)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: MXFP4 experts need inputs in blocks of "
                                 "32 (%s has %lld)", file, name, (long long)cols);
        int64_t wb[4] = {E, rows, cols / 32, 16}, ws[3] = {E, rows, cols / 32};
        TSR_TRY(tsr__hf_dims(file, t, 4, wb));
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s_scales", l, nm);
        TSR_TRY(tsr__hf_locate(s, name, true, &sc, &file));
        TSR_TRY(tsr__hf_dims(file, sc, 3, ws));
        if (strcmp(t->st_dtype, "U8") || strcmp(sc->st_dtype, "U8"))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: MXFP4 blocks and scales of %s must be "
                                 "U8 (they are %s and %s)", file, nm, t->st_dtype,
                                 sc->st_dtype);
        x->mxfp4 = 1;
        x->w = (tsr_tensor){.dtype = TSR_U8, .rows = E * rows, .cols = cols / 2, .data = t->data};
        x->scales = (tsr_tensor){.dtype = TSR_U8, .rows = E * rows, .cols = cols / 32,
                                 .data = sc->data};
    } else {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, nm);
        TSR_TRY(tsr__hf_find(s, name, true, &t, &file));
        int64_t want[3] = {E, cols, rows};
        TSR_TRY(tsr__hf_dims(file, t, 3, want));
        size_t esz = tsr_dtype_size(t->dtype);
        uint8_t *buf;
        TSR_TRY(tsr_model_alloc(m, (size_t)t->nbytes, (void **)&buf));
        const uint8_t *src = t->data;
        for (int64_t e = 0; e < E; e++)
            for (int64_t i = 0; i < cols; i++)
                for (int64_t o = 0; o < rows; o++)
                    memcpy(buf + (size_t)((e * rows + o) * cols + i) * esz,
                           src + (size_t)((e * cols + i) * rows + o) * esz, esz);
        x->w = (tsr_tensor){.dtype = t->dtype, .rows = E * rows, .cols = cols, .data = buf};
    }
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s_bias", l, nm);
    TSR_TRY(tsr__hf_find(s, name, true, &t, &file));
    int64_t wbias[2] = {E, rows};
    TSR_TRY(tsr__hf_dims(file, t, 2, wbias));
    float *b;
    TSR_TRY(tsr_model_alloc(m, (size_t)(E * rows) * sizeof(float), (void **)&b));
    for (int64_t i = 0; i < E * rows; i++) b[i] = tsr__hf_elem(t, (size_t)i);
    x->bias = (tsr_tensor){.dtype = TSR_F32, .rows = E, .cols = rows, .data = b};
    return TSR_OK;
}

/* GPT-OSS's attention and router extras of layer l (besides q/k/v biases). */
static tsr_status tsr__hf_gpt_oss_layer(tsr_model *m, const tsr__hf_src *s, int l,
                                        tsr_layer_weights *w) {
    const tsr_model_config *c = &m->cfg;
    char name[160];
    if (c->o_bias) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.bias", l);
        TSR_TRY(tsr__hf_vector_n(m, s, name, c->dim, &w->bo));
    }
    if (c->attn_sinks) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.sinks", l);
        TSR_TRY(tsr__hf_vector_n(m, s, name, c->n_heads, &w->sinks));
    }
    snprintf(name, sizeof name, "model.layers.%d.mlp.router.bias", l);
    TSR_TRY(tsr__hf_vector_n(m, s, name, c->n_experts, &w->router_b));
    TSR_TRY(tsr__hf_experts(m, s, l, "gate_up_proj", 2 * (int64_t)c->hidden_dim, c->dim,
                            &w->gate_up));
    return tsr__hf_experts(m, s, l, "down_proj", c->dim, c->hidden_dim, &w->down);
}

static tsr_status tsr__hf_weights(tsr_model *m, const tsr__hf_src *s) {
    const tsr_model_config *c = &m->cfg;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int n_mats = 2 + 8 * c->n_layers;
    tsr__hf_mat *mats = tsr_calloc((size_t)n_mats, sizeof *mats);
    if (!mats) return TSR_ERR_NOMEM;
    tsr_status st = TSR_OK;
    int k = 0, n_fp8 = 0;
    char name[160];
#define TSR__MAT(dstp, nm, r, cc, req)                                                     \
    do {                                                                                 \
        const tsr_st_tensor *t_;                                                         \
        const char *f_;                                                                  \
        TSR_TRY_GOTO(tsr__hf_find(s, nm, req, &t_, &f_), st, done);                      \
        if (t_) {                                                                        \
            TSR_TRY_GOTO(tsr__hf_shape(f_, t_, r, cc, false), st, done);                 \
            mats[k++] = (tsr__hf_mat){.dst = (dstp), .src = t_, .file = f_};             \
        }                                                                                \
    } while (0)

    TSR__MAT(&m->tok_emb, "model.embed_tokens.weight", c->vocab_size, c->dim, true);
    /* Tied: lm_head is absent (or a duplicate HF ignores); the embedding is the classifier. */
    if (!c->tied_embeddings)
        TSR__MAT(&m->classifier, "lm_head.weight", c->vocab_size, c->dim, true);
    TSR_TRY_GOTO(tsr__hf_vector(m, s, "model.norm.weight", &m->out_norm), st, done);
    for (int l = 0; l < c->n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        static const struct {
            const char *suffix;
            size_t off;
            int rows, cols; /* 0 dim, 1 q, 2 kv, 3 hidden */
        } spec[] = {
            {"self_attn.q_proj", offsetof(tsr_layer_weights, wq), 1, 0},
            {"self_attn.k_proj", offsetof(tsr_layer_weights, wk), 2, 0},
            {"self_attn.v_proj", offsetof(tsr_layer_weights, wv), 2, 0},
            {"self_attn.o_proj", offsetof(tsr_layer_weights, wo), 0, 1},
            {"mlp.gate_proj", offsetof(tsr_layer_weights, w_gate), 3, 0},
            {"mlp.up_proj", offsetof(tsr_layer_weights, w_up), 3, 0},
            {"mlp.down_proj", offsetof(tsr_layer_weights, w_down), 0, 3},
        };
        int64_t sizes[4] = {c->dim, q, kv, c->hidden_dim};
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        TSR_TRY_GOTO(tsr__hf_vector(m, s, name, &w->attn_norm), st, done);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        TSR_TRY_GOTO(tsr__hf_vector(m, s, name, &w->ffn_norm), st, done);
        if (c->qkv_bias) {
            const char *proj[3] = {"q", "k", "v"};
            tsr_tensor *b[3] = {&w->bq, &w->bk, &w->bv};
            for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof name, "model.layers.%d.self_attn.%s_proj.bias", l, proj[i]);
                TSR_TRY_GOTO(tsr__hf_vector_n(m, s, name, i ? kv : q, b[i]), st, done);
            }
        }
        if (c->qk_norm) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
            TSR_TRY_GOTO(tsr__hf_vector_n(m, s, name, c->head_dim, &w->q_norm), st, done);
            snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", l);
            TSR_TRY_GOTO(tsr__hf_vector_n(m, s, name, c->head_dim, &w->k_norm), st, done);
        }
        if (c->n_experts > 0) { /* GPT-OSS: a router and experts instead of the MLP */
            TSR_TRY_GOTO(tsr__hf_gpt_oss_layer(m, s, l, w), st, done);
            snprintf(name, sizeof name, "model.layers.%d.mlp.router.weight", l);
            TSR__MAT(&w->router, name, c->n_experts, c->dim, true);
        }
        for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
            if (c->n_experts > 0 && spec[i].suffix[0] == 'm') continue; /* mlp.* */
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, spec[i].suffix);
            tsr_tensor *dst = (tsr_tensor *)((char *)w + spec[i].off);
            const tsr_st_tensor *f8, *f8s;
            const char *f8f, *f8sf;
            TSR_TRY_GOTO(tsr__hf_locate(s, name, true, &f8, &f8f), st, done);
            if (!strcmp(f8->st_dtype, "F8_E4M3")) { /* compressed-tensors FP8, kept as it is */
                TSR_TRY_GOTO(tsr__hf_shape(f8f, f8, sizes[spec[i].rows], sizes[spec[i].cols],
                                           false), st, done);
                snprintf(name, sizeof name, "model.layers.%d.%s.weight_scale", l, spec[i].suffix);
                TSR_TRY_GOTO(tsr__hf_locate(s, name, false, &f8s, &f8sf), st, done);
                TSR_TRY_GOTO(tsr_fp8_from_st(m, f8f, f8, f8s, dst), st, done);
                n_fp8++;
                continue;
            }
            TSR__MAT(dst, name, sizes[spec[i].rows], sizes[spec[i].cols], true);
        }
    }
#undef TSR__MAT

    /* One dtype per model (the kernels take cfg.dtype): mixed files are unified to the dtype
     * holding the most elements, converting the minority into model-owned copies. */
    int64_t per[3] = {0, 0, 0};
    for (int i = 0; i < k; i++) per[mats[i].src->dtype] += mats[i].src->numel;
    tsr_dtype dtype = TSR_F32;
    for (int d = 1; d < 3; d++)
        if (per[d] > per[dtype]) dtype = (tsr_dtype)d;
    m->cfg.dtype = n_fp8 ? TSR_F8_E4M3 : dtype; /* named as its projections are */
    for (int i = 0; i < k; i++) TSR_TRY_GOTO(tsr__hf_bind(m, &mats[i], dtype), st, done);
    if (c->tied_embeddings) m->classifier = m->tok_emb;

done:
    tsr_free(mats);
    return st;
}

tsr_status tsr_loader_hf(const char *dir, tsr_model **out) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    tsr_model_config cfg;
    TSR_TRY(tsr_config_from_hf_json(path, &cfg));
    tsr_model *m;
    TSR_TRY(tsr_model_create(dir, &cfg, &m));
    tsr__hf_src src = {.dir = dir};
    tsr_status st = tsr__hf_open(&src, m);
    if (st == TSR_OK) st = tsr__hf_weights(m, &src);
    tsr__hf_src_free(&src);
    if (st != TSR_OK) {
        tsr_model_destroy(m);
        return st;
    }
    *out = m;
    return TSR_OK;
}
