#!/usr/bin/env python3
"""roofline.py - the roofline model of ckv's CUDA backend: per kernel and per step (prefill of the
whole prompt, one decode step, the eviction ops of a press) the floating-point work and the bytes
that must cross HBM for a model shape, and the time they take at the ceilings of a GPU:
    time = max(FLOPs / compute peak of the kernel's class, bytes / HBM bandwidth)
Classes: 'tc' (bf16 tensor cores), 'fp32' (CUDA-core FMA), 'mem' (bandwidth only). Each kernel is
timed at the class it should run at ('ideal') and at the class today's kernel runs at ('today', with
the bytes today's kernel moves beyond the ideal and the FLOPs it does as a multiple of the ideal's
where they differ), e.g. the window scores run on tensor cores today, but as two passes of three
mma per product (6x the ideal's FLOPs), the column-sum pass re-reading the keys per query head.
Bytes are compulsory traffic: each operand once per use as the code is organised (weights once per
prefill chunk, K/V once per chunk of queries, kept K/V once per decode step), so L2 reuse inside a
kernel is assumed; element-wise kernels and launch overheads are left out (small at these shapes,
but not at batch 1 decode: a CUDA graph is what removes the launches).

Ceilings: the datasheets (NVIDIA H200 Tensor Core GPU and A100 Tensor Core GPU datasheets: dense
bf16 tensor-core rate, fp32 rate, HBM bandwidth and capacity), or measured ones (--ceilings FILE: a
bench.json of tools/bench/bench_gpu.py, whose copy bandwidth and bf16 GEMM rate replace the H200's).

  roofline.py [--cases all|NAME..] [--gpu H200|A100|all] [--ceilings bench.json] [--markdown]
  roofline.py --check     the model's own checks (parameter counts against the published ones)
The last tables are prefill attention against its goal (>= 60% of torch SDPA's flash backend, taken
at FlashAttention-2's published efficiency until tests/gpu/run.sh measures SDPA), the prefill kernel's
tiles at 8K and 32K (the mma rate and L2 traffic it must sustain to meet that goal, before and after
its 128-row blocks and two K/V stages), the eviction's share of the TTFT it adds to (goal <= 3% at
32K), decode attention against its goal (>= 70% of the copy bandwidth, batch 1 and 16), per GPU and
shape, and the prefill kernel's split-K for a chunk of query rows over a long prefix per tensor-parallel
degree.
Used by bench_gpu.py --dry-run and for docs/benchmarks.md (--markdown prints its tables).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUS = {  # datasheet figures: dense bf16 tensor core TFLOP/s, fp32 TFLOP/s, HBM GB/s, HBM bytes
    "H200": {"tc": 989.4, "fp32": 67.0, "hbm_gbs": 4800.0, "mem": 141e9, "sms": 132, "source": "datasheet (H200 SXM)"},
    "A100": {"tc": 312.0, "fp32": 19.5, "hbm_gbs": 2039.0, "mem": 80e9, "sms": 108, "source": "datasheet (A100 80GB SXM)"},
}
# The prefill attention goal: >= 60% of torch SDPA's flash backend, which runs FlashAttention-2. Its
# published forward efficiency (Dao, arXiv:2307.08691: up to 73% of the A100's peak; about 35% of an
# H100's, the H200's SM) stands in for the measured SDPA rate until tests/gpu/run.sh measures it.
FA2_FRACTION = {"H200": 0.35, "A100": 0.73}
GOAL_OF_SDPA = 0.60
# The eviction goal: critical_adakv:snapkv at budget 0.2 adds <= 3% to TTFT at 32K (8B), the prefill's
# attention taken at its goal.
EVICT_GOAL = 0.03
# The decode attention goal: >= 70% of the copy bandwidth (the datasheet HBM rate until
# tests/gpu/run.sh measures a copy kernel), at batch 1 and 16. Split-KV plan of
# src/backend/cuda/cuda_decode.cu (plan_splits): blocks resident per SM, splits per segment at most,
# keys per split at least, and the share of the best wave efficiency taken.
GOAL_OF_COPY = 0.70
DECODE_BATCHES = (1, 16)
DK_MAX_SPLITS, DK_MIN_CHUNK, DK_EFF_SHARE = 64, 256, 0.95
# The prefill kernel's split-K (src/backend/cuda/cuda_prefill_split.cu, docs/gpu.md 3b): query rows
# per block, resident blocks per SM, the widest head dim, keys per split at least, split blocks at
# most (waves), split boundaries on whole key tiles. SPLIT_K_CASES: a chunk of query rows over a
# long cached prefix (name, model, prefix, chunk rows), at each tensor-parallel degree.
FA_BM, FA_BLOCKS_PER_SM, FA_HD_MAX, PS_MIN_CHUNK, PS_WAVES, PS_KEY_ALIGN = 64, 2, 128, 1024, 2, 64
SPLIT_K_CASES = [("8B chunk 512 @128K", "llama-3.1-8b-instruct", 131072, 512),
                 ("8B chunk 512 @32K", "llama-3.1-8b-instruct", 32768, 512),
                 ("32B chunk 512 @128K", "qwen2.5-32b-instruct-128k", 130000, 512)]
SPLIT_K_TP = (1, 2, 4, 8)


def dk_blocks_per_sm(rows, d):
    """Resident blocks per SM of the bf16 decode kernel that takes `rows` query rows at head dim d:
    the tensor-core kernel for 4-8 rows at head dims 64-128 (dm_blocks_per_sm, cuda_decode_mma.cu),
    else the FMA kernel's instance (dk_blocks_per_sm, cuda_decode.cu)."""
    if 4 <= rows <= 8 and d in (64, 80, 96, 128):
        return 3 if d >= 128 else 4
    return 2 if rows > 4 else 3 if rows > 2 else 4
CASES = [  # name, model config directory, context, press
    ("8B@32K full", "llama-3.1-8b-instruct", 32768, None),
    ("8B@32K critical_adakv", "llama-3.1-8b-instruct", 32768, "critical_adakv:snapkv"),
    ("8B@128K full", "llama-3.1-8b-instruct", 131072, None),
    ("8B@128K critical_adakv", "llama-3.1-8b-instruct", 131072, "critical_adakv:snapkv"),
    ("32B@128K full", "qwen2.5-32b-instruct-128k", 130000, None),
    ("32B@128K critical_adakv", "qwen2.5-32b-instruct-128k", 130000, "critical_adakv:snapkv"),
]
BF16, F32 = 2, 4
WINDOW = 64  # snapkv's observation window (kvpress default)
WIN_CHUNK = 512  # keys per block of the window scores' statistics pass (cuda_evict_window.cu)


def load_config(name):
    with open(os.path.join(ROOT, "configs", "models", name, "config.json")) as f:
        c = json.load(f)
    c["head_dim"] = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c


def shape(c):
    return (c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"],
            c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"])


def param_count(c):
    """Parameters of the checkpoint: embeddings, layers (projections, qkv biases, norms), final
    norm, lm_head unless tied."""
    D, d, H, Hkv, F, L, V = shape(c)
    bias = (H + 2 * Hkv) * d if c.get("model_type") == "qwen2" else 0
    layer = D * H * d * 2 + D * Hkv * d * 2 + 3 * D * F + 2 * D + bias
    return V * D + L * layer + D + (0 if c.get("tie_word_embeddings") else V * D)


def kernels(c, context, press, budget=0.2, chunk=2048, new_tokens=64, batch=1):
    """[(step, kernel, today's ckv kernel, FLOPs, bytes, ideal class, today's class or (class, extra
    bytes))] summed over
    the layers, for one prefill of `context` tokens (chunks of `chunk`), the eviction ops of
    `press` at `budget` (once per layer, after the prefill), and one decode step of `batch`
    sequences at the cache length they see halfway through `new_tokens`."""
    D, d, H, Hkv, F, L, V = shape(c)
    n, w = context, WINDOW
    chunks = (n + chunk - 1) // chunk
    rows = [(i + 1) * chunk if (i + 1) * chunk < n else n for i in range(chunks)]  # keys seen by chunk i
    out = []

    def add(step, name, today, flops, nbytes, ideal, now):
        now = (now[0], float(L * now[1])) + now[2:] if isinstance(now, tuple) else now
        out.append((step, name, today, float(L * flops), float(L * nbytes), ideal, now))

    # ---- prefill (per layer, then x L) ----
    for name, m, k in (("q/k/v projection", (H + 2 * Hkv) * d, D), ("o projection", D, H * d),
                       ("gate/up projection", 2 * F, D), ("down projection", D, F)):
        add("prefill", name, "cuBLAS bf16", 2 * n * m * k, chunks * m * k * BF16 + n * k * BF16 + n * m * F32, "tc", "tc")
    pairs = n * (n + 1) // 2  # causal (query, key) pairs
    kv_reads = sum(rows) * Hkv * d * 2 * BF16
    add("prefill", "attention", "flash_kernel", 4 * H * d * pairs, kv_reads + 2 * n * H * d * F32, "tc", "tc")
    out.append(("prefill", "lm_head (last token)", "cuBLAS bf16", 2.0 * D * V, float(D * V * BF16), "tc", "tc"))
    # ---- eviction (critical_adakv:snapkv and the other snapkv-scored presses) ----
    if press:
        kept = int(n * budget)
        add("evict", "window queries (q_proj, RoPE)", "cuBLAS", 2 * w * H * d * D, H * d * D * BF16, "tc", "tc")
        # logits q.k of the window's queries over all keys; softmax and column sums from the same tiles.
        # Today (cuda_evict_window.cu): two passes of mma.sync m16n8k16, each product as the three mma of
        # the fp32 queries' bf16 split (6x the ideal's tensor-core FLOPs): the statistics pass reads the
        # keys once (a chunk's row blocks run side by side), the column-sum pass once per query head
        # (snapkv's sums are per query head: a KV head's keys read by each head of its group, counted as
        # HBM traffic); beyond the ideal it also reads the fp32 window queries once per pass, writes and
        # merges the per-chunk statistics (float max, double sum) and accumulates the column sums in
        # double ([H, n]: zeroed, read and written)
        n_win_chunks = (n + WIN_CHUNK - 1) // WIN_CHUNK
        add("evict", "window scores (QK^T, softmax, column sums)",
            "window_stats + window_merge + window_colsum", 2 * w * n * d * H, n * Hkv * d * BF16 + n * H * F32, "tc",
            ("tc", n * H * d * BF16 + 2 * w * H * d * F32 + 2 * n_win_chunks * H * w * (F32 + 8) + 5 * n * H * F32,
             3 * 2))
        if press.startswith("critical"):
            # ||V[t] W_O^h||_1 for every head h: the FLOPs of one more o projection over the context
            # today: vnorm_mma_kernel, mma.sync with the L1 norm in its epilogue (the projection stays
            # in registers); beyond the ideal it reads each KV head's values once per query head of its
            # group (n (H - Hkv) d BF16) and writes then reads back the per-head norms (2 n H F32);
            # o_proj's head columns are re-read per tile of 128 rows from L2 (not counted)
            add("evict", "value norms (L1 of V W_O^h)", "vnorm_mma_kernel + vnorm_add", 2 * n * d * D * H,
                n * Hkv * d * BF16 + H * d * D * BF16 + n * H * F32, "tc",
                ("tc", n * (H - Hkv) * d * BF16 + 2 * n * H * F32))
        add("evict", "pool, head mean, AdaKV top-k", "pool, head_sum, radix select (sel_*)", 0,
            n * H * F32 + 6 * n * Hkv * F32, "mem", "mem")
        add("evict", "gather kept rows", "kv_gather", 0, 2 * kept * Hkv * d * 2 * BF16, "mem", "mem")
        ctx_rows = kept + new_tokens // 2
    else:
        ctx_rows = n + new_tokens // 2
    # ---- one decode step ----
    for name, m, k in (("q/k/v projection", (H + 2 * Hkv) * d, D), ("o projection", D, H * d),
                       ("gate/up projection", 2 * F, D), ("down projection", D, F)):
        add("decode", name, "cuBLAS bf16", 2 * batch * m * k, m * k * BF16, "tc", "tc")
    add("decode", "attention", "decode_kernel + merge", 4 * batch * H * d * ctx_rows,
        batch * ctx_rows * Hkv * d * 2 * BF16, "mem", "mem")
    out.append(("decode", "lm_head", "cuBLAS bf16", 2.0 * batch * D * V, float(D * V * BF16), "tc", "tc"))
    return out


def seconds(flops, nbytes, cls, gpu):
    """Roofline time of one kernel at a class."""
    rate = {"tc": gpu["tc"], "fp32": gpu["fp32"], "mem": None}[cls]
    t_mem = nbytes / (gpu["hbm_gbs"] * 1e9)
    return max(flops / (rate * 1e12) if rate else 0.0, t_mem)


def memory_need(c, context, press, budget=0.2, new_tokens=64):
    """Bytes the GPU holds at the peak: bf16 weights and the full cache before eviction (plus the
    new tokens); workspaces are left out (ckv inspect --backend cuda plans them)."""
    D, d, H, Hkv, F, L, V = shape(c)
    return param_count(c) * BF16 + L * (context + new_tokens) * Hkv * d * 2 * BF16


def ceilings_from(path):
    """H200 ceilings replaced by the measured ones of a bench_gpu.py bench.json."""
    with open(path) as f:
        m = json.load(f).get("ceilings", {})
    if not m.get("gemm_tflops") or not m.get("copy_gbs"):
        sys.exit("roofline: %s has no measured ceilings (ceilings.gemm_tflops, ceilings.copy_gbs)" % path)
    g = dict(GPUS["H200"])
    g.update(tc=m["gemm_tflops"], hbm_gbs=m["copy_gbs"], source="measured (%s)" % os.path.basename(path))
    return g


def today_class(now):
    """Today's class of a kernel: `now` is a class, or (class, bytes today's kernel moves beyond the ideal
    [, the FLOPs it does as a multiple of the ideal's])."""
    return now[0] if isinstance(now, tuple) else now


def today_extra(now):
    return now[1] if isinstance(now, tuple) else 0


def today_flops_factor(now):
    return now[2] if isinstance(now, tuple) and len(now) > 2 else 1


def case_table(case, gpu):
    """Rows (step, kernel, today's kernel, FLOPs, bytes, ideal s, today s) and the step totals."""
    name, cfg_dir, context, press = case
    c = load_config(cfg_dir)
    rows = [(st, k, today, fl, by, seconds(fl, by, ideal, gpu),
             seconds(fl * today_flops_factor(now), by + today_extra(now), today_class(now), gpu))
            for st, k, today, fl, by, ideal, now in kernels(c, context, press)]
    tot = {}
    for st, _, _, _, _, si, sn in rows:
        a = tot.setdefault(st, [0.0, 0.0])
        a[0] += si
        a[1] += sn
    need = memory_need(c, context, press)
    return rows, tot, need


def fmt_t(s):
    return "%.2f ms" % (s * 1e3) if s < 1 else "%.2f s" % s


def summary_rows(cases, gpus):
    """One row per (gpu, case): TTFT, eviction share, decode ms/token (ideal and today's classes)."""
    out = []
    for gname, gpu in gpus:
        for case in cases:
            rows, tot, need = case_table(case, gpu)
            pre, ev, dec = tot["prefill"], tot.get("evict", [0.0, 0.0]), tot["decode"]
            out.append({"gpu": gname, "case": case[0], "ttft_ideal": pre[0] + ev[0], "ttft_today": pre[1] + ev[1],
                        "evict_ideal": ev[0] / pre[0], "evict_today": ev[1] / pre[1], "decode_ideal": dec[0],
                        "decode_today": dec[1], "fits": need <= gpu["mem"], "need": need})
    return out


def print_tables(cases, gpus, markdown):
    for gname, gpu in gpus:
        for case in cases:
            rows, tot, need = case_table(case, gpu)
            fit = "" if need <= gpu["mem"] else " - does not fit at tp 1: %.0f GB of weights and cache > %.0f GB" % (
                need / 1e9, gpu["mem"] / 1e9)
            title = "%s on %s (%s: %.0f TFLOP/s bf16, %.1f fp32, %.0f GB/s)%s" % (
                case[0], gname, gpu["source"], gpu["tc"], gpu["fp32"], gpu["hbm_gbs"], fit)
            if markdown:
                print("\n**%s**\n" % title)
                print("| step | kernel | today's kernel | GFLOP | GB | roofline | at today's class |")
                print("|---|---|---|---:|---:|---:|---:|")
            else:
                print("\n== roofline: " + title)
                print("%-8s %-44s %-34s %10s %8s %10s %10s" % ("step", "kernel", "today's kernel", "GFLOP", "GB",
                                                               "roofline", "today"))
            for st, k, today, fl, by, si, sn in rows:
                cells = (st, k, today, "%.1f" % (fl / 1e9), "%.2f" % (by / 1e9), fmt_t(si), fmt_t(sn))
                if markdown:
                    print("| %s |" % " | ".join(cells))
                else:
                    print("%-8s %-44s %-34s %10s %8s %10s %10s" % cells)
            for st, (si, sn) in tot.items():
                cells = ("**%s**" % st if markdown else st, "total", "", "", "", fmt_t(si), fmt_t(sn))
                print(("| %s |" % " | ".join(cells)) if markdown else "%-8s %-44s %-34s %10s %8s %10s %10s" % cells)


def print_summary(cases, gpus, markdown):
    rows = summary_rows(cases, gpus)
    hdr = ("GPU", "case", "TTFT roofline", "today's classes", "eviction / prefill", "today's classes",
           "decode ms/token", "fits tp 1")
    if markdown:
        print("| %s |" % " | ".join(hdr))
        print("|---|---|---:|---:|---:|---:|---:|---|")
    else:
        print("\n== roofline summary (per step; 'today's classes': each kernel at the class it runs at today)")
        print("%-5s %-24s %13s %15s %18s %15s %15s %9s" % hdr)
    for r in rows:
        cells = (r["gpu"], r["case"], fmt_t(r["ttft_ideal"]), fmt_t(r["ttft_today"]),
                 "%.1f%%" % (100 * r["evict_ideal"]) if r["evict_ideal"] else "-",
                 "%.1f%%" % (100 * r["evict_today"]) if r["evict_today"] else "-",
                 "%.2f" % (r["decode_ideal"] * 1e3), "yes" if r["fits"] else "no (%.0f GB)" % (r["need"] / 1e9))
        print(("| %s |" % " | ".join(cells)) if markdown else "%-5s %-24s %13s %15s %18s %15s %15s %9s" % cells)


def attention_at_goal(rows, gpu, frac):
    """Prefill attention of a case's rows: FLOPs and its time at the tensor-core peak, at
    FlashAttention-2's published efficiency (frac of the peak) and at the goal (60% of that rate)."""
    fl, by = next((r[3], r[4]) for r in rows if r[0] == "prefill" and r[1] == "attention")
    t_peak = seconds(fl, by, "tc", gpu)
    t_sdpa = max(fl / (gpu["tc"] * frac * 1e12), by / (gpu["hbm_gbs"] * 1e9))
    t_goal = max(fl / (gpu["tc"] * frac * GOAL_OF_SDPA * 1e12), by / (gpu["hbm_gbs"] * 1e9))
    return fl, t_peak, t_sdpa, t_goal


def goal_cases(cases, gpus):
    """(gpu name, gpu, FlashAttention-2 fraction, case, step totals, prefill attention at its goal as
    attention_at_goal returns it) for every case on the GPUs with a published FlashAttention-2 rate."""
    for gname, gpu in gpus:
        frac = FA2_FRACTION.get(gname)
        if frac is None:
            continue
        for case in cases:
            rows, tot, _ = case_table(case, gpu)
            yield gname, gpu, frac, case, tot, attention_at_goal(rows, gpu, frac)


def attention_goal_rows(cases, gpus):
    """Per (gpu, case): prefill attention's FLOPs and its time at the tensor-core peak, at
    FlashAttention-2's published efficiency (the SDPA flash reference) and at the goal (60% of that
    rate), with the whole TTFT roofline when attention runs at the goal."""
    out = []
    for gname, gpu, frac, case, tot, (fl, t_peak, t_sdpa, t_goal) in goal_cases(cases, gpus):
        ttft = tot["prefill"][0] + tot.get("evict", [0.0, 0.0])[0] - t_peak + t_goal
        out.append({"gpu": gname, "case": case[0], "tflop": fl / 1e12, "peak": t_peak, "sdpa": t_sdpa,
                    "goal": t_goal, "goal_tflops": gpu["tc"] * frac * GOAL_OF_SDPA, "ttft_goal": ttft,
                    "share": t_goal / ttft})
    return out


def print_goal_table(title, hdr, widths, rule, cells, markdown):
    """A goal table: markdown (rule: its separator row) or text (title, then rows in widths)."""
    if markdown:
        print("| %s |" % " | ".join(hdr))
        print(rule)
    else:
        print("\n== " + title)
        print(widths % hdr)
    for c in cells:
        print(("| %s |" % " | ".join(c)) if markdown else widths % c)


def print_attention_goal(cases, gpus, markdown):
    rows = attention_goal_rows([c for c in cases if c[3] is None], gpus)  # the press does not change it
    hdr = ("GPU", "case", "attention TFLOP", "at tc peak", "SDPA flash (FA2 rate)", "goal (60%)", "goal TFLOP/s",
           "TTFT at goal", "attention share")
    cells = [(r["gpu"], r["case"], "%.1f" % r["tflop"], fmt_t(r["peak"]), fmt_t(r["sdpa"]), fmt_t(r["goal"]),
              "%.0f" % r["goal_tflops"], fmt_t(r["ttft_goal"]), "%.0f%%" % (100 * r["share"])) for r in rows]
    print_goal_table("prefill attention against its goal (>= %d%% of torch SDPA's flash backend, taken at "
                     "FlashAttention-2's published efficiency until measured)" % (100 * GOAL_OF_SDPA), hdr,
                     "%-5s %-16s %15s %11s %21s %11s %13s %13s %15s", "|---|---|---:|---:|---:|---:|---:|---:|---:|",
                     cells, markdown)


def evict_goal_rows(cases, gpus):
    """Per (gpu, case with a press): the eviction's time (ideal and today's classes) against the
    prefill it follows, with prefill attention at its goal: the TTFT the eviction adds to."""
    out = []
    for gname, _, _, case, tot, (_, t_peak, _, t_goal) in goal_cases(cases, gpus):
        base, ev = tot["prefill"][0] - t_peak + t_goal, tot["evict"]
        out.append({"gpu": gname, "case": case[0], "ideal": ev[0], "today": ev[1], "base": base,
                    "share_ideal": ev[0] / base, "share_today": ev[1] / base, "goal": case[2] == 32768})
    return out


def print_evict_goal(cases, gpus, markdown):
    rows = evict_goal_rows([c for c in cases if c[3] is not None], gpus)
    hdr = ("GPU", "case", "eviction, ideal", "today's classes", "TTFT at the attention goal", "added, today",
           "added, ideal", "goal (<= %.0f%% at 32K)" % (100 * EVICT_GOAL))
    cells = [(r["gpu"], r["case"], fmt_t(r["ideal"]), fmt_t(r["today"]), fmt_t(r["base"]),
              "%.1f%%" % (100 * r["share_today"]), "%.1f%%" % (100 * r["share_ideal"]),
              "-" if not r["goal"] else "met" if r["share_today"] <= EVICT_GOAL else "not met") for r in rows]
    print_goal_table("the eviction's share of TTFT (goal: critical_adakv:snapkv at 0.2 adds <= %.0f%% at 32K), "
                     "prefill attention at its goal" % (100 * EVICT_GOAL), hdr,
                     "%-5s %-24s %15s %15s %26s %12s %12s %18s", "|---|---|---:|---:|---:|---:|---:|---|", cells,
                     markdown)


# The prefill kernel's tiles and launch plan (src/backend/cuda/cuda_attention.cu, docs/gpu.md §3), bf16
# caches: 64-key tiles, rows padded to an odd number of 16-byte chunks. "before": 64 query rows per
# block (4 warps), one K and one V buffer, 3 barriers per tile, 2 blocks per SM; "after": 128 rows
# (8 warps, 1 block per SM) where launch_flash_hd picks them, two K/V stages, 1 barrier per tile.
FA_BN = 64
FA_PLANS = (("before", {"bm": 64, "stages": 1, "barriers": 3, "wide": False}),
            ("after", {"bm": 128, "stages": 2, "barriers": 1, "wide": True}))
PREFILL_TILE_CONTEXTS = (8192, 32768)  # the goal's contexts (Llama-3.1-8B: head dim 128, GQA 4)


def fa_smem_bytes(d, stages):
    """Shared memory of one block: per stage a K and a V tile (bf16, padded rows) and 64 positions."""
    return stages * (2 * FA_BN * ((d // 8) | 1) * 8 * BF16 + FA_BN * 4)


def fa_rows(plan, n, rows, sms):
    """Query rows per block for a launch of n tokens over `rows` (heads x sequences) row sets:
    launch_flash_hd's rule (128 unless that grid keeps fewer than 15/16 of the SMs busy that the
    64-row grid does)."""
    if not plan["wide"]:
        return plan["bm"]
    busy = [min(-(-n // bm) * rows, sms) for bm in (128, 64)]
    return 128 if busy[0] * 16 >= busy[1] * 15 else 64


def prefill_tiles(c, context, plan, gpu, chunk=2048):
    """The prefill kernel's work over the layers for one prompt in chunks: FLOPs its mma execute
    (whole 64-key tiles up to the one holding a block's last query, every row of a block) against the
    causal FLOPs, the K/V bytes its tiles copy into shared memory (from L2; once per block and query
    head), and per chunk launch its blocks, resident blocks and wave efficiency."""
    D, d, H, Hkv, F, L, V = shape(c)
    fl = kv = 0.0
    waves = []
    for q0 in range(0, context, chunk):
        nq = min(chunk, context - q0)
        bm = fa_rows(plan, nq, H, gpu["sms"])
        per_sm = 2 if bm == 64 else 1
        for b in range(-(-nq // bm)):
            last = q0 + min((b + 1) * bm, nq)  # keys up to and including the block's last query
            keys = min(-(-last // FA_BN) * FA_BN, q0 + nq)
            fl += 4.0 * d * bm * keys * H
            kv += 2.0 * keys * d * BF16 * H
        blocks = -(-nq // bm) * H
        slots = gpu["sms"] * per_sm
        waves.append((bm, blocks, per_sm, blocks / (-(-blocks // slots) * slots)))
    causal = 4.0 * H * d * context * (context + 1) / 2
    return {"flops": L * fl, "causal": L * causal, "kv_bytes": L * kv, "bm": waves[-1][0], "blocks": waves[-1][1],
            "per_sm": waves[-1][2], "wave_eff": sum(w[3] for w in waves) / len(waves),
            "smem": fa_smem_bytes(d, plan["stages"])}


def prefill_tile_rows(gpus):
    """Per (gpu, context, plan) the tile model of Llama-3.1-8B's prefill attention against the goal."""
    c = load_config("llama-3.1-8b-instruct")
    out = []
    for gname, gpu in gpus:
        frac = FA2_FRACTION.get(gname)
        if frac is None:
            continue
        goal_rate = gpu["tc"] * frac * GOAL_OF_SDPA * 1e12
        for ctx in PREFILL_TILE_CONTEXTS:
            for pname, plan in FA_PLANS:
                t = prefill_tiles(c, ctx, plan, gpu)
                t_goal = t["causal"] / goal_rate
                out.append(dict(t, gpu=gname, context=ctx, plan=pname, barriers=plan["barriers"],
                                stages=plan["stages"], goal=t_goal, need_tflops=t["flops"] / t_goal / 1e12,
                                l2_tbs=t["kv_bytes"] / t_goal / 1e12))
    return out


def print_prefill_tiles(gpus, markdown):
    hdr = ("GPU", "context", "kernel", "rows x blocks/SM", "K/V stages", "barriers/tile", "shared KiB/SM",
           "mma FLOPs / causal", "wave eff.", "K/V into shared GB", "goal", "mma TFLOP/s at goal", "L2 TB/s at goal")
    fmt = "%-5s %7s %-6s %16s %10s %13s %13s %18s %9s %18s %9s %19s %15s"
    cells = [(r["gpu"], "%dK" % (r["context"] // 1024), r["plan"], "%d x %d" % (r["bm"], r["per_sm"]),
              "%d + %d" % (r["stages"], r["stages"]), "%d" % r["barriers"],
              "%.1f" % (r["smem"] * r["per_sm"] / 1024.0), "%.3f" % (r["flops"] / r["causal"]),
              "%.0f%%" % (100 * r["wave_eff"]), "%.1f" % (r["kv_bytes"] / 1e9), fmt_t(r["goal"]),
              "%.0f" % r["need_tflops"], "%.1f" % r["l2_tbs"]) for r in prefill_tile_rows(gpus)]
    print_goal_table("prefill attention tiles (Llama-3.1-8B: head dim 128, GQA 4; chunks of 2048): what ckv's kernel "
                     "must sustain to meet the goal", hdr, fmt, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                     cells, markdown)


def plan_splits(segs, wave, max_len, cap, min_chunk=DK_MIN_CHUNK):
    """The split count of cuda_decode.cu's plan_splits: the smallest whose wave efficiency is
    within DK_EFF_SHARE of the best, each split >= min_chunk keys, at most cap."""
    most = min((max_len + min_chunk - 1) // min_chunk, cap, DK_MAX_SPLITS)
    if most <= 1 or segs >= wave:
        return 1
    eff = {sp: (segs * sp / wave) / -(-segs * sp // wave) for sp in range(1, most + 1)}
    best = max(eff.values())
    return next(sp for sp in range(1, most + 1) if eff[sp] >= DK_EFF_SHARE * best)


def decode_goal_rows(cases, gpus):
    """Per (gpu, full-cache case, batch): the bytes one decode step's attention must read (every
    layer's K, V and positions once), its time at the copy bandwidth and at the goal (70% of it),
    the split plan (blocks against the resident slots) and the decode step at the goal."""
    out = []
    for gname, gpu in gpus:
        for name, cfg_dir, context, press in cases:
            c = load_config(cfg_dir)
            D, d, H, Hkv, F, L, V = shape(c)
            ctx_rows = context + 32  # halfway through 64 new tokens, as kernels() counts
            for batch in DECODE_BATCHES:
                nbytes = L * batch * ctx_rows * Hkv * (2 * d * BF16 + 4)
                t_copy = nbytes / (gpu["hbm_gbs"] * 1e9)
                t_goal = t_copy / GOAL_OF_COPY
                segs, wave = batch * Hkv, gpu["sms"] * dk_blocks_per_sm(H // Hkv, d)
                cap = min(DK_MAX_SPLITS, -(-2 * wave // segs))
                splits = plan_splits(segs, wave, ctx_rows, cap)
                blocks = splits * segs
                fill = blocks / (-(-blocks // wave) * wave)
                rest = sum(seconds(fl, by, ideal, gpu) for st, k, _, fl, by, ideal, _ in kernels(c, context, None, batch=batch)
                           if st == "decode" and k != "attention")
                need = param_count(c) * BF16 + batch * L * (context + 64) * Hkv * d * 2 * BF16
                out.append({"gpu": gname, "case": name, "batch": batch, "gb": nbytes / 1e9, "copy": t_copy,
                            "goal": t_goal, "splits": splits, "blocks": blocks, "fill": fill,
                            "step_goal": rest + t_goal, "share": t_goal / (rest + t_goal), "fits": need <= gpu["mem"],
                            "need": need})
    return out


def print_decode_goal(cases, gpus, markdown):
    rows = decode_goal_rows([c for c in cases if c[3] is None], gpus)
    hdr = ("GPU", "case", "batch", "K/V GB per step", "at copy bw", "goal (70%)", "splits x segments", "wave fill",
           "step at goal", "attention share", "fits tp 1")
    cells = [(r["gpu"], r["case"], "%d" % r["batch"], "%.2f" % r["gb"], fmt_t(r["copy"]), fmt_t(r["goal"]),
              "%d x %d" % (r["splits"], r["blocks"] // r["splits"]), "%.0f%%" % (100 * r["fill"]),
              fmt_t(r["step_goal"]), "%.0f%%" % (100 * r["share"]),
              "yes" if r["fits"] else "no (%.0f GB)" % (r["need"] / 1e9)) for r in rows]
    print_goal_table("decode attention against its goal (>= %d%% of the copy bandwidth; the datasheet HBM rate until "
                     "measured)" % (100 * GOAL_OF_COPY), hdr, "%-5s %-14s %5s %15s %11s %11s %17s %9s %12s %15s %10s",
                     "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", cells, markdown)


def prefill_split_plan(sms, n, n_seq, heads, hd, max_len):
    """cuda_prefill_split.cu's plan: (blocks without splits, splits, keys per split)."""
    items = (n + (FA_BM - 1) * n_seq) // FA_BM * heads
    wave = sms * FA_BLOCKS_PER_SM
    reserved = PS_WAVES * wave * FA_BM * (FA_HD_MAX + 2) * F32
    cap = min(-(-PS_WAVES * wave // items), reserved // (n * heads * (hd + 2) * F32), DK_MAX_SPLITS)
    want = 1 if items >= wave else plan_splits(items, wave, max_len, cap, PS_MIN_CHUNK)
    if want <= 1:
        return items, 1, max_len
    chunk = -(-(-(-max_len // want)) // PS_KEY_ALIGN) * PS_KEY_ALIGN
    return items, -(-max_len // chunk), chunk


def wave_fill(blocks, wave):
    """Share of the resident block slots the blocks keep busy over their waves."""
    return blocks / (-(-blocks // wave) * wave)


def split_k_rows(gpus):
    """Per (gpu, split-K case, tp): the chunk's prefill attention over all layers of one rank, one
    pass (the blocks of the chunk's rows and the rank's heads) against split-K (the plan's splits
    and the merge's partials: written by the splits, read by the merge). Time is the roofline with
    the tensor-core rate scaled by the wave fill (the share of resident block slots in use: a rank
    with few heads leaves SMs idle); bytes: K/V of the prefix and chunk once, q and the output,
    and with split-K the partials twice."""
    out = []
    for gname, gpu in gpus:
        wave = gpu["sms"] * FA_BLOCKS_PER_SM
        for name, cfg_dir, prefix, n in SPLIT_K_CASES:
            c = load_config(cfg_dir)
            D, d, H, Hkv, F, L, V = shape(c)
            for tp in SPLIT_K_TP:
                if H % tp or Hkv % tp:
                    continue
                h, hkv, keys = H // tp, Hkv // tp, prefix + n
                flops = L * 4 * h * d * n * (prefix + (n + 1) / 2)
                nbytes = L * (keys * hkv * d * 2 * BF16 + 2 * n * h * d * F32)
                items, splits, chunk = prefill_split_plan(gpu["sms"], n, 1, h, d, keys)
                part = L * 2 * n * h * splits * (d + 2) * F32 if splits > 1 else 0
                f1, f2 = wave_fill(items, wave), wave_fill(items * splits, wave)
                t1 = max(flops / (gpu["tc"] * f1 * 1e12), nbytes / (gpu["hbm_gbs"] * 1e9))
                t2 = max(flops / (gpu["tc"] * f2 * 1e12), (nbytes + part) / (gpu["hbm_gbs"] * 1e9))
                out.append({"gpu": gname, "case": name, "tp": tp, "blocks": items, "splits": splits, "chunk": chunk,
                            "fill1": f1, "fill2": f2, "t1": t1, "t2": t2, "part_gb": part / 1e9})
    return out


def print_split_k(gpus, markdown):
    rows = split_k_rows(gpus)
    hdr = ("GPU", "case", "tp", "blocks", "splits", "keys/split", "fill before", "fill after", "partials GB",
           "attention before", "after", "speed-up")
    cells = [(r["gpu"], r["case"], "%d" % r["tp"], "%d" % r["blocks"], "%d" % r["splits"],
              "%d" % r["chunk"] if r["splits"] > 1 else "-", "%.0f%%" % (100 * r["fill1"]),
              "%.0f%%" % (100 * r["fill2"]), "%.3f" % r["part_gb"], fmt_t(r["t1"]), fmt_t(r["t2"]),
              "%.2fx" % (r["t1"] / r["t2"])) for r in rows]
    print_goal_table("prefill split-K: a chunk of query rows over a long cached prefix, per rank (all layers; the "
                     "tensor-core roofline scaled by the wave fill)", hdr,
                     "%-5s %-20s %3s %7s %7s %11s %12s %11s %12s %17s %10s %9s",
                     "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", cells, markdown)


def check():
    """Parameter counts against the published ones; FLOPs of a prefill against 2 N P + attention."""
    fails = 0
    for cfg, want in (("llama-3.1-8b-instruct", 8030261248), ("qwen2.5-32b-instruct-128k", 32763876352),
                      ("qwen2.5-7b-instruct", 7615616512), ("mistral-7b-instruct-v0.3", 7248023552)):
        got = param_count(load_config(cfg))
        ok = got == want
        fails += not ok
        print("%s %s: %d parameters (published %d)" % ("ok  " if ok else "FAIL", cfg, got, want))
    c = load_config("llama-3.1-8b-instruct")
    D, d, H, Hkv, F, L, V = shape(c)
    n = 4096
    ks = kernels(c, n, None, chunk=n)
    body = sum(fl for st, k, _, fl, _, _, _ in ks if st == "prefill" and "projection" in k)
    attn = sum(fl for st, k, _, fl, _, _, _ in ks if st == "prefill" and k == "attention")
    want_body = 2 * n * (param_count(c) - 2 * V * D - (2 * L + 1) * D)  # every layer weight, once per token
    want_attn = L * 2 * 2 * H * d * n * (n + 1) / 2                     # QK^T and PV over the causal pairs
    for what, got, want in (("prefill projection FLOPs", body, want_body), ("prefill attention FLOPs", attn, want_attn)):
        ok = abs(got - want) <= 1e-9 * want
        fails += not ok
        print("%s %s at 4K: %.6g (expected %.6g)" % ("ok  " if ok else "FAIL", what, got, want))
    dec = sum(by for st, k, _, _, by, _, _ in kernels(c, n, None) if st == "decode")
    want_dec = (param_count(c) - V * D - (2 * L + 1) * D) * BF16 + L * (n + 32) * Hkv * d * 2 * BF16
    ok = abs(dec - want_dec) <= 1e-9 * want_dec
    fails += not ok
    print("%s decode bytes at 4K: %.6g (expected every weight but the embeddings and norms, and the cache: %.6g)" %
          ("ok  " if ok else "FAIL", dec, want_dec))
    # the goal's attention time at 32K on an H200: FLOPs / (989.4 x 0.35 x 0.6 TFLOP/s)
    g = attention_goal_rows([CASES[0]], [("H200", GPUS["H200"])])[0]
    want_goal = g["tflop"] * 1e12 / (989.4e12 * 0.35 * 0.6)
    ok = abs(g["goal"] - want_goal) <= 1e-9 * want_goal and g["peak"] < g["sdpa"] < g["goal"]
    fails += not ok
    print("%s prefill attention goal at 8B@32K on H200: %.4f s (expected %.4f s, after the peak %.4f s and SDPA %.4f s)" %
          ("ok  " if ok else "FAIL", g["goal"], want_goal, g["peak"], g["sdpa"]))
    # decode attention at 8B@128K, batch 1, on an H200: 32 layers x 131,104 rows x 8 KV heads x (2 x 128 x 2 + 4)
    # bytes at 70% of 4.8 TB/s; one sequence: 8 segments, 47 splits (376 of 396 resident blocks)
    r = next(x for x in decode_goal_rows([CASES[2]], [("H200", GPUS["H200"])]) if x["batch"] == 1)
    want_b = 32 * 131104 * 8 * (2 * 128 * 2 + 4)
    ok = abs(r["gb"] * 1e9 - want_b) <= 1e-9 * want_b and abs(r["goal"] - want_b / (0.7 * 4800e9)) <= 1e-12 and \
        r["splits"] == 47 and r["blocks"] == 376
    fails += not ok
    print("%s decode attention goal at 8B@128K batch 1 on H200: %.4f GB, %.4f ms, %d splits (expected %.4f GB, "
          "%.4f ms, 47)" % ("ok  " if ok else "FAIL", r["gb"], r["goal"] * 1e3, r["splits"], want_b / 1e9,
                              want_b / (0.7 * 4800e9) * 1e3))
    # split-K: Llama-3.1-8B, a chunk of 512 rows over a 128K prefix on an H200 (132 SMs, 264 resident
    # blocks): tp 1 runs 8 x 32 = 256 blocks (97% of a wave, no split); tp 8 runs 8 x 4 = 32 blocks,
    # split 8 ways (chunks of 16,448 keys, 256 blocks, 97%)
    ks = {r["tp"]: r for r in split_k_rows([("H200", GPUS["H200"])]) if r["case"] == "8B chunk 512 @128K"}
    ok = (ks[1]["blocks"], ks[1]["splits"], ks[8]["blocks"], ks[8]["splits"], ks[8]["chunk"]) == (256, 1, 32, 8, 16448) \
        and abs(ks[8]["fill2"] - 256 / 264) < 1e-12 and ks[8]["t2"] < ks[8]["t1"]
    fails += not ok
    print("%s split-K at 8B chunk 512 @128K on H200: tp 1 %d blocks x %d, tp 8 %d blocks x %d splits of %d keys "
          "(expected 256 x 1, 32 x 8 of 16448)" % ("ok  " if ok else "FAIL", ks[1]["blocks"], ks[1]["splits"],
                                                     ks[8]["blocks"], ks[8]["splits"], ks[8]["chunk"]))
    # the window scores today at 8B@32K: two passes of three mma per product (6 x 2 w n d H FLOPs per
    # layer), the keys read once by the statistics pass and once per query head by the column sums
    w, n = WINDOW, 32768
    ws = next(x for x in kernels(c, n, "critical_adakv:snapkv") if x[1].startswith("window scores"))
    want_fl = 6 * 2 * w * n * d * H * L
    want_keys = L * (Hkv + H) * n * d * BF16
    got_keys = ws[4] + ws[6][1] - L * n * H * F32 - L * (2 * w * H * d * F32 + 2 * (n // WIN_CHUNK) * H * w * 12 +
                                                            5 * n * H * F32)
    ok = abs(ws[3] * ws[6][2] - want_fl) <= 1e-9 * want_fl and abs(got_keys - want_keys) <= 1e-9 * want_keys
    fails += not ok
    print("%s window scores today at 8B@32K: %.6g tensor-core FLOPs, %.6g key bytes (expected %.6g, %.6g)" %
          ("ok  " if ok else "FAIL", ws[3] * ws[6][2], got_keys, want_fl, want_keys))
    # the prefill tiles at 8K on an H200: two stages of 64-key bf16 tiles at head dim 128 are 70,144 bytes
    # (2 blocks fit sm_80's 164 KiB), and 128-row blocks copy about half the K/V of 64-row ones
    rows = [r for r in prefill_tile_rows([("H200", GPUS["H200"])]) if r["context"] == 8192]
    before, after = rows[0], rows[1]
    ok = fa_smem_bytes(128, 2) == 70144 and 2 * (70144 + 1024) <= 164 * 1024 and after["bm"] == 128 and \
        0.49 < after["kv_bytes"] / before["kv_bytes"] < 0.51 and before["flops"] >= before["causal"]
    fails += not ok
    print("%s prefill tiles at 8K on H200: %d bytes of shared memory a block, K/V into shared memory %.1f -> %.1f GB "
          "(expected 70144, about half)" % ("ok  " if ok else "FAIL", fa_smem_bytes(128, 2), before["kv_bytes"] / 1e9,
                                            after["kv_bytes"] / 1e9))
    print("roofline check: %d failures" % fails)
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", default=["all"], help="case names (default all): " +
                    ", ".join(c[0] for c in CASES))
    ap.add_argument("--gpu", default="all", choices=["all"] + list(GPUS))
    ap.add_argument("--ceilings", help="bench.json with measured ceilings (replace the H200's datasheet)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--summary", action="store_true", help="the summary table only")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.check:
        return check()
    cases = CASES if a.cases == ["all"] else [c for c in CASES if c[0] in a.cases]
    unknown = set(a.cases) - {"all"} - {c[0] for c in CASES}
    if unknown:
        sys.exit("roofline: unknown case %s (known: %s)" % (", ".join(sorted(unknown)), ", ".join(c[0] for c in CASES)))
    gpus = [(g, dict(GPUS[g])) for g in GPUS if a.gpu in ("all", g)]
    if a.ceilings:
        gpus = [("H200", ceilings_from(a.ceilings)) if g == "H200" else (g, v) for g, v in gpus]
    if not a.summary:
        print_tables(cases, gpus, a.markdown)
    print_summary(cases, gpus, a.markdown)
    print_attention_goal(cases, gpus, a.markdown)
    print_prefill_tiles(gpus, a.markdown)
    print_evict_goal(cases, gpus, a.markdown)
    print_decode_goal(cases, gpus, a.markdown)
    print_split_k(gpus, a.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
