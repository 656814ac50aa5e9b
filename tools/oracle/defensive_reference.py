"""A pure-torch port of DefensiveKV's scorer and selection (FFY0/DefensiveKV, the CriticalKV authors'
follow-up, press "efficient_defensivekv" = EfficientDefensiveKVPress), written from reading the
official code, not copied from it. ckv's src/evict/score_defensive.c implements the same semantics;
defensive_fixtures.py records what this port keeps on the tiny oracle models.

One layer at a time, batch 1, inputs as press_reference.LayerInputs. Official defaults: window 32,
avg pooling with kernel 5 (kvpress's SnapKV uses window 64).

The scorer, per layer (L context tokens, w window, H query heads in Hkv groups of G):
  1. A[h, i, t]: softmax attention of the last w tokens' queries (q_proj + bias, RoPE at their
     positions, logits / sqrt(head_dim), causal inside the window, softmax over all L keys in fp32),
     then only the L - w non-window columns.
  2. ave[g, t] = mean over the group's G heads, then over the w queries, of A (snapkv's unpooled
     score), used by stage 1 below.
  3. Per (h, i) row: P = avg_pool1d(A[h, i], kernel, pad kernel // 2, zero padding counted), then
     P * (sum_t A[h, i, t]) / (sum_t P[t]): pooled, rescaled to the row's own attention mass.
  4. Defensive aggregation: D[g, t] = max over the G heads and the w queries of the rows of step 3,
     then floored at its own mean over t: D = max(D, mean_t D).
  5. Value-norm weighting: N[g, t] = mean over the group's heads of ||V[g, t] W_O^h||_1; the weight
     is N normalised ACROSS THE KV HEADS of the layer (N[g, t] / sum_g' N[g', t]); S = D * weight.
  6. Stage 1 (CriticalKV-style): per KV head, tokens ranked by ave / sum_t ave; the head forces the
     first c of them, where c is the first rank at which the cumulative share reaches
     0.9 - window_bias, capped at m = int((L - w) * (1 - cr) - w). Forced tokens get the layer-wide
     max M of S (all KV heads).
  7. The window gets the layer's max as well (official) - ckv protects it instead (max + 1).
  Selection: ONE top-k over the layer's Hkv * L entries, k = int(L * (1 - cr) * Hkv).

Quirks of the official code, ported as they are:
  Q1 window_bias = mean over heads and window queries of the attention on the LAST w COLUMNS OF THE
     ALREADY-SLICED weights, i.e. on the w tokens just before the window (positions L-2w .. L-w-1;
     all L - w context tokens when L < 2w), not on the window itself (it is computed after the
     window columns were dropped).
  Q2 The stage-1 cap uses q_len = L - w (the length of the sliced values), so m = int((L - w) *
     (1 - cr) - w), Python int(): truncation toward zero.
  Q3 c = argmax(cumsum >= threshold): the count of tokens BEFORE the one that crosses the threshold
     (that token itself is not forced); 0 when the very first share already reaches it (or when no
     prefix ever does).
  Q4 When m < 0 (budget below about two windows) min(c, m) = m is negative and the official slice
     sorted[:m] forces all but the last |m| tokens of every head: nearly everything ties at M and the
     global top-k picks among ties (torch.topk order, undefined; ckv: lower head, then lower position).
  Q5 The forced value is the layer max M itself, so forced tokens tie with the top unforced token and
     (officially) with the window.
  Q6 The global budget is int(L * (1 - cr) * Hkv) (one truncation of the product), not
     Hkv * int(L * (1 - cr)).
  Q7 The value-norm weights are normalised over KV heads per token (dim -2), not over tokens.
  Q8 (precision) the official Triton kernel for N runs tl.dot, TF32 on GPUs for fp32 inputs; this
     port (and ckv) compute N in full fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from press_reference import LayerInputs

DEFAULT_WINDOW = 32
DEFAULT_KERNEL = 5
THRESHOLD = 0.9  # stage-1 cumulative attention share before the window correction


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@dataclass
class DefensiveScores:
    scores: torch.Tensor  # [Hkv, L]: final scores, window = layer max (official padding)
    body: torch.Tensor  # [Hkv, L - w]: S with the forced tokens set to M
    weighted: torch.Tensor  # [Hkv, L - w]: S before forcing
    forced: torch.Tensor  # [Hkv, L - w] bool
    M: float  # layer max of `weighted`, the forced / window value
    window_bias: float
    threshold: float
    counts: list[int]  # c per KV head before the cap
    cap: int  # m
    n_forced: list[int]  # per KV head
    stage1_gap_rel: float  # smallest relative margin of a first-stage decision (share order, threshold)


def window_attention(inp: LayerInputs, w: int, dtype=torch.float32) -> tuple[torch.Tensor, float]:
    """[H, w, L - w] attention of the window queries on the non-window keys, and window_bias (Q1)."""
    L, H, d, G = inp.L, inp.n_heads, inp.d, inp.G
    x = inp.hidden[L - w :].to(dtype)
    q = x @ inp.wq.to(dtype).T
    if inp.bq is not None:
        q = q + inp.bq.to(dtype)
    q = q.view(w, H, d).transpose(0, 1)  # [H, w, d]
    cos, sin = inp.cos[L - w :].to(dtype), inp.sin[L - w :].to(dtype)
    q = q * cos + _rotate_half(q) * sin
    k = inp.keys.to(dtype).repeat_interleave(G, dim=0)  # [H, L, d]
    logits = q @ k.transpose(1, 2) / math.sqrt(d)
    mask = torch.triu(torch.full((w, L), float("-inf"), dtype=dtype), diagonal=L - w + 1)
    attn = torch.softmax(logits + mask, dim=-1, dtype=dtype)[..., : L - w]
    window_bias = float(attn[..., -w:].sum(-1).mean())  # Q1: the sliced tensor's last w columns
    return attn, window_bias


def value_norms(inp: LayerInputs, n_tokens: int, dtype=torch.float32) -> torch.Tensor:
    """N [Hkv, n_tokens]: mean over the group's query heads of ||V[g, t] W_O^h||_1."""
    H, d, G = inp.n_heads, inp.d, inp.G
    V = inp.values[:, :n_tokens].to(dtype).repeat_interleave(G, dim=0)  # [H, T, d]
    Wo = inp.wo.to(dtype).T.reshape(H, d, -1)  # [H, d, D]
    per_head = torch.stack([(V[h] @ Wo[h]).abs().sum(-1) for h in range(H)])  # [H, T]
    return per_head.view(inp.n_kv, G, n_tokens).mean(1)


def stage1_cap(L: int, w: int, cr: float) -> int:
    """Q2: int(q_len * (1 - cr) - w) with q_len = L - w, Python int() (toward zero)."""
    return int((L - w) * (1 - cr) - w)


def defensive_scores(inp: LayerInputs, cr: float, window: int = DEFAULT_WINDOW, kernel: int = DEFAULT_KERNEL,
                     dtype=torch.float32) -> DefensiveScores:
    L, w, G, n_kv = inp.L, window, inp.G, inp.n_kv
    if L <= w:
        raise ValueError(f"defensivekv needs more context tokens ({L}) than its window ({w})")
    n = L - w
    attn, window_bias = window_attention(inp, w, dtype)
    s = attn.view(n_kv, G, w, n)
    ave = s.mean(1).mean(-2)  # [Hkv, n]
    base = s.sum(-1, keepdim=True)
    pooled = F.avg_pool1d(s.reshape(n_kv * G, w, n), kernel_size=kernel, padding=kernel // 2, stride=1)
    pooled = pooled.view(n_kv, G, w, n)
    s = pooled / pooled.sum(-1, keepdim=True) * base
    mx = s.max(dim=1).values.max(dim=-2).values  # [Hkv, n]
    D = mx.clamp(min=mx.mean(-1, keepdim=True))
    N = value_norms(inp, n, dtype)
    S = D * (N / N.sum(0, keepdim=True))  # Q7
    threshold = THRESHOLD - window_bias
    shares = ave / ave.sum(-1, keepdim=True)
    sorted_shares, order = torch.sort(shares, dim=-1, descending=True, stable=True)
    cum = torch.cumsum(sorted_shares, dim=-1)
    counts = torch.argmax((cum >= threshold).to(torch.int32), dim=-1)  # Q3
    cap = stage1_cap(L, w, cr)
    forced = torch.zeros((n_kv, n), dtype=torch.bool)
    n_forced = []
    margin = math.inf
    for g in range(n_kv):
        k = min(int(counts[g]), cap)
        idx = order[g, :k]  # Q4: a negative k drops the last |k| instead
        forced[g, idx] = True
        nf = int(forced[g].sum())
        n_forced.append(nf)
        sh = sorted_shares[g].tolist()
        if 0 < nf < n:  # the share order at the forced set's edge
            margin = min(margin, (sh[nf - 1] - sh[nf]) / sh[nf - 1])
        c = int(counts[g])
        if k == c:  # the threshold decided: the running shares around it
            cs = cum[g].tolist()
            margin = min(margin, abs(cs[c] - threshold) / abs(threshold))
            if c > 0:
                margin = min(margin, abs(cs[c - 1] - threshold) / abs(threshold))
    M = float(S.max())
    body = torch.where(forced, torch.tensor(M, dtype=dtype), S)
    scores = F.pad(body, (0, w), value=float(body.max()))
    return DefensiveScores(scores, body, S, forced, M, window_bias, threshold, [int(c) for c in counts], cap,
                           n_forced, margin)


def n_kept_total(L: int, cr: float, n_kv: int) -> int:
    """Q6: int(q_len * (1 - cr) * Hkv), evaluated left to right in double."""
    return int(L * (1 - cr) * n_kv)


@dataclass
class GlobalSelection:
    kept: list[list[int]]  # per KV head, ascending
    budgets: list[int]
    k: int
    boundary_gap: float  # score gap at the cut (inf: the cut lies between protected/forced groups)
    boundary_rel_gap: float
    structural_tie: bool  # the cut falls inside the protected window or the forced group (ties by design)


def select_global(ds: DefensiveScores, L: int, w: int, k: int, ties: str = "low") -> GlobalSelection:
    """ckv's selection of the official scores: the window is protected (ranks above everything,
    max + 1), then one ranking of all Hkv * L entries by score; equal scores by flat index
    head * L + position ascending ("low", ckv's rule) or descending ("high": only to detect
    selections that depend on tie order)."""
    n_kv = ds.body.shape[0]
    vals = torch.cat([ds.body.to(torch.float64), torch.full((n_kv, w), ds.M + 1.0, dtype=torch.float64)], 1)
    flat = vals.reshape(-1).tolist()
    sign = 1 if ties == "low" else -1
    order = sorted(range(n_kv * L), key=lambda i: (-flat[i], sign * i))
    top = order[:k]
    kept = [[] for _ in range(n_kv)]
    for i in top:
        kept[i // L].append(i % L)
    gap, rel, structural = math.inf, math.inf, False
    if 0 < k < n_kv * L:
        a, b = flat[order[k - 1]], flat[order[k]]
        gap = a - b
        rel = gap / max(abs(a), abs(b)) if max(abs(a), abs(b)) > 0 else 0.0
        structural = gap == 0.0 and a >= ds.M  # inside the forced group (== M) or the window (M + 1)
    return GlobalSelection([sorted(x) for x in kept], [len(x) for x in kept], k, gap, rel, structural)


# ----------------------------------------------------------------------------------------------
# the layer variant (press "efficient_layer_defensivekv" = EfficientLayerDefensiveKVPress)
#
# Official semantics, read from EfficientLayerDefensiveKVPress (the same score() as defensivekv, the
# head-length assertion commented out) and its base EfficientAdaGlobalScorerPress:
#   L1 every layer is scored as above and its flattened scores [Hkv * L] (window = the layer's max M_l,
#      the F.pad value scores.max()) are appended to a list; nothing is compressed before the last layer
#      (every layer is prefilled with its full cache);
#   L2 at the last layer: ONE torch.topk over the stacked [n_layers * Hkv * L] scores with
#      k = int(L * (1 - cr) * Hkv * n_layers) (left to right in double, one truncation), and the number
#      of winners falling in each layer becomes that layer's budget;
#   L3 each layer then runs its own top-k of that budget over its [Hkv * L] scores (the same entries as
#      the global top-k's, up to ties), per-head kept counts following;
#   L4 the window is NOT protected across layers: it competes at M_l, so a layer whose M_l is low can
#      lose window tokens (or everything) to other layers; inside its layer it ties with the forced
#      tokens at M_l.
# ckv's rule (select_model): the window holds nextafter(M_l, +inf) (one ulp above its layer's forced
# tokens, so never cut before them; across layers it competes at M_l as officially), then one ranking
# of every (layer, head, token) entry by score, equal scores by flat index (layer * Hkv + head) * L +
# position ascending.


def n_kept_model(L: int, cr: float, n_kv: int, n_layers: int) -> int:
    """L2: int(q_len * (1 - cr) * Hkv * n_layers), evaluated left to right in double."""
    return int(L * (1 - cr) * n_kv * n_layers)


def window_value(M: float, dtype=torch.float32) -> float:
    """ckv's window score: the next representable value above M in the scores' dtype."""
    m = torch.tensor(M, dtype=dtype)
    return float(torch.nextafter(m, torch.tensor(math.inf, dtype=dtype)))


@dataclass
class ModelSelection:
    kept: list[list[list[int]]]  # [layer][KV head] kept positions, ascending
    budgets: list[list[int]]  # [layer][KV head]
    layer_budgets: list[int]  # L2's per-layer counts
    k: int
    boundary_gap: float
    boundary_rel_gap: float
    structural_tie: bool  # the cut falls inside one layer's group of its window / forced tokens
    windows_cut: list[int]  # per layer: window entries (over all heads) left out


def select_model(layers: list[DefensiveScores], L: int, w: int, k: int, ties: str = "low",
                 dtype=torch.float32) -> ModelSelection:
    """ckv's selection of the official per-layer scores over all layers (see above); ties "high"
    reverses the order among equal scores, only to detect selections that depend on it."""
    n_layers, n_kv = len(layers), layers[0].body.shape[0]
    flat: list[float] = []
    for ds in layers:
        win = window_value(ds.M, dtype)
        vals = torch.cat([ds.body.to(torch.float64), torch.full((n_kv, w), win, dtype=torch.float64)], 1)
        flat += vals.reshape(-1).tolist()
    per_layer = n_kv * L
    sign = 1 if ties == "low" else -1
    order = sorted(range(len(flat)), key=lambda i: (-flat[i], sign * i))
    top = order[:k]
    kept = [[[] for _ in range(n_kv)] for _ in range(n_layers)]
    for i in top:
        layer, r = divmod(i, per_layer)
        kept[layer][r // L].append(r % L)
    gap, rel, structural = math.inf, math.inf, False
    if 0 < k < len(flat):
        a, b = flat[order[k - 1]], flat[order[k]]
        gap = a - b
        rel = gap / max(abs(a), abs(b)) if max(abs(a), abs(b)) > 0 else 0.0
        if gap == 0.0:  # a tie at the cut: structural when it is one layer's window or forced value
            la, lb = order[k - 1] // per_layer, order[k] // per_layer
            structural = la == lb and a >= layers[la].M
    kept = [[sorted(h) for h in layer] for layer in kept]
    budgets = [[len(h) for h in layer] for layer in kept]
    cut = [sum(w - sum(1 for t in h if t >= L - w) for h in layer) for layer in kept]
    return ModelSelection(kept, budgets, [sum(b) for b in budgets], k, gap, rel, structural, cut)
