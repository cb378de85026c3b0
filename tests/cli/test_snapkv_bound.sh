#!/usr/bin/env bash
# snapkv's KV against what the start-up sizing counts (docs/kv-cache.md, "snapkv"): a layer
# holds at most its budget plus one chunk, however many tokens the sequence generates
# (decode steps recompress it there). On stories260K: 5 layers, 4 KV heads of 8, a block of
# 8 f32 rows of K and V and their positions: 8 x (2 x 32 x 4 + 4) = 2080 B. At --chunk 16,
# --kv-budget 24 and --block-size 8, worked by hand: a layer 24 + 16 = 40 rows = 5 blocks, a
# sequence 25 blocks = 52000 B. A 31-token prompt then generates 200 tokens, past those 40
# rows 16 decode steps after the prompt's compression, so:
# - --kv-memory 51999 (24 blocks) refuses at start with the one-sequence line;
# - 52000 runs the whole generation (it failed for want of blocks when decode steps only
#   appended), peaks at 25 blocks, recompresses in decode, and prints the tokens of the
#   default pool;
# - `tessera run` of 4 such requests in 4 x 52000 B finishes them all without a preemption.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }

P="Once upon a time, there was a little girl named Lily. She loved to play outside in the sun."
KV=(--max-context 256 --block-size 8 --threads 2 --kv-policy snapkv --kv-budget 24
    --snapkv-window 8)
gen() {
    "$BIN" generate --model "$MODEL" --prompt "$P" --max-tokens 200 --temperature 0 \
        --chunk 16 "${KV[@]}" --stats "$@"
}
# stat FILE KEY: KEY of the policy's --stats line in FILE
stat() {
    python3 -c 'import json, sys; print([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"policy\"")][0][sys.argv[2]])' "$1" "$2" 2>/dev/null
}

gen --kv-memory 51999 >/dev/null 2>"$TMP/small.err"
rc=$?
[ $rc -eq 1 ] || fail "51999: exit $rc, want 1: $(cat "$TMP/small.err")"
grep -q "one sequence of the full context (256 tokens, of which the policy keeps its budget)" \
    "$TMP/small.err" || fail "51999: no clear line: $(cat "$TMP/small.err")"

gen --kv-memory 52000 >"$TMP/exact.txt" 2>"$TMP/exact.err" ||
    fail "52000: exit $?: $(cat "$TMP/exact.err")"
grep -q "generated 200 tokens.*stop: length" "$TMP/exact.err" ||
    fail "52000: not 200 tokens: $(cat "$TMP/exact.err")"
grep -q warning "$TMP/exact.err" && fail "52000: warned: $(cat "$TMP/exact.err")"
peak=$(stat "$TMP/exact.err" blocks_peak) || fail "52000: no stats: $(cat "$TMP/exact.err")"
[ "${peak:-26}" -le 25 ] || fail "52000: blocks_peak ${peak:-?}, want <= 25"
dc=$(stat "$TMP/exact.err" snapkv_decode_compressions) || fail "52000: no decode compressions"
[ "${dc:-0}" -gt 0 ] || fail "52000: snapkv_decode_compressions ${dc:-?}, want > 0"
gen >"$TMP/default.txt" 2>"$TMP/default.err" || fail "default pool: exit $?: $(cat "$TMP/default.err")"
cmp -s "$TMP/exact.txt" "$TMP/default.txt" || fail "52000 and the default pool print different tokens"

for i in 1 2 3 4; do
    printf '{"custom_id": "s%d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "%s %d", "max_tokens": 200, "temperature": 0}}\n' \
        "$i" "$P" "$i"
done >"$TMP/in.jsonl"
"$BIN" run --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/out.jsonl" \
    --max-batch-seqs 4 --max-batch-tokens 16 "${KV[@]}" --kv-memory 208000 \
    --metrics "$TMP/m.json" >/dev/null 2>"$TMP/run.err" || fail "run: exit $?: $(cat "$TMP/run.err")"
python3 - "$TMP/m.json" <<'PY' || fail "run: $(cat "$TMP/run.err")"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["requests"]["ok"] == 4 and m["requests"]["finish_length"] == 4, m["requests"]
assert m["tokens"]["completion"] == 800, m["tokens"]
assert m["scheduler"]["preemptions"] == 0, m["scheduler"]
assert m["kv"]["blocks_peak"] <= 100, m["kv"]
assert m["kv"]["snapkv_decode_compressions"] > 0, m["kv"]
PY

[ $fails -eq 0 ] || exit 1
echo "test_snapkv_bound: ok"
