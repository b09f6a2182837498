"""The runner's progress lines: one when a job starts (with its log), one when it ends, with the progress (row i
of n, seed, elapsed time, estimated time remaining), and while it trains a line every ``run.progress_interval``
seconds with the update, the losses and the time left of its training (:mod:`.live`)."""

import threading
import time
from typing import Dict, Optional

from .config import RunConfig
from .live import LogWatcher, clock
from .records import JobRecord
from .spec import Row, Table


class Progress:
    """Start and end lines of the jobs: ``row i of n (seed s)``, elapsed time, estimated time remaining.

    The estimate is the mean duration of the jobs that trained in this invocation (reused runs take no
    time) applied to the queued jobs and the rest of the running ones, spread over the parallel jobs."""

    def __init__(self, table: Table, run: RunConfig, total: int):
        self.name, self.rows, self.run, self.total = table.table, table.rows, run, total
        self.start, self.started, self.durations, self.done = time.time(), {}, [], 0
        self.watchers: Dict[tuple, LogWatcher] = {}
        self._print_lock = threading.Lock()  # the watchers print from their own threads

    def _where(self, row: Row, seed: int) -> str:
        i = next(i for i, r in enumerate(self.rows, 1) if r.id == row.id)
        return f"[{self.name}] row {i} of {len(self.rows)} (seed {seed}) {row.label}"

    def remaining(self, now: float) -> str:
        if self.done == self.total:
            return "0:00:00"
        if not self.durations:
            return "unknown"
        mean = sum(self.durations) / len(self.durations)
        queued = self.total - self.done - len(self.started)
        work = queued * mean + sum(max(mean - (now - t), 0.0) for t in self.started.values())
        return clock(work / max(1, min(self.run.jobs, self.total - self.done)))

    def _print(self, text: str):
        with self._print_lock:
            print(text, flush=True)

    def _line(self, text: str, after: str = ""):
        now = time.time()
        self._print(f"{text}; elapsed {clock(now - self.start)}, estimated remaining {self.remaining(now)}{after}")

    def begin(self, row: Row, seed: int):
        """The start line, with the log to follow (the job's own with ``jobs > 1``, else fairseq's), and the
        watcher of the job's training log."""
        self.started[(row.id, seed)] = time.time()
        train_log = self.run.run_dir(row, seed) / "train.log"
        log = f"log: {self.run.log_path(row, seed)}" if self.run.jobs > 1 else f"training log: {train_log}"
        self._line(f"{self._where(row, seed)}: started", after=f"; {log}")
        where = self._where(row, seed)
        self.watchers[(row.id, seed)] = LogWatcher(train_log, self.run.progress_interval,
                                                   lambda line: self._print(f"{where}: {line}")).start()

    def stop_watching(self):
        """Stop every running job's log watcher (Ctrl-C: the jobs end without :meth:`end`)."""
        for watcher in self.watchers.values():
            watcher.stop()
        self.watchers.clear()

    def end(self, row: Row, seed: int, record: Optional[JobRecord] = None, error: Optional[str] = None):
        watcher = self.watchers.pop((row.id, seed), None)
        if watcher is not None:
            watcher.stop()
        seconds = time.time() - self.started.pop((row.id, seed))
        self.done += 1
        if error is not None:
            what = f"FAILED after {clock(seconds)}: {error}"
        elif record.reused:
            what = f"reused the run trained {record.train.trained_at}, BLEU {record.eval.bleu:.2f}"
        else:
            self.durations.append(seconds)
            what = f"finished in {clock(seconds)}, BLEU {record.eval.bleu:.2f}"
        if self.run.jobs > 1:
            what += f" (log: {self.run.log_path(row, seed)})"
        self._line(f"{self._where(row, seed)}: {what} [{self.done}/{self.total} jobs done]")
