#!/usr/bin/env python3
"""An independent float64 NumPy forward of the oracle models, checked against the fixtures.

Written from the model definitions (RMSNorm, rotate-half RoPE with default / llama3 / yarn
frequencies, GQA causal softmax attention, SwiGLU MLP), not from transformers' code, and reading
only the fixture files (config.json, safetensors). It proves that the recorded logits mean what
the fixture format says, and is the executable spec a C implementation can be read against.

For fp32 fixtures the float64 result must match reference_logits.f32 within 1e-4; for the bf16
copies (bf16 weights, HF computes in bf16) it reports how far an ideal high-precision engine
with the same bf16 weights lands from HF's bf16 run: a floor for bf16 test tolerances.

Usage: numpy_forward.py [--only NAME ...]   (run by tools/oracle/regen.sh after dump_logits.py)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

ATOL_F32 = 1e-4


def load_weights(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file  # torch: numpy has no bfloat16

    files = sorted(model_dir.glob("*.safetensors"))
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / n for n in names]
    out = {}
    for f in files:
        for k, t in load_file(str(f)).items():
            out[k] = t.double().numpy()
    return out


def rope_params(cfg: dict) -> dict:
    """v5 configs keep everything in rope_parameters; older ones use rope_theta + rope_scaling."""
    p = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    p.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    p["rope_type"] = p.get("rope_type", p.get("type", "default"))
    return p


def inv_freq_and_scale(cfg: dict, d: int) -> tuple[np.ndarray, float]:
    p = rope_params(cfg)
    theta = float(p["rope_theta"])
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    kind = p["rope_type"]
    if kind == "default":
        return inv, 1.0
    if kind == "llama3":
        factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        orig = p["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.empty_like(inv)
        for i, (f, w) in enumerate(zip(inv, wavelen)):
            if w < orig / hi:  # high frequency: unchanged
                out[i] = f
            elif w > orig / lo:  # low frequency: divided by the factor
                out[i] = f / factor
            else:  # in between: blend of the two by orig / wavelen
                s = (orig / w - lo) / (hi - lo)
                out[i] = (1 - s) * f / factor + s * f
        return out, 1.0
    if kind == "yarn":
        factor = p["factor"]
        orig = p["original_max_position_embeddings"]
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
        att = p.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

        def dim_for_rotations(n_rot):  # the dimension whose wavelength makes n_rot turns in orig
            return d * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = dim_for_rotations(beta_fast), dim_for_rotations(beta_slow)
        if p.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        keep = 1 - ramp  # 1: original frequency (extrapolate), 0: divided by factor (interpolate)
        return inv / factor * (1 - keep) + inv * keep, float(att)
    raise NotImplementedError(f"rope_type {kind}")


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [heads, T, d]; pairs are (i, i + d/2) ("rotate half"), not adjacent elements."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward(model_dir: Path, ids: list[int]) -> np.ndarray:
    cfg = json.loads((model_dir / "config.json").read_text())
    return forward_weights(cfg, load_weights(model_dir), ids)


def forward_weights(cfg: dict, W: dict[str, np.ndarray], ids: list[int], on_layer=None) -> np.ndarray:
    """The forward over weights W (Hugging Face names, any float dtype; computed in float64).
    on_layer(layer, q, k, v, p), if given, sees every layer's post-RoPE queries [H, T, d], keys and
    values repeated per query head [H, T, d] and causal softmax weights [H, T, T]."""
    D, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or D // H
    G, eps, T = H // Hkv, cfg["rms_norm_eps"], len(ids)
    inv, att = inv_freq_and_scale(cfg, d)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]  # [T, d/2]
    cos, sin = np.cos(ang) * att, np.sin(ang) * att  # yarn scales cos/sin (so q.k by att^2)
    causal = np.triu(np.full((T, T), -np.inf), 1)

    x = W["model.embed_tokens.weight"][ids].astype(np.float64)  # [T, D]
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."

        def lin(name, inp):
            y = inp @ W[pre + name + ".weight"].astype(np.float64).T
            b = W.get(pre + name + ".bias")
            return y if b is None else y + b

        h = rmsnorm(x, W[pre + "input_layernorm.weight"], eps)
        q = lin("self_attn.q_proj", h).reshape(T, H, d).transpose(1, 0, 2)  # [H, T, d]
        k = lin("self_attn.k_proj", h).reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
        v = lin("self_attn.v_proj", h).reshape(T, Hkv, d).transpose(1, 0, 2)  # [Hkv, T, d]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)  # query head j uses KV head j // G
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d) + causal  # [H, T, T]
        s = np.exp(s - s.max(-1, keepdims=True))
        p = s / s.sum(-1, keepdims=True)
        if on_layer is not None:
            on_layer(layer, q, k, v, p)
        a = p @ v  # [H, T, d]
        x = x + lin("self_attn.o_proj", a.transpose(1, 0, 2).reshape(T, H * d))
        h = rmsnorm(x, W[pre + "post_attention_layernorm.weight"], eps)
        g = lin("mlp.gate_proj", h)
        x = x + lin("mlp.down_proj", g / (1 + np.exp(-g)) * lin("mlp.up_proj", h))
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return x @ head.astype(np.float64).T  # [T, V]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    import oracle_common as oc  # torch (for the fixture models), so only here

    status = 0
    for name in args.only or oc.all_fixture_names():
        model_dir = oc.FIXTURE_MODELS / name
        ref = json.loads((model_dir / "reference.json").read_text())
        rows, V = ref["rows"], ref["vocab_size"]
        want = np.fromfile(model_dir / ref["logits_file"], dtype="<f4").reshape(rows, V)
        fed = ref["prompt_ids"] + ref["greedy_ids"][: ref["n_decode"]]
        got = forward(model_dir, fed)
        diff = np.abs(got - want)
        greedy_ok = [int(np.argmax(got[len(ref["prompt_ids"]) - 1 + i])) for i in range(len(ref["greedy_ids"]))]
        same_greedy = greedy_ok == ref["greedy_ids"]
        line = (
            f"[numpy_forward] {name:<18} max|d| {diff.max():.2e}  mean|d| {diff.mean():.2e}  "
            f"greedy {'same' if same_greedy else 'DIFFERENT'}"
        )
        if ref["dtype_run"] == "float32" and (diff.max() > ATOL_F32 or not same_greedy):
            line += f"  FAIL (atol {ATOL_F32})"
            status = 1
        print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
