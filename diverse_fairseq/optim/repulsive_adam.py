"""``--optimizer repulsive_adam``: Adam whose per-head Q/K/V gradients are replaced by SVGD or SPOS.

Repulsive attention (An et al., EMNLP 2020, Algorithm 1): every chosen q/k/v projection
weight is a set of M = H particles (its per-head row blocks) and, inside ``step()``, its gradient is
replaced by the particle-optimization direction of :mod:`diverse_fairseq.optim.repulsive` before the
Adam update. All other parameters get plain fairseq Adam (``fairseq.optim.adam.Adam``; same math,
decoupled weight decay). How the particles are found is explained in
:mod:`diverse_fairseq.optim.particles`.

Where the transform sits. fairseq's trainer does backward → all-reduce → ``multiply_grads`` →
``clip_grad_norm`` → ``optimizer.step()``, so ``step()`` sees the gradients Adam would see. What it must
undo depends on the precision wrapper around this optimizer, and each case hands the transform the
true, unscaled, clipped gradient in fp32:

* fp32: the gradients as they are.
* ``--memory-efficient-fp16`` and ``--fp16 --fp16-no-flatten-grads`` (and ``--bf16``): the wrapper calls
  ``step(scale=1/multiply_factor)`` because this optimizer ``supports_step_with_scale``; the loss scale
  and the clip factor are divided out here in fp32 (fp16 gradients are never rescaled in fp16 first).
  The transformed gradients are handed to Adam as fp32 tensors, never written back into fp16 ``.grad``.
* ``--amp``: fairseq's ``AMPOptimizer`` unscales the inner torch optimizer in ``clip_grad_norm`` and then
  passes *this* object to ``GradScaler.step``, which would unscale the same gradients a second time
  (a known fairseq 0.12 trap). This class sets ``_step_supports_amp_scaling``, so ``GradScaler.step`` only checks
  for inf/NaN and calls ``step()`` with ``self.grad_scale`` / ``self.found_inf`` set: the step is skipped
  when ``found_inf``; the gradients are divided by ``grad_scale`` only if ``clip_grad_norm`` (which
  fairseq's AMP wrapper always precedes with the unscale) did not run since the last step.
* plain ``--fp16`` (one flat fp32 master tensor) hides the per-head structure: refused at start-up with
  a message naming ``--fp16-no-flatten-grads``.

SPOS noise comes from a generator seeded by (``--seed``, number of steps taken by this optimizer), so all
data-parallel workers draw the same noise; the step count is part of the optimizer state dict, so it is
saved in checkpoints and resuming continues the noise sequence.
"""

import logging
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.optim import register_optimizer
from fairseq.optim.adam import Adam, FairseqAdam, FairseqAdamConfig
from fairseq.optim.fairseq_optimizer import FairseqOptimizer
from omegaconf import II

from ..option_parsing import ALL_LAYERS, describe_layers, parse_layer_spec, parse_names, resolve_layers
from .particles import ATTENTION_TYPES, PROJECTIONS, ParticleTag, find_particle_tags
from .repulsive import NOISE_SCALES, parse_bandwidth, spos_update_, svgd_update_

logger = logging.getLogger(__name__)

OPTIMIZER_NAME = "repulsive_adam"
METHODS = ("svgd", "spos")


@dataclass
class RepulsiveAdamConfig(FairseqAdamConfig):
    repulsive_method: ChoiceEnum(METHODS) = field(
        default="svgd",
        metadata={"help": "particle-optimization rule for the attention heads: svgd (paper Eq. 4) or "
                          "spos (Eq. 5, SVGD plus beta·g and Gaussian noise)"},
    )
    repulsive_alpha: float = field(
        default=0.01, metadata={"help": "repulsive weight alpha in front of the kernel-gradient term"}
    )
    repulsive_stepsize: float = field(
        default=0.1,
        metadata={"help": "stepsize epsilon multiplying the particle update (the paper's value for both "
                          "translation tasks, Appendix B.2.3: 0.1; the authors' IWSLT script uses 0.01). "
                          "Adam is invariant to a constant factor on a gradient, so for svgd epsilon changes "
                          "nothing; it matters only for spos (noise scale sqrt(2·beta/epsilon))"},
    )
    repulsive_beta: float = field(
        default=1e-3,
        metadata={"help": "SPOS only: beta, which the paper's SPOS (Eq. 5) writes as beta^-1: adds "
                          "beta·g_i and noise -sqrt(2·beta/epsilon)·xi_i inside the update"},
    )
    repulsive_bandwidth: str = field(
        default="median",
        metadata={"help": "RBF bandwidth: median (paper: h = med^2/ln M over distances between distinct "
                          "heads, kernel exp(-D^2/h)), authors (the authors' code: h = 0.5 · median of all "
                          "M^2 squared distances / ln(M+1), kernel exp(-D^2/2h), repulsive factor 1/h) or a "
                          "fixed positive number h (paper kernel)"},
    )
    repulsive_noise_scale: ChoiceEnum(NOISE_SCALES) = field(
        default="unit",
        metadata={"help": "SPOS only: unit (the paper's formula) or grad_median (noise times the median |g| of "
                          "the particle set, as in the authors' code)"},
    )
    repulsive_attention: str = field(
        default="enc_self,dec_self,enc_dec",
        metadata={"help": "comma-separated attention types whose heads are particles: "
                          "enc_self, dec_self, enc_dec"},
    )
    repulsive_layers: Optional[str] = field(
        default=None,
        metadata={"help": "layers whose heads are particles: 'all' (the default), 'none', or comma-separated "
                          "0-based indices (negative ones count from the last layer of each attention type)"},
    )
    repulsive_projections: str = field(
        default="q,k,v",
        metadata={"help": "comma-separated projections whose per-head blocks are particles: q, k, v"},
    )
    seed: int = II("common.seed")
    fp16: bool = II("common.fp16")
    bf16: bool = II("common.bf16")
    memory_efficient_fp16: bool = II("common.memory_efficient_fp16")
    fp16_no_flatten_grads: bool = II("common.fp16_no_flatten_grads")
    amp: bool = II("common.amp")
    ddp_backend: str = II("distributed_training.ddp_backend")
    zero_sharding: str = II("distributed_training.zero_sharding")


def _option(cfg, name: str, default):
    """``cfg.name``, or ``default`` when absent or an unresolved ``${...}`` interpolation."""
    try:
        value = getattr(cfg, name)
    except Exception:  # omegaconf: interpolation to a missing node
        return default
    if value is None or (isinstance(value, str) and value.startswith("${")):
        return default
    return value


def check_precision_setup(cfg) -> None:
    """Refuse set-ups in which the optimizer cannot see per-parameter gradients."""
    fp16 = bool(_option(cfg, "fp16", False))
    bf16 = bool(_option(cfg, "bf16", False))
    if fp16 and not bf16 and not any(
        _option(cfg, flag, False) for flag in ("memory_efficient_fp16", "fp16_no_flatten_grads", "amp")
    ):
        raise ValueError(
            f"--optimizer {OPTIMIZER_NAME} needs each parameter's own gradient, but --fp16 flattens all "
            "parameters into one fp32 master tensor. Add --fp16-no-flatten-grads (or use "
            "--memory-efficient-fp16 or --amp)."
        )
    if _option(cfg, "ddp_backend", None) == "fully_sharded":
        raise ValueError(f"--optimizer {OPTIMIZER_NAME} does not support --ddp-backend fully_sharded "
                         "(FSDP flattens parameters); use legacy_ddp, c10d or no_c10d")
    if _option(cfg, "zero_sharding", "none") not in ("none", None):
        raise ValueError(f"--optimizer {OPTIMIZER_NAME} does not support --zero-sharding")


def _stack_into(views: List[torch.Tensor], out: torch.Tensor) -> None:
    """``torch.stack(views, out=out)``, converting dtype (fp16 → fp32) on the way."""
    if views[0].dtype == out.dtype:
        torch.stack(views, out=out)
    else:
        for dst, src in zip(out.unbind(0), views):
            dst.copy_(src)


class ParticleAdam(Adam):
    """fairseq's Adam (same update, same state) that takes replacement gradients and a scale.

    ``step(grad_overrides={id(param): fp32 gradient}, inv_scale=c)``: a parameter listed in
    ``grad_overrides`` is updated with that gradient; any other one with ``param.grad`` × c (c = None
    means 1). Also counts the steps it has taken (``num_steps``), kept in its state dict.
    """

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.num_steps = 0

    @property
    def supports_step_with_scale(self):
        # fairseq's FP16 wrappers ask the torch optimizer (``wrapper.optimizer``): they then hand the
        # scale to RepulsiveAdam.step instead of unscaling fp16 gradients in fp16 first
        return True

    def state_dict(self):
        state = super().state_dict()
        state[OPTIMIZER_NAME] = {"num_steps": self.num_steps}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop(OPTIMIZER_NAME, None)
        super().load_state_dict(state_dict)
        self.num_steps = int(extra["num_steps"]) if extra else 0

    @torch.no_grad()
    def step(self, closure=None, grad_overrides: Optional[Dict[int, torch.Tensor]] = None, inv_scale=None):
        loss = closure() if closure is not None else None
        overrides = grad_overrides or {}
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
        if len(state) == 0:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p_data_fp32)
            state["exp_avg_sq"] = torch.zeros_like(p_data_fp32)
            if amsgrad:
                state["max_exp_avg_sq"] = torch.zeros_like(p_data_fp32)
        else:
            state["exp_avg"] = state["exp_avg"].to(p_data_fp32)
            state["exp_avg_sq"] = state["exp_avg_sq"].to(p_data_fp32)
            if amsgrad:
                state["max_exp_avg_sq"] = state["max_exp_avg_sq"].to(p_data_fp32)

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


@register_optimizer(OPTIMIZER_NAME, dataclass=RepulsiveAdamConfig)
class RepulsiveAdam(FairseqAdam):
    """Adam with repulsive (SVGD/SPOS) updates of attention heads (An et al., EMNLP 2020)."""

    # torch.amp.GradScaler.step() then calls step() with self.grad_scale / self.found_inf set instead
    # of unscaling again (see the module docstring, "--amp")
    _step_supports_amp_scaling = True

    def __init__(self, cfg: RepulsiveAdamConfig, params):
        FairseqOptimizer.__init__(self, cfg)  # not FairseqAdam's: it would build its own torch optimizer
        check_precision_setup(cfg)
        if _option(cfg, "fp16_adam_stats", False):
            raise ValueError(f"--optimizer {OPTIMIZER_NAME} does not support --fp16-adam-stats")
        params = list(params)
        self._optimizer = ParticleAdam(params, **self.optimizer_config)
        self.method = str(cfg.repulsive_method)
        if self.method not in METHODS:
            raise ValueError(f"--repulsive-method must be one of {', '.join(METHODS)}, got {self.method!r}")
        self.alpha = float(cfg.repulsive_alpha)
        self.stepsize = float(cfg.repulsive_stepsize)
        self.beta = float(cfg.repulsive_beta)
        self.bandwidth = parse_bandwidth(cfg.repulsive_bandwidth)
        self.noise_scale = str(cfg.repulsive_noise_scale)
        self.seed = int(_option(cfg, "seed", 1))
        if not self.alpha >= 0 or self.alpha == float("inf"):
            raise ValueError(f"--repulsive-alpha must be a finite number >= 0 (0: no repulsive term), got "
                             f"{cfg.repulsive_alpha}")
        if not self.stepsize > 0:
            raise ValueError(f"--repulsive-stepsize must be positive, got {self.stepsize}")
        if self.method == "spos" and self.beta < 0:
            raise ValueError(f"--repulsive-beta must be >= 0, got {self.beta}")
        self.attention_types = parse_names(cfg.repulsive_attention, ATTENTION_TYPES, "--repulsive-attention")
        self.projections = parse_names(cfg.repulsive_projections, PROJECTIONS, "--repulsive-projections")
        self.layers = parse_layer_spec(cfg.repulsive_layers, "--repulsive-layers", ALL_LAYERS)
        if not self.layers:
            raise ValueError(f"--optimizer {OPTIMIZER_NAME}: --repulsive-layers none selects no particles; choose "
                             "layers ('all' or indices), or train with --optimizer adam")
        self._groups = self._build_groups(params)
        self._unscaled_since_step = False
        self._generators: Dict[str, torch.Generator] = {}

    # ------------------------------------------------------------------ particles
    def _build_groups(self, params) -> List[_ParticleGroup]:
        tags = find_particle_tags(params)
        depth = Counter()
        for tag in tags.values():
            depth[tag.attention_type] = max(depth[tag.attention_type], tag.layer_idx + 1)

        chosen = {t: resolve_layers(self.layers, depth[t], "--repulsive-layers", f" of {t} attention")
                  for t in self.attention_types if t in depth}

        def selected(tag: ParticleTag) -> bool:
            if tag.attention_type not in self.attention_types or tag.projection not in self.projections:
                return False
            return tag.layer_idx in chosen[tag.attention_type]

        groups: "OrderedDict[Any, _ParticleGroup]" = OrderedDict()
        for i in sorted(tags):
            tag, p = tags[i], params[i]
            if not selected(tag):
                continue
            m = tag.num_heads
            key = (m, p.numel() // m, p.dtype, p.device)
            group = groups.setdefault(key, _ParticleGroup(m, p.numel() // m))
            group.params.append(p)
            group.tags.append(tag)
        result = list(groups.values())
        n_sets = sum(len(g.params) for g in result)
        if n_sets == 0:
            hint = (
                "no attention module was found in the model being trained (models are found when built "
                "through fairseq.models.build_model; register others with "
                "diverse_fairseq.optim.particles.track_model)"
                if not tags
                else f"the {len(tags)} q/k/v weights found are all excluded by --repulsive-attention "
                     f"{','.join(self.attention_types)} / --repulsive-layers "
                     f"{describe_layers(self.layers)} / "
                     f"--repulsive-projections {','.join(self.projections)} (layers per type: {dict(depth)})"
            )
            raise ValueError(f"--optimizer {OPTIMIZER_NAME}: no particles to update: {hint}")
        per_type = Counter(t.attention_type for g in result for t in g.tags)
        logger.info(
            f"{OPTIMIZER_NAME}: {self.method} on {n_sets} particle sets "
            f"({', '.join(f'{k}: {v}' for k, v in per_type.items())}; "
            f"M×D = {', '.join(f'{g.num_heads}×{g.dim}' for g in result)}), alpha={self.alpha}, "
            f"stepsize={self.stepsize}, bandwidth={self.bandwidth}"
            + (f", beta={self.beta}, noise={self.noise_scale}" if self.method == "spos" else "")
        )
        return result

    @property
    def particle_tags(self) -> List[ParticleTag]:
        return [t for g in self._groups for t in g.tags]

    @property
    def particle_params(self) -> List[torch.Tensor]:
        """The q/k/v weights whose gradients are transformed, in the order of ``particle_tags``."""
        return [p for g in self._groups for p in g.params]

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        gen = self._generators.get(key)
        if gen is None:
            gen = self._generators[key] = torch.Generator(device=device)
        # the same (seed, step) on every worker and after resuming: replicas draw identical noise
        gen.manual_seed((self.seed * 1_000_003 + self.optimizer.num_steps) % (2**63 - 1))
        return gen

    def particle_gradients(self, inv_scale=None) -> Dict[int, torch.Tensor]:
        """The transformed gradient (fp32) of every particle weight with a gradient, by ``id(param)``.

        ``inv_scale`` multiplies the raw gradients first (1 / loss scale and clip factor). The returned
        tensors are views of work buffers that the next call overwrites.
        """
        overrides: Dict[int, torch.Tensor] = {}
        generators: Dict[str, torch.Generator] = {}  # SPOS: seeded once per step and device
        for group in self._groups:
            live = [p for p in group.params if p.grad is not None]
            if not live:
                continue
            m, d = group.num_heads, group.dim
            theta, grad, out = group.buffers(len(live), live[0])  # [G, M, D] each
            _stack_into([p.detach().reshape(m, d) for p in live], theta)
            _stack_into([p.grad.detach().reshape(m, d) for p in live], grad)
            if self.method == "svgd":
                svgd_update_(theta, grad, out, self.alpha, self.stepsize, self.bandwidth, grad_scale=inv_scale)
            else:
                key = str(theta.device)
                if key not in generators:
                    generators[key] = self._generator(theta.device)
                spos_update_(
                    theta, grad, out, self.alpha, self.stepsize, self.beta, self.bandwidth,
                    generator=generators[key], noise_scale=self.noise_scale, grad_scale=inv_scale,
                )
            for p, new in zip(live, out.unbind(0)):
                overrides[id(p)] = new.view(p.shape)
        return overrides

    # ------------------------------------------------------------------ FairseqOptimizer API
    @property
    def supports_step_with_scale(self):
        return True

    @property
    def supports_flat_params(self):
        return False

    @property
    def supports_memory_efficient_fp16(self):
        return True

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        # fairseq's AMPOptimizer unscales this optimizer's gradients right before calling this
        self._unscaled_since_step = True
        return super().clip_grad_norm(max_norm, aggregate_norm_fn)

    def step(self, closure=None, scale=1.0, groups=None):
        """Transform the particle gradients (true gradient, fp32) and take one Adam step."""
        unscaled = self._unscaled_since_step
        self._unscaled_since_step = False
        grad_scale = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler.step (--amp)
        if grad_scale is not None:
            found_inf = getattr(self, "found_inf", None)
            if found_inf is not None and bool(found_inf.sum() > 0):
                return None  # overflow: GradScaler skips the step and lowers the scale
            if not unscaled:
                scale = scale * grad_scale
        inv_scale = None
        if torch.is_tensor(scale) or scale != 1.0:
            inv_scale = 1.0 / scale
        overrides = self.particle_gradients(inv_scale)
        return self.optimizer.step(closure, grad_overrides=overrides, inv_scale=inv_scale)
