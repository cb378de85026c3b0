#!/usr/bin/env python3
"""Writes the Q3_K and IQ4_NL goldens (tests/data/q3k/) with the `gguf` PyPI package, whose
gguf.quants.dequantize (llama.cpp's dequantization) is the oracle. tessera loads Q3_K into
its Q6_K layout and IQ4_NL into its Q8_0 layout (the same values in more bits). The package
has no quantizer for either, so the blocks are encoded here (any valid encoding will do: the
oracle is the dequantization of the bytes; the script checks that it reproduces the encoded
floats):

  w_q3k.bin     GGUF Q3_K blocks of a [37, 512] matrix (37 rows x 2 blocks x 110 bytes):
                random floats encoded per 16-value sub-block (signed 6-bit scales, codes
                -4..3), rows with an offset, plus edge blocks (the first block of rows 0..3):
                d = 0; every scale -32 with every code -4; every scale 31 with every code 3;
                random bytes with d = 0.01
  w_q3k.f32     gguf.quants.dequantize of w_q3k.bin (little-endian f32, [37, 512])
  w_iq4nl.bin   GGUF IQ4_NL blocks of a [37, 160] matrix (5 blocks x 18 bytes a row): random
                floats by nearest table value, plus edge blocks (d = 0, a negative d, every
                code 0, every code 15, random bytes)
  w_iq4nl.f32   gguf.quants.dequantize of w_iq4nl.bin ([37, 160])
  tiny_q3k.gguf a 1-layer llama mixed as llama.cpp's Q3_K_M (dim 256, 4 heads of 64, 2 KV
                heads, hidden 512, the byte-level gpt2 tokenizer of
                tools/make_gguf_testdata.py): attn_q, attn_k, ffn_gate, ffn_up, attn_output
                and the embedding Q3_K; attn_v and ffn_down IQ4_NL (the type llama.cpp gives
                Q3_K matrices of widths not a multiple of 256); an untied output Q3_K

Usage: python3 tools/make_q3k_testdata.py  (pip install gguf numpy)
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# the GGUF model writing of tools/make_gguf_testdata.py (this script's folder is on sys.path)
from make_gguf_testdata import (add_gpt2_tokenizer, add_llama_tensors, llama_writer,
                                 write_and_close)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "q3k")
rng = np.random.default_rng(3303)
KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
              np.float32)


def q3k_block(d, sc, q):
    """One block_q3_K from d, 16 scales (-32..31) and 256 codes (-4..3) in column order."""
    sc = np.asarray(sc, np.int64) + 32
    q = np.asarray(q, np.int64)
    hbit = (q >= 0).astype(np.uint8)  # set: no offset
    low = (q + 4 * (1 - hbit)).astype(np.uint8)  # 0..3
    hmask = np.zeros(32, np.uint8)
    qs = np.zeros(64, np.uint8)
    for c in range(256):
        h, s, l = c // 128, c // 32 % 4, c % 32
        qs[32 * h + l] |= low[c] << (2 * s)
        hmask[l] |= hbit[c] << (4 * h + s)
    scales = np.zeros(12, np.uint8)
    for j in range(16):
        scales[j % 8] |= (sc[j] & 15) << (4 * (j // 8))
        scales[8 + j % 4] |= (sc[j] >> 4 & 3) << (2 * (j // 4))
    return hmask.tobytes() + qs.tobytes() + scales.tobytes() + np.float16(d).tobytes()


def q3k_encode(x):
    """A valid Q3_K encoding of 256 floats: a signed scale per 16 values, codes -4..3."""
    sub = x.reshape(16, 16).astype(np.float32)
    s = np.array([r[np.argmax(np.abs(r))] / -4.0 for r in sub], np.float32)
    d = np.float16(np.abs(s).max() / 31.0)
    sc = np.clip(np.rint(s / np.float32(d)) if d else np.zeros(16), -32, 31).astype(np.int64)
    q = np.zeros(256, np.int64)
    for j in range(16):
        step = np.float32(d) * np.float32(sc[j])
        if step != 0:
            q[16 * j:16 * j + 16] = np.clip(np.rint(sub[j] / step), -4, 3)
    return q3k_block(d, sc, q)


def q3k_matrix(rows, cols, sigma=1.0, edges=False):
    out = []
    for r in range(rows):
        for b in range(cols // 256):
            x = (rng.standard_normal(256) * sigma).astype(np.float32)
            if r % 3 == 1:
                x += np.float32(0.5 * sigma)
            out.append(q3k_encode(x))
    if edges:  # the first blocks of rows 0..3
        nb = cols // 256
        out[0] = q3k_block(0.0, rng.integers(-32, 32, 16), rng.integers(-4, 4, 256))
        out[nb] = q3k_block(0.02, np.full(16, -32), np.full(256, -4))
        out[2 * nb] = q3k_block(0.02, np.full(16, 31), np.full(256, 3))
        raw = rng.integers(0, 256, 110, dtype=np.uint8)
        raw[108:110] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        out[3 * nb] = raw.tobytes()
    return np.frombuffer(b"".join(out), np.uint8).reshape(rows, cols // 256 * 110)


def iq4nl_block(d, codes):
    codes = np.asarray(codes, np.uint8)
    qs = (codes[:16] & 15) | ((codes[16:] & 15) << 4)
    return np.float16(d).tobytes() + qs.astype(np.uint8).tobytes()


def iq4nl_matrix(rows, cols, sigma=1.0, edges=False):
    out = []
    for r in range(rows):
        for b in range(cols // 32):
            x = (rng.standard_normal(32) * sigma).astype(np.float32)
            if r % 3 == 1:
                x += np.float32(0.5 * sigma)
            d = np.float16(x[np.argmax(np.abs(x))] / -127.0)
            v = x / np.float32(d) if d else np.zeros(32, np.float32)
            codes = np.abs(v[:, None] - KV[None, :]).argmin(axis=1)
            out.append(iq4nl_block(d, codes))
    if edges:
        nb = cols // 32
        out[0] = iq4nl_block(0.0, rng.integers(0, 16, 32))
        out[nb] = iq4nl_block(-0.03, rng.integers(0, 16, 32))
        out[2 * nb] = iq4nl_block(0.01, np.zeros(32))
        out[3 * nb] = iq4nl_block(0.01, np.full(32, 15))
        raw = rng.integers(0, 256, 18, dtype=np.uint8)
        raw[0:2] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
        out[4 * nb] = raw.tobytes()
    return np.frombuffer(b"".join(out), np.uint8).reshape(rows, cols // 32 * 18)


def check_encodings():
    """dequantize(encode(x)) is x to within a step: the layouts above are the package's."""
    x = rng.standard_normal(256 * 8).astype(np.float32)
    blocks = b"".join(q3k_encode(x[256 * i:256 * i + 256]) for i in range(8))
    y = dequantize(np.frombuffer(blocks, np.uint8).reshape(8, 110), T.Q3_K).reshape(-1)
    err = np.abs(y - x).max() / np.abs(x).max()
    assert err < 0.2, err
    w = iq4nl_matrix(4, 256)
    y = dequantize(w, T.IQ4_NL)
    assert y.shape == (4, 256) and np.isfinite(y).all()


def goldens():
    for name, w, t, cols in (("q3k", q3k_matrix(37, 512, edges=True), T.Q3_K, 512),
                             ("iq4nl", iq4nl_matrix(37, 160, edges=True), T.IQ4_NL, 160)):
        with open(os.path.join(OUT, "w_%s.bin" % name), "wb") as f:
            f.write(w.tobytes())
        deq = dequantize(w, t).reshape(37, cols).astype("<f4")
        with open(os.path.join(OUT, "w_%s.f32" % name), "wb") as f:
            f.write(deq.tobytes())


def tiny_model(name, dim=256, hidden=512, heads=4, kv=2, hd=64):
    w = llama_writer(os.path.join(OUT, name), 1, dim, hidden, heads, kv, hd, 10000.0, 1e-5)
    toks = add_gpt2_tokenizer(w, [])

    def mat(tname, rows, cols, sigma, t):
        m = q3k_matrix(rows, cols, sigma) if t == T.Q3_K else iq4nl_matrix(rows, cols, sigma)
        w.add_tensor(tname, m, raw_dtype=t)

    add_llama_tensors(w, mat, len(toks), 1, dim, hidden, heads, kv, hd,
                      lambda role: T.IQ4_NL if role in ("attn_v", "ffn_down") else T.Q3_K)
    write_and_close(w)


def main():
    os.makedirs(OUT, exist_ok=True)
    check_encodings()
    goldens()
    tiny_model("tiny_q3k.gguf")
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
