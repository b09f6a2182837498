"""``--optimizer repulsive_adam`` (repulsive attention, An et al., EMNLP 2020), the fairseq plugin.

Adam whose per-head Q/K/V gradients are replaced by SVGD, SPOS or (for the paper's comparison) SGLD. The
math is in :mod:`.svgd`, which parameters are particles in :mod:`.particles` (models are found through
:mod:`diverse_fairseq.methods.hooks`), the torch optimizer (transform, then Adam) in :mod:`.particle_adam`,
the fp16/bf16/AMP paths in :mod:`.precision`. Here: the options, their checks, the particle selection, and a
``step()`` that hands the true gradient scale to the torch optimizer. The options are checked here, once;
:mod:`.svgd` only asserts them.
"""

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from fairseq.optim.fairseq_optimizer import FairseqOptimizer
from omegaconf import II

from diverse_fairseq.methods.options import (
    ALL_LAYERS,
    attention_types_field,
    describe_layers,
    layers_field,
    parse_layer_spec,
    parse_names,
    resolve_layers,
)
from diverse_fairseq.methods.repulsive.particle_adam import OPTIMIZER_NAME, ParticleAdam, ParticleRule
from diverse_fairseq.methods.repulsive.particles import PROJECTIONS, ParticleTag, find_particle_tags
from diverse_fairseq.methods.repulsive.precision import AmpAwareStep, check_precision_setup, option
from diverse_fairseq.methods.repulsive.svgd import NOISE_SCALES, parse_bandwidth
from diverse_fairseq.methods.sites import ATTENTION_TYPES

logger = logging.getLogger(__name__)

METHODS = ("svgd", "spos", "sgld")
# the --repulsive-* options of the update rule that each method reads; setting another one (to a value other
# than its default) would do nothing, so it is refused
RULE_OPTIONS = ("alpha", "stepsize", "bandwidth", "beta", "noise_scale")
METHOD_OPTIONS = {
    "svgd": ("alpha", "stepsize", "bandwidth"),
    "spos": ("alpha", "stepsize", "bandwidth", "beta", "noise_scale"),
    "sgld": ("stepsize", "beta", "noise_scale"),
}


@dataclass
class RepulsiveAdamConfig(FairseqAdamConfig):
    repulsive_method: ChoiceEnum(METHODS) = field(
        default="svgd",
        metadata={"help": "particle-optimization rule for the attention heads: svgd (paper Eq. 4), "
                          "spos (Eq. 5, SVGD plus beta·g and Gaussian noise) or sgld (this project's definition "
                          "for the paper's comparison, Appendix C.1, which gives no formula: SPOS without the kernel "
                          "terms, i.e. each head's own beta·g plus the same noise, no repulsion; the authors' "
                          "trainer accepts sgld but trains it as plain Adam)"},
    )
    repulsive_alpha: float = field(
        default=0.01, metadata={"help": "svgd, spos: repulsive weight alpha in front of the kernel-gradient term"}
    )
    repulsive_stepsize: float = field(
        default=0.1,
        metadata={"help": "stepsize epsilon multiplying the particle update (the paper's value for both "
                          "translation tasks, Appendix B.2.3: 0.1; the authors' IWSLT script uses 0.01). "
                          "Adam is invariant to a constant factor on a gradient, so for svgd epsilon changes "
                          "nothing; it matters for spos (noise scale sqrt(2·beta/epsilon)) and, through the "
                          "product epsilon·beta, for sgld"},
    )
    repulsive_beta: float = field(
        default=1.0,
        metadata={"help": "spos, sgld: beta, which the paper's SPOS (Eq. 5) writes as beta^-1: adds "
                          "beta·g_i and noise -sqrt(2·beta/epsilon)·xi_i inside the update (sgld needs beta > 0). "
                          "Default 1, the authors' code (the paper gives no beta for translation)"},
    )
    repulsive_bandwidth: str = field(
        default="median",
        metadata={"help": "svgd, spos: RBF bandwidth: median (paper: h = med^2/ln M over distances between distinct "
                          "heads, kernel exp(-D^2/h)), authors (the authors' code: h = 0.5 · median of all "
                          "M^2 squared distances / ln(M+1), kernel exp(-D^2/2h), repulsive factor 1/h) or a "
                          "fixed positive number h (paper kernel)"},
    )
    repulsive_noise_scale: ChoiceEnum(NOISE_SCALES) = field(
        default="grad_median",
        metadata={"help": "spos, sgld: grad_median (default, the authors' code: the noise times the median |g| of "
                          "the particle set) or unit (the paper's formula as written; under Adam unit noise "
                          "swamps the gradient and the heads random-walk)"},
    )
    repulsive_attention: str = attention_types_field("whose heads are particles (all three, the default: every type "
                                                     "the model has)")
    repulsive_layers: Optional[str] = layers_field("whose heads are particles")
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


def _refuse_idle_options(cfg: RepulsiveAdamConfig, method: str) -> None:
    """Refuse the update-rule options that ``method`` does not read, where they differ from their defaults."""
    idle = []
    for name in RULE_OPTIONS:
        if name in METHOD_OPTIONS[method]:
            continue
        value = getattr(cfg, f"repulsive_{name}")
        default = RepulsiveAdamConfig.__dataclass_fields__[f"repulsive_{name}"].default
        if name == "bandwidth":
            value, default = parse_bandwidth(value), parse_bandwidth(default)
        elif name != "noise_scale":
            value, default = float(value), float(default)
        if str(value) != str(default):
            idle.append(f"--repulsive-{name.replace('_', '-')} {value}")
    if idle:
        users = {n: [m for m in METHODS if n in METHOD_OPTIONS[m]] for n in RULE_OPTIONS}
        raise ValueError(
            f"{', '.join(idle)} would do nothing with --repulsive-method {method} (it reads only "
            f"{', '.join('--repulsive-' + n.replace('_', '-') for n in METHOD_OPTIONS[method])}): drop the option"
            f"{'s' if len(idle) > 1 else ''}, or choose a method that uses it ("
            + "; ".join(f"--repulsive-{n.replace('_', '-')}: {', '.join(users[n])}" for n in RULE_OPTIONS
                        if n not in METHOD_OPTIONS[method]) + ")")


@register_optimizer(OPTIMIZER_NAME, dataclass=RepulsiveAdamConfig)
class RepulsiveAdam(AmpAwareStep, FairseqAdam):
    """Adam with repulsive (SVGD/SPOS) updates of attention heads (An et al., EMNLP 2020), or SGLD ones."""

    def __init__(self, cfg: RepulsiveAdamConfig, params):
        FairseqOptimizer.__init__(self, cfg)  # not FairseqAdam's: it would build its own torch optimizer
        check_precision_setup(cfg)
        params = list(params)
        self._optimizer = ParticleAdam(params, **self.optimizer_config)
        method = str(cfg.repulsive_method)
        if method not in METHODS:
            raise ValueError(f"--repulsive-method must be one of {', '.join(METHODS)}, got {method!r}")
        rule = ParticleRule(
            method=method, alpha=float(cfg.repulsive_alpha), stepsize=float(cfg.repulsive_stepsize),
            bandwidth=parse_bandwidth(cfg.repulsive_bandwidth), beta=float(cfg.repulsive_beta),
            noise_scale=str(cfg.repulsive_noise_scale), seed=int(option(cfg, "seed", 1)),
        )
        if not rule.alpha >= 0 or rule.alpha == float("inf"):
            raise ValueError(f"--repulsive-alpha must be a finite number >= 0 (0: no repulsive term), got "
                             f"{cfg.repulsive_alpha}")
        if not rule.stepsize > 0:
            raise ValueError(f"--repulsive-stepsize must be positive, got {rule.stepsize}")
        if method == "spos" and rule.beta < 0:
            raise ValueError(f"--repulsive-beta must be >= 0, got {rule.beta}")
        if method == "sgld" and not rule.beta > 0:
            raise ValueError(f"--repulsive-method sgld needs --repulsive-beta > 0 (with 0 the heads get neither "
                             f"gradient nor noise), got {cfg.repulsive_beta}")
        if rule.noise_scale not in NOISE_SCALES:
            raise ValueError(f"--repulsive-noise-scale must be one of {', '.join(NOISE_SCALES)}, got "
                             f"{rule.noise_scale!r}")
        _refuse_idle_options(cfg, method)
        self.attention_types = parse_names(cfg.repulsive_attention, ATTENTION_TYPES, "--repulsive-attention")
        self.projections = parse_names(cfg.repulsive_projections, PROJECTIONS, "--repulsive-projections")
        self.layers = parse_layer_spec(cfg.repulsive_layers, "--repulsive-layers", ALL_LAYERS)
        if not self.layers:
            raise ValueError(f"--optimizer {OPTIMIZER_NAME}: --repulsive-layers none selects no particles; choose "
                             "layers ('all' or indices), or train with --optimizer adam")
        self._optimizer.set_particles(self._select_particles(params), rule)
        per_type = Counter(t.attention_type for t in self.particle_tags)
        logger.info(
            f"{OPTIMIZER_NAME}: {method} on {len(self.particle_tags)} particle sets "
            f"({', '.join(f'{k}: {v}' for k, v in per_type.items())}; "
            f"M×D = {', '.join(f'{g.num_heads}×{g.dim}' for g in self.optimizer.particle_groups)}), "
            + ", ".join(f"{name}={getattr(rule, name)}" for name in METHOD_OPTIONS[method])
        )

    def _select_particles(self, params) -> List[tuple]:
        """``(weight, tag)`` of the q/k/v weights chosen by --repulsive-attention/-layers/-projections."""
        tags = find_particle_tags(params)
        depth = Counter()
        for tag in tags.values():
            depth[tag.attention_type] = max(depth[tag.attention_type], tag.layer_idx + 1)
        missing = [t for t in self.attention_types if t not in depth]
        if depth and missing and self.attention_types != ATTENTION_TYPES:  # all three (the default): those it has
            raise ValueError(f"--repulsive-attention {','.join(self.attention_types)}: the model has no "
                             f"{','.join(missing)} attention (it has {','.join(depth)}; a language model has "
                             "dec_self, RoBERTa enc_self)")
        chosen = {t: resolve_layers(self.layers, depth[t], "--repulsive-layers", f" of {t} attention")
                  for t in self.attention_types if t in depth}
        selected = [
            (params[i], tag) for i, tag in sorted(tags.items())
            if tag.attention_type in self.attention_types and tag.projection in self.projections
            and tag.layer_idx in chosen[tag.attention_type]
        ]
        if not selected:
            hint = (
                "no attention module was found in the model being trained (models are found when built through "
                "fairseq.models.build_model; register others with diverse_fairseq.methods.hooks.track_model)"
                if not tags
                else f"the {len(tags)} q/k/v weights found are all excluded by --repulsive-attention "
                     f"{','.join(self.attention_types)} / --repulsive-layers "
                     f"{describe_layers(self.layers)} / "
                     f"--repulsive-projections {','.join(self.projections)} (layers per type: {dict(depth)})"
            )
            raise ValueError(f"--optimizer {OPTIMIZER_NAME}: no particles to update: {hint}")
        return selected

    @property
    def particle_tags(self) -> List[ParticleTag]:
        return [t for g in self.optimizer.particle_groups for t in g.tags]

    @property
    def particle_params(self) -> List[torch.Tensor]:
        """The q/k/v weights whose gradients are transformed, in the order of ``particle_tags``."""
        return [p for g in self.optimizer.particle_groups for p in g.params]

    def particle_gradients(self, inv_scale=None):
        """:meth:`ParticleAdam.particle_gradients <.particle_adam.ParticleAdam.particle_gradients>`."""
        return self.optimizer.particle_gradients(inv_scale)

    def step(self, closure=None, scale=1.0, groups=None):
        """Transform the particle gradients (true gradient, fp32) and take one Adam step."""
        skip, inv_scale = self.true_gradient_factor(scale)
        if skip:
            return None
        return self.optimizer.step(closure, inv_scale=inv_scale)
