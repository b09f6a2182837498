"""Find a translation model's attention modules and let them be observed and head-masked, stock ones too.

The analysis needs, per attention module, the per-head tensors V, A, O and the ability to mask
one head's output O_h before the heads are combined (head ablation, Michel et al. 2019, as used in EMNLP
2020 Figure 2). :class:`~diverse_fairseq.modules.diverse_attention.DiverseMultiheadAttention` already taps
V/A/O and combines heads in one place (``combine_heads``). :func:`instrument` therefore temporarily turns
every attention module, whether fairseq's stock ``MultiheadAttention`` (``--arch transformer``) or a
``DiverseMultiheadAttention`` (possibly with a routing aggregator), into a subclass of its diverse class that
multiplies O by a per-head mask before ``combine_heads``; on exit the original classes and attributes are
restored. Modules are found structurally (``encoder.layers[i].self_attn``, ``decoder.layers[i].self_attn``
and ``.encoder_attn``), never by parameter names.
"""

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional

import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor, nn

from ..modules.diverse_attention import TAP_NAMES, DiverseMultiheadAttention

#: the attribute holding each attention type inside an encoder / decoder layer
_LAYER_ATTRS = (("encoder", "self_attn", "enc_self"), ("decoder", "self_attn", "dec_self"),
                ("decoder", "encoder_attn", "enc_dec"))


@dataclass
class AttentionSite:
    """One attention module of the model: its type, 0-based layer and the module itself."""

    attention_type: str
    layer: int
    module: MultiheadAttention

    @property
    def num_heads(self) -> int:
        return self.module.num_heads

    @property
    def name(self) -> str:
        return f"{self.attention_type}/{self.layer + 1}"


def _find_in_layer(layer: nn.Module, attr: str) -> Optional[MultiheadAttention]:
    """``layer.<attr>``, also when the layer sits inside an activation-checkpoint or FSDP wrapper."""
    for sub in layer.modules():
        mha = getattr(sub, attr, None)
        if isinstance(mha, MultiheadAttention):
            return mha
    return None


def attention_sites(model: nn.Module) -> List[AttentionSite]:
    """All attention modules of an encoder-decoder model: encoder self, decoder self, encoder-decoder."""
    sites: List[AttentionSite] = []
    for part, attr, attention_type in _LAYER_ATTRS:
        stack = getattr(model, part, None)
        for idx, layer in enumerate(getattr(stack, "layers", None) or []):
            mha = _find_in_layer(layer, attr)
            if mha is not None:
                sites.append(AttentionSite(attention_type, idx, mha))
    if not sites:
        raise ValueError(f"no attention modules found in {type(model).__name__}: expected a fairseq "
                         "encoder-decoder model with encoder.layers / decoder.layers")
    return sites


class _HeadMaskMixin:
    """Multiplies the head outputs O ``[B, H, T, d]`` by ``head_mask`` ``[H]`` before ``combine_heads``.

    Vectorised over heads: masking head h (mask 0 at h) removes exactly that head's block of the
    concatenation that ``out_proj`` (or a routing aggregator) sees.
    """

    head_mask: Optional[Tensor]

    def combine_heads(self, o: Tensor) -> Tensor:
        if self.head_mask is not None:
            o = o * self.head_mask.to(dtype=o.dtype, device=o.device).view(1, -1, 1, 1)  # [B, H, T, d]
        return super().combine_heads(o)


_CLASSES: Dict[type, type] = {}


def _analysis_class(cls: type) -> type:
    if issubclass(cls, DiverseMultiheadAttention):
        base = cls
    elif cls is MultiheadAttention:
        base = DiverseMultiheadAttention
    else:
        raise TypeError(f"cannot analyse attention module of class {cls.__module__}.{cls.__name__}: only "
                        "fairseq's MultiheadAttention and DiverseMultiheadAttention (and its subclasses) are supported")
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Analysis{base.__name__}", (_HeadMaskMixin, base), {})
    return _CLASSES[base]


# attributes DiverseMultiheadAttention adds to fairseq's MultiheadAttention, with their neutral values
_DIVERSE_DEFAULTS = {"taps": frozenset(), "tapped": {}, "aggregator": None, "attention_type": None, "layer_idx": None}


@contextlib.contextmanager
def instrument(sites: Iterable[AttentionSite]) -> Iterator[List[AttentionSite]]:
    """Make the modules of ``sites`` tappable and head-maskable for the duration of the ``with`` block.

    Inside, set ``site.module.taps`` (see :func:`set_taps`) and ``site.module.head_mask``. A non-empty tap set
    routes the forward through ``DiverseMultiheadAttention``'s own path, which is where ``combine_heads``
    (and so the mask) applies; fairseq's fused path would bypass it. Classes, taps and added attributes are
    restored on exit, also after an exception.
    """
    sites = list(sites)
    saved = []
    try:
        for site in sites:
            module = site.module
            added = [k for k in _DIVERSE_DEFAULTS if not hasattr(module, k)]  # (an aggregator lives in _modules)
            saved.append((module, module.__class__, added, getattr(module, "taps", None)))
            for key in added:
                value = _DIVERSE_DEFAULTS[key]
                setattr(module, key, dict(value) if isinstance(value, dict) else value)
            module.__class__ = _analysis_class(module.__class__)
            module.head_mask = None
            if module.attention_type is None:
                module.attention_type, module.layer_idx = site.attention_type, site.layer
        yield sites
    finally:
        for module, cls, added, taps in reversed(saved):
            module.__class__ = cls
            module.__dict__.pop("head_mask", None)
            for key in added:
                module.__dict__.pop(key, None)
            if "taps" not in added:
                module.taps = taps
                module.tapped = {}


def set_taps(sites: Iterable[AttentionSite], taps: Iterable[str]) -> None:
    """Set the same taps (a subset of {"v", "a", "o"}, non-empty) on all instrumented modules."""
    taps = frozenset(taps)
    if not taps or taps - TAP_NAMES:
        raise ValueError(f"taps must be a non-empty subset of {sorted(TAP_NAMES)}, got {sorted(taps)}")
    for site in sites:
        site.module.set_taps(taps)


def set_head_mask(sites: Iterable[AttentionSite], masked: Optional[AttentionSite] = None, head: int = 0) -> None:
    """Clear all head masks, then (if ``masked`` is given) zero head ``head`` of that module."""
    for site in sites:
        site.module.head_mask = None
    if masked is not None:
        if not 0 <= head < masked.num_heads:
            raise IndexError(f"head {head} out of range for {masked.name} with {masked.num_heads} heads")
        mask = torch.ones(masked.num_heads)
        mask[head] = 0.0
        masked.module.head_mask = mask
