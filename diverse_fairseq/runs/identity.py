"""What a training run *is*: one identity for the save-directory name, the resume check and the table cache.

A run is identified by the *effective* fairseq-train option values, the way fairseq itself sees them: the
arguments are parsed with fairseq's own parser (``options.parse_args_and_arch``, with ``--user-dir`` so that the
plugin's criteria, optimizers and architectures add their options and defaults), and only the values that
differ from what fairseq would use anyway for the same task, architecture, criterion, optimizer and scheduler
count, together with those choices themselves and the prepared data (``prepare.json`` without its creation
time, :meth:`diverse_fairseq.runs.dataset_meta.DatasetMeta.identity`). So spelling out a default changes nothing:
``--dropout 0.1`` on an architecture whose dropout is 0.1, or ``--repulsive-method svgd --repulsive-alpha 0.01
--repulsive-stepsize 0.1`` under ``--optimizer repulsive_adam``, is the same run as leaving them out.

:data:`NOT_THE_MODEL` is the one list of options that do not change the model being trained: where and how
things are logged or saved (``--tensorboard-logdir`` included, which is added only where a writer is installed),
how data is loaded, and how long training goes on (``--max-update``: raising it extends a run in its own
directory; the table cache adds it to its key itself). Everything else counts, the batch options that depend on
the number of GPUs (``--update-freq``, ``--distributed-world-size``, ``--cpu``, precision) included.
"""

import hashlib
import json
from typing import Dict, List, Sequence

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


def parse_train_args(args: Sequence[str]):
    """fairseq-train's namespace of ``args`` (its parser, the user dir's options and the architecture's
    defaults applied). Options fairseq-train would not accept are refused here, before anything runs:
    SystemExit with argparse's own error line."""
    import contextlib
    import io

    from fairseq import options

    parser = options.get_training_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return options.parse_args_and_arch(parser, input_args=list(args))
    except SystemExit:
        last = [line for line in said.getvalue().splitlines() if line.strip()][-1:] or ["(no message)"]
        raise SystemExit(f"error: fairseq-train would not accept these options: {last[0]}") from None


def _normal(value):
    return json.loads(json.dumps(value, default=str))


def option_values(args: Sequence[str]) -> Dict[str, object]:
    """``{option: value}`` of the options whose effective value differs from fairseq's default for the same
    registry choices (:data:`CHOICES`, always included), without :data:`NOT_THE_MODEL`; keys are spelled as
    flags (``--dropout``)."""
    effective = vars(parse_train_args(args))
    baseline_args = [str(effective.get("data") or "data")]
    if effective.get("user_dir"):
        baseline_args += ["--user-dir", str(effective["user_dir"])]
    for name in CHOICES:
        if effective.get(name) is not None:
            baseline_args += [f"--{name.replace('_', '-')}", str(effective[name])]
    baseline = vars(parse_train_args(baseline_args))
    missing = object()
    out = {}
    for name, value in effective.items():
        if name in NOT_THE_MODEL or name.startswith("_"):
            continue
        if name in CHOICES or baseline.get(name, missing) != value:
            out["--" + name.replace("_", "-")] = _normal(value)
    return dict(sorted(out.items()))


def run_identity(args: Sequence[str], meta: DatasetMeta) -> Dict:
    """A run's identity: the model-changing effective option values (:func:`option_values`) and the prepared
    data. JSON-normalised, so it compares equal to a stored one."""
    return {"version": IDENTITY_VERSION, "options": option_values(args), "data": meta.identity()}


def identity_hash(identity: Dict) -> str:
    """8 hex digits of the SHA-256 of an identity (the save directory's suffix)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:8]


def differences(old: Dict, new: Dict) -> List[str]:
    """``["--lr [0.0007] → [0.001]", "--criterion (default) → ..."]`` and ``"the prepared data"`` where two
    identities differ."""
    if old.get("version") != new.get("version"):
        return [f"made by another version of this package (identity version {old.get('version')}, "
                f"now {new.get('version')})"]

    def show(options, name):
        return str(options[name]) if name in options else "(default)"

    before, after = old.get("options", {}), new["options"]
    lines = [f"{name} {show(before, name)} → {show(after, name)}" for name in sorted(set(before) | set(after))
             if (name in before) != (name in after) or before.get(name) != after.get(name)]
    if old.get("data") != new["data"]:
        lines.append("the prepared data (prepare.json of DATA_BIN/DATASET)")
    return lines
