"""The table runner's options (``python -m diverse_fairseq.tables``, ``make table-<id>``): :class:`TableOptions`,
one :mod:`~diverse_fairseq.runs.options` field each, every one with its environment variable (the make targets
pass them), checked before any work starts (``tables/__main__.py``'s ``parse_options``)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Mapping, Optional

from .. import training
from ..data.download import mirror_option
from ..data.senteval import probing_data_option
from ..runs import env_checks
from ..runs.options import choice, gpus_option, integer, number, option, seeds, switch, words
from ..runs.options import path as a_path
from ..runs.paths import data_bin_option
from ..runs.plan import TrainOptions
from .cache import RUNNER_FLAGS

SCALES = ("demo", "paper")
SUBSETS = ("valid", "test")


def parse_subsets(label: str, text) -> List[str]:
    """``SUBSETS``: distinct names among valid and test, comma-separated."""
    subsets = [s.strip() for s in str(text).split(",")]
    if not all(s in SUBSETS for s in subsets) or len(set(subsets)) != len(subsets):
        raise env_checks.bad(label, text, f"use {', '.join(SUBSETS)} or both, comma-separated")
    return subsets


def parse_hook(label: str, text) -> str:
    """``TRAIN_HOOK``: an existing Python script (its absolute path)."""
    path = Path(text)
    if not path.is_file() or path.suffix != ".py":
        raise env_checks.bad(label, text, "name a Python script that exists, e.g. scripts/experiments/kernel_probe.py")
    return str(path.resolve())


def parse_train_args(label: str, text) -> List[str]:
    """``TRAIN_ARGS``: fairseq-train flags, without the ones the runner sets itself (:data:`RUNNER_FLAGS`)."""
    args = words(label, text)
    taken = [a for a in args if a.split("=", 1)[0] in RUNNER_FLAGS]
    if taken:
        raise env_checks.bad(label, text, f"leave out {' '.join(taken)}: the runner sets {' and '.join(RUNNER_FLAGS)} "
                                          f"itself (it reads fairseq's JSON log records from the run's train.log)")
    return args


@dataclass(frozen=True)
class TableOptions:
    """What one invocation of the table runner was asked: ``--flag``, else the variable in brackets, else the
    default. ``train_options`` are ``scripts/train.sh``'s launch variables (MAX_UPDATE, PRECISION, ...), applied to
    every row's training."""

    table: str  # a table id from configs/tables/ or a YAML path
    data_bin: Path = data_bin_option()
    dataset: Optional[str] = option("DATASET", "dataset to run on; default: the table's paper dataset at scale paper, "
                                               "demo at scale demo")
    scale: str = option("SCALE", "demo or paper, exactly", "demo", choice(SCALES))
    seeds: List[int] = option("SEEDS", "a count N (seeds 1..N) or a comma-separated list of positive seeds",
                              parse=seeds, default_factory=lambda: [1])
    gpus: Optional[int] = gpus_option()
    threads: int = option("THREADS", "CPU threads of every training/decoding job (OMP_NUM_THREADS, MKL_NUM_THREADS, "
                                     "torch): fixed, so that a seed gives the same numbers again on the same machine "
                                     "type with the same library versions (not on any machine: docs/reproducing.md)",
                          1, integer(1))
    jobs: Optional[int] = option("JOBS", "row/seed jobs run at once, each with its log in <out>/logs/; default: the "
                                         "CPU cores (at most the number of jobs), 1 with GPUs", None, integer(1))
    out: Optional[Path] = option("RESULTS", "results directory (default results/<table>)", None, a_path)
    train_args: List[str] = option("TRAIN_ARGS", "extra fairseq-train flags for every row, e.g. '--max-update 100'",
                                   parse=parse_train_args, default_factory=list)
    probing_data: Optional[Path] = probing_data_option()
    mirror: Optional[str] = mirror_option("URL or directory holding the demo's and the probing tasks' files by name, "
                                          "used instead of the public addresses")
    generate_args: List[str] = option("GENERATE_ARGS", "extra fairseq-generate flags for every row, e.g. '--beam 1'",
                                      parse=words, default_factory=list)
    rows: str = option("ROWS", "comma-separated row ids to run (default: all); a chosen row's baseline runs too", "")
    subsets: List[str] = option("SUBSETS", "comma-separated subsets to decode, valid and/or test; the first is the "
                                           "report's BLEU (default test)", parse=parse_subsets,
                                default_factory=lambda: ["test"])
    train_hook: Optional[str] = option(
        "TRAIN_HOOK", "a Python script started in place of 'python -m fairseq_cli.train' with the same arguments, to "
        "watch each training, e.g. scripts/experiments/kernel_probe.py (records the SVGD kernel); not part of the "
        "cache key, so a finished run is reused without it", None, parse_hook)
    allow_unverified_data: bool = option(
        "ALLOW_UNVERIFIED_DATA", "1: run a paper-scale table on data that prepare.json records as not the published "
        "data (skipped or partial CWMT, a corpus count that differs from the published one); SentEval stand-ins are "
        "still refused", False, switch)
    progress_interval: float = option(
        "PROGRESS_INTERVAL", "seconds between two progress lines of a training row (update, losses, time left), "
        "printed only when fairseq has logged since the last one; 0: every record it logs (default 30)", 30.0,
        number(0))
    dry_run: bool = option("DRY_RUN", "1: print every row's training and evaluation commands, run and write nothing",
                           False, switch)
    train_options: TrainOptions = field(default_factory=TrainOptions)


def check_gpus(options: TableOptions, env: Mapping[str, str]):
    """GPUS given: more than this machine shows stop now, not when the first row starts training (the local launcher
    trains every row here). Unset, every GPU visible to the process that trains, decided there.
    A launcher that trains elsewhere (LAUNCHER=slurm) cannot see the GPUs of the machine that trains: there, GPUS
    must be given instead (refuse before any work, naming ``GPUS=N``) and is not checked against this machine."""
    # LAUNCHER=slurm (the launcher's option, issue 36): return here, refusing GPUS unset before any work
    if options.gpus:
        training.select_gpus(options.gpus, env, training.visible_gpus())
