#!/usr/bin/env bash
# tessera convert: llama2.c -> HF directory; files present, tokenizer copied, reloadable;
# GGUF output (f32/f16/bf16/q8_0) byte for byte the file whose tensors
# tools/gguf_convert_check.py checked against the gguf package's quantizer (the digests in
# tests/data/convert/expected.json), reloaded with the greedy tokens of --dtype q8_0 on the
# source; usage errors exit 2 with one line.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
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

# GGUF: each file's SHA-256 is the one tools/gguf_convert_check.py recorded after checking
# every tensor against gguf.quants.quantize of the source (rerun it to see which differs).
expected=$root/tests/data/convert/expected.json
want_sha() { # the file_sha256 of entry $1
    awk -v k="\"$1\": {" 'index($0, k) { f = 1 } f && /"file_sha256"/ {
        gsub(/[",]/, "", $2); print $2; exit }' "$expected"
}
for entry in stories260K.bin:q8_0 stories260K.bin:f32 stories260K.bin:f16 stories260K.bin:bf16 \
    arch/qwen2_f32:q8_0 arch/qwen3_f32:q8_0 arch/mistral_f32:q8_0; do
    src=${entry%%:*} dt=${entry##*:}
    case $src in
    *.bin) spec=$root/models/$src ;;
    *) spec=$root/tests/data/$src ;;
    esac
    name=$(basename "$src" .bin)_$dt
    g=$tmp/$name.gguf
    "$bin" convert --model "$spec" --output "$g" --dtype "$dt" 2>"$tmp/err" ||
        fail "convert to $name.gguf exited $? ($(cat "$tmp/err"))"
    [ -e "$g.tmp" ] && fail "$g.tmp left behind"
    want=$(want_sha "$name")
    [ -n "$want" ] || fail "no digest for $name in $expected"
    got=$(sha256sum "$g" | cut -d' ' -f1)
    [ "$got" = "$want" ] || fail "$name.gguf sha256 $got, expected $want (python3 \
tools/gguf_convert_check.py $spec $g $dt names the tensors that differ)"
done
grep -q "stored as GGUF keys" "$tmp/err" && fail "a model without a tokenizer reported one"
# the stories file carries its tokenizer: generate reads it from the GGUF alone and gives
# --dtype q8_0's greedy text on the source; the f32 file gives the source's own
gen() { "$bin" generate --model "$1" --prompt "Once upon a time" --max-tokens 24 \
    --temperature 0 --threads 1 "${@:2}" 2>"$tmp/gerr" || fail "generate $1 ($(cat "$tmp/gerr"))"; }
[ "$(gen "$tmp/stories260K_q8_0.gguf")" = \
  "$(gen "$root/models/stories260K.bin" --dtype q8_0)" ] || fail "q8_0 GGUF tokens differ"
[ "$(gen "$tmp/stories260K_f32.gguf")" = "$(gen "$root/models/stories260K.bin")" ] ||
    fail "f32 GGUF tokens differ"
# the vocabulary-256 models have no tokenizer: bench's greedy last token over the same ids
last() { "$bin" bench --model "$1" --prompt-tokens 8 --gen-tokens 12 --repeat 1 --warmup 0 \
    --threads 1 --json "${@:2}" 2>"$tmp/berr" | grep -o '"last_token":[0-9]*' ||
    fail "bench $1 ($(cat "$tmp/berr"))"; }
for m in qwen2_f32 qwen3_f32 mistral_f32; do
    [ "$(last "$tmp/${m}_q8_0.gguf")" = "$(last "$root/tests/data/arch/$m" --dtype q8_0)" ] ||
        fail "$m q8_0 GGUF greedy token differs"
done
# --format gguf writes GGUF whatever the name; --format hf with a .gguf name a directory
"$bin" convert --model "$root/models/stories260K.bin" --output "$tmp/plain" --format gguf \
    --dtype q8_0 2>"$tmp/err" || fail "--format gguf exited $? ($(cat "$tmp/err"))"
cmp -s "$tmp/plain" "$tmp/stories260K_q8_0.gguf" || fail "--format gguf wrote another file"
"$bin" convert --model "$root/models/stories260K.bin" --output "$tmp/dir.gguf" --format hf \
    2>"$tmp/err" || fail "--format hf exited $? ($(cat "$tmp/err"))"
[ -s "$tmp/dir.gguf/config.json" ] || fail "--format hf did not write a directory"

# Usage errors: exit 2, one line on stderr naming the problem.
"$bin" convert --model "$root/models/stories260K.bin" --output "$tmp/x" --dtype q8 \
    2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "bad --dtype exited $rc, expected 2"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "bad --dtype printed $(wc -l <"$tmp/err") lines"
grep -q "dtype" "$tmp/err" || fail "bad --dtype message does not mention dtype: $(cat "$tmp/err")"
[ -e "$tmp/x" ] && fail "bad --dtype still created $tmp/x"
for bad in "--dtype q8_0" "--format onnx" "--dtype q4_0 --format gguf"; do
    # shellcheck disable=SC2086
    "$bin" convert --model "$root/models/stories260K.bin" --output "$tmp/x" $bad 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || fail "convert $bad exited $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "convert $bad printed $(wc -l <"$tmp/err") lines"
    [ -e "$tmp/x" ] && fail "convert $bad still created $tmp/x"
done
"$bin" convert --output "$tmp/x" 2>"$tmp/err"
[ $? -eq 2 ] || fail "missing --model did not exit 2"
"$bin" convert --help >"$tmp/help" || fail "--help exited nonzero"
grep -q -- "--dtype" "$tmp/help" || fail "--help lacks --dtype"
grep -q -- "--format gguf|hf" "$tmp/help" || fail "--help lacks --format"
grep -q "q8_0" "$tmp/help" || fail "--help lacks q8_0"

# Runtime failure: exit 1 with one line naming the file.
"$bin" convert --model "$tmp/nope.bin" --output "$tmp/y" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "missing model exited $rc, expected 1"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "missing model printed $(wc -l <"$tmp/err") lines"
grep -q "nope.bin" "$tmp/err" || fail "error does not name the file: $(cat "$tmp/err")"
# A GGUF into a folder that does not exist: exit 1, one line naming it, nothing written.
"$bin" convert --model "$root/models/stories260K.bin" --output "$tmp/nodir/m.gguf" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "missing output folder exited $rc, expected 1"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "missing folder printed $(wc -l <"$tmp/err") lines"
grep -q "nodir/m.gguf" "$tmp/err" || fail "error does not name the output: $(cat "$tmp/err")"
echo "ok test_convert"
