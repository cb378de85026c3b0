#!/usr/bin/env bash
# The KV pool of a device backend follows its memory (runtime/exec/kv_setup.h): on cpu-fenced,
# without --kv-memory, `generate --stats` reports a bytes_capacity that grows with the fenced
# arena (TSR_FENCED_MEMORY) and stays below it; the plain CPU's pool does not depend on the
# arena. Skipped (77) while this build has no cpu-fenced.
# args: $1 tessera binary, $2 repo root, $3 scratch dir
set -u
BIN=$1 ROOT=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP"
MODEL=$ROOT/models/stories260K.bin
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# bytes_capacity of one generate on backend $1 with an arena of $2 (TSR_FENCED_MEMORY).
capacity() {
    TSR_FENCED_MEMORY=$2 "$BIN" generate --model "$MODEL" --prompt "Once upon a time" \
        --max-tokens 4 --temperature 0 --backend "$1" --stats >"$TMP/out" 2>"$TMP/err" || return 1
    sed -n 's/.*"bytes_capacity":\([0-9]*\).*/\1/p' "$TMP/err" | head -1
}

if ! capacity cpu-fenced 256M >/dev/null; then
    if grep -qiE "not built|unsupported|not supported|this build" "$TMP/err"; then
        echo "skipped: $(cat "$TMP/err")"
        exit 77
    fi
    cat "$TMP/err"
    fail "generate on cpu-fenced with a 256M arena"
fi
c256=$(capacity cpu-fenced 256M) || fail "generate on cpu-fenced (256M)"
c512=$(capacity cpu-fenced 512M) || fail "generate on cpu-fenced (512M)"
echo "cpu-fenced KV pool: ${c256:-?} bytes of a 256M arena, ${c512:-?} of a 512M one"
M=$((1 << 20))
[ -n "${c256:-}" ] && [ "$c256" -gt $((128 * M)) ] && [ "$c256" -lt $((256 * M)) ] ||
    fail "256M arena: pool of ${c256:-?} bytes, expected between 128M and 256M"
[ -n "${c512:-}" ] && [ "$c512" -gt $((384 * M)) ] && [ "$c512" -lt $((512 * M)) ] ||
    fail "512M arena: pool of ${c512:-?} bytes, expected between 384M and 512M"
# An explicit --kv-memory still wins over the memory query.
TSR_FENCED_MEMORY=256M "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 2 \
    --backend cpu-fenced --kv-memory 16M --stats >"$TMP/out" 2>"$TMP/err" || fail "--kv-memory 16M"
k=$(sed -n 's/.*"bytes_capacity":\([0-9]*\).*/\1/p' "$TMP/err" | head -1)
[ -n "$k" ] && [ "$k" -le $((16 * M)) ] && [ "$k" -gt $((8 * M)) ] ||
    fail "--kv-memory 16M on cpu-fenced: pool of ${k:-?} bytes"
# The plain CPU sizes from host memory: the arena's size is not its business.
a=$(capacity cpu 256M) && b=$(capacity cpu 512M) || fail "generate on cpu"
echo "cpu KV pool: ${a:-?} and ${b:-?} bytes"
echo "$fails failed"
[ "$fails" -eq 0 ]
