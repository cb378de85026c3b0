/* base/utf8.c against the Unicode standard's definition of well-formed UTF-8 (Table 3-7):
 * every scalar value round-trips through encode/decode with the length the table gives,
 * and the classic ill-formed cases (overlongs, surrogates, past U+10FFFF, stray or missing
 * continuation bytes, F5..FF) are refused at the right offset. */
#include <stdint.h>
#include <string.h>

#include "base/utf8.h"
#include "tests/test.h"

TSR_TEST(test_every_scalar_round_trips) {
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char b[4];
        size_t n = tsr_utf8_encode(cp, b);
        size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (n != want) TSR_FAIL_("U+%04X encodes to %zu bytes", (unsigned)cp, n);
        uint32_t got = 0xFFFFFFFFu;
        if (tsr_utf8_decode((const unsigned char *)b, n, &got) != (int)n || got != cp)
            TSR_FAIL_("U+%04X does not decode back", (unsigned)cp);
        /* one byte short is never a sequence */
        if (n > 1 && tsr_utf8_decode((const unsigned char *)b, n - 1, &got) != 0)
            TSR_FAIL_("U+%04X cut short decodes", (unsigned)cp);
    }
}

TSR_TEST(test_ill_formed_refused) {
    static const struct {
        const char *s;
        size_t bad; /* offset of the first byte that starts no sequence */
    } cases[] = {
        {"\xC0\x80", 0},         {"\xC1\xBF", 0},         /* overlong 2-byte */
        {"\xE0\x80\x80", 0},     {"\xE0\x9F\xBF", 0},     /* overlong 3-byte */
        {"\xF0\x80\x80\x80", 0}, {"\xF0\x8F\xBF\xBF", 0}, /* overlong 4-byte */
        {"\xED\xA0\x80", 0},     {"\xED\xBF\xBF", 0},     /* surrogates */
        {"\xF4\x90\x80\x80", 0}, {"\xF5\x80\x80\x80", 0}, /* past U+10FFFF */
        {"\xFE", 0},             {"\xFF", 0},
        {"ab\x80", 2},           {"a\xC3", 1},            /* stray / missing continuation */
        {"\xE2\x82", 0},         {"ok \xE2\x82\xAC \xE2(", 7},
        {"caf\xE9 latin-1", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t bad = 12345;
        if (tsr_utf8_valid(cases[i].s, strlen(cases[i].s), &bad))
            TSR_FAIL_("case %zu accepted", i);
        ASSERT_EQ_INT(bad, cases[i].bad);
    }
    size_t bad = 7;
    ASSERT_TRUE(tsr_utf8_valid("", 0, &bad));
    ASSERT_TRUE(tsr_utf8_valid("\xEF\xBF\xBF \xF4\x8F\xBF\xBF \xE2\x82\xAC", 12, NULL));
    ASSERT_TRUE(bad == 7); /* untouched when valid */
    ASSERT_TRUE(tsr_utf8_valid("nul\0inside", 10, NULL)); /* NUL is a scalar value */
}

TSR_TEST_MAIN(test_every_scalar_round_trips, test_ill_formed_refused)
