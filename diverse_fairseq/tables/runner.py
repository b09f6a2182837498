"""Train, evaluate and measure every row and seed of a table (one *job* each: :func:`~.job.run_job` of its
:class:`~.job.TableJob`), resuming whatever is already finished, one by one in this process or ``jobs`` at once in
worker processes; ``DRY_RUN=1`` prints the jobs' commands instead. Every job runs with ``threads`` CPU threads, so a
seed gives the same numbers again on the same machine type with the same library versions (docs/reproducing.md,
"What may differ across machines").
"""

import multiprocessing
import os
import shlex
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Dict, List, Mapping, Optional, Tuple

from .. import training
from ..data.recipes.demo import SHIPPED
from ..evaluate import command_line
from ..runs.hints import prepare_hint
from ..runs.settings import SETTINGS
from .cache import cache_key, load
from .config import RunConfig
from .job import TableJob, finished_record, run_job, table_jobs
from .progress import Progress
from .records import JobRecord
from .spec import Table


class TableInterrupted(KeyboardInterrupt):
    """Ctrl-C during a table run: ``jobs`` are the ``(job, update)`` of the jobs that were running (update None:
    read from the run's log)."""

    def __init__(self, jobs: List[Tuple[TableJob, Optional[int]]]):
        super().__init__(jobs)
        self.jobs = jobs


def interrupted_lines(jobs: List[Tuple[TableJob, Optional[int]]], resume: str) -> List[str]:
    """One line per interrupted job: the update reached, its last checkpoint's and ``resume``, the command that
    continues the table."""
    out = []
    for job, update in jobs:
        log = job.run_dir / "train.log"
        if update is None and log.exists():
            update = training.last_update(log.read_text(encoding="utf-8", errors="replace"))
        out.append(f"[{job.table}] row {job.row} seed {job.seed}: "
                   + training.interrupt_message(update, job.run_dir, resume))
    return out


def run_table(table: Table, run: RunConfig, env: Mapping[str, str]) -> Optional[Dict[str, List[JobRecord]]]:
    """``{row id: [per-seed record]}`` of every row and seed (None after a dry run); a row that trains an earlier
    row's model (:func:`~.job.table_jobs`) gets that row's records. ``env``: this machine's environment (the jobs')."""
    if run.dry_run:
        return dry_run_table(table, run)
    data = run.data_bin / run.dataset
    if not (data / "prepare.json").exists():
        raise SystemExit(f"error: no prepared dataset in {data}. Prepare it first: {prepare_hint(data)}")
    jobs = table_jobs(table, run)
    if run.slurm is not None:  # LAUNCHER=slurm
        from .slurm import run_on_slurm

        print(f"[{table.table}] {len(table.rows)} rows x {len(run.seeds)} seed(s) = {len(jobs)} jobs, each a SLURM "
              f"job", flush=True)
        return _by_row(table, run, jobs, run_on_slurm(jobs, run.slurm, run.progress_interval))
    progress = Progress(table, run, len(jobs))
    print(f"[{table.table}] {len(table.rows)} rows x {len(run.seeds)} seed(s) = {len(jobs)} jobs, {run.jobs} at a "
          f"time, {run.threads} CPU thread(s) each", flush=True)
    try:
        if run.jobs == 1:
            records, failed = {}, []
            for job in jobs:
                progress.begin(job)
                try:
                    records[job.row, job.seed] = run_job(job, env)
                except KeyboardInterrupt as e:  # Ctrl-C: fairseq-train stopped too (training.Interrupted)
                    raise TableInterrupted([(job, getattr(e, "update", None))]) from None
                progress.end(job, records[job.row, job.seed])
        else:
            records, failed = run_parallel(jobs, run, env, progress)
    except KeyboardInterrupt:
        progress.stop_watching()  # no progress line after the interrupted rows' lines
        raise
    if failed:
        logs_ = "\n".join(f"  {job.tag}: {job.log_path}" for job in failed)
        raise SystemExit(f"error: {len(failed)} job(s) failed; their logs:\n{logs_}")
    return _by_row(table, run, jobs, records)


def _by_row(table: Table, run: RunConfig, jobs: List[TableJob],
            records: Dict[Tuple[str, int], JobRecord]) -> Dict[str, List[JobRecord]]:
    """``{row id: [per-seed record]}`` of the jobs' ``{(row, seed): record}``, a same-model row's from its job."""
    by_row = {(row, job.seed): records[job.row, job.seed] if row == job.row else
              replace(records[job.row, job.seed], same_as=job.row) for job in jobs for row in job.rows}
    return {row.id: [by_row[row.id, seed] for seed in run.seeds] for row in table.rows}


#: in a worker process: the pool's stop event (set by the runner at Ctrl-C), given by :func:`_worker_init`
_STOP = None


def _worker_init(stop):
    from ..runs.cli_logging import setup_cli_logging

    global _STOP
    _STOP = stop
    setup_cli_logging()


def _worker_job(job: TableJob, env: Mapping[str, str]) -> JobRecord:
    """:func:`~.job.run_job` in a worker process, its output (and its subprocesses') appended to the job's log.
    Ctrl-C, ignored while the worker starts or waits, stops a job (and its fairseq-train); a job handed out after it
    does not start."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        if _STOP.is_set():
            raise KeyboardInterrupt
        with open(job.log_path, "a", encoding="utf-8") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            print(f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} {job.tag}", flush=True)
            return run_job(job, env)
    except SystemExit as e:  # a failed fairseq-train/-generate: an ordinary error for the parent
        raise RuntimeError(str(e)) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in enumerate(saved, 1):
            os.dup2(copy, fd)
            os.close(copy)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_parallel(todo: List[TableJob], run: RunConfig, env: Mapping[str, str],
                 progress: Progress) -> Tuple[Dict[Tuple[str, int], JobRecord], List[TableJob]]:
    """Run ``todo``, ``run.jobs`` at a time in spawned worker processes (output in :attr:`TableJob.log_path`);
    ``({(row id, seed): record}, [the failed jobs])``. Ctrl-C stops the workers and their fairseq-train, and
    :class:`TableInterrupted` names the running jobs; this process then ignores Ctrl-C (a second one would interrupt
    the shutdown, or the interpreter's exit), as the CLI ends right after."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    records, failed = {}, []
    queue, running = list(todo), {}
    pool = ProcessPoolExecutor(run.jobs, mp_context=context, initializer=_worker_init, initargs=(stop,))
    try:
        while queue or running:
            while queue and len(running) < run.jobs:
                job = queue.pop(0)
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by a worker this starts
                try:
                    running[pool.submit(_worker_job, job, env)] = job
                finally:
                    signal.signal(signal.SIGINT, previous)
                progress.begin(job)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                job = running[future]  # still running for Ctrl-C until its result is taken
                try:
                    records[job.row, job.seed] = future.result()  # a worker's Ctrl-C: training.Interrupted
                    progress.end(job, records[job.row, job.seed])
                except Exception as e:  # noqa: BLE001 - reported by the runner with the job's log
                    failed.append(job)
                    progress.end(job, error=str(e) or type(e).__name__)
                del running[future]
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # from now on: a second Ctrl-C while the jobs stop, or later
        stop.set()  # the jobs not yet started do not start; the pool shuts down below
        raise TableInterrupted([(job, None) for job in running.values()]) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return records, failed


def dry_run_table(table: Table, run: RunConfig):
    """``DRY_RUN=1``: print what a run would do (data preparation, probing downloads, each job's commands and
    whether its finished run would be reused), from the jobs' plans; nothing is run or written."""
    data = run.data_bin / run.dataset
    if run.probing_tasks:
        print(f"[{table.table}] probing tasks {', '.join(run.probing_tasks)}: files in {run.probing_dir} (a real run "
              f"downloads the missing ones first)", flush=True)
    if not (data / "prepare.json").exists():
        demo = run.dataset in SHIPPED
        prepare = prepare_hint(data)
        print(f"[{table.table}] DRY_RUN=1: {data} is not prepared, and the training commands depend on it "
              f"(languages, dictionaries); {'a real run prepares it first' if demo else 'prepare it'} ({prepare}), "
              f"then run the dry run again to see them. Rows: "
              + "; ".join(f"{row.id} ({row.arch(SETTINGS[run.setting(row)].arch)} {shlex.join(row.args)})"
                          for row in table.rows), flush=True)
        return
    jobs = table_jobs(table, run)
    print(f"[{table.table}] DRY_RUN=1: the commands of {len(jobs)} job(s); nothing is run or written", flush=True)
    for job in jobs:
        p = job.plan
        threads = "".join(f"{k}={v} " for k, v in job.env.items())
        device = "CUDA_VISIBLE_DEVICES='' " if p.gpus == 0 else ""
        if finished_record(job) is not None:
            state = "finished earlier: its record would be reused"
        elif (load(job.run_dir / "train.json") or {}).get("key") == cache_key(p):
            state = "finished earlier: its training would be reused"
        elif (job.run_dir / "checkpoint_last.pt").exists():
            state = "interrupted: training would resume it, or start afresh if its options changed"
        else:
            state = "would be trained"
        evaluations = "".join(f"\n    evaluate: {threads}" + shlex.join(
            [sys.executable, "-m", "diverse_fairseq.evaluate", *command_line(r)]) for r in job.evals)
        print(f"  {job.tag} ({p.arch}, {p.setting_name}; {state}):\n"
              f"    train:    {threads}{device}{shlex.join(p.command)}{evaluations}", flush=True)
    print(f"[{table.table}] then head-diversity scores{' and probing' if run.probing_tasks else ''} of each "
          f"checkpoint, and the report in {run.out_dir.parent}", flush=True)
