#!/usr/bin/env python3
"""CPU benchmark: ckv vs llama.cpp (llama-cpp-python) on the same GGUF files, alternated in one run.

For every model and context length: a prompt of --contexts random ids (seeded), then
  (a) ckv:       <ckv> generate --model F --prompt-ids-file P --max-new-tokens N --threads T
                 --ignore-eos --weights-dtype auto --stats-json OUT.json
  (b) llama.cpp: in a child process (the interpreter of --llama-python, which has llama_cpp):
                 Llama(F, n_ctx, n_batch = n_ubatch = 512, n_threads = T), one timed eval of the
                 prompt (prefill), then N timed greedy steps (decode),
each --repeats times, the order of (a) and (b) swapped every repeat. Also measures the machine's
read bandwidth (tools/bench/read_bw.c, compiled here) at the start and the end, and gives each
decode figure as a fraction of its roofline: bandwidth / bytes streamed per token (the weight
bytes; the KV cache at these lengths is below 1% of them).

Models (--models, comma separated): smollm2-q4_1 (models/smollm2-135m-instruct-q4_1.gguf),
smollm2-q8_0 (a Q8_0 conversion of it made here with llama.cpp's quantizer through llama_cpp,
cached under the output directory) and qwen25-q4_k_m (models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf).

Prints a markdown table (ranges over the repeats: the machine may be shared, so single figures are
noisy) and writes PREFIX.json (every run) and PREFIX.md (the table). Numbers are reported, never
asserted.

Example:
  /path/to/venv-with-llama_cpp/bin/python tools/bench/bench_llamacpp.py --ckv build/ckv --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MODELS = {
    "smollm2-q4_1": ("SmolLM2-135M-Instruct Q4_1", "models/smollm2-135m-instruct-q4_1.gguf"),
    "smollm2-q8_0": ("SmolLM2-135M-Instruct Q8_0 (converted)", None),
    "qwen25-q4_k_m": ("Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
}

# Runs under --llama-python: argv = model, ids file, n_new, threads, n_ctx; prints one JSON line.
LLAMA_CHILD = r"""
import json, sys, time
import numpy as np
import llama_cpp
model, ids_file, n_new, threads, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ids = [int(t) for t in open(ids_file).read().split(",")]
llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                      n_threads_batch=threads, logits_all=False, seed=0, verbose=False)
t0 = time.perf_counter()
llm.eval(ids)
t1 = time.perf_counter()
n_vocab = llm.n_vocab()
for _ in range(n_new):  # greedy on the last position's logits (logits_all=False keeps only those)
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
    llm.eval([int(np.argmax(logits))])
t2 = time.perf_counter()
rss = 0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        rss = int(line.split()[1]) * 1024
print(json.dumps({"prefill_tokens": len(ids), "prefill_s": t1 - t0, "decode_tokens": n_new, "decode_s": t2 - t1,
                  "peak_rss_bytes": rss, "version": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode()}))
"""

QUANTIZE_CHILD = r"""
import ctypes, sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
params.allow_requantize = True
params.nthread = 2
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params))
sys.exit(1 if rc else 0)
"""


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    print(f"bench_llamacpp: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_bandwidth(outdir: Path, threads: int) -> float:
    exe = outdir / "read_bw"
    src = REPO / "tools" / "bench" / "read_bw.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["cc", "-O3", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe), str(threads), "1024"], check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["read_gb_s"])


def model_path(key: str, args) -> Path:
    if key != "smollm2-q8_0":
        p = REPO / MODELS[key][1]
        if not p.exists():
            die(f"{p} is missing: run tools/models/fetch_smollm2.sh / fetch_qwen25_coder.sh")
        return p
    dst = args.outdir / "smollm2-135m-instruct-q8_0.gguf"
    if not dst.exists():
        src = model_path("smollm2-q4_1", args)
        log(f"converting {src.name} to Q8_0 with llama.cpp's quantizer -> {dst}")
        subprocess.run([args.llama_python, "-c", QUANTIZE_CHILD, str(src), str(dst)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dst


def run_ckv(args, model: Path, ids_file: Path, ctx: int) -> dict:
    with tempfile.TemporaryDirectory() as td:
        stats = Path(td) / "stats.json"
        cmd = [str(args.ckv), "generate", "--model", str(model), "--prompt-ids-file", str(ids_file),
               "--max-new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--ignore-eos",
               "--weights-dtype", "auto", "--stats-json", str(stats)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s = json.loads(stats.read_text())
    # ckv counts the first generated token in the prefill; decode = the remaining steps
    return {"prefill_tok_s": s["prefill_tokens"] / s["prefill_s"], "decode_tok_s": s["decode_tok_s"],
            "peak_rss_bytes": s["peak_rss_bytes"], "weight_bytes": s.get("weight_bytes", 0)}


def run_llama(args, model: Path, ids_file: Path, ctx: int) -> dict:
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    out = subprocess.run([args.llama_python, "-c", LLAMA_CHILD, str(model), str(ids_file), str(args.new_tokens),
                          str(args.threads), str(ctx + args.new_tokens + 16)],
                         check=True, capture_output=True, text=True, env=env).stdout
    s = json.loads(out.strip().splitlines()[-1])
    return {"prefill_tok_s": s["prefill_tokens"] / s["prefill_s"], "decode_tok_s": s["decode_tokens"] / s["decode_s"],
            "peak_rss_bytes": s["peak_rss_bytes"], "version": s["version"], "system_info": s["system_info"]}


def span(vals: list[float], fmt: str) -> str:
    lo, hi = min(vals), max(vals)
    return (fmt % lo) if abs(hi - lo) <= 0.005 * max(abs(hi), 1e-9) else f"{fmt % lo}-{fmt % hi}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckv", type=Path, default=REPO / "build" / "ckv")
    ap.add_argument("--llama-python", default=sys.executable, help="a Python that imports llama_cpp")
    ap.add_argument("--models", default="smollm2-q4_1,smollm2-q8_0,qwen25-q4_k_m")
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outdir", type=Path, default=REPO / "build" / "bench")
    args = ap.parse_args()
    if not args.ckv.exists():
        die(f"{args.ckv}: no ckv binary (build it first)")
    args.outdir.mkdir(parents=True, exist_ok=True)
    keys = [k for k in args.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            die(f"--models: unknown model '{k}' (known: {', '.join(MODELS)})")
    contexts = [int(c) for c in args.contexts.split(",") if c]
    paths = {k: model_path(k, args) for k in keys}
    rng = random.Random(args.seed)
    prompts = {}
    for c in contexts:
        p = args.outdir / f"prompt_{c}.txt"
        p.write_text(",".join(str(rng.randrange(100, 40000)) for _ in range(c)))
        prompts[c] = p

    bw = [read_bandwidth(args.outdir, args.threads)]
    log(f"read bandwidth {bw[0]:.2f} GB/s ({args.threads} threads)")
    runs = []
    for rep in range(args.repeats):
        for k in keys:
            for c in contexts:
                order = ["ckv", "llama.cpp"] if rep % 2 == 0 else ["llama.cpp", "ckv"]
                for who in order:
                    t0 = time.perf_counter()
                    r = (run_ckv if who == "ckv" else run_llama)(args, paths[k], prompts[c], c)
                    r.update(engine=who, model=k, context=c, repeat=rep, wall_s=time.perf_counter() - t0)
                    runs.append(r)
                    log(f"rep {rep} {k} ctx {c} {who}: prefill {r['prefill_tok_s']:.1f} tok/s, decode "
                        f"{r['decode_tok_s']:.2f} tok/s, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")
    bw.append(read_bandwidth(args.outdir, args.threads))
    log(f"read bandwidth at the end {bw[1]:.2f} GB/s")
    version = next((r["version"] for r in runs if r["engine"] == "llama.cpp"), "?")
    sysinfo = next((r["system_info"] for r in runs if r["engine"] == "llama.cpp"), "?")

    lines = [f"read bandwidth {min(bw):.2f}-{max(bw):.2f} GB/s ({args.threads} threads); llama-cpp-python {version} "
             f"({sysinfo.strip()}); {args.threads} threads, {args.new_tokens} decode tokens, {args.repeats} "
             f"alternated repeats (ranges)", "",
             "| model | context | prefill ckv tok/s | prefill llama.cpp tok/s | prefill ratio | decode ckv tok/s | "
             "decode llama.cpp tok/s | decode ratio | ckv decode / roofline | peak RSS ckv / llama.cpp MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in keys:
        size = paths[k].stat().st_size
        for c in contexts:
            a = [r for r in runs if r["model"] == k and r["context"] == c and r["engine"] == "ckv"]
            b = [r for r in runs if r["model"] == k and r["context"] == c and r["engine"] == "llama.cpp"]
            pa, pb = [r["prefill_tok_s"] for r in a], [r["prefill_tok_s"] for r in b]
            da, db = [r["decode_tok_s"] for r in a], [r["decode_tok_s"] for r in b]
            wbytes = max(r["weight_bytes"] for r in a) or size
            roof = [d / (max(bw) * 1e9 / wbytes) for d in da]
            ratio_p = span([x / y for x, y in zip(pa, pb)], "%.2f")
            ratio_d = span([x / y for x, y in zip(da, db)], "%.2f")
            lines.append(f"| {MODELS[k][0]} | {c} | {span(pa, '%.1f')} | {span(pb, '%.1f')} | {ratio_p}x | "
                         f"{span(da, '%.2f')} | {span(db, '%.2f')} | {ratio_d}x | {span(roof, '%.2f')} | "
                         f"{span([r['peak_rss_bytes'] / 2**20 for r in a], '%.0f')} / "
                         f"{span([r['peak_rss_bytes'] / 2**20 for r in b], '%.0f')} |")
    table = "\n".join(lines)
    print(table)
    prefix = args.outdir / "bench_llamacpp"
    Path(f"{prefix}.md").write_text(table + "\n")
    Path(f"{prefix}.json").write_text(json.dumps({"runs": runs, "read_gb_s": bw, "machine": platform.platform(),
                                                  "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    log(f"wrote {prefix}.md and {prefix}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
