/* Tokenizer dispatch and lookup; the formats live in tokenizer_spm.c and tokenizer_bpe.c. */
#include "runtime/text/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/format/gguf.h"

static bool tsr__has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A JSON object starts with '{' then whitespace or '"'; a tokenizer.bin starts with a small
 * little-endian int32 (max_token_length), whose second byte is 0. */
static bool tsr__looks_like_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char b[2] = {0, 0};
    size_t n = fread(b, 1, 2, f);
    fclose(f);
    return n == 2 && b[0] == '{' && b[1] != 0;
}

tsr_status tsr_tokenizer_load(const char *path, tsr_tokenizer **out) {
    *out = NULL;
    if (!path || !*path) return tsr_error_set(TSR_ERR_INVALID, "tokenizer: empty path");
    if (tsr__has_suffix(path, ".json") || tsr__looks_like_json(path))
        return tsr_tokenizer_load_bpe(path, out);
    if (tsr_gguf_is_gguf(path)) return tsr_tokenizer_load_gguf(path, out);
    return tsr_tokenizer_load_spm(path, out);
}

static bool tsr__is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Writes DIR/NAME into buf and reports whether it is a regular file. */
static bool tsr__try(const char *dir, size_t dir_len, const char *name, char *buf,
                     size_t cap) {
    int n = snprintf(buf, cap, "%.*s%s%s", (int)dir_len, dir, dir_len ? "/" : "", name);
    return n > 0 && (size_t)n < cap && tsr__is_file(buf);
}

tsr_status tsr_tokenizer_find(const char *model_path, int vocab_size, char *buf, size_t cap) {
    if (!model_path || !buf || cap == 0)
        return tsr_error_set(TSR_ERR_INVALID, "tokenizer_find: bad arguments");
    buf[0] = '\0';
    struct stat st;
    if (stat(model_path, &st) != 0)
        return tsr_error_set(TSR_ERR_IO, "%s: model path not found (looking for a tokenizer)",
                             model_path);
    char tok_name[32];
    snprintf(tok_name, sizeof tok_name, "tok%d.bin", vocab_size);
    if (S_ISDIR(st.st_mode)) {
        size_t dl = strlen(model_path);
        while (dl > 1 && model_path[dl - 1] == '/') dl--;
        if (tsr__try(model_path, dl, "tokenizer.json", buf, cap)) return TSR_OK;
        if (tsr__try(model_path, dl, "tokenizer.bin", buf, cap)) return TSR_OK;
        if (vocab_size > 0 && tsr__try(model_path, dl, tok_name, buf, cap)) return TSR_OK;
        buf[0] = '\0';
        return tsr_error_set(TSR_ERR_IO,
                             "%s: no tokenizer.json or tokenizer.bin in this directory "
                             "(pass --tokenizer PATH)", model_path);
    }
    if (tsr_gguf_is_gguf(model_path)) {
        int n = snprintf(buf, cap, "%s", model_path);
        if (n > 0 && (size_t)n < cap) return TSR_OK;
        buf[0] = '\0';
        return tsr_error_set(TSR_ERR_INVALID, "%s: path too long", model_path);
    }
    const char *slash = strrchr(model_path, '/');
    const char *dir = slash ? model_path : ".";
    size_t dl = slash ? (size_t)(slash - model_path) : 1;
    if (slash && dl == 0) dl = 1; /* a model in "/" */
    /* tok<vocab>.bin first: a folder may hold several llama2.c models with their own vocab
     * (stories260K.bin + tok512.bin next to the 32000-entry tokenizer.bin). */
    if (vocab_size > 0 && tsr__try(dir, dl, tok_name, buf, cap)) return TSR_OK;
    if (tsr__try(dir, dl, "tokenizer.bin", buf, cap)) return TSR_OK;
    if (tsr__try(dir, dl, "tokenizer.json", buf, cap)) return TSR_OK;
    buf[0] = '\0';
    return tsr_error_set(TSR_ERR_IO,
                         "%s: no %s or tokenizer.bin next to the model (pass --tokenizer PATH)",
                         model_path, vocab_size > 0 ? tok_name : "tok<vocab>.bin");
}

bool tsr_tokenizer_is_eos(const tsr_tokenizer *t, int32_t id) {
    if (!t || id < 0) return false;
    if (id == t->eos_id) return true;
    for (int i = 0; i < t->n_eos_ids && i < 8; i++)
        if (t->eos_ids[i] == id) return true;
    return false;
}

void tsr_tokenizer_destroy(tsr_tokenizer *t) {
    if (t && t->ops && t->ops->destroy) t->ops->destroy(t);
}

tsr_status tsr_tokenizer_for_model(const char *model_path, const char *path, int vocab_size,
                                   tsr_tokenizer **out) {
    *out = NULL;
    char found[4096];
    if (!path) {
        TSR_TRY(tsr_tokenizer_find(model_path, vocab_size, found, sizeof found));
        path = found;
    }
    tsr_tokenizer *t = NULL;
    TSR_TRY(tsr_tokenizer_load(path, &t));
    if (t->vocab_size > vocab_size) {
        int tv = t->vocab_size;
        tsr_tokenizer_destroy(t);
        return tsr_error_set(TSR_ERR_INVALID,
                             "%s: tokenizer has %d tokens but the model's vocabulary is %d", path,
                             tv, vocab_size);
    }
    *out = t;
    return TSR_OK;
}
