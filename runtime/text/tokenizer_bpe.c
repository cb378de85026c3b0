/* Hugging Face tokenizer.json: byte-level BPE (GPT-2 byte map) as used by Llama 3.
 *
 * Encode: split the text on added tokens (whole matches, leftmost-longest), pre-tokenize each
 * remaining span through PCRE2 with the file's Split regex (Llama 3 carries
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * then ByteLevel(use_regex=false)), then run BPE on each piece's bytes, merging the
 * lowest-ranked pair first (leftmost on ties), as tokenizers' word.rs does. Invalid UTF-8
 * never matches the regex (PCRE2_MATCH_INVALID_UTF); the gaps it leaves become their own
 * pieces, so every byte is still encoded through the 256 byte tokens. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/heap.h"
#include "runtime/format/gguf.h"
#include "runtime/text/tokenizer.h"

/* ByteLevel(use_regex=true), GPT-2. */
#define TSR__GPT2_REGEX                                                                     \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

#define TSR__MAX_ID (1 << 26)

typedef struct tsr__merge {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX when empty */
    int32_t rank;
    int32_t id;
} tsr__merge;

typedef struct tsr__added {
    char *text;
    size_t len;
    int32_t id;
} tsr__added;

typedef struct tsr__bpe {
    tsr_tokenizer base; /* first: the public handle */
    char *blob;         /* raw bytes of every token */
    size_t blob_len;
    uint32_t *off; /* per id; len UINT32_MAX for an id without a token */
    uint32_t *len;
    int32_t *vslots; /* model.vocab bytes -> id, open addressing, -1 empty */
    uint32_t vmask;
    tsr__merge *mslots;
    uint64_t mmask;
    int32_t byte_id[256];
    tsr__added *added;
    int n_added;
    uint8_t added_first[256]; /* first bytes of added tokens: a quick reject */
    int32_t unk_id;
    bool ignore_merges;
    pcre2_code *digits; /* Digits pre-tokenizer, applied before re (NULL: none) */
    pcre2_code *re;
} tsr__bpe;

static uint32_t tsr__hash(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint64_t tsr__mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int32_t tsr__vocab_lookup(const tsr__bpe *t, const char *s, size_t n) {
    for (uint32_t h = tsr__hash(s, n) & t->vmask;; h = (h + 1) & t->vmask) {
        int32_t id = t->vslots[h];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->blob + t->off[id], s, n) == 0) return id;
    }
}

static const tsr__merge *tsr__merge_lookup(const tsr__bpe *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint64_t h = tsr__mix64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        const tsr__merge *m = &t->mslots[h];
        if (m->key == UINT64_MAX) return NULL;
        if (m->key == key) return m;
    }
}

static void tsr__bpe_destroy(tsr_tokenizer *base) {
    tsr__bpe *t = (tsr__bpe *)base;
    if (!t) return;
    for (int i = 0; i < t->n_added; i++) tsr_free(t->added[i].text);
    tsr_free(t->added);
    tsr_free(t->blob);
    tsr_free(t->off);
    tsr_free(t->len);
    tsr_free(t->vslots);
    tsr_free(t->mslots);
    if (t->re) pcre2_code_free(t->re);
    if (t->digits) pcre2_code_free(t->digits);
    tsr_free(t);
}

/* ---- encode ------------------------------------------------------------------------- */

typedef struct tsr__cand {
    int32_t rank;
    int32_t left, right;
    int32_t a, b, id; /* the pair as pushed; stale when the symbols' ids changed */
} tsr__cand;

static bool tsr__cand_before(const tsr__cand *x, const tsr__cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

TSR_HEAP_DEFINE(tsr__heap, tsr__cand, tsr__cand_before)

typedef struct tsr__sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
} tsr__sym;

/* Per-encode scratch, sized for the longest piece (the whole text). */
typedef struct tsr__scratch {
    tsr__sym *sym;
    tsr__cand *heap;
    int32_t *ids;
    size_t n_ids;
} tsr__scratch;

static void tsr__bpe_try_pair(const tsr__bpe *t, const tsr__sym *sym, int32_t left,
                              tsr__cand *heap, size_t *nheap) {
    if (left < 0) return;
    int32_t right = sym[left].next;
    if (right < 0) return;
    const tsr__merge *m = tsr__merge_lookup(t, sym[left].id, sym[right].id);
    if (!m) return;
    tsr__heap_push(heap, nheap,
                   (tsr__cand){m->rank, left, right, sym[left].id, sym[right].id, m->id});
}

static void tsr__bpe_word(const tsr__bpe *t, const char *w, size_t n, tsr__scratch *sc) {
    if (n == 0) return;
    if (t->ignore_merges) {
        int32_t id = tsr__vocab_lookup(t, w, n);
        if (id >= 0) {
            sc->ids[sc->n_ids++] = id;
            return;
        }
    }
    tsr__sym *sym = sc->sym;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(uint8_t)w[i]];
        if (id < 0) id = t->unk_id;
        if (id < 0) continue; /* no byte token and no unk: dropped, as tokenizers does */
        sym[ns] = (tsr__sym){id, ns - 1, ns + 1, true};
        ns++;
    }
    if (ns == 0) return;
    sym[ns - 1].next = -1;
    size_t nheap = 0;
    for (int32_t i = 0; i + 1 < ns; i++) tsr__bpe_try_pair(t, sym, i, sc->heap, &nheap);
    while (nheap > 0) {
        tsr__cand c = tsr__heap_pop(sc->heap, &nheap);
        tsr__sym *l = &sym[c.left], *r = &sym[c.right];
        /* A symbol's token only grows, so matching ids mean the pair is unchanged. */
        if (!l->alive || !r->alive || l->next != c.right || l->id != c.a || r->id != c.b)
            continue;
        l->id = c.id;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        r->alive = false;
        tsr__bpe_try_pair(t, sym, l->prev, sc->heap, &nheap);
        tsr__bpe_try_pair(t, sym, c.left, sc->heap, &nheap);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) sc->ids[sc->n_ids++] = sym[i].id;
}

/* Splits text[0..n) with `re` (stage 0: the Digits step, whose pieces and gaps then go
 * through stage 1; stage 1: the Split/ByteLevel regex, whose pieces are BPE words). */
static tsr_status tsr__bpe_split(const tsr__bpe *t, int stage, const char *text, size_t n,
                                 pcre2_match_data *md, tsr__scratch *sc);

static tsr_status tsr__bpe_piece(const tsr__bpe *t, int stage, const char *text, size_t n,
                                 pcre2_match_data *md, tsr__scratch *sc) {
    if (stage == 0) return tsr__bpe_split(t, 1, text, n, md, sc);
    tsr__bpe_word(t, text, n, sc);
    return TSR_OK;
}

static tsr_status tsr__bpe_split(const tsr__bpe *t, int stage, const char *text, size_t n,
                                 pcre2_match_data *md, tsr__scratch *sc) {
    const pcre2_code *re = stage == 0 ? t->digits : t->re;
    if (!re) return tsr__bpe_piece(t, stage, text, n, md, sc);
    size_t pos = 0;
    uint32_t opts = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, n, pos, opts, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT; /* a huge whitespace run: the interpreter copes */
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            TSR_TRY(tsr__bpe_piece(t, stage, text + pos, n - pos, md, sc));
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tsr_error_set(TSR_ERR_INTERNAL, "bpe encode: regex match failed: %s",
                                 (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* the patterns used never match empty; be safe anyway */
            e = s + 1;
        }
        if (s > pos) /* unmatched bytes (invalid UTF-8, or text between digits) */
            TSR_TRY(tsr__bpe_piece(t, stage, text + pos, s - pos, md, sc));
        TSR_TRY(tsr__bpe_piece(t, stage, text + s, e - s, md, sc));
        pos = e;
    }
    return TSR_OK;
}

/* Pre-tokenizes text[0..n) (no added tokens inside) and encodes every piece. */
static tsr_status tsr__bpe_span(const tsr__bpe *t, const char *text, size_t n,
                                pcre2_match_data *md, tsr__scratch *sc) {
    return tsr__bpe_split(t, 0, text, n, md, sc);
}

/* Longest added token at text[i..n), or -1. */
static int tsr__added_at(const tsr__bpe *t, const char *text, size_t i, size_t n) {
    if (!t->added_first[(uint8_t)text[i]]) return -1;
    int best = -1;
    for (int k = 0; k < t->n_added; k++) {
        const tsr__added *a = &t->added[k];
        if (a->len <= n - i && memcmp(text + i, a->text, a->len) == 0 &&
            (best < 0 || a->len > t->added[best].len))
            best = k;
    }
    return best;
}

static tsr_status tsr__bpe_encode(const tsr_tokenizer *base, const char *text, size_t len,
                                  bool bos, bool eos, int32_t **ids_out, size_t *n_out) {
    const tsr__bpe *t = (const tsr__bpe *)base;
    *ids_out = NULL;
    *n_out = 0;
    if (len > (size_t)INT32_MAX / 4)
        return tsr_error_set(TSR_ERR_INVALID, "bpe encode: text of %zu bytes is too long", len);
    tsr__scratch sc = {0};
    pcre2_match_data *md = NULL;
    tsr_status st = TSR_OK;
    /* Every id covers at least one byte, plus BOS and EOS. */
    sc.ids = tsr_malloc((len + 2) * sizeof *sc.ids);
    sc.sym = tsr_malloc((len + 1) * sizeof *sc.sym);
    sc.heap = tsr_malloc((3 * len + 1) * sizeof *sc.heap);
    const pcre2_code *md_re = t->re ? t->re : t->digits;
    if (md_re) md = pcre2_match_data_create_from_pattern(md_re, NULL);
    if (!sc.ids || !sc.sym || !sc.heap || (md_re && !md)) {
        st = tsr_error_set(TSR_ERR_NOMEM, "bpe encode: out of memory for %zu bytes", len);
        goto done;
    }
    if (bos && t->base.bos_id >= 0) sc.ids[sc.n_ids++] = t->base.bos_id;
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int k = t->n_added ? tsr__added_at(t, text, i, len) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        TSR_TRY_GOTO(tsr__bpe_span(t, text + start, i - start, md, &sc), st, done);
        sc.ids[sc.n_ids++] = t->added[k].id;
        i += t->added[k].len;
        start = i;
    }
    TSR_TRY_GOTO(tsr__bpe_span(t, text + start, len - start, md, &sc), st, done);
    if (eos && t->base.eos_id >= 0) sc.ids[sc.n_ids++] = t->base.eos_id;
done:
    if (md) pcre2_match_data_free(md);
    tsr_free(sc.sym);
    tsr_free(sc.heap);
    if (st != TSR_OK) {
        tsr_free(sc.ids);
        return st;
    }
    *ids_out = sc.ids;
    *n_out = sc.n_ids;
    return TSR_OK;
}

static int tsr__bpe_decode(const tsr_tokenizer *base, int32_t prev, int32_t id, char *buf,
                           size_t cap) {
    (void)prev; /* byte-level BPE carries its spaces inside the tokens */
    const tsr__bpe *t = (const tsr__bpe *)base;
    if (id < 0 || id >= t->base.vocab_size || t->len[id] == UINT32_MAX) return 0;
    size_t n = t->len[id];
    if (n > cap) return -1;
    memcpy(buf, t->blob + t->off[id], n);
    return (int)n;
}

static const tsr_tokenizer_ops tsr__bpe_ops = {
    .name = "bpe",
    .encode = tsr__bpe_encode,
    .decode = tsr__bpe_decode,
    .destroy = tsr__bpe_destroy,
};

/* ---- load --------------------------------------------------------------------------- */


/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. unicode_to_byte inverts it (-1: not a byte-level codepoint). */
static void tsr__byte_map(int16_t unicode_to_byte[324]) {
    for (int i = 0; i < 324; i++) unicode_to_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        int cp = direct ? b : 256 + extra++;
        unicode_to_byte[cp] = (int16_t)b;
    }
}

/* Decodes one UTF-8 codepoint (the JSON parser guarantees valid UTF-8 from escapes, but
 * raw bytes may be anything). Returns its length, or 0 when invalid. */
static int tsr__utf8_cp(const unsigned char *s, size_t avail, uint32_t *cp) {
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || (size_t)n > avail) return 0;
    uint32_t v = n == 1 ? c : c & (0x7Fu >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    *cp = v;
    return n;
}

/* Byte-level token string -> raw bytes into out (never longer than s). A string with a
 * codepoint outside the byte map is kept as its UTF-8 bytes. Returns the length. */
static size_t tsr__unbyte(const int16_t map[324], const char *s, char *out) {
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        int k = tsr__utf8_cp((const unsigned char *)s + i, n - i, &cp);
        if (k == 0 || cp >= 324 || map[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)map[cp];
        i += (size_t)k;
    }
    return o;
}

/* What the pre_tokenizer asks for: a Split regex and/or a ByteLevel step. */
typedef struct tsr__pretok {
    const char *digits;  /* Digits: "\\p{N}" (individual_digits) or "\\p{N}+", or NULL */
    const char *split;   /* Split's Regex, or NULL */
    bool byte_level;     /* a ByteLevel step is present */
    bool byte_regex;     /* ...with use_regex (the GPT-2 pattern) */
} tsr__pretok;

static tsr_status tsr__parse_pretok(const char *path, const cJSON *pt, tsr__pretok *p) {
    if (!pt || cJSON_IsNull(pt)) return TSR_OK;
    const cJSON *type = cJSON_GetObjectItem(pt, "type");
    if (!cJSON_IsString(type))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: pre_tokenizer without a type", path);
    const char *ty = type->valuestring;
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItem(pt, "pretokenizers")) {
            TSR_TRY(tsr__parse_pretok(path, item, p));
        }
        return TSR_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        const cJSON *use_regex = cJSON_GetObjectItem(pt, "use_regex");
        if (cJSON_IsTrue(cJSON_GetObjectItem(pt, "add_prefix_space")))
            return tsr_error_set(TSR_ERR_UNSUPPORTED,
                                 "%s: ByteLevel add_prefix_space is not supported", path);
        p->byte_level = true;
        p->byte_regex = !cJSON_IsFalse(use_regex); /* tokenizers' default is true */
        return TSR_OK;
    }
    if (strcmp(ty, "Digits") == 0) {
        /* Tessera runs Digits first; later in a Sequence it would split the same pieces only
         * if nothing before it merged digits with other characters. */
        if (p->split || p->byte_level)
            return tsr_error_set(TSR_ERR_UNSUPPORTED,
                                 "%s: a Digits pre-tokenizer after Split/ByteLevel is not "
                                 "supported", path);
        p->digits = cJSON_IsTrue(cJSON_GetObjectItem(pt, "individual_digits")) ? "\\p{N}"
                                                                              : "\\p{N}+";
        return TSR_OK;
    }
    if (strcmp(ty, "Split") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: pre-tokenizer %s is not supported", path,
                             ty);
    const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(pt, "pattern"), "Regex");
    const cJSON *behavior = cJSON_GetObjectItem(pt, "behavior");
    if (!cJSON_IsString(re) ||
        (cJSON_IsString(behavior) && strcmp(behavior->valuestring, "Isolated") != 0) ||
        cJSON_IsTrue(cJSON_GetObjectItem(pt, "invert")))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: only a Split pre-tokenizer with a Regex pattern and "
                             "behavior Isolated is supported", path);
    if (p->split)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: more than one Split pre-tokenizer",
                             path);
    p->split = re->valuestring;
    return TSR_OK;
}

static tsr_status tsr__compile(const char *path, const char *regex, pcre2_code **out) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    *out = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tsr_error_set(TSR_ERR_FORMAT, "%s: pre-tokenizer regex fails at offset %zu: %s",
                             path, (size_t)err_off, (const char *)msg);
    }
    (void)pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return TSR_OK;
}

static tsr_status tsr__bpe_build(const char *path, const cJSON *doc, tsr__bpe *t) {
    const cJSON *model = cJSON_GetObjectItem(doc, "model");
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: no model.vocab object", path);
    const cJSON *mtype = cJSON_GetObjectItem(model, "type");
    if (cJSON_IsString(mtype) && strcmp(mtype->valuestring, "BPE") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: model type %s (only BPE is supported)",
                             path, mtype->valuestring);
    if (cJSON_IsTrue(cJSON_GetObjectItem(model, "byte_fallback")))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: byte_fallback BPE (SentencePiece-style) is not supported; "
                             "use tokenizer.bin", path);
    const cJSON *norm = cJSON_GetObjectItem(doc, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItem(norm, "type");
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: normalizer %s is not supported", path,
                             cJSON_IsString(nt) ? nt->valuestring : "(untyped)");
    }
    const cJSON *merges = cJSON_GetObjectItem(model, "merges");
    if (merges && !cJSON_IsArray(merges))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges is not an array", path);
    const cJSON *added = cJSON_GetObjectItem(doc, "added_tokens");
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItem(model, "ignore_merges"));

    /* Ids and an upper bound on the token bytes (un-byte-mapping never grows a string). */
    int max_id = -1, n_vocab = 0, n_added = 0;
    size_t bytes = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= TSR__MAX_ID ||
            it->valuedouble != (double)it->valueint)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: model.vocab[\"%s\"] is not a valid id",
                                 path, it->string);
        if (it->valueint > max_id) max_id = it->valueint;
        bytes += strlen(it->string);
        n_vocab++;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItem(it, "id");
        const cJSON *content = cJSON_GetObjectItem(it, "content");
        if (!cJSON_IsNumber(id) || id->valueint < 0 || id->valueint >= TSR__MAX_ID ||
            !cJSON_IsString(content) || !content->valuestring[0])
            return tsr_error_set(TSR_ERR_FORMAT, "%s: added_tokens[%d] lacks a valid id/content",
                                 path, n_added);
        if (id->valueint > max_id) max_id = id->valueint;
        bytes += strlen(content->valuestring);
        n_added++;
    }
    if (n_vocab == 0) return tsr_error_set(TSR_ERR_FORMAT, "%s: model.vocab is empty", path);
    if (bytes >= UINT32_MAX)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: vocabulary too large", path);
    size_t n_ids = (size_t)max_id + 1;
    uint32_t vslots = 16;
    while (vslots < 2 * (uint32_t)n_vocab) vslots *= 2;
    t->blob = tsr_malloc(bytes + 1);
    t->off = tsr_malloc(n_ids * sizeof *t->off);
    t->len = tsr_malloc(n_ids * sizeof *t->len);
    t->vslots = tsr_malloc(vslots * sizeof *t->vslots);
    t->added = tsr_calloc((size_t)n_added + 1, sizeof *t->added);
    if (!t->blob || !t->off || !t->len || !t->vslots || !t->added) return TSR_ERR_NOMEM;
    t->base.vocab_size = (int)n_ids;
    t->vmask = vslots - 1;
    memset(t->vslots, 0xff, vslots * sizeof *t->vslots);
    for (size_t i = 0; i < n_ids; i++) t->len[i] = UINT32_MAX, t->off[i] = 0;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    int16_t map[324];
    tsr__byte_map(map);

    cJSON_ArrayForEach(it, vocab) {
        int id = it->valueint;
        if (t->len[id] != UINT32_MAX)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: id %d appears twice in model.vocab",
                                 path, id);
        char *dst = t->blob + t->blob_len;
        size_t n = tsr__unbyte(map, it->string, dst);
        uint32_t h = tsr__hash(dst, n) & t->vmask;
        for (; t->vslots[h] >= 0; h = (h + 1) & t->vmask) {
            int32_t o = t->vslots[h];
            if (t->len[o] == n && memcmp(t->blob + t->off[o], dst, n) == 0)
                return tsr_error_set(TSR_ERR_FORMAT,
                                     "%s: model.vocab has \"%s\" twice (ids %d and %d)", path,
                                     it->string, (int)o, id);
        }
        t->off[id] = (uint32_t)t->blob_len;
        t->len[id] = (uint32_t)n;
        t->vslots[h] = id;
        t->blob_len += n;
        if (n == 1 && t->byte_id[(uint8_t)dst[0]] < 0) t->byte_id[(uint8_t)dst[0]] = id;
    }

    /* Added tokens decode to their text and are matched whole in the input. */
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItem(it, "id")->valueint;
        const char *content = cJSON_GetObjectItem(it, "content")->valuestring;
        size_t n = strlen(content);
        tsr__added *a = &t->added[t->n_added];
        a->text = tsr_strdup(content);
        if (!a->text) return TSR_ERR_NOMEM;
        a->len = n;
        a->id = id;
        t->n_added++;
        t->added_first[(uint8_t)content[0]] = 1;
        memcpy(t->blob + t->blob_len, content, n);
        t->off[id] = (uint32_t)t->blob_len;
        t->len[id] = (uint32_t)n;
        t->blob_len += n;
        if (strcmp(content, "<|begin_of_text|>") == 0) t->base.bos_id = id;
        if ((strcmp(content, "<|end_of_text|>") == 0 || strcmp(content, "<|eot_id|>") == 0) &&
            t->base.n_eos_ids < 8)
            t->base.eos_ids[t->base.n_eos_ids++] = id;
    }
    if (t->base.n_eos_ids == 0) { /* GPT-2 / Qwen style vocabularies */
        for (int k = 0; k < t->n_added; k++)
            if (strcmp(t->added[k].text, "<|endoftext|>") == 0)
                t->base.eos_ids[t->base.n_eos_ids++] = t->added[k].id;
    }
    if (t->base.n_eos_ids > 0) t->base.eos_id = t->base.eos_ids[0];
    const cJSON *unk = cJSON_GetObjectItem(model, "unk_token");
    if (cJSON_IsString(unk)) {
        const cJSON *uid = cJSON_GetObjectItem(vocab, unk->valuestring);
        if (cJSON_IsNumber(uid)) t->unk_id = uid->valueint;
    }

    /* Merges: pair of ids -> rank and merged id. */
    int n_merges = cJSON_GetArraySize(merges);
    uint64_t mslots = 16;
    while (mslots < 2 * (uint64_t)n_merges) mslots *= 2;
    t->mslots = tsr_malloc(mslots * sizeof *t->mslots);
    char *tmp = tsr_malloc(2 * (bytes + 2) + 2);
    if (!t->mslots || !tmp) {
        tsr_free(tmp);
        return TSR_ERR_NOMEM;
    }
    t->mmask = mslots - 1;
    for (uint64_t i = 0; i < mslots; i++) t->mslots[i].key = UINT64_MAX;
    tsr_status st = TSR_OK;
    int rank = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        char *split = NULL;
        if (cJSON_IsString(it)) {
            /* Legacy "a b": byte-level tokens never hold a raw space. */
            split = tsr_strdup(it->valuestring);
            if (!split) {
                st = TSR_ERR_NOMEM;
                break;
            }
            char *sp = strchr(split, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                *sp = '\0';
                a = split;
                b = sp + 1;
            }
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
        }
        if (!a || !b || strlen(a) > bytes || strlen(b) > bytes) {
            tsr_free(split);
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges[%d] is not a pair of tokens",
                               path, rank);
            break;
        }
        size_t na = tsr__unbyte(map, a, tmp);
        int32_t ia = tsr__vocab_lookup(t, tmp, na);
        size_t nb = tsr__unbyte(map, b, tmp + na);
        int32_t ib = tsr__vocab_lookup(t, tmp + na, nb);
        int32_t im = tsr__vocab_lookup(t, tmp, na + nb);
        if (ia < 0 || ib < 0 || im < 0) {
            st = tsr_error_set(TSR_ERR_FORMAT,
                               "%s: model.merges[%d] (\"%s\" \"%s\") uses a token missing from "
                               "model.vocab", path, rank, a, b);
            tsr_free(split);
            break;
        }
        tsr_free(split);
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint64_t h = tsr__mix64(key) & t->mmask;
        while (t->mslots[h].key != UINT64_MAX && t->mslots[h].key != key) h = (h + 1) & t->mmask;
        if (t->mslots[h].key == UINT64_MAX) /* a repeated pair keeps its first rank */
            t->mslots[h] = (tsr__merge){key, rank, im};
        rank++;
    }
    tsr_free(tmp);
    if (st != TSR_OK) return st;

    /* Llama 3: Split(llama-3 regex) then ByteLevel(use_regex=false). GPT-2 style files use
     * ByteLevel's own regex. Neither: each span between added tokens is one piece. */
    tsr__pretok pre = {0};
    TSR_TRY(tsr__parse_pretok(path, cJSON_GetObjectItem(doc, "pre_tokenizer"), &pre));
    if (pre.split && pre.byte_regex)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: Split followed by ByteLevel(use_regex=true) is not supported",
                             path);
    const char *regex = pre.split ? pre.split : pre.byte_regex ? TSR__GPT2_REGEX : NULL;
    if (pre.digits) TSR_TRY(tsr__compile(path, pre.digits, &t->digits));
    if (!regex) return TSR_OK;
    return tsr__compile(path, regex, &t->re);
}

static tsr_status tsr__bpe_from_doc(const char *path, const cJSON *doc, tsr__bpe **out) {
    *out = NULL;
    tsr__bpe *t = tsr_calloc(1, sizeof *t);
    if (!t) return TSR_ERR_NOMEM;
    t->base.ops = &tsr__bpe_ops;
    t->base.bos_id = -1;
    t->base.eos_id = -1;
    t->unk_id = -1;
    tsr_status st = tsr__bpe_build(path, doc, t);
    if (st != TSR_OK) {
        tsr__bpe_destroy(&t->base);
        return st;
    }
    *out = t;
    return TSR_OK;
}

tsr_status tsr_tokenizer_load_bpe(const char *path, tsr_tokenizer **out) {
    *out = NULL;
    char *data = NULL;
    size_t size = 0;
    TSR_TRY(tsr_file_read(path, "tokenizer", 0, &data, &size));
    cJSON *doc = cJSON_ParseWithLength(data, size);
    if (!doc) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= data && at <= data + size ? (long)(at - data) : -1;
        tsr_free(data);
        return tsr_error_set(TSR_ERR_FORMAT, "%s: not valid JSON (near byte %ld)", path, off);
    }
    tsr_free(data);
    tsr__bpe *t;
    tsr_status st = tsr__bpe_from_doc(path, doc, &t);
    cJSON_Delete(doc);
    if (st == TSR_OK) *out = &t->base;
    return st;
}

/* ---- GGUF metadata ---------------------------------------------------------------------- */

/* llama.cpp's tokenizer.ggml.pre names -> the HF pre_tokenizer they stand for. */
#define TSR__LLAMA3_REGEX                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "               \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TSR__QWEN2_REGEX                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                    \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static tsr_status tsr__gguf_pretok(const tsr_gguf *g, const char *pre, cJSON *doc) {
    cJSON *seq = cJSON_AddObjectToObject(doc, "pre_tokenizer");
    if (!seq) return TSR_ERR_NOMEM;
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON *a = cJSON_CreateObject(), *b = cJSON_CreateObject();
    if (!list || !a || !b) {
        cJSON_Delete(a);
        cJSON_Delete(b);
        return TSR_ERR_NOMEM;
    }
    cJSON_AddItemToArray(list, a);
    cJSON_AddItemToArray(list, b);
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2")) {
        cJSON_DetachItemFromArray(list, 0); /* ByteLevel's own regex only */
        cJSON_Delete(a);
        return TSR_OK;
    }
    if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder")) {
        /* HF: Sequence[Digits(individual_digits), ByteLevel(use_regex)] */
        cJSON_AddStringToObject(a, "type", "Digits");
        cJSON_AddBoolToObject(a, "individual_digits", 1);
        return TSR_OK;
    }
    const char *re = !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") ? TSR__LLAMA3_REGEX
                     : !strcmp(pre, "qwen2")                            ? TSR__QWEN2_REGEX
                                                                        : NULL;
    if (!re)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: tokenizer pre-tokenizer \"%.48s\" is not supported (tessera "
                             "knows smollm, starcoder, llama-bpe, qwen2, gpt2)", g->path, pre);
    cJSON_AddStringToObject(a, "type", "Split");
    cJSON *pat = cJSON_AddObjectToObject(a, "pattern");
    if (!pat) return TSR_ERR_NOMEM;
    cJSON_AddStringToObject(pat, "Regex", re);
    cJSON_AddStringToObject(a, "behavior", "Isolated");
    cJSON_AddBoolToObject(b, "use_regex", 0);
    return TSR_OK;
}

/* Token strings must be NUL-free to pass through cJSON (they never hold NUL in practice). */
static tsr_status tsr__gguf_tok(const tsr_gguf *g, const tsr_gguf_kv *kv, uint64_t i,
                                char **out) {
    const char *s;
    uint64_t n;
    tsr_gguf_arr_str(kv, i, &s, &n);
    if (n == 0 || memchr(s, 0, (size_t)n))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: %s[%llu] is empty or holds a NUL byte",
                             g->path, kv->key, (unsigned long long)i);
    *out = tsr_malloc((size_t)n + 1);
    if (!*out) return TSR_ERR_NOMEM;
    memcpy(*out, s, (size_t)n);
    (*out)[n] = '\0';
    return TSR_OK;
}

/* Builds the tokenizer.json equivalent of the GGUF tokenizer metadata. */
static tsr_status tsr__gguf_doc(const tsr_gguf *g, cJSON *doc) {
    const char *model = NULL, *pre = NULL;
    bool have;
    TSR_TRY(tsr_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL));
    if (strcmp(model, "gpt2") != 0)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: tokenizer model \"%.32s\" is not supported (tessera reads "
                             "gpt2 byte-level BPE from GGUF)", g->path, model);
    TSR_TRY(tsr_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &have));
    const tsr_gguf_kv *toks = tsr_gguf_find(g, "tokenizer.ggml.tokens");
    const tsr_gguf_kv *types = tsr_gguf_find(g, "tokenizer.ggml.token_type");
    const tsr_gguf_kv *merges = tsr_gguf_find(g, "tokenizer.ggml.merges");
    if (!toks || toks->type != TSR_GGUF_ARRAY || toks->elem != TSR_GGUF_STRING)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing or not a "
                             "string array", g->path);
    if (toks->n == 0 || toks->n > (1 << 24))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                             g->path, (unsigned long long)toks->n);
    if (types && (types->type != TSR_GGUF_ARRAY || types->n != toks->n ||
                  types->elem == TSR_GGUF_STRING || types->elem == TSR_GGUF_ARRAY ||
                  types->elem == TSR_GGUF_F32 || types->elem == TSR_GGUF_F64))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.token_type does not match the "
                             "tokens", g->path);
    if (merges && (merges->type != TSR_GGUF_ARRAY || merges->elem != TSR_GGUF_STRING))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.merges is not a string array",
                             g->path);
    cJSON *m = cJSON_AddObjectToObject(doc, "model");
    cJSON *vocab = m ? cJSON_AddObjectToObject(m, "vocab") : NULL;
    cJSON *marr = m ? cJSON_AddArrayToObject(m, "merges") : NULL;
    cJSON *added = cJSON_AddArrayToObject(doc, "added_tokens");
    if (!vocab || !marr || !added) return TSR_ERR_NOMEM;
    cJSON_AddStringToObject(m, "type", "BPE");
    for (uint64_t i = 0; i < toks->n; i++) {
        char *s;
        TSR_TRY(tsr__gguf_tok(g, toks, i, &s));
        /* Control (3) and user-defined (4) tokens are matched whole, like HF added tokens. */
        int64_t ty = types ? tsr_gguf_arr_int(types, i) : 1;
        cJSON *item;
        if (ty == 3 || ty == 4) {
            item = cJSON_CreateObject();
            if (item) {
                cJSON_AddNumberToObject(item, "id", (double)i);
                cJSON_AddStringToObject(item, "content", s);
                cJSON_AddItemToArray(added, item);
            }
        } else {
            item = cJSON_CreateNumber((double)i);
            if (item) cJSON_AddItemToObject(vocab, s, item);
        }
        tsr_free(s);
        if (!item) return TSR_ERR_NOMEM;
    }
    for (uint64_t i = 0; merges && i < merges->n; i++) {
        char *s;
        TSR_TRY(tsr__gguf_tok(g, merges, i, &s));
        cJSON *item = cJSON_CreateString(s);
        tsr_free(s);
        if (!item) return TSR_ERR_NOMEM;
        cJSON_AddItemToArray(marr, item);
    }
    return tsr__gguf_pretok(g, have ? pre : NULL, doc);
}

tsr_status tsr_tokenizer_load_gguf(const char *path, tsr_tokenizer **out) {
    *out = NULL;
    tsr_gguf *g;
    TSR_TRY(tsr_gguf_open(path, &g));
    cJSON *doc = cJSON_CreateObject();
    tsr_status st = doc ? tsr__gguf_doc(g, doc) : TSR_ERR_NOMEM;
    tsr__bpe *t = NULL;
    if (st == TSR_OK) st = tsr__bpe_from_doc(path, doc, &t);
    cJSON_Delete(doc);
    /* The file's own special ids and add-BOS flag replace what the names suggested. */
    int64_t v;
    bool have, add_bos = false;
    if (st == TSR_OK) st = tsr_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, &have);
    if (st == TSR_OK) st = tsr_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v, &have);
    if (st == TSR_OK) {
        t->base.bos_id = add_bos && have && v >= 0 && v < t->base.vocab_size ? (int)v : -1;
        t->base.n_eos_ids = 0;
        static const char *const keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0] && st == TSR_OK; i++) {
            st = tsr_gguf_get_int(g, keys[i], &v, &have);
            if (st == TSR_OK && have && v >= 0 && v < t->base.vocab_size)
                t->base.eos_ids[t->base.n_eos_ids++] = (int)v;
        }
        t->base.eos_id = t->base.n_eos_ids ? t->base.eos_ids[0] : -1;
    }
    tsr_gguf_close(g);
    if (st != TSR_OK) {
        if (t) tsr__bpe_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return TSR_OK;
}
