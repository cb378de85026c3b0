#!/usr/bin/env python3
"""Writes tests/data/gguf/tok512_spm.gguf: a GGUF holding only the `llama` (SentencePiece)
tokenizer metadata of models/tok512.bin (the 512-piece SentencePiece vocabulary of llama2.c's
stories260K, in llama2.c's export; small, so the stored file is too), as llama.cpp's converter writes it: pieces with U+2581 for spaces,
scores, token types (2 unknown, 3 control, 6 byte, 1 normal), unknown/BOS/EOS ids 0/1/2,
add_bos_token. tests/unit/test_tokenizer_gguf_spm.c checks that tessera reads it into the
same tokenizer as the .bin (whose ids test_tokenizer_spm checks against sentencepiece).

Usage: python3 tools/spm_gguf.py   (pip install gguf)
"""
import os
import struct

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    with open(os.path.join(ROOT, "models", "tok512.bin"), "rb") as f:
        data = f.read()
    off, toks, scores, types = 4, [], [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        piece = data[off + 8:off + 8 + n]
        off += 8 + n
        i = len(toks)
        text = piece.decode("utf-8").replace(" ", "\u2581")
        if i == 0:
            text, ty = "<unk>", 2
        elif i in (1, 2):
            text, ty = ("<s>", "</s>")[i - 1], 3
        elif len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            ty = 6
        else:
            ty = 1
        toks.append(text)
        scores.append(score)
        types.append(ty)
    out = os.path.join(ROOT, "tests", "data", "gguf", "tok512_spm.gguf")
    w = gguf.GGUFWriter(out, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, len(toks), "tokens")


if __name__ == "__main__":
    main()
