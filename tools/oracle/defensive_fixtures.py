#!/usr/bin/env python3
"""Record DefensiveKV and HeadKV fixtures under tests/fixtures/presses/<model>/ for the tiny models
llama_gqa (G = 2) and qwen2_bias (q/k/v biases, G = 3).

The context is context.json's context_ids when press_fixtures.py has written it, otherwise its first
seeded context (press_fixtures.context_ids(model, vocab, 0): 300 distinct seeded ids). One
uncompressed prefill (transformers, fp32, sdpa) gives per layer the attention input, the RoPE
tables, the post-RoPE keys and the values; the presses are then evaluated from those inputs:

  defensivekv (cases defensivekv_crNN.json): defensive_reference.py, the port of DefensiveKV's
    EfficientDefensiveKVPress (window 32, avg pooling, kernel 5), in fp32 as the official code runs
    an fp32 model; kept = ckv's selection of those scores: the window protected (layer max + 1),
    then ONE top-k of int(L * (1 - cr) * Hkv) entries over all KV heads of the layer, ties by lower
    head, then lower position. The same run in float64 must keep the same tokens.
  layer_defensivekv (cases layer_defensivekv_crNN.json): the same per-layer scores, then ckv's rule for
    DefensiveKV's EfficientLayerDefensiveKVPress: ONE top-k of int(L * (1 - cr) * Hkv * n_layers)
    entries over every (layer, KV head, token), the window holding nextafter(its layer's max) (it
    competes across layers at that value, as the official window does at the max itself), ties by
    lower layer, head, position; the question logits of those kept sets from press_fixtures' float64
    replay. The same run in float64 must keep the same tokens; with --official
    the official compress() (run layer after layer on a stand-in cache) must keep them too unless the
    case is tie_dependent.
  headkv:snapkv (cases headkv-snapkv_crNN.json, and headkv-snapkv_w8k7max_crNN.json with HeadKV's own
    run settings window 8, max pooling, kernel 7): snapkv scores (press_reference.score_snapkv,
    float64; for avg pooling also kvpress's SnapKVPress.score, which must keep the same tokens), per-head
    budgets from the committed synthetic profile tests/fixtures/presses/headkv_profile_<model>.json
    (headkv_reference.ckv_budgets with the snapkv window beside the shares), each head keeping its
    budget's best tokens (window protected, ties by lower position). The case's "profile" option is
    relative to the case file's directory; "headkv" gives the allocation's parameters (beta, temp,
    the window kept beside each share, n_kept_mean) and "head_budgets" its result.

Every case records whether its kept sets depend on how ties are broken (tie_dependent: e.g. the
forced first-stage tokens of defensivekv all hold the layer max, and budgets below the window cut
inside the protected window) and the relative score gap at each non-structural cut.

With --official DIR (a checkout of FFY0/DefensiveKV) the official EfficientDefensiveKVPress.score is
also run on the same inputs (its package imports stubbed, the Triton value-norm kernel replaced by
the plain torch product it fuses) and must give the port's scores; nothing of it is written.

The synthetic profiles are regenerated (deterministically) by --new-profiles: seeded per-query-head
retrieval-score lists in HeadKV's own file format, converted by headkv_profile.py.

Usage: defensive_fixtures.py [--only MODEL ...] [--official DIR] [--new-profiles]
Run it after press_fixtures.py (which rewrites tests/fixtures/presses/<model>/ and its context.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import defensive_reference as dref  # noqa: E402
import headkv_profile as hprof  # noqa: E402
import headkv_reference as href  # noqa: E402
import oracle_common as oc  # noqa: E402
import press_reference as ref  # noqa: E402

FIXTURE_PRESSES = oc.REPO_ROOT / "tests" / "fixtures" / "presses"
MODELS = ["llama_gqa", "qwen2_bias"]
RATIOS = [0.25, 0.5, 0.75, 0.9]
GENERATOR = "tools/oracle/defensive_fixtures.py"


# ----------------------------------------------------------------------------------------------
# inputs


@dataclass
class Run:
    name: str
    model: object
    n_layers: int
    n_heads: int
    n_kv: int
    vocab: int
    ctx: list
    context_source: str
    inputs: list  # [layer] press_reference.LayerInputs
    attn: list  # [layer] attention modules


def load(name: str) -> Run:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(oc.FIXTURE_MODELS / name, dtype=torch.float32, attn_implementation="sdpa")
    m.eval()
    cfg = m.config
    ctx_file = FIXTURE_PRESSES / name / "context.json"
    if ctx_file.exists():
        ctx = json.loads(ctx_file.read_text())["context_ids"]
        src = f"tests/fixtures/presses/{name}/context.json"
    else:
        import press_fixtures as pf

        ctx, _ = pf.context_ids(name, cfg.vocab_size, 0)
        src = f"press_fixtures.context_ids('{name}', {cfg.vocab_size}, 0)"
    run = Run(name, m, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size,
              ctx, src, [], [layer.self_attn for layer in m.model.layers])
    capture(run)
    return run


@torch.inference_mode()
def capture(run: Run) -> None:
    """One uncompressed prefill: per layer the attention input, RoPE tables, keys and values."""
    from transformers import DynamicCache

    seen: dict[int, tuple] = {}

    def hook(module, args, kwargs, output):
        cos, sin = kwargs["position_embeddings"]
        seen[module.layer_idx] = (kwargs["hidden_states"][0].clone(), cos[0].clone(), sin[0].clone())

    handles = [a.register_forward_hook(hook, with_kwargs=True) for a in run.attn]
    try:
        cache = DynamicCache()
        run.model.model(input_ids=torch.tensor([run.ctx]), past_key_values=cache)
    finally:
        for h in handles:
            h.remove()
    rotary = run.model.model.rotary_emb

    def rope_table(positions: torch.Tensor):
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
        return cos[0], sin[0]

    for i, attn in enumerate(run.attn):
        hidden, cos, sin = seen[i]
        run.inputs.append(ref.LayerInputs(
            layer=i, n_layers=run.n_layers, n_heads=run.n_heads, hidden=hidden,
            keys=cache.layers[i].keys[0].clone(), values=cache.layers[i].values[0].clone(), cos=cos, sin=sin,
            wq=attn.q_proj.weight.detach(), bq=None if attn.q_proj.bias is None else attn.q_proj.bias.detach(),
            wo=attn.o_proj.weight.detach(), rope_table=rope_table))


# ----------------------------------------------------------------------------------------------
# the official DefensiveKV scorer, run for comparison only


def load_official_defensive(root: Path, layer: bool = False):
    """EfficientDefensiveKVPress (layer: EfficientLayerDefensiveKVPress over its real base class
    EfficientAdaGlobalScorerPress, whose compress() selects over all layers) from a DefensiveKV
    checkout, its other package imports stubbed."""
    from dataclasses import dataclass as dc

    @dc
    class _AdaBase:
        compression_ratio: float = 0.0

    class _Other:
        pass

    def vw_l1norm(V, Wo, scale=1.0):  # what the fused Triton kernel computes: ||V W_O^h||_1 per head
        return ((V * scale) @ Wo.unsqueeze(0)).abs().sum(-1)

    stubs = {
        "kvpress.presses.efficient_ada_scorer_press": {"EfficientAdaScorerPress": _AdaBase},
        "kvpress.presses.efficient_ada_global_scorer_press": {"EfficientAdaGlobalScorerPress": _Other},
        "kvpress.presses.base_press": {"BasePress": _Other},
        "kvpress.presses.scorer_press": {"ScorerPress": _Other},
        "kvpress.ops.vw_norm": {"vw_l1norm": vw_l1norm},
    }
    saved = {k: sys.modules.get(k) for k in ["kvpress", "kvpress.presses", "kvpress.ops", *stubs]}

    def run_file(name: str, stem: str):
        spec = importlib.util.spec_from_file_location(f"official_{stem}", root / "kvpress" / "presses" / f"{stem}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    try:
        for pkg in ("kvpress", "kvpress.presses", "kvpress.ops"):
            sys.modules[pkg] = types.ModuleType(pkg)
            sys.modules[pkg].__path__ = []
        for name, attrs in stubs.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
        if layer:
            base = run_file("global", "efficient_ada_global_scorer_press")
            sys.modules["kvpress.presses.efficient_ada_global_scorer_press"].EfficientAdaGlobalScorerPress = \
                base.EfficientAdaGlobalScorerPress
            mod = run_file("layer", "efficient_layer_defensivekv_press")
        else:
            mod = run_file("defensive", "efficient_defensivekv_press")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod.EfficientLayerDefensiveKVPress if layer else mod.EfficientDefensiveKVPress


@torch.inference_mode()
def official_scores(cls, run: Run, layer: int, cr: float) -> torch.Tensor:
    inp = run.inputs[layer]
    press = cls(compression_ratio=cr)
    meta = types.SimpleNamespace(bsz=1, num_key_value_heads=run.n_kv, head_lens=[inp.L] * run.n_kv)
    kwargs = {"metadata": meta, "position_embeddings": (inp.cos[None], inp.sin[None])}
    flat = press.score(run.attn[layer], inp.hidden[None], inp.keys[None], inp.values[None], None, kwargs)
    return flat.view(run.n_kv, inp.L)


# ----------------------------------------------------------------------------------------------
# defensivekv


def _num(x: float):
    return None if x is None or math.isinf(x) else float(f"{x:.6g}")


@torch.inference_mode()
def defensive_case(run: Run, cr: float, official) -> tuple[dict, np.ndarray, list[str]]:
    w, kern = dref.DEFAULT_WINDOW, dref.DEFAULT_KERNEL
    L = len(run.ctx)
    k = dref.n_kept_total(L, cr, run.n_kv)
    kept, budgets, scores, problems = [], [], [], []
    stage = {"cap": dref.stage1_cap(L, w, cr), "window_bias": [], "threshold": [], "threshold_count": [],
             "forced": []}
    gaps, structural, tie_dep, fp64_same, off_diff, stage_gaps = [], [], False, True, 0.0, []
    for i, inp in enumerate(run.inputs):
        ds = dref.defensive_scores(inp, cr, w, kern, torch.float32)
        low = dref.select_global(ds, L, w, k, "low")
        high = dref.select_global(ds, L, w, k, "high")
        ds64 = dref.defensive_scores(inp, cr, w, kern, torch.float64)
        low64 = dref.select_global(ds64, L, w, k, "low")
        tie_dep |= low.kept != high.kept
        fp64_same &= low64.kept == low.kept
        if low.structural_tie:
            structural.append(i)
        elif low.boundary_rel_gap != math.inf:
            gaps.append(low.boundary_rel_gap)
        kept.append(low.kept)
        budgets.append(low.budgets)
        stage["window_bias"].append(float(f"{ds.window_bias:.6g}"))
        stage["threshold"].append(float(f"{ds.threshold:.6g}"))
        stage["threshold_count"].append(ds.counts)
        stage["forced"].append(ds.n_forced)
        stage_gaps.append(ds.stage1_gap_rel)
        s = ds.scores.clone()
        s[:, L - w:] = torch.tensor(ds.M, dtype=torch.float32) + 1.0  # ckv's protected value
        scores.append(s.numpy())
        if official is not None:
            o = official_scores(official, run, i, cr)
            scale = float(ds.scores.abs().max())
            off_diff = max(off_diff, float((o - ds.scores).abs().max()) / scale)
    if not fp64_same:
        problems.append(f"defensivekv cr {cr}: fp32 and fp64 scores keep different tokens (a near tie)")
    checks = {"fp64_same_kept": fp64_same}
    if official is not None:  # reported, not written (the fixtures must not depend on the flag)
        print(f"[defensive_fixtures] {run.name} cr {cr}: official vs port scores, max rel diff {off_diff:.3g}")
        if off_diff > 1e-5:
            problems.append(f"defensivekv cr {cr}: port and official scores differ by {off_diff:.3g}")
    obj = {
        "press": "defensivekv",
        "case": "defensivekv",
        "reference": "FFY0/DefensiveKV EfficientDefensiveKVPress (port: tools/oracle/defensive_reference.py)",
        "compression_ratio": cr,
        "options": {"window": w, "kernel": kern, "pool": "avg"},
        "n_kept": ref.n_kept_uniform(L, cr),
        "n_kept_total": k,
        "n_kept_total_formula": "int(L * (1 - cr) * n_kv_heads)",
        "head_budgets": budgets,
        "kept": kept,
        "first_stage": stage,
        "min_score_gap_rel": _num(min(gaps)) if gaps else None,
        "first_stage_min_gap_rel": _num(min(stage_gaps)),
        "structural_ties_layers": structural,
        "tie_dependent": tie_dep,
        "scores_file": None,
        "scores_note": "float32 [n_layers, n_kv_heads, L]: the port's final scores, window = layer max + 1",
        "checks": checks,
        "generator": GENERATOR,
    }
    return obj, np.stack(scores), problems


# ----------------------------------------------------------------------------------------------
# layer_defensivekv


class _OfficialMeta:
    """The cache metadata EfficientAdaGlobalScorerPress reads and updates (bsz 1)."""

    def __init__(self, n_kv: int, L: int):
        self.bsz, self.num_key_value_heads, self.head_lens = 1, n_kv, [L] * n_kv

    def _update_metadata_while_compressing(self, head_lens, cu_seqlens, max_seqlen):
        self.head_lens = [int(x) for x in head_lens]


@torch.inference_mode()
def official_layer_kept(cls, run: Run, cr: float) -> list:
    """The official EfficientLayerDefensiveKVPress.compress run layer after layer as its forward hooks
    call it (scores appended, one selection over all layers at the last one), on a stand-in cache whose
    flattened rows [Hkv * L, d] carry their own flat index, so the gathered rows name what was kept.
    Returns [layer][KV head] kept positions (torch.topk's choice among ties)."""
    L, n_kv = len(run.ctx), run.n_kv
    d = run.inputs[0].keys.shape[-1]
    idx = torch.arange(n_kv * L, dtype=torch.float32)[:, None].expand(-1, d).contiguous()
    cache = types.SimpleNamespace(layer_scores=[], metadata_list=[_OfficialMeta(n_kv, L) for _ in run.inputs],
                                  key_cache=[idx.clone() for _ in run.inputs],
                                  value_cache=[idx.clone() for _ in run.inputs])
    press = cls(compression_ratio=cr)
    for i, inp in enumerate(run.inputs):
        kwargs = {"past_key_value": cache, "position_embeddings": (inp.cos[None], inp.sin[None])}
        press.compress(run.attn[i], inp.hidden[None], inp.keys[None], inp.values[None], None, kwargs)
    kept = []
    for i in range(len(run.inputs)):
        flat = [int(x) for x in cache.key_cache[i][:, 0].tolist()]
        heads = [[] for _ in range(n_kv)]
        for f in flat:
            heads[f // L].append(f % L)
        kept.append([sorted(h) for h in heads])
    return kept


class Replay:
    """The question logits of a kept set: press_fixtures' float64 replay of the question against the
    uncompressed context cache, each (layer, KV head) attending only to its kept positions."""

    def __init__(self, run: Run):
        import press_fixtures as pf

        ctx_file = FIXTURE_PRESSES / run.name / "context.json"
        self.q_ids = json.loads(ctx_file.read_text())["question_ids"] if ctx_file.exists() else None
        self.pf = pf
        pf.register_replay_attention()
        self.prun = pf.load_models(run.name)
        pf.capture_inputs(self.prun, run.ctx)

    def logits(self, kept: list) -> np.ndarray | None:
        return None if self.q_ids is None else self.pf.replay_logits(self.prun, self.q_ids, kept, "sdpa")


@torch.inference_mode()
def layer_defensive_case(run: Run, cr: float, official) -> tuple[dict, np.ndarray, list[str]]:
    w, kern = dref.DEFAULT_WINDOW, dref.DEFAULT_KERNEL
    L = len(run.ctx)
    k = dref.n_kept_model(L, cr, run.n_kv, run.n_layers)
    ds32 = [dref.defensive_scores(inp, cr, w, kern, torch.float32) for inp in run.inputs]
    ds64 = [dref.defensive_scores(inp, cr, w, kern, torch.float64) for inp in run.inputs]
    low = dref.select_model(ds32, L, w, k, "low", torch.float32)
    high = dref.select_model(ds32, L, w, k, "high", torch.float32)
    low64 = dref.select_model(ds64, L, w, k, "low", torch.float64)
    problems = []
    fp64_same = low64.kept == low.kept
    if not fp64_same:
        problems.append(f"layer_defensivekv cr {cr}: fp32 and fp64 scores keep different tokens (a near tie)")
    checks = {"fp64_same_kept": fp64_same}
    if official is not None:  # reported, not written (the fixtures must not depend on the flag)
        off = official_layer_kept(official, run, cr)
        same = off == low.kept
        print(f"[defensive_fixtures] {run.name} layer_defensivekv cr {cr}: official compress() keeps "
              f"{'the same sets' if same else 'DIFFERENT sets'} (tie-dependent: {low.kept != high.kept})")
        if not same and low.kept == high.kept:
            problems.append(f"layer_defensivekv cr {cr}: the official compress() keeps other tokens")
    scores = []
    for ds in ds32:
        s = ds.scores.clone()
        s[:, L - w:] = dref.window_value(ds.M, torch.float32)  # ckv's window value
        scores.append(s.numpy())
    obj = {
        "press": "layer_defensivekv",
        "case": "layer_defensivekv",
        "reference": "FFY0/DefensiveKV EfficientLayerDefensiveKVPress (port: tools/oracle/defensive_reference.py)",
        "compression_ratio": cr,
        "options": {"window": w, "kernel": kern, "pool": "avg"},
        "n_kept": ref.n_kept_uniform(L, cr),
        "n_kept_total": k,
        "n_kept_total_formula": "int(L * (1 - cr) * n_kv_heads * n_layers)",
        "layer_budgets": low.layer_budgets,
        "head_budgets": low.budgets,
        "windows_cut": low.windows_cut,
        "kept": low.kept,
        "layer_max": [float(f"{ds.M:.9g}") for ds in ds32],
        "min_score_gap_rel": _num(low.boundary_rel_gap),
        "structural_tie": low.structural_tie,
        "tie_dependent": low.kept != high.kept,
        "scores_file": None,
        "scores_note": "float32 [n_layers, n_kv_heads, L]: the port's final scores, window = nextafter(layer max)",
        "checks": checks,
        "generator": GENERATOR,
    }
    return obj, np.stack(scores), problems


# ----------------------------------------------------------------------------------------------
# headkv:snapkv


def synthetic_profile(run: Run, path: Path) -> None:
    """A HeadKV-format file (per query head, "layer-head": [20 retrieval scores]) from a seeded
    generator - a few strong heads, many weak, some zero - converted to ckv's format."""
    rng = np.random.Generator(np.random.PCG64(oc.stable_seed(f"headkv-profile:{run.name}")))
    obj = {}
    for layer in range(run.n_layers):
        for h in range(run.n_heads):
            strength = float(rng.choice([0.0, 0.02, 0.1, 0.5], p=[0.15, 0.45, 0.25, 0.15]))
            vals = np.where(rng.random(20) < 0.6, strength * rng.random(20), 0.0)
            obj[f"{layer}-{h}"] = [float(f"{v:.6g}") for v in vals]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{run.name}_synthetic_retrieval_heads.json"
        src.write_text(json.dumps(obj) + "\n")
        prof = hprof.convert(src, run.n_kv, run.name,
                             "synthetic: seeded per-query-head retrieval-score lists in HeadKV's format "
                             "(tools/oracle/defensive_fixtures.py --new-profiles), converted by "
                             "tools/oracle/headkv_profile.py", run.n_layers, run.n_heads)
    if sum(sum(r) for r in prof["scores"]) <= 0:
        raise RuntimeError("synthetic profile is all zero")
    hprof.write_profile(path, prof)


def _snapkv_kvpress(run: Run, layer: int, w: int, kernel: int) -> torch.Tensor:
    import kvpress as kp

    inp = run.inputs[layer]
    press = kp.SnapKVPress(compression_ratio=0.5, window_size=w, kernel_size=kernel)
    with torch.inference_mode():
        s = press.score(run.attn[layer], inp.hidden[None], inp.keys[None], inp.values[None], None,
                        {"position_embeddings": (inp.cos[None], inp.sin[None])})
    return s[0].to(torch.float64)


def _per_head_top(scores: torch.Tensor, protected: torch.Tensor, budgets: list[int], ties: str):
    """Per head: the budget's best (protected first, then score; equal by position low/high).
    Returns kept, the relative gaps at the cuts, whether a cut lies inside the protected window, and
    the number of cuts inside a group of exactly equal scores (max pooling makes plateaus); for those
    the gap is the distance from the tied value to the nearest different score on either side."""
    kept, gaps, structural, exact = [], [], False, 0
    n_kv, L = scores.shape
    sign = 1 if ties == "low" else -1
    for h in range(n_kv):
        s, p = scores[h].tolist(), protected[h].tolist()
        order = sorted(range(L), key=lambda t: (not p[t], -s[t], sign * t))
        b = budgets[h]
        kept.append(sorted(order[:b]))
        if 0 < b < L:
            a, c = order[b - 1], order[b]
            if p[a] and p[c]:
                structural = True
            elif not p[a]:
                v = s[a]
                if s[c] == v:
                    exact += 1
                    free = [s[t] for t in range(L) if not p[t]]
                    above = [x - v for x in free if x > v]
                    below = [v - x for x in free if x < v]
                    g = min(above + below) if above + below else math.inf
                else:
                    g = v - s[c]
                gaps.append(g / max(abs(v), 1e-300))
    return kept, gaps, structural, exact


@torch.inference_mode()
def headkv_case(run: Run, cr: float, profile: dict, case: str, w: int, kernel: int, pool: str):
    L = len(run.ctx)
    n_kept = ref.n_kept_uniform(L, cr)
    beta, temp = profile.get("beta", href.DEFAULT_BETA), profile.get("temp", href.DEFAULT_TEMP)
    budgets = href.ckv_budgets(profile["scores"], L, n_kept, w, beta, temp)
    kept, gaps, structural_layers, tie_dep, problems = [], [], [], False, []
    scores_out, kvpress_same, exact_cuts = [], True, 0
    for i, inp in enumerate(run.inputs):
        sc = ref.score_snapkv(inp, w, kernel, pool)
        low, g, st, ex = _per_head_top(sc.scores, sc.protected, budgets[i], "low")
        high, _, _, _ = _per_head_top(sc.scores, sc.protected, budgets[i], "high")
        tie_dep |= low != high
        exact_cuts += ex
        gaps += g
        if st:
            structural_layers.append(i)
        if pool == "avg":  # kvpress's own SnapKV scores must keep the same tokens
            kv = _snapkv_kvpress(run, i, w, kernel)
            kk, _, _, _ = _per_head_top(kv, sc.protected, budgets[i], "low")
            kvpress_same &= kk == low
        kept.append(low)
        scores_out.append(sc.scores.to(torch.float32).numpy())
    checks = {}
    if pool == "avg":
        checks["kvpress_snapkv_same_kept"] = kvpress_same
        if not kvpress_same:
            problems.append(f"{case} cr {cr}: kvpress SnapKV scores keep different tokens")
    obj = {
        "press": "headkv:snapkv",
        "case": case,
        "reference": "FYYFU/HeadKV ReasonSnapKVCluster allocation (port: tools/oracle/headkv_reference.py) over "
                     "ckv's snapkv scores (tools/oracle/press_reference.py)",
        "compression_ratio": cr,
        "options": {"window": w, "kernel": kernel, "pool": pool,
                    "profile": f"../headkv_profile_{run.name}.json"},  # relative to this file's directory
        "headkv": {"beta": beta, "temp": temp, "window": w, "n_kept_mean": n_kept},
        "n_kept": n_kept,
        "head_budgets": budgets,
        "kept": kept,
        "min_score_gap_rel": _num(min(gaps)) if gaps else None,
        "structural_ties_layers": structural_layers,
        "cuts_inside_equal_scores": exact_cuts,
        "tie_dependent": tie_dep,
        "scores_file": None,
        "scores_note": "float32 [n_layers, n_kv_heads, L]: snapkv scores, window = layer max + 1",
        "checks": checks,
        "generator": GENERATOR,
    }
    return obj, np.stack(scores_out), problems


# ----------------------------------------------------------------------------------------------
# driver


def write_case(out: Path, stem: str, obj: dict, scores: np.ndarray, logits: np.ndarray | None = None) -> None:
    scores.astype("<f4").tofile(out / f"{stem}.scores.f32")
    obj["scores_file"] = f"{stem}.scores.f32"
    if logits is not None:  # the question (context.json's question_ids) fed after the kept sets
        logits.astype("<f4").tofile(out / f"{stem}.logits.f32")
        obj["question_logits_file"] = f"{stem}.logits.f32"
    oc.write_json(out / f"{stem}.json", obj)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help=f"models ({', '.join(MODELS)})")
    ap.add_argument("--official", type=Path, default=None, help="a FFY0/DefensiveKV checkout to compare with")
    ap.add_argument("--new-profiles", action="store_true", help="regenerate the synthetic headkv profiles")
    args = ap.parse_args()
    oc.setup_torch()
    official = load_official_defensive(args.official) if args.official else None
    official_layer = load_official_defensive(args.official, layer=True) if args.official else None
    problems: list[str] = []
    for name in args.only or MODELS:
        run = load(name)
        replay = Replay(run)
        out = FIXTURE_PRESSES / name
        out.mkdir(parents=True, exist_ok=True)
        prof_path = FIXTURE_PRESSES / f"headkv_profile_{name}.json"
        if args.new_profiles or not prof_path.exists():
            synthetic_profile(run, prof_path)
        profile = json.loads(prof_path.read_text())
        ctx_note = {"context_source": run.context_source, "L": len(run.ctx)}
        for cr in RATIOS:
            stem = f"defensivekv_cr{round(cr * 100):02d}"
            obj, scores, pr = defensive_case(run, cr, official)
            obj["context"] = ctx_note
            write_case(out, stem, obj, scores)
            problems += [f"{name}: {p}" for p in pr]
            fs = obj["first_stage"]
            print(f"[defensive_fixtures] {name:<10} {stem:<28} total {obj['n_kept_total']:>4} budgets "
                  f"{obj['head_budgets']} cap {fs['cap']} forced {fs['forced']} gap_rel {obj['min_score_gap_rel']} "
                  f"stage1_gap_rel {obj['first_stage_min_gap_rel']} "
                  f"{'TIE-DEPENDENT' if obj['tie_dependent'] else ''} {obj['checks']}")
            stem = f"layer_defensivekv_cr{round(cr * 100):02d}"
            obj, scores, pr = layer_defensive_case(run, cr, official_layer)
            obj["context"] = ctx_note
            write_case(out, stem, obj, scores, replay.logits(obj["kept"]))
            problems += [f"{name}: {p}" for p in pr]
            print(f"[defensive_fixtures] {name:<10} {stem:<28} total {obj['n_kept_total']:>4} layers "
                  f"{obj['layer_budgets']} windows cut {obj['windows_cut']} gap_rel {obj['min_score_gap_rel']} "
                  f"{'TIE-DEPENDENT' if obj['tie_dependent'] else ''} {obj['checks']}")
            for case, w, kern, pool in (("headkv-snapkv", 64, 5, "avg"), ("headkv-snapkv_w8k7max", 8, 7, "max")):
                stem = f"{case}_cr{round(cr * 100):02d}"
                obj, scores, pr = headkv_case(run, cr, profile, case, w, kern, pool)
                obj["context"] = ctx_note
                write_case(out, stem, obj, scores)
                problems += [f"{name}: {p}" for p in pr]
                print(f"[defensive_fixtures] {name:<10} {stem:<28} n_kept {obj['n_kept']:>4} budgets "
                      f"{obj['head_budgets']} gap_rel {obj['min_score_gap_rel']} "
                      f"{'TIE-DEPENDENT' if obj['tie_dependent'] else ''} {obj['checks']}")
    for p in problems:
        print(f"[defensive_fixtures] PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
