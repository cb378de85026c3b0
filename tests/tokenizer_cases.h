/* Helpers shared by the tokenizer tests: reading the golden case files written by
 * tools/ref_tokenizers.py (strings base64-encoded so any bytes survive) and decoding ids. */
#ifndef TSR_TESTS_TOKENIZER_CASES_H
#define TSR_TESTS_TOKENIZER_CASES_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "runtime/text/tokenizer.h"

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    size_t got = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    buf[got] = '\0';
    if (n) *n = got;
    return buf;
}

static cJSON *load_cases(const char *path) {
    char *txt = read_all(path, NULL);
    if (!txt) return NULL;
    cJSON *doc = cJSON_Parse(txt);
    free(txt);
    return doc;
}

static int b64val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes base64 into a malloc'd buffer (NUL-terminated for printing). */
static char *b64dec(const char *s, size_t *n) {
    size_t len = strlen(s);
    char *out = malloc(len / 4 * 3 + 4);
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64val(s[i]);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = '\0';
    *n = o;
    return out;
}

/* Concatenates decode() over ids, starting from prev = -1. Returns a malloc'd buffer. */
static char *decode_all(const tsr_tokenizer *t, const int32_t *ids, size_t n, size_t *out_n) {
    size_t cap = 64 + n * 64, o = 0;
    char *buf = malloc(cap);
    int32_t prev = -1;
    for (size_t i = 0; i < n; i++) {
        int k = tsr_tokenizer_decode(t, prev, ids[i], buf + o, cap - o);
        if (k < 0) {
            free(buf);
            return NULL;
        }
        o += (size_t)k;
        prev = ids[i];
    }
    buf[o] = '\0';
    *out_n = o;
    return buf;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

/* Encodes a case's text (no BOS/EOS) and compares with its reference "ids", printing both
 * on a mismatch. Returns the ids (tsr_free) or NULL when encode failed; *bad counts
 * failures. */
static int32_t *encode_and_compare(const tsr_tokenizer *t, const cJSON *c, const char *name,
                                   const char *text, size_t tn, size_t *n, int *bad) {
    const cJSON *want = cJSON_GetObjectItem(c, "ids");
    size_t wn = (size_t)cJSON_GetArraySize(want);
    int32_t *ids = NULL;
    *n = 0;
    if (tsr_tokenizer_encode(t, text, tn, false, false, &ids, n) != TSR_OK) {
        fprintf(stderr, "  case %s: encode failed: %s\n", name, tsr_last_error());
        (*bad)++;
        return NULL;
    }
    bool same = *n == wn;
    for (size_t i = 0; same && i < *n; i++)
        same = ids[i] == cJSON_GetArrayItem(want, (int)i)->valueint;
    if (!same) {
        fprintf(stderr, "  case %s: ids differ from the reference\n", name);
        print_ids("got ", ids, *n);
        int32_t *w = malloc((wn + 1) * sizeof *w);
        for (size_t i = 0; i < wn; i++) w[i] = cJSON_GetArrayItem(want, (int)i)->valueint;
        print_ids("want", w, wn);
        free(w);
        (*bad)++;
    }
    return ids;
}

#endif
