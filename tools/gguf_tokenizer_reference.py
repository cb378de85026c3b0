#!/usr/bin/env python3
"""Reference token ids for the GGUF tokenizer of SmolLM2-135M-Instruct, from Hugging Face
`tokenizers` (no torch needed). Writes tests/data/gguf/smollm2_tokens.json, which
tests/unit/test_gguf_smollm2.c compares tessera with, token for token.

The reference tokenizer is built from the GGUF's own metadata (tokens, merges, token types)
with the pre-tokenizer SmolLM2's tokenizer.json declares and llama.cpp's `smollm` stands for:
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)];
control tokens (type 3) are special added tokens, user-defined ones (4) plain added tokens.
transformers' own GGUF tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) is run
too and its disagreements are counted: transformers 5.x maps unknown `tokenizer.ggml.pre` names
to plain GPT-2 splitting, so it drops smollm's Digits step (it splits "2024" as one piece).

The corpus: the tricky strings of tests/data/tokenizers/bpe_cases.json, English prose (this
repository's README.md and docs/architecture.md), code (runtime/format/gguf.c, tools/*.py), numbers,
whitespace runs, CJK, emoji, and special-token strings inside text.

Usage: python3 tools/gguf_tokenizer_reference.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
(pip install gguf tokenizers; transformers optional)
"""
import argparse
import base64
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, decoders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def field(r, name):
    return r.fields[name].contents()


def build(path):
    r = gguf.GGUFReader(path)
    pre = field(r, "tokenizer.ggml.pre")
    if pre not in ("smollm", "starcoder"):
        sys.exit(f"this script knows the smollm pre-tokenizer, not {pre}")
    toks = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(toks)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(toks, types) if ty == 3])
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(toks, types) if ty == 4]
    if user:
        tk.add_tokens(user)
    return tk, len(toks)


def corpus():
    texts = []
    with open(os.path.join(ROOT, "tests", "data", "tokenizers", "bpe_cases.json")) as f:
        for c in json.load(f)["cases"]:
            texts.append((c["name"], base64.b64decode(c["text_b64"])))
    for rel in ["README.md", "docs/architecture.md", "runtime/format/gguf.c", "tools/hf_reference.py"]:
        with open(os.path.join(ROOT, rel), "rb") as f:
            data = f.read()
        texts.append((rel, data[:24000]))
    extra = {
        "numbers": "In 2024, 3.14159 and 1,000,000 people paid $12.50 (or 0x1F, 1e-9, ２０２４).",
        "whitespace": "a  b   c\t\td\n\n\ne \r\n f    \n   g" + " " * 40 + "h",
        "cjk": "日本語のテキストと中文文本，한국어 텍스트도 있습니다。",
        "emoji": "Emoji: 👍🏽 👨‍👩‍👧 🇫🇷 ❤️ and text 🙂🙂",
        "chatml": "<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
        "specials_inside": "x<|endoftext|>y <|im_end|>z<repo_name>w",
        "accents": "Café naïve façade — “quotes” ‘single’ … résumé Ünïcödé",
        "contractions": "I'm you're he'll she'd we've they're It's DON'T",
    }
    for k, v in extra.items():
        texts.append((k, v.encode()))
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "gguf", "smollm2_tokens.json"))
    args = ap.parse_args()
    tk, n_vocab = build(args.model)
    hf = None
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.model)),
                                           gguf_file=os.path.basename(args.model))
    except Exception as e:  # optional
        print(f"transformers GGUF tokenizer not available: {e}", file=sys.stderr)
    cases, total, differ = [], 0, 0
    for name, data in corpus():
        text = data.decode("utf-8", errors="surrogateescape")
        if any("\udc80" <= ch <= "\udcff" for ch in text):
            continue  # tokenizers takes str: invalid UTF-8 cannot be given to it
        ids = tk.encode(text, add_special_tokens=False).ids
        if tk.decode(ids, skip_special_tokens=False) != text:
            print(f"note: {name} does not round-trip through the reference", file=sys.stderr)
        total += len(data)
        case = {"name": name, "text_b64": base64.b64encode(data).decode(), "ids": ids}
        if hf is not None:
            hids = hf.encode(text, add_special_tokens=False)
            if hids != ids:
                differ += 1
        cases.append(case)
    doc = {"source": f"HF tokenizers from {os.path.basename(args.model)}'s metadata with "
                     "SmolLM2's pre_tokenizer (tools/gguf_tokenizer_reference.py)",
           "vocab_size": n_vocab, "bos_id": -1, "eos_id": 2,
           "transformers_gguf_cases_differing": differ if hf is not None else None,
           "cases": cases}
    with open(args.out, "w") as f:
        f.write("{\n")
        for k in list(doc)[:-1]:
            f.write(f" {json.dumps(k)}: {json.dumps(doc[k])},\n")
        f.write(' "cases": [\n' + ",\n".join("  " + json.dumps(c) for c in cases) + "\n ]\n}\n")
    print(f"{len(cases)} cases, {total} bytes of text; transformers' GGUF tokenizer differs on "
          f"{differ} of them", file=sys.stderr)


if __name__ == "__main__":
    main()
