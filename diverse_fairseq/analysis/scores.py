"""Disagreement scores as reported in EMNLP 2018 Tables 4–5, on the paper's scale.

Li, Tu, Yang, Lyu, Zhang. *Multi-Head Attention with Disagreement Regularization*. EMNLP 2018, §5.5: the
paper lists ``exp(D)`` ("larger value denotes more disagreement (at most 1.0)") of the three disagreement
measures of §3.2 (Eq. 1–3), on the paper's own scale: the mean over **all H² head pairs, each head with
itself included**, exactly the similarities that training minimises
(:mod:`diverse_fairseq.methods.disagreement.similarity`):

* sub / out: per token ``exp(−(1/H²) Σ_i Σ_j cos(x_i, x_j))``, the exponent averaged over tokens. Identical
  heads give e^−1 ≈ 0.368, mutually orthogonal heads exp(−1/H) (0.882 at H = 8, the paper's baseline, 0.779
  at H = 4), and 1.0, the maximum, only when the unit head vectors cancel (``Σ_i x_i/‖x_i‖ = 0``);
* pos: per sentence ``exp(−(1/H²) Σ_i Σ_j Σ_{t,s} A_i[t,s] A_j[t,s])`` (summed over the sentence's query
  tokens t and key tokens s), then the mean over sentences. Because it sums over t it reaches the paper's
  0.007 for a baseline whose heads attend alike.

For nonzero vectors the all-pairs mean is ``1/H + (H−1)/H · c`` with ``c = mean_{i≠j} cos`` the
**off-diagonal** mean cosine, which reports give as a second, separately labelled figure
(:func:`offdiag_cosine`, key ``offdiag_cos``: 1 = identical heads, 0 = orthogonal, −1/(H−1) = cancelling).
A zero vector (norm below the floor) counts as cosine 0 with every head, itself included.

Which tokens (as in training, :mod:`diverse_fairseq.methods.disagreement.similarity`): a cosine term averages over
the tokens it is defined on, the non-padding keys for ``sub`` (V is [B,H,S,d]) and the non-padding queries for
``out`` (O is [B,H,T,d]); ``pos`` sums over the non-padding queries (rows of A; padded keys carry zero
probability). Hence **source tokens** for encoder self-attention (all three terms) and for ``sub`` of
encoder-decoder attention, **target tokens** for decoder self-attention (all three) and for ``pos``/``out`` of
encoder-decoder attention.

Per attention type (EMNLP 2018 Table 4 reports "encoder-side" scores) the layers are combined as training
combines them, by the mean over layers of the similarity: ``exp(−mean_l sim_l)``, i.e. the
geometric mean of the per-layer scores. This reproduces the paper's Table 4 from its Table 5 (baseline
positions: geometric mean of 0.040 0.009 0.002 0.003 0.008 0.006 = 0.007, the Table 4 value; the
arithmetic mean would be 0.011).

The per-token sums are training's own (:func:`~diverse_fairseq.methods.disagreement.similarity.token_cosine_sums`,
``Σ_i Σ_j cos = ‖Σ_i u_i‖²`` with u_i unit vectors, and
:func:`~diverse_fairseq.methods.disagreement.similarity.token_overlap_sums`, ``Σ_i Σ_j Σ_s A_i A_j = Σ_s (Σ_i A_i)²``),
O(H), here computed in fp64 (these are statistics, not training terms); so is the token-side rule
(:func:`diverse_fairseq.methods.sites.token_side`).
The landmarks of the scale and its relation to the off-diagonal one: docs/methods.md#disagreement-scores.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

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


def _cosine_sums(x: Tensor, eps: float = NORM_EPS) -> Tuple[Tensor, Tensor]:
    """Per token ``Σ_i Σ_j cos(x_i, x_j)`` (all H² pairs, training's sum) and its diagonal ``Σ_i cos(x_i, x_i)``,
    both [B, N] fp64.

    The diagonal is H, less one per zero vector (a vector below the norm floor has cosine 0 with everything).
    """
    xf = x.double()
    all_pairs = token_cosine_sums(xf, eps)  # [B, N] = ‖Σ_i u_i‖²
    norm = torch.linalg.vector_norm(xf, dim=-1)  # [B, H, N]
    diagonal = (norm / norm.clamp_min(eps)).pow(2).sum(dim=1)  # [B, N]: cos(x_i, x_i) = ‖u_i‖²
    return all_pairs, diagonal


def mean_pair_cosine(x: Tensor, eps: float = NORM_EPS) -> Tensor:
    """Per-token mean cosine over all H² head pairs (self-pairs included): ``(1/H²) Σ_i Σ_j cos(x_i, x_j)``.

    Args:
        x: ``[B, H, N, d]`` per-head vectors (projected values V or head outputs O).
        eps: floor on the norms; a zero vector has cosine 0 with every head (never NaN).
    Returns:
        ``[B, N]`` fp64 in [0, 1]: 1 for identical heads, 1/H for orthogonal ones, 0 when they cancel.
    """
    _check(x, "mean_pair_cosine")
    return _cosine_sums(x, eps)[0] / x.size(1) ** 2


def offdiag_cosine(x: Tensor, eps: float = NORM_EPS) -> Tensor:
    """Per-token mean cosine over distinct head pairs: ``mean_{i≠j} cos(x_i[b,n], x_j[b,n])``.

    Args:
        x: ``[B, H, N, d]`` per-head vectors (projected values V or head outputs O).
        eps: floor on the norms; a zero vector has cosine 0 with every head (never NaN).
    Returns:
        ``[B, N]`` fp64 in [−1/(H−1), 1]: 1 for identical heads, 0 for orthogonal ones.
    """
    _check(x, "offdiag_cosine")
    num_heads = x.size(1)
    all_pairs, diagonal = _cosine_sums(x, eps)
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
    per_query = token_overlap_sums(a, torch.float64) / (num_heads * num_heads)  # [B, T]
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
    """EMNLP 2018 Table 4 "Sub.": ``exp(−mean over tokens of (1/H²) Σ_i Σ_j cos(V_i, V_j))``; v ``[B,H,S,d]``."""
    return math.exp(-float(mean_pair_cosine(v)[_keep(pad_mask, v)].mean()))


def output_score(o: Tensor, pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Out.": ``exp(−mean over tokens of (1/H²) Σ_i Σ_j cos(O_i, O_j))``; o ``[B,H,T,d]``."""
    return math.exp(-float(mean_pair_cosine(o)[_keep(pad_mask, o)].mean()))


def position_score(a: Tensor, query_pad_mask: Optional[Tensor] = None) -> float:
    """EMNLP 2018 Table 4 "Pos.": mean over sentences of ``exp(−overlap)``; a ``[B,H,T,S]``."""
    return float(torch.exp(-sentence_position_overlap(a, query_pad_mask)).mean())


def _zeros() -> Dict[str, float]:
    return {k: 0.0 for k in SCORE_NAMES}


@dataclass
class ScoreAccumulator:
    """Running sums of one attention module's three scores over batches (fp64 scalars).

    ``update`` takes the module's tapped tensors ``{"v": [B,H,S,d], "a": [B,H,T,S], "o": [B,H,T,d]}`` and the
    padding masks of its keys and queries; ``similarities``/``scores``/``offdiag`` give the per-layer values.
    """

    sums: Dict[str, float] = field(default_factory=_zeros)  # Σ over tokens (sentences for pos) of the similarity
    offdiag_sums: Dict[str, float] = field(default_factory=_zeros)  # Σ over tokens of mean_{i≠j} cos
    counts: Dict[str, int] = field(default_factory=lambda: {k: 0 for k in SCORE_NAMES})
    pos_score_sum: float = 0.0  # Σ over sentences of exp(−overlap)

    def _add_cosines(self, name: str, x: Tensor, pad: Tensor) -> None:
        _check(x, name)
        keep = _keep(pad, x)  # [B, N]
        num_heads = x.size(1)
        all_pairs, diagonal = _cosine_sums(x)  # [B, N] each
        self.sums[name] += float(all_pairs[keep].sum()) / num_heads ** 2
        self.offdiag_sums[name] += float((all_pairs - diagonal)[keep].sum()) / (num_heads * (num_heads - 1))
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

    def similarities(self) -> Dict[str, Optional[float]]:
        """Mean all-pairs cosine (sub, out; self-pairs included) and mean per-sentence overlap (pos)."""
        return {k: (self.sums[k] / self.counts[k] if self.counts[k] else None) for k in SCORE_NAMES}

    def offdiag(self) -> Dict[str, Optional[float]]:
        """The second figure: mean over tokens of the off-diagonal mean cosine ``mean_{i≠j} cos`` (sub, out)."""
        return {k: (self.offdiag_sums[k] / self.counts[k] if self.counts[k] else None) for k in COSINE_NAMES}

    def scores(self) -> Dict[str, Optional[float]]:
        """The reported exp(−·) scores: sub/out of the token mean, pos as the mean of per-sentence scores."""
        sims = self.similarities()
        return {
            "sub": math.exp(-sims["sub"]) if sims["sub"] is not None else None,
            "pos": self.pos_score_sum / self.counts["pos"] if self.counts["pos"] else None,
            "out": math.exp(-sims["out"]) if sims["out"] is not None else None,
        }


def combine_layers(layer_scores: Iterable[Dict]) -> Dict:
    """Per attention type: the geometric mean of the per-layer scores, ``exp(mean_l log score_l)``.

    For sub/out this is exactly ``exp(−mean over layers of the similarity)`` (the layer mean of training). Where the
    layers carry ``offdiag_cos`` (``{"sub": c, "out": c}``), the result carries its mean over layers too.
    """
    layer_scores = list(layer_scores)
    combined: Dict = {}
    for name in SCORE_NAMES:
        values: List[float] = [s[name] for s in layer_scores if s.get(name) is not None]
        if not values:
            combined[name] = None
        elif any(v <= 0.0 for v in values):
            combined[name] = 0.0
        else:
            combined[name] = math.exp(sum(math.log(v) for v in values) / len(values))
    if layer_scores and all("offdiag_cos" in s for s in layer_scores):
        combined["offdiag_cos"] = {}
        for name in COSINE_NAMES:
            values = [s["offdiag_cos"][name] for s in layer_scores if s["offdiag_cos"].get(name) is not None]
            combined["offdiag_cos"][name] = sum(values) / len(values) if values else None
    return combined
