"""Extract downloaded archives (tar, tar.gz, split tar.gz parts, zip) safely and verifiably: :func:`extract`.

(``shutil.unpack_archive`` reads no split archive, cannot select the members a recipe reads, and checks no gzip
trailer.)
"""

import contextlib
import gzip
import os
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterator, Optional, Sequence, Tuple

from .verify import junk_member

CHUNK = 1 << 20


class CorruptArchiveError(RuntimeError):
    """An archive could not be read to its end."""


class _ConcatReader:
    """A read-only stream over several files one after the other (``cat part.00 part.01 ...``); a read returns
    bytes of one file at a time, as a raw stream may (tarfile and gzip read until they have enough)."""

    def __init__(self, paths: Sequence[Path]):
        self._files = [open(p, "rb") for p in paths]

    def read(self, size: int = -1) -> bytes:
        while self._files:
            data = self._files[0].read(size)
            if data:
                return data
            self._files.pop(0).close()
        return b""

    def close(self):
        for f in self._files:
            f.close()


def _tar_members(parts: Sequence[Path]) -> Iterator[Tuple[str, IO[bytes]]]:
    """(name, content) of the regular files of the tar (or tar.gz) archive made of ``parts``, in order."""
    with open(parts[0], "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with contextlib.closing(_ConcatReader(parts)) as raw, \
            (gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else contextlib.nullcontext(raw)) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    yield member.name, tar.extractfile(member)
        while stream.read(CHUNK):  # read to the very end so that gzip checks its CRC and length trailer
            pass


def _zip_members(path: Path) -> Iterator[Tuple[str, IO[bytes]]]:
    """(name, content) of the files of the zip archive ``path``, after checking every member's CRC."""
    with zipfile.ZipFile(path) as zf:
        bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"CRC error in member {bad}")
        for info in zf.infolist():
            if not info.is_dir():
                with zf.open(info) as content:
                    yield info.filename, content


def extract(parts: Sequence[Path], dest: Path, wanted: Optional[Callable[[str], bool]] = None, log=print,
            check: Optional[Callable[[Path], None]] = None):
    """Extract the archive made of ``parts`` (one file, or the pieces of a split archive) into ``dest``.

    The whole compressed stream is read, so a truncated or corrupt archive is detected (gzip CRC and length, tar
    header checksums, zip CRCs); such an archive is renamed ``NAME.corrupt`` so that the next run downloads it
    again. Only the regular files that ``wanted(member_name)`` selects (default: all) are written, never an absolute
    path, one with ``..`` or packing debris (``__MACOSX/``, ``._NAME``: :func:`~.verify.junk_member`), into a
    temporary folder that ``check(folder)`` (the member line counts) sees first and
    that is renamed to ``dest`` only when everything succeeded; whatever fails leaves nothing behind.
    """
    tmp = dest.with_name(dest.name + ".extracting")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:  # whatever goes wrong leaves no .extracting folder behind
        try:
            members = _zip_members(parts[0]) if len(parts) == 1 and zipfile.is_zipfile(parts[0]) else \
                _tar_members(parts)
            with contextlib.closing(members):
                for name, content in members:
                    path = PurePosixPath(name)
                    if path.is_absolute() or ".." in path.parts or junk_member(name) or (
                            wanted is not None and not wanted(name)):
                        continue
                    target = tmp.joinpath(*path.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "wb") as out:
                        shutil.copyfileobj(content, out, CHUNK)
        except (tarfile.TarError, EOFError, zlib.error, zipfile.BadZipFile, OSError) as e:
            if isinstance(e, OSError) and e.errno is not None:  # gzip.BadGzipFile has none
                raise  # a real I/O problem (disk full, permissions), not a corrupt archive
            names = ", ".join(p.name for p in parts)
            for p in parts:
                if p.exists():
                    os.replace(p, p.with_name(p.name + ".corrupt"))
            log(f"  {names}: corrupt ({e})")
            raise CorruptArchiveError(
                f"archive {names} is corrupt or truncated ({type(e).__name__}: {e}). It was renamed to *.corrupt; "
                f"run the command again to download it anew. If it came from a mirror (--mirror / "
                f"$DIVERSE_FAIRSEQ_MIRROR) or was put there by hand, replace that copy first.") from e
        if not any(tmp.iterdir()):
            raise CorruptArchiveError(f"archive {parts[0].name} contains none of the expected files; is it the "
                                      f"right file? Delete it and run the command again.")
        if check is not None:
            check(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
