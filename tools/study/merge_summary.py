#!/usr/bin/env python3
"""merge_summary.py - one RULER summary from the summary.json files of runs over disjoint task lists
(Python's standard library only). `ckv eval --report-only` over the concatenated results.jsonl is
the way when every part's raw results are at hand; this is for parts of which only the summary was
kept (the study's committed docs/study/qwen05b-ruler-summary.json). Each part's per-task rows are
taken as they are; the "(mean)" rows are computed again over all the tasks, as ckv eval computes
them (the plain mean of the per-task rows of each press and budget, n = the number of tasks),
rounded to 6 decimals. A task that two parts both hold, or two parts of different lengths, is an
error.

Usage: merge_summary.py --out DIR SUMMARY.json [SUMMARY.json ...]
  writes DIR/summary.json and DIR/summary.md (the table ckv eval writes)"""
import argparse
import json
import sys
from pathlib import Path

MEAN = "(mean)"


def num(v: float):
    """v rounded to 6 decimals, written as ckv eval (cJSON) writes it: whole numbers without a fraction."""
    v = round(v, 6)
    return int(v) if v.is_integer() else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("parts", nargs="+", type=Path)
    a = ap.parse_args()
    rows, owner = [], {}
    for p in a.parts:
        try:
            part = [r for r in json.loads(p.read_text())["rows"] if r["task"] != MEAN]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"merge_summary.py: {p}: not an eval summary.json ({e})", file=sys.stderr)
            return 1
        for t in sorted({r["task"] for r in part}):
            if t in owner:
                print(f"merge_summary.py: task {t} is in both {owner[t]} and {p}", file=sys.stderr)
                return 1
            owner[t] = p
        rows += part
    if len({r["length"] for r in rows}) > 1:
        print("merge_summary.py: the parts have different lengths: "
              f"{sorted({r['length'] for r in rows})}", file=sys.stderr)
        return 1
    tasks = sorted({r["task"] for r in rows})
    keys = list(dict.fromkeys((r["press"], r["budget"]) for r in rows))
    means = []
    for press, budget in keys if len(tasks) > 1 else []:
        got = [r for r in rows if r["press"] == press and r["budget"] == budget]
        m = {"task": MEAN, "length": 0, "press": press, "budget": budget, "n": len(got),
             "score": num(sum(g["score"] for g in got) / len(got))}
        if all("full_cache" in g for g in got):
            m["full_cache"] = num(sum(g["full_cache"] for g in got) / len(got))
            m["loss"] = num(sum(g["loss"] for g in got) / len(got))
        means.append(m)
    order = {k: i for i, k in enumerate(sorted(keys, key=lambda k: (k[0] != "none", k[0], k[1])))}
    rows.sort(key=lambda r: (r["task"], order[(r["press"], r["budget"])]))
    means.sort(key=lambda r: order[(r["press"], r["budget"])])
    out = rows + means
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text("{\"rows\": [\n" + ",\n".join(
        "  " + json.dumps(r, separators=(",", ":")) for r in out) + "\n]}\n")
    md = ["| task | length | press | budget | n | score | full cache | loss |", "|---|--:|---|--:|--:|--:|--:|--:|"]
    for r in out:
        base = f"{r['full_cache']:.1f}" if "full_cache" in r else "-"
        loss = f"{r['loss']:.1f}" if "loss" in r else "-"
        md.append(f"| {r['task']} | {r['length'] or '-'} | {'full cache' if r['press'] == 'none' else r['press']} | "
                  f"{r['budget']:.2f} | {r['n']} | {r['score']:.1f} | {base} | {loss} |")
    (a.out / "summary.md").write_text("\n".join(md) + "\n")
    print(f"merge_summary.py: {len(tasks)} tasks, {len(rows)} rows and {len(means)} means in {a.out}/summary.json",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
