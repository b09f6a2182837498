"""What a training run *is* (:func:`run_identity`; docs/architecture.md, "What a run is, planned once"). Spelling
out a default (``--dropout 0.1`` where the architecture's is 0.1) is the same run; :data:`NOT_THE_MODEL` never
counts, the batch options that depend on the number of GPUs do. Its hash names the default save directory;
``SAVE_DIR/train_args.json`` stores it, so that resuming a directory trained as another run is refused
(:func:`check_resume`). The table cache keys on it too (``tables/cache.py``, which adds ``--max-update``).
"""

import contextlib
import hashlib
import io
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY

from .dataset_meta import DatasetMeta

#: bump when the identity's form changes: an identity of another version is never equal to this one's
IDENTITY_VERSION = 2

#: fairseq-train options (argparse destinations) that do not change the model being trained; the only such list
NOT_THE_MODEL = frozenset({
    "data", "save_dir", "tensorboard_logdir", "user_dir", "log_format", "log_file", "log_interval",
    "no_progress_bar", "num_workers", "keep_interval_updates", "keep_last_epochs", "keep_best_checkpoints",
    "save_interval", "save_interval_updates", "no_epoch_checkpoints", "no_last_checkpoints", "no_save",
    "wandb_project", "azureml_logging", "aim_repo", "aim_run_hash", "max_update",
    "distributed_port",  # under SLURM derived from the job id: a resubmitted job resumes its run
    "distributed_rank", "device_id", "distributed_init_method", "restore_file",
})

#: registry choices: always part of the identity (the defaults they bring are compared against)
CHOICES = ("task", "arch", "criterion", "optimizer", "lr_scheduler", "bpe", "tokenizer", "scoring")
ARGS_FILE = "train_args.json"
RESUME_ENV = "RESUME_ANYWAY"


def parse_train_args(args: Sequence[str]):
    """fairseq-train's namespace of ``args`` (its parser, the user dir's options and the architecture's defaults
    applied). Options fairseq-train would not accept are refused here, before anything runs: SystemExit with
    argparse's own error line, or, for routing-by-agreement options (``--routing-*``, NAACL 2019) on an
    architecture without them, naming the plugin's architecture of the same sizes that accepts them."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            namespace, unknown = options.parse_args_and_arch(options.get_training_parser(), input_args=list(args),
                                                             parse_known=True)
    except SystemExit:
        last = [line for line in said.getvalue().splitlines() if line.strip()][-1:] or ["(no message)"]
        raise SystemExit(f"error: fairseq-train would not accept these options: {last[0]}") from None
    routing = sorted({a.split("=", 1)[0] for a in unknown if a.startswith("--routing-")})
    if routing:  # the plugin's architecture of the same sizes: diverse_<arch> where registered
        arch = namespace.arch if namespace.arch.startswith("diverse_") else f"diverse_{namespace.arch}"
        raise SystemExit(f"error: {', '.join(routing)}: routing-by-agreement options, which --arch {namespace.arch} "
                         f"does not accept: add --arch {arch if arch in ARCH_MODEL_REGISTRY else 'diverse_transformer'}"
                         f" (the same sizes, with the routing options)")
    if unknown:
        raise SystemExit("error: fairseq-train would not accept these options: error: unrecognized arguments: "
                         + " ".join(unknown))
    return namespace


def run_identity(namespace, meta: DatasetMeta) -> Dict:
    """A run's identity: the options of fairseq-train's parsed arguments ``namespace`` (:func:`parse_train_args`)
    whose value differs from fairseq's default for the same registry choices (:data:`CHOICES`, always included),
    without :data:`NOT_THE_MODEL`, spelled as flags (``--dropout``); and the prepared data. JSON-normalised, so it
    compares equal to a stored one."""
    effective = vars(namespace)
    baseline_args = [str(effective.get("data") or "data")]
    for name in ("user_dir", *CHOICES):
        if effective.get(name) not in (None, ""):
            baseline_args += [f"--{name.replace('_', '-')}", str(effective[name])]
    baseline = vars(parse_train_args(baseline_args))
    values = {"--" + name.replace("_", "-"): json.loads(json.dumps(value, default=str))
              for name, value in effective.items() if name not in NOT_THE_MODEL and not name.startswith("_")
              and (name in CHOICES or name not in baseline or baseline[name] != value)}
    return {"version": IDENTITY_VERSION, "options": dict(sorted(values.items())), "data": meta.identity()}


def identity_hash(identity: Dict) -> str:
    """8 hex digits of the SHA-256 of an identity (the save directory's suffix)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:8]


def changed_fields(old: Dict, new: Dict, unset: object = None) -> List[Tuple[str, object, object]]:
    """``(name, old value, new value)`` of each key whose value differs between two records, in name order; a key that
    one of them lacks has the value ``unset`` there."""
    return [(name, old.get(name, unset), new.get(name, unset)) for name in sorted(set(old) | set(new))
            if old.get(name, unset) != new.get(name, unset)]


def differences(old: Dict, new: Dict) -> List[str]:
    """``["--lr [0.0007] → [0.001]", "--criterion (default) → ..."]`` and ``"the prepared data"`` where two
    identities differ."""
    if old.get("version") != new.get("version"):
        return [f"made by another version of this package (identity version {old.get('version')}, "
                f"now {new.get('version')})"]
    lines = [f"{name} {before} → {after}"
             for name, before, after in changed_fields(old.get("options", {}), new["options"], "(default)")]
    if old.get("data") != new["data"]:
        lines.append("the prepared data (prepare.json of DATA_BIN/DATASET)")
    return lines


def check_resume(save_dir: Path, identity: Dict, resume_anyway: bool = False) -> Optional[str]:
    """Refuse (``SystemExit``) to resume ``save_dir`` when it was trained as another run (another
    :func:`run_identity`), unless ``resume_anyway`` (``RESUME_ANYWAY=1``); return a warning to print, or ``None``.
    Called before training, also by a dry run."""
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


def write_args(save_dir: Path, identity: Dict, command: List[str], about: Optional[Dict] = None) -> Path:
    """Write ``SAVE_DIR/train_args.json``: the full command and the identity it is checked by, and ``about``
    (training writes the setting's name and the methods: what ``make significance`` labels a system by)."""
    path = Path(save_dir) / ARGS_FILE
    payload = {"identity": identity, "hash": identity_hash(identity), "command": list(command), **(about or {})}
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path
