"""The one cache helper of the table runner's four cached steps (training record, evaluation, head-diversity
scores, probing), and what the evaluation and analysis caches check about a checkpoint.

Every cached step stores JSON beside its run and reuses it only while the key stored there matches the key of
this invocation; what the key is and where it is stored is the step's own
(``steps.py``): :func:`lookup` reads the stored key and says whether it matches, :func:`store` writes a file.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

#: the form of the cached records and keys; bumped when it changes (2: runs keyed by their identity, typed
#: records), so that the caches of earlier builds are recomputed instead of read
CACHE_VERSION = 2


def cache_version() -> str:
    """The package version and :data:`CACHE_VERSION`, part of every cache key (either one new recomputes
    everything)."""
    from .. import __version__

    return f"{__version__}/cache-{CACHE_VERSION}"


def stored_under_key(data: Dict) -> Optional[Dict]:
    """The key of a file that keeps it under ``"key"`` (the training record, the probing cache)."""
    return data.get("key")


def whole_file(data: Dict) -> Dict:
    """The key of a file that is nothing but the key (``key.json`` of a run and of an evaluation)."""
    return data


@dataclass(frozen=True)
class Found:
    """A cache file as :func:`lookup` found it."""

    data: Optional[Dict]  # the file's contents; None when there is no file
    key: Optional[Dict]  # the key stored in it; None when there is no file (or no key in it)
    hit: bool  # whether that key matches this invocation's: the cached result may be reused


def lookup(path: Path, key: Dict, stored_key: Callable[[Dict], Optional[Dict]] = stored_under_key) -> Found:
    """Read the JSON file ``path`` (if there is one) and compare the key stored in it (``stored_key``) with
    ``key``."""
    if not path.exists():
        return Found(data=None, key=None, hit=False)
    data = json.loads(path.read_text())
    old = stored_key(data)
    return Found(data=data, key=old, hit=old == key)


def store(path: Path, data: Dict):
    """Write ``data`` to ``path`` as indented JSON (making its folder), as every cached step does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def checkpoint_identity(checkpoint) -> Dict:
    """What the evaluation and analysis caches check besides a checkpoint's name: its size and the SHA-256 of its
    contents, so that a model changed after the cache was written (a resumed or retrained run) is evaluated
    again, while a results directory that was moved or copied is still reused. Memoised by path, size and
    modification time, so each checkpoint is read once per process."""
    path = Path(checkpoint)
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _IDENTITIES:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _IDENTITIES[memo] = {"name": path.name, "bytes": stat.st_size, "sha256": digest.hexdigest()}
    return dict(_IDENTITIES[memo])


_IDENTITIES: Dict[tuple, Dict] = {}
