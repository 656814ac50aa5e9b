#!/usr/bin/env python3
"""bench_kernels_peer.py - ckv's kernel microbenchmarks (tools/bench/bench_kernels.c) beside their torch
peers, alternated in one run: for each round and each case, the ckv kernel (bench_kernels --stdin,
one process that allocates once), then its peers on the same shapes:
  prefill attention -> torch scaled_dot_product_attention, causal, bf16, flash backend forced when
                       torch offers it (GQA by enable_gqa, else by repeated KV heads);
  decode attention  -> SDPA with one query row per sequence, and a device copy of the same bytes
                       (the bandwidth ceiling: bytes read + bytes written over the time).
The eviction and sample cases have no peer. Prints each measurement as a JSON line, then the table of
medians over the rounds with the ratios against their goals (reported, never asserted): ckv prefill
TFLOP/s / SDPA's >= 0.60, ckv decode GB/s / copy GB/s >= 0.70. Writes OUT/kernels.jsonl.
--rehearse: small shapes on --backend cuda-emu and torch on the CPU (skipped, with a line, when torch
is not installed); the figures mean nothing, the run proves that every command runs and its output
parses. Exits 1 when a command fails or a line cannot be read. It measures nothing of whole models
(bench_gpu.py does that).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GOALS = {"prefill_attention": ("sdpa", 0.60), "decode_attention": ("copy", 0.70)}


class TorchPeers:
    """The torch side: SDPA at a case's shape and a copy of its bytes, timed as bench_kernels times
    (warm-up, `inner` calls between two syncs, median and min of `reps`)."""

    def __init__(self, torch, device, reps, warmup):
        self.torch, self.device, self.reps, self.warmup = torch, device, reps, warmup
        self.gpu = device == "cuda"
        self.cache = {}

    def sync(self):
        if self.gpu:
            self.torch.cuda.synchronize()

    def timed(self, fn, min_ms=2.0):
        for _ in range(self.warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        one = (time.perf_counter() - t0) * 1e3
        inner = max(1, min(64, int(-(-min_ms // one)) if one > 0 else 64))
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            self.sync()
            ts.append((time.perf_counter() - t0) * 1e3 / inner)
        return statistics.median(ts), min(ts), inner

    def sdpa_inputs(self, shape, n_q):
        """q [B, Hq, n_q, d], k, v [B, Hkv, rows, d] bf16 (kept between rounds)."""
        key = (shape["batch"], shape["rows"], n_q)
        if key not in self.cache:
            t = self.torch
            g = t.Generator(device=self.device).manual_seed(1)
            mk = lambda h, n: t.rand(shape["batch"], h, n, shape["head_dim"], device=self.device, generator=g,
                                     dtype=t.float32).sub_(0.5).to(t.bfloat16)
            self.cache.clear()  # one shape at a time on the device
            self.cache[key] = (mk(shape["heads"], n_q), mk(shape["kv_heads"], shape["rows"]),
                               mk(shape["kv_heads"], shape["rows"]))
        return self.cache[key]

    def sdpa(self, shape, causal):
        """(median ms, min ms, inner, how): SDPA at the shape; prefill: causal over rows queries."""
        t = self.torch
        F = t.nn.functional
        q, k, v = self.sdpa_inputs(shape, shape["rows"] if causal else 1)
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            forced = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        except ImportError:
            forced = None
        group = shape["heads"] // shape["kv_heads"]
        gqa = lambda: (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))

        def repeated():  # the KV heads repeated once, outside the timing
            kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
        attempts = []
        if forced:
            attempts = [("flash, enable_gqa", forced, gqa), ("flash, repeated KV heads", forced, repeated)]
        attempts += [("default backend, enable_gqa", None, gqa), ("default backend, repeated KV heads", None, repeated)]
        errors = []
        for how, ctx, make in attempts:
            try:
                fn = make()
                if ctx is None:
                    return self.timed(fn) + (how,)
                with ctx():
                    return self.timed(fn) + (how,)
            except (RuntimeError, TypeError) as e:
                errors.append("%s: %s" % (how, (str(e).splitlines() or [""])[0][:80]))
        raise RuntimeError("; ".join(errors))

    def copy(self, nbytes):
        t = self.torch
        n = max(1, int(nbytes) // 2)
        src = t.empty(n, dtype=t.bfloat16, device=self.device).fill_(1.0)
        dst = t.empty_like(src)
        r = self.timed(lambda: dst.copy_(src))
        del src, dst
        return r + ("device copy",)


def peer_lines(peers, ckv):
    """The torch measurements of one ckv line (a list of JSON-ready dicts)."""
    kernel, shape = ckv["kernel"], ckv["shape"]
    out = []
    if kernel == "prefill_attention":
        med, mn, inner, how = peers.sdpa(shape, True)
        out.append({"peer": "sdpa", "how": how, "median_ms": med, "min_ms": mn, "inner": inner,
                    "flops": ckv["flops"], "tflops": ckv["flops"] / (med * 1e-3) / 1e12})
    elif kernel == "decode_attention":
        med, mn, inner, how = peers.sdpa(shape, False)
        out.append({"peer": "sdpa", "how": how, "median_ms": med, "min_ms": mn, "inner": inner,
                    "bytes": ckv["bytes"], "gbs": ckv["bytes"] / (med * 1e-3) / 1e9})
        med, mn, inner, how = peers.copy(ckv["bytes"])
        out.append({"peer": "copy", "how": how, "median_ms": med, "min_ms": mn, "inner": inner,
                    "bytes": 2 * ckv["bytes"], "gbs": 2 * ckv["bytes"] / (med * 1e-3) / 1e9})
    for o in out:
        o.update(case=ckv["case"], kernel=kernel, round=ckv["round"], device=peers.device)
    return out


def read_ckv(raw, case):
    """bench_kernels' JSON line for `case`, with every field the table reads; ValueError/KeyError if not."""
    line = json.loads(raw)
    for key in ("kernel", "backend", "round", "median_ms", "min_ms"):
        line[key]  # noqa: B018  (KeyError when missing)
    if line["case"] != case or not line["median_ms"] > 0 or rate(line) is None:
        raise ValueError("case %s, median %s ms, rate %s" % (line["case"], line["median_ms"], rate(line)))
    for key in ("rows", "batch", "heads", "kv_heads", "head_dim"):
        line["shape"][key]  # noqa: B018
    return line


def rate(line):
    return line.get("tflops", line.get("gbs"))


def table(lines, header):
    """The summary: per case, ckv's median over rounds, then each peer's and the ratio to it."""
    rows = ["", "== kernel microbenchmarks (%s)" % header,
            "%-26s %-18s %10s %18s %7s %s" % ("case", "engine", "median ms", "rate", "ratio", "goal")]
    cases = []
    for l in lines:
        if "peer" not in l and l["case"] not in cases:
            cases.append(l["case"])
    for case in cases:
        ckv = [l for l in lines if l["case"] == case and "peer" not in l]
        unit = "TFLOP/s" if "tflops" in ckv[0] else "GB/s"
        c_ms, c_rate = statistics.median(l["median_ms"] for l in ckv), statistics.median(rate(l) for l in ckv)
        rows.append("%-26s %-18s %10.4f %18s %7s %s" % (case, "ckv " + ckv[0]["backend"], c_ms,
                                                        "%.3g %s" % (c_rate, unit), "", ""))
        for peer in ("sdpa", "copy"):
            pl = [l for l in lines if l["case"] == case and l.get("peer") == peer]
            if not pl:
                continue
            p_ms, p_rate = statistics.median(l["median_ms"] for l in pl), statistics.median(rate(l) for l in pl)
            goal = GOALS.get(ckv[0]["kernel"])
            g = ">= %.2f" % goal[1] if goal and goal[0] == peer else "-"
            rows.append("%-26s %-18s %10.4f %18s %7.2f %s" % ("", "torch " + peer, p_ms, "%.3g %s" % (p_rate, unit),
                                                              c_rate / p_rate if p_rate else float("nan"), g))
    return "\n".join(r.rstrip() for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="the bench_kernels binary")
    ap.add_argument("--out", required=True, help="directory for kernels.jsonl")
    ap.add_argument("--backend", default=None, help="ckv backend (cuda; a rehearsal: cuda-emu)")
    ap.add_argument("--shapes", default=None, choices=("full", "small"), help="full; a rehearsal: small")
    ap.add_argument("--rounds", type=int, default=None, help="alternations of every case (3; a rehearsal: 2)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per measurement (10; a rehearsal: 3)")
    ap.add_argument("--warmup", type=int, default=None, help="calls before timing (2; a rehearsal: 0)")
    ap.add_argument("--cases", default=None, help="comma-separated subset of bench_kernels --list")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--rehearse", action="store_true")
    a = ap.parse_args()
    backend = a.backend or ("cuda-emu" if a.rehearse else "cuda")
    shapes = a.shapes or ("small" if a.rehearse else "full")
    rounds = a.rounds or (2 if a.rehearse else 3)
    reps = a.reps or (3 if a.rehearse else 10)
    warmup = a.warmup if a.warmup is not None else (0 if a.rehearse else 2)
    if rounds < 1 or reps < 1 or warmup < 0:
        print("bench_kernels_peer: --rounds and --reps must be >= 1, --warmup >= 0")
        return 2
    os.makedirs(a.out, exist_ok=True)
    common = ["--shapes", shapes] + (["--cases", a.cases] if a.cases else [])
    try:
        p = subprocess.run([a.bench, "--list"] + common, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        print("bench_kernels --list: %s" % e)
        return 1
    cases = p.stdout.split()
    if p.returncode != 0 or not cases:
        print("bench_kernels --list: exit %d: %s" % (p.returncode, (p.stderr.strip().splitlines() or [""])[-1]))
        return 1
    peers = None
    if a.skip_torch:
        print("torch peers: skipped (--skip-torch)")
    else:
        try:
            import torch
        except ImportError:
            torch = None
            print("torch peers: skipped (torch is not installed for %s)" % sys.executable)
        if torch is not None:
            device = "cpu" if a.rehearse else "cuda"
            peers = TorchPeers(torch, device, reps, warmup)
            print("torch peers: torch %s on %s" % (torch.__version__, device))
    cmd = [a.bench, "--backend", backend, "--stdin", "--reps", str(reps), "--warmup", str(warmup)] + common
    print("running: " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, failed = [], False
    try:
        for r in range(rounds):
            for case in cases:
                proc.stdin.write(case + "\n")
                proc.stdin.flush()
                raw = proc.stdout.readline()
                try:
                    ckv = read_ckv(raw, case)
                except (ValueError, KeyError, TypeError) as e:
                    proc.stdin.close()
                    err = proc.stderr.read().strip().splitlines()
                    raise RuntimeError("bench_kernels %s: no measurement line (%s: %s)%s" % (
                        case, type(e).__name__, e, ": " + err[-1] if err else ""))
                print(json.dumps(ckv), flush=True)
                lines.append(ckv)
                if peers:
                    try:
                        for pl in peer_lines(peers, ckv):
                            print(json.dumps(pl), flush=True)
                            lines.append(pl)
                    except RuntimeError as e:
                        print("torch peer of %s: %s" % (case, e), flush=True)
                        failed = True
        proc.stdin.close()
        rc = proc.wait(timeout=60)
        if rc != 0:
            err = proc.stderr.read().strip().splitlines()
            raise RuntimeError("bench_kernels exit %d: %s" % (rc, err[-1] if err else ""))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(str(e), flush=True)
        proc.kill()
        failed = True
    with open(os.path.join(a.out, "kernels.jsonl"), "w") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    if lines:
        header = "ckv --backend %s, --shapes %s, %d rounds x %d reps; medians over the rounds%s" % (
            backend, shapes, rounds, reps, "; torch on " + peers.device if peers else "; no torch peers")
        if a.rehearse:
            header += " - a rehearsal: the figures mean nothing"
        print(table(lines, header))
    print("kernel microbenchmarks: %s" % ("FAILED (see above)" if failed else "%d measurements read" % len(lines)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
