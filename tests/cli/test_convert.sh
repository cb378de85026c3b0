#!/usr/bin/env bash
# tessera convert: llama2.c -> HF directory; files present, tokenizer copied, reloadable;
# usage errors exit 2 with one line. Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
bin=$1 root=$2 tmp=$3
rm -rf "$tmp" && mkdir -p "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$tmp/stories_hf
"$bin" convert --model "$root/models/stories260K.bin" --output "$out" 2>"$tmp/err" ||
    fail "convert exited $? ($(cat "$tmp/err"))"
for f in config.json model.safetensors tokenizer.bin; do
    [ -s "$out/$f" ] || fail "$out/$f missing or empty"
done
ls "$out" | grep -q '\.tmp$' && fail "temporary files left in $out"
cmp -s "$out/tokenizer.bin" "$root/models/tok512.bin" || fail "tokenizer.bin is not tok512.bin"
grep -q '"LlamaForCausalLM"' "$out/config.json" || fail "config.json lacks LlamaForCausalLM"
grep -q '"tie_word_embeddings":[[:space:]]*true' "$out/config.json" || fail "not tied"
grep -q '"torch_dtype":[[:space:]]*"float32"' "$out/config.json" || fail "dtype not float32"

# bf16 output: half the bytes of f32 (same header size give or take), and it converts back.
out16=$tmp/stories_bf16
"$bin" convert --model "$root/models/stories260K.bin" --output "$out16" --dtype bf16 \
    2>"$tmp/err" || fail "bf16 convert exited $? ($(cat "$tmp/err"))"
grep -q '"torch_dtype":[[:space:]]*"bfloat16"' "$out16/config.json" || fail "dtype not bf16"
s32=$(stat -c %s "$out/model.safetensors") s16=$(stat -c %s "$out16/model.safetensors")
[ $((s16 * 2)) -lt $((s32 + 65536)) ] || fail "bf16 file $s16 bytes vs f32 $s32"
# An HF directory is itself a valid source (round trip through the HF loader).
"$bin" convert --model "$out16" --output "$tmp/again" 2>"$tmp/err" ||
    fail "HF -> HF convert exited $? ($(cat "$tmp/err"))"
cmp -s "$out16/model.safetensors" "$tmp/again/model.safetensors" ||
    fail "HF -> HF changed the weights"

# Usage errors: exit 2, one line on stderr naming the problem.
"$bin" convert --model "$root/models/stories260K.bin" --output "$tmp/x" --dtype q8 \
    2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "bad --dtype exited $rc, expected 2"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "bad --dtype printed $(wc -l <"$tmp/err") lines"
grep -q "dtype" "$tmp/err" || fail "bad --dtype message does not mention dtype: $(cat "$tmp/err")"
[ -e "$tmp/x" ] && fail "bad --dtype still created $tmp/x"
"$bin" convert --output "$tmp/x" 2>"$tmp/err"
[ $? -eq 2 ] || fail "missing --model did not exit 2"
"$bin" convert --help >"$tmp/help" || fail "--help exited nonzero"
grep -q -- "--dtype" "$tmp/help" || fail "--help lacks --dtype"

# Runtime failure: exit 1 with one line naming the file.
"$bin" convert --model "$tmp/nope.bin" --output "$tmp/y" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "missing model exited $rc, expected 1"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "missing model printed $(wc -l <"$tmp/err") lines"
grep -q "nope.bin" "$tmp/err" || fail "error does not name the file: $(cat "$tmp/err")"
echo "ok test_convert"
