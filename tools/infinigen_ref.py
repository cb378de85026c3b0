#!/usr/bin/env python3
"""InfiniGen (Lee et al., OSDI'24) as its authors' Llama code defines it, re-implemented in torch
on a Llama GGUF (SmolLM2-135M-Instruct), to compare policies/offload.c against (issue 31).

Scoring is tessera fidelity's decode mode: the text is one sequence from BOS, fed one token per
step, the policy's cache against the full cache; per position the policy's NLL, the greedy
token's agreement with the full cache and KL(full || policy). A teacher-forced decode with a
per-step selection equals one parallel pass in which row i attends to the tokens selected at
step i (a row depends only on the rows before it), which is how this script computes it.

InfiniGen's method, as implemented here (the authors' accuracy/ code for Llama):
- skewing: per layer and query head, the right singular vectors of the post-RoPE queries of a
  calibration text (the authors use a PG-19 book; here --calib), so q A . k A = q . k;
- partial weights: per query head, the union of the top ratio x head_dim columns of
  sum_t |q_t A| and of sum_t |k_t A| over the calibration text (ratio 0.2 in their scripts);
- speculation: layer l's query is the previous layer's attention input (after its RMSNorm)
  times Wq_l, rotated, skewed and masked to the partial columns, against every cached key
  skewed (the keys of the head's KV group under GQA); layers 0 and 1 attend to everything;
- the fetch: per head, the keys whose partial logit (scaled by 1/sqrt(head_dim)) is within
  alpha of the head's maximum are counted, the count is averaged over the heads and truncated,
  capped at the budget; each head then takes its own top `count` keys (current token included
  only if it ranks);
- budget: --budget-of step: a fraction of the tokens so far at each step (tessera's
  semantics, ceil); sequence: of the whole text's length, every row before that sees all (the
  authors' perplexity script, one parallel pass over a 2048-token sample).
Variants isolate tessera's departures: --select head (InfiniGen), group (one set per KV head,
scores summed over its query heads), layer (one set for all heads, as offload.c); --skew
calib (InfiniGen) or none (identity: the partial columns of the raw rotated query).

Writes a JSON of the metrics per budget (--out). Needs torch and gguf; CPU is enough.
Usage: tools/infinigen_ref.py [--model GGUF] [--text FILE] [--budgets 0.1,0.2,0.5] [--out F]
"""
import argparse
import json
import math
import sys

import numpy as np
import torch


def load_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}

    def val(k):
        v = f[k]
        return v.parts[v.data[0]][0]

    cfg = dict(L=int(val("llama.block_count")), dim=int(val("llama.embedding_length")),
               H=int(val("llama.attention.head_count")),
               G=int(val("llama.attention.head_count_kv")),
               eps=float(val("llama.attention.layer_norm_rms_epsilon")),
               theta=float(val("llama.rope.freq_base")),
               bos=int(val("tokenizer.ggml.bos_token_id")))
    cfg["hd"] = cfg["dim"] // cfg["H"]
    W = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(x) for x in reversed(t.shape.tolist())]
        W[t.name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(shape))
    if "output.weight" not in W:
        W["output.weight"] = W["token_embd.weight"]
    return cfg, W


def tokenize(model_path, text):
    from transformers import AutoTokenizer
    import os
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(model_path)),
                                        gguf_file=os.path.basename(model_path))
    return tok(text, add_special_tokens=False)["input_ids"]


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, hd, theta):
    """GGUF Llama weights are permuted for adjacent-pair RoPE (channels 2p, 2p+1)."""
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None].double() * inv[None, :]
    c, s = torch.cos(ang).float(), torch.sin(ang).float()
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


class Model:
    def __init__(self, cfg, W):
        self.c, self.W = cfg, W

    def qkv(self, l, xn, pos):
        c, W = self.c, self.W
        T = xn.shape[0]
        q = (xn @ W[f"blk.{l}.attn_q.weight"].T).view(T, c["H"], c["hd"]).transpose(0, 1)
        k = (xn @ W[f"blk.{l}.attn_k.weight"].T).view(T, c["G"], c["hd"]).transpose(0, 1)
        v = (xn @ W[f"blk.{l}.attn_v.weight"].T).view(T, c["G"], c["hd"]).transpose(0, 1)
        return rope(q, pos, c["hd"], c["theta"]), rope(k, pos, c["hd"], c["theta"]), v

    def forward(self, ids, mask_fn=None, record=None):
        """mask_fn(l, xn_prev, xn, q, k) -> [H, T, T] bool of allowed keys, or None (causal)."""
        c, W = self.c, self.W
        T = len(ids)
        pos = torch.arange(T)
        x = W["token_embd.weight"][torch.tensor(ids)]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        xn_prev = None
        rep = c["H"] // c["G"]
        for l in range(c["L"]):
            xn = rms(x, W[f"blk.{l}.attn_norm.weight"], c["eps"])
            q, k, v = self.qkv(l, xn, pos)
            if record is not None:
                record(l, q, k)
            kr, vr = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            s = q @ kr.transpose(1, 2) / math.sqrt(c["hd"])
            allow = causal[None].expand(c["H"], T, T)
            if mask_fn is not None:
                m = mask_fn(l, xn_prev, xn, q, k, s)
                if m is not None:
                    allow = m & causal[None]
            s = s.masked_fill(~allow, float("-inf"))
            o = torch.softmax(s, -1) @ vr
            x = x + o.transpose(0, 1).reshape(T, -1) @ W[f"blk.{l}.attn_output.weight"].T
            h = rms(x, W[f"blk.{l}.ffn_norm.weight"], c["eps"])
            g = torch.nn.functional.silu(h @ W[f"blk.{l}.ffn_gate.weight"].T)
            x = x + (g * (h @ W[f"blk.{l}.ffn_up.weight"].T)) @ W[f"blk.{l}.ffn_down.weight"].T
            xn_prev = xn
        x = rms(x, W["output_norm.weight"], c["eps"])
        return x @ W["output.weight"].T


def calibrate(model, ids, ratio):
    """Skewing matrices A[l][h] (hd x hd) and partial-column masks M[l][h] (hd bool)."""
    c = model.c
    A = torch.zeros(c["L"], c["H"], c["hd"], c["hd"])
    M = torch.zeros(c["L"], c["H"], c["hd"], dtype=torch.bool)
    rep = c["H"] // c["G"]
    k_cols = int(c["hd"] * ratio)

    def rec(l, q, k):
        for h in range(c["H"]):
            _, _, vq = torch.linalg.svd(q[h].double(), full_matrices=False)
            a = vq.T.float()  # columns: right singular vectors, largest first
            A[l, h] = a
            sq = (q[h] @ a).abs().sum(0)
            sk = (k[h // rep] @ a).abs().sum(0)
            M[l, h, torch.topk(sq, k_cols).indices] = True
            M[l, h, torch.topk(sk, k_cols).indices] = True

    with torch.no_grad():
        model.forward(ids, record=rec)
    return A, M


def infinigen_mask(model, A, M, budget, alpha, budget_of, select, skew, stats, dense_layers):
    c = model.c
    rep = c["H"] // c["G"]
    W = model.W

    def fn(l, xn_prev, xn, q, k, s_exact):
        if l < dense_layers or xn_prev is None:
            return None
        T = q.shape[1]
        pos = torch.arange(T)
        qs = (xn_prev @ W[f"blk.{l}.attn_q.weight"].T).view(T, c["H"], c["hd"]).transpose(0, 1)
        qs = rope(qs, pos, c["hd"], c["theta"])
        a = A[l] if skew else torch.eye(c["hd"]).expand(c["H"], -1, -1)
        qp = (qs @ a) * M[l][:, None, :]
        kp = k.repeat_interleave(rep, 0) @ a
        sp = qp @ kp.transpose(1, 2) / math.sqrt(c["hd"])  # [H, T, T]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        sp = sp.masked_fill(~causal[None], float("-inf"))
        mx = sp.max(-1, keepdim=True).values
        cnt = (sp >= mx - alpha).sum(-1).float().mean(0).to(torch.int64)  # [T]
        n = torch.arange(1, T + 1)
        if budget_of == "step":
            cap = torch.clamp(torch.ceil(budget * n.double()).long(), min=1)
        else:
            cap = torch.full((T,), int(T * budget), dtype=torch.long)
        take = torch.minimum(cnt, cap).clamp(min=1)
        full_rows = n <= cap if budget_of == "sequence" else torch.zeros(T, dtype=torch.bool)
        # the ranking per selection unit
        if select == "head":
            score = sp
        else:
            p = torch.softmax(sp, -1)
            if select == "group":
                score = p.view(c["G"], rep, T, T).sum(1).repeat_interleave(rep, 0)
            else:
                score = p.sum(0, keepdim=True).expand(c["H"], T, T)
            score = score.masked_fill(~causal[None], float("-inf"))
        order = score.argsort(-1, descending=True)
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(T).expand_as(order).contiguous())
        allow = rank < take[None, :, None]
        allow |= full_rows[None, :, None]
        # recall: of each head's exact top `take` keys (its own query, all keys), the share
        # selected; rows that keep everything are left out
        ex = s_exact.masked_fill(~causal[None], float("-inf"))
        eo = ex.argsort(-1, descending=True)
        erank = torch.empty_like(eo)
        erank.scatter_(-1, eo, torch.arange(T).expand_as(eo).contiguous())
        etop = erank < take[None, :, None]
        rows = (take < n) & ~full_rows
        if rows.any():
            hit = (etop & allow).sum(-1).float() / take[None, :].float()
            stats["recall_sum"] += hit[:, rows].mean().item()
            stats["recall_n"] += 1
            stats["fetch_frac"] += (take[rows].double() / n[rows].double()).mean().item()
        return allow

    return fn


def metrics(lf, lp, ids):
    """Scores positions 0..T-2 (each predicts the next token), as tessera fidelity."""
    tgt = torch.tensor(ids[1:])
    lf, lp = lf[:-1].double(), lp[:-1].double()
    lsf, lsp = torch.log_softmax(lf, -1), torch.log_softmax(lp, -1)
    nll_f = -lsf.gather(1, tgt[:, None]).mean().item()
    nll_p = -lsp.gather(1, tgt[:, None]).mean().item()
    agree = (lf.argmax(-1) == lp.argmax(-1)).double().mean().item()
    kl = (lsf.exp() * (lsf - lsp)).sum(-1).clamp(min=0).mean().item()
    return dict(tokens=len(ids) - 1, ppl_full=math.exp(nll_f), ppl=math.exp(nll_p),
                nll=nll_p, agreement=agree, kl=kl)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default="tests/data/infinigen/artistic.txt")
    ap.add_argument("--calib", default="bench/data/heldout.txt",
                    help="calibration text for the skew and the partial columns")
    ap.add_argument("--max-tokens", type=int, default=0, help="score the first N tokens (0: all)")
    ap.add_argument("--budgets", default="0.1,0.2,0.5")
    ap.add_argument("--alpha", type=float, default=5.0, help="InfiniGen's Llama scripts: 5")
    ap.add_argument("--ratio", type=float, default=0.2, help="partial-weight ratio (0.2)")
    ap.add_argument("--budget-of", choices=["step", "sequence"], default="step")
    ap.add_argument("--select", default="head", help="head,group,layer (comma list)")
    ap.add_argument("--skew", default="calib", help="calib,none (comma list)")
    ap.add_argument("--dense-layers", type=int, default=2,
                    help="leading layers that attend to all (InfiniGen: 2)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    cfg, W = load_gguf(a.model)
    model = Model(cfg, W)
    text = open(a.text).read().strip()
    calib = " ".join(open(a.calib).read().split())
    ids = [cfg["bos"]] + tokenize(a.model, text)
    cids = [cfg["bos"]] + tokenize(a.model, calib)
    if a.max_tokens:
        ids = ids[: a.max_tokens + 1]
    print(f"text {len(ids)} tokens, calibration {len(cids)}", file=sys.stderr)
    A, M = calibrate(model, cids, a.ratio)
    lf = model.forward(ids)
    rows = []
    for skew in a.skew.split(","):
        for sel in a.select.split(","):
            for b in [float(x) for x in a.budgets.split(",")]:
                st = dict(recall_sum=0.0, recall_n=0, fetch_frac=0.0)
                fn = infinigen_mask(model, A, M, b, a.alpha, a.budget_of, sel, skew == "calib",
                                    st, a.dense_layers)
                lp = model.forward(ids, fn)
                r = metrics(lf, lp, ids)
                r.update(budget=b, select=sel, skew=skew, alpha=a.alpha, ratio=a.ratio,
                         budget_of=a.budget_of,
                         recall=st["recall_sum"] / max(st["recall_n"], 1),
                         fetched_frac=st["fetch_frac"] / max(st["recall_n"], 1))
                rows.append(r)
                print(f"skew={skew:5s} select={sel:5s} budget={b:.2f} ppl={r['ppl']:.2f} "
                      f"(full {r['ppl_full']:.2f}) agree={r['agreement']:.3f} kl={r['kl']:.3f} "
                      f"recall={r['recall']:.3f} fetched={r['fetched_frac']:.3f}", flush=True)
                if a.out:  # after every row: a long run keeps what it measured
                    out = dict(model="SmolLM2-135M-Instruct.Q4_1", text=a.text, calib=a.calib,
                               tokens=len(ids), ids=ids, rows=rows)
                    with open(a.out, "w") as f:
                        json.dump(out, f, indent=1)
                        f.write("\n")


if __name__ == "__main__":
    main()
