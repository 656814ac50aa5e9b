#!/usr/bin/env python3
"""The time-to-first-token cost of presses against the full cache, beside each press's roofline floor.

Alternated (default): a seeded prompt of --context ids; then, --repeats times, for every press in
--presses: `ckv generate` with the full cache, then with the press (--compression-ratio, default
0.5), each once, alternated, so the pair sees the same machine state. Per pair the overhead is
ttft(press) / ttft(full) - 1 (ttft_s of --stats-json: prefill + scoring + selection + compaction +
the first token); the table gives the median over the repeats and the eviction share evict_s / ttft_s.

--sweep: one `ckv fidelity` run per model (one full-cache prefill of the first --context tokens of
--text-file, then every press derived from it, each one's eviction timed: prefill_s, evict_s and
score_s of its --out lines), so every press costs one eviction instead of one prefill; the list of
presses is evicted --repeats times in rounds, and a press's evict_s is the median of its rounds (a
scheduler's slice on a shared machine moves a few-millisecond eviction by 2x; the median of three
does not); its share of TTFT is evict_s / (prefill_s + evict_s), measured against a prefill of the
same process and run.

The floor is a roofline: the larger of two times, each as a share of TTFT, t / (prefill_s + t):
  FLOP floor: the press's own arithmetic f (below) at the prefill's multiply-add rate, t = f / (p /
    prefill_s), i.e. f / (p + f), with p the prefill's multiply-adds: (non-embedding parameters) x L, the
    token table and an untied output head excluded (the prefill computes one token's logits), + the causal
    attention's L^2 x layers x heads x head_dim (QK^T and PV over half the keys each);
  byte floor: the bytes any implementation must move, at the read bandwidth measured in the same run
    (tools/bench/read_bw.c, THREADS threads summing 1 GiB, best of 5 passes, run before every ckv run
    and after the last; the median is used): the scoring's one read of the cache it scores (keys, over
    all L rows of every layer's KV heads; values too for the presses that read them: the value-norm
    wrappers below, defensivekv, layer_defensivekv, lagkv's and cur's value statistics, kvzip's replay) plus the compaction's read and write
    of the kept rows' keys and values (2 x 2 x kept x Hkv x d x 4 bytes per layer; 4: the CPU cache's
    default f32, which these ckv runs use). Writes are priced at the read bandwidth.
streaming_llm and random have no FLOP floor, only the compaction's bytes. "share / floor" is how far
the measured eviction share (selection and compaction included) is from the binding floor; "binds" names it.

Floors per layer, multiply-adds (L tokens, D hidden, H query heads, Hkv KV heads, d head_dim, w the
window, k = 48), from what each scorer reads and computes (docs/presses.md, docs/benchmarks.md):
  snapkv, pyramidkv (w 64), snapkv_paper, defensivekv, layer_defensivekv (w 32), tova (w 1):
                     w L H d                  (the window's logits on every key; the window's queries are the
                     forward's own, which the scorers take from the prefill, so their q_proj w D H d is
                     not the press's work)
  observed_attention L D H d + L^2 H d / 2
  expected_attention L D H d + 1.5 L H d^2    (queries, their moments, the covariance term per key)
  knorm L d Hkv; keydiff 3 L d Hkv; lagkv 8 L d Hkv; cur 2 L d Hkv; leverage (2 L d k + L k^2) Hkv
  streaming_llm, random: none (selection only: the compaction's bytes are their floor)
  critical:, critical_adakv:, critical_headkv:, defensivekv and layer_defensivekv add the value norms L H d D
  compactor: L D H d + L 256 H d + leverage's   (queries, logits within chunks of 256, the sketch)
  adakv:, headkv:, chunkkv: add nothing (budgets or chunk ranks from the same scores)
  key_rerotation: adds L d Hkv (at most L kept keys rotated)
  kvzip: its replay forward (per chunk of C tokens, R = prompt + suffix + C rows: the weights, attention
         over L + R / 2 keys) and its scores' logits R (n_sink + C + R / 2) H d (alternated runs only: a
         sweep cannot derive it; its prompts' ids by --press-opt, as ckv takes them)

Usage: tools/bench/bench_press_cost.py --ckv build/ckv --model M.gguf [--model N.gguf]
       [--context 4096] [--threads 2] [--repeats 2] [--presses keydiff,lagkv,cur,leverage]
       [--sweep [--text-file data/haystack/essay.txt]] [--press-opt KEY=VALUE ...]
Prints a markdown table; writes nothing else (read_bw is compiled into a temporary folder). Speeds
are only ever compared within one run.
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

from bench_llamacpp import read_bandwidth

WINDOW = {"snapkv": 64, "pyramidkv": 64, "snapkv_paper": 32, "defensivekv": 32, "layer_defensivekv": 32, "tova": 1}
NO_FLOOR = ("streaming_llm", "random")
READS_V = ("kvzip", "lagkv", "cur")  # scorers that read the values too, without value norms' FLOPs
# 1: value norms; chunkkv ranks chunk means (L Hkv additions: no floor of its own); key_rerotation: below
WRAPPERS = {"critical": 1, "critical_adakv": 1, "critical_headkv": 1, "adakv": 0, "headkv": 0, "chunkkv": 0,
            "key_rerotation": 0}
COMPACTOR_CHUNK = 256  # kvpress CompactorPress's default chunk_size
KV_BYTES = 4  # the CPU cache's default element type, f32 (these runs pass no --kv-dtype)


def kvzip_mac(L: int, sh: dict, opts: dict) -> int:
    """kvzip's replay forward and its scores' logits, per layer (weights counted by the caller's body)."""
    H, d = sh["heads"], sh["d"]
    ids = {k: len([x for x in opts.get(k, "").replace("[", "").replace("]", "").split(",") if x.strip()])
           for k in ("repeat_ids", "repeat_next_ids", "suffix_ids")}
    if not ids["repeat_ids"] or not ids["suffix_ids"]:
        die("kvzip: give its prompts with --press-opt repeat_ids=... repeat_next_ids=... suffix_ids=...")
    C, n_sink = int(opts.get("chunk_size", 2048)), int(opts.get("n_sink", 4))
    mac = 0
    for start in range(0, L, C):
        c = min(C, L - start)
        r = (ids["repeat_ids"] if start == 0 else ids["repeat_next_ids"] + 8) + ids["suffix_ids"] + c
        mac += sh["body"] * r // sh["layers"]        # the replay's weights (per layer)
        mac += 2 * r * (L + r // 2) * H * d          # its attention over the context and itself (QK^T, PV)
        mac += r * (min(n_sink, start) + c + r // 2) * H * d  # the scores' logits (sinks, chunk, replay)
    return mac


def floor_mac(press: str, L: int, sh: dict, opts: dict | None = None) -> int | None:
    """The press's multiply-adds over the whole model (None: no arithmetic floor), or exit on an unknown press."""
    wrapper, _, base = press.rpartition(":")
    D, H, Hkv, d, k = sh["hidden"], sh["heads"], sh["kv"], sh["d"], 48
    if wrapper and wrapper not in WRAPPERS:
        die(f"--presses: no FLOP floor for wrapper '{wrapper}' (known: {', '.join(WRAPPERS)})")
    if base in WINDOW:
        w = WINDOW[base]
        mac = w * L * H * d
    elif base == "observed_attention":
        mac = L * D * H * d + L * L * H * d // 2
    elif base == "expected_attention":
        mac = L * D * H * d + 3 * L * H * d * d // 2
    elif base in ("knorm", "keydiff", "lagkv", "cur"):
        mac = {"knorm": 1, "keydiff": 3, "lagkv": 8, "cur": 2}[base] * L * d * Hkv
    elif base == "leverage":
        mac = (2 * L * d * k + L * k * k) * Hkv
    elif base == "compactor":  # queries, their logits within chunks, and leverage's sketch
        mac = L * D * H * d + L * COMPACTOR_CHUNK * H * d + (2 * L * d * k + L * k * k) * Hkv
    elif base == "kvzip":
        mac = kvzip_mac(L, sh, opts or {})
    elif base in NO_FLOOR:
        mac = 0
    else:
        die(f"--presses: no FLOP floor for '{base}'")
    if reads_values(press):
        mac += L * H * d * D
    if wrapper == "key_rerotation":  # at most L kept keys rotated: d multiply-adds each (sin/cos not counted)
        mac += L * d * Hkv
    return mac * sh["layers"] if mac else None


def reads_values(press: str) -> bool:
    """Whether the press's scores use the values (their norms), besides the keys."""
    wrapper, _, base = press.rpartition(":")
    return bool(WRAPPERS.get(wrapper, 0)) or base in ("defensivekv", "layer_defensivekv")


def floor_bytes(press: str, L: int, kept: int, sh: dict) -> int:
    """The bytes any implementation moves: one read of the scored cache rows, the kept rows' K and V
    read and written by the compaction (KV_BYTES each element)."""
    base = press.rpartition(":")[2]
    row = sh["kv"] * sh["d"] * KV_BYTES  # one position of one layer's K (or V), all KV heads
    scored = 0 if base in NO_FLOOR else (2 if reads_values(press) or base in READS_V else 1) * L * row
    return (scored + 2 * 2 * kept * row) * sh["layers"]


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
                params=num(r"parameters\s+(\d+)"), tied=bool(re.search(r"vocabulary\s+\d+ \(tied embeddings\)", out)))


def run(ckv: str, model: str, ids_file: Path, threads: int, press: str | None, cr: float, tmp: Path,
        press_opts: list | None = None) -> dict:
    stats = tmp / "stats.json"
    cmd = [ckv, "generate", "--model", model, "--prompt-ids-file", str(ids_file), "--max-new-tokens", "1",
           "--threads", str(threads), "--ignore-eos", "--stats-json", str(stats)]
    if press:
        cmd += ["--press", press, "--compression-ratio", str(cr)]
        for o in press_opts or []:
            cmd += ["--press-opt", o]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    return json.loads(stats.read_text())


def sweep(ckv: str, model: str, text: str, context: int, threads: int, presses: list, budget: float,
          tmp: Path, rounds: int) -> dict:
    """One `ckv fidelity` prefill, every press derived from it `rounds` times (the whole list once per round,
    so a press's evictions are spread over the run): {press: (prefill_s, median evict_s, median score_s)}."""
    out = tmp / "fidelity.jsonl"
    cmd = [ckv, "fidelity", "--model", model, "--text-file", text, "--context", str(context), "--continuation", "2",
           "--threads", str(threads), "--press", ",".join(presses * rounds), "--budget", str(budget), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    runs = {}
    for line in out.read_text().splitlines():
        r = json.loads(line)
        runs.setdefault(r["press"], []).append((r["prefill_s"], r["evict_s"], r["score_s"]))
    short = [x for x in presses if len(runs.get(x, [])) != rounds]
    if short:
        die(f"ckv fidelity did not write {rounds} lines (one per round) for {', '.join(short)}")
    return {x: (r[0][0], statistics.median(e for _, e, _ in r), statistics.median(s for _, _, s in r))
            for x, r in runs.items()}


def floor_cells(share: float, prefill_s: float, flop_s: float | None, byte_s: float) -> str:
    """FLOP floor | byte floor | binds | share / floor, each floor a share of TTFT t / (prefill_s + t)."""
    fl = None if flop_s is None else flop_s / (prefill_s + flop_s)
    by = byte_s / (prefill_s + byte_s)
    bind, floor = ("FLOP", fl) if fl is not None and fl > by else ("bytes", by)
    return (f"{'-' if fl is None else f'{100 * fl:.3f}%'} | {100 * by:.3f}% | {bind} | "
            f"{share / floor:.2f}x")


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
    ap.add_argument("--sweep", action="store_true", help="time every press on one prefill (ckv fidelity)")
    ap.add_argument("--press-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of every press of --presses (ckv's --press-opt, e.g. kvzip's repeat_ids)")
    ap.add_argument("--text-file", default=str(Path(__file__).resolve().parents[2] / "data" / "haystack" / "essay.txt"))
    a = ap.parse_args()
    presses = list(dict.fromkeys(p for p in a.presses.split(",") if p))  # each once: rounds repeat them
    opts = dict(o.split("=", 1) for o in a.press_opt if "=" in o)
    if len(opts) != len(a.press_opt):
        die("--press-opt takes KEY=VALUE")
    if a.sweep and a.press_opt:
        die("--press-opt is for alternated runs (a sweep derives presses with their defaults)")
    if not presses:
        die("--presses is empty")
    if a.repeats < 1 or a.context < 2:
        die("--repeats must be >= 1 and --context >= 2")
    if not 0 < a.compression_ratio < 1:
        die(f"--compression-ratio {a.compression_ratio}: expected a value in (0, 1)")
    if a.sweep and not Path(a.text_file).is_file():
        die(f"--text-file {a.text_file}: not a file")
    if a.sweep:
        rows = ["| model | press | prefill (s) | eviction (s) | share of TTFT | scoring share | FLOP floor | byte floor | "
                "binds | share / floor |", "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    else:
        rows = ["| model | press | TTFT full (s) | TTFT press (s) | overhead (median) | eviction share | FLOP floor | "
                "byte floor | binds | share / floor |", "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    bws = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for model in a.model:
            sh = model_shape(a.ckv, model)
            L = a.context
            # non-embedding: the token table, and an untied output head (the prefill computes the logits of
            # one token, not of all L)
            body = sh["params"] - (1 if sh["tied"] else 2) * sh["vocab"] * sh["hidden"]
            sh["body"] = body
            prefill_mac = body * L + L * L * sh["layers"] * sh["heads"] * sh["d"]  # causal QK^T and PV: 2 x L^2 / 2
            macs = {p: floor_mac(p, L, sh, opts) for p in presses}
            kept = int(L * (1.0 - a.compression_ratio))
            nbytes = {p: floor_bytes(p, L, kept, sh) for p in presses}
            name = Path(model).name

            def cells(p: str, share: float, prefill_s: float, bw: float) -> str:
                flop_s = macs[p] * prefill_s / prefill_mac if macs[p] else None  # at the prefill's rate
                return floor_cells(share, prefill_s, flop_s, nbytes[p] / (bw * 1e9))

            if a.sweep:
                bws.append(read_bandwidth(tmp, a.threads))
                got = sweep(a.ckv, model, a.text_file, L, a.threads, presses, 1.0 - a.compression_ratio, tmp,
                            a.repeats)
                bws.append(read_bandwidth(tmp, a.threads))
                bw = statistics.median(bws[-2:])
                for p in presses:
                    pre, ev, sc = got[p]
                    share = ev / (pre + ev)
                    rows.append(f"| {name} | {p} | {pre:.2f} | {ev:.4f} | {100 * share:.2f}% | "
                                f"{100 * sc / (pre + ev):.2f}% | {cells(p, share, pre, bw)} |")
                continue
            rng = random.Random(a.seed)
            ids = [rng.randrange(4, min(sh["vocab"], 32000)) for _ in range(a.context)]
            ids_file = tmp / "ids.txt"
            ids_file.write_text(",".join(map(str, ids)))
            res = {p: [] for p in presses}
            first = len(bws)
            for _ in range(a.repeats):
                for p in presses:
                    bws.append(read_bandwidth(tmp, a.threads))
                    full = run(a.ckv, model, ids_file, a.threads, None, a.compression_ratio, tmp)
                    got = run(a.ckv, model, ids_file, a.threads, p, a.compression_ratio, tmp, a.press_opt)
                    if not got.get("compressed"):
                        die(f"{p} did not compress: {got.get('uncompressed_reason')}")
                    res[p].append((full["ttft_s"], got["ttft_s"], got["evict_s"]))
            bws.append(read_bandwidth(tmp, a.threads))
            bw = statistics.median(bws[first:])
            for p in presses:
                r = res[p]
                over = statistics.median(g / f - 1.0 for f, g, _ in r)
                share = statistics.median(e / g for _, g, e in r)
                full_s = statistics.median(f for f, _, _ in r)
                rows.append(f"| {name} | {p} | {full_s:.2f} | "
                            f"{statistics.median(g for _, g, _ in r):.2f} | {100 * over:+.1f}% | {100 * share:.2f}% | "
                            f"{cells(p, share, full_s, bw)} |")
    mode = (f"one prefill per model (ckv fidelity), every press evicted {a.repeats} times (median)" if a.sweep else
             f"{a.repeats} alternated pairs per press")
    print(f"context {a.context}, threads {a.threads}, compression ratio {a.compression_ratio}, {mode}; read bandwidth "
          f"{min(bws):.2f}-{max(bws):.2f} GB/s over {len(bws)} probes (median per model used for the byte floor)")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
