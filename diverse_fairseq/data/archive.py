"""Extract downloaded archives (tar, tar.gz, split tar.gz parts, zip) safely and verifiably.

Extraction reads the whole compressed stream, so a truncated or corrupt archive is detected (gzip
CRC/length check, tar header checksums, zip CRCs) and reported with what to do. Members are written
into a temporary directory that is renamed into place only when everything succeeded, and an archive
found corrupt is renamed to ``NAME.corrupt`` so that the next run downloads it again.
Only regular files and directories are extracted; absolute paths and ``..`` are refused.
"""

import gzip
import io
import os
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable, Optional, Sequence

CHUNK = 1 << 20


class CorruptArchiveError(RuntimeError):
    """An archive could not be read to its end."""


class _ConcatReader(io.RawIOBase):
    """A read-only stream over several files one after the other (``cat part.00 part.01 ...``)."""

    def __init__(self, paths: Sequence[Path]):
        self._paths = list(paths)
        self._current = None

    def readable(self):
        return True

    def readinto(self, buffer):
        while True:
            if self._current is None:
                if not self._paths:
                    return 0
                self._current = open(self._paths.pop(0), "rb")
            n = self._current.readinto(buffer)
            if n:
                return n
            self._current.close()
            self._current = None

    def close(self):
        if self._current is not None:
            self._current.close()
        super().close()


def _safe_member_path(name: str) -> Optional[PurePosixPath]:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        return None
    return path


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _mark_corrupt(parts: Sequence[Path], error: Exception, log) -> CorruptArchiveError:
    names = ", ".join(p.name for p in parts)
    for p in parts:
        if p.exists():
            os.replace(p, p.with_name(p.name + ".corrupt"))
    log(f"  {names}: corrupt ({error})")
    return CorruptArchiveError(
        f"archive {names} is corrupt or truncated ({type(error).__name__}: {error}). It was renamed to "
        f"*.corrupt; run the command again to download it anew. If it came from a mirror (--mirror / "
        f"$DIVERSE_FAIRSEQ_MIRROR) or was put there by hand, replace that copy first."
    )


def extract(parts: Sequence[Path], dest: Path, wanted: Optional[Callable[[str], bool]] = None, log=print,
            check: Optional[Callable[[Path], None]] = None) -> Path:
    """Extract the archive made of ``parts`` (one file, or the pieces of a split archive) into ``dest``.

    ``wanted(member_name)`` selects the members to write (default: all). ``check(folder)`` is called on the
    extracted members before they are renamed into place (the member line counts); whatever it raises leaves
    nothing behind. ``dest`` appears only once the whole archive was read without error. Returns ``dest``.
    """
    parts = [Path(p) for p in parts]
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".extracting")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    written = 0
    try:
        if zipfile.is_zipfile(parts[0]) and len(parts) == 1:
            written = _extract_zip(parts[0], tmp, wanted)
        else:
            written = _extract_tar(parts, tmp, wanted)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, zipfile.BadZipFile, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile) and e.errno is not None:
            raise  # a real I/O problem (disk full, permissions), not a corrupt archive
        raise _mark_corrupt(parts, e, log) from e
    if written == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CorruptArchiveError(
            f"archive {parts[0].name} contains none of the expected files; is it the right file? "
            f"Delete it and run the command again."
        )
    if check is not None:
        try:
            check(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def _extract_tar(parts, tmp: Path, wanted) -> int:
    raw = io.BufferedReader(_ConcatReader(parts), buffer_size=CHUNK)
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if _is_gzip(parts[0]) else raw
    written = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                path = _safe_member_path(member.name)
                if path is None or not (member.isfile() or member.isdir()):
                    continue
                if member.isdir() or (wanted is not None and not wanted(member.name)):
                    continue
                target = tmp.joinpath(*path.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                with open(target, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                written += 1
        # read to the very end so that gzip checks its CRC and length trailer
        while stream.read(CHUNK):
            pass
    finally:
        stream.close()
        raw.close()
    return written


def _extract_zip(path: Path, tmp: Path, wanted) -> int:
    written = 0
    with zipfile.ZipFile(path) as zf:
        bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"CRC error in member {bad}")
        for info in zf.infolist():
            member_path = _safe_member_path(info.filename)
            if member_path is None or info.is_dir() or (wanted is not None and not wanted(info.filename)):
                continue
            target = tmp.joinpath(*member_path.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            written += 1
    return written
