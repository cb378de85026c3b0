#!/usr/bin/env bash
# tessera run's output that cannot be fooled (issue 30): two jobs on one output (the second
# refused with one line naming the holder, the first's records exact); a rerun after the
# input was edited (changed lines recomputed, their old records removed; another input's
# output refused); a non-UTF-8 line among good ones (one invalid_encoding record, the rest
# answered); a full file system mid-run (a tmpfs when this user may mount one, else the
# TSR_TEST_WRITE_FAIL_AFTER hook: no partial line, the checkpoint written, the rerun exact).
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }

prompts=("Once upon a time" "The little dog" "Lily wanted to" "One day, Tom saw a big"
    "The sun was" "Sam and Mia went to the park and" "There was a" "Mom said")
N=$(fenced_scale 48 16)
mkinput() { # $1 file, $2 prompt suffix for lines 3, 7, 11 (the edited ones)
    : >"$1"
    for i in $(seq 0 $((N - 1))); do
        p=${prompts[$((i % 8))]}
        if ((i % 4 == 3)) && ((i < 12)); then p="$p$2"; fi
        printf '{"custom_id": "r%02d", "url": "/v1/completions", "body": {"prompt": "%s", "max_tokens": %d, "temperature": 0.8, "seed": %d}}\n' \
            "$i" "$p" $((20 + i % 9)) "$i" >>"$1"
    done
}
RUN=(run --model "$MODEL" --threads 1 --max-batch-seqs 4 --max-batch-tokens 32
    --progress-interval 0 --quiet)
IN=$TMP/in.jsonl
mkinput "$IN" ""
"$BIN" "${RUN[@]}" --input "$IN" --output "$TMP/ref.jsonl" 2>"$TMP/err" ||
    fail "reference run: $(cat "$TMP/err")"
grep -q '"line_hash":"[0-9a-f]\{16\}"' "$TMP/ref.jsonl" || fail "records carry no line_hash"

# --- 1. two jobs on one output: the second is refused before it writes anything --------
OUT=$TMP/out.jsonl
"$BIN" "${RUN[@]}" --input "$IN" --output "$OUT" 2>"$TMP/a.err" &
apid=$!
for _ in $(seq 1 600); do [ -e "$OUT.lock" ] && break; sleep 0.02; done
# the first job is held stopped while the second tries, so the order does not depend on speed
kill -STOP $apid 2>/dev/null
[ -e "$OUT.lock" ] || fail "lock: no $OUT.lock while the first job runs"
before=$(nlines "$OUT")
"$BIN" "${RUN[@]}" --input "$IN" --output "$OUT" 2>"$TMP/b.err"
rc=$?
after=$(nlines "$OUT")
kill -CONT $apid 2>/dev/null
wait $apid || fail "lock: the first job failed: $(cat "$TMP/a.err")"
[ $rc -eq 1 ] || fail "lock: second job exit $rc, want 1: $(cat "$TMP/b.err")"
[ "$(wc -l <"$TMP/b.err")" -eq 1 ] || fail "lock: expected one line: $(cat "$TMP/b.err")"
grep -q "out.jsonl is in use by another job (pid $apid@" "$TMP/b.err" ||
    fail "lock: the line does not name the holder (pid $apid): $(cat "$TMP/b.err")"
[ "$before" -eq "$after" ] || fail "lock: the refused job changed the output"
[ "$before" -le "$(nlines "$OUT")" ] || fail "lock: output shrank"
same_records "$OUT" "$TMP/ref.jsonl" "lock"
[ -e "$OUT.lock" ] && fail "lock: the lock file was left behind"

# --- 2. a rerun after the input was edited --------------------------------------------
mkinput "$TMP/in2.jsonl" " and"
"$BIN" "${RUN[@]}" --input "$TMP/in2.jsonl" --output "$TMP/ref2.jsonl" 2>/dev/null ||
    fail "edited reference run failed"
cp "$IN" "$TMP/in_edit.jsonl"
cp "$OUT" "$TMP/out_edit.jsonl"
cp "$TMP/in2.jsonl" "$TMP/in_edit.jsonl"
"$BIN" run --model "$MODEL" --threads 1 --max-batch-seqs 4 --max-batch-tokens 32 \
    --progress-interval 0 --input "$TMP/in_edit.jsonl" --output "$TMP/out_edit.jsonl" \
    2>"$TMP/err" || fail "edited rerun: $(cat "$TMP/err")"
grep -q "3 records superseded" "$TMP/err" || fail "edited rerun: no superseded line: $(cat "$TMP/err")"
grep -q "$N requests: 3 ok, 0 failed, $((N - 3)) skipped" "$TMP/err" ||
    fail "edited rerun: expected 3 recomputed: $(cat "$TMP/err")"
same_records "$TMP/out_edit.jsonl" "$TMP/ref2.jsonl" "edited rerun"
# another input's output: refused with one line, the output untouched
sed 's/"r\([0-9]*\)"/"x\1"/' "$IN" >"$TMP/other.jsonl"
cp "$OUT" "$TMP/out_keep.jsonl"
"$BIN" "${RUN[@]}" --input "$TMP/other.jsonl" --output "$OUT" 2>"$TMP/err"
rc=$?
[ $rc -eq 1 ] || fail "foreign: exit $rc"
[ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "another input's output" "$TMP/err" ||
    fail "foreign: expected one line: $(cat "$TMP/err")"
cmp -s "$OUT" "$TMP/out_keep.jsonl" || fail "foreign: the output was changed"

# --- 3. a non-UTF-8 line among good ones ----------------------------------------------
{ head -n 2 "$IN"; printf '{"custom_id": "lat", "url": "/v1/completions", "body": {"prompt": "caf\xe9"}}\n'; sed -n 3,4p "$IN"; } >"$TMP/lat.jsonl"
"$BIN" "${RUN[@]}" --input "$TMP/lat.jsonl" --output "$TMP/lat_out.jsonl" 2>"$TMP/err" ||
    fail "latin1: exit non-zero: $(cat "$TMP/err")"
python3 - "$TMP/lat_out.jsonl" <<'PY' || fail "latin1: records wrong"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert len(recs) == 5, len(recs)
bad = [r for r in recs if r["error"]]
assert len(bad) == 1 and bad[0]["custom_id"] == "lat", bad
assert bad[0]["error"]["code"] == "invalid_encoding" and bad[0]["error"]["line"] == 3, bad
PY

# --- 4. a full file system mid-run ----------------------------------------------------
MNT=$TMP/mnt
mkdir -p "$MNT"
mounted=0
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=12k tmpfs "$MNT" 2>/dev/null; then
    mounted=1
    trap 'umount "$MNT" 2>/dev/null' EXIT
    FAULT=()
else
    echo "note: cannot mount a tmpfs: a write error is injected after 6000 bytes"
    FAULT=(env TSR_TEST_WRITE_FAIL_AFTER=6000)
fi
CK=()
"$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/x.jsonl" --checkpoint "$TMP/x.h5" \
    2>&1 | grep -q "this build has no HDF5" || CK=(--checkpoint "$TMP/full.h5")
"${FAULT[@]}" "$BIN" "${RUN[@]}" "${CK[@]}" --input "$IN" --output "$MNT/full.jsonl" 2>"$TMP/err"
rc=$?
[ $rc -eq 1 ] || fail "full: exit $rc: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "full: expected one line: $(cat "$TMP/err")"
grep -q "kept [0-9]* whole records" "$TMP/err" || fail "full: no 'kept' in: $(cat "$TMP/err")"
[ -s "$MNT/full.jsonl" ] && [ "$(tail -c 1 "$MNT/full.jsonl" | od -An -c | tr -d ' ')" = '\n' ] ||
    fail "full: the output ends in a partial line"
python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$MNT/full.jsonl" ||
    fail "full: a line is not JSON"
if [ ${#CK[@]} -gt 0 ]; then
    [ -s "$TMP/full.h5" ] || fail "full: no checkpoint written"
    grep -q "checkpoint: [0-9]* in-flight requests saved" "$TMP/err" ||
        fail "full: the line does not mention the checkpoint: $(cat "$TMP/err")"
fi
if [ $mounted -eq 1 ]; then
    mount -o remount,size=1m "$MNT" || fail "full: remount"
fi
"$BIN" "${RUN[@]}" "${CK[@]}" --input "$IN" --output "$MNT/full.jsonl" 2>"$TMP/err" ||
    fail "full: the rerun failed: $(cat "$TMP/err")"
same_records "$MNT/full.jsonl" "$TMP/ref.jsonl" "full rerun"
cmp -s <(grep -o '"line_hash":"[0-9a-f]*"' "$MNT/full.jsonl" | sort) \
    <(grep -o '"line_hash":"[0-9a-f]*"' "$TMP/ref.jsonl" | sort) ||
    fail "full rerun: the records' line hashes differ from the reference run's"

[ $fails -eq 0 ] || exit 1
echo "test_run_bound: ok"
