/* Native rendering of the Llama-3 chat templates. The Jinja sources they replicate:
 *   3.0: for each message: '<|start_header_id|>' + role + '<|end_header_id|>\n\n'
 *        + content|trim + '<|eot_id|>', bos_token before the first; then the assistant
 *        header (add_generation_prompt).
 *   3.1+: bos_token, then always a system block "Cutting Knowledge Date: December 2023\n
 *        Today Date: 26 Jul 2024\n\n" + the (trimmed) system message, then the other
 *        messages as in 3.0 (no tools). 3.2 templates take today's date from strftime_now;
 *        tessera keeps the 3.1 default date so that outputs are reproducible. */
#include "runtime/chat_template.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/file.h"

tsr_status tsr_chat_template_parse(const char *json, size_t len, const char *what,
                                   tsr_chat_template *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->bos, sizeof out->bos, "<|begin_of_text|>");
    cJSON *doc = cJSON_ParseWithLength(json, len);
    if (!doc || !cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return tsr_error_set(TSR_ERR_FORMAT, "%s: not a JSON object", what);
    }
    tsr_status st = TSR_OK;
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(doc, "chat_template");
    const char *text = NULL;
    if (cJSON_IsString(tpl)) {
        text = tpl->valuestring;
    } else if (cJSON_IsArray(tpl)) {
        /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
        const cJSON *it;
        cJSON_ArrayForEach(it, tpl) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *tt = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (cJSON_IsString(nm) && cJSON_IsString(tt) && !strcmp(nm->valuestring, "default"))
                text = tt->valuestring;
        }
    }
    if (text) {
        if (strstr(text, "<|start_header_id|>") && strstr(text, "<|end_header_id|>") &&
            strstr(text, "<|eot_id|>"))
            out->kind = strstr(text, "Cutting Knowledge Date") ? TSR_CHAT_LLAMA31
                                                               : TSR_CHAT_LLAMA3;
        else
            st = tsr_error_set(TSR_ERR_UNSUPPORTED,
                               "%s: chat_template is not a Llama-3 template (the only family "
                               "tessera renders)",
                               what);
    }
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(doc, "bos_token");
    if (cJSON_IsObject(bos)) bos = cJSON_GetObjectItemCaseSensitive(bos, "content");
    if (cJSON_IsString(bos) && strlen(bos->valuestring) < sizeof out->bos)
        snprintf(out->bos, sizeof out->bos, "%s", bos->valuestring);
    cJSON_Delete(doc);
    if (st != TSR_OK) out->kind = TSR_CHAT_NONE;
    return st;
}

tsr_status tsr_chat_template_detect(const char *model_path, tsr_chat_template *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (!model_path || stat(model_path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return TSR_OK;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/tokenizer_config.json", model_path);
    if (n < 0 || (size_t)n >= sizeof path) return TSR_OK;
    if (stat(path, &sb) != 0) return TSR_OK;
    char *text = NULL;
    size_t len = 0;
    TSR_TRY(tsr_file_read(path, "tokenizer config", 64u << 20, &text, &len));
    tsr_status st = tsr_chat_template_parse(text, len, path, out);
    tsr_free(text);
    return st;
}

typedef struct tsr__sb {
    char *p;
    size_t n, cap;
    bool oom;
} tsr__sb;

static void tsr__sb_put(tsr__sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = tsr_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void tsr__sb_str(tsr__sb *b, const char *s) { tsr__sb_put(b, s, strlen(s)); }

static bool tsr__ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Jinja's |trim (Python str.strip() on ASCII whitespace). */
static void tsr__sb_trimmed(tsr__sb *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && tsr__ws(s[i])) i++;
    while (n > i && tsr__ws(s[n - 1])) n--;
    tsr__sb_put(b, s + i, n - i);
}

static void tsr__sb_message(tsr__sb *b, const tsr_chat_message *m) {
    tsr__sb_str(b, "<|start_header_id|>");
    tsr__sb_str(b, m->role);
    tsr__sb_str(b, "<|end_header_id|>\n\n");
    tsr__sb_trimmed(b, m->content);
    tsr__sb_str(b, "<|eot_id|>");
}

tsr_status tsr_chat_render(const tsr_chat_template *t, const tsr_chat_message *msgs, int n,
                           char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!t || t->kind == TSR_CHAT_NONE)
        return tsr_error_set(TSR_ERR_INVALID, "model has no chat template");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return tsr_error_set(TSR_ERR_INVALID, "chat message %d lacks a role or content", i);
    tsr__sb b = {0};
    tsr__sb_str(&b, t->bos);
    int first = 0;
    if (t->kind == TSR_CHAT_LLAMA31) {
        tsr__sb_str(&b, "<|start_header_id|>system<|end_header_id|>\n\n"
                        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
        if (n > 0 && !strcmp(msgs[0].role, "system")) {
            tsr__sb_trimmed(&b, msgs[0].content);
            first = 1;
        }
        tsr__sb_str(&b, "<|eot_id|>");
    }
    for (int i = first; i < n; i++) tsr__sb_message(&b, &msgs[i]);
    tsr__sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    if (b.oom) {
        tsr_free(b.p);
        return tsr_error_set(TSR_ERR_NOMEM, "chat template: out of memory");
    }
    *out = b.p;
    *len = b.n;
    return TSR_OK;
}
