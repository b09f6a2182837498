"""Head-similarity measures minimised by disagreement regularization.

Li, Tu, Yang, Lyu, Zhang. *Multi-Head Attention with Disagreement Regularization*. EMNLP 2018, §3.2
(Eq. 1 subspaces, Eq. 2 attended positions, Eq. 3 outputs); implemented as described in
docs/methods.md#disagreement-regularization:
per-token similarities averaged over the H² head pairs (the diagonal included), then a mean over the
non-padding tokens of the whole batch. The paper's disagreement D is the negative of these numbers.

All three functions are O(H): for unit vectors ``u_i``,
``Σ_i Σ_j cos(x_i, x_j) = ‖Σ_i u_i‖²`` and ``Σ_i Σ_j Σ_s A_i[s] A_j[s] = Σ_s (Σ_i A_i[s])²``, the per-token sums
of :func:`token_cosine_sums` and :func:`token_overlap_sums`, which the reported disagreement scores
(:mod:`diverse_fairseq.analysis.scores`) use too.
They accumulate in fp32 for fp16/bf16/fp32 inputs (fp64 stays fp64, for gradcheck), floor vector norms at ``eps``
(zero vectors give 0, never NaN) and use hand-written backward passes that save only their input,
which the attention computation already keeps alive for its own backward, so a regularized step holds
no extra activation memory.
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = ["subspace_similarity", "position_similarity", "output_similarity", "token_cosine_sums",
           "token_overlap_sums"]

#: floor on vector norms before normalising (the gradient of x / max(‖x‖, eps) is used below it)
NORM_EPS = 1e-6


def _acc_dtype(x: Tensor) -> torch.dtype:
    """Accumulation dtype: fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 inputs."""
    return torch.promote_types(x.dtype, torch.float32)


def token_cosine_sums(x: Tensor, eps: float = NORM_EPS, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Per token, ``Σ_i Σ_j cos(x_i, x_j)`` over all H² head pairs (self-pairs included): [B, H, N, d] -> [B, N].

    Computed as ``‖Σ_i x_i / max(‖x_i‖, eps)‖²`` in ``dtype`` (default: fp32 for fp16/bf16/fp32, fp64 for fp64),
    so a vector below the norm floor counts as cosine 0 with every head (never NaN).
    """
    assert x.dim() == 4, f"expected per-head vectors [B, H, N, d], got {tuple(x.shape)}"
    xf = x.to(dtype or _acc_dtype(x))  # no copy when the dtype is already right
    norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)  # [B, H, N, 1]
    unit_sum = (xf / norm.clamp_min(eps)).sum(dim=1)  # [B, N, d]
    return unit_sum.pow(2).sum(dim=-1)  # [B, N]


def token_overlap_sums(a: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Per query token, ``Σ_i Σ_j Σ_s A_i[s] A_j[s] = Σ_s (Σ_i A_i[s])²`` over all H² head pairs:
    [B, H, T, S] -> [B, T].

    Accumulated in ``dtype`` (default: fp32 for fp16/bf16/fp32, fp64 for fp64).
    """
    assert a.dim() == 4, f"expected attention probabilities [B, H, T, S], got {tuple(a.shape)}"
    return a.sum(dim=1, dtype=dtype or _acc_dtype(a)).pow(2).sum(dim=-1)  # [B, T]


def _token_weights(pad_mask: Optional[Tensor], x: Tensor, ntok: int, name: str) -> Tensor:
    """[B, N] weights: 1/#non-pad on non-pad tokens, 0 on padding (a masked mean as a dot product)."""
    bsz, device, dtype = x.size(0), x.device, _acc_dtype(x)
    if pad_mask is None:
        return torch.full((bsz, ntok), 1.0 / max(bsz * ntok, 1), dtype=dtype, device=device)
    if tuple(pad_mask.shape) != (bsz, ntok):
        raise ValueError(
            f"{name}: pad_mask has shape {tuple(pad_mask.shape)}, expected (B, N) = {(bsz, ntok)}"
        )
    keep = ~pad_mask.to(device=device, dtype=torch.bool)
    keep = keep.to(dtype)
    return keep / keep.sum().clamp_min(1.0)


def _weights(x: Tensor, pad_mask: Optional[Tensor], name: str, what: str) -> Tensor:
    """Check ``x`` ([B, H, N, ·], described by ``what``) and return the [B, N] weights of its masked token mean.

    The number of heads is checked where it enters, by the criterion (each regularized attention module) and by
    the analysis; here it is only asserted."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected {what}, got shape {shape}")
    assert x.size(1) >= 2, f"{name}: head similarity needs at least 2 heads, got H = {x.size(1)}"
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    return _token_weights(pad_mask, x, x.size(2), name)


class _MeanHeadCosine(torch.autograd.Function):
    """Σ_{b,n} w[b,n] · (1/H²) ‖Σ_i x_i[b,n] / max(‖x_i[b,n]‖, eps)‖², x: [B, H, N, d], w: [B, N]."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, eps: float) -> Tensor:
        num_heads = x.size(1)
        per_token = token_cosine_sums(x, eps) / (num_heads * num_heads)  # [B, N]
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return (per_token * w).sum()

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, w = ctx.saved_tensors
        num_heads = x.size(1)
        xf = x.to(_acc_dtype(x))
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)  # [B, H, N, 1]
        inv = norm.clamp_min(ctx.eps).reciprocal()
        unit = xf * inv  # [B, H, N, d]
        # d loss / d unit_i = 2 w U / H², the same for every head i
        g_unit = (unit.sum(dim=1) * (w * (2.0 * grad_out.to(w.dtype) / (num_heads * num_heads))).unsqueeze(-1))
        g_unit = g_unit.unsqueeze(1)  # [B, 1, N, d]
        # through x / max(‖x‖, eps): (I - u uᵀ)/‖x‖ above the floor, I/eps below it
        radial = (unit * g_unit).sum(dim=-1, keepdim=True) * (norm > ctx.eps)  # [B, H, N, 1]
        grad_x = (g_unit - unit * radial) * inv  # [B, H, N, d]
        return grad_x.to(x.dtype), None, None


class _MeanHeadOverlap(torch.autograd.Function):
    """Σ_{b,t} w[b,t] · (1/H²) Σ_s (Σ_i A_i[b,t,s])², A: [B, H, T, S], w: [B, T]."""

    @staticmethod
    def forward(ctx, a: Tensor, w: Tensor) -> Tensor:
        num_heads = a.size(1)
        per_token = token_overlap_sums(a) / (num_heads * num_heads)  # [B, T]
        ctx.save_for_backward(a, w)
        return (per_token * w).sum()

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        a, w = ctx.saved_tensors
        num_heads = a.size(1)
        head_sum = a.sum(dim=1, dtype=_acc_dtype(a))  # [B, T, S]
        scale = w * (2.0 * grad_out.to(w.dtype) / (num_heads * num_heads))  # [B, T]
        grad = (head_sum * scale.unsqueeze(-1)).unsqueeze(1).expand_as(a)  # [B, H, T, S], a view
        return grad.to(a.dtype), None


def subspace_similarity(v: Tensor, pad_mask: Optional[Tensor] = None, eps: float = NORM_EPS) -> Tensor:
    """Mean pairwise cosine similarity of the heads' projected values (EMNLP 2018, Eq. 1, negated).

    Args:
        v: projected values V, ``[B, H, S, d]``.
        pad_mask: optional ``[B, S]`` boolean mask over the key tokens, True at padding.
    Returns:
        0-dim fp32 tensor (fp64 for fp64 inputs): mean over non-padding tokens of
        ``(1/H²) Σ_i Σ_j cos(V_i[b,s], V_j[b,s])``.
    """
    w = _weights(v, pad_mask, "subspace_similarity", "v of shape [B, H, S, d]")
    return _MeanHeadCosine.apply(v, w, eps)


def output_similarity(o: Tensor, pad_mask: Optional[Tensor] = None, eps: float = NORM_EPS) -> Tensor:
    """Mean pairwise cosine similarity of the heads' outputs (EMNLP 2018, Eq. 3, negated).

    Args:
        o: head outputs O = A·V before the output projection, ``[B, H, T, d]``.
        pad_mask: optional ``[B, T]`` boolean mask over the query tokens, True at padding.
    Returns:
        0-dim fp32 tensor (fp64 for fp64 inputs): mean over non-padding tokens of
        ``(1/H²) Σ_i Σ_j cos(O_i[b,t], O_j[b,t])``.
    """
    w = _weights(o, pad_mask, "output_similarity", "o of shape [B, H, T, d]")
    return _MeanHeadCosine.apply(o, w, eps)


def position_similarity(a: Tensor, pad_mask: Optional[Tensor] = None) -> Tensor:
    """Mean pairwise overlap of the heads' attention distributions (EMNLP 2018, Eq. 2, negated).

    Args:
        a: attention probabilities A (after softmax, before attention dropout), ``[B, H, T, S]``.
        pad_mask: optional ``[B, T]`` boolean mask over the query tokens, True at padding.
    Returns:
        0-dim fp32 tensor (fp64 for fp64 inputs): mean over non-padding tokens of
        ``(1/H²) Σ_i Σ_j Σ_s A_i[b,t,s] A_j[b,t,s]``.
    """
    w = _weights(a, pad_mask, "position_similarity", "a of shape [B, H, T, S]")
    return _MeanHeadOverlap.apply(a, w)
