#!/usr/bin/env python3
"""InfiniGen (Lee et al., OSDI'24) as its authors' Llama code defines it, re-implemented in torch
on a Llama GGUF (SmolLM2-135M-Instruct), to compare policies/offload.c against (issue 31).

Scoring is tessera fidelity's decode mode: the text is one sequence from BOS, fed one token per
step, the policy's cache against the full cache; per position the policy's NLL, the greedy
token's agreement with the full cache and KL(full || policy). --tail N is fidelity's prompt mode (`--document
--tail N`): all but the text's last N tokens are a prompt, prefilled with full attention as
InfiniGen's prefill does, and only the last N positions are scored; selection applies to the
decode steps, every prompt token a candidate. A teacher-forced decode with a
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
scores summed over its query heads), layer (one set for all heads, the heads' probabilities summed, as offload.c), layermax (the
heads' largest probability), layerpowK (their K-th powers summed); --skew
calib (InfiniGen), self (offload.c: calibrated on the scored sequence's own first 16, 32, ...
--calib-rows queries, the weights' transform before), weights (offload.c's transform from
Wq) or none (identity: the partial columns of the raw rotated query); --unit head
(InfiniGen) or kv (one transform per KV head); --cols union (InfiniGen), l2union (the query
side ranked by the squared sum, as offload.c) or eig (the first ceil(ratio x hd)).

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


def skew_from(q, k, rep, ratio, unit="head", cols="union"):
    """Skewing matrices A (H x hd x hd) and partial-column masks M (H x hd bool) from post-RoPE
    queries q [H, T, hd] and keys k [G, T, hd].
    unit: head (InfiniGen: the right singular vectors of each query head's queries) or kv (one
    transform per KV head from its whole query group's queries, as offload.c had).
    cols: union (InfiniGen: the union of the top int(ratio x hd) columns by sum_t |q_t A| and by
    sum_t |k_t A|), eig (the first ceil(ratio x hd) columns by singular value, as offload.c
    had), l2union (the union with the query side ranked by sum_t (q_t A)^2, the singular
    value squared: what a second moment alone can rank, as offload.c does now)."""
    H, hd = q.shape[0], q.shape[-1]
    A = torch.zeros(H, hd, hd)
    M = torch.zeros(H, hd, dtype=torch.bool)
    kc, ce = int(hd * ratio), int(math.ceil(ratio * hd))
    for h in range(H):
        g = h // rep
        if unit == "head":
            X = q[h]
        else:
            X = q[g * rep:(g + 1) * rep].reshape(-1, hd)
        _, S, vq = torch.linalg.svd(X.double(), full_matrices=True)
        a = vq.T.float()  # columns: right singular vectors, largest first
        A[h] = a
        if cols == "eig":
            M[h, :ce] = True
            continue
        sq = (X @ a).abs().sum(0) if cols == "union" else (X @ a).pow(2).sum(0)
        sk = (k[g] @ a).abs().sum(0)
        M[h, torch.topk(sq, kc).indices] = True
        M[h, torch.topk(sk, kc).indices] = True
    return A, M


def calibrate(model, ids, ratio, unit="head", cols="union"):
    """Skewing matrices A[l][h] (hd x hd) and partial-column masks M[l][h] (hd bool) from a
    calibration text (InfiniGen)."""
    c = model.c
    A = torch.zeros(c["L"], c["H"], c["hd"], c["hd"])
    M = torch.zeros(c["L"], c["H"], c["hd"], dtype=torch.bool)
    rep = c["H"] // c["G"]

    def rec(l, q, k):
        A[l], M[l] = skew_from(q, k, rep, ratio, unit, cols)

    with torch.no_grad():
        model.forward(ids, record=rec)
    return A, M


def self_checkpoints(n):
    """offload.c's recalibration points: 16, 32, 64, ... up to n query rows."""
    cps, c = [], min(16, n)
    while n > 0:
        cps.append(c)
        if c >= n:
            break
        c = min(2 * c, n)
    return cps


def weight_skew(model, ratio, n_pos):
    """offload.c's skew (policies/offload_skew.c): per KV head, the eigenvectors of the rotated
    query's covariance from the weights, E_t[R(t) C R(t)^T], C = Wq diag(g^2) Wq^T over the
    head's query group (the normed input taken as whitened), t over [0, n_pos); the first
    ceil(ratio x hd) columns by eigenvalue. Same shapes as calibrate()'s (per query head)."""
    c, W = model.c, model.W
    hd, rep = c["hd"], c["H"] // c["G"]
    half = hd // 2
    inv = 1.0 / c["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    t = np.arange(n_pos, dtype=np.float64)

    def phase(th):  # mean over t of exp(i th t), th [half, half]
        ang = th[..., None] * t
        return np.cos(ang).mean(-1), np.sin(ang).mean(-1)

    cr, ci = phase(inv[:, None] - inv[None, :])
    dr, di = phase(-(inv[:, None] + inv[None, :]))
    cols = int(math.ceil(ratio * hd))
    A = torch.zeros(c["L"], c["H"], hd, hd)
    M = torch.zeros(c["L"], c["H"], hd, dtype=torch.bool)
    for l in range(c["L"]):
        wq = W[f"blk.{l}.attn_q.weight"].double().numpy()
        g = W[f"blk.{l}.attn_norm.weight"].double().numpy()
        for kv in range(c["G"]):
            C = np.zeros((hd, hd))
            for h in range(kv * rep, (kv + 1) * rep):
                w = wq[h * hd:(h + 1) * hd] * g[None, :]
                C += w @ w.T
            m00, m01 = C[0::2, 0::2], C[0::2, 1::2]
            m10, m11 = C[1::2, 0::2], C[1::2, 1::2]
            x, y = (m00 + m11) / 2, (m10 - m01) / 2
            u, w_ = (m00 - m11) / 2, (m01 + m10) / 2
            R = np.zeros((hd, hd))
            R[0::2, 0::2] = x * cr - y * ci + u * dr + w_ * di
            R[0::2, 1::2] = -x * ci - y * cr - u * di + w_ * dr
            R[1::2, 0::2] = y * cr + x * ci + w_ * dr - u * di
            R[1::2, 1::2] = -y * ci + x * cr - w_ * di - u * dr
            ev, V = np.linalg.eigh((R + R.T) / 2)
            V = V[:, np.argsort(-ev)]
            for h in range(kv * rep, (kv + 1) * rep):
                A[l, h] = torch.from_numpy(V).float()
                M[l, h, :cols] = True
    return A, M


def static_skew(A, M, skew=True):
    """The transform of every row: a calibration text's (or the weights'); skew False: the
    identity (the raw rotated query's partial columns)."""
    def segs(l, q, k, T):
        a = A[l] if skew else torch.eye(A.shape[-1]).expand(A.shape[1], -1, -1)
        return [(0, T, a, M[l], False)]
    return segs


def self_skew(WA, WM, rows, rep, ratio, unit, cols):
    """offload.c's calibration from the sequence itself: row i uses the transform of the
    layer's own first c queries (and keys), c the last of 16, 32, ... `rows` that is <= i + 1,
    the weights' transform (WA, WM) before the first; at a recalibration row the layer's own
    query replaces the speculated one (offload.c drops the speculation made with the old
    transform)."""
    cps = self_checkpoints(rows)

    def segs(l, q, k, T):
        out = [(0, min(cps[0] - 1, T), WA[l], WM[l], False)]
        for j, cp in enumerate(cps):
            if cp - 1 >= T:
                break
            a, m = skew_from(q[:, :cp], k[:, :cp], rep, ratio, unit, cols)
            hi = cps[j + 1] - 1 if j + 1 < len(cps) else T
            out.append((cp - 1, cp, a, m, True))
            out.append((cp, min(hi, T), a, m, False))
        return [x for x in out if x[1] > x[0]]
    return segs


def infinigen_mask(model, skew_segs, budget, alpha, budget_of, select, stats, dense_layers,
                   r0=0):
    """r0: rows before it are a prompt, prefilled with full (causal) attention as InfiniGen's
    prefill does (its whole KV stored); speculation and selection apply to rows r0.. (the
    decode steps), whose candidates include every prompt token."""
    c = model.c
    rep = c["H"] // c["G"]
    W = model.W

    def fn(l, xn_prev, xn, q, k, s_exact):
        if l < dense_layers or xn_prev is None:
            return None
        T = q.shape[1]
        R = T - r0  # the speculated rows r0 .. T-1
        pos = torch.arange(T)
        qs = (xn_prev[r0:] @ W[f"blk.{l}.attn_q.weight"].T).view(R, c["H"], c["hd"])
        qs = rope(qs.transpose(0, 1), pos[r0:], c["hd"], c["theta"])
        sp = torch.empty(c["H"], R, T)
        for lo, hi, a, m, own in skew_segs(l, q, k, T):
            lo, hi = max(lo, r0), hi
            if hi <= lo:
                continue
            qp = ((q[:, lo:hi] if own else qs[:, lo - r0:hi - r0]) @ a) * m[:, None, :]
            kp = k.repeat_interleave(rep, 0) @ a
            sp[:, lo - r0:hi - r0] = qp @ kp.transpose(1, 2) / math.sqrt(c["hd"])  # [H, R, T]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))[r0:]
        sp = sp.masked_fill(~causal[None], float("-inf"))
        mx = sp.max(-1, keepdim=True).values
        cnt = (sp >= mx - alpha).sum(-1).float().mean(0).to(torch.int64)  # [R]
        n = torch.arange(r0 + 1, T + 1)
        if budget_of == "step":
            cap = torch.clamp(torch.ceil(budget * n.double()).long(), min=1)
        else:
            cap = torch.full((R,), int(T * budget), dtype=torch.long)
        take = torch.minimum(cnt, cap).clamp(min=1)
        full_rows = n <= cap if budget_of == "sequence" else torch.zeros(R, dtype=torch.bool)
        # the ranking per selection unit
        if select == "head":
            score = sp
        else:
            p = torch.softmax(sp, -1)
            if select == "group":
                score = p.view(c["G"], rep, R, T).sum(1).repeat_interleave(rep, 0)
            elif select == "layer":
                score = p.sum(0, keepdim=True).expand(c["H"], R, T)
            elif select == "layermax":  # the heads' largest probability
                score = p.max(0, keepdim=True).values.expand(c["H"], R, T)
            else:  # layerpowK: the sum of the heads' probabilities to the K-th power
                score = p.pow(float(select[8:])).sum(0, keepdim=True).expand(c["H"], R, T)
            score = score.masked_fill(~causal[None], float("-inf"))
        order = score.argsort(-1, descending=True)
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(T).expand_as(order).contiguous())
        sel = rank < take[None, :, None]
        sel |= full_rows[None, :, None]
        # recall: of each head's exact top `take` keys (its own query, all keys), the share
        # selected; rows that keep everything are left out
        ex = s_exact[:, r0:].masked_fill(~causal[None], float("-inf"))
        eo = ex.argsort(-1, descending=True)
        erank = torch.empty_like(eo)
        erank.scatter_(-1, eo, torch.arange(T).expand_as(eo).contiguous())
        etop = erank < take[None, :, None]
        rows = (take < n) & ~full_rows
        if rows.any():
            hit = (etop & sel).sum(-1).float() / take[None, :].float()
            stats["recall_sum"] += hit[:, rows].mean().item()
            stats["recall_n"] += 1
            stats["fetch_frac"] += (take[rows].double() / n[rows].double()).mean().item()
        allow = torch.tril(torch.ones(T, T, dtype=torch.bool))[None].repeat(c["H"], 1, 1)
        allow[:, r0:] = sel
        return allow

    return fn


def read_dump(path):
    """offload.c's TSR_OFFLOAD_DUMP: per line "layer len take pos...": at decode row `len` the
    prior tokens made resident (the current token is resident too). {layer: {row: (take, set)}}."""
    out = {}
    for line in open(path):
        if line.startswith("#"):  # offload.c's check of the resident rows
            continue
        f = [int(x) for x in line.split()]
        if len(f) >= 3:
            out.setdefault(f[0], {})[f[1]] = (f[2], f[3:])
    return out


def replay(model, A, M, dump, budget, alpha, skew, dense_layers, per_layer):
    """Scores tessera's selections (a dump) in this model, and per layer compares them with the
    reference's one-set-per-layer selection computed from the same hidden states: Jaccard of
    the two prior-token sets, and each one's recall of the exact pooled top tokens (the layer's
    own queries, softmax summed over heads, the top `take` of tessera's row)."""
    c = model.c
    ref_st = dict(recall_sum=0.0, recall_n=0, fetch_frac=0.0)
    ref_fn = infinigen_mask(model, static_skew(A, M, skew), budget, alpha, "step", "layer",
                            ref_st, dense_layers)

    def fn(l, xn_prev, xn, q, k, s_exact):
        rows = dump.get(l)
        ref = ref_fn(l, xn_prev, xn, q, k, s_exact)
        if not rows:
            return None
        T = q.shape[1]
        allow = torch.tril(torch.ones(T, T, dtype=torch.bool))
        pe = torch.softmax(s_exact.masked_fill(~allow[None], float("-inf")), -1).sum(0)
        st = per_layer.setdefault(l, dict(n=0, jac=0.0, rt=0.0, rr=0.0, tt=0.0, tr=0.0))
        for i, (take, sel) in rows.items():
            if i >= T:
                continue
            m = torch.zeros(T, dtype=torch.bool)
            m[torch.tensor(sel, dtype=torch.long)] = True
            allow[i] = m
            allow[i, i] = True
            ex = set(torch.topk(pe[i, :i], min(take, i)).indices.tolist())
            ts = set(sel)
            st["n"] += 1
            st["tt"] += len(ts)
            st["rt"] += len(ts & ex) / max(len(ex), 1)
            if ref is not None:
                rs = set(torch.nonzero(ref[0, i, :i]).flatten().tolist())
                st["tr"] += len(rs)
                st["rr"] += len(rs & ex) / max(len(ex), 1)
                st["jac"] += len(rs & ts) / max(len(rs | ts), 1)
        return allow[None].expand(c["H"], T, T)

    return fn


def metrics(lf, lp, ids, first=0):
    """Scores positions first..T-2 (each predicts the next token), as tessera fidelity (with
    --tail N: first = T - N - 1, the prompt's last row and the N - 1 decode steps)."""
    tgt = torch.tensor(ids[first + 1:])
    lf, lp = lf[first:-1].double(), lp[first:-1].double()
    lsf, lsp = torch.log_softmax(lf, -1), torch.log_softmax(lp, -1)
    nll_f = -lsf.gather(1, tgt[:, None]).mean().item()
    nll_p = -lsp.gather(1, tgt[:, None]).mean().item()
    agree = (lf.argmax(-1) == lp.argmax(-1)).double().mean().item()
    kl = (lsf.exp() * (lsf - lsp)).sum(-1).clamp(min=0).mean().item()
    return dict(tokens=len(ids) - 1 - first, ppl_full=math.exp(nll_f), ppl=math.exp(nll_p),
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
    ap.add_argument("--skew", default="calib",
                    help="calib (InfiniGen: a calibration text), self (offload.c's: the scored "
                    "sequence's own first --calib-rows queries, recalibrated at 16, 32, ...), "
                    "weights (offload.c's transform from Wq), none (comma list)")
    ap.add_argument("--unit", default="head",
                    help="calib/self: a transform per query head (InfiniGen) or per kv head "
                    "(comma list)")
    ap.add_argument("--cols", default="union",
                    help="calib/self partial columns: union (InfiniGen), l2union (the query side "
                    "by energy), eig (the first ceil(ratio x hd)) (comma list)")
    ap.add_argument("--calib-rows", type=int, default=256,
                    help="--skew self: rows of the last recalibration (offload.c's --offload-calib)")
    ap.add_argument("--rope-positions", type=int, default=8192,
                    help="--skew weights: positions the rotation is averaged over (offload.c: "
                    "the model's context)")
    ap.add_argument("--dense-layers", type=int, default=2,
                    help="leading layers that attend to all (InfiniGen: 2)")
    ap.add_argument("--tail", type=int, default=0,
                    help="prompt mode, as tessera fidelity --document --tail N: the text (its "
                    "first --doc-tokens) is one sequence, all but its last N tokens a prompt "
                    "prefilled with full attention (InfiniGen's prefill: the prompt's KV all "
                    "stored), the last N positions scored one per decode step; --max-tokens is "
                    "then ignored, as tessera's document mode ignores it")
    ap.add_argument("--doc-tokens", type=int, default=2048,
                    help="--tail: the document's first N tokens (tessera: the context, 2048)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replay", default=None,
                    help="a TSR_OFFLOAD_DUMP of tessera fidelity on the same text and budget "
                    "(the first --budgets value): score its selections here and compare them per "
                    "layer with this reference's one set per layer")
    ap.add_argument("--no-bos", action="store_true",
                    help="no BOS first: as tessera encodes this GGUF (its tokenizer's add_bos is "
                    "off), so positions match a TSR_OFFLOAD_DUMP")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    cfg, W = load_gguf(a.model)
    model = Model(cfg, W)
    text = open(a.text).read().strip()
    calib = " ".join(open(a.calib).read().split())
    bos = [] if a.no_bos else [cfg["bos"]]
    ids = bos + tokenize(a.model, text)
    cids = bos + tokenize(a.model, calib)
    if a.tail:
        ids = ids[: a.doc_tokens]
        if a.tail + 1 >= len(ids):
            sys.exit(f"infinigen_ref.py: --tail {a.tail} needs a text longer than it "
                     f"({a.text}: {len(ids)} tokens)")
    elif a.max_tokens:
        ids = ids[: a.max_tokens + 1]
    r0 = len(ids) - a.tail if a.tail else 0  # the first decode row (the prompt before it)
    first = r0 - 1 if a.tail else 0  # the first scored row: the prompt's last
    print(f"text {len(ids)} tokens (prompt {r0}), calibration {len(cids)}", file=sys.stderr)
    A, M = calibrate(model, cids, a.ratio)
    rep = cfg["H"] // cfg["G"]
    WAM = weight_skew(model, a.ratio, a.rope_positions) if "weights" in a.skew or \
        "self" in a.skew else None

    def skew_of(skew, unit, cols):
        if skew == "calib":
            if (unit, cols) == ("head", "union"):
                return static_skew(A, M)
            return static_skew(*calibrate(model, cids, a.ratio, unit, cols))
        if skew == "self":
            return self_skew(*WAM, a.calib_rows, rep, a.ratio, unit, cols)
        if skew == "weights":
            return static_skew(*WAM)
        return static_skew(A, M, False)
    lf = model.forward(ids)
    if a.replay:
        b = float(a.budgets.split(",")[0])
        per = {}
        fn = replay(model, A, M, read_dump(a.replay), b, a.alpha, a.skew.split(",")[0] == "calib",
                    a.dense_layers, per)
        r = metrics(lf, model.forward(ids, fn), ids)
        print(f"replay of {a.replay}: ppl={r['ppl']:.2f} (full {r['ppl_full']:.2f}) "
              f"agree={r['agreement']:.3f} kl={r['kl']:.3f}")
        print("layer rows  tessera: size recall   reference: size recall   jaccard")
        for l in sorted(per):
            d = per[l]
            n = max(d["n"], 1)
            print(f"{l:5d} {d['n']:4d}  {d['tt'] / n:13.1f} {d['rt'] / n:6.3f}   "
                  f"{d['tr'] / n:15.1f} {d['rr'] / n:6.3f}   {d['jac'] / n:7.3f}")
        return
    rows = []
    variants = [(skew, unit, cols) for skew in a.skew.split(",") for unit in a.unit.split(",")
                for cols in a.cols.split(",")]
    for skew, unit, cols in variants:
        segs = skew_of(skew, unit, cols)
        for sel in a.select.split(","):
            for b in [float(x) for x in a.budgets.split(",")]:
                st = dict(recall_sum=0.0, recall_n=0, fetch_frac=0.0)
                fn = infinigen_mask(model, segs, b, a.alpha, a.budget_of, sel, st,
                                    a.dense_layers, r0)
                lp = model.forward(ids, fn)
                r = metrics(lf, lp, ids, first)
                r.update(budget=b, select=sel, skew=skew, unit=unit, cols=cols, alpha=a.alpha,
                         ratio=a.ratio, tail=a.tail, prompt_tokens=r0,
                         budget_of=a.budget_of,
                         recall=st["recall_sum"] / max(st["recall_n"], 1),
                         fetched_frac=st["fetch_frac"] / max(st["recall_n"], 1))
                rows.append(r)
                print(f"skew={skew:7s} unit={unit:4s} cols={cols:7s} select={sel:5s} "
                      f"budget={b:.2f} ppl={r['ppl']:.2f} "
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
