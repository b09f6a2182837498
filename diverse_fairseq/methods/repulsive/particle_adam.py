"""The torch optimizer of ``repulsive_adam``: SVGD/SPOS/SGLD transform of the particle gradients, then Adam.

Repulsive attention (An et al., EMNLP 2020, Algorithm 1): every chosen q/k/v projection weight is a set
of M = H particles (its per-head row blocks, :mod:`.particles`) and, inside ``step()``, its gradient is
replaced by the particle-optimization direction of :mod:`.svgd` (SVGD, Eq. 4, or SPOS, Eq. 5; or SGLD,
the paper's kernel-free comparison of Appendix C.1) before the Adam update. All other parameters get plain
fairseq Adam (``fairseq.optim.adam.Adam``; same math, decoupled weight decay).

Why the Adam update is a copy and not ``super().step()``: fairseq's ``Adam.step`` reads ``p.grad``, but
under ``--memory-efficient-fp16`` ``p.grad`` is fp16 and the transformed gradient (like every gradient
times the 1/loss-scale factor) is fp32; writing it into ``.grad`` would round it to fp16 and scaling all
gradients in fp32 up front would hold a second fp32 copy of them, so neither is the same update.

SPOS and SGLD noise comes from a generator seeded by (``--seed``, number of steps taken by this optimizer),
so all data-parallel workers draw the same noise; the step count is part of the optimizer state dict, so it
is saved in checkpoints and resuming continues the noise sequence.
"""

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from fairseq.optim.adam import Adam

from diverse_fairseq.methods.repulsive.particles import ParticleTag
from diverse_fairseq.methods.repulsive.svgd import sgld_update_, spos_update_, svgd_update_

OPTIMIZER_NAME = "repulsive_adam"  # fairseq's --optimizer name; also the state dict's key of num_steps

#: The documented hook for diagnostics: callables ``fn(theta, grad, rule, grad_scale)`` that every ParticleAdam
#: calls with each SVGD update's inputs before applying it (see :func:`add_svgd_observer`).
SVGD_OBSERVERS: List = []


def add_svgd_observer(observer):
    """Register ``observer(theta, grad, rule, grad_scale)``, called by every :class:`ParticleAdam` before each SVGD
    update with the particle sets' parameters and raw gradients ``theta``, ``grad`` [G, M, D] (work buffers: read
    them, copy what you keep, change nothing), the :class:`ParticleRule` (α, ε, bandwidth) and the gradient scale
    (1 / loss scale, or None). fairseq builds the optimizer inside ``fairseq-train``, so a probe registers here
    before training starts (scripts/experiments/kernel_probe.py records the SVGD kernel this way). Returns a
    function that removes the observer."""
    SVGD_OBSERVERS.append(observer)
    return lambda: SVGD_OBSERVERS.remove(observer)


@dataclass(frozen=True)
class ParticleRule:
    """The particle update (paper Eq. 4 for ``svgd``; Eq. 5, which adds β·g and noise, for ``spos``; β·g and
    noise without the kernel terms for ``sgld``)."""

    method: str  # "svgd" | "spos" | "sgld"
    alpha: float  # svgd, spos
    stepsize: float
    bandwidth: Union[str, float]  # svgd, spos
    beta: float  # spos, sgld
    noise_scale: str  # spos, sgld
    seed: int  # spos, sgld: seeds the noise with the step count


def _stack_into(views: List[torch.Tensor], out: torch.Tensor) -> None:
    """``torch.stack(views, out=out)``, converting dtype (fp16 → fp32) on the way."""
    if views[0].dtype == out.dtype:
        torch.stack(views, out=out)
    else:
        for dst, src in zip(out.unbind(0), views):
            dst.copy_(src)


class _ParticleGroup:
    """Particle sets of one shape [M, D] (and dtype/device), transformed together as [G, M, D].

    Owns three [G, M, D] work buffers (θ scratch, g, ĝ), allocated on first use and reused every step.
    """

    def __init__(self, num_heads: int, dim: int):
        self.num_heads = num_heads
        self.dim = dim
        self.params: List[torch.Tensor] = []
        self.tags: List[ParticleTag] = []
        self._buffers: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def buffers(self, n: int, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(like.dtype, torch.float32)
        if self._buffers is None or self._buffers[0].dtype != dtype or self._buffers[0].device != like.device:
            shape = (len(self.params), self.num_heads, self.dim)
            self._buffers = tuple(torch.empty(shape, dtype=dtype, device=like.device) for _ in range(3))
        return tuple(b[:n] for b in self._buffers)


class ParticleAdam(Adam):
    """fairseq's Adam (same update, same state) whose particle gradients are first transformed.

    :meth:`set_particles` names the particle weights (with tags) and the :class:`ParticleRule`; ``step(inv_scale=c)``
    uses the SVGD/SPOS/SGLD direction of ``p.grad`` × c for those, ``p.grad`` × c for the rest (c = None means 1).
    Counts its steps (``num_steps``, kept in its state dict).
    """

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.num_steps = 0
        self.rule: Optional[ParticleRule] = None
        self.particle_groups: List[_ParticleGroup] = []

    def set_particles(self, particles: Sequence[Tuple[torch.Tensor, ParticleTag]], rule: ParticleRule) -> None:
        """Group the particle weights by (M, D, dtype, device), in the given order."""
        groups: "OrderedDict[Any, _ParticleGroup]" = OrderedDict()
        for p, tag in particles:
            m = tag.num_heads
            group = groups.setdefault((m, p.numel() // m, p.dtype, p.device), _ParticleGroup(m, p.numel() // m))
            group.params.append(p)
            group.tags.append(tag)
        self.particle_groups = list(groups.values())
        self.rule = rule

    @property
    def supports_step_with_scale(self):
        # fairseq's FP16 wrappers ask the torch optimizer (``wrapper.optimizer``): they then hand the
        # scale to step() instead of unscaling fp16 gradients in fp16 first
        return True

    @property
    def supports_flat_params(self):
        return False  # the particles are per-parameter row blocks

    def state_dict(self):
        state = super().state_dict()
        state[OPTIMIZER_NAME] = {"num_steps": self.num_steps}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop(OPTIMIZER_NAME, None)
        super().load_state_dict(state_dict)
        self.num_steps = int(extra["num_steps"]) if extra else 0

    def particle_gradients(self, inv_scale=None) -> Dict[int, torch.Tensor]:
        """The transformed gradient (fp32) of every particle weight with a gradient, by ``id(param)``.

        Algorithm 1 of An et al. (2020): the gradients g_i of the M particles of each set become the
        SVGD direction (Eq. 4), the SPOS one (Eq. 5) or the SGLD one, which Adam then applies.
        ``inv_scale`` multiplies the raw gradients first (1 / loss scale and clip factor). The returned
        tensors are views of work buffers that the next call overwrites.
        """
        rule = self.rule
        overrides: Dict[int, torch.Tensor] = {}
        generators: Dict[str, torch.Generator] = {}  # SPOS/SGLD: seeded once per step and device
        for group in self.particle_groups:
            live = [p for p in group.params if p.grad is not None]
            if not live:
                continue
            m, d = group.num_heads, group.dim
            theta, grad, out = group.buffers(len(live), live[0])  # [G, M, D] each
            if rule.method != "sgld":  # SGLD does not read θ: the buffer only holds its noise
                _stack_into([p.detach().reshape(m, d) for p in live], theta)
            _stack_into([p.grad.detach().reshape(m, d) for p in live], grad)
            if rule.method == "svgd":
                for observer in SVGD_OBSERVERS:
                    observer(theta, grad, rule, inv_scale)
                svgd_update_(theta, grad, out, rule.alpha, rule.stepsize, rule.bandwidth, grad_scale=inv_scale)
            else:
                key = str(theta.device)
                if key not in generators:  # the same (seed, step) on every worker and after resuming
                    generators[key] = torch.Generator(device=theta.device)
                    generators[key].manual_seed((rule.seed * 1_000_003 + self.num_steps) % (2**63 - 1))
                noise = dict(generator=generators[key], noise_scale=rule.noise_scale, grad_scale=inv_scale)
                if rule.method == "spos":
                    spos_update_(theta, grad, out, rule.alpha, rule.stepsize, rule.beta, rule.bandwidth, **noise)
                else:
                    sgld_update_(theta, grad, out, rule.stepsize, rule.beta, **noise)
            for p, new in zip(live, out.unbind(0)):
                overrides[id(p)] = new.view(p.shape)
        return overrides

    @torch.no_grad()
    def step(self, closure=None, inv_scale=None):
        """One iteration of Algorithm 1: the particle gradients' SVGD/SPOS/SGLD transform, then the Adam update."""
        overrides = self.particle_gradients(inv_scale)
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                grad = overrides.get(id(p))
                if grad is None:
                    if p.grad is None:
                        continue
                    grad = p.grad.data
                    if grad.dtype in {torch.float16, torch.bfloat16}:
                        grad = grad.float()
                    if grad.is_sparse:
                        raise RuntimeError("Adam does not support sparse gradients")
                    if inv_scale is not None:
                        grad = grad * inv_scale
                self._update(p, grad, group)
        self.num_steps += 1
        return loss

    def _update(self, p, grad, group):
        """One parameter's update, exactly as ``fairseq.optim.adam.Adam.step`` does it."""
        amsgrad = group.get("amsgrad", False)
        p_data_fp32 = p.data
        if p.data.dtype in {torch.float16, torch.bfloat16}:
            p_data_fp32 = p_data_fp32.float()

        state = self.state[p]
        new = len(state) == 0
        if new:
            state["step"] = 0
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")[: 3 if amsgrad else 2]:
            state[key] = torch.zeros_like(p_data_fp32) if new else state[key].to(p_data_fp32)

        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        beta1, beta2 = group["betas"]
        state["step"] += 1
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if amsgrad:
            max_exp_avg_sq = state["max_exp_avg_sq"]
            torch.max(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
            denom = max_exp_avg_sq.sqrt().add_(group["eps"])
        else:
            denom = exp_avg_sq.sqrt().add_(group["eps"])
        bias_correction1 = 1 - beta1 ** state["step"]
        bias_correction2 = 1 - beta2 ** state["step"]
        step_size = group["lr"] * math.sqrt(bias_correction2) / bias_correction1
        if group["weight_decay"] != 0:
            p_data_fp32.add_(p_data_fp32, alpha=-group["weight_decay"] * group["lr"])
        p_data_fp32.addcdiv_(exp_avg, denom, value=-step_size)
        if p.data.dtype in {torch.float16, torch.bfloat16}:
            p.data.copy_(p_data_fp32)
