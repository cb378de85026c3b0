/* runtime/text/harmony.c: the built-in harmony template renders what GPT-OSS's own template
 * renders under jinja2 (tests/data/chat_templates/expected.json, written by
 * tools/chat_template_ref.py) for every conversation of system/developer, user and
 * assistant messages there; the parser finds the final channel in synthetic answers
 * encoded with the o200k test tokenizer (harmony's special tokens, one id each), token by
 * token and over the decoded text alike; the harmony stop tokens end generation. */
#include <cjson/cJSON.h>

#include "base/alloc.h"
#include "base/file.h"
#include "runtime/text/harmony.h"
#include "tests/test.h"

#define TSR__TPL TSR_SOURCE_DIR "/tests/data/chat_templates/"
#define TSR__TOK TSR_SOURCE_DIR "/tests/data/tokenizers/hf/o200k.json"

/* The jinja2 renderings of GPT-OSS's own template (tests/data/chat_templates), or NULL. */
static cJSON *tsr__expected(void) {
    char *text = NULL;
    size_t len = 0;
    if (tsr_file_read(TSR__TPL "expected.json", "test data", 64u << 20, &text, &len) != TSR_OK)
        return NULL;
    cJSON *doc = cJSON_ParseWithLength(text, len);
    tsr_free(text);
    return doc;
}

TSR_TEST(test_harmony_template_matches_gpt_oss) {
    cJSON *doc = tsr__expected();
    ASSERT_TRUE(doc != NULL);
    int64_t now = (int64_t)cJSON_GetObjectItem(doc, "now")->valuedouble;
    tsr_chat_template t;
    ASSERT_OK(tsr_harmony_template(&t));
    int checked = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(doc, "results")) {
        if (strcmp(cJSON_GetObjectItem(r, "template")->valuestring, "openai-gpt-oss-120b.jinja"))
            continue;
        const char *name = cJSON_GetObjectItem(r, "case")->valuestring;
        const cJSON *c = NULL, *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(doc, "cases"))
            if (!strcmp(cJSON_GetObjectItem(it, "name")->valuestring, name)) c = it;
        ASSERT_TRUE(c != NULL);
        /* template variables (model identity, built-in tools) are the model's own
         * template's business */
        const cJSON *extra = cJSON_GetObjectItem(c, "extra");
        if (cJSON_GetArraySize(extra) > 0) continue;
        cJSON *ctx = cJSON_CreateObject();
        cJSON_AddItemToObject(ctx, "messages",
                              cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), true));
        if (!cJSON_IsNull(cJSON_GetObjectItem(c, "tools")))
            cJSON_AddItemToObject(ctx, "tools",
                                  cJSON_Duplicate(cJSON_GetObjectItem(c, "tools"), true));
        tsr_chat_opts o = {
            .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
            .continue_final = cJSON_IsTrue(cJSON_GetObjectItem(c, "continue_final")),
            .now = now};
        char *out = NULL;
        size_t n = 0;
        tsr_status st = tsr_chat_render_json(&t, ctx, &o, &out, &n);
        cJSON_Delete(ctx);
        ASSERT_OK(st);
        const char *want = cJSON_GetObjectItem(r, "output")->valuestring;
        if (strcmp(out, want))
            TSR_FAIL_("case %s: built-in harmony differs:\n%s\n---\n%s", name, out, want);
        tsr_free(out);
        checked++;
    }
    ASSERT_TRUE(checked >= 8); /* with the tool call and tool result cases */
    /* a role harmony has no place for: one line naming it */
    tsr_chat_message m[2] = {{"user", "hi"}, {"ipython", "{}"}};
    char *out = NULL;
    size_t n = 0;
    ASSERT_EQ_INT(tsr_chat_render(&t, m, 2, &out, &n), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "ipython messages need the model's own chat template");
    tsr_chat_template_free(&t);
    cJSON_Delete(doc);
}

/* Renders a context given as JSON text with the built-in template, at expected.json's time. */
static char *tsr__render_ctx(const char *json, int64_t now) {
    tsr_chat_template t;
    if (tsr_harmony_template(&t) != TSR_OK) return NULL;
    cJSON *ctx = cJSON_Parse(json);
    tsr_chat_opts o = {.add_generation_prompt = true, .now = now};
    char *out = NULL;
    size_t n = 0;
    if (!ctx || tsr_chat_render_json(&t, ctx, &o, &out, &n) != TSR_OK) out = NULL;
    cJSON_Delete(ctx);
    tsr_chat_template_free(&t);
    return out;
}

/* Function tools beyond expected.json's cases (which test_harmony_template_matches_gpt_oss
 * renders, calls and results included): harmony's own example of the namespace, arguments
 * given as a string (OpenAI's form: the text the model wrote, kept as is where GPT-OSS's
 * template would quote it), and what harmony cannot say refused with one line. */
TSR_TEST(test_harmony_template_tools) {
    char *out = tsr__render_ctx(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": "
        "\"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": "
        "\"f\", \"arguments\": \"{\\\"n\\\":1}\"}}]}, {\"role\": \"tool\", "
        "\"content\": \"ok\"}]}", 0);
    ASSERT_TRUE(out != NULL);
    ASSERT_STR_CONTAINS(out, "<|start|>user<|message|>Hi<|end|><|start|>assistant to=functions.f"
                             "<|channel|>commentary json<|message|>{\"n\":1}<|call|><|start|>"
                             "functions.f to=assistant<|channel|>commentary<|message|>\"ok\"<|end|>"
                             "<|start|>assistant");
    tsr_free(out);

    /* harmony's own example of the namespace (openai/harmony's format description): a tool
     * without parameters, a default as a comment, an array, a nested object, no system message */
    out = tsr__render_ctx(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": ["
        "{\"type\": \"function\", \"function\": {\"name\": \"get_location\", "
        "\"description\": \"Gets the location of the user.\"}},"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_current_weather\", "
        "\"description\": \"Gets the current weather in the provided location.\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {"
        "\"location\": {\"type\": \"string\", \"description\": \"The city and state, e.g. "
        "San Francisco, CA\"}, \"format\": {\"type\": \"string\", \"enum\": [\"celsius\", "
        "\"fahrenheit\"], \"default\": \"celsius\"}}, \"required\": [\"location\"]}}},"
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {"
        "\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", "
        "\"default\": 3}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
        "\"string\"}}, \"o\": {\"type\": \"object\", \"properties\": {\"b\": {"
        "\"type\": \"boolean\"}}, \"required\": [\"b\"]}}, \"required\": [\"o\"]}}}]}",
        0);
    ASSERT_TRUE(out != NULL);
    const char *dev = strstr(out, "<|start|>developer");
    ASSERT_TRUE(dev != NULL);
    ASSERT_STR_CONTAINS(out, "Channel must be included for every message.\nCalls to these tools "
                             "must go to the commentary channel: 'functions'.<|end|>");
    ASSERT_STR_EQ(dev,
                  "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
                  "// Gets the location of the user.\ntype get_location = () => any;\n\n"
                  "// Gets the current weather in the provided location.\n"
                  "type get_current_weather = (_: {\n"
                  "// The city and state, e.g. San Francisco, CA\nlocation: string,\n"
                  "format?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => any;\n\n"
                  "type f = (_: {\nn?: number, // default: 3\ntags?: string[],\n"
                  "o: {\nb: boolean,\n},\n}) => any;\n\n"
                  "} // namespace functions<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant");
    tsr_free(out);

    /* what harmony cannot say in one message: refused with one line */
    tsr_chat_template t;
    ASSERT_OK(tsr_harmony_template(&t));
    static const char *const bad[] = {
        "{\"messages\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\": ["
        "{\"function\": {\"name\": \"a\", \"arguments\": \"{}\"}}, {\"function\": "
        "{\"name\": \"b\", \"arguments\": \"{}\"}}]}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", "
        "\"content\": \"1\"}]}",
        "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\", \"thinking\": \"b\", "
        "\"tool_calls\": [{\"function\": {\"name\": \"a\", \"arguments\": {}}}]}]}"};
    static const char *const why[] = {"several tool_calls", "no assistant tool call before it",
                                      "both content and thinking"};
    for (int i = 0; i < 3; i++) {
        cJSON *bc = cJSON_Parse(bad[i]);
        tsr_chat_opts o = {.add_generation_prompt = true, .now = 0};
        char *bo = NULL;
        size_t bn = 0;
        ASSERT_EQ_INT(tsr_chat_render_json(&t, bc, &o, &bo, &bn), TSR_ERR_INVALID);
        ASSERT_STR_CONTAINS(tsr_last_error(), why[i]);
        cJSON_Delete(bc);
    }
    tsr_chat_template_free(&t);
}

/* Feeds the answer's tokens one by one: the final channel's text in *got (tsr_free), the
 * last part's kind in *last. */
static void tsr__parse(const tsr_tokenizer *tok, const char *answer, char **got,
                       tsr_harmony_part *last, bool *called) {
    *got = NULL;
    *last = TSR_HARMONY_MARKUP;
    tsr_harmony_ids ids;
    ASSERT_TRUE(tsr_harmony_ids_find(tok, &ids));
    tsr_harmony_parser p;
    tsr_harmony_parser_init(&p, &ids);
    int32_t *t = NULL;
    size_t n = 0;
    ASSERT_OK(tsr_tokenizer_encode(tok, answer, strlen(answer), false, false, &t, &n));
    char *out = tsr_calloc(strlen(answer) + 1, 1);
    size_t len = 0;
    char piece[256];
    int32_t prev = -1;
    *last = TSR_HARMONY_MARKUP;
    for (size_t i = 0; i < n; i++) {
        int nb = tsr_tokenizer_decode(tok, prev, t[i], piece, sizeof piece);
        ASSERT_TRUE(nb >= 0);
        prev = t[i];
        *last = tsr_harmony_feed(&p, t[i], piece, (size_t)nb);
        if (*last == TSR_HARMONY_FINAL) {
            memcpy(out + len, piece, (size_t)nb);
            len += (size_t)nb;
        }
        if (*last == TSR_HARMONY_STOP) break;
    }
    *called = p.called;
    tsr_free(t);
    *got = out;
}

TSR_TEST(test_harmony_parser) {
    tsr_tokenizer *tok = NULL;
    ASSERT_OK(tsr_tokenizer_load(TSR__TOK, &tok));
    static const struct {
        const char *answer, *final;
        bool has_final, called;
        tsr_harmony_part last;
    } cases[] = {
        /* reasoning, then the answer */
        {"<|channel|>analysis<|message|>The user greets. Answer briefly.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
         "Hello! How can I help?", true, false, TSR_HARMONY_STOP},
        /* the answer alone, text after the stop is not the answer */
        {"<|channel|>final<|message|>42<|return|>final words", "42", true, false,
         TSR_HARMONY_STOP},
        /* a tool call: commentary to a recipient with a content type, no final channel */
        {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
         "{\"city\":\"Paris\"}<|call|>",
         "", false, true, TSR_HARMONY_STOP},
        /* cut short while reasoning (max tokens) */
        {"<|channel|>analysis<|message|>Let me think about", "", false, false,
         TSR_HARMONY_OTHER},
        /* cut short in the final channel: what there is */
        {"<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final"
         "<|message|>Par", "Par", true, false, TSR_HARMONY_FINAL},
        /* a channel whose name only starts like final, and one named with a recipient */
        {"<|channel|>finalize<|message|>no<|end|><|start|>assistant<|channel|>final "
         "to=user<|message|>yes<|return|>", "yes", true, false, TSR_HARMONY_STOP},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tsr_harmony_part last = TSR_HARMONY_MARKUP;
        bool called = false;
        char *got = NULL;
        tsr__parse(tok, cases[i].answer, &got, &last, &called);
        ASSERT_TRUE(got != NULL);
        if (strcmp(got, cases[i].final))
            TSR_FAIL_("case %zu: final \"%s\", want \"%s\"", i, got, cases[i].final);
        ASSERT_EQ_INT(last, cases[i].last);
        ASSERT_EQ_INT(called, cases[i].called);
        tsr_free(got);
        /* the same over the decoded text */
        size_t b = 0, n = 0;
        bool found = tsr_harmony_final_span(cases[i].answer, strlen(cases[i].answer), &b, &n);
        ASSERT_EQ_INT(found, cases[i].has_final);
        if (n != strlen(cases[i].final) || memcmp(cases[i].answer + b, cases[i].final, n))
            TSR_FAIL_("case %zu: final span \"%.*s\", want \"%s\"", i, (int)n,
                      cases[i].answer + b, cases[i].final);
    }
    /* harmony's stops end generation, <|endoftext|> too */
    tsr_harmony_ids ids;
    ASSERT_TRUE(tsr_harmony_ids_find(tok, &ids));
    ASSERT_TRUE(tsr_tokenizer_is_eos(tok, ids.ret));
    ASSERT_TRUE(tsr_tokenizer_is_eos(tok, ids.call));
    ASSERT_TRUE(!tsr_tokenizer_is_eos(tok, ids.end));
    int32_t *t = NULL;
    size_t n = 0;
    ASSERT_OK(tsr_tokenizer_encode(tok, "<|endoftext|>", 13, false, false, &t, &n));
    ASSERT_TRUE(n == 1 && tsr_tokenizer_is_eos(tok, t[0]));
    tsr_free(t);
    tsr_tokenizer_destroy(tok);
    /* a vocabulary without the harmony tokens */
    ASSERT_OK(tsr_tokenizer_load(TSR_SOURCE_DIR "/tests/data/tokenizers/hf/llama3.json", &tok));
    ASSERT_TRUE(!tsr_harmony_ids_find(tok, &ids));
    tsr_tokenizer_destroy(tok);
}

/* A whole answer's parts for a `tessera run` record: the final channel, the reasoning (the
 * analysis messages), and a tool call (a message to a recipient ended by <|call|>, in the
 * text or, as `tessera run` sees it, as the stop token that is not). */
TSR_TEST(test_harmony_answer) {
    static const char *const think = "<|channel|>analysis<|message|>Need weather.<|end|>";
    static const struct {
        const char *answer;
        bool called;
        const char *final, *reasoning0, *name, *args;
        int n_reasoning;
    } cases[] = {
        /* reasoning, then the answer: no call */
        {"<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant"
         "<|channel|>final<|message|>Hello!<|return|>",
         false, "Hello!", "The user greets.", NULL, NULL, 1},
        /* a function call on commentary, the recipient after the channel, <|call|> in the text */
        {"@<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
         "<|message|>{\"city\":\"Paris\"}<|call|>",
         false, NULL, "Need weather.", "get_weather", "{\"city\":\"Paris\"}", 1},
        /* the same as `tessera run` has it: the stop token is not in the text */
        {"@<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
         "<|message|>{\"city\":\"Paris\"}",
         true, NULL, "Need weather.", "get_weather", "{\"city\":\"Paris\"}", 1},
        /* cut by max_tokens inside the call's arguments: no call */
        {"@<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
         "<|message|>{\"city\":",
         false, NULL, "Need weather.", NULL, NULL, 1},
        /* the recipient in the header, after the role */
        {"@<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}",
         true, NULL, "Need weather.", "lookup", "{}", 1},
        /* a built-in tool called on the analysis channel: its name whole, not reasoning */
        {"<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"q\":1}<|call|>",
         false, NULL, NULL, "browser.search", "{\"q\":1}", 0},
        /* no recipient ("auto=" is not "to="): ended by <|call|> but no tool call */
        {"<|channel|>commentary auto=x<|message|>hi<|call|>", false, NULL, NULL, NULL, NULL, 0},
        /* two analysis messages, a final one to a recipient ended by <|return|> */
        {"<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis"
         "<|message|>Two.<|end|><|start|>assistant<|channel|>final to=user<|message|>yes"
         "<|return|>",
         false, "yes", "One.", NULL, NULL, 2},
    };
    char buf[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *a = cases[i].answer;
        if (a[0] == '@') { /* after the reasoning */
            snprintf(buf, sizeof buf, "%s%s", think, a + 1);
            a = buf;
        }
        tsr_harmony_answer h;
        tsr_harmony_answer_parse(a, strlen(a), cases[i].called, &h);
        ASSERT_EQ_INT(h.has_final, cases[i].final != NULL);
        if (cases[i].final &&
            (h.final.len != strlen(cases[i].final) ||
             memcmp(a + h.final.begin, cases[i].final, h.final.len)))
            TSR_FAIL_("case %zu: final \"%.*s\"", i, (int)h.final.len, a + h.final.begin);
        ASSERT_EQ_INT(h.n_reasoning, cases[i].n_reasoning);
        if (cases[i].reasoning0 &&
            (h.reasoning[0].len != strlen(cases[i].reasoning0) ||
             memcmp(a + h.reasoning[0].begin, cases[i].reasoning0, h.reasoning[0].len)))
            TSR_FAIL_("case %zu: reasoning \"%.*s\"", i, (int)h.reasoning[0].len,
                      a + h.reasoning[0].begin);
        ASSERT_EQ_INT(h.tool_call, cases[i].name != NULL);
        if (!cases[i].name) continue;
        if (h.tool_name.len != strlen(cases[i].name) ||
            memcmp(a + h.tool_name.begin, cases[i].name, h.tool_name.len) ||
            h.tool_args.len != strlen(cases[i].args) ||
            memcmp(a + h.tool_args.begin, cases[i].args, h.tool_args.len))
            TSR_FAIL_("case %zu: call \"%.*s\" (\"%.*s\")", i, (int)h.tool_name.len,
                      a + h.tool_name.begin, (int)h.tool_args.len, a + h.tool_args.begin);
    }
    /* the second analysis message of the last case */
    const char *a = cases[7].answer;
    tsr_harmony_answer h;
    tsr_harmony_answer_parse(a, strlen(a), false, &h);
    ASSERT_TRUE(h.reasoning[1].len == 4 && !memcmp(a + h.reasoning[1].begin, "Two.", 4));
}

/* tool_choice forced: the prompt (the built-in template's rendering with the forcing text
 * appended) encodes to the rendering's ids, then the header of a call as a past call is
 * rendered, ending with <|message|> (named) or "functions." (required); an answer after a
 * named header, cut by max_tokens, still parses as the call with its arguments so far. */
TSR_TEST(test_harmony_force_call) {
    tsr_tokenizer *tok = NULL;
    ASSERT_OK(tsr_tokenizer_load(TSR__TOK, &tok));
    tsr_harmony_ids ids;
    ASSERT_TRUE(tsr_harmony_ids_find(tok, &ids));
    char *base = tsr__render_ctx(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": "
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]}", 0);
    ASSERT_TRUE(base != NULL);
    char force[256], want[256], small[8];
    ASSERT_TRUE(!tsr_harmony_force_call("get_weather", small, sizeof small));
    for (int named = 0; named < 2; named++) {
        ASSERT_TRUE(tsr_harmony_force_call(named ? "get_weather" : NULL, force, sizeof force));
        ASSERT_STR_EQ(force, named ? " to=functions.get_weather<|channel|>commentary json<|message|>"
                                   : " to=functions.");
        size_t bl = strlen(base), fl = strlen(force);
        char *prompt = tsr_malloc(bl + fl + 1);
        memcpy(prompt, base, bl);
        memcpy(prompt + bl, force, fl + 1);
        int32_t *pb = NULL, *pp = NULL;
        size_t nb = 0, np = 0;
        ASSERT_OK(tsr_tokenizer_encode(tok, base, bl, false, false, &pb, &nb));
        ASSERT_OK(tsr_tokenizer_encode(tok, prompt, bl + fl, false, false, &pp, &np));
        /* the rendering's ids (ending with <|start|>assistant) unchanged, then the header */
        ASSERT_TRUE(np > nb && !memcmp(pp, pb, nb * sizeof *pb));
        size_t len = 0;
        char piece[256];
        for (size_t i = nb; i < np; i++) {
            int n = tsr_tokenizer_decode(tok, pp[i - 1], pp[i], piece, sizeof piece);
            ASSERT_TRUE(n >= 0 && len + (size_t)n < sizeof want);
            memcpy(want + len, piece, (size_t)n);
            len += (size_t)n;
        }
        want[len] = '\0';
        ASSERT_STR_EQ(want, force);
        if (named) {
            ASSERT_EQ_INT(pp[np - 1], ids.message);
            int channels = 0; /* <|channel|> as its one special id */
            for (size_t i = nb; i < np; i++) channels += pp[i] == ids.channel;
            ASSERT_EQ_INT(channels, 1);
        }
        tsr_free(pb);
        tsr_free(pp);
        tsr_free(prompt);
    }
    tsr_free(base);
    tsr_tokenizer_destroy(tok);
    /* the answer's text begins with the forced header; cut inside the arguments */
    const char *a = " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Pa";
    tsr_harmony_answer h;
    tsr_harmony_answer_parse(a, strlen(a), true, &h);
    ASSERT_TRUE(h.tool_call && !h.has_final);
    ASSERT_TRUE(h.tool_name.len == 11 && !memcmp(a + h.tool_name.begin, "get_weather", 11));
    ASSERT_STR_EQ(a + h.tool_args.begin, "{\"city\": \"Pa");
}

TSR_TEST_MAIN(test_harmony_template_matches_gpt_oss, test_harmony_template_tools, test_harmony_parser, test_harmony_answer, test_harmony_force_call)
