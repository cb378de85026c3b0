#!/usr/bin/env python3
"""Tokenizer equality corpus and Hugging Face `tokenizers` reference ids.

Writes tests/data/tokenizers/hf/:
  corpus.json            {"texts": [...]}: >= 200 KB of varied UTF-8 text, in chunks
  <family>.json          a small tokenizer.json with that family's real normalizer,
                         pre-tokenizer, decoder and special tokens, its BPE trained on the corpus
  <family>.ids.json      {"ids": [one string per text], "decoded": {"index": text}} from HF
                         tokenizers (encode without special-token templates; decode keeps
                         special tokens; "decoded" lists only texts whose decode differs).
                         Each id is two base64 digits (id = 64 * first + second; the
                         vocabularies have fewer than 4096 ids), which keeps the files small.
tests/unit/test_tokenizer_hf.c compares tessera with these, token for token.

Every source is offline and deterministic: this repository's docs and code, text from
Python's standard library (the Zen of Python, module docstrings), and text generated from
unicodedata ranges with a fixed seed. Nothing is fetched; the test reads only the stored files.

Usage: python3 tools/tokenizer_corpus.py   (pip install tokenizers)
       python3 tools/tokenizer_corpus.py --only o200k   (one family, from the stored corpus)
"""
import inspect
import json
import os
import random
import sys
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizers", "hf")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k_base / o200k_harmony (GPT-4o, GPT-OSS; openai/tiktoken tiktoken_ext/openai_public.py)
O200K_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
            r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = {
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "smollm2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "gpt2_prefix": ["<|endoftext|>"],
    "llama2": ["<unk>", "<s>", "</s>"],
    "metaspace": ["<unk>", "<s>", "</s>"],
    # the harmony format's special tokens (GPT-OSS)
    "o200k": ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
              "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"],
}


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def chunks(text, size, rng):
    """Splits text into pieces of about `size` characters at line ends (some mid-line)."""
    out, i = [], 0
    while i < len(text):
        j = min(len(text), i + size)
        nl = text.rfind("\n", i, j)
        if j < len(text) and nl > i + size // 2 and rng.random() < 0.8:
            j = nl + 1
        out.append(text[i:j])
        i = j
    return out


def rand_chars(rng, ranges, n):
    s = []
    while len(s) < n:
        lo, hi = rng.choice(ranges)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cs", "Cn"):
            s.append(c)
    return "".join(s)


def corpus():
    rng = random.Random(25)
    texts = []
    # English prose: the repository's docs.
    for rel in ("README.md", "docs/architecture.md", "docs/correctness.md", "docs/kv-cache.md",
                "docs/chat-templates.md"):
        if os.path.exists(os.path.join(ROOT, rel)):
            texts += chunks(read(rel)[:16000], 3000, rng)
    # Code: C, Python, shell, CMake.
    for rel in ("runtime/text/tokenizer_bpe.c", "runtime/format/gguf.c", "tools/gguf_tokenizer_reference.py",
                "CMakeLists.txt", "base/status.h"):
        if os.path.exists(os.path.join(ROOT, rel)):
            texts += chunks(read(rel)[:9000], 3000, rng)
    # Python's standard library: the Zen of Python and module docstrings.
    import this  # noqa: F401  (prints the Zen once; its text is rot13 in this.s)
    texts.append("".join(this.d.get(c, c) for c in this.s))
    import collections, json as js, re, string, textwrap, unittest, argparse, heapq, difflib
    for mod in (collections, js, re, string, textwrap, unittest, argparse, heapq, difflib):
        doc = inspect.getdoc(mod) or ""
        texts += chunks(doc, 2500, rng)
    # Numbers: integers, decimals, dates, money, phone-like groups, long digit runs.
    nums = []
    for _ in range(600):
        k = rng.randrange(8)
        if k == 0:
            nums.append(str(rng.randrange(10 ** rng.randint(1, 12))))
        elif k == 1:
            nums.append(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 6)}f}")
        elif k == 2:
            nums.append(f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        elif k == 3:
            nums.append(f"${rng.randint(0, 99999):,}.{rng.randint(0, 99):02d}")
        elif k == 4:
            nums.append(f"{rng.random():.3e}")
        elif k == 5:
            nums.append("".join(rng.choice("0123456789") for _ in range(rng.randint(10, 40))))
        elif k == 6:
            nums.append(f"v{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 200)}")
        else:
            nums.append(f"{rng.randint(1, 999)}x{rng.randint(1, 999)}=" + "٣٤٥" * rng.randint(0, 1)
                        + "Ⅻ½²" * rng.randint(0, 1))
    texts += chunks(" ".join(nums), 1500, rng)
    # Whitespace runs: spaces, tabs, newlines, CR, NBSP, ideographic space, mixed with words.
    ws = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n\n", "\u00a0", "\u3000", "\u2009", "\v", "\f",
          " \n ", "\t\t", "        ", "\u2028", "\u0085"]
    words = ["alpha", "beta", "x", "Ünïcödé", "it's", "WE'LL", "don't", "42", "a1b2", "(){}", "--"]
    for _ in range(6):
        texts.append("".join(rng.choice(ws) * rng.randint(1, 5) + rng.choice(words)
                             for _ in range(300)))
    texts.append(" " * 700 + "end" + "\n" * 300 + "\t" * 100)
    # CJK, Hangul, kana, and other scripts from unicodedata ranges.
    scripts = [
        [(0x4E00, 0x9FFF)], [(0x3040, 0x309F), (0x30A0, 0x30FF)], [(0xAC00, 0xD7A3)],
        [(0x0400, 0x04FF)], [(0x0370, 0x03FF)], [(0x0590, 0x05FF)], [(0x0600, 0x06FF)],
        [(0x0900, 0x097F)], [(0x0E00, 0x0E7F)], [(0x20000, 0x2A6DF)], [(0x3400, 0x4DBF)],
    ]
    for ranges in scripts:
        for _ in range(3):
            parts = [rand_chars(rng, ranges, rng.randint(1, 12)) for _ in range(120)]
            sep = [" ", "", "、", "。", ", ", "\n", "1", "x"]
            texts.append("".join(p + rng.choice(sep) for p in parts))
    # Emoji: single, skin tones, ZWJ families, flags, keycaps, variation selectors.
    emo = [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF),
           (0x2600, 0x26FF)]
    for _ in range(6):
        parts = []
        for _ in range(200):
            k = rng.randrange(6)
            if k == 0:
                parts.append(rand_chars(rng, emo, 1) + chr(rng.randint(0x1F3FB, 0x1F3FF)))
            elif k == 1:
                parts.append("\u200d".join(rand_chars(rng, emo, 1) for _ in range(3)))
            elif k == 2:
                parts.append(chr(0x1F1E6 + rng.randrange(26)) + chr(0x1F1E6 + rng.randrange(26)))
            elif k == 3:
                parts.append(rng.choice("0123456789#*") + "\ufe0f\u20e3")
            elif k == 4:
                parts.append(rand_chars(rng, emo, rng.randint(1, 4)) + "\ufe0f")
            else:
                parts.append(rng.choice(words))
        texts.append(" ".join(parts))
    # Rare but valid UTF-8: combining marks (composed and decomposed forms), noncharacters,
    # private use, the last planes, math alphanumerics, controls, BOM, ZW(N)J, RTL marks.
    rare = [(0x0300, 0x036F), (0x1AB0, 0x1AFF), (0xFDD0, 0xFDEF), (0xE000, 0xF8FF),
            (0xF0000, 0xF00FF), (0x10FF00, 0x10FFFF), (0x1D400, 0x1D7FF), (0x0001, 0x0008),
            (0x007F, 0x009F), (0xFFF9, 0xFFFD), (0x200B, 0x200F), (0x202A, 0x202E),
            (0xFB00, 0xFB4F), (0x1100, 0x11FF), (0x2100, 0x214F), (0x0958, 0x095F)]
    for _ in range(8):
        parts = []
        for _ in range(250):
            w = rng.choice(words)
            k = rng.randrange(4)
            if k == 0:
                parts.append(unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC"]), w + "é"))
            elif k == 1:
                parts.append(w + rand_chars(rng, rare, rng.randint(1, 5)))
            elif k == 2:
                parts.append(rand_chars(rng, rare, rng.randint(1, 6)))
            else:
                parts.append("\ufeff" + w + "\uffff\ufffe")
        texts.append(" ".join(parts))
    texts.append("".join(unicodedata.normalize("NFD", chr(c)) for c in range(0xC0, 0x250)))
    texts.append("".join(chr(c) for c in range(0xAC00, 0xAC00 + 400, 7)) +
                 unicodedata.normalize("NFD", "".join(chr(c) for c in range(0xAC00, 0xAD00, 5))))
    # NFC at work: bases followed by marks of several combining classes, in every order,
    # composed and decomposed letters, Hangul jamo runs.
    marks = [0x0300, 0x0301, 0x0302, 0x0303, 0x0308, 0x030A, 0x0316, 0x0323, 0x0327, 0x0328,
             0x031B, 0x0334, 0x0345, 0x05B0, 0x0651, 0x093C, 0x3099, 0x1AB0, 0x1DC0, 0x20D0]
    bases = "aeiouAEIOUnNcCsSzZyYwWαεηιοωΑΕΗυρκгиеЗ" + "\u0915\u0B47\u0BC6\u304B\u30CF"
    for _ in range(3):
        parts = []
        for _ in range(400):
            p = rng.choice(bases) + "".join(chr(rng.choice(marks)) for _ in range(rng.randint(0, 3)))
            if rng.random() < 0.3:
                p = unicodedata.normalize(rng.choice(["NFC", "NFD"]), p)
            if rng.random() < 0.1:
                p = "".join(chr(c) for c in (rng.randint(0x1100, 0x1112), rng.randint(0x1161, 0x1175),
                                             rng.randint(0x11A7, 0x11C2)))
            parts.append(p)
        texts.append(rng.choice(["", " "]).join(parts))
    # Special-token strings inside text, whole and broken, next to spaces and words.
    allsp = sorted({s for v in SPECIALS.values() for s in v})
    for _ in range(4):
        parts = []
        for _ in range(250):
            k = rng.randrange(5)
            sp = rng.choice(allsp)
            if k == 0:
                parts.append(sp)
            elif k == 1:
                parts.append(rng.choice(words) + sp + rng.choice(words))
            elif k == 2:
                parts.append(sp[:rng.randint(1, len(sp) - 1)])
            elif k == 3:
                parts.append(" " + sp + " \n")
            else:
                parts.append(rng.choice(words))
        texts.append(rng.choice(["", " ", "\n"]).join(parts))
    texts = [t for t in texts if t and "\0" not in t]
    return texts


B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def build(family, texts):
    tk = Tokenizer(models.BPE())
    specials = SPECIALS[family]
    if family == "metaspace":
        # SentencePiece converted with a Metaspace pre-tokenizer (transformers' non-legacy
        # conversion of Llama / Mistral tokenizers): spaces become U+2581, one prepended to
        # the start of the text only, pieces cut before each U+2581.
        tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                    split=True)
        tk.decoder = decoders.Sequence([
            decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=True),
            decoders.ByteFallback(), decoders.Fuse()])
        trainer = trainers.BpeTrainer(vocab_size=2500, min_frequency=2,
                                      special_tokens=specials + BYTES, limit_alphabet=400,
                                      show_progress=False)
        tk.train_from_iterator(texts, trainer=trainer)
        doc = json.loads(tk.to_str())
        doc["added_tokens"] = [a for a in doc["added_tokens"] if a["content"] not in BYTES]
        return Tokenizer.from_str(json.dumps(doc))
    if family == "llama2":
        # Llama 2 / Mistral's SentencePiece converted to BPE: no pre-tokenizer, spaces become
        # U+2581 with one prepended to each span, characters missing from the vocabulary fall
        # back to <0xXX> byte tokens.
        tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                              normalizers.Replace(" ", "\u2581")])
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=2500, min_frequency=2,
                                      special_tokens=specials + BYTES, limit_alphabet=150,
                                      show_progress=False)
        tk.train_from_iterator(texts, trainer=trainer)
        # The byte tokens are plain vocabulary entries in Llama 2, not added tokens.
        doc = json.loads(tk.to_str())
        doc["added_tokens"] = [a for a in doc["added_tokens"] if a["content"] not in BYTES]
        return Tokenizer.from_str(json.dumps(doc))
    if family in ("llama3", "o200k"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE if family == "llama3" else O200K_RE),
                                 behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    elif family == "qwen2":
        tk.normalizer = normalizers.NFC()
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    elif family == "smollm2":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    elif family == "gpt2_prefix":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2500, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(texts, trainer=trainer)
    return tk


def main():
    os.makedirs(OUT, exist_ok=True)
    # --only FAMILY...: those families' files from the stored corpus (which stays as it is)
    only = sys.argv[sys.argv.index("--only") + 1:] if "--only" in sys.argv else None
    if only:
        with open(os.path.join(OUT, "corpus.json"), encoding="utf-8") as f:
            texts = json.load(f)["texts"]
    else:
        texts = corpus()
    total = sum(len(t.encode("utf-8")) for t in texts)
    if total < 200_000:
        sys.exit(f"corpus is only {total} bytes")
    if not only:
        with open(os.path.join(OUT, "corpus.json"), "w", encoding="utf-8") as f:
            json.dump({"texts": texts}, f, ensure_ascii=False, indent=0)
    for family in only or SPECIALS:
        tk = build(family, texts)
        tk.save(os.path.join(OUT, f"{family}.json"), pretty=False)
        tk = Tokenizer.from_file(os.path.join(OUT, f"{family}.json"))
        ids, decoded, n = [], {}, 0
        for i, t in enumerate(texts):
            e = tk.encode(t, add_special_tokens=False).ids
            ids.append(e)
            n += len(e)
            d = tk.decode(e, skip_special_tokens=False)
            if d != t:
                decoded[str(i)] = d
        assert tk.get_vocab_size() <= 4096
        with open(os.path.join(OUT, f"{family}.ids.json"), "w", encoding="utf-8") as f:
            f.write('{"decoded": ' + json.dumps(decoded, ensure_ascii=False) + ',\n"ids": [\n')
            f.write(",\n".join('"' + "".join(B64[i >> 6] + B64[i & 63] for i in e) + '"'
                               for e in ids))
            f.write("]}\n")
        print(f"{family}: {len(texts)} texts, {total} bytes, {n} tokens, "
              f"{len(decoded)} decode differently")


if __name__ == "__main__":
    main()
