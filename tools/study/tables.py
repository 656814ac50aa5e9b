#!/usr/bin/env python3
"""The tables of the study in docs/results.md, as Markdown, from what run_study.sh wrote (Python's
standard library only; it reads results, it runs nothing).

  RULER       eval's summary.json (ruler_context, ruler_query, ruler_contrast): the mean score over
              tasks per press and budget, the per-task loss against the full cache (mean over the
              budgets), and what each CriticalKV variant does to its base press's loss
  fidelity    fidelity.jsonl: KL, top-1 agreement and NLL excess per press and budget, and the
              CriticalKV / base press KL ratio
  analyze     analyze_*.json (--stats-json) and the per-head analyze_*.jsonl: the share of heads
              where CriticalKV perturbs less, the mean perturbations, the bound tightness, and how
              much of the question's attention each press's kept rows hold; the attention-
              concentration statistics (medians over heads, all layers and each half of the layers)
  profile     headkv_profile.json: answered probes and the most important heads

Usage: tables.py STUDY_DIR [--section ruler|query|contrast|fidelity|analyze|profile ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

PAIRS = (("snapkv", "critical:snapkv"), ("adakv:snapkv", "critical_adakv:snapkv"),
         ("headkv:snapkv", "critical_headkv:snapkv"))


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a: float, b: float) -> str:
    """b / a as a ratio ('-' when the base loss is 0)."""
    return "-" if abs(a) < 1e-12 else f"{b / a:.2f}"


def ruler(d: Path, title: str) -> str:
    f = d / "summary.json"
    if not f.exists():
        return f"({title}: {f} is missing: the step has not run)\n"
    rows = json.loads(f.read_text())["rows"]
    budgets = sorted({r["budget"] for r in rows if r["press"] != "none"}, reverse=True)
    presses = list(dict.fromkeys(r["press"] for r in rows if r["press"] != "none"))
    tasks = sorted({r["task"] for r in rows if r["task"] != "(mean)"})
    per = {(r["task"], r["press"], r["budget"]): r for r in rows if r["task"] != "(mean)"}
    mean = {}  # over the tasks (eval's own "(mean)" rows exist only with two tasks or more)
    for p in presses:
        for b in budgets:
            got = [per[(t, p, b)] for t in tasks if (t, p, b) in per]
            if got:
                m = {"score": sum(g["score"] for g in got) / len(got)}
                if all("loss" in g for g in got):
                    m["loss"] = sum(g["loss"] for g in got) / len(got)
                mean[(p, b)] = m
    full = {r["task"]: r["score"] for r in rows if r["press"] == "none" and r["task"] != "(mean)"}
    n = max((r["n"] for r in rows if r["task"] != "(mean)" and r["press"] == "none"), default=0)
    out = [f"#### {title}: mean score over {len(tasks)} tasks ({n} sample(s) each), x100\n"]
    full_mean = sum(full.values()) / len(full) if full else None
    out.append("| press | " + " | ".join(f"budget {b:g} (ratio {1 - b:g})" for b in budgets) + " | mean loss |")
    out.append("|---" * (len(budgets) + 2) + "|")
    out.append("| full cache | " + " | ".join(fmt(full_mean) for _ in budgets) + " | 0 |")
    for p in presses:
        sc = [mean.get((p, b), {}).get("score") for b in budgets]
        ls = [mean[(p, b)].get("loss") for b in budgets if (p, b) in mean and "loss" in mean[(p, b)]]
        out.append(f"| {p} | " + " | ".join(fmt(s) for s in sc) + f" | {fmt(sum(ls) / len(ls) if ls else None)} |")
    out.append("")
    out.append(f"#### {title}: loss against the full cache per task (mean over the {len(budgets)} budgets), x100\n")
    out.append("| press | " + " | ".join(tasks) + " |")
    out.append("|---" * (len(tasks) + 1) + "|")
    out.append("| (full cache score) | " + " | ".join(fmt(full.get(t)) for t in tasks) + " |")
    for p in presses:
        cells = []
        for t in tasks:
            ls = [per[(t, p, b)]["loss"] for b in budgets if (t, p, b) in per and "loss" in per[(t, p, b)]]
            cells.append(fmt(sum(ls) / len(ls) if ls else None))
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    out.append("")
    pairs = [(a, b) for a, b in PAIRS if a in presses and b in presses]
    if pairs:
        out.append(f"#### {title}: CriticalKV's loss against its base press's (mean over tasks; ratio < 1: CriticalKV loses less)\n")
        out.append("| base press -> CriticalKV | " + " | ".join(f"budget {b:g}" for b in budgets) + " | all budgets |")
        out.append("|---" * (len(budgets) + 2) + "|")
        for a, c in pairs:
            cells, ta, tc = [], 0.0, 0.0
            for b in budgets:
                la, lc = mean.get((a, b), {}).get("loss"), mean.get((c, b), {}).get("loss")
                if la is None or lc is None:
                    cells.append("-")
                    continue
                ta, tc = ta + la, tc + lc
                cells.append(f"{la:.1f} -> {lc:.1f} ({ratio(la, lc)})")
            out.append(f"| {a} -> {c} | " + " | ".join(cells) + f" | {ta:.1f} -> {tc:.1f} ({ratio(ta, tc)}) |")
        out.append("")
        out.append(f"Per task, loss summed over budgets, base -> CriticalKV:\n")
        out.append("| task | " + " | ".join(f"{a} -> {c}" for a, c in pairs) + " |")
        out.append("|---" * (len(pairs) + 1) + "|")
        for t in tasks:
            cells = []
            for a, c in pairs:
                la = sum(per[(t, a, b)].get("loss", 0) for b in budgets if (t, a, b) in per)
                lc = sum(per[(t, c, b)].get("loss", 0) for b in budgets if (t, c, b) in per)
                cells.append(f"{la:.0f} -> {lc:.0f}")
            out.append(f"| {t} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def fidelity(d: Path) -> str:
    f = d / "fidelity.jsonl"
    if not f.exists():
        return f"(fidelity: {f} is missing: the step has not run)\n"
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    budgets = sorted({r["budget"] for r in rows}, reverse=True)
    presses = list(dict.fromkeys(r["press"] for r in rows))
    by = {(r["press"], r["budget"]): r for r in rows}
    r0 = rows[0]
    out = [f"#### Teacher-forced KL(full || press) in nats, {r0['continuation']} tokens after {r0['context']} "
           f"(full-cache NLL {r0['nll_full']:.4f}); top-1 agreement in brackets\n"]
    out.append("| press | " + " | ".join(f"budget {b:g}" for b in budgets) + " |")
    out.append("|---" * (len(budgets) + 1) + "|")
    for p in presses:
        out.append(f"| {p} | " + " | ".join(
            f"{by[(p, b)]['kl']:.4f} ({by[(p, b)]['top1']:.3f})" if (p, b) in by else "-" for b in budgets) + " |")
    out.append("")
    pairs = [(a, c) for a, c in PAIRS if a in presses and c in presses]
    if pairs:
        out.append("CriticalKV's KL / its base press's KL (< 1: CriticalKV is closer to the full cache):\n")
        out.append("| base press -> CriticalKV | " + " | ".join(f"budget {b:g}" for b in budgets) + " |")
        out.append("|---" * (len(budgets) + 1) + "|")
        for a, c in pairs:
            out.append(f"| {a} -> {c} | " + " | ".join(
                ratio(by[(a, b)]["kl"], by[(c, b)]["kl"]) if (a, b) in by and (c, b) in by else "-" for b in budgets) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def median(v: list[float]) -> float | None:
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def concentration(s: dict, title: str) -> list[str]:
    """Medians over heads of the --stats-json "concentration" block: all layers, then each half."""
    c = s.get("concentration")
    if not c:
        return []
    hs = c["heads"]
    n_layers = max(h["layer"] for h in hs) + 1
    half = n_layers // 2
    groups = (("all layers", hs), (f"layers 0-{half - 1}", [h for h in hs if h["layer"] < half]),
              (f"layers {half}-{n_layers - 1}", [h for h in hs if h["layer"] >= half]))
    pct = [f"{100 * f:g}%" for f in c["fractions"]]
    scorer = re.sub(r"\([^)]*\)", "", c["scores_of"].split()[0])  # the press without its options
    out = [f"#### Attention concentration, {title}: medians over heads (the question's attention over the "
           f"context; scores of {scorer})\n",
           "| heads | " + " | ".join(f"top {p} hold" for p in pct) + " | " +
           " | ".join(f"recall {p}" for p in pct) + " | Spearman | value-norm spread (max / median) |",
           "|---" * (2 * len(pct) + 3) + "|"]
    for name, g in groups:
        cells = [fmt(median([h["top_share"][t] for h in g]), 3) for t in range(len(pct))]
        cells += [fmt(median([h["recall"][t] for h in g]), 3) for t in range(len(pct))]
        cells += [fmt(median([h["spearman"] for h in g]), 3), fmt(median([h["norm_spread"] for h in g]), 1)]
        out.append(f"| {name} ({len(g)}) | " + " | ".join(cells) + " |")
    out.append("")
    return out


def by_spread(heads: dict, title: str) -> list[str]:
    """Per budget, the heads in quartiles of their value-norm spread: where B perturbs less, and the
    mean perturbations (the heads the value norms could help most are the high-spread ones)."""
    budgets = sorted(b for b in heads if heads[b] and heads[b][0].get("norm_spread") is not None)
    if not budgets:
        return []
    out = [f"#### Press B against A by value-norm spread (quartiles of the heads), {title}: B less in / mean "
           f"perturbation A -> B\n"]
    hs = sorted(heads[budgets[0]], key=lambda h: h["norm_spread"])
    n = len(hs)
    cuts = [hs[i * n // 4]["norm_spread"] for i in range(4)] + [hs[-1]["norm_spread"]]
    out.append("| budget | " + " | ".join(f"spread {cuts[i]:.2f}-{cuts[i + 1]:.2f}" for i in range(4)) + " |")
    out.append("|---" * 5 + "|")
    for b in budgets:
        g = sorted(heads[b], key=lambda h: h["norm_spread"])
        cells = []
        for i in range(4):
            q = g[i * n // 4:(i + 1) * n // 4]
            less = sum(h["perturbation_b"] < h["perturbation_a"] for h in q)
            pa = sum(h["perturbation_a"] for h in q) / len(q)
            pb = sum(h["perturbation_b"] for h in q) / len(q)
            cells.append(f"{100 * less / len(q):.0f}% / {pa:.3g} -> {pb:.3g}")
        out.append(f"| {b:g} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def analyze(d: Path) -> str:
    out = []
    for sf in sorted(d.glob("analyze_*.json")):
        s = json.loads(sf.read_text())
        heads = collections.defaultdict(list)
        hf = sf.with_suffix(".jsonl")
        if hf.exists():
            for l in hf.read_text().splitlines():
                if l.strip():
                    r = json.loads(l)
                    heads[r.get("budget", 0)].append(r)
        tag, _, k = sf.stem[len("analyze_"):].rpartition("_")
        name_a, _, name_b = tag.replace("-", ":").partition("_vs_")
        out.append(f"#### {name_a} (A) vs {name_b} (B), prompt {k}: {s['context']} context + {s['question']} question "
                   f"token(s), {s['budgets'][0]['n_heads']} heads\n")
        out.append("| budget | heads where B perturbs less | mean perturbation A | B | B / A | bound / perturbation A "
                   "(attention-only) | B (theta) | theta B / theta A | question's attention kept: A | B |")
        out.append("|---" * 10 + "|")
        for r in s["budgets"]:
            hs = heads.get(r["budget"], [])
            ma = sum(h["mass_a"] for h in hs) / len(hs) if hs else None
            mb = sum(h["mass_b"] for h in hs) / len(hs) if hs else None
            pa, pb = r["mean_perturbation_a"], r["mean_perturbation_b"]
            out.append(f"| {r['budget']:g} | {r['n_b_less']} / {r['n_heads']} ({100 * r['frac_b_less']:.1f}%) | {pa:.4g} | "
                       f"{pb:.4g} | {ratio(pa, pb)} | {r['mean_bound_ratio_a']:.3g} | {r['mean_bound_ratio_b']:.3g} | "
                       f"{r['mean_theta_ratio']:.3g} | {fmt(ma, 3)} | {fmt(mb, 3)} |")
        out.append("")
        out += concentration(s, f"prompt {k}")
        out += by_spread(heads, f"prompt {k}")
    lw = sorted(d.glob("layerwise_*.jsonl"))
    for f in lw:
        rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
        last = max(r["layer"] for r in rows)
        by = collections.defaultdict(dict)
        for r in rows:
            by[(r["press"], r["budget"])][r["layer"]] = r["rel_perturbation"]
        budgets = sorted({r["budget"] for r in rows})
        presses = list(dict.fromkeys(r["press"] for r in rows))
        mid = last // 2
        tag, _, k = f.stem[len("layerwise_"):].rpartition("_")
        out.append(f"#### Layer-wise: ||h_c - h_f|| / ||h_f|| of the last question token after layers {mid} and {last}, "
                   f"{tag.replace('-', ':').replace('_vs_', ' vs ')}, prompt {k}\n")
        out.append("| press | " + " | ".join(f"budget {b:g}" for b in budgets) + " |")
        out.append("|---" * (len(budgets) + 1) + "|")
        for p in presses:
            out.append(f"| {p} | " + " | ".join(
                f"{by[(p, b)].get(mid, float('nan')):.3g} / {by[(p, b)].get(last, float('nan')):.3g}" for b in budgets) + " |")
        out.append("")
    return "\n".join(out) + "\n" if out else "(analyze: no analyze_*.json: the step has not run)\n"


def profile(d: Path) -> str:
    out = []
    for f in sorted(d.glob("headkv_profile*.json")):
        p = json.loads(f.read_text())
        s = p["scores"]
        flat = sorted(((v, l, h) for l, row in enumerate(s) for h, v in enumerate(row)), reverse=True)
        total = sum(v for v, _, _ in flat)
        top = ", ".join(f"L{l}/kv{h} {v / total:.3f}" for v, l, h in flat[:6])
        out.append(f"- {p.get('model', f.name)}: {p.get('probes_counted', p['probes'])} of {p['probes']} probes counted "
                   f"({p.get('probes_answered', '?')} answered), {p['length']} tokens; largest shares of the "
                   f"{len(flat)} KV heads: {top}; top 10% of heads hold "
                   f"{sum(v for v, _, _ in flat[:max(1, len(flat) // 10)]) / total:.2f} of the total")
    return "\n".join(out) + "\n" if out else "(profile: no headkv_profile*.json)\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--section", action="append",
                    choices=("ruler", "query", "contrast", "fidelity", "analyze", "profile"))
    a = ap.parse_args()
    if not a.study.is_dir():
        print(f"tables.py: {a.study} is not a directory", file=sys.stderr)
        return 2
    want = a.section or ["profile", "ruler", "query", "contrast", "fidelity", "analyze"]
    parts = {"ruler": lambda: ruler(a.study / "ruler_context", "RULER, context-only"),
             "query": lambda: ruler(a.study / "ruler_query", "RULER, query-aware"),
             "contrast": lambda: ruler(a.study / "ruler_contrast", "RULER on the contrast model, context-only"),
             "fidelity": lambda: fidelity(a.study), "analyze": lambda: analyze(a.study), "profile": lambda: profile(a.study)}
    try:
        for w in want:
            print(parts[w]())
    except (OSError, ValueError, KeyError) as e:
        print(f"tables.py: {a.study}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
