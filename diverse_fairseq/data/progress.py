"""Progress lines of data preparation, and atomic file writes.

Inside a step of the pipeline (:meth:`..prepare.Preparer.step`), :class:`Progress` reports a known amount of work
(lines, pairs, bytes) and :func:`heartbeat` work that tells nothing about itself (learning BPE, fairseq-preprocess), at
most every :data:`interval` seconds (``PROGRESS_INTERVAL``, default 10; 0: every update) and once at the end when it
took at least that long. Outputs are written through :func:`atomic_path`, so an interrupted step leaves no half file
under the final name::

    [wmt14_en_de] step 7/14 tokenize train.en: 1,200,000/4,508,785 lines (27%), 5m02s elapsed, about 13m40s left
    [wmt14_en_de] step 9/14 learn subword-nmt: running, 20m00s elapsed
"""

import functools
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..runs import env_checks
from ..runs.options import number, option

ENV = "PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 10.0


@dataclass(frozen=True)
class ProgressOptions:
    """``--progress-interval``: how often data preparation reports a long step."""

    interval: float = option(ENV, f"seconds between progress lines of a long step, 0 = every update (default "
                                  f"{DEFAULT_INTERVAL:g})", DEFAULT_INTERVAL, number(0), flag="--progress-interval")

interval = DEFAULT_INTERVAL  # seconds between two progress lines of one piece of work
_step = ""  # "[dataset] step i/n " before every progress line, set while a step of the pipeline runs
_print = functools.partial(print, flush=True)


def set_interval(seconds):
    """Set :data:`interval` (``PROGRESS_INTERVAL``: seconds >= 0); SystemExit naming the variable otherwise."""
    global interval
    interval = env_checks.parse_float(f"{ENV} (--progress-interval)", seconds, minimum=0)


def begin_step(label: str):
    """Prefix the progress lines of the work that follows with ``label`` (``[dataset] step i/n``; "": none)."""
    global _step
    _step = f"{label} " if label else ""


def duration(seconds: float) -> str:
    """``4.2s``, ``5m02s``, ``2h05m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def size(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``12.3 MiB``."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"


class Progress:
    """Counts done units of one piece of work (``what``) out of ``total`` (None: unknown) and prints a line
    every :data:`interval` seconds. ``unit="bytes"`` shows sizes and a rate; ``initial`` is work done before
    (a resumed download)."""

    def __init__(self, what: str, total: Optional[int] = None, unit: str = "lines", initial: int = 0,
                 log: Optional[Callable[[str], None]] = None):
        self.what = _step + what
        self.total = total
        self.unit = unit
        self.done = self.initial = initial
        self.log = log or _print
        self.started = self.last = time.monotonic()
        self.shown = None  # the amount the last printed line showed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()

    def update(self, n: int = 1):
        self.done += n
        now = time.monotonic()
        if now - self.last >= interval:
            self.last, self.shown = now, self.done
            self.log(self.line(now))

    def close(self):
        """The last line, when the work took at least :data:`interval` seconds and no line showed all of it yet."""
        now = time.monotonic()
        if now - self.started >= interval and self.shown != self.done:
            self.log(self.line(now, finished=True))

    def line(self, now: float, finished: bool = False) -> str:
        elapsed = now - self.started
        amount = size if self.unit == "bytes" else "{:,}".format
        parts = [amount(self.done) + (f"/{amount(self.total)}" if self.total else "")
                 + ("" if self.unit == "bytes" else f" {self.unit}")
                 + (f" ({100 * self.done / self.total:.0f}%)" if self.total else ""), f"{duration(elapsed)} elapsed"]
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0
        if self.unit == "bytes" and rate > 0:
            parts.append(f"{size(rate)}/s")
        if finished:
            parts.append("done")
        elif self.total and rate > 0 and self.done < self.total:
            parts.append(f"about {duration((self.total - self.done) / rate)} left")
        return f"{self.what}: " + ", ".join(parts)


@contextmanager
def heartbeat(what: str, log: Optional[Callable[[str], None]] = None):
    """Print ``what: running, T elapsed`` every :data:`interval` seconds while the block runs (work that
    reports no progress of its own), and ``what: done in T`` at the end when it took at least that long."""
    log = log or _print
    label = _step + what
    started = time.monotonic()
    stop = threading.Event()

    def beat():
        while not stop.wait(max(interval, 0.5)):
            log(f"{label}: running, {duration(time.monotonic() - started)} elapsed")

    thread = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    elapsed = time.monotonic() - started
    if elapsed >= interval:
        log(f"{label}: done in {duration(elapsed)}")


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; rename it to ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
