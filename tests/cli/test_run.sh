#!/usr/bin/env bash
# tessera run end to end on the bundled model: a 200-request job, greedy records equal to
# `tessera generate` run one by one, kill + restart without duplicates or losses, stop
# strings, every bad-line case, fatal/usage exit codes, and the metrics JSON.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
have_py=0
command -v python3 >/dev/null 2>&1 && have_py=1

# --- 200 requests: greedy and sampled, some with stop strings -------------------------
prompts=("Once upon a time" "The little dog" "Lily wanted to" "One day, Tom saw a big"
    "The sun was" "Sam and Mia went to the park and" "There was a" "Mom said"
    "The cat" "A bird flew over the tree")
IN=$TMP/in.jsonl
: >"$IN"
for i in $(seq 0 199); do
    p=${prompts[$((i % 10))]}
    mt=$((6 + i % 11))
    if ((i % 4 == 0)); then
        body="{\"prompt\": \"$p\", \"max_tokens\": $mt, \"temperature\": 0}"
    elif ((i % 4 == 1)); then
        body="{\"prompt\": \"$p\", \"max_tokens\": $mt, \"temperature\": 0.9, \"seed\": $i}"
    elif ((i % 4 == 2)); then
        body="{\"prompt\": \"$p\", \"max_tokens\": $mt, \"temperature\": 0.7, \"top_p\": 0.9}"
    else
        body="{\"prompt\": \"$p\", \"max_tokens\": $mt, \"temperature\": 0, \"stop\": [\".\", \"!\"]}"
    fi
    printf '{"custom_id": "req-%03d", "method": "POST", "url": "/v1/completions", "body": %s}\n' \
        "$i" "$body" >>"$IN"
done

OUT=$TMP/out.jsonl
"$BIN" run --model "$MODEL" --input "$IN" --output "$OUT" --metrics "$TMP/m.json" \
    --max-batch-seqs 16 --max-batch-tokens 64 --threads 2 --progress-interval 0 \
    2>"$TMP/run.err"
rc=$?
[ $rc -eq 0 ] || fail "run exited $rc: $(cat "$TMP/run.err")"
n=$(wc -l <"$OUT")
[ "$n" -eq 200 ] || fail "expected 200 records, got $n"
ok=$(grep -c '"status_code":200' "$OUT")
[ "$ok" -eq 200 ] || fail "expected 200 successful records, got $ok"
ids=$(grep -o '"custom_id":"req-[0-9]*"' "$OUT" | sort -u | wc -l)
[ "$ids" -eq 200 ] || fail "expected 200 distinct custom_ids, got $ids"
grep -q "tessera run: 200 requests: 200 ok, 0 failed" "$TMP/run.err" ||
    fail "summary line missing: $(cat "$TMP/run.err")"
[ -f "$TMP/out.errors.jsonl" ] && [ ! -s "$TMP/out.errors.jsonl" ] ||
    fail "the default errors file should exist and be empty"

# JSON string escaping as cJSON writes it (ASCII stories: \ " and newlines).
json_escape() { sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | awk 'NR > 1 { printf "\\n" } { printf "%s", $0 }'; }

# --- greedy records equal `tessera generate --temperature 0` one by one ---------------
for i in 0 8 44 120 196; do
    p=${prompts[$((i % 10))]}
    mt=$((6 + i % 11))
    # generate prints the text and then one newline; strip exactly that newline
    "$BIN" generate --model "$MODEL" --prompt "$p" --max-tokens $mt --temperature 0 \
        --threads 2 >"$TMP/gen.$i" 2>/dev/null || fail "generate failed for $i"
    head -c -1 "$TMP/gen.$i" >"$TMP/gen.$i.txt"
    want=$(json_escape <"$TMP/gen.$i.txt")
    rec=$(grep "\"custom_id\":\"req-$(printf %03d $i)\"" "$OUT")
    case "$rec" in
    *"\"text\":\"$want\""*) ;;
    *) fail "req $i: batch text differs from generate: want [$want] got [$rec]" ;;
    esac
done

# --- stop strings: trimmed at the stop string, finish_reason stop ---------------------
rec=$(grep '"custom_id":"req-003"' "$OUT")
"$BIN" generate --model "$MODEL" --prompt "${prompts[3]}" --max-tokens 9 --temperature 0 \
    --threads 2 2>/dev/null | head -c -1 >"$TMP/gen.stop"
full=$(cat "$TMP/gen.stop")
cut=${full%%[.!]*}
if [ "$cut" != "$full" ]; then
    want=$(printf '%s' "$cut" | json_escape)
    case "$rec" in
    *"\"text\":\"$want\",\"finish_reason\":\"stop\""*) ;;
    *) fail "stop string: want [$want] finish stop, got [$rec]" ;;
    esac
fi

# --- kill mid-way, rerun: no duplicates, no losses, the same records ------------------
OUT2=$TMP/out2.jsonl
TSR_TEST_KILL_AFTER=70 "$BIN" run --model "$MODEL" --input "$IN" --output "$OUT2" \
    --max-batch-seqs 16 --max-batch-tokens 64 --threads 2 --quiet
rc=$?
[ $rc -eq 137 ] || fail "the killed run should exit 137, got $rc"
n=$(wc -l <"$OUT2")
[ "$n" -eq 70 ] || fail "killed run left $n records, want 70"
# a record cut in the middle, as a kill during write() leaves it
tail -n 1 "$OUT" | head -c 57 >>"$OUT2"
TSR_TEST_KILL_AFTER=50 "$BIN" run --model "$MODEL" --input "$IN" --output "$OUT2" \
    --max-batch-seqs 5 --max-batch-tokens 40 --threads 2 --quiet
[ $? -eq 137 ] || fail "second killed run should exit 137"
"$BIN" run --model "$MODEL" --input "$IN" --output "$OUT2" --max-batch-seqs 32 \
    --max-batch-tokens 96 --threads 2 --progress-interval 0 2>"$TMP/resume.err"
rc=$?
[ $rc -eq 0 ] || fail "resumed run exited $rc"
grep -q "resuming" "$TMP/resume.err" || fail "no resume message: $(cat "$TMP/resume.err")"
n=$(wc -l <"$OUT2")
[ "$n" -eq 200 ] || fail "after restart: $n records, want 200"
dups=$(grep -o '"custom_id":"[^"]*"' "$OUT2" | sort | uniq -d | wc -l)
[ "$dups" -eq 0 ] || fail "after restart: $dups duplicated custom_ids"
if ! diff <(sort "$OUT") <(sort "$OUT2") >"$TMP/restart.diff"; then
    fail "restarted output differs from the uninterrupted run ($(wc -l <"$TMP/restart.diff") diff lines)"
fi
# a run over a complete output does nothing
"$BIN" run --model "$MODEL" --input "$IN" --output "$OUT2" --quiet || fail "idle rerun failed"
[ "$(wc -l <"$OUT2")" -eq 200 ] || fail "idle rerun appended records"

# --- bad lines: one error record each, the job goes on --------------------------------
BAD=$TMP/bad.jsonl
cat >"$BAD" <<'EOF'
{"custom_id": "good-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "The cat", "max_tokens": 4, "temperature": 0}}
{this is not json

{"method": "POST", "url": "/v1/completions", "body": {"prompt": "no id"}}
{"custom_id": "no-body", "method": "POST", "url": "/v1/completions"}
{"custom_id": "no-prompt", "method": "POST", "url": "/v1/completions", "body": {"max_tokens": 3}}
{"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {"prompt": "x"}}
{"custom_id": "too-long", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time there was a little girl named Lily who liked to play in the park with her dog"}}
{"custom_id": "good-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "duplicate"}}
{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}
{"custom_id": "bad-param", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "top_p": 5}}
{"custom_id": "good-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "The dog", "max_tokens": 0}}
EOF
BOUT=$TMP/bad_out.jsonl
"$BIN" run --model "$MODEL" --input "$BAD" --output "$BOUT" --errors "$TMP/bad.err.jsonl" \
    --max-context 16 --threads 2 --progress-interval 0 2>"$TMP/bad.stderr"
rc=$?
[ $rc -eq 0 ] || fail "bad-lines job exited $rc (bad lines are not fatal)"
n=$(wc -l <"$BOUT")
[ "$n" -eq 11 ] || fail "bad-lines job: $n records for 11 requests"
for code in invalid_json missing_custom_id missing_body missing_prompt invalid_url \
    prompt_too_long duplicate_custom_id no_chat_template invalid_parameter; do
    grep -q "\"code\":\"$code\"" "$BOUT" || fail "no $code error record"
done
grep -q '"custom_id":"no-body","response":null,"error":{"code":"missing_body"' "$BOUT" ||
    fail "error record shape"
grep -q '"code":"invalid_json","message":"line 2: ' "$BOUT" || fail "invalid JSON keyed by line 2"
grep -q '"custom_id":"good-2".*"text":"","finish_reason":"length"' "$BOUT" ||
    fail "max_tokens 0 should give an empty completion"
ne=$(wc -l <"$TMP/bad.err.jsonl")
[ "$ne" -eq 9 ] || fail "errors file holds $ne records, want 9"
[ "$(grep -c '"error":null' "$BOUT")" -eq 2 ] || fail "want 2 successful records"
grep -q "11 requests: 2 ok, 9 failed" "$TMP/bad.stderr" || fail "summary: $(cat "$TMP/bad.stderr")"
"$BIN" run --model "$MODEL" --input "$BAD" --output "$BOUT" --errors "$TMP/bad.err.jsonl" \
    --max-context 16 --quiet || fail "bad-lines rerun failed"
[ "$(wc -l <"$BOUT")" -eq 11 ] || fail "bad-lines rerun duplicated records"
[ "$(wc -l <"$TMP/bad.err.jsonl")" -eq 9 ] || fail "bad-lines rerun duplicated error records"

# --- fatal and usage errors -------------------------------------------------------------
"$BIN" run --model "$MODEL" --input "$TMP/missing.jsonl" --output "$TMP/x.jsonl" 2>"$TMP/e1"
[ $? -eq 1 ] || fail "unreadable input should exit 1"
grep -q "missing.jsonl" "$TMP/e1" || fail "the fatal error names the input"
"$BIN" run --model "$TMP/nomodel.bin" --input "$IN" --output "$TMP/x.jsonl" 2>/dev/null
[ $? -eq 1 ] || fail "unreadable model should exit 1"
"$BIN" run --input "$IN" --output "$TMP/x.jsonl" 2>/dev/null
[ $? -eq 2 ] || fail "missing --model should exit 2"
"$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/x.jsonl" --max-batch-seqs 8 \
    --max-batch-tokens 4 2>/dev/null
[ $? -eq 2 ] || fail "--max-batch-tokens < --max-batch-seqs should exit 2"
"$BIN" run --help | grep -q -- "--max-batch-tokens" || fail "--help lacks options"

# --- metrics JSON: every field present and sane -----------------------------------------
M=$TMP/m.json
[ -f "$M" ] && [ ! -f "$M.tmp" ] || fail "metrics file missing (or tmp left behind)"
if [ $have_py -eq 1 ]; then
    python3 - "$M" <<'EOF' || fail "metrics JSON check failed"
import json, os, sys
m = json.load(open(sys.argv[1]))
r, t, tp, lat = m["requests"], m["tokens"], m["throughput"], m["latency_s"]
assert r["lines"] == 200 and r["ok"] == 200 and r["failed"] == 0 and r["skipped"] == 0, r
assert r["finish_stop"] + r["finish_length"] == 200, r
assert t["prompt"] > 0 and t["completion"] > 0 and t["total"] == t["prompt"] + t["completion"]
for k in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s"):
    assert tp[k] > 0, k
kv_cap = m["kv"]["bytes_capacity"]
for k in ("ttft", "tpot", "itl", "e2e"):
    q = lat[k]
    assert q["count"] > 0 and 0 <= q["p50"] <= q["p90"] <= q["p99"] <= q["max"], (k, q)
    assert q["mean"] > 0 and q["max"] < 60, (k, q)
assert lat["ttft"]["count"] == 200 and lat["e2e"]["count"] == 200
assert lat["ttft"]["p50"] <= lat["e2e"]["p50"]
run = m["run"]
assert run["max_batch_seqs"] == 16 and run["max_batch_tokens"] == 64 and run["max_context"] == 512
assert run["wall_s"] > 0 and run["backend"] == os.environ.get("TSR_TEST_BACKEND", "cpu")
assert run["threads"] == 2
s = m["scheduler"]
assert s["steps"] > 0 and 0 < s["batch_tokens_mean"] <= 64 and s["max_running"] == 16
assert s["prefill_tokens"] == t["prompt"] and s["preemptions"] == 0
assert s["decode_tokens"] <= t["completion"]
mem = m["memory"]
assert mem["peak_host_rss_bytes"] > 1 << 20
# the plain CPU has no device memory; the fenced device's arena holds weights and KV pool
# (the pool's capacity also counts each slot's host-side position: hence 0.9)
if run["backend"] == "cpu":
    assert mem["peak_device_bytes"] == 0, mem
else:
    assert mem["peak_device_bytes"] >= 0.9 * kv_cap, (mem, kv_cap)
assert mem["ranks"][0]["rank"] == 0
kv = m["kv"]
assert kv["policy"] == "paged" and 0 < kv["bytes_peak"] <= kv["bytes_capacity"]
assert kv["blocks_peak"] > 0 and kv["blocks_used"] == 0 and kv["block_size"] == 16
assert kv["tokens_resident"] == 0 and kv["bytes_used"] == 0 and kv["evictions"] == 0
EOF
else
    for k in schema_version requests ok failed skipped lines tokens prompt completion \
        throughput requests_per_s input_tokens_per_s output_tokens_per_s latency_s ttft tpot \
        e2e p50 p90 p99 scheduler steps memory peak_host_rss_bytes peak_device_bytes kv \
        bytes_peak bytes_capacity; do
        grep -q "\"$k\":" "$M" || fail "metrics lack $k"
    done
    grep -q '"ok":[[:space:]]*200' "$M" || fail "metrics: ok != 200"
fi

# --- every KV policy at a 100 % budget gives the paged texts; a 20 % h2o budget runs ------
head -n 40 "$IN" | grep '"temperature": 0[,}]' >"$TMP/greedy.jsonl"
texts() { grep -o '"custom_id":"[^"]*".*"text":"[^"]*"' "$1" | sed 's/"id":"[^"]*",//' | sort; }
"$BIN" run --model "$MODEL" --input "$TMP/greedy.jsonl" --output "$TMP/pol_paged.jsonl" \
    --quiet --max-batch-seqs 4 2>/dev/null || fail "paged run failed"
for pol in h2o offload; do
    "$BIN" run --model "$MODEL" --input "$TMP/greedy.jsonl" --output "$TMP/pol_$pol.jsonl" \
        --quiet --max-batch-seqs 4 --kv-policy $pol --kv-budget 1 --stats 2>"$TMP/pol.err" ||
        fail "$pol run failed: $(cat "$TMP/pol.err")"
    grep -q "\"policy\":\"$pol\"" "$TMP/pol.err" || fail "$pol: no --stats line"
    [ "$(texts "$TMP/pol_$pol.jsonl")" = "$(texts "$TMP/pol_paged.jsonl")" ] ||
        fail "$pol at 100 % budget differs from paged"
done
"$BIN" run --model "$MODEL" --input "$TMP/greedy.jsonl" --output "$TMP/pol_h2o20.jsonl" \
    --quiet --kv-policy h2o --kv-budget 0.2 2>/dev/null || fail "h2o 20 % run failed"
[ "$(wc -l <"$TMP/pol_h2o20.jsonl")" -eq "$(wc -l <"$TMP/greedy.jsonl")" ] ||
    fail "h2o 20 %: record count"

if [ $fails -ne 0 ]; then
    echo "test_run: $fails failure(s)" >&2
    exit 1
fi
echo "test_run: ok"
