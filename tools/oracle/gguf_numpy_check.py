#!/usr/bin/env python3
"""ckv's f32 path on a real GGUF file against an independent float64 NumPy forward of the same file.

The weights are read and dequantised by the gguf PyPI package (gguf.GGUFReader, gguf.quants), not by
ckv; their names and the configuration are mapped from the GGUF metadata here (llama files get the
q/k rotary row permutation undone, qwen2 files keep their rows); numpy_forward.forward_weights runs
the model in float64. For each prompt of a llama.cpp fixture (tests/fixtures/gguf/<preset>_llamacpp.json)
ckv runs `generate --weights-dtype f32 --max-new-tokens 1 --dump-logits` and the first position's
logits are compared over the whole vocabulary: ckv computes in fp32 over the same dequantised
weights, so the two agree to fp32 rounding (a wrong block layout, scale, bias or permutation moves
logits by whole units).

Run (a Python with numpy and gguf, e.g. the llama-cpp-python venv of tools/bench):
  V/bin/python tools/oracle/gguf_numpy_check.py --ckv build/ckv --preset qwen25 [--tol 2e-3]
Not run by the tests (slow: the forward holds the model in fp32, ~2.5 GB for Qwen2.5-0.5B).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from numpy_forward import forward_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PRESETS = {"smollm2": "smollm2-135m-instruct-q4_1.gguf", "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}


def meta(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0].name == "STRING" else v.tolist()[0]


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """GGUF llama q/k rows (per head (d/2, 2)) back to Hugging Face's (2, d/2)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load(path: Path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(path))
    arch = meta(r, "general.architecture")
    a = lambda k: meta(r, f"{arch}.{k}")  # noqa: E731
    H, Hkv = a("attention.head_count"), a("attention.head_count_kv")
    W = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(n) for n in reversed(t.shape)])
        name = t.name
        if name == "token_embd.weight":
            W["model.embed_tokens.weight"] = x
        elif name == "output_norm.weight":
            W["model.norm.weight"] = x
        elif name == "output.weight":
            W["lm_head.weight"] = x
        elif name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if arch == "llama" and rest.startswith(("attn_q.", "attn_k.")):
                x = unpermute(x, H if rest.startswith("attn_q.") else Hkv)
            W[f"model.layers.{layer}.{LAYER_NAMES[rest]}"] = x
    cfg = {"hidden_size": a("embedding_length"), "num_attention_heads": H, "num_key_value_heads": Hkv,
           "num_hidden_layers": a("block_count"), "rms_norm_eps": a("attention.layer_norm_rms_epsilon"),
           "rope_theta": a("rope.freq_base") if f"{arch}.rope.freq_base" in r.fields else 10000.0,
           "tie_word_embeddings": "lm_head.weight" not in W}
    return cfg, W


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckv", type=Path, default=REPO / "build" / "ckv")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="qwen25")
    ap.add_argument("--tol", type=float, default=2e-3, help="max |logit diff| allowed (fp32 vs float64)")
    args = ap.parse_args()
    model = REPO / "models" / PRESETS[args.preset]
    fixture = json.loads((REPO / "tests" / "fixtures" / "gguf" / f"{args.preset}_llamacpp.json").read_text())
    cfg, W = load(model)
    status = 0
    for p in fixture["prompts"]:
        ids = p["prompt_ids"]
        ref = forward_weights(cfg, W, ids)[-1]
        with tempfile.TemporaryDirectory() as td:
            dump = Path(td) / "logits.f32"
            subprocess.run([str(args.ckv), "generate", "--model", str(model), "--prompt-ids", ",".join(map(str, ids)),
                            "--max-new-tokens", "1", "--threads", "2", "--weights-dtype", "f32", "--dump-logits",
                            str(dump)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            got = np.fromfile(dump, dtype="<f4")[: ref.shape[0]]
        diff = np.abs(got - ref)
        ok = diff.max() <= args.tol and int(np.argmax(got)) == int(np.argmax(ref))
        status |= 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} {p['name']}: max |ckv - numpy| {diff.max():.2e} over {ref.shape[0]} logits "
              f"(logit std {ref.std():.2f}), argmax {int(np.argmax(got))} / {int(np.argmax(ref))}")
    return status


if __name__ == "__main__":
    sys.exit(main())
