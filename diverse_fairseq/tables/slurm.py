"""The table runner on a SLURM cluster (``LAUNCHER=slurm``): every job of a table (:class:`~.job.TableJob`: a row and
seed, with the rows that train the same model) is one SLURM job, submitted with submitit, FAIR's launcher library
(it writes the sbatch script, pickles the job, starts it on the node through ``srun`` and keeps its log). On the
node, :func:`main` is the job's main: it reads the node's environment once and calls
:func:`~.job.run_job`, the job function of the local runner too.

A table's life on the cluster (:func:`run_on_slurm`): the jobs are submitted, then followed (``WAIT`` seconds;
default: until every one has ended; 0: submit and exit), with a line for each job's SLURM id and state changes, its
log and the progress line of its training log. Each run directory keeps its SLURM job ids (``slurm.json``) and logs
(``slurm/<id>_0_log.out``), so that running the same command again collects: a finished job is read from its record
(``job.json``); a job still queued or running is followed, not submitted again; a TIMEOUT or PREEMPTED one is
submitted again and resumes from ``checkpoint_last.pt``; another failure is reported with its state and the end of
its log, and submitted again only with ``RESUBMIT=failed``. Job states come from ``sacct`` (submitit's watcher).
"""

import contextlib
import fcntl
import math
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from ..runs import env_checks
from ..runs.options import choice, integer, number, option, word, words
from .cache import load, store
from .job import RECORD, TableJob, finished_record, run_job
from .progress import LogWatcher
from .records import JobRecord
from .steps import SLURM_LOGS, SLURM_STATE

LAUNCHERS = ("local", "slurm")
#: states of a job that is not over (sacct's; UNKNOWN: not yet in sacct right after its submission)
ACTIVE = ("UNKNOWN", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT")
#: ended by the cluster, not by the job: always submitted again, to resume from checkpoint_last.pt
RESUMED = ("TIMEOUT", "PREEMPTED")
#: seconds after its submission by which sacct knows a job; one it does not know by then is reported LOST, as failed
FORGOTTEN = 600
#: submitted again in one invocation at most this many times each (a time limit too short to reach a checkpoint)
MAX_RESUMES = 3
#: sbatch options that the launcher sets itself, and the variable to use instead
OWN_SBATCH = {"--time": "TIME_LIMIT", "--partition": "PARTITION", "--account": "ACCOUNT", "--qos": "QOS",
              "--constraint": "CONSTRAINT", "--nodes": "NODES", "--gpus-per-node": "GPUS",
              "--cpus-per-task": "THREADS (each job's CPU threads per GPU)", "--ntasks-per-node": "NODES",
              "--job-name": "", "--output": "", "--error": "", "--signal": "", "--open-mode": "", "--array": ""}


def parse_time_limit(label: str, text: str) -> int:
    """``TIME_LIMIT``: minutes, or ``[D-]HH:MM:SS`` (sbatch's forms), as whole minutes (rounded up)."""
    found = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)", text.strip())
    if text.strip().isdigit():
        minutes = int(text)
    elif found:
        days, hours, mins, secs = (int(g or 0) for g in found.groups())
        minutes = math.ceil((((days * 24 + hours) * 60 + mins) * 60 + secs) / 60)
    else:
        minutes = 0
    if minutes < 1:
        raise env_checks.bad(label, text, "give minutes (e.g. 90) or D-HH:MM:SS (e.g. 2-00:00:00), at least 1 minute")
    return minutes


def parse_sbatch_args(label: str, text: str) -> Tuple[Tuple[str, object], ...]:
    """``SBATCH_ARGS``: sbatch options as ``--name=value`` or ``--flag``, e.g. ``--mail-type=END --exclusive``;
    ``((name, value or True), ...)``. The options the launcher sets itself are refused, naming their variable."""
    pairs = []
    for arg in words(label, text):
        name, _, value = arg.partition("=")
        if not re.fullmatch(r"--[a-z][a-z0-9-]*", name):
            raise env_checks.bad(label, text, f"write each sbatch option as --name=value or --flag (not {arg!r}), "
                                              f"e.g. SBATCH_ARGS='--mem=64G --mail-type=END'")
        if name in OWN_SBATCH:
            instead = OWN_SBATCH[name]
            raise env_checks.bad(label, text, f"leave out {name}: the launcher sets it" +
                                 (f" (use {instead})" if instead else ""))
        pairs.append((name[2:], value if value else True))
    return tuple(pairs)


def launcher_option():
    """``LAUNCHER``: where a table's jobs run."""
    return option("LAUNCHER", "local: the jobs run on this machine (JOBS at a time); slurm: each job is a SLURM job "
                              "(GPUS must be given; PARTITION, TIME_LIMIT, NODES, ... docs/usage.md, 'Paper tables "
                              "on a cluster')", "local", choice(LAUNCHERS))


@dataclass(frozen=True)
class SlurmOptions:
    """How the jobs of a table are submitted and followed with ``LAUNCHER=slurm``."""

    partition: Optional[str] = option("PARTITION", "SLURM partition of every job (default: the cluster's)")
    account: Optional[str] = option("ACCOUNT", "SLURM account charged for every job")
    qos: Optional[str] = option("QOS", "SLURM quality of service of every job")
    constraint: Optional[str] = option("CONSTRAINT", "SLURM node features every job needs, e.g. 'a100|h100'")
    time_limit: Optional[int] = option(
        "TIME_LIMIT", "time limit of every job, minutes or D-HH:MM:SS (default: the partition's); a job that reaches "
        "it is submitted again and resumes from its checkpoint_last.pt", None, parse_time_limit)
    nodes: int = option("NODES", "nodes per job, GPUS GPUs on each (fairseq's SLURM initialisation over srun, one "
                                 "task per node)", 1, integer(1))
    sbatch_args: Tuple[Tuple[str, object], ...] = option(
        "SBATCH_ARGS", "more sbatch options for every job, e.g. '--mem=64G --mail-type=END --reservation=x'",
        parse=parse_sbatch_args, default_factory=tuple)
    wait: Optional[float] = option("WAIT", "seconds to follow the jobs after submitting them (default: until every "
                                           "one has ended); 0: submit and exit", None, number(0))
    resubmit_failed: bool = option(
        "RESUBMIT", "failed: submit again the jobs that ended FAILED, CANCELLED, OUT_OF_MEMORY or NODE_FAIL (TIMEOUT "
        "and PREEMPTED jobs always are)", False, word("failed"), flag="--resubmit")


# ----------------------------------------------------------------------------------------------- on the node
def main(job: TableJob) -> Optional[JobRecord]:
    """The SLURM job's main, on each of its nodes (submitit unpickles ``job`` there and calls this): the node's
    environment, read once, handed to :func:`~.job.run_job` (on the first node; the others only train with it)."""
    from .. import training
    from ..runs.cli_logging import setup_cli_logging

    setup_cli_logging()
    env = dict(os.environ)
    job = on_node(job, env)
    if not job.plan.rank0:  # a further node of a job over several: fairseq-train's ranks there, nothing else
        training.run(job.plan, env)
        return None
    return run_job(job, env)


def on_node(job: TableJob, env: Dict[str, str]) -> TableJob:
    """``job`` as this node runs it. Over several nodes, fairseq's SLURM initialisation needs the same port on every
    node and this node's rank, which the submitting side cannot know: the plan is made again with this SLURM job's
    id (the port) and node id (the first node averages and evaluates); neither is part of the run's identity."""
    if job.plan.nodes == 1:
        return job
    from ..runs.plan import plan

    request = job.plan.request
    options = replace(request.options, slurm_nnodes=int(env["SLURM_NNODES"]), slurm_job_id=int(env["SLURM_JOB_ID"]),
                      slurm_node_id=int(env["SLURM_NODEID"]))
    return replace(job, plan=plan(replace(request, options=options)))


# ------------------------------------------------------------------------------------ the submitting side
def check_cluster():
    """SystemExit before any work when this machine cannot submit SLURM jobs."""
    missing = [c for c in ("sbatch", "sacct", "srun") if shutil.which(c) is None]
    if missing:
        raise SystemExit(f"error: LAUNCHER=slurm, but {' and '.join(missing)} cannot be found here: run the table on a "
                         f"machine that submits to the cluster (a login node), or with LAUNCHER=local")


@dataclass
class _Job:
    """One table job as this invocation follows it on the cluster."""

    job: TableJob
    ids: List[str]  # its SLURM job ids (slurm.json), the last one current
    state: Optional[str] = None  # the current id's state as last printed
    record: Optional[JobRecord] = None
    resumes: int = 0  # submitted again in this invocation after TIMEOUT or PREEMPTED
    watcher: Optional[LogWatcher] = None

    @property
    def where(self) -> str:
        return f"[{self.job.table}] row {self.job.row} seed {self.job.seed}"

    @property
    def log(self) -> Path:
        return log_path(self.job, self.ids[-1])


def log_path(job: TableJob, slurm_id: str) -> Path:
    """The SLURM log of one submission of ``job`` (its output and errors, where submitit's sbatch script puts them)."""
    from submitit.core.utils import JobPaths

    return JobPaths(job.run_dir / SLURM_LOGS, job_id=slurm_id, task_id=0).stdout


def _submitted(job: TableJob) -> float:
    """When the job's last submission was made (seconds since the epoch)."""
    return time.mktime(time.strptime(submissions(job)[-1]["submitted"], "%Y-%m-%d %H:%M:%S"))


def submissions(job: TableJob) -> List[Dict]:
    """The job's SLURM submissions recorded in its run directory (``slurm.json``), oldest first."""
    return (load(job.run_dir / SLURM_STATE) or {}).get("submissions", [])


def _record(job: TableJob, slurm_id: str, state: Optional[str] = None):
    """Record a new submission (``state`` None) or the last state of ``slurm_id`` in ``slurm.json``."""
    subs = submissions(job)
    if state is None:
        subs.append({"job_id": slurm_id, "submitted": time.strftime("%Y-%m-%d %H:%M:%S"), "state": "PENDING"})
    else:
        for sub in subs:
            if sub["job_id"] == slurm_id:
                sub["state"] = state
    store(job.run_dir / SLURM_STATE, {"submissions": subs})


@contextlib.contextmanager
def _deciding(job: TableJob) -> Iterator[None]:
    """One invocation at a time looks at a job's submissions and submits it (two collecting at once, or one
    collecting while another waits, submit it once)."""
    folder = job.run_dir / SLURM_LOGS
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def states(ids: List[str]) -> Dict[str, str]:
    """The SLURM state of each job id, from one ``sacct`` call (submitit's watcher): ``PENDING``, ``RUNNING``,
    ``COMPLETED``, ``TIMEOUT``, ``CANCELLED``, ...; ``UNKNOWN`` where sacct has no record (yet)."""
    from submitit import SlurmJob

    watcher = SlurmJob.watcher
    for slurm_id in ids:
        watcher.register_job(slurm_id)
    watcher.update()
    return {i: (watcher.get_state(i, mode="cache").split() or ["UNKNOWN"])[0] for i in ids}


def submit(job: TableJob, o: SlurmOptions) -> str:
    """Submit ``job`` (its plan's GPUs on each of ``o.nodes`` nodes, ``job.threads`` CPUs per GPU); its SLURM id."""
    import submitit
    from submitit.core.utils import FailedJobError

    gpus = job.plan.gpus
    parameters = dict(job_name=f"{job.table}.{job.row}.seed{job.seed}", nodes=o.nodes, ntasks_per_node=1,
                      cpus_per_task=job.threads * max(1, gpus), gpus_per_node=gpus or None, time=o.time_limit,
                      partition=o.partition, account=o.account, qos=o.qos, constraint=o.constraint,
                      stderr_to_stdout=True, additional_parameters=dict(o.sbatch_args) or None,
                      # no warning signal before the time limit (submitit's USR2, which fairseq-train would die of,
                      # and which would end the job FAILED): training goes on to the limit, the job ends TIMEOUT, and
                      # it is submitted again, to resume from checkpoint_last.pt
                      signal_delay_s=0)
    executor = submitit.SlurmExecutor(folder=job.run_dir / SLURM_LOGS, max_num_timeout=0)
    # every parameter given, None ones too: submitit leaves those out of the script (time None: not its 5 minutes,
    # the partition's time limit)
    executor.update_parameters(**parameters)
    try:
        slurm_id = executor.submit(main, job).job_id
    except FailedJobError as e:
        raise SystemExit(f"error: sbatch refused row {job.row} seed {job.seed}: {str(e).strip()}. Check PARTITION, "
                         f"ACCOUNT, QOS, CONSTRAINT, TIME_LIMIT and SBATCH_ARGS") from None
    _record(job, slurm_id)
    return slurm_id


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log, indented; what is missing, said."""
    if not path.exists():
        return f"    (no log at {path})"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "\n".join("    | " + line for line in text)


def _start(j: _Job, o: SlurmOptions, say) -> None:
    """The first look at a job in this invocation: its record, else its last submission's state, else submit it."""
    record = finished_record(j.job)
    if record is not None:
        j.record = replace(record, reused=True)
        say(j, f"finished earlier: BLEU {record.eval.bleu:.2f} (its record {j.job.run_dir / RECORD})")
        return
    with _deciding(j.job):
        j.ids = [s["job_id"] for s in submissions(j.job)]
        state = states(j.ids[-1:])[j.ids[-1]] if j.ids else None
        if state == "UNKNOWN" and time.time() - _submitted(j.job) > FORGOTTEN:
            state = "LOST"  # sacct does not know it (sacct failing, another cluster's job): a failure
        if state not in (None, "UNKNOWN"):
            _record(j.job, j.ids[-1], state)
        if state in ACTIVE:
            j.state = state
            shown = "(not in sacct yet)" if state == "UNKNOWN" else state
            say(j, f"SLURM job {j.ids[-1]} {shown}, submitted earlier: followed, not submitted again (log: {j.log})")
            return
        if state is None:
            why = "submitted"
        elif state == "COMPLETED":  # without the record of this job: the table changed since
            why = f"SLURM job {j.ids[-1]} COMPLETED for another version of this job, submitted again"
        elif state in RESUMED:
            why = f"SLURM job {j.ids[-1]} {state}, submitted again to resume from checkpoint_last.pt"
        elif o.resubmit_failed:
            why = f"SLURM job {j.ids[-1]} {state}, submitted again (RESUBMIT=failed)"
        else:
            j.state = state
            shown = f"unknown to sacct {FORGOTTEN // 60} minutes after its submission" if state == "LOST" else state
            say(j, f"SLURM job {j.ids[-1]} {shown}; the end of its log ({j.log}):\n{tail(j.log)}")
            return
        j.ids.append(submit(j.job, o))
    j.state = "PENDING"
    say(j, f"{why}: SLURM job {j.ids[-1]}, PENDING (log: {j.log})")


def _resume(j: _Job, o: SlurmOptions, state: str, say) -> None:
    """Submit a job that the cluster ended (TIMEOUT, PREEMPTED) again, unless another invocation did."""
    with _deciding(j.job):
        ids = [s["job_id"] for s in submissions(j.job)]
        if ids[-1] != j.ids[-1]:  # another invocation submitted it meanwhile: follow that submission
            j.ids, j.state = ids, "UNKNOWN"
            say(j, f"SLURM job {j.ids[-2]} {state}, submitted again by another invocation: SLURM job {j.ids[-1]}")
            return
        j.ids.append(submit(j.job, o))
    j.resumes, j.state = j.resumes + 1, "PENDING"
    say(j, f"SLURM job {j.ids[-2]} {state}, submitted again to resume from checkpoint_last.pt: SLURM job "
           f"{j.ids[-1]}, PENDING (log: {j.log})")


def _changed(j: _Job, state: str, o: SlurmOptions, interval: float, say) -> None:
    """A new state of the job's current SLURM id: printed, recorded, and acted on."""
    _record(j.job, j.ids[-1], state)
    j.state = state
    if state != "RUNNING" and j.watcher is not None:
        j.watcher.stop()
        j.watcher = None
    if state == "RUNNING":
        say(j, f"SLURM job {j.ids[-1]} RUNNING (log: {j.log})")
        j.watcher = LogWatcher(j.job.run_dir / "train.log", interval, lambda line: say(j, line))
        j.watcher.start()
    elif state in ACTIVE:
        say(j, f"SLURM job {j.ids[-1]} {state}")
    elif state == "COMPLETED":
        j.record = finished_record(j.job)
        if j.record is not None:
            say(j, f"SLURM job {j.ids[-1]} COMPLETED: BLEU {j.record.eval.bleu:.2f}")
        else:
            say(j, f"SLURM job {j.ids[-1]} COMPLETED without this job's record; the end of its log ({j.log}):\n"
                   f"{tail(j.log)}")
    elif state == "TIMEOUT" and not (j.job.run_dir / "checkpoint_last.pt").exists():
        say(j, f"SLURM job {j.ids[-1]} TIMEOUT before its first checkpoint: not submitted again (it would start "
               f"afresh and stop at the same point; give it a longer TIME_LIMIT, then {j.job.rerun}); the end of its "
               f"log ({j.log}):\n{tail(j.log)}")
    elif state in RESUMED and j.resumes < MAX_RESUMES:
        _resume(j, o, state, say)
    else:
        say(j, f"SLURM job {j.ids[-1]} {state}; the end of its log ({j.log}):\n{tail(j.log)}")


def run_on_slurm(jobs: List[TableJob], o: SlurmOptions, interval: float) -> Dict[Tuple[str, int], JobRecord]:
    """``{(row id, seed): record}`` of every job, each a SLURM job (the module's docstring); ``interval``: seconds
    between two looks at the jobs' states and progress (the first ones sooner). SystemExit when some are not done: 0
    when they are still queued or running (``WAIT`` reached), with the command that collects them; 1 when some
    failed; 130 at Ctrl-C, which leaves the jobs running and says how to collect or cancel them."""
    check_cluster()
    say, rerun = _printer(), jobs[0].rerun
    followed = [_Job(job, []) for job in jobs]
    for j in followed:
        _start(j, o, say)
    deadline = None if o.wait is None else time.time() + o.wait
    pause = 1.0
    try:
        while True:
            active = [j for j in followed if _active(j)]
            left = float("inf") if deadline is None else deadline - time.time()
            if not active or left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(2 * pause, max(interval, 1.0))
            now = states([j.ids[-1] for j in active])
            for j in active:
                if now[j.ids[-1]] not in (j.state, "UNKNOWN"):
                    _changed(j, now[j.ids[-1]], o, interval, say)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C would cut the lines short
        _stop_watching(followed)
        ids = " ".join(j.ids[-1] for j in followed if _active(j))
        print(f"[{jobs[0].table}] Ctrl-C: the jobs keep running on the cluster; to collect them, {rerun}"
              + (f"; to cancel them: scancel {ids}" if ids else ""), flush=True)
        raise SystemExit(130) from None
    _stop_watching(followed)
    return _outcome(followed, rerun)


def _active(j: _Job) -> bool:
    return j.record is None and j.state in ACTIVE


def _outcome(followed: List[_Job], rerun: str) -> Dict[Tuple[str, int], JobRecord]:
    """The records when every job has one; else SystemExit (1 naming the failed jobs, 0 naming the running ones)."""
    done = {(j.job.row, j.job.seed): j.record for j in followed if j.record is not None}
    if len(done) == len(followed):
        return done
    running = [j for j in followed if _active(j)]
    failed = [j for j in followed if j.record is None and j not in running]
    if failed:
        lines = "\n".join(f"  row {j.job.row} seed {j.job.seed}: SLURM job {j.ids[-1]} {j.state}, log {j.log}"
                          for j in failed)
        raise SystemExit(f"error: {len(failed)} job(s) failed on the cluster:\n{lines}\nTo submit TIMEOUT and "
                         f"PREEMPTED jobs again, {rerun}; other failed jobs are submitted again with RESUBMIT=failed")
    ids = " ".join(j.ids[-1] for j in running)
    print(f"[{followed[0].job.table}] {len(running)} job(s) queued or running on the cluster (SLURM jobs {ids}), "
          f"{len(done)} finished; the table is written once every job has finished. To collect them, {rerun}; to "
          f"cancel them: scancel {ids}", flush=True)
    raise SystemExit(0)


def _stop_watching(followed: List[_Job]):
    for j in followed:
        if j.watcher is not None:
            j.watcher.stop()
            j.watcher = None


def _printer():
    """``say(job, text)``: one line for a job, from this thread or a log watcher's."""
    import threading

    lock = threading.Lock()

    def say(j: _Job, text: str):
        with lock:
            print(f"{j.where}: {text}", flush=True)

    return say


