"""The typed per-seed records of a table run: :class:`TrainRecord` (``train.json``), the evaluation's
:class:`~diverse_fairseq.evaluate.EvalRecord` (one subset's ``results.json``) and :class:`JobRecord` (one job:
``job.json``), written by :func:`dataclasses.asdict` and read by :func:`from_json`. A record of an earlier build
has another cache key (:data:`.cache.CACHE_VERSION`), so its run is trained again instead of being patched up.
"""

from dataclasses import dataclass, fields, is_dataclass
from typing import Dict, List, Optional, get_args, get_origin, get_type_hints

from ..evaluate import EvalRecord


@dataclass(frozen=True)
class TrainRecord:
    """One row and seed's training, as :func:`diverse_fairseq.tables.steps.train` made or reused it."""

    row: str
    seed: int
    arch: str
    setting: str
    train_args: List[str]  # fairseq-train's arguments, whatever the launcher (python -m, torchrun)
    key: Dict  # the cache key (cache.cache_key)
    trained_at: str
    threads: int
    checkpoint: str  # the checkpoint to evaluate (runs.plan.Plan.checkpoint)
    args: List[str]  # the row's flags, mapped to the setting's depth (scale.py)
    averaged_checkpoints: int  # checkpoints averaged into the evaluated model (0: a single model)
    best_checkpoint_metric: Optional[str]  # the setting's (settings.METRICS): which single model
    embeddings: str  # embedding sharing: "all" (--share-all-embeddings), "decoder" (target with output), "none"
    parameters: Optional[int]
    updates: int
    train_steps_per_second: Optional[float]
    train_loss: Optional[float]
    valid_loss: Optional[float]
    valid_nll_loss: Optional[float]  # per target token, base 2, without label smoothing


@dataclass(frozen=True)
class JobRecord:
    """One job's record (:func:`diverse_fairseq.tables.job.run_job`), ``job.json`` in its run directory."""

    train: TrainRecord
    evals: Dict[str, EvalRecord]  # by subset, the table's first subset (the report's BLEU) first
    reused: bool = False  # training finished in an earlier invocation
    disagreement: Optional[Dict] = None  # steps.disagreement_scores (None: a single-head model)
    probing: Optional[Dict] = None  # steps.probing_scores, for tables that probe
    same_as: Optional[str] = None  # the row whose runs these are (its job's first row: job.table_jobs)

    @property
    def eval(self) -> EvalRecord:
        """The evaluation the report's BLEU and significance tests use: the first subset's."""
        return next(iter(self.evals.values()))

    @property
    def output_disagreement(self) -> Optional[float]:
        """EMNLP 2018's output disagreement of the encoder self-attention (None without head pairs)."""
        return self.disagreement["enc_self"]["out"] if self.disagreement else None


def from_json(cls, data: Dict):
    """The ``cls`` record of :func:`dataclasses.asdict`'s ``data``; keys that are not fields of ``cls`` are left
    out."""
    hints, values = get_type_hints(cls), {}
    for name in (f.name for f in fields(cls) if f.name in data):
        hint, value = hints[name], data[name]
        item = (get_args(hint) or (None,))[-1] if get_origin(hint) in (dict, list) else None  # Dict[str, R], List[R]
        values[name] = (from_json(hint, value) if is_dataclass(hint) else value if not is_dataclass(item) else
                        {k: from_json(item, v) for k, v in value.items()} if isinstance(value, dict) else
                        [from_json(item, v) for v in value])
    return cls(**values)
