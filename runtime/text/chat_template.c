/* Chat templates rendered by runtime/text/jinja.c with the context transformers'
 * apply_chat_template gives a template: messages, add_generation_prompt, tools=None,
 * documents=None, bos_token, eos_token; continue_final cuts the output as
 * continue_final_message does. */
#include "runtime/text/chat_template.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/file.h"
#include "runtime/text/jinja.h"

/* Llama 3.1 Instruct's template (meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json,
 * as tests/data/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja): the fallback for
 * callers that know the model is a Llama-3 instruct model but have no template text. */
static const char tsr__llama31[] =
    "{{- bos_token }}\n"
    "{%- if custom_tools is defined %}\n"
    "    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n"
    "    {%- set tools_in_user_message = true %}\n"
    "{%- endif %}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- System message + builtin tools #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n"
    "    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    "        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n"
    "{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "    {{- first_user_message + \"<|eot_id|>\"}}\n"
    "{%- endif %}\n"
    "\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
    "        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- endif %}\n"
    "                {%- endfor %}\n"
    "            {{- \")\" }}\n"
    "        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- \"}\" }}\n"
    "        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n"
    "            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n"
    "            {{- \"<|eot_id|>\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n"
    "        {%- else %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

static uint64_t tsr__fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

void tsr_chat_template_free(tsr_chat_template *t) {
    if (!t) return;
    tsr_jinja_free(t->jinja);
    t->jinja = NULL;
    t->kind = TSR_CHAT_NONE;
}

tsr_status tsr_chat_template_from_source(const char *source, size_t len, const char *bos,
                                         const char *eos, const char *what,
                                         tsr_chat_template *out) {
    memset(out, 0, sizeof *out);
    if (!source) {
        source = tsr__llama31;
        len = sizeof tsr__llama31 - 1;
        if (!bos) bos = "<|begin_of_text|>";
        if (!eos) eos = "<|eot_id|>";
        what = "built-in Llama-3.1 template";
    }
    if ((bos && strlen(bos) >= sizeof out->bos) || (eos && strlen(eos) >= sizeof out->eos))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: bos/eos token longer than %zu bytes",
                             what, sizeof out->bos - 1);
    snprintf(out->bos, sizeof out->bos, "%s", bos ? bos : "");
    snprintf(out->eos, sizeof out->eos, "%s", eos ? eos : "");
    TSR_TRY(tsr_jinja_parse(source, len, what, &out->jinja));
    out->kind = TSR_CHAT_JINJA;
    out->source_hash = tsr__fnv(source, len);
    return TSR_OK;
}

/* A special token in tokenizer_config.json: a string or {"content": ...}. */
static const char *tsr__token(const cJSON *doc, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

tsr_status tsr_chat_template_parse(const char *json, size_t len, const char *what,
                                   tsr_chat_template *out) {
    memset(out, 0, sizeof *out);
    cJSON *doc = cJSON_ParseWithLength(json, len);
    if (!doc || !cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return tsr_error_set(TSR_ERR_FORMAT, "%s: not a JSON object", what);
    }
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
    tsr_status st = TSR_OK;
    if (text) {
        const char *bos = tsr__token(doc, "bos_token"), *eos = tsr__token(doc, "eos_token");
        st = tsr_chat_template_from_source(text, strlen(text), bos ? bos : "", eos ? eos : "",
                                           what, out);
    }
    cJSON_Delete(doc);
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

static bool tsr__ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* rindex of needle in hay; -1 if absent. */
static long tsr__rfind(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn > hn) return -1;
    for (size_t i = hn - nn + 1; i > 0; i--)
        if (!memcmp(hay + i - 1, needle, nn)) return (long)(i - 1);
    return -1;
}

/* strftime_now's time when the caller gives none: SOURCE_DATE_EPOCH (the reproducible-builds
 * convention: seconds since the epoch, UTC) where set to a non-negative integer, so a job's
 * prompts (a date in GPT-OSS's and Llama 3's system turns) do not change at midnight or
 * between a preempted run and its resumption; else -1, the current time. */
static int64_t tsr__chat_now(void) {
    const char *e = getenv("SOURCE_DATE_EPOCH");
    if (!e || !*e) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(e, &end, 10);
    return *end || errno || v < 0 ? -1 : (int64_t)v;
}

tsr_status tsr_chat_render_json(const tsr_chat_template *t, const cJSON *ctx,
                                const tsr_chat_opts *o, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!t || t->kind == TSR_CHAT_NONE || !t->jinja)
        return tsr_error_set(TSR_ERR_INVALID, "model has no chat template");
    tsr_chat_opts dflt = {.add_generation_prompt = true, .now = -1};
    if (!o) o = &dflt;
    cJSON *c = cJSON_Duplicate(ctx, true);
    if (!c || !cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return tsr_error_set(TSR_ERR_INVALID, "chat context is not a JSON object");
    }
    const char *fill[][2] = {{"bos_token", t->bos}, {"eos_token", t->eos}};
    for (int i = 0; i < 2; i++)
        if (!cJSON_HasObjectItem(c, fill[i][0])) cJSON_AddStringToObject(c, fill[i][0], fill[i][1]);
    if (!cJSON_HasObjectItem(c, "tools")) cJSON_AddNullToObject(c, "tools");
    if (!cJSON_HasObjectItem(c, "documents")) cJSON_AddNullToObject(c, "documents");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "add_generation_prompt");
    cJSON_AddBoolToObject(c, "add_generation_prompt",
                          o->add_generation_prompt && !o->continue_final);
    tsr_jinja_opts jo = {.now = o->now >= 0 ? o->now : tsr__chat_now()};
    char *r = NULL;
    size_t n = 0;
    tsr_status st = tsr_jinja_render(t->jinja, c, &jo, &r, &n);
    if (st == TSR_OK && o->continue_final) {
        /* transformers' continue_final_message: cut right after the final message */
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
        const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(last, "content");
        if (!cJSON_IsString(content)) {
            st = tsr_error_set(TSR_ERR_INVALID, "continue_final: the last message has no text");
        } else {
            const char *f = content->valuestring;
            size_t fn = strlen(f), b = 0, e = fn;
            while (b < fn && tsr__ws(f[b])) b++;
            while (e > b && tsr__ws(f[e - 1])) e--;
            long loc = tsr__rfind(r, n, f + b, e - b);
            if (loc < 0) {
                st = tsr_error_set(TSR_ERR_INVALID, "continue_final: the final message does not "
                                                    "appear in the rendered chat");
            } else {
                size_t keep;
                /* Python: out[loc:loc+len(lstrip)] == final only when final has no
                 * leading whitespace and the template kept it whole */
                if (b == 0 && (size_t)loc + fn <= n && !memcmp(r + loc, f, fn))
                    keep = (size_t)loc + fn;
                else
                    keep = (size_t)loc + (e - b);
                n = keep;
                r[n] = '\0';
            }
        }
    }
    cJSON_Delete(c);
    if (st != TSR_OK) {
        tsr_free(r);
        return st;
    }
    *out = r;
    *len = n;
    return TSR_OK;
}

tsr_status tsr_chat_render_opts(const tsr_chat_template *t, const tsr_chat_message *msgs,
                                int n, const tsr_chat_opts *o, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!t || t->kind == TSR_CHAT_NONE)
        return tsr_error_set(TSR_ERR_INVALID, "model has no chat template");
    cJSON *ctx = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(ctx, "messages");
    if (!ctx || !arr) {
        cJSON_Delete(ctx);
        return tsr_error_set(TSR_ERR_NOMEM, "chat template: out of memory");
    }
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            cJSON_Delete(ctx);
            return tsr_error_set(TSR_ERR_INVALID, "chat message %d lacks a role or content", i);
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, m);
        cJSON_AddStringToObject(m, "role", msgs[i].role);
        cJSON_AddStringToObject(m, "content", msgs[i].content);
    }
    tsr_status st = tsr_chat_render_json(t, ctx, o, out, len);
    cJSON_Delete(ctx);
    return st;
}

tsr_status tsr_chat_render(const tsr_chat_template *t, const tsr_chat_message *msgs, int n,
                           char **out, size_t *len) {
    tsr_chat_opts o = {.add_generation_prompt = true, .now = -1};
    return tsr_chat_render_opts(t, msgs, n, &o, out, len);
}
