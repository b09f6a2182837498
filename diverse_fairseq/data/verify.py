"""Verify every fetched file before anything reads it: size and checksum, HTML pages, member line counts.

A download, a mirror copy and a file placed by hand in ``downloads/`` all go through :func:`check_file`; right after
extraction :func:`check_member_lines` checks the members' line counts where a published source records them. A refused
file is never kept under its final name (:func:`reject`: ``NAME.rejected``), and the message names the file, what was
expected, what was found and where to get the right one. A verified file gets a ``NAME.verified`` record
(:func:`mark_verified`) so that the next run does not hash it again. Expectations other than the published ones (the
tests' tiny fixture archives) come from a manifest (:class:`Expectations`, ``--expect FILE``); data prepared with one
is recorded as such in ``prepare.json`` and written under its own name (``DATASET+MANIFEST``), never where real runs
read.
"""

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .text import count_lines

CHUNK = 1 << 20  # bytes per read of a fetched file (download.py)
MAGIC = {".tgz": b"\x1f\x8b", ".gz": b"\x1f\x8b", ".zip": b"PK"}
HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml version", b"<!--")


class VerificationError(RuntimeError):
    """A fetched file (or an archive member) is not the published one."""


DIGESTS = ("sha256", "sha1", "md5")  # the digests a published source may record for a file


@dataclass(frozen=True)
class Expected:
    """What one file must be: ``size`` in bytes, ``sha256``/``sha1``/``md5`` hex digests, and where they come from.
    ``copy`` names the published copy where a file has several (the same name, other bytes, at other addresses)."""

    size: Optional[int] = None
    sha256: Optional[str] = None
    md5: Optional[str] = None
    source: str = ""
    sha1: Optional[str] = None
    copy: str = ""

    def pinned(self) -> bool:
        return bool(self.size or self.sha256 or self.sha1 or self.md5)

    def describe(self) -> str:
        parts = ([f"{self.size:,} bytes"] if self.size else []) + \
                [f"{name} {getattr(self, name)}" for name in DIGESTS if getattr(self, name)]
        return (f"{self.copy}: " if self.copy else "") + (", ".join(parts) if parts else "nothing pinned")

    def label(self) -> str:
        """Where the values come from, with the copy's name where the file has several."""
        return ", ".join(filter(None, (self.copy, self.source)))


#: what a fetched file is checked against: one :class:`Expected`, or the published copies it may be (any one)
Candidates = Union[Expected, Sequence[Expected]]


def candidates(expected: Candidates) -> Tuple[Expected, ...]:
    return (expected,) if isinstance(expected, Expected) else tuple(expected)


def describe_all(expected: Candidates) -> str:
    return " or ".join(e.describe() for e in candidates(expected))


@dataclass
class Expectations:
    """Expected values that replace the published ones, read from a JSON manifest (the tests' fixtures): ``{"name":
    "fixture", "files": {FILE: {"size": N, "sha256": HEX}}, "lines": {ARCHIVE: {SUFFIX: N}}}`` (a file with several
    published copies: a list of them, each with its ``"copy"`` name); ``name`` labels the data prepared with it
    (``DATASET+name``, ``prepare.json``)."""

    name: str
    path: str
    files: Dict[str, Candidates] = field(default_factory=dict)
    lines: Dict[str, Dict[str, int]] = field(default_factory=dict)

    @classmethod
    def load(cls, path) -> "Expectations":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise VerificationError(f"cannot read the expectations manifest {path}: {e}") from None
        name = str(data.get("name") or "")
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise VerificationError(f"{path}: give the manifest a short \"name\" (letters, digits, - and _): it "
                                    f"labels the data prepared with it")
        def expected(v):
            return Expected(v.get("size"), v.get("sha256"), v.get("md5"), f"manifest {path}", v.get("sha1"),
                            v.get("copy", ""))

        # a file published in several copies: a list of {"copy": NAME, "size": N, ...}, NAME a copy of its recipe
        files = {f: tuple(map(expected, v)) if isinstance(v, list) else expected(v)
                 for f, v in data.get("files", {}).items()}
        lines = {a: {s: int(n) for s, n in counts.items()} for a, counts in data.get("lines", {}).items()}
        return cls(name, str(path), files, lines)


def looks_like_html(head: bytes) -> bool:
    """Whether the first bytes of a file are an HTML (or XHTML) page rather than data."""
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return start.startswith(HTML_STARTS) and (b"<html" in head.lower() or start.startswith(b"<!doctype html"))


def check_file(path: Path, name: str, expected: Candidates, where: str) -> str:
    """Raise :class:`VerificationError` unless ``path`` (to become ``name``) is the expected file (one of the
    published copies, :func:`check_copies`); ``where`` tells the user where to get the right one. Returns the file's
    sha256 (recorded in prepare.json)."""
    return check_copies(path, name, expected, where)[0]


def check_copies(path: Path, name: str, expected: Candidates, where: str) -> Tuple[str, Expected]:
    """(sha256, the copy it is) of ``path`` where it is one of the ``expected`` copies (the copy of its size where
    the copies differ in size, else each in turn), else :class:`VerificationError` saying what was expected and
    found."""
    options = candidates(expected)
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(4096)
    magic = next((m for suffix, m in MAGIC.items() if name.endswith(suffix)), None)
    sized = [e for e in options if e.size is None or e.size == size]
    problem = ""
    if looks_like_html(head):
        problem = (f"expected {'the archive' if magic else 'a data file'} ({describe_all(options)}), found an HTML "
                   f"page of {size:,} bytes (an error or login page served instead of the file)")
    elif magic and not head.startswith(magic):
        problem = (f"expected a {'zip' if magic == b'PK' else 'gzip'} file, found {size:,} bytes starting with "
                   f"{head[:8]!r}")
    elif not sized:
        shorter = all(size < e.size for e in options)
        problem = (" or ".join(f"expected {e.size:,} bytes ({e.label()})" for e in options) + f", found {size:,} "
                   f"bytes ({'truncated' if shorter else 'not the published file'})")
    else:
        digests = hash_file(path, ["sha256"] + [a for a in DIGESTS[1:] if any(getattr(e, a) for e in sized)])
        mismatches = []
        for copy in sized:
            wrong = next((a for a in DIGESTS if getattr(copy, a) and getattr(copy, a).lower() != digests[a]), None)
            if wrong is None:
                return digests["sha256"], copy
            mismatches.append(f"expected {wrong} {getattr(copy, wrong)} ({copy.label()}), found {digests[wrong]}")
        problem = "; or ".join(mismatches) + ": not the published file"
    raise VerificationError(f"{name}: {problem}. Get the file from {where}.")


def hash_file(path: Path, algorithms: List[str]) -> Dict[str, str]:
    """``{algorithm: hex digest}`` of ``path``, read once per algorithm (md5 is only published for small files)."""
    digests = {}
    for algorithm in algorithms:
        with open(path, "rb") as f:
            digests[algorithm] = hashlib.file_digest(f, algorithm).hexdigest()
    return digests


# ------------------------------------------------------------------------------------- verified records
def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _record(path: Path, expected: Expected) -> dict:
    """What a ``.verified`` record must match: the file's size and modification time, the expectations (a sha1 and
    a copy's name only where given, so that the records of files pinned without them stay valid)."""
    st = path.stat()
    pins = [expected.size, expected.sha256, expected.md5] + \
        ([expected.sha1] if expected.sha1 else []) + ([expected.copy] if expected.copy else [])
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "expected": json.dumps(pins, sort_keys=True)}


def mark_verified(path: Path, expected: Expected, sha256: str, origin: str = ""):
    """Write ``NAME.verified`` so that the next run trusts ``path`` without hashing it again; ``origin``: the address
    it came from (empty: placed by hand)."""
    extra = {"copy": expected.copy} if expected.copy else {}
    _record_path(path).write_text(json.dumps({**_record(path, expected), "sha256": sha256, **extra,
                                              **({"origin": origin} if origin else {})}) + "\n")


def verified_record(path: Path, expected: Candidates) -> Optional[dict]:
    """``path``'s ``.verified`` record (``sha256``, ``copy``, ``origin``) when it matches the file and one of the
    expected copies, else None."""
    try:
        record = json.loads(_record_path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if any(record.items() >= _record(path, e).items() for e in candidates(expected)) else None


def verified_sha256(path: Path, expected: Candidates) -> Optional[str]:
    """The sha256 recorded for ``path`` when its record matches the file and the expectations, else None."""
    return (verified_record(path, expected) or {}).get("sha256")


def reject(paths: Iterable[Path]) -> List[Path]:
    """Move refused files away from their final names (``NAME.rejected``); return the new paths."""
    moved = []
    for p in map(Path, paths):
        _record_path(p).unlink(missing_ok=True)
        if p.exists():
            moved.append(p.with_name(p.name + ".rejected"))
            os.replace(p, moved[-1])
    return moved


# ------------------------------------------------------------------------------------- member line counts
def junk_member(name: str) -> bool:
    """Whether an archive member (or a file in an unpacked folder) is packing debris, never data: macOS's resource
    forks (``__MACOSX/...``, ``._NAME``), as a zip made on a Mac holds beside each file."""
    parts = name.replace("\\", "/").split("/")
    return "__MACOSX" in parts or parts[-1].startswith("._")


def check_member_lines(root: Path, expected_lines: Dict[str, int], archive: str, source: str,
                       where: str) -> Dict[str, int]:
    """Check the extracted members under ``root`` against ``{member name suffix: line count}``; return the counts
    found. :class:`VerificationError` names the archive, the member, both counts and ``source``."""
    files = sorted(p for p in Path(root).rglob("*")
                   if p.is_file() and not junk_member(p.relative_to(root).as_posix()))
    found = {}
    for suffix, count in expected_lines.items():
        member = next((p for p in files if p.as_posix().endswith("/" + suffix.lstrip("/"))), None)
        if member is None:
            raise VerificationError(f"{archive}: expected a member ending in {suffix} ({count:,} lines, {source}), "
                                    f"found none. Get the archive from {where}.")
        found[suffix] = count_lines(member)
        if found[suffix] != count:
            raise VerificationError(
                f"{archive}: member {member.name} has {found[suffix]:,} lines, expected {count:,} ({source}): not "
                f"the published corpus (a truncated or different copy). Get the archive from {where}.")
    return found
