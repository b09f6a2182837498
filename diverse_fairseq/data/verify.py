"""Verify every fetched file before anything reads it: size and checksum, HTML pages, member line counts.

A download, a mirror copy and a file placed by hand in ``downloads/`` all go through the same checks:

* :func:`check_file` -- the file is not an HTML page (a 200 response whose body is an error or login page),
  starts with the magic bytes its name promises (gzip, zip), and matches the size and the sha256/md5 that a
  published source records for it (the source is named next to each value in the recipes);
* :func:`check_member_lines` -- right after extraction, the line counts of the member files where a published
  source records them (``Archive.expected_lines``, cited by ``Archive.counts_source``).

A refused file is never kept under its final name: it is renamed ``NAME.rejected`` (see :func:`reject`), and
the message names the file, what was expected, what was found and where to get the right one.
A verified file gets a small ``NAME.verified`` record (size, modification time, sha256, the expectations it
was checked against) so that the next run does not hash it again; a file whose record does not match is
checked again.

Expectations other than the published ones (tiny fixture archives in the tests) come from a manifest
(:class:`Expectations`, ``--expect FILE``); data prepared with one is recorded as such in ``prepare.json`` and
written under its own name (``DATASET+MANIFEST``), never into the folders that real runs read.
"""

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

CHUNK = 1 << 20
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
    """Expected values that replace the published ones, read from a JSON manifest (the tests' fixtures).

    ``{"name": "fixture", "files": {FILE: {"size": N, "sha256": HEX}}, "lines": {ARCHIVE: {SUFFIX: N}}}``.
    ``name`` labels the data prepared with it (``DATASET+name``, ``prepare.json``).
    """

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


def hash_file(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def looks_like_html(head: bytes) -> bool:
    """Whether the first bytes of a file are an HTML (or XHTML) page rather than data."""
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return start.startswith(HTML_STARTS) and (b"<html" in head.lower() or start.startswith(b"<!doctype html"))


def _expected_magic(name: str) -> Optional[bytes]:
    for suffix, magic in MAGIC.items():
        if name.endswith(suffix):
            return magic
    return None


def check_file(path: Path, name: str, expected: Expected, where: str) -> str:
    """Raise :class:`VerificationError` unless ``path`` (to become ``name``) is the expected file.

    ``where`` tells the user where to get the right one. Returns the file's sha256 (recorded in prepare.json).
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4096)
    if looks_like_html(head):
        raise VerificationError(
            f"{name}: expected {'the archive' if _expected_magic(name) else 'a data file'} "
            f"({expected.describe()}), found an HTML page of {size:,} bytes (an error or login page served "
            f"instead of the file). Get the file from {where}.")
    magic = _expected_magic(name)
    if magic and not head.startswith(magic):
        raise VerificationError(
            f"{name}: expected a {'zip' if magic == b'PK' else 'gzip'} file, found {size:,} bytes starting with "
            f"{head[:8]!r}. Get the file from {where}.")
    if expected.size is not None and size != expected.size:
        raise VerificationError(
            f"{name}: expected {expected.size:,} bytes ({expected.source}), found {size:,} bytes "
            f"({'truncated' if size < expected.size else 'not the published file'}). Get the file from {where}.")
    sha256 = hash_file(path, "sha256")
    if expected.sha256 and sha256 != expected.sha256.lower():
        raise VerificationError(
            f"{name}: expected sha256 {expected.sha256} ({expected.source}), found {sha256}: not the published "
            f"file. Get the file from {where}.")
    if expected.md5:
        md5 = hash_file(path, "md5")
        if md5 != expected.md5.lower():
            raise VerificationError(
                f"{name}: expected md5 {expected.md5} ({expected.source}), found {md5}: not the published file. "
                f"Get the file from {where}.")
    return sha256


# ------------------------------------------------------------------------------------- verified records
def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _key(expected: Expected) -> str:
    return json.dumps([expected.size, expected.sha256, expected.md5], sort_keys=True)


def mark_verified(path: Path, expected: Expected, sha256: str):
    """Write ``NAME.verified`` so that the next run trusts ``path`` without hashing it again."""
    st = path.stat()
    _record_path(path).write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256,
                                              "expected": _key(expected)}) + "\n")


def verified_sha256(path: Path, expected: Expected) -> Optional[str]:
    """The sha256 recorded for ``path`` when its record matches the file and the expectations, else None."""
    try:
        record = json.loads(_record_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return None
    if (record.get("size"), record.get("mtime_ns"), record.get("expected")) == (st.st_size, st.st_mtime_ns,
                                                                              _key(expected)):
        return record.get("sha256")
    return None


def reject(paths: Iterable[Path]) -> Sequence[Path]:
    """Move refused files away from their final names (``NAME.rejected``); return the new paths."""
    moved = []
    for p in paths:
        p = Path(p)
        _record_path(p).unlink(missing_ok=True)
        if p.exists():
            target = p.with_name(p.name + ".rejected")
            os.replace(p, target)
            moved.append(target)
    return moved


def verify_local(path: Path, expected: Expected, where: str, log=print) -> str:
    """Verify a file that is already under its final name (placed by hand, an earlier run's, a manual download
    such as CWMT's zips) before it is used; return its sha256.

    A matching ``NAME.verified`` record is trusted without hashing. A file that fails is moved to
    ``NAME.rejected`` and :class:`VerificationError` says so.
    """
    path = Path(path)
    sha256 = verified_sha256(path, expected)
    if sha256:
        return sha256
    log(f"  {path.name}: present, verifying it before use ({expected.describe()})")
    try:
        sha256 = check_file(path, path.name, expected, where)
    except VerificationError as e:
        reject([path])
        raise VerificationError(f"{e} It was moved to {path.name}.rejected.") from None
    mark_verified(path, expected, sha256)
    return sha256


# ------------------------------------------------------------------------------------- member line counts
def count_lines(path: Path) -> int:
    """Lines of a file as ``wc -l`` counts them, plus a last line without a newline."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def check_member_lines(root: Path, expected_lines: Dict[str, int], archive: str, source: str,
                       where: str) -> Dict[str, int]:
    """Check the extracted members under ``root`` against ``{member name suffix: line count}``.

    Raises :class:`VerificationError` naming the archive, the member, both counts and ``source``.
    Returns the counts found.
    """
    files = sorted(p for p in Path(root).rglob("*") if p.is_file())
    found = {}
    for suffix, count in expected_lines.items():
        matches = [p for p in files if p.as_posix().endswith(suffix)]
        if not matches:
            raise VerificationError(f"{archive}: expected a member ending in {suffix} ({count:,} lines, {source}), "
                                    f"found none. Get the archive from {where}.")
        n = count_lines(matches[0])
        found[suffix] = n
        if n != count:
            raise VerificationError(
                f"{archive}: member {matches[0].name} has {n:,} lines, expected {count:,} ({source}): not the "
                f"published corpus (a truncated or different copy). Get the archive from {where}.")
    return found
