"""Live progress of a row's training, read from fairseq's JSON log (``train.log``) while it grows.

:func:`progress_line` is the pure part: the log's text so far → one line such as::

    update 450/800 (56%), train loss 6.213, valid loss 6.02, BLEU 3.41 (update 400); about 0:02:05 left

Where the numbers come from (the records :mod:`.logs` reads, see fairseq_cli/train.py and
fairseq/logging/progress_bar.py):

- the number of updates to train, ``max_update``, from the configuration fairseq_cli.train logs at start-up
  (``{'_name': None, 'common': ..., 'optimization': {... 'max_update': 800 ...}}``; the last start-up of the log);
- the update reached and the train loss from the periodic ``train_inner`` records (``num_updates``, ``loss``),
  or from an end-of-epoch summary (``train_num_updates``, ``train_loss``: the epoch's mean) when it reached
  further than the last of them;
- the last validation (``valid_loss``, ``valid_bleu`` when the run validates by BLEU, ``valid_num_updates``);
- the time left: the updates still to do at the rate of the run so far, measured on fairseq's own clock of the
  training, ``wall`` (seconds since the trainer started, validations and checkpoints included): the updates
  over the seconds between the first record since the last start-up and the last one, so that the start-up
  (loading, the first batches) does not count; with a single record, ``num_updates / wall`` (fairseq keeps
  ``wall`` in the checkpoint, so after a resume both count the whole run).

:class:`LogWatcher` is the impure part: a daemon thread that reads the log every ``interval`` seconds and
emits the line when it differs from the last one emitted, so that it never prints more often than fairseq logs.
The runner's :class:`~diverse_fairseq.tables.progress.Progress` starts one per running job, in jobs run one by
one and in the worker pool alike (the log is a file, whichever process writes it).
"""

import re
import threading
from pathlib import Path
from typing import Callable, Optional

from .logs import number, records

_MAX_UPDATE = re.compile(r"'max_update': (\d+)")


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(log: str) -> Optional[str]:
    """The progress of the training whose fairseq log (``--log-format json``, as ``--log-file`` writes it or as
    the console shows it) is ``log``; None until its first update record."""
    max_update, first = 0, None  # first: (updates, wall) of the first record since the last start-up
    updates = loss = wall = None
    valid = None  # (updates, loss, bleu)
    for line in log.splitlines():
        found = _MAX_UPDATE.search(line)
        if found:  # fairseq_cli.train started (again)
            max_update, first = int(found.group(1)), None
            continue
        record = next(records(line), None)
        if record is None:
            continue
        if "loss" in record and "num_updates" in record:  # train_inner
            prefix = ""
        elif "train_loss" in record:  # end of an epoch
            prefix = "train_"
        elif "valid_loss" in record:
            valid = (number(record.get("valid_num_updates")), number(record["valid_loss"]),
                     number(record.get("valid_bleu")))
            continue
        else:
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
    if valid is not None and valid[1] is not None:
        text = f"valid loss {valid[1]:.3f}"
        if valid[2] is not None:
            text += f", BLEU {valid[2]:.2f}"
        if valid[0] is not None:
            text += f" (update {int(valid[0])})"
        parts.append(text)
    line = ", ".join(parts)
    if max_update and done >= max_update:
        return line + "; training done"
    if not max_update or wall is None:
        return line
    if first is not None and updates > first[0] and wall > first[1]:
        rate = (updates - first[0]) / (wall - first[1])  # since the first record: start-up and warm-up left out
    elif done > 0 and wall > 0:
        rate = done / wall
    else:
        return line
    return line + f"; about {clock((max_update - done) / rate)} left"


class LogWatcher:
    """Emit :func:`progress_line` of the log at ``path`` every ``interval`` seconds while it changes.

    ``start()`` starts the thread, ``stop()`` ends it (and waits for it); nothing is emitted before the first
    update record, nor twice for the same line, nor for the log as it was when the watcher started (a finished
    run that is reused, an interrupted one before it resumes). The log is read every ``interval`` seconds, at
    least 0.5 (``interval=0``: each record fairseq logs, as ``PROGRESS_INTERVAL=0`` does in data preparation)."""

    def __init__(self, path: Path, interval: float, emit: Callable[[str], None]):
        self.path, self.interval, self.emit = Path(path), float(interval), emit
        self.last: Optional[str] = None
        self._at_start = self._identity()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"watch {self.path}", daemon=True)

    def _identity(self):
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_size

    def poll(self):
        """Read the log once; emit its line if it is new."""
        now = self._identity()
        if now is None or (self._at_start is not None and now[0] == self._at_start[0]
                           and now[1] <= self._at_start[1]):
            return  # not written yet, or not since the watcher started
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:  # moved aside meanwhile
            return
        line = progress_line(text)
        if line is not None and line != self.last:
            self.last = line
            self.emit(line)

    def _loop(self):
        while not self._stop.wait(max(self.interval, 0.5)):
            self.poll()

    def start(self) -> "LogWatcher":
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
