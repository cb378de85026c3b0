/* UTF-8: one strict decoder, an encoder and a validator shared by the tokenizers, the
 * template engine and the job reader (Unicode's well-formed sequences, Table 3-7: no
 * overlongs, no surrogates, nothing past U+10FFFF). */
#ifndef TSR_BASE_UTF8_H
#define TSR_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes the well-formed sequence at s (avail > 0 bytes readable) into *cp and returns its
 * length 1..4; returns 0, *cp untouched, when s does not start one. */
int tsr_utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp);

/* Writes cp (<= U+10FFFF) as UTF-8 at d (room for 4 bytes); returns the bytes written. */
size_t tsr_utf8_encode(uint32_t cp, char *d);

/* True when s[0..n) is well-formed UTF-8; else false and *bad (when not NULL) is the offset
 * of the first byte that starts no well-formed sequence. */
bool tsr_utf8_valid(const char *s, size_t n, size_t *bad);

#endif
