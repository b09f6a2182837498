"""Progress lines for the long parts of data preparation: the one place that reports how far a step has got.

A pipeline step (:class:`~diverse_fairseq.data.steps.Pipeline`) announces itself with :func:`begin_step`; the
work inside it reports through :class:`Progress` (a known amount of work: lines, pairs or bytes) or
:func:`heartbeat` (work that tells nothing about itself: learning BPE, fairseq-preprocess). Both print plain
lines, which read the same on a terminal and in a log file::

    [wmt14_en_de] step 7/14 tokenize train.en: 1,200,000/4,508,785 lines (27%), 5m02s elapsed, about 13m40s left
    [wmt14_en_de] step 1/14 download training-parallel-europarl-v7.tgz: 210.0 MiB/628.4 MiB (33%), 41s elapsed, \
5.1 MiB/s
    [wmt14_en_de] step 9/14 learn subword-nmt: running, 20m00s elapsed

A line is printed at most every :data:`interval` seconds (``PROGRESS_INTERVAL``, default 10), and a last
one when the work ends if it took at least that long; ``PROGRESS_INTERVAL=0`` prints every update.
"""

import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional

ENV = "PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 10.0
interval = DEFAULT_INTERVAL  # seconds between two progress lines of one piece of work
_step = ""  # "[dataset] step i/n", set by the pipeline while a step runs


def parse_interval(text) -> float:
    """``PROGRESS_INTERVAL`` as seconds (>= 0); SystemExit naming the variable otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = -1.0
    if not value >= 0:
        raise SystemExit(f"error: {ENV} (--progress-interval)={text!r} is not valid: use a number of seconds >= 0 "
                         f"(0 prints every update; default {DEFAULT_INTERVAL:g})")
    return value


def set_interval(seconds: float):
    global interval
    interval = float(seconds)


def begin_step(label: str):
    """Prefix the progress lines of the work that follows with ``label`` (``[dataset] step i/n``)."""
    global _step
    _step = label


def end_step():
    begin_step("")


def _prefixed(what: str) -> str:
    return f"{_step} {what}" if _step else what


def duration(seconds: float) -> str:
    """``4.2s``, ``5m02s``, ``2h05m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def size(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``12.3 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _log_default(message: str):
    print(message, flush=True)


class Progress:
    """Counts done units of one piece of work (``what``) out of ``total`` (None: unknown) and prints a line
    every :data:`interval` seconds. ``unit="bytes"`` shows sizes and a rate; ``initial`` is work done before
    (a resumed download)."""

    def __init__(self, what: str, total: Optional[int] = None, unit: str = "lines", initial: int = 0,
                 log: Optional[Callable[[str], None]] = None):
        self.what = _prefixed(what)
        self.total = total
        self.unit = unit
        self.done = self.initial = initial
        self.log = log or _log_default
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
        """The last line, when the work took at least :data:`interval` seconds and the last line printed
        does not already show all of it."""
        now = time.monotonic()
        if now - self.started >= interval and self.shown != self.done:
            self.log(self.line(now, finished=True))

    def line(self, now: float, finished: bool = False) -> str:
        elapsed = now - self.started
        if self.unit == "bytes":
            amount = size(self.done) + (f"/{size(self.total)}" if self.total else "")
        else:
            amount = f"{self.done:,}" + (f"/{self.total:,}" if self.total else "") + f" {self.unit}"
        parts = [amount + (f" ({100 * self.done / self.total:.0f}%)" if self.total else "")]
        parts.append(f"{duration(elapsed)} elapsed")
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
    log = log or _log_default
    label = _prefixed(what)
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

