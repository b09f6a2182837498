"""One run trained by one process: :func:`run_lock` holds ``SAVE_DIR/run.lock`` while a run trains.

Two trainings of one save directory (two invocations of a table, or a table and ``scripts/train.sh`` with its
``SAVE_DIR``) would write the same checkpoints. The lock is an ``fcntl.flock`` on the file, which the kernel releases
when its holder exits, however it ends (a killed process leaves nothing held); the file holds who holds it (pid,
host, start time, SLURM job id), so that the second process is refused before any work with the first one named.
It is taken once per run, where the run starts (``training.main``'s path and the table's job), never twice in one
process: flock locks belong to an open file description, so a second open of the same file would refuse its own
process.
"""

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator, Mapping

LOCK_FILE = "run.lock"


def holder_text(holder: dict) -> str:
    """``pid 123 on host h (SLURM job 45), since 2025-01-01 10:00:00``, or what of it the lock file holds."""
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    job = f" (SLURM job {holder['slurm_job_id']})" if holder.get("slurm_job_id") else ""
    return who + job + (f", since {holder['started']}" if holder.get("started") else "")


def _refusal(save_dir: Path, holder: dict, rerun: str) -> SystemExit:
    stop = (f"scancel {holder['slurm_job_id']}" if holder.get("slurm_job_id") else
            f"kill {holder.get('pid', '?')} on {holder.get('host', '?')}")
    return SystemExit(f"error: {save_dir} is being trained by another process: {holder_text(holder)}. One run is "
                      f"trained by one process (two would overwrite each other's checkpoints): wait for it to end, or "
                      f"stop it ({stop}; it keeps its last checkpoint), then {rerun}")


@contextlib.contextmanager
def run_lock(save_dir: Path, env: Mapping[str, str], rerun: str = "run the same command again") -> Iterator[None]:
    """Hold ``save_dir/run.lock`` (made with its folder) for the ``with`` block; SystemExit naming the holder and
    what to do (``rerun``: what to run after it) when another process holds it. ``env``: this process's environment
    (its ``SLURM_JOB_ID`` is written beside the pid and host)."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with os.fdopen(fd) as f:
                text = f.read()
            raise _refusal(save_dir, json.loads(text) if text.startswith("{") else {}, rerun) from None
        try:  # the holder before us may have removed the file (a failed run's empty folder): lock the new one
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "slurm_job_id": env.get("SLURM_JOB_ID") or None}
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(holder) + "\n").encode())
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # nobody holds it
        os.close(fd)
