#!/usr/bin/env python3
"""Writes the golden tokenizer data that tests/unit/test_tokenizer_{spm,bpe}.c compare against.

Outputs (committed data; rerun only to regenerate):
  tests/data/tokenizers/spm_cases.json
      Llama-2 tokenizer.bin cases, ids from the `sentencepiece` package with
      tokenizer.model (the model tokenizer.bin was exported from). Also tok512.bin cases:
      tok512 has no SentencePiece model anywhere (models/SOURCES.md), so its ids
      come from the pure-Python SentencePiece-BPE encoder below, which is first checked to
      agree with `sentencepiece` on every Llama-2 case.
  tests/data/tokenizers/bpe_llama3/tokenizer.json
      a small byte-level BPE trained here with HF `tokenizers`, Llama-3 pre-tokenizer and
      special tokens (no real Llama-3 tokenizer.json is available offline).
  tests/data/tokenizers/bpe_llama3_legacy/tokenizer.json
      the same model with merges in the older "a b" string form.
  tests/data/tokenizers/bpe_cases.json
      ids from HF `tokenizers` for tricky strings.

Strings are base64 so that any bytes survive JSON.

Usage: python3 tools/ref_tokenizers.py --data DIR
  DIR holds tokenizer.model (the Llama 2 SentencePiece model), tokenizer.bin and tok512.bin
  (the last two are also in models/).
"""
import argparse
import base64
import json
import os
import random
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizers")

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
]


def dump(doc, path):
    """One JSON object per line inside lists: small, diffable golden files."""
    parts = ["{"]
    items = list(doc.items())
    for k, (key, val) in enumerate(items):
        sep = "," if k + 1 < len(items) else ""
        if isinstance(val, list) and val and isinstance(val[0], (dict, str)):
            parts.append(" %s: [" % json.dumps(key))
            parts.append(",\n".join("  " + json.dumps(v, ensure_ascii=True) for v in val))
            parts.append(" ]" + sep)
        else:
            parts.append(" %s: %s%s" % (json.dumps(key), json.dumps(val), sep))
    parts.append("}")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def b64(s):
    if isinstance(s, str):
        s = s.encode("utf-8")
    return base64.b64encode(s).decode("ascii")


# Tricky strings shared by both tokenizers.
COMMON_CASES = [
    ("empty", ""),
    ("space", " "),
    ("two_spaces", "  "),
    ("hello", "Hello world"),
    ("leading_space", " leading space"),
    ("leading_spaces", "   three leading"),
    ("trailing_space", "trailing space "),
    ("trailing_spaces", "trailing spaces   "),
    ("multi_spaces", "multiple    spaces  between   words"),
    ("newline", "\n"),
    ("newlines", "line one\nline two\n\nline four\r\nwindows\n"),
    ("tabs", "\ttab\tseparated\t\tvalues\t"),
    ("digits", "0 1 12 123 1234 12345 123456 1234567 3.14159 2024-01-31"),
    ("punct", "Hello, world! (yes?) [no] {maybe}; 'single' \"double\" -- ... \u2026 #@$%^&*"),
    ("contractions", "I'm sure you'll see it's what we've done, they'd say. DON'T I'LL WE'RE"),
    ("cjk", "\u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"),
    ("korean", "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4"),
    ("emoji", "I \u2764\ufe0f pizza \U0001F355\U0001F600\U0001F44D\U0001F3FD family "
              "\U0001F468\u200d\U0001F469\u200d\U0001F467"),
    ("combining", "e\u0301 cafe\u0301 na\u0303o \u00f1 \u0041\u030a\u0323"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3),
    ("once", "Once upon a time"),
    ("meaning", "I believe the meaning of life is"),
    ("rare_cjk", "\U0002070E\U00020731 rare"),
    ("cyrillic_greek_arabic", "\u041f\u0440\u0438\u0432\u0435\u0442 \u03b3\u03b5\u03b9\u03ac "
                              "\u0645\u0631\u062d\u0628\u0627"),
    ("control_chars", "a\x01b\x7fc\x1b[0m"),
    ("fullwidth", "\uff26\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48 \uff11\uff12\uff13"),
    ("code", "def f(x):\n    return x**2  # square\n\nint main(void) { return 0; }\n"),
    ("unicode_spaces", "a\u00a0b\u3000c\u2009d"),
    ("lone_punct", "!!! ??? ... ,,,"),
    ("mixed_newline_space", " \n \n\n  \t\n x"),
]

SPM_ONLY_CASES = [
    ("literal_pieces", "<s> </s> <unk> <0x41>"),
    ("sp_meta", "a\u2581b \u2581\u2581c"),
]

BPE_ONLY_CASES = [
    ("special_bos", "<|begin_of_text|>Hello"),
    ("special_chat", "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("special_inline", "text <|eot_id|> more<|end_of_text|>"),
    ("special_partial", "<|begin_of_tex <|eot_id <|eot_id|"),
    ("numbers_run", "1234567890123 and 42nd 3rd 1,000,000"),
    ("apostrophes", "'s 't 're 've 'm 'll 'd 'S 'T 'RE x's"),
    ("spaces_before_newline", "a   \n   b"),
    ("nel", "x\u0085y"),
]


# ---------------------------------------------------------------------------------------
# SentencePiece BPE over a llama2.c tokenizer.bin, in Python (the reference for tok512).

def read_tokenizer_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    off, pieces, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return pieces, scores


def spm_encode(pieces, scores, text):
    """SentencePiece BPE (bpe_model.cc): symbols are codepoints of the normalized text
    (dummy prefix, spaces as U+2581, here as ' ' like the .bin export); repeatedly merge the
    adjacent pair whose concatenation is a normal piece with the highest score, leftmost on
    ties; symbols that are not pieces become <0xXX> byte tokens."""
    lookup = {}
    for i, p in enumerate(pieces):
        if i < 3 or (len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">")):
            continue  # control and byte pieces are never matched from text
        lookup.setdefault(p, i)
    if not text:
        return []
    norm = " " + text.replace("\u2581", " ")
    syms = [c.encode("utf-8") for c in norm]
    while True:
        best, best_i = None, -1
        for i in range(len(syms) - 1):
            tid = lookup.get(syms[i] + syms[i + 1])
            if tid is not None and (best is None or scores[tid] > best):
                best, best_i = scores[tid], i
        if best_i < 0:
            break
        syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
    ids = []
    for s in syms:
        if s in lookup:
            ids.append(lookup[s])
        else:
            ids.extend(3 + b for b in s)
    return ids


def make_spm(data_dir):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "tokenizer.model"))
    pieces, scores = read_tokenizer_bin(os.path.join(data_dir, "tokenizer.bin"))
    assert len(pieces) == sp.get_piece_size() == 32000
    long_text = " ".join(
        "The quick brown fox number %d jumps over the lazy dog, again and again." % i
        for i in range(200))
    cases = COMMON_CASES + SPM_ONLY_CASES + [("long_text", long_text)]
    out_cases = []
    for name, text in cases:
        ids = sp.encode(text)
        mine = spm_encode(pieces, scores, text)
        if mine != ids:
            sys.exit("python spm_encode disagrees with sentencepiece on %r:\n%s\n%s"
                     % (name, ids, mine))
        out_cases.append({"name": name, "text_b64": b64(text), "ids": ids,
                          "decoded_b64": b64(sp.decode(ids))})
    # The well-known llama2.c test.c expectation, as a sanity anchor.
    assert [1] + sp.encode("I believe the meaning of life is") == \
        [1, 306, 4658, 278, 6593, 310, 2834, 338]

    p512, s512 = read_tokenizer_bin(os.path.join(data_dir, "tok512.bin"))
    assert len(p512) == 512
    tok512 = []
    for name, text in [("once", "Once upon a time"),
                       ("story", "Once upon a time, there was a little girl named Lily. "
                                 "She loved to play outside in the park."),
                       ("digits_punct", "Tom said: \"1, 2, 3!\"\nThe end."),
                       ("unicode", "caf\u00e9 \u4f60\u597d \U0001F600"),
                       ("spaces", "  two  spaces ")]:
        tok512.append({"name": name, "text_b64": b64(text), "ids": spm_encode(p512, s512, text)})

    roundtrip = [b"\xff", b"abc\x80def", b"\xc3\x28 overlong \xc0\xaf \xe0\x80\xaf",
                 b"surrogate \xed\xa0\x80 end", b"truncated \xe4\xbd", b"\xf4\x90\x80\x80 big",
                 b"nul\x00byte", bytes(range(256))]
    doc = {
        "source": "sentencepiece %s with shared/data/tokenizer.model (Llama 2); "
                  "ids without BOS; tok512 ids from tools/ref_tokenizers.py spm_encode "
                  "(no tok512.model exists)" % spm.__version__,
        "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
        "cases": out_cases,
        "tok512": tok512,
        "roundtrip_b64": [b64(x) for x in roundtrip],
    }
    dump(doc, os.path.join(OUT, "spm_cases.json"))
    print("spm: %d cases, %d tok512 cases" % (len(out_cases), len(tok512)))


# ---------------------------------------------------------------------------------------
# Byte-level BPE with the Llama-3 pre-tokenizer.

def training_corpus():
    rng = random.Random(1234)
    nouns = ["time", "girl", "park", "model", "token", "server", "cluster", "node", "value",
             "kernel", "matrix", "tensor", "batch", "queue", "memory", "story", "river",
             "house", "friend", "rank", "thread", "cache", "block", "layer", "head"]
    verbs = ["runs", "sees", "loves", "writes", "reads", "sends", "builds", "keeps", "finds",
             "moves", "computes", "returns", "checks", "allocates", "frees"]
    adjs = ["big", "small", "red", "fast", "slow", "happy", "distributed", "parallel",
            "quiet", "bright", "old", "new", "strange"]
    lines = []
    for _ in range(3000):
        s = "The %s %s %s a %s %s" % (rng.choice(adjs), rng.choice(nouns), rng.choice(verbs),
                                     rng.choice(adjs), rng.choice(nouns))
        if rng.random() < 0.3:
            s += ", and it's %s" % rng.choice(adjs)
        if rng.random() < 0.2:
            s += "; they'll say we've %s %d of them" % (rng.choice(verbs), rng.randint(0, 99999))
        lines.append(s + rng.choice([".", "!", "?", "..."]))
    code = [
        "def forward(self, x):\n    return self.proj(x) + x\n",
        "for (int i = 0; i < n; i++) {\n    y[i] += a * x[i];\n}\n",
        "if err != nil {\n\treturn err\n}\n",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
        "x = [1, 2, 3]\nprint(sum(x) / len(x))\n",
    ]
    for _ in range(200):
        lines.append(rng.choice(code))
    uni = ["\u4f60\u597d\u4e16\u754c", "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059",
           "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u041f\u0440\u0438\u0432\u0435\u0442 "
           "\u043c\u0438\u0440", "\U0001F600 \U0001F355 \u2764\ufe0f",
           "\uc548\ub155\ud558\uc138\uc694", "\u00fcber stra\u00dfe \u00e5r"]
    for _ in range(300):
        lines.append(" ".join(rng.choice(uni) for _ in range(rng.randint(1, 4))))
    for _ in range(300):
        lines.append(str(rng.randint(0, 10 ** rng.randint(1, 9))) + " " +
                     " " * rng.randint(0, 4) + "\n" * rng.randint(0, 2))
    return lines


def make_bpe():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    import tokenizers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    tok.add_special_tokens(LLAMA3_SPECIALS)

    d = os.path.join(OUT, "bpe_llama3")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    doc = json.load(open(path))
    assert doc["model"]["ignore_merges"] is True
    assert isinstance(doc["model"]["merges"][0], list)
    # Older tokenizer.json files store merges as "a b" strings (byte-level pieces hold no
    # literal spaces, so this is unambiguous).
    legacy = json.loads(json.dumps(doc))
    legacy["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]
    ld = os.path.join(OUT, "bpe_llama3_legacy")
    os.makedirs(ld, exist_ok=True)
    lpath = os.path.join(ld, "tokenizer.json")
    with open(lpath, "w") as f:
        json.dump(legacy, f, ensure_ascii=False)
    ltok = Tokenizer.from_file(lpath)

    long_text = " ".join("The big model %d runs a fast kernel, and it's parallel." % i
                         for i in range(200))
    cases = COMMON_CASES + BPE_ONLY_CASES + [("long_text", long_text)]
    out_cases = []
    for name, text in cases:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ltok.encode(text, add_special_tokens=False).ids == ids, name
        dec = tok.decode(ids, skip_special_tokens=False)
        assert dec == text, (name, dec, text)
        out_cases.append({"name": name, "text_b64": b64(text), "ids": ids})
    out = {
        "source": "HF tokenizers %s, trained by tools/ref_tokenizers.py" % tokenizers.__version__,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_id": tok.token_to_id("<|begin_of_text|>"),
        "eos_ids": [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")],
        "specials": {s: tok.token_to_id(s) for s in LLAMA3_SPECIALS},
        "cases": out_cases,
        "roundtrip_b64": [b64(x) for x in [b"\xff\xfe", b"abc\x80def", b"\xc3\x28 x \xed\xa0\x80",
                                           b"tail \xe4\xbd", bytes(range(256))]],
    }
    dump(out, os.path.join(OUT, "bpe_cases.json"))
    print("bpe: vocab %d, %d merges, %d cases, %d bytes" % (
        out["vocab_size"], len(doc["model"]["merges"]), len(out_cases), os.path.getsize(path)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True,
                    help="a folder with tokenizer.model, tokenizer.bin and tok512.bin")
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.data, "tokenizer.model")):
        sys.exit("ref_tokenizers.py: %s has no tokenizer.model (the Llama 2 SentencePiece "
                 "model that tokenizer.bin was exported from)" % args.data)
    os.makedirs(OUT, exist_ok=True)
    make_spm(args.data)
    make_bpe()


if __name__ == "__main__":
    main()
