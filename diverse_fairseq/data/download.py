"""Download files with resume, checksum verification, atomic rename and a mirror override.

A file is only ever visible under its final name once it is complete and verified: bytes go to
``NAME.part`` first (kept between runs so an interrupted download resumes with an HTTP ``Range``
request), are checked against the expected size and checksum, and are then renamed. A file that
fails its checksum is deleted, so no later run can trust it.

Mirrors: ``--mirror BASE`` or the environment variable ``DIVERSE_FAIRSEQ_MIRROR`` replaces the real
addresses. ``BASE`` is a URL (``https://mirror.example.org/nmt``) or a local directory; the file is
looked up there by its file name (``BASE/training-parallel-nc-v9.tgz``), so a mirror is simply a flat
directory of the original archives.
"""

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence

from .progress import Progress

MIRROR_ENV = "DIVERSE_FAIRSEQ_MIRROR"
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A file could not be fetched (network error, missing on the mirror, wrong size or checksum)."""


@dataclass(frozen=True)
class Source:
    """One file to download.

    ``filename`` is the local name and the name looked up in a mirror; ``urls`` are the real public
    addresses, tried in order. ``md5``/``sha256`` are the published checksums where the source
    publishes any (see :func:`published_md5`); ``size`` its published size in bytes, if any.
    """

    filename: str
    urls: Sequence[str]
    md5: Optional[str] = None
    sha256: Optional[str] = None
    size: Optional[int] = None
    description: str = ""
    extra: Dict[str, str] = field(default_factory=dict)


def published_md5(url: str) -> Optional[str]:
    """The md5 that sacrebleu's test-set registry publishes for ``url`` (WMT dev/test archives), if any."""
    try:
        from sacrebleu import DATASETS
    except ImportError:  # pragma: no cover - sacrebleu is a project dependency
        return None

    def norm(u):
        u = u.split("://", 1)[-1]
        return u[4:] if u.startswith("www.") else u

    wanted = norm(url)
    for dataset in DATASETS.values():
        data = getattr(dataset, "data", None) or []
        md5s = getattr(dataset, "md5", None) or []
        for u, md5 in zip(data, md5s):
            if norm(u) == wanted and md5:
                return md5
    return None


def read_checksum_file(path) -> Dict[str, str]:
    """Parse an ``md5sum``/``sha256sum`` style file into ``{file name: hex digest}``."""
    sums = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        digest, name = line.split(None, 1)
        sums[os.path.basename(name.lstrip("*"))] = digest.lower()
    return sums


def _hash_file(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, md5: Optional[str] = None, sha256: Optional[str] = None, override: Optional[str] = None):
    """Raise :class:`DownloadError` unless ``path`` matches the given digests.

    ``override`` is a digest from a user-supplied checksum file; its algorithm is recognised by length
    (32 hex digits md5, 64 sha256) and it replaces the published digests.
    """
    checks = []
    if override:
        checks.append(("md5" if len(override) == 32 else "sha256", override))
    else:
        if sha256:
            checks.append(("sha256", sha256))
        if md5:
            checks.append(("md5", md5))
    for algorithm, expected in checks:
        actual = _hash_file(path, algorithm)
        if actual.lower() != expected.lower():
            raise DownloadError(
                f"{path.name}: {algorithm} is {actual}, expected {expected}. The file is corrupt or not the "
                f"published one (a bad mirror copy?); it has been deleted, run the command again to re-download."
            )


def mirror_location(mirror: str, filename: str) -> str:
    """The address of ``filename`` in ``mirror`` (a URL or a local directory)."""
    if "://" in mirror and not mirror.startswith("file://"):
        return mirror.rstrip("/") + "/" + urllib.parse.quote(filename)
    base = mirror[len("file://"):] if mirror.startswith("file://") else mirror
    return str(Path(base).expanduser() / filename)


def _copy_local(src: Path, part: Path, log=print):
    if not src.is_file():
        raise DownloadError(f"{src} does not exist (mirror directory lacks this file)")
    size = src.stat().st_size
    with open(src, "rb") as fin, open(part, "wb") as fout, \
            Progress(f"copy {src.name}", total=size, unit="bytes", log=log) as meter:
        for block in iter(lambda: fin.read(CHUNK), b""):
            fout.write(block)
            meter.update(len(block))


def _http_fetch(url: str, part: Path, timeout: float, log=print):
    """Append the missing bytes of ``url`` to ``part`` (resuming with a Range request)."""
    start = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "diverse-fairseq-data/1.0"})
    if start:
        request.add_header("Range", f"bytes={start}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:  # nothing left to fetch: the .part file is already complete
            return None
        raise
    with response:
        status = getattr(response, "status", 200)
        length = response.headers.get("Content-Length")
        if start and status == 206:
            mode = "ab"
            total = start + int(length) if length is not None else None
        else:  # server ignored the Range header: start over
            mode, start = "wb", 0
            total = int(length) if length is not None else None
        with open(part, mode) as out, \
                Progress(f"download {part.name[:-5]}", total=total, unit="bytes", initial=start, log=log) as meter:
            for block in iter(lambda: response.read(CHUNK), b""):
                out.write(block)
                meter.update(len(block))
    size = part.stat().st_size
    if total is not None and size < total:
        raise DownloadError(f"connection closed after {size} of {total} bytes")
    return total


def fetch(source: Source, dest_dir, mirror: Optional[str] = None, checksums: Optional[Dict[str, str]] = None,
          retries: int = 3, timeout: float = 60.0, log=print) -> Path:
    """Make ``dest_dir/source.filename`` exist, complete and verified; return its path.

    An existing final file is trusted (it was renamed there only after verification). Otherwise the
    file is fetched from the mirror (``mirror`` or ``$DIVERSE_FAIRSEQ_MIRROR``) or else from the real
    addresses, resuming a ``.part`` file left by an earlier interrupted run.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / source.filename
    if final.exists():
        log(f"  {source.filename}: present, not downloading again")
        return final
    part = dest_dir / (source.filename + ".part")
    mirror = mirror or os.environ.get(MIRROR_ENV) or None
    locations = [mirror_location(mirror, source.filename)] if mirror else list(source.urls)
    override = (checksums or {}).get(source.filename)
    errors = []
    for location in locations:
        if not _fetch_with_retries(location, part, source.filename, retries, timeout, errors, log):
            continue
        try:
            verify(part, source.md5, source.sha256, override)
        except DownloadError:
            part.unlink()
            raise
        os.replace(part, final)
        checked = ", checksum verified" if (override or source.md5 or source.sha256) else ", no published checksum"
        log(f"  {source.filename}: complete ({final.stat().st_size:,} bytes{checked})")
        return final
    where = f"mirror {mirror}" if mirror else "its public addresses"
    raise DownloadError(
        f"could not download {source.filename} from {where}:\n    " + "\n    ".join(errors) +
        f"\n  Fix the network or proxy, or put the file into {dest_dir}/ yourself"
        f" (or into a directory given with --mirror / ${MIRROR_ENV}), and run the command again."
        + (f" Partial data is kept in {part.name} and will be resumed." if part.exists() else "")
    )


def _fetch_with_retries(location, part, filename, retries, timeout, errors, log) -> bool:
    """Fetch ``location`` into ``part``; True when the bytes are all there (not yet verified)."""
    for attempt in range(1, retries + 1):
        try:
            if "://" in location:
                log(f"  {filename}: fetching {location}" + (" (resuming)" if part.exists() else ""))
                _http_fetch(location, part, timeout, log)
            else:
                log(f"  {filename}: copying {location}")
                _copy_local(Path(location), part, log)
            return True
        except (urllib.error.URLError, http.client.HTTPException, OSError, DownloadError) as e:
            reason = getattr(e, "reason", None) or e
            errors.append(f"{location} (try {attempt}/{retries}): {reason}")
            log(f"  {filename}: {reason}")
            if "://" not in location or (isinstance(e, urllib.error.HTTPError) and e.code in (401, 403, 404, 410)):
                return False  # retrying will not make the file appear
            if attempt < retries:
                time.sleep(min(2 ** attempt, 30))
    return False
