#!/usr/bin/env bash
# tessera run stops gracefully on SIGTERM and SIGUSR1 (what Slurm sends): exit code 3, one
# "stopped by" line, only complete records in the output, and a rerun resumes to a complete
# output with every custom_id once, the same records as a run interrupted elsewhere.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N=$(fenced_scale 160 40)
IN=$TMP/in.jsonl
for i in $(seq 0 $((N - 1))); do
    printf '{"custom_id": "s-%03d", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0.8, "seed": %d}}\n' "$i" "$i"
done >"$IN"
# Batches of at most 4 rows keep the products bit-identical to solo ones (docs/jobs.md), so
# runs cut at different points give the same records.
ARGS=(--model "$MODEL" --input "$IN" --max-batch-seqs 4 --max-batch-tokens 16 --threads 1
    --progress-interval 0)

# Starts a run in the background, sends $2 once it has written 5 records (so the handlers
# are installed); sets rc.
run_and_signal() {
    local out=$1 sig=$2 err=$3 k=0 n0
    n0=$(nlines "$out")
    "$BIN" run "${ARGS[@]}" --output "$out" 2>"$err" &
    local pid=$!
    while [ "$(nlines "$out")" -lt $((n0 + 5)) ] && [ $k -lt 400 ]; do
        sleep 0.025
        k=$((k + 1))
    done
    kill -s "$sig" "$pid"
    wait "$pid"
    rc=$?
}

# Every line a complete JSON record (newline-terminated), no custom_id twice.
check_records() {
    local out=$1 what=$2
    [ -z "$(tail -c 1 "$out")" ] || fail "$what: last line has no newline"
    if command -v python3 >/dev/null 2>&1; then
        python3 - "$out" <<'PY' || fail "$what: not valid JSONL records"
import json, sys
for n, line in enumerate(open(sys.argv[1]), 1):
    r = json.loads(line)
    assert r["error"] is None and r["response"]["status_code"] == 200, (n, line)
    assert r["response"]["body"]["choices"][0]["finish_reason"] in ("stop", "length"), n
PY
    else
        grep -vq '^{.*}$' "$out" && fail "$what: a line is not a JSON object"
    fi
    local dups
    dups=$(grep -o '"custom_id":"[^"]*"' "$out" | sort | uniq -d | wc -l)
    [ "$dups" -eq 0 ] || fail "$what: $dups duplicated custom_ids"
}

# --- SIGTERM: exit 3, partial output of complete records, the stop line -----------------
A=$TMP/a.jsonl
run_and_signal "$A" TERM "$TMP/a.err"
[ $rc -eq 3 ] || fail "SIGTERM: exit $rc, want 3: $(cat "$TMP/a.err")"
na=$(wc -l <"$A")
if [ "$na" -lt 5 ] || [ "$na" -ge $N ]; then fail "SIGTERM: $na records, want 5..$((N - 1))"; fi
grep -qx "tessera run: stopped by SIGTERM after $na of $N requests; rerun the same command to resume" \
    "$TMP/a.err" || fail "SIGTERM: stop line missing: $(cat "$TMP/a.err")"
grep -q "requests: .* ok" "$TMP/a.err" && fail "SIGTERM: a stopped run must not print the summary"
check_records "$A" "after SIGTERM"

# --- rerun: resumes to every id exactly once ----------------------------------------------
"$BIN" run "${ARGS[@]}" --output "$A" 2>"$TMP/a2.err"
rc=$?
[ $rc -eq 0 ] || fail "resume after SIGTERM exited $rc: $(cat "$TMP/a2.err")"
grep -q "resuming: .* holds $na records" "$TMP/a2.err" || fail "no resume line: $(cat "$TMP/a2.err")"
[ "$(wc -l <"$A")" -eq $N ] || fail "after resume: $(wc -l <"$A") records, want $N"
ids=$(grep -o '"custom_id":"s-[0-9]*"' "$A" | sort -u | wc -l)
[ "$ids" -eq $N ] || fail "after resume: $ids distinct ids, want $N"
check_records "$A" "after resume"

# --- SIGUSR1 (Slurm's warning before the time limit), stopped twice, resumed -------------
B=$TMP/b.jsonl
run_and_signal "$B" USR1 "$TMP/b.err"
[ $rc -eq 3 ] || fail "SIGUSR1: exit $rc, want 3: $(cat "$TMP/b.err")"
grep -q "stopped by SIGUSR1 after $(wc -l <"$B") of $N" "$TMP/b.err" ||
    fail "SIGUSR1: stop line: $(cat "$TMP/b.err")"
nb=$(wc -l <"$B")
run_and_signal "$B" INT "$TMP/b2.err"
if [ $rc -eq 3 ]; then
    grep -q "stopped by SIGINT" "$TMP/b2.err" || fail "SIGINT: stop line: $(cat "$TMP/b2.err")"
    [ "$(wc -l <"$B")" -gt "$nb" ] || fail "SIGINT: the second run added no records"
else
    [ $rc -eq 0 ] || fail "SIGINT: exit $rc: $(cat "$TMP/b2.err")"
fi
check_records "$B" "after SIGUSR1 + SIGINT"
"$BIN" run "${ARGS[@]}" --output "$B" --quiet || fail "resume after SIGUSR1 failed"
diff <(sort "$A") <(sort "$B") >/dev/null ||
    fail "two runs cut at different points differ after resuming"

"$BIN" run --help | grep -q "3 when stopped by" || fail "--help does not document exit code 3"

if [ $fails -ne 0 ]; then
    echo "test_run_signal: $fails failure(s)" >&2
    exit 1
fi
echo "test_run_signal: ok"
