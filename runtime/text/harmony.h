/* The harmony chat format of GPT-OSS (OpenAI's openai/harmony; the model's own chat
 * template renders the same): a message is
 *   <|start|>ROLE[<|channel|>CHANNEL]<|message|>CONTENT<|end|>
 * a prompt ends with `<|start|>assistant`, and the model answers with one or more messages
 * (typically an `analysis` one, then `<|start|>assistant<|channel|>final<|message|>...`),
 * the last ended by <|return|> (done) or <|call|> (a tool call). The completion a user wants
 * is the text of the `final` channel; the rest is the raw text.
 *
 * Here: the built-in harmony template (for a GPT-OSS model whose directory carries no chat
 * template), the special tokens' ids in a tokenizer, and a streaming parser of the
 * generated tokens that says which token belongs to the final channel. */
#ifndef TSR_RUNTIME_HARMONY_H
#define TSR_RUNTIME_HARMONY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

/* The built-in harmony template (a Jinja source run by runtime/text/jinja.c): the system
 * message of GPT-OSS's own template (model identity, knowledge cutoff 2024-06, the current
 * date, "Reasoning: medium" unless reasoning_effort is given, the valid channels, and with
 * `tools` the line sending their calls to the commentary channel), a leading system or
 * developer message as the developer message ("# Instructions\n\n..."), then `tools`
 * (OpenAI function tools) as its "# Tools" section: `namespace functions { ... }` with one
 * TypeScript-like type per function from its JSON schema (descriptions as `//` lines,
 * optional properties with `?`, enums as unions, defaults as comments); user messages,
 * earlier assistant turns in the final channel, an assistant's tool call as
 * `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`
 * (ARGS: an object as tojson writes it, a string as is) after its content or `thinking` as
 * an analysis message unless a final answer follows later, a tool's result as
 * `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"TEXT"<|end|>` (the
 * text quoted by tojson; NAME: the last call's), then `<|start|>assistant`. Byte for byte
 * what the model's template renders (tested on tests/data/chat_templates' cases, tool calls
 * and results included), except string arguments, which the template would quote. Several
 * calls in one message (the template drops all but the first), both content and thinking
 * beside a call, a tool message with no call before it and other roles are refused by
 * name. */
tsr_status tsr_harmony_template(tsr_chat_template *out);

/* The text that forces a tool call when appended to a rendered prompt (which ends with
 * `<|start|>assistant`), in the header form of a past call above: with a function name,
 * ` to=functions.NAME<|channel|>commentary json<|message|>` (the model writes only the
 * arguments); with NULL (tool_choice "required"), ` to=functions.` (the model completes the
 * recipient with a function's name, then the channel and arguments as it would unforced).
 * Written to out (cap bytes with its '\0'); false when it does not fit. */
bool tsr_harmony_force_call(const char *name, char *out, size_t cap);

/* The harmony special tokens of a tokenizer (each must encode to one id). */
typedef struct tsr_harmony_ids {
    int32_t start, end, message, channel, constrain, ret, call;
} tsr_harmony_ids;

/* True when the tokenizer has every harmony special token (ids in *out). */
bool tsr_harmony_ids_find(const tsr_tokenizer *t, tsr_harmony_ids *out);

/* What a generated token is, for the output. */
typedef enum tsr_harmony_part {
    TSR_HARMONY_MARKUP = 0, /* a special token, a role, a channel name: not content */
    TSR_HARMONY_FINAL,      /* content of the final channel: the completion */
    TSR_HARMONY_OTHER,      /* content of another channel (analysis, commentary) */
    TSR_HARMONY_STOP,       /* <|return|> or <|call|>: the answer is over */
} tsr_harmony_part;

/* The parser's state over one answer, from just after the prompt's `<|start|>assistant`
 * (a header: the model writes `<|channel|>NAME<|message|>` next). */
typedef struct tsr_harmony_parser {
    tsr_harmony_ids ids;
    int state;          /* internal */
    char channel[32];   /* the current message's channel name (cut at 31 bytes) */
    size_t channel_len;
    bool called;        /* ended by <|call|> */
} tsr_harmony_parser;

void tsr_harmony_parser_init(tsr_harmony_parser *p, const tsr_harmony_ids *ids);
/* One generated token, with its decoded text (piece, n bytes; for the channel name). */
tsr_harmony_part tsr_harmony_feed(tsr_harmony_parser *p, int32_t id, const char *piece,
                                  size_t n);

/* The same over a whole decoded answer (special tokens as their text, e.g. a `tessera run`
 * record's raw text): the span [*begin, *begin + *len) of raw holding the text of its
 * final-channel messages' content, the last one when there are several. False when no
 * final-channel message started (an answer cut short while reasoning, a tool call): the
 * completion is then empty. An unfinished final message counts up to the end of raw. */
bool tsr_harmony_final_span(const char *raw, size_t n, size_t *begin, size_t *len);

/* A part of a decoded answer: raw[begin, begin + len). */
typedef struct tsr_harmony_span {
    size_t begin, len;
} tsr_harmony_span;

/* Analysis messages an answer's parse keeps (more are dropped: a GPT-OSS answer has one per
 * turn). */
#define TSR_HARMONY_MAX_REASONING 8

/* What a `tessera run` chat record is made of (tsr_harmony_answer_parse). */
typedef struct tsr_harmony_answer {
    bool has_final;         /* a final-channel message started (tsr_harmony_final_span) */
    tsr_harmony_span final; /* its text, the last one when there are several */
    /* the text of the analysis-channel messages (the reasoning), in order; not those to a
     * recipient (a built-in tool's call on the analysis channel) */
    tsr_harmony_span reasoning[TSR_HARMONY_MAX_REASONING];
    int n_reasoning;
    /* A tool call: the answer ended with <|call|> after a message with a recipient
     * (`to=functions.NAME`, in the header after the role or after the channel's name). */
    bool tool_call;
    tsr_harmony_span tool_name; /* NAME, without the "functions." of function tools */
    tsr_harmony_span tool_args; /* the message's text: the arguments as the model wrote them */
} tsr_harmony_answer;

/* Parses a whole decoded answer (special tokens as their text) into *out. An unfinished
 * message counts up to the end of raw. `called`: generation ended with <|call|>, which raw
 * does not hold (a stop token is not part of the text; `tessera run`), so raw ends as if it
 * were there. */
void tsr_harmony_answer_parse(const char *raw, size_t n, bool called, tsr_harmony_answer *out);

#endif
