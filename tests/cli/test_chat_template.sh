#!/usr/bin/env bash
# tessera run with the model's own chat template (runtime/text/jinja.c): a model directory whose
# tokenizer_config.json carries a template from tests/data/chat_templates renders chat
# requests with it; a request the template refuses (raise_exception) gets an error record
# with the template's message while the others run; a template using a construct tessera
# lacks gives a start-up warning naming it and line:col, and no_chat_template records.
# GPT-OSS (harmony): a model directory without a template gets the built-in harmony one,
# which encodes to the same prompt as the model's own template; chat records and
# `generate --chat` carry the final channel's text (empty from a random model: its answer
# never opens the final channel), --harmony-raw the whole answer with its special tokens;
# stop strings match the final channel only (the whole answer with --harmony-raw);
# tool_choice "required" and a named function are forced by the answer's header.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
bin=$1 root=$2 tmp=$3
# GPT-OSS's system turn carries the date (strftime_now): the random model's answers below are
# those of the prompt dated 2026-12-06 (SOURCE_DATE_EPOCH fixes strftime_now's time)
export SOURCE_DATE_EPOCH=1796558400
rm -rf "$tmp" && mkdir -p "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }

m=$tmp/hf
"$bin" convert --model "$root/models/stories260K.bin" --output "$m" 2>"$tmp/err" ||
    fail "convert exited $? ($(cat "$tmp/err"))"
# tokenizer_config.json with a template file as its chat_template (JSON-escaped by hand:
# backslash, quote, newline, tab).
config() {
    printf '{"bos_token": "%s", "chat_template": "' "$2"
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' "$1" | sed -e ':a;N;$!ba;s/\n/\\n/g' | tr -d '\n'
    printf '"}\n'
}
cat >"$tmp/in.jsonl" <<'JSONL'
{"custom_id": "user", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 3}}
{"custom_id": "system", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_tokens": 3}}
JSONL

# SmolLM2's ChatML template: both requests rendered and answered.
config "$root/tests/data/chat_templates/HuggingFaceTB-SmolLM2-1.7B-Instruct.jinja" "<s>" \
    >"$m/tokenizer_config.json"
"$bin" run --model "$m" --input "$tmp/in.jsonl" --output "$tmp/out1.jsonl" --threads 2 \
    --progress-interval 0 2>"$tmp/err1" || fail "run exited $? ($(cat "$tmp/err1"))"
[ "$(grep -c '"status_code":200' "$tmp/out1.jsonl")" -eq 2 ] ||
    fail "SmolLM2 template: not two answers: $(cat "$tmp/out1.jsonl")"
grep -q '"prompt_tokens":0' "$tmp/out1.jsonl" && fail "an empty rendered prompt"

# Gemma 2 refuses a system message: that request alone gets the template's message.
config "$root/tests/data/chat_templates/google-gemma-2-2b-it.jinja" "<bos>" \
    >"$m/tokenizer_config.json"
"$bin" run --model "$m" --input "$tmp/in.jsonl" --output "$tmp/out2.jsonl" --threads 2 \
    --progress-interval 0 2>"$tmp/err2" || fail "run exited $? ($(cat "$tmp/err2"))"
grep '"custom_id":"user"' "$tmp/out2.jsonl" | grep -q '"status_code":200' ||
    fail "Gemma template: the user-only request failed: $(cat "$tmp/out2.jsonl")"
grep '"custom_id":"system"' "$tmp/out2.jsonl" |
    grep -q '"code":"no_chat_template","message":"[^"]*raise_exception: System role not supported"' ||
    fail "Gemma template: no raise_exception record: $(cat "$tmp/out2.jsonl")"

# A construct tessera lacks: a warning with line:col; chat requests get no_chat_template.
printf '{"chat_template": "{%% for m in messages %%}\\n{%% include \\"x\\" %%}{%% endfor %%}"}\n' \
    >"$m/tokenizer_config.json"
"$bin" run --model "$m" --input "$tmp/in.jsonl" --output "$tmp/out3.jsonl" --threads 2 \
    --progress-interval 0 2>"$tmp/err3" || fail "run exited $? ($(cat "$tmp/err3"))"
grep -q "tokenizer_config.json: 2:4: unsupported statement 'include'" "$tmp/err3" ||
    fail "no warning naming the construct: $(cat "$tmp/err3")"
[ "$(grep -c '"code":"no_chat_template"' "$tmp/out3.jsonl")" -eq 2 ] ||
    fail "unsupported template: not two no_chat_template records"

# harmony on the tiny GPT-OSS model with the 160-id harmony tokenizer
g=$root/tests/data/arch/gptoss_f32 htok=$root/tests/data/harmony/tokenizer.json
cat >"$tmp/h.jsonl" <<'JSONL'
{"custom_id": "h", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}}
{"custom_id": "hs", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0, "stop": "Mat"}}
JSONL
hrun() { # $1 model dir, $2 output, then flags
    local md=$1 out=$2
    shift 2
    "$bin" run --model "$md" --tokenizer "$htok" --input "$tmp/h.jsonl" --output "$out" \
        --threads 2 --progress-interval 0 --quiet "$@" 2>"$tmp/herr" ||
        fail "harmony run exited $? ($(cat "$tmp/herr"))"
}
hrun "$g" "$tmp/h1.jsonl"
grep -q '"content":""' "$tmp/h1.jsonl" || fail "harmony: not the (empty) final channel: $(cat "$tmp/h1.jsonl")"
hrun "$g" "$tmp/h2.jsonl" --harmony-raw
grep -q '"content":""' "$tmp/h2.jsonl" && fail "--harmony-raw: an empty answer: $(cat "$tmp/h2.jsonl")"
# "Mat" is in the raw answer ("]:*V02RMat02", no final channel): it cuts the raw record
# only
python3 - "$tmp/h1.jsonl" "$tmp/h2.jsonl" <<'PY' || fail "harmony stop strings: $(cat "$tmp/h1.jsonl" "$tmp/h2.jsonl")"
import json, sys
def recs(path):
    d = {}
    for line in open(path):
        r = json.loads(line)
        b = r["response"]["body"]
        d[r["custom_id"]] = (b["choices"][0]["message"]["content"], b["usage"]["completion_tokens"])
    return d
h, raw = recs(sys.argv[1]), recs(sys.argv[2])
assert "Mat" in raw["h"][0] and raw["hs"][0] == raw["h"][0][:raw["h"][0].index("Mat")], raw
assert raw["hs"][1] < raw["h"][1], raw
assert h["hs"] == h["h"], h
PY
tokens() { grep -o '"prompt_tokens":[0-9]*' "$1"; }
mkdir -p "$tmp/oss/gptoss_f32" && cp "$g"/* "$tmp/oss/gptoss_f32/" # the same model name
config "$root/tests/data/chat_templates/openai-gpt-oss-120b.jinja" "<|startoftext|>" \
    >"$tmp/oss/gptoss_f32/tokenizer_config.json"
hrun "$tmp/oss/gptoss_f32" "$tmp/h3.jsonl" --harmony-raw
[ "$(tokens "$tmp/h2.jsonl")" = "$(tokens "$tmp/h3.jsonl")" ] ||
    fail "built-in harmony and the model's template: $(tokens "$tmp/h2.jsonl") vs $(tokens "$tmp/h3.jsonl")"
cmp -s "$tmp/h2.jsonl" "$tmp/h3.jsonl" || fail "built-in harmony and the model's template answer differently"
# function tools: the developer message's namespace (the same prompt as the model's own
# template renders), tool_choice "none" leaves them out, a tool call and its result in the
# history, and two calls in one message refused with a line naming the request
W='{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}'
M='[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]'
C='{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}'
cat >"$tmp/t.jsonl" <<JSONL
{"custom_id": "h", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $M, "max_tokens": 12, "temperature": 0}}
{"custom_id": "t1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $M, "tools": [$W], "max_tokens": 12, "temperature": 0}}
{"custom_id": "t2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $M, "tools": [$W], "tool_choice": "none", "max_tokens": 12, "temperature": 0}}
{"custom_id": "t3", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [$C]}, {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}], "tools": [$W], "max_tokens": 12, "temperature": 0}}
{"custom_id": "t4", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [$C, $C]}], "max_tokens": 12, "temperature": 0}}
{"custom_id": "t5", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $M, "tools": [$W], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 6, "temperature": 0}}
{"custom_id": "t6", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $M, "tools": [$W], "tool_choice": "required", "max_tokens": 6, "temperature": 0}}
{"custom_id": "t7", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $M, "tools": [$W], "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "max_tokens": 6, "temperature": 0}}
JSONL
for md in "$g" "$tmp/oss/gptoss_f32"; do
    "$bin" run --model "$md" --tokenizer "$htok" --input "$tmp/t.jsonl" --output "$tmp/t-$(basename "$(dirname "$md")").jsonl" \
        --threads 2 --progress-interval 0 --quiet 2>"$tmp/terr" || fail "tools run exited $? ($(cat "$tmp/terr"))"
done
"$bin" run --model "$g" --tokenizer "$htok" --input "$tmp/t.jsonl" --output "$tmp/t-raw.jsonl" \
    --threads 2 --progress-interval 0 --quiet --harmony-raw 2>"$tmp/terr" || fail "tools --harmony-raw exited $? ($(cat "$tmp/terr"))"
# tool_choice forced: a named call's record carries the call (the random model's arguments,
# cut by max_tokens), "required" leaves the recipient to the model; the raw answers begin
# with the forced header; a function not in tools is invalid_tools
python3 - "$tmp/t-arch.jsonl" "$tmp/t-oss.jsonl" "$tmp/t-raw.jsonl" <<'PY' || fail "tools: $(cat "$tmp/t-arch.jsonl")"
import json, sys
def recs(path):
    return {r["custom_id"]: r for r in map(json.loads, open(path))}
b, own, raw = recs(sys.argv[1]), recs(sys.argv[2]), recs(sys.argv[3])
msg = lambda d, k: d[k]["response"]["body"]["choices"][0]
for d in (b, own):
    ch = msg(d, "t5")
    assert ch["finish_reason"] == "length" and ch["message"]["content"] is None, ch
    call = ch["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and call["arguments"], ch
    assert d["t7"]["error"]["code"] == "invalid_tools" and "get_time" in d["t7"]["error"]["message"], d["t7"]
rc = lambda k: msg(raw, k)["message"]["content"]
assert rc("t5").startswith(" to=functions.get_weather<|channel|>commentary json<|message|>"), rc("t5")
assert rc("t5").endswith(msg(b, "t5")["message"]["tool_calls"][0]["function"]["arguments"]), rc("t5")
assert rc("t6").startswith(" to=functions."), rc("t6")
pt = lambda d, k: d[k]["response"]["body"]["usage"]["prompt_tokens"]
assert pt(b, "t1") > pt(b, "h") and pt(b, "t2") == pt(b, "h"), b
for k in ("t1", "t5", "t6"):  # the model's template agrees, forced headers included
    assert pt(b, k) == pt(own, k), (k, pt(b, k), pt(own, k))
assert pt(b, "t5") > pt(b, "t6") > pt(b, "t1"), b
for k in ("t1", "t3"):
    ch = b[k]["response"]["body"]["choices"][0]
    assert ch["finish_reason"] in ("stop", "length", "tool_calls"), ch
    assert (ch["finish_reason"] == "tool_calls") == ("tool_calls" in ch["message"]), ch
e = b["t4"]["error"]
assert e and e["code"] == "unsupported_tools" and "several tool_calls" in e["message"], b["t4"]
PY
# a model whose format has no call header to write (SmolLM2's ChatML): forcing refused
config "$root/tests/data/chat_templates/HuggingFaceTB-SmolLM2-1.7B-Instruct.jinja" "<s>" \
    >"$m/tokenizer_config.json"
grep '"custom_id": "t6"' "$tmp/t.jsonl" >"$tmp/t6.jsonl"
"$bin" run --model "$m" --input "$tmp/t6.jsonl" --output "$tmp/t6-out.jsonl" --threads 2 \
    --progress-interval 0 --quiet 2>"$tmp/terr" || fail "run exited $? ($(cat "$tmp/terr"))"
grep -q '"code":"unsupported_tools","message":"tool_choice \\"required\\" or a named function is forced on harmony models (GPT-OSS) only"' "$tmp/t6-out.jsonl" ||
    fail "forcing on ChatML not refused: $(cat "$tmp/t6-out.jsonl")"
out=$("$bin" generate --model "$g" --tokenizer "$htok" --chat --prompt "Hello there" \
    --max-tokens 12 --temperature 0 --threads 2 --stats 2>"$tmp/herr") || fail "generate --chat: $(cat "$tmp/herr")"
[ -z "$out" ] || fail "generate --chat printed more than the final channel: $out"
# KV memory by layer type, in the summary and the --stats line
grep -q '^tessera generate: KV 0.3 KiB/token in 1 full layer, 0.3 KiB/token in 1 sliding layer (window 8: 7 tokens a sequence between steps)$' "$tmp/herr" ||
    fail "no KV line by layer type: $(cat "$tmp/herr")"
grep -q '^{"kv_memory":{"full_layers":1,"full_bytes_per_token":260,"sliding_layers":1,"sliding_bytes_per_token":260,"window":8}}$' "$tmp/herr" ||
    fail "no kv_memory stats line: $(cat "$tmp/herr")"
out=$("$bin" generate --model "$g" --tokenizer "$htok" --chat --harmony-raw --prompt "Hello there" \
    --max-tokens 12 --temperature 0 --threads 2 2>"$tmp/herr") || fail "generate --chat --harmony-raw: $(cat "$tmp/herr")"
[ -n "$out" ] || fail "generate --chat --harmony-raw printed nothing"
echo "ok"
