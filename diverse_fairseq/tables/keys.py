"""The cache key of a training run: what a finished run must match to be reused.

A run is reused only if it is the same run: :func:`cache_key` is the run's identity
(:func:`diverse_fairseq.runs.identity.run_identity`, the same one that names a save directory and checks a resume:
the effective, model-changing fairseq-train option values and the prepared data), plus what the identity leaves
to the caller: the number of updates, the checkpoint averaging, and the cache version. The run's own paths and
the logging options are not part of the identity, so a results directory can move and a machine without
tensorboard reuses the runs of one with it. It is written to ``key.json`` when training starts and to
``train.json`` when it ends. The thread count is recorded in ``train.json`` but is not part of the key: it
changes the last bits of the numbers, not the experiment.
"""

import json
from typing import Dict, Optional

from ..runs.identity import differences
from ..runs.plan import Plan
from .cache import cache_version

#: fairseq-train flags (each with one value) that the runner sets itself for every run (TRAIN_ARGS must not contain
#: them)
RUNNER_FLAGS = ("--log-format", "--log-file")
LOG_FORMAT_ARGS = ["--log-format", "json"]  # every run logs JSON records (read by logs.py); check.py builds the same


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
    parts = []
    for name in new:
        if old.get(name) == new[name]:
            continue
        if name == "identity":
            parts.append("; ".join(differences(old.get(name) or {}, new[name])))
        else:
            parts.append(f"{name} {old.get(name)} → {new[name]}")
    return "changed: " + ", ".join(parts)
