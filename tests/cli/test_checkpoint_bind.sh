#!/usr/bin/env bash
# tessera run --checkpoint: a checkpoint is bound to its job and checksummed. Two jobs with
# the same --output/--checkpoint names in their own folders (as two array tasks would run)
# are stopped by SIGTERM; then each of these is refused with one line naming the checkpoint,
# exit 1, and the output left as it was: the other job's checkpoint (swapped), this job's
# checkpoint with other input lines (edited, shorter), other weights at the same shapes,
# another tokenizer, truncations, and bit flips, of which every one is refused or, when it
# hits bytes nothing reads, provably harmless: the resume equals the uninterrupted run.
# The same model at another path resumes exactly; --checkpoint-discard drops a checkpoint
# that does not fit (or is damaged) and recomputes its requests, again exactly.
# tests/cli/test_run_checkpoint.sh covers the matching resume, policy and record checks.
# Skipped (exit 77) in a build without HDF5. Args: $1 tessera binary, $2 repo root, $3 dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if "$BIN" run --model "$MODEL" --input /dev/null --output "$TMP/x.jsonl" \
    --checkpoint "$TMP/x.h5" 2>&1 | grep -q "this build has no HDF5"; then
    echo "test_checkpoint_bind: skipped (built without HDF5)"
    exit 77
fi
command -v python3 >/dev/null 2>&1 || { echo "test_checkpoint_bind: skipped (no python3)"; exit 77; }
# Sanitize build: HDF5's own losses on corrupt files are not tessera's (tests/lsan.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/lsan.supp:print_suppressions=0}

N=$(fenced_scale 60 30)
FLIPS=$(fenced_scale 16 8)
# Job A's and job B's inputs: the same custom_ids, other prompts. Prompts shorter than a KV
# block, so no prefix-cache hit makes a resumed schedule differ from the uninterrupted one.
python3 - "$TMP" "$N" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
sets = {"a": ["Once upon a time", "The little dog", "Lily wanted to", "One day, a cat"],
        "b": ["Tom and Sue", "The sun was", "A big red ball", "Mom said"]}
def line(i, prompts, extra=0):
    body = {"prompt": prompts[i % 4], "max_tokens": 30 + (i * 7) % 50 + extra}
    if i % 2:
        body.update(temperature=0.9, seed=i, top_p=0.95)
    return json.dumps({"custom_id": "r-%03d" % i, "url": "/v1/completions", "body": body})
for name, prompts in sets.items():
    with open("%s/in_%s.jsonl" % (d, name), "w") as f:
        f.writelines(line(i, prompts) + "\n" for i in range(n))
with open(d + "/in_edit.jsonl", "w") as f:  # job A's lines, each asking one token more
    f.writelines(line(i, sets["a"], 1) + "\n" for i in range(n))
with open(d + "/in_short.jsonl", "w") as f:  # job A's first 10 lines
    f.writelines(line(i, sets["a"]) + "\n" for i in range(10))
PY

ARGS=(--model "$MODEL" --max-batch-seqs 8 --threads 1 --progress-interval 0)
DA=$TMP/job_a
DB=$TMP/job_b
mkdir -p "$DA" "$DB"

# stop_job DIR INPUT: runs the job in DIR (out.jsonl, ck.h5), SIGTERM after 15 records.
stop_job() {
    (cd "$1" && exec "$BIN" run "${ARGS[@]}" --input "$2" --output out.jsonl \
        --checkpoint ck.h5 2>stop.err) &
    term_after $! "$1/out.jsonl" 15
    local rc=$?
    [ $rc -eq 3 ] || fail "$1: SIGTERM: exit $rc, want 3: $(cat "$1/stop.err")"
    [ -f "$1/ck.h5" ] || fail "$1: no checkpoint after SIGTERM"
}

"$BIN" run "${ARGS[@]}" --input "$TMP/in_a.jsonl" --output "$TMP/full.jsonl" --quiet ||
    fail "full run failed"
stop_job "$DA" "$TMP/in_a.jsonl"
stop_job "$DB" "$TMP/in_b.jsonl"
cp "$DA/ck.h5" "$TMP/a.ck"
cp "$DA/out.jsonl" "$TMP/a.out"
cp "$DB/ck.h5" "$TMP/b.ck"
na=$(nlines "$TMP/a.out")
[ "$na" -lt "$N" ] || fail "job A finished before the signal"

# resume_a CKPT ERR [args]: job A's command on its output as it was at the stop, with CKPT
# as its checkpoint (ck.h5 in its folder); sets rc.
resume_a() {
    local ck=$1 err=$2
    shift 2
    cp "$TMP/a.out" "$DA/out.jsonl"
    rm -f "$DA/ck.h5"
    cp "$ck" "$DA/ck.h5"
    (cd "$DA" && exec "$BIN" run "${ARGS[@]}" --input "$TMP/in_a.jsonl" --output out.jsonl \
        --checkpoint ck.h5 --quiet "$@") 2>"$err"
    rc=$?
}

# refused WHAT ERR PATTERN: exit 1, one line matching PATTERN, the output as it was, the
# checkpoint still there.
refused() {
    [ $rc -eq 1 ] || fail "$1: exit $rc, want 1: $(cat "$2")"
    grep -Eq "$3" "$2" || fail "$1: line: $(cat "$2")"
    [ "$(wc -l <"$2")" -eq 1 ] || fail "$1: more than one line: $(cat "$2")"
    cmp -s "$DA/out.jsonl" "$TMP/a.out" || fail "$1: a refused run changed the output"
    [ -f "$DA/ck.h5" ] || fail "$1: a refused run removed the checkpoint"
}

body_line='^tessera run: ck\.h5: checkpoint request r-([0-9]+) has another body than this job.s input line ([0-9]+)$'
# the named request is the one on that line (r-NNN is line NNN + 1)
named_line() {
    python3 -c 'import re, sys
m = re.search(r"request r-(\d+) .* line (\d+)$", open(sys.argv[1]).read().strip())
sys.exit(0 if m and int(m.group(1)) + 1 == int(m.group(2)) else 1)' "$1" ||
        fail "$2: the line names another request than its line: $(cat "$1")"
}

# Swapped: job B's checkpoint in job A's folder (same names, same model, same options).
resume_a "$TMP/b.ck" "$TMP/swap.err"
refused swapped "$TMP/swap.err" "$body_line"
named_line "$TMP/swap.err" swapped

# Other input: job A's own checkpoint, its input lines edited, or cut short.
cp "$TMP/a.out" "$DA/out.jsonl"
cp "$TMP/a.ck" "$DA/ck.h5"
(cd "$DA" && exec "$BIN" run "${ARGS[@]}" --input "$TMP/in_edit.jsonl" --output out.jsonl \
    --checkpoint ck.h5 --quiet) 2>"$TMP/edit.err"
rc=$?
refused "other input" "$TMP/edit.err" "$body_line"
named_line "$TMP/edit.err" "other input"
(cd "$DA" && exec "$BIN" run "${ARGS[@]}" --input "$TMP/in_short.jsonl" --output out.jsonl \
    --checkpoint ck.h5 --quiet) 2>"$TMP/short.err"
rc=$?
refused "short input" "$TMP/short.err" \
    "^tessera run: ck\.h5: checkpoint request r-[0-9]+ is input line [0-9]+, this job.s input .*in_short\.jsonl has 10 lines$"

# Other weights at the same shapes: 8 bytes changed in the token embedding (after the
# 28-byte llama2.c header); another tokenizer: the first token's score changed.
python3 - "$MODEL" "$ROOT/models/tok512.bin" "$TMP" <<'PY'
import sys
m = bytearray(open(sys.argv[1], "rb").read())
m[28 + 20000:28 + 20008] = b"\x01" * 8
open(sys.argv[3] + "/other.bin", "wb").write(m)
t = bytearray(open(sys.argv[2], "rb").read())
t[4] ^= 0x01
open(sys.argv[3] + "/tok_other.bin", "wb").write(t)
PY
resume_a "$TMP/a.ck" "$TMP/model.err" --model "$TMP/other.bin" --tokenizer "$ROOT/models/tok512.bin"
refused "other model" "$TMP/model.err" \
    "^tessera run: ck\.h5: checkpoint model .*stories260K\.bin has other weights than this job.s model .*other\.bin"
resume_a "$TMP/a.ck" "$TMP/tok.err" --tokenizer "$TMP/tok_other.bin"
refused "other tokenizer" "$TMP/tok.err" \
    "^tessera run: ck\.h5: checkpoint tokenizer .*tok512\.bin differs from this job.s tokenizer .*tok_other\.bin"

# Truncated anywhere.
size=$(wc -c <"$TMP/a.ck")
for cut in 0 100 2048 $((size / 2)) $((size - 1)); do
    head -c "$cut" "$TMP/a.ck" >"$TMP/cut.ck"
    resume_a "$TMP/cut.ck" "$TMP/cut.err"
    refused "truncated to $cut bytes" "$TMP/cut.err" "^tessera run: ck\.h5: .*(truncated|corrupt)"
done

# Bit flips at evenly spread offsets (a different bit each): refused, or harmless.
n_refused=0
n_harmless=0
for i in $(seq 0 $((FLIPS - 1))); do
    off=$(( (size - 1) * i / (FLIPS - 1) ))
    python3 - "$TMP/a.ck" "$TMP/flip.ck" "$off" "$((i % 8))" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[int(sys.argv[3])] ^= 1 << int(sys.argv[4])
open(sys.argv[2], "wb").write(b)
PY
    resume_a "$TMP/flip.ck" "$TMP/flip.err"
    if [ $rc -eq 0 ]; then
        n_harmless=$((n_harmless + 1))
        same_records "$DA/out.jsonl" "$TMP/full.jsonl" "flip at byte $off (accepted)"
    else
        n_refused=$((n_refused + 1))
        refused "flip at byte $off" "$TMP/flip.err" "^tessera run: ck\.h5: .*(corrupt|checksum)"
    fi
done
echo "test_checkpoint_bind: $FLIPS bit flips in a $size-byte checkpoint: $n_refused refused," \
    "$n_harmless harmless (resumed equal to the uninterrupted run)"

# The same model and tokenizer at another path: the identity is their contents.
mkdir -p "$TMP/moved"
cp "$MODEL" "$ROOT/models/tok512.bin" "$TMP/moved/"
resume_a "$TMP/a.ck" "$TMP/moved.err" --model "$TMP/moved/stories260K.bin"
rc_q=$rc
[ $rc_q -eq 0 ] || fail "moved model: exit $rc_q: $(cat "$TMP/moved.err")"
same_records "$DA/out.jsonl" "$TMP/full.jsonl" "moved model"
[ -f "$DA/ck.h5" ] && fail "moved model: the checkpoint is left after a clean finish"

# --checkpoint-discard: another job's checkpoint, then a damaged one, are dropped and their
# requests recomputed.
for what in swapped damaged; do
    if [ $what = swapped ]; then src=$TMP/b.ck; else src=$TMP/flip.ck; head -c 2048 "$TMP/a.ck" >"$src"; fi
    cp "$TMP/a.out" "$DA/out.jsonl"
    cp "$src" "$DA/ck.h5"
    (cd "$DA" && exec "$BIN" run "${ARGS[@]}" --input "$TMP/in_a.jsonl" --output out.jsonl \
        --checkpoint ck.h5 --checkpoint-discard --progress-interval 0) 2>"$TMP/discard.err"
    rc=$?
    [ $rc -eq 0 ] || fail "discard $what: exit $rc: $(cat "$TMP/discard.err")"
    grep -q "^tessera run: warning: ck\.h5: .*; --checkpoint-discard: removed, its requests are recomputed$" \
        "$TMP/discard.err" || fail "discard $what: no warning line: $(cat "$TMP/discard.err")"
    same_records "$DA/out.jsonl" "$TMP/full.jsonl" "discard $what"
    [ -f "$DA/ck.h5" ] && fail "discard $what: the checkpoint is left"
done

"$BIN" run "${ARGS[@]}" --input "$TMP/in_a.jsonl" --output "$TMP/u.jsonl" \
    --checkpoint-discard 2>"$TMP/u.err"
rc=$?
[ $rc -eq 2 ] || fail "--checkpoint-discard alone: exit $rc, want 2"
grep -q -- "--checkpoint-discard needs --checkpoint" "$TMP/u.err" ||
    fail "--checkpoint-discard alone: $(cat "$TMP/u.err")"
"$BIN" run --help | grep -q -- "--checkpoint-discard" || fail "--help does not list --checkpoint-discard"

if [ $fails -ne 0 ]; then
    echo "test_checkpoint_bind: $fails failure(s)" >&2
    exit 1
fi
echo "test_checkpoint_bind: ok"
