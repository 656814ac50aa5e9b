#!/usr/bin/env python3
"""Convert a HeadKV head-importance file (FYYFU/HeadKV, Important_Head/head_score/*.json) into ckv's
head-importance profile (the --profile FILE of the headkv presses; format in src/evict/headkv.h and
docs/presses.md).

HeadKV's file is one JSON object on its first line, {"<layer>-<head>": [retrieval scores ...]} with
one entry per QUERY head; HeadKV uses np.mean of each list. ckv allocates per KV head, so the
profile holds, per (layer, KV head g), the mean over the G = n_heads / n_kv_heads query heads
g*G .. g*G + G - 1 of those np.mean values. (ckv normalises the profile itself: the values need not
sum to 1.) Before HeadKV's rounding, a KV head's budget share is then the mean of its query heads'
shares; with temp != 1 HeadKV raises the per-query-head shares to the power temp before the mean,
ckv after it.

Usage:
  headkv_profile.py HEADKV.json --config MODEL_DIR/config.json -o PROFILE.json [--model NAME]
                    [--beta B] [--temp T] [--source TEXT]
  headkv_profile.py HEADKV.json --n-kv-heads 8 -o PROFILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headkv_reference as hr  # noqa: E402


def convert(src: Path, n_kv: int, model: str, source: str, n_layers_model: int | None = None,
            n_heads_model: int | None = None, beta: float | None = None, temp: float | None = None) -> dict:
    imp = hr.load_official_importance(src)
    if n_layers_model is not None and imp["n_layers"] != n_layers_model:
        raise ValueError(f"{src} has {imp['n_layers']} layers, the model {n_layers_model}")
    if n_heads_model is not None and imp["n_heads"] != n_heads_model:
        raise ValueError(f"{src} has {imp['n_heads']} query heads per layer, the model {n_heads_model}")
    kv = hr.kv_importance(imp["scores"], n_kv)
    out = {
        "format": "ckv-headkv-profile",
        "model": model,
        "n_layers": imp["n_layers"],
        "n_kv_heads": n_kv,
        "n_query_heads": imp["n_heads"],
        "aggregation": "mean over each KV head's query heads of np.mean(per-query-head scores)",
        "source": source,
    }
    if beta is not None:
        out["beta"] = beta
    if temp is not None:
        out["temp"] = temp
    out["scores"] = [[float(x) for x in row] for row in kv]
    return out


def write_profile(path: Path, obj: dict) -> None:
    """Indented JSON, one line per layer's scores."""
    lines = ["{"]
    keys = list(obj)
    for i, k in enumerate(keys):
        end = "," if i + 1 < len(keys) else ""
        if k == "scores":
            rows = [json.dumps(r) for r in obj[k]]
            lines.append(f'  "scores": [\n    ' + ",\n    ".join(rows) + f"\n  ]{end}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(obj[k])}{end}")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="HeadKV importance file")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--config", type=Path, help="the model's config.json (KV heads, layers and heads checked)")
    ap.add_argument("--n-kv-heads", type=int, help="KV heads per layer (when no --config)")
    ap.add_argument("--model", default=None, help="model name recorded in the profile")
    ap.add_argument("--beta", type=float, default=None, help="HeadKV beta recorded in the profile (ckv default 1.5)")
    ap.add_argument("--temp", type=float, default=None, help="HeadKV temp recorded in the profile (default 1)")
    ap.add_argument("--source", default=None, help="provenance text (default: the input file name)")
    args = ap.parse_args()
    n_layers = n_heads = None
    if args.config:
        cfg = json.loads(args.config.read_text())
        cfg = cfg.get("text_config", cfg)
        n_layers, n_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        n_kv = cfg.get("num_key_value_heads", n_heads)
        model = args.model or cfg.get("_name_or_path") or args.config.parent.name
    elif args.n_kv_heads:
        n_kv, model = args.n_kv_heads, args.model or args.src.stem
    else:
        ap.error("give --config or --n-kv-heads")
    try:
        obj = convert(args.src, n_kv, model, args.source or f"HeadKV importance file {args.src.name}", n_layers,
                      n_heads, args.beta, args.temp)
    except ValueError as e:
        print(f"headkv_profile: {e}", file=sys.stderr)
        return 1
    write_profile(args.output, obj)
    print(f"headkv_profile: wrote {args.output} ({obj['n_layers']} layers x {obj['n_kv_heads']} KV heads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
