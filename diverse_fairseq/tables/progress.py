"""The runner's progress line: one line when a job starts and one when it ends, with the progress (row i of n,
seed, elapsed time, estimated time remaining)."""

import time
from typing import Dict, Optional

from .config import RunConfig
from .spec import Row, Table


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Start and end lines of the jobs: ``row i of n (seed s)``, elapsed time, estimated time remaining.

    The estimate is the mean duration of the jobs that trained in this invocation (reused runs take no
    time) applied to the queued jobs and the rest of the running ones, spread over the parallel jobs."""

    def __init__(self, table: Table, run: RunConfig, total: int):
        self.name, self.rows, self.run, self.total = table.table, table.rows, run, total
        self.start, self.started, self.durations, self.done = time.time(), {}, [], 0

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

    def _line(self, text: str):
        now = time.time()
        print(f"{text}; elapsed {clock(now - self.start)}, estimated remaining {self.remaining(now)}", flush=True)

    def begin(self, row: Row, seed: int):
        self.started[(row.id, seed)] = time.time()
        self._line(f"{self._where(row, seed)}: started")

    def end(self, row: Row, seed: int, record: Optional[Dict] = None, error: Optional[str] = None):
        seconds = time.time() - self.started.pop((row.id, seed))
        self.done += 1
        if error is not None:
            what = f"FAILED after {clock(seconds)}: {error}"
        elif record.get("reused"):
            what = f"reused the run trained {record.get('trained_at', 'earlier')}, BLEU {record['eval']['bleu']:.2f}"
        else:
            self.durations.append(seconds)
            what = f"finished in {clock(seconds)}, BLEU {record['eval']['bleu']:.2f}"
        if self.run.jobs > 1:
            what += f" (log: {self.run.log_path(row, seed)})"
        self._line(f"{self._where(row, seed)}: {what} [{self.done}/{self.total} jobs done]")
