#include "base/utf8.h"

int tsr_utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    /* The lead byte fixes the length and the range of the second byte; the narrowed
     * ranges after E0, ED, F0 and F4 are what rule out overlongs, surrogates and
     * codepoints past U+10FFFF. */
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) n = 3, lo = 0xA0;
    else if (c == 0xED) n = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) n = 3;
    else if (c == 0xF0) n = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) n = 4, hi = 0x8F;
    else return 0;
    if ((size_t)n > avail || s[1] < lo || s[1] > hi) return 0;
    uint32_t v = c & (0x7Fu >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    *cp = v;
    return n;
}

size_t tsr_utf8_encode(uint32_t cp, char *d) {
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tsr_utf8_valid(const char *s, size_t n, size_t *bad) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) { /* ASCII runs are the common case */
            i++;
            continue;
        }
        uint32_t cp;
        int k = tsr_utf8_decode(u + i, n - i, &cp);
        if (k == 0) {
            if (bad) *bad = i;
            return false;
        }
        i += (size_t)k;
    }
    return true;
}
