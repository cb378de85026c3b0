#!/usr/bin/env bash
# tessera run --dtype: the bulk job quantizes at load as generate does. Its records equal a
# run on the same model converted to a Q8_0 GGUF by `tessera convert --dtype q8_0` (the
# gguf package's bytes: an independent quantization of the same weights); 4-bit dtypes run;
# a bad value is one usage line. A checkpoint records the dtype the weights ran in: a
# --dtype q8_0 job stopped by SIGTERM resumes exactly with --dtype q8_0 and is refused
# without it (HDF5 builds). Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
command -v python3 >/dev/null 2>&1 || { echo "test_run_dtype: skipped (no python3)"; exit 77; }
IN=$ROOT/examples/prompts.jsonl
ARGS=(--max-batch-seqs 8 --threads 1 --quiet)

# 1. --dtype q8_0 at load against a Q8_0 GGUF written by convert.
"$BIN" convert --model "$MODEL" --dtype q8_0 --output "$TMP/s260.q8_0.gguf" >/dev/null 2>"$TMP/err" ||
    fail "convert --dtype q8_0: $(cat "$TMP/err")"
"$BIN" run --model "$MODEL" --dtype q8_0 --input "$IN" --output "$TMP/q8.jsonl" "${ARGS[@]}" \
    2>"$TMP/err" || fail "run --dtype q8_0: $(cat "$TMP/err")"
"$BIN" run --model "$TMP/s260.q8_0.gguf" --input "$IN" --output "$TMP/gguf.jsonl" "${ARGS[@]}" \
    2>"$TMP/err" || fail "run on the Q8_0 GGUF: $(cat "$TMP/err")"
[ "$(nlines "$TMP/q8.jsonl")" -eq 30 ] || fail "run --dtype q8_0: $(nlines "$TMP/q8.jsonl") records, want 30"
same_records "$TMP/gguf.jsonl" "$TMP/q8.jsonl" "run --dtype q8_0 against the converted Q8_0 GGUF"
"$BIN" run --model "$MODEL" --dtype q8_0 --input /dev/null --output "$TMP/v.jsonl" --verbose \
    2>"$TMP/err" || fail "run --dtype q8_0 --verbose: $(cat "$TMP/err")"
grep -q "q8_0" "$TMP/err" || fail "run --dtype q8_0 --verbose does not say q8_0: $(cat "$TMP/err")"

# 2. The 4-bit dtypes run the whole input.
for dt in q4_0 q4_1; do
    "$BIN" run --model "$MODEL" --dtype $dt --input "$IN" --output "$TMP/$dt.jsonl" "${ARGS[@]}" \
        2>"$TMP/err" && [ "$(nlines "$TMP/$dt.jsonl")" -eq 30 ] ||
        fail "run --dtype $dt: $(cat "$TMP/err")"
done

# 3. A bad value: exit 2, one line, no output file.
"$BIN" run --model "$MODEL" --dtype q3_k --input "$IN" --output "$TMP/bad.jsonl" 2>"$TMP/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--dtype 'q3_k'" "$TMP/err" &&
    [ ! -e "$TMP/bad.jsonl" ] || fail "--dtype q3_k: exit $rc, $(cat "$TMP/err")"

# 4. Checkpoints are bound to the dtype.
if "$BIN" run --model "$MODEL" --input /dev/null --output "$TMP/x.jsonl" \
    --checkpoint "$TMP/x.h5" 2>&1 | grep -q "no HDF5"; then
    echo "test_run_dtype: checkpoint part skipped (built without HDF5)"
else
    N=$(fenced_scale 60 30)
    python3 - "$TMP/many.jsonl" "$N" <<'PY'
import json, sys
prompts = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a cat"]
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        body = {"prompt": prompts[i % 4], "max_tokens": 30 + (i * 7) % 50}
        f.write(json.dumps({"custom_id": "r-%03d" % i, "url": "/v1/completions",
                            "body": body}) + "\n")
PY
    CK=(--model "$MODEL" --dtype q8_0 --input "$TMP/many.jsonl" --max-batch-seqs 8 --threads 1
        --progress-interval 0)
    "$BIN" run "${CK[@]}" --output "$TMP/full.jsonl" --quiet || fail "uninterrupted q8_0 run failed"
    "$BIN" run "${CK[@]}" --output "$TMP/ck.jsonl" --checkpoint "$TMP/ck.h5" 2>"$TMP/stop.err" &
    term_after $! "$TMP/ck.jsonl" 10
    rc=$?
    if [ $rc -ne 3 ] || [ ! -f "$TMP/ck.h5" ]; then
        fail "SIGTERM of the q8_0 job: exit $rc, want 3 and a checkpoint: $(cat "$TMP/stop.err")"
    else
        cp "$TMP/ck.jsonl" "$TMP/ck.at_stop"
        "$BIN" run --model "$MODEL" --input "$TMP/many.jsonl" --max-batch-seqs 8 --threads 1 \
            --output "$TMP/ck.jsonl" --checkpoint "$TMP/ck.h5" --quiet 2>"$TMP/err"
        rc=$?
        [ $rc -eq 1 ] && grep -q 'checkpoint dtype is "q8_0"' "$TMP/err" ||
            fail "resume without --dtype: exit $rc, want 1 and the dtype named: $(cat "$TMP/err")"
        cmp -s "$TMP/ck.jsonl" "$TMP/ck.at_stop" || fail "the refused resume changed the output"
        "$BIN" run "${CK[@]}" --output "$TMP/ck.jsonl" --checkpoint "$TMP/ck.h5" --quiet \
            2>"$TMP/err" || fail "resume with --dtype q8_0: $(cat "$TMP/err")"
        same_records "$TMP/full.jsonl" "$TMP/ck.jsonl" "q8_0 job resumed from its checkpoint"
    fi
fi

[ $fails -eq 0 ] || exit 1
echo "test_run_dtype: ok"
