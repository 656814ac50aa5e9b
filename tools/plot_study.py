#!/usr/bin/env python3
"""Plots of a ckv study (SVG, matplotlib): what the eval, fidelity and analyze commands wrote.

  score vs budget   eval's summary.json: one panel per task plus the mean, a line per press, the
                    full cache as a dashed line                              -> score_vs_budget.svg
  KL vs budget      fidelity's --out JSON lines: mean KL(full || press) per press -> kl_vs_budget.svg
  per-head grid     analyze's --out JSON lines (one budget or a --budget list): per (layer, query
                    head), which press perturbs the attention output less (Figure 4's picture), one
                    panel per budget                                         -> head_grid.svg
  share vs budget   analyze's --stats-json: the share of heads where press B perturbs less than A,
                    per budget (Figure 6)                                    -> heads_vs_budget.svg
  concentration     the same file's "concentration" block: per layer, the medians over heads of the
                    top-5% share of the question's attention, the recall of those rows among press
                    A's top 5%, Spearman's rho and the value-norm spread     -> concentration.svg
  layer-wise        analyze's --layerwise JSON lines: relative perturbation of the hidden state after
                    every layer, a line per press x budget (Figure 5)       -> layerwise.svg

Usage: plot_study.py --out DIR [--eval DIR] [--fidelity F.jsonl] [--heads F.jsonl]
                     [--stats F.json] [--layerwise F.jsonl]
Every input is optional; each given input makes its plot. Needs matplotlib (pip install matplotlib).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path


def save(fig, path: Path) -> None:
    """Writes the SVG without its metadata block (creator and date): the same input, the same file."""
    fig.savefig(path, metadata={"Date": None})
    path.write_text(re.sub(r"\s*<metadata>.*?</metadata>", "", path.read_text(), flags=re.S))


def lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def plot_scores(plt, eval_dir: Path, out: Path) -> None:
    rows = json.loads((eval_dir / "summary.json").read_text())["rows"]
    tasks = sorted({r["task"] for r in rows if r["task"] != "(mean)"}) + ["(mean)"]
    tasks = [t for t in tasks if any(r["task"] == t for r in rows)]
    cols = min(4, len(tasks))
    nrows = (len(tasks) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        mine = [r for r in rows if r["task"] == task]
        full = [r["score"] for r in mine if r["press"] == "none"]
        by = collections.defaultdict(list)
        for r in mine:
            if r["press"] != "none":
                by[r["press"]].append((r["budget"], r["score"]))
        for press, pts in sorted(by.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=press)
        if full:
            ax.axhline(full[0], color="black", linestyle="--", linewidth=1, label="full cache")
        ax.set_title(task)
        ax.set_xlabel("budget (kept fraction)")
        ax.set_ylabel("score (x100)")
        ax.set_ylim(-2, 102)  # summary.json's scores are x100
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    save(fig, out / "score_vs_budget.svg")


def plot_kl(plt, path: Path, out: Path) -> None:
    by = collections.defaultdict(list)
    for r in lines(path):
        by[r["press"]].append((r["budget"], r["kl"]))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for press, pts in sorted(by.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=press)
    ax.set_xlabel("budget (kept fraction)")
    ax.set_ylabel("mean KL(full || press), nats")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out / "kl_vs_budget.svg")


def plot_heads(plt, path: Path, out: Path) -> None:
    rows = lines(path)
    budgets = sorted({r.get("budget", 0.0) for r in rows})
    n_layers = 1 + max(r["layer"] for r in rows)
    n_heads = 1 + max(r["head"] for r in rows)
    fig, axes = plt.subplots(1, len(budgets), figsize=(2 + 2.2 * len(budgets), 0.25 * n_layers + 1.5), squeeze=False)
    for ax, b in zip(axes.flat, budgets):
        grid = [[0.0] * n_heads for _ in range(n_layers)]
        for r in rows:
            if r.get("budget", 0.0) == b:
                pa, pb = r["perturbation_a"], r["perturbation_b"]
                grid[r["layer"]][r["head"]] = 1.0 if pb < pa else (-1.0 if pb > pa else 0.0)
        ax.imshow(grid, cmap="coolwarm_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
        share = sum(v > 0 for row in grid for v in row) / (n_layers * n_heads)
        ax.set_title(f"budget {b:g}: B less in {100 * share:.0f}%" if b else f"B less in {100 * share:.0f}%", fontsize=8)
        ax.set_xlabel("query head")
        ax.set_ylabel("layer")
    fig.suptitle("blue: press B perturbs less, red: press A", fontsize=8)
    fig.tight_layout()
    save(fig, out / "head_grid.svg")


def plot_share(plt, path: Path, out: Path) -> None:
    s = json.loads(path.read_text())
    rows = sorted(s["budgets"], key=lambda r: r["budget"])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["budget"] for r in rows], [r["frac_b_less"] for r in rows], marker="o")
    ax.axhline(0.5, color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("budget (kept fraction)")
    ax.set_ylabel("share of heads where B perturbs less")
    ax.set_title(f"A {s['press_a'].split()[0]}  vs  B {s['press_b'].split()[0]}", fontsize=8)
    ax.set_ylim(0, 1)
    fig.tight_layout()
    save(fig, out / "heads_vs_budget.svg")


def plot_concentration(plt, path: Path, out: Path) -> None:
    c = json.loads(path.read_text()).get("concentration")
    if not c:
        raise ValueError("no \"concentration\" block (written by ckv analyze --stats-json since it has one)")
    t = c["fractions"].index(0.05)
    by = collections.defaultdict(list)
    for h in c["heads"]:
        by[h["layer"]].append(h)

    def med(v):
        v = sorted(x for x in v if x is not None)
        return (v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])) if v else None

    layers = sorted(by)
    scorer = re.sub(r"\([^)]*\)", "", c["scores_of"].split()[0])  # the press without its options
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, label in (("top_share", "top 5% of rows: share of attention"), ("recall", "recall of those rows in A's top 5%")):
        ax.plot(layers, [med([h[key][t] for h in by[l]]) for l in layers], marker=".", label=label)
    ax.plot(layers, [med([h["spearman"] for h in by[l]]) for l in layers], marker=".", label="Spearman(score, attention)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.set_ylabel("median over the layer's heads")
    ax2 = ax.twinx()
    ax2.plot(layers, [med([h["norm_spread"] for h in by[l]]) for l in layers], color="gray", linestyle="--",
             label="value-norm spread max/median (right)")
    ax2.set_ylabel("max / median ||v W_O^h||_1")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=6, loc="lower left")
    ax.set_title(f"scores of {scorer}", fontsize=8)
    fig.tight_layout()
    save(fig, out / "concentration.svg")


def plot_layers(plt, path: Path, out: Path) -> None:
    by = collections.defaultdict(list)
    for r in lines(path):
        by[(r["press"], r["budget"])].append((r["layer"], r["rel_perturbation"]))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for (press, b), pts in sorted(by.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{press} b={b:g}")
    ax.set_xlabel("layer")
    ax.set_ylabel("||h_c - h_f|| / ||h_f||")
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    save(fig, out / "layerwise.svg")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--eval", type=Path)
    ap.add_argument("--fidelity", type=Path)
    ap.add_argument("--heads", type=Path)
    ap.add_argument("--stats", type=Path)
    ap.add_argument("--layerwise", type=Path)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: small SVG files
        matplotlib.rcParams["svg.hashsalt"] = "ckv-study"  # the same input gives the same file
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_study.py: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    made = []
    for arg, fn, name in ((a.eval, plot_scores, "score_vs_budget.svg"), (a.fidelity, plot_kl, "kl_vs_budget.svg"),
                          (a.heads, plot_heads, "head_grid.svg"), (a.stats, plot_share, "heads_vs_budget.svg"),
                          (a.stats, plot_concentration, "concentration.svg"),
                          (a.layerwise, plot_layers, "layerwise.svg")):
        if arg is None:
            continue
        try:
            fn(plt, arg, a.out)
        except (OSError, ValueError, KeyError) as e:
            print(f"plot_study.py: {arg}: {e}", file=sys.stderr)
            return 1
        made.append(name)
    if not made:
        print("plot_study.py: nothing to plot (give --eval, --fidelity, --heads, --stats or --layerwise)", file=sys.stderr)
        return 2
    print("wrote", ", ".join(str(a.out / m) for m in made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
