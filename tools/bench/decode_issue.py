#!/usr/bin/env python3
"""decode_issue.py - the issue-rate bound of the decode attention kernels, from the SASS of the GPU
module (docs/benchmarks.md, "Decode kernels against the issue rate"): per kernel and architecture,
the warp instructions its key loop executes per warp-wide 16-byte K/V load (512 bytes), against the
instructions a GPU can issue while its HBM delivers 512 bytes:
    budget = SMs x 4 schedulers x clock x 512 / HBM bytes/s   (H200: 111, A100: 153)
    share of HBM bandwidth reachable = budget / instructions per load, at most 100%.
The FMA kernel (decode_kernel<bf16,RP>) loads with LDG.E.128; its loop holds two versions, one for a
key in one lane (head dim 8, never taken at 64-128) and one with the shuffle loops of the lanes of a
key, run log2(lanes) times: the count is that path's (lanes 8 at head dim 64, 16 at 80-128). The
tensor-core kernel (decode_mma_kernel<HD>) loads with cp.async (LDGSTS) and its tile loop has no
branch but its own. No GPU needed: the SASS parser of tests/cuda/test_sass.py and cuobjdump.
    tools/bench/decode_issue.py [--module build/libckv_cuda.so]
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cuda"))
import test_sass as T  # noqa: E402

# SMs, warp schedulers per SM, clock (boost), HBM bytes/s: datasheet figures (roofline.py's GPUS)
ISSUE = {"H200": (132, 4, 1.98e9, 4.8e12, "sm_90"), "A100": (108, 4, 1.41e9, 2.04e12, "sm_80")}
GOAL = 0.70  # the decode attention's goal: 70% of the copy bandwidth


def budget(gpu):
    sms, sched, clock, hbm, _ = ISSUE[gpu]
    return sms * sched * clock * 512.0 / hbm


def fma_path(body, lanes_log2):
    """Instructions of the FMA key loop on the path taken with 2^lanes_log2 lanes per key."""
    addrs = [a for a, _, _ in body]
    a_sw, tgt = next((a, tg) for a, mn, tg in body if tg is not None and tg > a and mn.startswith("BRA")
                     and sum(1 for x in addrs if a < x < tg) > 300)
    pro = [x for x in body if x[0] <= a_sw]
    ver = [x for x in body if x[0] >= tgt]
    small = [(tg, a) for a, mn, tg in ver if tg is not None and tg < a and tg >= tgt]
    extra = sum((lanes_log2 - 1) * sum(1 for x in ver if tg <= x[0] <= a) for tg, a in small)
    return len(pro) + len(ver) + extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default=os.path.join(ROOT, "build", "libckv_cuda.so"))
    a = ap.parse_args()
    cu = T.find_cuobjdump(None)
    if not cu or not os.path.isfile(a.module):
        print("decode_issue: needs cuobjdump and %s" % a.module)
        return 77
    env = dict(os.environ)
    nvd = T.find_nvdisasm(cu)
    if nvd:
        env["PATH"] = os.path.dirname(nvd) + os.pathsep + env.get("PATH", "")
    code = T.parse_sass(subprocess.run([cu, "-sass", a.module], capture_output=True, text=True, env=env).stdout)
    names = T.demangle([m for _, m in code])
    print("budget per 512 bytes: " + ", ".join("%s %.1f (%.1f at the %d%% goal)" % (g, budget(g), budget(g) / GOAL,
                                                                                     GOAL * 100) for g in ISSUE))
    print("| arch | kernel | path | loop instructions | loads | per load | reachable share (of HBM) |")
    print("|---|---|---|---:|---:|---:|---:|")
    rows = []
    for (arch, m), ins in code.items():
        n = names[m]
        if n in ("decode_kernel<bf16,4>", "decode_kernel<bf16,8>"):
            for _, _, body in T.inner_loops_of(ins, "LDG.E.128"):
                loads = T.count(body, "LDG.E.128")
                rows.append((arch, n, "static", len(body), loads))
                for l2, what in ((3, "head dim 64 (8 lanes a key)"), (4, "head dim 128 (16 lanes)")):
                    rows.append((arch, n, what, fma_path(body, l2), loads))
        elif n.startswith("decode_mma_kernel<"):
            for _, _, body in T.inner_loops_of(ins, "HMMA"):
                rows.append((arch, n, "tile loop", len(body), T.count(body, "LDGSTS")))
    for arch, n, what, ins_, loads in sorted(rows):
        gpu = next(g for g, v in ISSUE.items() if v[4] == arch)
        per = ins_ / loads
        print("| %s | %s | %s | %d | %d | %.1f | %s %.0f%% |" % (arch, n, what, ins_, loads, per, gpu,
                                                               min(100.0, 100.0 * budget(gpu) / per)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
