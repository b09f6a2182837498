"""Attention sites: the one way every feature finds "the attention of type T in layer L" of a model.

A site is (attention type, 0-based layer, module). The disagreement criterion asks for the sites it
regularizes, routing for the sites it aggregates, the repulsive optimizer for the sites whose q/k/v
weights are particles, the analysis for the sites it scores and ablates. Sites are found from the
module structure of any fairseq Transformer model, never from parameter names::

    <model>.encoder.layers[i].self_attn                   -> ("enc_self", i)
    <model>.encoder.sentence_encoder.layers[i].self_attn  -> ("enc_self", i)   RoBERTa
    <model>.decoder.layers[i].self_attn                   -> ("dec_self", i)   also transformer_lm
    <model>.decoder.layers[i].encoder_attn                -> ("enc_dec", i)

so a language model (``transformer_lm``: a decoder without cross-attention) has only dec_self sites, whose
queries and keys are the target tokens, and RoBERTa only enc_self sites, over the source tokens.

also through distributed wrappers (``.module``), activation-checkpoint / FSDP layer wrappers and nested
encoder-decoder models. Stock ``MultiheadAttention`` modules are sites too (the repulsive optimizer only
needs their weights); what needs the heads themselves asks :func:`require_diverse`.

:func:`observe` is the one hook of the package into the attention forward: for the duration of a
``with`` block it hands each chosen ``DiverseMultiheadAttention`` an :class:`HeadObserver` that records the
per-head tensors V [B,H,S,d], A [B,H,T,S] and O [B,H,T,d] and may mask heads; the caller gets the
recorded tensors back from the yielded object, and nothing stays on the modules after the block.
"""

import contextlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor, nn

from diverse_fairseq.methods.options import LayerSpec, resolve_layers

#: attention types in the order of a Transformer: encoder self, decoder self, encoder-decoder
ATTENTION_TYPES = ("enc_self", "dec_self", "enc_dec")
#: (stack, attribute of its layers) holding each attention type
_PLACES = {"enc_self": ("encoder", "self_attn"), "dec_self": ("decoder", "self_attn"),
           "enc_dec": ("decoder", "encoder_attn")}
#: (query tokens, key tokens) of each attention type
TOKEN_SIDES = {"enc_self": ("source", "source"), "dec_self": ("target", "target"), "enc_dec": ("target", "source")}
TAP_NAMES = frozenset({"v", "a", "o"})


def token_side(attention_type: str, term: str) -> str:
    """``"source"`` or ``"target"``: the tokens over which disagreement term ``term`` of ``attention_type`` runs.

    ``sub`` compares the projected values V [B, H, S, d], one per **key** token; ``pos`` the rows of
    A [B, H, T, S] and ``out`` the head outputs O [B, H, T, d], one per **query** token (EMNLP 2018 Eqs. 1-3).
    So encoder self-attention runs over source tokens, decoder self-attention over target tokens, and
    encoder-decoder attention over the source for ``sub``, the target for ``pos`` and ``out``. The criterion
    (its padding masks) and the reported scores both ask here."""
    query, key = TOKEN_SIDES[attention_type]
    return key if term == "sub" else query


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model: its type, 0-based layer (within its stack) and the module (compared
    and hashed by identity, so two calls of :func:`attention_sites` give equal sites)."""

    attention_type: str
    layer: int
    module: MultiheadAttention

    @property
    def key(self) -> Tuple[str, int]:
        return (self.attention_type, self.layer)

    @property
    def name(self) -> str:
        """``enc_self/1`` (1-based layer, as the reports print it)."""
        return f"{self.attention_type}/{self.layer + 1}"

    @property
    def num_heads(self) -> int:
        return self.module.num_heads


def unwrap(model: nn.Module) -> nn.Module:
    """The model under fairseq's distributed / proxy wrappers (``.module``) and ``torch.compile`` (``._orig_mod``).

    (Heads of a compiled model are still refused when observed: see ``DiverseMultiheadAttention.forward``.)"""
    while not _owners(model):
        inner = getattr(model, "module", None)
        inner = inner if isinstance(inner, nn.Module) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _stack(owner: nn.Module, side: str) -> Optional[nn.Module]:
    """``owner.<side>`` ("encoder" / "decoder") if it has ``layers``; else RoBERTa's
    ``owner.encoder.sentence_encoder``."""
    stack = owner._modules.get(side)
    if stack is not None and not isinstance(getattr(stack, "layers", None), (nn.ModuleList, list, tuple)):
        stack = stack._modules.get("sentence_encoder")
    return stack if isinstance(getattr(stack, "layers", None), (nn.ModuleList, list, tuple)) else None


def _owners(model: nn.Module) -> List[nn.Module]:
    """Modules with an encoder or decoder stack (:func:`_stack`): the model, or nested models."""
    return [m for m in model.modules() if any(_stack(m, side) is not None for side in ("encoder", "decoder"))]


def _in_layer(layer: nn.Module, attr: str) -> Optional[MultiheadAttention]:
    """``layer.<attr>``, also when the layer sits inside an activation-checkpoint or FSDP wrapper."""
    for sub in layer.modules():
        mha = getattr(sub, attr, None)
        if isinstance(mha, MultiheadAttention):
            return mha
    return None


def attention_sites(model: nn.Module) -> List[AttentionSite]:
    """Every attention site of ``model``: all enc_self layers, then dec_self, then enc_dec.

    Raises ``ValueError`` when the model has none (not a fairseq Transformer model)."""
    model = unwrap(model)
    sites: List[AttentionSite] = []
    for attention_type, (side, attr) in _PLACES.items():
        for owner in _owners(model):
            for idx, layer in enumerate(getattr(_stack(owner, side), "layers", None) or []):
                mha = _in_layer(layer, attr)
                if mha is not None:
                    sites.append(AttentionSite(attention_type, idx, mha))
    if not sites:
        raise ValueError(f"no attention modules found in {type(model).__name__}: expected a fairseq Transformer "
                         "model (encoder[.sentence_encoder].layers[i].self_attn, decoder.layers[i].self_attn / "
                         ".encoder_attn)")
    return sites


def select_sites(model: nn.Module, attention_types: Sequence[str], layers: LayerSpec, types_flag: str,
                 layers_flag: str) -> List[AttentionSite]:
    """The sites of the given attention types in the layers ``layers`` selects (see
    :func:`~diverse_fairseq.methods.options.parse_layer_spec`); each type's depth bounds the indices.
    An attention type the model lacks is a ``ValueError`` naming ``types_flag``, an index out of range one
    naming ``layers_flag``."""
    sites = attention_sites(model)
    chosen: List[AttentionSite] = []
    for attention_type in attention_types:
        of_type = [s for s in sites if s.attention_type == attention_type]
        if not of_type:
            have = sorted({s.attention_type for s in sites}, key=ATTENTION_TYPES.index)
            raise ValueError(f"{types_flag} {attention_type}: the model has no such attention modules "
                             f"(it has {', '.join(have)})")
        depth = max(s.layer for s in of_type) + 1
        wanted = resolve_layers(layers, depth, layers_flag, f" of {attention_type} attention")
        chosen += [s for s in of_type if s.layer in wanted]
    return chosen


def require_diverse(sites: Iterable[AttentionSite], what: str) -> None:
    """``ValueError`` unless every site's module can expose its heads (a ``DiverseMultiheadAttention``)."""
    from diverse_fairseq.methods.attention import DiverseMultiheadAttention

    for site in sites:
        if not isinstance(site.module, DiverseMultiheadAttention):
            raise ValueError(f"{what} needs a model whose attention modules expose their heads (--arch "
                             f"diverse_transformer*, diverse_transformer_lm*, diverse_roberta*); its "
                             f"{site.attention_type} attention is a {type(site.module).__name__}")


def uses_activation_checkpointing(model: nn.Module) -> bool:
    """True when layers run under ``--checkpoint-activations`` (fairseq's wrapper: first forward without a graph)."""
    return any(hasattr(m, "precheckpoint_forward") for m in unwrap(model).modules())


@dataclass
class HeadObserver:
    """What one attention module records (``taps``) and masks (``head_mask`` [H], multiplied into O) in an
    :func:`observe` block; ``heads`` fills with ``{tap: tensor}`` at each forward (the last one wins)."""

    taps: frozenset
    head_mask: Optional[Tensor] = None
    heads: Dict[str, Tensor] = field(default_factory=dict)

    def record(self, tap: str, value: Tensor) -> None:
        if tap in self.taps:
            self.heads[tap] = value


class Observation:
    """The yield of :func:`observe`: ``heads(site)`` is ``{tap: tensor}`` from the block's last forward."""

    def __init__(self, observers: Mapping[AttentionSite, HeadObserver]):
        self._observers = observers

    def heads(self, site: AttentionSite) -> Dict[str, Tensor]:
        return self._observers[site].heads

    def mask_head(self, site: Optional[AttentionSite] = None, head: int = 0) -> None:
        """Clear every head mask, then (if ``site`` is given) zero head ``head`` of that site (ablation)."""
        for observer in self._observers.values():
            observer.head_mask = None
        if site is not None:
            if not 0 <= head < site.num_heads:
                raise IndexError(f"head {head} out of range for {site.name} with {site.num_heads} heads")
            mask = torch.ones(site.num_heads)
            mask[head] = 0.0
            self._observers[site].head_mask = mask


@contextlib.contextmanager
def observe(sites: Iterable[AttentionSite], taps: Iterable[str] = ()) -> Iterator[Observation]:
    """Record ``taps`` (a subset of {"v", "a", "o"}) of every site within the block; the yielded
    :class:`Observation` also masks heads (:meth:`Observation.mask_head`, used by the ablation).

    Recording or masking sends the forward through the module's own path (fused ``scaled_dot_product_attention``
    unless A is recorded); the observers are removed on exit, also after an exception. Under a grad-enabled
    forward with activation checkpointing the first forward runs without a graph, so recording is refused by the
    callers that need gradients (:func:`uses_activation_checkpointing`).
    """
    sites = list(sites)
    taps = frozenset(taps)
    if taps - TAP_NAMES:
        raise ValueError(f"unknown attention taps {sorted(taps - TAP_NAMES)}; choose from {sorted(TAP_NAMES)}")
    require_diverse(sites, "observing attention heads")
    observers = {s: HeadObserver(taps) for s in sites}
    busy = [s.name for s in sites if s.module.observer is not None]
    if busy:
        raise RuntimeError(f"attention modules {busy} are already observed (nested observe blocks)")
    try:
        for site, observer in observers.items():
            site.module.observer = observer
        yield Observation(observers)
    finally:
        for site in sites:
            site.module.observer = None
