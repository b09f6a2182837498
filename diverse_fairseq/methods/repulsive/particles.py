"""Which parameters are particles: per-head row blocks of the q/k/v projections of attention modules.

An et al. (EMNLP 2020), as in the authors' code: for each chosen attention module and each of W_Q, W_K,
W_V ([out, in] layout), particle i is the row block W[i·d:(i+1)·d, :], so a weight viewed as [H, d·in]
holds its M = H particles.

How the optimizer finds them (fairseq hands ``build_optimizer(cfg, params)`` only parameters):

1. **Models are tracked when they are built**, by the one hook in :mod:`diverse_fairseq.methods.hooks`
   (which says why and what it wraps); models built some other way can be registered with its
   :func:`~diverse_fairseq.methods.hooks.track_model`.
   A ``torch.compile`` wrapper (``OptimizedModule``) needs nothing more: its ``_orig_mod`` is a submodule.
2. **Attention modules are the model's attention sites, found at optimizer construction**
   (:func:`diverse_fairseq.methods.sites.attention_sites`: stock ``MultiheadAttention`` and
   ``DiverseMultiheadAttention`` alike, from the module structure). No parameter names are used,
   so DDP/FSDP/checkpoint wrappers (which change names) do not matter. Doing this at optimizer
   construction (not at model construction) sees the model as the trainer finally holds it, after
   ``.half()``, quantization or any replacement of modules.
3. **Parameters are matched by identity**, which covers fp32, ``--memory-efficient-fp16``, ``--amp``
   and ``--bf16 --memory-efficient-bf16``: there the optimizer receives the model's own Parameter
   objects. Under ``--fp16 --fp16-no-flatten-grads`` (and ``--bf16``) fairseq's ``FP16Optimizer``
   builds fresh fp32 master copies (``build_fp32_params`` keeps only ``expert``, ``param_group`` and
   ``optim_overrides`` attributes, so tags set on the model's parameters would be lost). Those copies
   come in the trainer's order, i.e. the model's ``requires_grad`` parameters first; they are matched
   **by position**, and each matched particle weight is checked to be value-identical to its model
   parameter (the copy was just made from it), so a wrong model can never be picked silently.
"""

from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple

import torch
from torch import nn

from diverse_fairseq.methods.hooks import tracked_models
from diverse_fairseq.methods.sites import attention_sites

PROJECTIONS = ("q", "k", "v")


@dataclass(frozen=True)
class ParticleTag:
    """Where a particle set lives: one q/k/v projection weight of one attention module."""

    attention_type: str  # "enc_self" | "dec_self" | "enc_dec"
    layer_idx: int  # 0-based layer of that attention type
    projection: str  # "q" | "k" | "v"
    num_heads: int  # M: the weight's rows split into M blocks of d = rows / M


def particle_weights(model: nn.Module) -> Iterator[Tuple[torch.Tensor, ParticleTag]]:
    """Every q/k/v projection weight of every attention module of ``model`` with its tag."""
    try:
        sites = attention_sites(model)
    except ValueError:  # not a fairseq Transformer model (no attention sites): no particles
        return
    for site in sites:
        module, attention_type, layer_idx = site.module, site.attention_type, site.layer
        num_heads = int(module.num_heads)
        for projection in PROJECTIONS:
            proj = getattr(module, f"{projection}_proj", None)
            weight = getattr(proj, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                continue
            if weight.shape[0] % num_heads != 0:
                raise ValueError(
                    f"{attention_type} layer {layer_idx}: {projection}_proj has {weight.shape[0]} rows, "
                    f"not divisible by its {num_heads} heads"
                )
            yield weight, ParticleTag(attention_type, layer_idx, projection, num_heads)


def _match_by_identity(params: Sequence[torch.Tensor], models: Iterable[nn.Module]) -> Dict[int, ParticleTag]:
    index = {id(p): i for i, p in enumerate(params)}
    tags: Dict[int, ParticleTag] = {}
    for model in models:
        for weight, tag in particle_weights(model):
            i = index.get(id(weight))
            if i is not None:
                tags.setdefault(i, tag)
    return tags


def _match_by_position(params: Sequence[torch.Tensor], model: nn.Module) -> Optional[Dict[int, ParticleTag]]:
    """Tags for master copies of ``model``'s parameters (same order), or None if they are not."""
    own = [p for p in model.parameters() if p.requires_grad]
    if not own or len(own) > len(params):
        return None
    if any(a.shape != b.shape for a, b in zip(own, params)):
        return None
    position = {id(p): i for i, p in enumerate(own)}
    tags: Dict[int, ParticleTag] = {}
    for weight, tag in particle_weights(model):
        i = position.get(id(weight))
        if i is None:
            continue
        copy = params[i]
        if not torch.equal(copy.detach(), weight.detach().to(device=copy.device, dtype=copy.dtype)):
            return None
        tags.setdefault(i, tag)
    return tags


def find_particle_tags(params: Sequence[torch.Tensor]) -> Dict[int, ParticleTag]:
    """``{index in params: tag}`` for the parameters that are q/k/v weights of a tracked model."""
    models = tracked_models()
    tags = _match_by_identity(params, models)
    if tags:
        return tags
    candidates = [t for t in (_match_by_position(params, model) for model in models) if t]
    if not candidates:
        return {}
    if any(c != candidates[0] for c in candidates[1:]):
        raise RuntimeError(
            "repulsive_adam: the optimizer's parameters are copies that match several live models "
            "with different attention layouts; cannot tell which one is being trained"
        )
    return candidates[0]
