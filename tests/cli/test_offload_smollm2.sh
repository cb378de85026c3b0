#!/usr/bin/env bash
# offload's InfiniGen mode on the bundled real model (tools/fetch-models.sh): decode-mode
# fidelity over the first 48 tokens of tests/data/infinigen/artistic.txt at a 50 % budget must
# keep its speculation's recall of the exact top tokens and its perplexity near the full
# cache's (issue 31). The skew's transform is recalibrated per query head from the layer's own
# queries after 16 and 32 rows (--offload-calib), its columns InfiniGen's union by query energy
# and by key magnitude; the same run measured recall 0.795 (ppl 57.2 against the full cache's
# 32.0), 0.747 with one transform per KV head and the columns by eigenvalue, 0.661 with the
# weights' transform alone (--offload-calib 0); so recall >= 0.77 fails a fall-back to either,
# to recent tokens (fallbacks) or to a wrong skew. The InfiniGen reference on the
# same model is tests/data/infinigen/. Skips (77) without the model.
. "$(dirname "$0")/common.sh"
GGUF=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$GGUF" ]; then
    echo "SKIP: $GGUF absent (tools/fetch-models.sh fetches it)"
    exit 77
fi
"$BIN" fidelity --model "$GGUF" --text "$ROOT/tests/data/infinigen/artistic.txt" \
    --max-tokens 48 --max-context 256 --threads 2 --kv-policy offload --offload-mode skew --kv-budget 0.5 \
    --offload-recall --json "$TMP/f.json" --quiet 2>"$TMP/f.err" ||
    fail "fidelity offload: exit $?: $(tail -n 3 "$TMP/f.err")"
python3 - "$TMP/f.json" <<'PY' || fail "offload on SmolLM2: $(cat "$TMP/f.json")"
import json, sys
d = json.load(open(sys.argv[1]))
kv = d["kv"]
print(f"ppl {d['ppl']:.2f} (full {d['ppl_full']:.2f}) agreement {d['agreement']:.3f} "
      f"recall {kv['spec_recall']:.3f} fallbacks {kv['spec_fallbacks']}")
assert d["tokens"] == 48, d["tokens"]
assert kv["spec_fallbacks"] == 0
assert kv["spec_recall"] >= 0.77, kv["spec_recall"]
assert d["ppl"] <= 2.5 * d["ppl_full"], (d["ppl"], d["ppl_full"])
PY
exit $((fails > 0))
