#!/usr/bin/env python3
"""An independent float64 NumPy reference of `ckv analyze`'s attention-concentration statistics
(src/engine/analyze_stats.c) on a fixture model, written from docs/presses.md ("Attention-concentration
statistics") and docs/spec-eviction.md (snapkv), not from ckv's code.

The prompt is the fixture's reference prompt (L context tokens) with its last token fed again as the
analysed query, as `ckv analyze` does without --question-ids. At every layer, for every query head:
- A_i: that query's softmax attention over the L context rows (the question row left out);
- k = max(1, ceil(f * L)) for f = 0.01, 0.05, 0.10; top_share = sum of the k largest A_i / sum A_i;
- the snapkv scores of the head's KV head (window w, average pooling, kernel 5, the window protected
  with the layer's max + 1), recomputed from the attention input; recall = |top k by A ∩ top k by
  score| / k (ties: lower row first); spearman = Pearson correlation of the average ranks;
- norm_spread = max / median of ||V_i W_O^h||_1 over the context rows.
The forward is numpy_forward.py's (RMSNorm, rotate-half RoPE, GQA, SwiGLU) on the F32 safetensors.

Writes the fixture tests/fixtures/presses/analyze_stats_<model>.json that test_analyze_stats.sh
compares `ckv analyze --stats-json` with:
  analyze_stats_reference.py tests/fixtures/models/llama_gqa -o tests/fixtures/presses/analyze_stats_llama_gqa.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headscore_reference import load_f32  # noqa: E402  (numpy only)
from numpy_forward import forward_weights  # noqa: E402

FRACTIONS = (0.01, 0.05, 0.10)


def order_desc(v: np.ndarray) -> list[int]:
    return sorted(range(len(v)), key=lambda i: (-v[i], i))


def avg_ranks(v: np.ndarray) -> np.ndarray:
    order = order_desc(v)
    r = np.zeros(len(v))
    a = 0
    while a < len(v):
        b = a + 1
        while b < len(v) and v[order[b]] == v[order[a]]:
            b += 1
        for t in range(a, b):
            r[order[t]] = 0.5 * (a + b - 1)
        a = b
    return r


def snapkv_scores(q_win: np.ndarray, k: np.ndarray, L: int, w: int, kernel: int, G: int) -> np.ndarray:
    """q_win [H, w, d] roped queries of rows L-w..L-1, k [H, L, d] roped keys (per query head)."""
    d = q_win.shape[-1]
    s = q_win @ k.transpose(0, 2, 1) / math.sqrt(d)  # [H, w, L]
    qpos, kpos = np.arange(L - w, L)[:, None], np.arange(L)[None, :]
    s = np.where(kpos > qpos, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    m = p[:, :, : L - w].mean(1)  # [H, L - w]
    r = kernel // 2
    padded = np.pad(m, ((0, 0), (r, r)))
    pooled = np.stack([padded[:, i:i + kernel].sum(-1) / kernel for i in range(L - w)], axis=1)
    body = pooled.reshape(-1, G, L - w).mean(1)  # [Hkv, L - w]
    out = np.full((body.shape[0], L), body.max() + 1.0)
    out[:, : L - w] = body
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--kernel", type=int, default=5)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    cfg = json.loads((a.model_dir / "config.json").read_text())
    W = load_f32(a.model_dir / "model.safetensors")
    ctx = json.loads((a.model_dir / "reference.json").read_text())["prompt_ids"]
    ids = ctx + [ctx[-1]]
    L, T = len(ctx), len(ctx) + 1
    D, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or D // H
    G = H // Hkv
    heads = []

    def on_layer(layer, q, k, v, p):
        scores = snapkv_scores(q[:, L - a.window:L], k[:, :L], L, a.window, a.kernel, G)
        wo = W[f"model.layers.{layer}.self_attn.o_proj.weight"]  # [D, H * d]
        for head in range(H):
            A = p[head, T - 1, :L]
            sc = scores[head // G]
            norms = np.abs(v[head, :L] @ wo[:, head * d:(head + 1) * d].T).sum(-1)
            oa, osc = order_desc(A), order_desc(sc)
            place = {i: r for r, i in enumerate(osc)}
            top_k, share, recall = [], [], []
            for f in FRACTIONS:
                kk = max(1, math.ceil(f * L - 1e-9))
                top_k.append(kk)
                share.append(float(sum(A[i] for i in oa[:kk]) / A.sum()))
                recall.append(sum(place[i] < kk for i in oa[:kk]) / kk)
            rho = float(np.corrcoef(avg_ranks(A), avg_ranks(sc))[0, 1])
            heads.append({"layer": layer, "head": head, "kv_head": head // G, "top_k": top_k, "top_share": share,
                          "recall": recall, "spearman": rho,
                          "norm_spread": float(norms.max() / np.median(norms))})

    forward_weights(cfg, W, ids, on_layer)
    a.out.write_text(json.dumps({
        "what": "expected `ckv analyze --stats-json` concentration statistics "
                "(tools/oracle/analyze_stats_reference.py, float64 NumPy)",
        "model": a.model_dir.name, "context": L, "press_a": f"snapkv window {a.window} kernel {a.kernel} avg",
        "fractions": list(FRACTIONS), "heads": heads}, indent=1) + "\n")
    print(f"wrote {a.out}: {len(heads)} heads, context {L}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
