#!/usr/bin/env python3
"""Record kvpress decode-time compression fixtures under tests/fixtures/decode/<model>/ (README.md).

For the fp32 models llama_gqa (G = 2) and qwen2_bias (G = 3): a seeded prompt of distinct ids is
prefilled in one forward inside `with press(model)`, then N_NEW tokens are generated greedily one
forward at a time at explicit positions (position_ids and cache_position P, P + 1, ..., as the
logical positions a compressed cache needs), under kvpress 0.5.5's DecodingPress,
CompressionRatioDecodingPress and PrefillDecodingPress. Per case it records the generated ids, the
logits each token was chosen from, and after every compression the kept positions of every
(layer, KV head).

How the kept sets are found, not assumed: the positions of every cached row are tracked beside
kvpress's cache; at a compression each kept key is matched bit for bit to the row it came from
(the prompt ids are distinct, so no two rows share a key), and the kept set must equal the top-k
of the base press's scores at the kvpress target. The relative score gap at the cut of every
compression must exceed MIN_REL_GAP (else the next prompt seed is tried), so ckv's tie rule never
decides a fixture.

Usage: decode_fixtures.py [--only MODEL ...]   (run by tools/oracle/regen.sh)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

FIXTURE_DECODE = oc.REPO_ROOT / "tests" / "fixtures" / "decode"
MODELS = ["llama_gqa", "qwen2_bias"]
PROMPT_LEN = 40
N_NEW = 41  # the first token from the prompt's logits, then 40 decode steps
MIN_REL_GAP = 1e-6
MAX_SEED_TRIES = 32


@dataclass
class Case:
    name: str  # file stem
    decode_spec: str  # ckv --decode-press
    interval: int
    target: int  # 0 in the ratio form
    ratio: float  # -1 in the target form
    prefill_spec: str  # ckv --press ("none": no prefill press)
    prefill_cr: float  # its compression ratio
    make: Callable[[], object]  # the kvpress press


def _cases() -> list[Case]:
    import kvpress as kp

    return [
        Case("decoding-knorm", "knorm", 8, 48, -1, "none", 0.0,
             lambda: kp.DecodingPress(base_press=kp.KnormPress(), compression_interval=8, target_size=48)),
        Case("decoding-keydiff", "keydiff", 5, 30, -1, "none", 0.0,
             lambda: kp.DecodingPress(base_press=kp.KeyDiffPress(), compression_interval=5, target_size=30)),
        Case("ratio-knorm", "knorm", 6, 0, 0.4, "none", 0.0,
             lambda: kp.CompressionRatioDecodingPress(base_press=kp.KnormPress(), compression_interval=6,
                                                      target_compression_ratio=0.4)),
        Case("prefill_knorm-decoding_keydiff", "keydiff", 7, 24, -1, "knorm", 0.5,
             lambda: kp.PrefillDecodingPress(
                 prefilling_press=kp.KnormPress(compression_ratio=0.5),
                 decoding_press=kp.DecodingPress(base_press=kp.KeyDiffPress(), compression_interval=7, target_size=24))),
    ]


def _base_presses(press) -> list:
    """The ScorerPress objects whose compress() cuts the cache (prefill and decode)."""
    import kvpress as kp

    if isinstance(press, kp.PrefillDecodingPress):
        out = []
        if press.prefilling_press is not None:
            out.append(press.prefilling_press)
        if press.decoding_press is not None:
            out.append(press.decoding_press.base_press)
        return out
    return [press.base_press]


class Tracker:
    """Positions of the cached rows per layer, updated at every compression kvpress makes."""

    def __init__(self, n_layers: int):
        self.pos = {l: None for l in range(n_layers)}  # [H, len] int64
        self.events = []  # (step, layer, positions [H, kept])
        self.min_gap = float("inf")
        self.step = 0
        self.problems = []

    def append(self, layer: int, n_heads: int, positions: list[int]):
        new = torch.tensor(positions, dtype=torch.long)[None].expand(n_heads, -1)
        self.pos[layer] = new.clone() if self.pos[layer] is None else torch.cat([self.pos[layer], new], 1)


def install_tracking(press, tracker: Tracker) -> None:
    for bp in _base_presses(press):
        orig = bp.compress

        def compress(module, hidden_states, keys, values, attentions, kwargs, _orig=orig, _bp=bp):
            layer = module.layer_idx
            new_k, new_v = _orig(module, hidden_states, keys, values, attentions, kwargs)
            if new_k.shape[2] == keys.shape[2]:
                return new_k, new_v
            # match every kept key to its source row (bit for bit)
            eq = (new_k[0][:, :, None, :] == keys[0][:, None, :, :]).all(-1)  # [H, kept, len]
            if not bool((eq.sum(-1) == 1).all()):
                tracker.problems.append(f"layer {layer}: a kept key matches {eq.sum(-1).unique().tolist()} rows")
            src = eq.float().argmax(-1)  # [H, kept]
            scores = _bp.score(module, hidden_states, keys, values, attentions, kwargs)[0]  # [H, len]
            n_kept = new_k.shape[2]
            top = scores.topk(n_kept, dim=-1).indices
            if not torch.equal(top.sort(-1).values, src.sort(-1).values):
                tracker.problems.append(f"layer {layer}: kept rows are not the top-{n_kept} of the scores")
            srt = scores.sort(-1, descending=True).values.double()
            gap = ((srt[:, n_kept - 1] - srt[:, n_kept]).abs() / srt[:, n_kept - 1].abs().clamp_min(1e-30)).min()
            tracker.min_gap = min(tracker.min_gap, float(gap))
            kept_pos = tracker.pos[layer].gather(1, src)
            tracker.pos[layer] = kept_pos
            tracker.events.append((tracker.step, layer, kept_pos.sort(-1).values.tolist()))
            return new_k, new_v

        object.__setattr__(bp, "compress", compress)


class RowAppender:
    """Forward pre-hook on every attention module: the token's position joins the tracked rows."""

    def __init__(self, tracker: Tracker, n_kv: int):
        self.tracker, self.n_kv, self.positions = tracker, n_kv, []

    def __call__(self, module, args, kwargs):
        self.tracker.append(module.layer_idx, self.n_kv, self.positions)


@torch.inference_mode()
def run_case(model, case: Case, prompt: list[int]):
    cfg = model.config
    press = case.make()
    tracker = Tracker(cfg.num_hidden_layers)
    install_tracking(press, tracker)
    appender = RowAppender(tracker, cfg.num_key_value_heads)
    hooks = [layer.self_attn.register_forward_pre_hook(appender, with_kwargs=True) for layer in model.model.layers]
    rows, ids = [], []
    try:
        with press(model):
            P = len(prompt)
            appender.positions = list(range(P))
            out = model(input_ids=torch.tensor([prompt]), position_ids=torch.arange(P)[None],
                        cache_position=torch.arange(P), use_cache=True)
            cache = out.past_key_values
            row = out.logits[0, -1].float()
            for i in range(N_NEW):
                rows.append(row.clone())
                tok = int(torch.argmax(row))
                ids.append(tok)
                if i == N_NEW - 1:
                    break
                pos = P + i
                tracker.step = i + 1
                appender.positions = [pos]
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, position_ids=torch.tensor([[pos]]),
                            cache_position=torch.tensor([pos]), use_cache=True)
                cache = out.past_key_values
                row = out.logits[0, -1].float()
    finally:
        for h in hooks:
            h.remove()
    logits = torch.stack(rows).numpy().astype(np.float32)
    return ids, logits, tracker


def prompt_for(name: str, vocab: int, k: int) -> list[int]:
    rng = np.random.Generator(np.random.PCG64(oc.stable_seed(f"decode-prompt:{name}") + k))
    return [int(x) for x in rng.choice(np.arange(oc.FIRST_PROMPT_ID, vocab), size=PROMPT_LEN, replace=False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=MODELS)
    args = ap.parse_args()
    oc.setup_torch()
    from transformers import AutoModelForCausalLM
    import kvpress
    import transformers

    problems = []
    for name in args.only:
        model = AutoModelForCausalLM.from_pretrained(oc.FIXTURE_MODELS / name, dtype=torch.float32,
                                                     attn_implementation="sdpa")
        model.eval()
        cfg = model.config
        out = FIXTURE_DECODE / name
        for k in range(MAX_SEED_TRIES):
            prompt = prompt_for(name, cfg.vocab_size, k)
            results = [(c, *run_case(model, c, prompt)) for c in _cases()]
            gap = min(t.min_gap for _, _, _, t in results)
            if gap > MIN_REL_GAP and not any(t.problems for _, _, _, t in results):
                break
            print(f"[decode_fixtures] {name}: prompt seed {k} rejected (gap {gap:.3g}, "
                  f"{sum(len(t.problems) for _, _, _, t in results)} problems)")
        else:
            problems.append(f"{name}: no prompt seed passed")
            continue
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        cases = []
        for c, ids, logits, t in results:
            logits.astype("<f4").tofile(out / f"{c.name}.logits.f32")
            events = [{"step": s, "layer": l, "positions": p} for s, l, p in t.events]
            oc.write_json(out / f"{c.name}.json", {
                "case": c.name, "decode_press": c.decode_spec, "interval": c.interval, "target": c.target,
                "ratio": c.ratio, "press": c.prefill_spec, "compression_ratio": c.prefill_cr,
                "kvpress": repr(c.make()), "generated_ids": ids, "logits_file": f"{c.name}.logits.f32",
                "n_rows": len(ids), "compressions": events, "min_score_gap_rel": float(f"{t.min_gap:.3g}"),
            })
            cases.append(c.name)
            print(f"[decode_fixtures] {name} {c.name}: {len(t.events)} layer compressions, gap {t.min_gap:.3g}")
        oc.write_json(out / "prompt.json", {
            "model": name, "prompt_ids": prompt, "n_layers": cfg.num_hidden_layers,
            "n_kv_heads": cfg.num_key_value_heads, "vocab_size": cfg.vocab_size, "cases": cases,
            "prompt_seed": oc.stable_seed(f"decode-prompt:{name}") + k, "generator": "tools/oracle/decode_fixtures.py",
            "kvpress": getattr(kvpress, "__version__", "?"), "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
        })
    for p in problems:
        print(f"[decode_fixtures] PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
