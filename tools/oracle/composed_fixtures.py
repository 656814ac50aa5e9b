#!/usr/bin/env python3
"""Record kvpress 0.5.5 ComposedPress fixtures under tests/fixtures/presses/<model>/ (ckv's
`composed:` wrapper) at the context press_fixtures.py recorded in the model's context.json.

ComposedPress([P1, P2, ...]) runs each press's forward hook in turn on the same layer: P1 compresses
the layer's cache, P2 scores and compresses what P1 kept, and so on; each keeps
compute_n_kept(n, cr_i) = max(1, int(n * (1 - cr_i))) of the n rows before it, so the kept fraction is
the product of the (1 - cr_i). kvpress stores each press's kept rows in torch.topk order (descending
score), so P2 sees P1's rows in score order; ckv keeps rows in position order and defines the later
presses on that order (docs/presses.md, "composed"). Per case this records:

  - kept: ckv's rule, computed with kvpress's own scorers: P1's scores on the whole layer (recorded
    from the ComposedPress run), its top n1 per head; then P_i's score() called on the rows kept so far
    in POSITION order, its top n_i; ties by lower position (tie_dependent marks selections where the
    order among equal scores decides);
  - kept_kvpress and checks.kvpress_same_kept: what the ComposedPress run really kept (its cache rows
    matched bit for bit to the context keys); for the later presses whose scores do not depend on the
    order of the rows (knorm, keydiff) it must equal `kept`, and kvpress's question logits must equal
    the replay of those sets;
  - the first press's raw scores [n_layers, n_kv_heads, L] (scores_file) and the question logits of
    `kept` (press_fixtures' float64 replay of context.json's question against the uncompressed cache,
    each head attending to its kept positions).

Wrapped members: a CriticalKVPress (a ScorerPress) selects by its combined scores at any position; a
ChunkKVPress member's rows under ckv's rule are what its own compress() keeps of the rows in position
order (matched bit for bit), ties as kvpress's. A first press under a wrapper records its inner
press's scores.

A PerLayerCompressionPress member sets its press's compression_ratio to the layer's entry of its
compression_ratios and runs that press's hook (it takes no ratio of its own, and ComposedPress reports
its mean); a case's ratio for it is the centre of press_fixtures.per_layer_ratios (cr / 2 at the first
layer to 3 cr / 2 at the last), and the fixture records kvpress's own ComposedPress.compression_ratio.

Usage: composed_fixtures.py [--only MODEL ...] [--cases STEM ...]   (run after press_fixtures.py, by
tools/oracle/regen.sh)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402
import press_fixtures as pf  # noqa: E402
import press_reference as ref  # noqa: E402

GENERATOR = "tools/oracle/composed_fixtures.py"
SNAP = dict(window=64, kernel=5, pool="avg")
CUR = dict(n_sink=4, leverage_type="kv_product", use_local_approximation=True, local_window_size=16)
TWO = [(0.25, 0.5), (0.5, 0.5), (0.5, 0.75), (0.75, 0.25)]
THREE = [(0.25, 0.5, 0.25), (0.5, 0.25, 0.5)]


class PerLayer:
    """A PerLayerCompressionPress member: make(ratios) builds it from the layer ratios; a case's ratio
    for it is their centre (press_fixtures.per_layer_ratios)."""

    def __init__(self, make):
        self.make = make


def _cases():
    import kvpress as kp

    snap = lambda cr: kp.SnapKVPress(compression_ratio=cr, window_size=64, kernel_size=5)  # noqa: E731
    knorm = lambda cr: kp.KnormPress(compression_ratio=cr)  # noqa: E731
    keydiff = lambda cr: kp.KeyDiffPress(compression_ratio=cr)  # noqa: E731
    cur = lambda cr: kp.CURPress(compression_ratio=cr)  # noqa: E731
    crit_snap = lambda cr: kp.CriticalKVPress(snap(cr), epsilon=1e-4, first_stage_ratio=0.5)  # noqa: E731
    rot_snap = lambda cr: kp.KeyRerotationPress(snap(cr))  # noqa: E731
    rot_knorm = lambda cr: kp.KeyRerotationPress(knorm(cr))  # noqa: E731
    crit_knorm = lambda cr: kp.CriticalKVPress(knorm(cr), epsilon=1e-4, first_stage_ratio=0.5)  # noqa: E731
    chunk_snap = lambda cr: kp.ChunkKVPress(snap(cr), chunk_length=20)  # noqa: E731
    chunk_keydiff = lambda cr: kp.ChunkKVPress(keydiff(cr), chunk_length=20)  # noqa: E731
    per_snap = PerLayer(lambda crs: kp.PerLayerCompressionPress(press=snap(0.0), compression_ratios=crs))
    per_knorm = PerLayer(lambda crs: kp.PerLayerCompressionPress(press=knorm(0.0), compression_ratios=crs))
    # (file stem, ckv spec, kvpress factories in order, options, ratio sets, order-free later presses)
    return [
        ("composed-snapkv-knorm", "composed:snapkv+knorm", [snap, knorm], dict(SNAP), TWO, True),
        ("composed-snapkv-keydiff", "composed:snapkv+keydiff", [snap, keydiff], dict(SNAP), TWO, True),
        # a CriticalKVPress (a ScorerPress) as the first press: its combined scores select
        ("composed-critical-snapkv-knorm", "composed:critical:snapkv+knorm", [crit_snap, knorm],
         dict(SNAP, alpha=0.5, eps=1e-4), TWO, True),
        # wrapped members: CriticalKVPress after the first press, ChunkKVPress first (its rows sorted) and after
        # another ChunkKVPress
        ("composed-snapkv-critical-knorm", "composed:snapkv+critical:knorm", [snap, crit_knorm],
         dict(SNAP, alpha=0.5, eps=1e-4), TWO, True),
        ("composed-chunkkv-snapkv-knorm", "composed:chunkkv:snapkv+knorm", [chunk_snap, knorm],
         dict(SNAP, chunk_length=20), TWO, True),
        ("composed-chunkkv-snapkv-chunkkv-keydiff", "composed:chunkkv:snapkv+chunkkv:keydiff", [chunk_snap, chunk_keydiff],
         dict(SNAP, chunk_length=20), TWO, True),
        # KeyRerotationPress first (sorted, re-rotated keys), and again after it (kvpress rotates by the row's
        # index among the rows before, which are then positions 0 .. n - 1)
        ("composed-key_rerotation-snapkv-knorm", "composed:key_rerotation:snapkv+knorm", [rot_snap, knorm], dict(SNAP),
         TWO, True),
        ("composed-key_rerotation-snapkv-key_rerotation-knorm", "composed:key_rerotation:snapkv+key_rerotation:knorm",
         [rot_snap, rot_knorm], dict(SNAP), TWO, True),
        ("composed-snapkv-knorm-keydiff", "composed:snapkv+knorm+keydiff", [snap, knorm, keydiff], dict(SNAP), THREE,
         True),
        # PerLayerCompressionPress members: each layer at its own ratio, first (its rows left in score order) and
        # after a plain press
        ("composed-per_layer-snapkv-knorm", "composed:per_layer:snapkv+knorm", [per_snap, knorm], dict(SNAP),
         [(0.5, 0.5), (0.25, 0.75)], True),
        ("composed-snapkv-per_layer-knorm", "composed:snapkv+per_layer:knorm", [snap, per_knorm], dict(SNAP),
         [(0.5, 0.5), (0.75, 0.25)], True),
        # cur's sinks and local windows read row order: ckv's rule (position order) differs from kvpress's
        ("composed-knorm-cur", "composed:knorm+cur", [knorm, cur], dict(CUR), TWO, False),
    ]


def _order(scores: list[float], ties: str) -> list[int]:
    sign = 1 if ties == "low" else -1
    return sorted(range(len(scores)), key=lambda i: (-scores[i], sign * i))


def _cut_gap(scores: list[float], order: list[int], k: int) -> float:
    """Relative gap at the cut between the k-th and (k+1)-th best (inf when nothing is cut)."""
    if not 0 < k < len(order):
        return math.inf
    a, b = scores[order[k - 1]], scores[order[k]]
    return (a - b) / max(abs(a), abs(b), 1e-300)


@torch.inference_mode()
def run_case(run, stem, spec, makers, options, ratios, order_free, ctx, q_ids):
    import kvpress as kp
    from transformers import DynamicCache

    model = run.models["sdpa"]
    L, n_kv = len(ctx), run.n_kv
    # per press: its compression ratio at each layer (a PerLayerCompressionPress member's own list)
    layer_crs = [pf.per_layer_ratios(cr, run.n_layers) if isinstance(mk, PerLayer) else [cr] * run.n_layers
                 for mk, cr in zip(makers, ratios)]
    presses = [mk.make(crs) if isinstance(mk, PerLayer) else mk(cr) for mk, cr, crs in zip(makers, ratios, layer_crs)]
    composed = kp.ComposedPress(presses)
    seen = [dict() for _ in presses]  # per press: layer -> (keys in, scores, module, hidden, kwargs)
    raw = [dict() for _ in presses]  # a wrapped press (CriticalKVPress): layer -> its inner press's scores

    def wrap(i, p):
        if isinstance(p, kp.PerLayerCompressionPress):  # its press's hook runs at the layer's ratio
            p = p.press
        if isinstance(p, kp.KeyRerotationPress):  # its inner press's scores select (sorted), then it rotates
            orig_r = p.press.score

            def rec_r(module, hidden_states, keys, values, attentions, kwargs):
                s = orig_r(module, hidden_states, keys, values, attentions, kwargs)
                seen[i][module.layer_idx] = (keys[0].clone(), s[0].clone(), module, hidden_states, dict(kwargs), orig_r)
                raw[i][module.layer_idx] = s[0].clone()
                return s

            p.press.score = rec_r
            return
        if isinstance(p, kp.ChunkKVPress):  # not a ScorerPress: its compress() is recorded (scores None)
            orig_c = p.compress

            def rec_c(module, hidden_states, keys, values, attentions, kwargs):
                seen[i][module.layer_idx] = (keys[0].clone(), None, module, hidden_states, dict(kwargs), orig_c)
                return orig_c(module, hidden_states, keys, values, attentions, kwargs)

            p.compress = rec_c
        else:
            orig = p.score

            def rec(module, hidden_states, keys, values, attentions, kwargs):
                s = orig(module, hidden_states, keys, values, attentions, kwargs)
                seen[i][module.layer_idx] = (keys[0].clone(), s[0].clone(), module, hidden_states, dict(kwargs), orig)
                return s

            p.score = rec
        if hasattr(p, "press"):
            inner = p.press.score

            def rec_inner(module, hidden_states, keys, values, attentions, kwargs):
                s = inner(module, hidden_states, keys, values, attentions, kwargs)
                raw[i][module.layer_idx] = s[0].clone()
                return s

            p.press.score = rec_inner

    for i, p in enumerate(presses):
        wrap(i, p)
    cache = DynamicCache()
    with composed(model):
        model.model(input_ids=torch.tensor([ctx]), past_key_values=cache)
    full_k, full_v = run.full_keys["sdpa"], run.full_values["sdpa"]
    rotating = any(isinstance(p, kp.KeyRerotationPress) for p in presses)
    cache_keys = [cache.layers[layer].keys[0].clone() for layer in range(run.n_layers)]  # before the question
    q, pos = torch.tensor([q_ids]), pf.question_positions(L)
    if len({cache.layers[layer].keys.shape[2] for layer in range(run.n_layers)}) > 1:
        # per-layer lengths (a PerLayerCompressionPress member): transformers sizes one forward's causal mask
        # from layer 0, so the question goes one token at a time (no mask needed), as press_fixtures.py does
        feed = "token by token"
        kv_logits = torch.stack([model(input_ids=q[:, j: j + 1], past_key_values=cache, position_ids=pos[:, j: j + 1])
                                 .logits[0, -1].float() for j in range(len(q_ids))]).numpy()
    else:
        feed = "one forward"
        kv_logits = model(input_ids=q, past_key_values=cache, position_ids=pos).logits[0].float().numpy()

    problems, kept, low_all, high_all, gaps = [], [], [], [], []
    first_scores, counts, kept_kv = [], [L], []  # counts: layer 0's rows after each press
    for layer in range(run.n_layers):
        k_in, s1, module, hidden, kwargs, _ = seen[0][layer]
        if not torch.equal(k_in, full_k[layer]):
            problems.append(f"layer {layer}: the first press did not see the context's keys")
        # the scores ckv reports: the first press's own (under CriticalKVPress: its inner press's)
        first_scores.append((raw[0][layer] if raw[0] else s1).to(torch.float32).numpy())
        sel, last_keys = {}, None
        for ties in ("low", "high"):
            rows = [list(range(L)) for _ in range(n_kv)]  # context rows kept so far, ascending
            keys, vals = full_k[layer][None], full_v[layer][None]  # [1, n_kv, n, d] those rows (keys re-rotated)
            for i in range(len(ratios)):
                n = len(rows[0])
                k = ref.n_kept_uniform(n, layer_crs[i][layer])
                if seen[i][layer][1] is None:  # ChunkKVPress: what its compress() keeps of those rows
                    out_k = seen[i][layer][5](module, hidden, keys, vals, None, kwargs)[0][0]
                    js = [sorted(pf._match_rows(out_k[h], keys[0][h])) for h in range(n_kv)]
                else:
                    if i == 0:
                        sc = s1.to(torch.float64)
                    else:  # kvpress's scorer on the rows kept so far, in position order
                        sc = seen[i][layer][5](module, hidden, keys, vals, None, kwargs)[0].to(torch.float64)
                    js = []
                    for h in range(n_kv):
                        vals_h = sc[h].tolist()
                        order = _order(vals_h, ties)
                        if ties == "low":
                            g = _cut_gap(vals_h, order, k)
                            # snapkv's window is padded with one value: a tie by construction, above the cut
                            gaps.append(g if not (i == 0 and g == 0.0) else math.inf)
                        js.append(sorted(order[:k]))
                if layer == 0 and ties == "low":
                    counts.append(len(js[0]))
                rows = [[rows[h][j] for j in js[h]] for h in range(n_kv)]
                jt = torch.tensor(js)[None]  # [1, n_kv, k] kept rows of the n
                if isinstance(presses[i], kp.KeyRerotationPress):  # kvpress's own rotation of the kept keys
                    keys = kp.KeyRerotationPress.rerotate_keys(module, jt, keys)
                else:
                    keys = keys.gather(2, jt[..., None].expand(-1, -1, -1, keys.shape[-1]))
                vals = vals.gather(2, jt[..., None].expand(-1, -1, -1, vals.shape[-1]))
            sel[ties] = rows
            if ties == "low":
                last_keys = keys[0]
        # what the ComposedPress run kept: its cache rows matched bit for bit to the rule's rows (the
        # context keys, or their re-rotations)
        ck = cache_keys[layer]
        try:
            kept_kv.append([sorted(sel["low"][h][j] for j in pf._match_rows(ck[h], last_keys[h])) for h in range(n_kv)])
        except RuntimeError:
            kept_kv.append(None)
        kept.append(sel["low"])
        low_all.append(sel["low"])
        high_all.append(sel["high"])
    tie_dependent = low_all != high_all
    same = kept_kv == kept
    checks = {"kvpress_same_kept": same}
    # re-rotated keys: the question logits are kvpress's own (its question at L, as its pipeline feeds a
    # ComposedPress), which ckv must reproduce; else the replay of the kept sets
    replay = kv_logits if rotating else pf.replay_logits(run, q_ids, kept, "sdpa")
    if rotating:
        checks["question_logits"] = "kvpress's, with the kept keys re-rotated"
    elif same:
        d = float(np.abs(replay - kv_logits).max())
        checks["replay_vs_kvpress_max_abs_diff"] = float(f"{d:.3g}")
        if d > pf.REPLAY_ATOL:
            problems.append(f"kvpress's question logits differ from the replay of its kept sets by {d:.3g}")
    if order_free and not same:
        problems.append("kvpress's ComposedPress kept other tokens than ckv's rule with order-free later presses")
    min_gap = min(gaps, default=math.inf)
    if not tie_dependent and not min_gap > pf.MIN_REL_GAP:
        problems.append(f"relative score gap {min_gap:.3g} <= {pf.MIN_REL_GAP} at a cut")
    total_keep = 1.0  # ComposedPress's own compression_ratio: a PerLayerCompressionPress at its mean
    for crs in layer_crs:
        total_keep *= 1.0 - sum(crs) / len(crs)
    if not math.isclose(composed.compression_ratio, 1.0 - total_keep, rel_tol=1e-12, abs_tol=1e-12):
        problems.append(f"ComposedPress reports compression_ratio {composed.compression_ratio}, not {1.0 - total_keep}")
    options = dict(options, press_ratios=[cr for mk, cr in zip(makers, ratios) if not isinstance(mk, PerLayer)])
    per_layer = [crs for mk, crs in zip(makers, layer_crs) if isinstance(mk, PerLayer)]
    if per_layer:
        options["compression_ratios"] = per_layer[0]
    if not options["press_ratios"]:
        del options["press_ratios"]
    obj = {
        "press": spec,
        "case": stem,
        "kvpress": pf.describe(composed) if hasattr(pf, "describe") else repr(composed),
        "compression_ratio": round(1.0 - total_keep, 12),
        "options": options,
        "attn_implementation": "sdpa",
        "n_kept_per_stage": counts[1:],
        "n_kept": counts[-1],
        "kept": kept,
        "kept_kvpress": kept_kv,
        "min_score_gap_rel": 0.0 if tie_dependent else pf._num(min_gap),
        "tie_dependent": tie_dependent,
        "order_free_later_presses": order_free,
        "scores_file": None,
        "scores_note": "float32 [n_layers, n_kv_heads, L]: the first press's scores (kvpress)",
        "question_logits_file": None,
        "question_feed": feed,
        "checks": checks,
        "generator": GENERATOR,
    }
    return obj, np.stack(first_scores), replay, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help=f"models ({', '.join(pf.MODELS)})")
    ap.add_argument("--cases", nargs="*", default=None, help="only these cases (file stems without the ratios)")
    args = ap.parse_args()
    oc.setup_torch()
    import kvpress  # noqa: F401  (importing kvpress patches the attention functions, as in its pipeline)

    pf.register_replay_attention()
    problems: list[str] = []
    for name in args.only or pf.MODELS:
        out = pf.FIXTURE_PRESSES / name
        ctx_json = json.loads((out / "context.json").read_text())
        ctx, q_ids = ctx_json["context_ids"], ctx_json["question_ids"]
        run = pf.load_models(name)
        pf.capture_inputs(run, ctx)
        for stem0, spec, makers, options, ratio_sets, order_free in _cases():
            if args.cases is not None and stem0 not in args.cases:
                continue
            for ratios in ratio_sets:
                stem = stem0 + "_r" + "_".join(f"{round(r * 100):02d}" for r in ratios)
                obj, scores, logits, pr = run_case(run, stem0, spec, makers, options, ratios, order_free, ctx, q_ids)
                scores.astype("<f4").tofile(out / f"{stem}.scores.f32")
                logits.astype("<f4").tofile(out / f"{stem}.logits.f32")
                obj["scores_file"] = f"{stem}.scores.f32"
                obj["question_logits_file"] = f"{stem}.logits.f32"
                oc.write_json(out / f"{stem}.json", obj)
                problems += [f"{name} {stem}: {p}" for p in pr]
                print(f"[composed_fixtures] {name:<10} {stem:<40} kept/stage {obj['n_kept_per_stage']} "
                      f"gap_rel {obj['min_score_gap_rel']} {'TIE-DEPENDENT ' if obj['tie_dependent'] else ''}"
                      f"{obj['checks']}")
    for p in problems:
        print(f"[composed_fixtures] PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
