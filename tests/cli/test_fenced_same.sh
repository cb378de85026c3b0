#!/usr/bin/env bash
# The fenced CPU device (--backend cpu-fenced: backend memory that host code cannot touch)
# prints exactly what the CPU backend prints: `generate` and `run` for every KV policy
# (paged, h2o with eviction, h2o's materialize baseline, offload with selection), and a bulk
# job stopped by SIGTERM with --checkpoint and resumed on cpu-fenced gives the records of an
# uninterrupted cpu run. With the MPI tests (tp/pp on cpu-fenced equal one process on
# cpu-fenced) this makes every layout on cpu-fenced equal the CPU.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if ! "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1 --backend cpu-fenced \
    >/dev/null 2>"$TMP/probe.err"; then
    echo "test_fenced_same: skipped: $(cat "$TMP/probe.err")"
    exit 77
fi
command -v python3 >/dev/null 2>&1 || { echo "test_fenced_same: skipped (no python3)"; exit 77; }

PROMPT="Once upon a time, there was a little dog named Max who lived in a small house"
POLICIES=("paged" "h2o --kv-budget 0.5" "h2o --kv-budget 0.5 --h2o-scores materialize"
    "offload --kv-budget 0.5")
for pol in "${POLICIES[@]}"; do
    for samp in "--temperature 0" "--temperature 0.9 --top-p 0.95 --seed 7"; do
        for be in cpu cpu-fenced; do
            # shellcheck disable=SC2086
            "$BIN" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 60 --chunk 8 \
                --kv-policy $pol $samp --backend $be >"$TMP/gen.$be" 2>"$TMP/gen.$be.err" ||
                fail "generate [$pol] [$samp] on $be: $(cat "$TMP/gen.$be.err")"
        done
        cmp -s "$TMP/gen.cpu" "$TMP/gen.cpu-fenced" ||
            fail "generate [$pol] [$samp]: cpu-fenced prints other tokens than cpu"
    done
done

# A bulk job: 24 requests, several in each step, sampled and greedy.
IN=$TMP/in.jsonl
python3 - "$IN" <<'PY'
import json, sys
prompts = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a cat"]
with open(sys.argv[1], "w") as f:
    for i in range(24):
        body = {"prompt": prompts[i % 4], "max_tokens": 40 + (i * 7) % 50}
        if i % 2:
            body.update(temperature=0.9, seed=i, top_p=0.95)
        f.write(json.dumps({"custom_id": "r-%03d" % i, "url": "/v1/completions",
                            "body": body}) + "\n")
PY
for pol in "${POLICIES[@]}"; do
    tag=${pol// /_}
    for be in cpu cpu-fenced; do
        # shellcheck disable=SC2086
        "$BIN" run --model "$MODEL" --input "$IN" --output "$TMP/run.$tag.$be.jsonl" \
            --max-batch-seqs 4 --threads 1 --quiet --kv-policy $pol --backend $be \
            2>"$TMP/run.err" || fail "run [$pol] on $be: $(cat "$TMP/run.err")"
    done
    same_records "$TMP/run.$tag.cpu.jsonl" "$TMP/run.$tag.cpu-fenced.jsonl" \
        "run [$pol]: cpu-fenced against cpu"
done

# SIGTERM + --checkpoint on cpu-fenced, resumed on cpu-fenced, against the cpu run above.
if "$BIN" run --model "$MODEL" --input /dev/null --output "$TMP/x.jsonl" \
    --checkpoint "$TMP/x.h5" 2>&1 | grep -q "this build has no HDF5"; then
    echo "test_fenced_same: checkpoint part skipped (built without HDF5)"
else
    for pol in "paged" "h2o --kv-budget 0.5"; do
        tag=${pol// /_}
        out=$TMP/ck.$tag.jsonl ck=$TMP/ck.$tag.h5
        # shellcheck disable=SC2086
        ARGS=(--model "$MODEL" --input "$IN" --max-batch-seqs 4 --threads 1 --quiet
            --kv-policy $pol --backend cpu-fenced --output "$out" --checkpoint "$ck")
        "$BIN" run "${ARGS[@]}" 2>"$TMP/ck.err" &
        term_after $! "$out" 6 1000
        rc=$?
        [ $rc -eq 3 ] || fail "checkpoint [$pol]: SIGTERM: exit $rc, want 3: $(cat "$TMP/ck.err")"
        [ "$(nlines "$out")" -lt 24 ] || fail "checkpoint [$pol]: finished before the signal"
        grep -q "checkpoint: [1-9][0-9]* in-flight requests saved" "$TMP/ck.err" ||
            fail "checkpoint [$pol]: nothing in flight was saved: $(cat "$TMP/ck.err")"
        "$BIN" run "${ARGS[@]}" 2>"$TMP/ck2.err" ||
            fail "checkpoint [$pol]: resume failed: $(cat "$TMP/ck2.err")"
        same_records "$TMP/run.$tag.cpu.jsonl" "$out" "checkpoint [$pol]: resumed cpu-fenced against cpu"
    done
fi

[ "$fails" -eq 0 ] || exit 1
echo "test_fenced_same: cpu-fenced prints what cpu prints"
