/* OpenAI batch JSONL: every bad-line case, the output record shapes, the resume scan of a
 * truncated output file, the errors-file rebuild, and the chat template. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jobs/run/batch_io.h"
#include "base/alloc.h"
#include "runtime/text/chat_template.h"
#include "tests/test.h"

/* Parses `line`; returns the error code ("" when valid) and keeps custom_id presence. */
static const char *parse_code(const char *line, bool *has_id) {
    static tsr_batch_error e;
    tsr_batch_request r;
    tsr_status st = tsr_batch_parse_line(line, strlen(line), 7, &r, &e);
    *has_id = r.custom_id != NULL;
    tsr_batch_request_free(&r);
    if (st == TSR_OK) return "";
    return e.code;
}

TSR_TEST(test_parse_valid_completion_and_defaults) {
    const char *l = "{\"custom_id\":\"r1\",\"method\":\"POST\",\"url\":\"/v1/completions\","
                    "\"body\":{\"prompt\":\"Once\",\"stop\":[\"\\n\",\"The end\"],\"seed\":-3}}";
    tsr_batch_request r;
    tsr_batch_error e;
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_STR_EQ(r.custom_id, "r1");
    ASSERT_EQ_INT(r.kind, TSR_BATCH_COMPLETION);
    ASSERT_STR_EQ(r.prompt, "Once");
    ASSERT_EQ_INT(r.max_tokens, 16);
    ASSERT_NEAR(r.temperature, 1.0, 0);
    ASSERT_NEAR(r.top_p, 1.0, 0);
    ASSERT_TRUE(r.has_seed);
    ASSERT_EQ_INT((int64_t)r.seed, -3);
    ASSERT_EQ_INT(r.n_stops, 2);
    ASSERT_STR_EQ(r.stops[0], "\n");
    ASSERT_STR_EQ(r.stops[1], "The end");
    tsr_batch_request_free(&r);

    const char *c = "{\"custom_id\":\"c1\",\"url\":\"/v1/chat/completions\",\"body\":{"
                    "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
                    "{\"type\":\"text\",\"text\":\"there\"}]}],\"max_tokens\":3,"
                    "\"temperature\":0,\"top_p\":0.5,\"stop\":\"x\"}}";
    ASSERT_OK(tsr_batch_parse_line(c, strlen(c), 2, &r, &e));
    ASSERT_EQ_INT(r.kind, TSR_BATCH_CHAT);
    ASSERT_EQ_INT(r.n_messages, 2);
    ASSERT_STR_EQ(r.messages[0].role, "system");
    ASSERT_STR_EQ(r.messages[1].content, "Hi there");
    ASSERT_EQ_INT(r.max_tokens, 3);
    ASSERT_NEAR(r.temperature, 0.0, 0);
    ASSERT_NEAR(r.top_p, 0.5, 1e-7);
    ASSERT_EQ_INT(r.n_stops, 1);
    ASSERT_TRUE(!r.has_seed);
    ASSERT_TRUE(r.chat_ctx == NULL); /* no tools: the plain messages */
    tsr_batch_request_free(&r);
}

/* A chat body's tools and tool messages become the template's context; tool_choice "none"
 * drops the tools, "required" and a named function mark the request to be forced; malformed
 * tools or tool_choice (a function not in tools) are invalid_tools, malformed tool_calls
 * invalid_messages. */
TSR_TEST(test_parse_chat_tools) {
#define TSR__T "{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{}}}"
#define TSR__L(body) "{\"custom_id\":\"t\",\"url\":\"/v1/chat/completions\",\"body\":{" body "}}"
#define TSR__U "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"
    tsr_batch_request r;
    tsr_batch_error e;
    const char *l = TSR__L(TSR__U ",\"tools\":[" TSR__T "]");
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_TRUE(r.chat_ctx != NULL);
    ASSERT_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(r.chat_ctx, "tools")), 1);
    ASSERT_STR_EQ(cJSON_GetArrayItem(cJSON_GetObjectItem(r.chat_ctx, "messages"), 0)
                      ->child->next->valuestring, "Hi");
    tsr_batch_request_free(&r);
    l = TSR__L(TSR__U ",\"tools\":[" TSR__T "],\"tool_choice\":\"none\"");
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_TRUE(r.chat_ctx == NULL);
    tsr_batch_request_free(&r);
    l = TSR__L("\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{"
               "\"function\":{\"name\":\"w\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
               "\"name\":\"w\",\"content\":[{\"type\":\"text\",\"text\":\"1\"}]}]");
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_TRUE(r.chat_ctx != NULL && !cJSON_GetObjectItem(r.chat_ctx, "tools"));
    const cJSON *ms = cJSON_GetObjectItem(r.chat_ctx, "messages");
    ASSERT_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, 0), "content")->valuestring, "");
    ASSERT_TRUE(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, 0), "tool_calls") != NULL);
    ASSERT_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, 1), "name")->valuestring, "w");
    ASSERT_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, 1), "content")->valuestring, "1");
    tsr_batch_request_free(&r);
    bool id;
    ASSERT_STR_EQ(parse_code(TSR__L(TSR__U ",\"tools\":{}"), &id), "invalid_tools");
    ASSERT_STR_EQ(parse_code(TSR__L(TSR__U ",\"tools\":[{\"type\":\"web\"}]"), &id),
                  "invalid_tools");
    /* tool_choice: "required" and a named function of `tools` are to be forced */
    l = TSR__L(TSR__U ",\"tools\":[" TSR__T "],\"tool_choice\":\"required\"");
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_TRUE(r.force_call && r.force_name == NULL && r.chat_ctx != NULL);
    tsr_batch_request_free(&r);
    l = TSR__L(TSR__U ",\"tools\":[" TSR__T "],\"tool_choice\":{\"type\":\"function\","
               "\"function\":{\"name\":\"w\"}}");
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_TRUE(r.force_call && r.force_name && !strcmp(r.force_name, "w"));
    tsr_batch_request_free(&r);
    l = TSR__L(TSR__U ",\"tools\":[" TSR__T "],\"tool_choice\":\"auto\"");
    ASSERT_OK(tsr_batch_parse_line(l, strlen(l), 1, &r, &e));
    ASSERT_TRUE(!r.force_call && r.chat_ctx != NULL);
    tsr_batch_request_free(&r);
    ASSERT_STR_EQ(parse_code(TSR__L(TSR__U ",\"tools\":[" TSR__T "],\"tool_choice\":{\"type\":"
                                    "\"function\",\"function\":{\"name\":\"x\"}}"), &id),
                  "invalid_tools");
    ASSERT_STR_EQ(parse_code(TSR__L(TSR__U ",\"tools\":[" TSR__T "],\"tool_choice\":\"any\""),
                             &id), "invalid_tools");
    ASSERT_STR_EQ(parse_code(TSR__L(TSR__U ",\"tool_choice\":\"required\""), &id),
                  "invalid_tools");
    ASSERT_STR_EQ(parse_code(TSR__L("\"messages\":[{\"role\":\"user\",\"content\":\"x\","
                                    "\"tool_calls\":[]}]"), &id),
                  "invalid_messages");
    ASSERT_STR_EQ(parse_code(TSR__L("\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
                                    "[{\"function\":{\"name\":\"w\"}}]}]"), &id),
                  "invalid_messages");
#undef TSR__T
#undef TSR__L
#undef TSR__U
}

TSR_TEST(test_parse_each_bad_line) {
    static const struct {
        const char *line, *code;
        bool keyed_by_id;
    } cases[] = {
        {"{not json", TSR_BATCH_E_JSON, false},
        {"[1,2]", TSR_BATCH_E_JSON, false},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}} junk",
         TSR_BATCH_E_JSON, false},
        {"{\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}", TSR_BATCH_E_CUSTOM_ID,
         false},
        {"{\"custom_id\":5,\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}",
         TSR_BATCH_E_CUSTOM_ID, false},
        {"{\"custom_id\":\"\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}",
         TSR_BATCH_E_CUSTOM_ID, false},
        {"{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\","
         "\"body\":{\"prompt\":\"x\"}}", TSR_BATCH_E_METHOD, true},
        {"{\"custom_id\":\"a\",\"body\":{\"prompt\":\"x\"}}", TSR_BATCH_E_URL, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":\"x\"}}",
         TSR_BATCH_E_URL, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\"}", TSR_BATCH_E_BODY, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":\"x\"}", TSR_BATCH_E_BODY,
         true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{}}", TSR_BATCH_E_PROMPT,
         true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"\"}}",
         TSR_BATCH_E_PROMPT, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[1,2]}}",
         TSR_BATCH_E_PROMPT, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/chat/completions\",\"body\":{\"prompt\":\"x\"}}",
         TSR_BATCH_E_MESSAGES, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":"
         "[{\"role\":\"wizard\",\"content\":\"x\"}]}}", TSR_BATCH_E_MESSAGES, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":"
         "[{\"role\":\"user\"}]}}", TSR_BATCH_E_MESSAGES, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"max_tokens\":-1}}", TSR_BATCH_E_PARAM, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"max_tokens\":2.5}}", TSR_BATCH_E_PARAM, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"temperature\":-1}}", TSR_BATCH_E_PARAM, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"top_p\":0}}", TSR_BATCH_E_PARAM, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"seed\":\"s\"}}", TSR_BATCH_E_PARAM, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"stop\":[1]}}", TSR_BATCH_E_PARAM, true},
        {"{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"n\":2}}", TSR_BATCH_E_PARAM, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool has_id = false;
        const char *code = parse_code(cases[i].line, &has_id);
        if (strcmp(code, cases[i].code) != 0)
            TSR_FAIL_("case %zu (%s): code \"%s\", want \"%s\"", i, cases[i].line, code,
                      cases[i].code);
        ASSERT_EQ_INT(has_id, cases[i].keyed_by_id);
    }
}

TSR_TEST(test_record_shapes) {
    tsr_batch_result r = {.custom_id = "q\"1", .kind = TSR_BATCH_COMPLETION, .model = "m.bin",
                          .text = "hi\xff there", .text_len = 9, .finish_reason = "length",
                          .prompt_tokens = 4, .completion_tokens = 3};
    char *line = tsr_batch_format_result(&r);
    ASSERT_TRUE(line != NULL);
    size_t n = strlen(line);
    ASSERT_TRUE(n > 0 && line[n - 1] == '\n');
    ASSERT_TRUE(strchr(line, '\n') == line + n - 1); /* one line */
    cJSON *d = cJSON_Parse(line);
    ASSERT_TRUE(d != NULL);
    ASSERT_STR_EQ(cJSON_GetObjectItem(d, "custom_id")->valuestring, "q\"1");
    ASSERT_STR_CONTAINS(cJSON_GetObjectItem(d, "id")->valuestring, "batch_req_");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(d, "error")));
    cJSON *resp = cJSON_GetObjectItem(d, "response");
    ASSERT_EQ_INT(cJSON_GetObjectItem(resp, "status_code")->valueint, 200);
    ASSERT_TRUE(cJSON_IsString(cJSON_GetObjectItem(resp, "request_id")));
    cJSON *body = cJSON_GetObjectItem(resp, "body");
    ASSERT_STR_EQ(cJSON_GetObjectItem(body, "object")->valuestring, "text_completion");
    ASSERT_STR_EQ(cJSON_GetObjectItem(body, "model")->valuestring, "m.bin");
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "choices"), 0);
    ASSERT_EQ_INT(cJSON_GetObjectItem(ch, "index")->valueint, 0);
    /* invalid UTF-8 became U+FFFD */
    ASSERT_STR_EQ(cJSON_GetObjectItem(ch, "text")->valuestring, "hi\xef\xbf\xbd there");
    ASSERT_STR_EQ(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "length");
    cJSON *u = cJSON_GetObjectItem(body, "usage");
    ASSERT_EQ_INT(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 4);
    ASSERT_EQ_INT(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 3);
    ASSERT_EQ_INT(cJSON_GetObjectItem(u, "total_tokens")->valueint, 7);
    cJSON_Delete(d);
    tsr_free(line);

    r.kind = TSR_BATCH_CHAT;
    r.finish_reason = "stop";
    line = tsr_batch_format_result(&r);
    d = cJSON_Parse(line);
    body = cJSON_GetObjectItem(cJSON_GetObjectItem(d, "response"), "body");
    ASSERT_STR_EQ(cJSON_GetObjectItem(body, "object")->valuestring, "chat.completion");
    ch = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(ch, "message");
    ASSERT_STR_EQ(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    ASSERT_TRUE(cJSON_IsString(cJSON_GetObjectItem(msg, "content")));
    ASSERT_TRUE(cJSON_GetObjectItem(ch, "text") == NULL);
    ASSERT_TRUE(!cJSON_GetObjectItem(msg, "reasoning") && !cJSON_GetObjectItem(msg, "tool_calls"));
    cJSON_Delete(d);
    tsr_free(line);

    /* a harmony tool call (OpenAI's shape): content null, the reasoning, one function call
     * whose id follows the record's (the same in every run) */
    r.text = "";
    r.text_len = 0;
    r.finish_reason = "tool_calls";
    r.reasoning = "Need weather.xx";
    r.reasoning_len = 13;
    r.tool_name = "get_weather";
    r.tool_name_len = 11;
    r.tool_args = "{\"city\":\"Paris\"}";
    r.tool_args_len = strlen(r.tool_args);
    line = tsr_batch_format_result(&r);
    ASSERT_TRUE(line != NULL);
    ASSERT_STR_CONTAINS(line, "\"message\":{\"role\":\"assistant\",\"content\":null,"
                              "\"reasoning\":\"Need weather.\",\"tool_calls\":[{\"id\":\"call_");
    ASSERT_STR_CONTAINS(line, "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                              "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
                              "\"finish_reason\":\"tool_calls\"");
    char *again = tsr_batch_format_result(&r);
    ASSERT_TRUE(again && !strcmp(line, again));
    tsr_free(again);
    tsr_free(line);
    r.text = "Sunny.";
    r.text_len = 6; /* text with a call stays the content */
    line = tsr_batch_format_result(&r);
    ASSERT_STR_CONTAINS(line, "\"content\":\"Sunny.\"");
    tsr_free(line);

    /* from the decoded harmony answer as `tessera run` has it (the <|call|> that ended it
     * is not in the text) to the record */
    static const char ans[] = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>"
                              "assistant<|channel|>commentary to=functions.get_weather "
                              "<|constrain|>json<|message|>{\"city\":\"Paris\"}";
    tsr_batch_result h = {.custom_id = "h1", .kind = TSR_BATCH_CHAT, .model = "oss",
                          .finish_reason = "stop", .prompt_tokens = 9, .completion_tokens = 20};
    char *reasoning = NULL;
    ASSERT_OK(tsr_batch_result_harmony(&h, ans, strlen(ans), true, &reasoning));
    ASSERT_STR_EQ(h.finish_reason, "tool_calls");
    line = tsr_batch_format_result(&h);
    d = cJSON_Parse(line);
    ch = cJSON_GetArrayItem(cJSON_GetObjectItem(
                                cJSON_GetObjectItem(cJSON_GetObjectItem(d, "response"), "body"),
                                "choices"),
                            0);
    msg = cJSON_GetObjectItem(ch, "message");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")));
    ASSERT_STR_EQ(cJSON_GetObjectItem(msg, "reasoning")->valuestring, "Need weather.");
    cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    ASSERT_STR_CONTAINS(cJSON_GetObjectItem(call, "id")->valuestring, "call_");
    cJSON *fn = cJSON_GetObjectItem(call, "function");
    ASSERT_STR_EQ(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather");
    ASSERT_STR_EQ(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"city\":\"Paris\"}");
    ASSERT_STR_EQ(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls");
    cJSON_Delete(d);
    tsr_free(line);
    tsr_free(reasoning);
    /* the same text cut by max_tokens: no call, the reasoning, empty content */
    h = (tsr_batch_result){.custom_id = "h1", .kind = TSR_BATCH_CHAT, .finish_reason = "length"};
    ASSERT_OK(tsr_batch_result_harmony(&h, ans, strlen(ans), false, &reasoning));
    line = tsr_batch_format_result(&h);
    ASSERT_STR_CONTAINS(line, "\"message\":{\"role\":\"assistant\",\"content\":\"\","
                              "\"reasoning\":\"Need weather.\"},\"finish_reason\":\"length\"");
    tsr_free(line);
    tsr_free(reasoning);

    line = tsr_batch_format_error(NULL, 12, TSR_BATCH_E_JSON, "line 12: not a JSON object");
    d = cJSON_Parse(line);
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(d, "custom_id")));
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(d, "response")));
    cJSON *e = cJSON_GetObjectItem(d, "error");
    ASSERT_STR_EQ(cJSON_GetObjectItem(e, "code")->valuestring, "invalid_json");
    ASSERT_STR_EQ(cJSON_GetObjectItem(e, "message")->valuestring, "line 12: not a JSON object");
    ASSERT_EQ_INT(cJSON_GetObjectItem(e, "line")->valueint, 12);
    cJSON_Delete(d);
    tsr_free(line);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

TSR_TEST(test_resume_scan_truncated_output) {
    char path[512], errp[600];
    snprintf(path, sizeof path, "%s/test_batch_io_out.%d.jsonl", TSR_BINARY_DIR, (int)getpid());
    snprintf(errp, sizeof errp, "%s.errors", path);
    tsr_batch_result ok = {.custom_id = "A", .model = "m", .text = "x", .text_len = 1,
                           .finish_reason = "stop", .prompt_tokens = 1, .completion_tokens = 1};
    char *l1 = tsr_batch_format_result(&ok);
    char *l2 = tsr_batch_format_error("B", 2, TSR_BATCH_E_PROMPT, "no prompt");
    char *l3 = tsr_batch_format_error(NULL, 3, TSR_BATCH_E_JSON, "bad");
    char *l4 = tsr_batch_format_error(NULL, 4, TSR_BATCH_E_DUPLICATE, "dup of A");
    ok.custom_id = "C";
    char *l5 = tsr_batch_format_result(&ok);
    ASSERT_TRUE(l1 && l2 && l3 && l4 && l5);
    char content[8192];
    /* the last record was cut by a kill: no newline, half its bytes */
    snprintf(content, sizeof content, "%s%s%s\n%s%.*s", l1, l2, l3, l4, (int)(strlen(l5) / 2),
             l5);
    write_file(path, content);
    size_t good = strlen(l1) + strlen(l2) + strlen(l3) + 1 + strlen(l4);

    tsr_batch_resume r;
    ASSERT_OK(tsr_batch_resume_scan(path, &r));
    ASSERT_EQ_INT(r.n_records, 4);
    ASSERT_EQ_INT(r.n_errors, 3);
    ASSERT_EQ_INT(r.truncated_bytes, (int64_t)(strlen(l5) / 2));
    ASSERT_TRUE(tsr_batch_resume_has(&r, "A", 1));
    ASSERT_TRUE(tsr_batch_resume_has(&r, "B", 2));
    ASSERT_TRUE(!tsr_batch_resume_has(&r, "C", 5)); /* truncated: not done */
    ASSERT_TRUE(tsr_batch_resume_has(&r, NULL, 3));  /* line-keyed (no custom_id) */
    ASSERT_TRUE(tsr_batch_resume_has(&r, NULL, 4));  /* line-keyed (duplicate) */
    ASSERT_TRUE(!tsr_batch_resume_has(&r, NULL, 2));
    tsr_batch_resume_free(&r);
    char *now = read_file(path);
    ASSERT_TRUE(now != NULL);
    ASSERT_EQ_INT(strlen(now), good); /* cut back to the last complete line */
    ASSERT_TRUE(now[good - 1] == '\n');

    /* appending after the scan gives well-formed lines; rescan sees the new record */
    tsr_batch_writer w;
    ASSERT_OK(tsr_batch_writer_open(&w, path));
    ASSERT_OK(tsr_batch_writer_put(&w, l5));
    tsr_batch_writer_close(&w);
    ASSERT_OK(tsr_batch_resume_scan(path, &r));
    ASSERT_EQ_INT(r.n_records, 5);
    ASSERT_EQ_INT(r.truncated_bytes, 0);
    ASSERT_TRUE(tsr_batch_resume_has(&r, "C", 5));
    tsr_batch_resume_free(&r);

    /* the errors file is rebuilt from the output's error records */
    write_file(errp, "stale\n");
    ASSERT_OK(tsr_batch_rebuild_errors(path, errp));
    char expect[8192];
    snprintf(expect, sizeof expect, "%s%s%s", l2, l3, l4);
    ASSERT_STR_EQ(read_file(errp), expect);

    /* a missing output file is an empty scan */
    remove(path);
    ASSERT_OK(tsr_batch_resume_scan(path, &r));
    ASSERT_EQ_INT(r.n_records, 0);
    tsr_batch_resume_free(&r);
    remove(errp);
    tsr_free(l1);
    tsr_free(l2);
    tsr_free(l3);
    tsr_free(l4);
    tsr_free(l5);
}

TSR_TEST(test_strset) {
    tsr_strset *s = NULL;
    ASSERT_OK(tsr_strset_create(&s));
    char k[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(k, sizeof k, "id-%d", i);
        bool added = false;
        ASSERT_OK(tsr_strset_add(s, k, &added));
        ASSERT_TRUE(added);
    }
    bool added = true;
    ASSERT_OK(tsr_strset_add(s, "id-7", &added));
    ASSERT_TRUE(!added);
    ASSERT_EQ_INT(tsr_strset_count(s), 1000);
    ASSERT_TRUE(tsr_strset_has(s, "id-999"));
    ASSERT_TRUE(!tsr_strset_has(s, "id-1000"));
    tsr_strset_destroy(s);
}

TSR_TEST(test_chat_template_llama3) {
    /* The Llama-3-8B-Instruct tokenizer_config.json template. */
    const char *cfg =
        "{\"bos_token\": \"<|begin_of_text|>\", \"chat_template\": \"{% set loop_messages = "
        "messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
        "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
        "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
        "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}\"}";
    tsr_chat_template t;
    ASSERT_OK(tsr_chat_template_parse(cfg, strlen(cfg), "cfg", &t));
    ASSERT_EQ_INT(t.kind, TSR_CHAT_JINJA);
    tsr_chat_message m[] = {{"system", "Be brief. "}, {"user", "\n Hello!"}};
    char *out = NULL;
    size_t n = 0;
    ASSERT_OK(tsr_chat_render(&t, m, 2, &out, &n));
    ASSERT_STR_EQ(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                       "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                       "Hello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    ASSERT_EQ_INT(n, strlen(out));
    tsr_free(out);
    tsr_chat_template_free(&t);

    /* the built-in Llama-3.1 fallback */
    ASSERT_OK(tsr_chat_template_from_source(NULL, 0, NULL, NULL, "builtin", &t));
    ASSERT_OK(tsr_chat_render(&t, m + 1, 1, &out, &n));
    ASSERT_STR_EQ(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                       "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                       "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n");
    tsr_free(out);
    tsr_chat_template_free(&t);

    const char *none = "{\"model_max_length\": 512}";
    ASSERT_OK(tsr_chat_template_parse(none, strlen(none), "none", &t));
    ASSERT_EQ_INT(t.kind, TSR_CHAT_NONE);
    ASSERT_EQ_INT(tsr_chat_render(&t, m, 2, &out, &n), TSR_ERR_INVALID);
    const char *other = "{\"chat_template\": \"{% for m in messages %}{% include 'x' %}{% endfor %}\"}";
    ASSERT_EQ_INT(tsr_chat_template_parse(other, strlen(other), "other", &t),
                  TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "other: 1:27: unsupported statement 'include'");
    /* a llama2.c model file is not a directory: no template, no error */
    ASSERT_OK(tsr_chat_template_detect(TSR_SOURCE_DIR "/models/stories260K.bin", &t));
    ASSERT_EQ_INT(t.kind, TSR_CHAT_NONE);
}

/* tsr_batch_input_scan over `n` bytes: the status, the request count, the start offset and
 * the error line. */
static tsr_status scan_bytes(const char *bytes, size_t n, int64_t *reqs, long *start) {
    FILE *f = fmemopen((void *)bytes, n, "rb");
    if (!f) return TSR_ERR_IO;
    tsr_status st = tsr_batch_input_scan("in.jsonl", f, reqs, start);
    fclose(f);
    return st;
}

TSR_TEST(test_input_scan_encodings) {
    int64_t reqs;
    long start;
    /* UTF-8: blank lines (spaces, CRLF) are not requests; the last line may lack '\n' */
    const char ok[] = "{\"a\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}\r\n \t\r\n\n{}";
    ASSERT_OK(scan_bytes(ok, sizeof ok - 1, &reqs, &start));
    ASSERT_EQ_INT(reqs, 2);
    ASSERT_EQ_INT(start, 0);
    /* UTF-8 byte-order mark: accepted, the reader starts after it */
    const char bom[] = "\xef\xbb\xbf{}\n{}\n";
    ASSERT_OK(scan_bytes(bom, sizeof bom - 1, &reqs, &start));
    ASSERT_EQ_INT(reqs, 2);
    ASSERT_EQ_INT(start, 3);
    /* a mark alone on the first line leaves it blank */
    ASSERT_OK(scan_bytes("\xef\xbb\xbf\n{}\n", 7, &reqs, &start));
    ASSERT_EQ_INT(reqs, 1);
    /* UTF-16 and UTF-32, with and without a mark: refused naming the file and the problem */
    const char u16le[] = "\xff\xfe{\0}\0\n\0";
    ASSERT_EQ_INT(scan_bytes(u16le, sizeof u16le - 1, &reqs, &start), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "in.jsonl: the input is UTF-16LE");
    const char u16be[] = "\xfe\xff\0{\0}\0\n";
    ASSERT_EQ_INT(scan_bytes(u16be, sizeof u16be - 1, &reqs, &start), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "UTF-16BE");
    const char u32le[] = "\xff\xfe\0\0{\0\0\0";
    ASSERT_EQ_INT(scan_bytes(u32le, sizeof u32le - 1, &reqs, &start), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "UTF-32LE");
    const char nobom[] = "{\0}\0\n\0";
    ASSERT_EQ_INT(scan_bytes(nobom, sizeof nobom - 1, &reqs, &start), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "in.jsonl: line 1 has a NUL byte at byte 2");
    /* Latin-1 on line 3, a lone continuation byte, an overlong '/', a surrogate, a cut
     * sequence at the end of the file: each is one bad line (an invalid_encoding record
     * when the job reads it), counted as a request; the file is not refused */
    const char lat[] = "{}\n{}\n{\"p\":\"caf\xe9\"}\n";
    ASSERT_OK(scan_bytes(lat, sizeof lat - 1, &reqs, &start));
    ASSERT_EQ_INT(reqs, 3);
    const char *bad[] = {"{\x80}\n", "{\xc0\xaf}\n", "{\xed\xa0\x80}\n", "{}\n\xe2\x82"};
    const int64_t nreq[] = {1, 1, 1, 2};
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(scan_bytes(bad[i], strlen(bad[i]), &reqs, &start));
        ASSERT_EQ_INT(reqs, nreq[i]);
    }
}

/* A line that is not UTF-8: invalid_encoding, keyed by its custom_id when that is UTF-8. */
TSR_TEST(test_take_line_invalid_encoding) {
    tsr_strset *seen;
    ASSERT_OK(tsr_strset_create(&seen));
    char l1[] = "{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"caf\xe9\"}}\n";
    bool blank;
    uint64_t h = 0;
    tsr_batch_request r;
    tsr_batch_error e;
    tsr_status v;
    ASSERT_OK(tsr_batch_take_line(l1, strlen(l1), 1, seen, &blank, &h, &r, &e, &v));
    ASSERT_TRUE(!blank && v == TSR_ERR_INVALID && h != 0);
    ASSERT_STR_EQ(e.code, TSR_BATCH_E_ENCODING);
    ASSERT_STR_CONTAINS(e.message, "byte 0xe9");
    ASSERT_STR_EQ(r.custom_id, "a");
    ASSERT_EQ_INT((int64_t)h, (int64_t)tsr_batch_line_hash(l1, strlen(l1) - 1));
    tsr_batch_request_free(&r);
    char l2[] = "{\"custom_id\":\"\xff\"}";
    ASSERT_OK(tsr_batch_take_line(l2, strlen(l2), 2, seen, &blank, &h, &r, &e, &v));
    ASSERT_TRUE(v == TSR_ERR_INVALID && r.custom_id == NULL); /* keyed by line */
    tsr_batch_request_free(&r);
    char l3[] = "  \r\n";
    ASSERT_OK(tsr_batch_take_line(l3, strlen(l3), 3, seen, &blank, &h, &r, &e, &v));
    ASSERT_TRUE(blank);
    tsr_batch_request_free(&r);
    tsr_strset_destroy(seen);
}

/* Records bound to the input: kept when key and line hash match, superseded (removed) when
 * the line changed, foreign (counted, output untouched) when the input lacks the key. */
TSR_TEST(test_resume_bound_to_input) {
    char in[512], out[512];
    snprintf(in, sizeof in, "%s/test_batch_io_bind_in.%d.jsonl", TSR_BINARY_DIR, (int)getpid());
    snprintf(out, sizeof out, "%s/test_batch_io_bind_out.%d.jsonl", TSR_BINARY_DIR,
             (int)getpid());
    const char *la = "{\"custom_id\":\"A\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}";
    const char *lb = "{\"custom_id\":\"B\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"y\"}}";
    const char *lb2 = "{\"custom_id\":\"B\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"z\"}}";
    char content[1024];
    snprintf(content, sizeof content, "%s\n%s\nnot json\n", la, lb2);
    write_file(in, content);
    tsr_batch_result ra = {.custom_id = "A", .model = "m", .text = "t", .text_len = 1,
                           .finish_reason = "stop", .line_hash = tsr_batch_line_hash(la, strlen(la))};
    tsr_batch_result rb = ra;
    rb.custom_id = "B";
    rb.line_hash = tsr_batch_line_hash(lb, strlen(lb)); /* the old line B */
    char *ka = tsr_batch_format_result(&ra), *kb = tsr_batch_format_result(&rb);
    char *k3 = tsr_batch_format_error_bound(NULL, 3, tsr_batch_line_hash("not json", 8),
                                            TSR_BATCH_E_JSON, "bad");
    snprintf(content, sizeof content, "%s%s%s", ka, kb, k3);
    write_file(out, content);
    FILE *f = fopen(in, "rb");
    ASSERT_TRUE(f != NULL);
    tsr_batch_input_index ix;
    ASSERT_OK(tsr_batch_input_index_build(in, f, &ix));
    fclose(f);
    ASSERT_EQ_INT(ix.n_lines, 3);
    tsr_batch_resume r;
    ASSERT_OK(tsr_batch_resume_scan_bound(out, &ix, true, &r));
    ASSERT_EQ_INT(r.n_records, 2);
    ASSERT_EQ_INT(r.n_superseded, 1);
    ASSERT_EQ_INT(r.n_foreign, 0);
    ASSERT_TRUE(tsr_batch_resume_has(&r, "A", 1));
    ASSERT_TRUE(!tsr_batch_resume_has(&r, "B", 2));
    ASSERT_TRUE(tsr_batch_resume_has(&r, NULL, 3));
    tsr_batch_resume_free(&r);
    snprintf(content, sizeof content, "%s%s", ka, k3);
    ASSERT_STR_EQ(read_file(out), content); /* B's old record is gone */
    /* another input: its records are foreign, the output is left as it was */
    write_file(in, "{\"custom_id\":\"Z\"}\n");
    f = fopen(in, "rb");
    tsr_batch_input_index_free(&ix);
    ASSERT_OK(tsr_batch_input_index_build(in, f, &ix));
    fclose(f);
    ASSERT_OK(tsr_batch_resume_scan_bound(out, &ix, true, &r));
    ASSERT_EQ_INT(r.n_foreign, 2);
    ASSERT_STR_EQ(r.first_foreign, "A");
    ASSERT_EQ_INT(r.n_records, 0);
    tsr_batch_resume_free(&r);
    ASSERT_STR_EQ(read_file(out), content);
    tsr_batch_input_index_free(&ix);
    remove(in);
    remove(out);
    tsr_free(ka);
    tsr_free(kb);
    tsr_free(k3);
}

/* The lock: a second taker is refused naming the holder; released, it can be taken again. */
TSR_TEST(test_lock_exclusive) {
    char out[512];
    snprintf(out, sizeof out, "%s/test_batch_io_lock.%d.jsonl", TSR_BINARY_DIR, (int)getpid());
    tsr_batch_lock a, b;
    ASSERT_OK(tsr_batch_lock_take(&a, out));
    /* POSIX locks are per process: the second taker must be another process */
    pid_t pid = fork();
    if (pid == 0) {
        tsr_status st = tsr_batch_lock_take(&b, out);
        _exit(st == TSR_ERR_INVALID && strstr(tsr_last_error(), "in use by another job (pid ")
                  ? 0 : 1);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    tsr_batch_lock_release(&a);
    ASSERT_OK(tsr_batch_lock_take(&b, out));
    tsr_batch_lock_release(&b);
}

TSR_TEST(test_errors_file_failure_names_the_path_given) {
    char out[512], err[600];
    snprintf(out, sizeof out, "%s/test_batch_io_nodir.%d/out.jsonl", TSR_BINARY_DIR,
             (int)getpid());
    snprintf(err, sizeof err, "%s/test_batch_io_nodir.%d/out.errors.jsonl", TSR_BINARY_DIR,
             (int)getpid());
    ASSERT_EQ_INT(tsr_batch_rebuild_errors(out, err), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), err);
    ASSERT_TRUE(strstr(tsr_last_error(), ".tmp") == NULL);
    tsr_batch_writer w;
    ASSERT_EQ_INT(tsr_batch_writer_open(&w, out), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), out);
}

TSR_TEST_MAIN(test_take_line_invalid_encoding, test_resume_bound_to_input, test_lock_exclusive,
              test_parse_valid_completion_and_defaults, test_parse_chat_tools,
              test_parse_each_bad_line,
              test_record_shapes, test_resume_scan_truncated_output, test_strset,
              test_chat_template_llama3, test_input_scan_encodings,
              test_errors_file_failure_names_the_path_given)
