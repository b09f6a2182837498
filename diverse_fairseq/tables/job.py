"""A table's job as one value: :class:`TableJob` (a row and seed, with the rows that train the same model), built
once on the submitting side (:func:`table_jobs`), and :func:`run_job`, the one job function (train or reuse,
average, evaluate, scores, probing) that the runner's own loop, its worker pool and the SLURM launcher call with
the environment of the machine that runs it. The job writes its :class:`JobRecord` as ``job.json`` in its run
directory; :func:`finished_record` reads it back while its key (:func:`job_key`) is the job's.
"""

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..evaluate import EvalRequest
from ..runs.checkpoint_file import trained_updates
from ..runs.lock import run_lock
from ..runs.plan import Plan, TrainRequest, plan
from ..runs.settings import SETTINGS
from . import scale, steps
from .cache import cache_key, load, store
from .config import RunConfig
from .records import JobRecord, from_json
from .spec import Row, Table

RECORD = "job.json"


@dataclass(frozen=True)
class TableJob:
    """One job of a table, everything it needs to run anywhere (it pickles: submitit sends it to a SLURM node)."""

    table: str  # the table's id
    rows: Tuple[str, ...]  # the ids of the rows whose runs these are: the job's row, then those of the same model
    seed: int
    plan: Plan  # the training: the run's arguments, save directory (the run directory), checkpoint, decoding
    evals: Tuple[EvalRequest, ...]  # one per subset, the report's first: the plan's decoding and precision
    row_args: Tuple[str, ...]  # the row's flags, mapped to the setting's depth (scale.py)
    train_args: Tuple[str, ...]  # TRAIN_ARGS, appended to every row's flags
    probing_tasks: Tuple[str, ...]  # SentEval tasks probed on the run's encoder (none: no probing)
    probing_dir: Optional[Path]  # their files
    log_path: Path  # the job's output where it does not run in the runner's own process
    threads: int  # CPU threads of the job's torch and of its subprocesses
    env: Dict[str, str]  # added to the environment of its subprocesses (their threads)
    rerun: str  # what runs the table again (the hints name it)

    @property
    def row(self) -> str:
        return self.rows[0]

    @property
    def tag(self) -> str:
        return f"{self.row} seed {self.seed}"

    @property
    def run_dir(self) -> Path:
        return self.plan.save_dir

    @property
    def data(self) -> Path:
        return Path(self.plan.request.data_bin) / self.plan.request.dataset

    @property
    def device(self) -> str:  # of the in-process steps (head-diversity scores, probing)
        return "cuda" if self.plan.gpus else "cpu"


def job_plan(row: Row, run: RunConfig, seed: int) -> Plan:
    """The one function that turns a table row and seed into its plan (training, cache key, dry run, check)."""
    run_dir, setting = run.run_dir(row, seed), run.setting(row)
    # the row's family and flags (layer flags mapped to the setting's depth, scale.py), TRAIN_ARGS, and the JSON log
    # (read by progress.py) of every run, which TRAIN_ARGS may not set
    extra = ["--arch", row.arch(SETTINGS[setting].arch), *scale.row_args(row.args, setting),
             "--log-file", str(run_dir / "train.log"), *run.train_args, "--log-format", "json"]
    return plan(TrainRequest(
        dataset=run.dataset, setting=setting, extra=tuple(extra), seed=seed, save_dir=run_dir,
        data_bin=run.data_bin, gpus=run.gpus,
        options=replace(run.train_options, dry_run=False),  # the runner's own dry run never calls training.run
        entry=run.train_hook))


def make_job(table: str, row: Row, run: RunConfig, seed: int, same: Sequence[str] = ()) -> TableJob:
    """The job of ``row`` and ``seed`` (``same``: the rows that train the same model), its plan built here."""
    p = job_plan(row, run, seed)
    d, threads = p.decoding, str(run.threads)
    evals = tuple(EvalRequest(
        checkpoint=p.checkpoint(p.average), data_dir=Path(run.data_bin) / run.dataset, subset=subset, beam=d.beam,
        lenpen=d.lenpen, length_penalty=d.length_penalty, beam_search=d.beam_search, max_len_a=d.max_len_a,
        max_len_b=d.max_len_b, out=run.eval_dir(row, seed, subset), cpu=p.gpus == 0, precision=p.precision,
        generate_args=tuple(run.generate_args)) for subset in run.subsets)
    return TableJob(table=table, rows=(row.id, *same), seed=seed, plan=p, evals=evals,
                    row_args=tuple(scale.row_args(row.args, p.setting_name)), train_args=tuple(run.train_args),
                    probing_tasks=tuple(run.probing_tasks), probing_dir=run.probing_dir,
                    log_path=run.log_path(row, seed), threads=run.threads, rerun=run.rerun,
                    env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"})


def table_jobs(table: Table, run: RunConfig) -> List[TableJob]:
    """Every job of ``table``, row by row and seed by seed, one plan each. Rows whose first seed's plan has an
    earlier row's cache key (e.g. at demo scale NAACL 2019 Table 3's rows [1-3], [1,2] and [1] map to one demo
    layer, ``scale.py``, or a row only spells out a default) are trained once: the earlier row's jobs carry them
    (:attr:`TableJob.rows`; a line says so). The data must be prepared."""
    groups: Dict[str, List[TableJob]] = {}
    for row in table.rows:
        job = make_job(table.table, row, run, run.seeds[0])
        groups.setdefault(json.dumps(cache_key(job.plan), sort_keys=True), []).append(job)
    jobs = []
    for first, *others in groups.values():
        for other in others:
            print(f"[{table.table}] row {other.row} trains the same model as row {first.row} at this scale (the "
                  f"same run identity and cache key): it gets {first.row}'s runs", flush=True)
        same = tuple(other.row for other in others)
        jobs += [replace(first, rows=first.rows + same),
                 *(make_job(table.table, table.row(first.row), run, seed, same) for seed in run.seeds[1:])]
    return jobs


def job_key(job: TableJob) -> Dict:
    """What a job's record must match to be read back: its training's cache key, its evaluations' settings and its
    probing tasks; JSON-normalised."""
    return json.loads(json.dumps({"train": cache_key(job.plan), "evals": [steps.evaluation_settings(r) for r in
                                                                         job.evals], "probing": job.probing_tasks}))


def finished_record(job: TableJob) -> Optional[JobRecord]:
    """The record ``job`` wrote when it finished (``job.json``), while its key is the job's, with the paths of this
    run directory (the results directory may have moved); else None. Nothing is run or checked besides."""
    data = load(job.run_dir / RECORD)
    if data is None or data.get("key") != job_key(job):
        return None
    record = from_json(JobRecord, data)
    train = replace(record.train, checkpoint=str(job.plan.checkpoint(record.train.averaged_checkpoints)))
    return replace(record, train=train, evals={r.subset: replace(record.evals[r.subset], out=str(r.out))
                                               for r in job.evals})


def resumes_from(job: TableJob) -> Optional[int]:
    """The update at which the job's training resumes: that of the ``checkpoint_last.pt`` of an interrupted run of
    the job's cache key in its run directory (:func:`~.steps.resumable`). None for a new run, a finished one, one
    made by a different command, or one without a readable ``checkpoint_last.pt``."""
    if not steps.resumable(job.run_dir, cache_key(job.plan)):
        return None
    return trained_updates(job.run_dir / "checkpoint_last.pt")


def run_job(job: TableJob, env: Mapping[str, str]) -> JobRecord:
    """The job's record: :func:`finished_record` if it has one, else train (or reuse, or resume), evaluate, score
    head disagreement (and probe) holding the run's lock (:func:`~diverse_fairseq.runs.lock.run_lock`), and write
    the record. ``env``: the environment of the machine that runs the job, read once by its entry point; the job's
    subprocesses get it with :attr:`TableJob.env`."""
    record = finished_record(job)
    if record is not None:
        print(f"  [{job.tag}] training finished earlier ({record.train.trained_at}) and evaluated: reusing its "
              f"record {job.run_dir / RECORD}", flush=True)
        return replace(record, reused=True)
    torch.set_num_threads(job.threads)
    env = {**env, **job.env}
    with run_lock(job.run_dir, env, rerun=job.rerun):
        train, reused = steps.train(job, env)
        checkpoint = Path(train.checkpoint)
        record = JobRecord(
            train=train, reused=reused,
            evals={r.subset: steps.evaluation(job, replace(r, checkpoint=checkpoint)) for r in job.evals},
            disagreement=steps.disagreement_scores(job, checkpoint),
            probing=steps.probing_scores(job, checkpoint) if job.probing_tasks else None)
        store(job.run_dir / RECORD, dict(asdict(record), key=job_key(job)))
    return record
