#!/usr/bin/env bash
# offload's two modes from the command line (docs/kv-cache.md): at a 100 % budget both give
# the tokens of paged; at 20 % the --stats line reports speculative selections (none falling
# back to the recent window), the sampled recall of the exact top tokens and the bytes
# fetched per token; the default is skew with dense prefill; --offload-mode and
# --offload-dense-prefill are checked, and warned about under other policies.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

gen() { "$BIN" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 48 --temperature 0 "$@"; }

gen --kv-policy paged >"$TMP/paged" 2>"$TMP/err" || fail "paged: $(cat "$TMP/err")"
for mode in skew warmup; do
    gen --kv-policy offload --kv-budget 1.0 --offload-mode $mode >"$TMP/full_$mode" 2>"$TMP/err" ||
        fail "offload $mode 100 %: $(cat "$TMP/err")"
    cmp -s "$TMP/paged" "$TMP/full_$mode" || fail "offload $mode at 100 % differs from paged"
    gen --kv-policy offload --kv-budget 0.2 --offload-mode $mode --stats >/dev/null 2>"$TMP/err" ||
        fail "offload $mode 20 %: $(cat "$TMP/err")"
    python3 - "$TMP/err" "$mode" <<'PY' || fail "offload $mode 20 %: stats: $(cat "$TMP/err")"
import json, sys
st = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"policy"')][0]
assert st["spec_selections"] > 0 and st["spec_fallbacks"] == 0, st
assert 0 < st["spec_recall"] <= 1, st
assert st["bytes_fetched_per_token"] > 0 and st["bytes_fetched"] > 0, st
PY
done

# The copy streams (cpu-fenced: the fetch a layer ahead, the write-back on a copy stream) give
# the tokens of --offload-sync, in both modes.
for mode in skew warmup; do
    gen --kv-policy offload --kv-budget 0.2 --offload-mode $mode >"$TMP/ovl_$mode" 2>"$TMP/err" ||
        fail "offload $mode 20 %: $(cat "$TMP/err")"
    gen --kv-policy offload --kv-budget 0.2 --offload-mode $mode --offload-sync >"$TMP/sync_$mode" 2>"$TMP/err" ||
        fail "offload $mode 20 % --offload-sync: $(cat "$TMP/err")"
    cmp -s "$TMP/ovl_$mode" "$TMP/sync_$mode" || fail "offload $mode: --offload-sync differs"
done

# skew's alpha rule: a wider alpha fetches at least as many tokens (InfiniGen's --offload-alpha)
for a in 0.5 16; do
    gen --kv-policy offload --kv-budget 0.5 --offload-mode skew --offload-alpha $a --stats >/dev/null 2>"$TMP/alpha_$a" ||
        fail "offload alpha $a: $(cat "$TMP/alpha_$a")"
done
python3 - "$TMP/alpha_0.5" "$TMP/alpha_16" <<'PY' || fail "alpha: $(cat "$TMP/alpha_0.5" "$TMP/alpha_16")"
import json, sys
f = [[json.loads(l) for l in open(p) if l.startswith('{"policy"')][0]["bytes_fetched"] for p in sys.argv[1:]]
assert 0 < f[0] < f[1], f
PY
# the default (no option but the budget): skew with dense prefill, the same tokens as both
# given; 48 tokens from a 4-token prompt have no prefill chunk over a budget, so a prompt of
# 40 tokens in 8-token chunks makes dense prefill act (the output differs with it off)
P40="one two three four five six seven eight nine ten one two three four five six seven eight nine ten"
gen --kv-policy offload --kv-budget 0.2 --prompt "$P40" --chunk 8 >"$TMP/def" 2>"$TMP/err" ||
    fail "offload default: $(cat "$TMP/err")"
gen --kv-policy offload --kv-budget 0.2 --prompt "$P40" --chunk 8 --offload-mode skew \
    --offload-dense-prefill on >"$TMP/expl" 2>"$TMP/err" || fail "offload skew on: $(cat "$TMP/err")"
cmp -s "$TMP/def" "$TMP/expl" || fail "offload's default is not skew with dense prefill"
gen --kv-policy offload --offload-dense-prefill maybe >/dev/null 2>"$TMP/err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--offload-dense-prefill maybe: use one of off, on" "$TMP/err" ||
    fail "bad dense prefill: exit $rc: $(cat "$TMP/err")"
gen --kv-policy offload --offload-mode bogus >/dev/null 2>"$TMP/err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--offload-mode bogus: use one of warmup, skew" "$TMP/err" ||
    fail "bad mode: exit $rc: $(cat "$TMP/err")"
gen --max-tokens 1 --kv-policy h2o --kv-budget 0.5 --offload-mode warmup >/dev/null 2>"$TMP/err" ||
    fail "h2o with --offload-mode: $(cat "$TMP/err")"
grep -q -- "--offload-mode is ignored under --kv-policy h2o" "$TMP/err" ||
    fail "h2o with --offload-mode did not warn: $(cat "$TMP/err")"
[ $fails -eq 0 ] && echo "ok   offload_modes"
exit $((fails > 0))
