#!/usr/bin/env bash
# The small checks of issue 17 (point 7), one section each: --threads beyond what the CPUs
# can run is a usage error; an unwritable --output / --errors is named as the user gave it
# (not its .tmp), --output DIR is called a directory; an input in UTF-16 or UTF-32 is refused
# up front, a Latin-1 line is one invalid_encoding record,
# while a UTF-8 byte-order mark is accepted; KV options the chosen policy ignores get a
# warning; a 1 MB model's peak resident memory stays small.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# expect_fail NAME EXIT SUBSTRING -- command...: exit code EXIT, exactly one stderr line,
# containing SUBSTRING and no ".tmp".
expect_fail() {
    local name=$1 code=$2 sub=$3
    shift 4
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne "$code" ]; then
        fail "$name: exit $rc, expected $code: $(cat "$TMP/err")"
    elif [ "$(wc -l <"$TMP/err")" -ne 1 ]; then
        fail "$name: expected one stderr line, got: $(cat "$TMP/err")"
    elif ! grep -qF -- "$sub" "$TMP/err"; then
        fail "$name: stderr lacks '$sub': $(cat "$TMP/err")"
    else
        local e
        e=$(cat "$TMP/err")
        e=${e//"$TMP"/} # ctest's scratch dir ends in .tmp itself
        [[ $e == *.tmp* ]] && fail "$name: stderr names a temporary file: $(cat "$TMP/err")"
    fi
}

printf '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}}\n{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "The caf\xc3\xa9", "max_tokens": 3, "temperature": 0}}\n' >"$TMP/in.jsonl"
RUN=(run --model "$MODEL" --quiet --progress-interval 0)

# --- a. --threads: at most 4 per CPU this process may run on (usage error, exit 2) -------
expect_fail threads_generate 2 "--threads 10000" -- \
    "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1 --threads 10000
expect_fail threads_run 2 "--threads 10000" -- \
    "$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/t.jsonl" --threads 10000
[ -e "$TMP/t.jsonl" ] && fail "threads_run: a refused job wrote its output"
expect_fail threads_bench 2 "--threads 10000" -- \
    "$BIN" bench --model synthetic:tiny --gen-tokens 1 --repeat 1 --threads 10000
"$BIN" generate --model "$MODEL" --prompt hi --help | grep -q "at most 4 per CPU" ||
    fail "threads: --help does not state the limit"
if command -v taskset >/dev/null 2>&1 && taskset -c 0 true 2>/dev/null; then
    # one CPU: 4 threads run, 5 are refused
    taskset -c 0 "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 2 --threads 4 \
        >/dev/null 2>"$TMP/err" || fail "threads: 4 threads on one CPU refused: $(cat "$TMP/err")"
    expect_fail threads_one_cpu 2 "(1 CPU: at most 4)" -- \
        taskset -c 0 "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1 --threads 5
else
    echo "note: no taskset, the one-CPU case is not checked"
fi

# --- b. output-path errors name the path given ---------------------------------------------
expect_fail output_dir_missing 1 "$TMP/nodir/out.jsonl:" -- \
    "$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/nodir/out.jsonl"
expect_fail errors_dir_missing 1 "$TMP/nodir/e.jsonl:" -- \
    "$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/o.jsonl" --errors "$TMP/nodir/e.jsonl"

# --- c. an input that is not UTF-8 is refused up front; a UTF-8 BOM is accepted -------------
to_utf16() { # $1 iconv encoding name
    if command -v iconv >/dev/null 2>&1; then
        iconv -f UTF-8 -t "$1"
    else
        python3 -c "import sys; e=sys.argv[1].lower().replace('-','_'); sys.stdout.buffer.write(sys.stdin.buffer.read().decode().encode(e))" "$1"
    fi
}
if command -v iconv >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1; then
    # iconv's UTF-16 writes a byte-order mark (either order); UTF-16LE writes none
    to_utf16 UTF-16 <"$TMP/in.jsonl" >"$TMP/in16.jsonl"
    to_utf16 UTF-16LE <"$TMP/in.jsonl" >"$TMP/in16le.jsonl"
    expect_fail utf16_bom 1 "$TMP/in16.jsonl: the input is UTF-16" -- \
        "$BIN" "${RUN[@]}" --input "$TMP/in16.jsonl" --output "$TMP/o16.jsonl"
    expect_fail utf16_no_bom 1 "$TMP/in16le.jsonl: line 1 has a NUL byte" -- \
        "$BIN" "${RUN[@]}" --input "$TMP/in16le.jsonl" --output "$TMP/o16le.jsonl"
    for f in o16 o16le; do
        [ -e "$TMP/$f.jsonl" ] && fail "$f: a refused input left an output file"
        [ -e "$TMP/$f.errors.jsonl" ] && fail "$f: a refused input left an errors file"
    done
else
    echo "note: neither iconv nor python3, the UTF-16 case is not checked"
fi
LC_ALL=C sed 's/caf\xc3\xa9/caf\xe9/' "$TMP/in.jsonl" >"$TMP/latin1.jsonl"
# a Latin-1 line is one bad line: an invalid_encoding record, the other line answered
"$BIN" "${RUN[@]}" --input "$TMP/latin1.jsonl" --output "$TMP/olat.jsonl" 2>"$TMP/err" ||
    fail "latin1: exit non-zero: $(cat "$TMP/err")"
grep -q '"custom_id":"b".*"code":"invalid_encoding","message":"line 2 is not UTF-8 (byte 0xe9' \
    "$TMP/olat.jsonl" || fail "latin1: no invalid_encoding record: $(cat "$TMP/olat.jsonl")"
[ "$(grep -c '"status_code":200' "$TMP/olat.jsonl")" -eq 1 ] ||
    fail "latin1: the good line was not answered"
# --kv-budget 2.5 is neither a fraction (<= 1) nor whole tokens: a usage error
expect_fail kv_budget_fraction 2 "--kv-budget 2.5: a fraction of the sequence must be <= 1" -- \
    "$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/kb.jsonl" --kv-policy h2o --kv-budget 2.5
# --output DIR: named as a directory, not a read error
mkdir -p "$TMP/adir"
expect_fail output_is_dir 1 "--output $TMP/adir is a directory" -- \
    "$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/adir"
{ printf '\xef\xbb\xbf'; cat "$TMP/in.jsonl"; } >"$TMP/bom.jsonl"
if "$BIN" "${RUN[@]}" --input "$TMP/bom.jsonl" --output "$TMP/obom.jsonl" 2>"$TMP/err"; then
    [ "$(grep -c '"status_code":200' "$TMP/obom.jsonl")" -eq 2 ] ||
        fail "utf8_bom: expected 2 completed records: $(cat "$TMP/obom.jsonl")"
    "$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/oplain.jsonl" 2>/dev/null
    cmp -s "$TMP/obom.jsonl" "$TMP/oplain.jsonl" ||
        fail "utf8_bom: records differ from the same input without the mark"
else
    fail "utf8_bom: exit non-zero: $(cat "$TMP/err")"
fi

# --- d. KV options the policy ignores get one warning line (not refused: scripts loop over
# policies with one set of options, e.g. test_run_checkpoint.sh) ------------------------------
# expect_warn NAME SUBSTRING -- command...: exit 0 and exactly one stderr warning, with SUBSTRING
expect_warn() {
    local name=$1 sub=$2
    shift 3
    "$@" >"$TMP/out" 2>"$TMP/err" || fail "$name: exit $?: $(cat "$TMP/err")"
    [ "$(grep -c "warning" "$TMP/err")" -eq 1 ] && grep -qF -- "$sub" "$TMP/err" ||
        fail "$name: expected one warning with '$sub': $(cat "$TMP/err")"
}
# (the list goes on with every policy that declares uses_budget: a new one adds to its end)
expect_warn budget_paged_default "tessera generate: warning: --kv-budget is ignored under --kv-policy paged (it applies to h2o, offload, " -- \
    "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1 --kv-budget 1
expect_warn budget_paged_run "tessera run: warning: --kv-budget is ignored under --kv-policy paged" -- \
    "$BIN" run --model "$MODEL" --progress-interval 0 --input "$TMP/in.jsonl" \
    --output "$TMP/kv1.jsonl" --kv-policy paged --kv-budget 0.5
expect_warn recent_offload "--h2o-recent is ignored under --kv-policy offload (it applies to h2o)" -- \
    "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1 --kv-policy offload --kv-budget 0.5 --h2o-recent 0.3
expect_warn scores_paged "--h2o-scores is ignored under --kv-policy paged (it applies to h2o)" -- \
    "$BIN" run --model "$MODEL" --progress-interval 0 --input "$TMP/in.jsonl" \
    --output "$TMP/kv2.jsonl" --h2o-scores materialize
# --quiet: nothing but fatal errors
"$BIN" "${RUN[@]}" --input "$TMP/in.jsonl" --output "$TMP/kv3.jsonl" --kv-budget 0.5 \
    2>"$TMP/err" || fail "quiet paged + budget: exit $?"
[ -s "$TMP/err" ] && fail "quiet paged + budget: stderr not empty: $(cat "$TMP/err")"
"$BIN" generate --model "$MODEL" --prompt hi --max-tokens 2 --kv-policy h2o --kv-budget 0.5 \
    --h2o-recent 0.3 --h2o-scores materialize >/dev/null 2>"$TMP/err" ||
    fail "h2o with all its options: exit $?: $(cat "$TMP/err")"
grep -q warning "$TMP/err" && fail "h2o with all its options warned: $(cat "$TMP/err")"
"$BIN" generate --model "$MODEL" --prompt hi --max-tokens 2 --kv-policy offload --kv-budget 0.5 \
    >/dev/null 2>"$TMP/err" || fail "offload with a budget: exit $?: $(cat "$TMP/err")"
grep -q warning "$TMP/err" && fail "offload with a budget warned: $(cat "$TMP/err")"

# --- e. a 1 MB model's peak resident memory -------------------------------------------------
# Measured on the plain CPU build only: ASan's shadow memory and the fenced device's
# page-granular buffers are not what a user runs.
# The default pool (no --kv-memory) is capped at what the job's sequences can fill
# (runtime/exec/kv_setup.c), not half the host's memory in block records.
check_default_pool=1
real=${TSR_TEST_BIN:-$BIN}
peak_kib() { # peak RSS in KiB of the command, from getrusage of the children
    python3 -c "import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)" "$@"
}
if [ "${TSR_TEST_BACKEND:-cpu}" != cpu ]; then
    echo "note: peak RSS checked on the cpu backend only"
elif ldd "$real" 2>/dev/null | grep -q libasan; then
    echo "note: ASan build, peak RSS not checked"
elif ! command -v python3 >/dev/null 2>&1; then
    echo "note: no python3, peak RSS not checked"
else
    GEN=(generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 8 --temperature 0)
    kib=$(peak_kib "$real" "${GEN[@]}" --kv-memory 1M) || fail "rss: generate failed"
    echo "peak RSS, stories260K generate, --kv-memory 1M: ${kib:-?} KiB"
    [ -n "$kib" ] && [ "$kib" -lt 65536 ] || fail "rss: ${kib:-?} KiB with a 1 MiB pool (> 64 MiB)"
    kib=$(peak_kib "$real" "${GEN[@]}") || fail "rss: generate failed"
    echo "peak RSS, stories260K generate, default pool: ${kib:-?} KiB"
    if [ $check_default_pool = 1 ]; then
        [ -n "$kib" ] && [ "$kib" -lt 65536 ] ||
            fail "rss: ${kib:-?} KiB with the default pool (> 64 MiB)"
    fi
fi

if [ $fails -ne 0 ]; then
    echo "test_cli_checks: $fails failure(s)" >&2
    exit 1
fi
echo "test_cli_checks: ok"
