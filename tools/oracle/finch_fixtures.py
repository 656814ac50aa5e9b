#!/usr/bin/env python3
"""Record kvpress 0.5.5 FinchPress fixtures under tests/fixtures/presses/<model>/ (ckv's `finch`, which
runs query-aware) at the context and question press_fixtures.py recorded in the model's context.json.

FinchPress runs as kvpress feeds it: one prefill of context + delimiter + question inside
`with press(model):`; its embedding hook finds the delimiter (an id that occurs nowhere else), sets the
window to the question's length and drops the delimiter's embedding, so the layers see context +
question at positions 0 .. L - 1 (L = 300 + 8). Every layer scores the context rows by the question
rows' attention (each row times its count of earlier rows with normalize_scores), gives the question
rows max + 1, keeps compute_n_kept(L, cr) rows per KV head (per chunk of chunk_length rows when set)
and re-rotates the kept keys to 0 .. n_kept - 1 with rerotate_keys.

Per case: kept positions per (layer, KV head) (rerotate_keys: the indices kvpress hands
KeyRerotationPress.rerotate_keys; else the compressed keys matched row for row to the prefill's), the
scores [n_layers, Hkv, L] as kvpress's score() returns them (float32), and the logits of 8 more ids
fed after the compressed prompt: with rerotate_keys at positions n_kept .. n_kept + 7 (kvpress's
pipeline continues at the cache's length), else at L .. L + 7 (ckv has no delimiter, which kvpress's
pipeline counts: L + 1; docs/presses.md): press_fixtures' float64 replay of the kept sets (re-rotated
keys with rerotate_keys), checked against kvpress's own compressed cache fed at those positions.

Usage: finch_fixtures.py [--only MODEL ...]   (run after press_fixtures.py, by tools/oracle/regen.sh)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402
import press_fixtures as pf  # noqa: E402
import press_reference as ref  # noqa: E402

GENERATOR = "tools/oracle/finch_fixtures.py"
REPLAY_ATOL = 1e-4  # kvpress's compressed cache vs the float64 replay of its kept sets
KEY_ATOL = 1e-4     # kvpress's re-rotated keys vs press_reference's float64 rotation
# (stem, chunk_length, normalize_scores, rerotate_keys, ratios)
CASES = [
    ("finch", None, True, True, pf.RATIOS),
    ("finch_c128", 128, True, True, [0.5, 0.75]),  # cr 0.9: the last chunk (52 rows) keeps 5 < 8 question rows, a tie
    ("finch_norot", None, True, False, [0.5, 0.9]),
    ("finch_nonorm", None, False, True, [0.5, 0.9]),
    ("finch_c64_nonorm_norot", 64, False, False, [0.25, 0.75]),
]


def after_ids(name: str, vocab: int) -> list[int]:
    """The 8 ids fed after the compressed prompt (the answer's first tokens)."""
    rng = np.random.Generator(np.random.PCG64(oc.stable_seed(f"finch-after:{name}")))
    return [int(x) for x in rng.integers(oc.FIRST_PROMPT_ID, vocab, size=pf.N_QUESTION)]


def _gap(scores: np.ndarray, kept: list, chunk: int | None) -> float:
    """Smallest relative gap between a kept and a dropped score of the same head (and chunk)."""
    worst = float("inf")
    L = scores.shape[-1]
    for i, layer in enumerate(kept):
        for h, pos in enumerate(layer):
            s = scores[i, h].astype(np.float64)
            k = np.zeros(L, dtype=bool)
            k[pos] = True
            for t0 in range(0, L, chunk or L):
                sl = slice(t0, min(L, t0 + (chunk or L)))
                ks, ds = s[sl][k[sl]], s[sl][~k[sl]]
                if len(ks) and len(ds):
                    lo, hi = ks.min(), ds.max()
                    worst = min(worst, (lo - hi) / max(abs(lo), abs(hi), 1e-30))
    return worst


@torch.inference_mode()
def run_case(run, chunk, normalize, rerotate, cr, prompt, delim, after):
    import kvpress as kp
    from kvpress.presses.finch_press import KeyRerotationPress
    from transformers import DynamicCache

    model = run.models["sdpa"]
    L = len(prompt)
    W = pf.N_QUESTION
    press = kp.FinchPress(compression_ratio=cr, chunk_length=chunk, normalize_scores=normalize, rerotate_keys=rerotate)
    press.delimiter_token_id = delim
    scores, indices = {}, {}
    orig_score = press.score

    def score(module, *args, **kwargs):
        s = orig_score(module, *args, **kwargs)
        scores[module.layer_idx] = s[0].to(torch.float32).clone()
        return s

    press.score = score
    orig_rerotate = KeyRerotationPress.rerotate_keys

    def rec_rerotate(module, idx, keys):
        indices[module.layer_idx] = idx[0].clone()
        return orig_rerotate(module, idx, keys)

    KeyRerotationPress.rerotate_keys = staticmethod(rec_rerotate)
    cache = DynamicCache()
    ids = prompt[:-W] + [delim] + prompt[-W:]
    try:
        with press(model):
            model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    finally:
        KeyRerotationPress.rerotate_keys = staticmethod(orig_rerotate)
    problems = []
    if press.window_size != W:
        problems.append(f"kvpress's window is {press.window_size}, not the question's {W} tokens")
    full = run.full_keys["sdpa"]
    kept, key_err = [], 0.0
    for i in range(run.n_layers):
        ck = cache.layers[i].keys[0]
        if rerotate:
            per = [sorted(indices[i][h].tolist()) for h in range(run.n_kv)]
            want = ref.rerotate(full[i], per, model.model.rotary_emb.inv_freq)
            key_err = max(key_err, float((ck.to(torch.float64) - want).abs().max()))
        else:
            per = [sorted(pf._match_rows(ck[h], full[i][h])) for h in range(run.n_kv)]
        kept.append(per)
    if key_err > KEY_ATOL:
        problems.append(f"kvpress's re-rotated keys differ from the float64 rotation by {key_err:.3g}")
    sc = torch.stack([scores[i] for i in range(run.n_layers)]).numpy()  # [n_layers, Hkv, L]
    n_kept = sorted({len(h) for layer in kept for h in layer})
    if rerotate and len(n_kept) != 1:
        problems.append(f"re-rotated layers hold different row counts {n_kept}: no one next position")
    start = n_kept[0] if rerotate else L  # kvpress's pipeline: after re-rotated keys, at the cache's length
    pos = torch.arange(start, start + len(after))[None]
    kv_logits = model(input_ids=torch.tensor([after]), past_key_values=cache, position_ids=pos).logits[0].float().numpy()
    keys = pf.rerotated_cache(run, model, full, kept) if rerotate else None
    replay = pf.replay_logits(run, after, kept, "sdpa", keys=keys, start=start)
    d = float(np.abs(replay - kv_logits).max())
    if d > REPLAY_ATOL:
        problems.append(f"kvpress's logits after the prompt differ from the replay of its kept sets by {d:.3g}")
    gap = _gap(sc, kept, chunk)
    if not gap > pf.MIN_REL_GAP:
        problems.append(f"relative score gap {gap:.3g} <= {pf.MIN_REL_GAP} at the cut")
    obj = {
        "press": "finch",
        "kvpress": repr(press),
        "compression_ratio": cr,
        "options": {"chunk_length": chunk or 0, "normalize_scores": int(normalize), "rerotate_keys": int(rerotate)},
        "attn_implementation": "sdpa",
        "prompt": "context+question",
        "question_rows": W,
        "delimiter_id": delim,
        "n_kept": n_kept[0] if len(n_kept) == 1 else n_kept,
        "kept": kept,
        "min_score_gap_rel": pf._num(gap),
        "tie_dependent": False,
        "scores_file": None,
        "scores_note": "float32 [n_layers, n_kv_heads, L]: kvpress's FinchPress.score (question rows at the max + 1)",
        "after_ids": after,
        "after_positions": [start, start + len(after) - 1],
        "kvpress_pipeline_answer_position": start if rerotate else L + 1,
        "question_logits_file": None,
        "question_feed": "the after ids, one forward at positions n_kept .. (re-rotated keys) or L ..",
        "checks": {"replay_vs_kvpress_max_abs_diff": float(f"{d:.3g}"),
                   "rerotated_keys_max_abs_diff": float(f"{key_err:.3g}") if rerotate else None},
        "generator": GENERATOR,
    }
    return obj, sc, replay, problems


def prepare(name, run, ctx_json):
    """The prompt (context + question), a delimiter id absent from it, the answer's ids."""
    prompt = ctx_json["context_ids"] + ctx_json["question_ids"]
    delim = next(i for i in range(oc.FIRST_PROMPT_ID, run.vocab) if i not in set(prompt))
    pf.capture_inputs(run, prompt)  # the prefill the layers see (the delimiter's embedding dropped)
    return prompt, delim, after_ids(name, run.vocab)


def run_one(run, name, state, case, cr):
    stem0, chunk, normalize, rerotate, _ = case
    prompt, delim, after = state
    obj, scores, logits, pr = run_case(run, chunk, normalize, rerotate, cr, prompt, delim, after)
    obj["case"] = stem0
    return obj, scores, logits, pr


def main() -> int:
    return pf.run_generator("finch_fixtures", __doc__, CASES, prepare, run_one,
                            lambda o: f"kept {o['n_kept']} gap_rel {o['min_score_gap_rel']} {o['checks']}")


if __name__ == "__main__":
    sys.exit(main())
