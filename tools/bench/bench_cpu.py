#!/usr/bin/env python3
"""CPU benchmark: ckv vs Hugging Face transformers on a Qwen2.5-0.5B-shaped random-weight model.

One run: build (or reuse) the model, draw a prompt of --context random ids, then
  (a) ckv:  <ckv> generate --model DIR --prompt-ids-file F --max-new-tokens N --threads T
            --ignore-eos --stats-json OUT.json
  (b) HF:   torch.set_num_threads(T); one timed prefill forward over the prompt (logits of the last
            position only), then N timed greedy decode steps through the KV cache,
            in a child process so that its peak RSS is its own,
and print / write a table of prefill and decode tok/s of both and the ratio ckv / HF.

Example:  .venv-oracle/bin/python tools/bench/bench_cpu.py --ckv build/ckv --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Qwen2.5-0.5B shapes (Qwen2ForCausalLM, tied embeddings, q/k/v bias)
QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
    bos_token_id=151643,
    eos_token_id=151643,
)
MODEL_MARKER = "bench_model.json"  # written next to the weights: what the directory holds
STATS_KEYS = ("prefill_tokens", "prefill_s", "prefill_tok_s", "decode_tokens", "decode_s", "decode_tok_s",
              "peak_rss_bytes", "kv_bytes")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def die(msg: str, code: int = 2) -> None:
    print(f"bench_cpu: error: {msg}", file=sys.stderr)
    sys.exit(code)


# ----------------------------------------------------------------------------- model and prompt
def model_identity(args) -> dict:
    return {"shape": "qwen2.5-0.5b", "config": QWEN25_05B, "dtype": args.dtype, "seed": args.seed}


def build_model(model_dir: Path, args) -> None:
    """Random weights at O(1) activation scale (linear N(0, 1/fan_in), q/k/v bias N(0, 0.1^2),
    small tied embedding with the final norm scaled so that logits spread over a few units)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    config = Qwen2Config(**QWEN25_05B)
    torch.manual_seed(args.seed)
    with torch.no_grad():
        model = Qwen2ForCausalLM(config).to(torch.float32)
        gen = torch.Generator().manual_seed(args.seed)
        emb_std = 0.03
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                std, mean = emb_std, 0.0
            elif name == "model.norm.weight":
                mean = 3.0 / (emb_std * config.hidden_size**0.5)
                std = 0.1 * mean
            elif "norm" in name:
                std, mean = 0.1, 1.0
            elif name.endswith(".bias"):
                std, mean = 0.1, 0.0
            else:
                std, mean = 1.0 / p.shape[1] ** 0.5, 0.0
            p.copy_(torch.randn(p.shape, generator=gen) * std + mean)
        if args.dtype == "bf16":
            model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=151643, eos_token_id=[151645, 151643])
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model.save_pretrained(model_dir, safe_serialization=True)
    (model_dir / MODEL_MARKER).write_text(json.dumps(model_identity(args), indent=2) + "\n")
    log(f"built {args.dtype} model in {model_dir} ({time.perf_counter() - t0:.1f} s)")


def build_model_in_child(model_dir: Path, args) -> None:
    """The parent never imports torch: children forked from it start with a small RSS, so the peak
    RSS that ckv and the HF worker report is their own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--build-worker", str(model_dir), "--dtype", args.dtype,
           "--seed", str(args.seed)]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        die(f"building the model failed (status {p.returncode})\n--- stderr ---\n{p.stderr[-4000:]}", 1)
    sys.stderr.write(p.stderr)


def ensure_model(args, tmp_root: Path) -> Path:
    if args.keep_model:
        model_dir = Path(args.keep_model).resolve()
        marker = model_dir / MODEL_MARKER
        if marker.exists():
            try:
                same = json.loads(marker.read_text()) == json.loads(json.dumps(model_identity(args)))
            except json.JSONDecodeError:
                same = False
            if same:
                log(f"reusing model in {model_dir}")
                return model_dir
            log(f"{model_dir} holds another bench model (dtype/seed/shape differ): rebuilding it")
        elif model_dir.exists() and any(model_dir.iterdir()):
            die(f"--keep-model {model_dir}: directory exists, is not empty and has no {MODEL_MARKER}; "
                "refusing to overwrite it")
    else:
        model_dir = tmp_root / "model"
    build_model_in_child(model_dir, args)
    return model_dir


def make_prompt(args, vocab: int) -> list[int]:
    import random

    rng = random.Random(args.seed + 1)
    return [rng.randrange(4, vocab) for _ in range(args.context)]


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


# ----------------------------------------------------------------------------- ckv
def find_ckv(path: str | None) -> Path:
    cand = Path(path) if path else REPO_ROOT / "build" / "ckv"
    if not cand.is_file() or not os.access(cand, os.X_OK):
        hint = "pass --ckv PATH" if path is None else "check the path"
        die(f"ckv binary not found or not executable: {cand}\n"
            f"  build it first (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j), "
            f"{hint}, or run the HF half alone with --skip-ckv")
    return cand.resolve()


def run_ckv(ckv: Path, model_dir: Path, prompt: list[int], args, tmp_root: Path) -> dict:
    prompt_file = tmp_root / "prompt_ids.txt"
    prompt_file.write_text(",".join(map(str, prompt)) + "\n")
    stats_file = tmp_root / "ckv_stats.json"
    cmd = [str(ckv), "generate", "--model", str(model_dir), "--prompt-ids-file", str(prompt_file),
           "--max-new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--ignore-eos",
           "--stats-json", str(stats_file)] + args.ckv_arg
    log("ckv: " + " ".join(cmd))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        die(f"ckv exited with status {p.returncode}\n--- stderr ---\n{p.stderr[-4000:]}", 1)
    if not stats_file.exists():
        die(f"ckv did not write --stats-json {stats_file}\n--- stderr ---\n{p.stderr[-4000:]}", 1)
    stats = json.loads(stats_file.read_text())
    missing = [k for k in STATS_KEYS if k not in stats]
    if missing:
        die(f"ckv stats JSON lacks keys {missing}: {stats}", 1)
    stats["wall_s"] = wall
    stats["generated_ids"] = [int(x) for x in re.findall(r"-?\d+", p.stdout)]
    stats["stderr_tail"] = p.stderr.strip().splitlines()[-4:]
    return stats


# ----------------------------------------------------------------------------- HF (child process)
def hf_worker(args) -> None:
    """Runs in its own process: loads the model, times prefill and decode, prints JSON on stdout."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    prompt = json.loads(Path(args.hf_worker).read_text())

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype, attn_implementation=args.hf_attn)
    model.eval()
    load_s = time.perf_counter() - t0

    with torch.inference_mode():
        if not args.no_warmup:  # first-call overheads (allocator, kernel selection) off the clock
            out = model(input_ids=torch.tensor([list(range(4, 20))]), use_cache=True, logits_to_keep=1)
            out = model(input_ids=torch.tensor([[20]]), past_key_values=out.past_key_values,
                        use_cache=True, logits_to_keep=1)
            del out

        ids = torch.tensor([prompt], dtype=torch.long)
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        prefill_s = time.perf_counter() - t0
        cache = out.past_key_values
        tok = int(torch.argmax(out.logits[0, -1]))
        generated = [tok]

        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            tok = int(torch.argmax(out.logits[0, -1]))
            generated.append(tok)
        decode_s = time.perf_counter() - t0

    kv_bytes = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                kv_bytes += t.numel() * t.element_size()
    res = {
        "prefill_tokens": len(prompt),
        "prefill_s": prefill_s,
        "prefill_tok_s": len(prompt) / prefill_s,
        "decode_tokens": args.new_tokens,
        "decode_s": decode_s,
        "decode_tok_s": args.new_tokens / decode_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "kv_bytes": kv_bytes,
        "load_s": load_s,
        "attn_implementation": args.hf_attn,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generated_ids": generated,
    }
    print(json.dumps(res))


def peak_rss_bytes() -> int:
    """VmHWM of this process (Linux); ru_maxrss is inherited across fork + exec, VmHWM is not."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_hf(model_dir: Path, prompt: list[int], args, tmp_root: Path) -> dict:
    prompt_json = tmp_root / "prompt_ids.json"
    prompt_json.write_text(json.dumps(prompt))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--hf-worker", str(prompt_json), "--model-dir",
           str(model_dir), "--threads", str(args.threads), "--new-tokens", str(args.new_tokens),
           "--dtype", args.dtype, "--hf-attn", args.hf_attn] + (["--no-warmup"] if args.no_warmup else [])
    log(f"HF transformers: {args.hf_attn} attention, {args.threads} threads")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        die(f"HF worker failed (status {p.returncode})\n--- stderr ---\n{p.stderr[-4000:]}", 1)
    return json.loads(p.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report
def fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "rate":
        return f"{v:.2f}"
    if kind == "s":
        return f"{v:.3f}"
    if kind == "mib":
        return f"{v / 2**20:.0f}"
    return str(v)


def report(res: dict) -> str:
    ckv, hf = res.get("ckv"), res.get("hf")
    hf_name = f"HF ({hf['attn_implementation']})" if hf else "HF"
    rows = [("prefill tok/s", "prefill_tok_s", "rate", True), ("decode tok/s", "decode_tok_s", "rate", True),
            ("prefill s", "prefill_s", "s", False), ("decode s", "decode_s", "s", False),
            ("prefill tokens", "prefill_tokens", "n", False), ("decode steps", "decode_tokens", "n", False),
            ("peak RSS MiB", "peak_rss_bytes", "mib", False), ("KV cache MiB", "kv_bytes", "mib", False)]
    lines = [f"| metric | ckv | {hf_name} | ckv / HF |", "|---|---:|---:|---:|"]
    for label, key, kind, ratio in rows:
        a = ckv.get(key) if ckv else None
        b = hf.get(key) if hf else None
        r = f"{a / b:.2f}x" if (ratio and a and b) else "-"
        lines.append(f"| {label} | {fmt(a, kind)} | {fmt(b, kind)} | {r} |")
    s = res["settings"]
    head = (f"CPU benchmark: Qwen2.5-0.5B-shaped random weights, {s['dtype']}, context {s['context']}, "
            f"{s['new_tokens']} new tokens, {s['threads']} threads, HF attention {s['hf_attn']}\n"
            f"machine: {s['cpu']} ({s['cpus']} CPUs visible); torch {s['torch']}, transformers {s['transformers']}\n")
    tail = ""
    if ckv and hf:
        a, b = ckv["generated_ids"], hf["generated_ids"]
        n = min(len(a), len(b))
        agree = next((i for i in range(n) if a[i] != b[i]), n)
        tail = f"\ngreedy ids: ckv and HF agree on the first {agree} of {n} compared tokens\n"
    notes = ("\nckv: N new tokens = 1 from the prefill logits + N-1 decode forwards; "
             "HF: 1 from the prefill + N decode forwards. Rates are per forward, so they compare.\n")
    return head + "\n" + "\n".join(lines) + "\n" + tail + notes


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckv", default=None, help="ckv binary (default: <repo>/build/ckv)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--context", type=int, default=2048, help="prompt tokens (default 2048)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32", help="weights and HF compute dtype")
    ap.add_argument("--keep-model", metavar="DIR", default=None,
                    help="build the model in DIR and keep it (reused by later runs with the same settings); "
                         "default: a temporary directory removed at the end")
    ap.add_argument("--hf-attn", choices=("sdpa", "eager"), default="sdpa", help="HF attention implementation")
    ap.add_argument("--seed", type=int, default=0, help="weights and prompt seed")
    ap.add_argument("--out", default=None, metavar="PREFIX",
                    help="write PREFIX.json and PREFIX.md (default: <repo>/build/bench/bench_cpu)")
    ap.add_argument("--skip-ckv", action="store_true", help="run the HF half only")
    ap.add_argument("--skip-hf", action="store_true", help="run the ckv half only")
    ap.add_argument("--no-warmup", action="store_true", help="HF: no untimed warm-up forward")
    ap.add_argument("--ckv-arg", action="append", default=[], metavar="ARG",
                    help="extra argument passed to `ckv generate` (repeatable), e.g. --ckv-arg=--chunk --ckv-arg=1024")
    ap.add_argument("--hf-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--build-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.hf_worker:
        hf_worker(args)
        return 0
    if args.build_worker:
        build_model(Path(args.build_worker), args)
        return 0
    if args.skip_ckv and args.skip_hf:
        die("nothing to run: both --skip-ckv and --skip-hf given")
    if args.threads < 1 or args.context < 1 or args.new_tokens < 1:
        die("--threads, --context and --new-tokens must be >= 1")
    if args.context + args.new_tokens + 1 > QWEN25_05B["max_position_embeddings"]:
        die(f"--context + --new-tokens exceed max_position_embeddings {QWEN25_05B['max_position_embeddings']}")
    ckv = None if args.skip_ckv else find_ckv(args.ckv)  # fail before spending minutes on the model

    out_prefix = Path(args.out) if args.out else REPO_ROOT / "build" / "bench" / "bench_cpu"
    tmp_root = Path(tempfile.mkdtemp(prefix="ckv-bench-"))
    try:
        model_dir = ensure_model(args, tmp_root)
        prompt = make_prompt(args, QWEN25_05B["vocab_size"])
        res = {
            "settings": {
                "model": "qwen2.5-0.5b-shaped random weights", "dtype": args.dtype, "context": args.context,
                "new_tokens": args.new_tokens, "threads": args.threads, "hf_attn": args.hf_attn,
                "seed": args.seed, "model_bytes": dir_bytes(model_dir), "cpu": cpu_name(),
                "cpus": os.cpu_count(), "torch": None, "transformers": None,
                "ckv": str(ckv) if ckv else None,
            },
            "ckv": None,
            "hf": None,
        }
        if not args.skip_ckv:
            res["ckv"] = run_ckv(ckv, model_dir, prompt, args, tmp_root)
        if not args.skip_hf:
            res["hf"] = run_hf(model_dir, prompt, args, tmp_root)
            res["settings"]["torch"] = res["hf"]["torch"]
            res["settings"]["transformers"] = res["hf"]["transformers"]
        if res["ckv"] and res["hf"]:
            res["ratio"] = {k: res["ckv"][k] / res["hf"][k] for k in ("prefill_tok_s", "decode_tok_s")
                            if res["hf"].get(k)}
        text = report(res)
        print(text)
        out_prefix.parent.mkdir(parents=True, exist_ok=True)
        Path(str(out_prefix) + ".json").write_text(json.dumps(res, indent=2) + "\n")
        Path(str(out_prefix) + ".md").write_text(text)
        log(f"wrote {out_prefix}.json and {out_prefix}.md")
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
