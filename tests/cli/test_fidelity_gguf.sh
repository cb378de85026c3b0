#!/usr/bin/env bash
# The bundled instruct model (tools/fetch-models.sh) on real text: `tessera fidelity
# --document --tail` scores the last positions of a licence text after a chunked prefill
# (paged against itself is exact), and `tessera needle` finds the pass key through the chat
# template with the full cache at the end of a short haystack; h2o keeps the reference H2O's
# tokens (tests/data/h2o/). Skips (77) without the model.
. "$(dirname "$0")/common.sh"
GGUF=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$GGUF" ]; then
    echo "SKIP: $GGUF absent (tools/fetch-models.sh fetches it)"
    exit 77
fi
"$BIN" fidelity --model "$GGUF" --text "$ROOT/bench/data/gpl-3.txt" --document \
    --doc-tokens 96 --tail 8 --chunk 64 --threads 2 --quiet --json "$TMP/f.json" \
    2>"$TMP/f.err" || fail "fidelity --tail: exit $?: $(cat "$TMP/f.err")"
grep -q '"scoring":"tail-prompt"' "$TMP/f.json" || fail "fidelity: scoring: $(cat "$TMP/f.json")"
grep -q '"tokens":8,' "$TMP/f.json" || fail "fidelity: 8 positions: $(cat "$TMP/f.json")"
grep -q '"agreement":1,' "$TMP/f.json" && grep -q '"kl":0,' "$TMP/f.json" ||
    fail "fidelity: paged against itself not exact: $(cat "$TMP/f.json")"

"$BIN" needle --model "$GGUF" --haystack "$ROOT/bench/data/gpl-3.txt" --length 128 \
    --depths 100 --answer-tokens 10 --threads 2 --quiet --json "$TMP/n.json" \
    --reference-dir "$TMP/refs" 2>"$TMP/n.err" || fail "needle: exit $?: $(cat "$TMP/n.err")"
grep -q '"prompt_tokens":12[0-8],' "$TMP/n.json" || fail "needle: prompt length: $(cat "$TMP/n.json")"
grep -q '"full_accuracy":1,' "$TMP/n.json" || fail "needle: the full cache missed the key: $(cat "$TMP/n.json")"
# paged is the full cache itself (one engine answers); its reference serves the next policy,
# which then runs no full cache: the same prompt and full answer
grep -q '"reference":"computed","policy_is_full":true' "$TMP/n.json" ||
    fail "needle: paged's reference: $(cat "$TMP/n.json")"
"$BIN" needle --model "$GGUF" --haystack "$ROOT/bench/data/gpl-3.txt" --length 128 \
    --depths 100 --answer-tokens 10 --threads 2 --quiet --json "$TMP/n2.json" \
    --reference-dir "$TMP/refs" --kv-policy streaming --kv-budget 0.5 2>"$TMP/n2.err" ||
    fail "needle streaming: exit $?: $(cat "$TMP/n2.err")"
grep -q '"reference":"reused","policy_is_full":false' "$TMP/n2.json" ||
    fail "needle: the reference not reused: $(cat "$TMP/n2.json")"
python3 - "$TMP/n.json" "$TMP/n2.json" <<'PY' || fail "needle: the reused full side differs"
import json, sys
a, b = (json.load(open(p))["cells"][0] for p in sys.argv[1:])
assert a["full"] == b["full"] and a["prompt_tokens"] == b["prompt_tokens"], (a, b)
assert a["needle_position"] == b["needle_position"], (a, b)
PY
# --dtype q8_0 (the Q4_1 matrices converted at load): the reference kept above is of the
# file's dtype, so this run computes its own; the JSON names the dtype the matrices ran in
"$BIN" needle --model "$GGUF" --haystack "$ROOT/bench/data/gpl-3.txt" --length 128 \
    --depths 100 --answer-tokens 10 --threads 2 --quiet --json "$TMP/nq.json" --dtype q8_0 \
    --reference-dir "$TMP/refs" --kv-policy streaming --kv-budget 0.5 2>"$TMP/nq.err" ||
    fail "needle --dtype q8_0: exit $?: $(cat "$TMP/nq.err")"
grep -q '"dtype":"q8_0"' "$TMP/nq.json" && grep -q '"dtype":"q4_1"' "$TMP/n2.json" &&
    grep -q '"reference":"computed","policy_is_full":false' "$TMP/nq.json" ||
    fail "needle --dtype q8_0: $(cat "$TMP/nq.json")"
# a model path so long that the reference's key cannot hold it: needle says nothing is kept
# (one line), keeps nothing and reports no reference
# (about 4000 bytes, under PATH_MAX's 4096 wherever the build directory is)
long=$TMP
while [ $((${#long} + 200)) -lt 4000 ]; do long=$long/$(printf 'p%.0s' $(seq 1 199)); done
mkdir -p "$long" && ln -s "$GGUF" "$long/m.gguf" || fail "cannot make a long path"
"$BIN" needle --model "$long/m.gguf" --haystack "$ROOT/bench/data/gpl-3.txt" --length 128 \
    --depths 100 --answer-tokens 4 --threads 2 --quiet --json "$TMP/n3.json" \
    --reference-dir "$TMP/refs3" 2>"$TMP/n3.err" || fail "needle long path: exit $?: $(cat "$TMP/n3.err")"
grep -q "^tessera needle: --reference-dir .*refs3: nothing kept: the reference's key" "$TMP/n3.err" ||
    fail "needle long path: no line saying nothing is kept: $(cat "$TMP/n3.err")"
grep -q '"reference":"none"' "$TMP/n3.json" || fail "needle long path: $(cat "$TMP/n3.json")"
[ -z "$(ls -A "$TMP/refs3" 2>/dev/null)" ] || fail "needle long path: something was kept"
# h2o decode-only against the H2O reference (tools/h2o_ref.py wrote the data: its kept positions
# per layer at every 4th step, 48 tokens at 50 %): the sets depart only where scores nearly
# tie (measured mean Jaccard 0.97), a wrong score (heads, decode probabilities, slots) far more.
TSR_H2O_DUMP="$TMP/h2o.txt" "$BIN" fidelity --model "$GGUF" --document --max-tokens 48 \
    --text "$ROOT/tests/data/infinigen/artistic.txt" --max-context 256 --threads 2 \
    --kv-policy h2o --kv-budget 0.5 --quiet --json "$TMP/h.json" 2>"$TMP/h.err" ||
    fail "fidelity h2o: exit $?: $(tail -n 3 "$TMP/h.err")"
python3 - "$TMP/h2o.txt" "$ROOT/tests/data/h2o/smollm2_artistic_48_b050.txt" <<'PY' ||
import sys
t, r = ({tuple(map(int, l.split()[:2])): set(map(int, l.split()[2:])) for l in open(p)}
        for p in sys.argv[1:])
j = [len(t[k] & r[k]) / len(t[k] | r[k]) for k in r]
print(f"h2o against the reference: {len(j)} sets, mean Jaccard {sum(j) / len(j):.3f}")
assert len(j) == 360 and sum(j) / len(j) >= 0.9
PY
    fail "h2o: kept sets unlike the reference's"
# usage errors
rc=0
"$BIN" needle --model "$GGUF" --haystack "$ROOT/bench/data/gpl-3.txt" --needles 2 2>/dev/null || rc=$?
[ $rc = 2 ] || fail "needle --needles 2: not a usage error"
[ "$fails" = 0 ] && echo "test_fidelity_gguf: ok"
exit $((fails > 0))
