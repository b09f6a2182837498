"""Train with the recipes' hyper-parameters: ``fairseq-train --user-dir diverse_fairseq`` on every visible GPU.

The settings (:mod:`diverse_fairseq.runs.settings`) hold the recipes' hyper-parameters;
:func:`diverse_fairseq.runs.plan.plan` turns a request into the run's plan (fairseq-train's arguments, save
directory, checkpoint to evaluate), and :func:`run` trains it.

    python -m diverse_fairseq.training DATASET SETTING_OR_ARCH [extra fairseq-train options]
    scripts/train.sh DATASET SETTING_OR_ARCH [...]

SETTING is ``small`` (Transformer-small, IWSLT), ``base``, ``big`` (the THUMT papers' Transformer-Base and -Big,
100k updates as the authors' trainer), ``big_300k`` (big for Vaswani et al.'s 300k updates), ``fairseq_base``,
``fairseq_big`` (fairseq's Transformer, EMNLP 2020) or ``tiny`` (the laptop-CPU demo scale); an architecture name
(``transformer_wmt_en_de``, ``diverse_transformer_vaswani_wmt_en_de_big``, ...) picks the setting its name implies
(``big``, ``iwslt`` → small, ``tiny``, else base) and replaces its architecture. Extra options go to
fairseq-train after ours, so they override them (e.g. ``--criterion ... --optimizer repulsive_adam``).

The journal version reports single models (the conference papers do not say), so no setting averages
checkpoints; with ``AVERAGE=N`` the last N checkpoints are averaged after training into
``SAVE_DIR/checkpoint_avg_lastN.pt`` (:func:`diverse_fairseq.average_checkpoints.average_last`), and that average
is evaluated.

Save directory: ``SAVE_DIR``, else ``CHECKPOINTS/<DATASET>_<SETTING_OR_ARCH>-<hash>``, one per run: the hash is
that of the run's identity (:mod:`diverse_fairseq.runs.identity`: the effective, model-changing option values), so
runs with other method flags never share a directory. The identity is stored in ``SAVE_DIR/train_args.json``;
resuming a directory trained as another run is refused before training (``RESUME_ANYWAY=1`` overrides), see
:mod:`diverse_fairseq.runs.save_dir`. A finished run (``checkpoint_last.pt`` at ``--max-update``) is left alone:
raise ``MAX_UPDATE`` to train further (docs/training.md, "Resuming, finished runs and failures").

Environment: DATA_BIN, CHECKPOINTS (defaults: :mod:`diverse_fairseq.runs.paths`), SAVE_DIR, MAX_TOKENS,
UPDATE_FREQ, MAX_UPDATE, PRECISION (fp16 | bf16 | amp | memory-efficient-fp16 | fp32), AVERAGE (N, default 0 = off),
SEED, DRY_RUN=1 (print the command only), RESUME_ANYWAY=1, GPUS=N (train on the first N visible GPUs only: sets
``CUDA_VISIBLE_DEVICES`` of the training processes to the first N of the devices visible now, so fairseq's world
size, torchrun's processes per node and the ``--update-freq`` arithmetic all use N; GPUS=0 trains on the CPU;
more than are visible is an error); every value is checked before anything runs. Multi-node: NNODES, NODE_RANK,
MASTER_ADDR, MASTER_PORT (the command is then started through torchrun on each node), or run under SLURM
(``srun`` with one task per node; fairseq reads the SLURM variables, we add ``--distributed-port``).

SETTING may be left out: the dataset's default is used (:func:`default_setting`: the papers' for their datasets,
else one chosen by the number of training pairs, for your own corpus).
"""

import codecs
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional

from .runs import env_checks, paths
from .runs import save_dir as save_dirs
from .runs.checkpoint_file import refuse_damaged_last
from .runs.plan import PRECISIONS, Plan, TrainOptions, TrainRequest, plan, visible_gpus
from .runs.settings import EMBEDDINGS, SETTINGS, default_setting


def parse_gpus(text) -> Optional[int]:
    """``GPUS``: None when unset (every visible GPU), else a non-negative integer; SystemExit otherwise."""
    if text in (None, ""):
        return None
    try:
        return env_checks.parse_int("GPUS", text)
    except SystemExit:
        raise env_checks.bad("GPUS", text, "use a non-negative integer (0 = the CPU, N = the first N visible GPUs), "
                             "or leave GPUS unset to use every visible GPU") from None


def select_gpus(requested: Optional[int], env, visible: int):
    """(GPUs to train on, environment for the training processes) for ``requested`` GPUs (None: all visible).

    ``CUDA_VISIBLE_DEVICES`` becomes the first ``requested`` entries of the current one (0..N-1 when unset), so
    that fairseq (whose default world size is the number of visible devices), torchrun and SLURM's fairseq
    launch all see exactly those devices. More than ``visible`` is an error."""
    if requested is None:
        return visible, {}
    current = env.get("CUDA_VISIBLE_DEVICES")
    if requested > visible:
        shown = f"CUDA_VISIBLE_DEVICES={current}" if current is not None else "CUDA_VISIBLE_DEVICES unset"
        raise SystemExit(f"error: GPUS={requested} but only {visible} GPU(s) are visible ({shown}): use GPUS={visible} "
                         f"or fewer (GPUS=0 trains on the CPU), or leave GPUS unset to use every visible GPU")
    if requested == 0:
        return 0, {"CUDA_VISIBLE_DEVICES": ""}
    ids = [d.strip() for d in current.split(",") if d.strip()] if current else [str(i) for i in range(visible)]
    return requested, {"CUDA_VISIBLE_DEVICES": ",".join(ids[:requested])}


def _env(env, name, default=None):
    value = env_checks.get(env, name)
    return value if value is not None else default


def _int(env, name, default, minimum, maximum=None):
    """The integer environment variable ``name`` (``default`` when unset), validated."""
    value = env_checks.get(env, name)
    return default if value is None else env_checks.parse_int(name, value, minimum, maximum)


def options_from_env(env) -> TrainOptions:
    """The validated launch options of the environment (SystemExit naming a bad variable)."""
    nnodes = _int(env, "NNODES", None, 1)
    return TrainOptions(
        nnodes=nnodes, slurm_nnodes=_int(env, "SLURM_NNODES", 1, 1),
        max_tokens=_int(env, "MAX_TOKENS", None, 1), update_freq=_int(env, "UPDATE_FREQ", None, 1),
        max_update=_int(env, "MAX_UPDATE", None, 1), average=_int(env, "AVERAGE", None, 0),
        node_rank=_int(env, "NODE_RANK", 0, 0, (nnodes or 1) - 1),
        master_addr=_env(env, "MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", None, 1, 65535), slurm_job_id=_int(env, "SLURM_JOB_ID", 0, 0),
        slurm_node_id=_int(env, "SLURM_NODEID", 0, 0),
        precision=None if env_checks.get(env, "PRECISION") is None
        else env_checks.parse_choice("PRECISION", env["PRECISION"], PRECISIONS),
        dry_run=env_checks.parse_flag("DRY_RUN", env.get("DRY_RUN")),
        resume_anyway=env_checks.parse_flag(save_dirs.RESUME_ENV, env.get(save_dirs.RESUME_ENV)),
        embeddings=None if env_checks.get(env, "EMBEDDINGS") is None
        else env_checks.parse_choice("EMBEDDINGS", env["EMBEDDINGS"], EMBEDDINGS),
        checkpoints=paths.from_env("CHECKPOINTS", env),
    )


def request_from_env(dataset: str, setting_or_arch: str, extra: List[str], env=None,
                     gpus: Optional[int] = None) -> TrainRequest:
    """The request of ``scripts/train.sh DATASET SETTING EXTRA...``: every variable of ``env`` (default: this
    process's environment) checked before anything runs. ``gpus`` overrides ``GPUS``; a ``GPUS`` above the
    visible devices is an error here."""
    env = dict(os.environ if env is None else env)
    options = options_from_env(env)  # every variable, before anything else
    seed = _int(env, "SEED", 1, 0)
    if gpus is None:
        gpus = parse_gpus(env.get("GPUS"))
        select_gpus(gpus, env, visible_gpus())  # more than are visible: stop now
    save_dir = _env(env, "SAVE_DIR")
    return TrainRequest(dataset=dataset, setting=setting_or_arch, extra=tuple(extra), seed=seed,
                        save_dir=Path(save_dir) if save_dir else None,
                        data_bin=paths.from_env("DATA_BIN", env), gpus=gpus, options=options)


def run_from_env(dataset: str, setting_or_arch: str, extra: List[str], env=None,
                 gpus: Optional[int] = None) -> "TrainResult":
    """:func:`run` of :func:`request_from_env`'s request, ``env`` also being the training processes' environment."""
    return run(request_from_env(dataset, setting_or_arch, extra, env=env, gpus=gpus), env=env)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`run` did with a :class:`~diverse_fairseq.runs.plan.Plan`."""

    plan: Plan
    averaged: int = 0  # checkpoints averaged into the evaluated model (0: a single model)
    finished_earlier: bool = False  # checkpoint_last.pt had reached --max-update: left as it was
    device_env: Dict[str, str] = field(default_factory=dict)  # CUDA_VISIBLE_DEVICES of the training processes

    @property
    def checkpoint(self) -> Path:
        """The checkpoint to evaluate (:meth:`Plan.checkpoint`)."""
        return self.plan.checkpoint(self.averaged)


def run(request: TrainRequest, env=None) -> TrainResult:
    """Train the :func:`~diverse_fairseq.runs.plan.plan` of ``request`` (resuming from
    SAVE_DIR/checkpoint_last.pt if present), then average.

    A finished run, whose ``checkpoint_last.pt`` has reached ``--max-update`` (``MAX_UPDATE``), is left alone
    (``finished_earlier``): fairseq would resume it and train one more update before its stop check,
    overwriting the finished model. Model options the architecture lacks (``--routing-*`` without a routing
    architecture) stop the run before it starts (:func:`~diverse_fairseq.runs.plan.plan`). A resume of another
    run (another identity) is refused. A failed fairseq-train raises SystemExit that offers to resume only
    where a checkpoint exists (a save directory left with nothing but ``train_args.json`` is removed) and
    ends with fairseq's own error line (:func:`failure_message`). A ``checkpoint_last.pt`` that cannot be read is
    refused before training, naming the intact checkpoint to resume from (:func:`refuse_damaged_last`). Ctrl-C
    raises :class:`Interrupted` whose ``message`` gives the update reached, the last checkpoint's update and the
    command that resumes (:func:`interrupt_message`).

    ``request.gpus`` (None: every visible GPU) restricts training to the first ``gpus`` visible devices
    (:func:`select_gpus`). ``env`` is the training processes' environment (default: this process's), their
    ``CUDA_VISIBLE_DEVICES`` set to the chosen devices; no training option is read from it.
    """
    env = dict(os.environ if env is None else env)
    gpus, device_env = select_gpus(request.gpus, env, visible_gpus())
    env.update(device_env)
    asked = request
    p = plan(replace(request, gpus=gpus))
    dataset, save_dir, cmd = request.dataset, p.save_dir, p.command
    device = f"{p.world} GPU(s)" if p.gpus else "the CPU"
    print(f"[train] {dataset} {request.setting}: {p.arch} on {device}, "
          f"{p.max_tokens} tokens x {p.world} x update-freq {p.update_freq} = "
          f"{p.tokens_per_update} tokens per update (papers: {p.setting.batch_tokens})", flush=True)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in device_env.items())
    print("[train] " + prefix + shlex.join(cmd), flush=True)
    if "--tensorboard-logdir" not in cmd:
        print("[train] no tensorboard logs: neither tensorboardX nor tensorboard is installed "
              "(pip install -e '.[tensorboard]')", flush=True)
    warning = save_dirs.check_resume(save_dir, p.identity,
                                     resume_anyway=request.options.resume_anyway)  # refuses a different run
    if warning:
        print(f"[train] warning: {warning}", flush=True)
    done = save_dirs.finished(save_dir, p.max_update)
    if done is not None:  # resuming would train update max_update + 1 and overwrite the finished model
        print(f"[train] already trained to {done} updates (--max-update {p.max_update}): {save_dir}; left as it "
              f"is. To train further, raise MAX_UPDATE (e.g. MAX_UPDATE={2 * p.max_update}: the run resumes in the "
              f"same directory); to train afresh, delete it or give another SAVE_DIR. Evaluate with: "
              f"scripts/evaluate.sh {p.single_checkpoint} {dataset}", flush=True)
        averaged = 0 if request.options.dry_run else _average(p, reuse=True)
        return TrainResult(p, averaged=averaged, finished_earlier=True, device_env=device_env)
    # fairseq would crash reading it, on every rerun; "the same command": train.sh's or the table runner's
    refuse_damaged_last(save_dir)
    rerun = resume_command(asked, save_dir)  # GPUS as the user gave it (unset: every visible GPU)
    resume = "resuming from" if (save_dir / "checkpoint_last.pt").exists() else "new run in"
    print(f"[train] {resume} {save_dir}; evaluate with: scripts/evaluate.sh {p.single_checkpoint} {dataset}",
          flush=True)
    if request.options.dry_run:
        return TrainResult(p, device_env=device_env)
    save_dir.mkdir(parents=True, exist_ok=True)
    save_dirs.write_args(save_dir, p.identity, cmd)
    try:
        rc, last_error = call_keeping_error(cmd, env)
    except Interrupted as e:  # Ctrl-C: one line, what was saved and how to resume
        raise Interrupted(e.update, interrupt_message(e.update, save_dir, rerun)) from None
    if rc != 0:
        raise SystemExit(failure_message(rc, last_error, save_dir))
    return TrainResult(p, averaged=_average(p), device_env=device_env)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during fairseq-train: ``update`` is the last update fairseq's progress reported (None: none yet);
    ``message`` (set by :func:`run`) the one line that says what was saved and how to resume."""

    def __init__(self, update: Optional[int] = None, message: str = ""):
        super().__init__(update, message)
        self.update, self.message = update, message


#: the update number in fairseq's progress lines: ``num_updates=50`` (simple, tqdm), ``"num_updates": "50"``
#: (json), ``num_updates 200`` (end-of-epoch summaries), ``"train_num_updates": "200"``
_NUM_UPDATES = re.compile(r"num_updates\W{1,4}(\d+)")
INTERRUPT_EXIT = 130  # the shell's status for a command ended by SIGINT (128 + 2)


def last_update(text: str) -> Optional[int]:
    """The last update number that fairseq's progress output ``text`` reports, or None."""
    found = _NUM_UPDATES.findall(text)
    return int(found[-1]) if found else None


def call_keeping_error(cmd: List[str], env) -> tuple:
    """Run ``cmd`` with its output shown as it comes; return (exit status, the last line it wrote to stderr).

    stdout (fairseq's log) and stderr are passed on chunk by chunk (progress bars with carriage returns
    included); the last 64 KiB of stderr are kept, so that fairseq's own error line (argparse's ``error: ...``, a
    traceback's exception) can be repeated as the last line the user sees, and the update number of fairseq's
    last progress line is followed. Ctrl-C reaches fairseq-train too (one process group): this waits for it to
    stop, without passing on its KeyboardInterrupt traceback, and raises :class:`Interrupted` with that update
    (an ``Interrupted`` also when fairseq-train alone was stopped by SIGINT)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    streams = {proc.stdout.fileno(): sys.stdout, proc.stderr.fileno(): sys.stderr}
    decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in streams}
    selector = selectors.DefaultSelector()
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    tail, update, interrupted_at, carry = "", None, None, {fd: "" for fd in streams}
    try:
        while selector.get_map():
            try:
                ready = selector.select(timeout=1.0)
                for key, _ in ready:
                    chunk = os.read(key.fd, 65536)
                    text = decoders[key.fd].decode(chunk, final=not chunk)
                    if not chunk:
                        selector.unregister(key.fd)
                    seen = last_update(carry[key.fd] + text)  # tqdm's progress bar writes to stderr
                    update = update if seen is None else seen
                    carry[key.fd] = (carry[key.fd] + text)[-64:]  # a number split between two chunks
                    if key.fd == proc.stderr.fileno():
                        tail = (tail + text)[-65536:]
                    if interrupted_at is None or key.fd == proc.stdout.fileno():  # not its traceback
                        streams[key.fd].write(text)
                        streams[key.fd].flush()
                if interrupted_at is not None and proc.poll() is None and time.time() - interrupted_at > 10:
                    proc.send_signal(signal.SIGINT)  # the signal reached only this process: pass it on, once
                    interrupted_at = float("inf")
            except KeyboardInterrupt:
                interrupted_at = interrupted_at or time.time()
    finally:
        selector.close()
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # a second Ctrl-C: fairseq is stopping already
                interrupted_at = interrupted_at or time.time()
        proc.stdout.close()
        proc.stderr.close()
    if interrupted_at is not None or rc in (-signal.SIGINT, INTERRUPT_EXIT):
        raise Interrupted(update)
    lines = [line.strip() for line in tail.replace("\r", "\n").split("\n")]
    return rc, next((line for line in reversed(lines) if line), "")


def resume_command(request: TrainRequest, save_dir: Path) -> str:
    """The ``scripts/train.sh`` command that continues ``request``'s training in ``save_dir``: its dataset,
    setting and extra options, with the variables that set its options (``SAVE_DIR`` pins the directory)."""
    o = request.options
    variables = {"SAVE_DIR": str(save_dir), "DATA_BIN": str(request.data_bin),
                 "SEED": str(request.seed) if request.seed != 1 else None,
                 "GPUS": None if request.gpus is None else str(request.gpus),
                 "MAX_TOKENS": o.max_tokens, "UPDATE_FREQ": o.update_freq, "MAX_UPDATE": o.max_update,
                 "AVERAGE": o.average, "PRECISION": o.precision, "EMBEDDINGS": o.embeddings,
                 "RESUME_ANYWAY": "1" if o.resume_anyway else None}
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in variables.items() if v is not None)
    return prefix + shlex.join(["scripts/train.sh", request.dataset, request.setting, *request.extra])


def interrupt_message(update: Optional[int], save_dir: Path, resume: str) -> str:
    """The one line after Ctrl-C: the update fairseq reached, the update its last checkpoint holds (read from
    ``save_dir/checkpoint_last.pt``, where fairseq resumes from) and the command that resumes."""
    at = f"interrupted at update {update}" if update is not None else "interrupted before fairseq reported an update"
    last = Path(save_dir) / "checkpoint_last.pt"
    saved = save_dirs.trained_updates(last) if last.exists() else None
    if saved is not None:
        return f"{at}; the last checkpoint is at update {saved} ({last}); resume with: {resume}"
    if last.exists():
        return (f"{at}; {last} cannot be read (Ctrl-C during its save?): the next run refuses it and names the "
                f"fix; then resume with: {resume}")
    return f"{at}; no checkpoint was saved yet, so a new run starts from update 0 with: {resume}"


def failure_message(rc: int, last_error: str, save_dir: Path) -> str:
    """The error for a failed fairseq-train: "resume" only where a checkpoint exists (a save directory holding
    nothing but ours is removed), fairseq's own error line last."""
    how = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
    if (save_dir / "checkpoint_last.pt").exists():
        what = f"run the same command again to resume from {save_dir}/checkpoint_last.pt"
    elif save_dirs.remove_unused(save_dir):
        what = f"it wrote no checkpoint, so there is nothing to resume; removed the unused {save_dir}"
    else:
        what = f"it wrote no checkpoint, so there is nothing to resume ({save_dir} kept: it holds other files)"
    said = f"\nfairseq-train said: {last_error}" if last_error else ""
    return f"error: fairseq-train failed ({how}): {what}{said}"


def _average(p: Plan, reuse: bool = False) -> int:
    """``AVERAGE=N``: average the last N checkpoints into :attr:`Plan.average_file` (rank 0 only); return how
    many were averaged (0: none, the single model is evaluated). ``reuse``: keep an average written before
    (a finished run's)."""
    if not (p.average and p.rank0):
        return 0
    from .average_checkpoints import average_last

    out = p.average_file
    if reuse and out.exists():
        return p.average
    print(f"[train] averaging the last {p.average} checkpoints into {out}", flush=True)
    try:
        average_last(str(p.save_dir), p.average, p.update_based, str(out))
        return p.average
    except SystemExit as e:  # too few checkpoints (a short run): training itself succeeded
        print(f"[train] warning: no average written: {e}", flush=True)
        return 0


#: variables of other commands that this one does not read: {name: what to use here instead}
FOREIGN_VARIABLES = {
    "SEEDS": "SEED (one seed per training; SEEDS is the table runner's: make table-<id>, python -m "
             "diverse_fairseq.tables)",
    "TRAIN_ARGS": "extra fairseq-train options after the setting on the command line (TRAIN_ARGS is the table "
                  "runner's)",
}


def foreign_variable_warnings(env) -> List[str]:
    """Warnings for variables set in ``env`` that belong to another command (``SEEDS=3 scripts/train.sh``
    would otherwise silently train, or resume, seed 1), each naming the variable to use."""
    return [f"{name}={env[name]} is not read by scripts/train.sh: use {instead}; now training with SEED="
            f"{env.get('SEED') or 1}" if name == "SEEDS" else
            f"{name}={env[name]} is not read by scripts/train.sh: use {instead}"
            for name, instead in FOREIGN_VARIABLES.items() if env_checks.get(env, name) is not None]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    for warning in foreign_variable_warnings(os.environ):
        print(f"[train] warning: {warning}", flush=True)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("settings: " + ", ".join(f"{k} ({v.arch})" for k, v in SETTINGS.items()))
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    dataset, rest = argv[0], argv[1:]
    if rest and not rest[0].startswith("-"):
        setting, extra = rest[0], rest[1:]
    else:  # no setting named: the dataset's default
        setting, extra = default_setting(dataset, paths.from_env("DATA_BIN")), rest
        print(f"[train] no setting given: {dataset} trains with {setting!r} (name one to choose: "
              f"{', '.join(SETTINGS)})", flush=True)
    try:
        run_from_env(dataset, setting, extra)
    except KeyboardInterrupt as e:  # Interrupted: during fairseq-train, with its line; else before or after it
        print(f"[train] {getattr(e, 'message', '') or 'interrupted (outside fairseq-train)'}", file=sys.stderr,
              flush=True)
        return INTERRUPT_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
