"""The Transformer whose attention modules expose their heads: ``--arch diverse_transformer*``.

Identical to fairseq's legacy ``transformer`` (same parameter names, initialisation and outputs) except
that every attention module is a :class:`~diverse_fairseq.methods.attention.DiverseMultiheadAttention`,
whose heads the disagreement criterion (Li et al. EMNLP 2018) and the analysis can observe; every feature
finds them through :mod:`diverse_fairseq.methods.sites`. Not observed and without aggregators it trains
exactly like ``transformer``.

Routing-by-agreement (Li et al., NAACL 2019, §3-4): the ``--routing-*`` options replace concatenation +
W_O of chosen attention modules by a :class:`~diverse_fairseq.methods.routing.aggregation.RoutingAggregation`
(vote network + simple or EM routing). None are routed by default; the ``routing_transformer_*``
architectures route the encoder self-attention of layers 0 and 1 with EM routing, the paper's
"Effective Aggregation" (NAACL 2019 Table 3, journal Table 5).
"""

from argparse import Namespace
from typing import Dict, List, Optional, Tuple

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.models.transformer.transformer_legacy import (
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from diverse_fairseq.methods.attention import DiverseMultiheadAttention
from diverse_fairseq.methods.routing.aggregation import RoutingAggregation
from diverse_fairseq.methods.routing.options import add_routing_args, routing_architecture, routing_plan
from diverse_fairseq.methods.scripting import inherited_as
from diverse_fairseq.methods.sites import attention_sites


def diverse_attention(layer, embed_dim, cfg, side, **kwargs) -> DiverseMultiheadAttention:
    """The attention module fairseq's layer builders make (heads of ``side``, ``cfg.encoder`` or ``cfg.decoder``;
    attention dropout; the layer's quant-noise), as a :class:`DiverseMultiheadAttention`."""
    kwargs.setdefault("xformers_att_config", side.xformers_att_config)
    return DiverseMultiheadAttention(embed_dim, side.attention_heads, dropout=cfg.attention_dropout,
                                     q_noise=layer.quant_noise, qn_block_size=layer.quant_noise_block_size, **kwargs)


def keep_dropout_names(module, name: str) -> None:
    """Name ``module``'s dropout modules ``name``, the name fairseq gives them in the stock class: fairseq's
    ``FairseqDropout`` takes its owner's class name, and ``--retain-dropout-modules`` matches that name, so that
    fairseq's names select our modules too (docs/fairseq-notes.md#retain-dropout-modules)."""
    for dropout in (module.dropout_module, getattr(module, "activation_dropout_module", None)):
        if dropout is not None:
            dropout.module_name = name


class DiverseTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with a :class:`DiverseMultiheadAttention` self-attention."""

    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        keep_dropout_names(self, "TransformerEncoderLayerBase")

    def build_self_attention(self, embed_dim, cfg):
        return diverse_attention(self, embed_dim, cfg, cfg.encoder, self_attention=True)


class DiverseTransformerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with :class:`DiverseMultiheadAttention` self- and cross-attention."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        keep_dropout_names(self, "TransformerDecoderLayerBase")

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """fairseq's forward. A routed encoder-decoder attention also gets the target padding (its query padding,
        which fairseq's layer does not pass it) for this call, so that its aggregator skips padded positions; the
        attention clears it when it reads it. (TorchScript-compatible: no ``super()``, ``*args`` or ``try``.)"""
        cross = self.encoder_attn
        if cross is not None and cross.aggregator is not None:
            cross.query_padding_mask = self_attn_padding_mask
        return self._stock_forward(x, encoder_out, encoder_padding_mask, incremental_state, prev_self_attn_state,
                                   prev_attn_state, self_attn_mask, self_attn_padding_mask, need_attn,
                                   need_head_weights)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return diverse_attention(self, embed_dim, cfg, cfg.decoder, add_bias_kv=add_bias_kv,
                                 add_zero_attn=add_zero_attn, self_attention=not cfg.cross_self_attention)

    def build_encoder_attention(self, embed_dim, cfg):
        return diverse_attention(self, embed_dim, cfg, cfg.decoder, kdim=cfg.encoder.embed_dim,
                                 vdim=cfg.encoder.embed_dim, encoder_decoder_attention=True,
                                 xformers_att_config=cfg.encoder.xformers_att_config)


#: fairseq's ``TransformerDecoderLayerBase.forward`` (TorchScript compiles no ``super()``)
DiverseTransformerDecoderLayer._stock_forward = inherited_as(TransformerDecoderLayerBase.forward, "_stock_forward",
                                                             DiverseTransformerDecoderLayer)


def as_namespace(args):
    """``args`` as an ``argparse.Namespace``: under fairseq-hydra-train the model config is a DictConfig, whose
    extra options TransformerConfig.from_namespace would silently drop (docs/fairseq-notes.md#fairseq-hydra-train)."""
    return Namespace(**OmegaConf.to_container(args, resolve=True)) if isinstance(args, DictConfig) else args


def install_routing(model, plan: Dict[Tuple[str, int], dict]) -> None:
    """Give each attention module of ``model`` named in ``plan`` (``{(attention_type, layer): kwargs}``, see
    :func:`routing_plan`) a routing aggregator in place of its ``out_proj`` (NAACL 2019 §4)."""
    if plan and any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()):
        raise ValueError("routing (--routing-*) cannot be combined with --ddp-backend fully_sharded")
    found = set()
    for site in attention_sites(model):
        if site.key in plan:
            mha = site.module
            mha.set_aggregator(RoutingAggregation(embed_dim=mha.embed_dim, num_heads=mha.num_heads, **plan[site.key]))
            found.add(site.key)
    missing = set(plan) - found
    if missing:  # e.g. --no-cross-attention with --routing-encoder-decoder-layers
        raise ValueError(f"routing: no attention module for {sorted(missing)} in the built model")


def _wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping exactly as fairseq's ``build_*_layer``."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class DiverseTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder with :class:`DiverseTransformerEncoderLayer` layers."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        keep_dropout_names(self, "TransformerEncoder")

    def build_encoder_layer(self, cfg):
        return _wrap_layer(DiverseTransformerEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class DiverseTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder with :class:`DiverseTransformerDecoderLayer` layers."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        keep_dropout_names(self, "TransformerDecoder")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(DiverseTransformerDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("diverse_transformer")
class DiverseTransformerModel(TransformerModel):
    """fairseq's ``transformer`` built from :class:`DiverseMultiheadAttention` modules, optionally with
    routing-by-agreement aggregation (NAACL 2019) in chosen attention modules (``--routing-*``)."""

    @classmethod
    def add_args(cls, parser):
        """fairseq's Transformer options plus the routing-by-agreement options
        (:func:`~diverse_fairseq.methods.routing.options.add_routing_args`)."""
        super().add_args(parser)
        add_routing_args(parser)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)
        base_architecture(args)  # layer counts and widths, as TransformerModel.build_model does first
        plan = routing_plan(args)  # validated before the model is built
        model = super().build_model(args, task)
        model.install_routing(plan)
        return model

    def install_routing(self, plan: Dict[Tuple[str, int], dict]) -> None:
        """:func:`install_routing` on this model."""
        install_routing(self, plan)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return DiverseTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return DiverseTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


# ---------------------------------------------------------------------------------- architectures
# Each sets no defaults of its own beyond fairseq's and calls the stock architecture function, so that
# ``diverse_transformer_X`` has exactly the sizes of ``transformer_X``.


@register_model_architecture("diverse_transformer", "diverse_transformer")
def diverse_base_architecture(args):
    """Transformer-base sizes (512 dim, 8 heads, 6+6 layers, FFN 2048)."""
    base_architecture(args)


@register_model_architecture("diverse_transformer", "diverse_transformer_iwslt_de_en")
def diverse_transformer_iwslt_de_en(args):
    """IWSLT Transformer-small (512 dim, 4 heads, 6+6 layers, FFN 1024): EMNLP 2020 IWSLT14 setting."""
    transformer_iwslt_de_en(args)


@register_model_architecture("diverse_transformer", "diverse_transformer_wmt_en_de")
def diverse_transformer_wmt_en_de(args):
    """Transformer-base (512 dim, 8 heads): the papers' WMT14 En⇒De / WMT17 Zh⇒En base setting."""
    transformer_wmt_en_de(args)


@register_model_architecture("diverse_transformer", "diverse_transformer_vaswani_wmt_en_de_big")
def diverse_transformer_vaswani_wmt_en_de_big(args):
    """Transformer-big (1024 dim, 16 heads, FFN 4096; fairseq's architecture default dropout 0.3, which the
    ``big`` setting lowers to the journal's 0.1): the papers' big model."""
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("diverse_transformer", "diverse_transformer_wmt_en_de_big")
def diverse_transformer_wmt_en_de_big(args):
    """Transformer-big with attention dropout 0.1 (fairseq's ``transformer_wmt_en_de_big``)."""
    transformer_wmt_en_de_big(args)


@register_model_architecture("diverse_transformer", "diverse_transformer_wmt_en_de_big_8heads")
def diverse_transformer_wmt_en_de_big_8heads(args):
    """Transformer-big with 8 heads per attention (journal version, Table 6)."""
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 8)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 8)
    transformer_vaswani_wmt_en_de_big(args)


# Routing-by-agreement, the paper's "Effective Aggregation" (NAACL 2019 Table 3 / journal Table 5): EM
# routing, 3 iterations, N = E capsules, in the encoder self-attention of the lowest two layers. Each
# sets these defaults (a command line or config still overrides them) and calls the diverse architecture.


@register_model_architecture("diverse_transformer", "routing_transformer_iwslt_de_en")
def routing_transformer_iwslt_de_en(args):
    """Transformer-small (IWSLT) with Effective Aggregation."""
    routing_architecture(args)
    diverse_transformer_iwslt_de_en(args)


@register_model_architecture("diverse_transformer", "routing_transformer_wmt_en_de")
def routing_transformer_wmt_en_de(args):
    """Transformer-base with Effective Aggregation: the NAACL 2019 / journal WMT14 En⇒De base setting."""
    routing_architecture(args)
    diverse_transformer_wmt_en_de(args)


@register_model_architecture("diverse_transformer", "routing_transformer_vaswani_wmt_en_de_big")
def routing_transformer_vaswani_wmt_en_de_big(args):
    """Transformer-big with Effective Aggregation (journal Table 5, big)."""
    routing_architecture(args)
    diverse_transformer_vaswani_wmt_en_de_big(args)
