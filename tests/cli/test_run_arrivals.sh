#!/usr/bin/env bash
# tessera run --arrival-rate: requests arrive by a seeded Poisson process and are admitted
# when the job's clock reaches them. The job completes, its wall time is at least the last
# arrival's, its records equal the offline run's (same seeds, same texts), and the metrics
# carry latency_s.itl, run.arrival_rate, memory.peak_device_bytes and kv.bytes_moved.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

N=$(fenced_scale 24 12)
IN=$TMP/in.jsonl
: >"$IN"
prompts=("Once upon a time" "The little dog" "Lily wanted to" "One day, Tom saw a big")
for i in $(seq 0 $((N - 1))); do
    p=${prompts[$((i % 4))]}
    if ((i % 2 == 0)); then t=0; else t=0.8; fi
    printf '{"custom_id": "r%02d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "%s", "max_tokens": %d, "temperature": %s}}\n' \
        "$i" "$p" $((4 + i % 5)) "$t" >>"$IN"
done
# one bad line: its error record does not wait for an arrival
echo '{"custom_id": "bad", "method": "POST", "url": "/v1/completions"}' >>"$IN"

common=(--model "$MODEL" --input "$IN" --max-batch-seqs 4 --max-batch-tokens 64 --threads 2
    --progress-interval 0 --quiet --seed 7)
"$BIN" run "${common[@]}" --output "$TMP/off.jsonl" --metrics "$TMP/off.json" ||
    fail "offline run failed"
RATE=40
"$BIN" run "${common[@]}" --output "$TMP/arr.jsonl" --metrics "$TMP/arr.json" \
    --arrival-rate $RATE 2>"$TMP/arr.err" || fail "run with --arrival-rate failed: $(cat "$TMP/arr.err")"
[ "$(nlines "$TMP/arr.jsonl")" -eq $((N + 1)) ] || fail "expected $((N + 1)) records"
grep -v '"custom_id":"bad"' "$TMP/off.jsonl" >"$TMP/off.ok"
grep -v '"custom_id":"bad"' "$TMP/arr.jsonl" >"$TMP/arr.ok"
[ "$(nlines "$TMP/arr.ok")" -eq "$N" ] || fail "expected $N good records"
same_records "$TMP/off.ok" "$TMP/arr.ok" "arrivals vs offline"

# The last of N - 1 Poisson gaps (the first request arrives at 0), recomputed as the job
# draws them: splitmix64 from seed ^ 0x6172726976616C73, -ln(1 - U) / R.
python3 - "$TMP/arr.json" "$TMP/off.json" "$N" "$RATE" 7 <<'PY' || fail "arrival metrics"
import json, math, sys
arr, off = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n, rate, seed = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
M = (1 << 64) - 1
state = seed ^ 0x6172726976616C73
t = 0.0
for _ in range(n - 1):
    state = (state + 0x9E3779B97F4A7C15) & M
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    z ^= z >> 31
    t += -math.log1p(-((z >> 11) * 2.0 ** -53)) / rate
assert t > 0.1, t
assert arr["run"]["wall_s"] >= t, (arr["run"]["wall_s"], t)
assert arr["run"]["arrival_rate"] == rate and off["run"]["arrival_rate"] == 0
for d in (arr, off):
    lat = d["latency_s"]
    for k in ("ttft", "tpot", "itl", "e2e"):
        for q in ("p50", "p90", "p99"):
            assert lat[k][q] >= 0, (k, q)
    assert lat["itl"]["count"] > 0
    # one gap per output token after a request's first
    assert lat["itl"]["count"] == d["tokens"]["completion"] - d["requests"]["ok"], lat["itl"]
    assert d["memory"]["peak_device_bytes"] >= 0
    assert d["memory"]["peak_host_rss_bytes"] > 0
    assert d["kv"]["bytes_moved"] >= 0
    for k in ("input_tokens_per_s", "output_tokens_per_s"):
        assert d["throughput"][k] > 0
    assert d["scheduler"]["preemptions"] >= 0
assert arr["requests"]["ok"] == n and arr["requests"]["failed"] == 1
PY

# A device backend reports the memory it holds; the plain CPU has none.
if [ "${TSR_TEST_BACKEND:-cpu}" = cpu-fenced ]; then
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['memory']['peak_device_bytes'] > 0, d['memory']" \
        "$TMP/arr.json" || fail "peak_device_bytes on cpu-fenced"
fi

# A bad rate is a usage error.
"$BIN" run "${common[@]}" --output "$TMP/x.jsonl" --arrival-rate -1 2>"$TMP/x.err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/x.err")" -eq 1 ] || fail "--arrival-rate -1 should be a usage error"

[ "$fails" -eq 0 ]
