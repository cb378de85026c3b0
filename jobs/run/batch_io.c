/* OpenAI batch JSONL parsing/emitting with cJSON, and the resume scan (see batch_io.h). */
#include "jobs/run/batch_io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "runtime/text/harmony.h"

/* ---- string set: open addressing, FNV-1a ------------------------------------------------ */

struct tsr_strset {
    char **slots;
    size_t cap; /* power of two */
    int64_t n;
};

static uint64_t tsr__fnv(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

tsr_status tsr_strset_create(tsr_strset **out) {
    tsr_strset *s = tsr_calloc(1, sizeof *s);
    if (!s) return TSR_ERR_NOMEM;
    s->cap = 64;
    s->slots = tsr_calloc(s->cap, sizeof *s->slots);
    if (!s->slots) {
        tsr_free(s);
        return TSR_ERR_NOMEM;
    }
    *out = s;
    return TSR_OK;
}

void tsr_strset_destroy(tsr_strset *s) {
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++) tsr_free(s->slots[i]);
    tsr_free(s->slots);
    tsr_free(s);
}

static size_t tsr__find(char *const *slots, size_t cap, const char *key) {
    size_t i = (size_t)tsr__fnv(key) & (cap - 1);
    while (slots[i] && strcmp(slots[i], key) != 0) i = (i + 1) & (cap - 1);
    return i;
}

bool tsr_strset_has(const tsr_strset *s, const char *key) {
    return s->slots[tsr__find(s->slots, s->cap, key)] != NULL;
}

int64_t tsr_strset_count(const tsr_strset *s) { return s->n; }

tsr_status tsr_strset_add(tsr_strset *s, const char *key, bool *added) {
    if (added) *added = false;
    size_t i = tsr__find(s->slots, s->cap, key);
    if (s->slots[i]) return TSR_OK;
    if ((size_t)(s->n + 1) * 2 > s->cap) { /* keep the load under 1/2 */
        size_t cap = s->cap * 2;
        char **ns = tsr_calloc(cap, sizeof *ns);
        if (!ns) return TSR_ERR_NOMEM;
        for (size_t j = 0; j < s->cap; j++)
            if (s->slots[j]) ns[tsr__find(ns, cap, s->slots[j])] = s->slots[j];
        tsr_free(s->slots);
        s->slots = ns;
        s->cap = cap;
        i = tsr__find(s->slots, s->cap, key);
    }
    char *copy = tsr_strdup(key);
    if (!copy) return TSR_ERR_NOMEM;
    s->slots[i] = copy;
    s->n++;
    if (added) *added = true;
    return TSR_OK;
}

/* ---- request parsing -------------------------------------------------------------------- */

void tsr_batch_request_free(tsr_batch_request *r) {
    if (!r) return;
    tsr_free(r->custom_id);
    tsr_free(r->prompt);
    for (int i = 0; i < r->n_messages; i++) {
        tsr_free((char *)r->messages[i].role);
        tsr_free((char *)r->messages[i].content);
    }
    tsr_free(r->messages);
    cJSON_Delete(r->chat_ctx);
    tsr_free(r->force_name);
    for (int i = 0; i < r->n_stops; i++) tsr_free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

static tsr_status tsr__bad(tsr_batch_error *e, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tsr_status tsr__bad(tsr_batch_error *e, const char *code, const char *fmt, ...) {
    snprintf(e->code, sizeof e->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return TSR_ERR_INVALID;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts. */
static tsr_status tsr__content(const cJSON *c, char **out) {
    *out = NULL;
    if (cJSON_IsString(c)) {
        *out = tsr_strdup(c->valuestring);
        return *out ? TSR_OK : TSR_ERR_NOMEM;
    }
    if (!cJSON_IsArray(c)) return TSR_ERR_INVALID;
    size_t n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx))
            return TSR_ERR_INVALID;
        n += strlen(tx->valuestring);
    }
    char *buf = tsr_malloc(n + 1);
    if (!buf) return TSR_ERR_NOMEM;
    size_t at = 0;
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(buf + at, t, l);
        at += l;
    }
    buf[at] = '\0';
    *out = buf;
    return TSR_OK;
}

/* A chat body's messages into r->messages and, as strings, into cms (the template's context).
 * Roles system, user, assistant and tool; an assistant message may carry tool_calls (then
 * its content may be null). *tooly: a tool message or a tool call needs the context. */
static tsr_status tsr__chat_messages(const cJSON *ms, tsr_batch_request *r, cJSON *cms,
                                     bool *tooly, tsr_batch_error *e) {
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        int i = r->n_messages;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) ||
            (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
             strcmp(role->valuestring, "assistant") && strcmp(role->valuestring, "tool")))
            return tsr__bad(e, TSR_BATCH_E_MESSAGES,
                            "messages[%d]: role must be \"system\", \"user\", \"assistant\" "
                            "or \"tool\"", i);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (calls && cJSON_IsNull(calls)) calls = NULL;
        if (calls) {
            bool ok = !strcmp(role->valuestring, "assistant") && cJSON_IsArray(calls);
            const cJSON *c, *each = ok ? calls : NULL;
            cJSON_ArrayForEach(c, each) {
                const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
                ok = ok && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")) &&
                     (cJSON_IsString(a) || cJSON_IsObject(a));
            }
            if (!ok)
                return tsr__bad(e, TSR_BATCH_E_MESSAGES,
                                "messages[%d]: tool_calls must be an assistant message's array "
                                "of {\"function\": {\"name\": string, \"arguments\": ...}}", i);
        }
        const cJSON *cj = cJSON_GetObjectItemCaseSensitive(m, "content");
        char *content = NULL;
        tsr_status st = TSR_OK;
        if (calls && (!cj || cJSON_IsNull(cj))) /* a call without text */
            st = (content = tsr_strdup("")) ? TSR_OK : TSR_ERR_NOMEM;
        else
            st = tsr__content(cj, &content);
        if (st == TSR_ERR_NOMEM) return st;
        if (st != TSR_OK)
            return tsr__bad(e, TSR_BATCH_E_MESSAGES,
                            "messages[%d]: content must be a string or text parts", i);
        r->messages[i].content = content;
        r->messages[i].role = tsr_strdup(role->valuestring);
        r->n_messages++;
        if (!r->messages[i].role) return TSR_ERR_NOMEM;
        *tooly = *tooly || calls || !strcmp(role->valuestring, "tool");
        cJSON *cm = cJSON_CreateObject();
        if (!cm || !cJSON_AddItemToArray(cms, cm)) {
            cJSON_Delete(cm);
            return TSR_ERR_NOMEM;
        }
        bool ok = cJSON_AddStringToObject(cm, "role", role->valuestring) &&
                  cJSON_AddStringToObject(cm, "content", content);
        static const char *const keep[] = {"name", "tool_call_id", "thinking"};
        for (int k = 0; k < 3 && ok; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(m, keep[k]);
            if (cJSON_IsString(x)) ok = cJSON_AddStringToObject(cm, keep[k], x->valuestring);
        }
        if (ok && calls) ok = cJSON_AddItemToObject(cm, "tool_calls", cJSON_Duplicate(calls, 1));
        if (!ok) return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

/* body.tools (OpenAI function tools) into ctx unless tool_choice is "none"; *need set when
 * they are kept. tool_choice "auto" (the default) leaves the choice to the model; "required"
 * and a named function set r->force_call (and r->force_name), which the caller forces. */
static tsr_status tsr__chat_tools(const cJSON *body, tsr_batch_request *r, cJSON *ctx,
                                  bool *need, tsr_batch_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (tools && cJSON_IsNull(tools)) tools = NULL;
    if (tc && cJSON_IsNull(tc)) tc = NULL;
    bool ok = !tools || cJSON_IsArray(tools);
    const cJSON *t, *each = ok ? tools : NULL;
    cJSON_ArrayForEach(t, each) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        ok = ok && cJSON_IsString(ty) && !strcmp(ty->valuestring, "function") &&
             cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")) &&
             (!pa || cJSON_IsNull(pa) || cJSON_IsObject(pa));
    }
    if (!ok)
        return tsr__bad(e, TSR_BATCH_E_TOOLS,
                        "\"tools\" must be an array of {\"type\": \"function\", \"function\": "
                        "{\"name\": string, \"parameters\": object}}");
    int n_tools = tools ? cJSON_GetArraySize(tools) : 0;
    const char *named = NULL;
    if (cJSON_IsObject(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm) ||
            !nm->valuestring[0])
            return tsr__bad(e, TSR_BATCH_E_TOOLS,
                            "\"tool_choice\" must be \"none\", \"auto\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": string}}");
        named = nm->valuestring;
        bool found = false;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            found = found || !strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring,
                                     named);
        }
        if (!found)
            return tsr__bad(e, TSR_BATCH_E_TOOLS,
                            "\"tool_choice\" names the function \"%.200s\", which is not in "
                            "\"tools\"", named);
    } else if (tc && (!cJSON_IsString(tc) || (strcmp(tc->valuestring, "none") &&
                                             strcmp(tc->valuestring, "auto") &&
                                             strcmp(tc->valuestring, "required")))) {
        return tsr__bad(e, TSR_BATCH_E_TOOLS,
                        "\"tool_choice\" must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": string}}");
    }
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) return TSR_OK;
    bool required = cJSON_IsString(tc) && !strcmp(tc->valuestring, "required");
    if (required && n_tools == 0)
        return tsr__bad(e, TSR_BATCH_E_TOOLS,
                        "\"tool_choice\" \"required\" needs a non-empty \"tools\"");
    if (n_tools == 0) return TSR_OK;
    if (required || named) {
        r->force_call = true;
        if (named && !(r->force_name = tsr_strdup(named))) return TSR_ERR_NOMEM;
    }
    if (!cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(tools, 1))) return TSR_ERR_NOMEM;
    *need = true;
    return TSR_OK;
}

static tsr_status tsr__parse_body(const cJSON *body, tsr_batch_request *r, tsr_batch_error *e) {
    if (r->kind == TSR_BATCH_COMPLETION) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        /* A one-element array of strings is the same prompt (OpenAI accepts both). */
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = cJSON_GetArrayItem(p, 0);
        if (!p || cJSON_IsNull(p))
            return tsr__bad(e, TSR_BATCH_E_PROMPT, "body has no \"prompt\"");
        if (!cJSON_IsString(p))
            return tsr__bad(e, TSR_BATCH_E_PROMPT,
                            "\"prompt\" must be a string (token arrays and several prompts per "
                            "request are not supported)");
        if (!p->valuestring[0]) return tsr__bad(e, TSR_BATCH_E_PROMPT, "\"prompt\" is empty");
        r->prompt = tsr_strdup(p->valuestring);
        if (!r->prompt) return TSR_ERR_NOMEM;
    } else {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0)
            return tsr__bad(e, TSR_BATCH_E_MESSAGES, "body has no \"messages\" array");
        int n = cJSON_GetArraySize(ms);
        r->messages = tsr_calloc((size_t)n, sizeof *r->messages);
        if (!r->messages) return TSR_ERR_NOMEM;
        /* the template's context, kept when tools or tool messages need it */
        cJSON *ctx = cJSON_CreateObject();
        cJSON *cms = ctx ? cJSON_AddArrayToObject(ctx, "messages") : NULL;
        bool need = false;
        tsr_status st = cms ? tsr__chat_messages(ms, r, cms, &need, e) : TSR_ERR_NOMEM;
        if (st == TSR_OK) st = tsr__chat_tools(body, r, ctx, &need, e);
        if (st == TSR_OK && need) {
            r->chat_ctx = ctx;
            ctx = NULL;
        }
        cJSON_Delete(ctx);
        if (st != TSR_OK) return st;
    }

    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if (!v || cJSON_IsNull(v)) v = cJSON_GetObjectItemCaseSensitive(body, "max_completion_tokens");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 ||
            v->valuedouble != floor(v->valuedouble))
            return tsr__bad(e, TSR_BATCH_E_PARAM, "\"max_tokens\" must be an integer >= 0");
        r->max_tokens = (int)v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(body, "temperature");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 100)
            return tsr__bad(e, TSR_BATCH_E_PARAM, "\"temperature\" must be a number >= 0");
        r->temperature = (float)v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(body, "top_p");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
            return tsr__bad(e, TSR_BATCH_E_PARAM, "\"top_p\" must be a number in (0, 1]");
        r->top_p = (float)v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(body, "seed");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
            fabs(v->valuedouble) > 9.2e18)
            return tsr__bad(e, TSR_BATCH_E_PARAM, "\"seed\" must be an integer");
        r->has_seed = true;
        r->seed = (uint64_t)(int64_t)v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(body, "n");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return tsr__bad(e, TSR_BATCH_E_PARAM, "\"n\" other than 1 is not supported");
    v = cJSON_GetObjectItemCaseSensitive(body, "stop");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *one = v;
        if (cJSON_IsString(v)) {
            if (v->valuestring[0]) {
                r->stops[r->n_stops] = tsr_strdup(v->valuestring);
                if (!r->stops[r->n_stops++]) return TSR_ERR_NOMEM;
            }
        } else if (cJSON_IsArray(v)) {
            if (cJSON_GetArraySize(v) > TSR_BATCH_MAX_STOPS)
                return tsr__bad(e, TSR_BATCH_E_PARAM, "\"stop\" holds more than %d strings",
                                TSR_BATCH_MAX_STOPS);
            cJSON_ArrayForEach(one, v) {
                if (!cJSON_IsString(one))
                    return tsr__bad(e, TSR_BATCH_E_PARAM,
                                    "\"stop\" must be a string or an array of strings");
                if (!one->valuestring[0]) continue;
                r->stops[r->n_stops] = tsr_strdup(one->valuestring);
                if (!r->stops[r->n_stops++]) return TSR_ERR_NOMEM;
            }
        } else {
            return tsr__bad(e, TSR_BATCH_E_PARAM,
                            "\"stop\" must be a string or an array of strings");
        }
    }
    return TSR_OK;
}

tsr_status tsr_batch_parse_line(const char *text, size_t len, int64_t line,
                                tsr_batch_request *r, tsr_batch_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->line = line;
    r->max_tokens = 16;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!doc || !cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return tsr__bad(e, TSR_BATCH_E_JSON, "line %" PRId64 ": not a JSON object", line);
    }
    /* Trailing bytes other than whitespace make the line invalid. */
    for (; end && end < text + len; end++)
        if (*end != ' ' && *end != '\t' && *end != '\r') {
            cJSON_Delete(doc);
            return tsr__bad(e, TSR_BATCH_E_JSON, "line %" PRId64 ": not a JSON object", line);
        }
    tsr_status st = TSR_OK;
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(doc, "custom_id");
    if (!cJSON_IsString(cid) || !cid->valuestring[0]) {
        st = tsr__bad(e, TSR_BATCH_E_CUSTOM_ID,
                      "line %" PRId64 ": \"custom_id\" is missing or not a non-empty string",
                      line);
        goto done;
    }
    r->custom_id = tsr_strdup(cid->valuestring);
    if (!r->custom_id) {
        st = TSR_ERR_NOMEM;
        goto done;
    }
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(doc, "method");
    if (method && !(cJSON_IsString(method) && !strcmp(method->valuestring, "POST"))) {
        st = tsr__bad(e, TSR_BATCH_E_METHOD, "\"method\" must be \"POST\"");
        goto done;
    }
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(doc, "url");
    if (!cJSON_IsString(url)) {
        st = tsr__bad(e, TSR_BATCH_E_URL,
                      "\"url\" is missing (need /v1/completions or /v1/chat/completions)");
        goto done;
    }
    if (!strcmp(url->valuestring, "/v1/completions")) {
        r->kind = TSR_BATCH_COMPLETION;
    } else if (!strcmp(url->valuestring, "/v1/chat/completions")) {
        r->kind = TSR_BATCH_CHAT;
    } else {
        st = tsr__bad(e, TSR_BATCH_E_URL,
                      "\"url\" %.200s is not /v1/completions or /v1/chat/completions",
                      url->valuestring);
        goto done;
    }
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(doc, "body");
    if (!cJSON_IsObject(body)) {
        st = tsr__bad(e, TSR_BATCH_E_BODY, "\"body\" is missing or not an object");
        goto done;
    }
    st = tsr__parse_body(body, r, e);
done:
    cJSON_Delete(doc);
    return st;
}

/* ---- records ---------------------------------------------------------------------------- */

void tsr_batch_record_id(const char *custom_id, int64_t line, char *buf, size_t cap) {
    char key[48];
    if (!custom_id) {
        snprintf(key, sizeof key, "#line %" PRId64, line);
        custom_id = key;
    }
    snprintf(buf, cap, "batch_req_%016" PRIx64, tsr__fnv(custom_id));
}

/* Length of the UTF-8 character at p (n bytes left): 1-4, or 0 when p does not start a
 * well-formed one (base/utf8.h) or is a NUL byte (no JSON text holds one raw). */
static size_t tsr__utf8_char(const uint8_t *p, size_t n) {
    uint32_t cp;
    if (p[0] == 0) return 0;
    return (size_t)tsr_utf8_decode(p, n, &cp);
}

/* Valid UTF-8 copy: invalid sequences and NUL bytes become U+FFFD (JSON needs UTF-8). */
static char *tsr__utf8_clean(const char *s, size_t n) {
    size_t cap;
    if (!tsr_mul_size(n, 3, &cap)) return NULL;
    char *out = tsr_malloc(cap + 1);
    if (!out) return NULL;
    const uint8_t *p = (const uint8_t *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = tsr__utf8_char(p + i, n - i);
        if (len > 0) {
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += 1;
        }
    }
    out[o] = '\0';
    return out;
}

/* cJSON output (malloc'd) -> a tsr_malloc'd line with '\n'. */
static char *tsr__line(cJSON *doc) {
    char *js = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!js) return NULL;
    size_t n = strlen(js);
    char *line = tsr_malloc(n + 2);
    if (line) {
        memcpy(line, js, n);
        line[n] = '\n';
        line[n + 1] = '\0';
    }
    cJSON_free(js);
    return line;
}

/* A cleaned (UTF-8) copy of s[0, n) as a string member of o. */
static bool tsr__add_text(cJSON *o, const char *key, const char *s, size_t n) {
    char *t = tsr__utf8_clean(s, n);
    bool ok = t && cJSON_AddStringToObject(o, key, t);
    tsr_free(t);
    return ok;
}

/* A chat record's message: role, content (null for a tool call without text), then the
 * reasoning and the tool call when there are. The call's id is a hash of the record's, so
 * it is the same in every run (one call per record: <|call|> ends the answer). */
static bool tsr__chat_message(cJSON *msg, const tsr_batch_result *r, const char *text,
                              const char *record_id) {
    bool ok = cJSON_AddStringToObject(msg, "role", "assistant") != NULL;
    if (r->tool_name && !*text) ok = ok && cJSON_AddNullToObject(msg, "content");
    else ok = ok && cJSON_AddStringToObject(msg, "content", text);
    if (ok && r->reasoning)
        ok = tsr__add_text(msg, "reasoning", r->reasoning, r->reasoning_len);
    if (!ok || !r->tool_name) return ok;
    cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
    cJSON *call = cJSON_CreateObject();
    if (!calls || !call || !cJSON_AddItemToArray(calls, call)) {
        cJSON_Delete(call);
        return false;
    }
    char cid[32];
    snprintf(cid, sizeof cid, "call_%016" PRIx64, tsr__fnv(record_id));
    cJSON *fn = NULL;
    return cJSON_AddStringToObject(call, "id", cid) &&
           cJSON_AddStringToObject(call, "type", "function") &&
           (fn = cJSON_AddObjectToObject(call, "function")) != NULL &&
           tsr__add_text(fn, "name", r->tool_name, r->tool_name_len) &&
           tsr__add_text(fn, "arguments", r->tool_args ? r->tool_args : "",
                         r->tool_args ? r->tool_args_len : 0);
}

tsr_status tsr_batch_result_harmony(tsr_batch_result *res, const char *raw, size_t n,
                                    bool called, char **reasoning) {
    *reasoning = NULL;
    tsr_harmony_answer a;
    tsr_harmony_answer_parse(raw, n, called, &a);
    res->text = raw + a.final.begin;
    res->text_len = a.final.len;
    if (a.tool_call) { /* cut by max_tokens: a forced call's arguments so far, "length" */
        if (!strcmp(res->finish_reason, "stop")) res->finish_reason = "tool_calls";
        res->tool_name = raw + a.tool_name.begin;
        res->tool_name_len = a.tool_name.len;
        res->tool_args = raw + a.tool_args.begin;
        res->tool_args_len = a.tool_args.len;
    }
    if (a.n_reasoning == 0) return TSR_OK;
    size_t len = 0;
    for (int i = 0; i < a.n_reasoning; i++) len += a.reasoning[i].len + 2;
    char *t = tsr_malloc(len + 1);
    if (!t) return TSR_ERR_NOMEM;
    len = 0;
    for (int i = 0; i < a.n_reasoning; i++) {
        if (i) {
            memcpy(t + len, "\n\n", 2);
            len += 2;
        }
        memcpy(t + len, raw + a.reasoning[i].begin, a.reasoning[i].len);
        len += a.reasoning[i].len;
    }
    t[len] = '\0';
    res->reasoning = t;
    res->reasoning_len = len;
    *reasoning = t;
    return TSR_OK;
}

char *tsr_batch_format_result(const tsr_batch_result *r) {
    char id[48], req[48];
    tsr_batch_record_id(r->custom_id, 0, id, sizeof id);
    snprintf(req, sizeof req, "req_%s", id + strlen("batch_req_"));
    char *text = tsr__utf8_clean(r->text ? r->text : "", r->text ? r->text_len : 0);
    if (!text) return NULL;
    cJSON *doc = cJSON_CreateObject();
    cJSON *resp = cJSON_CreateObject();
    cJSON *body = cJSON_CreateObject();
    cJSON *choices = cJSON_CreateArray();
    cJSON *choice = cJSON_CreateObject();
    cJSON *usage = cJSON_CreateObject();
    bool ok = doc && resp && body && choices && choice && usage, msg_ok = true;
    if (ok) {
        cJSON_AddStringToObject(doc, "id", id);
        cJSON_AddStringToObject(doc, "custom_id", r->custom_id);
        cJSON_AddItemToObject(doc, "response", resp);
        cJSON_AddNumberToObject(resp, "status_code", 200);
        cJSON_AddStringToObject(resp, "request_id", req);
        cJSON_AddItemToObject(resp, "body", body);
        cJSON_AddStringToObject(body, "id", req);
        cJSON_AddStringToObject(body, "object",
                                r->kind == TSR_BATCH_CHAT ? "chat.completion" : "text_completion");
        cJSON_AddStringToObject(body, "model", r->model ? r->model : "");
        cJSON_AddNumberToObject(choice, "index", 0);
        if (r->kind == TSR_BATCH_CHAT) {
            cJSON *msg = cJSON_AddObjectToObject(choice, "message");
            msg_ok = msg && tsr__chat_message(msg, r, text, id);
        } else {
            cJSON_AddStringToObject(choice, "text", text);
        }
        cJSON_AddStringToObject(choice, "finish_reason", r->finish_reason);
        cJSON_AddItemToArray(choices, choice);
        cJSON_AddItemToObject(body, "choices", choices);
        cJSON_AddNumberToObject(usage, "prompt_tokens", r->prompt_tokens);
        cJSON_AddNumberToObject(usage, "completion_tokens", r->completion_tokens);
        cJSON_AddNumberToObject(usage, "total_tokens", r->prompt_tokens + r->completion_tokens);
        cJSON_AddItemToObject(body, "usage", usage);
        cJSON_AddNullToObject(doc, "error");
        if (r->line_hash) {
            char h[24];
            snprintf(h, sizeof h, "%016" PRIx64, r->line_hash);
            cJSON_AddStringToObject(doc, "line_hash", h);
        }
        if (!msg_ok) { /* out of memory: no record rather than half of one */
            cJSON_Delete(doc);
            doc = NULL;
        }
    } else {
        cJSON_Delete(resp);
        cJSON_Delete(body);
        cJSON_Delete(choices);
        cJSON_Delete(choice);
        cJSON_Delete(usage);
        cJSON_Delete(doc);
        doc = NULL;
    }
    tsr_free(text);
    return tsr__line(doc);
}

uint64_t tsr_batch_line_hash(const char *text, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)text[i]) * 0x100000001b3ull;
    return h ? h : 1; /* 0 means "not recorded" */
}

char *tsr_batch_format_error(const char *custom_id, int64_t line, const char *code,
                             const char *message) {
    return tsr_batch_format_error_bound(custom_id, line, 0, code, message);
}

char *tsr_batch_format_error_bound(const char *custom_id, int64_t line, uint64_t line_hash,
                                   const char *code, const char *message) {
    char id[48];
    tsr_batch_record_id(custom_id, line, id, sizeof id);
    char *msg = tsr__utf8_clean(message, strlen(message));
    if (!msg) return NULL;
    cJSON *doc = cJSON_CreateObject();
    cJSON *err = doc ? cJSON_CreateObject() : NULL;
    if (!err) {
        cJSON_Delete(doc);
        tsr_free(msg);
        return NULL;
    }
    cJSON_AddStringToObject(doc, "id", id);
    if (custom_id)
        cJSON_AddStringToObject(doc, "custom_id", custom_id);
    else
        cJSON_AddNullToObject(doc, "custom_id");
    cJSON_AddNullToObject(doc, "response");
    cJSON_AddStringToObject(err, "code", code);
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_AddNumberToObject(err, "line", (double)line);
    cJSON_AddItemToObject(doc, "error", err);
    if (line_hash) {
        char h[24];
        snprintf(h, sizeof h, "%016" PRIx64, line_hash);
        cJSON_AddStringToObject(doc, "line_hash", h);
    }
    tsr_free(msg);
    return tsr__line(doc);
}

/* ---- input file ------------------------------------------------------------------------- */

/* A file that begins with a byte-order mark other than UTF-8's: its encoding, else NULL. */
static const char *tsr__foreign_bom(const uint8_t *p, size_t n) {
    if (n >= 4 && p[0] == 0xff && p[1] == 0xfe && p[2] == 0 && p[3] == 0)
        return "UTF-32LE (byte-order mark FF FE 00 00)";
    if (n >= 4 && p[0] == 0 && p[1] == 0 && p[2] == 0xfe && p[3] == 0xff)
        return "UTF-32BE (byte-order mark 00 00 FE FF)";
    if (n >= 2 && p[0] == 0xff && p[1] == 0xfe) return "UTF-16LE (byte-order mark FF FE)";
    if (n >= 2 && p[0] == 0xfe && p[1] == 0xff) return "UTF-16BE (byte-order mark FE FF)";
    return NULL;
}

tsr_status tsr_batch_input_scan(const char *path, FILE *f, int64_t *n_requests, long *start) {
    *n_requests = 0;
    *start = 0;
    char *buf = NULL;
    size_t cap = 0;
    int64_t line = 0;
    tsr_status st = TSR_OK;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&buf, &cap, f);
        if (n < 0) {
            if (ferror(f))
                st = tsr_error_set(TSR_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        line++;
        const uint8_t *p = (const uint8_t *)buf;
        size_t len = (size_t)n, i = 0;
        if (line == 1) {
            const char *enc = tsr__foreign_bom(p, len);
            if (enc) {
                st = tsr_error_set(TSR_ERR_INVALID,
                                   "%s: the input is %s, not UTF-8: convert it first (e.g. "
                                   "iconv -f UTF-16 -t UTF-8)", path, enc);
                break;
            }
            if (len >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) {
                i = 3; /* UTF-8's byte-order mark: allowed, the reader starts after it */
                *start = 3;
            }
        }
        bool blank = true;
        while (i < len) {
            size_t k = tsr__utf8_char(p + i, len - i);
            if (k == 0) {
                /* A NUL byte in the first line: UTF-16 without a mark, or binary; the whole
                 * file is refused. Any other bad byte makes one bad line (its record). */
                if (line == 1 && p[i] == 0)
                    st = tsr_error_set(TSR_ERR_INVALID,
                                       "%s: line 1 has a NUL byte at byte %zu (UTF-16 without "
                                       "a byte-order mark, or binary?): the input must be UTF-8 "
                                       "JSONL", path, i + 1);
                blank = false;
                break;
            }
            if (!(k == 1 && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n')))
                blank = false;
            i += k;
        }
        if (st != TSR_OK) break;
        if (!blank) (*n_requests)++;
    }
    free(buf); /* getline allocates with malloc */
    return st;
}

tsr_status tsr_batch_take_line(char *buf, size_t n, int64_t line, tsr_strset *seen, bool *blank,
                               uint64_t *hash, tsr_batch_request *r, tsr_batch_error *e,
                               tsr_status *verdict) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    *verdict = TSR_OK;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    size_t k = 0;
    while (k < n && (buf[k] == ' ' || buf[k] == '\t')) k++;
    *blank = k == n;
    if (*blank) return TSR_OK;
    *hash = tsr_batch_line_hash(buf, n);
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < n;) {
        size_t c = tsr__utf8_char((const uint8_t *)buf + i, n - i);
        if (c == 0) {
            bad = i;
            break;
        }
        i += c;
    }
    tsr_status pst = tsr_batch_parse_line(buf, n, line, r, e);
    if (pst != TSR_OK && pst != TSR_ERR_INVALID) return pst;
    if (bad != SIZE_MAX) {
        /* Keyed by its custom_id when that is UTF-8 (so the record names it), else by line. */
        if (r->custom_id) {
            const uint8_t *c = (const uint8_t *)r->custom_id;
            for (size_t i = 0, m = strlen(r->custom_id); i < m;) {
                size_t l = tsr__utf8_char(c + i, m - i);
                if (l == 0) {
                    tsr_free(r->custom_id);
                    r->custom_id = NULL;
                    break;
                }
                i += l;
            }
        }
        tsr__bad(e, TSR_BATCH_E_ENCODING,
                 "line %" PRId64 " is not UTF-8 (byte 0x%02x at byte %zu): JSON lines must be "
                 "UTF-8", line, (uint8_t)buf[bad], bad + 1);
        pst = TSR_ERR_INVALID;
    }
    if (r->custom_id) {
        bool added = false;
        TSR_TRY(tsr_strset_add(seen, r->custom_id, &added));
        if (!added) { /* keyed by line from here on */
            snprintf(e->code, sizeof e->code, "%s", TSR_BATCH_E_DUPLICATE);
            snprintf(e->message, sizeof e->message,
                     "line %" PRId64 ": custom_id \"%.200s\" is used by an earlier line", line,
                     r->custom_id);
            pst = TSR_ERR_INVALID;
            tsr_free(r->custom_id);
            r->custom_id = NULL;
        }
    }
    *verdict = pst;
    return TSR_OK;
}

/* A record's key: its custom_id, or "#line N". */
static void tsr__key(const char *custom_id, int64_t line, char *buf, size_t cap) {
    if (custom_id)
        snprintf(buf, cap, "%s", custom_id);
    else
        snprintf(buf, cap, "#line %" PRId64, line);
}

void tsr_batch_input_index_free(tsr_batch_input_index *ix) {
    tsr_strset_destroy(ix->keys);
    tsr_strset_destroy(ix->pairs);
    memset(ix, 0, sizeof *ix);
}

tsr_status tsr_batch_input_index_build(const char *path, FILE *f, tsr_batch_input_index *ix) {
    memset(ix, 0, sizeof *ix);
    tsr_strset *seen = NULL;
    tsr_status st = tsr_strset_create(&ix->keys);
    if (st == TSR_OK) st = tsr_strset_create(&ix->pairs);
    if (st == TSR_OK) st = tsr_strset_create(&seen);
    char *buf = NULL, *pair = NULL;
    size_t cap = 0, pcap = 0;
    while (st == TSR_OK) {
        errno = 0;
        ssize_t n = getline(&buf, &cap, f);
        if (n < 0) {
            if (ferror(f))
                st = tsr_error_set(TSR_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        ix->n_lines++;
        bool blank;
        uint64_t hash = 0;
        tsr_batch_request r;
        tsr_batch_error e;
        tsr_status verdict;
        st = tsr_batch_take_line(buf, (size_t)n, ix->n_lines, seen, &blank, &hash, &r, &e,
                                 &verdict);
        if (st == TSR_OK && !blank) {
            size_t need = (r.custom_id ? strlen(r.custom_id) : 0) + 64;
            if (need > pcap) {
                char *np = tsr_realloc(pair, need);
                if (!np) st = TSR_ERR_NOMEM;
                else {
                    pair = np;
                    pcap = need;
                }
            }
            if (st == TSR_OK) {
                tsr__key(r.custom_id, ix->n_lines, pair, pcap);
                st = tsr_strset_add(ix->keys, pair, NULL);
                size_t l = strlen(pair);
                snprintf(pair + l, pcap - l, "\x1f%016" PRIx64, hash);
                if (st == TSR_OK) st = tsr_strset_add(ix->pairs, pair, NULL);
            }
        }
        tsr_batch_request_free(&r);
    }
    free(buf); /* getline allocates with malloc */
    tsr_free(pair);
    tsr_strset_destroy(seen);
    if (st != TSR_OK) tsr_batch_input_index_free(ix);
    return st;
}

/* ---- resume ----------------------------------------------------------------------------- */

void tsr_batch_resume_free(tsr_batch_resume *r) {
    tsr_strset_destroy(r->ids);
    tsr_strset_destroy(r->lines);
    memset(r, 0, sizeof *r);
}

bool tsr_batch_resume_has(const tsr_batch_resume *r, const char *custom_id, int64_t line) {
    if (custom_id) return tsr_strset_has(r->ids, custom_id);
    char key[32];
    snprintf(key, sizeof key, "%" PRId64, line);
    return tsr_strset_has(r->lines, key);
}

typedef struct tsr__scan {
    tsr_batch_resume *r;
    const tsr_batch_input_index *ix; /* NULL: not bound */
    FILE *copy; /* the rewrite: every line but the superseded records goes here */
    const char *tmp;
} tsr__scan;

/* Whether a record of key `key` (line-keyed: by_line, number n) with line hash `hash` text
 * (NULL: none) belongs to the input: 1 kept, 0 superseded, -1 foreign. */
static int tsr__bind(const tsr_batch_input_index *ix, const char *key, bool by_line, int64_t n,
                     const char *hash) {
    if (!tsr_strset_has(ix->keys, key)) return by_line && n >= 1 && n <= ix->n_lines ? 0 : -1;
    if (!hash || strlen(hash) != 16) return 0;
    char pair[4200];
    int w = snprintf(pair, sizeof pair, "%s\x1f%s", key, hash);
    if (w < 0 || (size_t)w >= sizeof pair) return 0;
    return tsr_strset_has(ix->pairs, pair) ? 1 : 0;
}

/* Classifies one complete output line: 1 = a record (key added), 0 = not a record;
 * *drop: a superseded record (bound scans). */
static tsr_status tsr__scan_record(tsr__scan *sc, const char *text, size_t len, int *is_rec,
                                   int *is_err, bool *drop) {
    tsr_batch_resume *r = sc->r;
    *is_rec = *is_err = 0;
    *drop = false;
    cJSON *doc = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return TSR_OK;
    }
    tsr_status st = TSR_OK;
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(doc, "custom_id");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    const cJSON *resp = cJSON_GetObjectItemCaseSensitive(doc, "response");
    bool has_err = cJSON_IsObject(err);
    if (!has_err && !cJSON_IsObject(resp)) goto done;
    const cJSON *code = has_err ? cJSON_GetObjectItemCaseSensitive(err, "code") : NULL;
    const cJSON *line = has_err ? cJSON_GetObjectItemCaseSensitive(err, "line") : NULL;
    bool by_line = !cJSON_IsString(cid) ||
                   (cJSON_IsString(code) && !strcmp(code->valuestring, TSR_BATCH_E_DUPLICATE));
    if (by_line && !cJSON_IsNumber(line)) goto done;
    if (sc->ix) {
        char key[4096];
        int64_t n = by_line ? (int64_t)line->valuedouble : 0;
        tsr__key(by_line ? NULL : cid->valuestring, n, key, sizeof key);
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(doc, "line_hash");
        int b = tsr__bind(sc->ix, key, by_line, n, cJSON_IsString(h) ? h->valuestring : NULL);
        if (b <= 0) {
            if (b == 0) {
                r->n_superseded++;
                *drop = true;
            } else if (r->n_foreign++ == 0) {
                snprintf(r->first_foreign, sizeof r->first_foreign, "%.120s", key);
            }
            goto done; /* not a record of this input: its line is not skipped */
        }
    }
    if (by_line) {
        char key[32];
        snprintf(key, sizeof key, "%" PRId64, (int64_t)line->valuedouble);
        st = tsr_strset_add(r->lines, key, NULL);
    } else {
        st = tsr_strset_add(r->ids, cid->valuestring, NULL);
    }
    *is_rec = 1;
    *is_err = has_err;
done:
    cJSON_Delete(doc);
    return st;
}

/* Reads `path` line by line, calling fn on each complete line; *good_end gets the offset
 * after the last newline and *size the file size. */
typedef tsr_status (*tsr__line_fn)(void *ctx, const char *line, size_t len);

static tsr_status tsr__each_line(const char *path, FILE *f, tsr__line_fn fn, void *ctx,
                                 int64_t *good_end, int64_t *size) {
    char *buf = NULL;
    size_t cap = 0;
    int64_t off = 0;
    *good_end = 0;
    tsr_status st = TSR_OK;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&buf, &cap, f);
        if (n < 0) {
            if (ferror(f)) st = tsr_error_set(TSR_ERR_IO, "%s: read error: %s", path,
                                              strerror(errno));
            break;
        }
        off += n;
        if (buf[n - 1] != '\n') break; /* the truncated tail */
        *good_end = off;
        st = fn(ctx, buf, (size_t)n - 1);
        if (st != TSR_OK) break;
    }
    free(buf); /* getline allocates with malloc */
    *size = off;
    return st;
}

static tsr_status tsr__scan_line(void *ctx, const char *line, size_t len) {
    tsr__scan *sc = ctx;
    tsr_batch_resume *r = sc->r;
    size_t k = 0;
    while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
    int rec = 0, err = 0;
    bool drop = false;
    if (k < len) { /* not blank */
        int64_t before = r->n_superseded + r->n_foreign;
        TSR_TRY(tsr__scan_record(sc, line, len, &rec, &err, &drop));
        if (rec) {
            r->n_records++;
            r->n_errors += err;
        } else if (r->n_superseded + r->n_foreign == before) {
            r->n_ignored++;
        }
    }
    if (sc->copy && !drop &&
        (fwrite(line, 1, len, sc->copy) != len || fputc('\n', sc->copy) == EOF))
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", sc->tmp, strerror(errno));
    return TSR_OK;
}

/* Writes `path` again without its superseded records: a temporary beside it, fsynced, then
 * renamed over it (a kill leaves either file whole). */
static tsr_status tsr__rewrite(const char *path, tsr__scan *sc) {
    char tmp[4200];
    int w = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (w < 0 || (size_t)w >= sizeof tmp)
        return tsr_error_set(TSR_ERR_INVALID, "%s: path too long", path);
    FILE *in = fopen(path, "rb");
    if (!in) return tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        fclose(in);
        return tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    /* A fresh count over the same lines (the sets already hold the kept keys). */
    tsr_batch_resume *r = sc->r;
    r->n_records = r->n_errors = r->n_ignored = r->n_superseded = r->n_foreign = 0;
    sc->copy = out;
    sc->tmp = tmp;
    int64_t good_end = 0, size = 0;
    tsr_status st = tsr__each_line(path, in, tsr__scan_line, sc, &good_end, &size);
    sc->copy = NULL;
    fclose(in);
    if ((fflush(out) != 0 || fsync(fileno(out)) != 0) && st == TSR_OK)
        st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
    if (fclose(out) != 0 && st == TSR_OK)
        st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
    if (st == TSR_OK && rename(tmp, path) != 0)
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename into place: %s", path,
                           strerror(errno));
    if (st != TSR_OK) remove(tmp);
    return st;
}

tsr_status tsr_batch_resume_scan(const char *path, tsr_batch_resume *r) {
    return tsr_batch_resume_scan_bound(path, NULL, true, r);
}

tsr_status tsr_batch_resume_scan_bound(const char *path, const tsr_batch_input_index *ix,
                                       bool writable, tsr_batch_resume *r) {
    memset(r, 0, sizeof *r);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return tsr_error_set(TSR_ERR_INVALID, "%s is a directory: the output must be a file "
                             "path", path);
    TSR_TRY(tsr_strset_create(&r->ids));
    tsr_status st = tsr_strset_create(&r->lines);
    if (st != TSR_OK) {
        tsr_batch_resume_free(r);
        return st;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return TSR_OK;
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot open the output file: %s", path,
                           strerror(errno));
        tsr_batch_resume_free(r);
        return st;
    }
    int64_t good_end = 0, size = 0;
    tsr__scan sc = {.r = r, .ix = ix};
    st = tsr__each_line(path, f, tsr__scan_line, &sc, &good_end, &size);
    fclose(f);
    if (st == TSR_OK) {
        r->good_end = good_end;
        r->truncated_bytes = size - good_end;
        if (writable) st = tsr_batch_resume_fix(path, ix, r);
    }
    if (st != TSR_OK) tsr_batch_resume_free(r);
    return st;
}

tsr_status tsr_batch_resume_fix(const char *path, const tsr_batch_input_index *ix,
                                tsr_batch_resume *r) {
    if (r->n_foreign > 0) return TSR_OK; /* another input's output: left as it was */
    /* A record cut by a kill: remove it, so the next append starts on a fresh line. */
    if (r->truncated_bytes > 0 && truncate(path, (off_t)r->good_end) != 0)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot truncate the partial last record: %s",
                             path, strerror(errno));
    if (r->n_superseded == 0) return TSR_OK;
    int64_t superseded = r->n_superseded;
    tsr__scan sc = {.r = r, .ix = ix};
    tsr_status st = tsr__rewrite(path, &sc);
    r->n_superseded = superseded;
    return st;
}

typedef struct tsr__err_copy {
    FILE *out;
    const char *path;
} tsr__err_copy;

static tsr_status tsr__copy_errors(void *ctx, const char *line, size_t len) {
    tsr__err_copy *c = ctx;
    cJSON *doc = cJSON_ParseWithLength(line, len);
    bool is_err = cJSON_IsObject(doc) &&
                  cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(doc, "error"));
    cJSON_Delete(doc);
    if (!is_err) return TSR_OK;
    if (fwrite(line, 1, len, c->out) != len || fputc('\n', c->out) == EOF)
        return tsr_error_set(TSR_ERR_IO, "%s: write error", c->path);
    return TSR_OK;
}

tsr_status tsr_batch_rebuild_errors(const char *out_path, const char *err_path) {
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", err_path);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return tsr_error_set(TSR_ERR_INVALID, "%s: path too long", err_path);
    /* Errors name err_path, the file the user asked for (--errors, or the default beside
     * --output), not the temporary that is an implementation detail. */
    FILE *out = fopen(tmp, "wb");
    if (!out)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot create the errors file: %s", err_path,
                             strerror(errno));
    tsr_status st = TSR_OK;
    FILE *in = fopen(out_path, "rb");
    if (in) {
        tsr__err_copy c = {out, err_path};
        int64_t good_end, size;
        st = tsr__each_line(out_path, in, tsr__copy_errors, &c, &good_end, &size);
        fclose(in);
    } else if (errno != ENOENT) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", out_path, strerror(errno));
    }
    if (fflush(out) != 0 || fsync(fileno(out)) != 0) {
        if (st == TSR_OK) st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", err_path,
                                             strerror(errno));
    }
    fclose(out);
    if (st == TSR_OK && rename(tmp, err_path) != 0)
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename into place: %s", err_path,
                           strerror(errno));
    if (st != TSR_OK) remove(tmp);
    return st;
}

/* ---- writer ----------------------------------------------------------------------------- */

tsr_status tsr_batch_writer_open(tsr_batch_writer *w, const char *path) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return tsr_error_set(TSR_ERR_IO, "%s is a directory: give a file path", path);
    w->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (w->fd < 0)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot open for writing: %s", path,
                             strerror(errno));
    off_t end = lseek(w->fd, 0, SEEK_END);
    w->path = tsr_strdup(path);
    if (end < 0 || !w->path) {
        tsr_status st = end < 0 ? tsr_error_set(TSR_ERR_IO, "%s: %s", path, strerror(errno))
                                : TSR_ERR_NOMEM;
        tsr_batch_writer_close(w);
        return st;
    }
    w->good = (int64_t)end;
    return TSR_OK;
}

tsr_status tsr_batch_writer_put(tsr_batch_writer *w, const char *line) {
    if (w->failed_errno)
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", w->path,
                             strerror(w->failed_errno));
    size_t n = strlen(line), at = 0;
    int e = 0;
    const char *fault = getenv("TSR_TEST_WRITE_FAIL_AFTER"); /* test hook: bytes, then EIO */
    while (at < n) {
        ssize_t k;
        if (fault && w->good + (int64_t)at >= strtoll(fault, NULL, 10)) {
            k = -1;
            errno = EIO;
        } else {
            size_t want = n - at;
            if (fault && (int64_t)want > strtoll(fault, NULL, 10) - w->good - (int64_t)at)
                want = (size_t)(strtoll(fault, NULL, 10) - w->good - (int64_t)at);
            k = write(w->fd, line + at, want);
        }
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            e = k < 0 ? errno : EIO;
            break;
        }
        at += (size_t)k;
    }
    if (e == 0 && fsync(w->fd) != 0) e = errno;
    if (e != 0) {
        /* A cut record would stay in the file until a rerun: cut back to the last whole one
         * (the space it frees is what the cut record took). */
        w->failed_errno = e;
        if (ftruncate(w->fd, (off_t)w->good) != 0 || fsync(w->fd) != 0)
            return tsr_error_set(TSR_ERR_IO, "%s: write error: %s; and cutting the partial "
                                 "record failed: %s", w->path, strerror(e), strerror(errno));
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", w->path, strerror(e));
    }
    w->good += (int64_t)n;
    w->n_put++;
    return TSR_OK;
}

void tsr_batch_writer_close(tsr_batch_writer *w) {
    if (w->fd >= 0 && w->path) close(w->fd);
    tsr_free(w->path);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

/* ---- lock ------------------------------------------------------------------------------- */

tsr_status tsr_batch_lock_take(tsr_batch_lock *l, const char *file) {
    memset(l, 0, sizeof *l);
    l->fd = -1;
    size_t n = strlen(file) + 6;
    l->path = tsr_malloc(n);
    if (!l->path) return TSR_ERR_NOMEM;
    snprintf(l->path, n, "%s.lock", file);
    /* The lock file is removed at release; one that a releasing job removed between our
     * open and our lock is not the live one, so the lock is taken again on the new file
     * (same inode as the path, checked after locking). */
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            tsr_status st = tsr_error_set(TSR_ERR_IO, "%s: cannot create its lock file %s: %s",
                                          file, l->path, strerror(errno));
            tsr_batch_lock_release(l);
            return st;
        }
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
        if (fcntl(fd, F_SETLK, &fl) != 0) {
            int e = errno;
            char holder[256] = "";
            ssize_t k = pread(fd, holder, sizeof holder - 1, 0);
            /* the holder writes its record just after it locks: a job refused in between
             * reads an empty file, so it gives the record up to 200 ms to appear */
            for (int t = 0; t < 20 && k <= 0 && (e == EACCES || e == EAGAIN); t++) {
                nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
                k = pread(fd, holder, sizeof holder - 1, 0);
            }
            close(fd);
            holder[k > 0 ? k : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
            tsr_status st;
            if (e == EACCES || e == EAGAIN)
                st = tsr_error_set(TSR_ERR_INVALID,
                                   "%s is in use by another job (%s, lock %s): wait for it to "
                                   "end or give another --output/--errors", file,
                                   holder[0] ? holder : "holder unknown", l->path);
            else
                st = tsr_error_set(TSR_ERR_IO, "%s: cannot lock (%s); this file system may "
                                   "not support POSIX locks (docs/jobs.md)", l->path,
                                   strerror(e));
            tsr_batch_lock_release(l);
            return st;
        }
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(l->path, &b) != 0 || a.st_ino != b.st_ino ||
            a.st_dev != b.st_dev) {
            close(fd); /* removed under us: take the new one */
            continue;
        }
        char rec[512], host[256] = "?", when[32] = "?";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        int w = snprintf(rec, sizeof rec, "pid %ld@%s since %s\n", (long)getpid(), host, when);
        if (ftruncate(fd, 0) != 0 || w < 0 || pwrite(fd, rec, (size_t)w, 0) != (ssize_t)w) {
            /* the lock holds without its record; a refused job then says "holder unknown" */
        }
        l->fd = fd;
        return TSR_OK;
    }
    tsr_status st = tsr_error_set(TSR_ERR_IO, "%s: the lock file keeps being replaced", l->path);
    tsr_batch_lock_release(l);
    return st;
}

void tsr_batch_lock_release(tsr_batch_lock *l) {
    if (l->fd >= 0 && l->path) { /* a zeroed lock (never taken) has no path */
        /* Removed while still locked, so no other job can lock this inode and believe it
         * holds the file (a job that opened it meanwhile sees another inode and retries). */
        if (l->path) unlink(l->path);
        close(l->fd);
    }
    tsr_free(l->path);
    memset(l, 0, sizeof *l);
    l->fd = -1;
}
