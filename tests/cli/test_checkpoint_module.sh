#!/usr/bin/env bash
# Checkpoints' HDF5 code is a module loaded on first use (libtessera-hdf5.so,
# jobs/run/checkpoint.c): the binary links no HDF5 library and runs without the module;
# a checkpoint that cannot be had is one line naming the module and why (not installed,
# cannot load), and a non-zero exit; TSR_MODULE_DIR finds a module elsewhere; --version
# says where the module is, or where it looked.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
unset TSR_MODULE_DIR
IN=$TMP/in.jsonl
printf '{"custom_id":"a","body":{"prompt":"Once upon a time","max_tokens":8}}\n' >"$IN"

# 1. The binary links no HDF5 (nor its closure), whatever the build.
if command -v ldd >/dev/null; then
    if ldd "$BIN" | grep -E 'lib(hdf5[^ ]*|curl|gssapi_krb5)\.so' >"$TMP/ldd"; then
        fail "tessera links HDF5 or its dependencies: $(tr '\n' ' ' <"$TMP/ldd")"
    fi
fi
if "$BIN" run --model "$MODEL" --input /dev/null --output "$TMP/x.jsonl" \
    --checkpoint "$TMP/x.h5" 2>&1 | grep -q "this build has no HDF5"; then
    echo "test_checkpoint_module: the rest skipped (built without HDF5)"
    [ $fails -eq 0 ] || exit 1
    exit 77
fi
MODDIR=$(dirname "$BIN")
[ -f "$MODDIR/libtessera-hdf5.so" ] || fail "no libtessera-hdf5.so next to $BIN"

# expect_line NAME SUBSTRING -- command...: a non-zero exit, one stderr line naming the
# module and containing SUBSTRING, no record written.
expect_line() {
    local name=$1 sub=$2
    shift 3
    rm -f "$TMP/out.jsonl"
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 0 ]; then
        fail "$name: exit 0, expected an error"
    elif [ "$(wc -l <"$TMP/err")" -ne 1 ]; then
        fail "$name: expected one stderr line, got: $(cat "$TMP/err")"
    elif ! grep -qF -- "libtessera-hdf5.so" "$TMP/err" || ! grep -qF -- "$sub" "$TMP/err"; then
        fail "$name: stderr lacks '$sub': $(cat "$TMP/err")"
    elif [ -s "$TMP/out.jsonl" ]; then
        fail "$name: records written although the checkpoint cannot be had"
    fi
}

# 2. The binary alone in a directory of its own: generate and run without --checkpoint work;
#    --checkpoint and `checkpoint inspect` say the module is not installed.
mkdir -p "$TMP/alone/bin"
cp "$BIN" "$TMP/alone/bin/tessera"
ALONE=$TMP/alone/bin/tessera
"$ALONE" generate --model "$MODEL" --prompt "Once" --max-tokens 4 >"$TMP/out" 2>"$TMP/err" &&
    [ -s "$TMP/out" ] || fail "generate without the module: $(cat "$TMP/err")"
"$ALONE" run --model "$MODEL" --input "$IN" --output "$TMP/plain.jsonl" --quiet 2>"$TMP/err" &&
    [ "$(nlines "$TMP/plain.jsonl")" -eq 1 ] || fail "run without the module: $(cat "$TMP/err")"
expect_line "run --checkpoint, module absent" "is not installed" -- \
    "$ALONE" run --model "$MODEL" --input "$IN" --output "$TMP/out.jsonl" --checkpoint "$TMP/c.h5"
expect_line "checkpoint inspect, module absent" "is not installed" -- \
    "$ALONE" checkpoint inspect "$TMP/c.h5"
"$ALONE" --version >"$TMP/version" 2>&1 &&
    grep -q "^hdf5 module   libtessera-hdf5.so not found (looked in .*): run --checkpoint cannot run$" \
        "$TMP/version" || fail "--version without the module: $(cat "$TMP/version")"

# 3. TSR_MODULE_DIR names the module's directory: the same binary checkpoints.
TSR_MODULE_DIR=$MODDIR "$ALONE" run --model "$MODEL" --input "$IN" --output "$TMP/ok.jsonl" \
    --checkpoint "$TMP/c.h5" --quiet 2>"$TMP/err" &&
    [ "$(nlines "$TMP/ok.jsonl")" -eq 1 ] || fail "TSR_MODULE_DIR: $(cat "$TMP/err")"
TSR_MODULE_DIR=$MODDIR "$ALONE" --version >"$TMP/version" 2>&1 &&
    grep -qF "hdf5 module   $MODDIR/libtessera-hdf5.so (loaded by run --checkpoint)" \
        "$TMP/version" || fail "--version with TSR_MODULE_DIR: $(cat "$TMP/version")"

# 4. A file of that name that is no shared object: "cannot load", with the loader's reason.
mkdir -p "$TMP/bad"
echo "not an ELF file" >"$TMP/bad/libtessera-hdf5.so"
expect_line "module not loadable" "cannot load" -- env TSR_MODULE_DIR="$TMP/bad" \
    "$ALONE" run --model "$MODEL" --input "$IN" --output "$TMP/out.jsonl" --checkpoint "$TMP/c.h5"

[ $fails -eq 0 ] || exit 1
echo "test_checkpoint_module: ok"
