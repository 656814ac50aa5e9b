#!/usr/bin/env python3
"""The time-to-first-token cost of presses against the full cache, beside each press's FLOP floor.

One run: a seeded prompt of --context ids; then, --repeats times, for every press in --presses:
`ckv generate` with the full cache, then with the press (--compression-ratio, default 0.5), each
once, alternated, so the pair sees the same machine state. Per pair the overhead is
ttft(press) / ttft(full) - 1 (ttft_s of --stats-json: prefill + scoring + selection + compaction +
the first token); the table gives the median over the repeats, the scoring share evict_s / ttft_s,
and the floor: the press's own arithmetic (below) over the prefill's 2 x (non-embedding parameters)
x L + the causal attention's 2 x L^2 x layers x heads x head_dim multiply-adds (x 2 for FLOPs).

Floors per layer and KV head, multiply-adds (L tokens, d head_dim), from what each op reads and
computes (docs/presses.md "Cost of the attention-free presses"):
  keydiff  3 L d             (norms, anchor, dot)
  lagkv    8 L d             (keys and values: range, normalise, spread)
  cur      2 L d             (key and value norms)
  leverage 2 L d k + L k^2   (sketch twice, Gram, one triangular solve per token; k = 48)

Usage: tools/bench/bench_press_cost.py --ckv build/ckv --model M.gguf [--model N.gguf]
       [--context 4096] [--threads 2] [--repeats 2] [--presses keydiff,lagkv,cur,leverage]
Prints a markdown table; writes nothing else. Speeds are only ever compared within one run.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FLOOR_MAC = {  # per layer and KV head, multiply-adds (L, d, k)
    "keydiff": lambda L, d, k: 3 * L * d,
    "lagkv": lambda L, d, k: 8 * L * d,
    "cur": lambda L, d, k: 2 * L * d,
    "leverage": lambda L, d, k: 2 * L * d * k + L * k * k,
}


def die(msg: str) -> None:
    print(f"bench_press_cost: {msg}", file=sys.stderr)
    sys.exit(1)


def model_shape(ckv: str, model: str) -> dict:
    """layers, heads, KV heads, head_dim, hidden, vocab and parameters from `ckv inspect`."""
    p = subprocess.run([ckv, "inspect", "--model", model], capture_output=True, text=True)
    if p.returncode != 0:
        die(f"ckv inspect --model {model} failed: {p.stderr.strip()[-400:]}")
    out = p.stdout
    def num(pat: str) -> int:
        m = re.search(pat, out)
        if not m:
            die(f"ckv inspect: no '{pat}' in its output")
        return int(m.group(1))
    return dict(layers=num(r"layers\s+(\d+)"), hidden=num(r"hidden size\s+(\d+)"), heads=num(r"heads\s+(\d+) query"),
                kv=num(r"query, (\d+) KV"), d=num(r"head_dim (\d+)"), vocab=num(r"vocabulary\s+(\d+)"),
                params=num(r"parameters\s+(\d+)"))


def run(ckv: str, model: str, ids_file: Path, threads: int, press: str | None, cr: float, tmp: Path) -> dict:
    stats = tmp / "stats.json"
    cmd = [ckv, "generate", "--model", model, "--prompt-ids-file", str(ids_file), "--max-new-tokens", "1",
           "--threads", str(threads), "--ignore-eos", "--stats-json", str(stats)]
    if press:
        cmd += ["--press", press, "--compression-ratio", str(cr)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    return json.loads(stats.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckv", default="build/ckv")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compression-ratio", type=float, default=0.5)
    ap.add_argument("--presses", default="keydiff,lagkv,cur,leverage")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    presses = [p for p in a.presses.split(",") if p]
    for p in presses:
        if p not in FLOOR_MAC:
            die(f"--presses: no FLOP floor for '{p}' (known: {', '.join(FLOOR_MAC)})")
    if a.repeats < 1 or a.context < 2:
        die("--repeats must be >= 1 and --context >= 2")
    rows = ["| model | press | TTFT full (s) | TTFT press (s) | overhead (median) | scoring share | FLOP floor |",
            "|---|---|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for model in a.model:
            sh = model_shape(a.ckv, model)
            rng = random.Random(a.seed)
            ids = [rng.randrange(4, min(sh["vocab"], 32000)) for _ in range(a.context)]
            ids_file = tmp / "ids.txt"
            ids_file.write_text(",".join(map(str, ids)))
            L = a.context
            body = sh["params"] - sh["vocab"] * sh["hidden"]  # non-embedding (tied or not: one table)
            prefill_mac = body * L + L * L * sh["layers"] * sh["heads"] * sh["d"]  # causal QK^T and PV: 2 x L^2 / 2
            res = {p: [] for p in presses}
            for _ in range(a.repeats):
                for p in presses:
                    full = run(a.ckv, model, ids_file, a.threads, None, a.compression_ratio, tmp)
                    got = run(a.ckv, model, ids_file, a.threads, p, a.compression_ratio, tmp)
                    if not got.get("compressed"):
                        die(f"{p} did not compress: {got.get('uncompressed_reason')}")
                    res[p].append((full["ttft_s"], got["ttft_s"], got["evict_s"]))
            name = Path(model).name
            for p in presses:
                r = res[p]
                over = statistics.median(g / f - 1.0 for f, g, _ in r)
                share = statistics.median(e / g for _, g, e in r)
                floor = FLOOR_MAC[p](L, sh["d"], 48) * sh["layers"] * sh["kv"] / prefill_mac
                rows.append(f"| {name} | {p} | {statistics.median(f for f, _, _ in r):.2f} | "
                            f"{statistics.median(g for _, g, _ in r):.2f} | {100 * over:+.1f}% | {100 * share:.2f}% | "
                            f"{100 * floor:.3f}% |")
    print(f"context {a.context}, threads {a.threads}, compression ratio {a.compression_ratio}, "
          f"{a.repeats} alternated pairs per press")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
