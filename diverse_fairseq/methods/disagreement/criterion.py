"""Disagreement regularization (Li et al., EMNLP 2018, §3.1: J = likelihood + λ·D, λ = 1) on top of three
fairseq criteria:

* ``--criterion label_smoothed_cross_entropy_with_disagreement`` (translation, ``--arch diverse_transformer*``);
* ``--criterion cross_entropy_with_disagreement`` (``--task language_modeling``, ``--arch diverse_transformer_lm*``:
  decoder self-attention ``dec_self`` over the target tokens);
* ``--criterion sentence_prediction_with_disagreement`` (``--task sentence_prediction``, ``--arch diverse_roberta*``:
  encoder self-attention ``enc_self`` over the source tokens; EMNLP 2020 applies its repulsive attention to
  such classification models too).

The training loss (a sum, as fairseq's) is ``base_loss + λ · sample_size · sim_total``
(docs/methods.md#disagreement-regularization). Each (term, type) value is the layer mean of each module's
masked token-mean head similarity (:mod:`diverse_fairseq.methods.disagreement.similarity`); ``sim_total`` adds,
for every selected term (sub, pos, out), the **encoder side** (its enc_self value) and the **decoder side**:
the *mean* of its selected types (dec_self, enc_dec), as the authors' Diversify-MHA ``models/transformer.py``
does (``reduce_mean([self, ecdc])``). So "all three attention types" weighs enc_self 1, dec_self ½, enc_dec ½.
``--disagreement-weighting sum`` instead sums every selected type with weight 1 (each decoder-side type then
weighs twice the authors' weight). Each active (term, type) value is logged as ``sim_<term>_<type>`` for
training and validation.

The model must expose its attention heads. When fairseq-train builds the criterion, the model of its task is
already built (:func:`diverse_fairseq.methods.hooks.model_built_for`): a model without such heads (``--arch
transformer``), or without the chosen layers, is refused then, before the first step. On its first forward the
criterion selects its attention sites
(:func:`diverse_fairseq.methods.sites.select_sites`); each forward records exactly what the terms need
(sub → V, pos → A, out → O) of those sites only (:func:`~diverse_fairseq.methods.sites.observe`), so
unregularized modules keep fairseq's path. :class:`DisagreementTerm` holds all of this; each criterion only
names its base criterion and its default attention types.
"""

import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.logging import metrics
from torch import Tensor

from diverse_fairseq.methods.disagreement.similarity import output_similarity, position_similarity, subspace_similarity
from diverse_fairseq.methods.hooks import model_built_for
from diverse_fairseq.methods.options import (
    ALL_LAYERS,
    attention_types_field,
    layers_field,
    parse_layer_spec,
    parse_names,
)
from diverse_fairseq.methods.sites import (
    ATTENTION_TYPES,
    AttentionSite,
    observe,
    require_diverse,
    select_sites,
    token_side,
    unwrap,
    uses_activation_checkpointing,
)

TERMS = ("sub", "pos", "out")
_TAP_OF_TERM = {"sub": "v", "pos": "a", "out": "o"}
_SIMILARITY = {"sub": subspace_similarity, "pos": position_similarity, "out": output_similarity}
DECODER_SIDE = ("dec_self", "enc_dec")  # the attention types the authors' code averages into one decoder term
WEIGHTINGS = ("sides", "sum")
CRITERION_NAME = "label_smoothed_cross_entropy_with_disagreement"


@dataclass
class DisagreementConfig(FairseqDataclass):
    """The options of the disagreement term; each criterion's config adds ``disagreement_attention``."""

    disagreement_lambda: float = field(
        default=1.0,
        metadata={"help": "weight λ of the disagreement term (loss = base loss + λ·sample_size·sim_total); "
                          "0 logs the similarities without regularizing"},
    )
    disagreement_terms: str = field(
        default="out",
        metadata={"help": "comma-separated similarity terms to minimise: sub (value subspaces), "
                          "pos (attended positions), out (head outputs)"},
    )
    disagreement_layers: Optional[str] = layers_field("to regularize", none=False)
    disagreement_weighting: ChoiceEnum(WEIGHTINGS) = field(
        default="sides",
        metadata={"help": "how the attention types add up, per term: sides (default, the authors' code) = "
                          "enc_self + the mean of the selected decoder-side types (dec_self, enc_dec), so all "
                          "three types weigh 1, 1/2, 1/2; sum = every selected type with weight 1"},
    )


def type_weights(attention_types, weighting: str = "sides") -> Dict[str, float]:
    """The weight of each selected attention type in ``sim_total`` (docs/methods.md, the authors' side weighting).

    ``sides``: the encoder side is enc_self (weight 1); the decoder side is the mean of the selected decoder-side
    types, so each of the ``k`` selected ones weighs ``1/k`` (dec_self and enc_dec together: ½ each).
    ``sum``: every selected type weighs 1."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"--disagreement-weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    decoder = [t for t in attention_types if t in DECODER_SIDE]
    return {t: 1.0 / len(decoder) if weighting == "sides" and t in DECODER_SIDE else 1.0 for t in attention_types}


class DisagreementTerm:
    """Adds λ·sample_size·sim_total to the loss of the fairseq criterion it is mixed in before.

    Subclasses set ``name`` (their ``--criterion``) and ``plain_criterion`` (the one without the term), call the
    base criterion's ``__init__`` and then :meth:`init_disagreement`. The base criterion's ``forward`` runs inside
    :func:`observe`, so its one model forward is the one whose heads are regularized."""

    name = CRITERION_NAME
    plain_criterion = "label_smoothed_cross_entropy"

    def init_disagreement(self, task, disagreement_lambda, disagreement_terms, disagreement_attention,
                          disagreement_layers, disagreement_weighting="sides") -> None:
        lam = float(disagreement_lambda)
        if not lam >= 0.0 or lam == float("inf"):
            raise ValueError(f"--disagreement-lambda must be a finite number >= 0, got {disagreement_lambda}")
        self.disagreement_lambda = lam
        self.terms = parse_names(disagreement_terms, TERMS, "--disagreement-terms")
        self.attention_types = parse_names(disagreement_attention, ATTENTION_TYPES, "--disagreement-attention")
        self.layers = parse_layer_spec(disagreement_layers, "--disagreement-layers", ALL_LAYERS)
        if not self.layers:
            raise ValueError("--disagreement-layers none would regularize nothing: choose layers ('all' or "
                             f"indices), or train with --criterion {self.plain_criterion}")
        self.type_weights = type_weights(self.attention_types, str(disagreement_weighting))
        source = getattr(task, "source_dictionary", None)  # sentence_prediction's target dictionary holds labels
        self.source_padding_idx = source.pad() if source is not None else self.padding_idx
        # the model whose sites self._sites holds, weakly referenced (an id() is reused once a model is freed)
        self._prepared_for: Optional[weakref.ref] = None
        self._sites: List[AttentionSite] = []
        model = model_built_for(task)  # fairseq-train builds the model before the criterion
        if model is not None:
            self.regularized_sites(model)  # a wrong model is refused now, not at the first step (and its crash.pt)

    # ------------------------------------------------------------------ model set-up

    @property
    def taps(self) -> frozenset:
        """The per-head tensors the terms need: sub → V, pos → A, out → O."""
        return frozenset(_TAP_OF_TERM[t] for t in self.terms)

    def regularized_sites(self, model) -> List[AttentionSite]:
        """The attention sites this criterion regularizes in ``model``, checked once per model (the one place
        where the number of heads is checked for disagreement: at least 2 per regularized module)."""
        core = unwrap(model)
        if self._prepared_for is None or self._prepared_for() is not core:
            if uses_activation_checkpointing(core):
                raise ValueError(
                    f"--criterion {self.name} cannot be used with --checkpoint-activations / "
                    "--offload-activations: their first forward runs without autograd, so the recorded heads "
                    "carry no graph; drop the flag")
            sites = select_sites(core, self.attention_types, self.layers, "--disagreement-attention",
                                 "--disagreement-layers")
            require_diverse(sites, f"--criterion {self.name}")
            for site in sites:
                if site.num_heads < 2:
                    raise ValueError(f"--criterion {self.name}: {site.attention_type} attention of layer "
                                     f"{site.layer} has {site.num_heads} head; disagreement needs at least 2")
            self._sites, self._prepared_for = sites, weakref.ref(core)
        return self._sites

    # ------------------------------------------------------------------ loss

    def similarities(self, sites: List[AttentionSite], heads, sample) -> Dict[str, Tensor]:
        """``{"<term>_<type>": 0-dim tensor}``: per term and attention type, the layer mean of the similarity
        of the recorded heads (``heads(site)`` → ``{tap: tensor}``) over the non-padding tokens: the source tokens
        (``net_input.src_tokens``: translation's encoder, RoBERTa) or the target tokens (translation's decoder, and
        the language model, whose decoder input is padded where its target is), as :func:`token_side` says."""
        def side(site: AttentionSite, term: str) -> str:
            return token_side(site.attention_type, term)

        masks = {"source": lambda: sample["net_input"]["src_tokens"].eq(self.source_padding_idx),  # [B, S]
                 "target": lambda: sample["target"].eq(self.padding_idx)}  # [B, T]
        pads = {name: masks[name]() for name in {side(s, t) for s in sites for t in self.terms}}  # each once
        sims: Dict[str, Tensor] = {}
        for attention_type in self.attention_types:
            of_type = [s for s in sites if s.attention_type == attention_type]
            for term in self.terms:
                per_layer = [_SIMILARITY[term](heads(s)[_TAP_OF_TERM[term]], pads[side(s, term)]) for s in of_type]
                sims[f"{term}_{attention_type}"] = torch.stack(per_layer).mean()
        return sims

    def forward(self, model, sample, reduce=True):
        if not reduce:
            raise ValueError(f"{self.name} only supports reduce=True (a summed loss)")
        sites = self.regularized_sites(model)
        with observe(sites, self.taps) as seen:
            loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.disagreement_lambda > 0):  # λ = 0: only logged
            sims = self.similarities(sites, seen.heads, sample)
        sim_total = sum(self.type_weights[key.split("_", 1)[1]] * value for key, value in sims.items())
        if self.disagreement_lambda > 0:
            loss = loss + (self.disagreement_lambda * sample_size) * sim_total
        logging_output["loss"] = loss.data
        logging_output["sim_total"] = sim_total.detach() * sample_size
        for name, value in sims.items():  # sample_size-weighted sums, averaged in reduce_metrics
            logging_output[f"sim_{name}"] = value.detach() * sample_size
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        keys = sorted({k for log in logging_outputs for k in log if k.startswith("sim_")})
        for key in keys:
            total = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(key, total / max(sample_size, 1), sample_size, round=4)


# ---------------------------------------------------------------------------------- the three criteria


@dataclass
class LabelSmoothedCrossEntropyWithDisagreementConfig(LabelSmoothedCrossEntropyCriterionConfig, DisagreementConfig):
    disagreement_attention: str = attention_types_field("to regularize")


@register_criterion(CRITERION_NAME, dataclass=LabelSmoothedCrossEntropyWithDisagreementConfig)
class LabelSmoothedCrossEntropyWithDisagreementCriterion(DisagreementTerm, LabelSmoothedCrossEntropyCriterion):
    """Translation: label-smoothed cross-entropy + λ·D (EMNLP 2018 §3.1)."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 disagreement_lambda=1.0, disagreement_terms="out", disagreement_attention="enc_self,dec_self,enc_dec",
                 disagreement_layers=None, disagreement_weighting="sides"):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.init_disagreement(task, disagreement_lambda, disagreement_terms, disagreement_attention,
                               disagreement_layers, disagreement_weighting)


@dataclass
class CrossEntropyWithDisagreementConfig(CrossEntropyCriterionConfig, DisagreementConfig):
    disagreement_attention: str = attention_types_field("to regularize (a language model has only dec_self)",
                                                        default="dec_self")


@register_criterion("cross_entropy_with_disagreement", dataclass=CrossEntropyWithDisagreementConfig)
class CrossEntropyWithDisagreementCriterion(DisagreementTerm, CrossEntropyCriterion):
    """Language modelling (``--arch diverse_transformer_lm*``): cross-entropy + λ·D over the decoder
    self-attention (EMNLP 2018 §3.1 applied to a decoder-only Transformer)."""

    name, plain_criterion = "cross_entropy_with_disagreement", "cross_entropy"

    def __init__(self, task, sentence_avg, disagreement_lambda=1.0, disagreement_terms="out",
                 disagreement_attention="dec_self", disagreement_layers=None, disagreement_weighting="sides"):
        super().__init__(task, sentence_avg)
        self.init_disagreement(task, disagreement_lambda, disagreement_terms, disagreement_attention,
                               disagreement_layers, disagreement_weighting)


@dataclass
class SentencePredictionWithDisagreementConfig(SentencePredictionConfig, DisagreementConfig):
    disagreement_attention: str = attention_types_field("to regularize (RoBERTa has only enc_self)",
                                                        default="enc_self")


@register_criterion("sentence_prediction_with_disagreement", dataclass=SentencePredictionWithDisagreementConfig)
class SentencePredictionWithDisagreementCriterion(DisagreementTerm, SentencePredictionCriterion):
    """Sentence classification / regression (``--arch diverse_roberta*``): fairseq's sentence_prediction loss
    + λ·D over the encoder self-attention (EMNLP 2018 §3.1; EMNLP 2020 regularizes such classifiers' heads)."""

    name, plain_criterion = "sentence_prediction_with_disagreement", "sentence_prediction"

    def __init__(self, cfg: SentencePredictionWithDisagreementConfig, task):
        super().__init__(cfg, task)
        self.init_disagreement(task, cfg.disagreement_lambda, cfg.disagreement_terms, cfg.disagreement_attention,
                               cfg.disagreement_layers, cfg.disagreement_weighting)
