#!/usr/bin/env bash
# tessera run --checkpoint: a SIGTERM mid-run saves every in-flight request (scheduler state,
# sampler, text, KV rows) to HDF5 and exits 3; the rerun resumes them where they stopped, so
# the records equal an uninterrupted run's token for token (greedy and seeded sampling) and
# the in-flight prompts are not prefilled again. Mismatched jobs (policy, weights, edited
# output) and a truncated file are refused with one line; tests/cli/test_checkpoint_bind.sh
# checks the rest of the binding (another job's checkpoint, other input lines, bit flips,
# --checkpoint-discard). Skipped (exit 77) in a build without HDF5.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if "$BIN" run --model "$MODEL" --input /dev/null --output "$TMP/x.jsonl" \
    --checkpoint "$TMP/x.h5" 2>&1 | grep -q "this build has no HDF5"; then
    echo "test_run_checkpoint: skipped (built without HDF5)"
    exit 77
fi
command -v python3 >/dev/null 2>&1 || { echo "test_run_checkpoint: skipped (no python3)"; exit 77; }

N=$(fenced_scale 100 30)
IN=$TMP/in.jsonl
# Prompts shorter than a KV block (16 tokens), so no prefix-cache hit makes a resumed run's
# schedule differ from the uninterrupted one's.
python3 - "$IN" "$N" <<'PY'
import json, sys
prompts = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a cat",
           "Tom and Sue", "The sun was"]
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        body = {"prompt": prompts[i % 6], "max_tokens": 60 + (i * 7) % 80}
        if i % 2:
            body.update(temperature=0.9, seed=i, top_p=0.95)
        if i % 10 == 3:
            body["stop"] = ["."]
        f.write(json.dumps({"custom_id": "r-%03d" % i, "url": "/v1/completions",
                            "body": body}) + "\n")
PY

# run_and_term OUT CKPT ERR [args]: starts a run, SIGTERMs it once it wrote 15 records;
# sets rc.
run_and_term() {
    local out=$1 ck=$2 err=$3
    shift 3
    "$BIN" run "$@" --output "$out" --checkpoint "$ck" 2>"$err" &
    term_after $! "$out" 15
    rc=$?
}

prefill() {
    python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["scheduler"]["prefill_tokens"])' "$1"
}

for policy in paged h2o; do
    ARGS=(--model "$MODEL" --input "$IN" --max-batch-seqs 8 --threads 1 --progress-interval 0
        --kv-policy "$policy")
    [ "$policy" = h2o ] && ARGS+=(--kv-budget 24)
    D=$TMP/$policy
    mkdir -p "$D"
    "$BIN" run "${ARGS[@]}" --output "$D/full.jsonl" --quiet || fail "$policy: full run failed"

    run_and_term "$D/a.jsonl" "$D/ck.h5" "$D/a.err" "${ARGS[@]}"
    [ $rc -eq 3 ] || fail "$policy: SIGTERM: exit $rc, want 3: $(cat "$D/a.err")"
    [ -f "$D/ck.h5" ] || fail "$policy: no checkpoint after SIGTERM"
    [ -f "$D/ck.h5.tmp" ] && fail "$policy: the temporary file was left"
    grep -q "checkpoint: [1-9][0-9]* in-flight requests saved to $D/ck.h5" "$D/a.err" ||
        fail "$policy: no checkpoint line: $(cat "$D/a.err")"
    na=$(nlines "$D/a.jsonl")
    [ "$na" -lt $N ] || fail "$policy: the run finished before the signal"

    # A copy resumed without the checkpoint recomputes the in-flight requests.
    cp "$D/a.jsonl" "$D/r.jsonl"
    "$BIN" run "${ARGS[@]}" --output "$D/r.jsonl" --quiet --metrics "$D/r.json" ||
        fail "$policy: plain resume failed"
    cp "$D/ck.h5" "$D/ck.keep"

    # `tessera checkpoint inspect`: the binding, the requests, the KV bytes per layer.
    "$BIN" checkpoint inspect "$D/ck.h5" >"$D/inspect.txt" 2>"$D/inspect.err" ||
        fail "$policy: inspect failed: $(cat "$D/inspect.err")"
    grep -q "^checkpoint $D/ck.h5: format 3, checksum ok$" "$D/inspect.txt" &&
        grep -q "^policy: $policy " "$D/inspect.txt" &&
        grep -q "^written by: tp 1 x pp 1 (1 rank); resumes on any layout$" "$D/inspect.txt" &&
        grep -Eq "^requests: [1-9][0-9]* \([1-9][0-9]* running with KV" "$D/inspect.txt" &&
        grep -Eq "^  layer 4: [1-9][0-9]* rows x 4 KV heads x 8, [0-9]+ bytes$" "$D/inspect.txt" ||
        fail "$policy: inspect output: $(cat "$D/inspect.txt")"
    head -c 3000 "$D/ck.h5" >"$D/ins_trunc.h5"
    "$BIN" checkpoint inspect "$D/ins_trunc.h5" >/dev/null 2>"$D/inspect.err" &&
        fail "$policy: inspect accepted a truncated file"
    [ "$(wc -l <"$D/inspect.err")" -eq 1 ] || fail "$policy: inspect: $(cat "$D/inspect.err")"

    # Mismatches, refused before anything changes: model, policy, output records.
    other=$([ "$policy" = paged ] && echo h2o || echo paged)
    "$BIN" run "${ARGS[@]}" --kv-policy "$other" --output "$D/a.jsonl" \
        --checkpoint "$D/ck.h5" --quiet 2>"$D/m.err"
    rc=$?
    [ $rc -eq 1 ] || fail "$policy: policy mismatch: exit $rc, want 1"
    grep -q "^tessera run: $D/ck.h5: checkpoint policy is \"$policy\", this job has \"$other\"" \
        "$D/m.err" || fail "$policy: policy mismatch line: $(cat "$D/m.err")"
    [ "$(wc -l <"$D/m.err")" -eq 1 ] || fail "$policy: policy mismatch: more than one line"
    # Other weights at the same shapes (a copy with 8 bytes changed inside the token
    # embedding, after the 28-byte llama2.c header): the model's content is its identity.
    python3 - "$MODEL" "$D/other.bin" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[28 + 4000:28 + 4008] = bytes(8)
open(sys.argv[2], "wb").write(b)
PY
    "$BIN" run "${ARGS[@]}" --model "$D/other.bin" --tokenizer "$ROOT/models/tok512.bin" \
        --output "$D/a.jsonl" --checkpoint "$D/ck.h5" --quiet 2>"$D/m2.err"
    rc=$?
    [ $rc -eq 1 ] || fail "$policy: model mismatch: exit $rc, want 1"
    grep -q "ck.h5: checkpoint model .*stories260K.bin has other weights than this job's model .*other.bin" \
        "$D/m2.err" || fail "$policy: model mismatch line: $(cat "$D/m2.err")"
    [ "$(wc -l <"$D/m2.err")" -eq 1 ] || fail "$policy: model mismatch: more than one line"
    cp "$D/a.jsonl" "$D/a.bak"
    head -n $((na - 1)) "$D/a.bak" >"$D/a.jsonl"
    "$BIN" run "${ARGS[@]}" --output "$D/a.jsonl" --checkpoint "$D/ck.h5" --quiet \
        2>"$D/m3.err"
    rc=$?
    [ $rc -eq 1 ] || fail "$policy: edited output: exit $rc, want 1"
    grep -q "ck.h5: checkpoint was written when .* held $na records, it holds $((na - 1)) now" \
        "$D/m3.err" || fail "$policy: edited output line: $(cat "$D/m3.err")"
    cp "$D/a.bak" "$D/a.jsonl"
    [ "$(nlines "$D/a.jsonl")" -eq "$na" ] || fail "$policy: a refused run changed the output"

    # The resume: every id once, the uninterrupted run's texts, fewer prefill tokens.
    "$BIN" run "${ARGS[@]}" --output "$D/a.jsonl" --checkpoint "$D/ck.h5" \
        --metrics "$D/a.json" 2>"$D/a2.err"
    rc=$?
    [ $rc -eq 0 ] || fail "$policy: resume exited $rc: $(cat "$D/a2.err")"
    grep -q "resuming [1-9][0-9]* in-flight requests from $D/ck.h5" "$D/a2.err" ||
        fail "$policy: no resume line: $(cat "$D/a2.err")"
    [ -f "$D/ck.h5" ] && fail "$policy: the checkpoint is left after a clean finish"
    same_records "$D/a.jsonl" "$D/full.jsonl" "$policy resume"
    pa=$(prefill "$D/a.json")
    pr=$(prefill "$D/r.json")
    [ "$pa" -lt "$pr" ] ||
        fail "$policy: resumed run prefilled $pa tokens, recomputing prefilled $pr"

    # A truncated checkpoint: one error line, exit 1, never a crash.
    head -c 3000 "$D/ck.keep" >"$D/trunc.h5"
    head -n "$na" "$D/a.jsonl" >"$D/t.jsonl"
    "$BIN" run "${ARGS[@]}" --output "$D/t.jsonl" --checkpoint "$D/trunc.h5" --quiet \
        2>"$D/t.err"
    rc=$?
    [ $rc -eq 1 ] || fail "$policy: truncated checkpoint: exit $rc, want 1: $(cat "$D/t.err")"
    grep -q "^tessera run: $D/trunc.h5: .*checkpoint" "$D/t.err" ||
        fail "$policy: truncated checkpoint line: $(cat "$D/t.err")"
    [ "$(wc -l <"$D/t.err")" -eq 1 ] || fail "$policy: truncated checkpoint: more than one line"
done

# A per-rank checkpoint of format 2 (FILE.rank<R>.h5) is refused with one line, never read.
mkdir -p "$TMP/old"
echo "not read" >"$TMP/old/ck.rank0.h5"
"$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/old/o.jsonl" \
    --checkpoint "$TMP/old/ck.h5" --quiet 2>"$TMP/old/err"
rc=$?
[ $rc -eq 1 ] || fail "format 2: exit $rc, want 1"
grep -q "^tessera run: $TMP/old/ck.rank0.h5: a per-rank checkpoint of an older tessera (format 2)" \
    "$TMP/old/err" || fail "format 2: $(cat "$TMP/old/err")"
[ "$(wc -l <"$TMP/old/err")" -eq 1 ] || fail "format 2: more than one line"
[ -f "$TMP/old/o.jsonl" ] && [ "$(nlines "$TMP/old/o.jsonl")" -gt 0 ] && fail "format 2: ran"

"$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/o.jsonl" --kv-policy offload \
    --checkpoint "$TMP/o.h5" 2>"$TMP/o.err"
rc=$?
[ $rc -eq 2 ] || fail "offload: exit $rc, want 2"
grep -q "does not support --kv-policy offload" "$TMP/o.err" || fail "offload: $(cat "$TMP/o.err")"
"$BIN" run --help | grep -q -- "--checkpoint" || fail "--help does not list --checkpoint"

if [ $fails -ne 0 ]; then
    echo "test_run_checkpoint: $fails failure(s)" >&2
    exit 1
fi
echo "test_run_checkpoint: ok"
