"""fairseq-train's JSON log (``train.log``), read for a run's record and for the runner's progress lines.

With ``--log-format json`` fairseq writes each progress record as a JSON object on its own line (after a logging
prefix): the periodic ``train_inner`` records (``{"loss": "7.7", "num_updates": "3", "wall": "20", ...}``) and the
end-of-epoch summaries, whose keys carry the subset's name (``{"train_loss": "7.715", ...}``, ``{"valid_loss":
...}``); see fairseq/logging/progress_bar.py. Text logs are not read.
"""

import json
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional

from ..runs.checkpoint_file import damage
from .config import RunConfig
from .records import JobRecord
from .spec import Table

if TYPE_CHECKING:  # job.py imports steps.py, which imports this module
    from .job import TableJob

_PARAMS = re.compile(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)")
_MAX_UPDATE = re.compile(r"'max_update': (\d+)")  # in the configuration fairseq_cli.train logs at start-up


def model_parameters(log: str) -> Optional[int]:
    """Trained parameters as fairseq_cli.train prints them at its last start-up."""
    found = _PARAMS.findall(log)
    return int(found[-1][1].replace(",", "")) if found else None


def records(log: str) -> Iterator[Dict]:
    """Every JSON object that a line of ``log`` holds, after an optional fairseq logging prefix."""
    for line in log.splitlines():
        start = line.find("{")
        if start < 0 or not line.rstrip().endswith("}"):
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue  # a line that only looks like JSON (fairseq's start-up configuration dump is a Python dict)
        if isinstance(record, dict):
            yield record


def number(value) -> Optional[float]:
    """``value`` as a float (fairseq's JSON logs hold numbers as strings), or None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def last_summary(log: str, subset: str) -> Dict[str, float]:
    """The last end-of-epoch summary of ``subset`` (``train`` or ``valid``) as a name → number dict without the
    subset prefix (``train_num_updates`` → ``num_updates``); {} if the log has none."""
    if subset not in ("train", "valid"):
        raise ValueError(f"subset={subset!r} is not valid: use 'train' or 'valid'")
    prefix = subset + "_"
    last = next((r for r in reversed(list(records(log))) if prefix + "loss" in r), {})
    return {k[len(prefix):]: number(v) for k, v in last.items() if k.startswith(prefix) and number(v) is not None}


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(log: str) -> Optional[str]:
    """The progress of the training whose JSON log is ``log``; None until its first update record.

    The update reached and train loss come from the ``train_inner`` records, or an epoch's summary when it reached
    further. The time left is the updates still to do at the rate on fairseq's clock (``wall``) since the first
    record after the last start-up (loading and warm-up left out); with one record, ``num_updates / wall``
    (``wall`` is kept in the checkpoint, so after a resume both count the whole run)."""
    max_update, first = 0, None  # first: (updates, wall) of the first record since the last start-up
    updates = loss = wall = None
    valid = {}  # the last validation record
    for line in log.splitlines():
        found = _MAX_UPDATE.search(line)
        if found:  # fairseq_cli.train started (again)
            max_update, first = int(found.group(1)), None
            continue
        record = next(records(line), {})
        valid = record if "valid_loss" in record else valid
        # a train_inner record, or the end of an epoch
        prefix = "" if "loss" in record and "num_updates" in record else "train_" if "train_loss" in record else None
        if prefix is None:
            continue
        reached = number(record.get(prefix + "num_updates"))
        if prefix and updates is not None and (reached is None or reached <= updates):
            continue  # an epoch's summary at the last logged update: its loss is the epoch's mean, keep the last
        updates, loss, wall = reached, number(record.get(prefix + "loss")), number(record.get(prefix + "wall"))
        if first is None and updates is not None and wall is not None:
            first = (updates, wall)
    if updates is None:
        return None
    done = int(updates)
    parts = [f"update {done}/{max_update} ({100 * done // max_update}%)" if max_update else f"update {done}"]
    if loss is not None:
        parts.append(f"train loss {loss:.3f}")
    valid_loss, bleu, at = (number(valid.get(name)) for name in ("valid_loss", "valid_bleu", "valid_num_updates"))
    if valid_loss is not None:
        parts.append(f"valid loss {valid_loss:.3f}" + (f", BLEU {bleu:.2f}" if bleu is not None else "")
                     + (f" (update {int(at)})" if at is not None else ""))
    line = ", ".join(parts)
    if max_update and done >= max_update:
        return line + "; training done"
    if not max_update or wall is None:
        return line
    if first is not None and updates > first[0] and wall > first[1]:
        rate = (updates - first[0]) / (wall - first[1])  # since the first record: start-up and warm-up left out
    else:
        rate = done / wall if done > 0 and wall > 0 else None
    return line if rate is None else line + f"; about {clock((max_update - done) / rate)} left"


class LogWatcher(threading.Thread):
    """A daemon thread that emits :func:`progress_line` of the log at ``path`` every ``interval`` seconds (at least
    0.5) until :meth:`stop`; one per running job, whichever process writes the log. Nothing is emitted twice, nor
    for the log as it was when the watcher started (a reused run, an interrupted one before it resumes)."""

    def __init__(self, path: Path, interval: float, emit: Callable[[str], None]):
        super().__init__(name=f"watch {path}", daemon=True)
        self.path, self.interval, self.emit = Path(path), float(interval), emit
        self.last: Optional[str] = None
        self._at_start = self._stat()
        self._done = threading.Event()

    def _stat(self):
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_size

    def poll(self):
        """Read the log once; emit its line if it is new."""
        now, start = self._stat(), self._at_start
        if now is None or (start is not None and now[0] == start[0] and now[1] <= start[1]):
            return  # not written yet, or not since the watcher started
        try:
            line = progress_line(self.path.read_text(encoding="utf-8", errors="replace"))
        except OSError:  # moved aside meanwhile
            return
        if line is not None and line != self.last:
            self.last = line
            self.emit(line)

    def run(self):
        while not self._done.wait(max(self.interval, 0.5)):
            self.poll()

    def stop(self):
        self._done.set()
        if self.is_alive():
            self.join()


class Progress:
    """Start and end lines of the jobs: ``row i of n (seed s)``, elapsed time, estimated time remaining (the mean
    duration of the jobs trained in this invocation, applied to the rest, spread over the parallel jobs)."""

    def __init__(self, table: Table, run: RunConfig, total: int):
        self.name, self.rows, self.run, self.total = table.table, table.rows, run, total
        self.start, self.started, self.durations, self.done = time.time(), {}, [], 0
        self.watchers: Dict[tuple, LogWatcher] = {}
        self._print_lock = threading.Lock()  # the watchers print from their own threads

    def _where(self, job: "TableJob") -> str:
        i, row = next((i, r) for i, r in enumerate(self.rows, 1) if r.id == job.row)
        return f"[{self.name}] row {i} of {len(self.rows)} (seed {job.seed}) {row.label}"

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

    def begin(self, job: "TableJob"):
        """The start line ("started", or "resuming from update N" for an interrupted run of the same command), with
        the log to follow, and the watcher of the job's training log."""
        from .job import resumes_from  # (job.py imports this module through steps.py)

        self.started[job.row, job.seed] = time.time()
        train_log = job.run_dir / "train.log"
        log = f"log: {job.log_path}" if self.run.jobs > 1 else f"training log: {train_log}"
        where, update = self._where(job), resumes_from(job)
        self._line(f"{where}: {'started' if update is None else f'resuming from update {update}'}", after=f"; {log}")
        watcher = self.watchers[job.row, job.seed] = LogWatcher(train_log, self.run.progress_interval,
                                                                lambda line: self._print(f"{where}: {line}"))
        watcher.start()

    def stop_watching(self):
        """Stop every running job's log watcher (Ctrl-C: the jobs end without :meth:`end`)."""
        for watcher in self.watchers.values():
            watcher.stop()
        self.watchers.clear()

    def end(self, job: "TableJob", record: Optional[JobRecord] = None, error: Optional[str] = None):
        watcher = self.watchers.pop((job.row, job.seed), None)
        if watcher is not None:
            watcher.stop()
        seconds = time.time() - self.started.pop((job.row, job.seed))
        self.done += 1
        if error is not None:
            what = f"FAILED after {clock(seconds)}: {error}"
        elif record.reused:
            what = f"reused the run trained {record.train.trained_at}, BLEU {record.eval.bleu:.2f}"
            gone = damage(Path(record.train.checkpoint))
            if gone is not None:  # the numbers stand; what reads the model later does not
                what += (f"; its evaluated checkpoint {record.train.checkpoint} is {gone}: the record's numbers "
                         f"stand, but analysing or translating this run needs that checkpoint; to train the run "
                         f"again: mv {job.run_dir} {job.run_dir}.old, then {job.rerun}")
        else:
            self.durations.append(seconds)
            what = f"finished in {clock(seconds)}, BLEU {record.eval.bleu:.2f}"
        if self.run.jobs > 1:
            what += f" (log: {job.log_path})"
        self._line(f"{self._where(job)}: {what} [{self.done}/{self.total} jobs done]")
