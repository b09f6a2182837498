"""Train, evaluate and measure every row and seed of a table (one *job* each: ``steps.run_job``), resuming whatever
is already finished, one by one in this process or ``jobs`` at once in worker processes; ``DRY_RUN=1`` prints the
commands instead. Every job runs with ``threads`` CPU threads, so a seed gives the same numbers on any machine.
"""

import json
import multiprocessing
import os
import shlex
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from .. import training
from ..data.recipes.demo import SHIPPED
from ..evaluate import command_line
from ..runs.settings import SETTINGS
from .cache import cache_key, load
from .config import RunConfig
from .progress import Progress
from .records import JobRecord
from .spec import Row, Table
from .steps import eval_request, job_plan, run_job


class TableInterrupted(KeyboardInterrupt):
    """Ctrl-C during a table run: ``jobs`` are the ``(row, seed, update)`` jobs that were running (update None:
    read from the run's log)."""

    def __init__(self, jobs: List[Tuple[Row, int, Optional[int]]]):
        super().__init__(jobs)
        self.jobs = jobs


def interrupted_lines(table: Table, run: RunConfig, jobs, resume: str) -> List[str]:
    """One line per interrupted job: the update reached, its last checkpoint's and ``resume``, the command that
    continues the table."""
    out = []
    for row, seed, update in jobs:
        log = run.run_dir(row, seed) / "train.log"
        if update is None and log.exists():
            update = training.last_update(log.read_text(encoding="utf-8", errors="replace"))
        out.append(f"[{table.table}] row {row.id} seed {seed}: "
                   + training.interrupt_message(update, run.run_dir(row, seed), resume))
    return out


def run_table(table: Table, run: RunConfig) -> Optional[Dict[str, List[JobRecord]]]:
    """``{row id: [per-seed record]}`` of every row and seed (None after a dry run); a row that trains an earlier
    row's model (:func:`same_model_rows`) gets that row's records."""
    if run.dry_run:
        return dry_run_table(table, run)
    data = run.data_bin / run.dataset
    if not (data / "prepare.json").exists():
        raise SystemExit(f"error: no prepared dataset in {data}. Prepare it first: make data DATASET={run.dataset}")
    same_as, todo = _jobs(table, run)
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


def limit_threads(threads: int):
    """Pin this process (in-process torch) and the subprocesses it starts to ``threads`` CPU threads."""
    import torch

    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)


#: in a worker process: the pool's stop event (set by the runner at Ctrl-C), given by :func:`_worker_init`
_STOP = None


def _worker_init(threads: int, stop):
    from ..runs.cli_logging import setup_cli_logging

    global _STOP
    _STOP = stop
    limit_threads(threads)
    setup_cli_logging()


def _worker_job(row: Row, run: RunConfig, seed: int) -> JobRecord:
    """``run_job`` in a worker process, its output (and its subprocesses') appended to the job's log. Ctrl-C,
    ignored while the worker starts or waits, stops a job (and its fairseq-train); a job handed out after it does
    not start."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log_path = run.log_path(row, seed)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        if _STOP.is_set():
            raise KeyboardInterrupt
        with open(log_path, "a", encoding="utf-8") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            print(f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} {row.id} seed {seed}", flush=True)
            return run_job(row, run, seed)
    except SystemExit as e:  # a failed fairseq-train/-generate: an ordinary error for the parent
        raise RuntimeError(str(e)) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in enumerate(saved, 1):
            os.dup2(copy, fd)
            os.close(copy)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_parallel(todo: List[Tuple[Row, int]], run: RunConfig,
                 progress: Progress) -> Tuple[Dict[Tuple[str, int], JobRecord], List[Tuple[Row, int]]]:
    """Run ``todo``, ``run.jobs`` at a time in spawned worker processes (output in :meth:`RunConfig.log_path`);
    ``({(row id, seed): record}, [(row, seed) of the failed jobs])``. Ctrl-C stops the workers and their
    fairseq-train, and :class:`TableInterrupted` names the running jobs; this process then ignores Ctrl-C (a second
    one would interrupt the shutdown, or the interpreter's exit), as the CLI ends right after."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    records, failed = {}, []
    queue, running = list(todo), {}
    pool = ProcessPoolExecutor(run.jobs, mp_context=context, initializer=_worker_init, initargs=(run.threads, stop))
    try:
        while queue or running:
            while queue and len(running) < run.jobs:
                row, seed = queue.pop(0)
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by a worker this starts
                try:
                    running[pool.submit(_worker_job, row, run, seed)] = (row, seed)
                finally:
                    signal.signal(signal.SIGINT, previous)
                progress.begin(row, seed)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                row, seed = running[future]  # still running for Ctrl-C until its result is taken
                try:
                    records[row.id, seed] = future.result()  # a worker's Ctrl-C: training.Interrupted
                    progress.end(row, seed, records[row.id, seed])
                except Exception as e:  # noqa: BLE001 - reported by the runner with the job's log
                    failed.append((row, seed))
                    progress.end(row, seed, error=str(e) or type(e).__name__)
                del running[future]
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # from now on: a second Ctrl-C while the jobs stop, or later
        stop.set()  # the jobs not yet started do not start; the pool shuts down below
        raise TableInterrupted([(row, seed, None) for row, seed in running.values()]) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return records, failed


def _jobs(table: Table, run: RunConfig) -> Tuple[Dict[str, str], List[Tuple[Row, int]]]:
    """:func:`same_model_rows` (each printed) and the ``(row, seed)`` jobs of the other rows."""
    same_as = same_model_rows(table, run)
    for row_id, first in same_as.items():
        print(f"[{table.table}] row {row_id} trains the same model as row {first} at this scale "
              f"(the same run identity and cache key): it gets {first}'s runs", flush=True)
    return same_as, [(row, seed) for row in table.rows if row.id not in same_as for seed in run.seeds]


def dry_run_table(table: Table, run: RunConfig):
    """``DRY_RUN=1``: print what a run would do (data preparation, probing downloads, each job's commands and
    whether its finished run would be reused); nothing is run or written."""
    data = run.data_bin / run.dataset
    if run.probing_tasks:
        print(f"[{table.table}] probing tasks {', '.join(run.probing_tasks)}: files in {run.probing_dir} (a real run "
              f"downloads the missing ones first)", flush=True)
    if not (data / "prepare.json").exists():
        demo = run.dataset in SHIPPED
        prepare = f"bash scripts/prepare_data.sh {run.dataset}" if demo else f"make data DATASET={run.dataset}"
        print(f"[{table.table}] DRY_RUN=1: {data} is not prepared, and the training commands depend on it "
              f"(languages, dictionaries); {'a real run prepares it first' if demo else 'prepare it'} ({prepare}), "
              f"then run the dry run again to see them. Rows: "
              + "; ".join(f"{row.id} ({row.arch(SETTINGS[run.setting(row)].arch)} {shlex.join(row.args)})"
                          for row in table.rows), flush=True)
        return
    _, todo = _jobs(table, run)
    print(f"[{table.table}] DRY_RUN=1: the commands of {len(todo)} job(s); nothing is run or written", flush=True)
    threads = "".join(f"{k}={v} " for k, v in run.thread_env().items())
    device = "CUDA_VISIBLE_DEVICES='' " if run.gpus == 0 else ""
    for row, seed in todo:
        job = job_plan(row, run, seed)
        run_dir = run.run_dir(row, seed)
        if (load(run_dir / "train.json") or {}).get("key") == cache_key(job):
            state = "finished earlier: its training would be reused"
        elif (run_dir / "checkpoint_last.pt").exists():
            state = "interrupted: training would resume it, or start afresh if its options changed"
        else:
            state = "would be trained"
        checkpoint = str(job.checkpoint(averaged=job.average))
        evaluations = "".join(
            f"\n    evaluate: {threads}" + shlex.join([sys.executable, "-m", "diverse_fairseq.evaluate", *command_line(
                eval_request(run, row, seed, checkpoint, subset))]) for subset in run.subsets)
        print(f"  {row.id} seed {seed} ({job.arch}, {job.setting_name}; {state}):\n"
              f"    train:    {threads}{device}{shlex.join(job.command)}{evaluations}", flush=True)
    print(f"[{table.table}] then head-diversity scores{' and probing' if run.probing_tasks else ''} of each "
          f"checkpoint, and the report in {run.out_dir.parent}", flush=True)


def same_model_rows(table: Table, run: RunConfig) -> Dict[str, str]:
    """``{row id: id of the first earlier row}`` for rows with an earlier row's cache key (first seed's plan):
    e.g. at demo scale NAACL 2019 Table 3's rows [1-3], [1,2] and [1] map to one demo layer (``scale.py``), or a
    row only spells out a default. Trained once, its runs stand for every such row. The data must exist."""
    keys = {row.id: json.dumps(cache_key(job_plan(row, run, run.seeds[0])), sort_keys=True) for row in table.rows}
    first: Dict[str, str] = {}
    for row_id, key in keys.items():
        first.setdefault(key, row_id)
    return {row_id: first[key] for row_id, key in keys.items() if first[key] != row_id}
