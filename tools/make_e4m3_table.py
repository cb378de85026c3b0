#!/usr/bin/env python3
"""Writes tests/data/kv/e4m3fn.txt: the value PyTorch's float8_e4m3fn gives each of the 256
codes, one line per code ("code hex-of-f32-bits"), for tests/unit/test_kv_dtype.c (the FP8
KV codec, kernels/kv_dtype.c, must decode every code the same). Needs torch; CI reads the
committed file only."""
import struct
import sys

import torch


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/kv/e4m3fn.txt"
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(torch.float8_e4m3fn).to(torch.float32).tolist()
    with open(out, "w", encoding="ascii", newline="\n") as f:
        for c, v in enumerate(vals):
            bits = struct.unpack("<I", struct.pack("<f", v))[0]
            f.write(f"{c} {bits:08x}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
