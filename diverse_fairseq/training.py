"""Train with the recipes' hyper-parameters: ``fairseq-train --user-dir diverse_fairseq`` on every visible GPU.

    python -m diverse_fairseq.training DATASET [SETTING_OR_ARCH] [extra fairseq-train options]
    scripts/train.sh DATASET [SETTING_OR_ARCH] [...]

SETTING is ``small`` (Transformer-small, IWSLT), ``base``, ``big`` (the THUMT papers' Transformer-Base and -Big,
100k updates as the authors' trainer), ``big_300k`` (big for Vaswani et al.'s 300k updates), ``fairseq_base``,
``fairseq_big`` (fairseq's Transformer, EMNLP 2020) or ``tiny`` (the laptop-CPU demo scale); an architecture name
(``diverse_transformer_vaswani_wmt_en_de_big``, ...) picks the setting its name implies (``big``, ``iwslt`` →
small, ``tiny``, else base) and replaces its architecture; left out, the dataset's default. Extra options go to
fairseq-train after ours, so they override them (e.g. ``--criterion ... --optimizer repulsive_adam``).
:func:`~diverse_fairseq.runs.plan.plan` turns the request into the run's plan, and :func:`run` trains it.

Save directory: ``SAVE_DIR``, else ``CHECKPOINTS/<DATASET>_<SETTING_OR_ARCH>-<methods>-<hash of its identity>``
(:mod:`diverse_fairseq.runs.naming`, ``NAME`` for the methods); resuming a directory trained as another run is refused
(``RESUME_ANYWAY=1`` overrides). A finished run (``checkpoint_last.pt`` at ``--max-update``) is left alone: raise
``MAX_UPDATE`` to train further (docs/training.md, "Resuming, finished runs and failures"). No setting averages
checkpoints (the journal reports single models); ``AVERAGE=N`` averages the last N into
``SAVE_DIR/checkpoint_avg_lastN.pt``, and that average is evaluated.

Environment, every value checked before anything runs: DATA_BIN, CHECKPOINTS (:mod:`diverse_fairseq.runs.paths`),
SAVE_DIR, NAME, MAX_TOKENS, UPDATE_FREQ, MAX_UPDATE, PRECISION (fp16 | bf16 | amp | memory-efficient-fp16 | fp32),
AVERAGE, EMBEDDINGS (shared | untied), SEED, DRY_RUN=1 (print the command only), RESUME_ANYWAY=1, GPUS=N (the
first N visible GPUs, as the training processes' ``CUDA_VISIBLE_DEVICES``; 0: the CPU). Multi-node: NNODES,
NODE_RANK, MASTER_ADDR, MASTER_PORT (torchrun on each node), or SLURM (``srun`` with one task per node).
"""

import codecs
import logging
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from .average_checkpoints import average_files, last_n_checkpoints
from .runs import env_checks
from .runs.checkpoint_file import finished, refuse_damaged_last, trained_updates
from .runs.cli_logging import fairseq_main_logging, setup_cli_logging
from .runs.hints import evaluate_command, pip_command, repository_extra
from .runs.identity import ARGS_FILE, check_resume, write_args
from .runs.lock import LOCK_FILE, run_lock
from .runs.options import options_of, resolve, warn_misspelled
from .runs.plan import Plan, TrainOptions, TrainRequest, plan, select_gpus, visible_gpus
from .runs.settings import SETTINGS, default_setting


def options_from_env(env: Mapping[str, str]) -> TrainOptions:
    """The checked launch options of ``env`` (SystemExit naming a bad variable)."""
    o = resolve(TrainOptions, env)
    if o.node_rank > (o.nnodes or 1) - 1:
        raise env_checks.bad("NODE_RANK", str(o.node_rank), f"use an integer from 0 to {(o.nnodes or 1) - 1}")
    return o


def request_from_env(dataset: str, setting_or_arch: str, extra: List[str], env: Mapping[str, str],
                     gpus: Optional[int] = None) -> TrainRequest:
    """The request of ``scripts/train.sh DATASET SETTING EXTRA...``: every variable of ``env`` checked before
    anything runs. ``gpus`` overrides ``GPUS`` (None: ``GPUS``, else every visible GPU)."""
    request = resolve(TrainRequest, env, dataset=dataset, setting=setting_or_arch, extra=tuple(extra),
                      options=options_from_env(env))  # every variable, before anything else
    return request if gpus is None else replace(request, gpus=gpus)


def run_from_env(dataset: str, setting_or_arch: str, extra: List[str], env: Mapping[str, str],
                 gpus: Optional[int] = None) -> "TrainResult":
    """:func:`train` of :func:`request_from_env`'s request, ``env`` also being the training processes' environment."""
    return train(request_from_env(dataset, setting_or_arch, extra, env=env, gpus=gpus), env)


def train(request: TrainRequest, env: Mapping[str, str]) -> "TrainResult":
    """``scripts/train.sh``: :func:`run` of the plan of ``request``, holding the run's lock
    (:func:`~diverse_fairseq.runs.lock.run_lock`) on the first node (the other nodes of a multi-node run train the
    same run with it; a dry run writes nothing and takes none). ``env``: this process's environment, also the
    training processes'."""
    p = plan(request)
    if p.request.options.dry_run or not p.rank0:
        return run(p, env)
    with run_lock(p.save_dir, env):
        return run(p, env)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`run` did with a :class:`~diverse_fairseq.runs.plan.Plan`."""

    plan: Plan
    averaged: int = 0  # checkpoints averaged into the evaluated model (0: a single model)
    finished_earlier: bool = False  # checkpoint_last.pt had reached --max-update: left as it was

    @property
    def checkpoint(self) -> Path:
        return self.plan.checkpoint(self.averaged)


def run(p: Plan, env: Mapping[str, str]) -> TrainResult:
    """Train plan ``p`` (resuming from ``checkpoint_last.pt``), then average. Refused before training: more GPUs
    than this machine shows, a resume of another run (:func:`check_resume`) and an unreadable
    ``checkpoint_last.pt`` (:func:`refuse_damaged_last`); a finished run is left alone (:func:`finished`). A failed
    fairseq-train raises SystemExit (:func:`failure_message`), Ctrl-C :class:`Interrupted` with its one line. ``env``
    is the environment of the machine that trains, the training processes' with the GPUs chosen
    (``CUDA_VISIBLE_DEVICES``: the plan's GPUs where ``GPUS`` was given). The caller holds the run's lock."""
    request = p.request
    device_env = select_gpus(request.gpus, env, visible_gpus())[1]
    env = {**env, **device_env}
    dataset, save_dir, cmd = request.dataset, p.save_dir, p.command
    device = f"{p.world} GPU(s)" if p.gpus else "the CPU"
    print(f"[train] {dataset} {request.setting}: {p.arch} on {device}, "
          f"{p.max_tokens} tokens x {p.world} x update-freq {p.update_freq} = "
          f"{p.tokens_per_update} tokens per update (papers: {p.setting.batch_tokens})", flush=True)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in device_env.items())
    print("[train] " + prefix + shlex.join(cmd), flush=True)
    if "--tensorboard-logdir" not in cmd:
        print("[train] no tensorboard logs: neither tensorboardX nor tensorboard is installed "
              f"({pip_command('-e', repository_extra('tensorboard'))})", flush=True)
    warning = check_resume(save_dir, p.identity, resume_anyway=request.options.resume_anyway)
    if warning:
        print(f"[train] warning: {warning}", flush=True)
    evaluate = evaluate_command(p.single_checkpoint, dataset, request.data_bin)
    done = finished(save_dir, p.max_update)
    if done is not None:  # resuming would train update max_update + 1 and overwrite the finished model
        print(f"[train] already trained to {done} updates (--max-update {p.max_update}): {save_dir}; left as it "
              f"is. To train further, raise MAX_UPDATE (e.g. MAX_UPDATE={2 * p.max_update}: the run resumes in the "
              f"same directory); to train afresh, delete it or give another SAVE_DIR. Evaluate with: {evaluate}",
              flush=True)
        averaged = 0 if request.options.dry_run else _average(p, reuse=True)
        return TrainResult(p, averaged=averaged, finished_earlier=True)
    refuse_damaged_last(save_dir)  # fairseq would crash reading it, on every rerun
    resume = "resuming from" if (save_dir / "checkpoint_last.pt").exists() else "new run in"
    print(f"[train] {resume} {save_dir}; evaluate with: {evaluate}", flush=True)
    if request.options.dry_run:
        return TrainResult(p)
    save_dir.mkdir(parents=True, exist_ok=True)
    write_args(save_dir, p.identity, cmd, about={"setting": p.setting_name, "method": p.method})
    try:
        rc, last_error = launch(p, env)
    except Interrupted as e:  # Ctrl-C: one line, what was saved and how to resume (GPUS as the user gave it)
        raise Interrupted(e.update, interrupt_message(e.update, save_dir, resume_command(request, save_dir))) from None
    if rc != 0:
        raise SystemExit(failure_message(rc, last_error, save_dir))
    return TrainResult(p, averaged=_average(p))


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


def launch(p: Plan, env: Mapping[str, str]) -> Tuple[int, str]:
    """fairseq-train on plan ``p``: (its exit status, its last error line). One training process
    (:attr:`~diverse_fairseq.runs.plan.Plan.in_process`) runs in this process (:func:`train_here`); any other plan
    (several GPUs or nodes, torchrun, a ``TRAIN_HOOK``, an option only fairseq-train's command line handles) is
    ``p.command`` started with ``env`` (:func:`call_keeping_error`)."""
    return train_here(p.args) if p.in_process else call_keeping_error(p.command, env)


class _UpdateWatch(logging.Handler):
    """The update number of the last log line of fairseq's that reports one (:func:`last_update`)."""

    def __init__(self):
        super().__init__()
        self.update: Optional[int] = None

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str):  # not the configuration fairseq logs as an object
            seen = last_update(record.getMessage())
            self.update = self.update if seen is None else seen


def forget_fairseq_state() -> None:
    """What a fresh fairseq-train process starts without, and fairseq keeps between two runs in one process: its
    metrics; the best validation score so far and the patience count, kept as attributes of two functions (a
    second run would otherwise save no ``checkpoint_best.pt`` that the first run's score beats); and its tensorboard
    writers, kept by tag alone ("train", "valid"; a second run would write into the first run's
    ``--tensorboard-logdir``), which are closed."""
    import fairseq_cli.train
    from fairseq import checkpoint_utils
    from fairseq.logging import metrics, progress_bar

    metrics.reset()
    for function, names in ((checkpoint_utils.save_checkpoint, ("best",)),
                            (fairseq_cli.train.should_stop_early, ("best", "num_runs"))):
        for name in names:
            if hasattr(function, name):
                delattr(function, name)
    writers = getattr(progress_bar, "_tensorboard_writers", {})  # set where torch or tensorboardX has a writer
    for writer in writers.values():
        writer.close()
    writers.clear()


def train_here(args: Sequence[str]) -> Tuple[int, str]:
    """fairseq-train's ``main`` in this process on ``args`` (through fairseq's ``call_main``, as fairseq-train runs
    it), so that a run costs no second start of torch and fairseq (about 8 CPU-seconds): the same contract as
    :func:`call_keeping_error`. A failure returns status 1 and the exception's last line, its traceback logged (2
    and its message for fairseq-train's parser); Ctrl-C raises :class:`Interrupted` with the last update fairseq
    logged. fairseq's state of a run in this process is forgotten before and after it (:func:`forget_fairseq_state`),
    and its logging is put back afterwards (:func:`~diverse_fairseq.runs.cli_logging.fairseq_main_logging`)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train as fairseq_train

    forget_fairseq_state()
    watch = _UpdateWatch()
    try:
        with fairseq_main_logging(watch):
            parsed = options.parse_args_and_arch(options.get_training_parser(), list(args))
            # one process, as the command's fairseq-train under the plan's CUDA_VISIBLE_DEVICES (fairseq's default
            # world size is every GPU this process sees)
            parsed.distributed_world_size = 1
            distributed_utils.call_main(convert_namespace_to_omegaconf(parsed), fairseq_train.main)
    except KeyboardInterrupt:
        raise Interrupted(watch.update) from None
    except SystemExit as e:  # its parser's error (printed), or an exit of its own
        if e.code in (None, 0):
            return 0, ""
        return (e.code, "") if isinstance(e.code, int) else (1, str(e.code))
    except Exception as e:  # noqa: BLE001 - any failure of fairseq's: its last line, as its process would end
        fairseq_train.logger.exception("fairseq-train failed")
        lines = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
        return 1, lines[-1].strip() if lines else type(e).__name__
    finally:
        forget_fairseq_state()  # its tensorboard files closed too
    return 0, ""


def call_keeping_error(cmd: List[str], env) -> tuple:
    """Run ``cmd`` with its output passed on as it comes (progress bars included); return (exit status, the last
    line it wrote to stderr: fairseq's own error line, repeated as the last line the user sees).

    The update number of fairseq's last progress line is followed. Ctrl-C reaches fairseq-train too (one process
    group): this waits for it to stop, without passing on its KeyboardInterrupt traceback, and raises
    :class:`Interrupted` with that update (also when fairseq-train alone was stopped by SIGINT)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    streams = {out: sys.stdout, err: sys.stderr}
    decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in streams}
    tails = dict.fromkeys(streams, "")  # the last 64 KiB of each stream
    selector = selectors.DefaultSelector()
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    update, interrupted_at = None, None
    try:
        while selector.get_map():
            try:
                for key, _ in selector.select(timeout=1.0):
                    chunk = os.read(key.fd, 65536)
                    text = decoders[key.fd].decode(chunk, final=not chunk)
                    if not chunk:
                        selector.unregister(key.fd)
                    tails[key.fd] = (tails[key.fd] + text)[-65536:]
                    # both streams (tqdm writes to stderr), a number split between two chunks included
                    seen = last_update(tails[key.fd][-64 - len(text):])
                    update = update if seen is None else seen
                    if interrupted_at is None or key.fd == out:  # not its traceback
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
    lines = [line.strip() for line in tails[err].replace("\r", "\n").split("\n")]
    return rc, next((line for line in reversed(lines) if line), "")


def resume_command(request: TrainRequest, save_dir: Path) -> str:
    """The ``scripts/train.sh`` command that continues ``request``'s training in ``save_dir``: its dataset,
    setting and extra options, with the variables that set its options (``SAVE_DIR`` pins the directory)."""
    o, seed = request.options, request.seed
    variables = {"SAVE_DIR": save_dir, "DATA_BIN": request.data_bin, "SEED": seed if seed != 1 else None,
                 "GPUS": request.gpus, "MAX_TOKENS": o.max_tokens, "UPDATE_FREQ": o.update_freq,
                 "MAX_UPDATE": o.max_update, "AVERAGE": o.average, "PRECISION": o.precision,
                 "EMBEDDINGS": o.embeddings, "RESUME_ANYWAY": "1" if o.resume_anyway else None}
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in variables.items() if v is not None)
    return prefix + shlex.join(["scripts/train.sh", request.dataset, request.setting, *request.extra])


def interrupt_message(update: Optional[int], save_dir: Path, resume: str) -> str:
    """The one line after Ctrl-C: the update fairseq reached, the update its last checkpoint holds (read from
    ``save_dir/checkpoint_last.pt``, where fairseq resumes from) and the command that resumes."""
    at = f"interrupted at update {update}" if update is not None else "interrupted before fairseq reported an update"
    last = Path(save_dir) / "checkpoint_last.pt"
    saved = trained_updates(last)  # None: missing or unreadable
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
    elif remove_unused(save_dir):
        what = f"it wrote no checkpoint, so there is nothing to resume; removed the unused {save_dir}"
    else:
        what = f"it wrote no checkpoint, so there is nothing to resume ({save_dir} kept: it holds other files)"
    said = f"\nfairseq-train said: {last_error}" if last_error else ""
    return f"error: fairseq-train failed ({how}): {what}{said}"


def remove_unused(save_dir: Path) -> bool:
    """After a training that wrote no checkpoint: delete our :data:`ARGS_FILE` and every empty folder in
    ``save_dir``, the deepest first (an unused tensorboard folder, then ``save_dir`` itself). Nothing else is
    touched, so a folder holding anything else (logs, a user's files) stays. Returns whether ``save_dir`` is gone."""
    if not save_dir.is_dir() or any(save_dir.glob("checkpoint*.pt")):
        return False
    (save_dir / ARGS_FILE).unlink(missing_ok=True)
    (save_dir / LOCK_FILE).unlink(missing_ok=True)  # held until the caller's run ends; the next one makes another
    for folder in [*sorted(save_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True), save_dir]:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return not save_dir.exists()


def _average(p: Plan, reuse: bool = False) -> int:
    """``AVERAGE=N``: average the last N checkpoints into ``p.checkpoint(N)`` (rank 0 only); return how many were
    averaged (0: none, the single model is evaluated). ``reuse``: keep an average written before."""
    if not (p.average and p.rank0):
        return 0
    out = p.checkpoint(p.average)
    if reuse and out.exists():
        return p.average
    print(f"[train] averaging the last {p.average} checkpoints into {out}", flush=True)
    try:
        average_files(last_n_checkpoints(str(p.save_dir), p.average, p.update_based), str(out))
        return p.average
    except SystemExit as e:  # too few checkpoints (a short run): training itself succeeded
        print(f"[train] warning: no average written: {e}", flush=True)
        return 0


def main(argv=None):
    argv, env = list(sys.argv[1:] if argv is None else argv), os.environ
    foreign = {  # the table runner's variables, which scripts/train.sh does not read (SEEDS=3 would train seed 1)
        "SEEDS": f"SEED (one seed per training; now training with SEED={env_checks.get(env, 'SEED') or 1}; "
                 "SEEDS is the table runner's: make table-<id>, python -m diverse_fairseq.tables)",
        "TRAIN_ARGS": "extra fairseq-train options after the setting on the command line (TRAIN_ARGS is the table "
                      "runner's)"}
    setup_cli_logging()  # fairseq-train's log, where it trains in this process (launch)
    warn_misspelled(env, "train", foreign=foreign)
    for warning in env_checks.foreign_variables(env, foreign, "scripts/train.sh"):
        print(f"[train] warning: {warning}", flush=True)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("settings: " + ", ".join(f"{k} ({v.arch})" for k, v in SETTINGS.items()))
        print("variables:\n" + "\n".join(f"  {f.metadata['var']}: {f.metadata['help']}"
                                          for cls in (TrainRequest, TrainOptions) for f in options_of(cls)))
        return 0 if argv else 2
    dataset, rest = argv[0], argv[1:]
    request = request_from_env(dataset, "", [], env)  # every variable checked before anything runs
    if rest and not rest[0].startswith("-"):
        setting, extra = rest[0], rest[1:]
    else:  # no setting named: the dataset's default
        setting, extra = default_setting(dataset, request.data_bin), rest
        print(f"[train] no setting given: {dataset} trains with {setting!r} (name one to choose: "
              f"{', '.join(SETTINGS)})", flush=True)
    try:
        train(replace(request, setting=setting, extra=tuple(extra)), dict(env))
    except KeyboardInterrupt as e:  # Interrupted: during fairseq-train, with its line; else before or after it
        print(f"[train] {getattr(e, 'message', '') or 'interrupted (outside fairseq-train)'}", file=sys.stderr,
              flush=True)
        return INTERRUPT_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
