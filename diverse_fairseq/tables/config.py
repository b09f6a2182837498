"""What one invocation of the table runner trains and where it writes: :class:`RunConfig`."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from ..runs.paths import DATA_BIN
from ..runs.plan import TrainOptions
from ..runs.settings import DEMO_SETTING, default_setting
from .spec import Row


@dataclass
class RunConfig:
    dataset: str
    scale: str
    seeds: List[int]
    gpus: Optional[int]  # GPUs per run: None every GPU visible to the process that trains, 0 the CPU
    out_dir: Path
    data_bin: Path = DATA_BIN
    train_args: List[str] = field(default_factory=list)  # appended to every row's fairseq-train flags
    generate_args: List[str] = field(default_factory=list)  # appended to every row's fairseq-generate flags
    threads: int = 1  # CPU threads of every job (fairseq-train, fairseq-generate, in-process torch)
    jobs: int = 1  # row/seed jobs run at once (each in its own process when > 1)
    progress_interval: float = 30.0  # seconds between two progress lines of a training job (0: each log record)
    probing_tasks: List[str] = field(default_factory=list)  # SentEval probing tasks of every run (table's probing)
    probing_dir: Optional[Path] = None  # where their files are
    dry_run: bool = False  # print every job's commands, run and write nothing (DRY_RUN=1)
    # launch options of every training (MAX_UPDATE, PRECISION, NNODES, ...)
    train_options: TrainOptions = field(default_factory=TrainOptions)
    # a script started in place of ``-m fairseq_cli.train`` (e.g. scripts/experiments/kernel_probe.py); not in the
    # cache key: it must not change what is trained
    train_hook: Optional[str] = None
    # subsets decoded after training; the first is the one the report's BLEU and significance use
    subsets: List[str] = field(default_factory=lambda: ["test"])
    # the command that runs this table again (the hints name it)
    rerun: str = "run the same command again"

    def run_dir(self, row: Row, seed: int) -> Path:
        return self.out_dir / "runs" / row.id / f"seed{seed}"

    def setting(self, row: Row) -> str:
        """The training setting of ``row``: ``tiny`` at demo scale, else the row's or the dataset's default."""
        if self.scale == "demo":
            return DEMO_SETTING
        return row.setting or default_setting(self.dataset, self.data_bin)

    def log_path(self, row: Row, seed: int) -> Path:
        return self.out_dir / "logs" / f"{row.id}-seed{seed}.log"

    def eval_dir(self, row: Row, seed: int, subset: str) -> Path:
        """Where a run's ``subset`` is decoded: ``eval/`` for the test set, ``eval-<subset>/`` for another."""
        return self.run_dir(row, seed) / ("eval" if subset == "test" else f"eval-{subset}")
