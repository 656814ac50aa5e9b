#!/usr/bin/env python3
"""Record the reference logits of every oracle model (tests/fixtures/models/<name>/).

For each model: load it from its fixture directory as a user would (eager attention; fp32, or
bfloat16 for the *_bf16 copies), prefill the fixed 240-token prompt in one forward, then feed
8 greedy tokens one at a time through the KV cache. Writes, next to the weights:

  reference.json         prompt_ids, greedy_ids, n_decode, vocab_size, logits_file, rows, ...
  reference_logits.f32   raw little-endian float32 [rows = 240 + 8, vocab]
  reference_logits_f32compute.f32  (*_bf16 only) the same rows from the bf16 checkpoint loaded with
                         dtype=float32 (weights upcast exactly, fp32 compute), fed the same tokens:
                         what ckv's CPU backend computes, so it is compared at fp32 tolerance

Self-check: the incremental logits must equal one full forward over prompt + fed tokens
within 1e-5 (fp32 models; bf16 models only report the difference).

Usage: dump_logits.py [--only NAME ...]   (normally run through tools/oracle/regen.sh)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

SELF_CHECK_ATOL_F32 = 1e-5
LOGITS_FILE = "reference_logits.f32"
LOGITS_FILE_F32COMPUTE = "reference_logits_f32compute.f32"


def torch_version() -> str:
    return torch.__version__.split("+")[0]


def dump_one(name: str) -> dict:
    spec = oc.spec_by_name(oc.base_name(name))
    bf16 = oc.is_bf16(name)
    model_dir = oc.FIXTURE_MODELS / name
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir}/config.json missing: run tools/oracle/make_models.py first")

    model = oc.load_model(model_dir, bf16)
    vocab = int(model.config.vocab_size)
    prompt = oc.prompt_ids(spec)
    logits, greedy = oc.reference_run(model, prompt, oc.N_DECODE)
    rows = oc.PROMPT_LEN + oc.N_DECODE
    assert logits.shape == (rows, vocab), logits.shape
    for i, g in enumerate(greedy):
        assert g == int(np.argmax(logits[oc.PROMPT_LEN - 1 + i])), (name, i)

    # self-check: incremental decode == one full forward over everything that was fed
    full = oc.full_forward(model, prompt + greedy[:-1])
    diff = float(np.max(np.abs(full - logits)))
    if not bf16 and diff > SELF_CHECK_ATOL_F32:
        raise RuntimeError(f"{name}: incremental vs full-forward logits differ by {diff:.3g} > {SELF_CHECK_ATOL_F32}")
    if not np.all(np.isfinite(logits)):
        raise RuntimeError(f"{name}: non-finite logits")

    logits.astype("<f4").tofile(model_dir / LOGITS_FILE)
    if bf16:
        upcast = oc.load_model(model_dir, False)  # bf16 weights, fp32 compute
        f32c = oc.full_forward(upcast, prompt + greedy[:-1])
        assert f32c.shape == logits.shape, f32c.shape
        f32c.astype("<f4").tofile(model_dir / LOGITS_FILE_F32COMPUTE)
    margins = oc.greedy_margins(logits)
    ref = {
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "n_decode": oc.N_DECODE,
        "vocab_size": vocab,
        "logits_file": LOGITS_FILE,
        "rows": rows,
        "dtype_run": "bfloat16" if bf16 else "float32",
        **({"logits_file_f32compute": LOGITS_FILE_F32COMPUTE} if bf16 else {}),
        "generator": "tools/oracle/dump_logits.py",
        "transformers": transformers.__version__,
        "torch": torch_version(),
        # informational extras (tests may ignore them)
        "attn_implementation": "eager",
        "greedy_margins": [round(m, 6) for m in margins],
        "logits_std": round(oc.logits_std(logits), 6),
        "self_check_max_abs_diff": float(f"{diff:.3g}"),
    }
    oc.write_json(model_dir / "reference.json", ref)
    return {
        "name": name,
        "logits_std": ref["logits_std"],
        "min_margin": min(margins),
        "self_check": diff,
        "greedy": greedy,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="fixture names (e.g. llama_gqa qwen2_bias_bf16)")
    args = ap.parse_args()
    oc.setup_torch()
    names = args.only or oc.all_fixture_names()
    for name in names:
        r = dump_one(name)
        print(
            f"[dump_logits] {r['name']:<18} logits std {r['logits_std']:.3f}  min greedy margin "
            f"{r['min_margin']:.4f}  incremental-vs-full max|d| {r['self_check']:.2e}  greedy {r['greedy']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
