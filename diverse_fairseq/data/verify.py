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
from typing import Dict, Iterable, List, Optional

from .text import count_lines

CHUNK = 1 << 20  # bytes per read of a fetched file (download.py)
MAGIC = {".tgz": b"\x1f\x8b", ".gz": b"\x1f\x8b", ".zip": b"PK"}
HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml version", b"<!--")


class VerificationError(RuntimeError):
    """A fetched file (or an archive member) is not the published one."""


@dataclass(frozen=True)
class Expected:
    """What one file must be: ``size`` in bytes, ``sha256``/``md5`` hex digests, and where they come from."""

    size: Optional[int] = None
    sha256: Optional[str] = None
    md5: Optional[str] = None
    source: str = ""

    def pinned(self) -> bool:
        return bool(self.size or self.sha256 or self.md5)

    def describe(self) -> str:
        parts = ([f"{self.size:,} bytes"] if self.size else []) + \
                [f"{name} {value}" for name, value in (("sha256", self.sha256), ("md5", self.md5)) if value]
        return ", ".join(parts) if parts else "nothing pinned"


@dataclass
class Expectations:
    """Expected values that replace the published ones, read from a JSON manifest (the tests' fixtures): ``{"name":
    "fixture", "files": {FILE: {"size": N, "sha256": HEX}}, "lines": {ARCHIVE: {SUFFIX: N}}}``; ``name`` labels the
    data prepared with it (``DATASET+name``, ``prepare.json``)."""

    name: str
    path: str
    files: Dict[str, Expected] = field(default_factory=dict)
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
        files = {f: Expected(v.get("size"), v.get("sha256"), v.get("md5"), f"manifest {path}")
                 for f, v in data.get("files", {}).items()}
        lines = {a: {s: int(n) for s, n in counts.items()} for a, counts in data.get("lines", {}).items()}
        return cls(name, str(path), files, lines)


def looks_like_html(head: bytes) -> bool:
    """Whether the first bytes of a file are an HTML (or XHTML) page rather than data."""
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return start.startswith(HTML_STARTS) and (b"<html" in head.lower() or start.startswith(b"<!doctype html"))


def check_file(path: Path, name: str, expected: Expected, where: str) -> str:
    """Raise :class:`VerificationError` unless ``path`` (to become ``name``) is the expected file; ``where`` tells the
    user where to get the right one. Returns the file's sha256 (recorded in prepare.json)."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(4096)
    magic = next((m for suffix, m in MAGIC.items() if name.endswith(suffix)), None)
    digests, problem = {}, ""
    if looks_like_html(head):
        problem = (f"expected {'the archive' if magic else 'a data file'} ({expected.describe()}), found an HTML "
                   f"page of {size:,} bytes (an error or login page served instead of the file)")
    elif magic and not head.startswith(magic):
        problem = (f"expected a {'zip' if magic == b'PK' else 'gzip'} file, found {size:,} bytes starting with "
                   f"{head[:8]!r}")
    elif expected.size is not None and size != expected.size:
        problem = (f"expected {expected.size:,} bytes ({expected.source}), found {size:,} bytes "
                   f"({'truncated' if size < expected.size else 'not the published file'})")
    else:
        digests = hash_file(path, ["sha256"] + (["md5"] if expected.md5 else []))
        for algorithm, found in digests.items():
            wanted = getattr(expected, algorithm)
            if wanted and wanted.lower() != found:
                problem = f"expected {algorithm} {wanted} ({expected.source}), found {found}: not the published file"
                break
    if problem:
        raise VerificationError(f"{name}: {problem}. Get the file from {where}.")
    return digests["sha256"]


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
    """What a ``.verified`` record must match: the file's size and modification time, the expectations."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "expected": json.dumps([expected.size, expected.sha256, expected.md5], sort_keys=True)}


def mark_verified(path: Path, expected: Expected, sha256: str):
    """Write ``NAME.verified`` so that the next run trusts ``path`` without hashing it again."""
    _record_path(path).write_text(json.dumps({**_record(path, expected), "sha256": sha256}) + "\n")


def verified_sha256(path: Path, expected: Expected) -> Optional[str]:
    """The sha256 recorded for ``path`` when its record matches the file and the expectations, else None."""
    try:
        record = json.loads(_record_path(path).read_text())
        return record.get("sha256") if record.items() >= _record(path, expected).items() else None
    except (OSError, ValueError):
        return None


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
def check_member_lines(root: Path, expected_lines: Dict[str, int], archive: str, source: str,
                       where: str) -> Dict[str, int]:
    """Check the extracted members under ``root`` against ``{member name suffix: line count}``; return the counts
    found. :class:`VerificationError` names the archive, the member, both counts and ``source``."""
    files = sorted(p for p in Path(root).rglob("*") if p.is_file())
    found = {}
    for suffix, count in expected_lines.items():
        member = next((p for p in files if p.as_posix().endswith(suffix)), None)
        if member is None:
            raise VerificationError(f"{archive}: expected a member ending in {suffix} ({count:,} lines, {source}), "
                                    f"found none. Get the archive from {where}.")
        found[suffix] = count_lines(member)
        if found[suffix] != count:
            raise VerificationError(
                f"{archive}: member {member.name} has {found[suffix]:,} lines, expected {count:,} ({source}): not "
                f"the published corpus (a truncated or different copy). Get the archive from {where}.")
    return found
