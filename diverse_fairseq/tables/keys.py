"""The cache key of a training run: what a finished run must match to be reused.

A run is reused only if it was made by the same effective command: :func:`cache_key` is the full fairseq-train
command line (the setting's hyper-parameters, the row's and ``TRAIN_ARGS``' flags, seed, precision, batch), the
checkpoint averaging, the dataset's ``prepare.json`` and the package version, with the run's own paths left out
(so a results directory can move). It is written to ``key.json`` when training starts and to ``train.json`` when
it ends. The thread count is recorded in ``train.json`` but is not part of the key: it changes the last bits of
the numbers, not the experiment; nor are the logging flags (:data:`RUNNER_FLAGS`), which change what is
written, not what is trained: keys are compared without them (:func:`same_key`).
"""

import json
import shlex
from difflib import SequenceMatcher
from typing import Dict, Optional

from .. import save_dir as save_dirs
from .. import training
from .cache import package_version
from .config import RunConfig

#: fairseq-train flags (each with one value) that the runner sets itself for every run (TRAIN_ARGS must not contain
#: them); they change the log, not the model, so they are left out when keys are compared
RUNNER_FLAGS = save_dirs.LOG_OPTIONS  # one list with the save directory's resumable options
LOG_FORMAT_ARGS = ["--log-format", "json"]  # every run logs JSON records (read by logs.py); check.py builds the same


def cache_key(run: RunConfig, request: training.TrainRequest) -> Dict:
    """What a finished run must match to be reused: the effective fairseq-train command (as
    :func:`training.build_command` makes it for ``request``) with the run's own paths replaced by ``<run>`` /
    ``<data-bin>`` / ``<user-dir>``, checkpoint averaging, setting, dataset (its ``prepare.json`` without the
    creation time), seed and package version. JSON-normalised, so it compares equal to a stored one."""
    args, _, info = training.build_command(request)
    paths = [(str(request.save_dir), "<run>"), (str(run.data_bin), "<data-bin>"),
             (training.USER_DIR, "<user-dir>")]

    def neutral(arg: str) -> str:
        for path, name in paths:
            arg = arg.replace(path, name)
        return arg

    meta = json.loads((run.data_bin / run.dataset / "prepare.json").read_text())
    meta.pop("created", None)
    key = {"command": [neutral(a) for a in args], "average": info["average"], "setting": request.setting,
           "dataset": run.dataset, "data": meta, "seed": request.seed, "version": package_version()}
    return json.loads(json.dumps(key))


def comparable(key: Optional[Dict]) -> Optional[Dict]:
    """``key`` without the :data:`RUNNER_FLAGS` and their values in its command."""
    if not key or "command" not in key:
        return key
    command, skip = [], False
    for arg in key["command"]:
        if skip:
            skip = False
        elif arg in RUNNER_FLAGS:
            skip = True
        elif arg.split("=", 1)[0] not in RUNNER_FLAGS:
            command.append(arg)
    return dict(key, command=command)


def same_key(old: Optional[Dict], new: Dict) -> bool:
    """Whether a stored key and this run's key describe the same experiment (logging flags aside)."""
    return bool(old) and comparable(old) == comparable(new)


def key_difference(old: Optional[Dict], new: Dict) -> str:
    """A short account of how two cache keys differ, for the message that retrains a run."""
    if not old:
        return "no cache key stored (made by an older runner)"
    old, new = comparable(old), comparable(new)
    parts = []
    for name in new:
        if old.get(name) == new[name]:
            continue
        if name == "command":
            before, after = old.get(name) or [], new[name]
            gone, added = [], []
            for op, i1, i2, j1, j2 in SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
                if op != "equal":
                    gone += before[i1:i2]
                    added += after[j1:j2]
            parts.append(f"command (removed {shlex.join(gone) or '-'}; added {shlex.join(added) or '-'})")
        else:
            parts.append(name)
    return "changed: " + ", ".join(parts)
