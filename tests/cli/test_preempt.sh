#!/usr/bin/env bash
# tessera run --preempt: under a --kv-memory too small for the running sequences, swap
# preemption (the default) gives the records of an unconstrained run for each policy, and
# the metrics file's scheduler section counts the swaps (out = in, bytes both ways, no
# fallbacks with an unlimited host pool); --preempt recompute too for paged; a bad mode is
# a usage error. test_scheduler covers every registered policy and the full host pool.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }

prompts=("Once upon a time, there was a little girl named Lily. She loved to play outside"
    "The little dog ran to the big tree and saw a bird. The bird was sad because"
    "Tom and Sam went to the beach. They built a big sand castle and then"
    "One day, a cat found a red ball in the garden. The cat wanted to play with it, but")
IN=$TMP/in.jsonl
: >"$IN"
n_req=$(fenced_scale 16 8)
for i in $(seq 0 $((n_req - 1))); do
    p=${prompts[$((i % 4))]}
    mt=$((60 + (i % 5) * 10))
    if ((i % 2 == 0)); then t=0; else t=0.8; fi
    printf '{"custom_id": "r%02d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "%s", "max_tokens": %d, "temperature": %s, "seed": %d}}\n' \
        "$i" "$p" "$mt" "$t" "$i" >>"$IN"
done

# run NAME POLICY MEMORY [options]: the job into $TMP/NAME.jsonl, metrics $TMP/NAME.json
run() {
    local name=$1 pol=$2 mem=$3
    shift 3
    rm -f "$TMP/$name.jsonl"
    "$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/$name.jsonl" \
        --metrics "$TMP/$name.json" --max-batch-seqs 8 --max-batch-tokens 256 \
        --max-context 160 --threads 2 --progress-interval 0 --kv-policy "$pol" \
        --kv-memory "$mem" "$@" 2>"$TMP/$name.err" || fail "$name: exit $?: $(cat "$TMP/$name.err")"
}
# sched FILE EXPR: the scheduler section's field (python expression over s)
sched() {
    python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["scheduler"]; print(eval(sys.argv[2]))' "$1" "$2"
}

for pol in paged h2o offload; do
    budget=()
    [ $pol = paged ] || budget=(--kv-budget 0.5)
    # offload's skew mode fetches a varying count (the alpha rule); under a pool this tight
    # some fetches are cut to what fits (fetch_short, checked below), so the equality is
    # checked in warmup mode, whose resident set is the budget at every step.
    [ $pol = offload ] && budget+=(--offload-mode warmup)
    run "$pol.big" $pol 8M "${budget[@]}"
    run "$pol.tiny" $pol 300K "${budget[@]}"
    [ "$(sched "$TMP/$pol.big.json" 's["preemptions"]')" = 0 ] || fail "$pol: 8M preempted"
    [ "$(sched "$TMP/$pol.tiny.json" 's["preempt"]')" = swap ] || fail "$pol: default not swap"
    [ "$(sched "$TMP/$pol.tiny.json" 's["swaps_out"] > 0 and s["swaps_in"] == s["swaps_out"] and s["swap_out_bytes"] == s["swap_in_bytes"] > 0 and s["swap_fallbacks"] == 0')" = True ] ||
        fail "$pol: swap counters: $(sched "$TMP/$pol.tiny.json" s)"
    grep -q "preemptions (--preempt swap): [0-9]* swapped out" "$TMP/$pol.tiny.err" ||
        fail "$pol: no preemption line in the summary: $(cat "$TMP/$pol.tiny.err")"
    same_records "$TMP/$pol.big.jsonl" "$TMP/$pol.tiny.jsonl" "$pol swap under 300K"
    echo "$pol: $(sched "$TMP/$pol.tiny.json" s)"
done
# skew under the same pool: completes, every record ok, the cut fetches counted
run offload.skew offload 300K --kv-budget 0.5
python3 - "$TMP/offload.skew.json" "$TMP/offload.skew.jsonl" "$n_req" <<'PY' || fail "offload skew under 300K"
import json, sys
m = json.load(open(sys.argv[1]))
recs = [json.loads(l) for l in open(sys.argv[2])]
assert len(recs) == int(sys.argv[3]) and all(r.get("error") is None for r in recs), recs[:1]
assert m["scheduler"]["swaps_out"] > 0 and m["kv"]["fetch_short"] >= 0, m["kv"]
PY
run paged.recompute paged 300K --preempt recompute
[ "$(sched "$TMP/paged.recompute.json" 's["preemptions"] > 0 and s["swaps_out"] == 0')" = True ] ||
    fail "recompute: $(sched "$TMP/paged.recompute.json" s)"
same_records "$TMP/paged.big.jsonl" "$TMP/paged.recompute.jsonl" "paged recompute under 300K"

"$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/bad.jsonl" --preempt sometimes \
    >/dev/null 2>"$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "preempt must be swap or recompute" "$TMP/bad.err" ||
    fail "--preempt sometimes: exit $rc: $(cat "$TMP/bad.err")"

[ $fails -eq 0 ] || exit 1
echo "test_preempt: ok"
