#!/usr/bin/env bash
# on_backend.sh BACKEND TESSERA CMD...: runs a CLI or MPI test script (CMD...) with every
# `tessera generate|run|bench` it starts on BACKEND. The script gets
# tests/cli/tessera_on_backend.sh as its tessera binary (ctest passes it in place of the
# real one), which adds `--backend BACKEND` after the subcommand; an explicit --backend
# later on the line still wins (the last value counts). Exits 77 (skipped) when this build
# says the backend is unsupported, e.g. cpu-fenced before it is built.
set -u
backend=$1 real=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
err=$(mktemp)
trap 'rm -f "$err"' EXIT
if ! "$real" generate --model "$root/models/stories260K.bin" --prompt hi --max-tokens 1 \
    --backend "$backend" >/dev/null 2>"$err"; then
    if grep -qiE "not built|unsupported|not supported|this build" "$err"; then
        echo "skipped: backend $backend: $(cat "$err")"
        exit 77
    fi
    echo "backend $backend fails a one-token generate:"; cat "$err"
    exit 1
fi
export TSR_TEST_BACKEND=$backend TSR_TEST_BIN=$real
"$@"
