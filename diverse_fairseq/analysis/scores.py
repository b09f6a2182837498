"""Disagreement scores as reported in EMNLP 2018 Tables 4–5 (SPEC §1, "Reported disagreement scores").

Li, Tu, Yang, Lyu, Zhang. *Multi-Head Attention with Disagreement Regularization*. EMNLP 2018, §5.5: the
paper lists ``exp(D)`` (at most 1.0, larger = more disagreement) of the three disagreement measures. Unlike
the training-time similarities of :mod:`diverse_fairseq.disagreement` (which average over all H² head
pairs, diagonal included), the reported cosine scores use the **off-diagonal** pairs only, so that

* sub / out: ``exp(−mean over tokens of mean_{i≠j} cos(x_i, x_j))``: identical heads give e^−1 ≈ 0.368,
  mutually orthogonal heads give 1.0;
* pos: per sentence ``exp(−(1/H²) Σ_i Σ_j Σ_{t,s} A_i[t,s] A_j[t,s])`` (all H² pairs, summed over the
  sentence's query tokens t and key tokens s), then the mean over sentences. Because it sums over t it
  reaches the paper's 0.007 for a baseline whose heads attend alike.

Which tokens (SPEC §1): a cosine term averages over the tokens it is defined on, the non-padding keys for
``sub`` (V is [B,H,S,d]) and the non-padding queries for ``out`` (O is [B,H,T,d]); ``pos`` sums over the
non-padding queries (rows of A; padded keys carry zero probability). Hence **source tokens** for encoder
self-attention (all three terms) and for ``sub`` of encoder-decoder attention, **target tokens** for
decoder self-attention (all three) and for ``pos``/``out`` of encoder-decoder attention.

Per attention type (EMNLP 2018 Table 4 reports "encoder-side" scores) the layers are combined as SPEC §1
combines them for training, by the mean over layers of the similarity: ``exp(−mean_l sim_l)``, i.e. the
geometric mean of the per-layer scores. This reproduces the paper's Table 4 from its Table 5 (baseline
positions: geometric mean of 0.040 0.009 0.002 0.003 0.008 0.006 = 0.007, the Table 4 value; the
arithmetic mean would be 0.011).

Everything is vectorised over heads in O(H) with ``Σ_i Σ_j cos = ‖Σ_i u_i‖²`` (u_i unit vectors) and
``Σ_i Σ_j Σ_s A_i A_j = Σ_s (Σ_i A_i)²``, computed in fp64 (these are statistics, not training terms).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import torch
from torch import Tensor

from ..disagreement import NORM_EPS

SCORE_NAMES = ("sub", "pos", "out")
#: query/key side whose non-padding tokens each term runs over, per attention type (see module docstring)
TOKEN_SIDE = {
    "enc_self": {"sub": "source", "pos": "source", "out": "source"},
    "dec_self": {"sub": "target", "pos": "target", "out": "target"},
    "enc_dec": {"sub": "source", "pos": "target", "out": "target"},
}


def _check(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"{name}: expected a [B, H, N, ·] tensor, got {getattr(x, 'shape', type(x))}")
    if x.size(1) < 2:
        raise ValueError(f"{name}: disagreement needs at least 2 heads, got H = {x.size(1)}")


def offdiag_cosine(x: Tensor, eps: float = NORM_EPS) -> Tensor:
    """Per-token mean cosine over distinct head pairs: ``mean_{i≠j} cos(x_i[b,n], x_j[b,n])``.

    Args:
        x: ``[B, H, N, d]`` per-head vectors (projected values V or head outputs O).
        eps: floor on the norms; a zero vector has cosine 0 with every head (never NaN).
    Returns:
        ``[B, N]`` fp64.
    """
    _check(x, "offdiag_cosine")
    num_heads = x.size(1)
    xf = x.double()
    unit = xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(eps)  # [B, H, N, d]
    all_pairs = unit.sum(dim=1).pow(2).sum(dim=-1)  # [B, N] = Σ_i Σ_j cos
    diagonal = unit.pow(2).sum(dim=-1).sum(dim=1)  # [B, N] = Σ_i cos(x_i, x_i) (1, or 0 for a zero vector)
    return (all_pairs - diagonal) / (num_heads * (num_heads - 1))


def sentence_position_overlap(a: Tensor, query_pad_mask: Optional[Tensor] = None) -> Tensor:
    """Per-sentence ``(1/H²) Σ_i Σ_j Σ_{t,s} A_i[b,t,s] A_j[b,t,s]`` over the non-padding queries t.

    Args:
        a: attention probabilities ``[B, H, T, S]``.
        query_pad_mask: optional ``[B, T]``, True at padding queries (their rows are left out).
    Returns:
        ``[B]`` fp64; the sentence's position score is ``exp(−value)``.
    """
    _check(a, "sentence_position_overlap")
    num_heads = a.size(1)
    per_query = a.double().sum(dim=1).pow(2).sum(dim=-1) / (num_heads * num_heads)  # [B, T]
    if query_pad_mask is not None:
        per_query = per_query.masked_fill(query_pad_mask.to(torch.bool), 0.0)
    return per_query.sum(dim=-1)  # [B]


def _keep(pad_mask: Optional[Tensor], x: Tensor) -> Tensor:
    """[B, N] bool, True on the tokens to average over."""
    if pad_mask is None:
        return torch.ones(x.size(0), x.size(2), dtype=torch.bool, device=x.device)
    if tuple(pad_mask.shape) != (x.size(0), x.size(2)):
        raise ValueError(f"pad mask of shape {tuple(pad_mask.shape)} does not match [B, N] = {(x.size(0), x.size(2))}")
    return ~pad_mask.to(torch.bool)


def subspace_score(v: Tensor, pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Sub.": ``exp(−mean over tokens of mean_{i≠j} cos(V_i, V_j))``; v ``[B,H,S,d]``."""
    keep = _keep(pad_mask, v)
    return math.exp(-float(offdiag_cosine(v)[keep].mean()))


def output_score(o: Tensor, pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Out.": ``exp(−mean over tokens of mean_{i≠j} cos(O_i, O_j))``; o ``[B,H,T,d]``."""
    keep = _keep(pad_mask, o)
    return math.exp(-float(offdiag_cosine(o)[keep].mean()))


def position_score(a: Tensor, query_pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Pos.": mean over sentences of ``exp(−overlap)``; a ``[B,H,T,S]``."""
    return float(torch.exp(-sentence_position_overlap(a, query_pad_mask)).mean())


@dataclass
class ScoreAccumulator:
    """Running sums of one attention module's three scores over batches (fp64 scalars).

    ``update`` takes the module's tapped tensors ``{"v": [B,H,S,d], "a": [B,H,T,S], "o": [B,H,T,d]}`` and the
    padding masks of its keys and queries; ``similarities``/``scores`` give the per-layer values.
    """

    sums: Dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in SCORE_NAMES})
    counts: Dict[str, int] = field(default_factory=lambda: {k: 0 for k in SCORE_NAMES})
    pos_score_sum: float = 0.0  # Σ over sentences of exp(−overlap)

    def update(self, tapped: Dict[str, Tensor], key_pad: Tensor, query_pad: Tensor) -> None:
        if "v" in tapped:
            keep = _keep(key_pad, tapped["v"])
            self.sums["sub"] += float(offdiag_cosine(tapped["v"])[keep].sum())
            self.counts["sub"] += int(keep.sum())
        if "o" in tapped:
            keep = _keep(query_pad, tapped["o"])
            self.sums["out"] += float(offdiag_cosine(tapped["o"])[keep].sum())
            self.counts["out"] += int(keep.sum())
        if "a" in tapped:
            overlap = sentence_position_overlap(tapped["a"], query_pad)  # [B]
            self.sums["pos"] += float(overlap.sum())
            self.pos_score_sum += float(torch.exp(-overlap).sum())
            self.counts["pos"] += overlap.numel()

    def similarities(self) -> Dict[str, Optional[float]]:
        """Mean off-diagonal cosine (sub, out) and mean per-sentence overlap (pos)."""
        return {k: (self.sums[k] / self.counts[k] if self.counts[k] else None) for k in SCORE_NAMES}

    def scores(self) -> Dict[str, Optional[float]]:
        """The reported exp(−·) scores: sub/out of the token mean, pos as the mean of per-sentence scores."""
        sims = self.similarities()
        return {
            "sub": math.exp(-sims["sub"]) if sims["sub"] is not None else None,
            "pos": self.pos_score_sum / self.counts["pos"] if self.counts["pos"] else None,
            "out": math.exp(-sims["out"]) if sims["out"] is not None else None,
        }


def combine_layers(layer_scores: Iterable[Dict[str, Optional[float]]]) -> Dict[str, Optional[float]]:
    """Per attention type: the geometric mean of the per-layer scores, ``exp(mean_l log score_l)``.

    For sub/out this is exactly ``exp(−mean over layers of the similarity)`` (SPEC §1's layer mean).
    """
    layer_scores = list(layer_scores)
    combined: Dict[str, Optional[float]] = {}
    for name in SCORE_NAMES:
        values: List[float] = [s[name] for s in layer_scores if s.get(name) is not None]
        if not values:
            combined[name] = None
        elif any(v <= 0.0 for v in values):
            combined[name] = 0.0
        else:
            combined[name] = math.exp(sum(math.log(v) for v in values) / len(values))
    return combined
