"""fairseq's language models with observable heads: ``--arch diverse_transformer_lm*`` and ``diverse_roberta*``.

Each is the stock model (``transformer_lm``, ``roberta``: same parameter names, so stock checkpoints load, same
initialisation and, with no method on, the same outputs) whose attention modules are
:class:`~diverse_fairseq.methods.attention.DiverseMultiheadAttention`, built by the layers of
:mod:`diverse_fairseq.methods.transformer`. Every stock architecture ``X`` of the two models has a
``diverse_X`` here with exactly its sizes (``diverse_transformer_lm_gpt``, ``diverse_roberta_base``, ...).

Attention types (:mod:`diverse_fairseq.methods.sites`): a language model's causal self-attention is ``dec_self``
(over the target tokens), RoBERTa's bidirectional self-attention ``enc_self`` (over the source tokens). So the
methods apply as in translation: disagreement regularization (Li et al., EMNLP 2018) through
``cross_entropy_with_disagreement`` / ``sentence_prediction_with_disagreement``; routing-by-agreement (Li et al.,
NAACL 2019) through ``--routing-decoder-layers`` (LM) or ``--routing-encoder-layers`` (RoBERTa); repulsive
attention (An et al., EMNLP 2020, who apply it to ELECTRA-style pre-training and to classification) through
``--optimizer repulsive_adam``, which also works on the stock models.
"""

import dataclasses

import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from torch import nn

from diverse_fairseq.methods.routing.options import DECODER_ROUTING, ENCODER_ROUTING, add_routing_args, routing_plan
from diverse_fairseq.methods.transformer import (
    DiverseTransformerDecoder,
    DiverseTransformerEncoder,
    as_namespace,
    install_routing,
)


@register_model("diverse_transformer_lm")
class DiverseTransformerLanguageModel(TransformerLanguageModel):
    """fairseq's ``transformer_lm`` built from :class:`DiverseMultiheadAttention` modules, optionally with
    routing-by-agreement in chosen decoder self-attention layers (``--routing-decoder-layers``)."""

    @classmethod
    def add_args(cls, parser):
        # the stock model's options as fairseq adds them, then the routing ones (registered without a dataclass,
        # so that the options outside TransformerLanguageModelConfig reach build_model)
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_routing_args(parser, DECODER_ROUTING)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # its architecture function has set the sizes
        plan = routing_plan(args, DECODER_ROUTING)  # validated before the model is built
        # fairseq's build_model hard-codes its decoder class (and builds the character / adaptive input
        # embeddings): let it build the stock model, then the same decoder with diverse layers on the meta device
        # (no memory, no random draws), which takes the stock decoder's tensors: the stock initialisation, and
        # the start-up time and memory of one model
        stock = super().build_model(args, task)
        with torch.device("meta"):
            decoder = DiverseTransformerDecoder(TransformerConfig.from_namespace(args), task.target_dictionary,
                                                stock.decoder.embed_tokens, no_encoder_attn=True)
        take_tensors(decoder, stock.decoder)
        model = cls(decoder)
        install_routing(model, plan)
        return model


def _own_tensors(module: nn.Module):
    """A module's own tensors: its parameters, its buffers (non-persistent ones included) and its tensor
    attributes (e.g. the decoder's ``_future_mask``)."""
    return module._parameters, module._buffers, {k: v for k, v in vars(module).items() if isinstance(v, torch.Tensor)}


def _layout(module: nn.Module):
    """A module's own tensors by name: shape and dtype, or ``None`` (``Linear(bias=False)``'s bias)."""
    return [{key: t if t is None else (t.shape, t.dtype) for key, t in tensors.items()}
            for tensors in _own_tensors(module)]


def take_tensors(target: nn.Module, source: nn.Module) -> None:
    """Give ``target``, built on the meta device, the tensors of ``source``, a module of the same structure: the
    tensors themselves, not copies, so that ties (a shared output projection) are kept."""
    sources = dict(source.named_modules(remove_duplicate=False))
    targets = dict(target.named_modules(remove_duplicate=False))
    for name in sources.keys() | targets.keys():
        module, other = targets.get(name), sources.get(name)
        if module is None or other is None or _layout(module) != _layout(other):
            raise ValueError(f"{type(target).__name__}: module {name or '(top)'} does not match "
                             f"{type(source).__name__}'s; cannot take its tensors")
        parameters, buffers, attributes = _own_tensors(other)
        module._parameters.update(parameters)
        module._buffers.update(buffers)
        module.__dict__.update(attributes)
    left = [f"{name}.{key}" for name, module in target.named_modules()
            for tensors in _own_tensors(module) for key, t in tensors.items() if t is not None and t.is_meta]
    if left:
        raise ValueError(f"{type(target).__name__}: tensors still on the meta device: {', '.join(left)}")


class DiverseRobertaEncoder(RobertaEncoder):
    """RoBERTa's encoder whose sentence encoder has :class:`DiverseMultiheadAttention` self-attention."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = DiverseTransformerEncoder(TransformerConfig.from_namespace(args), dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


@register_model("diverse_roberta")
class DiverseRobertaModel(RobertaModel):
    """fairseq's ``roberta`` built from :class:`DiverseMultiheadAttention` modules, optionally with
    routing-by-agreement in chosen encoder self-attention layers (``--routing-encoder-layers``)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_routing_args(parser, ENCODER_ROUTING)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)
        roberta_base_architecture(args)
        plan = routing_plan(args, ENCODER_ROUTING)
        if getattr(args, "max_positions", None) is None:  # as RobertaModel.build_model
            args.max_positions = getattr(args, "tokens_per_sample", None) or task.max_positions()
        model = cls(args, DiverseRobertaEncoder(args, task.source_dictionary))
        install_routing(model, plan)
        return model


def transformer_lm_defaults(args):
    """``--arch transformer_lm``'s sizes: its architecture function is a no-op, its dataclass holds the defaults
    (which differ from ``base_lm_architecture``'s: post-norm, ``decoder_input_dim`` 512 whatever the width)."""
    for f in dataclasses.fields(TransformerLanguageModelConfig):
        if getattr(args, f.name, None) is None and not str(f.default).startswith("${"):
            setattr(args, f.name, f.default)


# every stock architecture X of the two models as diverse_X, with exactly its sizes
for _arch, _model in list(ARCH_MODEL_REGISTRY.items()):
    _name = {TransformerLanguageModel: "diverse_transformer_lm", RobertaModel: "diverse_roberta"}.get(_model)
    if _name is not None:
        _set = transformer_lm_defaults if _arch == "transformer_lm" else ARCH_CONFIG_REGISTRY[_arch]
        register_model_architecture(_name, f"diverse_{_arch}")(_set)
