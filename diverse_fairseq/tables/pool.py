"""Jobs run at once, and their threads.

Every job runs with a fixed number of CPU threads (``threads``: the ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` of
fairseq-train and fairseq-generate, ``torch.set_num_threads`` for the in-process analysis), so a seed gives the
same numbers on any machine size. With ``jobs > 1``, :func:`run_parallel` runs ``jobs`` row/seed jobs at once,
each in its own (spawned) process with its output in ``<out>/logs/<row>-seed<N>.log``.
"""

import os
import sys
import time
from typing import Dict, List, Tuple

from .config import RunConfig
from .progress import Progress
from .spec import Row
from .steps import run_job


def limit_threads(threads: int):
    """Pin this process (in-process torch) and the subprocesses it starts to ``threads`` CPU threads."""
    import torch

    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)


def _worker_init(threads: int):
    from ..runs.cli_logging import setup_cli_logging

    limit_threads(threads)
    setup_cli_logging()


def _worker_job(row: Row, run: RunConfig, seed: int) -> Dict:
    """``run_job`` in a worker process, its output (and its subprocesses') appended to the job's log."""
    log_path = run.log_path(row, seed)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "a", encoding="utf-8") as log:
        saved = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            print(f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} {row.id} seed {seed}", flush=True)
            return run_job(row, run, seed)
        except SystemExit as e:  # a failed fairseq-train/-generate: an ordinary error for the parent
            raise RuntimeError(str(e)) from None
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_parallel(todo: List[Tuple[Row, int]], run: RunConfig,
                 progress: Progress) -> Tuple[Dict[Tuple[str, int], Dict], List[Tuple[Row, int]]]:
    """Run the ``(row, seed)`` jobs of ``todo``, ``run.jobs`` at a time in worker processes, reporting each
    start and end to ``progress``; ``({(row id, seed): record}, [(row, seed) of the failed jobs]``)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    records, failed = {}, []
    queue, running = list(todo), {}
    pool = ProcessPoolExecutor(run.jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(run.threads,))
    try:
        while queue or running:
            while queue and len(running) < run.jobs:
                row, seed = queue.pop(0)
                progress.begin(row, seed)
                running[pool.submit(_worker_job, row, run, seed)] = (row, seed)
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
    except KeyboardInterrupt:  # Ctrl-C reached the workers and their fairseq-train too: let them stop
        pool.shutdown(wait=True, cancel_futures=True)
        from .runner import TableInterrupted

        raise TableInterrupted([(row, seed, None) for row, seed in running.values()]) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return records, failed
