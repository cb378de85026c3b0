/* Jinja2 subset for chat templates (see jinja.h). Layout: a scanner that applies Jinja's
 * whitespace rules (trim_blocks, lstrip_blocks, {%- -%}) and yields text and tag tokens; a
 * recursive-descent parser building an AST in an arena; an evaluator over tagged values
 * allocated in a second arena that is dropped after each render. Errors unwind with
 * longjmp to the entry point: every allocation lives in an arena, so nothing leaks. */
#include "runtime/text/jinja.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/utf8.h"

#define TSR__J_MAX_DEPTH 200        /* parser nesting (expressions and blocks) */
#define TSR__J_MAX_CALLS 64         /* macro call depth */
#define TSR__J_MAX_STEPS 20000000   /* loop iterations + evaluated nodes per render */

/* ---------------------------------------------------------------- arena */

typedef struct tsr__jchunk {
    struct tsr__jchunk *next;
    size_t used, cap;
    max_align_t data[];
} tsr__jchunk;

typedef struct tsr__jarena {
    tsr__jchunk *head;
    size_t total, limit;
} tsr__jarena;

typedef struct tsr__jerr {
    jmp_buf jb;
    tsr_status code;
    char msg[512];
} tsr__jerr;

static void tsr__jfail(tsr__jerr *e, tsr_status code, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
static void tsr__jfail(tsr__jerr *e, tsr_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->code = code;
    longjmp(e->jb, 1);
}

/* Under AddressSanitizer every allocation is a chunk of its own, exactly sized, so that an
 * overrun is reported instead of landing in a neighbour inside a shared chunk. */
#if defined(__SANITIZE_ADDRESS__)
#define TSR__J_EXACT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TSR__J_EXACT 1
#endif
#endif
#ifndef TSR__J_EXACT
#define TSR__J_EXACT 0
#endif

static void *tsr__jalloc(tsr__jarena *a, tsr__jerr *e, size_t n) {
    if (!TSR__J_EXACT || n == 0)
        n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n > a->limit) tsr__jfail(e, TSR_ERR_BUDGET, "template needs more than %zu bytes", a->limit);
    if (TSR__J_EXACT || !a->head || a->head->cap - a->head->used < n) {
        size_t cap = TSR__J_EXACT ? n : n > 65536 ? n : 65536;
        if (a->total + cap > a->limit)
            tsr__jfail(e, TSR_ERR_BUDGET, "template needs more than %zu bytes", a->limit);
        tsr__jchunk *c = tsr_malloc(sizeof *c + cap);
        if (!c) tsr__jfail(e, TSR_ERR_NOMEM, "out of memory");
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void tsr__jarena_free(tsr__jarena *a) {
    while (a->head) {
        tsr__jchunk *n = a->head->next;
        tsr_free(a->head);
        a->head = n;
    }
    a->total = 0;
}

/* ---------------------------------------------------------------- values */

typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS,
    JV_MACRO, JV_FUNC
} tsr__jt;

typedef struct tsr__jlist tsr__jlist;
typedef struct tsr__jdict tsr__jdict;
typedef struct tsr__jnode tsr__jnode;

typedef struct tsr__jv {
    tsr__jt t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        tsr__jlist *l;
        tsr__jdict *d; /* JV_DICT, JV_NS */
        const tsr__jnode *m;
        int fn;
    } u;
} tsr__jv;

struct tsr__jlist {
    tsr__jv *v;
    size_t n, cap;
    bool tup; /* a tuple: repr "(a, b)"; never equal to a list */
};
struct tsr__jdict {
    tsr__jv *k, *v;
    size_t n, cap;
};

enum { JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME };

/* ---------------------------------------------------------------- AST */

typedef enum {
    /* expressions */
    JN_CONST, JN_NAME, JN_LIST, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER,
    JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BIN, JN_AND, JN_OR, JN_COND,
    /* statements */
    JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETATTR, JN_SETBLOCK, JN_MACRO, JN_BREAK,
    JN_CONTINUE, JN_BODY, JN_FILTERBLOCK
} tsr__jk;

typedef enum {
    JO_ADD, JO_SUB, JO_MUL, JO_DIV, JO_FDIV, JO_MOD, JO_POW, JO_CAT, JO_EQ, JO_NE, JO_LT,
    JO_LE, JO_GT, JO_GE, JO_IN, JO_NOTIN
} tsr__jop;

struct tsr__jnode {
    tsr__jk k;
    int line, col;
    int op;              /* tsr__jop; JN_TEST: negated */
    const char *name;    /* NAME, ATTR, FILTER, TEST, SET, MACRO; FOR: first target */
    const char *name2;   /* FOR: second target (k, v); SETATTR: attribute */
    tsr__jv cval;        /* CONST, TEXT (string) */
    tsr__jnode *a, *b, *c, *d; /* operands / bodies */
    tsr__jnode **args;   /* LIST items, DICT k,v pairs, CALL/FILTER/TEST args, BODY stmts,
                            MACRO parameter defaults (NULL: none) */
    const char **kw;     /* CALL/FILTER: keyword names (NULL for positional); MACRO: params */
    int nargs;
};

/* ---------------------------------------------------------------- scanner */

typedef enum {
    JT_EOF, JT_TEXT, JT_VBEGIN, JT_VEND, JT_BBEGIN, JT_BEND, JT_NAME, JT_STR, JT_INT,
    JT_FLOAT, JT_OP
} tsr__jtt;

typedef struct tsr__jtok {
    tsr__jtt t;
    int line, col;
    const char *s; /* TEXT/NAME/STR: arena string; OP: operator text */
    size_t n;
    int64_t i;
    double f;
} tsr__jtok;

typedef struct tsr__jparser {
    tsr__jarena *ar;
    tsr__jerr *err;
    const char *what;
    char *src;
    size_t len;
    tsr__jtok *toks;
    size_t ntok, cap, pos;
    int depth;
    size_t pos_off; /* tsr__jpos's cursor */
    int pos_line, pos_col;
} tsr__jparser;

static void tsr__jp_fail(tsr__jparser *p, tsr_status code, int line, int col, const char *fmt,
                         ...) __attribute__((noreturn, format(printf, 5, 6)));
static void tsr__jp_fail(tsr__jparser *p, tsr_status code, int line, int col, const char *fmt,
                         ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    tsr__jfail(p->err, code, "%s: %d:%d: %s", p->what, line, col, m);
}

/* Line and column of byte `off`, counted on from the last position asked (tokens come in
 * order), so that a large template costs one pass, not one per token. */
static void tsr__jpos(tsr__jparser *p, size_t off, int *line, int *col) {
    if (off < p->pos_off) {
        p->pos_off = 0;
        p->pos_line = p->pos_col = 1;
    }
    for (size_t i = p->pos_off; i < off && i < p->len; i++) {
        if (p->src[i] == '\n') {
            p->pos_line++;
            p->pos_col = 1;
        } else {
            p->pos_col++;
        }
    }
    p->pos_off = off;
    *line = p->pos_line;
    *col = p->pos_col;
}

static tsr__jtok *tsr__jpush(tsr__jparser *p, tsr__jtt t, size_t off) {
    if (p->ntok == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        tsr__jtok *n = tsr__jalloc(p->ar, p->err, cap * sizeof *n);
        if (p->ntok) memcpy(n, p->toks, p->ntok * sizeof *n);
        p->toks = n;
        p->cap = cap;
    }
    tsr__jtok *k = &p->toks[p->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    tsr__jpos(p, off, &k->line, &k->col);
    return k;
}

static char *tsr__jstrdup(tsr__jarena *a, tsr__jerr *e, const char *s, size_t n) {
    char *d = tsr__jalloc(a, e, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static bool tsr__jws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Tokens inside {{ }} or {% %} from *pos up to the closing delimiter; returns the offset
 * just past the closing "}}"/"%}" and sets *sign to its '-'/'+' prefix (0 if none). */
static size_t tsr__jscan_tag(tsr__jparser *p, size_t i, bool block, char *sign) {
    const char *s = p->src;
    size_t n = p->len;
    int nest = 0;
    for (;;) {
        while (i < n && tsr__jws(s[i])) i++;
        if (i >= n) {
            int l, c;
            tsr__jpos(p, i, &l, &c);
            tsr__jp_fail(p, TSR_ERR_FORMAT, l, c, "unexpected end of template inside a tag");
        }
        /* closing delimiter (only outside brackets) */
        char close = block ? '%' : '}';
        for (int sg = 0; sg < 2 && nest == 0; sg++) {
            size_t j = i;
            char sc = 0;
            if (sg == 0 && (s[j] == '-' || s[j] == '+')) {
                sc = s[j];
                j++;
            } else if (sg == 0) {
                continue;
            }
            if (j + 1 < n && s[j] == close && s[j + 1] == '}') {
                *sign = sc;
                tsr__jpush(p, block ? JT_BEND : JT_VEND, i);
                return j + 2;
            }
        }
        if (nest == 0 && i + 1 < n && s[i] == close && s[i + 1] == '}') {
            *sign = 0;
            tsr__jpush(p, block ? JT_BEND : JT_VEND, i);
            return i + 2;
        }
        char ch = s[i];
        if (isalpha((unsigned char)ch) || ch == '_') {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
            tsr__jtok *t = tsr__jpush(p, JT_NAME, i);
            t->s = tsr__jstrdup(p->ar, p->err, s + i, j - i);
            t->n = j - i;
            i = j;
        } else if (isdigit((unsigned char)ch)) {
            size_t j = i;
            bool isf = false;
            while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_')) j++;
            if (j + 1 < n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
                isf = true;
                j++;
                while (j < n && isdigit((unsigned char)s[j])) j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && isdigit((unsigned char)s[k])) {
                    isf = true;
                    j = k;
                    while (j < n && isdigit((unsigned char)s[j])) j++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t k = i; k < j && m < sizeof buf - 1; k++)
                if (s[k] != '_') buf[m++] = s[k];
            buf[m] = 0;
            tsr__jtok *t = tsr__jpush(p, isf ? JT_FLOAT : JT_INT, i);
            if (isf) {
                t->f = strtod(buf, NULL);
            } else {
                errno = 0;
                t->i = strtoll(buf, NULL, 10);
                if (m >= 19 && errno) {
                    int l, c;
                    tsr__jpos(p, i, &l, &c);
                    tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, l, c, "integer literal beyond 64 bits");
                }
            }
            i = j;
        } else if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != ch) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
            if (j >= n) {
                int l, c;
                tsr__jpos(p, i, &l, &c);
                tsr__jp_fail(p, TSR_ERR_FORMAT, l, c, "unterminated string literal");
            }
            char *d = tsr__jalloc(p->ar, p->err, (j - i) * 2 + 4);
            size_t m = 0;
            for (size_t k = i + 1; k < j; k++) {
                if (s[k] != '\\') {
                    d[m++] = s[k];
                    continue;
                }
                char e = s[++k];
                switch (e) {
                case 'n': d[m++] = '\n'; break;
                case 't': d[m++] = '\t'; break;
                case 'r': d[m++] = '\r'; break;
                case '0': d[m++] = '\0'; break;
                case 'a': d[m++] = '\a'; break;
                case 'b': d[m++] = '\b'; break;
                case 'f': d[m++] = '\f'; break;
                case 'v': d[m++] = '\v'; break;
                case '\\': d[m++] = '\\'; break;
                case '\'': d[m++] = '\''; break;
                case '"': d[m++] = '"'; break;
                case '\n': break;
                case 'x': case 'u': case 'U': {
                    int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                    uint32_t cp = 0;
                    int got = 0;
                    while (got < nd && k + 1 < j && isxdigit((unsigned char)s[k + 1])) {
                        char h = s[++k];
                        cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0'
                                                  : (tolower((unsigned char)h) - 'a' + 10));
                        got++;
                    }
                    if (got != nd || cp > 0x10FFFF) {
                        int l, c;
                        tsr__jpos(p, k, &l, &c);
                        tsr__jp_fail(p, TSR_ERR_FORMAT, l, c, "bad \\%c escape", e);
                    }
                    m += tsr_utf8_encode(cp, d + m);
                    break;
                }
                default:
                    d[m++] = '\\';
                    d[m++] = e;
                }
            }
            d[m] = 0;
            tsr__jtok *t = tsr__jpush(p, JT_STR, i);
            t->s = d;
            t->n = m;
            i = j + 1;
        } else {
            static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
                                        "%", "~", "<", ">", "(", ")", "[", "]", "{", "}",
                                        ",", ".", ":", "|", "=", NULL};
            const char *hit = NULL;
            for (int k = 0; ops[k]; k++) {
                size_t ol = strlen(ops[k]);
                if (i + ol <= n && !memcmp(s + i, ops[k], ol)) {
                    hit = ops[k];
                    break;
                }
            }
            if (!hit) {
                int l, c;
                tsr__jpos(p, i, &l, &c);
                tsr__jp_fail(p, TSR_ERR_FORMAT, l, c, "unexpected character '%c'", ch);
            }
            if (hit[0] == '(' || hit[0] == '[' || hit[0] == '{') nest++;
            if ((hit[0] == ')' || hit[0] == ']' || hit[0] == '}') && nest > 0) nest--;
            tsr__jtok *t = tsr__jpush(p, JT_OP, i);
            t->s = hit;
            t->n = strlen(hit);
            i += t->n;
        }
    }
}

/* The whole template into tokens, with Jinja's whitespace rules applied to the text. */
static void tsr__jscan(tsr__jparser *p) {
    const char *s = p->src;
    size_t n = p->len, i = 0;
    for (;;) {
        size_t tag = i;
        while (tag + 1 < n && !(s[tag] == '{' && (s[tag + 1] == '{' || s[tag + 1] == '%' ||
                                                  s[tag + 1] == '#')))
            tag++;
        if (tag + 1 >= n) tag = n;
        size_t ts = i, te = tag;
        char kind = tag < n ? s[tag + 1] : 0;
        char sign = tag + 2 < n ? s[tag + 2] : 0;
        if (kind && sign == '-') {
            while (te > ts && tsr__jws(s[te - 1])) te--;
        } else if ((kind == '%' || kind == '#') && sign != '+') {
            size_t l = te;
            while (l > ts && s[l - 1] != '\n') l--;
            bool line_starting = ts == 0 || s[ts - 1] == '\n';
            bool allws = l < te;
            for (size_t k = l; k < te; k++)
                if (!tsr__jws(s[k])) allws = false;
            if ((l > ts || line_starting) && allws) te = l;
        }
        if (te > ts) {
            tsr__jtok *t = tsr__jpush(p, JT_TEXT, ts);
            t->s = tsr__jstrdup(p->ar, p->err, s + ts, te - ts);
            t->n = te - ts;
        }
        if (tag >= n) break;
        size_t body = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
        char endsign = 0;
        if (kind == '#') {
            size_t j = body;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}')) j++;
            if (j + 1 >= n) {
                int l, c;
                tsr__jpos(p, tag, &l, &c);
                tsr__jp_fail(p, TSR_ERR_FORMAT, l, c, "unterminated comment");
            }
            if (j > body && (s[j - 1] == '-' || s[j - 1] == '+')) endsign = s[j - 1];
            i = j + 2;
        } else {
            tsr__jpush(p, kind == '%' ? JT_BBEGIN : JT_VBEGIN, tag);
            i = tsr__jscan_tag(p, body, kind == '%', &endsign);
        }
        if (kind != '{' && !endsign && i < n && s[i] == '\n') i++; /* trim_blocks */
        if (endsign == '-')
            while (i < n && tsr__jws(s[i])) i++;
    }
    tsr__jpush(p, JT_EOF, n);
}

/* ---------------------------------------------------------------- parser */

static tsr__jtok *tsr__jpeek(tsr__jparser *p) { return &p->toks[p->pos]; }
static tsr__jtok *tsr__jnext(tsr__jparser *p) {
    tsr__jtok *t = &p->toks[p->pos];
    if (t->t != JT_EOF) p->pos++;
    return t;
}
static bool tsr__jis_op(const tsr__jtok *t, const char *op) {
    return t->t == JT_OP && !strcmp(t->s, op);
}
static bool tsr__jis_name(const tsr__jtok *t, const char *nm) {
    return t->t == JT_NAME && !strcmp(t->s, nm);
}
static void tsr__jexpect_op(tsr__jparser *p, const char *op) {
    tsr__jtok *t = tsr__jnext(p);
    if (!tsr__jis_op(t, op))
        tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "expected '%s'", op);
}
static const char *tsr__jexpect_name(tsr__jparser *p) {
    tsr__jtok *t = tsr__jnext(p);
    if (t->t != JT_NAME) tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "expected a name");
    return t->s;
}

static tsr__jnode *tsr__jnew(tsr__jparser *p, tsr__jk k, const tsr__jtok *at) {
    tsr__jnode *nd = tsr__jalloc(p->ar, p->err, sizeof *nd);
    memset(nd, 0, sizeof *nd);
    nd->k = k;
    nd->line = at->line;
    nd->col = at->col;
    return nd;
}

typedef struct tsr__jvec {
    tsr__jnode **v;
    const char **kw;
    int n, cap;
} tsr__jvec;

static void tsr__jvec_push(tsr__jparser *p, tsr__jvec *v, tsr__jnode *nd, const char *kw) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        tsr__jnode **nv = tsr__jalloc(p->ar, p->err, (size_t)cap * sizeof *nv);
        const char **nk = tsr__jalloc(p->ar, p->err, (size_t)cap * sizeof *nk);
        if (v->n) {
            memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
            memcpy(nk, v->kw, (size_t)v->n * sizeof *nk);
        }
        v->v = nv;
        v->kw = nk;
        v->cap = cap;
    }
    v->v[v->n] = nd;
    v->kw[v->n++] = kw;
}

static tsr__jnode *tsr__jexpr(tsr__jparser *p);
static tsr__jnode *tsr__jor(tsr__jparser *p);
static tsr__jnode *tsr__junary(tsr__jparser *p, bool with_filter);

static void tsr__jdepth(tsr__jparser *p, const tsr__jtok *at) {
    if (++p->depth > TSR__J_MAX_DEPTH)
        tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, at->line, at->col, "nesting deeper than %d",
                     TSR__J_MAX_DEPTH);
}

/* ( args ) after the '(' has been consumed; keyword arguments allowed. */
static void tsr__jcall_args(tsr__jparser *p, tsr__jnode *nd) {
    tsr__jvec v = {0};
    while (!tsr__jis_op(tsr__jpeek(p), ")")) {
        const char *kw = NULL;
        if (tsr__jpeek(p)->t == JT_NAME && tsr__jis_op(&p->toks[p->pos + 1], "=")) {
            kw = tsr__jnext(p)->s;
            tsr__jnext(p);
        } else if (tsr__jis_op(tsr__jpeek(p), "*") || tsr__jis_op(tsr__jpeek(p), "**")) {
            tsr__jtok *t = tsr__jpeek(p);
            tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, t->line, t->col, "*args / **kwargs in a call");
        }
        tsr__jvec_push(p, &v, tsr__jexpr(p), kw);
        if (!tsr__jis_op(tsr__jpeek(p), ",")) break;
        tsr__jnext(p);
    }
    tsr__jexpect_op(p, ")");
    nd->args = v.v;
    nd->kw = v.kw;
    nd->nargs = v.n;
}

static const char *const tsr__jfilters[] = {
    "trim", "tojson", "length", "count", "selectattr", "rejectattr", "map", "join", "upper",
    "lower", "replace", "default", "d", "first", "last", "list", "string", "int", "float",
    "items", "capitalize", "title", "indent", "abs", "reverse", "unique", "sort", "safe",
    "select", "reject", "min", "max", "sum", "wordcount", "round", "dictsort", "format",
    NULL};
static const char *const tsr__jtests[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
    "integer", "float", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=", "in",
    "odd", "even", "divisibleby", "sameas", "lower", "upper", "callable", "gt", "ge", "lt",
    "le", ">", ">=", "<", "<=", "greaterthan", "lessthan", NULL};
static const char *const tsr__jmethods[] = {
    "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit", "replace",
    "upper", "lower", "title", "capitalize", "format", "find", "rfind", "count", "join",
    "items", "keys", "values", "get", "splitlines", "index", "isdigit", "isalpha",
    "isspace", "isupper", "islower", "isalnum", "removeprefix", "removesuffix", "zfill",
    "swapcase", NULL};

static bool tsr__jin_set(const char *const *set, const char *nm) {
    for (int i = 0; set[i]; i++)
        if (!strcmp(set[i], nm)) return true;
    return false;
}

static tsr__jnode *tsr__jprimary(tsr__jparser *p) {
    tsr__jtok *t = tsr__jnext(p);
    tsr__jnode *nd;
    switch (t->t) {
    case JT_NAME:
        nd = tsr__jnew(p, JN_CONST, t);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) {
            nd->cval = (tsr__jv){.t = JV_BOOL, .u.b = true};
        } else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            nd->cval = (tsr__jv){.t = JV_BOOL, .u.b = false};
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            nd->cval = (tsr__jv){.t = JV_NONE};
        } else {
            nd->k = JN_NAME;
            nd->name = t->s;
        }
        return nd;
    case JT_STR: {
        nd = tsr__jnew(p, JN_CONST, t);
        /* adjacent literals concatenate */
        size_t total = t->n, k = p->pos;
        while (p->toks[k].t == JT_STR) total += p->toks[k++].n;
        char *d = tsr__jalloc(p->ar, p->err, total + 1);
        memcpy(d, t->s, t->n);
        size_t m = t->n;
        while (tsr__jpeek(p)->t == JT_STR) {
            tsr__jtok *u = tsr__jnext(p);
            memcpy(d + m, u->s, u->n);
            m += u->n;
        }
        d[m] = 0;
        nd->cval = (tsr__jv){.t = JV_STR, .u.s = {d, m}};
        return nd;
    }
    case JT_INT:
        nd = tsr__jnew(p, JN_CONST, t);
        nd->cval = (tsr__jv){.t = JV_INT, .u.i = t->i};
        return nd;
    case JT_FLOAT:
        nd = tsr__jnew(p, JN_CONST, t);
        nd->cval = (tsr__jv){.t = JV_FLOAT, .u.f = t->f};
        return nd;
    case JT_OP:
        if (!strcmp(t->s, "(")) {
            tsr__jdepth(p, t);
            if (tsr__jis_op(tsr__jpeek(p), ")")) { /* empty tuple */
                tsr__jnext(p);
                p->depth--;
                tsr__jnode *e = tsr__jnew(p, JN_LIST, t);
                e->op = 1;
                return e;
            }
            tsr__jnode *e = tsr__jexpr(p);
            if (tsr__jis_op(tsr__jpeek(p), ",")) { /* a tuple: kept as a list */
                tsr__jvec v = {0};
                tsr__jvec_push(p, &v, e, NULL);
                while (tsr__jis_op(tsr__jpeek(p), ",")) {
                    tsr__jnext(p);
                    if (tsr__jis_op(tsr__jpeek(p), ")")) break;
                    tsr__jvec_push(p, &v, tsr__jexpr(p), NULL);
                }
                e = tsr__jnew(p, JN_LIST, t);
                e->op = 1; /* a tuple */
                e->args = v.v;
                e->nargs = v.n;
            }
            tsr__jexpect_op(p, ")");
            p->depth--;
            return e;
        }
        if (!strcmp(t->s, "[")) {
            tsr__jdepth(p, t);
            tsr__jvec v = {0};
            while (!tsr__jis_op(tsr__jpeek(p), "]")) {
                tsr__jvec_push(p, &v, tsr__jexpr(p), NULL);
                if (!tsr__jis_op(tsr__jpeek(p), ",")) break;
                tsr__jnext(p);
            }
            tsr__jexpect_op(p, "]");
            nd = tsr__jnew(p, JN_LIST, t);
            nd->args = v.v;
            nd->nargs = v.n;
            p->depth--;
            return nd;
        }
        if (!strcmp(t->s, "{")) {
            tsr__jdepth(p, t);
            tsr__jvec v = {0};
            while (!tsr__jis_op(tsr__jpeek(p), "}")) {
                tsr__jvec_push(p, &v, tsr__jexpr(p), NULL);
                tsr__jexpect_op(p, ":");
                tsr__jvec_push(p, &v, tsr__jexpr(p), NULL);
                if (!tsr__jis_op(tsr__jpeek(p), ",")) break;
                tsr__jnext(p);
            }
            tsr__jexpect_op(p, "}");
            nd = tsr__jnew(p, JN_DICT, t);
            nd->args = v.v;
            nd->nargs = v.n;
            p->depth--;
            return nd;
        }
        break;
    default:
        break;
    }
    tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "unexpected %s",
                 t->t == JT_OP ? t->s : t->t == JT_EOF ? "end of template" : "token");
}

static tsr__jnode *tsr__jpostfix(tsr__jparser *p, tsr__jnode *nd) {
    for (;;) {
        tsr__jtok *t = tsr__jpeek(p);
        if (tsr__jis_op(t, ".")) {
            tsr__jnext(p);
            tsr__jtok *nt = tsr__jnext(p);
            tsr__jnode *a = tsr__jnew(p, JN_ATTR, t);
            a->a = nd;
            if (nt->t == JT_NAME) {
                a->name = nt->s;
            } else if (nt->t == JT_INT) { /* x.0 is x[0] */
                a->k = JN_ITEM;
                a->b = tsr__jnew(p, JN_CONST, nt);
                a->b->cval = (tsr__jv){.t = JV_INT, .u.i = nt->i};
            } else {
                tsr__jp_fail(p, TSR_ERR_FORMAT, nt->line, nt->col, "expected an attribute name");
            }
            nd = a;
        } else if (tsr__jis_op(t, "[")) {
            tsr__jnext(p);
            tsr__jdepth(p, t);
            tsr__jnode *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                tsr__jtok *u = tsr__jpeek(p);
                if (tsr__jis_op(u, "]")) break;
                if (tsr__jis_op(u, ":")) {
                    tsr__jnext(p);
                    slice = true;
                    if (++np > 2)
                        tsr__jp_fail(p, TSR_ERR_FORMAT, u->line, u->col, "bad slice");
                    continue;
                }
                if (parts[np])
                    tsr__jp_fail(p, TSR_ERR_FORMAT, u->line, u->col, "expected ']'");
                parts[np] = tsr__jexpr(p);
            }
            tsr__jexpect_op(p, "]");
            p->depth--;
            tsr__jnode *a = tsr__jnew(p, slice ? JN_SLICE : JN_ITEM, t);
            a->a = nd;
            if (slice) {
                a->b = parts[0];
                a->c = parts[1];
                a->d = parts[2];
            } else {
                if (!parts[0]) tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "empty subscript");
                a->b = parts[0];
            }
            nd = a;
        } else if (tsr__jis_op(t, "(")) {
            tsr__jnext(p);
            tsr__jdepth(p, t);
            if (nd->k == JN_ATTR && !tsr__jin_set(tsr__jmethods, nd->name))
                tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, nd->line, nd->col, "unsupported method '%s'",
                             nd->name);
            tsr__jnode *c = tsr__jnew(p, JN_CALL, t);
            c->a = nd;
            tsr__jcall_args(p, c);
            p->depth--;
            nd = c;
        } else {
            return nd;
        }
    }
}

static tsr__jnode *tsr__jfilter_expr(tsr__jparser *p, tsr__jnode *nd) {
    for (;;) {
        tsr__jtok *t = tsr__jpeek(p);
        if (tsr__jis_op(t, "|")) {
            tsr__jnext(p);
            tsr__jtok *nt = tsr__jpeek(p);
            const char *nm = tsr__jexpect_name(p);
            if (!tsr__jin_set(tsr__jfilters, nm))
                tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, nt->line, nt->col, "unsupported filter '%s'",
                             nm);
            tsr__jnode *f = tsr__jnew(p, JN_FILTER, nt);
            f->name = nm;
            f->a = nd;
            if (tsr__jis_op(tsr__jpeek(p), "(")) {
                tsr__jnext(p);
                tsr__jdepth(p, nt);
                tsr__jcall_args(p, f);
                p->depth--;
            }
            nd = f;
        } else if (tsr__jis_name(t, "is")) {
            tsr__jnext(p);
            bool neg = false;
            if (tsr__jis_name(tsr__jpeek(p), "not")) {
                tsr__jnext(p);
                neg = true;
            }
            tsr__jtok *nt = tsr__jnext(p);
            const char *nm = nt->t == JT_NAME ? nt->s : NULL;
            if (!nm && nt->t == JT_OP) nm = nt->s;
            if (!nm || !tsr__jin_set(tsr__jtests, nm)) {
                if (nt->t != JT_NAME)
                    tsr__jp_fail(p, TSR_ERR_FORMAT, nt->line, nt->col, "expected a test name");
                tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, nt->line, nt->col, "unsupported test '%s'",
                             nm);
            }
            if (!strcmp(nm, "none") || !strcmp(nm, "true") || !strcmp(nm, "false")) {
                /* names that are also literals */
            }
            tsr__jnode *te = tsr__jnew(p, JN_TEST, nt);
            te->name = nm;
            te->op = neg;
            te->a = nd;
            tsr__jtok *u = tsr__jpeek(p);
            if (tsr__jis_op(u, "(")) {
                tsr__jnext(p);
                tsr__jdepth(p, u);
                tsr__jcall_args(p, te);
                p->depth--;
            } else if ((u->t == JT_NAME && !tsr__jis_name(u, "else") && !tsr__jis_name(u, "or") &&
                        !tsr__jis_name(u, "and")) ||
                       u->t == JT_STR || u->t == JT_INT || u->t == JT_FLOAT ||
                       tsr__jis_op(u, "[") || tsr__jis_op(u, "{")) {
                /* Jinja's rule: a test takes one argument without parentheses when a
                 * primary follows (not else/or/and) */
                if (tsr__jis_name(u, "is"))
                    tsr__jp_fail(p, TSR_ERR_FORMAT, u->line, u->col, "tests cannot be chained with is");
                tsr__jdepth(p, u);
                tsr__jnode *arg = tsr__jpostfix(p, tsr__jprimary(p));
                p->depth--;
                te->args = tsr__jalloc(p->ar, p->err, sizeof *te->args);
                te->kw = tsr__jalloc(p->ar, p->err, sizeof *te->kw);
                te->args[0] = arg;
                te->kw[0] = NULL;
                te->nargs = 1;
            }
            nd = te;
        } else {
            return nd;
        }
    }
}

static tsr__jnode *tsr__junary(tsr__jparser *p, bool with_filter) {
    tsr__jtok *t = tsr__jpeek(p);
    tsr__jdepth(p, t);
    tsr__jnode *nd;
    if (tsr__jis_op(t, "-") || tsr__jis_op(t, "+")) {
        tsr__jnext(p);
        nd = tsr__jnew(p, t->s[0] == '-' ? JN_NEG : JN_POS, t);
        nd->a = tsr__junary(p, false);
    } else {
        nd = tsr__jpostfix(p, tsr__jprimary(p));
    }
    if (with_filter) nd = tsr__jfilter_expr(p, nd);
    p->depth--;
    return nd;
}

static tsr__jnode *tsr__jbin(tsr__jparser *p, tsr__jop op, const tsr__jtok *at, tsr__jnode *l,
                             tsr__jnode *r) {
    tsr__jnode *nd = tsr__jnew(p, JN_BIN, at);
    nd->op = (int)op;
    nd->a = l;
    nd->b = r;
    return nd;
}

static tsr__jnode *tsr__jpow(tsr__jparser *p) {
    tsr__jnode *l = tsr__junary(p, true);
    while (tsr__jis_op(tsr__jpeek(p), "**")) {
        tsr__jtok *t = tsr__jnext(p);
        l = tsr__jbin(p, JO_POW, t, l, tsr__junary(p, true));
    }
    return l;
}

static tsr__jnode *tsr__jmath2(tsr__jparser *p) {
    tsr__jnode *l = tsr__jpow(p);
    for (;;) {
        tsr__jtok *t = tsr__jpeek(p);
        tsr__jop op;
        if (tsr__jis_op(t, "*")) op = JO_MUL;
        else if (tsr__jis_op(t, "/")) op = JO_DIV;
        else if (tsr__jis_op(t, "//")) op = JO_FDIV;
        else if (tsr__jis_op(t, "%")) op = JO_MOD;
        else return l;
        tsr__jnext(p);
        l = tsr__jbin(p, op, t, l, tsr__jpow(p));
    }
}

static tsr__jnode *tsr__jmath1(tsr__jparser *p) {
    tsr__jnode *l = tsr__jmath2(p);
    for (;;) {
        tsr__jtok *t = tsr__jpeek(p);
        tsr__jop op;
        if (tsr__jis_op(t, "+")) op = JO_ADD;
        else if (tsr__jis_op(t, "-")) op = JO_SUB;
        else return l;
        tsr__jnext(p);
        l = tsr__jbin(p, op, t, l, tsr__jmath2(p));
    }
}

static tsr__jnode *tsr__jconcat(tsr__jparser *p) {
    tsr__jnode *l = tsr__jmath1(p);
    while (tsr__jis_op(tsr__jpeek(p), "~")) {
        tsr__jtok *t = tsr__jnext(p);
        l = tsr__jbin(p, JO_CAT, t, l, tsr__jmath1(p));
    }
    return l;
}

static tsr__jnode *tsr__jcompare(tsr__jparser *p) {
    tsr__jnode *l = tsr__jconcat(p);
    for (;;) {
        tsr__jtok *t = tsr__jpeek(p);
        tsr__jop op;
        if (tsr__jis_op(t, "==")) op = JO_EQ;
        else if (tsr__jis_op(t, "!=")) op = JO_NE;
        else if (tsr__jis_op(t, "<")) op = JO_LT;
        else if (tsr__jis_op(t, "<=")) op = JO_LE;
        else if (tsr__jis_op(t, ">")) op = JO_GT;
        else if (tsr__jis_op(t, ">=")) op = JO_GE;
        else if (tsr__jis_name(t, "in")) op = JO_IN;
        else if (tsr__jis_name(t, "not") && tsr__jis_name(&p->toks[p->pos + 1], "in")) {
            tsr__jnext(p);
            op = JO_NOTIN;
        } else {
            return l;
        }
        tsr__jnext(p);
        l = tsr__jbin(p, op, t, l, tsr__jconcat(p));
    }
}

static tsr__jnode *tsr__jnot(tsr__jparser *p) {
    tsr__jtok *t = tsr__jpeek(p);
    if (tsr__jis_name(t, "not")) {
        tsr__jnext(p);
        tsr__jdepth(p, t);
        tsr__jnode *nd = tsr__jnew(p, JN_NOT, t);
        nd->a = tsr__jnot(p);
        p->depth--;
        return nd;
    }
    return tsr__jcompare(p);
}

/* A left-associative chain of one keyword operator ("and", "or") over operands parsed by
 * `sub` (the next tighter level). */
static tsr__jnode *tsr__jchain(tsr__jparser *p, const char *kw, tsr__jk kind,
                               tsr__jnode *(*sub)(tsr__jparser *)) {
    tsr__jnode *l = sub(p);
    while (tsr__jis_name(tsr__jpeek(p), kw)) {
        tsr__jtok *t = tsr__jnext(p);
        tsr__jnode *nd = tsr__jnew(p, kind, t);
        nd->a = l;
        nd->b = sub(p);
        l = nd;
    }
    return l;
}

static tsr__jnode *tsr__jand(tsr__jparser *p) { return tsr__jchain(p, "and", JN_AND, tsr__jnot); }

static tsr__jnode *tsr__jor(tsr__jparser *p) { return tsr__jchain(p, "or", JN_OR, tsr__jand); }

static tsr__jnode *tsr__jexpr(tsr__jparser *p) {
    tsr__jtok *t0 = tsr__jpeek(p);
    tsr__jdepth(p, t0);
    tsr__jnode *l = tsr__jor(p);
    while (tsr__jis_name(tsr__jpeek(p), "if")) {
        tsr__jtok *t = tsr__jnext(p);
        tsr__jnode *nd = tsr__jnew(p, JN_COND, t);
        nd->a = tsr__jor(p); /* condition */
        nd->b = l;
        if (tsr__jis_name(tsr__jpeek(p), "else")) {
            tsr__jnext(p);
            nd->c = tsr__jexpr(p);
        }
        l = nd;
    }
    p->depth--;
    return l;
}

/* Statements until one of the end tags in `ends` (NULL-terminated); returns a BODY node and
 * leaves the position just after the "{%" of the ending tag, whose name is *which. */
static tsr__jnode *tsr__jbody(tsr__jparser *p, const char *const *ends, const char **which);

static void tsr__jend_tag(tsr__jparser *p) {
    tsr__jtok *t = tsr__jnext(p);
    if (t->t != JT_BEND)
        tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "expected end of statement '%%}'");
}

static tsr__jnode *tsr__jstmt(tsr__jparser *p, tsr__jtok *at) {
    tsr__jtok *t = tsr__jnext(p);
    if (t->t != JT_NAME) tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "expected a statement");
    const char *kw = t->s;
    tsr__jdepth(p, t);
    tsr__jnode *nd;
    if (!strcmp(kw, "if")) {
        nd = tsr__jnew(p, JN_IF, at);
        nd->a = tsr__jexpr(p);
        tsr__jend_tag(p);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const char *which;
        nd->b = tsr__jbody(p, ends, &which);
        tsr__jnode *cur = nd;
        while (!strcmp(which, "elif")) {
            tsr__jnode *e = tsr__jnew(p, JN_IF, tsr__jpeek(p));
            e->a = tsr__jexpr(p);
            tsr__jend_tag(p);
            e->b = tsr__jbody(p, ends, &which);
            cur->c = e;
            cur = e;
        }
        if (!strcmp(which, "else")) {
            tsr__jend_tag(p);
            static const char *const ends2[] = {"endif", NULL};
            cur->c = tsr__jbody(p, ends2, &which);
        }
        tsr__jend_tag(p);
    } else if (!strcmp(kw, "for")) {
        nd = tsr__jnew(p, JN_FOR, at);
        nd->name = tsr__jexpect_name(p);
        if (tsr__jis_op(tsr__jpeek(p), ",")) {
            tsr__jnext(p);
            nd->name2 = tsr__jexpect_name(p);
            if (tsr__jis_op(tsr__jpeek(p), ",")) {
                tsr__jtok *u = tsr__jpeek(p);
                tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, u->line, u->col,
                             "for loop with more than two targets");
            }
        }
        tsr__jtok *in = tsr__jnext(p);
        if (!tsr__jis_name(in, "in")) tsr__jp_fail(p, TSR_ERR_FORMAT, in->line, in->col, "expected 'in'");
        nd->a = tsr__jor(p); /* iterable: no conditional expression (the 'if' filters) */
        if (tsr__jis_name(tsr__jpeek(p), "if")) {
            tsr__jnext(p);
            nd->d = tsr__jor(p);
        }
        if (tsr__jis_name(tsr__jpeek(p), "recursive")) {
            tsr__jtok *u = tsr__jpeek(p);
            tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, u->line, u->col, "recursive for loop");
        }
        tsr__jend_tag(p);
        static const char *const ends[] = {"else", "endfor", NULL};
        const char *which;
        nd->b = tsr__jbody(p, ends, &which);
        if (!strcmp(which, "else")) {
            tsr__jend_tag(p);
            static const char *const ends2[] = {"endfor", NULL};
            nd->c = tsr__jbody(p, ends2, &which);
        }
        tsr__jend_tag(p);
    } else if (!strcmp(kw, "set")) {
        tsr__jtok *nt = tsr__jpeek(p);
        const char *nm = tsr__jexpect_name(p);
        if (tsr__jis_op(tsr__jpeek(p), ".")) {
            tsr__jnext(p);
            nd = tsr__jnew(p, JN_SETATTR, at);
            nd->name = nm;
            nd->name2 = tsr__jexpect_name(p);
            tsr__jexpect_op(p, "=");
            nd->a = tsr__jexpr(p);
            tsr__jend_tag(p);
        } else if (tsr__jis_op(tsr__jpeek(p), ",") || tsr__jis_op(tsr__jpeek(p), "=")) {
            nd = tsr__jnew(p, JN_SET, at);
            nd->name = nm;
            if (tsr__jis_op(tsr__jpeek(p), ",")) { /* set a, b = ...: names in kw */
                tsr__jvec names = {0};
                tsr__jvec_push(p, &names, NULL, nm);
                while (tsr__jis_op(tsr__jpeek(p), ",")) {
                    tsr__jnext(p);
                    tsr__jvec_push(p, &names, NULL, tsr__jexpect_name(p));
                }
                nd->kw = names.kw;
                nd->nargs = names.n;
            }
            tsr__jexpect_op(p, "=");
            nd->a = tsr__jexpr(p);
            if (tsr__jis_op(tsr__jpeek(p), ",")) { /* set x = a, b: a tuple */
                tsr__jnode *l = tsr__jnew(p, JN_LIST, nt);
                tsr__jvec v = {0};
                tsr__jvec_push(p, &v, nd->a, NULL);
                while (tsr__jis_op(tsr__jpeek(p), ",")) {
                    tsr__jnext(p);
                    tsr__jvec_push(p, &v, tsr__jexpr(p), NULL);
                }
                l->op = 1; /* a tuple */
                l->args = v.v;
                l->nargs = v.n;
                nd->a = l;
            }
            tsr__jend_tag(p);
        } else if (tsr__jpeek(p)->t == JT_BEND) {
            tsr__jnext(p);
            nd = tsr__jnew(p, JN_SETBLOCK, at);
            nd->name = nm;
            static const char *const ends[] = {"endset", NULL};
            const char *which;
            nd->b = tsr__jbody(p, ends, &which);
            tsr__jend_tag(p);
        } else {
            tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, nt->line, nt->col,
                         "set with several targets or filters");
        }
    } else if (!strcmp(kw, "macro")) {
        nd = tsr__jnew(p, JN_MACRO, at);
        nd->name = tsr__jexpect_name(p);
        tsr__jexpect_op(p, "(");
        tsr__jvec v = {0};
        while (!tsr__jis_op(tsr__jpeek(p), ")")) {
            const char *pn = tsr__jexpect_name(p);
            tsr__jnode *def = NULL;
            if (tsr__jis_op(tsr__jpeek(p), "=")) {
                tsr__jnext(p);
                def = tsr__jexpr(p);
            }
            tsr__jvec_push(p, &v, def, pn);
            if (!tsr__jis_op(tsr__jpeek(p), ",")) break;
            tsr__jnext(p);
        }
        tsr__jexpect_op(p, ")");
        nd->args = v.v;
        nd->kw = v.kw;
        nd->nargs = v.n;
        tsr__jend_tag(p);
        static const char *const ends[] = {"endmacro", NULL};
        const char *which;
        nd->b = tsr__jbody(p, ends, &which);
        if (tsr__jpeek(p)->t == JT_NAME) tsr__jnext(p); /* {% endmacro name %} */
        tsr__jend_tag(p);
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        nd = tsr__jnew(p, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE, at);
        tsr__jend_tag(p);
    } else if (!strcmp(kw, "filter")) {
        /* {% filter f(args)|g %}body{% endfilter %}: the filters applied to the rendered
         * body, which they read as a reserved variable */
        nd = tsr__jnew(p, JN_FILTERBLOCK, at);
        tsr__jtok *nt = tsr__jpeek(p);
        tsr__jnode *base = tsr__jnew(p, JN_NAME, nt);
        base->name = "\x01body";
        const char *nm = tsr__jexpect_name(p);
        if (!tsr__jin_set(tsr__jfilters, nm))
            tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, nt->line, nt->col, "unsupported filter '%s'", nm);
        tsr__jnode *f = tsr__jnew(p, JN_FILTER, nt);
        f->name = nm;
        f->a = base;
        if (tsr__jis_op(tsr__jpeek(p), "(")) {
            tsr__jnext(p);
            tsr__jcall_args(p, f);
        }
        nd->a = tsr__jfilter_expr(p, f);
        tsr__jend_tag(p);
        static const char *const ends[] = {"endfilter", NULL};
        const char *which;
        nd->b = tsr__jbody(p, ends, &which);
        tsr__jend_tag(p);
    } else if (!strcmp(kw, "generation")) {
        /* transformers' AssistantTracker: the body renders as is */
        tsr__jend_tag(p);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        nd = tsr__jbody(p, ends, &which);
        tsr__jend_tag(p);
    } else {
        tsr__jp_fail(p, TSR_ERR_UNSUPPORTED, t->line, t->col, "unsupported statement '%s'", kw);
    }
    p->depth--;
    return nd;
}

static tsr__jnode *tsr__jbody(tsr__jparser *p, const char *const *ends, const char **which) {
    tsr__jvec v = {0};
    for (;;) {
        tsr__jtok *t = tsr__jnext(p);
        if (t->t == JT_EOF) {
            if (!ends) break;
            int last = 0;
            while (ends[last + 1]) last++;
            tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "missing {%% %s %%}", ends[last]);
        }
        if (t->t == JT_TEXT) {
            tsr__jnode *nd = tsr__jnew(p, JN_TEXT, t);
            nd->cval = (tsr__jv){.t = JV_STR, .u.s = {t->s, t->n}};
            tsr__jvec_push(p, &v, nd, NULL);
        } else if (t->t == JT_VBEGIN) {
            tsr__jnode *nd = tsr__jnew(p, JN_OUT, t);
            nd->a = tsr__jexpr(p);
            tsr__jtok *e = tsr__jnext(p);
            if (e->t != JT_VEND) tsr__jp_fail(p, TSR_ERR_FORMAT, e->line, e->col, "expected '}}'");
            tsr__jvec_push(p, &v, nd, NULL);
        } else if (t->t == JT_BBEGIN) {
            tsr__jtok *nt = tsr__jpeek(p);
            if (nt->t == JT_NAME && ends) {
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(nt->s, ends[i])) {
                        tsr__jnext(p);
                        *which = ends[i];
                        goto done;
                    }
            }
            if (nt->t == JT_NAME && (!strncmp(nt->s, "end", 3) || !strcmp(nt->s, "elif") ||
                                     !strcmp(nt->s, "else")))
                tsr__jp_fail(p, TSR_ERR_FORMAT, nt->line, nt->col, "unexpected '%s'", nt->s);
            tsr__jvec_push(p, &v, tsr__jstmt(p, t), NULL);
        } else {
            tsr__jp_fail(p, TSR_ERR_FORMAT, t->line, t->col, "unexpected token");
        }
    }
done:;
    tsr__jnode *b = tsr__jnew(p, JN_BODY, &p->toks[p->pos ? p->pos - 1 : 0]);
    b->args = v.v;
    b->nargs = v.n;
    return b;
}

struct tsr_jinja {
    tsr__jarena ar;
    tsr__jnode *root;
    char what[128];
};

tsr_status tsr_jinja_parse(const char *src, size_t len, const char *what, tsr_jinja **out) {
    *out = NULL;
    tsr_jinja *t = tsr_calloc(1, sizeof *t);
    if (!t) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", what);
    snprintf(t->what, sizeof t->what, "%s", what ? what : "template");
    t->ar.limit = 64u << 20;
    tsr__jerr err;
    tsr__jparser p = {.ar = &t->ar, .err = &err, .what = t->what, .pos_line = 1, .pos_col = 1};
    if (setjmp(err.jb)) {
        tsr__jarena_free(&t->ar);
        tsr_free(t);
        return tsr_error_set(err.code, "%s", err.msg);
    }
    /* newlines normalised to \n; one trailing newline dropped (keep_trailing_newline off) */
    char *s = tsr__jalloc(&t->ar, &err, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    p.src = s;
    p.len = n;
    tsr__jscan(&p);
    const char *which = NULL;
    t->root = tsr__jbody(&p, NULL, &which);
    *out = t;
    return TSR_OK;
}

void tsr_jinja_free(tsr_jinja *t) {
    if (!t) return;
    tsr__jarena_free(&t->ar);
    tsr_free(t);
}

/* ---------------------------------------------------------------- evaluation */

typedef struct tsr__jscope {
    struct tsr__jscope *parent;
    tsr__jdict vars;
} tsr__jscope;

typedef struct tsr__jctx {
    tsr__jarena ar;
    tsr__jerr err;
    const char *what;
    char *out;
    size_t n, cap, max_out;
    int64_t now;
    int calls;
    long steps;
    tsr__jscope *globals;
} tsr__jctx;

static void tsr__jrfail(tsr__jctx *c, const tsr__jnode *at, tsr_status code, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
static void tsr__jrfail(tsr__jctx *c, const tsr__jnode *at, tsr_status code, const char *fmt,
                        ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    tsr__jfail(&c->err, code, "%s: %d:%d: %s", c->what, at ? at->line : 0, at ? at->col : 0, m);
}

static void *tsr__jra(tsr__jctx *c, size_t n) { return tsr__jalloc(&c->ar, &c->err, n); }

static tsr__jv tsr__jv_undef(void) { return (tsr__jv){.t = JV_UNDEF}; }
static tsr__jv tsr__jv_none(void) { return (tsr__jv){.t = JV_NONE}; }
static tsr__jv tsr__jv_bool(bool b) { return (tsr__jv){.t = JV_BOOL, .u.b = b}; }
static tsr__jv tsr__jv_int(int64_t i) { return (tsr__jv){.t = JV_INT, .u.i = i}; }
static tsr__jv tsr__jv_float(double f) { return (tsr__jv){.t = JV_FLOAT, .u.f = f}; }
static tsr__jv tsr__jv_str(const char *p, size_t n) {
    return (tsr__jv){.t = JV_STR, .u.s = {p, n}};
}
static tsr__jv tsr__jv_cstr(const char *p) { return tsr__jv_str(p, strlen(p)); }

static tsr__jv tsr__jv_list(tsr__jctx *c, size_t cap) {
    tsr__jlist *l = tsr__jra(c, sizeof *l);
    l->n = 0;
    l->tup = false;
    l->cap = cap ? cap : 4;
    l->v = tsr__jra(c, l->cap * sizeof *l->v);
    return (tsr__jv){.t = JV_LIST, .u.l = l};
}
static void tsr__jlist_push(tsr__jctx *c, tsr__jlist *l, tsr__jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap * 2;
        tsr__jv *nv = tsr__jra(c, cap * sizeof *nv);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}
static tsr__jv tsr__jv_dict(tsr__jctx *c) {
    tsr__jdict *d = tsr__jra(c, sizeof *d);
    memset(d, 0, sizeof *d);
    return (tsr__jv){.t = JV_DICT, .u.d = d};
}

static bool tsr__jstr_eq(tsr__jv a, const char *s, size_t n) {
    return a.t == JV_STR && a.u.s.n == n && !memcmp(a.u.s.p, s, n);
}

static bool tsr__jeq(tsr__jv a, tsr__jv b);

static tsr__jv *tsr__jdict_find(const tsr__jdict *d, tsr__jv k) {
    for (size_t i = 0; i < d->n; i++)
        if (tsr__jeq(d->k[i], k)) return &d->v[i];
    return NULL;
}
static tsr__jv *tsr__jdict_findc(const tsr__jdict *d, const char *k) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (tsr__jstr_eq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static void tsr__jdict_set(tsr__jctx *c, tsr__jdict *d, tsr__jv k, tsr__jv v) {
    tsr__jv *e = tsr__jdict_find(d, k);
    if (e) {
        *e = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        tsr__jv *nk = tsr__jra(c, cap * sizeof *nk), *nv = tsr__jra(c, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static tsr__jv tsr__jfrom_json(tsr__jctx *c, const cJSON *j, int depth) {
    if (depth > 100) tsr__jrfail(c, NULL, TSR_ERR_INVALID, "context nested too deeply");
    if (!j || cJSON_IsNull(j)) return tsr__jv_none();
    if (cJSON_IsBool(j)) return tsr__jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double f = j->valuedouble;
        /* cJSON keeps no int/float distinction: integral numbers become ints (a JSON 2.0
         * prints as 2, where Python would print 2.0) */
        if (f == floor(f) && fabs(f) < 9.2e18) return tsr__jv_int((int64_t)f);
        return tsr__jv_float(f);
    }
    if (cJSON_IsString(j)) return tsr__jv_cstr(j->valuestring);
    if (cJSON_IsArray(j)) {
        tsr__jv l = tsr__jv_list(c, (size_t)cJSON_GetArraySize(j) + 1);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) tsr__jlist_push(c, l.u.l, tsr__jfrom_json(c, it, depth + 1));
        return l;
    }
    if (cJSON_IsObject(j)) {
        tsr__jv d = tsr__jv_dict(c);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            tsr__jdict_set(c, d.u.d, tsr__jv_cstr(it->string ? it->string : ""),
                           tsr__jfrom_json(c, it, depth + 1));
        }
        return d;
    }
    return tsr__jv_none();
}

/* -------- string builder (arena-backed, for str()/repr/json; output uses c->out) */

typedef struct tsr__jsb {
    tsr__jctx *c;
    char *p;
    size_t n, cap;
} tsr__jsb;

static void tsr__jsb_put(tsr__jsb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        if (cap > b->c->max_out * 2 + 1024)
            tsr__jrfail(b->c, NULL, TSR_ERR_BUDGET, "a string grows beyond %zu bytes", b->c->max_out);
        char *np = tsr__jra(b->c, cap);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void tsr__jsb_str(tsr__jsb *b, const char *s) { tsr__jsb_put(b, s, strlen(s)); }
static void tsr__jsb_ch(tsr__jsb *b, char ch) { tsr__jsb_put(b, &ch, 1); }
static tsr__jv tsr__jsb_val(tsr__jsb *b) {
    if (!b->p) return tsr__jv_str("", 0);
    return tsr__jv_str(b->p, b->n);
}

/* Python's repr(float). */
static void tsr__jfloat_repr(tsr__jsb *b, double f) {
    if (isnan(f)) {
        tsr__jsb_str(b, "nan");
        return;
    }
    if (isinf(f)) {
        tsr__jsb_str(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* digits and exponent */
    char digits[32];
    int nd = 0;
    const char *q = buf;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) tsr__jsb_ch(b, '-');
    if (exp10 >= 16 || exp10 < -4) {
        tsr__jsb_ch(b, digits[0]);
        if (nd > 1) {
            tsr__jsb_ch(b, '.');
            tsr__jsb_str(b, digits + 1);
        }
        snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        tsr__jsb_str(b, buf);
    } else if (exp10 < 0) {
        tsr__jsb_str(b, "0.");
        for (int i = 0; i < -exp10 - 1; i++) tsr__jsb_ch(b, '0');
        tsr__jsb_str(b, digits);
    } else {
        for (int i = 0; i <= exp10; i++) tsr__jsb_ch(b, i < nd ? digits[i] : '0');
        tsr__jsb_ch(b, '.');
        if (nd > exp10 + 1)
            tsr__jsb_str(b, digits + exp10 + 1);
        else
            tsr__jsb_ch(b, '0');
    }
}

static void tsr__jstr_into(tsr__jsb *b, tsr__jv v, bool repr);

static void tsr__jrepr_str(tsr__jsb *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = (sq && !dq) ? '"' : '\'';
    tsr__jsb_ch(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ch == '\\') tsr__jsb_str(b, "\\\\");
        else if (ch == (unsigned char)q) {
            tsr__jsb_ch(b, '\\');
            tsr__jsb_ch(b, q);
        } else if (ch == '\n') tsr__jsb_str(b, "\\n");
        else if (ch == '\r') tsr__jsb_str(b, "\\r");
        else if (ch == '\t') tsr__jsb_str(b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", ch);
            tsr__jsb_str(b, e);
        } else tsr__jsb_ch(b, (char)ch);
    }
    tsr__jsb_ch(b, q);
}

/* Python str(v) (repr=false) or repr(v). */
static void tsr__jstr_into(tsr__jsb *b, tsr__jv v, bool repr) {
    char buf[32];
    switch (v.t) {
    case JV_UNDEF:
        if (repr) tsr__jsb_str(b, "Undefined");
        break;
    case JV_NONE: tsr__jsb_str(b, "None"); break;
    case JV_BOOL: tsr__jsb_str(b, v.u.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        tsr__jsb_str(b, buf);
        break;
    case JV_FLOAT: tsr__jfloat_repr(b, v.u.f); break;
    case JV_STR:
        if (repr) tsr__jrepr_str(b, v.u.s.p, v.u.s.n);
        else tsr__jsb_put(b, v.u.s.p, v.u.s.n);
        break;
    case JV_LIST:
        tsr__jsb_ch(b, v.u.l->tup ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tsr__jsb_str(b, ", ");
            tsr__jstr_into(b, v.u.l->v[i], true);
        }
        if (v.u.l->tup && v.u.l->n == 1) tsr__jsb_ch(b, ',');
        tsr__jsb_ch(b, v.u.l->tup ? ')' : ']');
        break;
    case JV_DICT:
        tsr__jsb_ch(b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) tsr__jsb_str(b, ", ");
            tsr__jstr_into(b, v.u.d->k[i], true);
            tsr__jsb_str(b, ": ");
            tsr__jstr_into(b, v.u.d->v[i], true);
        }
        tsr__jsb_ch(b, '}');
        break;
    case JV_NS: tsr__jsb_str(b, "<Namespace>"); break;
    case JV_MACRO: tsr__jsb_str(b, "<Macro>"); break;
    case JV_FUNC: tsr__jsb_str(b, "<function>"); break;
    }
}

static tsr__jv tsr__jto_str(tsr__jctx *c, tsr__jv v) {
    if (v.t == JV_STR) return v;
    tsr__jsb b = {.c = c};
    tsr__jstr_into(&b, v, false);
    return tsr__jsb_val(&b);
}

/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) */
typedef struct tsr__jjson {
    int indent; /* < 0: none */
    const char *item_sep, *key_sep;
    bool sort_keys;
} tsr__jjson;

static int tsr__jcmp(tsr__jctx *c, const tsr__jnode *at, tsr__jv a, tsr__jv b);

static void tsr__jjson_into(tsr__jctx *c, const tsr__jnode *at, tsr__jsb *b, tsr__jv v,
                            const tsr__jjson *o, int level) {
    if (level > 100) tsr__jrfail(c, at, TSR_ERR_INVALID, "tojson: nesting too deep");
    switch (v.t) {
    case JV_NONE: tsr__jsb_str(b, "null"); return;
    case JV_BOOL: tsr__jsb_str(b, v.u.b ? "true" : "false"); return;
    case JV_INT:
    case JV_FLOAT:
        if (v.t == JV_FLOAT && isnan(v.u.f)) tsr__jsb_str(b, "NaN");
        else if (v.t == JV_FLOAT && isinf(v.u.f)) tsr__jsb_str(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else tsr__jstr_into(b, v, false);
        return;
    case JV_STR: {
        tsr__jsb_ch(b, '"');
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char ch = (unsigned char)v.u.s.p[i];
            char e[8];
            switch (ch) {
            case '"': tsr__jsb_str(b, "\\\""); break;
            case '\\': tsr__jsb_str(b, "\\\\"); break;
            case '\n': tsr__jsb_str(b, "\\n"); break;
            case '\r': tsr__jsb_str(b, "\\r"); break;
            case '\t': tsr__jsb_str(b, "\\t"); break;
            case '\b': tsr__jsb_str(b, "\\b"); break;
            case '\f': tsr__jsb_str(b, "\\f"); break;
            default:
                if (ch < 0x20) {
                    snprintf(e, sizeof e, "\\u%04x", ch);
                    tsr__jsb_str(b, e);
                } else {
                    tsr__jsb_ch(b, (char)ch);
                }
            }
        }
        tsr__jsb_ch(b, '"');
        return;
    }
    case JV_LIST:
    case JV_DICT: {
        bool isl = v.t == JV_LIST;
        size_t n = isl ? v.u.l->n : v.u.d->n;
        tsr__jsb_ch(b, isl ? '[' : '{');
        if (n == 0) {
            tsr__jsb_ch(b, isl ? ']' : '}');
            return;
        }
        size_t *ord = tsr__jra(c, n * sizeof *ord);
        for (size_t i = 0; i < n; i++) ord[i] = i;
        if (!isl && o->sort_keys)
            for (size_t i = 1; i < n; i++) /* insertion sort: stable, small n */
                for (size_t j = i; j > 0 && tsr__jcmp(c, at, v.u.d->k[ord[j - 1]], v.u.d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        for (size_t i = 0; i < n; i++) {
            if (i) tsr__jsb_str(b, o->item_sep);
            if (o->indent >= 0) {
                tsr__jsb_ch(b, '\n');
                for (int k = 0; k < o->indent * (level + 1); k++) tsr__jsb_ch(b, ' ');
            }
            if (isl) {
                tsr__jjson_into(c, at, b, v.u.l->v[i], o, level + 1);
            } else {
                tsr__jv k = v.u.d->k[ord[i]];
                if (k.t == JV_STR) tsr__jjson_into(c, at, b, k, o, level + 1);
                else if (k.t == JV_NONE) tsr__jsb_str(b, "\"null\"");
                else if (k.t == JV_BOOL) tsr__jsb_str(b, k.u.b ? "\"true\"" : "\"false\"");
                else if (k.t == JV_INT || k.t == JV_FLOAT) {
                    tsr__jsb_ch(b, '"');
                    tsr__jstr_into(b, k, false);
                    tsr__jsb_ch(b, '"');
                } else tsr__jrfail(c, at, TSR_ERR_INVALID, "tojson: keys must be str, int, float, bool or None");
                tsr__jsb_str(b, o->key_sep);
                tsr__jjson_into(c, at, b, v.u.d->v[ord[i]], o, level + 1);
            }
        }
        if (o->indent >= 0) {
            tsr__jsb_ch(b, '\n');
            for (int k = 0; k < o->indent * level; k++) tsr__jsb_ch(b, ' ');
        }
        tsr__jsb_ch(b, isl ? ']' : '}');
        return;
    }
    default:
        tsr__jrfail(c, at, TSR_ERR_INVALID, "tojson: object of this type is not JSON serializable");
    }
}

static bool tsr__jtruthy(tsr__jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool tsr__jnum(tsr__jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double tsr__jnumf(tsr__jv v) {
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t tsr__jnumi(tsr__jv v) { return v.t == JV_INT ? v.u.i : (int64_t)v.u.b; }

static bool tsr__jeq(tsr__jv a, tsr__jv b) {
    if (tsr__jnum(a) && tsr__jnum(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return tsr__jnumi(a) == tsr__jnumi(b);
        return tsr__jnumf(a) == tsr__jnumf(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tup != b.u.l->tup) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tsr__jeq(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tsr__jv *o = tsr__jdict_find(b.u.d, a.u.d->k[i]);
            if (!o || !tsr__jeq(a.u.d->v[i], *o)) return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

static int tsr__jcmp(tsr__jctx *c, const tsr__jnode *at, tsr__jv a, tsr__jv b) {
    if (tsr__jnum(a) && tsr__jnum(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = tsr__jnumi(a), y = tsr__jnumi(b);
            return x < y ? -1 : x > y;
        }
        double x = tsr__jnumf(a), y = tsr__jnumf(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, m);
        if (r) return r < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (!tsr__jeq(a.u.l->v[i], b.u.l->v[i])) return tsr__jcmp(c, at, a.u.l->v[i], b.u.l->v[i]);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    tsr__jrfail(c, at, TSR_ERR_INVALID, "'<' not supported between these types");
}

static void tsr__jstep(tsr__jctx *c, const tsr__jnode *at) {
    if (++c->steps > TSR__J_MAX_STEPS)
        tsr__jrfail(c, at, TSR_ERR_BUDGET, "template takes more than %d steps", TSR__J_MAX_STEPS);
}

static tsr__jv tsr__jeval(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc);

static tsr__jv tsr__jlookup(tsr__jscope *sc, const char *nm) {
    for (; sc; sc = sc->parent) {
        tsr__jv *v = tsr__jdict_findc(&sc->vars, nm);
        if (v) return *v;
    }
    return tsr__jv_undef();
}

static void tsr__jsetvar(tsr__jctx *c, tsr__jscope *sc, const char *nm, tsr__jv v) {
    tsr__jdict_set(c, &sc->vars, tsr__jv_cstr(nm), v);
}

static tsr__jv tsr__jiter(tsr__jctx *c, const tsr__jnode *at, tsr__jv v);
static tsr__jv tsr__jjoin(tsr__jctx *c, tsr__jv list, tsr__jv sep);
static uint32_t tsr__jcp_next(const char *s, size_t n, size_t *i);
static bool tsr__jascii(tsr__jv s);

static tsr__jv tsr__jgetattr(tsr__jctx *c, const tsr__jnode *at, tsr__jv o, tsr__jv key) {
    if (o.t == JV_UNDEF)
        tsr__jrfail(c, at, TSR_ERR_INVALID, "attribute or item of an undefined value");
    if (o.t == JV_DICT || o.t == JV_NS) {
        tsr__jv *v = tsr__jdict_find(o.u.d, key);
        return v ? *v : tsr__jv_undef();
    }
    if ((o.t == JV_LIST || o.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        if (o.t == JV_STR && !tsr__jascii(o)) o = tsr__jiter(c, at, o); /* code points */
        int64_t n = o.t == JV_LIST ? (int64_t)o.u.l->n : (int64_t)o.u.s.n;
        int64_t i = tsr__jnumi(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return tsr__jv_undef();
        if (o.t == JV_LIST) return o.u.l->v[i];
        return tsr__jv_str(o.u.s.p + i, 1);
    }
    if (o.t == JV_NONE)
        tsr__jrfail(c, at, TSR_ERR_INVALID, "'NoneType' object has no attribute or item");
    return tsr__jv_undef();
}

static int64_t tsr__jsli(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc, int64_t dflt,
                         int64_t n, bool *given) {
    *given = false;
    if (!nd) return dflt;
    tsr__jv v = tsr__jeval(c, nd, sc);
    if (v.t == JV_NONE) return dflt;
    if (v.t != JV_INT) tsr__jrfail(c, nd, TSR_ERR_INVALID, "slice indices must be integers");
    *given = true;
    (void)n;
    return v.u.i;
}

static bool tsr__jascii(tsr__jv s) {
    for (size_t i = 0; i < s.u.s.n; i++)
        if ((unsigned char)s.u.s.p[i] >= 0x80) return false;
    return true;
}

static tsr__jv tsr__jslice(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc) {
    tsr__jv o = tsr__jeval(c, nd->a, sc);
    if (o.t != JV_LIST && o.t != JV_STR)
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "slicing a value that is not a list or string");
    bool joined = false; /* a non-ASCII string is sliced as its list of code points */
    if (o.t == JV_STR && !tsr__jascii(o)) {
        o = tsr__jiter(c, nd, o);
        joined = true;
    }
    int64_t n = o.t == JV_LIST ? (int64_t)o.u.l->n : (int64_t)o.u.s.n;
    bool g1, g2, g3;
    int64_t step = tsr__jsli(c, nd->d, sc, 1, n, &g3);
    if (step == 0) tsr__jrfail(c, nd, TSR_ERR_INVALID, "slice step cannot be zero");
    int64_t start = tsr__jsli(c, nd->b, sc, 0, n, &g1), stop = tsr__jsli(c, nd->c, sc, 0, n, &g2);
    /* Python's PySlice_AdjustIndices */
    if (!g1) start = step < 0 ? n - 1 : 0;
    else {
        if (start < 0) start += n;
        if (start < 0) start = step < 0 ? -1 : 0;
        else if (start >= n) start = step < 0 ? n - 1 : n;
    }
    if (!g2) stop = step < 0 ? -1 : n;
    else {
        if (stop < 0) stop += n;
        if (stop < 0) stop = step < 0 ? -1 : 0;
        else if (stop >= n) stop = step < 0 ? n - 1 : n;
    }
    if (o.t == JV_LIST) {
        tsr__jv r = tsr__jv_list(c, 4);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            tsr__jlist_push(c, r.u.l, o.u.l->v[i]);
        return joined ? tsr__jjoin(c, r, tsr__jv_str("", 0)) : r;
    }
    tsr__jsb b = {.c = c};
    tsr__jsb_put(&b, "", 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        tsr__jsb_ch(&b, o.u.s.p[i]);
    return tsr__jsb_val(&b);
}

/* Iterating a value: lists as they are, dicts by key, strings by character. */
static tsr__jv tsr__jiter(tsr__jctx *c, const tsr__jnode *at, tsr__jv v) {
    if (v.t == JV_LIST) return v;
    if (v.t == JV_UNDEF) return tsr__jv_list(c, 1);
    if (v.t == JV_DICT) {
        tsr__jv r = tsr__jv_list(c, v.u.d->n + 1);
        for (size_t i = 0; i < v.u.d->n; i++) tsr__jlist_push(c, r.u.l, v.u.d->k[i]);
        return r;
    }
    if (v.t == JV_STR) {
        tsr__jv r = tsr__jv_list(c, v.u.s.n + 1);
        const unsigned char *s = (const unsigned char *)v.u.s.p;
        (void)s;
        for (size_t i = 0; i < v.u.s.n;) {
            size_t at0 = i;
            tsr__jcp_next(v.u.s.p, v.u.s.n, &i);
            tsr__jlist_push(c, r.u.l, tsr__jv_str(v.u.s.p + at0, i - at0));
        }
        return r;
    }
    tsr__jrfail(c, at, TSR_ERR_INVALID, "value is not iterable");
}

static size_t tsr__jutf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

static bool tsr__jcontains(tsr__jctx *c, const tsr__jnode *at, tsr__jv hay, tsr__jv needle) {
    if (hay.t == JV_STR) {
        if (needle.t != JV_STR)
            tsr__jrfail(c, at, TSR_ERR_INVALID, "'in <string>' requires string as left operand");
        if (needle.u.s.n == 0) return true;
        if (needle.u.s.n > hay.u.s.n) return false;
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (!memcmp(hay.u.s.p + i, needle.u.s.p, needle.u.s.n)) return true;
        return false;
    }
    if (hay.t == JV_DICT || hay.t == JV_NS) return tsr__jdict_find(hay.u.d, needle) != NULL;
    if (hay.t == JV_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (tsr__jeq(hay.u.l->v[i], needle)) return true;
        return false;
    }
    if (hay.t == JV_UNDEF) return false;
    tsr__jrfail(c, at, TSR_ERR_INVALID, "'in' on a value that is not a container");
}

static tsr__jv tsr__jconcat_str(tsr__jctx *c, tsr__jv a, tsr__jv b) {
    tsr__jsb s = {.c = c};
    tsr__jstr_into(&s, a, false);
    tsr__jstr_into(&s, b, false);
    if (!s.p) tsr__jsb_put(&s, "", 0);
    return tsr__jsb_val(&s);
}

static int64_t tsr__jfloordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* Python's "fmt" % args for the conversions templates use: %s %r %d %i %%. */
static tsr__jv tsr__jprintf(tsr__jctx *c, const tsr__jnode *nd, tsr__jv fmt, tsr__jv args) {
    tsr__jsb b = {.c = c};
    tsr__jsb_put(&b, "", 0);
    size_t ai = 0;
    for (size_t i = 0; i < fmt.u.s.n; i++) {
        char ch = fmt.u.s.p[i];
        if (ch != '%') {
            tsr__jsb_ch(&b, ch);
            continue;
        }
        char cv = i + 1 < fmt.u.s.n ? fmt.u.s.p[++i] : 0;
        if (cv == '%') {
            tsr__jsb_ch(&b, '%');
            continue;
        }
        if (ai >= args.u.l->n) tsr__jrfail(c, nd, TSR_ERR_INVALID, "not enough arguments for format string");
        tsr__jv arg = args.u.l->v[ai++];
        if (cv == 's') tsr__jstr_into(&b, arg, false);
        else if (cv == 'r') tsr__jstr_into(&b, arg, true);
        else if ((cv == 'd' || cv == 'i') && tsr__jnum(arg))
            tsr__jstr_into(&b, tsr__jv_int(arg.t == JV_FLOAT ? (int64_t)arg.u.f : tsr__jnumi(arg)), false);
        else tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "format conversion '%%%c'", cv ? cv : ' ');
    }
    if (ai < args.u.l->n) tsr__jrfail(c, nd, TSR_ERR_INVALID, "not all arguments converted during string formatting");
    return tsr__jsb_val(&b);
}

static tsr__jv tsr__jbinop(tsr__jctx *c, const tsr__jnode *nd, tsr__jop op, tsr__jv a, tsr__jv b) {
    switch (op) {
    case JO_CAT: return tsr__jconcat_str(c, a, b);
    case JO_EQ: return tsr__jv_bool(tsr__jeq(a, b));
    case JO_NE: return tsr__jv_bool(!tsr__jeq(a, b));
    case JO_LT: return tsr__jv_bool(tsr__jcmp(c, nd, a, b) < 0);
    case JO_LE: return tsr__jv_bool(tsr__jcmp(c, nd, a, b) <= 0);
    case JO_GT: return tsr__jv_bool(tsr__jcmp(c, nd, a, b) > 0);
    case JO_GE: return tsr__jv_bool(tsr__jcmp(c, nd, a, b) >= 0);
    case JO_IN: return tsr__jv_bool(tsr__jcontains(c, nd, b, a));
    case JO_NOTIN: return tsr__jv_bool(!tsr__jcontains(c, nd, b, a));
    default: break;
    }
    if (op == JO_ADD && a.t == JV_STR && b.t == JV_STR) return tsr__jconcat_str(c, a, b);
    if (op == JO_MOD && a.t == JV_STR) {
        if (b.t == JV_LIST && b.u.l->tup) return tsr__jprintf(c, nd, a, b);
        tsr__jv one = tsr__jv_list(c, 1);
        tsr__jlist_push(c, one.u.l, b);
        return tsr__jprintf(c, nd, a, one);
    }
    if (op == JO_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        tsr__jv r = tsr__jv_list(c, a.u.l->n + b.u.l->n + 1);
        for (size_t i = 0; i < a.u.l->n; i++) tsr__jlist_push(c, r.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) tsr__jlist_push(c, r.u.l, b.u.l->v[i]);
        return r;
    }
    if (op == JO_MUL && ((a.t == JV_STR && b.t == JV_INT) || (a.t == JV_INT && b.t == JV_STR))) {
        tsr__jv s = a.t == JV_STR ? a : b;
        int64_t k = a.t == JV_INT ? a.u.i : b.u.i;
        tsr__jsb sb = {.c = c};
        tsr__jsb_put(&sb, "", 0);
        if (k > 0 && s.u.s.n > 0 && (uint64_t)k > c->max_out / s.u.s.n)
            tsr__jrfail(c, nd, TSR_ERR_BUDGET, "string repetition beyond the output limit");
        for (int64_t i = 0; i < k; i++) tsr__jsb_put(&sb, s.u.s.p, s.u.s.n);
        return tsr__jsb_val(&sb);
    }
    if (!tsr__jnum(a) || !tsr__jnum(b))
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "unsupported operand types for an arithmetic operator");
    bool fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    if (op == JO_DIV || fl || op == JO_POW) {
        double x = tsr__jnumf(a), y = tsr__jnumf(b);
        if ((op == JO_DIV || op == JO_FDIV || op == JO_MOD) && y == 0)
            tsr__jrfail(c, nd, TSR_ERR_INVALID, "division by zero");
        switch (op) {
        case JO_ADD: return tsr__jv_float(x + y);
        case JO_SUB: return tsr__jv_float(x - y);
        case JO_MUL: return tsr__jv_float(x * y);
        case JO_DIV: return tsr__jv_float(x / y);
        case JO_FDIV: return tsr__jv_float(floor(x / y));
        case JO_MOD: {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return tsr__jv_float(m);
        }
        case JO_POW:
            if (!fl && y >= 0) {
                int64_t base = tsr__jnumi(a), e = tsr__jnumi(b), r = 1;
                for (int64_t i = 0; i < e; i++) {
                    if (__builtin_mul_overflow(r, base, &r))
                        tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "integer beyond 64 bits");
                    if (r == 0 || r == 1) break;
                }
                return tsr__jv_int(r);
            }
            return tsr__jv_float(pow(x, y));
        default: break;
        }
    }
    int64_t x = tsr__jnumi(a), y = tsr__jnumi(b), r = 0;
    bool ovf = false;
    switch (op) {
    case JO_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
    case JO_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
    case JO_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
    case JO_FDIV:
    case JO_MOD:
        if (y == 0) tsr__jrfail(c, nd, TSR_ERR_INVALID, "division by zero");
        if (x == INT64_MIN && y == -1) ovf = true;
        else if (op == JO_FDIV) r = tsr__jfloordiv(x, y);
        else r = x - tsr__jfloordiv(x, y) * y;
        break;
    default: break;
    }
    if (ovf) tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "integer beyond 64 bits");
    return tsr__jv_int(r);
}

/* -------- arguments */

typedef struct tsr__jargs {
    tsr__jv v[8];
    const char *kw[8];
    int n;
} tsr__jargs;

static void tsr__jeval_args(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc, tsr__jargs *a) {
    if (nd->nargs > 8) tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "more than 8 arguments");
    a->n = nd->nargs;
    for (int i = 0; i < nd->nargs; i++) {
        a->v[i] = tsr__jeval(c, nd->args[i], sc);
        a->kw[i] = nd->kw ? nd->kw[i] : NULL;
    }
}

/* Argument `pos` (positional index, after any already-taken ones) or keyword `name`. */
static bool tsr__jarg(const tsr__jargs *a, int pos, const char *name, tsr__jv *out) {
    int k = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            if (name && !strcmp(a->kw[i], name)) {
                *out = a->v[i];
                return true;
            }
        } else if (k++ == pos) {
            *out = a->v[i];
            return true;
        }
    }
    return false;
}

static tsr__jv tsr__jstr_arg(tsr__jctx *c, const tsr__jnode *at, const tsr__jargs *a, int pos,
                             const char *name) {
    tsr__jv v;
    if (!tsr__jarg(a, pos, name, &v) || v.t != JV_STR)
        tsr__jrfail(c, at, TSR_ERR_INVALID, "expected a string argument%s%s", name ? " " : "",
                    name ? name : "");
    return v;
}

static bool tsr__jstarts(tsr__jv s, tsr__jv p) {
    return p.u.s.n <= s.u.s.n && !memcmp(s.u.s.p, p.u.s.p, p.u.s.n);
}
static bool tsr__jends(tsr__jv s, tsr__jv p) {
    return p.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + s.u.s.n - p.u.s.n, p.u.s.p, p.u.s.n);
}

/* Python's str.strip family; chars: NULL for whitespace. */
static tsr__jv tsr__jstrip(tsr__jv s, tsr__jv *chars, bool left, bool right) {
    const char *p = s.u.s.p;
    size_t i = 0, n = s.u.s.n;
    bool ws = !chars || chars->t != JV_STR;
#define TSR__JSTRIPC(ch) (ws ? tsr__jws(ch) || (ch) == '\x1c' || (ch) == '\x1d' || (ch) == '\x1e' || (ch) == '\x1f' \
                             : memchr(chars->u.s.p, (ch), chars->u.s.n) != NULL)
    if (left)
        while (i < n && TSR__JSTRIPC(p[i])) i++;
    if (right)
        while (n > i && TSR__JSTRIPC(p[n - 1])) n--;
#undef TSR__JSTRIPC
    return tsr__jv_str(p + i, n - i);
}

/* Case mapping of one code point for the scripts chat content commonly holds (ASCII,
 * Latin-1, Latin Extended-A, basic Greek and Cyrillic); others have no case here. */
static uint32_t tsr__jcp_upper(uint32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    if (cp == 0x131) return 'I';
    if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 0x20;
    if (cp == 0xFF) return 0x178;
    if (cp == 0xB5) return 0x39C;
    if (cp >= 0x100 && cp <= 0x137) return cp & ~1u;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return (cp & 1) ? cp : cp - 1;
    if (cp >= 0x14A && cp <= 0x177) return cp & ~1u;
    if (cp == 0x3C2) return 0x3A3;
    if (cp >= 0x3B1 && cp <= 0x3C9) return cp - 0x20;
    if (cp >= 0x430 && cp <= 0x44F) return cp - 0x20;
    if (cp >= 0x450 && cp <= 0x45F) return cp - 0x50;
    return cp;
}
static uint32_t tsr__jcp_lower(uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 0x20;
    if (cp == 0x178) return 0xFF;
    if (cp >= 0x100 && cp <= 0x137 && cp != 0x130) return cp | 1u;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return (cp & 1) ? cp + 1 : cp;
    if (cp >= 0x14A && cp <= 0x177) return cp | 1u;
    if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 0x20;
    if (cp >= 0x410 && cp <= 0x42F) return cp + 0x20;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 0x50;
    return cp;
}
static bool tsr__jcp_cased(uint32_t cp) {
    return tsr__jcp_upper(cp) != cp || tsr__jcp_lower(cp) != cp || cp == 0xDF || cp == 0x138 ||
           cp == 0x149;
}

/* One code point from s[*i]; a byte that starts no valid sequence (template source is not
 * checked for UTF-8) gives 0x110000 + the byte: no case, copied as it is. */
static uint32_t tsr__jcp_next(const char *s, size_t n, size_t *i) {
    uint32_t cp;
    int k = tsr_utf8_decode((const unsigned char *)s + *i, n - *i, &cp);
    if (k == 0) {
        cp = 0x110000u + (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

/* mode 0 str.upper, 1 str.lower, 2 str.title, 3 str.capitalize, 4 Jinja's title filter
 * (words begin after '-', whitespace, '(', '{', '[', '<'). */
static tsr__jv tsr__jcase(tsr__jctx *c, tsr__jv s, int mode) {
    /* every mapping keeps or shrinks the UTF-8 length; unmapped bytes are copied */
    char *d = tsr__jra(c, s.u.s.n + 1);
    size_t o = 0;
    bool prev_cased = false, word_start = true;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t at = i;
        uint32_t cp = tsr__jcp_next(s.u.s.p, s.u.s.n, &i), r = cp;
        bool up;
        switch (mode) {
        case 0: up = true; break;
        case 1: up = false; break;
        case 2: up = !prev_cased; break;
        case 3: up = at == 0; break;
        default: up = word_start; break;
        }
        if (mode == 0 && cp == 0xDF) { /* ß.upper() is "SS" */
            d[o++] = 'S';
            d[o++] = 'S';
        } else {
            r = up ? tsr__jcp_upper(cp) : tsr__jcp_lower(cp);
            if (r == cp && cp >= 0x80) {
                memcpy(d + o, s.u.s.p + at, i - at); /* unchanged bytes, valid or not */
                o += i - at;
            } else {
                o += tsr_utf8_encode(r, d + o);
            }
        }
        prev_cased = tsr__jcp_cased(cp);
        word_start = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' ||
                     tsr__jws((char)cp) || (cp == ' ');
        if (cp >= 0x80) word_start = false;
    }
    d[o] = 0;
    return tsr__jv_str(d, o);
}

/* str.islower / str.isupper: every cased character in that case, at least one. */
static bool tsr__jis_case(tsr__jv s, bool lower) {
    bool any = false;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp = tsr__jcp_next(s.u.s.p, s.u.s.n, &i);
        if (!tsr__jcp_cased(cp)) continue;
        any = true;
        if ((lower ? tsr__jcp_lower(cp) : tsr__jcp_upper(cp)) != cp) return false;
    }
    return any;
}

static tsr__jv tsr__jreplace(tsr__jctx *c, const tsr__jnode *at, tsr__jv s, tsr__jv from,
                             tsr__jv to, int64_t count) {
    tsr__jsb b = {.c = c};
    tsr__jsb_put(&b, "", 0);
    if (from.u.s.n == 0) {
        /* Python inserts `to` between every character */
        int64_t k = 0;
        for (size_t i = 0; i <= s.u.s.n; i++) {
            if (count < 0 || k < count) {
                tsr__jsb_put(&b, to.u.s.p, to.u.s.n);
                k++;
            }
            if (i < s.u.s.n) tsr__jsb_ch(&b, s.u.s.p[i]);
        }
        (void)at;
        return tsr__jsb_val(&b);
    }
    int64_t k = 0;
    size_t i = 0;
    while (i < s.u.s.n) {
        if ((count < 0 || k < count) && i + from.u.s.n <= s.u.s.n &&
            !memcmp(s.u.s.p + i, from.u.s.p, from.u.s.n)) {
            tsr__jsb_put(&b, to.u.s.p, to.u.s.n);
            i += from.u.s.n;
            k++;
        } else {
            tsr__jsb_ch(&b, s.u.s.p[i++]);
        }
    }
    return tsr__jsb_val(&b);
}

static tsr__jv tsr__jsplit(tsr__jctx *c, tsr__jv s, tsr__jv *sep, int64_t maxsplit, bool rev) {
    tsr__jv r = tsr__jv_list(c, 4);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (!sep || sep->t == JV_NONE) {
        /* runs of whitespace; no empty strings */
        if (rev) {
            tsr__jv tmp = tsr__jv_list(c, 4);
            size_t e = n;
            int64_t k = 0;
            for (;;) {
                while (e > 0 && tsr__jws(p[e - 1])) e--;
                if (e == 0) break;
                if (maxsplit >= 0 && k >= maxsplit) {
                    tsr__jlist_push(c, tmp.u.l, tsr__jv_str(p, e));
                    break;
                }
                size_t b = e;
                while (b > 0 && !tsr__jws(p[b - 1])) b--;
                tsr__jlist_push(c, tmp.u.l, tsr__jv_str(p + b, e - b));
                k++;
                e = b;
            }
            for (size_t i = tmp.u.l->n; i > 0; i--) tsr__jlist_push(c, r.u.l, tmp.u.l->v[i - 1]);
            return r;
        }
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            while (i < n && tsr__jws(p[i])) i++;
            if (i >= n) break;
            if (maxsplit >= 0 && k >= maxsplit) {
                size_t e = n;
                while (e > i && tsr__jws(p[e - 1])) e--;
                tsr__jlist_push(c, r.u.l, tsr__jv_str(p + i, e - i));
                break;
            }
            size_t b = i;
            while (i < n && !tsr__jws(p[i])) i++;
            tsr__jlist_push(c, r.u.l, tsr__jv_str(p + b, i - b));
            k++;
        }
        return r;
    }
    const char *q = sep->u.s.p;
    size_t m = sep->u.s.n;
    if (rev) {
        tsr__jv tmp = tsr__jv_list(c, 4);
        size_t e = n;
        int64_t k = 0;
        size_t i = n;
        while (i >= m && (maxsplit < 0 || k < maxsplit)) {
            if (!memcmp(p + i - m, q, m)) {
                tsr__jlist_push(c, tmp.u.l, tsr__jv_str(p + i, e - i));
                i -= m;
                e = i;
                k++;
            } else {
                i--;
            }
        }
        tsr__jlist_push(c, tmp.u.l, tsr__jv_str(p, e));
        for (size_t j = tmp.u.l->n; j > 0; j--) tsr__jlist_push(c, r.u.l, tmp.u.l->v[j - 1]);
        return r;
    }
    size_t b = 0, i = 0;
    int64_t k = 0;
    while (i + m <= n && (maxsplit < 0 || k < maxsplit)) {
        if (!memcmp(p + i, q, m)) {
            tsr__jlist_push(c, r.u.l, tsr__jv_str(p + b, i - b));
            i += m;
            b = i;
            k++;
        } else {
            i++;
        }
    }
    tsr__jlist_push(c, r.u.l, tsr__jv_str(p + b, n - b));
    return r;
}

static tsr__jv tsr__jjoin(tsr__jctx *c, tsr__jv list, tsr__jv sep) {
    tsr__jsb b = {.c = c};
    tsr__jsb_put(&b, "", 0);
    for (size_t i = 0; i < list.u.l->n; i++) {
        if (i) tsr__jsb_put(&b, sep.u.s.p, sep.u.s.n);
        tsr__jstr_into(&b, list.u.l->v[i], false);
    }
    return tsr__jsb_val(&b);
}

static int64_t tsr__jfind(tsr__jv s, tsr__jv sub, bool rev) {
    if (sub.u.s.n > s.u.s.n) return -1;
    size_t last = s.u.s.n - sub.u.s.n;
    if (rev) {
        for (size_t i = last + 1; i > 0; i--)
            if (!memcmp(s.u.s.p + i - 1, sub.u.s.p, sub.u.s.n)) return (int64_t)(i - 1);
        return -1;
    }
    for (size_t i = 0; i <= last; i++)
        if (!memcmp(s.u.s.p + i, sub.u.s.p, sub.u.s.n)) return (int64_t)i;
    return -1;
}

static tsr__jv tsr__jitems(tsr__jctx *c, tsr__jv d) {
    tsr__jv r = tsr__jv_list(c, d.u.d->n + 1);
    for (size_t i = 0; i < d.u.d->n; i++) {
        tsr__jv pair = tsr__jv_list(c, 2);
        pair.u.l->tup = true;
        tsr__jlist_push(c, pair.u.l, d.u.d->k[i]);
        tsr__jlist_push(c, pair.u.l, d.u.d->v[i]);
        tsr__jlist_push(c, r.u.l, pair);
    }
    return r;
}

static tsr__jv tsr__jmethod(tsr__jctx *c, const tsr__jnode *nd, tsr__jv o, const char *m,
                            const tsr__jargs *a) {
    tsr__jv x, y;
    if (o.t == JV_STR) {
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            bool has = tsr__jarg(a, 0, NULL, &x) && x.t != JV_NONE;
            return tsr__jstrip(o, has ? &x : NULL, m[0] != 'r', m[0] != 'l');
        }
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            if (!tsr__jarg(a, 0, NULL, &x)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "%s needs an argument", m);
            bool st = m[0] == 's';
            if (x.t == JV_LIST) {
                for (size_t i = 0; i < x.u.l->n; i++)
                    if (x.u.l->v[i].t == JV_STR &&
                        (st ? tsr__jstarts(o, x.u.l->v[i]) : tsr__jends(o, x.u.l->v[i])))
                        return tsr__jv_bool(true);
                return tsr__jv_bool(false);
            }
            if (x.t != JV_STR) tsr__jrfail(c, nd, TSR_ERR_INVALID, "%s needs a string", m);
            return tsr__jv_bool(st ? tsr__jstarts(o, x) : tsr__jends(o, x));
        }
        if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
            bool has = tsr__jarg(a, 0, "sep", &x);
            int64_t ms = -1;
            if (tsr__jarg(a, 1, "maxsplit", &y) && y.t == JV_INT) ms = y.u.i;
            if (has && x.t == JV_STR && x.u.s.n == 0)
                tsr__jrfail(c, nd, TSR_ERR_INVALID, "empty separator");
            if (has && x.t != JV_STR && x.t != JV_NONE)
                tsr__jrfail(c, nd, TSR_ERR_INVALID, "split needs a string separator");
            return tsr__jsplit(c, o, has ? &x : NULL, ms, m[0] == 'r');
        }
        if (!strcmp(m, "replace")) {
            x = tsr__jstr_arg(c, nd, a, 0, NULL);
            y = tsr__jstr_arg(c, nd, a, 1, NULL);
            tsr__jv k;
            int64_t cnt = -1;
            if (tsr__jarg(a, 2, "count", &k) && k.t == JV_INT) cnt = k.u.i;
            return tsr__jreplace(c, nd, o, x, y, cnt);
        }
        if (!strcmp(m, "upper")) return tsr__jcase(c, o, 0);
        if (!strcmp(m, "lower")) return tsr__jcase(c, o, 1);
        if (!strcmp(m, "title")) return tsr__jcase(c, o, 2);
        if (!strcmp(m, "capitalize")) return tsr__jcase(c, o, 3);
        if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index")) {
            x = tsr__jstr_arg(c, nd, a, 0, NULL);
            int64_t r = tsr__jfind(o, x, m[0] == 'r');
            if (r >= 0 && !tsr__jascii(o)) /* byte offsets would differ from code points */
                r = (int64_t)tsr__jutf8_len(o.u.s.p, (size_t)r);
            if (r < 0 && m[0] == 'i') tsr__jrfail(c, nd, TSR_ERR_INVALID, "substring not found");
            return tsr__jv_int(r);
        }
        if (!strcmp(m, "count")) {
            x = tsr__jstr_arg(c, nd, a, 0, NULL);
            if (x.u.s.n == 0) return tsr__jv_int((int64_t)tsr__jutf8_len(o.u.s.p, o.u.s.n) + 1);
            int64_t k = 0;
            for (size_t i = 0; i + x.u.s.n <= o.u.s.n;) {
                if (!memcmp(o.u.s.p + i, x.u.s.p, x.u.s.n)) {
                    k++;
                    i += x.u.s.n;
                } else {
                    i++;
                }
            }
            return tsr__jv_int(k);
        }
        if (!strcmp(m, "join")) {
            if (!tsr__jarg(a, 0, NULL, &x)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "join needs an argument");
            x = tsr__jiter(c, nd, x);
            for (size_t i = 0; i < x.u.l->n; i++)
                if (x.u.l->v[i].t != JV_STR) tsr__jrfail(c, nd, TSR_ERR_INVALID, "join: items must be strings");
            return tsr__jjoin(c, x, o);
        }
        if (!strcmp(m, "splitlines")) {
            tsr__jv r = tsr__jv_list(c, 4);
            size_t b = 0;
            for (size_t i = 0; i < o.u.s.n; i++) {
                if (o.u.s.p[i] == '\n' || o.u.s.p[i] == '\r') {
                    tsr__jlist_push(c, r.u.l, tsr__jv_str(o.u.s.p + b, i - b));
                    if (o.u.s.p[i] == '\r' && i + 1 < o.u.s.n && o.u.s.p[i + 1] == '\n') i++;
                    b = i + 1;
                }
            }
            if (b < o.u.s.n) tsr__jlist_push(c, r.u.l, tsr__jv_str(o.u.s.p + b, o.u.s.n - b));
            return r;
        }
        if (!strcmp(m, "format")) {
            /* str.format: {} {0} {name} and {{ }}; no format specs */
            tsr__jsb b = {.c = c};
            tsr__jsb_put(&b, "", 0);
            int auto_i = 0;
            for (size_t i = 0; i < o.u.s.n; i++) {
                char ch = o.u.s.p[i];
                if ((ch == '{' || ch == '}') && i + 1 < o.u.s.n && o.u.s.p[i + 1] == ch) {
                    tsr__jsb_ch(&b, ch);
                    i++;
                    continue;
                }
                if (ch == '}') tsr__jrfail(c, nd, TSR_ERR_INVALID, "format: single '}'");
                if (ch != '{') {
                    tsr__jsb_ch(&b, ch);
                    continue;
                }
                size_t e = i + 1;
                while (e < o.u.s.n && o.u.s.p[e] != '}') e++;
                if (e >= o.u.s.n) tsr__jrfail(c, nd, TSR_ERR_INVALID, "format: single '{'");
                char field[64];
                size_t fl = e - i - 1;
                if (fl >= sizeof field || memchr(o.u.s.p + i + 1, ':', fl) ||
                    memchr(o.u.s.p + i + 1, '!', fl) || memchr(o.u.s.p + i + 1, '.', fl) ||
                    memchr(o.u.s.p + i + 1, '[', fl))
                    tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "str.format field with a format spec");
                memcpy(field, o.u.s.p + i + 1, fl);
                field[fl] = 0;
                tsr__jv arg;
                bool ok;
                if (fl == 0) ok = tsr__jarg(a, auto_i++, NULL, &arg);
                else if (isdigit((unsigned char)field[0])) ok = tsr__jarg(a, atoi(field), NULL, &arg);
                else ok = tsr__jarg(a, -1, field, &arg);
                if (!ok) tsr__jrfail(c, nd, TSR_ERR_INVALID, "format: no argument for {%s}", field);
                tsr__jstr_into(&b, arg, false);
                i = e;
            }
            return tsr__jsb_val(&b);
        }
        if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
            x = tsr__jstr_arg(c, nd, a, 0, NULL);
            if (m[6] == 'p' && tsr__jstarts(o, x)) return tsr__jv_str(o.u.s.p + x.u.s.n, o.u.s.n - x.u.s.n);
            if (m[6] == 's' && tsr__jends(o, x) && x.u.s.n) return tsr__jv_str(o.u.s.p, o.u.s.n - x.u.s.n);
            return o;
        }
        if (!strcmp(m, "islower") || !strcmp(m, "isupper")) return tsr__jv_bool(tsr__jis_case(o, m[2] == 'l'));
        if (!strncmp(m, "is", 2)) {
            if (o.u.s.n == 0) return tsr__jv_bool(false);
            for (size_t i = 0; i < o.u.s.n; i++) {
                unsigned char ch = (unsigned char)o.u.s.p[i];
                bool ok = !strcmp(m, "isdigit") ? isdigit(ch) : !strcmp(m, "isalpha") ? isalpha(ch)
                        : !strcmp(m, "isspace") ? tsr__jws((char)ch) : !strcmp(m, "isalnum") ? isalnum(ch)
                        : !strcmp(m, "isupper") ? !islower(ch) : !islower(ch) ? !isupper(ch) : true;
                if (ch >= 0x80) tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "%s on a non-ASCII string", m);
                if (!ok) return tsr__jv_bool(false);
            }
            if (!strcmp(m, "isupper") || !strcmp(m, "islower")) {
                bool any = false;
                for (size_t i = 0; i < o.u.s.n; i++) any |= isalpha((unsigned char)o.u.s.p[i]) != 0;
                return tsr__jv_bool(any);
            }
            return tsr__jv_bool(true);
        }
    } else if (o.t == JV_DICT) {
        if (!strcmp(m, "items")) return tsr__jitems(c, o);
        if (!strcmp(m, "keys")) return tsr__jiter(c, nd, o);
        if (!strcmp(m, "values")) {
            tsr__jv r = tsr__jv_list(c, o.u.d->n + 1);
            for (size_t i = 0; i < o.u.d->n; i++) tsr__jlist_push(c, r.u.l, o.u.d->v[i]);
            return r;
        }
        if (!strcmp(m, "get")) {
            if (!tsr__jarg(a, 0, NULL, &x)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "get needs a key");
            tsr__jv *v = tsr__jdict_find(o.u.d, x);
            if (v) return *v;
            return tsr__jarg(a, 1, NULL, &y) ? y : tsr__jv_none();
        }
    } else if (o.t == JV_LIST) {
        if (!strcmp(m, "index")) {
            if (!tsr__jarg(a, 0, NULL, &x)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "index needs a value");
            for (size_t i = 0; i < o.u.l->n; i++)
                if (tsr__jeq(o.u.l->v[i], x)) return tsr__jv_int((int64_t)i);
            tsr__jrfail(c, nd, TSR_ERR_INVALID, "value is not in list");
        }
        if (!strcmp(m, "count")) {
            if (!tsr__jarg(a, 0, NULL, &x)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "count needs a value");
            int64_t k = 0;
            for (size_t i = 0; i < o.u.l->n; i++) k += tsr__jeq(o.u.l->v[i], x);
            return tsr__jv_int(k);
        }
    }
    if (o.t == JV_UNDEF) tsr__jrfail(c, nd, TSR_ERR_INVALID, "'%s' called on an undefined value", m);
    tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "method '%s' on this type", m);
}

static tsr__jv tsr__jcall_macro(tsr__jctx *c, const tsr__jnode *at, const tsr__jnode *m,
                                const tsr__jargs *a);
static bool tsr__jtest(tsr__jctx *c, const tsr__jnode *nd, const char *nm, tsr__jv v,
                       const tsr__jargs *a);

/* attribute / item path "a.b.c" */
static tsr__jv tsr__jattr_path(tsr__jctx *c, const tsr__jnode *at, tsr__jv v, tsr__jv path) {
    if (path.t != JV_STR) return tsr__jgetattr(c, at, v, path);
    const char *p = path.u.s.p, *e = p + path.u.s.n;
    while (p <= e) {
        const char *d = memchr(p, '.', (size_t)(e - p));
        if (!d) d = e;
        tsr__jv key = tsr__jv_str(p, (size_t)(d - p));
        bool digits = d > p;
        for (const char *q = p; q < d; q++) digits &= isdigit((unsigned char)*q) != 0;
        if (v.t == JV_UNDEF) return v;
        if (digits && v.t == JV_LIST) key = tsr__jv_int(strtoll(p, NULL, 10));
        v = tsr__jgetattr(c, at, v, key);
        p = d + 1;
    }
    return v;
}

static tsr__jv tsr__jfilter(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc) {
    tsr__jv v = tsr__jeval(c, nd->a, sc);
    tsr__jargs a;
    tsr__jeval_args(c, nd, sc, &a);
    const char *f = nd->name;
    tsr__jv x, y;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        bool boolean = tsr__jarg(&a, 1, "boolean", &y) && tsr__jtruthy(y);
        if (v.t == JV_UNDEF || (boolean && !tsr__jtruthy(v)))
            return tsr__jarg(&a, 0, "default_value", &x) ? x : tsr__jv_str("", 0);
        return v;
    }
    if (!strcmp(f, "safe")) return v;
    if (!strcmp(f, "wordcount")) {
        tsr__jv s = tsr__jto_str(c, v);
        int64_t k = 0;
        bool in = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char ch = (unsigned char)s.u.s.p[i];
            bool w = isalnum(ch) || ch == '_' || ch >= 0x80; /* \w, non-ASCII as letters */
            if (w && !in) k++;
            in = w;
        }
        return tsr__jv_int(k);
    }
    if (!strcmp(f, "round")) {
        int64_t prec = tsr__jarg(&a, 0, "precision", &x) && x.t == JV_INT ? x.u.i : 0;
        tsr__jv meth = tsr__jv_cstr("common");
        tsr__jarg(&a, 1, "method", &meth);
        if (!tsr__jnum(v)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "round: not a number");
        if (prec < 0 || prec > 15) tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "round with precision %lld", (long long)prec);
        if (tsr__jstr_eq(meth, "common", 6)) {
            if (v.t != JV_FLOAT) return v.t == JV_BOOL ? tsr__jv_int(v.u.b) : v; /* round(int, n) */
            /* Python's round(): correctly rounded, ties to even, as printf rounds */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, v.u.f);
            return tsr__jv_float(strtod(buf, NULL));
        }
        double m = pow(10.0, (double)prec), f0 = tsr__jnumf(v) * m;
        if (tsr__jstr_eq(meth, "floor", 5)) return tsr__jv_float(floor(f0) / m);
        if (tsr__jstr_eq(meth, "ceil", 4)) return tsr__jv_float(ceil(f0) / m);
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "round: method must be common, ceil or floor");
    }
    if (!strcmp(f, "format")) {
        tsr__jv l = tsr__jv_list(c, (size_t)a.n + 1);
        for (int i = 0; i < a.n; i++) {
            if (a.kw[i]) tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "format with keyword arguments");
            tsr__jlist_push(c, l.u.l, a.v[i]);
        }
        return tsr__jprintf(c, nd, tsr__jto_str(c, v), l);
    }
    if (!strcmp(f, "tojson")) {
        tsr__jjson o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
        if (tsr__jarg(&a, 1, "indent", &x) && x.t == JV_INT) {
            o.indent = (int)(x.u.i < 0 ? 0 : x.u.i > 64 ? 64 : x.u.i);
            o.item_sep = ",";
        }
        if (tsr__jarg(&a, 2, "separators", &x) && x.t == JV_LIST && x.u.l->n == 2 &&
            x.u.l->v[0].t == JV_STR && x.u.l->v[1].t == JV_STR) {
            o.item_sep = tsr__jto_str(c, x.u.l->v[0]).u.s.p;
            o.key_sep = tsr__jto_str(c, x.u.l->v[1]).u.s.p;
        }
        if (tsr__jarg(&a, 3, "sort_keys", &x)) o.sort_keys = tsr__jtruthy(x);
        if (tsr__jarg(&a, 0, "ensure_ascii", &x) && tsr__jtruthy(x))
            tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "tojson with ensure_ascii");
        tsr__jsb b = {.c = c};
        tsr__jsb_put(&b, "", 0);
        tsr__jjson_into(c, nd, &b, v, &o, 0);
        return tsr__jsb_val(&b);
    }
    if (!strcmp(f, "string")) return tsr__jto_str(c, v);
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (v.t == JV_STR) return tsr__jv_int((int64_t)tsr__jutf8_len(v.u.s.p, v.u.s.n));
        if (v.t == JV_LIST) return tsr__jv_int((int64_t)v.u.l->n);
        if (v.t == JV_DICT || v.t == JV_NS) return tsr__jv_int((int64_t)v.u.d->n);
        if (v.t == JV_UNDEF) return tsr__jv_int(0);
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "object has no len()");
    }
    if (!strcmp(f, "list")) {
        tsr__jv it = tsr__jiter(c, nd, v);
        tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
        for (size_t i = 0; i < it.u.l->n; i++) tsr__jlist_push(c, r.u.l, it.u.l->v[i]);
        return r;
    }
    if (!strcmp(f, "items")) {
        if (v.t == JV_UNDEF) return tsr__jv_list(c, 1);
        if (v.t != JV_DICT) tsr__jrfail(c, nd, TSR_ERR_INVALID, "items: not a mapping");
        return tsr__jitems(c, v);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        tsr__jv it = tsr__jiter(c, nd, v);
        if (it.u.l->n == 0) return tsr__jv_undef();
        return it.u.l->v[f[0] == 'f' ? 0 : it.u.l->n - 1];
    }
    if (!strcmp(f, "reverse")) {
        tsr__jv it = tsr__jiter(c, nd, v);
        tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
        for (size_t i = it.u.l->n; i > 0; i--) tsr__jlist_push(c, r.u.l, it.u.l->v[i - 1]);
        if (v.t == JV_STR) return tsr__jjoin(c, r, tsr__jv_str("", 0));
        return r;
    }
    if (!strcmp(f, "join")) {
        tsr__jv sep = tsr__jv_str("", 0);
        if (tsr__jarg(&a, 0, "d", &x)) sep = tsr__jto_str(c, x);
        tsr__jv it = tsr__jiter(c, nd, v);
        if (tsr__jarg(&a, 1, "attribute", &y)) {
            tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
            for (size_t i = 0; i < it.u.l->n; i++)
                tsr__jlist_push(c, r.u.l, tsr__jattr_path(c, nd, it.u.l->v[i], y));
            it = r;
        }
        return tsr__jjoin(c, it, sep);
    }
    if (!strcmp(f, "trim")) {
        tsr__jv s = tsr__jto_str(c, v);
        bool has = tsr__jarg(&a, 0, "chars", &x) && x.t == JV_STR;
        return tsr__jstrip(s, has ? &x : NULL, true, true);
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") ||
        !strcmp(f, "title")) {
        tsr__jv s = tsr__jto_str(c, v);
        return tsr__jcase(c, s, f[0] == 'u' ? 0 : f[0] == 'l' ? 1 : f[0] == 't' ? 4 : 3);
    }
    if (!strcmp(f, "replace")) {
        tsr__jv s = tsr__jto_str(c, v);
        x = tsr__jto_str(c, tsr__jarg(&a, 0, "old", &x) ? x : tsr__jv_str("", 0));
        y = tsr__jto_str(c, tsr__jarg(&a, 1, "new", &y) ? y : tsr__jv_str("", 0));
        tsr__jv k;
        int64_t cnt = -1;
        if (tsr__jarg(&a, 2, "count", &k) && k.t == JV_INT) cnt = k.u.i;
        return tsr__jreplace(c, nd, s, x, y, cnt);
    }
    if (!strcmp(f, "int")) {
        int64_t dflt = tsr__jarg(&a, 0, "default", &x) && x.t == JV_INT ? x.u.i : 0;
        if (v.t == JV_INT) return v;
        if (v.t == JV_BOOL) return tsr__jv_int(v.u.b);
        if (v.t == JV_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? tsr__jv_int((int64_t)v.u.f) : tsr__jv_int(dflt);
        if (v.t == JV_STR) {
            char buf[64];
            size_t n = v.u.s.n < 63 ? v.u.s.n : 63;
            memcpy(buf, v.u.s.p, n);
            buf[n] = 0;
            char *end;
            errno = 0;
            long long r = strtoll(buf, &end, 10);
            while (*end && tsr__jws(*end)) end++;
            if (end != buf && !*end && !errno) return tsr__jv_int(r);
            double d = strtod(buf, &end);
            while (*end && tsr__jws(*end)) end++;
            if (end != buf && !*end && isfinite(d) && fabs(d) < 9.2e18) return tsr__jv_int((int64_t)d);
        }
        return tsr__jv_int(dflt);
    }
    if (!strcmp(f, "float")) {
        if (tsr__jnum(v)) return tsr__jv_float(tsr__jnumf(v));
        if (v.t == JV_STR) {
            char buf[64];
            size_t n = v.u.s.n < 63 ? v.u.s.n : 63;
            memcpy(buf, v.u.s.p, n);
            buf[n] = 0;
            char *end;
            double d = strtod(buf, &end);
            if (end != buf && !*end) return tsr__jv_float(d);
        }
        return tsr__jv_float(tsr__jarg(&a, 0, "default", &x) && tsr__jnum(x) ? tsr__jnumf(x) : 0.0);
    }
    if (!strcmp(f, "bool")) return tsr__jv_bool(tsr__jtruthy(v));
    if (!strcmp(f, "abs")) {
        if (v.t == JV_INT) return tsr__jv_int(v.u.i < 0 && v.u.i != INT64_MIN ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT) return tsr__jv_float(fabs(v.u.f));
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "abs: not a number");
    }
    if (!strcmp(f, "indent")) {
        tsr__jv s = tsr__jto_str(c, v);
        tsr__jv w = tsr__jarg(&a, 0, "width", &x) ? x : tsr__jv_int(4);
        bool first = tsr__jarg(&a, 1, "first", &y) && tsr__jtruthy(y);
        tsr__jv bl;
        bool blank = tsr__jarg(&a, 2, "blank", &bl) && tsr__jtruthy(bl);
        tsr__jv pad = w.t == JV_STR ? w : tsr__jv_str("", 0);
        if (w.t == JV_INT) {
            int64_t k = w.u.i < 0 ? 0 : w.u.i > 256 ? 256 : w.u.i;
            char *sp = tsr__jra(c, (size_t)k + 1);
            memset(sp, ' ', (size_t)k);
            pad = tsr__jv_str(sp, (size_t)k);
        }
        /* Jinja: lines split with splitlines(); blank lines get no indent unless blank */
        tsr__jsb b = {.c = c};
        tsr__jsb_put(&b, "", 0);
        const char *p = s.u.s.p;
        size_t n = s.u.s.n, i = 0;
        bool firstline = true;
        while (i < n) {
            size_t e = i;
            while (e < n && p[e] != '\n') e++;
            bool empty = e == i;
            if ((firstline ? first : true) && (blank || !empty))
                tsr__jsb_put(&b, pad.u.s.p, pad.u.s.n);
            tsr__jsb_put(&b, p + i, e - i);
            if (e < n) tsr__jsb_ch(&b, '\n');
            firstline = false;
            i = e + 1;
        }
        return tsr__jsb_val(&b);
    }
    if (!strcmp(f, "map")) {
        tsr__jv it = tsr__jtruthy(v) ? tsr__jiter(c, nd, v) : tsr__jv_list(c, 1);
        tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
        if (tsr__jarg(&a, -1, "attribute", &x)) {
            bool hasd = tsr__jarg(&a, -1, "default", &y);
            for (size_t i = 0; i < it.u.l->n; i++) {
                tsr__jv e = tsr__jattr_path(c, nd, it.u.l->v[i], x);
                if (e.t == JV_UNDEF && hasd) e = y;
                tsr__jlist_push(c, r.u.l, e);
            }
            return r;
        }
        if (!tsr__jarg(&a, 0, NULL, &x) || x.t != JV_STR)
            tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "map without attribute= or a filter name");
        static const char *const mapf[] = {"string", "trim", "upper", "lower", "length", "int",
                                           "tojson", "first", "last", "list", NULL};
        char fname[32];
        snprintf(fname, sizeof fname, "%.*s", (int)(x.u.s.n < 31 ? x.u.s.n : 31), x.u.s.p);
        if (!tsr__jin_set(mapf, fname))
            tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "map with filter '%s'", fname);
        /* a synthetic filter node on a constant */
        for (size_t i = 0; i < it.u.l->n; i++) {
            tsr__jnode cn = {.k = JN_CONST, .line = nd->line, .col = nd->col, .cval = it.u.l->v[i]};
            const char *nm = NULL;
            for (int k = 0; mapf[k]; k++)
                if (!strcmp(mapf[k], fname)) nm = mapf[k];
            tsr__jnode fn = {.k = JN_FILTER, .line = nd->line, .col = nd->col, .name = nm, .a = &cn};
            tsr__jlist_push(c, r.u.l, tsr__jfilter(c, &fn, sc));
        }
        return r;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr") || !strcmp(f, "select") ||
        !strcmp(f, "reject")) {
        bool attr = !strcmp(f, "selectattr") || !strcmp(f, "rejectattr");
        bool keep_true = f[0] == 's';
        tsr__jv it = tsr__jtruthy(v) ? tsr__jiter(c, nd, v) : tsr__jv_list(c, 1);
        tsr__jv path = tsr__jv_undef();
        int ai = 0;
        if (attr) {
            if (!tsr__jarg(&a, 0, NULL, &path)) tsr__jrfail(c, nd, TSR_ERR_INVALID, "%s needs an attribute", f);
            ai = 1;
        }
        tsr__jv tn;
        bool has_test = tsr__jarg(&a, ai, NULL, &tn);
        char tname[32] = "";
        if (has_test) {
            if (tn.t != JV_STR) tsr__jrfail(c, nd, TSR_ERR_INVALID, "%s: test name must be a string", f);
            snprintf(tname, sizeof tname, "%.*s", (int)(tn.u.s.n < 31 ? tn.u.s.n : 31), tn.u.s.p);
            if (!tsr__jin_set(tsr__jtests, tname))
                tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "unsupported test '%s'", tname);
        }
        tsr__jargs ta = {.n = 0};
        int k = 0;
        for (int i = 0; i < a.n; i++)
            if (!a.kw[i] && k++ > ai) {
                ta.v[ta.n] = a.v[i];
                ta.kw[ta.n++] = NULL;
            }
        tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
        for (size_t i = 0; i < it.u.l->n; i++) {
            tsr__jv e = attr ? tsr__jattr_path(c, nd, it.u.l->v[i], path) : it.u.l->v[i];
            bool ok = has_test ? tsr__jtest(c, nd, tname, e, &ta) : tsr__jtruthy(e);
            if (ok == keep_true) tsr__jlist_push(c, r.u.l, it.u.l->v[i]);
        }
        return r;
    }
    if (!strcmp(f, "unique")) {
        tsr__jv it = tsr__jiter(c, nd, v);
        tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
        for (size_t i = 0; i < it.u.l->n; i++)
            if (!tsr__jcontains(c, nd, r, it.u.l->v[i])) tsr__jlist_push(c, r.u.l, it.u.l->v[i]);
        return r;
    }
    if (!strcmp(f, "sort") || !strcmp(f, "min") || !strcmp(f, "max") || !strcmp(f, "sum") ||
        !strcmp(f, "dictsort")) {
        if (!strcmp(f, "sum")) {
            tsr__jv it = tsr__jiter(c, nd, v), s = tsr__jv_int(0);
            for (size_t i = 0; i < it.u.l->n; i++) s = tsr__jbinop(c, nd, JO_ADD, s, it.u.l->v[i]);
            return s;
        }
        /* Jinja sorts case-insensitively unless case_sensitive=true */
        bool cs = tsr__jarg(&a, -1, "case_sensitive", &x) && tsr__jtruthy(x);
        bool rev = tsr__jarg(&a, -1, "reverse", &y) && tsr__jtruthy(y);
        tsr__jv by;
        bool by_value = tsr__jarg(&a, -1, "by", &by) && tsr__jstr_eq(by, "value", 5);
        tsr__jv attr_path = tsr__jv_undef();
        tsr__jarg(&a, -1, "attribute", &attr_path);
        for (int i = 0; i < a.n; i++)
            if (!a.kw[i] || (strcmp(a.kw[i], "case_sensitive") && strcmp(a.kw[i], "reverse") &&
                             strcmp(a.kw[i], "by") && strcmp(a.kw[i], "attribute")))
                tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "filter '%s' with these arguments", f);
        bool ds = !strcmp(f, "dictsort");
        if (ds && v.t != JV_DICT) tsr__jrfail(c, nd, TSR_ERR_INVALID, "dictsort: not a mapping");
        tsr__jv it = ds ? tsr__jitems(c, v) : tsr__jiter(c, nd, v);
        tsr__jv r = tsr__jv_list(c, it.u.l->n + 1);
        tsr__jv *keys = tsr__jra(c, (it.u.l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < it.u.l->n; i++) {
            tsr__jv e = it.u.l->v[i];
            tsr__jv k = ds ? e.u.l->v[by_value ? 1 : 0]
                       : attr_path.t != JV_UNDEF ? tsr__jattr_path(c, nd, e, attr_path) : e;
            if (!cs && k.t == JV_STR) k = tsr__jcase(c, k, 1);
            size_t j = r.u.l->n;
            tsr__jlist_push(c, r.u.l, e);
            keys[j] = k;
            /* stable insertion (Python's sort is stable; reverse keeps equal items' order) */
            while (j > 0) {
                int cmp = tsr__jcmp(c, nd, keys[j - 1], keys[j]);
                if (!(rev ? cmp < 0 : cmp > 0)) break;
                tsr__jv t = r.u.l->v[j], tk = keys[j];
                r.u.l->v[j] = r.u.l->v[j - 1];
                keys[j] = keys[j - 1];
                r.u.l->v[j - 1] = t;
                keys[j - 1] = tk;
                j--;
            }
        }
        if (ds) return r;
        if (f[0] == 's') return r;
        if (r.u.l->n == 0) return tsr__jv_undef();
        return r.u.l->v[f[1] == 'i' ? 0 : r.u.l->n - 1];
    }
    tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "unsupported filter '%s'", f);
}

static bool tsr__jtest(tsr__jctx *c, const tsr__jnode *nd, const char *t, tsr__jv v,
                       const tsr__jargs *a) {
    tsr__jv x;
    bool has = tsr__jarg(a, 0, NULL, &x);
    if (!strcmp(t, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(t, "none")) return v.t == JV_NONE;
    if (!strcmp(t, "string")) return v.t == JV_STR;
    if (!strcmp(t, "mapping")) return v.t == JV_DICT;
    if (!strcmp(t, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    if (!strcmp(t, "sequence")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    if (!strcmp(t, "number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (!strcmp(t, "integer")) return v.t == JV_INT;
    if (!strcmp(t, "float")) return v.t == JV_FLOAT;
    if (!strcmp(t, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(t, "true")) return v.t == JV_BOOL && v.u.b;
    if (!strcmp(t, "false")) return v.t == JV_BOOL && !v.u.b;
    if (!strcmp(t, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC;
    if (!strcmp(t, "lower") || !strcmp(t, "upper"))
        return tsr__jis_case(tsr__jto_str(c, v), t[0] == 'l');
    if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        if (v.t != JV_INT) tsr__jrfail(c, nd, TSR_ERR_INVALID, "test '%s' needs an integer", t);
        return t[0] == 'o' ? (v.u.i & 1) != 0 : (v.u.i & 1) == 0;
    }
    if (!has) tsr__jrfail(c, nd, TSR_ERR_INVALID, "test '%s' needs an argument", t);
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==")) return tsr__jeq(v, x);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !tsr__jeq(v, x);
    if (!strcmp(t, "sameas")) {
        if (v.t != x.t) return false;
        if (v.t == JV_NONE || v.t == JV_UNDEF) return true;
        if (v.t == JV_BOOL) return v.u.b == x.u.b;
        return tsr__jeq(v, x) && (v.t == JV_INT ? v.u.i >= -5 && v.u.i <= 256 : false);
    }
    if (!strcmp(t, "in")) return tsr__jcontains(c, nd, x, v);
    if (!strcmp(t, "gt") || !strcmp(t, ">") || !strcmp(t, "greaterthan")) return tsr__jcmp(c, nd, v, x) > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return tsr__jcmp(c, nd, v, x) >= 0;
    if (!strcmp(t, "lt") || !strcmp(t, "<") || !strcmp(t, "lessthan")) return tsr__jcmp(c, nd, v, x) < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return tsr__jcmp(c, nd, v, x) <= 0;
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v.t != JV_INT) tsr__jrfail(c, nd, TSR_ERR_INVALID, "test '%s' needs an integer", t);
        if (t[0] == 'o') return (v.u.i & 1) != 0;
        if (t[0] == 'e') return (v.u.i & 1) == 0;
        if (x.t != JV_INT || x.u.i == 0) tsr__jrfail(c, nd, TSR_ERR_INVALID, "divisibleby needs a nonzero integer");
        return x.u.i == -1 || v.u.i % x.u.i == 0;
    }
    tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "unsupported test '%s'", t);
}

static tsr__jv tsr__jcall(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc) {
    tsr__jargs a;
    if (nd->a->k == JN_ATTR) {
        tsr__jv o = tsr__jeval(c, nd->a->a, sc);
        tsr__jeval_args(c, nd, sc, &a);
        if (o.t == JV_NS || (o.t == JV_DICT && tsr__jdict_findc(o.u.d, nd->a->name) &&
                             !tsr__jin_set(tsr__jmethods, nd->a->name))) {
            tsr__jv f = tsr__jgetattr(c, nd, o, tsr__jv_cstr(nd->a->name));
            if (f.t == JV_MACRO) return tsr__jcall_macro(c, nd, f.u.m, &a);
        }
        return tsr__jmethod(c, nd, o, nd->a->name, &a);
    }
    tsr__jv f = tsr__jeval(c, nd->a, sc);
    tsr__jeval_args(c, nd, sc, &a);
    if (f.t == JV_MACRO) return tsr__jcall_macro(c, nd, f.u.m, &a);
    if (f.t != JV_FUNC) {
        if (nd->a->k == JN_NAME)
            tsr__jrfail(c, nd, f.t == JV_UNDEF ? TSR_ERR_UNSUPPORTED : TSR_ERR_INVALID,
                        "'%s' is %s", nd->a->name,
                        f.t == JV_UNDEF ? "not a known function" : "not callable");
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "value is not callable");
    }
    tsr__jv x, y, z;
    switch (f.u.fn) {
    case JF_RAISE: {
        tsr__jv m = tsr__jarg(&a, 0, NULL, &x) ? tsr__jto_str(c, x) : tsr__jv_str("", 0);
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "raise_exception: %.*s",
                    (int)(m.u.s.n > 300 ? 300 : m.u.s.n), m.u.s.p);
    }
    case JF_STRFTIME: {
        tsr__jv fmt = tsr__jstr_arg(c, nd, &a, 0, NULL);
        time_t t = c->now >= 0 ? (time_t)c->now : time(NULL);
        struct tm tmv;
        if (c->now >= 0) gmtime_r(&t, &tmv);
        else localtime_r(&t, &tmv);
        char fbuf[256], obuf[512];
        if (fmt.u.s.n >= sizeof fbuf) tsr__jrfail(c, nd, TSR_ERR_INVALID, "strftime format too long");
        memcpy(fbuf, fmt.u.s.p, fmt.u.s.n);
        fbuf[fmt.u.s.n] = 0;
        size_t n = strftime(obuf, sizeof obuf, fbuf, &tmv);
        char *d = tsr__jra(c, n + 1);
        memcpy(d, obuf, n);
        d[n] = 0;
        return tsr__jv_str(d, n);
    }
    case JF_RANGE: {
        int64_t start = 0, stop = 0, step = 1;
        int np = 0;
        for (int i = 0; i < a.n; i++) {
            if (a.kw[i] || a.v[i].t != JV_INT) tsr__jrfail(c, nd, TSR_ERR_INVALID, "range takes integers");
            np++;
        }
        if (np == 1) stop = a.v[0].u.i;
        else if (np >= 2) {
            start = a.v[0].u.i;
            stop = a.v[1].u.i;
            if (np >= 3) step = a.v[2].u.i;
        } else tsr__jrfail(c, nd, TSR_ERR_INVALID, "range needs arguments");
        if (step == 0) tsr__jrfail(c, nd, TSR_ERR_INVALID, "range step cannot be zero");
        tsr__jv r = tsr__jv_list(c, 8);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            tsr__jstep(c, nd);
            if (r.u.l->n >= 1000000)
                tsr__jrfail(c, nd, TSR_ERR_BUDGET, "range longer than 1000000 items");
            tsr__jlist_push(c, r.u.l, tsr__jv_int(i));
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        return r;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        tsr__jv d = tsr__jv_dict(c);
        if (f.u.fn == JF_NAMESPACE) d.t = JV_NS;
        for (int i = 0; i < a.n; i++) {
            if (!a.kw[i]) {
                if (a.v[i].t == JV_DICT) {
                    for (size_t k = 0; k < a.v[i].u.d->n; k++)
                        tsr__jdict_set(c, d.u.d, a.v[i].u.d->k[k], a.v[i].u.d->v[k]);
                    continue;
                }
                tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "positional argument to namespace()/dict()");
            }
            tsr__jdict_set(c, d.u.d, tsr__jv_cstr(a.kw[i]), a.v[i]);
        }
        (void)y;
        (void)z;
        return d;
    }
    default: break;
    }
    tsr__jrfail(c, nd, TSR_ERR_INVALID, "bad function");
}

static void tsr__jexec(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc, tsr__jsb *out,
                       int *ctl);

static tsr__jv tsr__jcall_macro(tsr__jctx *c, const tsr__jnode *at, const tsr__jnode *m,
                                const tsr__jargs *a) {
    if (++c->calls > TSR__J_MAX_CALLS)
        tsr__jrfail(c, at, TSR_ERR_BUDGET, "macro calls nested deeper than %d", TSR__J_MAX_CALLS);
    tsr__jscope *sc = tsr__jra(c, sizeof *sc);
    memset(sc, 0, sizeof *sc);
    sc->parent = c->globals;
    int pos = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            int k = 0;
            while (k < m->nargs && strcmp(m->kw[k], a->kw[i])) k++;
            if (k == m->nargs)
                tsr__jrfail(c, at, TSR_ERR_UNSUPPORTED, "macro '%s' has no parameter '%s'", m->name, a->kw[i]);
            tsr__jsetvar(c, sc, m->kw[k], a->v[i]);
        } else {
            if (pos >= m->nargs)
                tsr__jrfail(c, at, TSR_ERR_UNSUPPORTED, "macro '%s' called with extra arguments (varargs)", m->name);
            tsr__jsetvar(c, sc, m->kw[pos++], a->v[i]);
        }
    }
    for (int k = 0; k < m->nargs; k++) {
        if (!tsr__jdict_findc(&sc->vars, m->kw[k]))
            tsr__jsetvar(c, sc, m->kw[k], m->args[k] ? tsr__jeval(c, m->args[k], c->globals) : tsr__jv_undef());
    }
    tsr__jsb b = {.c = c};
    tsr__jsb_put(&b, "", 0);
    int ctl = 0;
    tsr__jexec(c, m->b, sc, &b, &ctl);
    c->calls--;
    return tsr__jsb_val(&b);
}

static tsr__jv tsr__jeval(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc) {
    tsr__jstep(c, nd);
    switch (nd->k) {
    case JN_CONST: return nd->cval;
    case JN_NAME: return tsr__jlookup(sc, nd->name);
    case JN_LIST: {
        tsr__jv r = tsr__jv_list(c, (size_t)nd->nargs + 1);
        r.u.l->tup = nd->op == 1;
        for (int i = 0; i < nd->nargs; i++) tsr__jlist_push(c, r.u.l, tsr__jeval(c, nd->args[i], sc));
        return r;
    }
    case JN_DICT: {
        tsr__jv r = tsr__jv_dict(c);
        for (int i = 0; i + 1 < nd->nargs; i += 2) {
            tsr__jv k = tsr__jeval(c, nd->args[i], sc);
            if (k.t == JV_LIST || k.t == JV_DICT)
                tsr__jrfail(c, nd, TSR_ERR_INVALID, "unhashable dict key");
            tsr__jdict_set(c, r.u.d, k, tsr__jeval(c, nd->args[i + 1], sc));
        }
        return r;
    }
    case JN_ATTR: {
        tsr__jv o = tsr__jeval(c, nd->a, sc);
        if (o.t == JV_DICT && (!strcmp(nd->name, "items") || !strcmp(nd->name, "keys") ||
                               !strcmp(nd->name, "values") || !strcmp(nd->name, "get")))
            tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "method '%s' used as a value", nd->name);
        if (o.t == JV_STR || o.t == JV_LIST) return tsr__jv_undef(); /* no such attribute */
        return tsr__jgetattr(c, nd, o, tsr__jv_cstr(nd->name));
    }
    case JN_ITEM: {
        tsr__jv o = tsr__jeval(c, nd->a, sc);
        tsr__jv k = tsr__jeval(c, nd->b, sc);
        return tsr__jgetattr(c, nd, o, k);
    }
    case JN_SLICE: return tsr__jslice(c, nd, sc);
    case JN_CALL: return tsr__jcall(c, nd, sc);
    case JN_FILTER: return tsr__jfilter(c, nd, sc);
    case JN_TEST: {
        tsr__jv v = tsr__jeval(c, nd->a, sc);
        tsr__jargs a;
        tsr__jeval_args(c, nd, sc, &a);
        bool r = tsr__jtest(c, nd, nd->name, v, &a);
        return tsr__jv_bool(nd->op ? !r : r);
    }
    case JN_NOT: return tsr__jv_bool(!tsr__jtruthy(tsr__jeval(c, nd->a, sc)));
    case JN_NEG:
    case JN_POS: {
        tsr__jv v = tsr__jeval(c, nd->a, sc);
        if (v.t == JV_INT && nd->k == JN_NEG) {
            if (v.u.i == INT64_MIN) tsr__jrfail(c, nd, TSR_ERR_UNSUPPORTED, "integer beyond 64 bits");
            return tsr__jv_int(-v.u.i);
        }
        if (v.t == JV_FLOAT) return tsr__jv_float(nd->k == JN_NEG ? -v.u.f : v.u.f);
        if (v.t == JV_BOOL) return tsr__jv_int(nd->k == JN_NEG ? -(int64_t)v.u.b : v.u.b);
        if (v.t == JV_INT) return v;
        tsr__jrfail(c, nd, TSR_ERR_INVALID, "bad operand type for unary -/+");
    }
    case JN_BIN: {
        tsr__jv a = tsr__jeval(c, nd->a, sc);
        tsr__jv b = tsr__jeval(c, nd->b, sc);
        if ((a.t == JV_UNDEF || b.t == JV_UNDEF) && nd->op != JO_CAT && nd->op != JO_EQ &&
            nd->op != JO_NE && nd->op != JO_IN && nd->op != JO_NOTIN)
            tsr__jrfail(c, nd, TSR_ERR_INVALID, "operation on an undefined value");
        return tsr__jbinop(c, nd, (tsr__jop)nd->op, a, b);
    }
    case JN_AND: {
        tsr__jv a = tsr__jeval(c, nd->a, sc);
        return tsr__jtruthy(a) ? tsr__jeval(c, nd->b, sc) : a;
    }
    case JN_OR: {
        tsr__jv a = tsr__jeval(c, nd->a, sc);
        return tsr__jtruthy(a) ? a : tsr__jeval(c, nd->b, sc);
    }
    case JN_COND:
        if (tsr__jtruthy(tsr__jeval(c, nd->a, sc))) return tsr__jeval(c, nd->b, sc);
        return nd->c ? tsr__jeval(c, nd->c, sc) : tsr__jv_undef();
    default: break;
    }
    tsr__jrfail(c, nd, TSR_ERR_INVALID, "not an expression");
}

static void tsr__jemit(tsr__jctx *c, const tsr__jnode *at, tsr__jsb *out, const char *s, size_t n) {
    if (out->n + n > c->max_out)
        tsr__jrfail(c, at, TSR_ERR_BUDGET, "output beyond %zu bytes", c->max_out);
    tsr__jsb_put(out, s, n);
}

/* ctl: 0 normal, 1 break, 2 continue */
static void tsr__jexec(tsr__jctx *c, const tsr__jnode *nd, tsr__jscope *sc, tsr__jsb *out,
                       int *ctl) {
    tsr__jstep(c, nd);
    switch (nd->k) {
    case JN_BODY:
        for (int i = 0; i < nd->nargs && !*ctl; i++) tsr__jexec(c, nd->args[i], sc, out, ctl);
        return;
    case JN_TEXT: tsr__jemit(c, nd, out, nd->cval.u.s.p, nd->cval.u.s.n); return;
    case JN_OUT: {
        tsr__jv v = tsr__jeval(c, nd->a, sc);
        if (v.t == JV_STR) {
            tsr__jemit(c, nd, out, v.u.s.p, v.u.s.n);
        } else {
            tsr__jv s = tsr__jto_str(c, v);
            tsr__jemit(c, nd, out, s.u.s.p, s.u.s.n);
        }
        return;
    }
    case JN_IF:
        for (const tsr__jnode *b = nd; b;) {
            if (b->k != JN_IF) {
                tsr__jexec(c, b, sc, out, ctl);
                return;
            }
            if (tsr__jtruthy(tsr__jeval(c, b->a, sc))) {
                tsr__jexec(c, b->b, sc, out, ctl);
                return;
            }
            b = b->c;
        }
        return;
    case JN_FOR: {
        tsr__jv seq = tsr__jeval(c, nd->a, sc);
        if (seq.t == JV_NONE) tsr__jrfail(c, nd, TSR_ERR_INVALID, "'NoneType' object is not iterable");
        seq = tsr__jiter(c, nd, seq);
        tsr__jscope *ls = tsr__jra(c, sizeof *ls);
        memset(ls, 0, sizeof *ls);
        ls->parent = sc;
        /* the loop filter runs before loop.* is known: filter first */
        tsr__jv items = seq;
        if (nd->d) {
            items = tsr__jv_list(c, seq.u.l->n + 1);
            for (size_t i = 0; i < seq.u.l->n; i++) {
                tsr__jscope fs = {.parent = sc};
                tsr__jv e = seq.u.l->v[i];
                if (nd->name2) {
                    if (e.t != JV_LIST || e.u.l->n != 2)
                        tsr__jrfail(c, nd, TSR_ERR_INVALID, "cannot unpack into two targets");
                    tsr__jsetvar(c, &fs, nd->name, e.u.l->v[0]);
                    tsr__jsetvar(c, &fs, nd->name2, e.u.l->v[1]);
                } else {
                    tsr__jsetvar(c, &fs, nd->name, e);
                }
                if (tsr__jtruthy(tsr__jeval(c, nd->d, &fs))) tsr__jlist_push(c, items.u.l, e);
            }
        }
        size_t n = items.u.l->n;
        if (n == 0) {
            if (nd->c) tsr__jexec(c, nd->c, sc, out, ctl);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            tsr__jstep(c, nd);
            ls->vars.n = 0; /* fresh scope per iteration */
            tsr__jv e = items.u.l->v[i];
            if (nd->name2) {
                if (e.t != JV_LIST || e.u.l->n != 2)
                    tsr__jrfail(c, nd, TSR_ERR_INVALID, "cannot unpack into two targets");
                tsr__jsetvar(c, ls, nd->name, e.u.l->v[0]);
                tsr__jsetvar(c, ls, nd->name2, e.u.l->v[1]);
            } else {
                tsr__jsetvar(c, ls, nd->name, e);
            }
            tsr__jv loop = tsr__jv_dict(c);
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("index"), tsr__jv_int((int64_t)i + 1));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("index0"), tsr__jv_int((int64_t)i));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("revindex"), tsr__jv_int((int64_t)(n - i)));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("revindex0"), tsr__jv_int((int64_t)(n - i - 1)));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("first"), tsr__jv_bool(i == 0));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("last"), tsr__jv_bool(i + 1 == n));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("length"), tsr__jv_int((int64_t)n));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("depth"), tsr__jv_int(1));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("depth0"), tsr__jv_int(0));
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("previtem"), i ? items.u.l->v[i - 1] : tsr__jv_undef());
            tsr__jdict_set(c, loop.u.d, tsr__jv_cstr("nextitem"), i + 1 < n ? items.u.l->v[i + 1] : tsr__jv_undef());
            tsr__jsetvar(c, ls, "loop", loop);
            int lctl = 0;
            tsr__jexec(c, nd->b, ls, out, &lctl);
            if (lctl == 1) break;
        }
        return;
    }
    case JN_SET: {
        tsr__jv v = tsr__jeval(c, nd->a, sc);
        if (!nd->kw) {
            tsr__jsetvar(c, sc, nd->name, v);
            return;
        }
        if (v.t == JV_STR || v.t == JV_DICT) v = tsr__jiter(c, nd, v);
        if (v.t != JV_LIST || v.u.l->n != (size_t)nd->nargs)
            tsr__jrfail(c, nd, TSR_ERR_INVALID, "cannot unpack into %d names", nd->nargs);
        for (int i = 0; i < nd->nargs; i++) tsr__jsetvar(c, sc, nd->kw[i], v.u.l->v[i]);
        return;
    }
    case JN_SETATTR: {
        tsr__jv ns = tsr__jlookup(sc, nd->name);
        if (ns.t != JV_NS)
            tsr__jrfail(c, nd, TSR_ERR_INVALID, "cannot assign attribute on non-namespace object");
        tsr__jdict_set(c, ns.u.d, tsr__jv_cstr(nd->name2), tsr__jeval(c, nd->a, sc));
        return;
    }
    case JN_SETBLOCK: {
        tsr__jsb b = {.c = c};
        tsr__jsb_put(&b, "", 0);
        int lctl = 0;
        tsr__jexec(c, nd->b, sc, &b, &lctl);
        tsr__jsetvar(c, sc, nd->name, tsr__jsb_val(&b));
        return;
    }
    case JN_MACRO:
        tsr__jsetvar(c, sc, nd->name, (tsr__jv){.t = JV_MACRO, .u.m = nd});
        return;
    case JN_FILTERBLOCK: {
        tsr__jsb b = {.c = c};
        tsr__jsb_put(&b, "", 0);
        tsr__jexec(c, nd->b, sc, &b, ctl);
        tsr__jscope fs = {.parent = sc};
        tsr__jsetvar(c, &fs, "\x01body", tsr__jsb_val(&b));
        tsr__jv r = tsr__jto_str(c, tsr__jeval(c, nd->a, &fs));
        tsr__jemit(c, nd, out, r.u.s.p, r.u.s.n);
        return;
    }
    case JN_BREAK: *ctl = 1; return;
    case JN_CONTINUE: *ctl = 2; return;
    default: break;
    }
    tsr__jrfail(c, nd, TSR_ERR_INVALID, "not a statement");
}

tsr_status tsr_jinja_render(const tsr_jinja *t, const cJSON *context,
                            const tsr_jinja_opts *opts, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    tsr__jctx *c = tsr_calloc(1, sizeof *c);
    if (!c) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", t->what);
    c->what = t->what;
    c->max_out = opts && opts->max_output ? opts->max_output : (16u << 20);
    c->ar.limit = opts && opts->max_memory ? opts->max_memory : (256u << 20);
    c->now = opts ? opts->now : -1;
    if (setjmp(c->err.jb)) {
        tsr_status code = c->err.code;
        size_t wl = strlen(c->what);
        if (!strncmp(c->err.msg, c->what, wl) && c->err.msg[wl] == ':')
            tsr_error_set(code, "%s", c->err.msg);
        else
            tsr_error_set(code, "%s: %s", c->what, c->err.msg);
        tsr__jarena_free(&c->ar);
        tsr_free(c);
        return code;
    }
    tsr__jscope *g = tsr__jra(c, sizeof *g);
    memset(g, 0, sizeof *g);
    c->globals = g;
    tsr__jsetvar(c, g, "range", (tsr__jv){.t = JV_FUNC, .u.fn = JF_RANGE});
    tsr__jsetvar(c, g, "namespace", (tsr__jv){.t = JV_FUNC, .u.fn = JF_NAMESPACE});
    tsr__jsetvar(c, g, "dict", (tsr__jv){.t = JV_FUNC, .u.fn = JF_DICT});
    tsr__jsetvar(c, g, "raise_exception", (tsr__jv){.t = JV_FUNC, .u.fn = JF_RAISE});
    tsr__jsetvar(c, g, "strftime_now", (tsr__jv){.t = JV_FUNC, .u.fn = JF_STRFTIME});
    if (context) {
        if (!cJSON_IsObject(context))
            tsr__jrfail(c, NULL, TSR_ERR_INVALID, "the context is not a JSON object");
        const cJSON *it;
        cJSON_ArrayForEach(it, context) {
            if (it->string) tsr__jsetvar(c, g, it->string, tsr__jfrom_json(c, it, 0));
        }
    }
    /* top-level statements share one scope with the globals (a child, so that a template's
     * `set` shadows a context variable without replacing it) */
    tsr__jscope *top = tsr__jra(c, sizeof *top);
    memset(top, 0, sizeof *top);
    top->parent = g;
    c->globals = top;
    tsr__jsb b = {.c = c};
    tsr__jsb_put(&b, "", 0);
    int ctl = 0;
    tsr__jexec(c, t->root, top, &b, &ctl);
    char *r = tsr_malloc(b.n + 1);
    if (!r) tsr__jrfail(c, NULL, TSR_ERR_NOMEM, "out of memory");
    memcpy(r, b.p, b.n + 1);
    *out = r;
    if (len) *len = b.n;
    tsr__jarena_free(&c->ar);
    tsr_free(c);
    return TSR_OK;
}
