"""A resumable pipeline: named steps that are skipped when their outputs already exist and are complete.

Each step declares its outputs and its parameters. When a step finishes, a stamp
``WORK/.stamps/<step>.json`` records a key made of the step's parameters and of the keys of all
steps before it. On the next run a step is skipped when its stamp key matches and all its outputs
exist; otherwise it runs again (and so does everything after it, because their keys change).
Outputs are written through :func:`atomic_path`, so an interrupted step leaves only temporary files
that the next run overwrites, never a half file under the final name.
"""

import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional

from . import progress


class StopPipeline(Exception):
    """Raised after the step named by ``--stop-after`` (a deliberate, resumable stop)."""


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; rename it to ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class Pipeline:
    """Runs steps in order, printing ``[name] step i/n: title`` and whether each ran or was skipped."""

    def __init__(self, name: str, work_dir: Path, total_steps: int, stop_after: Optional[str] = None, log=print):
        self.name = name
        self.work_dir = Path(work_dir)
        self.stamp_dir = self.work_dir / ".stamps"
        self.total = total_steps
        self.index = 0
        self.chain = hashlib.sha256(name.encode()).hexdigest()
        self.stop_after = stop_after
        self.log = log
        self.ran = []
        self.skipped = []

    def _stamp(self, step_id: str) -> Path:
        return self.stamp_dir / f"{step_id}.json"

    def step(self, step_id: str, title: str, outputs: Iterable[Path], params: Dict, fn: Callable[[], None]):
        """Run ``fn`` unless step ``step_id`` already completed with the same parameters and inputs."""
        self.index += 1
        outputs = [Path(o) for o in outputs]
        blob = json.dumps({"step": step_id, "params": params, "before": self.chain}, sort_keys=True, default=str)
        key = hashlib.sha256(blob.encode()).hexdigest()
        self.chain = key
        header = f"[{self.name}] step {self.index}/{self.total}: {title}"
        stamp = self._stamp(step_id)
        if stamp.exists() and all(o.exists() for o in outputs):
            try:
                recorded = json.loads(stamp.read_text()).get("key")
            except (OSError, ValueError):
                recorded = None
            if recorded == key:
                self.log(f"{header} -- done already, skipped")
                self.skipped.append(step_id)
                self._maybe_stop(step_id)
                return
        if stamp.exists():
            stamp.unlink()
        self.log(header)
        started = time.time()
        progress.begin_step(f"[{self.name}] step {self.index}/{self.total}")
        try:
            fn()
        finally:
            progress.end_step()
        missing = [str(o) for o in outputs if not o.exists()]
        if missing:
            raise RuntimeError(f"step {step_id} finished without producing {', '.join(missing)} (a bug)")
        self.stamp_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(stamp) as tmp:
            tmp.write_text(json.dumps({"key": key, "params": params, "outputs": [str(o) for o in outputs],
                                       "seconds": round(time.time() - started, 1)}, indent=1, default=str))
        self.log(f"[{self.name}]   finished {step_id} in {time.time() - started:.1f}s")
        self.ran.append(step_id)
        self._maybe_stop(step_id)

    def _maybe_stop(self, step_id):
        if self.stop_after and step_id == self.stop_after:
            raise StopPipeline(f"stopped after step {step_id} as asked (--stop-after); run again to continue")
