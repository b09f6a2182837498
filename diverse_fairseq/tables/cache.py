"""The table runner's caches: every cached step (training record, evaluation, head-diversity scores, probing)
stores JSON beside its run and reuses it only while the key stored there equals this invocation's.

A training run's key (:func:`cache_key`) is its identity (:func:`diverse_fairseq.runs.identity.run_identity`,
which also names a save directory and checks a resume: the effective, model-changing fairseq-train options and
the prepared data), its number of updates, the checkpoint averaging and the cache version; written to
``key.json`` when training starts and to ``train.json`` when it ends. Neither the run's paths nor the logging
options nor the thread count (recorded in ``train.json``) are part of it: a results directory can move, and a
machine without tensorboard reuses the runs of one with it.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

from ..runs.identity import differences
from ..runs.plan import Plan

#: the form of the cached records and keys; bumped when it changes (2: runs keyed by their identity, typed
#: records), so that the caches of earlier builds are recomputed instead of read
CACHE_VERSION = 2
#: fairseq-train flags (each with one value) that the runner sets itself for every run (TRAIN_ARGS must not contain
#: them): every run logs JSON records to its train.log (read by progress.py); check.py builds the same
RUNNER_FLAGS = ("--log-format", "--log-file")
LOG_FORMAT_ARGS = ["--log-format", "json"]


def cache_version() -> str:
    """The package version and :data:`CACHE_VERSION`, part of every cache key (either one new recomputes
    everything)."""
    from .. import __version__

    return f"{__version__}/cache-{CACHE_VERSION}"


def cache_key(plan: Plan) -> Dict:
    """What a finished run must match to be reused: the plan's identity, its number of updates, the checkpoint
    averaging, the setting and dataset names and the cache version. JSON-normalised, so it compares equal to a
    stored one."""
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


@dataclass(frozen=True)
class Found:
    """A cache file as :func:`lookup` found it."""

    data: Optional[Dict]  # the file's contents; None when there is no file
    key: Optional[Dict]  # the key stored in it; None when there is no file (or no key in it)
    hit: bool  # whether that key matches this invocation's: the cached result may be reused


def lookup(path: Path, key: Dict, stored_key: Callable[[Dict], Optional[Dict]] = lambda data: data.get("key")
           ) -> Found:
    """Read the JSON file ``path`` (if there is one) and compare the key stored in it (``stored_key``; default:
    the file's ``"key"`` field; ``dict``: the file is nothing but the key, as a ``key.json``) with ``key``."""
    if not path.exists():
        return Found(data=None, key=None, hit=False)
    data = json.loads(path.read_text())
    old = stored_key(data)
    return Found(data=data, key=old, hit=old == key)


def store(path: Path, data: Dict):
    """Write ``data`` to ``path`` as indented JSON (making its folder), as every cached step does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def cached(path: Path, key: Dict, compute: Callable[[], Dict], stored_key=lambda data: data.get("key")) -> Dict:
    """The JSON of ``path`` while its stored key is ``key``; else ``compute()``'s, stored there (it must hold the
    key where ``stored_key`` reads it)."""
    found = lookup(path, key, stored_key)
    if found.hit:
        return found.data
    data = compute()
    store(path, data)
    return data


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
