#!/usr/bin/env python3
"""Writes the Q6_K goldens (tests/data/q6k/) with the `gguf` PyPI package, whose
gguf.quants.dequantize (llama.cpp's Q6_K dequantization) is the oracle. The package has no
Q6_K quantizer, so the blocks are encoded here (any valid encoding will do: the oracle is
the dequantization of the bytes; the script checks that it reproduces the encoded floats):

  w_q6k.bin    GGUF Q6_K blocks of a [37, 768] matrix (37 rows x 3 blocks x 210 bytes):
               random floats encoded per 16-value sub-block (6-bit codes, int8 scales, some
               negative), plus edge blocks (the first block of rows 0..4): d = 0; every
               scale -128 with every code 0 (q = -32); every scale 127 with every code 63
               (q = 31); scales of both signs with random codes; random bytes (d = 0.004)
  w_deq.f32    gguf.quants.dequantize of w_q6k.bin (little-endian f32, [37, 768])
  tiny_q6k.gguf  a 2-layer llama (dim 512, 2 heads of 256, 1 KV head, hidden 512, the
               byte-level gpt2 tokenizer of tools/make_gguf_testdata.py) mixed as llama.cpp's
               Q4_K_M: attn_v, ffn_down and an untied output.weight Q6_K, the other
               matrices and the embedding Q4_K
  tiny_q6k_hd64.gguf  1 layer, dim 256, 4 heads of 64, 2 KV heads, hidden 512, every matrix
               and the (tied) embedding Q6_K: wo's head parts (64 columns) and w_down's
               hidden chunks (128) cut 256-value blocks, which Q6_K's 32-column repacking
               takes

Usage: python3 tools/make_q6k_testdata.py  (pip install gguf numpy)
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# the GGUF model writing of tools/make_gguf_testdata.py, Q4_K blocks of make_q4k_testdata.py
# (this script's folder is on sys.path)
from make_gguf_testdata import (add_gpt2_tokenizer, add_llama_tensors, llama_writer,
                                 write_and_close)
from make_q4k_testdata import matrix as q4k_matrix

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "q6k")
rng = np.random.default_rng(6262)


def block(d, sc, code):
    """One block_q6_K from its parts (code: 256 values 0..63 = q + 32, column order)."""
    ql = np.zeros(128, np.uint8)
    qh = np.zeros(64, np.uint8)
    code = np.asarray(code, np.uint8)
    for n in range(2):
        c = code[128 * n:128 * n + 128]
        for l in range(32):
            ql[64 * n + l] = (c[l] & 15) | ((c[l + 64] & 15) << 4)
            ql[64 * n + 32 + l] = (c[l + 32] & 15) | ((c[l + 96] & 15) << 4)
            qh[32 * n + l] = ((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4)
                              | ((c[l + 96] >> 4) << 6))
    return (ql.tobytes() + qh.tobytes() + np.asarray(sc, np.int8).tobytes()
            + np.float16(d).tobytes())


def encode(x, flip=False):
    """A valid Q6_K encoding of 256 floats: per sub-block of 16, q in [-32, 31] over its
    largest magnitude; flip: every other scale negative (with its codes negated)."""
    sub = x.reshape(16, 16).astype(np.float32)
    scale = np.abs(sub).max(axis=1) / np.float32(31.0)
    d16 = np.float16(scale.max() / 127.0)
    d = np.float32(d16)
    sc = np.clip(np.rint(scale / d), 1, 127) if d else np.zeros(16)
    if flip:
        sc[1::2] = -sc[1::2]
    sc = sc.astype(np.int8)
    q = np.zeros((16, 16), np.int32)
    for j in range(16):
        step = d * np.float32(sc[j])
        if step != 0:
            q[j] = np.clip(np.rint(sub[j] / step), -32, 31)
    return block(d16, sc, (q + 32).reshape(256))


def matrix(rows, cols, sigma=1.0, edges=False):
    out = []
    for r in range(rows):
        for b in range(cols // 256):
            x = (rng.standard_normal(256) * sigma).astype(np.float32)
            out.append(encode(x, flip=(r + b) % 2 == 1))
    if edges:  # the first blocks of rows 0..4
        codes = rng.integers(0, 64, 256)
        out[0] = block(0.0, rng.integers(-128, 128, 16), codes)
        out[3] = block(0.01, np.full(16, -128), np.zeros(256, np.uint8))
        out[6] = block(0.01, np.full(16, 127), np.full(256, 63, np.uint8))
        out[9] = block(0.003, rng.integers(-128, 128, 16), codes)
        raw = rng.integers(0, 256, 210, dtype=np.uint8)
        raw[208:210] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
        out[12] = raw.tobytes()  # every bit of the packing
    return np.frombuffer(b"".join(out), np.uint8).reshape(rows, cols // 256 * 210)


def check_encoding():
    """dequantize(encode(x)) is x to within half a step: the layout above is the package's."""
    x = (rng.standard_normal(256 * 8)).astype(np.float32)
    for flip in (False, True):
        blocks = b"".join(encode(x[256 * i:256 * i + 256], flip) for i in range(8))
        y = dequantize(np.frombuffer(blocks, np.uint8).reshape(8, 210), T.Q6_K).reshape(-1)
        err = np.abs(y - x).max() / np.abs(x).max()
        assert err < 0.03, err


def goldens():
    w = matrix(37, 768, edges=True)
    with open(os.path.join(OUT, "w_q6k.bin"), "wb") as f:
        f.write(w.tobytes())
    deq = dequantize(w, T.Q6_K).reshape(37, 768).astype("<f4")
    with open(os.path.join(OUT, "w_deq.f32"), "wb") as f:
        f.write(deq.tobytes())


def tiny_model(name, dim, hidden, heads, kv, hd, layers, all_q6k):
    w = llama_writer(os.path.join(OUT, name), layers, dim, hidden, heads, kv, hd, 10000.0, 1e-5)
    toks = add_gpt2_tokenizer(w, [])

    def mat(tname, rows, cols, sigma, q6):
        if q6:
            w.add_tensor(tname, matrix(rows, cols, sigma), raw_dtype=T.Q6_K)
        else:
            w.add_tensor(tname, q4k_matrix(rows, cols, sigma), raw_dtype=T.Q4_K)

    def kind(role):  # Q4_K_M's choice: output, attn_v and ffn_down Q6_K
        if role == "output":
            return None if all_q6k else True
        return all_q6k or role in ("attn_v", "ffn_down")

    add_llama_tensors(w, mat, len(toks), layers, dim, hidden, heads, kv, hd, kind)
    write_and_close(w)


def main():
    os.makedirs(OUT, exist_ok=True)
    check_encoding()
    goldens()
    tiny_model("tiny_q6k.gguf", 512, 512, 2, 1, 256, 2, all_q6k=False)
    tiny_model("tiny_q6k_hd64.gguf", 256, 512, 4, 2, 64, 1, all_q6k=True)
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
