"""Line files: reading (plain or gzip), atomic writing, and a parallel streaming map with progress lines."""

import gzip
import itertools
import multiprocessing
from pathlib import Path
from typing import Callable, Iterable, Iterator, List

from .progress import Progress
from .steps import atomic_path

CHUNK_LINES = 2000


def open_text(path, mode="rt"):
    """Open a UTF-8 text file, transparently gunzipping ``*.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8", errors="strict", newline="\n")
    return open(path, mode, encoding="utf-8", errors="strict", newline="\n")


def iter_lines(path) -> Iterator[str]:
    """Yield the lines of ``path`` without line terminators (``\\n``, ``\\r\\n``) or a leading BOM."""
    with open_text(path) as f:
        first = True
        for line in f:
            line = line.rstrip("\n").rstrip("\r")
            if first:
                line = line.lstrip("\ufeff")
                first = False
            yield line


def read_lines(path) -> List[str]:
    return list(iter_lines(path))


def count_lines(path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def write_lines(path, lines: Iterable[str]) -> int:
    """Write ``lines`` (one per line) to ``path`` atomically; returns the number of lines."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            if "\n" in line or "\r" in line:
                line = line.replace("\r", " ").replace("\n", " ")
            f.write(line + "\n")
            n += 1
    return n


def _apply_chunk(args):
    fn, chunk = args
    return [fn(line) for line in chunk]


def _chunks(lines: Iterable[str], size: int):
    it = iter(lines)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


def map_file(fn: Callable[[str], str], src, dst, workers: int = 1, desc: str = "") -> int:
    """Write ``fn(line)`` for every line of ``src`` to ``dst`` (atomically), in order, reporting progress
    (:class:`~diverse_fairseq.data.progress.Progress`: lines done of all, elapsed and remaining time).

    ``fn`` must be picklable (a module-level function or a ``functools.partial`` of one) when
    ``workers > 1``; the lines are processed in chunks by a process pool.
    """
    total = count_lines(src) if Path(src).suffix != ".gz" else None
    meter = Progress(desc or Path(dst).name, total=total, unit="lines")
    n = 0
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as out:
        chunks = ((fn, c) for c in _chunks(iter_lines(src), CHUNK_LINES))
        if workers > 1 and (total is None or total > CHUNK_LINES):
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                results = pool.imap(_apply_chunk, chunks)
                n = _drain(results, out, meter)
        else:
            n = _drain(map(_apply_chunk, chunks), out, meter)
    meter.close()
    return n


def _drain(results, out, meter) -> int:
    n = 0
    for result in results:
        for line in result:
            out.write(line.replace("\n", " ") + "\n")
        n += len(result)
        meter.update(len(result))
    return n
