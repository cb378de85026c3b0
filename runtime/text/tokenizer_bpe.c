/* Hugging Face tokenizer.json BPE: byte-level (GPT-2 byte map: Llama 3, Qwen2, SmolLM2) and
 * SentencePiece converted to BPE (byte_fallback: Llama 2, Mistral); also the GGUF gpt2
 * tokenizer, through an equivalent tokenizer.json built from the metadata.
 *
 * Encode: split the text on added tokens (whole matches, leftmost-longest); normalize each
 * remaining span (NFC, Prepend, Replace, in the file's order); pre-tokenize it through the
 * file's steps as a pipeline, each splitting every piece of the one before (Split's regex and
 * Digits through PCRE2, ByteLevel's optional prefix space and GPT-2 regex); then run BPE on
 * each piece, from its bytes (byte-level) or characters (byte_fallback, with <0xXX> tokens
 * for characters outside the vocabulary), merging the lowest-ranked pair first (leftmost on
 * ties), as tokenizers' word.rs does. Invalid UTF-8 never matches a regex
 * (PCRE2_MATCH_INVALID_UTF); the gaps it leaves become their own pieces, so every byte is
 * still encoded. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/utf8.h"
#include "runtime/format/gguf.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_nfc.h"

/* ByteLevel(use_regex=true), GPT-2. */
#define TSR__GPT2_REGEX                                                                     \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

#define TSR__MAX_ID (1 << 26)
#define TSR__MAX_STAGES 8

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
    /* The pre-tokenizer as a pipeline: each stage splits every piece of the one before
     * (Isolated: matches and the gaps between them), after prepending a space to pieces that
     * lack one when prefix_space (ByteLevel add_prefix_space); re NULL keeps the piece. */
    int n_stages;
    struct {
        pcre2_code *re;
        bool prefix_space;
        /* Metaspace: spaces become meta (e.g. U+2581), which is prepended too (meta_prepend
         * 1: always, 2: only to the piece at the start of the text) unless there already. */
        char meta[8];
        int meta_prepend;
    } stage[TSR__MAX_STAGES];
    /* The normalizer's steps in order, applied to each span between added tokens. */
    int n_norm;
    struct {
        enum { TSR__NORM_NFC, TSR__NORM_PREPEND, TSR__NORM_REPLACE } kind;
        char *from, *to; /* Prepend: to; Replace: every `from` becomes `to` */
    } norm[TSR__MAX_STAGES];
    /* SentencePiece-style BPE (Llama 2, Mistral): vocabulary strings are raw UTF-8, words
     * start as characters, a character missing from the vocabulary becomes its <0xXX>
     * byte tokens (byte_fallback) or unk. */
    bool raw_vocab, byte_fallback, fuse_unk;
    /* Decoder: Replace(dec_from -> dec_to), ByteFallback, Strip(dec_strip leading spaces
     * of the whole text). */
    char *dec_from, *dec_to;
    int dec_strip;
    bool dec_byte_fallback;
    bool dec_meta_first; /* Metaspace decoder: the first token loses every dec_from */
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
    for (int i = 0; i < t->n_stages; i++)
        if (t->stage[i].re) pcre2_code_free(t->stage[i].re);
    for (int i = 0; i < t->n_norm; i++) {
        tsr_free(t->norm[i].from);
        tsr_free(t->norm[i].to);
    }
    tsr_free(t->dec_from);
    tsr_free(t->dec_to);
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
    size_t n_ids, cap_ids;
    size_t cap_piece;                /* sym, heap and each pbuf hold a piece this long */
    char *pbuf[TSR__MAX_STAGES];     /* a piece with its prefix space, per stage */
    pcre2_match_data *md;
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
    for (size_t i = 0; i < n;) {
        /* Byte-level: one symbol per byte. Raw: one per character, else its byte tokens. */
        size_t k = 1;
        int32_t id;
        if (t->raw_vocab) {
            uint32_t cp;
            int cl = tsr_utf8_decode((const unsigned char *)w + i, n - i, &cp);
            k = cl > 0 ? (size_t)cl : 1;
            id = tsr__vocab_lookup(t, w + i, k);
            if (id < 0 && t->byte_fallback) {
                bool all = true;
                for (size_t j = 0; j < k; j++) all = all && t->byte_id[(uint8_t)w[i + j]] >= 0;
                if (all) {
                    for (size_t j = 0; j < k; j++, ns++)
                        sym[ns] = (tsr__sym){t->byte_id[(uint8_t)w[i + j]], ns - 1, ns + 1, true};
                    i += k;
                    continue;
                }
            }
        } else {
            id = t->byte_id[(uint8_t)w[i]];
        }
        i += k;
        if (id < 0) id = t->unk_id;
        if (id < 0) continue; /* no token and no unk: dropped, as tokenizers does */
        if (id == t->unk_id && t->fuse_unk && ns > 0 && sym[ns - 1].id == id) continue;
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

/* Runs stage `k` of the pre-tokenizer on text[0..n); past the last stage, a piece is a BPE
 * word. */
static tsr_status tsr__bpe_split(const tsr__bpe *t, int k, const char *text, size_t n,
                                 bool at_start, tsr__scratch *sc) {
    if (n == 0) return TSR_OK; /* tokenizers drops empty pieces */
    if (k == t->n_stages) {
        tsr__bpe_word(t, text, n, sc);
        return TSR_OK;
    }
    if (t->stage[k].prefix_space && text[0] != ' ') {
        sc->pbuf[k][0] = ' ';
        memcpy(sc->pbuf[k] + 1, text, n);
        text = sc->pbuf[k];
        n++;
    } else if (t->stage[k].meta[0]) {
        const char *m = t->stage[k].meta;
        size_t ml = strlen(m), w = 0;
        char *o = sc->pbuf[k];
        bool has = text[0] == ' ' || (n >= ml && memcmp(text, m, ml) == 0);
        int pre = t->stage[k].meta_prepend;
        if (!has && (pre == 1 || (pre == 2 && at_start))) {
            memcpy(o, m, ml);
            w = ml;
        }
        for (size_t i = 0; i < n; i++) {
            if (text[i] == ' ') {
                memcpy(o + w, m, ml);
                w += ml;
            } else {
                o[w++] = text[i];
            }
        }
        text = o;
        n = w;
    }
    const pcre2_code *re = t->stage[k].re;
    if (!re) return tsr__bpe_split(t, k + 1, text, n, at_start, sc);
    size_t pos = 0;
    uint32_t opts = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, n, pos, opts, sc->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT; /* a huge whitespace run: the interpreter copes */
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            TSR_TRY(tsr__bpe_split(t, k + 1, text + pos, n - pos, at_start && pos == 0, sc));
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tsr_error_set(TSR_ERR_INTERNAL, "bpe encode: regex match failed: %s",
                                 (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* the patterns used never match empty; be safe anyway */
            e = s + 1;
        }
        /* The match vector is reused by the stages below: keep what is needed first. */
        if (s > pos) /* unmatched bytes (invalid UTF-8, or text between digits) */
            TSR_TRY(tsr__bpe_split(t, k + 1, text + pos, s - pos, at_start && pos == 0, sc));
        TSR_TRY(tsr__bpe_split(t, k + 1, text + s, e - s, at_start && s == 0, sc));
        pos = e;
    }
    return TSR_OK;
}

/* Grows the scratch for a span of n bytes: every stage may prepend one space to a piece, a
 * Metaspace stage (at most one) makes a piece at most 4 times longer plus its prefix, and
 * every piece byte becomes at most one id. */
static tsr_status tsr__scratch_reserve(const tsr__bpe *t, tsr__scratch *sc, size_t n) {
    bool meta = false;
    for (int k = 0; k < t->n_stages; k++) meta = meta || t->stage[k].meta[0];
    size_t piece = (n + (size_t)t->n_stages + 1) * (meta ? 4 : 1) + 8;
    size_t ids = sc->n_ids + piece * (size_t)(t->n_stages + 1) + 4;
    if (ids > sc->cap_ids) {
        int32_t *p = tsr_realloc(sc->ids, ids * sizeof *p);
        if (!p) return TSR_ERR_NOMEM;
        sc->ids = p;
        sc->cap_ids = ids;
    }
    if (piece <= sc->cap_piece) return TSR_OK;
    tsr_free(sc->sym);
    tsr_free(sc->heap);
    sc->sym = tsr_malloc(piece * sizeof *sc->sym);
    sc->heap = tsr_malloc(3 * piece * sizeof *sc->heap);
    bool ok = sc->sym && sc->heap;
    for (int k = 0; k < t->n_stages; k++) {
        tsr_free(sc->pbuf[k]);
        sc->pbuf[k] = tsr_malloc(piece);
        ok = ok && sc->pbuf[k];
    }
    if (!ok) return TSR_ERR_NOMEM;
    sc->cap_piece = piece;
    return TSR_OK;
}

/* Prepend (`to` before the text) or Replace (every `from` by `to`, left to right) into a new
 * buffer. */
static tsr_status tsr__norm_text(bool prepend, const char *from, const char *to,
                                 const char *text, size_t n, char **out, size_t *out_n) {
    size_t nf = from ? strlen(from) : 0, nt = strlen(to), count = 0;
    if (prepend) count = 1;
    else
        for (size_t i = 0; nf && i + nf <= n;)
            if (memcmp(text + i, from, nf) == 0) count++, i += nf;
            else i++;
    char *o = tsr_malloc(n + count * nt + 1);
    if (!o) return TSR_ERR_NOMEM;
    size_t w = 0;
    if (prepend) {
        memcpy(o, to, nt);
        memcpy(o + nt, text, n);
        w = nt + n;
    } else {
        for (size_t i = 0; i < n;)
            if (nf && i + nf <= n && memcmp(text + i, from, nf) == 0) {
                memcpy(o + w, to, nt);
                w += nt;
                i += nf;
            } else {
                o[w++] = text[i++];
            }
    }
    *out = o;
    *out_n = w;
    return TSR_OK;
}

/* Normalizes text[0..n) (no added tokens inside), pre-tokenizes it and encodes every piece. */
static tsr_status tsr__bpe_span(const tsr__bpe *t, const char *text, size_t n, bool at_start,
                                tsr__scratch *sc) {
    if (n == 0) return TSR_OK;
    char *norm = NULL;
    for (int k = 0; k < t->n_norm; k++) {
        char *next = NULL;
        size_t nn = 0;
        tsr_status st = TSR_OK;
        if (t->norm[k].kind == TSR__NORM_NFC) st = tsr_nfc(text, n, &next, &nn);
        else
            st = tsr__norm_text(t->norm[k].kind == TSR__NORM_PREPEND, t->norm[k].from,
                                t->norm[k].to, text, n, &next, &nn);
        tsr_free(norm);
        if (st != TSR_OK) return st;
        norm = next;
        text = norm;
        n = nn;
    }
    tsr_status st = tsr__scratch_reserve(t, sc, n);
    if (st == TSR_OK) st = tsr__bpe_split(t, 0, text, n, at_start, sc);
    tsr_free(norm);
    return st;
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
    tsr_status st = TSR_OK;
    const pcre2_code *md_re = NULL;
    for (int k = 0; k < t->n_stages; k++)
        if (t->stage[k].re) md_re = t->stage[k].re;
    if (md_re) sc.md = pcre2_match_data_create_from_pattern(md_re, NULL);
    if (md_re && !sc.md) {
        st = tsr_error_set(TSR_ERR_NOMEM, "bpe encode: out of memory for %zu bytes", len);
        goto done;
    }
    TSR_TRY_GOTO(tsr__scratch_reserve(t, &sc, 0), st, done);
    if (bos && t->base.bos_id >= 0) sc.ids[sc.n_ids++] = t->base.bos_id;
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int k = t->n_added ? tsr__added_at(t, text, i, len) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        TSR_TRY_GOTO(tsr__bpe_span(t, text + start, i - start, start == 0, &sc), st, done);
        TSR_TRY_GOTO(tsr__scratch_reserve(t, &sc, 0), st, done);
        sc.ids[sc.n_ids++] = t->added[k].id;
        i += t->added[k].len;
        start = i;
    }
    TSR_TRY_GOTO(tsr__bpe_span(t, text + start, len - start, start == 0, &sc), st, done);
    TSR_TRY_GOTO(tsr__scratch_reserve(t, &sc, 0), st, done);
    if (eos && t->base.eos_id >= 0) sc.ids[sc.n_ids++] = t->base.eos_id;
done:
    if (sc.md) pcre2_match_data_free(sc.md);
    tsr_free(sc.sym);
    tsr_free(sc.heap);
    for (int k = 0; k < TSR__MAX_STAGES; k++) tsr_free(sc.pbuf[k]);
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
    const tsr__bpe *t = (const tsr__bpe *)base;
    if (id < 0 || id >= t->base.vocab_size || t->len[id] == UINT32_MAX) return 0;
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    if (!t->raw_vocab) { /* byte-level BPE carries its spaces inside the tokens */
        if (n > cap) return -1;
        memcpy(buf, s, n);
        return (int)n;
    }
    /* tokenizers' Sequence[Replace, ByteFallback, Fuse, Strip]: Strip acts on the fused
     * text, so only the first token (prev < 0) loses its leading spaces. */
    char one;
    if (t->dec_byte_fallback && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
        unsigned v = 0;
        if (sscanf(s + 3, "%2X", &v) == 1) {
            one = (char)v;
            s = &one;
            n = 1;
        }
    }
    size_t nf = t->dec_from ? strlen(t->dec_from) : 0, nt = t->dec_to ? strlen(t->dec_to) : 0;
    size_t w = 0;
    int strip = prev < 0 ? t->dec_strip : 0;
    for (size_t i = 0; i < n;) {
        const char *piece = s + i;
        size_t pn = 1;
        if (nf && s != &one && i + nf <= n && memcmp(s + i, t->dec_from, nf) == 0) {
            piece = t->dec_to;
            pn = prev < 0 && t->dec_meta_first ? 0 : nt;
            i += nf;
        } else {
            i++;
        }
        for (size_t j = 0; j < pn; j++) {
            if (strip > 0 && w == 0 && piece[j] == ' ') {
                strip--;
                continue;
            }
            if (w == cap) return -1;
            buf[w++] = piece[j];
        }
    }
    return (int)w;
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

/* Byte-level token string -> raw bytes into out (never longer than s). A string with a
 * codepoint outside the byte map is kept as its UTF-8 bytes. Returns the length. */
static size_t tsr__unbyte(const int16_t map[324], const char *s, char *out) {
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        int k = tsr_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (k == 0 || cp >= 324 || map[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)map[cp];
        i += (size_t)k;
    }
    return o;
}

/* The pre_tokenizer's steps in order (tsr__bpe's stages, as regex text). */
typedef struct tsr__pretok {
    int n;
    const char *re[TSR__MAX_STAGES]; /* NULL: no split at this stage */
    bool prefix_space[TSR__MAX_STAGES];
    char meta[TSR__MAX_STAGES][8];
    int meta_prepend[TSR__MAX_STAGES];
    char meta_re[80]; /* Metaspace split's pattern */
} tsr__pretok;

static tsr_status tsr__add_stage(const char *path, tsr__pretok *p, const char *re,
                                 bool prefix_space) {
    if (p->n == TSR__MAX_STAGES)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps", path,
                             TSR__MAX_STAGES);
    p->re[p->n] = re;
    p->prefix_space[p->n] = prefix_space;
    p->n++;
    return TSR_OK;
}

static const char *tsr__str(const cJSON *o, const char *key, const char *sub);

/* Whether a pre_tokenizer (or one inside its Sequence) has type `ty`. */
static bool tsr__has_pretok(const cJSON *o, const char *ty) {
    const cJSON *t = cJSON_GetObjectItem(o, "type");
    if (cJSON_IsString(t) && strcmp(t->valuestring, ty) == 0) return true;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "pretokenizers")) {
        if (tsr__has_pretok(it, ty)) return true;
    }
    return false;
}

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
        /* tokenizers: every piece that does not start with a space gets one, then (use_regex,
         * the default) GPT-2's split. The byte mapping itself is in the vocabulary. */
        const cJSON *use_regex = cJSON_GetObjectItem(pt, "use_regex");
        return tsr__add_stage(path, p, cJSON_IsFalse(use_regex) ? NULL : TSR__GPT2_REGEX,
                              cJSON_IsTrue(cJSON_GetObjectItem(pt, "add_prefix_space")));
    }
    if (strcmp(ty, "Metaspace") == 0) {
        /* Spaces become the replacement, prepended per prepend_scheme (older files:
         * add_prefix_space means always); split cuts before every replacement
         * (MergedWithNext), as the regex below does with Isolated pieces. */
        const char *r = tsr__str(pt, "replacement", NULL);
        const char *scheme = tsr__str(pt, "prepend_scheme", NULL);
        uint32_t cp = 0;
        size_t rl = r ? strlen(r) : 0;
        if (!r || rl == 0 || rl > 4 ||
            tsr_utf8_decode((const unsigned char *)r, rl, &cp) != (int)rl || cp == ' ')
            return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: Metaspace needs a one-character "
                                 "replacement", path);
        for (int k = 0; k < p->n; k++)
            if (p->meta[k][0])
                return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: more than one Metaspace", path);
        int pre = scheme ? (!strcmp(scheme, "always") ? 1 : !strcmp(scheme, "first") ? 2
                            : !strcmp(scheme, "never") ? 0 : -1)
                         : cJSON_IsFalse(cJSON_GetObjectItem(pt, "add_prefix_space")) ? 0 : 1;
        if (pre < 0)
            return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme %s", path,
                                 scheme);
        const char *re = NULL;
        if (!cJSON_IsFalse(cJSON_GetObjectItem(pt, "split"))) {
            snprintf(p->meta_re, sizeof p->meta_re, "\\x{%X}[^\\x{%X}]*|[^\\x{%X}]+",
                     (unsigned)cp, (unsigned)cp, (unsigned)cp);
            re = p->meta_re;
        }
        TSR_TRY(tsr__add_stage(path, p, re, false));
        memcpy(p->meta[p->n - 1], r, rl + 1);
        p->meta_prepend[p->n - 1] = pre;
        return TSR_OK;
    }
    if (strcmp(ty, "Digits") == 0) /* Rust's char::is_numeric is \p{N} */
        return tsr__add_stage(path, p,
                              cJSON_IsTrue(cJSON_GetObjectItem(pt, "individual_digits"))
                                  ? "\\p{N}"
                                  : "\\p{N}+",
                              false);
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
    return tsr__add_stage(path, p, re->valuestring, false);
}

/* A string field of a normalizer or decoder (Replace's pattern must be a String). */
static const char *tsr__str(const cJSON *o, const char *key, const char *sub) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (sub) v = cJSON_GetObjectItem(v, sub);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Normalizers: NFC (Qwen2); Prepend and Replace with a String (Llama 2, Mistral); in a
 * Sequence. */
static tsr_status tsr__parse_norm(const char *path, const cJSON *n, tsr__bpe *t) {
    if (!n || cJSON_IsNull(n)) return TSR_OK;
    const cJSON *nt = cJSON_GetObjectItem(n, "type");
    const char *ty = cJSON_IsString(nt) ? nt->valuestring : "(untyped)";
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItem(n, "normalizers")) {
            TSR_TRY(tsr__parse_norm(path, item, t));
        }
        return TSR_OK;
    }
    if (t->n_norm == TSR__MAX_STAGES)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: more than %d normalizer steps", path,
                             TSR__MAX_STAGES);
    const char *from = NULL, *to = NULL;
    int kind;
    if (strcmp(ty, "NFC") == 0) {
        kind = TSR__NORM_NFC;
    } else if (strcmp(ty, "Prepend") == 0 && (to = tsr__str(n, "prepend", NULL))) {
        kind = TSR__NORM_PREPEND;
    } else if (strcmp(ty, "Replace") == 0 && (from = tsr__str(n, "pattern", "String")) &&
               from[0] && (to = tsr__str(n, "content", NULL))) {
        kind = TSR__NORM_REPLACE;
    } else {
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: normalizer %s is not supported (tessera knows NFC, Prepend, "
                             "Replace of a String, Sequence)", path, ty);
    }
    int k = t->n_norm++;
    t->norm[k].kind = kind;
    t->norm[k].from = from ? tsr_strdup(from) : NULL;
    t->norm[k].to = to ? tsr_strdup(to) : NULL;
    if ((from && !t->norm[k].from) || (to && !t->norm[k].to)) return TSR_ERR_NOMEM;
    return TSR_OK;
}

/* Decoders: ByteLevel (nothing to do: the vocabulary is stored as bytes), or for raw
 * vocabularies Replace of a String, ByteFallback, Fuse and Strip of leading spaces. */
static tsr_status tsr__parse_dec(const char *path, const cJSON *d, tsr__bpe *t) {
    if (!d || cJSON_IsNull(d)) return TSR_OK;
    const cJSON *dt = cJSON_GetObjectItem(d, "type");
    const char *ty = cJSON_IsString(dt) ? dt->valuestring : "(untyped)";
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItem(d, "decoders")) {
            TSR_TRY(tsr__parse_dec(path, item, t));
        }
        return TSR_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0 || strcmp(ty, "Fuse") == 0) return TSR_OK;
    if (strcmp(ty, "Metaspace") == 0 && !t->dec_from) {
        /* Each replacement decodes to a space, except in the first token (prepend_scheme
         * other than never), which loses them all, as tokenizers' decode_chain does. */
        const char *r = tsr__str(d, "replacement", NULL);
        const char *scheme = tsr__str(d, "prepend_scheme", NULL);
        if (r && r[0]) {
            t->dec_from = tsr_strdup(r);
            t->dec_to = tsr_strdup(" ");
            t->dec_meta_first =
                scheme ? strcmp(scheme, "never") != 0
                       : !cJSON_IsFalse(cJSON_GetObjectItem(d, "add_prefix_space"));
            return t->dec_from && t->dec_to ? TSR_OK : TSR_ERR_NOMEM;
        }
    }
    if (strcmp(ty, "ByteFallback") == 0) {
        t->dec_byte_fallback = true;
        return TSR_OK;
    }
    const char *from = tsr__str(d, "pattern", "String"), *to = tsr__str(d, "content", NULL);
    if (strcmp(ty, "Replace") == 0 && from && from[0] && to && !t->dec_from) {
        t->dec_from = tsr_strdup(from);
        t->dec_to = tsr_strdup(to);
        return t->dec_from && t->dec_to ? TSR_OK : TSR_ERR_NOMEM;
    }
    const cJSON *start = cJSON_GetObjectItem(d, "start");
    if (strcmp(ty, "Strip") == 0 && to && strcmp(to, " ") == 0 && cJSON_IsNumber(start) &&
        start->valueint >= 0 && cJSON_GetObjectItem(d, "stop") &&
        cJSON_GetObjectItem(d, "stop")->valueint == 0) {
        t->dec_strip = start->valueint;
        return TSR_OK;
    }
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "%s: decoder %s is not supported (tessera knows ByteLevel, Replace of "
                         "a String, ByteFallback, Fuse, Strip of leading spaces)", path, ty);
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
    /* byte_fallback vocabularies (SentencePiece converted to BPE) hold raw UTF-8 with
     * <0xXX> byte tokens; the others hold GPT-2's byte-to-character mapping. */
    t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItem(model, "byte_fallback"));
    t->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItem(model, "fuse_unk"));
    t->raw_vocab = t->byte_fallback ||
                   tsr__has_pretok(cJSON_GetObjectItem(doc, "pre_tokenizer"), "Metaspace");
    TSR_TRY(tsr__parse_dec(path, cJSON_GetObjectItem(doc, "decoder"), t));
    TSR_TRY(tsr__parse_norm(path, cJSON_GetObjectItem(doc, "normalizer"), t));
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
        size_t n = t->raw_vocab ? strlen(it->string) : tsr__unbyte(map, it->string, dst);
        if (t->raw_vocab) memcpy(dst, it->string, n);
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
        unsigned v = 0;
        if (!t->raw_vocab && n == 1 && t->byte_id[(uint8_t)dst[0]] < 0)
            t->byte_id[(uint8_t)dst[0]] = id;
        else if (t->raw_vocab && n == 6 && memcmp(dst, "<0x", 3) == 0 && dst[5] == '>' &&
                 sscanf(dst + 3, "%2X", &v) == 1 && v < 256)
            t->byte_id[v] = id;
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
    /* harmony (GPT-OSS): an answer ends at <|return|>, or at <|call|> for a tool call */
    for (int k = 0; k < t->n_added && t->base.n_eos_ids < 8; k++)
        if (!strcmp(t->added[k].text, "<|return|>") || !strcmp(t->added[k].text, "<|call|>"))
            t->base.eos_ids[t->base.n_eos_ids++] = t->added[k].id;
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
        size_t na = t->raw_vocab ? strlen(a) : tsr__unbyte(map, a, tmp);
        if (t->raw_vocab) memcpy(tmp, a, na);
        int32_t ia = tsr__vocab_lookup(t, tmp, na);
        size_t nb = t->raw_vocab ? strlen(b) : tsr__unbyte(map, b, tmp + na);
        if (t->raw_vocab) memcpy(tmp + na, b, nb);
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

    /* Llama 3 / Qwen2: Split(regex) then ByteLevel(use_regex=false); SmolLM2: Digits then
     * ByteLevel(use_regex); GPT-2: ByteLevel alone. No pre_tokenizer: each span between
     * added tokens is one piece. */
    tsr__pretok pre = {0};
    TSR_TRY(tsr__parse_pretok(path, cJSON_GetObjectItem(doc, "pre_tokenizer"), &pre));
    for (int k = 0; k < pre.n; k++) {
        t->stage[k].prefix_space = pre.prefix_space[k];
        memcpy(t->stage[k].meta, pre.meta[k], sizeof t->stage[k].meta);
        t->stage[k].meta_prepend = pre.meta_prepend[k];
        if (pre.re[k]) TSR_TRY(tsr__compile(path, pre.re[k], &t->stage[k].re));
        t->n_stages = k + 1;
    }
    return TSR_OK;
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
                             "gpt2 byte-level BPE and llama SentencePiece from GGUF)",
                             g->path, model);
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
    const char *model = NULL;
    tsr_status mst = tsr_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (mst == TSR_OK && strcmp(model, "llama") == 0) {
        mst = tsr_tokenizer_load_gguf_spm(g, out);
        tsr_gguf_close(g);
        return mst;
    }
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
