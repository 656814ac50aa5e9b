#!/usr/bin/env python3
"""A pure-Python/torch port of HeadKV's per-head budget allocation (FYYFU/HeadKV, ReasonSnapKVCluster
in headkv/snapkv_utils.py), written from reading the official code, not copied from it; and ckv's
KV-head form of it (src/evict/headkv.c implements the same).

The official allocation (per QUERY head: HeadKV repeats K/V to the query heads and keeps a cache
per query head):
    imp[l, h]  = np.mean(retrieval-score list of "l-h")       (file order, reshaped [layers, heads])
    p          = imp / sum(imp);  p = p ** temp;  p = p / sum(p)
    base       = max_capacity_prompt - window                  (tokens beside the window)
    pool       = (base // beta) * n_layers * n_heads           (Python float floor division)
    min_num    = base - base // beta
    capacity   = round(p * pool + min_num)                     (torch.round: half to even)
    head h keeps its top min(capacity, L - window) non-window tokens plus the window;
    when base > L - window nothing is compressed.
Before rounding the capacities sum to n_layers * n_heads * base: the total is the uniform one.

ckv (per KV head): the profile holds one importance per (layer, KV head) - tools/oracle/headkv_profile.py
averages the official per-query-head values over each group - and the same formula runs with
n_heads = Hkv, base = n_kept_mean - window where n_kept_mean is ckv's per-head kept count (the window
included, like HeadKV's max_capacity_prompt) and window is the base scorer's protected tail (snapkv:
its window; 0 for scorers without one). budget = min(capacity, L - window) + window, clamped to
[1, L]; n_kept_mean - window < 0 gives every head n_kept_mean; base > L - window keeps everything.

Defaults: beta 1.5 and temp 1 (run_longbench.py's argument defaults; the README sweeps beta over
1.005 .. 10).

Usage:
  headkv_reference.py --c-cases            print the budgets hard-coded in tests/unit/test_evict_defensive.c
  headkv_reference.py --official DIR       check the port against ReasonSnapKVCluster of a HeadKV checkout
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

DEFAULT_BETA = 1.5
DEFAULT_TEMP = 1.0


def py_floordiv(a: float, b: float) -> float:
    """Python's float a // b (what HeadKV's `base_capacity // beta` evaluates)."""
    return float(a // b)


def normalise(imp, temp: float) -> torch.Tensor:
    """HeadKV: p = imp / sum (numpy float64, Python sum), p ** temp, renormalised (torch float64)."""
    arr = np.asarray(imp, dtype=np.float64).reshape(-1)
    p = torch.tensor(arr / sum(arr.tolist()))
    p = torch.pow(p, temp)
    return p / torch.sum(p)


def official_capacity(imp, n_layers: int, n_heads: int, max_capacity_prompt: int, window: int,
                      beta: float, temp: float) -> torch.Tensor:
    """ReasonSnapKVCluster's head_capacity [n_layers, n_heads] (tokens beside the window)."""
    p = normalise(imp, temp).reshape(n_layers, n_heads)
    base = max_capacity_prompt - window
    pool = py_floordiv(base, beta) * n_layers * n_heads
    min_num = base - py_floordiv(base, beta)
    return torch.round(p * pool + min_num).int()


def kv_importance(per_query_head, n_kv: int) -> np.ndarray:
    """[n_layers, H] -> [n_layers, Hkv]: mean over the G query heads of each KV head (h // G)."""
    a = np.asarray(per_query_head, dtype=np.float64)
    n_layers, H = a.shape
    if H % n_kv:
        raise ValueError(f"{H} query heads are not a multiple of {n_kv} KV heads")
    return a.reshape(n_layers, n_kv, H // n_kv).mean(-1)


def ckv_budgets(kv_imp, L: int, n_kept_mean: int, window: int = 0, beta: float = DEFAULT_BETA,
                temp: float = DEFAULT_TEMP) -> list[list[int]]:
    """ckv's budgets [n_layers][Hkv] (kept rows per KV head, window included)."""
    a = np.asarray(kv_imp, dtype=np.float64)
    n_layers, n_kv = a.shape
    base = n_kept_mean - window
    if base < 0:
        cap = np.full((n_layers, n_kv), n_kept_mean)
    elif base > L - window:
        cap = np.full((n_layers, n_kv), L)
    else:
        c = official_capacity(a, n_layers, n_kv, n_kept_mean, window, beta, temp).numpy().astype(np.int64)
        cap = np.minimum(c, L - window) + window
    return np.clip(cap, 1, L).astype(int).tolist()


# ---- cases hard-coded in tests/unit/test_evict_defensive.c ---------------------------------------

C_PROFILE = [[0.9, 0.1, 0.0], [0.25, 0.5, 0.35], [0.05, 0.3, 0.6], [0.2, 0.2, 0.2]]  # 4 layers x 3 KV heads
C_CASES = [  # (L, n_kept_mean, window, beta, temp)
    (300, 150, 0, 1.5, 1.0),
    (300, 150, 32, 1.5, 1.0),
    (300, 75, 64, 1.005, 1.0),
    (300, 150, 64, 1.2, 2.0),
    (1000, 100, 8, 1.5, 0.5),
    (120, 110, 16, 1.01, 1.0),  # large shares capped at L - window
    (300, 29, 64, 1.5, 1.0),  # n_kept below the window: uniform
    (50, 60, 8, 1.5, 1.0),  # base above L - window: everything
    (300, 2, 0, 1.0, 1.0),  # beta 1: min_num 0, a zero-importance head clamped to 1
]


def print_c_cases() -> None:
    print("/* generated by: .venv-oracle/bin/python tools/oracle/headkv_reference.py --c-cases */")
    for L, n, w, beta, temp in C_CASES:
        b = ckv_budgets(C_PROFILE, L, n, w, beta, temp)
        flat = [x for row in b for x in row]
        print(f"{{{L}, {n}, {w}, {beta!r}, {temp!r}, {{{', '.join(map(str, flat))}}}}},  /* sum {sum(flat)} */")


# ---- check against the official code -------------------------------------------------------------

def check_official(root: Path) -> int:
    """Instantiates ReasonSnapKVCluster from a HeadKV checkout (it reads
    Important_Head/head_score/Meta-Llama-3-8B-Instruct_*.json itself) and compares its
    head_capacity with official_capacity() on the same file."""
    sys.path.insert(0, str(root))
    from headkv.snapkv_utils import ReasonSnapKVCluster  # the official class

    bad = 0
    for choice, fname in (("copy", "Meta-Llama-3-8B-Instruct_retrieval_heads.json"),
                          ("reason", "Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json")):
        imp = load_official_importance(root / "Important_Head" / "head_score" / fname)
        for cap, window, beta, temp in ((128, 32, 1.005, 1.0), (128, 8, 1.5, 1.0), (512, 8, 1.2, 1.0),
                                        (2048, 32, 2.0, 1.0), (256, 8, 1.1, 2.0), (64, 8, 10.0, 0.5)):
            off = ReasonSnapKVCluster(window_size=window, base_capacity=cap, head_choice=choice, beta=beta,
                                      temp=temp, layer_idx=0, num_hidden_layers=32, num_attention_heads=32,
                                      model="meta-llama/Meta-Llama-3-8B-Instruct").head_capacity
            mine = official_capacity(imp["scores"], 32, 32, cap, window, beta, temp)
            same = torch.equal(off.to(torch.int64), mine.to(torch.int64))
            bad += not same
            print(f"[headkv_reference] {choice} cap {cap} window {window} beta {beta} temp {temp}: "
                  f"{'identical' if same else 'DIFFERENT'} (sum {int(mine.sum())}, "
                  f"uniform {32 * 32 * (cap - window)})")
    return 1 if bad else 0


def load_official_importance(path: Path) -> dict:
    """HeadKV's importance file: one JSON object on its first line, {"layer-head": [scores...]}.
    Returns {"scores": [n_layers, n_heads] float64 of np.mean(list), "n_layers", "n_heads"}.
    HeadKV itself reads the values in the file's key order and reshapes; the published files are in
    layer-major order, which is checked here (keys are parsed, and must be complete)."""
    with open(path) as f:
        obj = json.loads(f.readline())
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{path}: expected a JSON object {{\"layer-head\": [scores]}} on its first line")
    entries = []
    for key, vals in obj.items():
        try:
            layer, head = (int(x) for x in key.split("-"))
        except ValueError:
            raise ValueError(f"{path}: key '{key}' is not 'layer-head'") from None
        if not isinstance(vals, list) or not vals:
            raise ValueError(f"{path}: '{key}' has no scores")
        entries.append((layer, head, float(np.mean(vals))))
    n_layers = max(e[0] for e in entries) + 1
    n_heads = max(e[1] for e in entries) + 1
    if len(entries) != n_layers * n_heads or len({(e[0], e[1]) for e in entries}) != len(entries):
        raise ValueError(f"{path}: {len(entries)} entries do not cover {n_layers} layers x {n_heads} heads once")
    file_order = [(e[0], e[1]) for e in entries]
    if file_order != [(l, h) for l in range(n_layers) for h in range(n_heads)]:
        print(f"[headkv_reference] note: {path} is not in layer-major key order; HeadKV would reshape the "
              f"values in file order, ckv uses the parsed keys", file=sys.stderr)
    scores = np.zeros((n_layers, n_heads))
    for layer, head, v in entries:
        scores[layer, head] = v
    return {"scores": scores, "n_layers": n_layers, "n_heads": n_heads}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--c-cases", action="store_true")
    ap.add_argument("--official", type=Path, help="root of a FYYFU/HeadKV checkout")
    args = ap.parse_args()
    if args.c_cases:
        print_c_cases()
    if args.official:
        return check_official(args.official)
    if not args.c_cases and not args.official:
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
