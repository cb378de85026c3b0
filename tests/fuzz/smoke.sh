#!/usr/bin/env bash
# Smoke run of the libFuzzer targets (CI, and `cmake --build BUILD --target fuzz_smoke`):
#   smoke.sh BINDIR CORPUSDIR TARGET...
# Each target runs for TSR_FUZZ_SECONDS (default 20) on a scratch copy of its seed corpus
# (new inputs never land in the source tree), TSR_FUZZ_JOBS at a time (default 2). Any crash,
# leak, sanitizer report, timeout or out-of-memory fails the run: the log's tail and the
# reproducer's path are printed. Exit 0 only when every target ran clean.
set -uo pipefail
BIN=$1 CORPUS=$2
shift 2
SECS=${TSR_FUZZ_SECONDS:-20}
JOBS=${TSR_FUZZ_JOBS:-2}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tsr_fuzz_smoke.XXXXXX")
# The sanitizers' options for a fuzzing run: stop at the first report, leak checks on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

one() {
    local t=$1 w=$WORK/$1
    mkdir -p "$w/corpus" "$w/artifacts"
    "$BIN/$t" -max_total_time="$SECS" -timeout=25 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -artifact_prefix="$w/artifacts/" "$w/corpus" "$CORPUS/$t" >"$w/log" 2>&1
    echo $? >"$w/rc"
}

running=0
for t in "$@"; do
    if [ ! -d "$CORPUS/$t" ]; then
        echo "fuzz smoke: no seed corpus $CORPUS/$t" >&2
        mkdir -p "$WORK/$t" && echo 1 >"$WORK/$t/rc" && echo "no seed corpus" >"$WORK/$t/log"
        continue
    fi
    one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait

fail=0
for t in "$@"; do
    rc=$(cat "$WORK/$t/rc" 2>/dev/null || echo 1)
    runs=$(grep -o 'Done [0-9]* runs' "$WORK/$t/log" | grep -o '[0-9]*' || echo '?')
    if [ "$rc" = 0 ]; then
        printf 'fuzz smoke: %-22s ok   (%s runs in %ss)\n' "$t" "$runs" "$SECS"
    else
        fail=1
        printf 'fuzz smoke: %-22s FAIL (exit %s)\n' "$t" "$rc"
        tail -n 40 "$WORK/$t/log" | sed "s/^/  $t: /"
        for a in "$WORK/$t"/artifacts/*; do
            [ -e "$a" ] && echo "  $t: reproducer kept: $a (run: $BIN/$t $a)"
        done
    fi
done
# The scratch corpora go; a failing run keeps its directory for the reproducers.
if [ "$fail" = 0 ]; then rm -rf "$WORK"; else echo "fuzz smoke: logs and inputs in $WORK"; fi
exit "$fail"
