"""Train, evaluate and measure every row of a table, resuming whatever is already finished.

The orchestration: :func:`run_table` finds the rows that train the same model at this scale
(:func:`same_model_rows`), runs each remaining row and seed (one *job*: ``steps.run_job``, train, evaluate,
measure) one after the other in this process with its output on the console (``jobs = 1``) or ``jobs`` at once
in worker processes (``pool.py``), prints a line when a job starts and one when it ends (``progress.py``), and
returns every row's per-seed records. ``DRY_RUN=1`` prints the commands instead (:func:`dry_run_table`).

The jobs' modules: ``config.py`` (:class:`RunConfig`: what one invocation runs and where it writes),
``steps.py`` (the steps of a job), ``keys.py`` (the cache key of a training run), ``cache.py`` (the cache helper
of the four cached steps, the checkpoint identity), ``pool.py`` (the worker processes and CPU threads),
``progress.py`` (the progress line).
"""

import json
import shlex
import sys
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from .. import training
from ..evaluate import command_line
from .cache import lookup
from .config import RunConfig
from .keys import cache_key
from .pool import limit_threads, run_parallel
from .progress import Progress
from .records import JobRecord
from .spec import Row, Table
from .steps import eval_request, job_plan, run_job


class TableInterrupted(KeyboardInterrupt):
    """Ctrl-C during a table run: ``jobs`` are the ``(row, seed, update)`` jobs that were running, ``update`` the
    last one fairseq-train reported (None: unknown; :func:`interrupted_lines` then reads the run's log)."""

    def __init__(self, jobs: List[Tuple[Row, int, Optional[int]]]):
        super().__init__(jobs)
        self.jobs = jobs


def interrupted_lines(table: Table, run: RunConfig, jobs, resume: str) -> List[str]:
    """One line per interrupted job: the update reached, the update of its last checkpoint and ``resume``, the
    command that continues the table (finished rows are reused, interrupted ones resume)."""
    out = []
    for row, seed, update in jobs:
        log = run.run_dir(row, seed) / "train.log"
        if update is None and log.exists():
            update = training.last_update(log.read_text(encoding="utf-8", errors="replace"))
        out.append(f"[{table.table}] row {row.id} seed {seed}: "
                   + training.interrupt_message(update, run.run_dir(row, seed), resume))
    return out


def run_table(table: Table, run: RunConfig) -> Dict[str, List[JobRecord]]:
    """Train and evaluate every row and seed (``run.jobs`` at once); return ``{row id: [per-seed record]}``."""
    data = run.data_bin / run.dataset
    if not (data / "prepare.json").exists():
        raise SystemExit(f"error: no prepared dataset in {data}. Prepare it first: make data DATASET={run.dataset}")
    same_as = same_model_rows(table, run)
    todo = [(row, seed) for row in table.rows if row.id not in same_as for seed in run.seeds]
    for row_id, first in same_as.items():
        print(f"[{table.table}] row {row_id} trains the same model as row {first} at this scale "
              f"(the same run identity and cache key): it gets {first}'s runs", flush=True)
    if run.dry_run:
        dry_run_table(table, run, todo)
        return None
    progress = Progress(table, run, len(todo))
    print(f"[{table.table}] {len(table.rows)} rows x {len(run.seeds)} seed(s) = {len(todo)} jobs, {run.jobs} at a "
          f"time, {run.threads} CPU thread(s) each", flush=True)
    try:
        if run.jobs == 1:
            records, failed = {}, []
            limit_threads(run.threads)
            for row, seed in todo:
                progress.begin(row, seed)
                try:
                    records[row.id, seed] = run_job(row, run, seed)
                except KeyboardInterrupt as e:  # Ctrl-C: fairseq-train stopped too (training.Interrupted)
                    raise TableInterrupted([(row, seed, getattr(e, "update", None))]) from None
                progress.end(row, seed, records[row.id, seed])
        else:
            records, failed = run_parallel(todo, run, progress)
    except KeyboardInterrupt:
        progress.stop_watching()  # no progress line after the interrupted rows' lines
        raise
    if failed:
        logs_ = "\n".join(f"  {row.id} seed {seed}: {run.log_path(row, seed)}" for row, seed in failed)
        raise SystemExit(f"error: {len(failed)} job(s) failed; their logs:\n{logs_}")
    return {row.id: [records[row.id, seed] if row.id not in same_as else
                     replace(records[same_as[row.id], seed], same_as=same_as[row.id]) for seed in run.seeds]
            for row in table.rows}


def dry_run_table(table: Table, run: RunConfig, todo: List[tuple]):
    """``DRY_RUN=1``: print each job's training and evaluation commands (and whether a finished run would be
    reused); nothing is trained, evaluated or written."""
    print(f"[{table.table}] DRY_RUN=1: the commands of {len(todo)} job(s); nothing is run or written", flush=True)
    for row, seed in todo:
        job = job_plan(row, run, seed)
        run_dir = run.run_dir(row, seed)
        if lookup(run_dir / "train.json", cache_key(job)).hit:
            state = "finished earlier: its training would be reused"
        elif (run_dir / "checkpoint_last.pt").exists():
            state = "interrupted: training would resume it, or start afresh if its options changed"
        else:
            state = "would be trained"
        checkpoint = job.checkpoint(averaged=job.average)
        eval_cmds = [[sys.executable, "-m", "diverse_fairseq.evaluate",
                      *command_line(eval_request(run, row, seed, str(checkpoint), subset))] for subset in run.subsets]
        threads = "".join(f"{k}={v} " for k, v in run.thread_env().items())
        device = "CUDA_VISIBLE_DEVICES='' " if run.gpus == 0 else ""
        print(f"  {row.id} seed {seed} ({job.arch}, {job.setting_name}; {state}):\n"
              f"    train:    {threads}{device}{shlex.join(job.command)}"
              + "".join(f"\n    evaluate: {threads}{shlex.join(cmd)}" for cmd in eval_cmds), flush=True)
    print(f"[{table.table}] then head-diversity scores{' and probing' if run.probing_tasks else ''} of each "
          f"checkpoint, and the report in {run.out_dir.parent}", flush=True)


def same_model_rows(table: Table, run: RunConfig) -> Dict[str, str]:
    """``{row id: id of the first earlier row}`` for rows whose run is an earlier row's: the same cache key
    (:func:`~diverse_fairseq.tables.keys.cache_key` of the first seed's plan: the run identity over the effective
    option values, the updates, the averaging, the setting and the data), the key that decides reuse.

    At demo scale several paper layer lists map to one demo layer (``scale.py``), so e.g. NAACL 2019 Table 3's
    rows [1-3], [1,2] and [1] are one model; so is a row that only spells out a default. It is trained once and
    its runs stand for every such row. The identity holds the prepared data's metadata: the data must exist."""
    first: Dict[str, str] = {}
    out = {}
    for row in table.rows:
        key = json.dumps(cache_key(job_plan(row, run, run.seeds[0])), sort_keys=True)
        if key in first:
            out[row.id] = first[key]
        else:
            first[key] = row.id
    return out
