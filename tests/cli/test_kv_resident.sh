#!/usr/bin/env bash
# The KV pool against what offload's default (skew, 2 dense layers, dense prefill) holds
# (docs/kv-cache.md, "Pool size and workspace"), on stories260K: 5 layers, 4 KV heads of 8
# (a block of 16 f32 rows of K and V and their positions: 16 x (2 x 32 x 4 + 4) = 4160 B).
# At --max-context 256, --chunk 16 and --kv-budget 0.1 (26 tokens), worked by hand: a whole
# layer is 16 blocks, a budgeted one 26 + 16 rows = 3 blocks; the budgeted set (two dense
# layers, three budgeted) 41 blocks = 170560 B, the peak with one more whole layer 54 blocks
# = 224640 B (219.4 KiB). So:
# - --kv-memory 150K (36 blocks) refuses at start with the one-sequence line;
# - 180K (44 blocks) runs with one warning naming fetch_short and "--kv-memory 220K or
#   more", and a prompt near the context then counts fetch_short > 0;
# - 220K (54 blocks) and the default pool run the same prompt without a warning and with
#   fetch_short 0.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }

# A prompt of 241 tokens of the model's tokenizer: prefill chunks up to the end of
# the context, where a dense prefill layer's prior tokens need the most blocks.
P="Once upon a time, there was a little girl named Lily. She loved to play outside in the sun."
PROMPT="$P $P $P $P $P $P $P $P"
gen() {
    "$BIN" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 4 --temperature 0 \
        --max-context 256 --chunk 16 --threads 2 --kv-policy offload --kv-budget 0.1 \
        --stats "$@"
}
# short FILE: fetch_short of the --stats line in FILE
short() {
    python3 -c 'import json, sys; print([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"policy\"")][0]["fetch_short"])' "$1"
}

gen --kv-memory 150K >/dev/null 2>"$TMP/small.err"
rc=$?
[ $rc -eq 1 ] || fail "150K: exit $rc, want 1: $(cat "$TMP/small.err")"
grep -q "one sequence of the full context (256 tokens, of which the policy keeps its budget) needs 0.2 MiB" \
    "$TMP/small.err" || fail "150K: no clear line: $(cat "$TMP/small.err")"

gen --kv-memory 180K >/dev/null 2>"$TMP/mid.err" || fail "180K: exit $?: $(cat "$TMP/mid.err")"
[ "$(grep -c 'warning' "$TMP/mid.err")" -eq 1 ] || fail "180K: not one warning: $(cat "$TMP/mid.err")"
grep -q "^tessera warning: KV pool: 178.8 KiB (from --kv-memory) holds one sequence of the full context (256 tokens) under offload but not its peak (219.4 KiB): dense prefill .*(counted in fetch_short); --kv-memory 220K or more avoids it$" \
    "$TMP/mid.err" || fail "180K: warning line: $(cat "$TMP/mid.err")"
s=$(short "$TMP/mid.err") || fail "180K: no stats: $(cat "$TMP/mid.err")"
[ "${s:-0}" -gt 0 ] || fail "180K: fetch_short ${s:-?}, want > 0 (the prompt reaches the context)"

for run in "220K --kv-memory 220K" "default"; do
    read -r name args <<<"$run"
    # shellcheck disable=SC2086
    gen $args >/dev/null 2>"$TMP/$name.err" || fail "$name: exit $?: $(cat "$TMP/$name.err")"
    grep -q warning "$TMP/$name.err" && fail "$name: warned: $(cat "$TMP/$name.err")"
    s=$(short "$TMP/$name.err") || fail "$name: no stats: $(cat "$TMP/$name.err")"
    [ "${s:-1}" -eq 0 ] || fail "$name: fetch_short ${s:-?}, want 0"
done

# Without dense prefill the budgeted set is the peak: 180K runs without a warning.
gen --kv-memory 180K --offload-dense-prefill off >/dev/null 2>"$TMP/off.err" ||
    fail "180K, dense prefill off: exit $?: $(cat "$TMP/off.err")"
grep -q warning "$TMP/off.err" && fail "180K, dense prefill off: warned: $(cat "$TMP/off.err")"

[ $fails -eq 0 ] || exit 1
echo "test_kv_resident: ok"
