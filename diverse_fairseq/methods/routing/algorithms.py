"""Routing-by-agreement as the paper writes it: simple routing and EM routing over the votes of attention heads.

Li, Yang, Dou, Wang, Lyu, Tu. *Information Aggregation for Multi-Head Attention with
Routing-by-Agreement*. NAACL 2019, §4 (Algorithm 1: simple routing, Eqs. 7-8, Sabour et al. 2017;
Algorithm 2: EM routing, Eqs. 9-12, Hinton et al. 2018). Where the paper leaves a choice open,
docs/methods.md#routing-by-agreement-aggregation says which one is made.

Both functions are pure: they take the votes ``V`` of shape ``[..., H, N, C]`` (H input capsules, i.e.
heads; N output capsules; C the capsule width) and return the output capsules ``[..., N, C]``. Any
leading batch dimensions are allowed (routing acts per position).

Numerics. Both cores run in float32 (or float64 for float64 input) with autocast disabled, whatever the
input dtype, and cast the result back to the input dtype. The agreement weights are kept in log space:
with ``log C = log_softmax_n(logits)``, the normalised weights ``C_{h,n} / Σ_h' C_{h',n}`` used by Eq. 7
and Eqs. 10-11 are ``softmax_h(log C)``, so no division by a vanishing ``Σ_h C`` (which happens for
large votes, when the coupling becomes one-hot) ever occurs. The result is the same quantity as the
paper's, computed without 0/0.

Speed. With capsule width 1 (N = E, the paper's setting and the default) :func:`em_routing` runs the fused
core of :mod:`~diverse_fairseq.methods.routing.fast` (hand-derived backward, same values);
``em_routing(..., fused=False)`` runs the generic code here. :func:`get_routing_function` can wrap either
algorithm in ``torch.compile``.

Options are validated where they enter (:func:`~diverse_fairseq.methods.routing.options.routing_plan` for the
``--routing-*`` flags); the functions here only assert what they rely on.
"""

import math
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from diverse_fairseq.methods.routing.fast import compiled, em_routing_width1

__all__ = ["ROUTING_TYPES", "em_routing", "get_routing_function", "simple_routing", "squash"]

ROUTING_TYPES = ("simple", "em")

_LOG_2PI = math.log(2.0 * math.pi)


def valid_iterations(iterations) -> bool:
    """Whether ``iterations`` is a routing iteration count T: an integer >= 1 (``bool`` excluded)."""
    return isinstance(iterations, int) and not isinstance(iterations, bool) and iterations >= 1


def _check_votes(votes: Tensor) -> None:
    if votes.dim() < 3:
        raise ValueError(
            f"votes must have shape [..., H, N, C] (at least 3 dimensions), got {tuple(votes.shape)}"
        )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 input, float64 for float64 input."""
    return torch.promote_types(dtype, torch.float32)


def _routing_weights(logits: Tensor, with_total: bool = True):
    """Agreement weights from routing logits ``[..., H, N]`` (softmax over the output capsules n).

    Returns ``(W, R)`` with ``C = softmax_n(logits)``, ``R_n = Σ_h C_{h,n}`` ``[..., N]`` (``None``
    unless ``with_total``) and the normalised weights ``W_{h,n} = C_{h,n} / R_n`` ``[..., H, N]`` of
    Eqs. 7 and 10-11, computed as ``softmax_h(log C)``: exact, and finite where ``R_n`` underflows to 0
    (no 0/0, no 1/R² in the backward pass).
    """
    log_c = torch.log_softmax(logits, dim=-1)  # [..., H, N]
    weights = torch.softmax(log_c, dim=-2)  # C / Σ_h C: [..., H, N]
    r = torch.exp(log_c).sum(dim=-2) if with_total else None  # Σ_h C: [..., N]
    return weights, r


def _weighted_sum_over_heads(weights: Tensor, x: Tensor) -> Tensor:
    """Σ_h weights[..., h, n] · x[..., h, n, c]: [..., H, N] x [..., H, N, C] -> [..., N, C].

    (A broadcast product and one reduction: measured faster than the equivalent ``einsum`` on CPU.)
    """
    return (weights.unsqueeze(-1) * x).sum(dim=-3)


def squash(s: Tensor, eps: float = 1e-12) -> Tensor:
    """Squashing non-linearity (NAACL 2019 Eq. 8; Sabour et al. 2017 Eq. 1) over the last dimension.

    ``squash(s) = ‖s‖² / (1 + ‖s‖²) · s / ‖s‖ = s · ‖s‖ / (1 + ‖s‖²)``, with ``‖s‖`` computed as
    ``sqrt(‖s‖² + eps)`` so that ``s = 0`` gives 0 with a finite gradient.
    """
    sq = s.square().sum(-1, keepdim=True)  # [..., 1]
    return s * (torch.sqrt(sq + eps) / (1.0 + sq))


def simple_routing(votes: Tensor, iterations: int = 3) -> Tensor:
    """Iterative simple routing (NAACL 2019 Algorithm 1; Sabour et al. 2017).

    Args:
        votes: ``V_{h→n}`` of shape ``[..., H, N, C]``.
        iterations: number of routing iterations T (>= 1).

    Returns:
        the output capsules ``[Ω_1 .. Ω_N]`` of shape ``[..., N, C]``, in the dtype of ``votes``.

    Per iteration (lines 3-6): ``C = softmax_n(B)`` (over the *output* capsules, as in the paper;
    docs/methods.md#simple-routing), ``s_n = Σ_h C_{h,n} V_{h,n} / Σ_h C_{h,n}`` (Eq. 7),
    ``Ω_n = squash(s_n)`` (Eq. 8) and ``B_{h,n} += Ω_n · V_{h,n}``. The update of B after the last iteration does
    not affect the output
    and is skipped.
    """
    assert valid_iterations(iterations), f"routing iterations must be an integer >= 1, got {iterations!r}"
    _check_votes(votes)
    in_dtype = votes.dtype
    with torch.autocast(device_type=votes.device.type, enabled=False):
        v = votes.to(_compute_dtype(in_dtype))  # [..., H, N, C]
        logits = None  # B_{h,n}; line 2: B = 0
        omega = None
        for t in range(iterations):
            if logits is None:
                # C = 1/N for every (h, n): the normalised weights of Eq. 7 are 1/H
                s = v.mean(dim=-3)  # [..., N, C]
            else:
                weights, _ = _routing_weights(logits, with_total=False)  # [..., H, N]
                s = _weighted_sum_over_heads(weights, v)  # [..., N, C]
            omega = squash(s)  # [..., N, C]
            if t + 1 < iterations:
                # line 6: B_{h,n} += Ω_n · V_{h,n}, [..., N, C] x [..., H, N, C] -> [..., H, N]
                if v.shape[-1] == 1:
                    if logits is None:
                        logits = v.squeeze(-1) * omega.transpose(-1, -2)
                    else:
                        logits = torch.addcmul(logits, v.squeeze(-1), omega.transpose(-1, -2))
                else:
                    agreement = torch.einsum("...nc,...hnc->...hn", omega, v)
                    logits = agreement if logits is None else logits + agreement
    return omega.to(in_dtype)


def _per_capsule(x: Union[Tensor, float], num_capsules: int, like: Tensor, name: str) -> Tensor:
    """β as a [N] tensor of ``like``'s dtype/device (scalars and [N] tensors are accepted)."""
    if isinstance(x, Tensor):
        x = x.to(dtype=like.dtype, device=like.device)
    else:
        x = torch.tensor(float(x), dtype=like.dtype, device=like.device)
    if x.dim() > 1 or (x.dim() == 1 and x.shape[0] not in (1, num_capsules)):
        raise ValueError(f"{name} must be a scalar or have shape [{num_capsules}], got {tuple(x.shape)}")
    return x


def _inverse_temperature_schedule(inverse_temperatures, iterations: int) -> Sequence[float]:
    if inverse_temperatures is None:
        return [float(t) for t in range(1, iterations + 1)]  # λ_t = t (docs/methods.md#em-routing)
    schedule = [float(x) for x in inverse_temperatures]
    if len(schedule) != iterations:
        raise ValueError(
            f"inverse_temperatures must have one value per iteration ({iterations}), got {len(schedule)}"
        )
    return schedule


def em_routing(
    votes: Tensor,
    beta_a: Union[Tensor, float],
    beta_mu: Union[Tensor, float],
    iterations: int = 3,
    inverse_temperatures: Optional[Sequence[float]] = None,
    eps: float = 1e-6,
    *,
    fused: Optional[bool] = None,
) -> Tensor:
    """Iterative EM routing (NAACL 2019 Algorithm 2, Eqs. 9-12; Hinton et al. 2018), as in docs/methods.md#em-routing.

    Args:
        votes: ``V_{h→n}`` of shape ``[..., H, N, C]``.
        beta_a: ``β_A``, the activation cost, a scalar or one value per output capsule ``[N]``.
        beta_mu: ``β_μ``, the per-input cost, a scalar or ``[N]``.
        iterations: number of routing iterations T (>= 1).
        inverse_temperatures: λ_1..λ_T; default ``1, 2, .., T``.
        eps: variance floor ε added to σ² (at most 1e-4).
        fused: use the fused core with a hand-derived backward (capsule width C = 1 only; see
            ``routing_fast``); ``None`` (default) uses it whenever C = 1 outside ``torch.compile``
            tracing (TorchInductor fuses the generic code itself), ``False`` forces the generic code.

    Returns:
        ``Ω_n = A_n · μ_n`` from the last M-step, shape ``[..., N, C]``, in the dtype of ``votes``.

    ``C_{h,n} = 1/N``; for t = 1..T:

    * M-step: ``R_n = Σ_h C_{h,n}``; ``μ_n = Σ_h C_{h,n} V_{h,n} / R_n`` (Eq. 10);
      ``σ²_n = Σ_h C_{h,n} (V_{h,n} - μ_n)² / R_n + ε`` (Eq. 11);
      ``χ_n = Σ_i (½ ln σ²_{n,i} + (1 + ln 2π)/2) · R_n``;
      ``A_n = sigmoid(λ_t (β_A,n - β_μ,n R_n - χ_n))``.
    * E-step (only when t < T): ``ln p_{h,n} = Σ_i [-(V_{h,n,i} - μ_{n,i})² / (2σ²_{n,i})
      - ½ ln(2π σ²_{n,i})]``; ``C_{h,n} = softmax_n(ln A_n + ln p_{h,n})`` (Eq. 12 in log space,
      ``ln A_n = logsigmoid(.)``).
    """
    assert valid_iterations(iterations), f"routing iterations must be an integer >= 1, got {iterations!r}"
    assert eps > 0, f"the EM variance floor eps must be > 0, got {eps}"
    _check_votes(votes)
    schedule = _inverse_temperature_schedule(inverse_temperatures, iterations)
    in_dtype = votes.dtype
    num_heads, num_capsules, width = votes.shape[-3:]
    with torch.autocast(device_type=votes.device.type, enabled=False):
        v = votes.to(_compute_dtype(in_dtype))  # [..., H, N, C]
        b_a = _per_capsule(beta_a, num_capsules, v, "beta_a")  # [N] or []
        b_mu = _per_capsule(beta_mu, num_capsules, v, "beta_mu")  # [N] or []
        if fused is None:
            fused = width == 1 and not torch.compiler.is_compiling()
        elif fused and width != 1:
            raise ValueError(f"the fused EM routing core needs capsule width 1, got votes {tuple(votes.shape)}")
        if fused and v.numel() > 0:
            # capsule width 1 (the paper's N = E): the fused core with a hand-derived backward
            out = em_routing_width1(v.reshape(-1, num_heads, num_capsules), b_a, b_mu, tuple(schedule), eps)
            return out.view(v.shape[:-3] + (num_capsules, 1)).to(in_dtype)
        const = 0.5 * width * (1.0 + _LOG_2PI)  # Σ_i (1 + ln 2π)/2

        weights = None  # C_{h,n} / R_n; None while C = 1/N (line 2)
        r: Union[Tensor, float] = num_heads / num_capsules  # R_n = Σ_h C_{h,n}
        for t, lam in enumerate(schedule):
            # ---- M-step (line 4): μ, σ², A ------------------------------------------------------
            if weights is None:
                mu = v.mean(dim=-3)  # [..., N, C]
            else:
                mu = _weighted_sum_over_heads(weights, v)  # Eq. 10: [..., N, C]
            dev = v - mu.unsqueeze(-3)  # V - μ: [..., H, N, C]
            sq_dev = dev * dev
            if weights is None:
                var = sq_dev.mean(dim=-3) + eps  # [..., N, C]
            else:
                var = _weighted_sum_over_heads(weights, sq_dev) + eps  # Eq. 11 + ε: [..., N, C]
            log_var_sum = torch.log(var).sum(-1)  # Σ_i ln σ²_{n,i}: [..., N]
            chi = (0.5 * log_var_sum + const) * r  # χ_n: [..., N]
            activation_logit = lam * (b_a - b_mu * r - chi)  # λ_t(β_A - β_μ R_n - χ_n): [..., N]
            if t + 1 == len(schedule):
                break
            # ---- E-step (line 5), Eq. 12 in log space ---------------------------------------------
            # ln A_n + ln p_{h,n} = [ln A_n - Σ_i ½ ln(2π σ²_{n,i})] + Σ_i (V - μ)²_{h,n,i} · (-1/(2σ²_{n,i}))
            log_norm = 0.5 * (log_var_sum + width * _LOG_2PI)  # Σ_i ½ ln(2π σ²_{n,i}): [..., N]
            per_capsule = (F.logsigmoid(activation_logit) - log_norm).unsqueeze(-2)  # [..., 1, N]
            neg_half_precision = -0.5 / var  # [..., N, C]
            if width == 1:  # one fused multiply-add over [..., H, N]
                logits = torch.addcmul(per_capsule, sq_dev.squeeze(-1), neg_half_precision.transpose(-1, -2))
            else:
                logits = per_capsule + torch.einsum("...hnc,...nc->...hn", sq_dev, neg_half_precision)
            weights, r = _routing_weights(logits)  # [..., H, N], [..., N]
        out = torch.sigmoid(activation_logit).unsqueeze(-1) * mu  # Ω_n = A_n μ_n: [..., N, C]
    return out.to(in_dtype)


def get_routing_function(routing: str, compile: bool = False) -> Callable[..., Tensor]:
    """Return :func:`simple_routing` or :func:`em_routing`, wrapped in ``torch.compile`` if ``compile``.

    Args:
        routing: ``"simple"`` or ``"em"`` (one of :data:`ROUTING_TYPES`).
        compile: run the routing core through ``torch.compile`` (``--routing-compile``).
    """
    functions = {"simple": simple_routing, "em": em_routing}
    assert routing in functions, f"unknown routing type {routing!r}; expected one of {ROUTING_TYPES}"
    return compiled(functions[routing]) if compile else functions[routing]
