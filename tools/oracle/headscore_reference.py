#!/usr/bin/env python3
"""An independent float64 NumPy reference of `ckv profile-heads` (src/eval/headscore.c) on a fixture
model: the HeadKV retrieval-reasoning score of every query head over the probes ckv generated.

For each probe (token ids of prompt + answer, the needle sentence's span, the answer's length), the
model runs over the prompt and the answer but its last token; at every layer, for the query row that
produces answer token t (row n - 1 + t), the head's causal softmax attention over rows 0 .. n - 1 + t
is taken, its top-k rows (by weight, ties to the lower row; k = the needle sentence's length unless
--topk is given), and each of those rows inside the needle sentence adds
10 * weight / (needle length * answer length) (HeadKV's retrieval_head_detection_r2.py: no token
match). The profile is the mean over the probes that count: with --count-probes answered only those
whose every answer token is the greedy argmax of the final logits (final RMSNorm + lm_head, tied to
the embeddings when the fixture has no lm_head); a KV head's score is the mean over its query heads.
The forward is
the one of numpy_forward.py (RMSNorm, rotate-half RoPE, GQA attention, SwiGLU), with the weights
read straight from an F32 safetensors file (no torch).

Writes the fixture tests/fixtures/presses/headscore_<model>.json that test_profile_heads.sh compares
ckv with:
  ckv profile-heads --model tests/fixtures/models/llama_gqa --samples 3 --length 200 --count-probes all \\
      --out profile.json --probes-out probes.jsonl
  headscore_reference.py tests/fixtures/models/llama_gqa probes.jsonl --count-probes all \\
      -o tests/fixtures/presses/headscore_llama_gqa.json
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from numpy_forward import inv_freq_and_scale, rmsnorm, rope  # noqa: E402  (numpy only)


def load_f32(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}; this reference reads F32 fixtures only")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"]).astype(np.float64)
    return out


def probe_scores(cfg: dict, W: dict, ids: list[int], n: int, lo: int, hi: int, A: int,
                 topk: int) -> tuple[np.ndarray, bool]:
    D, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or D // H
    G, eps, L = H // Hkv, cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    span = hi - lo
    k_rows = topk if topk > 0 else span
    seq = ids[: n + A - 1]
    T = len(seq)
    inv, att = inv_freq_and_scale(cfg, d)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang) * att, np.sin(ang) * att
    causal = np.triu(np.full((T, T), -np.inf), 1)
    x = W["model.embed_tokens.weight"][seq]
    out = np.zeros((L, H))
    for layer in range(L):
        pre = f"model.layers.{layer}."

        def lin(name, inp):
            y = inp @ W[pre + name + ".weight"].T
            b = W.get(pre + name + ".bias")
            return y if b is None else y + b

        h = rmsnorm(x, W[pre + "input_layernorm.weight"], eps)
        q = rope(lin("self_attn.q_proj", h).reshape(T, H, d).transpose(1, 0, 2), cos, sin)
        k = rope(lin("self_attn.k_proj", h).reshape(T, Hkv, d).transpose(1, 0, 2), cos, sin)
        v = lin("self_attn.v_proj", h).reshape(T, Hkv, d).transpose(1, 0, 2)
        k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d) + causal
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)  # [H, T, T]
        for t in range(A):
            row = n - 1 + t
            for head in range(H):
                w = p[head, row, : row + 1]
                order = sorted(range(row + 1), key=lambda i: (-w[i], i))[:k_rows]
                out[layer, head] += 10 * sum(w[i] for i in order if lo <= i < hi) / (span * A)
        x = x + lin("self_attn.o_proj", (p @ v).transpose(1, 0, 2).reshape(T, H * d))
        h = rmsnorm(x, W[pre + "post_attention_layernorm.weight"], eps)
        g = lin("mlp.gate_proj", h)
        x = x + lin("mlp.down_proj", g / (1 + np.exp(-g)) * lin("mlp.up_proj", h))
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = rmsnorm(x[n - 1:n - 1 + A], W["model.norm.weight"], eps) @ head.T
    answered = all(int(np.argmax(logits[t])) == ids[n + t] for t in range(A))
    return out, answered


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("probes", type=Path, help="ckv profile-heads --probes-out file")
    ap.add_argument("--topk", type=int, default=0, help="0: the needle sentence's length (HeadKV)")
    ap.add_argument("--count-probes", choices=("answered", "all"), default="answered")
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    cfg = json.loads((a.model_dir / "config.json").read_text())
    W = load_f32(a.model_dir / "model.safetensors")
    probes = [json.loads(l) for l in a.probes.read_text().splitlines() if l.strip()]
    total, counted, answered = None, 0, 0
    for pr in probes:
        s, ok = probe_scores(cfg, W, pr["ids"], pr["n"], pr["needle_lo"], pr["needle_hi"], pr["n_answer"], a.topk)
        answered += ok
        if ok or a.count_probes == "all":
            counted += 1
            total = s if total is None else total + s
    if not counted:
        raise SystemExit("the model answered none of the probes (use --count-probes all)")
    q = total / counted
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    kv = q.reshape(q.shape[0], Hkv, H // Hkv).mean(-1)
    a.out.write_text(json.dumps({
        "what": "expected `ckv profile-heads` scores (tools/oracle/headscore_reference.py, float64 NumPy)",
        "model": a.model_dir.name, "topk": a.topk, "count_probes": a.count_probes,
        "probes_answered": answered, "probes_counted": counted, "probes": probes,
        "query_head_scores": q.tolist(), "scores": kv.tolist()}, indent=1) + "\n")
    print(f"wrote {a.out}: {len(probes)} probes, {q.shape[0]} layers x {H} heads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
