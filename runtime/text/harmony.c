/* The harmony chat format (harmony.h). */
#include "runtime/text/harmony.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

/* What GPT-OSS's template (its chat_template.jinja) renders for system, developer, user and
 * assistant messages and function tools, the same text with its own macros (ts_type: a JSON
 * schema as a TypeScript-like type; ts_props: an object's properties, one a line); tool calls
 * and results as harmony renders them (harmony.h); anything else is refused rather than
 * rendered differently. */
static const char tsr__harmony_src[] =
    "{%- macro ts_type(s) -%}"
    "{%- if s.enum is defined -%}{%- for v in s.enum -%}{{- \" | \" if not loop.first -}}"
    "{{- v | tojson -}}{%- endfor -%}"
    "{%- elif s.anyOf is defined -%}{%- for a in s.anyOf -%}{{- \" | \" if not loop.first -}}"
    "{{- ts_type(a) -}}{%- endfor -%}"
    "{%- elif s.oneOf is defined -%}{%- for a in s.oneOf -%}{{- \" | \" if not loop.first -}}"
    "{{- ts_type(a) -}}{%- endfor -%}"
    "{%- elif s.type is defined and s.type is not string -%}{%- for t in s.type -%}"
    "{{- \" | \" if not loop.first -}}{{- ts_type({\"type\": t}) -}}{%- endfor -%}"
    "{%- elif s.type == \"string\" or s.type == \"boolean\" or s.type == \"null\" -%}{{- s.type -}}"
    "{%- elif s.type == \"number\" or s.type == \"integer\" -%}{{- \"number\" -}}"
    "{%- elif s.type == \"array\" -%}"
    "{{- (ts_type(s[\"items\"]) if s[\"items\"] is defined else \"any\") + \"[]\" -}}"
    "{%- elif s.type == \"object\" and s.properties is defined -%}"
    "{{- \"{\\n\" + ts_props(s) + \"}\" -}}"
    "{%- elif s.type == \"object\" -%}{{- \"object\" -}}"
    "{%- else -%}{{- \"any\" -}}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro ts_props(s) -%}"
    "{%- set req = s.required if s.required is defined else [] -%}"
    "{%- for name, p in s.properties.items() -%}"
    "{%- if p.description is defined and p.description -%}"
    "{%- for line in p.description.split(\"\\n\") -%}{{- \"// \" + line + \"\\n\" -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- name + (\"\" if name in req else \"?\") + \": \" + ts_type(p) + \",\" -}}"
    "{%- if p.default is defined -%}"
    "{{- \" // default: \" + (p.default if p.default is string else p.default | tojson) -}}"
    "{%- endif -%}"
    "{{- \"\\n\" -}}"
    "{%- endfor -%}"
    "{%- endmacro -%}"
    "{%- if reasoning_effort is not defined %}{%- set reasoning_effort = \"medium\" %}{%- endif %}"
    "{{- \"<|start|>system<|message|>\" }}"
    "{{- \"You are ChatGPT, a large language model trained by OpenAI.\\n\" }}"
    "{{- \"Knowledge cutoff: 2024-06\\n\" }}"
    "{{- \"Current date: \" + strftime_now(\"%Y-%m-%d\") + \"\\n\\n\" }}"
    "{{- \"Reasoning: \" + reasoning_effort + \"\\n\\n\" }}"
    "{{- \"# Valid channels: analysis, commentary, final. Channel must be included for every message.\" }}"
    "{%- if tools %}"
    "{{- \"\\nCalls to these tools must go to the commentary channel: 'functions'.\" }}{%- endif %}"
    "{{- \"<|end|>\" }}"
    "{%- if messages[0].role == \"developer\" or messages[0].role == \"system\" %}"
    "{%- set developer_message = messages[0].content %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set developer_message = \"\" %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- if developer_message or tools %}"
    "{{- \"<|start|>developer<|message|>\" }}"
    "{%- if developer_message %}{{- \"# Instructions\\n\\n\" + developer_message + \"\\n\\n\" }}"
    "{%- endif %}"
    "{%- if tools %}"
    "{{- \"# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n\" }}"
    "{%- for t in tools %}"
    "{%- set f = t.function if t.function is defined else t %}"
    "{%- if f.description is defined and f.description %}"
    "{%- for line in f.description.split(\"\\n\") %}{{- \"// \" + line + \"\\n\" }}{%- endfor %}"
    "{%- endif %}"
    "{%- if f.parameters is defined and f.parameters.properties is defined and f.parameters.properties %}"
    "{{- \"type \" + f.name + \" = (_: {\\n\" + ts_props(f.parameters) + \"}) => any;\\n\\n\" }}"
    "{%- else %}"
    "{{- \"type \" + f.name + \" = () => any;\\n\\n\" }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- \"} // namespace functions\" }}"
    "{%- endif %}"
    "{{- \"<|end|>\" }}"
    "{%- endif %}"
    "{%- set ns = namespace(call=\"\") %}"
    "{%- for message in loop_messages -%}"
    "{%- if message.role == 'assistant' and message.tool_calls is defined and message.tool_calls -%}"
    "{%- if message.tool_calls | length > 1 -%}"
    "{{- raise_exception(\"an assistant message with several tool_calls (harmony has one call per message; give each its own assistant message)\") }}"
    "{%- endif -%}"
    "{%- set later = namespace(final=false) -%}"
    "{%- for m in loop_messages[loop.index:] -%}"
    "{%- if m.role == 'assistant' and not (m.tool_calls is defined and m.tool_calls) -%}"
    "{%- set later.final = true -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set thinking = message.thinking if message.thinking is defined and message.thinking else \"\" -%}"
    "{%- if message.content and thinking -%}"
    "{{- raise_exception(\"an assistant message with tool_calls and both content and thinking (harmony keeps one analysis message beside a call)\") }}"
    "{%- endif -%}"
    "{%- if (message.content or thinking) and not later.final -%}"
    "{{- \"<|start|>assistant<|channel|>analysis<|message|>\" + (message.content or thinking) + \"<|end|>\" }}"
    "{%- endif -%}"
    "{%- set c = message.tool_calls[0].function if message.tool_calls[0].function is defined else message.tool_calls[0] -%}"
    "{%- set ns.call = c.name -%}"
    "{{- \"<|start|>assistant to=functions.\" + c.name + \"<|channel|>commentary json<|message|>\" }}"
    "{{- c.arguments if c.arguments is string else c.arguments | tojson }}"
    "{{- \"<|call|>\" }}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set ns.call = \"\" -%}"
    "{%- if loop.last and not add_generation_prompt %}"
    "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|return|>\" }}"
    "{%- else %}"
    "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}"
    "{%- endif %}"
    "{%- elif message.role == 'user' -%}"
    "{{- \"<|start|>user<|message|>\" + message.content + \"<|end|>\" }}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if not ns.call -%}"
    "{{- raise_exception(\"a tool message with no assistant tool call before it (its result is named by the last call)\") }}"
    "{%- endif -%}"
    "{{- \"<|start|>functions.\" + ns.call + \" to=assistant<|channel|>commentary<|message|>\" + message.content | tojson + \"<|end|>\" }}"
    "{%- else -%}"
    "{{- raise_exception(\"the built-in harmony template renders system, developer, user, assistant and tool messages only (\" + message.role + \" messages need the model's own chat template)\") }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|start|>assistant"
    "{%- endif -%}";

tsr_status tsr_harmony_template(tsr_chat_template *out) {
    return tsr_chat_template_from_source(tsr__harmony_src, sizeof tsr__harmony_src - 1,
                                         "<|startoftext|>", "<|return|>",
                                         "the built-in harmony template", out);
}

bool tsr_harmony_force_call(const char *name, char *out, size_t cap) {
    int n = name ? snprintf(out, cap, " to=functions.%s<|channel|>commentary json<|message|>", name)
                 : snprintf(out, cap, " to=functions.");
    return n >= 0 && (size_t)n < cap;
}

/* The id of a special token: its text must encode to exactly one id. */
static bool tsr__one_id(const tsr_tokenizer *t, const char *text, int32_t *out) {
    int32_t *ids = NULL;
    size_t n = 0;
    bool ok = tsr_tokenizer_encode(t, text, strlen(text), false, false, &ids, &n) == TSR_OK &&
              n == 1;
    if (ok) *out = ids[0];
    tsr_free(ids);
    return ok;
}

bool tsr_harmony_ids_find(const tsr_tokenizer *t, tsr_harmony_ids *out) {
    memset(out, 0xff, sizeof *out);
    if (!t) return false;
    return tsr__one_id(t, "<|start|>", &out->start) && tsr__one_id(t, "<|end|>", &out->end) &&
           tsr__one_id(t, "<|message|>", &out->message) &&
           tsr__one_id(t, "<|channel|>", &out->channel) &&
           tsr__one_id(t, "<|constrain|>", &out->constrain) &&
           tsr__one_id(t, "<|return|>", &out->ret) && tsr__one_id(t, "<|call|>", &out->call);
}

enum {
    TSR__H_HEADER = 0, /* after <|start|>: the role (and a recipient), until a channel */
    TSR__H_CHANNEL,    /* after <|channel|>: the channel's name */
    TSR__H_CONSTRAIN,  /* after <|constrain|>: a content type, until <|message|> */
    TSR__H_CONTENT,    /* after <|message|>: the message's text */
    TSR__H_BETWEEN,    /* after <|end|>: until the next <|start|> */
    TSR__H_DONE,       /* after <|return|> or <|call|> */
};

void tsr_harmony_parser_init(tsr_harmony_parser *p, const tsr_harmony_ids *ids) {
    memset(p, 0, sizeof *p);
    p->ids = *ids;
    p->state = TSR__H_HEADER;
}

/* The channel is "final" when its name's first word is (a recipient may follow it). */
static bool tsr__is_final(const tsr_harmony_parser *p) {
    size_t i = 0;
    while (i < p->channel_len && p->channel[i] == ' ') i++;
    size_t b = i;
    while (i < p->channel_len && p->channel[i] != ' ') i++;
    return i - b == 5 && !memcmp(p->channel + b, "final", 5);
}

tsr_harmony_part tsr_harmony_feed(tsr_harmony_parser *p, int32_t id, const char *piece,
                                  size_t n) {
    const tsr_harmony_ids *k = &p->ids;
    if (p->state == TSR__H_DONE) return TSR_HARMONY_MARKUP;
    if (id == k->ret || id == k->call) {
        p->called = id == k->call;
        p->state = TSR__H_DONE;
        return TSR_HARMONY_STOP;
    }
    if (id == k->start) {
        p->state = TSR__H_HEADER;
        p->channel_len = 0;
        return TSR_HARMONY_MARKUP;
    }
    if (id == k->channel) {
        p->state = TSR__H_CHANNEL;
        p->channel_len = 0;
        return TSR_HARMONY_MARKUP;
    }
    if (id == k->constrain) {
        p->state = TSR__H_CONSTRAIN;
        return TSR_HARMONY_MARKUP;
    }
    if (id == k->message) {
        p->state = TSR__H_CONTENT;
        return TSR_HARMONY_MARKUP;
    }
    if (id == k->end) {
        p->state = TSR__H_BETWEEN;
        return TSR_HARMONY_MARKUP;
    }
    switch (p->state) {
    case TSR__H_CHANNEL:
        for (size_t i = 0; i < n && p->channel_len < sizeof p->channel - 1; i++)
            p->channel[p->channel_len++] = piece[i];
        p->channel[p->channel_len] = '\0';
        return TSR_HARMONY_MARKUP;
    case TSR__H_CONTENT: return tsr__is_final(p) ? TSR_HARMONY_FINAL : TSR_HARMONY_OTHER;
    default: return TSR_HARMONY_MARKUP; /* a role, a recipient, a content type */
    }
}

/* The channel's first word in raw[b, e) (a recipient or content type may follow it). */
static bool tsr__word_is(const char *raw, size_t b, size_t e, const char *word) {
    while (b < e && raw[b] == ' ') b++;
    size_t w = b;
    while (w < e && raw[w] != ' ') w++;
    size_t L = strlen(word);
    return w - b == L && !memcmp(raw + b, word, L);
}

/* The recipient named by "to=NAME" in raw[b, e) (NAME ends at a space), "functions." cut
 * from a function tool's name. False when there is none. */
static bool tsr__recipient(const char *raw, size_t b, size_t e, tsr_harmony_span *name) {
    for (size_t i = b; i + 3 <= e; i++) {
        if (memcmp(raw + i, "to=", 3) || (i > b && raw[i - 1] != ' ')) continue;
        size_t s = i + 3, t = s;
        while (t < e && raw[t] != ' ') t++;
        if (t - s > 10 && !memcmp(raw + s, "functions.", 10)) s += 10;
        if (t == s) return false;
        *name = (tsr_harmony_span){s, t - s};
        return true;
    }
    return false;
}

void tsr_harmony_answer_parse(const char *raw, size_t n, bool called, tsr_harmony_answer *out) {
    static const char *const marks[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                        "<|return|>", "<|call|>", "<|constrain|>"};
    enum { START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN };
    int state = TSR__H_HEADER;
    /* the current message: its header (the role, after the prompt's `<|start|>` for the
     * first), channel name and body */
    size_t hdr = 0, hdr_len = 0, ch = 0, ch_len = 0, body = 0;
    bool final = false, analysis = false, to = false;
    tsr_harmony_span name = {0, 0};
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i <= n;) {
        int m = -1;
        if (i < n && raw[i] == '<')
            for (int k = 0; k < (int)(sizeof marks / sizeof marks[0]) && m < 0; k++) {
                size_t L = strlen(marks[k]);
                if (L <= n - i && !memcmp(raw + i, marks[k], L)) m = k;
            }
        if (i == n || m >= 0) {
            /* a header, a channel name or a message body ends here */
            if (state == TSR__H_HEADER) hdr_len = i - hdr;
            if (state == TSR__H_CHANNEL) ch_len = i - ch;
            if (state == TSR__H_CONTENT) {
                tsr_harmony_span text = {body, i - body};
                if (final) {
                    out->final = text;
                    out->has_final = true;
                }
                if (analysis && !to && out->n_reasoning < TSR_HARMONY_MAX_REASONING)
                    out->reasoning[out->n_reasoning++] = text;
                if ((m == CALL || (i == n && called)) && to) {
                    out->tool_call = true;
                    out->tool_name = name;
                    out->tool_args = text;
                }
            }
            if (i == n) break;
        }
        if (m < 0) {
            i++;
            continue;
        }
        i += strlen(marks[m]);
        switch (m) {
        case CHANNEL: state = TSR__H_CHANNEL; ch = i; ch_len = 0; break;
        case CONSTRAIN: state = TSR__H_CONSTRAIN; break;
        case MESSAGE:
            final = tsr__word_is(raw, ch, ch + ch_len, "final"); /* no channel: not final */
            analysis = tsr__word_is(raw, ch, ch + ch_len, "analysis");
            to = tsr__recipient(raw, hdr, hdr + hdr_len, &name) ||
                 tsr__recipient(raw, ch, ch + ch_len, &name);
            state = TSR__H_CONTENT;
            body = i;
            break;
        case START: state = TSR__H_HEADER; hdr = i; hdr_len = ch_len = 0; break;
        case END: state = TSR__H_BETWEEN; break;
        default: state = TSR__H_DONE; break; /* return, call */
        }
        if (state == TSR__H_DONE) break;
    }
}

bool tsr_harmony_final_span(const char *raw, size_t n, size_t *begin, size_t *len) {
    tsr_harmony_answer a;
    tsr_harmony_answer_parse(raw, n, false, &a);
    *begin = a.final.begin;
    *len = a.final.len;
    return a.has_final;
}
