"""Which checkpoint file of a run is evaluated: the one place where this is decided.

A setting names its ``best_checkpoint_metric`` (:class:`diverse_fairseq.runs.settings.Setting`):

- ``None``: the last checkpoint, ``checkpoint_last.pt`` (the demo scale);
- ``"bleu"``: ``checkpoint_best.pt``, the best by validation BLEU (fairseq's ``--eval-bleu`` with
  ``--best-checkpoint-metric bleu``), as the THUMT trainer of the EMNLP 2018 / NAACL 2019 / journal papers keeps
  its best checkpoints by validation BLEU;
- ``"loss"``: ``checkpoint_best.pt``, the lowest validation loss (fairseq's default best metric), as the EMNLP 2020
  authors' README tests ``checkpoint_best.pt`` (bangann/Repulsive-Attention, commit f480b5c,
  ``RepulsiveTransformer/README.md`` lines 31 and 37).

``AVERAGE=N`` replaces the single checkpoint by the average of the last N checkpoints,
``checkpoint_avg_lastN.pt``.
"""

from typing import Optional

#: the metrics a setting may name, with what its evaluated checkpoint is, in words for the report
METRICS = {
    None: "the last",
    "bleu": "the best by validation BLEU",
    "loss": "the best by validation loss",
}


def check_metric(metric: Optional[str]) -> Optional[str]:
    """``metric`` when it is one of :data:`METRICS`, else a ValueError that names the choices."""
    if metric not in METRICS:
        raise ValueError(f"best_checkpoint_metric={metric!r} is not known: use None (evaluate checkpoint_last.pt), "
                         "'bleu' or 'loss' (evaluate checkpoint_best.pt chosen by that validation metric)")
    return metric


def checkpoint_name(metric: Optional[str], average: int = 0) -> str:
    """The file name of the checkpoint evaluated for a setting whose best metric is ``metric``, after averaging
    the last ``average`` checkpoints (0: no averaging)."""
    check_metric(metric)
    if average:
        return f"checkpoint_avg_last{int(average)}.pt"
    return "checkpoint_best.pt" if metric else "checkpoint_last.pt"


def describe(metric: Optional[str], averaged: int = 0) -> str:
    """What was evaluated, in words: "the average of the last 5 checkpoints (checkpoint_avg_last5.pt)", "a single
    checkpoint (the best by validation loss, checkpoint_best.pt)", ..."""
    if averaged:
        return f"the average of the last {int(averaged)} checkpoints ({checkpoint_name(metric, averaged)})"
    return f"a single checkpoint ({METRICS[check_metric(metric)]}, {checkpoint_name(metric)})"
