#!/usr/bin/env python3
"""H2O (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle") as its authors' real-drop KV cache does
it, in torch on a Llama GGUF (SmolLM2-135M-Instruct), to compare policies/h2o.c against.

Scoring is tessera fidelity's decode mode (as tools/infinigen_ref.py, whose GGUF loader,
tokenizer and model this script imports): the text is one sequence, fed one token per step,
the policy's cache against the full cache; per position the policy's NLL, the greedy token's
agreement with the full cache and KL(full || policy). --tail N is fidelity's prompt mode (`--document --tail N`): all but
the text's last N tokens are a prompt, fed in --chunk-token chunks (tessera's h2o: each chunk
sees the cache and itself, then one cut) or, --chunk 0, in one pass (the authors': the
prompt's full attention accumulated, then one cut), and only the last N positions are scored.

H2O, as the authors' H2OKVCache_LayerWise does it, per layer:
- step i appends token i to the cache and attends over what the cache holds;
- each cached token's score is the attention probability it received, accumulated over every
  query since it entered the cache (the new token starts with its own probability);
- then the cache is cut to the budget: the `recent` newest tokens plus the highest-scored
  `budget - recent` of the others; an evicted token never returns.
Departures, all tessera's semantics: one token set per layer, the scores summed over every
query head (a tessera slot holds all heads; --select head keeps a set per query head, the
paper's); the budget is ceil(budget x tokens so far) at every step (--fixed: the authors'
fixed cache of budget x text tokens); recent = round-half-up of --recent x budget
(policies/h2o.c); ties go to the newer token. --min-budget K (an ablation): at least K tokens,
which keeps the first token past the second step (docs/kv-cache.md, h2o).

A teacher-forced decode with a per-step cache equals one parallel pass in which row i attends
to the cache of step i, so each layer runs its steps in order on that layer's logits (which
depend only on lower layers) and hands the forward pass the mask.

--dump FILE writes the kept positions per step and layer ("newest_position layer pos..."), for
comparison with TSR_H2O_DUMP=FILE of tessera (policies/h2o.c); --write-testdata DIR writes
tests/data/h2o/ (see tests/unit/test_h2o.c).
Usage: tools/h2o_ref.py [--model GGUF] [--text FILE] [--max-tokens N] [--budgets 0.1,0.2,0.5]
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import infinigen_ref as ig  # noqa: E402  (the GGUF loader, tokenizer, model and metrics)


def h2o_budget(b, n, min_budget=0):
    """tsr_kv_policy_budget: ceil(b x n) for b <= 1, else b tokens; at least 1, at most n.
    min_budget (an ablation, not tessera's): at least min(n, min_budget)."""
    t = math.ceil(b * n) if b <= 1.0 else int(b)
    return max(max(1, min(t, n)), min(n, min_budget))


def h2o_keep(cache, score, bud, recent_share):
    """One eviction: cache (positions, ascending) cut to bud, the round-half-up of
    recent_share x bud newest plus the highest-scored others (ties: the newer stays).
    score(j) is position j's accumulated score. Returns the kept positions, ascending."""
    if len(cache) <= bud:
        return list(cache)
    rec = min(int(math.floor(bud * recent_share + 0.5)), bud)
    old, new = cache[: len(cache) - rec], cache[len(cache) - rec:]
    ranked = sorted(old, key=lambda j: (-score(j), -j))
    return sorted(ranked[: bud - rec]) + list(new)


def h2o_mask(c, budget, recent_share, select, dump=None, min_budget=0, fixed=None, steps=None):
    """The forward pass's mask_fn: per layer the H2O cache of each step, one set per layer
    (select 'layer') or per query head ('head'). fixed: a cache of that many tokens instead of
    the step budget (the authors' real-drop cache: hh_size + recent_size). steps: the
    (start, end) token ranges fed per step (default: one token each); a step of several
    tokens is a prefill chunk: its queries see the cache and the chunk causally, each cached
    and new token's score gains the chunk's probabilities summed over its queries, and the
    cache is cut once after the chunk (tessera's h2o: observe after each attention call)."""

    def fn(l, xn_prev, xn, q, k, s):
        H, T = s.shape[0], s.shape[1]
        sets = H if select == "head" else 1
        allow = torch.zeros(H, T, T, dtype=torch.bool)
        score = torch.zeros(sets, T, dtype=torch.float64)
        kept = [[] for _ in range(sets)]
        for a0, a1 in (steps or [(i, i + 1) for i in range(T)]):
            bud = fixed if fixed else h2o_budget(budget, a1, min_budget)
            for u in range(sets):
                cache = kept[u] + list(range(a0, a1))
                heads = list(range(H)) if sets == 1 else [u]
                idx = torch.tensor(cache)
                ok = idx[None, :] <= torch.arange(a0, a1)[:, None]  # [rows, n] causal
                for h in heads:
                    allow[h, a0:a1, idx] = ok
                lg = s[heads[0]:heads[-1] + 1, a0:a1][:, :, idx].double().masked_fill(~ok[None], float("-inf"))
                p = torch.softmax(lg, -1)  # [heads, rows, n]
                score[u, idx] += p.sum((0, 1))
                sc = dict(zip(cache, score[u, idx].tolist()))
                kept[u] = h2o_keep(cache, sc.__getitem__, bud, recent_share)
            if dump is not None and sets == 1:
                dump.append((a1 - 1, l, kept[0]))
        return allow

    return fn


def write_testdata(path, steps, budget, recent_share, seed):
    """A mechanism case for tests/unit/test_h2o.c: one layer, decode steps of one token; the
    score each cached position receives at step i is a multiple of 1/64 (exact in f32 sums,
    ties included), drawn from a seeded generator; after each step the kept positions and
    their accumulated scores. Format: a header line 'steps budget recent', then per step
    'i s_0 .. s_i | kept positions | their scores', scores in units of 1/64."""
    g = torch.Generator().manual_seed(seed)
    acc = {}
    kept = []
    lines = [f"{steps} {budget:.17g} {recent_share:.17g}"]
    for i in range(steps):
        # some positions draw large scores (heavy hitters), most small ones
        draw = torch.randint(0, 64, (i + 1,), generator=g)
        big = torch.randint(0, 8, (i + 1,), generator=g) == 0
        sc = [(int(d) + (192 if b else 0)) / 64.0 for d, b in zip(draw, big)]
        cache = kept + [i]
        for j in cache:
            acc[j] = acc.get(j, 0.0) + sc[j]
        kept = h2o_keep(cache, acc.__getitem__, h2o_budget(budget, i + 1), recent_share)
        for j in list(acc):
            if j not in kept:
                del acc[j]
        lines.append(f"{i} " + " ".join(str(int(x * 64)) for x in sc) + " | " +
                     " ".join(map(str, kept)) + " | " +
                     " ".join(str(int(acc[j] * 64)) for j in kept))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default="tests/data/infinigen/artistic.txt")
    ap.add_argument("--max-tokens", type=int, default=300, help="score the first N tokens")
    ap.add_argument("--budgets", default="0.1,0.2,0.5")
    ap.add_argument("--recent", type=float, default=0.5, help="share of the budget for recent")
    ap.add_argument("--select", default="layer", help="layer (tessera), head (paper), or both")
    ap.add_argument("--bos", action="store_true",
                    help="BOS first (tessera encodes this GGUF without: its add_bos is off)")
    ap.add_argument("--dump", default=None, help="kept positions per step and layer (first "
                    "budget, --select layer)")
    ap.add_argument("--dump-every", type=int, default=1, metavar="K",
                    help="dump only the steps i with i %% K == K - 1 (tests/data/h2o/"
                    "smollm2_artistic_48_b050.txt: --max-tokens 48 --budgets 0.5 --dump-every 4)")
    ap.add_argument("--min-budget", type=int, default=0,
                    help="ablation: at least this many tokens (0: tessera's budget)")
    ap.add_argument("--fixed", action="store_true",
                    help="ablation: a cache of budget x text tokens from the start (the "
                    "authors' hh_size + recent_size), not ceil(budget x tokens so far)")
    ap.add_argument("--tail", type=int, default=0,
                    help="prompt mode, as tessera fidelity --document --tail N: the text (its "
                    "first --doc-tokens) is one sequence, all but its last N tokens a prompt "
                    "prefilled in --chunk-token chunks, the last N positions scored one per "
                    "decode step (--max-tokens is then ignored, as in tessera's document mode)")
    ap.add_argument("--doc-tokens", type=int, default=2048,
                    help="--tail: the document's first N tokens (tessera: the context, 2048)")
    ap.add_argument("--chunk", type=int, default=256,
                    help="--tail: prefill chunk (tessera fidelity's --chunk, 256); 0: the whole "
                    "prompt in one pass, then one cut (the authors' real-drop cache)")
    ap.add_argument("--out", default=None, help="JSON of the metrics")
    ap.add_argument("--write-testdata", default=None, metavar="DIR",
                    help="write DIR/steps_*.txt for tests/unit/test_h2o.c (no model) and exit")
    a = ap.parse_args()
    if a.write_testdata:
        for name, steps, b, rs, seed in [("steps_b050_r050", 80, 0.5, 0.5, 1),
                                         ("steps_b030_r050", 80, 0.3, 0.5, 2),
                                         ("steps_b020_r025", 80, 0.2, 0.25, 3)]:
            write_testdata(os.path.join(a.write_testdata, name + ".txt"), steps, b, rs, seed)
        return
    torch.set_grad_enabled(False)
    cfg, W = ig.load_gguf(a.model)
    model = ig.Model(cfg, W)
    text = open(a.text).read().strip()
    ids = ([cfg["bos"]] if a.bos else []) + ig.tokenize(a.model, text)
    steps, first = None, 0
    if a.tail:
        ids = ids[: a.doc_tokens]
        if a.tail + 1 >= len(ids):
            sys.exit(f"h2o_ref.py: --tail {a.tail} needs a text longer than it "
                     f"({a.text}: {len(ids)} tokens)")
        pre = len(ids) - a.tail
        ch = a.chunk if a.chunk > 0 else pre
        steps = [(s0, min(s0 + ch, pre)) for s0 in range(0, pre, ch)]
        steps += [(i, i + 1) for i in range(pre, len(ids))]
        first = pre - 1  # the prompt's last row, then the decode steps
    elif a.max_tokens:
        ids = ids[: a.max_tokens + 1]  # N predictions, as tessera fidelity --max-tokens N
    print(f"text {len(ids)} tokens" + (f" (prompt {len(ids) - a.tail})" if a.tail else ""),
          file=sys.stderr)
    lf = model.forward(ids)
    rows = []
    for sel in a.select.split(","):
        for bi, b in enumerate(float(x) for x in a.budgets.split(",")):
            dump = [] if a.dump and bi == 0 and sel == "layer" else None
            fixed = math.ceil(b * (len(ids) - 1)) if a.fixed else None
            lp = model.forward(ids, h2o_mask(cfg, b, a.recent, sel, dump, a.min_budget, fixed,
                                             steps))
            r = ig.metrics(lf, lp, ids, first)
            r.update(budget=b, select=sel, recent=a.recent, min_budget=a.min_budget,
                     fixed=fixed, tail=a.tail, chunk=a.chunk if a.tail else None)
            rows.append(r)
            print(f"select={sel:5s} chunk={r['chunk']} budget={b:.2f} min={a.min_budget} fixed={fixed} ppl={r['ppl']:.2f} (full {r['ppl_full']:.2f}) "
                  f"agree={r['agreement']:.3f} kl={r['kl']:.3f}", flush=True)
            if dump is not None:
                with open(a.dump, "w") as f:
                    for i, l, kept in sorted(dump):
                        if i % a.dump_every == a.dump_every - 1 and i < len(ids) - 1:
                            f.write(f"{i} {l} " + " ".join(map(str, kept)) + "\n")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(model=os.path.basename(a.model), text=a.text, tokens=len(ids),
                           bos=a.bos, rows=rows), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
