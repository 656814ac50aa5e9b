#!/usr/bin/env python3
"""bench_serve.py - serving throughput and latency of `ckv serve` next to llama.cpp's server
(llama-cpp-python[server]) on the same GGUF model, in one run, the servers taking turns round by
round, each round in a rotated order (the machine is shared: report ranges over rounds). Besides
this build (`ckv`) the run may hold another ckv build (--ckv-base, e.g. the main branch before a
change: `ckv-base`) and a tensor-parallel group of this build (--tp N: `ckv tp N`, N ranks under
--mpirun with --threads / N threads each), all with the same serving flags (--ckv-flags). Each
level of concurrency C sends
distinct short prompts from C client threads as streaming /v1/completions and records requests/s,
output tokens/s, time to first token (p50/p99) and end-to-end latency. Only one server runs at a
time. A second part runs ckv alone on a long context (default 4096 tokens) with the full cache and
with a press (default critical_adakv:snapkv at budget 0.2): time to first token (the prefill), KV
bytes per request (usage), server RSS, and decode tokens/s of 4 clients asking different questions
over the reused compressed context. Prints a JSON summary and Markdown tables.
usage: bench_serve.py --ckv build/ckv --model models/smollm2-135m-instruct-q4_1.gguf
                      [--ckv-base OTHER/ckv] [--tp 2] [--llama-python VENV/bin/python]
                      [--threads 2] [--rounds 2] [--skip-long]"""
import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proc:
    def __init__(self, cmd, port, env=None, log=None):
        self.port = port
        self.log = open(log or os.devnull, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        t_end = time.time() + 300
        while time.time() < t_end:
            if self.p.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {self.p.returncode} (log: {log})")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v1/models")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{cmd[0]} did not start")

    def rss_peak(self):
        try:
            for line in open(f"/proc/{self.p.pid}/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def stream_request(port, body):
    """One streaming completion: (ttft s, total s, output tokens, text)."""
    body = dict(body, stream=True)
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    ttft, chunks, usage, text = None, 0, None, []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch.get("text"):
                if ttft is None:
                    ttft = time.time() - t0
                chunks += 1
                text.append(ch["text"])
    total = time.time() - t0
    c.close()
    n = usage["completion_tokens"] if usage else chunks
    return ttft if ttft is not None else total, total, n, "".join(text), usage


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else 0.0


def run_level(port, conc, n_req, max_tokens, tag, extra):
    jobs = list(range(n_req))
    lock = threading.Lock()
    res = []

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                i = jobs.pop(0)
            prompt = f"Request {tag}-{conc}-{i}: write a short story about a lighthouse keeper named Number{i}."
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
            out = stream_request(port, body)
            with lock:
                res.append(out)
    t0 = time.time()
    th = [threading.Thread(target=worker) for _ in range(conc)]
    [x.start() for x in th]
    [x.join() for x in th]
    wall = time.time() - t0
    toks = sum(r[2] for r in res)
    return {"concurrency": conc, "requests": len(res), "wall_s": wall, "req_s": len(res) / wall, "out_tok_s": toks / wall,
            "ttft_p50": pct([r[0] for r in res], 0.5), "ttft_p99": pct([r[0] for r in res], 0.99),
            "latency_p50": pct([r[1] for r in res], 0.5), "out_tokens": toks, "tokens_per_request": toks / max(1, len(res))}


def start_ckv(a, port, logdir, *extra, binary=None, ranks=1):
    threads = max(1, a.threads // ranks)
    cmd = [binary or a.ckv, "serve", "--model", a.model, "--port", str(port), "--threads", str(threads), "--max-batch", "16",
           "--model-name", "m", *a.ckv_flags.split(), *extra]
    env = None
    if ranks > 1:
        cmd = [a.mpirun, "-np", str(ranks), "--oversubscribe", *cmd]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return Proc(cmd, port, env=env, log=os.path.join(logdir, f"ckv-{port}.log"))


def start_server(a, name, port, logdir):
    if name == "llama.cpp":
        return start_llama(a, port, logdir)
    if name == "ckv-base":
        return start_ckv(a, port, logdir, binary=a.ckv_base)
    if name.startswith("ckv tp"):
        return start_ckv(a, port, logdir, ranks=a.tp)
    return start_ckv(a, port, logdir)


def start_llama(a, port, logdir):
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    # llama_cpp.server has no setting for use_extra_bufts (the AMX repack buffers that crash on this
    # CPU): the launcher builds the app itself and passes it to the Llama constructor.
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llamacpp_server.py")
    cmd = [a.llama_python, launcher, "--model", a.model, "--port", str(port), "--threads", str(a.threads),
           "--n-ctx", str(a.n_ctx)]
    return Proc(cmd, port, env=env, log=os.path.join(logdir, f"llama-{port}.log"))


def long_context(a, logdir):
    filler = " ".join(f"Entry {i}: the depot in district {i} opened at {i % 12 + 1} o'clock and shipped {i * 37 % 1000} crates."
                      for i in range(400))
    out = []
    for press in ["none", a.press]:
        port = free_port()
        srv = start_ckv(a, port, logdir, "--max-tokens-limit", "512", *a.long_flags.split())
        # the context: about a.long_ctx tokens of text (the server's /tokenize sizes it)
        words = filler.split(" ")
        lo, hi = 1, len(words)
        while lo < hi:  # the longest prefix of the filler within the target
            mid = (lo + hi + 1) // 2
            c = http.client.HTTPConnection("127.0.0.1", port)
            c.request("POST", "/tokenize", body=json.dumps({"prompt": " ".join(words[:mid])}))
            n = json.loads(c.getresponse().read())["count"]
            if n <= a.long_ctx:
                lo = mid
            else:
                hi = mid - 1
        ctx = " ".join(words[:lo])
        extra = {"stream_options": {"include_usage": True}}
        if press != "none":
            extra.update(press=press, budget=a.budget)
        cold = stream_request(port, {"context": ctx, "prompt": " Question: which district shipped 37 crates? Answer:",
                                     "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True, **extra})
        res = []

        def ask(i):
            res.append(stream_request(port, {"context": ctx, "prompt": f" Question: when did district {i * 7} open? Answer:",
                                             "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True, **extra}))
        t0 = time.time()
        th = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        [x.start() for x in th]
        [x.join() for x in th]
        wall = time.time() - t0
        u = cold[4] or {}
        out.append({"press": press if press == "none" else f"{press} budget {a.budget}", "context_tokens": u.get("context_tokens"),
                    "cold_ttft_s": cold[0], "cold_decode_tok_s": cold[2] / max(1e-9, cold[1] - cold[0]),
                    "kv_bytes_per_request": u.get("kv_bytes_kept"), "kv_bytes_full": u.get("kv_bytes_full"),
                    "reused_4_clients_tok_s": sum(r[2] for r in res) / wall, "reused_ttft_p50": pct([r[0] for r in res], 0.5),
                    "server_peak_rss": srv.rss_peak()})
        srv.stop()
    return out


def run_server(a, name, port, rnd, levels, nreq, results):
    # both generate exactly max_tokens: ckv ignores end-of-sequence ids, llama.cpp gets them banned
    # (SmolLM2's <|endoftext|> 0 and <|im_end|> 2; --eos-ids for other models)
    extra = {"stream_options": {"include_usage": True}, "ignore_eos": True} if name.startswith("ckv") else \
        {"logit_bias": {str(t): -100 for t in a.eos_ids.split(",")}}
    stream_request(port, {"prompt": "warm up", "max_tokens": 2, **extra})
    for c, n in zip(levels, nreq):
        r = run_level(port, c, n, a.max_tokens, f"{rnd}", extra)
        r["round"] = rnd
        results[name][c].append(r)
        print(f"round {rnd} {name:9s} c={c:2d}: {r['req_s']:.2f} req/s, {r['out_tok_s']:.1f} tok/s "
              f"({r['tokens_per_request']:.1f} per request), TTFT p50 {r['ttft_p50'] * 1000:.0f} ms p99 "
              f"{r['ttft_p99'] * 1000:.0f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckv", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ckv-base", help="another ckv binary served alike (e.g. a build of main before a change)")
    ap.add_argument("--tp", type=int, default=0, help="also serve this build as a tensor-parallel group of N ranks")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--ckv-flags", default="", help="extra flags of every ckv server of the first part")
    ap.add_argument("--llama-python", help="a Python with llama-cpp-python[server] (omit: ckv only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--requests", default="6,12,32", help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--long-ctx", type=int, default=4096)
    ap.add_argument("--press", default="critical_adakv:snapkv")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--skip-long", action="store_true")
    ap.add_argument("--long-flags", default="--weights-dtype f32",
                    help="extra ckv serve flags of the long-context part (CriticalKV's value norms need f32/f16/bf16 o_proj)")
    ap.add_argument("--eos-ids", default="0,2", help="end-of-sequence ids llama.cpp is kept from sampling")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    nreq = [int(x) for x in a.requests.split(",")]
    logdir = tempfile.mkdtemp(prefix="bench_serve.")
    servers = ["ckv"] + (["ckv-base"] if a.ckv_base else []) + ([f"ckv tp {a.tp}"] if a.tp > 1 else []) + \
        (["llama.cpp"] if a.llama_python else [])
    results = {s: {c: [] for c in levels} for s in servers}
    for rnd in range(a.rounds):
        k = rnd % len(servers)
        for name in servers[k:] + servers[:k]:  # each round starts with the next server
            port = free_port()
            srv = start_server(a, name, port, logdir)
            try:
                run_server(a, name, port, rnd, levels, nreq, results)
            finally:
                srv.stop()
    summary = {"servers": results, "long_context": None if a.skip_long else long_context(a, logdir)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)

    def rng(v, fmt):
        return fmt.format(min(v)) if len(v) == 1 or fmt.format(min(v)) == fmt.format(max(v)) else \
            f"{fmt.format(min(v))}-{fmt.format(max(v))}"
    print("\n| server | clients | requests/s | output tok/s | tokens/request | TTFT p50 (ms) | TTFT p99 (ms) |\n|---|---|---|---|---|---|---|")
    for name in servers:
        for c in levels:
            rs = results[name][c]
            if not rs:
                continue
            print(f"| {name} | {c} | {rng([r['req_s'] for r in rs], '{:.2f}')} | {rng([r['out_tok_s'] for r in rs], '{:.1f}')} | "
                  f"{rng([r['tokens_per_request'] for r in rs], '{:.1f}')} | "
                  f"{rng([r['ttft_p50'] * 1000 for r in rs], '{:.0f}')} | {rng([r['ttft_p99'] * 1000 for r in rs], '{:.0f}')} |")
    if summary["long_context"]:
        print("\n| ckv, long context | context tokens | TTFT cold (s) | KV bytes per request | decode tok/s (1 client) | "
              "decode tok/s (4 clients, reused context) | server peak RSS |\n|---|---|---|---|---|---|---|")
        for r in summary["long_context"]:
            print(f"| {r['press']} | {r['context_tokens']} | {r['cold_ttft_s']:.1f} | {r['kv_bytes_per_request'] / 2**20:.1f} MiB "
                  f"(full {r['kv_bytes_full'] / 2**20:.1f} MiB) | {r['cold_decode_tok_s']:.1f} | {r['reused_4_clients_tok_s']:.1f} | "
                  f"{r['server_peak_rss'] / 2**20:.0f} MiB |")
    print(f"\nlogs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
