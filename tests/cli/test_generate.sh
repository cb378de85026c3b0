#!/usr/bin/env bash
# CLI behaviour of `tessera generate`: bad input gives one stderr line naming the problem
# and a non-zero exit; a good run prints the reference story.
# args: $1 tessera binary, $2 repo root, $3 scratch dir
set -u
BIN=$1 ROOT=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP"
MODEL=$ROOT/models/stories260K.bin
fails=0 passes=0

# expect NAME EXIT_CODE STDERR_SUBSTRING -- command...
expect() {
    local name=$1 code=$2 needle=$3
    shift 4
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$? lines
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -ne "$code" ] || ! grep -qF -- "$needle" "$TMP/err" || { [ "$code" -ne 0 ] && [ "$lines" -ne 1 ]; }; then
        echo "FAIL $name: exit $rc (want $code), stderr ($lines lines):"; cat "$TMP/err"
        fails=$((fails + 1))
    else
        echo "ok   $name"; passes=$((passes + 1))
    fi
}

expect empty_prompt 1 "empty prompt" -- "$BIN" generate --model "$MODEL" --prompt ""
: >"$TMP/empty.txt"
expect empty_prompt_file 1 "$TMP/empty.txt: empty prompt" -- "$BIN" generate --model "$MODEL" --prompt-file "$TMP/empty.txt"
expect missing_model 1 "$TMP/nope.bin: model not found" -- "$BIN" generate --model "$TMP/nope.bin" --prompt hi
head -c 1000 "$MODEL" >"$TMP/trunc.bin"
expect truncated_model 1 "$TMP/trunc.bin: header sizes disagree with the file size" -- "$BIN" generate --model "$TMP/trunc.bin" --prompt hi
head -c 10 "$MODEL" >"$TMP/tiny.bin"
expect truncated_header 1 "$TMP/tiny.bin: truncated" -- "$BIN" generate --model "$TMP/tiny.bin" --prompt hi
expect prompt_too_long 1 "does not fit the context of 8 tokens" -- "$BIN" generate --model "$MODEL" --max-context 8 --prompt "Once upon a time there was a little girl named Lily who"
expect bad_option 2 "unknown option '--frobnicate'" -- "$BIN" generate --model "$MODEL" --prompt hi --frobnicate
expect bad_value 2 "invalid value 'abc' for --max-tokens" -- "$BIN" generate --model "$MODEL" --prompt hi --max-tokens abc
expect no_prompt 2 "give exactly one of --prompt and --prompt-file" -- "$BIN" generate --model "$MODEL"
expect no_model 2 "--model is required" -- "$BIN" generate --prompt hi
expect bad_top_p 2 "--top-p must be in (0, 1]" -- "$BIN" generate --model "$MODEL" --prompt hi --top-p 0
expect missing_tokenizer 1 "tokenizer" -- "$BIN" generate --model "$MODEL" --prompt hi --tokenizer "$TMP/none.bin"
expect bad_policy 2 "--kv-policy bogus: unknown (use paged|h2o|offload|snapkv|streaming)" -- "$BIN" generate --model "$MODEL" --prompt hi --kv-policy bogus
expect tiny_kv_memory 1 "holds no block" -- "$BIN" generate --model "$MODEL" --prompt hi --kv-memory 1K
expect bad_kv_memory 2 "invalid size '12Q' for --kv-memory" -- "$BIN" generate --model "$MODEL" --prompt hi --kv-memory 12Q
expect unknown_command 2 "unknown command 'frob'" -- "$BIN" frob

# --version: the version, then the build's facts on this machine (kernels, BLAS, MPI, where
# the modules are), opening no module (LD_DEBUG=files lists every object the loader maps).
"$BIN" --version >"$TMP/version" 2>"$TMP/err"
rc=$?
TSR_CPU_ISA=scalar "$BIN" --version >"$TMP/version_scalar" 2>&1
LD_DEBUG=files "$BIN" --version >/dev/null 2>"$TMP/ld_debug"
if [ $rc -eq 0 ] && [ ! -s "$TMP/err" ] && head -n 1 "$TMP/version" | grep -qE '^tessera [0-9]+\.[0-9]+\.[0-9]+$' &&
    grep -qE '^cpu kernels +(avx512|avx2|scalar)( \([^)]*\))?; quantized products ' "$TMP/version" &&
    grep -qE '^blas +OpenBLAS ' "$TMP/version" && grep -qE '^hdf5 module ' "$TMP/version" &&
    grep -qE '^cpu kernels +scalar; quantized products scalar ' "$TMP/version_scalar" &&
    ! grep -q 'libtessera-' "$TMP/ld_debug"; then
    echo "ok   version"; passes=$((passes + 1))
else
    echo "FAIL version (exit $rc):"; cat "$TMP/version" "$TMP/err" "$TMP/version_scalar"
    grep 'libtessera-' "$TMP/ld_debug"; fails=$((fails + 1))
fi

# --help tells the truth: every option the parser knows is listed.
if "$BIN" generate --help >"$TMP/help" && grep -q -- "--max-context N" "$TMP/help" && grep -q -- "--prompt-file PATH" "$TMP/help"; then
    echo "ok   help"; passes=$((passes + 1))
else
    echo "FAIL help"; fails=$((fails + 1))
fi

# Greedy generation prints the HF reference continuation (tests/data/golden).
GOLD=$ROOT/tests/data/golden/stories260K_greedy.txt
if [ -f "$GOLD" ]; then
    "$BIN" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 64 --temperature 0 >"$TMP/story" 2>"$TMP/err"
    if cmp -s "$TMP/story" "$GOLD"; then
        echo "ok   greedy_matches_reference"; passes=$((passes + 1))
    else
        echo "FAIL greedy_matches_reference"; diff "$TMP/story" "$GOLD" | head; cat "$TMP/err"; fails=$((fails + 1))
    fi
    # Every KV policy with a 100 % budget gives the reference tokens.
    for pol in paged h2o offload snapkv streaming; do
        if "$BIN" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 64 --temperature 0 \
            --kv-policy $pol --kv-budget 1 --block-size 8 --stats >"$TMP/story_$pol" 2>"$TMP/err" &&
            cmp -s "$TMP/story_$pol" "$GOLD" && grep -q "\"policy\":\"$pol\"" "$TMP/err"; then
            echo "ok   greedy_policy_$pol"; passes=$((passes + 1))
        else
            echo "FAIL greedy_policy_$pol"; cat "$TMP/err"; fails=$((fails + 1))
        fi
    done
    # Same tokens again through the converted Hugging Face directory.
    if "$BIN" convert --model "$MODEL" --output "$TMP/hf" >/dev/null 2>"$TMP/err" &&
        "$BIN" generate --model "$TMP/hf" --prompt "Once upon a time" --max-tokens 64 --temperature 0 >"$TMP/story_hf" 2>>"$TMP/err" &&
        cmp -s "$TMP/story_hf" "$GOLD"; then
        echo "ok   greedy_hf_dir_matches_reference"; passes=$((passes + 1))
    else
        echo "FAIL greedy_hf_dir_matches_reference"; cat "$TMP/err"; fails=$((fails + 1))
    fi
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
