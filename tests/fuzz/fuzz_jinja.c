/* libFuzzer target: the Jinja interpreter (runtime/text/jinja.c). The input is
 * [uint16 LE n][n bytes of template][context JSON]; a template that compiles is rendered
 * with the context when that parses as a JSON object, else with a fixed chat context.
 * Limits are kept small (1 MiB output, 32 MiB of values) so that every input runs fast;
 * reaching one is a refusal, not a finding. */
#include "tests/fuzz/fuzz_util.h"

#include <cjson/cJSON.h>

#include "base/alloc.h"
#include "runtime/text/jinja.h"

static const char tsr__ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": "
    "[{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}], \"tools\": null, "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *tpl, *rest;
    size_t tpl_len, rest_len;
    tsr_fuzz_split(data, size, &tpl, &tpl_len, &rest, &rest_len);
    tsr_jinja *t = NULL;
    if (tsr_jinja_parse((const char *)tpl, tpl_len, "fuzz", &t) != TSR_OK) {
        if (t) abort(); /* a refusal leaves nothing behind */
        if (!strchr(tsr_last_error(), ':') || strchr(tsr_last_error(), '\n')) abort();
        return 0;
    }
    cJSON *ctx = cJSON_ParseWithLength((const char *)rest, rest_len);
    if (!cJSON_IsObject(ctx)) {
        cJSON_Delete(ctx);
        ctx = cJSON_Parse(tsr__ctx);
    }
    tsr_jinja_opts o = {.now = 1721995200, .max_output = 1u << 20, .max_memory = 32u << 20};
    char *out = NULL;
    size_t len = 0;
    if (tsr_jinja_render(t, ctx, &o, &out, &len) == TSR_OK) {
        if (len > o.max_output) abort();
        tsr_free(out);
    } else if (out) {
        abort();
    }
    cJSON_Delete(ctx);
    tsr_jinja_free(t);
    return 0;
}
