#!/usr/bin/env python3
"""A harmony tokenizer small enough for the tiny GPT-OSS test models (vocabulary 160).

Writes tests/data/harmony/tokenizer.json: GPT-OSS's tokenizer.json shape (o200k's split
regex, ByteLevel without its own regex, the ByteLevel decoder) with the harmony special
tokens at ids 0-9, the printable ASCII characters, space and newline, and BPE merges
trained on harmony-rendered text up to 160 ids, so that `tessera generate --chat` and
`tessera run` can render, encode and parse harmony on tests/data/arch/gptoss_*. Text beyond
printable ASCII has no ids here.

Needs python3 and tokenizers (pip install tokenizers); CI uses only the stored file.
Usage: python3 tools/make_harmony_tokenizer.py
"""
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "harmony", "tokenizer.json")
VOCAB = 160  # tests/data/arch/gptoss_*/config.json vocab_size

# tools/tokenizer_corpus.py's O200K_RE (openai/tiktoken o200k_base)
O200K_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
            r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
            "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"]
TEXTS = [
    "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
    "Current date: 2026-12-04\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, "
    "final. Channel must be included for every message.",
    "# Instructions\n\nAnswer in one sentence.\n\n",
    "The user asks a question. Let me think about the answer before I write it.",
    "Hello! How can I help you today? The weather in Paris is clear and warm.",
]


def main():
    byte_level = pre_tokenizers.ByteLevel.alphabet()
    # printable ASCII keeps its own character in ByteLevel; space and newline map to these
    alphabet = [chr(c) for c in range(33, 127)] + ["\u0120", "\u010a"]
    assert all(a in byte_level for a in alphabet)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet),
                                  show_progress=False)
    tk.train_from_iterator(TEXTS * 4, trainer=trainer)
    assert tk.get_vocab_size() == VOCAB, tk.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tk.token_to_id(s) == i
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    tk.save(OUT)
    print(f"wrote {OUT}: {tk.get_vocab_size()} ids")


if __name__ == "__main__":
    main()
