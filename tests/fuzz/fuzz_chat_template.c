/* libFuzzer target: chat templates (runtime/text/chat_template.c). The input is
 * [uint16 LE n][n bytes of tokenizer_config.json][messages], the messages being
 * NUL-separated role, content, role, content, ... (at most 16); a template that parses is
 * rendered with them. */
#include "tests/fuzz/fuzz_util.h"

#include "base/alloc.h"
#include "runtime/text/chat_template.h"

#define TSR__MAX_MSGS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *cfg, *rest;
    size_t cfg_len, rest_len;
    tsr_fuzz_split(data, size, &cfg, &cfg_len, &rest, &rest_len);
    char *json = tsr_fuzz_copy(cfg, cfg_len);
    tsr_chat_template t;
    tsr_status st = tsr_chat_template_parse(json, cfg_len, "fuzz", &t);
    free(json);
    if (st != TSR_OK || t.kind == TSR_CHAT_NONE) {
        if (t.jinja) abort(); /* a refusal leaves nothing behind */
        return 0;
    }
    /* NUL-terminated copy of the message strings. */
    char *buf = malloc(rest_len + 1);
    if (!buf) abort();
    memcpy(buf, rest, rest_len);
    buf[rest_len] = 0;
    const char *strs[2 * TSR__MAX_MSGS];
    int n_strs = 0;
    for (size_t off = 0; off <= rest_len && n_strs < 2 * TSR__MAX_MSGS;) {
        strs[n_strs++] = buf + off;
        off += strlen(buf + off) + 1;
    }
    tsr_chat_message msgs[TSR__MAX_MSGS];
    int n = n_strs / 2;
    for (int i = 0; i < n; i++) msgs[i] = (tsr_chat_message){strs[2 * i], strs[2 * i + 1]};
    char *out = NULL;
    size_t len = 0;
    if (tsr_chat_render(&t, msgs, n, &out, &len) == TSR_OK) {
        if (strlen(out) != len) abort(); /* the length returned is the string's */
        tsr_free(out);
    }
    free(buf);
    tsr_chat_template_free(&t);
    return 0;
}
