"""The benchmark's cases: the stock-fairseq baselines (a translation Transformer, a language model, a RoBERTa
sentence classifier) and the builders of the disagreement, repulsive, routing and decode cases, each a
``builder(Context) -> Case`` entry of :data:`CASES` that names the baseline it is timed against
(:data:`REFERENCES`)."""

import argparse
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from fairseq import options
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import TransformerModel
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.sentence_prediction import SentencePredictionTask
from fairseq.tasks.translation import TranslationTask

import diverse_fairseq  # noqa: F401  (registers the plugin)
from diverse_fairseq.methods.disagreement.criterion import (
    CrossEntropyWithDisagreementCriterion,
    LabelSmoothedCrossEntropyWithDisagreementCriterion,
    SentencePredictionWithDisagreementConfig,
    SentencePredictionWithDisagreementCriterion,
)
from diverse_fairseq.methods.hooks import track_model
from diverse_fairseq.methods.repulsive.optimizer import RepulsiveAdam, RepulsiveAdamConfig
from diverse_fairseq.methods.transformer import DiverseTransformerModel

LABEL_SMOOTHING = 0.1
CLASSIFICATION_HEAD = "sentence_classification_head"


@dataclass
class Context:
    """What every case builder gets: the tasks, model arguments and the translation baseline's weights."""

    task: TranslationTask
    device: torch.device
    arch: str
    extra_model_args: List[str]
    lm_task: Optional[LanguageModelingTask] = None
    lm_arch: str = "diverse_transformer_lm"
    lm_model_args: List[str] = field(default_factory=list)
    roberta_task: Optional[SentencePredictionTask] = None
    roberta_arch: str = "diverse_roberta"
    roberta_model_args: List[str] = field(default_factory=list)
    baseline_state: Optional[Dict[str, torch.Tensor]] = None
    beam: int = 5
    decode_len: int = 30

    def generator(self, model: torch.nn.Module):
        """fairseq's beam search with exactly ``decode_len`` steps for every hypothesis (EOS is barred
        before and forced at that length), so that models with different weights do the same work."""
        from fairseq.sequence_generator import SequenceGenerator

        return SequenceGenerator([model], self.task.target_dictionary, beam_size=self.beam,
                                 max_len_a=0, max_len_b=self.decode_len, min_len=self.decode_len)

    def model_args(self, arch: str, extra=()) -> argparse.Namespace:
        parser = options.get_training_parser()
        argv = ["unused-data-dir", "--arch", arch, "--task", "translation", *self.extra_model_args, *extra]
        return options.parse_args_and_arch(parser, input_args=argv)

    def single_stack_arch(self, family: str) -> str:
        """The architecture of a family's cases: ``--lm-arch`` ("lm") or ``--roberta-arch`` ("roberta")."""
        return self.lm_arch if family == "lm" else self.roberta_arch

    def build_single(self, family: str, arch: str, extra=()) -> torch.nn.Module:
        """A language model (``family`` "lm") or a RoBERTa sentence classifier ("roberta", with its
        classification head) as fairseq-train builds it from ``arch`` and the family's model options, in
        training mode on the device."""
        if family == "lm":  # the stock transformer_lm takes its sizes from its dataclass config
            task, argv = self.lm_task, ["--task", "language_modeling", *self.lm_model_args]
        else:
            task = self.roberta_task
            argv = ["--task", "sentence_prediction", "--criterion", "sentence_prediction",  # the task reads its head
                    "--num-classes", str(task.cfg.num_classes),
                    "--max-positions", str(task.cfg.max_positions), *self.roberta_model_args]
        argv = ["unused-data-dir", "--arch", arch, *argv, *extra]
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
        return task.build_model(cfg.model).to(self.device).train()

    def finish(self, model: torch.nn.Module) -> torch.nn.Module:
        """Load the baseline's weights (same names) and move to the device, in training mode.

        A model with routing aggregators has no ``out_proj`` in its routed attention modules and
        aggregator parameters the baseline lacks: exactly those are left out (and checked to be the only
        differences), everything else is loaded."""
        if self.baseline_state is not None:
            routed = [name for name, m in model.named_modules() if getattr(m, "aggregator", None) is not None]
            if not routed:
                model.load_state_dict(self.baseline_state, strict=True)
            else:
                state = {k: v for k, v in self.baseline_state.items()
                         if not any(k.startswith(f"{name}.out_proj.") for name in routed)}
                missing, unexpected = model.load_state_dict(state, strict=False)
                assert not unexpected, unexpected
                assert all(any(k.startswith(f"{name}.aggregator.") for name in routed) for k in missing), missing
        return model.to(self.device).train()


@dataclass
class Case:
    model: torch.nn.Module
    criterion: Optional[torch.nn.Module]
    optimizer: object  # zero_grad(set_to_none=...) and step(), e.g. a torch optimizer
    report_memory: bool = False  # put "<key>_peak_mem" in the JSON (the table shows every case)
    times: List[float] = field(default_factory=list)
    #: "train": one training step per round, against the training step of ``reference``; "decode": beam search
    #: over one test batch per round with ``generator``, against the same beam search with ``reference``'s model
    mode: str = "train"
    generator: Optional[object] = None
    reference: str = "baseline"  # the case it is timed against (set by its :class:`Builder`)
    batches: str = "translation"  # its synthetic batches: "translation", "test" (decode cases), "lm" or "roberta"


@dataclass(frozen=True)
class Builder:
    """A case's builder and the case it is timed against, known before it is built (the benchmark builds the
    references a selection needs, then one case at a time)."""

    build: Callable[[Context], Case]
    reference: str = "baseline"  # a key of :data:`REFERENCES`, "baseline" or "baseline_decode"

    def __call__(self, ctx: Context) -> Case:
        case = self.build(ctx)
        case.reference = self.reference
        return case


def adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), weight_decay=1e-4)


def build_baseline(ctx: Context) -> Case:
    args = ctx.model_args(ctx.arch.replace("diverse_", ""))
    model = ctx.finish(TransformerModel.build_model(args, ctx.task))
    criterion = LabelSmoothedCrossEntropyCriterion(ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)
    return Case(model, criterion.to(ctx.device), adam(model))


def disagreement_case(terms: str, attention: str = "enc_self,dec_self,enc_dec", report_memory=False):
    def build(ctx: Context) -> Case:
        args = ctx.model_args(ctx.arch)
        model = ctx.finish(DiverseTransformerModel.build_model(args, ctx.task))
        criterion = LabelSmoothedCrossEntropyWithDisagreementCriterion(
            ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING,
            disagreement_lambda=1.0, disagreement_terms=terms, disagreement_attention=attention,
        )
        return Case(model, criterion.to(ctx.device), adam(model), report_memory=report_memory)

    return Builder(build)


class SvgdThenAdam:
    """The baseline's Adam after ``repulsive_adam``'s SVGD transform of the Q/K/V head blocks of every
    attention module (the transformed gradients are copied into ``.grad``), so that the ratio is the
    cost of the transform itself and not of a different Adam implementation."""

    def __init__(self, model: torch.nn.Module, **options):
        config = RepulsiveAdamConfig(lr=[5e-4], adam_betas="(0.9, 0.98)", weight_decay=1e-4, **options)
        self.repulsive = RepulsiveAdam(config, list(model.parameters()))
        self.adam = adam(model)
        self.state = self.adam.state

    def zero_grad(self, set_to_none=True):
        self.adam.zero_grad(set_to_none=set_to_none)

    def step(self):
        new = self.repulsive.particle_gradients()
        for p in self.repulsive.particle_params:
            p.grad.copy_(new[id(p)])
        self.adam.step()


def repulsive_case(**options):
    def build(ctx: Context) -> Case:
        args = ctx.model_args(ctx.arch.replace("diverse_", ""))  # stock fairseq transformer
        model = track_model(ctx.finish(TransformerModel.build_model(args, ctx.task)))
        criterion = LabelSmoothedCrossEntropyCriterion(ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)
        return Case(model, criterion.to(ctx.device), SvgdThenAdam(model, **options))

    return Builder(build)


def routing_args(routing: str = "em", encoder=None, decoder=None, enc_dec=None) -> List[str]:
    """``--routing-*`` options: ``encoder`` / ``decoder`` / ``enc_dec`` are layer lists ("0,1", "all")."""
    args = ["--routing-type", routing, "--routing-iterations", "3"]
    for flag, layers in (("--routing-encoder-layers", encoder), ("--routing-decoder-layers", decoder),
                         ("--routing-encoder-decoder-layers", enc_dec)):
        if layers is not None:
            args += [flag, layers]
    return args


def routing_case(report_memory=False, **placement):
    """Training step of diverse_transformer with routing-by-agreement aggregation (NAACL 2019) in the
    given attention modules, plain label-smoothed cross-entropy."""

    def build(ctx: Context) -> Case:
        args = ctx.model_args(ctx.arch, routing_args(**placement))
        model = ctx.finish(DiverseTransformerModel.build_model(args, ctx.task))
        criterion = LabelSmoothedCrossEntropyCriterion(ctx.task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)
        return Case(model, criterion.to(ctx.device), adam(model), report_memory=report_memory)

    return Builder(build)


def decode_case(train_builder: Builder):
    """Beam search (``Context.beam`` beams, ``Context.decode_len`` steps) with the model that
    ``train_builder`` builds, against the same beam search with the baseline model."""

    def build(ctx: Context) -> Case:
        case = train_builder(ctx)
        case.model.eval()
        return Case(case.model, None, None, mode="decode", generator=ctx.generator(case.model), batches="test")

    return Builder(build, reference="baseline_decode")


def single_stack_criterion(ctx: Context, family: str, **disagreement) -> torch.nn.Module:
    """The stock loss of a language model (cross-entropy) or of a RoBERTa classifier (``sentence_prediction``);
    with ``disagreement`` options, the same loss + λ·D (the ``*_with_disagreement`` criterion)."""
    if family == "lm":
        cls = CrossEntropyWithDisagreementCriterion if disagreement else CrossEntropyCriterion
        return cls(ctx.lm_task, sentence_avg=False, **disagreement)
    if disagreement:
        config = SentencePredictionWithDisagreementConfig(classification_head_name=CLASSIFICATION_HEAD, **disagreement)
        return SentencePredictionWithDisagreementCriterion(config, ctx.roberta_task)
    return SentencePredictionCriterion(SentencePredictionConfig(classification_head_name=CLASSIFICATION_HEAD),
                                       ctx.roberta_task)


def single_stack_baseline(family: str):
    """Stock fairseq's ``transformer_lm`` ("lm") or ``roberta`` ("roberta"), the stock architecture of the
    family's ``--*-arch``, with its stock loss and Adam."""

    def build(ctx: Context) -> Case:
        arch = ctx.single_stack_arch(family)
        model = ctx.build_single(family, arch.replace("diverse_", ""))
        return Case(model, single_stack_criterion(ctx, family).to(ctx.device), adam(model), batches=family)

    return build


def single_stack_case(family: str, method: str, report_memory=False, **options):
    """A training step of a language model ("lm") or a RoBERTa classifier ("roberta") against
    :func:`single_stack_baseline`'s, from the same seed (so from the same weights: the diverse models initialise
    exactly as the stock ones): ``method`` "disagreement" (the ``out`` term on every layer's self-attention),
    "repulsive" (SVGD, as ``repulsive_case``) or "routing" (EM routing in the lowest two layers'
    self-attention)."""

    def build(ctx: Context) -> Case:
        arch = ctx.single_stack_arch(family)
        routing = routing_args(**{"decoder" if family == "lm" else "encoder": "0,1"}) if method == "routing" else []
        model = ctx.build_single(family, arch.replace("diverse_", "") if method == "repulsive" else arch, routing)
        criterion = single_stack_criterion(ctx, family, **(options if method == "disagreement" else {}))
        optimizer = SvgdThenAdam(track_model(model), **options) if method == "repulsive" else adam(model)
        return Case(model, criterion.to(ctx.device), optimizer, report_memory=report_memory, batches=family)

    return Builder(build, reference=f"baseline_{family}")


#: key -> builder(Context) -> Case: a new case is one more entry here.
CASES: Dict[str, Builder] = {
    "disagreement_out_all": disagreement_case("out", report_memory=True),
    "disagreement_pos_all": disagreement_case("pos"),
    "disagreement_sub_all": disagreement_case("sub"),
    "repulsive_svgd_all": repulsive_case(repulsive_method="svgd"),
    # the two noisy samplers of EMNLP 2020 Table 8 on the same particles: SPOS (Eq. 5) and SGLD (no kernel)
    "repulsive_spos_all": repulsive_case(repulsive_method="spos"),
    "repulsive_sgld_all": repulsive_case(repulsive_method="sgld"),
    # routing-by-agreement (NAACL 2019): EM routing in the lowest two encoder layers (the paper's
    # "Effective Aggregation"), in all encoder layers, in every attention module; beam search with the first
    # (encoder routing runs once per test sentence, not once per decoding step)
    "routing_em_enc2_train": routing_case(encoder="0,1", report_memory=True),
    "routing_em_enc_all_train": routing_case(encoder="all"),
    "routing_em_all_train": routing_case(encoder="all", decoder="all", enc_dec="all"),
    "routing_em_enc2_decode": decode_case(routing_case(encoder="0,1")),
    # the methods on fairseq's transformer_lm (its self-attention is dec_self), against the stock LM
    "lm_disagreement_out_all": single_stack_case("lm", "disagreement", report_memory=True, disagreement_terms="out"),
    "lm_repulsive_svgd_all": single_stack_case("lm", "repulsive", repulsive_method="svgd"),
    "lm_routing_em_dec2_train": single_stack_case("lm", "routing", report_memory=True),
    # the same on a RoBERTa sentence classifier (its self-attention is enc_self), against the stock RoBERTa
    "roberta_disagreement_out_all": single_stack_case("roberta", "disagreement", report_memory=True,
                                                      disagreement_terms="out"),
    "roberta_repulsive_svgd_all": single_stack_case("roberta", "repulsive", repulsive_method="svgd"),
    "roberta_routing_em_enc2_train": single_stack_case("roberta", "routing", report_memory=True),
}

#: the baselines other than the translation one, built when a selected case names them
REFERENCES: Dict[str, Callable[[Context], Case]] = {"baseline_lm": single_stack_baseline("lm"),
                                                    "baseline_roberta": single_stack_baseline("roberta")}

