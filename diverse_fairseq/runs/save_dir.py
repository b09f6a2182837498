"""One save directory per training variant, and no silent resume of a different one.

:func:`diverse_fairseq.training.run` (``scripts/train.sh``) names its default save directory
``CHECKPOINTS/<DATASET>_<SETTING>-<hash>``: the hash (8 hex digits) is taken over the run's identity
(:func:`diverse_fairseq.runs.identity.run_identity`: the effective, model-changing fairseq-train option values and
the prepared data), so two method variants never share a directory, and rerunning the same command, or one that
only spells out defaults, finds its own directory again and resumes it. An explicit ``SAVE_DIR`` is used as given.

Before training, the identity is written to ``SAVE_DIR/train_args.json``. A run that would resume a directory
(one with ``checkpoint_last.pt``) whose stored identity differs from the requested one stops before training,
naming each differing option with its old and new value; ``RESUME_ANYWAY=1`` resumes anyway (and records the
new options), another ``SAVE_DIR`` or deleting the directory starts afresh. The options that may differ on
resume are :data:`diverse_fairseq.runs.identity.NOT_THE_MODEL` (logging, saving, ``--max-update``, ...): so
``MAX_UPDATE=N`` extends a run in its own directory, ``AVERAGE=N`` (which only keeps more checkpoints) averages
the run trained without it, and a resubmitted SLURM job (another ``--distributed-port``) resumes its run.
"""

import json
from pathlib import Path
from typing import Dict, List, Optional

from .identity import NOT_THE_MODEL, differences, identity_hash

ARGS_FILE = "train_args.json"
RESUME_ENV = "RESUME_ANYWAY"


def effective_options(args: List[str]) -> Dict[str, Optional[str]]:
    """``{option: value}`` of a fairseq-train argument list, where a later occurrence of an option overrides an
    earlier one (as argparse does); a switch has the value ``None``, the positional data path the key ``DATA``."""
    options: Dict[str, Optional[str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if eq:
                options[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                options[name] = args[i + 1]
                i += 1
            else:
                options[name] = None
        else:
            options["DATA"] = arg
        i += 1
    return options


def default_save_dir(checkpoints: Path, name: str, identity: Dict) -> Path:
    """``checkpoints/<name>-<hash of the run's identity>`` (``name`` is ``<DATASET>_<SETTING>``)."""
    return Path(checkpoints) / f"{name}-{identity_hash(identity)}"


def check_resume(save_dir: Path, identity: Dict, resume_anyway: bool = False) -> Optional[str]:
    """Refuse (``SystemExit``) to resume ``save_dir`` when it was trained as another run (another
    :func:`~diverse_fairseq.runs.identity.run_identity`), unless ``resume_anyway`` (``RESUME_ANYWAY=1``); return a
    warning to print, or ``None``. Called before training, also by a dry run."""
    save_dir = Path(save_dir)
    if not (save_dir / "checkpoint_last.pt").exists():
        return None
    stored = save_dir / ARGS_FILE
    if not stored.exists():
        return (f"{save_dir} has a checkpoint_last.pt but no {ARGS_FILE} (trained by an older version): "
                f"resuming it without checking that it was trained with the same options")
    changed = differences(json.loads(stored.read_text(encoding="utf-8")).get("identity", {}), identity)
    if not changed:
        return None
    listing = "\n  ".join(changed)
    if resume_anyway:
        return f"{RESUME_ENV}=1: resuming {save_dir} although these options changed:\n  {listing}"
    raise SystemExit(
        f"error: {save_dir}/checkpoint_last.pt was trained with other options than the ones requested; "
        f"resuming it would continue that model. Changed (stored → requested):\n  {listing}\n"
        f"To train the requested options from scratch, give another SAVE_DIR (or leave SAVE_DIR unset: "
        f"every variant then gets its own directory) or delete {save_dir}; to continue the stored run with "
        f"the new options anyway, set {RESUME_ENV}=1. Options that may change on resume: "
        f"{', '.join(sorted('--' + name.replace('_', '-') for name in NOT_THE_MODEL))}.")


def write_args(save_dir: Path, identity: Dict, command: List[str]) -> Path:
    """Write ``SAVE_DIR/train_args.json``: the full command and the identity it is checked by."""
    path = Path(save_dir) / ARGS_FILE
    payload = {"identity": identity, "hash": identity_hash(identity), "command": list(command)}
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path


def trained_updates(checkpoint: Path) -> Optional[int]:
    """The number of updates a fairseq checkpoint was saved at (``optimizer_history[-1]["num_updates"]``, what
    fairseq resumes from), or ``None`` when the file cannot be read as a checkpoint.

    Memory-mapped and with ``weights_only=True`` (the package allowlists the classes fairseq stores), so even a
    big model's ``checkpoint_last.pt`` is read in a fraction of a second without loading its tensors."""
    import torch

    try:
        try:
            state = torch.load(str(checkpoint), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a checkpoint in torch's legacy (non-zip) format cannot be memory-mapped
            state = torch.load(str(checkpoint), map_location="cpu", weights_only=True)
        return int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # noqa: BLE001 - a truncated or foreign file: the caller lets fairseq decide
        return None


def finished(save_dir: Path, max_update: Optional[int]) -> Optional[int]:
    """The number of updates of ``save_dir/checkpoint_last.pt`` when it has reached ``max_update`` (the run is
    finished: fairseq would resume it and train one more update before its stop check), else ``None``.
    ``max_update`` None or 0 means no limit (fairseq's default), so a run is never finished by it."""
    last = Path(save_dir) / "checkpoint_last.pt"
    if not max_update or not last.exists():
        return None
    updates = trained_updates(last)
    return updates if updates is not None and updates >= max_update else None


def remove_unused(save_dir: Path) -> bool:
    """After a training that wrote no checkpoint: delete our :data:`ARGS_FILE` and every empty folder in
    ``save_dir`` (an unused tensorboard folder, then ``save_dir`` itself). Nothing else is touched, so a folder
    holding anything else (logs, a user's files) stays. Returns whether ``save_dir`` is gone."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir() or any(save_dir.glob("checkpoint*.pt")):
        return False
    (save_dir / ARGS_FILE).unlink(missing_ok=True)
    for folder in sorted((p for p in save_dir.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    if any(save_dir.iterdir()):
        return False
    save_dir.rmdir()
    return True
