#!/usr/bin/env bash
# `tessera fidelity`: one JSON object with every field present and in range; the paged cache
# against itself is exact (agreement 1, KL 0); h2o at 10 % is not; a synthetic model gets the
# probe without a tokenizer; --reference-dir keeps the full cache's side of a document and
# says why when it keeps nothing; --dtype q8_0 runs both caches quantized (and is part of a
# reference's key); errors are one line with a non-zero exit.
# args: $1 tessera binary, $2 repo root, $3 scratch dir
set -u
BIN=$1 ROOT=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP"
fails=0
check() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fails=$((fails + 1)); fi; }
MODEL=$ROOT/models/stories260K.bin
TEXT=$ROOT/bench/data/heldout.txt
# Fewer positions on the fenced device (a fence per backend call); the checks do not depend
# on the count.
if [ "${TSR_TEST_BACKEND:-cpu}" = cpu-fenced ]; then N=200; else N=600; fi

# fields.py FILE POLICY MODE: every field present, in range; MODE exact|lossy|probe-only
fields() {
    python3 - "$@" <<'PY'
import json, math, sys
path, policy, mode = sys.argv[1:4]
d = json.load(open(path))
keys = ["schema_version", "policy", "tokens", "nll", "ppl", "nll_full", "ppl_full",
        "agreement", "kl", "probe_text_recall", "probe_attention_recall", "wall_s"]
missing = [k for k in keys if k not in d]
assert not missing, "missing %s" % missing
assert d["schema_version"] == 1 and d["policy"] == policy, d
assert d["wall_s"] > 0
ar = d["probe_attention_recall"]
assert ar is not None and 0 <= ar <= 1, ar
if mode == "probe-only":
    assert d["tokens"] == 0
    for k in ["nll", "ppl", "nll_full", "ppl_full", "agreement", "kl", "probe_text_recall"]:
        assert d[k] is None, (k, d[k])
    sys.exit(0)
assert d["tokens"] > 0
for k in ["nll", "nll_full"]:
    assert d[k] > 0 and math.isfinite(d[k]), (k, d[k])
assert abs(d["ppl"] - math.exp(d["nll"])) <= 1e-9 * d["ppl"]
assert abs(d["ppl_full"] - math.exp(d["nll_full"])) <= 1e-9 * d["ppl_full"]
assert 0 <= d["agreement"] <= 1 and d["kl"] >= 0
tr = d["probe_text_recall"]
assert tr is not None and 0 <= tr <= 1, tr
if mode == "exact":
    assert d["agreement"] == 1 and d["kl"] == 0 and d["nll"] == d["nll_full"], d
    assert ar == 1, ar
else:
    assert d["agreement"] < 1 and d["kl"] > 0 and d["nll"] > d["nll_full"], d
PY
}

"$BIN" fidelity --model "$MODEL" --text "$TEXT" --max-tokens $N --probe-length 300 \
    --kv-policy paged --threads 1 --json "$TMP/paged.json" 2>"$TMP/err"
[ $? -eq 0 ] && fields "$TMP/paged.json" paged exact && grep -q "^tessera fidelity: paged: $N tokens" "$TMP/err"
check $? fidelity_paged_exact

"$BIN" fidelity --model "$MODEL" --text "$TEXT" --max-tokens $N --probe-length 300 \
    --kv-policy h2o --kv-budget 0.1 --threads 1 --json "$TMP/h2o.json" --quiet 2>"$TMP/err"
[ $? -eq 0 ] && fields "$TMP/h2o.json" h2o lossy && [ ! -s "$TMP/err" ]
check $? fidelity_h2o_lossy

# --gen-tokens: the full cache's greedy continuation of each story, fed to both (exact too).
printf 'Once upon a time there was a little cat.\n\nThe dog ran to the park. It was happy.\n' >"$TMP/short.txt"
"$BIN" fidelity --model "$MODEL" --text "$TMP/short.txt" --gen-tokens 8 --probe-length 200 \
    --kv-policy paged --threads 1 --quiet --json "$TMP/gen.json" &&
    fields "$TMP/gen.json" paged exact &&
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['gen_tokens'] == 16 and d['gen_agreement'] == 1 and d['gen_kl'] == 0, d" "$TMP/gen.json"
check $? fidelity_gen_tokens

# --reference-dir with --document: the paged run writes the full cache's logits there, the
# h2o run reads them (no full cache of its own) and gets the same full-cache figures; where
# no reference can be kept (a probe alone, --gen-tokens) the CLI says so and writes none.
"$BIN" fidelity --model "$MODEL" --text "$TEXT" --document --doc-tokens 96 --kv-policy paged \
    --threads 1 --reference-dir "$TMP/refs" --quiet --json "$TMP/ref1.json" 2>"$TMP/err" &&
    [ ! -s "$TMP/err" ] && [ "$(ls "$TMP/refs" | grep -c '^fidelity-.*\.ref$')" -eq 1 ] &&
    "$BIN" fidelity --model "$MODEL" --text "$TEXT" --document --doc-tokens 96 \
        --kv-policy h2o --kv-budget 0.5 --threads 1 --reference-dir "$TMP/refs" --quiet \
        --json "$TMP/ref2.json" 2>"$TMP/err" && [ ! -s "$TMP/err" ] &&
    python3 - "$TMP/ref1.json" "$TMP/ref2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["reference"] == "computed" and b["reference"] == "reused", (a, b)
assert a["document"] and a["tokens"] == b["tokens"] == 95, (a, b)
assert a["nll_full"] == b["nll_full"] and a["nll"] == a["nll_full"], (a, b)
assert b["nll"] != b["nll_full"], b
PY
check $? fidelity_reference_dir_document
"$BIN" fidelity --model "$MODEL" --probe-length 200 --threads 1 --reference-dir "$TMP/refs2" \
    --quiet --json "$TMP/ref3.json" 2>"$TMP/err" && [ ! -e "$TMP/refs2" ] &&
    [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
    grep -q "^tessera fidelity: --reference-dir .*refs2: nothing kept: .*no text" "$TMP/err" &&
    grep -q '"reference":"none"' "$TMP/ref3.json" &&
    "$BIN" fidelity --model "$MODEL" --text "$TMP/short.txt" --gen-tokens 4 --threads 1 \
        --reference-dir "$TMP/refs2" --quiet --json "$TMP/ref4.json" 2>"$TMP/err" &&
    [ ! -e "$TMP/refs2" ] && grep -q "nothing kept: --gen-tokens" "$TMP/err"
check $? fidelity_reference_dir_says_why_none

# --dtype q8_0: both caches run on the matrices quantized at load; the JSON names the dtype,
# and a reference's key holds it, so the f32 run's full-cache logits (refs, above) are not
# reused for it: computed once (other figures), then reused by the next q8_0 run.
for i in 1 2; do
    "$BIN" fidelity --model "$MODEL" --text "$TEXT" --document --doc-tokens 96 --dtype q8_0 \
        --kv-policy h2o --kv-budget 0.5 --threads 1 --reference-dir "$TMP/refs" --quiet \
        --json "$TMP/q$i.json" 2>"$TMP/err" && [ ! -s "$TMP/err" ] || break
done
[ -s "$TMP/q2.json" ] && [ "$(ls "$TMP/refs" | grep -c '^fidelity-.*\.ref$')" -eq 2 ] &&
    python3 - "$TMP/ref2.json" "$TMP/q1.json" "$TMP/q2.json" <<'PY'
import json, sys
f, a, b = (json.load(open(p)) for p in sys.argv[1:])
assert f["dtype"] == "f32" and a["dtype"] == b["dtype"] == "q8_0", (f, a, b)
assert a["reference"] == "computed" and b["reference"] == "reused", (a, b)
assert a["nll_full"] != f["nll_full"] and a["nll"] != f["nll"], (f, a)
assert a["nll_full"] == b["nll_full"] and a["nll"] == b["nll"], (a, b)
PY
check $? fidelity_dtype_q8_0
"$BIN" fidelity --model "$MODEL" --text "$TEXT" --dtype q9 >"$TMP/o" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--dtype" "$TMP/err" && [ ! -s "$TMP/o" ]
check $? fidelity_dtype_bad

# No --json: the object on stdout. A synthetic model without a tokenizer: the probe alone.
"$BIN" fidelity --model synthetic:tiny,ctx=512 --probe-length 400 --kv-policy h2o \
    --kv-budget 0.2 --quiet >"$TMP/syn.json" 2>"$TMP/err"
[ $? -eq 0 ] && fields "$TMP/syn.json" h2o probe-only
check $? fidelity_synthetic_probe

# Errors: one line, non-zero.
"$BIN" fidelity --model "$MODEL" >"$TMP/o" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "text or --probe-length" "$TMP/err"
check $? fidelity_needs_work
"$BIN" fidelity --model "$MODEL" --text "$TMP/nope.txt" >"$TMP/o" 2>"$TMP/err"
[ $? -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "^tessera fidelity: .*nope.txt" "$TMP/err"
check $? fidelity_missing_text
"$BIN" fidelity --model "$MODEL" --probe-length 100000 >"$TMP/o" 2>"$TMP/err"
[ $? -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "exceeds the context" "$TMP/err"
check $? fidelity_probe_too_long
"$BIN" fidelity --model "$MODEL" --probe-length 100 --kv-policy nosuch >"$TMP/o" 2>"$TMP/err"
[ $? -ne 0 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "nosuch" "$TMP/err"
check $? fidelity_unknown_policy
"$BIN" fidelity --help | grep -q -- "--probe-length"
check $? fidelity_help

[ "$fails" -eq 0 ]
