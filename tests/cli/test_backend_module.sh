#!/usr/bin/env bash
# The GPU backend is a module loaded at run time (kernels/backend.c): the binary links no
# CUDA library and runs on the CPU without one; `--backend cuda` that cannot run is one line
# saying why (module not installed, cannot load, another build's, no driver, no GPU) and
# exit 1; `auto` falls back to the CPU with one --verbose line.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
# shellcheck source=tests/cli/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
unset TSR_MODULE_DIR
GEN=(generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 8 --temperature 0)

# expect_line NAME SUBSTRING -- command...: exit 1, one stderr line naming the cuda backend
# and containing SUBSTRING.
expect_line() {
    local name=$1 sub=$2
    shift 3
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 1 ]; then
        fail "$name: exit $rc, expected 1: $(cat "$TMP/err")"
    elif [ "$(wc -l <"$TMP/err")" -ne 1 ]; then
        fail "$name: expected one stderr line, got: $(cat "$TMP/err")"
    elif ! grep -qF -- "backend 'cuda'" "$TMP/err" || ! grep -qF -- "$sub" "$TMP/err"; then
        fail "$name: stderr lacks '$sub': $(cat "$TMP/err")"
    fi
}

# 1. The binary links no CUDA, cuBLAS or NCCL library (whatever the build).
if command -v ldd >/dev/null; then
    if ldd "$BIN" | grep -E 'lib(cuda|cudart|cublas|cublasLt|nccl)\.so' >"$TMP/ldd"; then
        fail "tessera links CUDA libraries: $(tr '\n' ' ' <"$TMP/ldd")"
    fi
fi

# 2. --backend cuda as built: on a GPU node it runs; elsewhere one line, whichever reason.
if "$BIN" "${GEN[@]}" --backend cuda >"$TMP/out" 2>"$TMP/err"; then
    echo "(a GPU answers here: the no-GPU line is not checked)"
else
    expect_line "cuda as built" "run with --backend cpu" -- "$BIN" "${GEN[@]}" --backend cuda
fi

# 3. The module moved away: the binary alone in a directory of its own.
mkdir -p "$TMP/alone/bin"
cp "$BIN" "$TMP/alone/bin/tessera"
expect_line "module absent" "is not installed" -- "$TMP/alone/bin/tessera" "${GEN[@]}" --backend cuda

# 4. The CUDA libraries out of reach: no module, LD_LIBRARY_PATH pointing nowhere; auto (and
#    the default) run on the CPU, with one --verbose line saying why not the GPU.
for b in auto cpu; do
    if ! LD_LIBRARY_PATH=/nonexistent "$TMP/alone/bin/tessera" "${GEN[@]}" --backend $b \
        >"$TMP/out" 2>"$TMP/err" || [ ! -s "$TMP/out" ]; then
        fail "no CUDA libraries, --backend $b: $(cat "$TMP/err")"
    fi
done
LD_LIBRARY_PATH=/nonexistent "$TMP/alone/bin/tessera" "${GEN[@]}" --verbose >"$TMP/out" 2>"$TMP/err" ||
    fail "no CUDA libraries, --verbose: $(cat "$TMP/err")"
n=$(grep -c 'backend auto: cpu' "$TMP/err")
[ "$n" -eq 1 ] ||
    fail "auto without the module: expected one 'backend auto: cpu' line under --verbose, got $n"
grep -q 'backend auto' <(LD_LIBRARY_PATH=/nonexistent "$TMP/alone/bin/tessera" "${GEN[@]}" 2>&1) &&
    fail "auto's fallback line shows without --verbose"

# 5. A module that cannot load (a broken file stands for one whose libraries are missing):
#    named, with what to do; auto still runs on the CPU.
mkdir -p "$TMP/broken/bin"
cp "$BIN" "$TMP/broken/bin/tessera"
echo "not a shared object" >"$TMP/broken/bin/libtessera-cuda.so"
expect_line "module cannot load" "cannot load" -- "$TMP/broken/bin/tessera" "${GEN[@]}" --backend cuda
"$TMP/broken/bin/tessera" "${GEN[@]}" --backend auto >"$TMP/out" 2>"$TMP/err" ||
    fail "auto with a broken module: $(cat "$TMP/err")"

# 6. A module of another build (ABI version): refused with one line. Installed tree layout
#    (bin/tessera, lib/tessera/), which is where the loader looks second.
if command -v cc >/dev/null; then
    mkdir -p "$TMP/other/bin" "$TMP/other/lib/tessera"
    cp "$BIN" "$TMP/other/bin/tessera"
    printf '%s\n' 'static const unsigned t[16] = {999u};' \
        'const void *tsr_backend_module_entry(void);' \
        'const void *tsr_backend_module_entry(void) { return t; }' >"$TMP/other.c"
    if cc -shared -fPIC -o "$TMP/other/lib/tessera/libtessera-cuda.so" "$TMP/other.c" 2>"$TMP/cc"; then
        expect_line "module of another build" "module ABI 999" -- \
            "$TMP/other/bin/tessera" "${GEN[@]}" --backend cuda
    else
        echo "(no working cc: the ABI check is not tested: $(cat "$TMP/cc"))"
    fi
fi

# 7. An unknown backend lists the registry's names.
"$BIN" "${GEN[@]}" --backend tpu >"$TMP/out" 2>"$TMP/err"
grep -qF "auto, cpu" "$TMP/err" && grep -qF "cuda" "$TMP/err" ||
    fail "unknown backend: the names are not listed: $(cat "$TMP/err")"

[ "$fails" -eq 0 ] || exit 1
echo "backend module: ok"
