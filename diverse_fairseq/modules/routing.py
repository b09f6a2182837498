"""Routing-by-agreement cores: simple routing and EM routing over the votes of attention heads.

Li, Yang, Dou, Wang, Lyu, Tu. *Information Aggregation for Multi-Head Attention with
Routing-by-Agreement*. NAACL 2019, §4 (Algorithm 1: simple routing, Sabour et al. 2017; Algorithm 2:
EM routing, Hinton et al. 2018). Where the paper leaves a choice open,
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

Speed. With capsule width 1 (N = E, the paper's setting and the default) EM routing runs through a fused
core (``_EMRoutingWidth1``): tokens in cache-sized chunks, in-place updates and a hand-derived backward
instead of autograd through ~10 full-size temporaries per iteration (forward + backward about twice as
fast as autograd through the generic code on CPU, with fewer saved tensors).
``em_routing(..., fused=False)`` runs the generic code.

Optionally the cores can be run through ``torch.compile`` (off by default): pass ``compile=True`` to
:func:`get_routing_function` or set the environment variable ``DIVERSE_FAIRSEQ_COMPILE_ROUTING=1``
(TorchInductor then compiles the generic code; on CPU this measured slower than the fused eager core).
"""

import math
import os
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "COMPILE_ENV_VAR",
    "ROUTING_TYPES",
    "compile_requested",
    "em_routing",
    "get_routing_function",
    "simple_routing",
    "squash",
]

ROUTING_TYPES = ("simple", "em")
COMPILE_ENV_VAR = "DIVERSE_FAIRSEQ_COMPILE_ROUTING"

_LOG_2PI = math.log(2.0 * math.pi)


def _check_iterations(iterations: int) -> None:
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"routing iterations must be an integer >= 1, got {iterations!r}")


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
    _check_iterations(iterations)
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
            ``_EMRoutingWidth1``); ``None`` (default) uses it whenever C = 1 outside ``torch.compile``
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
    _check_iterations(iterations)
    _check_votes(votes)
    if not eps > 0:
        raise ValueError(f"the EM variance floor eps must be > 0, got {eps}")
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
            out = _em_routing_width1(v.reshape(-1, num_heads, num_capsules), b_a, b_mu, tuple(schedule), eps)
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


# ------------------------------------------------------------------------------------------------------
# EM routing with capsule width 1: fused, chunked core with a hand-derived backward
# ------------------------------------------------------------------------------------------------------
#
# With C = 1 (N = E, the paper's setting) every vote is a scalar and the routing state of one token is a
# handful of [H, N] and [N] arrays. Autograd through the generic code above keeps ~10 [tokens, H, N]
# temporaries per iteration and runs ~3x as many full passes over them in backward as the forward does.
# Here the tokens are processed in chunks of about ``_CHUNK_ELEMENTS`` votes (a few MiB: the chunk's
# temporaries stay in cache), most [.., H, N] updates are in place, and the backward is written out
# by hand (Algorithm 2 differentiated step by step, below); it is checked against autograd through
# the generic code (tests/test_routing_model.py) and against finite differences (gradcheck).
#
# Notation per token (h: head, n: output capsule), iteration t = 1..T with weights W^t = C/R (softmax over
# h of log C), R^t = Σ_h C (W^1 = 1/H, R^1 = H/N):
#   M-step  μ = Σ_h W v,  d = v - μ,  σ² = Σ_h W d² + ε,  ℓ = ln σ²,  χ = (½ℓ + k) R,  k = (1 + ln 2π)/2,
#           α = λ_t (β_A - β_μ R - χ)
#   E-step  g = logsigmoid(α) - ½ℓ (the constant -½ ln 2π cancels in the softmax),  P = -1/(2σ²),
#           Y = log_softmax_n(g + P d²) = log C,  W' = softmax_h(Y) = C / Σ_h C,  R' = Σ_h e^Y
#   output  o = sigmoid(α^T) μ^T
# Backward (x̄ = ∂loss/∂x), from the output to t = 1:
#   μ̄^T = ō A, ᾱ^T = ō μ^T A (1 - A) with A = sigmoid(α^T)
#   E-step  Ȳ = W' ⊙ (W̄' - Σ_h W' W̄' + R̄' R'),  X̄ = Ȳ - C ⊙ Σ_n Ȳ (C = e^Y = W' R'),
#           ḡ = Σ_h X̄,  P̄ = Σ_h X̄ d²,  ᾱ = ḡ (1 - sigmoid(α)),  ℓ̄ = -½ ḡ,  σ̄² = P̄ / (2σ⁴)
#   M-step  β̄_A += λ ᾱ,  χ̄ = -λ ᾱ,  β̄_μ += χ̄ R,  R̄ = χ̄ (β_μ + ½ℓ + k),  ℓ̄ += ½ R χ̄,  s̄ = σ̄² + ℓ̄ / σ²,
#           d̄ = 2 d ⊙ (P X̄ + s̄ W),  μ̄ -= Σ_h d̄,  v̄ += d̄ + μ̄ W,  W̄ = s̄ d² + μ̄ v  (→ W̄', R̄' of t - 1)

_CHUNK_ELEMENTS = 1 << 18  # votes per chunk (1 MiB in float32; measured best on CPU between 2^16 and 2^20)
_HALF_1_PLUS_LOG_2PI = 0.5 * (1.0 + _LOG_2PI)


def _em_width1_forward(v: Tensor, b_a: Tensor, b_mu: Tensor, schedule, eps: float, saved: Optional[list]):
    """EM routing of one chunk ``v`` [m, H, N] -> Ω [m, N]; appends per-iteration tensors to ``saved``."""
    num_heads, num_capsules = v.shape[1], v.shape[2]
    weights: Optional[Tensor] = None  # W^t [m, H, N]; None while uniform (1/H)
    r: Union[Tensor, float] = num_heads / num_capsules  # R^t
    for t, lam in enumerate(schedule):
        # ---- M-step
        if weights is None:
            mu = v.mean(1)  # [m, N]
        else:
            mu = torch.mul(weights, v).sum(1)
        if saved is not None:
            d = v - mu.unsqueeze(1)  # [m, H, N], kept for the backward
            d2 = d * d
        else:  # inference: (v - μ)² in one pass
            d = None
            d2 = F.mse_loss(v, mu.unsqueeze(1).expand_as(v), reduction="none")
        var = (d2.mean(1) if weights is None else torch.mul(weights, d2).sum(1)).add_(eps)  # σ² [m, N]
        log_var = torch.log(var)
        # α = λ β_A - λ R (β_μ + ½ℓ + k)
        alpha = torch.add(b_mu + _HALF_1_PLUS_LOG_2PI, log_var, alpha=0.5).mul_(-lam * r).add_(b_a, alpha=lam)
        record = {"weights": weights, "r": r, "d": d, "mu": mu, "var": var, "log_var": log_var, "alpha": alpha}
        if saved is not None:
            saved.append(record)
        if t + 1 == len(schedule):
            break
        # ---- E-step: C = softmax_n(g + P d²), then W' = C / Σ_h C, R' = Σ_h C
        g = F.logsigmoid(alpha).sub_(0.5 * log_var)  # [m, N]
        neg_half_precision = -0.5 / var  # P [m, N]
        record["P"] = neg_half_precision
        logits = torch.addcmul(g.unsqueeze(1), d2, neg_half_precision.unsqueeze(1), out=d2)  # [m, H, N]
        weights, r = _normalised_coupling(logits)
    return torch.sigmoid(alpha).mul_(mu)  # Ω = A μ: [m, N]


_TINY_TOTAL = 1e-30  # below this Σ_h C, C / Σ_h C is computed in log space (C may be denormal or 0)


def _normalised_coupling(logits: Tensor):
    """``(W, R)`` from E-step logits [m, H, N]: C = softmax_n, R = Σ_h C [m, N], W = C / R [m, H, N].

    On CPU the ratio is taken directly (one exponential per vote) unless some ``R_n`` is tiny (a capsule
    no head couples to: the ratio would be 0/0); then, and always on accelerators (no host sync), W is
    ``softmax_h(log C)``, exact also where C underflows (see ``_routing_weights``).
    """
    if logits.device.type == "cpu":
        coupling = torch.softmax(logits, dim=-1)  # C
        total = coupling.sum(1, keepdim=True)  # [m, 1, N]
        if not bool((total < _TINY_TOTAL).any()):
            return coupling.div_(total), total.squeeze(1)
    log_c = torch.log_softmax(logits, dim=-1)  # [m, H, N]
    shift = log_c.amax(1, keepdim=True)  # [m, 1, N]
    weights = log_c.sub_(shift).exp_()
    total = weights.sum(1, keepdim=True)  # [m, 1, N]
    weights.div_(total)
    return weights, torch.exp(shift).mul_(total).squeeze(1)  # Σ_h C = e^shift Σ_h e^(log C - shift)


def _em_width1_backward(v: Tensor, b_mu: Tensor, schedule, saved: list, grad_out: Tensor):
    """Gradients of one chunk: v̄ [m, H, N] and the per-token parts of β̄_A, β̄_μ [m, N]."""
    num_heads = v.shape[1]
    last = saved[-1]
    act = torch.sigmoid(last["alpha"])
    mu_bar = grad_out * act  # [m, N]
    alpha_bar = grad_out * last["mu"] * act * (1.0 - act)
    grad_beta_a = torch.zeros_like(grad_out)
    grad_beta_mu = torch.zeros_like(grad_out)
    v_bar: Optional[Tensor] = None
    w_bar = r_bar = x_bar = None  # adjoints of W^{t+1}, R^{t+1}; X̄ of this E-step
    for t in range(len(schedule) - 1, -1, -1):
        rec, lam = saved[t], schedule[t]
        d, var, log_var, weights, r = rec["d"], rec["var"], rec["log_var"], rec["weights"], rec["r"]
        d2 = d * d
        if t + 1 < len(schedule):  # ---- E-step
            w_next, r_next = saved[t + 1]["weights"], saved[t + 1]["r"]
            inner = torch.mul(w_next, w_bar).sum(1, keepdim=True)  # Σ_h W' W̄'  [m, 1, N]
            y_bar = w_bar.sub_(inner).add_((r_bar * r_next).unsqueeze(1)).mul_(w_next)  # Ȳ
            row = y_bar.sum(-1, keepdim=True)  # Σ_n Ȳ  [m, H, 1]
            x_bar = y_bar.addcmul_(w_next, row * r_next.unsqueeze(1), value=-1.0)  # X̄ = Ȳ - C Σ_n Ȳ
            g_bar = x_bar.sum(1)  # [m, N]
            var_bar = torch.mul(x_bar, d2).sum(1).mul_(0.5 / (var * var))  # P̄ / (2σ⁴)
            alpha_bar = g_bar * (1.0 - torch.sigmoid(rec["alpha"]))
            log_var_bar = -0.5 * g_bar
        else:
            var_bar, log_var_bar, x_bar = 0.0, 0.0, None
        # ---- M-step
        grad_beta_a.add_(alpha_bar, alpha=lam)
        chi_bar = -lam * alpha_bar  # [m, N]
        grad_beta_mu.add_(chi_bar * r)
        s_bar = var_bar + (log_var_bar + 0.5 * r * chi_bar) / var  # s̄ [m, N]
        # d̄ = 2 d ⊙ (P X̄ + s̄ W)
        if x_bar is not None:
            d_bar = x_bar.mul_((2.0 * rec["P"]).unsqueeze(1))
            if weights is None:
                d_bar.add_((2.0 / num_heads * s_bar).unsqueeze(1))
            else:
                d_bar.addcmul_(weights, (2.0 * s_bar).unsqueeze(1))
        elif weights is None:
            d_bar = (2.0 / num_heads * s_bar).unsqueeze(1).expand_as(d).clone()
        else:
            d_bar = weights * (2.0 * s_bar).unsqueeze(1)
        d_bar.mul_(d)
        mu_bar = mu_bar - d_bar.sum(1)
        if weights is None:  # v̄ += d̄ + μ̄ W
            d_bar.add_((mu_bar / num_heads).unsqueeze(1))
        else:
            d_bar.addcmul_(weights, mu_bar.unsqueeze(1))
        v_bar = d_bar if v_bar is None else v_bar.add_(d_bar)
        if t > 0:  # W̄ = s̄ d² + μ̄ v, R̄ = χ̄ (β_μ + ½ℓ + k): the adjoints of the previous E-step's output
            w_bar = d2.mul_(s_bar.unsqueeze(1)).addcmul_(v, mu_bar.unsqueeze(1))
            r_bar = chi_bar * (b_mu + 0.5 * log_var + _HALF_1_PLUS_LOG_2PI)
            mu_bar = torch.zeros_like(mu_bar)
    return v_bar, grad_beta_a, grad_beta_mu


def _chunks(num_rows: int, row_elements: int):
    step = max(1, min(num_rows, _CHUNK_ELEMENTS // max(1, row_elements)))
    return [(i, min(num_rows, i + step)) for i in range(0, num_rows, step)]


class _EMRoutingWidth1(torch.autograd.Function):
    """EM routing over votes [M, H, N] (capsule width 1) with β_A, β_μ of shape [N]."""

    @staticmethod
    def forward(ctx, v: Tensor, b_a: Tensor, b_mu: Tensor, schedule, eps: float):
        out = v.new_empty(v.shape[0], v.shape[2])
        keep = any(ctx.needs_input_grad[:3])
        chunk_states = []
        for start, end in _chunks(v.shape[0], v.shape[1] * v.shape[2]):
            saved = [] if keep else None
            out[start:end] = _em_width1_forward(v[start:end], b_a, b_mu, schedule, eps, saved)
            chunk_states.append(saved)
        if keep:
            # every per-chunk tensor goes through save_for_backward (freed after backward unless the graph
            # is retained); the nesting is kept as indices into the saved tuple
            tensors, layout = [v, b_mu], []
            for saved in chunk_states:
                chunk_layout = []
                for record in saved:
                    entry = {}
                    for key, value in record.items():
                        if isinstance(value, Tensor):
                            entry[key] = (True, len(tensors))
                            tensors.append(value)
                        else:
                            entry[key] = (False, value)  # R^1 = H/N, W^1 = None (uniform)
                    chunk_layout.append(entry)
                layout.append(chunk_layout)
            ctx.save_for_backward(*tensors)
            ctx.layout = layout
            ctx.schedule = schedule
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        tensors = ctx.saved_tensors
        v, b_mu = tensors[0], tensors[1]
        grad_out = grad_out.contiguous()
        grad_v = torch.empty_like(v) if ctx.needs_input_grad[0] else None
        grad_beta_a = torch.zeros_like(b_mu)
        grad_beta_mu = torch.zeros_like(b_mu)
        for (start, end), chunk_layout in zip(_chunks(v.shape[0], v.shape[1] * v.shape[2]), ctx.layout):
            saved = [{key: tensors[x] if is_tensor else x for key, (is_tensor, x) in entry.items()}
                     for entry in chunk_layout]
            gv, ga, gm = _em_width1_backward(v[start:end], b_mu, ctx.schedule, saved, grad_out[start:end])
            if grad_v is not None:
                grad_v[start:end] = gv
            grad_beta_a.add_(ga.sum(0))
            grad_beta_mu.add_(gm.sum(0))
        return grad_v, grad_beta_a, grad_beta_mu, None, None


def _em_routing_width1(v: Tensor, b_a: Tensor, b_mu: Tensor, schedule, eps: float) -> Tensor:
    """v [M, H, N] (compute dtype), β [N] or [] -> Ω [M, N] through the fused core."""
    num_capsules = v.shape[2]
    b_a_n, b_mu_n = b_a.expand(num_capsules), b_mu.expand(num_capsules)
    if torch.is_grad_enabled() and (v.requires_grad or b_a.requires_grad or b_mu.requires_grad):
        out = _EMRoutingWidth1.apply(v.contiguous(), b_a_n, b_mu_n, schedule, eps)
        return out
    with torch.no_grad():
        v = v.contiguous()
        out = v.new_empty(v.shape[0], num_capsules)
        for start, end in _chunks(v.shape[0], v.shape[1] * num_capsules):
            out[start:end] = _em_width1_forward(v[start:end], b_a_n, b_mu_n, schedule, eps, None)
    return out


_COMPILED = {}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def compile_requested(compile: Optional[bool] = None) -> bool:
    """``compile`` if given, else whether ``DIVERSE_FAIRSEQ_COMPILE_ROUTING`` is set to a true value
    (``1``, ``true``, ``yes``, ``on``; unset, empty, ``0``, ``false``, ``no``, ``off``: no). Any other value of the
    variable is a ``ValueError`` naming it (checked when a routed model is built, before training)."""
    if compile is not None:
        return bool(compile)
    value = os.environ.get(COMPILE_ENV_VAR, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{COMPILE_ENV_VAR}={os.environ[COMPILE_ENV_VAR]!r} is not valid: use 1 (or true, yes, on) "
                         f"to compile the routing loop, 0 (or false, no, off) or unset not to")
    return value in _TRUE


def get_routing_function(routing: str, compile: Optional[bool] = None) -> Callable[..., Tensor]:
    """Return :func:`simple_routing` or :func:`em_routing`, wrapped in ``torch.compile`` if requested.

    Args:
        routing: ``"simple"`` or ``"em"``.
        compile: ``True``/``False``; ``None`` reads ``DIVERSE_FAIRSEQ_COMPILE_ROUTING``.
    """
    functions = {"simple": simple_routing, "em": em_routing}
    if routing not in functions:
        raise ValueError(f"unknown routing type {routing!r}; expected one of {ROUTING_TYPES}")
    fn = functions[routing]
    if not compile_requested(compile):
        return fn
    if routing not in _COMPILED:
        # dynamic=None: the first call compiles for static shapes, a changed number of tokens then
        # triggers one recompilation with dynamic leading dimensions.
        _COMPILED[routing] = torch.compile(fn)
    return _COMPILED[routing]
