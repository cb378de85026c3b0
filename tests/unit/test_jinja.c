/* runtime/text/jinja.c and runtime/text/chat_template.c: every template of the corpus in
 * tests/data/chat_templates times every case of expected.json (written by
 * tools/chat_template_ref.py with Python jinja2 under transformers' settings) rendered
 * byte for byte the same, or refused with the line listed in refusals.txt; the snippets of
 * snippets.txt the same as jinja2; plus constructs one at a time and hostile templates that
 * must end in one error line. */
#include <cjson/cJSON.h>

#include "base/alloc.h"
#include "base/file.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/jinja.h"
#include "tests/test.h"

#define TSR__DIR TSR_SOURCE_DIR "/tests/data/chat_templates/"

static char *tsr__read(const char *path, size_t *len) {
    char *text = NULL;
    if (tsr_file_read(path, "test data", 64u << 20, &text, len) != TSR_OK) return NULL;
    return text;
}

/* Renders src with a JSON context; returns the output (tsr_free) or NULL with the error. */
static char *tsr__render(const char *src, const char *ctx_json, tsr_status *st) {
    tsr_jinja *t = NULL;
    *st = tsr_jinja_parse(src, strlen(src), "t", &t);
    if (*st != TSR_OK) return NULL;
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    char *out = NULL;
    size_t n = 0;
    tsr_jinja_opts o = {.now = 1721995200};
    *st = tsr_jinja_render(t, ctx, &o, &out, &n);
    cJSON_Delete(ctx);
    tsr_jinja_free(t);
    return out;
}

#define ASSERT_RENDERS(src, ctx, want)                                                  \
    do {                                                                                \
        tsr_status st_;                                                                 \
        char *o_ = tsr__render(src, ctx, &st_);                                         \
        if (!o_) TSR_FAIL_("%s: %s", src, tsr_last_error());                            \
        int eq_ = !strcmp(o_, want);                                                    \
        if (!eq_) fprintf(stderr, "  got  [%s]\n  want [%s]\n", o_, want);              \
        tsr_free(o_);                                                                   \
        ASSERT_TRUE(eq_);                                                               \
    } while (0)

#define ASSERT_FAILS(src, ctx, code, needle)                                            \
    do {                                                                                \
        tsr_status st_;                                                                 \
        char *o_ = tsr__render(src, ctx, &st_);                                         \
        tsr_free(o_);                                                                   \
        ASSERT_EQ_INT(st_, code);                                                       \
        ASSERT_STR_CONTAINS(tsr_last_error(), needle);                                  \
    } while (0)

TSR_TEST(test_jinja_constructs) {
    ASSERT_RENDERS("a{{ 1 + 2 * 3 }}b{{ 7 // 2 }}{{ 7 / 2 }}{{ -7 % 3 }}{{ 2 ** 10 }}", NULL,
                   "a7b33.521024");
    ASSERT_RENDERS("{{ 'x' ~ 1 ~ none ~ true }}|{{ [1, 'a', none] }}|{{ {'k': 1.5} }}", NULL,
                   "x1NoneTrue|[1, 'a', None]|{'k': 1.5}");
    ASSERT_RENDERS("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ loop.revindex }},{% endfor %}",
                   "{\"xs\": [5, 6]}", "10TrueFalse22,21FalseTrue21,");
    ASSERT_RENDERS("{% set ns = namespace(n=0) %}{% for x in xs if x > 1 %}{% set ns.n = ns.n"
                   " + x %}{% set local = 1 %}{% endfor %}{{ ns.n }}{{ local is defined }}",
                   "{\"xs\": [1, 2, 3]}", "5False");
    ASSERT_RENDERS("{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}",
                   NULL, "[1B][23]");
    ASSERT_RENDERS("{{ '  Hi There  '|trim|upper }}{{ 'abc'[::-1] }}{{ 'a,b'.split(',') }}"
                   "{{ ' x '.strip() }}{{ 'Hello'.startswith('He') }}{{ 'hello world'.title() }}",
                   NULL, "HI THEREcba['a', 'b']xTrueHello World");
    ASSERT_RENDERS("{{ xs|selectattr('r', 'equalto', 'u')|map(attribute='c')|join('+') }}",
                   "{\"xs\": [{\"r\": \"u\", \"c\": \"1\"}, {\"r\": \"a\", \"c\": \"2\"}, "
                   "{\"r\": \"u\", \"c\": \"3\"}]}",
                   "1+3");
    ASSERT_RENDERS("{{ d|tojson }}|{{ d|tojson(indent=2) }}", "{\"d\": {\"a\": [1, \"\\u00e9\\n\"], \"b\": {}}}",
                   "{\"a\": [1, \"\xc3\xa9\\n\"], \"b\": {}}|{\n  \"a\": [\n    1,\n    \"\xc3\xa9\\n\"\n  ],\n  \"b\": {}\n}");
    ASSERT_RENDERS("{% if x is none %}n{% elif x is string %}s{% else %}o{% endif %}"
                   "{{ 'a' in 'cat' }}{{ 2 not in [1] }}{{ y|default('dflt') }}{{ 1 if x else 2 }}",
                   "{\"x\": \"s\"}", "sTrueTruedflt1");
    ASSERT_RENDERS("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
                   "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1;a=2;ba");
    ASSERT_RENDERS("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}"
                   "{% break %}{% endif %}{{ i }}{% endfor %}",
                   NULL, "02");
    ASSERT_RENDERS("{{ strftime_now('%d %b %Y') }}", NULL, "26 Jul 2024");
    /* whitespace control, trim_blocks and lstrip_blocks */
    ASSERT_RENDERS("<\n  {% if true %}\n  x\n  {% endif %}\n>", NULL, "<\n  x\n>");
    ASSERT_RENDERS("a  {%- if true -%}  b  {%- endif %}\nc {{- ' d ' -}} e", NULL, "abc d e");
    ASSERT_RENDERS("x {# c #}\n  {#- c2 #} y", NULL, "x  y");
    ASSERT_RENDERS("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]", NULL, "[in1]");
    ASSERT_RENDERS("{% filter trim|upper %}  ab{{ 'c' }}  {% endfilter %}.", NULL, "ABC.");
    ASSERT_RENDERS("end\n", NULL, "end"); /* one trailing newline dropped */
}

TSR_TEST(test_jinja_errors) {
    ASSERT_FAILS("{{ raise_exception('no way') }}", NULL, TSR_ERR_INVALID, "no way");
    ASSERT_FAILS("\n  {{ x|frobnicate }}", NULL, TSR_ERR_UNSUPPORTED,
                 "t: 2:8: unsupported filter 'frobnicate'");
    ASSERT_FAILS("{% include 'x' %}", NULL, TSR_ERR_UNSUPPORTED, "t: 1:4: unsupported statement 'include'");
    ASSERT_FAILS("{{ x is frob }}", NULL, TSR_ERR_UNSUPPORTED, "unsupported test 'frob'");
    ASSERT_FAILS("{{ x.frob() }}", NULL, TSR_ERR_UNSUPPORTED, "unsupported method 'frob'");
    ASSERT_FAILS("{% if x %}", NULL, TSR_ERR_FORMAT, "missing {% endif %}");
    ASSERT_FAILS("{{ 'abc }}", NULL, TSR_ERR_FORMAT, "unterminated string");
    /* hostile: limits, not crashes */
    ASSERT_FAILS("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", NULL, TSR_ERR_BUDGET,
                 "nested deeper");
    ASSERT_FAILS("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 NULL, TSR_ERR_BUDGET, "t: ");
    ASSERT_FAILS("{{ 'x' * 100000000 }}", NULL, TSR_ERR_BUDGET, "output limit");
    char deep[4000];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    memcpy(deep + k, " }}", 4);
    ASSERT_FAILS(deep, NULL, TSR_ERR_UNSUPPORTED, "nesting deeper");
    ASSERT_FAILS("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}",
                 NULL, TSR_ERR_BUDGET, "beyond");
}

/* refusals.txt: "TEMPLATE<TAB>error line" for corpus templates the subset refuses. */
static const char *tsr__refusal(const char *list, const char *name) {
    static char line[1024];
    const char *p = list;
    size_t nl = strlen(name);
    while (p && *p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > nl && !strncmp(p, name, nl) && p[nl] == '\t' && n - nl - 1 < sizeof line) {
            memcpy(line, p + nl + 1, n - nl - 1);
            line[n - nl - 1] = 0;
            return line;
        }
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

TSR_TEST(test_jinja_corpus) {
    size_t len = 0, rlen = 0;
    char *text = tsr__read(TSR__DIR "expected.json", &len);
    ASSERT_TRUE(text != NULL);
    char *refusals = tsr__read(TSR__DIR "refusals.txt", &rlen);
    cJSON *doc = cJSON_ParseWithLength(text, len);
    tsr_free(text);
    ASSERT_TRUE(doc != NULL);
    const cJSON *cases = cJSON_GetObjectItem(doc, "cases");
    const cJSON *results = cJSON_GetObjectItem(doc, "results");
    int64_t now = (int64_t)cJSON_GetObjectItem(doc, "now")->valuedouble;
    const char *bos = cJSON_GetObjectItem(doc, "bos_token")->valuestring;
    const char *eos = cJSON_GetObjectItem(doc, "eos_token")->valuestring;
    int n_ok = 0, n_bad = 0, n_refused = 0, n_err = 0;
    char cur[256] = "";
    tsr_chat_template t = {0};
    tsr_status parse_st = TSR_OK;
    const cJSON *r;
    cJSON_ArrayForEach(r, results) {
        const char *name = cJSON_GetObjectItem(r, "template")->valuestring;
        if (strcmp(cur, name)) {
            tsr_chat_template_free(&t);
            snprintf(cur, sizeof cur, "%s", name);
            char path[1024];
            snprintf(path, sizeof path, TSR__DIR "%s", name);
            size_t sl = 0;
            char *src = tsr__read(path, &sl);
            ASSERT_TRUE(src != NULL);
            parse_st = tsr_chat_template_from_source(src, sl, bos, eos, name, &t);
            tsr_free(src);
            const char *want = refusals ? tsr__refusal(refusals, name) : NULL;
            if (parse_st != TSR_OK) {
                if (!want || strcmp(want, tsr_last_error())) {
                    fprintf(stderr, "  %s: refused and not listed in refusals.txt: %s\n", name,
                            tsr_last_error());
                    n_bad++;
                } else {
                    n_refused++;
                }
            } else if (want) {
                fprintf(stderr, "  %s: listed in refusals.txt but compiles now\n", name);
                n_bad++;
            }
        }
        if (parse_st != TSR_OK) continue;
        const cJSON *cname = cJSON_GetObjectItem(r, "case");
        if (!cname) { /* jinja2 itself could not compile it */
            fprintf(stderr, "  %s: jinja2 refuses it, tessera compiles it\n", name);
            n_bad++;
            continue;
        }
        const cJSON *c = NULL, *it;
        cJSON_ArrayForEach(it, cases)
            if (!strcmp(cJSON_GetObjectItem(it, "name")->valuestring, cname->valuestring)) c = it;
        ASSERT_TRUE(c != NULL);
        cJSON *ctx = cJSON_CreateObject();
        cJSON_AddItemToObject(ctx, "messages",
                              cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), true));
        cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(cJSON_GetObjectItem(c, "tools"), true));
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "extra"))
            cJSON_AddItemToObject(ctx, x->string, cJSON_Duplicate(x, true));
        tsr_chat_opts o = {
            .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
            .continue_final = cJSON_IsTrue(cJSON_GetObjectItem(c, "continue_final")),
            .now = now};
        char *out = NULL;
        size_t n = 0;
        tsr_status st = tsr_chat_render_json(&t, ctx, &o, &out, &n);
        cJSON_Delete(ctx);
        const cJSON *want = cJSON_GetObjectItem(r, "output");
        if (!want) { /* Python raised: tessera must fail too */
            if (st == TSR_OK) {
                fprintf(stderr, "  %s / %s: jinja2 raised (%s), tessera rendered\n", name,
                        cname->valuestring, cJSON_GetObjectItem(r, "error")->valuestring);
                n_bad++;
            } else {
                n_err++;
            }
        } else if (st != TSR_OK) {
            fprintf(stderr, "  %s / %s: %s\n", name, cname->valuestring, tsr_last_error());
            n_bad++;
        } else if (n != strlen(want->valuestring) || memcmp(out, want->valuestring, n)) {
            size_t i = 0, wn = strlen(want->valuestring);
            while (i < n && i < wn && out[i] == want->valuestring[i]) i++;
            fprintf(stderr, "  %s / %s: differs at byte %zu of %zu/%zu: got [%.60s] want [%.60s]\n",
                    name, cname->valuestring, i, n, wn, out + i, want->valuestring + i);
            n_bad++;
        } else {
            n_ok++;
        }
        tsr_free(out);
    }
    tsr_chat_template_free(&t);
    cJSON_Delete(doc);
    tsr_free(refusals);
    fprintf(stderr, "  corpus: %d equal, %d errors as in jinja2, %d templates refused as listed, "
                    "%d mismatches\n", n_ok, n_err, n_refused, n_bad);
    ASSERT_EQ_INT(n_bad, 0);
    ASSERT_TRUE(n_ok > 250);
}

/* snippets.txt: small templates, one or two constructs each, rendered by jinja2 with one
 * context (expected.json "snippets"): equal bytes, or an error where jinja2 raised. */
TSR_TEST(test_jinja_snippets) {
    size_t len = 0;
    char *text = tsr__read(TSR__DIR "expected.json", &len);
    ASSERT_TRUE(text != NULL);
    cJSON *doc = cJSON_ParseWithLength(text, len);
    tsr_free(text);
    ASSERT_TRUE(doc != NULL);
    const cJSON *ctx = cJSON_GetObjectItem(doc, "snippet_context");
    int n_ok = 0, n_bad = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(doc, "snippets")) {
        const char *src = cJSON_GetObjectItem(r, "template")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(r, "output");
        tsr_jinja *t = NULL;
        char *out = NULL;
        size_t n = 0;
        tsr_status st = tsr_jinja_parse(src, strlen(src), "snippet", &t);
        if (st == TSR_OK) {
            tsr_jinja_opts o = {.now = 1721995200};
            st = tsr_jinja_render(t, ctx, &o, &out, &n);
            tsr_jinja_free(t);
        }
        if (!want ? st != TSR_OK
                  : st == TSR_OK && n == strlen(want->valuestring) && !memcmp(out, want->valuestring, n)) {
            n_ok++;
        } else {
            fprintf(stderr, "  snippet %.80s\n    got  %s\n    want %s\n", src,
                    st == TSR_OK ? out : tsr_last_error(),
                    want ? want->valuestring : cJSON_GetObjectItem(r, "error")->valuestring);
            n_bad++;
        }
        tsr_free(out);
    }
    cJSON_Delete(doc);
    fprintf(stderr, "  snippets: %d as jinja2, %d differ\n", n_ok, n_bad);
    ASSERT_EQ_INT(n_bad, 0);
    ASSERT_TRUE(n_ok > 60);
}

/* A chat render without a time of its own takes SOURCE_DATE_EPOCH's (UTC) where it is a
 * non-negative integer, else the current time; a caller's time wins over both. */
static void render_date(const tsr_chat_template *t, int64_t now, char *buf, size_t cap) {
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemToObject(ctx, "messages", cJSON_CreateArray());
    tsr_chat_opts o = {.now = now};
    char *out = NULL;
    size_t n = 0;
    buf[0] = 0;
    if (tsr_chat_render_json(t, ctx, &o, &out, &n) == TSR_OK) snprintf(buf, cap, "%s", out);
    tsr_free(out);
    cJSON_Delete(ctx);
}

TSR_TEST(test_chat_source_date_epoch) {
    static const char src[] = "{{ strftime_now('%Y-%m-%d') }}";
    tsr_chat_template t;
    ASSERT_OK(tsr_chat_template_from_source(src, sizeof src - 1, NULL, NULL, "date", &t));
    char got[64], now[64];
    const char *saved = getenv("SOURCE_DATE_EPOCH");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("SOURCE_DATE_EPOCH", "1796558400", 1);
    render_date(&t, -1, got, sizeof got);
    ASSERT_STR_EQ(got, "2026-12-06");
    render_date(&t, 0, got, sizeof got); /* the caller's time */
    ASSERT_STR_EQ(got, "1970-01-01");
    setenv("SOURCE_DATE_EPOCH", "12x", 1); /* not an integer: the current time */
    render_date(&t, -1, got, sizeof got);
    unsetenv("SOURCE_DATE_EPOCH");
    render_date(&t, -1, now, sizeof now);
    ASSERT_STR_EQ(got, now);
    if (keep) setenv("SOURCE_DATE_EPOCH", keep, 1);
    free(keep);
    tsr_chat_template_free(&t);
}

TSR_TEST_MAIN(test_jinja_constructs, test_jinja_errors, test_jinja_corpus, test_jinja_snippets,
              test_chat_source_date_epoch)
