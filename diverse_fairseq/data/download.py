"""Download files with resume (``NAME.part``, an HTTP ``Range`` request), verification (:mod:`.verify`), atomic
rename and a mirror override (``--mirror BASE`` or ``$DIVERSE_FAIRSEQ_MIRROR``, read by the commands' ``main()``
(:func:`mirror_option`) and handed down: a URL or a local directory, a flat folder of the original files looked up
by name): :func:`fetch`. docs/usage.md says why not pooch or mtdata."""

import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..runs.options import option
from .progress import Progress
from .verify import (
    CHUNK,
    Candidates,
    Expected,
    VerificationError,
    candidates,
    check_copies,
    describe_all,
    mark_verified,
    reject,
    verified_record,
)

MIRROR_ENV = "DIVERSE_FAIRSEQ_MIRROR"


def mirror_option(help: str = "URL or directory holding the files by name, used instead of the public addresses"):
    return option(MIRROR_ENV, help)


def checksums_option(help: str = "md5sum/sha256sum file"):
    return option("CHECKSUMS", help)


class DownloadError(RuntimeError):
    """A file could not be fetched (network error, missing on the mirror, wrong size or checksum)."""


class HTMLResponse(DownloadError):
    """A server answered an HTML page (status 200) where a data file was asked for."""


@dataclass(frozen=True)
class Copy:
    """One published copy of a file that exists in several (the same name, other bytes): its ``name``, the
    ``urls`` that serve it (none: no address serves it any more, a copy placed by hand is still recognised), and
    the ``size`` and digests that ``source`` records for it."""

    name: str
    urls: Tuple[str, ...]
    size: int
    sha256: Optional[str] = None
    sha1: Optional[str] = None
    source: str = ""

    def expected(self) -> Expected:
        return Expected(self.size, self.sha256, None, self.source, self.sha1, self.name)


@dataclass(frozen=True)
class Source:
    """One file to download: ``filename`` (local, and looked up in a mirror), the public ``urls`` tried in order,
    the ``size`` and ``md5``/``sha1``/``sha256`` that a published source (``checksum_source``) records for it, and an
    ``extra["hint"]`` added to the error when it cannot be had. A file published in several copies lists them in
    ``copies`` (its ``urls`` are then theirs, in order): the file fetched from an address must be the copy that
    address serves, a file placed by hand any one of them."""

    filename: str
    urls: Sequence[str]
    md5: Optional[str] = None
    sha256: Optional[str] = None
    extra: Dict[str, str] = field(default_factory=dict)
    size: Optional[int] = None
    checksum_source: str = ""
    sha1: Optional[str] = None
    copies: Tuple[Copy, ...] = ()


def copies_source(filename: str, copies: Sequence[Copy], **extra) -> Source:
    """A :class:`Source` published in several ``copies``, fetched from their addresses in order."""
    return Source(filename, tuple(u for c in copies for u in c.urls), copies=tuple(copies), **extra)


def read_checksum_file(path) -> Dict[str, str]:
    """Parse an ``md5sum``/``sha256sum`` style file into ``{file name: hex digest}``."""
    sums = {}
    for line in map(str.strip, Path(path).read_text().splitlines()):
        if line and not line.startswith("#"):
            digest, name = line.split(None, 1)
            sums[os.path.basename(name.lstrip("*"))] = digest.lower()
    return sums


def expected_for(source: Source, checksums: Optional[Dict[str, str]] = None,
                 manifest: Optional[Dict[str, Expected]] = None) -> Candidates:
    """What ``source`` must be: a manifest's entry (fixtures), else the published values (each published copy's,
    where there are several), completed by a digest from the user's checksum file (``CHECKSUMS``) where nothing is
    published; a user digest that contradicts a published one is refused: the published value wins, always."""
    if manifest and source.filename in manifest:
        return manifest[source.filename]
    if source.copies:
        return tuple(c.expected() for c in source.copies)
    expected = Expected(source.size, source.sha256, source.md5, source.checksum_source or "published checksum",
                        source.sha1)
    override = (checksums or {}).get(source.filename)
    algorithm = "md5" if len(override or "") == 32 else "sha256"
    published = getattr(expected, algorithm)
    if not override or (published and published.lower() == override.lower()):
        return expected
    if published:
        raise DownloadError(
            f"{source.filename}: the checksum file gives {algorithm} {override}, but the published {algorithm} is "
            f"{published} ({expected.source}). Remove the line from CHECKSUMS; for stand-in files (tests, "
            f"fixtures) use an expectations manifest (--expect / EXPECT), which labels the data it makes.")
    return replace(expected, **{algorithm: override},
                   source=expected.source + " and the CHECKSUMS file" if expected.pinned() else "the CHECKSUMS file")


def where_to_get(source: Source, mirror: Optional[str] = None) -> str:
    """Where the right copy of ``source`` can be had, for error messages."""
    urls = " or ".join(source.urls) if source.urls else "its publisher (this recipe knows no public address)"
    return urls + (f" (the mirror {mirror} has a wrong copy: replace it)" if mirror else "")


def _fetch(url: str, part: Path, retries: int, timeout: float, errors: List[str], log) -> bool:
    """Append the missing bytes of ``url`` to ``part`` (resuming with a Range request where the server allows),
    retrying where that may help; True when the bytes are all there (not yet verified)."""
    local, name = url.startswith("file:"), part.name[:-5]
    for attempt in range(1, retries + 1):
        start = part.stat().st_size if part.exists() else 0
        try:
            log(f"  {name}: {'copying' if local else 'fetching'} {url}"
                + (" (resuming)" if part.exists() and not local else ""))
            request = urllib.request.Request(url, headers={"User-Agent": "diverse-fairseq-data/1.0"})
            if start:
                request.add_header("Range", f"bytes={start}-")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status = getattr(response, "status", 200)
                kind = (response.headers.get("Content-Type") or "").lower()
                if kind.startswith(("text/html", "application/xhtml")) and not name.endswith((".html", ".htm")):
                    raise HTMLResponse(f"{url} answered an HTML page (status {status}, Content-Type {kind}), not "
                                       f"the file")
                length = response.headers.get("Content-Length")
                if not (start and status == 206):  # the server ignored the Range header (or a local file): anew
                    start = 0
                total = start + int(length) if length is not None else None
                with open(part, "ab" if start else "wb") as out, Progress(
                        f"{'copy' if local else 'download'} {name}", total=total, unit="bytes", initial=start,
                        log=log) as meter:
                    for block in iter(lambda: response.read(CHUNK), b""):
                        out.write(block)
                        meter.update(len(block))
            if total is not None and part.stat().st_size < total:
                raise DownloadError(f"connection closed after {part.stat().st_size} of {total} bytes")
            return True
        except (urllib.error.URLError, http.client.HTTPException, OSError, DownloadError) as e:
            if isinstance(e, urllib.error.HTTPError) and e.code == 416 and start:
                return True  # nothing left to fetch: the .part file is already complete
            reason = getattr(e, "reason", None) or e
            errors.append(f"{url} (try {attempt}/{retries}): {reason}")
            log(f"  {name}: {reason}")
            if isinstance(e, HTMLResponse) or local or (
                    isinstance(e, urllib.error.HTTPError) and e.code in (401, 403, 404, 410)):
                return False  # retrying will not make the file appear
            if attempt < retries:
                time.sleep(min(2 ** attempt, 30))
    return False


def serves(source: Source, url: str, expected: Candidates) -> Tuple[Expected, ...]:
    """The copies a file fetched from ``url`` may be: the one that address serves where ``source`` lists its copies'
    addresses, else any expected one (a mirror, a single-copy file, a manifest's stand-in)."""
    named = {c.name: c for c in source.copies if url in c.urls}
    own = tuple(e for e in candidates(expected) if e.copy in named)
    return own or candidates(expected)


def fetch(source: Source, dest_dir, mirror: Optional[str] = None, checksums: Optional[Dict[str, str]] = None,
          retries: int = 3, timeout: float = 60.0, log=print, expected: Optional[Candidates] = None) -> Path:
    """Make ``dest_dir/source.filename`` exist, complete and verified; return its path.

    ``expected`` replaces the published values (an expectations manifest); by default they are :func:`expected_for`
    ``(source, checksums)``. An existing final file is used when its ``.verified`` record matches, else verified first
    (a file placed by hand; refused: moved to ``NAME.rejected``). Otherwise the file is fetched from ``mirror`` or
    else from the real addresses in order, resuming a ``.part`` file left by an earlier interrupted run; a location
    whose file fails verification is given up for the next. A file published in several copies must be the copy its
    address serves; its ``.verified`` record says which copy it is and where it came from
    (:func:`~diverse_fairseq.data.verify.verified_record`).
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    expected = expected if expected is not None else expected_for(source, checksums)
    where = where_to_get(source, mirror)
    final = dest_dir / source.filename
    if final.exists():
        if verified_record(final, expected):
            log(f"  {source.filename}: present, not downloading again (verified before)")
            return final
        log(f"  {source.filename}: present, verifying it before use ({describe_all(expected)})")
        try:
            sha256, copy = check_copies(final, final.name, expected, where)
            mark_verified(final, copy, sha256)
            if copy.copy:
                log(f"  {source.filename}: {copy.describe()}")
        except VerificationError as e:
            reject([final])
            raise DownloadError(f"{e} It was moved to {final.name}.rejected. Run the command again to download the "
                                f"published file.") from None
        return final
    part = dest_dir / (source.filename + ".part")
    sizes = [e.size for e in candidates(expected)]
    if part.exists() and None not in sizes and part.stat().st_size > max(sizes):
        part.unlink()  # longer than the published file: not a prefix of it
    errors, urls = [], source.urls
    if mirror:  # a URL, or a local directory read through a file:// URL
        urls = [(mirror if "://" in mirror else Path(mirror).expanduser().resolve().as_uri()).rstrip("/") + "/"
                + urllib.parse.quote(source.filename)]
    for url in urls:
        if not _fetch(url, part, retries, timeout, errors, log):
            continue
        try:
            sha256, copy = check_copies(part, source.filename, serves(source, url, expected), where)
        except VerificationError as e:
            part.unlink()
            errors.append(f"{url}: refused: {e}")
            log(f"  {source.filename}: refused ({e})")
            continue
        os.replace(part, final)
        mark_verified(final, copy, sha256, origin=url)
        log(f"  {source.filename}: complete ({final.stat().st_size:,} bytes, "
            + (f"verified: {copy.describe()}, {copy.source})" if copy.pinned()
               else "no published size or checksum: checked for HTML only)"))
        return final
    raise DownloadError(
        f"could not download {source.filename} from {f'mirror {mirror}' if mirror else 'its public addresses'}:\n    "
        + "\n    ".join(errors) + f"\n  Fix the network or proxy, or put the file into {dest_dir}/ yourself"
        f" (or into a directory given with --mirror / ${MIRROR_ENV}), and run the command again."
        + (f" Partial data is kept in {part.name} and will be resumed." if part.exists() else ""))
