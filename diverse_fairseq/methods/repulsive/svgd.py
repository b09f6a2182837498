"""Particle updates for attention heads: SVGD and SPOS (An et al., EMNLP 2020), and SGLD for comparison.

Repulsive attention treats the M = H heads of one projection (W_Q, W_K or W_V of one attention module)
as M particles θ_1..θ_M ∈ R^D that sample the posterior of the attention parameter (paper §3–4,
Algorithm 1). Instead of each head following its own loss gradient g_i, the inner optimizer (Adam) is
handed the particle-optimization direction of paper Eq. (4) (SVGD) or Eq. (5) (SPOS), written as a
*gradient* (the negative of the paper's update direction φ, times the stepsize ε):

    SVGD:  ĝ_i = ε · (1/M) Σ_j [ κ_ij g_j − α · f · (θ_i − θ_j) κ_ij ]
    SPOS:  ĝ_i = ε · ( (1/M) Σ_j [ κ_ij g_j − α · f · (θ_i − θ_j) κ_ij ] + β g_i − √(2β/ε) ξ_i )

with ξ_i ~ N(0, I). The optimizer *subtracts* ĝ, so the term −α f (θ_i − θ_j) κ_ij moves θ_i away
from θ_j: the heads repel each other. α is the repulsive weight of Appendix B.2; our β is what the
paper's SPOS (Eq. 5) writes as β⁻¹ (the authors' code multiplies the gradient by ``beta``).

SGLD (Welling and Teh 2011; the baseline sampler of the paper's Appendix C.1 / Table 8) is SPOS without its
kernel terms: each head follows its own gradient plus Langevin noise, with no kernel and no repulsion,

    SGLD:  ĝ_i = ε · ( β g_i − √(2β/ε) ξ_i ) = η g_i − √(2η) ξ_i,   η = ε·β,

i.e. θ_i ← θ_i − η g_i + √(2η) ξ_i, Welling and Teh's update at temperature 1 with their stepsize ε_WT = 2η
(before Adam). The paper gives no formula or setting for its SGLD; this choice keeps ε, β, the noise (same
generator, same draws) and the noise scale of SPOS, so that SGLD and SPOS differ by the kernel terms only.

The stepsize ε (paper Appendix B.2.3: 0.1 for both translation tasks) multiplies the whole SVGD
direction, and Adam's update is invariant to a constant factor on a parameter's gradient (up to Adam's
tiny ε in the denominator): under Adam, ε changes nothing for SVGD. It matters only for SPOS, through
the noise scale √(2β/ε) relative to the gradient terms.

RBF kernel and bandwidth h (``bandwidth``):

* ``"median"`` (paper, Appendix B.2): κ_ij = exp(−‖θ_i − θ_j‖² / h), h = med² / ln M, med the median
  of the M(M−1)/2 distances between distinct particles (lower middle value for an even count, as
  ``torch.median``); ∇_{θ_j} κ_ij = (2/h)(θ_i − θ_j) κ_ij, so f = 2/h. At the median distance
  κ = exp(−ln M) = 1/M.
* ``"authors"`` (the ``rbf`` kernel of the authors' fairseq ``trainer.py``): h = 0.5 · median of all M²
  squared distances, the M zeros of the diagonal included (lower middle value, as ``torch.median``)
  / ln(M + 1); κ_ij = exp(−‖θ_i − θ_j‖² / 2h), f = 1/h (their kernel gradient is
  Σ_j κ_ij (θ_i − θ_j) / h). For M = 2 at least half of the M² values are the diagonal's zeros, so this
  bandwidth is always 0 there: the authors' code then computes exp(−0/0), NaN; here h = 0 is handled as
  below (κ = 1, no repulsive term).
* a positive float: that h with the paper's kernel (κ = exp(−D²/h), f = 2/h).

If h comes out as 0 (identical particles, or M = 1) the kernel is 1 everywhere and the repulsive term
is 0, so M = 1 gives exactly ε·g and identical particles give ε·mean_j(g_j). Nothing here divides by 0.

Everything is batched: ``theta`` and ``grad`` may be [M, D] or [G, M, D] (G particle sets of the same
shape, e.g. the Q, K and V weights of every attention module, updated in one call). Squared distances
come from one Gram matrix per set (``bmm``), computed relative to particle 0 so that they are exact for
identical particles and suffer less cancellation; no Python loop runs over particles or pairs.
:func:`svgd_direction` / :func:`spos_direction` / :func:`sgld_direction` are the functional API;
:func:`svgd_update_` / :func:`spos_update_` / :func:`sgld_update_` write into caller-owned buffers (the
optimizer reuses them every step: on CPU a fresh allocation of that size costs more than the whole update).
The options (α, ε, β, bandwidth, noise scale) are checked with messages naming their flags by
``--optimizer repulsive_adam`` (:mod:`.optimizer`); here β and the noise scale are only asserted.
"""

import math
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor

BANDWIDTHS = ("median", "authors")
NOISE_SCALES = ("unit", "grad_median")

Bandwidth = Union[str, float]

_TRIU_CACHE: Dict[Tuple[int, str], Tuple[Tensor, Tensor]] = {}


def parse_bandwidth(value: Union[str, float]) -> Bandwidth:
    """``"median"``, ``"authors"`` or a positive float (also given as a string, e.g. from the CLI)."""
    if isinstance(value, str):
        name = value.strip().lower()
        if name in BANDWIDTHS:
            return name
        try:
            value = float(name)
        except ValueError:
            raise ValueError(
                f"bandwidth must be one of {', '.join(BANDWIDTHS)} or a positive number, got {value!r}"
            ) from None
    value = float(value)
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"a fixed bandwidth must be a positive finite number, got {value!r}")
    return value


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _triu_pairs(m: int, device: torch.device) -> Tuple[Tensor, Tensor]:
    key = (m, str(device))
    pairs = _TRIU_CACHE.get(key)
    if pairs is None:
        rows, cols = torch.triu_indices(m, m, offset=1, device=device)
        pairs = _TRIU_CACHE[key] = (rows, cols)
    return pairs


def rbf_kernel(d2: Tensor, bandwidth: Bandwidth = "median") -> Tuple[Tensor, Tensor]:
    """RBF kernel matrix and repulsive factor f (∇_{θ_j} κ_ij = f (θ_i − θ_j) κ_ij) per set.

    Args:
        d2: [G, M, M] squared pairwise distances (zero diagonal).
        bandwidth: ``"median"``, ``"authors"`` or a positive float (see the module docstring).
    Returns:
        ``(kernel, factor)``: [G, M, M] and [G]. Where the bandwidth is 0 the kernel is 1 and the
        factor 0 (no repulsion).
    """
    g, m, _ = d2.shape
    scale = 1.0  # κ = exp(−D² / (scale·h))
    if isinstance(bandwidth, str):
        if bandwidth == "median":
            if m < 2:
                h = d2.new_zeros(g)
            else:
                rows, cols = _triu_pairs(m, d2.device)
                med2 = d2[:, rows, cols].median(dim=-1).values  # [G]: median squared distance
                h = med2 / math.log(m)
            numerator = 2.0
        elif bandwidth == "authors":
            med2 = d2.reshape(g, m * m).median(dim=-1).values  # [G], zeros of the diagonal included
            h = 0.5 * med2 / math.log(m + 1)
            numerator, scale = 1.0, 2.0
        else:
            raise ValueError(f"unknown bandwidth {bandwidth!r}; choose {', '.join(BANDWIDTHS)} or a number")
    else:
        h = d2.new_full((g,), float(bandwidth))
        numerator = 2.0
    # a bandwidth of 0 (or a subnormal one whose inverse would overflow) means "no scale to repel on"
    usable = h > torch.finfo(d2.dtype).tiny * 1e6  # [G]
    inv_h = torch.where(usable, 1.0 / torch.where(usable, h, torch.ones_like(h)), torch.zeros_like(h))
    kernel = torch.exp(d2 * (-inv_h / scale).view(g, 1, 1))  # [G, M, M]; exp(0) = 1 where h = 0
    factor = numerator * inv_h  # [G]; 0 where h = 0
    return kernel, factor


def _as_sets(theta: Tensor, grad: Tensor) -> Tuple[Tensor, Tensor, bool]:
    if theta.shape != grad.shape:
        raise ValueError(f"theta {tuple(theta.shape)} and grad {tuple(grad.shape)} differ in shape")
    if theta.dim() not in (2, 3):
        raise ValueError(f"expected particles shaped [M, D] or [G, M, D], got {tuple(theta.shape)}")
    single = theta.dim() == 2
    dtype = _compute_dtype(theta.dtype)
    theta = theta.detach().to(dtype, copy=True)  # a private copy: the update overwrites it
    grad = grad.detach().to(dtype)
    if single:
        theta, grad = theta.unsqueeze(0), grad.unsqueeze(0)
    return theta, grad, single


def svgd_update_(
    theta: Tensor,
    grad: Tensor,
    out: Tensor,
    alpha: float,
    stepsize: float,
    bandwidth: Bandwidth,
    grad_scale: Union[None, float, Tensor] = None,
) -> Tensor:
    """Batched SVGD gradient written into ``out``, without allocating anything of size [G, M, D].

    ``theta`` [G, M, D] is used as scratch space (it ends up holding θ − θ_0); ``grad`` [G, M, D] is
    read only and multiplied by ``grad_scale`` on the fly (e.g. 1/loss scale); ``out`` [G, M, D]
    receives ĝ. All three share one floating dtype. The repulsive sum is taken over j ≠ i, whose terms
    vanish one by one for distant particles, instead of as r_i θ_i − (Kθ)_i, a difference of two
    nearly equal numbers.
    """
    g, m, _ = theta.shape
    theta.sub_(theta[:, :1].clone())  # θ − θ_0: same differences; exact zeros for copies of θ_0
    rel = theta
    gram = torch.bmm(rel, rel.transpose(1, 2))  # [G, M, M]
    sq = gram.diagonal(dim1=1, dim2=2)  # [G, M]
    d2 = (sq.unsqueeze(2) + sq.unsqueeze(1) - 2.0 * gram).clamp_(min=0.0)  # [G, M, M]
    d2.diagonal(dim1=1, dim2=2).zero_()
    kernel, factor = rbf_kernel(d2, bandwidth)  # [G, M, M], [G]
    scale = stepsize / m
    drive = kernel * scale if grad_scale is None else kernel * (grad_scale * scale)  # [G, M, M]
    torch.bmm(drive, grad, out=out)  # ε/M Σ_j κ_ij g_j
    if alpha != 0.0:
        # − ε/M α f Σ_{j≠i} κ_ij (θ_i − θ_j) = ε/M α f (Σ_{j≠i} κ_ij θ_j − θ_i Σ_{j≠i} κ_ij)
        off = kernel * (alpha * scale * factor).view(g, 1, 1)  # [G, M, M]
        off.diagonal(dim1=1, dim2=2).zero_()
        out.baddbmm_(off, rel)
        out.addcmul_(off.sum(dim=2, keepdim=True), rel, value=-1.0)
    return out


def _add_langevin_(
    grad: Tensor,
    out: Tensor,
    scratch: Tensor,
    stepsize: float,
    beta: float,
    generator: Optional[torch.Generator],
    noise_scale: str,
    grad_scale: Union[None, float, Tensor],
) -> Tensor:
    """``out += ε (β g − √(2β/ε) ξ)``, the gradient-and-noise terms shared by SPOS and SGLD.

    ξ is drawn into ``scratch`` [G, M, D] in one ``randn`` call from ``generator``; with
    ``noise_scale="grad_median"`` it is multiplied by the median |g| of each set. Nothing is added for β = 0.
    """
    assert noise_scale in NOISE_SCALES, f"noise_scale must be one of {', '.join(NOISE_SCALES)}, got {noise_scale!r}"
    if beta > 0:
        if grad_scale is None:
            out.add_(grad, alpha=stepsize * beta)
        else:
            out.add_(grad * (grad_scale * (stepsize * beta)))
        noise = torch.randn(scratch.shape, generator=generator, out=scratch)  # ξ, reusing the scratch buffer
        coef = stepsize * math.sqrt(2.0 * beta / stepsize)
        if noise_scale == "grad_median":
            med = grad.abs().flatten(1).median(dim=1).values  # [G]
            if grad_scale is not None:
                med = med * grad_scale
            noise.mul_(med.view(-1, 1, 1))
        out.add_(noise, alpha=-coef)
    return out


def spos_update_(
    theta: Tensor,
    grad: Tensor,
    out: Tensor,
    alpha: float,
    stepsize: float,
    beta: float,
    bandwidth: Bandwidth,
    generator: Optional[torch.Generator] = None,
    noise_scale: str = "grad_median",
    grad_scale: Union[None, float, Tensor] = None,
) -> Tensor:
    """Batched SPOS gradient written into ``out``: SVGD + ε (β g_i − √(2β/ε) ξ_i).

    Same buffers as :func:`svgd_update_`; ``theta`` is reused for the noise ξ, drawn from
    ``generator`` in one ``randn`` call over all [G, M, D] entries.
    """
    assert beta >= 0, f"SPOS needs beta >= 0, got {beta}"
    svgd_update_(theta, grad, out, alpha, stepsize, bandwidth, grad_scale)
    return _add_langevin_(grad, out, theta, stepsize, beta, generator, noise_scale, grad_scale)


def sgld_update_(
    scratch: Tensor,
    grad: Tensor,
    out: Tensor,
    stepsize: float,
    beta: float,
    generator: Optional[torch.Generator] = None,
    noise_scale: str = "grad_median",
    grad_scale: Union[None, float, Tensor] = None,
) -> Tensor:
    """Batched SGLD gradient written into ``out``: ĝ_i = ε (β g_i − √(2β/ε) ξ_i) (module docstring).

    SPOS without the kernel terms, elementwise over all [G, M, D] entries (no loop over heads). The
    positions θ are not needed: ``scratch`` [G, M, D] only receives the noise ξ, drawn from ``generator``
    exactly as :func:`spos_update_` draws it (same call, same shape, same dtype), so for the same
    generator state SGLD and SPOS inject the same noise. β must be > 0 (β = 0 would freeze the particles).
    """
    assert beta > 0, f"SGLD needs beta > 0 (with beta = 0 the particles get no gradient and no noise), got {beta}"
    out.zero_()
    return _add_langevin_(grad, out, scratch, stepsize, beta, generator, noise_scale, grad_scale)


def svgd_direction(
    theta: Tensor,
    grad: Tensor,
    alpha: float = 0.01,
    stepsize: float = 0.1,
    bandwidth: Union[str, float] = "median",
) -> Tensor:
    """The SVGD replacement gradient (paper Eq. 4, with repulsive weight α; module docstring).

    Args:
        theta: particles, [M, D] or [G, M, D] (G independent sets).
        grad: loss gradients of the particles, same shape.
        alpha: repulsive weight α (0 turns the repulsion off).
        stepsize: ε.
        bandwidth: ``"median"`` (paper), ``"authors"`` or a positive float.
    Returns:
        ĝ, same shape as ``theta``, in float32 (float64 inputs stay float64).
    """
    theta, grad, single = _as_sets(theta, grad)
    out = torch.empty_like(theta)
    svgd_update_(theta, grad, out, float(alpha), float(stepsize), parse_bandwidth(bandwidth))
    return out.squeeze(0) if single else out


def spos_direction(
    theta: Tensor,
    grad: Tensor,
    alpha: float = 0.01,
    stepsize: float = 0.1,
    beta: float = 1.0,
    bandwidth: Union[str, float] = "median",
    generator: Optional[torch.Generator] = None,
    noise_scale: str = "grad_median",
) -> Tensor:
    """The SPOS replacement gradient (paper Eq. 5; our β is the paper's β⁻¹).

    ĝ_i = SVGD_i + ε (β g_i − √(2β/ε) ξ_i), ξ ~ N(0, I) of the shape of ``theta`` (as [G, M, D]) drawn
    in one ``torch.randn`` call from ``generator`` (on the device of ``theta``) in the compute dtype.
    ``noise_scale="grad_median"`` (default, with β = 1: the authors' code) multiplies ξ by the median |g| of
    each set; ``"unit"`` is the formula above as the paper writes it.
    """
    theta, grad, single = _as_sets(theta, grad)
    out = torch.empty_like(theta)
    spos_update_(
        theta, grad, out, float(alpha), float(stepsize), float(beta), parse_bandwidth(bandwidth),
        generator=generator, noise_scale=noise_scale,
    )
    return out.squeeze(0) if single else out


def sgld_direction(
    grad: Tensor,
    stepsize: float = 0.1,
    beta: float = 1.0,
    generator: Optional[torch.Generator] = None,
    noise_scale: str = "grad_median",
) -> Tensor:
    """The SGLD replacement gradient: ĝ_i = ε (β g_i − √(2β/ε) ξ_i) (module docstring).

    ``grad`` is [M, D] or [G, M, D]; ξ is drawn as in :func:`spos_direction` (one ``torch.randn`` of the
    [G, M, D] shape from ``generator``, compute dtype), so with the same generator state both inject the
    same noise. ``noise_scale`` as for SPOS.
    """
    _, grad, single = _as_sets(grad, grad)
    out = torch.empty_like(grad)
    sgld_update_(torch.empty_like(grad), grad, out, float(stepsize), float(beta), generator=generator,
                 noise_scale=noise_scale)
    return out.squeeze(0) if single else out
