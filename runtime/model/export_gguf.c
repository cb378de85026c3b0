#include "runtime/model/export_gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/file.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_q8.h"
#include "kernels/rope_freq.h"
#include "runtime/format/gguf.h"
#include "runtime/model/fp8.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/quantize.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr__gitem {
    char name[96];
    const tsr_tensor *t;
    bool vector;
    const char *which; /* tsr_model_q8_eligible's matrix name */
    int heads;         /* > 0: rotary rows permuted per head (perm) */
    int perm;          /* 1: half rotation -> adjacent pairs; 2: the reverse */
    uint32_t type;     /* TSR_GGML_* written */
} tsr__gitem;

/* Source row of written row r: llama.cpp's permute() (a head's rows (i, i + hd/2) become
 * (2i, 2i + 1)) for perm 1, its inverse for perm 2. */
static int64_t tsr__src_row(const tsr__gitem *it, int64_t r) {
    if (it->heads <= 0) return r;
    int64_t hd = it->t->rows / it->heads, half = hd / 2, head = r / hd, j = r % hd;
    if (it->perm == 1) return head * hd + (j % 2) * half + j / 2;
    return head * hd + (j < half ? 2 * j : 2 * (j - half) + 1);
}

/* Row r of t as f32 (block formats dequantized: exact in f32). */
static void tsr__row_f32(const tsr_tensor *t, int64_t r, float *out) {
    if (t->dtype == TSR_F8_E4M3)
        tsr_fp8_dequant_row(t, r, out);
    else
        tsr_qblocks_row_f32(t, r, out); /* Q8_0, Q4_0/1, Q4_K, or a plain dtype */
}

static uint32_t tsr__ggml_type(tsr_dtype d) {
    return d == TSR_F16 ? TSR_GGML_F16 : d == TSR_BF16 ? TSR_GGML_BF16 : TSR_GGML_F32;
}

static uint32_t tsr__item_type(const tsr_model_config *c, const tsr__gitem *it, tsr_dtype dt) {
    if (it->vector) return TSR_GGML_F32;
    if (dt != TSR_Q8_0) return tsr__ggml_type(dt);
    if (tsr_model_q8_eligible(c, it->which, it->t->cols)) return TSR_GGML_Q8_0;
    /* what tsr_model_quantize leaves: 16-bit kept, f32 made BF16, other blocks in f32 */
    if (it->t->dtype == TSR_F16 || it->t->dtype == TSR_BF16) return tsr__ggml_type(it->t->dtype);
    return it->t->dtype == TSR_F32 ? TSR_GGML_BF16 : TSR_GGML_F32;
}

static tsr_status tsr__write_tensors(tsr_gguf_writer *w, const tsr__gitem *items, int n) {
    int64_t max_cols = 32;
    for (int i = 0; i < n; i++)
        if (items[i].t->cols > max_cols) max_cols = items[i].t->cols;
    float *f32 = tsr_malloc((size_t)max_cols * 4);
    uint8_t *out = tsr_malloc((size_t)max_cols * 4);
    tsr_status st = f32 && out ? TSR_OK : TSR_ERR_NOMEM;
    for (int i = 0; i < n && st == TSR_OK; i++) {
        const tsr__gitem *it = &items[i];
        const tsr_tensor *t = it->t;
        size_t cols = (size_t)t->cols, bytes = 0;
        for (int64_t r = 0; r < t->rows && st == TSR_OK; r++) {
            int64_t sr = tsr__src_row(it, r);
            if (it->type == TSR_GGML_Q8_0 && t->dtype == TSR_Q8_0) {
                tsr_q8_unpack_row(t->data, t->cols, sr, out); /* the same blocks */
                bytes = cols / TSR_Q8_BLOCK * TSR_Q8_BLOCK_BYTES;
            } else {
                tsr__row_f32(t, sr, f32);
                if (it->type == TSR_GGML_Q8_0) {
                    tsr_q8_quantize_blocks(f32, t->cols, out);
                    bytes = cols / TSR_Q8_BLOCK * TSR_Q8_BLOCK_BYTES;
                } else if (it->type == TSR_GGML_F32) {
                    memcpy(out, f32, cols * 4);
                    bytes = cols * 4;
                } else {
                    uint16_t h;
                    for (size_t j = 0; j < cols; j++) {
                        h = it->type == TSR_GGML_BF16 ? tsr_f32_to_bf16(f32[j])
                                                      : tsr_f32_to_f16(f32[j]);
                        memcpy(out + 2 * j, &h, 2);
                    }
                    bytes = cols * 2;
                }
            }
            st = tsr_gguf_writer_write(w, out, bytes);
        }
    }
    tsr_free(f32);
    tsr_free(out);
    return st;
}

/* A llama2.c tokenizer.bin as llama.cpp's `llama` tokenizer keys (tools/spm_gguf.py writes
 * the same keys with the gguf package: tests compare the two). */
static tsr_status tsr__spm_keys(tsr_gguf_writer *w, const char *path, int vocab) {
    char *data = NULL;
    size_t size = 0;
    TSR_TRY(tsr_file_read(path, "tokenizer", 0, &data, &size));
    const char **strs = tsr_calloc((size_t)vocab, sizeof *strs);
    uint64_t *lens = tsr_calloc((size_t)vocab, sizeof *lens);
    float *scores = tsr_calloc((size_t)vocab, sizeof *scores);
    int32_t *types = tsr_calloc((size_t)vocab, sizeof *types);
    /* U+2581 for each space: at most 3 bytes per byte of the file */
    char *text = tsr_malloc(3 * size + 1);
    tsr_status st = strs && lens && scores && types && text ? TSR_OK : TSR_ERR_NOMEM;
    size_t off = 4, t = 0;
    int n = 0;
    while (st == TSR_OK && off < size) {
        int32_t len;
        if (n >= vocab || size - off < 8) {
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: not a tokenizer.bin of %d pieces", path,
                               vocab);
            break;
        }
        memcpy(&scores[n], data + off, 4);
        memcpy(&len, data + off + 4, 4);
        off += 8;
        if (len < 0 || (size_t)len > size - off) {
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: piece %d runs past the end", path, n);
            break;
        }
        const char *p = data + off;
        off += (size_t)len;
        static const char *const special[3] = {"<unk>", "<s>", "</s>"};
        strs[n] = text + t;
        if (n < 3) { /* llama2.c exports <s> and </s> as "\n<s>\n" and "\n</s>\n" */
            memcpy(text + t, special[n], strlen(special[n]));
            t += strlen(special[n]);
            types[n] = n == 0 ? 2 : 3; /* unknown, control */
        } else {
            for (int32_t k = 0; k < len; k++) {
                if (p[k] == ' ') {
                    memcpy(text + t, "\xe2\x96\x81", 3);
                    t += 3;
                } else {
                    text[t++] = p[k];
                }
            }
            bool byte = len == 6 && !memcmp(p, "<0x", 3) && p[5] == '>';
            types[n] = byte ? 6 : 1; /* byte, normal */
        }
        lens[n] = (uint64_t)(text + t - strs[n]);
        n++;
    }
    if (st == TSR_OK && n != vocab)
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: %d pieces, the model's vocabulary has %d", path,
                           n, vocab);
    if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, lens, (uint64_t)n);
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_arr(w, "tokenizer.ggml.scores", TSR_GGUF_F32, scores,
                                     (uint64_t)n);
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_I32, types,
                                     (uint64_t)n);
    if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (st == TSR_OK) st = tsr_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    tsr_free(data);
    tsr_free(strs);
    tsr_free(lens);
    tsr_free(scores);
    tsr_free(types);
    tsr_free(text);
    return st;
}

/* The end ids, first `a`'s then `b`'s not yet listed (b may be NULL), as the EOS, EOT and
 * EOM keys tessera's GGUF reader collects (at most three). */
static tsr_status tsr__eos_keys(tsr_gguf_writer *w, const int *a, int na, const int *b, int nb) {
    static const char *const keys[3] = {"tokenizer.ggml.eos_token_id",
                                        "tokenizer.ggml.eot_token_id",
                                        "tokenizer.ggml.eom_token_id"};
    int ids[3], n = 0;
    for (int i = 0; i < na + nb && n < 3; i++) {
        int id = i < na ? a[i] : b[i - na];
        bool dup = id < 0;
        for (int k = 0; k < n; k++) dup |= ids[k] == id;
        if (!dup) ids[n++] = id;
    }
    for (int k = 0; k < n; k++) TSR_TRY(tsr_gguf_writer_add_u32(w, keys[k], (uint32_t)ids[k]));
    return TSR_OK;
}

/* The llama.cpp pre-tokenizer name (tokenizer.ggml.pre) whose expansion in tessera's GGUF
 * reader (runtime/text/tokenizer_bpe.c) is this tokenizer.json pre_tokenizer, or NULL. */
static const char *tsr__pre_name(const cJSON *pt) {
    static const char llama3[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char qwen2[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const cJSON *type = cJSON_GetObjectItem(pt, "type");
    if (!cJSON_IsString(type)) return NULL;
    if (!strcmp(type->valuestring, "ByteLevel")) /* GPT-2: no prefix space */
        return cJSON_IsTrue(cJSON_GetObjectItem(pt, "add_prefix_space")) ? NULL : "gpt-2";
    const cJSON *list = cJSON_GetObjectItem(pt, "pretokenizers");
    if (strcmp(type->valuestring, "Sequence") != 0 || cJSON_GetArraySize(list) != 2) return NULL;
    const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
    const cJSON *at = cJSON_GetObjectItem(a, "type"), *bt = cJSON_GetObjectItem(b, "type");
    if (!cJSON_IsString(at) || !cJSON_IsString(bt) || strcmp(bt->valuestring, "ByteLevel") ||
        cJSON_IsTrue(cJSON_GetObjectItem(b, "add_prefix_space")))
        return NULL;
    bool b_regex = !cJSON_IsFalse(cJSON_GetObjectItem(b, "use_regex"));
    if (!strcmp(at->valuestring, "Digits"))
        return cJSON_IsTrue(cJSON_GetObjectItem(a, "individual_digits")) && b_regex ? "smollm"
                                                                                   : NULL;
    const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(a, "pattern"), "Regex");
    const cJSON *beh = cJSON_GetObjectItem(a, "behavior");
    if (strcmp(at->valuestring, "Split") || !cJSON_IsString(re) || b_regex ||
        !cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") ||
        cJSON_IsTrue(cJSON_GetObjectItem(a, "invert")))
        return NULL;
    return !strcmp(re->valuestring, llama3) ? "llama-bpe"
           : !strcmp(re->valuestring, qwen2) ? "qwen2"
                                              : NULL;
}

/* A byte-level BPE tokenizer.json as llama.cpp's `gpt2` tokenizer keys: tokens by id (the
 * vocabulary and the added tokens; ids up to the model's vocabulary that neither names are
 * "[PAD<id>]", type 5 unused), token types (added special 3 control, other added 4
 * user-defined, else 1), merges as "a b", the pre-tokenizer's llama.cpp name, and the BOS
 * (with add_bos_token) and EOS/EOT ids tessera's reader of the file finds. Tokenizers GGUF
 * cannot express as tessera reads it back (a normalizer other than NFC, byte fallback,
 * another pre-tokenizer) are not carried: *carried stays false. */
static tsr_status tsr__bpe_keys(tsr_gguf_writer *w, const tsr_model_config *c,
                                const char *path, bool *carried) {
    int vocab = c->vocab_size;
    char *data = NULL;
    size_t size = 0;
    TSR_TRY(tsr_file_read(path, "tokenizer", 0, &data, &size));
    cJSON *doc = cJSON_ParseWithLength(data, size);
    tsr_free(data);
    if (!doc) return tsr_error_set(TSR_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *model = cJSON_GetObjectItem(doc, "model");
    const cJSON *mvocab = cJSON_GetObjectItem(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItem(model, "merges");
    const cJSON *added = cJSON_GetObjectItem(doc, "added_tokens");
    const cJSON *norm = cJSON_GetObjectItem(doc, "normalizer");
    const cJSON *ntype = cJSON_GetObjectItem(norm, "type");
    const cJSON *mtype = cJSON_GetObjectItem(model, "type");
    /* Qwen2's NFC is dropped as llama.cpp's qwen2 files drop it (NFC text is unchanged) */
    bool norm_ok = !norm || cJSON_IsNull(norm) ||
                   (cJSON_IsString(ntype) && !strcmp(ntype->valuestring, "NFC"));
    const char *pre = tsr__pre_name(cJSON_GetObjectItem(doc, "pre_tokenizer"));
    if (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE") || !cJSON_IsObject(mvocab) ||
        !cJSON_IsArray(merges) || cJSON_IsTrue(cJSON_GetObjectItem(model, "byte_fallback")) ||
        !norm_ok || !pre) {
        cJSON_Delete(doc);
        return TSR_OK;
    }
    const char **strs = tsr_calloc((size_t)vocab, sizeof *strs);
    uint64_t *lens = tsr_calloc((size_t)vocab, sizeof *lens);
    int32_t *types = tsr_calloc((size_t)vocab, sizeof *types);
    char *pads = tsr_malloc((size_t)vocab * 16);
    int n_merges = cJSON_GetArraySize(merges);
    char **mstr = tsr_calloc((size_t)n_merges + 1, sizeof *mstr);
    uint64_t *mlen = tsr_calloc((size_t)n_merges + 1, sizeof *mlen);
    tsr_status st = strs && lens && types && pads && mstr && mlen ? TSR_OK : TSR_ERR_NOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, mvocab) {
        if (st != TSR_OK) break;
        int id = cJSON_IsNumber(it) ? it->valueint : -1;
        if (id < 0 || id >= vocab) {
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: token id %d is outside the model's %d",
                               path, id, vocab);
            break;
        }
        strs[id] = it->string;
        types[id] = 1;
    }
    cJSON_ArrayForEach(it, added) {
        if (st != TSR_OK) break;
        const cJSON *id = cJSON_GetObjectItem(it, "id");
        const cJSON *content = cJSON_GetObjectItem(it, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || id->valueint < 0 ||
            id->valueint >= vocab) {
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: an added token's id is outside the model's "
                               "%d", path, vocab);
            break;
        }
        strs[id->valueint] = content->valuestring;
        types[id->valueint] = cJSON_IsTrue(cJSON_GetObjectItem(it, "special")) ? 3 : 4;
    }
    for (int i = 0; i < vocab && st == TSR_OK; i++) {
        if (strs[i]) {
            lens[i] = strlen(strs[i]);
            continue;
        }
        char *p = pads + (size_t)i * 16;
        lens[i] = (uint64_t)snprintf(p, 16, "[PAD%d]", i);
        strs[i] = p;
        types[i] = 5;
    }
    int k = 0;
    cJSON_ArrayForEach(it, merges) {
        if (st != TSR_OK) break;
        const cJSON *a = cJSON_GetArrayItem(it, 0), *b = cJSON_GetArrayItem(it, 1);
        if (cJSON_IsString(it)) {
            mstr[k] = tsr_strdup(it->valuestring);
        } else if (cJSON_IsString(a) && cJSON_IsString(b)) {
            size_t na = strlen(a->valuestring), nb = strlen(b->valuestring);
            mstr[k] = tsr_malloc(na + nb + 2);
            if (mstr[k]) snprintf(mstr[k], na + nb + 2, "%s %s", a->valuestring, b->valuestring);
        } else {
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges[%d] is not a pair", path, k);
            break;
        }
        if (!mstr[k]) st = TSR_ERR_NOMEM;
        else mlen[k] = strlen(mstr[k]);
        k++;
    }
    /* BOS/EOS as tessera's tokenizer.json reader finds them */
    tsr_tokenizer *tok = NULL;
    if (st == TSR_OK) st = tsr_tokenizer_load_bpe(path, &tok);
    if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, lens, (uint64_t)vocab);
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_I32, types,
                                     (uint64_t)vocab);
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mstr,
                                         mlen, (uint64_t)k);
    if (st == TSR_OK)
        st = tsr_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", tok->bos_id >= 0);
    if (st == TSR_OK && tok->bos_id >= 0)
        st = tsr_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)tok->bos_id);
    /* the tokenizer's, then the model config's (a Llama 3 instruct's <|eom_id|>) */
    if (st == TSR_OK)
        st = tsr__eos_keys(w, tok->eos_ids, tok->n_eos_ids, c->eos_ids, c->n_eos_ids);
    if (st == TSR_OK) *carried = true;
    tsr_tokenizer_destroy(tok);
    for (int i = 0; mstr && i < k; i++) tsr_free(mstr[i]);
    tsr_free(mstr);
    tsr_free(mlen);
    tsr_free(strs);
    tsr_free(lens);
    tsr_free(types);
    tsr_free(pads);
    cJSON_Delete(doc);
    return st;
}

/* The tokenizer keys; *carried false when there is none to carry. */
static tsr_status tsr__tokenizer(tsr_gguf_writer *w, const tsr_model *m, const char *tok,
                                 bool *carried) {
    const tsr_model_config *c = &m->cfg;
    *carried = false;
    size_t len = tok ? strlen(tok) : 0;
    if (tok && tsr_gguf_is_gguf(tok)) {
        tsr_gguf *g;
        TSR_TRY(tsr_gguf_open(tok, &g));
        tsr_status st = TSR_OK;
        bool any = false; /* a file may hold only the BOS/EOS ids */
        for (uint64_t i = 0; i < g->n_kv && st == TSR_OK; i++)
            if (!strncmp(g->kv[i].key, "tokenizer.", 10)) {
                st = tsr_gguf_writer_add_kv(w, &g->kv[i]);
                any = true;
                if (!strcmp(g->kv[i].key, "tokenizer.ggml.tokens")) *carried = true;
            }
        tsr_gguf_close(g);
        if (st != TSR_OK || any) return st;
    } else if (tok && len >= 5 && !strcmp(tok + len - 5, ".json")) {
        TSR_TRY(tsr__bpe_keys(w, c, tok, carried));
        if (*carried) return TSR_OK;
    } else if (tok) {
        TSR_TRY(tsr__spm_keys(w, tok, c->vocab_size));
        *carried = true;
        return TSR_OK;
    }
    if (c->bos_id >= 0)
        TSR_TRY(tsr_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id));
    if (c->n_eos_ids > 0) return tsr__eos_keys(w, c->eos_ids, c->n_eos_ids, NULL, 0);
    return tsr__eos_keys(w, &c->eos_id, 1, NULL, 0);
}

static tsr_status tsr__metadata(tsr_gguf_writer *w, const tsr_model *m, const char *arch,
                                tsr_dtype dt) {
    const tsr_model_config *c = &m->cfg;
    char key[96];
    const char *name = strrchr(m->source, '/');
    name = name && name[1] ? name + 1 : m->source;
    /* llama.cpp's LLAMA_FTYPE numbers: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_BF16 32 */
    uint32_t ftype = dt == TSR_Q8_0 ? 7 : dt == TSR_F16 ? 1 : dt == TSR_BF16 ? 32 : 0;
    TSR_TRY(tsr_gguf_writer_add_str(w, "general.architecture", arch));
    TSR_TRY(tsr_gguf_writer_add_str(w, "general.name", name));
    TSR_TRY(tsr_gguf_writer_add_u32(w, "general.file_type", ftype));
    if (dt == TSR_Q8_0) TSR_TRY(tsr_gguf_writer_add_u32(w, "general.quantization_version", 2));
#define TSR__U32(suffix, v)                                                               \
    do {                                                                                  \
        snprintf(key, sizeof key, "%s.%s", arch, suffix);                                 \
        TSR_TRY(tsr_gguf_writer_add_u32(w, key, (uint32_t)(v)));                          \
    } while (0)
    TSR__U32("context_length", c->max_seq_len);
    TSR__U32("embedding_length", c->dim);
    TSR__U32("block_count", c->n_layers);
    TSR__U32("feed_forward_length", c->hidden_dim);
    TSR__U32("attention.head_count", c->n_heads);
    TSR__U32("attention.head_count_kv", c->n_kv_heads);
    TSR__U32("attention.key_length", c->head_dim);
    TSR__U32("attention.value_length", c->head_dim);
    TSR__U32("rope.dimension_count", c->head_dim);
    TSR__U32("vocab_size", c->vocab_size);
#undef TSR__U32
    if (c->rope_scaling == TSR_ROPE_LLAMA3) { /* the rest is in rope_freqs.weight */
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
        TSR_TRY(tsr_gguf_writer_add_u32(w, key, (uint32_t)c->rope_original_max_pos));
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    TSR_TRY(tsr_gguf_writer_add_f32(w, key, c->rope_theta));
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    return tsr_gguf_writer_add_f32(w, key, c->norm_eps);
}

tsr_status tsr_export_gguf(const tsr_model *m, const char *path, tsr_dtype dtype,
                           const char *tok, bool *carried) {
    const tsr_model_config *c = &m->cfg;
    *carried = false;
    if (dtype != TSR_F32 && dtype != TSR_F16 && dtype != TSR_BF16 && dtype != TSR_Q8_0)
        return tsr_error_set(TSR_ERR_INVALID, "%s: GGUF output is f32, f16, bf16 or q8_0, not "
                             "%s", path, tsr_dtype_name(dtype));
    const char *arch = c->arch == TSR_ARCH_QWEN2 ? "qwen2" : c->arch == TSR_ARCH_QWEN3 ? "qwen3"
                                                                                      : "llama";
    if (c->arch == TSR_ARCH_GPT_OSS || c->n_experts > 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: writing GPT-OSS models as GGUF is not "
                             "supported", path);
    if (c->rope_scaling != TSR_ROPE_NONE && c->rope_scaling != TSR_ROPE_LLAMA3)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: %s has YaRN rope scaling, which tessera "
                             "does not write as GGUF", path, m->source);
    bool llama = !strcmp(arch, "llama");
    if (llama && (c->qkv_bias || c->qk_norm))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: a llama model with q/k/v biases or q/k "
                             "norms cannot be written as GGUF", path);
    /* llama.cpp's llama rows rotate adjacent pairs; qwen2/qwen3 rows rotate halves */
    int perm = llama == c->rope_interleaved ? 0 : llama ? 1 : 2;

    int cap = 3 + 14 * c->n_layers, k = 0;
    tsr__gitem *items = tsr_calloc((size_t)cap, sizeof *items);
    if (!items) return TSR_ERR_NOMEM;
#define TSR__ITEM(tensor, vec, wh, h, ...)                                                 \
    do {                                                                                   \
        snprintf(items[k].name, sizeof items[k].name, __VA_ARGS__);                        \
        items[k].t = (tensor);                                                             \
        items[k].vector = (vec);                                                           \
        items[k].which = (wh);                                                             \
        items[k].heads = perm ? (h) : 0;                                                   \
        items[k].perm = perm;                                                              \
        k++;                                                                               \
    } while (0)
    TSR__ITEM(&m->tok_emb, false, "tok_emb", 0, "token_embd.weight");
    TSR__ITEM(&m->out_norm, true, "", 0, "output_norm.weight");
    if (!c->tied_embeddings) TSR__ITEM(&m->classifier, false, "classifier", 0, "output.weight");
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_weights *lw = &m->layers[l];
        TSR__ITEM(&lw->attn_norm, true, "", 0, "blk.%d.attn_norm.weight", l);
        TSR__ITEM(&lw->wq, false, "wq", c->n_heads, "blk.%d.attn_q.weight", l);
        TSR__ITEM(&lw->wk, false, "wk", c->n_kv_heads, "blk.%d.attn_k.weight", l);
        TSR__ITEM(&lw->wv, false, "wv", 0, "blk.%d.attn_v.weight", l);
        TSR__ITEM(&lw->wo, false, "wo", 0, "blk.%d.attn_output.weight", l);
        TSR__ITEM(&lw->ffn_norm, true, "", 0, "blk.%d.ffn_norm.weight", l);
        TSR__ITEM(&lw->w_gate, false, "w_gate", 0, "blk.%d.ffn_gate.weight", l);
        TSR__ITEM(&lw->w_up, false, "w_up", 0, "blk.%d.ffn_up.weight", l);
        TSR__ITEM(&lw->w_down, false, "w_down", 0, "blk.%d.ffn_down.weight", l);
        if (c->qkv_bias) { /* qwen2: never permuted (perm is 0 for qwen rows) */
            TSR__ITEM(&lw->bq, true, "", 0, "blk.%d.attn_q.bias", l);
            TSR__ITEM(&lw->bk, true, "", 0, "blk.%d.attn_k.bias", l);
            TSR__ITEM(&lw->bv, true, "", 0, "blk.%d.attn_v.bias", l);
        }
        if (c->qk_norm) {
            TSR__ITEM(&lw->q_norm, true, "", 0, "blk.%d.attn_q_norm.weight", l);
            TSR__ITEM(&lw->k_norm, true, "", 0, "blk.%d.attn_k_norm.weight", l);
        }
    }
#undef TSR__ITEM
    tsr_status st = TSR_OK;
    for (int i = 0; i < k && st == TSR_OK; i++) {
        if (!items[i].t->data)
            st = tsr_error_set(TSR_ERR_INVALID, "%s: cannot export, tensor %s is missing",
                               m->source, items[i].name);
        else if (items[i].vector && (items[i].t->rows != 1 || items[i].t->dtype != TSR_F32))
            st = tsr_error_set(TSR_ERR_INTERNAL, "%s: tensor %s is no f32 vector", m->source,
                               items[i].name);
        /* a permuted matrix with an odd head width has no pairs (config validation keeps
         * head_dim even; this guards the row arithmetic) */
        else if (items[i].heads > 0 &&
                 (items[i].t->rows % items[i].heads || (items[i].t->rows / items[i].heads) % 2))
            st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: tensor %s: rows do not split into "
                               "rotary pairs per head", m->source, items[i].name);
        items[i].type = tsr__item_type(c, &items[i], dtype);
    }
    tsr_gguf_writer *w = NULL;
    if (st == TSR_OK) st = tsr_gguf_writer_create(path, &w);
    if (st == TSR_OK) st = tsr__metadata(w, m, arch, dtype);
    if (st == TSR_OK) st = tsr__tokenizer(w, m, tok, carried);
    for (int i = 0; i < k && st == TSR_OK; i++) {
        const tsr_tensor *t = items[i].t;
        int64_t ne[2] = {t->cols, t->rows};
        st = tsr_gguf_writer_add_tensor(w, items[i].name, items[i].type,
                                        items[i].vector ? 1 : 2, ne);
    }
    /* Llama 3 rope scaling as llama.cpp stores it: rope_freqs.weight, per frequency the
     * divisor of the unscaled one (1 for high frequencies, `factor` for low ones, smoothed
     * between), last so that the tensor data follows the others' */
    float freqs[512];
    int half = c->head_dim / 2;
    bool rope_freqs = c->rope_scaling == TSR_ROPE_LLAMA3;
    if (st == TSR_OK && rope_freqs) {
        if (half > 512) {
            st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: head_dim %d is too large", path,
                               c->head_dim);
        } else if (c->rope_low_freq_factor != 1.0f || c->rope_high_freq_factor != 4.0f) {
            /* tessera's loader recovers Llama 3.1's 1 and 4 only (gguf_loader.c) */
            st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: llama3 rope scaling with low/high "
                               "frequency factors %g and %g (GGUF keeps 1 and 4 only)", path,
                               (double)c->rope_low_freq_factor,
                               (double)c->rope_high_freq_factor);
        } else {
            /* llama.cpp's convert_hf_to_gguf.py LlamaModel: exactly 1 and `factor` at the
             * ends, 1 / ((1 - smooth) / factor + smooth) between */
            float base[512];
            tsr_model_config plain = *c;
            plain.rope_scaling = TSR_ROPE_NONE;
            tsr_rope_inv_freq(&plain, base);
            double orig = c->rope_original_max_pos, lo = c->rope_low_freq_factor,
                   hi = c->rope_high_freq_factor, factor = c->rope_factor;
            for (int j = 0; j < half; j++) {
                double wavelen = 2.0 * 3.14159265358979323846 / (double)base[j];
                double smooth = (orig / wavelen - lo) / (hi - lo);
                freqs[j] = wavelen < orig / hi   ? 1.0f
                           : wavelen > orig / lo ? (float)factor
                                                 : (float)(1.0 / ((1.0 - smooth) / factor + smooth));
            }
            int64_t ne[1] = {half};
            st = tsr_gguf_writer_add_tensor(w, "rope_freqs.weight", TSR_GGML_F32, 1, ne);
        }
    }
    if (st == TSR_OK) st = tsr__write_tensors(w, items, k);
    if (st == TSR_OK && rope_freqs) st = tsr_gguf_writer_write(w, freqs, (size_t)half * 4);
    if (st == TSR_OK)
        st = tsr_gguf_writer_close(w);
    else
        tsr_gguf_writer_abort(w);
    tsr_free(items);
    return st;
}
