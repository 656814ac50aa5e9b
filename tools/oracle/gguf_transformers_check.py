#!/usr/bin/env python3
"""ckv's first-token logits on a real GGUF file against Hugging Face transformers loading the same file.

transformers reads the GGUF itself (`from_pretrained(..., gguf_file=...)`: its own metadata mapping,
dequantisation through the gguf PyPI package, fp32 torch weights) and runs its own model code; ckv
runs `generate --max-new-tokens 1 --dump-logits` on the prompts of the llama.cpp fixture
(tests/fixtures/gguf/<preset>_llamacpp.json), twice:
  --weights-dtype f32   the same dequantised weights in fp32: the two differ only by fp32 summation
                        order, so they must agree within --tol (default 5e-3 on logits whose spread is
                        ~3-5; a wrong block layout, scale, bias, rope or permutation moves them by units)
                        with the same argmax;
  --weights-dtype auto  the weights as stored, the last position's lm_head through the 8-bit activation
                        dot of decode (as llama.cpp does): bounded by --tol-auto, the same argmax unless
                        transformers' own top-two margin is within twice the largest difference (a
                        near-tie, printed).
Run (a Python with torch, transformers and gguf; not part of the tests: CI has no torch):
  V/bin/python tools/oracle/gguf_transformers_check.py --ckv build/ckv --preset qwen25
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PRESETS = {"smollm2": "smollm2-135m-instruct-q4_1.gguf", "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}


def ckv_logits(ckv: Path, model: Path, ids: list[int], wdtype: str, n_vocab: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as td:
        dump = Path(td) / "logits.f32"
        subprocess.run([str(ckv), "generate", "--model", str(model), "--prompt-ids", ",".join(map(str, ids)),
                        "--max-new-tokens", "1", "--threads", "2", "--weights-dtype", wdtype, "--dump-logits", str(dump)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return np.fromfile(dump, dtype="<f4")[:n_vocab]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckv", type=Path, default=REPO / "build" / "ckv")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="qwen25")
    ap.add_argument("--tol", type=float, default=5e-3, help="max |logit diff| of the f32 path")
    ap.add_argument("--tol-auto", type=float, default=0.5, help="max |logit diff| of the weights-as-stored path")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    model = REPO / "models" / PRESETS[args.preset]
    fixture = json.loads((REPO / "tests" / "fixtures" / "gguf" / f"{args.preset}_llamacpp.json").read_text())
    hf = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, torch_dtype=torch.float32)
    hf.eval()
    status = 0
    for p in fixture["prompts"]:
        ids = p["prompt_ids"]
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0, -1].double().numpy()
        for wdtype, tol in (("f32", args.tol), ("auto", args.tol_auto)):
            got = ckv_logits(args.ckv, model, ids, wdtype, ref.shape[0])
            diff = np.abs(got - ref)
            a, b = int(np.argmax(got)), int(np.argmax(ref))
            margin = float(ref[b] - ref[a])  # how far transformers ranks ckv's pick below its own
            # the f32 path must pick the same token; the as-stored path may differ only at a near-tie,
            # a margin within twice its largest logit difference
            same = a == b or (wdtype == "auto" and margin <= 2 * diff.max())
            ok = diff.max() <= tol and same
            status |= 0 if ok else 1
            tie = f", a near-tie: transformers' margin {margin:.3f}" if a != b else ""
            print(f"{'ok  ' if ok else 'FAIL'} {p['name']} --weights-dtype {wdtype}: max |ckv - transformers| "
                  f"{diff.max():.2e} (bound {tol:g}) over {ref.shape[0]} logits (std {ref.std():.2f}), argmax "
                  f"{a} / {b}{tie}")
    return status


if __name__ == "__main__":
    sys.exit(main())
