#!/usr/bin/env python3
"""bench_gpu.py - the GPU benchmark of tests/gpu/run.sh: ckv with random bf16 weights on the shapes
of Llama-3.1-8B at 32K and Qwen2.5-32B (YaRN) at 128K, tp 1, full cache and critical_adakv:snapkv at
budget 0.2, plus Hugging Face transformers (SDPA, random weights) on the 8B case on the same GPU.

Figures per case: time to first token, decode ms/token, peak GPU memory, eviction share of TTFT; the
copy bandwidth and bf16 GEMM rate are measured first in the same run (torch.cuda events, random data)
and every figure is given as a ratio to its roofline:
  prefill  = (FLOPs of the prefill / measured GEMM rate) / TTFT
  decode   = (bytes read per token: weights + KV rows / measured bandwidth) / (ms per token)
  memory   = peak GPU memory / the GPU memory plan (ckv inspect --backend cuda); beside it, "ckv GiB":
             the peak of ckv's own device allocations (its backend's ledger, --stats-json device_peak_bytes)
Targets (reported, never asserted): prefill >= 0.55, decode >= 0.80, eviction <= 3% of TTFT.

--dry-run does everything that needs no GPU: reads the configurations, writes the prompt files,
computes FLOPs, bytes and the memory plans, prints the commands it would run and the table with the
rooflines of the datasheet (H200: 989 TFLOP/s bf16 dense, 4.8 TB/s) in place of measured ones.
--rehearse runs every command of a GPU run on small shapes, with --backend cuda-emu (the CUDA
kernels on ckv's CPU execution layer) by default: each case's configuration cut to 2 layers, hidden
size 128 and intermediate size 256 (heads, KV heads, head_dim, vocabulary and RoPE as in the real
model), a 128-token context and 4 new tokens; transformers runs on the CPU when torch is installed.
The figures of a rehearsal are meaningless; it fails (exit 1) when any command fails or its output
cannot be read, which is what would stop the first GPU run.
--cases picks cases by name (comma-separated), --context replaces every case's context. --profile
runs the cases with CKV_CUDA_SYNC=2 (a wait after every op, the backend's per-op wall times printed
at exit) and prints each case's profile: where a whole run's time goes, without a profiler; its
times are not the benchmark's (waits after every op, no recorded decode steps).
Each ckv run writes its stderr to OUT/CASE.log; a run past --timeout is killed with its process
group and waited for at most 30 s more, its log's last lines printed.
Every mode ends with the per-kernel roofline of tools/bench/roofline.py (measured ceilings when
measured; a dry run or rehearsal adds the A100's datasheet). Writes OUT/bench.json.
"""
import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roofline  # noqa: E402  (tools/bench/roofline.py: the per-kernel model)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = [  # name, model config directory, context, press
    ("8B@32K full", "llama-3.1-8b-instruct", 32768, None),
    ("8B@32K critical_adakv", "llama-3.1-8b-instruct", 32768, "critical_adakv:snapkv"),
    ("32B@128K full", "qwen2.5-32b-instruct-128k", 130000, None),
    ("32B@128K critical_adakv", "qwen2.5-32b-instruct-128k", 130000, "critical_adakv:snapkv"),
]
DATASHEET = {"gemm_tflops": 989.0, "copy_gbs": 4800.0}  # H200 SXM leads (docs/gpu.md section 8)


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    c["head_dim"] = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c


REHEARSAL = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256}  # the small shape
REHEARSAL_CONTEXT = 128  # above snapkv's window (64), so the press compresses


def rehearsal_model(cfg_dir, out):
    """A copy of the case's config.json with REHEARSAL's sizes (head_dim kept explicit): its directory."""
    c = load_config(os.path.join(ROOT, "configs", "models", cfg_dir))
    c.update(REHEARSAL)
    d = os.path.join(out, "rehearsal_models", cfg_dir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return d


def matmul_params(c):
    """Weights of the linear layers per token (embedding lookup excluded, lm_head included)."""
    D, d, H, Hkv, F, L = (c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"],
                          c["intermediate_size"], c["num_hidden_layers"])
    layer = 2 * H * d * D + 2 * Hkv * d * D + 3 * F * D
    return L * layer, c["vocab_size"] * D


def prefill_flops(c, n):
    """Linear layers over n tokens (lm_head for the last one), causal attention (QK^T and PV)."""
    body, head = matmul_params(c)
    attn = c["num_hidden_layers"] * 2 * c["num_attention_heads"] * c["head_dim"] * n * n  # 2 GEMMs x 2 FLOP x n^2/2
    return 2 * body * n + 2 * head + attn


def decode_bytes(c, kv_rows):
    """Bytes one decode step must read: every bf16 weight once (+ embeddings row, ignored) and the KV
    rows of every layer and KV head (K and V, bf16)."""
    body, head = matmul_params(c)
    kv = c["num_hidden_layers"] * c["num_key_value_heads"] * kv_rows * 2 * c["head_dim"] * 2
    return 2 * (body + head) + kv


def plan_bytes(ckv, model, context, new, press, budget):
    """The GPU memory plan's total (GiB in ckv inspect's table, back to bytes), or an error string. The
    plan is computed from the configuration (no GPU needed), also in a rehearsal."""
    cmd = [ckv, "inspect", "--model", model, "--backend", "cuda", "--context", str(context), "--new-tokens", str(new),
           "--chunk", "2048"]
    if press:
        cmd += ["--press", press, "--budget", str(budget)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "ckv inspect: %s" % e
    for line in p.stdout.splitlines():
        if line.startswith("total"):
            v, unit = line.split()[1:3]
            return float(v) * {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}[unit]
    return "ckv inspect exit %d, no 'total' line: %s" % (p.returncode, (p.stderr.strip().splitlines() or [""])[-1])


def measure_ceilings(torch):
    """Device-to-device copy bandwidth (bytes read + written) and bf16 GEMM rate, random data, medians."""
    def timed(fn, reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        return sorted(ts)[len(ts) // 2]
    n = 1 << 30  # 2 GiB of bf16, far past the 50 MB L2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 20)
    copy_gbs = 2 * n * 2 / t / 1e9
    del src, dst
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: a @ b, 20)
    gemm = 2 * m ** 3 / t / 1e12
    del a, b
    torch.cuda.empty_cache()
    return {"copy_gbs": copy_gbs, "gemm_tflops": gemm}


class GpuMemPeak:
    """The peak memory used on GPU 0 while a child runs (bytes), from one nvidia-smi in its own loop
    mode (-lms 500). This script first started nvidia-smi every 0.2 s; on an H200 an elementwise op
    behind a wait (CKV_CUDA_SYNC=2) then took 1.7 ms, against 28 us in a run without the polling."""
    def __init__(self):
        self.peak, self.p = 0, None
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            for line in self.p.stdout:
                try:
                    self.peak = max(self.peak, int(line.split()[0]) * 2 ** 20)
                except (ValueError, IndexError):
                    pass
        except (OSError, ValueError):
            pass

    def __enter__(self):
        try:
            self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
                                       "0", "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.t.start()
        except OSError:
            self.p = None
        return self

    def __exit__(self, *a):
        if self.p:
            self.p.kill()
            self.p.wait()
            self.t.join(timeout=5)


def run_ckv(ckv, backend, model, case, prompt_file, new, budget, out):
    name, press = case[0], case[3]
    stats = os.path.join(out, name.replace(" ", "_").replace("@", "_") + ".json")
    cmd = [ckv, "generate", "--backend", backend, "--model", model, "--random-weights", "1", "--prompt-ids-file",
           prompt_file, "--max-new-tokens", str(new), "--ignore-eos", "--chunk", "2048", "--stats-json", stats]
    if press:
        cmd += ["--press", press, "--budget", str(budget)]
    return cmd, stats


def run_logged(cmd, log, timeout, env=None):
    """cmd with its stdout and stderr in the file log (no pipes to drain), in a process group of its
    own, killed as a group after timeout seconds and waited for at most 30 s more: (exit status, 124
    on timeout; the last line of its output or what happened)."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stuck in the driver: report it, do not wait on it
                return 124, "timed out after %d s, and still running 30 s after SIGKILL" % timeout
            return 124, "timed out after %d s" % timeout
    with open(log, errors="replace") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    return rc, lines[-1] if lines else ""


def log_tail(log, n):
    try:
        with open(log, errors="replace") as f:
            return [ln.rstrip() for ln in f][-n:]
    except OSError:
        return []


def hf_sdpa(model_dir, context, new, seed, device="cuda"):
    """transformers with SDPA on random bf16 weights: TTFT, decode ms/token, peak memory (GPU only)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(model_dir)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    gpu = device == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    ids = torch.randint(4, cfg.vocab_size, (1, context), device=device)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        o = model(ids, use_cache=True, logits_to_keep=1)
        tok = o.logits[:, -1:].argmax(-1)
        sync()
        ttft = time.perf_counter() - t0
        past = o.past_key_values
        t0 = time.perf_counter()
        for _ in range(new):
            o = model(tok, past_key_values=past, use_cache=True)
            past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        sync()
        dec = (time.perf_counter() - t0) / new
    return {"ttft_s": ttft, "decode_ms": dec * 1e3, "peak_bytes": torch.cuda.max_memory_allocated() if gpu else None}


def ratio(x):
    return "-" if x is None else "%.2f" % x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckv", default=os.path.join(ROOT, "build-gpu", "ckv"))
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "build-gpu", "bench")))
    ap.add_argument("--backend", default=None, help="ckv's --backend (cuda; a rehearsal: cuda-emu)")
    ap.add_argument("--new-tokens", type=int, default=None, help="decode steps (64; a rehearsal: 4)")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per ckv run")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all): " +
                    ", ".join(c[0] for c in CASES))
    ap.add_argument("--context", type=int, default=None, help="every case's context in tokens (default: the case's)")
    ap.add_argument("--profile", action="store_true",
                    help="run with CKV_CUDA_SYNC=2 and print each case's per-op profile (not the benchmark's times)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true")
    mode.add_argument("--rehearse", action="store_true")
    a = ap.parse_args()
    backend = a.backend or ("cuda-emu" if a.rehearse else "cuda")
    cases = CASES
    if a.cases:
        want = [x.strip() for x in a.cases.split(",") if x.strip()]
        unknown = [x for x in want if x not in [c[0] for c in CASES]]
        if unknown or not want:
            print("bench_gpu.py: --cases: unknown case %s (known: %s)" % (", ".join(repr(x) for x in unknown) or "''",
                  ", ".join(c[0] for c in CASES)), file=sys.stderr)
            return 2
        cases = [c for c in CASES if c[0] in want]
    if a.context is not None and a.context < 2:
        print("bench_gpu.py: --context %d: expected at least 2 tokens" % a.context, file=sys.stderr)
        return 2
    env = dict(os.environ, CKV_CUDA_SYNC="2") if a.profile else None
    new_tokens = a.new_tokens if a.new_tokens is not None else (4 if a.rehearse else 64)
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    rows, ceilings, result = [], dict(DATASHEET), {"cases": [], "rehearsal": a.rehearse, "backend": backend}
    have = [m for m in ("torch", "transformers") if importlib.util.find_spec(m)]
    if not a.dry_run and not a.rehearse:
        import torch
        ceilings = measure_ceilings(torch)
        print("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s (measured)" % (ceilings["copy_gbs"], ceilings["gemm_tflops"]),
              flush=True)
    else:
        print("%s: no GPU call; ceilings are the datasheet's (%s); python modules here: %s" %
              ("rehearsal on small shapes with --backend " + backend if a.rehearse else "dry run", DATASHEET,
               ", ".join(have) or "neither torch nor transformers"))
    result["ceilings"] = ceilings
    ckv_ok = os.access(a.ckv, os.X_OK)
    if not ckv_ok:
        print("ckv binary %s: missing (build first)" % a.ckv)
    failed = not ckv_ok and a.rehearse
    for case in cases:
        name, cfg_dir, context, press = case
        model = rehearsal_model(cfg_dir, a.out) if a.rehearse else os.path.join(ROOT, "configs", "models", cfg_dir)
        context = REHEARSAL_CONTEXT if a.rehearse else context
        context = a.context if a.context is not None else context
        c = load_config(model)
        prompt = os.path.join(a.out, "prompt_%s_%d.ids" % (cfg_dir, context))
        with open(prompt, "w") as f:
            f.write(",".join(str(rng.randrange(4, c["vocab_size"])) for _ in range(context)))
        cmd, stats = run_ckv(a.ckv, backend, model, case, prompt, new_tokens, a.budget, a.out)
        kept = int(context * a.budget) if press else context
        flops = prefill_flops(c, context)
        t_pre = flops / (ceilings["gemm_tflops"] * 1e12)
        t_dec = decode_bytes(c, kept + new_tokens // 2) / (ceilings["copy_gbs"] * 1e9)
        plan = plan_bytes(a.ckv, model, context, new_tokens, press, a.budget) if ckv_ok else None
        row = {"case": name, "engine": "ckv", "flops": flops, "roof_ttft_s": t_pre, "roof_decode_ms": t_dec * 1e3,
               "plan_bytes": plan if isinstance(plan, float) else None, "cmd": " ".join(cmd)}
        if isinstance(plan, str):
            row["error"] = plan
            print("%s: %s" % (name, plan), flush=True)
            failed = True
        if a.dry_run:
            print("would run: " + row["cmd"])
        else:
            t0 = time.time()
            log = os.path.splitext(stats)[0] + ".log"
            print("%s: running (context %d, %d new tokens%s), log %s" % (name, context, new_tokens,
                  ", CKV_CUDA_SYNC=2" if a.profile else "", log), flush=True)
            with GpuMemPeak() as mem:
                rc, err = run_logged(cmd, log, a.timeout, env)
            row["wall_s"] = time.time() - t0
            row["peak_bytes"] = mem.peak
            print("%s: exit %d after %.1f s" % (name, rc, row["wall_s"]), flush=True)
            if a.profile or rc != 0:
                tail = log_tail(log, 40)
                if a.profile:
                    tail = tail[next((i for i, ln in enumerate(tail) if "op profile" in ln), 0):]
                print("\n".join("    " + ln for ln in tail), flush=True)
            try:
                if rc != 0:
                    raise ValueError("exit %d: %s" % (rc, err))
                with open(stats) as f:
                    s = json.load(f)
                row.update(ttft_s=s["ttft_s"], decode_ms=1e3 * s["decode_s"] / max(1, s["decode_tokens"]),
                           ckv_peak_bytes=s.get("device_peak_bytes"),
                           evict_share=s.get("evict_s", 0.0) / s["ttft_s"] if s["ttft_s"] > 0 else None)
                if press and not s.get("compressed"):
                    raise ValueError("--stats-json says the context was not compressed")
                if a.rehearse:
                    print("rehearsed: " + row["cmd"], flush=True)
            except (OSError, ValueError, KeyError, TypeError) as e:
                row["error"] = "%s: %s" % (type(e).__name__, e) if not isinstance(e, ValueError) else str(e)
                print("%s: %s" % (name, row["error"]), flush=True)
                failed = True
        rows.append(row)
    if not a.skip_hf and not a.profile:
        name, cfg_dir, context, _ = CASES[0]
        model = rehearsal_model(cfg_dir, a.out) if a.rehearse else os.path.join(ROOT, "configs", "models", cfg_dir)
        context = REHEARSAL_CONTEXT if a.rehearse else context
        context = a.context if a.context is not None else context
        c = load_config(model)
        row = {"case": name.replace("full", "HF SDPA"), "engine": "transformers",
               "roof_ttft_s": prefill_flops(c, context) / (ceilings["gemm_tflops"] * 1e12),
               "roof_decode_ms": decode_bytes(c, context + new_tokens // 2) / (ceilings["copy_gbs"] * 1e9) * 1e3,
               "plan_bytes": None}
        what = "transformers %s (SDPA, random bf16 weights) at %d tokens + %d decode steps" % (cfg_dir, context, new_tokens)
        if a.dry_run:
            print("would run: " + what)
        elif a.rehearse and len(have) < 2:
            print("rehearsal: skipped %s (needs torch and transformers here)" % what)
        else:
            try:
                row.update(hf_sdpa(model, context, new_tokens, a.seed, "cpu" if a.rehearse else "cuda"))
                if a.rehearse:
                    print("rehearsed on the CPU: " + what, flush=True)
            except Exception as e:  # reported in the table, the benchmark goes on
                row["error"] = "%s: %s" % (type(e).__name__, e)
                failed = failed or a.rehearse
        rows.append(row)
    for r in rows:
        r["prefill_ratio"] = r["roof_ttft_s"] / r["ttft_s"] if r.get("ttft_s") else None
        r["decode_ratio"] = r["roof_decode_ms"] / r["decode_ms"] if r.get("decode_ms") else None
        r["mem_ratio"] = r["peak_bytes"] / r["plan_bytes"] if r.get("peak_bytes") and r.get("plan_bytes") else None
    result["cases"] = rows
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    gb = lambda x: "-" if not x else "%.1f" % (x / 2 ** 30)
    hdr = "%-26s %9s %6s %9s %6s %7s %7s %7s %6s %7s" % ("case", "TTFT s", "/roof", "ms/token", "/roof", "peak GiB",
                                                          "ckv GiB", "plan", "/plan", "evict%")
    print("\n== benchmark (%s ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s)%s" %
          ("measured" if not (a.dry_run or a.rehearse) else "datasheet", ceilings["copy_gbs"], ceilings["gemm_tflops"],
           " - a rehearsal on small shapes with --backend %s: the figures mean nothing" % backend if a.rehearse else ""))
    print(hdr)
    for r in rows:
        ttft = r.get("ttft_s")
        print("%-26s %9s %6s %9s %6s %7s %7s %7s %6s %7s" % (
            r["case"], "%.3f" % ttft if ttft else ("(%.3f)" % r["roof_ttft_s"] if a.dry_run else "-"),
            ratio(r["prefill_ratio"]), "%.2f" % r["decode_ms"] if r.get("decode_ms") else
            ("(%.2f)" % r["roof_decode_ms"] if a.dry_run else "-"), ratio(r["decode_ratio"]), gb(r.get("peak_bytes")),
            gb(r.get("ckv_peak_bytes")), gb(r.get("plan_bytes")), ratio(r["mem_ratio"]),
            "%.1f" % (100 * r["evict_share"]) if r.get("evict_share") is not None else "-"))
        if r.get("error"):
            print("    %s" % r["error"][:150])
    if a.dry_run:
        print("(dry run: TTFT and ms/token columns show the roofline times in parentheses)")
    # per kernel and per step (tools/bench/roofline.py): the datasheets' H200 and A100, or this run's
    # measured ceilings in place of the H200's
    gpu = dict(roofline.GPUS["H200"])
    if not a.dry_run and not a.rehearse:
        gpu.update(tc=ceilings["gemm_tflops"], hbm_gbs=ceilings["copy_gbs"], source="measured in this run")
    gpus = [("H200", gpu)] + ([("A100", dict(roofline.GPUS["A100"]))] if a.dry_run or a.rehearse else [])
    roofline.print_tables([c for c in roofline.CASES if c[0] in ("8B@32K critical_adakv",)], gpus[:1], False)
    roofline.print_summary(roofline.CASES, gpus, False)
    roofline.print_split_k(gpus, False)  # the prefill's split-K: a chunk over a long prefix per tp degree
    result["roofline"] = roofline.summary_rows(roofline.CASES, gpus)
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    if a.rehearse:
        print("rehearsal: %s" % ("FAILED (see the errors above)" if failed else "every command ran and its output was read"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
