"""GNMT's length penalty as a fairseq generation option: ``--task translation_length_penalty --length-penalty gnmt``.

The EMNLP 2018, NAACL 2019 and journal papers decoded with their THUMT fork (Diversify-MHA
``utils/inference.py``), which ranks finished hypotheses by GNMT's normalised score (Wu et al. 2016, "Google's
Neural Machine Translation System", Eq. 14, without the coverage penalty)::

    score(y) = log P(y | x) / lp(y),    lp(y) = ((5 + |y|) / 6) ** alpha

with ``alpha = 0.6`` (``decode_alpha`` in ``bin/trainer.py`` and ``bin/translator.py``). fairseq's own
``--lenpen alpha`` divides by ``|y| ** alpha`` instead. In both, ``|y|`` counts the end-of-sentence token: THUMT
divides the scores of step ``t`` (0-based) by ``lp(t + 1)``, where ``t + 1`` tokens including the EOS just
chosen have been generated, and fairseq's ``finalize_hypos`` divides by ``(step + 1) ** lenpen`` with the same
count.

:class:`TranslationLengthPenaltyTask` is fairseq's ``translation`` task with two more options:
``--length-penalty {fairseq,gnmt}`` (default ``fairseq``: fairseq's penalty, unchanged), and
``--beam-search {fairseq,thumt}`` (default ``fairseq``: fairseq's search). With ``gnmt`` and fairseq's search its
``build_generator`` returns :class:`GnmtSequenceGenerator`, and ``--lenpen`` is GNMT's ``alpha``; with
``--beam-search thumt`` it returns THUMT's search
(:class:`~diverse_fairseq.methods.thumt_search.ThumtSequenceGenerator`), which divides by the chosen penalty. Everything
that decodes through the task uses them: ``fairseq-generate``, ``fairseq-interactive`` and the validation BLEU of
``fairseq-train --eval-bleu`` (``--eval-bleu-args`` gives ``lenpen``), all with ``--user-dir diverse_fairseq``.

:class:`GnmtSequenceGenerator` applies the penalty where fairseq applies its own: to a hypothesis' score when it is
finalized (:meth:`GnmtLengthPenalty.finalize_hypos`). The beam search itself ranks the live hypotheses of a step by
their summed log-probabilities in both toolkits (THUMT divides all of a step's candidates by the same ``lp``), but
chooses and stops otherwise: :mod:`diverse_fairseq.methods.thumt_search` has THUMT's.
"""

from dataclasses import dataclass, field
from typing import Dict, List

from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from fairseq.tasks import register_task
from fairseq.tasks.translation import EVAL_BLEU_ORDER, TranslationConfig, TranslationTask
from torch import Tensor

from .thumt_search import ThumtSequenceGenerator, unsupported

TASK_NAME = "translation_length_penalty"
LENGTH_PENALTIES = ("fairseq", "gnmt")
BEAM_SEARCHES = ("fairseq", "thumt")


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``lp(y) = ((5 + |y|) / 6) ** alpha`` (Wu et al. 2016, Eq. 14) for ``|y| = length`` tokens."""
    return ((5.0 + length) / 6.0) ** alpha


class GnmtLengthPenalty:
    """Mixin for a fairseq ``SequenceGenerator``: finished hypotheses are scored by GNMT's penalty.

    The generator's ``len_penalty`` (fairseq's ``--lenpen``) becomes GNMT's ``alpha``; fairseq's own division
    by ``(step + 1) ** len_penalty`` is turned off (exponent 0), and the hypotheses that ``finalize_hypos``
    adds at ``step`` (``step + 1`` tokens with the EOS) get their score divided by
    :func:`gnmt_length_penalty` instead. ``--unnormalized`` leaves scores unnormalized, as in fairseq."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gnmt_alpha = float(self.len_penalty)
        self.len_penalty = 0.0  # fairseq's division by (step + 1) ** 0 = 1: a no-op

    def finalize_hypos(self, step: int, bbsz_idx, eos_scores, tokens, scores,
                       finalized: List[List[Dict[str, Tensor]]], finished: List[bool], beam_size: int, attn,
                       src_lengths, max_len: int):
        before = [len(hypos) for hypos in finalized]
        newly_finished = super().finalize_hypos(step, bbsz_idx, eos_scores, tokens, scores, finalized, finished,
                                                beam_size, attn, src_lengths, max_len)
        if self.normalize_scores:
            penalty = gnmt_length_penalty(step + 1, self.gnmt_alpha)
            for hypos, first_new in zip(finalized, before):
                for hypo in hypos[first_new:]:
                    hypo["score"] = hypo["score"] / penalty
        return newly_finished


class GnmtSequenceGenerator(GnmtLengthPenalty, SequenceGenerator):
    """fairseq's beam search with GNMT's length penalty (:class:`GnmtLengthPenalty`)."""


class GnmtSequenceGeneratorWithAlignment(GnmtLengthPenalty, SequenceGeneratorWithAlignment):
    """fairseq's beam search with alignments (``--print-alignment``) and GNMT's length penalty."""


@dataclass
class TranslationLengthPenaltyConfig(TranslationConfig):
    length_penalty: ChoiceEnum(LENGTH_PENALTIES) = field(
        default="fairseq",
        metadata={"help": "how decoding normalises a finished hypothesis' log-probability by its length |y| "
                          "(EOS included), with alpha = --lenpen: 'fairseq' divides by |y|^alpha (fairseq's "
                          "--lenpen); 'gnmt' by ((5 + |y|) / 6)^alpha (Wu et al. 2016, Eq. 14, as THUMT decodes; "
                          "alpha 0.6 there). Applies to fairseq-generate, fairseq-interactive and --eval-bleu"})
    beam_search: ChoiceEnum(BEAM_SEARCHES) = field(
        default="fairseq",
        metadata={"help": "the beam search: 'fairseq' (fairseq's SequenceGenerator) or 'thumt' (THUMT's, as the "
                          "EMNLP 2018 / NAACL 2019 papers decoded: EOS candidates among the top 2*beam, finished "
                          "hypotheses of all steps compete for the beam, its stopping bound, at the length limit "
                          "the best unfinished hypothesis without EOS, an empty output allowed: --min-len applies "
                          "only above 1; no --prefix-size, --print-alignment, --sampling or other fairseq searches). "
                          "Applies to fairseq-generate, fairseq-interactive and --eval-bleu"})


@register_task(TASK_NAME, dataclass=TranslationLengthPenaltyConfig)
class TranslationLengthPenaltyTask(TranslationTask):
    """fairseq's ``translation`` task whose generator applies ``--length-penalty`` (fairseq's or GNMT's) and
    ``--beam-search`` (fairseq's or THUMT's)."""

    cfg: TranslationLengthPenaltyConfig

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        scoring = getattr(args, "score_reference", False)  # fairseq's SequenceScorer: no search
        if str(self.cfg.beam_search) == "thumt" and not scoring:
            if seq_gen_cls is not None:
                raise ValueError(f"--beam-search thumt replaces the sequence generator, but the caller asked for "
                                 f"{seq_gen_cls.__name__}: use --beam-search fairseq with it")
            if getattr(args, "print_alignment", False):
                raise unsupported("--print-alignment")
            seq_gen_cls = ThumtSequenceGenerator
            extra_gen_cls_kwargs = dict(extra_gen_cls_kwargs or {}, length_penalty=str(self.cfg.length_penalty))
        elif str(self.cfg.length_penalty) == "gnmt" and not scoring:
            if seq_gen_cls is not None:
                raise ValueError(f"--length-penalty gnmt replaces the sequence generator, but the caller asked "
                                 f"for {seq_gen_cls.__name__}: use --length-penalty fairseq with it")
            if getattr(args, "print_alignment", False):
                seq_gen_cls = GnmtSequenceGeneratorWithAlignment
                extra_gen_cls_kwargs = dict(extra_gen_cls_kwargs or {}, print_alignment=args.print_alignment)
            else:
                seq_gen_cls = GnmtSequenceGenerator
        return super().build_generator(models, args, seq_gen_cls=seq_gen_cls,
                                       extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                                       prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)

    def reduce_metrics(self, logging_outputs, criterion):
        """fairseq's, and BLEU 0 for a validation (``--eval-bleu``) whose every hypothesis is empty, which THUMT's
        search allows (an early model may end every sentence at once): fairseq logs no BLEU then, and
        fairseq-train's ``--best-checkpoint-metric bleu`` would stop on the missing metric."""
        super().reduce_metrics(logging_outputs, criterion)
        validated = any("_bleu_totals_0" in log for log in logging_outputs)  # training logs have no BLEU counts
        if self.cfg.eval_bleu and validated and not any(
                sum(log.get(f"_bleu_totals_{i}", 0) for log in logging_outputs) for i in range(EVAL_BLEU_ORDER)):
            metrics.log_scalar("bleu", 0.0)
