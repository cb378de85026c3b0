#!/usr/bin/env python3
"""H2O (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle") as its authors' real-drop KV cache does
it, in torch on a Llama GGUF (SmolLM2-135M-Instruct), to compare policies/h2o.c against.

Scoring is tessera fidelity's decode mode (as tools/infinigen_ref.py, whose GGUF loader,
tokenizer and model this script imports): the text is one sequence, fed one token per step,
the policy's cache against the full cache; per position the policy's NLL, the greedy token's
agreement with the full cache and KL(full || policy).

H2O, as the authors' H2OKVCache_LayerWise does it, per layer:
- step i appends token i to the cache and attends over what the cache holds;
- each cached token's score is the attention probability it received, accumulated over every
  query since it entered the cache (the new token starts with its own probability);
- then the cache is cut to the budget: the `recent` newest tokens plus the highest-scored
  `budget - recent` of the others; an evicted token never returns.
Departures, all tessera's semantics: one token set per layer, the scores summed over every
query head (a tessera slot holds all heads; --select head keeps a set per query head, the
paper's); the budget is ceil(budget x tokens so far) at every step; recent = round-half-up
of --recent x budget (policies/h2o.c); ties go to the newer token.

A teacher-forced decode with a per-step cache equals one parallel pass in which row i attends
to the cache of step i, so each layer runs its steps in order on that layer's logits (which
depend only on lower layers) and hands the forward pass the mask.

--dump FILE writes the kept positions per step and layer ("step layer pos..."), for
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


def h2o_budget(b, n):
    """tsr_kv_policy_budget: ceil(b x n) for b <= 1, else b tokens; at least 1, at most n."""
    t = math.ceil(b * n) if b <= 1.0 else int(b)
    return max(1, min(t, n))


def h2o_mask(c, budget, recent_share, select, dump=None):
    """The forward pass's mask_fn: per layer the H2O cache of each step, one set per layer
    (select 'layer') or per query head ('head')."""

    def fn(l, xn_prev, xn, q, k, s):
        H, T = s.shape[0], s.shape[1]
        sets = H if select == "head" else 1
        allow = torch.zeros(H, T, T, dtype=torch.bool)
        score = torch.zeros(sets, T, dtype=torch.float64)
        kept = [torch.zeros(0, dtype=torch.long) for _ in range(sets)]
        for i in range(T):
            for u in range(sets):
                cache = torch.cat([kept[u], torch.tensor([i])])
                heads = range(H) if sets == 1 else [u]
                for h in heads:
                    allow[h, i, cache] = True
                p = torch.softmax(s[list(heads)][:, i, cache].double(), -1)  # [heads, n]
                score[u, cache] += p.sum(0)
                bud = h2o_budget(budget, i + 1)
                if cache.numel() > bud:
                    rec = min(int(math.floor(bud * recent_share + 0.5)), bud)
                    # cache is in position order: the newest `rec` stay
                    old, new = cache[: cache.numel() - rec], cache[cache.numel() - rec:]
                    # highest score first; ties: the newer first
                    sc = score[u, old].tolist()
                    key = sorted(zip(sc, old.tolist()), key=lambda t: (-t[0], -t[1]))
                    heavy = torch.tensor(sorted(j for _, j in key[: bud - rec]),
                                         dtype=torch.long)
                    cache = torch.cat([heavy, new])
                kept[u] = cache
            if dump is not None and sets == 1:
                dump.append((i, l, kept[0].tolist()))
        return allow

    return fn


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
    ap.add_argument("--out", default=None, help="JSON of the metrics")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    cfg, W = ig.load_gguf(a.model)
    model = ig.Model(cfg, W)
    text = open(a.text).read().strip()
    ids = ([cfg["bos"]] if a.bos else []) + ig.tokenize(a.model, text)
    if a.max_tokens:
        ids = ids[: a.max_tokens + 1]  # N predictions, as tessera fidelity --max-tokens N
    print(f"text {len(ids)} tokens", file=sys.stderr)
    lf = model.forward(ids)
    rows = []
    for sel in a.select.split(","):
        for bi, b in enumerate(float(x) for x in a.budgets.split(",")):
            dump = [] if a.dump and bi == 0 and sel == "layer" else None
            lp = model.forward(ids, h2o_mask(cfg, b, a.recent, sel, dump))
            r = ig.metrics(lf, lp, ids)
            r.update(budget=b, select=sel, recent=a.recent)
            rows.append(r)
            print(f"select={sel:5s} budget={b:.2f} ppl={r['ppl']:.2f} (full {r['ppl_full']:.2f}) "
                  f"agree={r['agreement']:.3f} kl={r['kl']:.3f}", flush=True)
            if dump is not None:
                with open(a.dump, "w") as f:
                    for i, l, kept in sorted(dump):
                        f.write(f"{i} {l} " + " ".join(map(str, kept)) + "\n")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(model=os.path.basename(a.model), text=a.text, tokens=len(ids),
                           bos=a.bos, rows=rows), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
