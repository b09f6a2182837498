"""Disagreement scores as reported in EMNLP 2018 Tables 4–5, on the paper's scale (docs/methods.md#disagreement-scores).

Li, Tu, Yang, Lyu, Zhang. *Multi-Head Attention with Disagreement Regularization*. EMNLP 2018, §5.5 lists
``exp(D)`` ("larger value denotes more disagreement (at most 1.0)") of the measures of §3.2, Eqs. 1–3, as the
mean over **all H² head pairs, self-pairs included**: the similarities that training minimises, from the same
per-token sums (:mod:`diverse_fairseq.methods.disagreement.similarity`), here in fp64, over the same tokens
(:func:`diverse_fairseq.methods.sites.token_side`):

* sub (Eq. 1, V) / out (Eq. 3, O): per token ``exp(−(1/H²) Σ_i Σ_j cos(x_i, x_j))``, the exponent averaged over
  the non-padding tokens (keys for sub, queries for out); a zero vector has cosine 0 with every head, itself too;
* pos (Eq. 2, A): per sentence ``exp(−(1/H²) Σ_i Σ_j Σ_{t,s} A_i[t,s] A_j[t,s])`` summed over its non-padding
  queries t, then the mean over sentences.

``offdiag_cos``, the mean cosine over distinct head pairs, is a second, separately labelled figure. Per attention
type the layers are combined as training combines them, ``exp(−mean_l sim_l)``: the geometric mean of the layer
scores, which turns the paper's Table 5 into its Table 4.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import Tensor

from diverse_fairseq.methods.disagreement.similarity import NORM_EPS, token_cosine_sums, token_overlap_sums
from diverse_fairseq.methods.sites import ATTENTION_TYPES, token_side

SCORE_NAMES = ("sub", "pos", "out")
COSINE_NAMES = ("sub", "out")  # the terms that also get an off-diagonal mean cosine
#: how reports name the scale of the scores
SCALE = "exp(−mean over all H² head pairs, self-pairs included)"
#: the side ("source"/"target") whose non-padding tokens each term runs over, per attention type (as training)
TOKEN_SIDE = {t: {name: token_side(t, name) for name in SCORE_NAMES} for t in ATTENTION_TYPES}


class TooFewHeads(ValueError):
    """Disagreement between heads needs at least two of them."""


def check_heads(num_heads: int, name: str) -> None:
    """The analysis's check of the head count, made once per checkpoint before its forward passes
    (``analysis.pipeline``); the functions below only assert it."""
    if num_heads < 2:
        raise TooFewHeads(f"{name}: disagreement needs at least 2 heads, got H = {num_heads}")


def _check(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"{name}: expected a [B, H, N, ·] tensor, got {getattr(x, 'shape', type(x))}")
    assert x.size(1) >= 2, f"{name}: disagreement needs at least 2 heads, got H = {x.size(1)}"


def pair_cosines(x: Tensor, name: str = "pair_cosines", eps: float = NORM_EPS) -> Tuple[Tensor, Tensor]:
    """Per token of ``x`` [B, H, N, d] (V or O), both ``[B, N]`` fp64: the mean cosine over all H² head pairs,
    ``(1/H²) Σ_i Σ_j cos(x_i, x_j)`` in [0, 1] (1 identical heads, 1/H orthogonal, 0 cancelling), and over the
    H(H−1) distinct ones, ``mean_{i≠j} cos`` in [−1/(H−1), 1] (1 identical heads, 0 orthogonal). The diagonal
    ``Σ_i cos(x_i, x_i) = Σ_i ‖u_i‖²`` is H less one per zero vector."""
    _check(x, name)
    num_heads, xf = x.size(1), x.double()
    all_pairs = token_cosine_sums(xf, eps)  # [B, N] = ‖Σ_i u_i‖²
    norm = torch.linalg.vector_norm(xf, dim=-1)  # [B, H, N]
    diagonal = (norm / norm.clamp_min(eps)).pow(2).sum(dim=1)  # [B, N]
    return all_pairs / num_heads ** 2, (all_pairs - diagonal) / (num_heads * (num_heads - 1))


def sentence_position_overlap(a: Tensor, query_pad_mask: Optional[Tensor] = None) -> Tensor:
    """``(1/H²) Σ_i Σ_j Σ_{t,s} A_i[b,t,s] A_j[b,t,s]`` per sentence of a ``[B, H, T, S]`` over its non-padding
    queries t (``query_pad_mask`` [B, T], True at padding): ``[B]`` fp64, the position score being exp(−value)."""
    _check(a, "sentence_position_overlap")
    per_query = token_overlap_sums(a, torch.float64) / a.size(1) ** 2  # [B, T]
    if query_pad_mask is not None:
        per_query = per_query.masked_fill(query_pad_mask.to(torch.bool), 0.0)
    return per_query.sum(dim=-1)


def _keep(pad_mask: Optional[Tensor], x: Tensor) -> Tensor:
    """[B, N] bool, True on the tokens to average over."""
    if pad_mask is None:
        return torch.ones(x.size(0), x.size(2), dtype=torch.bool, device=x.device)
    if tuple(pad_mask.shape) != (x.size(0), x.size(2)):
        raise ValueError(f"pad mask of shape {tuple(pad_mask.shape)} does not match [B, N] = {(x.size(0), x.size(2))}")
    return ~pad_mask.to(torch.bool)


def subspace_score(v: Tensor, pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Sub." of V ``[B,H,S,d]`` (and "Out." of O ``[B,H,T,d]``): ``exp(−token mean of
    (1/H²) Σ_i Σ_j cos)`` over the tokens that ``pad_mask`` leaves."""
    return math.exp(-float(pair_cosines(v, "subspace_score")[0][_keep(pad_mask, v)].mean()))


output_score = subspace_score  # Eqs. 1 and 3 are the same measure, of V and of O


def position_score(a: Tensor, query_pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Pos.": mean over sentences of ``exp(−overlap)``; a ``[B,H,T,S]``."""
    return float(torch.exp(-sentence_position_overlap(a, query_pad_mask)).mean())


@dataclass
class ScoreAccumulator:
    """Running fp64 sums of one attention module's scores over batches: ``update`` takes its tapped tensors
    ``{"v": [B,H,S,d], "a": [B,H,T,S], "o": [B,H,T,d]}`` and the padding masks of its keys and queries."""

    sums: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(SCORE_NAMES, 0.0))  # Σ of the similarity
    offdiag_sums: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(COSINE_NAMES, 0.0))
    counts: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(SCORE_NAMES, 0))  # tokens (pos: sentences)
    pos_score_sum: float = 0.0  # Σ over sentences of exp(−overlap)

    def _add_cosines(self, name: str, x: Tensor, pad: Tensor) -> None:
        keep = _keep(pad, x)
        all_pairs, offdiag = pair_cosines(x, name)
        self.sums[name] += float(all_pairs[keep].sum())
        self.offdiag_sums[name] += float(offdiag[keep].sum())
        self.counts[name] += int(keep.sum())

    def update(self, tapped: Dict[str, Tensor], key_pad: Tensor, query_pad: Tensor) -> None:
        if "v" in tapped:
            self._add_cosines("sub", tapped["v"], key_pad)
        if "o" in tapped:
            self._add_cosines("out", tapped["o"], query_pad)
        if "a" in tapped:
            overlap = sentence_position_overlap(tapped["a"], query_pad)  # [B]
            self.sums["pos"] += float(overlap.sum())
            self.pos_score_sum += float(torch.exp(-overlap).sum())
            self.counts["pos"] += overlap.numel()

    def _means(self, sums: Dict[str, float], names: Iterable[str]) -> Dict[str, Optional[float]]:
        return {k: sums[k] / self.counts[k] if self.counts[k] else None for k in names}

    def similarities(self) -> Dict[str, Optional[float]]:
        """Mean all-pairs cosine (sub, out) and mean per-sentence overlap (pos)."""
        return self._means(self.sums, SCORE_NAMES)

    def offdiag(self) -> Dict[str, Optional[float]]:
        """The second figure: the token mean of ``mean_{i≠j} cos`` (sub, out)."""
        return self._means(self.offdiag_sums, COSINE_NAMES)

    def scores(self) -> Dict[str, Optional[float]]:
        """The reported exp(−·) scores: sub/out of the token mean, pos as the mean of per-sentence scores."""
        scores = {k: None if s is None else math.exp(-s) for k, s in self.similarities().items()}
        scores["pos"] = self.pos_score_sum / self.counts["pos"] if self.counts["pos"] else None
        return scores


def combine_layers(layer_scores: Iterable[Dict]) -> Dict:
    """Per attention type: the geometric mean of the per-layer scores, ``exp(mean_l log score_l)`` (for sub/out
    exactly ``exp(−mean over layers of the similarity)``), and the layer mean of ``offdiag_cos`` where every
    layer carries it."""
    layer_scores = list(layer_scores)
    combined: Dict = {}
    for name in SCORE_NAMES:
        values = [s[name] for s in layer_scores if s.get(name) is not None]
        combined[name] = None if not values else 0.0 if min(values) <= 0.0 else statistics.geometric_mean(values)
    if layer_scores and all("offdiag_cos" in s for s in layer_scores):
        combined["offdiag_cos"] = {}
        for name in COSINE_NAMES:
            values = [s["offdiag_cos"][name] for s in layer_scores if s["offdiag_cos"].get(name) is not None]
            combined["offdiag_cos"][name] = statistics.fmean(values) if values else None
    return combined
