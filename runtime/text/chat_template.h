/* Chat templates: the model's own Jinja template (tokenizer_config.json's chat_template,
 * or a string handed over by a loader, e.g. GGUF's tokenizer.chat_template) rendered by
 * runtime/text/jinja.c exactly as transformers' apply_chat_template renders it. The Llama-3.1
 * template text is built in as a fallback for callers that know the model is a Llama-3
 * instruct model but have no template string. */
#ifndef TSR_RUNTIME_CHAT_TEMPLATE_H
#define TSR_RUNTIME_CHAT_TEMPLATE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum tsr_chat_kind {
    TSR_CHAT_NONE = 0, /* the model has no chat template */
    TSR_CHAT_JINJA,    /* a compiled Jinja template */
} tsr_chat_kind;

struct tsr_jinja;

typedef struct tsr_chat_template {
    tsr_chat_kind kind;
    char bos[64];             /* bos_token given to the template ("" if none) */
    char eos[64];             /* eos_token */
    struct tsr_jinja *jinja;  /* owned; NULL when kind is TSR_CHAT_NONE */
    uint64_t source_hash;     /* FNV-1a of the template text (checkpoint identity) */
} tsr_chat_template;

typedef struct tsr_chat_message {
    const char *role;
    const char *content;
} tsr_chat_message;

/* Looks for MODEL_DIR/tokenizer_config.json when model_path is a directory. No file, or a
 * file without a chat template: kind TSR_CHAT_NONE and TSR_OK. A template that uses a
 * construct tessera's Jinja lacks: TSR_ERR_UNSUPPORTED with a line naming it and its
 * line:col. Free with tsr_chat_template_free. */
tsr_status tsr_chat_template_detect(const char *model_path, tsr_chat_template *out);

/* The same from the JSON text of a tokenizer_config.json (`what` names it in errors). */
tsr_status tsr_chat_template_parse(const char *json, size_t len, const char *what,
                                   tsr_chat_template *out);

/* From a template string (e.g. GGUF metadata); bos/eos may be NULL ("" then). source NULL:
 * the built-in Llama-3.1 template (bos "<|begin_of_text|>", eos "<|eot_id|>" unless
 * given). */
tsr_status tsr_chat_template_from_source(const char *source, size_t len, const char *bos,
                                         const char *eos, const char *what,
                                         tsr_chat_template *out);

void tsr_chat_template_free(tsr_chat_template *t);

/* Rendering options. add_generation_prompt: the template's assistant header after the
 * messages. continue_final: the last message is an assistant prefix to continue:
 * rendered without the generation prompt and cut right after that message's (stripped)
 * content, as transformers' continue_final_message does. now: strftime_now's time
 * (seconds since the epoch, UTC), < 0: SOURCE_DATE_EPOCH from the environment where it is a
 * non-negative integer, else the current local time. */
typedef struct tsr_chat_opts {
    bool add_generation_prompt;
    bool continue_final;
    int64_t now;
} tsr_chat_opts;

/* Renders the messages. *out is NUL-terminated and owned by the caller (tsr_free).
 * TSR_ERR_INVALID when kind is TSR_CHAT_NONE or when the template refuses the messages
 * (raise_exception: the message is in the error line). */
tsr_status tsr_chat_render_opts(const tsr_chat_template *t, const tsr_chat_message *msgs,
                                int n, const tsr_chat_opts *o, char **out, size_t *len);

/* The same with a full context object (messages with tool_calls, tools, extra template
 * variables): ctx's members are the template's variables; bos_token/eos_token are added
 * when ctx lacks them. */
tsr_status tsr_chat_render_json(const tsr_chat_template *t, const cJSON *ctx,
                                const tsr_chat_opts *o, char **out, size_t *len);

/* add_generation_prompt on, current time. */
tsr_status tsr_chat_render(const tsr_chat_template *t, const tsr_chat_message *msgs, int n,
                           char **out, size_t *len);

#endif
