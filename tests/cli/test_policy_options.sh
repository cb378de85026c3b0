#!/usr/bin/env bash
# The KV policies' options on the command line come from their declarations
# (policies/policy.h): tessera --help lists each policy with its options under it, the
# subcommands' --help carry the generated lines, a bad value is a one-line usage error
# written from the declaration, and --stats shows the policy's declared stats.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$BIN" --help >"$TMP/top" || fail "tessera --help: exit $?"
grep -q "^  h2o  *heavy hitters + recent window (uses --kv-budget)$" "$TMP/top" ||
    fail "tessera --help lacks the h2o line: $(cat "$TMP/top")"
grep -A3 "^  h2o " "$TMP/top" | grep -q -- "--h2o-recent F .*(0..1; default: 0.5)" ||
    fail "tessera --help does not list --h2o-recent under h2o"
grep -A2 "^  offload " "$TMP/top" | grep -q -- "--offload-pairs N" ||
    fail "tessera --help does not list --offload-pairs under offload"
for cmd in generate run; do
    "$BIN" $cmd --help >"$TMP/help" || fail "$cmd --help: exit $?"
    grep -q -- "--h2o-scores MODE .*h2o: .*(tiled|materialize; default: tiled)" "$TMP/help" ||
        fail "$cmd --help lacks the generated --h2o-scores line"
    grep -q -- "--offload-recall  *offload: " "$TMP/help" ||
        fail "$cmd --help lacks --offload-recall"
    grep -q -- "--kv-budget B  *h2o, offload, " "$TMP/help" || # then the other budget policies
        fail "$cmd --help: --kv-budget does not name its policies"
done

# expect_usage NAME SUBSTRING -- command...: exit 2 and one stderr line with SUBSTRING
expect_usage() {
    local name=$1 sub=$2
    shift 3
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -qF -- "$sub" "$TMP/err" ||
        fail "$name: exit $rc, expected 2 and one line with '$sub': $(cat "$TMP/err")"
}
G=("$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1)
expect_usage recent_range "tessera generate: --h2o-recent 2: must be in [0, 1]" -- \
    "${G[@]}" --kv-policy h2o --h2o-recent 2
expect_usage scores_enum "--h2o-scores bogus: use one of tiled, materialize" -- \
    "${G[@]}" --kv-policy h2o --h2o-scores bogus
expect_usage pairs_int "--offload-pairs 1.5: not an integer" -- \
    "${G[@]}" --kv-policy offload --offload-pairs 1.5
# checked whichever policy runs (as --h2o-recent always was)
expect_usage pairs_under_paged "--offload-pairs 99: must be in [0, 64]" -- \
    "${G[@]}" --offload-pairs 99

# --stats: the policy's declared stats in the JSON line
"${G[@]}" --max-tokens 4 --kv-policy offload --kv-budget 0.5 --offload-pairs 2 --offload-recall \
    --stats >/dev/null 2>"$TMP/err" || fail "offload --stats: exit $?: $(cat "$TMP/err")"
grep -q '"policy":"offload".*"bytes_fetched":[0-9]*,.*"spec_recall":' "$TMP/err" ||
    fail "offload --stats lacks its declared stats: $(cat "$TMP/err")"
"${G[@]}" --kv-policy h2o --kv-budget 0.5 --stats >/dev/null 2>"$TMP/err" ||
    fail "h2o --stats: exit $?"
grep -q '"policy":"h2o".*"score_matrix_rebuilds":0' "$TMP/err" ||
    fail "h2o --stats lacks its declared stats: $(cat "$TMP/err")"
grep -q '"spec_recall"' "$TMP/err" && fail "h2o --stats shows offload's stats"

if [ $fails -ne 0 ]; then
    echo "test_policy_options: $fails failure(s)" >&2
    exit 1
fi
echo "test_policy_options: ok"
