"""The table runner's caches: every cached step (training record, evaluation, head-diversity scores, probing)
stores JSON beside its run and reuses it only while the key stored there equals this invocation's.

A training run's key (:func:`cache_key`) is written to ``key.json`` when training starts and to ``train.json``
when it ends. Neither the run's paths nor the logging options nor the thread count are part of it: a results
directory can move, and a machine without tensorboard reuses the runs of one with it.
"""

import functools
import hashlib
import json
from pathlib import Path
from typing import Callable, Dict, Optional

from ..runs.identity import differences
from ..runs.plan import Plan

#: the form of the cached records and keys; bumped when it changes (2: runs keyed by their identity, typed
#: records), so that the caches of earlier builds are recomputed instead of read
CACHE_VERSION = 2
#: fairseq-train flags (each with one value) that the runner sets itself (job.job_plan), not TRAIN_ARGS
RUNNER_FLAGS = ("--log-format", "--log-file")


def cache_version() -> str:
    """The package version and :data:`CACHE_VERSION`, part of every cache key."""
    from .. import __version__

    return f"{__version__}/cache-{CACHE_VERSION}"


def cache_key(plan: Plan) -> Dict:
    """What a finished run must match to be reused: the plan's identity, updates, averaging, setting, dataset and
    cache version; JSON-normalised, so it compares equal to a stored one."""
    key = {"identity": plan.identity, "max_update": plan.max_update, "average": plan.average,
           "setting": plan.setting_name, "dataset": plan.request.dataset, "version": cache_version()}
    return json.loads(json.dumps(key))


def key_difference(old: Optional[Dict], new: Dict) -> str:
    """A short account of how two cache keys differ, for the message that retrains a run."""
    if not old:
        return "no cache key stored (made by an older runner)"
    if old.get("version") != new["version"]:
        return f"changed: made by another version ({old.get('version')}, now {new['version']})"
    parts = ["; ".join(differences(old.get(name) or {}, new[name])) if name == "identity" else
             f"{name} {old.get(name)} → {new[name]}" for name in new if old.get(name) != new[name]]
    return "changed: " + ", ".join(parts)


def load(path: Path) -> Optional[Dict]:
    """The JSON of ``path``; None when there is no such file."""
    return json.loads(path.read_text()) if path.exists() else None


def store(path: Path, data: Dict):
    """Write ``data`` to ``path`` as indented JSON (making its folder), whole or not at all: a reader (another
    invocation collecting the records) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data, indent=1) + "\n")
    part.replace(path)


def cached(path: Path, key: Dict, compute: Callable[[], Dict], stored_key=lambda data: data.get("key")) -> Dict:
    """The JSON of ``path`` while its stored key is ``key``; else ``compute()``'s, stored there (it must hold the
    key where ``stored_key`` reads it)."""
    data = load(path)
    if data is None or stored_key(data) != key:
        data = compute()
        store(path, data)
    return data


def checkpoint_identity(checkpoint) -> Dict:
    """What the evaluation and analysis caches check besides a checkpoint's name: its size and the SHA-256 of its
    contents, so that a changed model (a resumed or retrained run) is evaluated again, while a moved results
    directory is still reused. Memoised by path, size and modification time: each checkpoint is read once."""
    path = Path(checkpoint)
    stat = path.stat()
    return dict(_identity(str(path.resolve()), path.name, stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=None)
def _identity(path: str, name: str, size: int, mtime_ns: int) -> Dict:
    with open(path, "rb") as f:
        return {"name": name, "bytes": size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
