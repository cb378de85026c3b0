/* Chat templates rendered natively in C (no Jinja): a model directory's
 * tokenizer_config.json names its template, and tessera recognises the Llama-3 family by
 * its header/eot markers and renders it the way the Jinja template would. */
#ifndef TSR_RUNTIME_CHAT_TEMPLATE_H
#define TSR_RUNTIME_CHAT_TEMPLATE_H

#include <stddef.h>

#include "base/status.h"

typedef enum tsr_chat_kind {
    TSR_CHAT_NONE = 0, /* the model has no (recognised) chat template */
    TSR_CHAT_LLAMA3,   /* Llama 3 / 3-Instruct: header + content|trim + <|eot_id|> */
    TSR_CHAT_LLAMA31,  /* Llama 3.1+: always a system block with the knowledge-cutoff lines */
} tsr_chat_kind;

typedef struct tsr_chat_template {
    tsr_chat_kind kind;
    char bos[64]; /* the template's bos_token ("<|begin_of_text|>") */
} tsr_chat_template;

typedef struct tsr_chat_message {
    const char *role;
    const char *content;
} tsr_chat_message;

/* Looks for MODEL_DIR/tokenizer_config.json when model_path is a directory. No file, or a
 * file without a chat template: kind TSR_CHAT_NONE and TSR_OK. A template that exists but is
 * not one tessera can render: TSR_ERR_UNSUPPORTED naming the file. */
tsr_status tsr_chat_template_detect(const char *model_path, tsr_chat_template *out);

/* The same from the JSON text of a tokenizer_config.json (`what` names it in errors). */
tsr_status tsr_chat_template_parse(const char *json, size_t len, const char *what,
                                   tsr_chat_template *out);

/* Renders the messages plus the assistant generation header. *out is NUL-terminated and
 * owned by the caller (tsr_free). TSR_ERR_INVALID when kind is TSR_CHAT_NONE. */
tsr_status tsr_chat_render(const tsr_chat_template *t, const tsr_chat_message *msgs, int n,
                           char **out, size_t *len);

#endif
