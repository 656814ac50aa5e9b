"""An independent float64 reference of ckv's eviction scorers and selections.

Written from docs/spec-eviction.md (the contract ckv implements), not from kvpress: press_fixtures.py
feeds it the same per-layer inputs kvpress sees (attention input, post-RoPE keys, values, weights,
RoPE tables) and checks that it keeps the same tokens as kvpress did. Its selection functions also
run on kvpress's own recorded scores, to measure how close each selection is to a tie and whether
the result depends on how ties are broken.

Conventions: one layer at a time, batch 1. Scores are [Hkv, L] float64, higher = more important.
Tie rule "low" (SPEC, and ckv): equal scores rank by lower flat index head * L + position first;
"high" reverses that, and serves only to detect selections that depend on tie breaking.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# inputs


@dataclass
class LayerInputs:
    layer: int
    n_layers: int
    n_heads: int  # query heads H
    hidden: torch.Tensor  # [L, D] attention input (post input-RMSNorm) of the context tokens
    keys: torch.Tensor  # [Hkv, L, d] post-RoPE keys, as cached
    values: torch.Tensor  # [Hkv, L, d]
    cos: torch.Tensor  # [L, d] RoPE table of positions 0..L-1 (any attention scaling included)
    sin: torch.Tensor  # [L, d]
    wq: torch.Tensor  # [H*d, D] q_proj weight
    bq: torch.Tensor | None  # [H*d] q_proj bias
    wo: torch.Tensor  # [D, H*d] o_proj weight
    rope_table: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # positions -> cos, sin [n, d]
    wk: torch.Tensor | None = None  # [Hkv*d, D] k_proj weight (leverage's pre-RoPE keys)
    bk: torch.Tensor | None = None  # [Hkv*d] k_proj bias

    @property
    def L(self) -> int:
        return self.keys.shape[1]

    @property
    def n_kv(self) -> int:
        return self.keys.shape[0]

    @property
    def d(self) -> int:
        return self.keys.shape[2]

    @property
    def G(self) -> int:
        return self.n_heads // self.n_kv


@dataclass
class Scored:
    scores: torch.Tensor  # [Hkv, L] float64, protected tokens included
    protected: torch.Tensor  # [Hkv, L] bool: tokens given the protected score


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: the pairs are (i, i + d/2). x [..., T, d], cos/sin [T, d]."""
    half = x.shape[-1] // 2
    swapped = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + swapped * sin


def _queries(inp: LayerInputs, rows: slice, rope: bool = True) -> torch.Tensor:
    """Queries [H, T, d] of context rows, recomputed from the attention input."""
    h = inp.hidden[rows].to(F64)
    q = h @ inp.wq.to(F64).T
    if inp.bq is not None:
        q = q + inp.bq.to(F64)
    q = q.view(h.shape[0], inp.n_heads, inp.d).transpose(0, 1)
    if rope:
        q = _rope(q, inp.cos[rows].to(F64), inp.sin[rows].to(F64))
    return q


def _keys_per_query_head(inp: LayerInputs) -> torch.Tensor:
    """[H, L, d]: query head h reads KV head h // G."""
    return inp.keys.to(F64).repeat_interleave(inp.G, dim=0)


def _with_protected(body: torch.Tensor, L: int, head: int, tail: int) -> Scored:
    """body [Hkv, L - head - tail] -> [Hkv, L] with the first `head` and last `tail` tokens protected:
    their score is the maximum of the layer's whole unprotected score tensor plus one."""
    n_kv = body.shape[0]
    value = float(body.max()) + 1.0
    scores = torch.full((n_kv, L), value, dtype=F64)
    scores[:, head : L - tail] = body
    protected = torch.ones((n_kv, L), dtype=torch.bool)
    protected[:, head : L - tail] = False
    return Scored(scores, protected)


# ----------------------------------------------------------------------------------------------
# scorers


def window_attention(inp: LayerInputs, w: int) -> torch.Tensor:
    """Softmax attention [H, w, L] of the last w context tokens over all L keys (causal inside the
    window), logits scaled by 1/sqrt(head_dim)."""
    L = inp.L
    q = _queries(inp, slice(L - w, L))
    logits = q @ _keys_per_query_head(inp).transpose(1, 2) / math.sqrt(inp.d)
    qpos = torch.arange(L - w, L)[:, None]
    kpos = torch.arange(L)[None, :]
    logits = logits.masked_fill(kpos > qpos, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _pool(x: torch.Tensor, kernel: int, kind: str) -> torch.Tensor:
    """1-D pooling along the last axis, stride 1, padding kernel // 2 on both sides (odd kernels):
    avg counts the zero padding in the divisor, max pads with -inf."""
    if kernel <= 1:
        return x
    if kernel % 2 == 0:
        raise ValueError("pooling kernel must be odd")
    r = kernel // 2
    pad_value = 0.0 if kind == "avg" else float("-inf")
    padded = torch.nn.functional.pad(x, (r, r), value=pad_value)
    windows = padded.unfold(-1, kernel, 1)
    return windows.sum(-1) / kernel if kind == "avg" else windows.amax(-1)


def score_snapkv(inp: LayerInputs, window: int, kernel: int, pool: str = "avg") -> Scored:
    L, w = inp.L, window
    if L <= w:
        raise ValueError(f"snapkv needs more context tokens ({L}) than its window ({w})")
    attn = window_attention(inp, w)[:, :, : L - w]  # [H, w, L - w]
    per_head = _pool(attn.mean(1), kernel, pool)  # [H, L - w]
    body = per_head.view(inp.n_kv, inp.G, L - w).mean(1)
    return _with_protected(body, L, 0, w)


def score_tova(inp: LayerInputs) -> Scored:
    L = inp.L
    attn = window_attention(inp, 1)[:, 0, : L - 1]  # [H, L - 1]
    body = attn.mean(0, keepdim=True).expand(inp.n_kv, L - 1)  # one row shared by every KV head
    return _with_protected(body.clone(), L, 0, 1)


def score_knorm(inp: LayerInputs) -> Scored:
    s = -torch.linalg.vector_norm(inp.keys.to(F64), dim=-1)
    return Scored(s, torch.zeros_like(s, dtype=torch.bool))


def score_keydiff(inp: LayerInputs) -> Scored:
    """Minus the cosine of each key to the head's mean unit key (protects nothing)."""
    k = inp.keys.to(F64)  # [Hkv, L, d]
    unit = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(1e-12)
    anchor = unit.mean(dim=1, keepdim=True)  # [Hkv, 1, d]
    cos = (k * anchor).sum(-1) / (torch.linalg.vector_norm(k, dim=-1).clamp_min(1e-8) *
                                   torch.linalg.vector_norm(anchor, dim=-1).clamp_min(1e-8))
    s = -cos
    return Scored(s, torch.zeros_like(s, dtype=torch.bool))


def lagkv_tail(L: int, n_sink: int, lag: int) -> int:
    """Tokens after LagKV's last scored partition (0 when the context is too short to score)."""
    return 0 if L < n_sink + 2 * lag else lag + (L - n_sink) % lag


def score_lagkv(inp: LayerInputs, n_sink: int, lag: int, cross: bool) -> Scored:
    """Partitions of `lag` tokens after the sinks; each but the last is scored by the spread of its
    keys and values normalised by the next partition's per-channel range (unbiased std over the
    channels, softmax over the partition, keys and values averaged), ranked within the partition
    (rank / lag) unless `cross`. Sinks and the tail are protected; a context shorter than
    n_sink + 2 lag ranks the non-sink tokens by position."""
    L = inp.L
    if L < n_sink + 2 * lag:
        body = (torch.arange(L - n_sink, dtype=F64) / (L - n_sink))[None].repeat(inp.n_kv, 1)
        return _always_keep(_with_protected(body, L, n_sink, 0))
    tail = lagkv_tail(L, n_sink, lag)
    P = (L - n_sink) // lag

    def spread(x: torch.Tensor) -> torch.Tensor:  # x [Hkv, P, lag, d] -> [Hkv, P - 1, lag]
        ref_, v = x[:, 1:], x[:, :-1]
        lo = ref_.min(dim=2, keepdim=True).values
        hi = ref_.max(dim=2, keepdim=True).values
        return torch.softmax(((v - lo) / (hi - lo)).std(dim=-1), dim=-1)

    k = inp.keys.to(F64)[:, n_sink: n_sink + P * lag].reshape(inp.n_kv, P, lag, inp.d)
    v = inp.values.to(F64)[:, n_sink: n_sink + P * lag].reshape(inp.n_kv, P, lag, inp.d)
    r = (spread(k) + spread(v)) / 2
    if not cross:
        r = r.argsort(dim=-1, stable=True).argsort(dim=-1).to(F64) / lag
    return _always_keep(_with_protected(r.reshape(inp.n_kv, -1), L, n_sink, tail))


def score_cur(inp: LayerInputs, n_sink: int, kind: str, window: int) -> Scored:
    """Squared key and value norms, each divided by its sum over its window of `window` tokens from
    token 0 (0: no windows), combined as key, value, their mean or their product, divided by the sum
    over the context; the first n_sink tokens score 1 (above every other score) and are protected."""
    L = inp.L

    def lev(x: torch.Tensor) -> torch.Tensor:
        n = (x.to(F64) ** 2).sum(-1)  # [Hkv, L]
        if window:
            for t0 in range(0, L, window):
                n[:, t0:t0 + window] = n[:, t0:t0 + window] / n[:, t0:t0 + window].sum(-1, keepdim=True)
        return n

    k2, v2 = lev(inp.keys), lev(inp.values)
    s = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[kind]
    s = s / s.sum(-1, keepdim=True)
    protected = torch.zeros((inp.n_kv, L), dtype=torch.bool)
    protected[:, :n_sink] = True
    s[protected] = 1.0
    return Scored(s, protected)


_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def leverage_sketch(d: int, k: int, seed: int, layer: int, head: int) -> torch.Tensor:
    """The Gaussian sketch of (layer, KV head) as SPEC defines it: fp32 [d, k], N(0, 1) from
    splitmix64 counters and Box-Muller (before the 1 / sqrt(k) scale kvpress applies)."""
    kh = _mix64(_mix64(_mix64(seed) ^ layer) ^ (head << 32))
    z = []
    for e in range(d * k):
        a = _mix64((kh + 2 * e * 0xD1B54A32D192ED03) & _M64)
        b = _mix64((kh + (2 * e + 1) * 0xD1B54A32D192ED03) & _M64)
        u1 = ((a >> 11) + 1.0) * 2.0 ** -53
        u2 = (b >> 11) * 2.0 ** -53
        z.append(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))
    return torch.tensor(z, dtype=torch.float64).to(torch.float32).reshape(d, k)


def score_leverage(inp: LayerInputs, k: int, seed: int) -> Scored:
    """Leverage of the pre-RoPE keys (hidden @ wk^T + bk) centred over the context, sketched by
    the (layer, head) sketch / sqrt(k): x_t^T (X^T X + 1e-2 I)^-1 x_t, then z-scored over all heads
    (unbiased std, at least 1e-6). Protects nothing."""
    pre = inp.hidden.to(F64) @ inp.wk.to(F64).T
    if inp.bk is not None:
        pre = pre + inp.bk.to(F64)
    pre = pre.reshape(inp.L, inp.n_kv, inp.d).transpose(0, 1)  # [Hkv, L, d]
    out = []
    for h in range(inp.n_kv):
        phi = leverage_sketch(inp.d, k, seed, inp.layer, h).to(F64) * (1.0 / math.sqrt(k))
        X = (pre[h] - pre[h].mean(0, keepdim=True)) @ phi
        G = X.T @ X + 1e-2 * torch.eye(k, dtype=F64)
        out.append((X * torch.linalg.solve(G, X.T).T).sum(-1).clamp_min(0))
    s = torch.stack(out)
    s = (s - s.mean()) / s.std().clamp_min(1e-6)
    return Scored(s, torch.zeros_like(s, dtype=torch.bool))


def _always_keep(sc: Scored) -> Scored:
    """LagKV scores its sinks and tail 1 (above every other score) instead of the layer max + 1."""
    sc.scores[sc.protected] = 1.0
    return sc


def score_streaming(inp: LayerInputs, n_kept: int, n_sink: int) -> Scored:
    """1 for the n_sink first and the n_kept - n_sink last tokens, 0 elsewhere."""
    L = inp.L
    s = torch.zeros((inp.n_kv, L), dtype=F64)
    s[:, :n_sink] = 1.0
    s[:, L - max(n_kept - n_sink, 0) :] = 1.0
    return Scored(s, s > 0)


def score_observed(inp: LayerInputs, block: int = 64) -> Scored:
    """Column sums of the causal attention matrix, each divided by the number of queries that see
    the key (L - j), averaged over the G query heads of the group. Query blocks of `block` rows."""
    L = inp.L
    k = _keys_per_query_head(inp)
    col = torch.zeros((inp.n_heads, L), dtype=F64)
    for start in range(0, L, block):
        stop = min(L, start + block)
        q = _queries(inp, slice(start, stop))
        logits = q @ k.transpose(1, 2) / math.sqrt(inp.d)
        qpos = torch.arange(start, stop)[:, None]
        logits = logits.masked_fill(torch.arange(L)[None, :] > qpos, float("-inf"))
        col += torch.softmax(logits, dim=-1).sum(1)
    col = col / torch.arange(L, 0, -1, dtype=F64)
    s = col.view(inp.n_kv, inp.G, L).mean(1)
    return Scored(s, torch.zeros_like(s, dtype=torch.bool))


def score_expected(
    inp: LayerInputs,
    n_future: int = 512,
    n_sink: int = 4,
    use_covariance: bool = True,
    use_vnorm: bool = True,
    epsilon: float = 0.0,
) -> Scored:
    """Expected attention of future queries. The pre-RoPE queries of the non-sink context tokens give
    a mean mu and a (biased, / T) covariance S per query head; the RoPE rotation averaged over the
    positions L .. L + n_future - 1 is Rbar = diag(mean cos) + diag(mean sin) P (P x = rotate-half
    of x), so mu' = Rbar mu and S' = Rbar S Rbar^T. For non-sink key k_j (post-RoPE, as cached):
    z_j = mu'.k_j / sqrt(d) + k_j^T S' k_j / (2 d); softmax over the non-sink keys; mean over the
    group; times (s + epsilon) * ||v_j||_2; the sinks are protected."""
    L, d = inp.L, inp.d
    if L <= n_sink:
        raise ValueError(f"expected_attention needs more than n_sink={n_sink} tokens")
    q = _queries(inp, slice(n_sink, L), rope=False)  # [H, T, d]
    mu = q.mean(1)  # [H, d]
    centered = q - mu[:, None, :]
    cov = centered.transpose(1, 2) @ centered / q.shape[1]  # [H, d, d]
    cos, sin = inp.rope_table(torch.arange(L, L + n_future))
    mc, ms = cos.to(F64).mean(0), sin.to(F64).mean(0)  # [d]
    half = d // 2
    P = torch.zeros((d, d), dtype=F64)
    P[:half, half:] = -torch.eye(half, dtype=F64)
    P[half:, :half] = torch.eye(half, dtype=F64)
    Rbar = torch.diag(mc) + torch.diag(ms) @ P
    mu = mu @ Rbar.T
    k = _keys_per_query_head(inp)[:, n_sink:]  # [H, T, d]
    z = (k @ mu[:, :, None])[..., 0] / math.sqrt(d)
    if use_covariance:
        cov = Rbar @ cov @ Rbar.T
        z = z + torch.einsum("htd,hde,hte->ht", k, cov, k) / (2 * d)
    p = torch.softmax(z, dim=-1).view(inp.n_kv, inp.G, L - n_sink).mean(1)
    if use_vnorm:
        p = (p + epsilon) * torch.linalg.vector_norm(inp.values.to(F64)[:, n_sink:], dim=-1)
    return _with_protected(p, L, n_sink, 0)


def value_output_l1(inp: LayerInputs, block: int = 128) -> torch.Tensor:
    """CriticalKV's N [Hkv, L]: mean over the query heads h of the group of ||V[t] W_O^h||_1, with
    W_O^h = o_proj.weight[:, h*d:(h+1)*d]^T (d x D). Token blocks of `block` rows."""
    d, L = inp.d, inp.L
    wo = inp.wo.to(F64)
    v = inp.values.to(F64)
    out = torch.zeros((inp.n_heads, L), dtype=F64)
    for h in range(inp.n_heads):
        w_h = wo[:, h * d : (h + 1) * d].T  # [d, D]
        for start in range(0, L, block):
            stop = min(L, start + block)
            out[h, start:stop] = (v[h // inp.G, start:stop] @ w_h).abs().sum(-1)
    return out.view(inp.n_kv, inp.G, L).mean(1)


# ----------------------------------------------------------------------------------------------
# kept counts


def n_kept_uniform(L: int, cr: float) -> int:
    """kvpress: max(1, floor(L * (1 - cr))), (1 - cr) evaluated first, in double; 0 when cr >= 1."""
    if cr >= 1.0:
        return 0
    return max(1, int(L * (1.0 - cr)))


def critical_first_stage(L: int, cr: float, alpha: float) -> int:
    """b1 = floor(((1 - cr) * L) * alpha), at least 1 (when alpha > 0 and cr < 1)."""
    b1 = int((1.0 - cr) * L * alpha)
    if alpha > 0:
        b1 = max(1, b1) if cr < 1.0 else 0
    return b1


def adakv_n_safe(n_kept: int, safeguard: float) -> int:
    n = int(n_kept * safeguard)
    if safeguard > 0:
        n = max(1, n) if n_kept > 0 else 0
    return n


def pyramid_n_kept(L: int, cr: float, window: int, beta: float, layer: int, n_layers: int) -> int:
    """PyramidKV's per-layer count (kvpress's schedule): the layer budgets decrease linearly from
    top to bottom while their mean stays L * (1 - cr); an infeasible schedule falls back to a uniform
    count. round() is Python's (half to even). The intermediate capacity is formed as kvpress does
    (window + L*(1-cr), then minus window), which can differ from L*(1-cr) in the last bit."""
    if beta < 1:
        raise ValueError("beta must be >= 1")
    capacity = window + L * (1.0 - cr)
    spread = capacity - window
    lo = spread / beta
    hi = spread * 2 - lo
    if hi >= L - window:
        hi = L - window
        lo = spread * 2 - hi
    if not (L >= hi >= lo >= window):
        return max(1, round(L * (1.0 - cr)))
    step = (hi - lo) / (n_layers - 1) if n_layers > 1 else 0.0
    return round(hi - layer * step)


# ----------------------------------------------------------------------------------------------
# selection


@dataclass
class Boundary:
    """The cut of one top-k: the last kept and the first dropped entry of a ranking."""

    stage: str
    head: int  # -1: a ranking across all heads of the layer
    k: int
    above: float  # score of the last kept entry (inf: a forced entry)
    below: float  # score of the first dropped entry
    structural: bool  # both entries are protected tokens (a tie by construction)

    @property
    def gap(self) -> float:
        if math.isinf(self.above) and not math.isinf(self.below):
            return math.inf
        return self.above - self.below

    @property
    def rel_gap(self) -> float:
        g = self.gap
        if math.isinf(g):
            return math.inf
        scale = max(abs(self.above), abs(self.below))
        return g / scale if scale > 0 else 0.0


@dataclass
class Selection:
    kept: list[list[int]]  # per KV head, ascending positions
    boundaries: list[Boundary] = field(default_factory=list)
    budgets: list[int] | None = None  # per-head kept counts (cross-head allocations)


def _ranking(keys: list[tuple[int, float, bool]], ties: str) -> list[int]:
    """Indices of `keys` = (flat index, score, forced) best first: forced entries, then by score;
    equal entries by flat index ascending (ties "low") or descending ("high")."""
    sign = 1 if ties == "low" else -1
    order = sorted(range(len(keys)), key=lambda i: (not keys[i][2], -keys[i][1], sign * keys[i][0]))
    return order


def _top(
    scores: list[float],
    flat: list[int],
    k: int,
    ties: str,
    stage: str,
    head: int,
    forced: list[bool] | None = None,
    protected: list[bool] | None = None,
    out: list[Boundary] | None = None,
) -> list[int]:
    """The k best entries (indices into `scores`), recording the boundary."""
    n = len(scores)
    forced = forced or [False] * n
    order = _ranking([(flat[i], scores[i], forced[i]) for i in range(n)], ties)
    if out is not None and 0 < k < n and not (forced[order[k - 1]] and forced[order[k]]):
        a, b = order[k - 1], order[k]
        above = math.inf if forced[a] else scores[a]
        below = math.inf if forced[b] else scores[b]
        structural = bool(protected and protected[a] and protected[b])
        out.append(Boundary(stage, head, k, above, below, structural))
    return order[:k]


def select_uniform(sc: Scored, n_kept: int, ties: str = "low", stage: str = "topk") -> Selection:
    n_kv, L = sc.scores.shape
    sel = Selection([])
    for h in range(n_kv):
        s = sc.scores[h].tolist()
        idx = _top(s, [h * L + t for t in range(L)], n_kept, ties, stage, h, None, sc.protected[h].tolist(),
                   sel.boundaries)
        sel.kept.append(sorted(idx))
    return sel


def select_critical(sc: Scored, N: torch.Tensor, n_kept: int, b1: int, eps: float, ties: str = "low") -> Selection:
    """Stage 1 forces each head's top-b1 of s; stage 2 fills the head up to n_kept with the best of
    the rest ranked by (s + eps) * N."""
    n_kv, L = sc.scores.shape
    sel = Selection([])
    for h in range(n_kv):
        s = sc.scores[h].tolist()
        flat = [h * L + t for t in range(L)]
        prot = sc.protected[h].tolist()
        first = _top(s, flat, b1, ties, "stage1", h, None, prot, sel.boundaries)
        chosen = set(first)
        rest = [t for t in range(L) if t not in chosen]
        s2 = ((sc.scores[h] + eps) * N[h].to(F64)).tolist()
        second = _top([s2[t] for t in rest], [flat[t] for t in rest], n_kept - len(first), ties, "stage2", h,
                      None, None, sel.boundaries)
        sel.kept.append(sorted(first + [rest[i] for i in second]))
    return sel


def _safeguard(sc: Scored, n_safe: int, ties: str, boundaries: list[Boundary]) -> list[list[bool]]:
    n_kv, L = sc.scores.shape
    forced = []
    for h in range(n_kv):
        top = _top(sc.scores[h].tolist(), [h * L + t for t in range(L)], n_safe, ties, "safeguard", h, None,
                   sc.protected[h].tolist(), boundaries)
        f = [False] * L
        for t in top:
            f[t] = True
        forced.append(f)
    return forced


def _global_budgets(sc: Scored, forced: list[list[bool]], n_kept: int, ties: str, stage: str,
                    boundaries: list[Boundary]) -> tuple[list[int], list[list[int]]]:
    """One ranking over all (head, token) entries of the layer (forced first): the best
    n_kv * n_kept entries. Returns per-head counts and per-head chosen positions."""
    n_kv, L = sc.scores.shape
    flat_s = sc.scores.reshape(-1).tolist()
    flat_f = [f for row in forced for f in row]
    flat_p = sc.protected.reshape(-1).tolist()
    top = _top(flat_s, list(range(n_kv * L)), n_kv * n_kept, ties, stage, -1, flat_f, flat_p, boundaries)
    chosen: list[list[int]] = [[] for _ in range(n_kv)]
    for i in top:
        chosen[i // L].append(i % L)
    return [len(c) for c in chosen], chosen


def select_adakv(sc: Scored, n_kept: int, n_safe: int, ties: str = "low") -> Selection:
    """Each head's top-n_safe are forced; then the best n_kv * n_kept entries of the whole layer."""
    sel = Selection([])
    forced = _safeguard(sc, n_safe, ties, sel.boundaries)
    budgets, chosen = _global_budgets(sc, forced, n_kept, ties, "global", sel.boundaries)
    sel.kept = [sorted(c) for c in chosen]
    sel.budgets = budgets
    return sel


def select_critical_adakv(sc: Scored, N: torch.Tensor, n_kept: int, n_safe: int, alpha: float, eps: float,
                          ties: str = "low") -> Selection:
    """Safeguard as adakv; budget[h] = head h's share of the layer's best n_kv * n_kept entries;
    stage 1 forces head h's top floor(budget[h] * alpha) (safeguarded entries rank first); stage 2
    fills head h up to budget[h] with the rest ranked by (s + eps) * N."""
    n_kv, L = sc.scores.shape
    sel = Selection([])
    forced = _safeguard(sc, n_safe, ties, sel.boundaries)
    budgets, _ = _global_budgets(sc, forced, n_kept, ties, "budget", sel.boundaries)
    for h in range(n_kv):
        s = sc.scores[h].tolist()
        flat = [h * L + t for t in range(L)]
        prot = sc.protected[h].tolist()
        b1 = int(budgets[h] * alpha)
        first = set(_top(s, flat, b1, ties, "stage1", h, forced[h], prot, sel.boundaries))
        first |= {t for t in range(L) if forced[h][t]}
        rest = [t for t in range(L) if t not in first]
        s2 = ((sc.scores[h] + eps) * N[h].to(F64)).tolist()
        second = _top([s2[t] for t in rest], [flat[t] for t in rest], budgets[h] - len(first), ties, "stage2", h,
                      None, None, sel.boundaries)
        sel.kept.append(sorted(list(first) + [rest[i] for i in second]))
    sel.budgets = budgets
    return sel


def chunk_spans(L: int, chunk: int) -> list[tuple[int, int]]:
    """ChunkKV's chunks: [c * chunk, (c + 1) * chunk) from token 0, the last one shorter when L is not
    a multiple of chunk."""
    return [(t0, min(L, t0 + chunk)) for t0 in range(0, L, chunk)]


def chunk_means(scores: torch.Tensor, L: int, chunk: int) -> list[float]:
    """The mean over each chunk's tokens of the scores summed over the layer's KV heads."""
    over_heads = scores.to(F64).sum(0)
    return [float(over_heads[a:b].mean()) for a, b in chunk_spans(L, chunk)]


def select_chunkkv(sc: Scored, cr: float, chunk: int, ties: str = "low") -> Selection:
    """ChunkKV (kvpress ChunkKVPress): the best max(1, int(n_chunks * (1 - cr))) chunks by chunk_means,
    ties to the lower chunk ("low") or the higher ("high"), kept whole by every head; a context shorter
    than one chunk is the per-head top-k of the scorer."""
    n_kv, L = sc.scores.shape
    if L < chunk:
        return select_uniform(sc, n_kept_uniform(L, cr), ties)
    spans = chunk_spans(L, chunk)
    means = chunk_means(sc.scores, L, chunk)
    keep = max(1, int(len(spans) * (1.0 - cr)))
    whole = [bool(sc.protected[:, a:b].all()) for a, b in spans]  # chunks of protected tokens only
    sel = Selection([])
    top = _top(means, list(range(len(spans))), keep, ties, "chunks", -1, None, whole, sel.boundaries)
    rows = sorted(t for c in top for t in range(*spans[c]))
    sel.kept = [list(rows) for _ in range(n_kv)]
    return sel


def rerotate(keys: torch.Tensor, kept: list[list[int]], inv_freq: torch.Tensor) -> torch.Tensor:
    """Key re-rotation (kvpress KeyRerotationPress): the kept post-RoPE keys of each head, kept[h]
    ascending, rotated by the angles (i - kept[h][i]) * inv_freq so that they read as positions
    0 .. n - 1; float64. keys [Hkv, L, d] -> [Hkv, n, d]."""
    out = []
    inv = inv_freq.to(F64)
    for h, pos in enumerate(kept):
        p = torch.tensor(pos, dtype=F64)
        a = (torch.arange(len(pos), dtype=F64) - p)[:, None] * inv[None, :]  # [n, d / 2]
        cos, sin = torch.cat([a.cos(), a.cos()], -1), torch.cat([a.sin(), a.sin()], -1)
        out.append(_rope(keys[h, pos].to(F64), cos, sin))
    return torch.stack(out)


def _sliced(inp: LayerInputs, a: int, b: int) -> LayerInputs:
    """The layer inputs of context rows a .. b - 1 only (what CompactorPress hands its inner presses)."""
    return dataclasses.replace(inp, hidden=inp.hidden[a:b], keys=inp.keys[:, a:b], values=inp.values[:, a:b],
                               cos=inp.cos[a:b], sin=inp.sin[a:b])


def score_compactor(inp: LayerInputs, cr: float, sink_start: int, sink_end: int, chunk: int, k: int, seed: int,
                    blending: float) -> Scored:
    """CompactorPress: rows a = min(sink_start, L) .. b = L - min(sink_end, L - a) score
    blending * (the leverage of those rows, score_leverage) + NonCausalAttnPress's score; the sinks
    score the maximum of those scores (not + 1) and are protected. NonCausalAttnPress: the rows cut
    into chunks of `chunk` (the last one padded with zero rows to `chunk`); in a chunk every query
    (RoPE'd, no 1/sqrt(d) scale) attends to every key of the chunk; padding keys get logit -1e-9,
    padding queries logit 0 on real keys; softmax; summed over all the chunk's queries (padding
    ones too); mean over the group; times ||v||_2; avg-pooled over 3 (zero padding counted);
    z-scored over every head (unbiased std, at least 1e-6). blending < 0: cr."""
    L = inp.L
    a = min(sink_start, L)
    tail = min(sink_end, max(0, L - a))
    b = L - tail
    sl = _sliced(inp, a, b)
    S = b - a
    q = _queries(sl, slice(0, S))  # [H, S, d]
    kk = _keys_per_query_head(sl)  # [H, S, d]
    A = torch.zeros((inp.n_heads, S), dtype=F64)
    for c0 in range(0, S, chunk):
        c1 = min(S, c0 + chunk)
        n, pad = c1 - c0, chunk - (c1 - c0)
        dots = q[:, c0:c1] @ kk[:, c0:c1].transpose(1, 2)  # [H, n, n]
        logits = torch.cat([dots, torch.full((inp.n_heads, n, pad), -1e-9, dtype=F64)], -1)
        A[:, c0:c1] += torch.softmax(logits, -1)[..., :n].sum(1)
        if pad:
            padq = torch.cat([torch.zeros(n, dtype=F64), torch.full((pad,), -1e-9, dtype=F64)])
            A[:, c0:c1] += pad * torch.softmax(padq, -1)[:n]
    A = A.view(inp.n_kv, inp.G, S).mean(1) * torch.linalg.vector_norm(sl.values.to(F64), dim=-1)
    A = _pool(A, 3, "avg")
    A = (A - A.mean()) / A.std().clamp_min(1e-6)
    lev = score_leverage(sl, k, seed).scores
    w = cr if blending < 0 else blending
    body = w * lev + A
    s = torch.full((inp.n_kv, L), float(body.max()), dtype=F64)
    s[:, a:b] = body
    protected = torch.ones((inp.n_kv, L), dtype=torch.bool)
    protected[:, a:b] = False
    return Scored(s, protected)
