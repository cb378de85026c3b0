#!/usr/bin/env python3
"""Writes the 4-bit quantizer goldens (tests/data/q4/) with the `gguf` PyPI package
(gguf.quants.quantize reproduces ggml's reference quantize_row_q4_0 / q4_1):

  edge_q4_0.bin   the GGUF Q4_0 bytes (24 rows x 3 blocks x 18 bytes) of
                  tests/data/q8/edge_f32.bin (a [24, 96] f32 matrix of edge cases)
  edge_q4_1.bin   its GGUF Q4_1 bytes (24 rows x 3 blocks x 20 bytes)

Usage: python3 tools/make_q4_testdata.py  (pip install gguf numpy)
"""
import os

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "q4")


def main():
    os.makedirs(OUT, exist_ok=True)
    raw = open(os.path.join(ROOT, "tests", "data", "q8", "edge_f32.bin"), "rb").read()
    w = np.frombuffer(raw, dtype="<f4").reshape(24, 96)
    for name, t in (("q4_0", GGMLQuantizationType.Q4_0), ("q4_1", GGMLQuantizationType.Q4_1)):
        q = quantize(np.ascontiguousarray(w, dtype=np.float32), t)
        with open(os.path.join(OUT, "edge_%s.bin" % name), "wb") as f:
            f.write(bytes(q))


if __name__ == "__main__":
    main()
