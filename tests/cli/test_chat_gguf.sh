#!/usr/bin/env bash
# The bundled real model (tools/fetch-models.sh): `tessera generate --chat` renders the user
# message with the GGUF's own chat template (SmolLM2's ChatML, with its default system
# message) and answers; `tessera run` takes a chat request through the same template. A
# model without a template refuses --chat in one line; `--dtype bf16` keeps the file's Q4_1
# matrices with one warning line. Skips (77) without the model.
# "Paris" is the answer of the matrices expanded to f32 (TSR_GGUF_DEQUANT=1); the native
# 4-bit path (Q4_1 weights, activations quantized per 32-block) begins as llama.cpp does on
# the same file: llama-cli -no-cnv --temp 0 printed "L'Étoile, la Marseillaise," for the same
# rendered prompt, tessera "L'Étoile, la Cité" (a near tie at the fifth token).
. "$(dirname "$0")/common.sh"
GGUF=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$GGUF" ]; then
    echo "SKIP: $GGUF absent (tools/fetch-models.sh fetches it)"
    exit 77
fi
out=$(TSR_GGUF_DEQUANT=1 "$BIN" generate --model "$GGUF" --chat --prompt "What is the capital of France?" \
    --max-tokens 24 --temperature 0 --threads 2 2>"$TMP/gen.err") || fail "generate --chat: exit $?: $(cat "$TMP/gen.err")"
grep -q "Paris" <<<"$out" || fail "generate --chat: no 'Paris' in: $out"
# the rendered template is the prompt: 37 tokens with SmolLM2's default system message
grep -q "prompt 37 tokens" "$TMP/gen.err" || fail "generate --chat: prompt length: $(cat "$TMP/gen.err")"
out=$("$BIN" generate --model "$GGUF" --chat --prompt "What is the capital of France?" \
    --max-tokens 8 --temperature 0 --threads 2 2>"$TMP/gen4.err") || fail "generate --chat (4-bit): exit $?: $(cat "$TMP/gen4.err")"
grep -q "^L'Étoile, la " <<<"$out" || fail "generate --chat (4-bit): not llama.cpp's answer: $out"
# a float --dtype keeps the 4-bit matrices, and one warning line says so (not silently)
"$BIN" generate --model "$GGUF" --dtype bf16 --prompt "Hi" --max-tokens 1 --threads 2 \
    >/dev/null 2>"$TMP/dt.err" || fail "generate --dtype bf16: exit $?: $(cat "$TMP/dt.err")"
[ "$(grep -c "q4_1 matrices are kept as stored" "$TMP/dt.err")" = 1 ] ||
    fail "generate --dtype bf16 on a Q4_1 file: no warning: $(cat "$TMP/dt.err")"

# run: a /v1/chat/completions request through the GGUF's template
cat >"$TMP/in.jsonl" <<'J'
{"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24, "temperature": 0}}
J
TSR_GGUF_DEQUANT=1 "$BIN" run --model "$GGUF" --input "$TMP/in.jsonl" --output "$TMP/out.jsonl" --threads 2 \
    2>"$TMP/run.err" || fail "run chat: exit $?: $(tail -n 3 "$TMP/run.err")"
grep -q "Paris" "$TMP/out.jsonl" || fail "run chat: no 'Paris' in $(cat "$TMP/out.jsonl")"

# no template: one line naming the model, exit 1
if "$BIN" generate --model "$MODEL" --chat --prompt "Hi" --max-tokens 4 2>"$TMP/none.err" >/dev/null; then
    fail "--chat on a model without a template succeeded"
fi
[ "$(wc -l <"$TMP/none.err")" = 1 ] && grep -q "no chat template" "$TMP/none.err" ||
    fail "--chat without a template: $(cat "$TMP/none.err")"
[ "$fails" = 0 ] && echo "test_chat_gguf: ok"
exit $((fails > 0))
