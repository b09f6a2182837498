"""The typed per-seed training record that the table runner caches (``train.json``) and the report,
the progress line and the disagreement/probing reports read.

Only records of this cache version are ever read: a record of an earlier build has another cache key
(:data:`diverse_fairseq.tables.cache.CACHE_VERSION`), so its run is trained again instead of being patched up.
"""

from dataclasses import asdict, dataclass, fields
from typing import Dict, List, Optional


@dataclass(frozen=True)
class TrainRecord:
    """One row and seed's training, as :func:`diverse_fairseq.tables.steps.train_row` made or reused it."""

    row: str
    seed: int
    arch: str
    setting: str
    train_args: List[str]  # fairseq-train's arguments, whatever the launcher (python -m, torchrun)
    key: Dict  # the cache key (keys.cache_key)
    trained_at: str
    threads: int
    checkpoint: str  # the checkpoint to evaluate (run_plan.Plan.checkpoint)
    args: List[str]  # the row's flags, mapped to the setting's depth (scale.py)
    averaged_checkpoints: int  # checkpoints averaged into the evaluated model (0: a single model)
    best_checkpoint_metric: Optional[str]  # the setting's (checkpoint_choice.METRICS): which single model
    embeddings: str  # embedding sharing: "all" (--share-all-embeddings), "decoder" (target with output), "none"
    parameters: Optional[int]
    updates: int
    train_steps_per_second: Optional[float]
    train_loss: Optional[float]
    valid_loss: Optional[float]
    valid_nll_loss: Optional[float]  # per target token, base 2, without label smoothing

    def to_dict(self) -> Dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict) -> "TrainRecord":
        """The record stored in ``train.json`` (the ``reused`` flag and other runtime additions dropped)."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})

