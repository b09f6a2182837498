"""The ten probing tasks of Conneau et al. (2018) from SentEval: where they come from and how they are read.

Conneau, Kruszewski, Lample, Barrault, Baroni. *What you can cram into a single $&!#* vector: Probing sentence
embeddings for linguistic properties*. ACL 2018. The data is SentEval's ``data/probing/`` folder
(github.com/facebookresearch/SentEval): one text file per task, each line ``split<TAB>label<TAB>sentence`` (split
``tr``/``va``/``te``; the sentence, Moses-tokenized, is the last field).

SentEval publishes no checksums: :func:`download` checks each file against the published sizes instead, and keeps
a mirror's files (stand-ins) out of the cache that real runs read. ``python -m diverse_fairseq.data.senteval
[--dest DIR] [--tasks SentLen,WC,...]`` downloads them.
"""

import argparse
import collections
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..runs.hints import python_command
from ..runs.options import add_options, option, resolve, warn_misspelled
from ..runs.options import path as a_path
from .download import DownloadError, Source, checksums_option, fetch, mirror_option, read_checksum_file
from .verify import reject

#: the raw files of SentEval's repository, tried in this order (the default branch, then its former name)
BASE_URLS = ("https://raw.githubusercontent.com/facebookresearch/SentEval/main/data/probing/",
             "https://raw.githubusercontent.com/facebookresearch/SentEval/master/data/probing/")
SPLITS = ("tr", "va", "te")  # train, validation, test
DEFAULT_DIR_ENV = "PROBING_DATA"
#: the published sizes: "All data sets contain 100k training instances, 10k validation instances and 10k test
#: instances, and in all cases they are balanced across the target classes (in some cases, there are a few more
#: instances, as a result of balancing constraints in the sampling process)" (SIZES_SOURCE). Hence minimums.
PUBLISHED_MIN = {"tr": 100_000, "va": 10_000, "te": 10_000}
SIZES_SOURCE = ("SentEval's data/probing/README.md (github.com/facebookresearch/SentEval, commit 2a7c3da) and "
                "Conneau et al. (ACL 2018), Sec. 2")


@dataclass(frozen=True)
class Task:
    name: str  # Conneau et al.'s name
    filename: str  # SentEval's file
    column: str  # the column title of NAACL 2019 Table 1 and the journal's Table 7

    @property
    def paper_key(self) -> str:
        """The key of the paper's accuracy in a table row's ``paper:`` mapping (``probe_sentlen``)."""
        return f"probe_{self.name.lower()}"

    def source(self) -> Source:
        return Source(self.filename, tuple(base + self.filename for base in BASE_URLS))


# in the papers' column order: surface (SentLen, WC), syntactic (TreeDepth, TopConst, BShift), then semantic tasks
TASKS = (
    Task("SentLen", "sentence_length.txt", "SeLen"),
    Task("WC", "word_content.txt", "WC"),
    Task("TreeDepth", "tree_depth.txt", "TrDep"),
    Task("TopConst", "top_constituents.txt", "ToCo"),
    Task("BShift", "bigram_shift.txt", "BShif"),
    Task("Tense", "past_present.txt", "Tense"),
    Task("SubjNum", "subj_number.txt", "SubNm"),
    Task("ObjNum", "obj_number.txt", "ObjNm"),
    Task("SOMO", "odd_man_out.txt", "SOMO"),
    Task("CoordInv", "coordination_inversion.txt", "CoIn"),
)
BY_NAME = {t.name.lower(): t for t in TASKS}


def parse_tasks(text) -> List[Task]:
    """Task names (comma-separated or a list; case-insensitive; ``all``) as :class:`Task` objects, in the given
    order."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if str(n).strip()]
    if not names or [n.lower() for n in names] == ["all"]:
        return list(TASKS)
    unknown = [n for n in names if n.lower() not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: unknown probing task(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(t.name for t in TASKS)} (or all)")
    return list(dict.fromkeys(BY_NAME[n.lower()] for n in names))


@dataclass
class TaskData:
    """One task's sentences and labels per split (``tr``, ``va``, ``te``)."""

    task: Task
    sentences: Dict[str, List[str]]
    labels: Dict[str, List[str]]

    def classes(self) -> List[str]:
        """The training set's labels, sorted (the classifier's outputs)."""
        return sorted(set(self.labels["tr"]))


def read_task(task: Task, data_dir) -> TaskData:
    """Read ``data_dir/<task file>``; SystemExit naming the file (and the line) when it is missing or malformed."""
    path = Path(data_dir) / task.filename
    if not path.is_file():
        download = python_command("diverse_fairseq.data.senteval", "--dest", data_dir, "--tasks", task.name)
        raise SystemExit(f"error: probing task {task.name}: {path} not found. Download it with `{download}` "
                         f"(from {task.source().urls[0]}) or pass --download")
    sentences = {s: [] for s in SPLITS}
    labels = {s: [] for s in SPLITS}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 3 or fields[0] not in SPLITS or not fields[1] or not fields[-1].strip():
                raise SystemExit(f"error: {path}:{lineno}: expected 'split<TAB>label<TAB>sentence' with split "
                                 f"tr, va or te, got {line[:80]!r}")
            sentences[fields[0]].append(fields[-1].strip())
            labels[fields[0]].append(fields[1])
    empty = [s for s in SPLITS if not sentences[s]]
    if empty:
        raise SystemExit(f"error: {path} has no {'/'.join(empty)} sentences (each task needs tr, va and te)")
    data = TaskData(task, sentences, labels)
    unseen = sorted({label for s in ("va", "te") for label in labels[s]} - set(data.classes()))
    if unseen:
        raise SystemExit(f"error: {path}: label(s) {', '.join(unseen)} occur in va/te but not in tr")
    return data


def real_dir() -> Path:
    """``work/senteval_probing`` in the repository: the cache that real runs read (SentEval's own files only)."""
    return Path(__file__).resolve().parents[2] / "work" / "senteval_probing"


def probing_data_option():
    """``PROBING_DATA``: one field for the table runner, the downloader and ``python -m diverse_fairseq.probing``."""
    return option(DEFAULT_DIR_ENV, "folder of SentEval's probing files (default: work/senteval_probing; with a "
                                   "mirror, a folder of its own beside it)", None, a_path)


def default_dir(mirror: Optional[str] = None) -> Path:
    """Where the probing files go when no folder (``PROBING_DATA``) is given: with a mirror,
    ``work/senteval_probing-mirrors/<hash of the mirror>`` (its own cache); else :func:`real_dir`."""
    if mirror:
        return real_dir().with_name("senteval_probing-mirrors") / hashlib.sha256(str(mirror).encode()).hexdigest()[:12]
    return real_dir()


def split_sizes(path) -> Dict[str, int]:
    """Lines per split (``tr``/``va``/``te``) of a task file, from the first field of each line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        counts = collections.Counter(line.split("\t", 1)[0] for line in f)
    return {s: counts[s] for s in SPLITS}


def check_sizes(path) -> Optional[str]:
    """Why ``path`` is not SentEval's published file (too few sentences in a split), or None."""
    found = split_sizes(path)
    if all(found[s] >= PUBLISHED_MIN[s] for s in SPLITS):
        return None
    return (f"{Path(path).name} has {' / '.join(f'{found[s]:,}' for s in SPLITS)} sentences tr / va / te, SentEval "
            f"publishes at least {' / '.join(f'{PUBLISHED_MIN[s]:,}' for s in SPLITS)} ({SIZES_SOURCE})")


def download(tasks: Sequence[Task], dest, mirror: Optional[str] = None, checksums: Optional[Dict[str, str]] = None,
             log=print, require_published: bool = True) -> Dict[str, Path]:
    """Make ``dest/<file>`` exist for every task (:func:`fetch`: present files are kept); ``{task name: path}``.
    Every file is checked with :func:`check_sizes`: a short one is renamed ``NAME.rejected`` (a :class:`DownloadError`
    names it) with ``require_published``, else kept as a stand-in with a warning, but never in :func:`real_dir`."""
    dest = Path(dest)
    if not require_published and dest.resolve() == real_dir().resolve():
        raise DownloadError(f"stand-in probing files are not allowed in {real_dir()}, the cache that real runs read; "
                            f"use another folder (PROBING_DATA) or leave it unset (a mirror gets its own cache)")
    paths = {}
    for t in tasks:
        path = fetch(t.source(), dest, mirror=mirror, checksums=checksums, log=log)
        problem = check_sizes(path)
        if problem and require_published:
            rejected = reject([path])[0]
            raise DownloadError(f"probing task {t.name}: {problem}. It is a stand-in or a truncated copy, not the "
                                f"published file; it was renamed to {rejected.name}. Get the file from "
                                f"{t.source().urls[0]} (run again without DIVERSE_FAIRSEQ_MIRROR to download it)")
        if problem:
            log(f"  warning: probing task {t.name}: {problem}: a stand-in, accepted for this demo run only "
                f"(in {dest}, not in {real_dir()})")
        paths[t.name] = path
    return paths


def sizes(data: TaskData) -> Tuple[int, int, int]:
    return tuple(len(data.sentences[s]) for s in SPLITS)


@dataclass(frozen=True)
class DownloadOptions:
    """The options of ``python -m diverse_fairseq.data.senteval``."""

    dest: Optional[Path] = probing_data_option()
    tasks: str = option(None, "comma-separated task names or all (default)", "all")
    mirror: Optional[str] = mirror_option("a folder or URL with the files by name")
    checksums: Optional[str] = checksums_option()
    stand_ins: bool = option(None, "accept files smaller than SentEval's published sizes (test fixtures); never into "
                                   "work/senteval_probing", False, store_true=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.data.senteval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    args = add_options(p, DownloadOptions).parse_args(argv)
    warn_misspelled(os.environ, "senteval")
    o = resolve(DownloadOptions, os.environ, args)
    dest = o.dest or default_dir(o.mirror)
    sums = read_checksum_file(o.checksums) if o.checksums else None
    try:
        paths = download(parse_tasks(o.tasks), dest, mirror=o.mirror, checksums=sums,
                         require_published=not o.stand_ins)
    except DownloadError as e:
        raise SystemExit(f"error: {e}") from None
    for name, path in paths.items():
        train, valid, test = sizes(read_task(BY_NAME[name.lower()], dest))
        print(f"{name}: {path} ({train:,} / {valid:,} / {test:,} sentences tr / va / te)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
