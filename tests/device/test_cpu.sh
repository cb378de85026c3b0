#!/usr/bin/env bash
# The device check's CPU paths (ctest device_cpu_paths): what tests/device/run.sh runs on a
# GPU, rehearsed on the fenced CPU device with small shapes, plus the failure paths of its
# parts. Arguments: $1 the build dir (with bench/ and tests/), $2 the repo root, $3 scratch.
set -uo pipefail
BUILD=$(cd "$1" && pwd)
ROOT=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
cd "$ROOT" || exit 1
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
CHECK=$BUILD/bench/tsr_logits_check

# 1. The whole check on cpu-fenced (against cpu): every section but ctest passes, and the
#    summary holds the tables.
OUT=$TMP/out LOGS_DIR=$TMP/logs DEVICE_BACKEND=cpu-fenced BUILD_DIR=$BUILD SKIP_CTEST=1 \
    bash tests/device/run.sh >"$TMP/run.txt" 2>&1 || fail "run.sh rehearsal: exit $? ($(tail -n 3 "$TMP/run.txt"))"
MD=$TMP/out/gpu-results.md
for s in machine backend_ops flash_attn cuda_mem dist_plane logits roofline throughput longctx quant gptoss; do
    grep -q "^| $s | PASS |" "$MD" 2>/dev/null || fail "run.sh: section $s did not pass"
done
grep -q "^| ctest | SKIP |" "$MD" || fail "run.sh: ctest not reported as skipped"
[ "$(grep -c '^RESULT logits .*: PASS' "$MD")" = 5 ] || fail "run.sh: not 5 logits results"
[ "$(grep -c '^| decode, batch' "$MD")" = 2 ] || fail "run.sh: not 2 decode rows"
grep -q '^| prefill, 128 tokens' "$MD" || fail "run.sh: no prefill row"
for p in $("$BUILD/bench/tsr_longctx" --policies); do
    grep -Eq "^$p +2048 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+$" "$MD" ||
        fail "run.sh: no longctx row with device peak for $p"
done
[ -s "$TMP/out/run.log" ] && [ -s "$TMP/out/device-logs.tar.gz" ] || fail "run.sh: logs missing"

# 2. A section that cannot get its minimum time is skipped, not started.
OUT=$TMP/out2 LOGS_DIR=$TMP/logs2 DEVICE_BACKEND=cpu-fenced BUILD_DIR=$BUILD \
    DEVICE_BUDGET_S=20 SECTIONS="machine longctx" bash tests/device/run.sh >"$TMP/run2.txt" 2>&1
grep -q "^| longctx | SKIP | 0 | out of time" "$TMP/out2/gpu-results.md" ||
    fail "run.sh: longctx not skipped on a 20 s budget"

# 3. logits_check fails on a tolerance nothing meets, and refuses a broken reference.
"$CHECK" models/stories260K.bin --backend cpu-fenced --against cpu --threads 2 \
    --ref golden=tests/data/golden/stories260K.json --tol-rel 1e-9 >"$TMP/tight.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "^RESULT logits .*: FAIL" "$TMP/tight.txt" ||
    fail "logits_check: tol 1e-9 gave exit $rc"
echo '{"vocab_size": 512, "prompts": [{"ids": [1, 2], "logits": [0.5], "greedy": [3]}]}' \
    >"$TMP/bad.json"
"$CHECK" models/stories260K.bin --ref bad="$TMP/bad.json" >"$TMP/bad.txt" 2>&1
rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$TMP/bad.txt")" = 1 ] ||
    fail "logits_check: malformed reference gave exit $rc: $(cat "$TMP/bad.txt")"

# 4. The PyTorch reference: one line and exit 3 without torch; with it, the CPU agrees.
python3 tools/torch_reference.py --model tests/data/synth_bf16_gqa \
    --prompts-from tests/data/golden/synth_bf16_gqa.json --out "$TMP/torch.json" \
    >"$TMP/torch.out" 2>"$TMP/torch.err"
rc=$?
if [ $rc = 3 ]; then
    [ "$(wc -l <"$TMP/torch.err")" = 1 ] && grep -q "needs numpy, torch and transformers" \
        "$TMP/torch.err" || fail "torch_reference.py without torch: $(cat "$TMP/torch.err")"
elif [ $rc = 0 ]; then
    "$CHECK" tests/data/synth_bf16_gqa --backend cpu-fenced --against cpu --threads 2 \
        --ref torch="$TMP/torch.json" >"$TMP/torch_check.txt" 2>&1 ||
        fail "logits_check against torch: $(tail -n 1 "$TMP/torch_check.txt")"
else
    fail "torch_reference.py: exit $rc: $(tail -n 2 "$TMP/torch.err")"
fi

# 5. longctx.sh: a run past RUN_TIMEOUT is a row, not a hang.
out=$(BACKEND=cpu THREADS=1 RUN_TIMEOUT=1 MATERIALIZE=0 bash bench/longctx.sh "$BUILD" 65536 1 2>&1)
grep -q "^paged .*FAILED: timeout 1s" <<<"$out" || fail "longctx.sh timeout row: $out"

[ $fails = 0 ] && echo "device CPU paths: all passed"
exit $((fails > 0))
