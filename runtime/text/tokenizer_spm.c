/* llama2.c tokenizer.bin: SentencePiece BPE vocabulary (pieces with '▁' exported as ' ').
 *
 * File: int32 max_token_length, then {float32 score, int32 len, len bytes} to the end of
 * the file; the vocab size is the number of entries. Encoding follows SentencePiece's
 * bpe_model.cc (which run.c approximates): normalize (dummy-prefix space, U+2581 as a
 * space), split into codepoints, repeatedly merge the adjacent pair whose concatenation is
 * a normal piece with the highest score (leftmost on ties), then byte-fall-back every
 * symbol that is not a piece. Control pieces (ids 0..2) and <0xXX> byte pieces are never
 * matched from text, as in SentencePiece. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/utf8.h"
#include "runtime/format/gguf.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr__spm {
    tsr_tokenizer base; /* first: the public handle */
    char *blob;         /* every piece, NUL-terminated, back to back */
    uint32_t *off;
    uint32_t *len;
    float *score;
    int16_t *byte_of; /* id -> byte for <0xXX> pieces, else -1 */
    int32_t byte_id[256];
    int32_t *slots; /* open addressing piece -> id, -1 empty */
    uint32_t mask;
    int unk_id;
    int max_token_length;
} tsr__spm;

static uint32_t tsr__hash(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* Id of a normal piece equal to s[0..n), or -1. */
static int32_t tsr__spm_lookup(const tsr__spm *t, const char *s, size_t n) {
    for (uint32_t h = tsr__hash(s, n) & t->mask;; h = (h + 1) & t->mask) {
        int32_t id = t->slots[h];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->blob + t->off[id], s, n) == 0) return id;
    }
}

static void tsr__spm_destroy(tsr_tokenizer *base) {
    tsr__spm *t = (tsr__spm *)base;
    if (!t) return;
    tsr_free(t->blob);
    tsr_free(t->off);
    tsr_free(t->len);
    tsr_free(t->score);
    tsr_free(t->byte_of);
    tsr_free(t->slots);
    tsr_free(t);
}

/* Max-heap of merge candidates: best score first, then the leftmost symbol. */
typedef struct tsr__cand {
    float score;
    int32_t left, right;
    uint32_t len; /* len[left] + len[right] when pushed; stale when it changed */
} tsr__cand;

static bool tsr__cand_before(const tsr__cand *a, const tsr__cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

TSR_HEAP_DEFINE(tsr__heap, tsr__cand, tsr__cand_before)

typedef struct tsr__sym {
    uint32_t start, len;
    int32_t prev, next; /* -1 at the ends */
    bool alive, text;   /* text: false for an invalid UTF-8 byte (byte fallback only) */
} tsr__sym;

static void tsr__spm_try_pair(const tsr__spm *t, const char *norm, const tsr__sym *sym,
                              int32_t left, tsr__cand *heap, size_t *nheap) {
    if (left < 0) return;
    int32_t right = sym[left].next;
    if (right < 0 || !sym[left].text || !sym[right].text) return;
    uint32_t n = sym[left].len + sym[right].len;
    int32_t id = tsr__spm_lookup(t, norm + sym[left].start, n);
    if (id < 0) return;
    tsr__heap_push(heap, nheap, (tsr__cand){t->score[id], left, right, n});
}

static tsr_status tsr__spm_encode(const tsr_tokenizer *base, const char *text, size_t len,
                                  bool bos, bool eos, int32_t **ids_out, size_t *n_out) {
    const tsr__spm *t = (const tsr__spm *)base;
    *ids_out = NULL;
    *n_out = 0;
    if (len > (size_t)UINT32_MAX / 16)
        return tsr_error_set(TSR_ERR_INVALID, "spm encode: text of %zu bytes is too long", len);
    size_t norm_cap = len ? len + 1 : 0;
    char *norm = NULL;
    tsr__sym *sym = NULL;
    tsr__cand *heap = NULL;
    int32_t *ids = NULL;
    size_t n_norm = 0, n_sym = 0, nheap = 0, n_ids = 0;
    tsr_status st = TSR_OK;

    /* At most one id per normalized byte (byte fallback), plus BOS and EOS. */
    ids = tsr_malloc((len + 3) * sizeof *ids);
    if (!ids) return TSR_ERR_NOMEM;
    if (bos && t->base.bos_id >= 0) ids[n_ids++] = t->base.bos_id;
    if (len > 0) {
        norm = tsr_malloc(norm_cap);
        sym = tsr_malloc(norm_cap * sizeof *sym);
        heap = tsr_malloc(norm_cap * 3 * sizeof *heap);
        if (!norm || !sym || !heap) {
            st = TSR_ERR_NOMEM;
            goto done;
        }
        /* SentencePiece escapes spaces as U+2581 and the .bin export maps it back to ' ',
         * so a literal U+2581 in the text is the same symbol as a space. */
        norm[n_norm++] = ' ';
        for (size_t i = 0; i < len; i++) {
            if (i + 2 < len && (uint8_t)text[i] == 0xE2 && (uint8_t)text[i + 1] == 0x96 &&
                (uint8_t)text[i + 2] == 0x81) {
                norm[n_norm++] = ' ';
                i += 2;
            } else {
                norm[n_norm++] = text[i];
            }
        }
        for (size_t i = 0; i < n_norm;) {
            uint32_t cp;
            int k = tsr_utf8_decode((const unsigned char *)norm + i, n_norm - i, &cp);
            tsr__sym *s = &sym[n_sym];
            s->start = (uint32_t)i;
            s->len = k ? (uint32_t)k : 1;
            s->text = k > 0;
            s->alive = true;
            s->prev = (int32_t)n_sym - 1;
            s->next = (int32_t)n_sym + 1;
            n_sym++;
            i += s->len;
        }
        sym[n_sym - 1].next = -1;
        for (size_t i = 0; i + 1 < n_sym; i++)
            tsr__spm_try_pair(t, norm, sym, (int32_t)i, heap, &nheap);
        /* n_sym - 1 initial candidates, then each of at most n_sym - 1 merges pushes two:
         * the heap never holds 3 * n_sym entries. */
        while (nheap > 0) {
            tsr__cand c = tsr__heap_pop(heap, &nheap);
            tsr__sym *l = &sym[c.left], *r = &sym[c.right];
            if (!l->alive || !r->alive || l->next != c.right || l->len + r->len != c.len)
                continue;
            l->len = c.len;
            l->next = r->next;
            if (r->next >= 0) sym[r->next].prev = c.left;
            r->alive = false;
            tsr__spm_try_pair(t, norm, sym, l->prev, heap, &nheap);
            tsr__spm_try_pair(t, norm, sym, c.left, heap, &nheap);
        }
        for (int32_t i = 0; i >= 0; i = sym[i].next) {
            const tsr__sym *s = &sym[i];
            int32_t id = s->text ? tsr__spm_lookup(t, norm + s->start, s->len) : -1;
            if (id >= 0) {
                ids[n_ids++] = id;
                continue;
            }
            for (uint32_t b = 0; b < s->len; b++) {
                int32_t bid = t->byte_id[(uint8_t)norm[s->start + b]];
                ids[n_ids++] = bid >= 0 ? bid : t->unk_id;
            }
        }
    }
    if (eos && t->base.eos_id >= 0) ids[n_ids++] = t->base.eos_id;
done:
    tsr_free(norm);
    tsr_free(sym);
    tsr_free(heap);
    if (st != TSR_OK) {
        tsr_free(ids);
        return st;
    }
    *ids_out = ids;
    *n_out = n_ids;
    return TSR_OK;
}

static int tsr__spm_decode(const tsr_tokenizer *base, int32_t prev, int32_t id, char *buf,
                           size_t cap) {
    const tsr__spm *t = (const tsr__spm *)base;
    if (id < 0 || id >= t->base.vocab_size) return 0;
    /* BOS/EOS are control tokens: tok512's pieces are "\n<s>\n" and "\n</s>\n". */
    if (id == t->base.bos_id || id == t->base.eos_id) return 0;
    if (t->byte_of[id] >= 0) {
        if (cap < 1) return -1;
        buf[0] = (char)t->byte_of[id];
        return 1;
    }
    const char *p = t->blob + t->off[id];
    size_t n = t->len[id];
    /* run.c: the piece after BOS drops its leading space (the dummy prefix). */
    if (prev >= 0 && prev == t->base.bos_id && n > 0 && p[0] == ' ') p++, n--;
    if (n > cap) return -1;
    memcpy(buf, p, n);
    return (int)n;
}

static const tsr_tokenizer_ops tsr__spm_ops = {
    .name = "spm",
    .encode = tsr__spm_encode,
    .decode = tsr__spm_decode,
    .destroy = tsr__spm_destroy,
};


static int tsr__hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Parses tokenizer.bin bytes (data stays the caller's). */
static tsr_status tsr__spm_parse(const char *path, const char *data, size_t size,
                                 tsr__spm **out) {
    *out = NULL;
    tsr_status st = TSR_OK;
    tsr__spm *t = NULL;
    if (size < 4) {
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: too short for a tokenizer.bin (%zu bytes)",
                           path, size);
        goto fail;
    }
    int32_t max_len;
    memcpy(&max_len, data, 4);
    if (max_len <= 0 || (size_t)max_len > size) {
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: bad max_token_length %d", path, (int)max_len);
        goto fail;
    }
    /* First pass: count and validate the entries against the file size. */
    size_t n = 0, bytes = 0;
    for (size_t off = 4; off < size; n++) {
        if (size - off < 8) {
            st = tsr_error_set(TSR_ERR_FORMAT,
                               "%s: truncated entry %zu (header at byte %zu, file is %zu bytes)",
                               path, n, off, size);
            goto fail;
        }
        int32_t len;
        memcpy(&len, data + off + 4, 4);
        if (len < 0 || (size_t)len > size - off - 8) {
            st = tsr_error_set(TSR_ERR_FORMAT,
                               "%s: entry %zu length %d runs past the end of the file "
                               "(byte %zu of %zu)", path, n, (int)len, off + 8, size);
            goto fail;
        }
        off += 8 + (size_t)len;
        bytes += (size_t)len + 1;
    }
    if (n == 0) {
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: no vocabulary entries", path);
        goto fail;
    }
    if (n > (size_t)INT32_MAX / 4 || bytes > UINT32_MAX) {
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: vocabulary too large (%zu)", path, n);
        goto fail;
    }
    t = tsr_calloc(1, sizeof *t);
    if (!t) {
        st = TSR_ERR_NOMEM;
        goto fail;
    }
    uint32_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    t->blob = tsr_malloc(bytes);
    t->off = tsr_malloc(n * sizeof *t->off);
    t->len = tsr_malloc(n * sizeof *t->len);
    t->score = tsr_malloc(n * sizeof *t->score);
    t->byte_of = tsr_malloc(n * sizeof *t->byte_of);
    t->slots = tsr_malloc(slots * sizeof *t->slots);
    if (!t->blob || !t->off || !t->len || !t->score || !t->byte_of || !t->slots) {
        st = TSR_ERR_NOMEM;
        goto fail;
    }
    t->base.ops = &tsr__spm_ops;
    t->base.vocab_size = (int)n;
    t->max_token_length = max_len;
    t->mask = slots - 1;
    memset(t->slots, 0xff, slots * sizeof *t->slots);
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    /* SentencePiece exports put <unk>, <s>, </s> at 0, 1, 2 (llama2.c relies on it). */
    t->unk_id = 0;
    t->base.bos_id = n > 1 ? 1 : -1;
    t->base.eos_id = n > 2 ? 2 : -1;
    if (t->base.eos_id >= 0) {
        t->base.n_eos_ids = 1;
        t->base.eos_ids[0] = t->base.eos_id;
    }
    size_t pos = 0, off = 4;
    for (size_t i = 0; i < n; i++) {
        int32_t len;
        memcpy(&t->score[i], data + off, 4);
        memcpy(&len, data + off + 4, 4);
        off += 8;
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)len;
        memcpy(t->blob + pos, data + off, (size_t)len);
        t->blob[pos + (size_t)len] = '\0';
        const char *p = t->blob + pos;
        off += (size_t)len;
        pos += (size_t)len + 1;
        t->byte_of[i] = -1;
        if (len == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && tsr__hexval(p[3]) >= 0 &&
            tsr__hexval(p[4]) >= 0) {
            int b = tsr__hexval(p[3]) * 16 + tsr__hexval(p[4]);
            t->byte_of[i] = (int16_t)b;
            if (t->byte_id[b] < 0) t->byte_id[b] = (int32_t)i;
            continue; /* byte pieces are only produced by fallback */
        }
        if (i < 3) continue; /* control pieces are never matched from text */
        uint32_t h = tsr__hash(p, (size_t)len) & t->mask;
        bool dup = false;
        for (; t->slots[h] >= 0; h = (h + 1) & t->mask) {
            int32_t o = t->slots[h];
            if (t->len[o] == (uint32_t)len && memcmp(t->blob + t->off[o], p, (size_t)len) == 0) {
                dup = true; /* keep the first id, as SentencePiece would */
                break;
            }
        }
        if (!dup) t->slots[h] = (int32_t)i;
    }
    *out = t;
    return TSR_OK;
fail:
    if (t) tsr__spm_destroy(&t->base);
    return st;
}

tsr_status tsr_tokenizer_load_spm(const char *path, tsr_tokenizer **out) {
    *out = NULL;
    char *data = NULL;
    size_t size = 0;
    TSR_TRY(tsr_file_read(path, "tokenizer", 0, &data, &size));
    tsr__spm *t = NULL;
    tsr_status st = tsr__spm_parse(path, data, size, &t);
    tsr_free(data);
    if (st == TSR_OK) *out = &t->base;
    return st;
}

/* GGUF `llama` tokenizer: tokenizer.ggml.tokens (pieces with U+2581 for spaces) and .scores,
 * written out as the tokenizer.bin they stand for (U+2581 as ' ', as llama2.c's export does)
 * and parsed by the code above; the file's unknown/BOS/EOS ids and add-BOS flag then replace
 * the .bin conventions (<unk>, <s>, </s> at 0, 1, 2). */
tsr_status tsr_tokenizer_load_gguf_spm(const struct tsr_gguf *g, tsr_tokenizer **out) {
    *out = NULL;
    const tsr_gguf_kv *toks = tsr_gguf_find(g, "tokenizer.ggml.tokens");
    const tsr_gguf_kv *scores = tsr_gguf_find(g, "tokenizer.ggml.scores");
    if (!toks || toks->type != TSR_GGUF_ARRAY || toks->elem != TSR_GGUF_STRING || toks->n == 0 ||
        toks->n > (1 << 24))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing or not a "
                             "string array of 1..2^24 entries", g->path);
    if (scores && (scores->type != TSR_GGUF_ARRAY || scores->elem != TSR_GGUF_F32 ||
                   scores->n != toks->n))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.scores is not an f32 array "
                             "matching the tokens", g->path);
    size_t size = 4;
    for (uint64_t i = 0; i < toks->n; i++) {
        const char *p;
        uint64_t n;
        tsr_gguf_arr_str(toks, i, &p, &n);
        size += 8 + (size_t)n;
    }
    char *data = tsr_malloc(size);
    if (!data) return TSR_ERR_NOMEM;
    size_t off = 4;
    int32_t max_len = 1;
    for (uint64_t i = 0; i < toks->n; i++) {
        const char *p;
        uint64_t n;
        tsr_gguf_arr_str(toks, i, &p, &n);
        float score = 0.0f;
        if (scores) memcpy(&score, scores->data + 4 * i, 4);
        int32_t len = 0;
        char *dst = data + off + 8;
        for (uint64_t k = 0; k < n; k++) {
            if (k + 2 < n && (uint8_t)p[k] == 0xE2 && (uint8_t)p[k + 1] == 0x96 &&
                (uint8_t)p[k + 2] == 0x81) {
                dst[len++] = ' ';
                k += 2;
            } else {
                dst[len++] = p[k];
            }
        }
        memcpy(data + off, &score, 4);
        memcpy(data + off + 4, &len, 4);
        off += 8 + (size_t)len;
        if (len > max_len) max_len = len;
    }
    memcpy(data, &max_len, 4);
    tsr__spm *t = NULL;
    tsr_status st = tsr__spm_parse(g->path, data, off, &t);
    tsr_free(data);
    if (st != TSR_OK) return st;
    int64_t v;
    bool have, add_bos = true;
    st = tsr_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, &have);
    if (st == TSR_OK) st = tsr_gguf_get_int(g, "tokenizer.ggml.unknown_token_id", &v, &have);
    if (st == TSR_OK && have && v >= 0 && v < t->base.vocab_size) t->unk_id = (int)v;
    if (st == TSR_OK) st = tsr_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v, &have);
    if (st == TSR_OK && have) t->base.bos_id = v >= 0 && v < t->base.vocab_size ? (int)v : -1;
    if (st == TSR_OK && !add_bos) t->base.bos_id = -1;
    if (st == TSR_OK) st = tsr_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v, &have);
    if (st == TSR_OK && have) {
        t->base.eos_id = v >= 0 && v < t->base.vocab_size ? (int)v : -1;
        t->base.n_eos_ids = t->base.eos_id >= 0;
        t->base.eos_ids[0] = t->base.eos_id;
    }
    if (st != TSR_OK) {
        tsr__spm_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return TSR_OK;
}
