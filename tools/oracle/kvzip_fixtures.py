#!/usr/bin/env python3
"""Record kvpress 0.5.5 KVzipPress fixtures under tests/fixtures/presses/<model>/ (ckv's `kvzip`) at
the context press_fixtures.py recorded in the model's context.json.

KVzipPress runs as kvpress's pipeline runs it: the context is prefilled inside `with press(model):`,
then (on leaving the block) the press replays the context chunk by chunk after the prompt
"\\n\\nRepeat the previous context exactly." (later chunks: "...starting with" + the last 8 ids of the
chunk before) and the suffix, scores each context token by the largest attention a replayed query of
its KV head's group pays it, gives the first n_sink tokens the model's max + 1 and removes the
int(E * cr) lowest of all E = n_layers * Hkv * L scores at once (layerwise: int(Hkv * L * cr) per
layer), masking them (masked_key_indices). The fixture models have no chat template, so kvpress's
suffix is the tokenizer's "\\n" and its prefix length 0; the tokenizer is the model directory's
tokenizer.json, llama_gqa's for qwen2_bias, which has none (the two share fixture_tokenizer.py's 512-id
vocabulary); kvpress's AutoTokenizer.from_pretrained(name_or_path) is pointed at it.

Per case: kept = the complement of kvpress's masked indices per (layer, KV head), checked equal to
ckv's rule on kvpress's own scores (one top-k over every layer, ties by lower layer, head, position),
the scores [n_layers, Hkv, L] (kvpress's score_val, float32), the replay prompt ids, and the question
logits of the kept sets (press_fixtures' float64 replay), checked against kvpress's own masked
forward.

Usage: kvzip_fixtures.py [--only MODEL ...]   (run after press_fixtures.py, by tools/oracle/regen.sh)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402
import press_fixtures as pf  # noqa: E402

GENERATOR = "tools/oracle/kvzip_fixtures.py"
# kvpress's masked question forward vs the float64 replay of the same kept sets: within 1.4e-5 but for
# qwen2_bias at cr 0.75 (0.0106), where a fake key's exp(q.k) is small but not 0 for some query
KVPRESS_MASK_ATOL = 0.05
FIRST = "\n\nRepeat the previous context exactly."
NEXT = "\n\nRepeat the part of the previous context exactly, starting with"
# (stem, chunk_size, layerwise, kvzip_plus_normalization, ratios)
CASES = [
    ("kvzip", 2048, False, False, pf.RATIOS),
    ("kvzip_c128", 128, False, False, [0.5, 0.9]),
    ("kvzip_layerwise", 2048, True, False, [0.5, 0.9]),
    ("kvzip_plus", 2048, False, True, [0.5, 0.9]),
    ("kvzip_plus_c128", 128, False, True, [0.5]),
]


def _tokenizer(name: str):
    from transformers import PreTrainedTokenizerFast

    path = oc.FIXTURE_MODELS / name / "tokenizer.json"
    if not path.exists():  # qwen2_bias has none: the fixtures' one tokenizer (tools/oracle/fixture_tokenizer.py)
        path = oc.FIXTURE_MODELS / "llama_gqa" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    tok.chat_template = None
    return tok


def _ckv_rule(scores: np.ndarray, cr: float, layerwise: bool):
    """ckv's selection on kvpress's scores: kept sets and the relative gap at the cut."""
    n_layers, n_kv, L = scores.shape
    groups = [list(range(n_layers))] if not layerwise else [[l] for l in range(n_layers)]
    kept = [[[] for _ in range(n_kv)] for _ in range(n_layers)]
    gap = math.inf
    for layers in groups:
        flat = np.concatenate([scores[l].reshape(-1) for l in layers]).astype(np.float64)
        E = flat.size
        keep = E - int(E * cr)
        order = sorted(range(E), key=lambda i: (-flat[i], i))
        if 0 < keep < E:
            a, b = flat[order[keep - 1]], flat[order[keep]]
            gap = min(gap, (a - b) / max(abs(a), abs(b), 1e-300))
        per = n_kv * L
        for i in order[:keep]:
            l, r = layers[i // per], i % per
            kept[l][r // L].append(r % L)
    return [[sorted(h) for h in layer] for layer in kept], gap


@torch.inference_mode()
def run_case(run, name, stem, chunk_size, layerwise, plus, cr, ctx, q_ids):
    import kvpress as kp
    import kvpress.presses.kvzip_press as kz
    from transformers import DynamicCache

    model = run.models["sdpa"]
    L = len(ctx)
    tok = _tokenizer(name)

    class _Tok:  # kvpress loads the tokenizer by the model's name_or_path: the fixture's tokenizer.json
        @staticmethod
        def from_pretrained(*args, **kwargs):
            return tok

    kz.AutoTokenizer = _Tok
    press = kp.KVzipPress(compression_ratio=cr, chunk_size=chunk_size, layerwise=layerwise,
                          kvzip_plus_normalization=plus)
    seen = {}
    orig_post = press.compress_post

    def post(m):
        r = orig_post(m)  # sets the sinks to the max + 1, then the masked indices
        seen["scores"] = press.score_val[:, 0].to(torch.float32).clone()
        return r

    press.compress_post = post
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    cache = DynamicCache()
    with press(model):
        model.model(input_ids=torch.tensor([ctx]), past_key_values=cache)
    scores = seen["scores"].numpy()  # [n_layers, Hkv, L]
    kept_kv = []
    for layer in model.model.layers:
        b, h, s = layer.self_attn.masked_key_indices
        masked = [set() for _ in range(run.n_kv)]
        for hh, ss in zip(h.tolist(), s.tolist()):
            masked[hh].add(ss)
        kept_kv.append([sorted(set(range(L)) - masked[hh]) for hh in range(run.n_kv)])
    q = torch.tensor([q_ids])
    kv_logits = model(input_ids=q, past_key_values=cache, position_ids=pf.question_positions(L)).logits[0].float().numpy()
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    kept, gap = _ckv_rule(scores, cr, layerwise)
    problems = []
    same = kept == kept_kv
    if not same:
        problems.append("kvpress's masked sets differ from ckv's rule on kvpress's scores")
    if not gap > pf.MIN_REL_GAP:
        problems.append(f"relative score gap {gap:.3g} <= {pf.MIN_REL_GAP} at the cut")
    replay = pf.replay_logits(run, q_ids, kept, "sdpa")
    d = float(np.abs(replay - kv_logits).max())
    if d > KVPRESS_MASK_ATOL:  # kvpress masks with fake keys (search_hyperplane): exp(q.k) tiny, not always 0
        problems.append(f"kvpress's question logits differ from the replay of its kept sets by {d:.3g}")
    ids = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    opts = dict(n_sink=4, chunk_size=chunk_size, layerwise=int(layerwise), kvzip_plus_normalization=int(plus),
                repeat_ids=ids(FIRST),
                repeat_next_ids=ids(NEXT), suffix_ids=ids("\n"))
    E = scores.size if not layerwise else scores[0].size
    obj = {
        "press": "kvzip",
        "case": stem,
        "kvpress": repr(press),
        "compression_ratio": cr,
        "options": opts,
        "attn_implementation": "sdpa",
        "n_kept": None,
        "n_kept_total": int(sum(len(h) for layer in kept for h in layer)),
        "n_removed_formula": "int(E * cr), E = " + ("Hkv * L per layer" if layerwise else "n_layers * Hkv * L"),
        "n_removed": int(E * cr),
        "head_budgets": [[len(h) for h in layer] for layer in kept],
        "kept": kept,
        "min_score_gap_rel": pf._num(gap),
        "tie_dependent": False,
        "scores_file": None,
        "scores_note": "float32 [n_layers, n_kv_heads, L]: kvpress's score_val (sinks at the max + 1)",
        "question_logits_file": None,
        "question_feed": "one forward",
        "checks": {"kvpress_same_kept": same, "replay_vs_kvpress_max_abs_diff": float(f"{d:.3g}")},
        "generator": GENERATOR,
    }
    return obj, scores, replay, problems


def prepare(name, run, ctx_json):
    """The context and question ids."""
    pf.capture_inputs(run, ctx_json["context_ids"])
    return ctx_json["context_ids"], ctx_json["question_ids"]


def run_one(run, name, state, case, cr):
    stem0, chunk_size, layerwise, plus, _ = case
    ctx, q_ids = state
    return run_case(run, name, stem0, chunk_size, layerwise, plus, cr, ctx, q_ids)


def main() -> int:
    return pf.run_generator("kvzip_fixtures", __doc__, CASES, prepare, run_one,
                            lambda o: f"kept {o['n_kept_total']} budgets {o['head_budgets']} "
                            f"gap_rel {o['min_score_gap_rel']} {o['checks']}")


if __name__ == "__main__":
    sys.exit(main())
