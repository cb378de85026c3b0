/* NFC from tables generated out of Unicode's data (runtime/text/tokenizer_nfc_table.h by
 * tools/gen_nfc_table.py); Hangul syllables are composed and decomposed arithmetically. */
#include "runtime/text/tokenizer_nfc.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "runtime/text/tokenizer_nfc_table.h"

#define TSR__RAW 0x80000000u /* a byte that is not UTF-8: kept as is, never composed */
#define TSR__SBASE 0xAC00u
#define TSR__LBASE 0x1100u
#define TSR__VBASE 0x1161u
#define TSR__TBASE 0x11A7u
#define TSR__NL 19u
#define TSR__NV 21u
#define TSR__NT 28u
#define TSR__NS (TSR__NL * TSR__NV * TSR__NT)

#define TSR__COUNT(a) (sizeof(a) / sizeof((a)[0]))

static unsigned tsr__ccc(uint32_t cp) {
    if (cp < 0x300 || (cp & TSR__RAW)) return 0;
    size_t lo = 0, hi = TSR__COUNT(tsr__nfc_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tsr__nfc_ccc[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < TSR__COUNT(tsr__nfc_ccc) && tsr__nfc_ccc[lo][0] == cp ? tsr__nfc_ccc[lo][1] : 0;
}

static const uint32_t *tsr__dec(uint32_t cp) {
    size_t lo = 0, hi = TSR__COUNT(tsr__nfc_dec);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tsr__nfc_dec[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < TSR__COUNT(tsr__nfc_dec) && tsr__nfc_dec[lo][0] == cp ? tsr__nfc_dec[lo] : NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t tsr__comp(uint32_t a, uint32_t b) {
    if (a >= TSR__LBASE && a < TSR__LBASE + TSR__NL && b >= TSR__VBASE &&
        b < TSR__VBASE + TSR__NV)
        return TSR__SBASE + ((a - TSR__LBASE) * TSR__NV + (b - TSR__VBASE)) * TSR__NT;
    if (a >= TSR__SBASE && a < TSR__SBASE + TSR__NS && (a - TSR__SBASE) % TSR__NT == 0 &&
        b > TSR__TBASE && b < TSR__TBASE + TSR__NT)
        return a + (b - TSR__TBASE);
    size_t lo = 0, hi = TSR__COUNT(tsr__nfc_comp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = tsr__nfc_comp[mid];
        if (e[0] < a || (e[0] == a && e[1] < b)) lo = mid + 1;
        else hi = mid;
    }
    return lo < TSR__COUNT(tsr__nfc_comp) && tsr__nfc_comp[lo][0] == a &&
                   tsr__nfc_comp[lo][1] == b
               ? tsr__nfc_comp[lo][2]
               : 0;
}

/* Full canonical decomposition of cp appended at cps[*n] (at most 4 codepoints: the
 * deepest canonical decomposition in Unicode has 4). */
static void tsr__decompose(uint32_t cp, uint32_t *cps, size_t *n) {
    if (cp >= TSR__SBASE && cp < TSR__SBASE + TSR__NS) {
        uint32_t s = cp - TSR__SBASE;
        cps[(*n)++] = TSR__LBASE + s / (TSR__NV * TSR__NT);
        cps[(*n)++] = TSR__VBASE + (s % (TSR__NV * TSR__NT)) / TSR__NT;
        if (s % TSR__NT) cps[(*n)++] = TSR__TBASE + s % TSR__NT;
        return;
    }
    const uint32_t *d = cp >= 0xC0 && !(cp & TSR__RAW) ? tsr__dec(cp) : NULL;
    if (!d) {
        cps[(*n)++] = cp;
        return;
    }
    tsr__decompose(d[1], cps, n);
    if (d[2]) tsr__decompose(d[2], cps, n);
}

static size_t tsr__put(uint32_t cp, char *o) {
    if (cp & TSR__RAW) {
        o[0] = (char)(cp & 0xFF);
        return 1;
    }
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

tsr_status tsr_nfc(const char *text, size_t n, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    /* Codepoints below U+0300 are their own NFC and never compose with each other: UTF-8
     * bytes below 0xCC encode only those. */
    bool simple = true;
    for (size_t i = 0; i < n && simple; i++) simple = (uint8_t)text[i] < 0xCC;
    if (simple) {
        *out = tsr_malloc(n + 1);
        if (!*out) return TSR_ERR_NOMEM;
        memcpy(*out, text, n);
        *out_len = n;
        return TSR_OK;
    }
    /* Every byte yields at most 4 codepoints after decomposition (a 2-byte character
     * decomposes into at most 2, a 3-byte one into at most 3, a 4-byte one into 4). */
    uint32_t *cps = tsr_malloc((4 * n + 4) * sizeof *cps);
    if (!cps) return TSR_ERR_NOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tsr_utf8_decode((const unsigned char *)text + i, n - i, &cp);
        if (k == 0) {
            cps[m++] = TSR__RAW | (uint8_t)text[i];
            i++;
            continue;
        }
        tsr__decompose(cp, cps, &m);
        i += (size_t)k;
    }
    /* Canonical ordering: a stable sort of every run of non-starters by combining class. */
    for (size_t i = 1; i < m; i++) {
        unsigned c = tsr__ccc(cps[i]);
        if (c == 0) continue;
        size_t j = i;
        uint32_t v = cps[i];
        while (j > 0 && tsr__ccc(cps[j - 1]) > c) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = v;
    }
    /* Canonical composition (UAX #15): each character joins the last starter unless a
     * character of the same or higher class (or a starter) stands between them. */
    size_t w = 0;
    if (m > 0) {
        size_t starter = 0;
        bool have_starter = tsr__ccc(cps[0]) == 0 && !(cps[0] & TSR__RAW);
        unsigned last = have_starter ? 0 : 256;
        w = 1;
        for (size_t i = 1; i < m; i++) {
            uint32_t c = cps[i];
            unsigned cc = tsr__ccc(c);
            uint32_t comp = 0;
            if (have_starter && !(c & TSR__RAW) && (last < cc || last == 0) &&
                (last == 0 ? w - 1 == starter : true))
                comp = tsr__comp(cps[starter], c);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
            if (cc == 0) {
                starter = w;
                have_starter = !(c & TSR__RAW);
                last = have_starter ? 0 : 256;
            } else {
                last = cc;
            }
            cps[w++] = c;
        }
    }
    char *o = tsr_malloc(4 * w + 1);
    if (!o) {
        tsr_free(cps);
        return TSR_ERR_NOMEM;
    }
    size_t len = 0;
    for (size_t i = 0; i < w; i++) len += tsr__put(cps[i], o + len);
    tsr_free(cps);
    *out = o;
    *out_len = len;
    return TSR_OK;
}
