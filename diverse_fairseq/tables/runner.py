"""Train, evaluate and measure every row of a table, resuming whatever is already finished.

For each row and seed (one *job*) the runner

1. trains with :func:`diverse_fairseq.training.run` (``fairseq-train --user-dir diverse_fairseq`` with the
   dataset's setting) into ``<out>/runs/<row>/seed<N>/``; fairseq resumes from ``checkpoint_last.pt`` there,
   and a finished run leaves ``train.json`` and is reused next time;
2. evaluates the run's checkpoint (the average of the last checkpoints where training made one, else the
   setting's single model: ``checkpoint_best.pt`` by validation BLEU for the THUMT papers' settings, else
   ``checkpoint_last.pt``) with
   :mod:`diverse_fairseq.evaluate` (sacrebleu and tokenized BLEU, decoding speed; reused while
   ``eval/key.json`` matches);
3. records parameters and training steps/s from fairseq's log (``--log-format json``, read by
   :mod:`diverse_fairseq.tables.logs`; the runner passes ``--log-file`` and ``--log-format json`` itself).

Cache key. A run is reused only if it was made by the same effective command: ``cache_key`` is the full
fairseq-train command line (the setting's hyper-parameters, the row's and ``TRAIN_ARGS``' flags, seed,
precision, batch), the checkpoint averaging, the dataset's ``prepare.json`` and the package version, with the
run's own paths left out (so a results directory can move). It is written to ``key.json`` when training
starts and to ``train.json`` when it ends. When a row's YAML, the setting or the data change, the old run
directory is **moved aside** to ``seed<N>.stale-<time>/`` (nothing is deleted) and the row is trained
afresh; a run interrupted under the same key resumes from its last checkpoint. The report lists the runs
reused from earlier invocations. The thread count is recorded in ``train.json`` but is not part of the key:
it changes the last bits of the numbers, not the experiment; nor are the logging flags (``RUNNER_FLAGS``),
which change what is written, not what is trained: keys are compared without them (:func:`same_key`).

Reproducibility and parallelism. Every job runs with a fixed number of CPU threads (``threads``: the
``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` of fairseq-train and fairseq-generate, ``torch.set_num_threads``
for the in-process analysis), so a seed gives the same numbers on any machine size. ``jobs`` row/seed jobs
run at once, each in its own process with its output in ``<out>/logs/<row>-seed<N>.log``; the runner prints
one line when a job starts and one when it ends, with the progress (row i of n, seed, elapsed time,
estimated time remaining). With ``jobs = 1`` the jobs run one after the other in this process and their
output goes to the console.
"""

import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import save_dir as save_dirs, training
from . import logs, scale
from .spec import REPO, Row, Table


@dataclass
class RunConfig:
    dataset: str
    scale: str
    seeds: List[int]
    gpus: int
    out_dir: Path
    data_bin: Path = REPO / "data-bin"
    train_args: List[str] = field(default_factory=list)  # appended to every row's fairseq-train flags
    generate_args: List[str] = field(default_factory=list)  # appended to every row's fairseq-generate flags
    threads: int = 1  # CPU threads of every job (fairseq-train, fairseq-generate, in-process torch)
    jobs: int = 1  # row/seed jobs run at once (each in its own process when > 1)
    probing_tasks: List[str] = field(default_factory=list)  # SentEval probing tasks of every run (table's probing)
    probing_dir: Optional[Path] = None  # where their files are
    dry_run: bool = False  # print every job's commands, run and write nothing (DRY_RUN=1)
    # launch options of every training (MAX_UPDATE, PRECISION, NNODES, ...: the CLI reads them from the environment)
    train_options: training.TrainOptions = field(default_factory=training.TrainOptions)
    # a script started in place of ``-m fairseq_cli.train`` with the same arguments, watching every training
    # (e.g. scripts/experiments/kernel_probe.py); not in the cache key: it must not change what is trained
    train_hook: Optional[str] = None
    # subsets decoded after training; the first is the one the report's BLEU and significance use
    subsets: List[str] = field(default_factory=lambda: ["test"])

    def run_dir(self, row: Row, seed: int) -> Path:
        return self.out_dir / "runs" / row.id / f"seed{seed}"

    def setting(self, row: Row) -> str:
        """The training setting of ``row``: ``tiny`` at demo scale, else the row's or the dataset's
        (:func:`training.default_setting`: the papers' for their datasets, by size for your own corpus)."""
        if self.scale == "demo":
            return "tiny"
        return row.setting or training.default_setting(self.dataset, self.data_bin)

    def thread_env(self) -> Dict[str, str]:
        """The environment that pins a job's subprocesses to ``threads`` CPU threads."""
        return {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}

    def log_path(self, row: Row, seed: int) -> Path:
        return self.out_dir / "logs" / f"{row.id}-seed{seed}.log"


def _version() -> str:
    from .. import __version__

    return __version__


def cache_key(run: RunConfig, request: training.TrainRequest) -> Dict:
    """What a finished run must match to be reused: the effective fairseq-train command (as
    :func:`training.build_command` makes it for ``request``) with the run's own paths
    replaced by ``<run>`` / ``<data-bin>`` / ``<user-dir>``, checkpoint averaging, setting, dataset (its ``prepare.json``
    without the creation time), seed and package version. JSON-normalised, so it compares equal to a stored one."""
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
           "dataset": run.dataset, "data": meta, "seed": request.seed, "version": _version()}
    return json.loads(json.dumps(key))


#: fairseq-train flags (each with one value) that the runner sets itself for every run (TRAIN_ARGS must not contain
#: them); they change the log, not the model, so they are left out when keys are compared
RUNNER_FLAGS = save_dirs.LOG_OPTIONS  # one list with the save directory's resumable options
LOG_FORMAT_ARGS = ["--log-format", "json"]  # every run logs JSON records (read by logs.py); check.py builds the same


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
            from difflib import SequenceMatcher

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


def _move_aside(run_dir: Path, why: str, tag: str):
    stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(stale)
    print(f"  [{tag}] the run in {run_dir} was made by a different command ({why}): moved it to {stale.name}/ "
          f"and training afresh", flush=True)


def _valid_nll(log: str) -> Optional[float]:
    """The last validation's NLL per target token (fairseq's ``nll_loss``: base 2, without label smoothing)."""
    return logs.last_summary(log, "valid").get("nll_loss")


def checkpoint_identity(checkpoint) -> Dict:
    """What the evaluation and analysis caches check besides a checkpoint's name: its size and the SHA-256 of its
    contents, so that a model changed after the cache was written (a resumed or retrained run) is evaluated
    again, while a results directory that was moved or copied is still reused. Memoised by path, size and
    modification time, so each checkpoint is read once per process."""
    import hashlib

    path = Path(checkpoint)
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _IDENTITIES:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _IDENTITIES[memo] = {"name": path.name, "bytes": stat.st_size, "sha256": digest.hexdigest()}
    return dict(_IDENTITIES[memo])


_IDENTITIES: Dict[tuple, Dict] = {}


def job_request(row: Row, run: RunConfig, seed: int) -> Tuple[str, List[str], training.TrainRequest]:
    """(architecture, the row's mapped flags, the training request) of one row/seed, as :func:`train_row` runs
    it and a dry run prints it."""
    run_dir = run.run_dir(row, seed)
    setting = run.setting(row)
    arch = row.arch(training.SETTINGS[setting].arch)
    row_args = scale.row_args(row.args, setting)  # layer flags mapped to the setting's depth (scale.py)
    extra = ["--arch", arch, *row_args, "--log-file", str(run_dir / "train.log"), *run.train_args, *LOG_FORMAT_ARGS]
    request = training.TrainRequest(
        dataset=run.dataset, setting=setting, extra=tuple(extra), seed=seed, save_dir=run_dir,
        data_bin=run.data_bin, gpus=run.gpus,
        options=replace(run.train_options, dry_run=False),  # the runner's own dry run never calls training.run
        entry=run.train_hook)
    return arch, row_args, request


def job_env(run: RunConfig) -> Dict[str, str]:
    """The environment of a job's training processes: this one's, pinned to ``run.threads`` CPU threads."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **run.thread_env())


def train_row(row: Row, run: RunConfig, seed: int) -> Dict:
    """Train one row/seed (or reuse its finished run) and return its training record.

    A finished run (``train.json``) or an interrupted one (``key.json``) is reused or resumed only when its
    cache key equals this run's; otherwise its directory is moved aside and the row is trained afresh.
    The record says ``reused: true`` when training finished in an earlier invocation."""
    run_dir = run.run_dir(row, seed)
    record_path, key_path = run_dir / "train.json", run_dir / "key.json"
    tag = f"{row.id} seed {seed}"
    arch, row_args, request = job_request(row, run, seed)
    setting = request.setting
    log_file = run_dir / "train.log"
    key = cache_key(run, request)
    if record_path.exists():
        record = json.loads(record_path.read_text())
        if same_key(record.get("key"), key):
            print(f"  [{tag}] training finished earlier ({record.get('trained_at', 'unknown time')}); "
                  f"reusing {run_dir}", flush=True)
            if "valid_nll_loss" not in record and log_file.exists():  # a record written before it was kept
                record["valid_nll_loss"] = _valid_nll(log_file.read_text(encoding="utf-8", errors="replace"))
            # the checkpoint beside train.json, also when the results directory has moved since
            return dict(record, checkpoint=str(run_dir / Path(record["checkpoint"]).name), reused=True)
        _move_aside(run_dir, key_difference(record.get("key"), key), tag)
    elif run_dir.exists() and any(run_dir.iterdir()):
        old = json.loads(key_path.read_text()) if key_path.exists() else None
        if not same_key(old, key):
            _move_aside(run_dir, key_difference(old, key), tag)
        else:
            print(f"  [{tag}] resuming the interrupted run in {run_dir}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    key_path.write_text(json.dumps(key, indent=1) + "\n")
    print(f"  [{row.id} seed {seed}] training {arch} ({setting}): {shlex.join(row_args + run.train_args)}",
          flush=True)
    info = training.run(request, env=job_env(run))
    if not info.get("averaged") and info.get("single_checkpoint"):  # a single model: the setting's (checkpoint_best.pt by validation BLEU for THUMT rows)
        info["checkpoint"] = str(Path(info["save_dir"]) / info["single_checkpoint"])
    log = log_file.read_text(encoding="utf-8", errors="replace")
    train = logs.last_summary(log, "train")
    record = {
        "row": row.id, "seed": seed, "arch": arch, "setting": setting,
        "train_args": info["args"],  # fairseq-train's arguments, whatever the launcher (python -m, torchrun)
        "key": key, "trained_at": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": run.threads,
        "checkpoint": info["checkpoint"], "args": row_args, "averaged_checkpoints": info["averaged"],
        "parameters": logs.model_parameters(log),
        "updates": int(train.get("num_updates", 0)),
        "train_steps_per_second": train.get("ups"),
        "train_loss": train.get("loss"),
        "valid_loss": logs.last_summary(log, "valid").get("loss"),
        "valid_nll_loss": _valid_nll(log),
    }
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return dict(record, reused=False)


def eval_dir(run: RunConfig, row: Row, seed: int, subset: str) -> Path:
    """Where a run's ``subset`` is decoded: ``eval/`` for the test set, ``eval-<subset>/`` for another."""
    return run.run_dir(row, seed) / ("eval" if subset == "test" else f"eval-{subset}")


def evaluate_row(row: Row, run: RunConfig, seed: int, checkpoint: str, subset: str = "test") -> Dict:
    """Decode and score ``subset`` with one row/seed's checkpoint (cached in results.json of :func:`eval_dir`
    while key.json there matches: the checkpoint's name and contents (:func:`checkpoint_identity`), the
    decoding flags)."""
    from ..evaluate import load_meta, main as evaluate_main

    data = run.data_bin / run.dataset
    out = eval_dir(run, row, seed, subset)
    args = [checkpoint, str(data), "--out", str(out), *(["--subset", subset] if subset != "test" else []),
            *run.generate_args]
    if run.gpus == 0:
        args.append("--cpu")
    key = {"checkpoint": Path(checkpoint).name, "checkpoint_identity": checkpoint_identity(checkpoint),
           "generate_args": run.generate_args, "cpu": run.gpus == 0, "version": _version()}
    if (out / "results.json").exists() and (out / "key.json").exists() and \
            json.loads((out / "key.json").read_text()) == key:
        results = json.loads((out / "results.json").read_text())
    else:
        print(f"  [{row.id} seed {seed}] evaluating {checkpoint} on {subset}", flush=True)
        if out.exists():
            shutil.rmtree(out)  # made with other decoding flags
        results = evaluate_main(args)
        (out / "key.json").write_text(json.dumps(key, indent=1) + "\n")
    return dict(results, out=str(out), target_lang=load_meta(data)["target_lang"])


def disagreement_scores(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Dict:
    """EMNLP 2018 Tables 4–5 disagreement scores of one run on the whole validation set, per attention type.

    On the paper's scale, exp(−mean over all H² head pairs, self-pairs included)
    (:mod:`diverse_fairseq.analysis.scores`): ``{type: {"sub", "pos", "out", "offdiag_cos": {"sub", "out"},
    "layers": [{"layer": 1, "heads", "sub", "pos", "out", "offdiag_cos", ...}, ...]}}``, the per-type numbers
    being Table 4's and the per-layer ones Table 5's. Only the scores are computed (teacher-forced passes in
    batches of 4096 tokens without the output projection; no NLL, pictures or head ablation: a few seconds
    for the demo model's 1,000 validation sentences on one CPU thread), cached in
    ``analysis/disagreement.json``; a cache on another scale, of part of the set or of another checkpoint
    (:func:`checkpoint_identity`) is recomputed. A model with a
    single head per attention module has no head pairs to score: None (the cache records why).
    """
    from ..analysis.scores import SCALE, TooFewHeads

    path = run.run_dir(row, seed) / "analysis" / "disagreement.json"
    payload = json.loads(path.read_text()) if path.exists() else {}
    identity = checkpoint_identity(checkpoint)
    if payload.get("scale") != SCALE or payload.get("max_sentences") is not None or \
            payload.get("checkpoint_identity") != identity:
        from ..analysis.pipeline import Options, score_checkpoint

        print(f"  [{row.id} seed {seed}] head-diversity scores", flush=True)
        device = "cuda" if run.gpus else "cpu"
        opts = Options(data=str(run.data_bin / run.dataset), max_sentences=None, max_tokens=4096,
                       ablation=False, progress=False, device=device)
        try:
            payload = score_checkpoint(checkpoint, opts, label=row.id)
            print(f"  [{row.id} seed {seed}] head-diversity scores of {payload['sentences']} sentences in "
                  f"{payload['seconds']:.1f}s", flush=True)
        except TooFewHeads as e:
            payload = {"scale": SCALE, "max_sentences": None, "by_type": None, "skipped": str(e)}
        payload["checkpoint_identity"] = identity
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1) + "\n")
    if payload["by_type"] is None:
        print(f"  [{row.id} seed {seed}] no head-diversity scores: {payload['skipped']}", flush=True)
        return None
    return {t: {**scores, "layers": payload["by_layer"][t]} for t, scores in payload["by_type"].items()}


def probing_scores(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Dict:
    """NAACL 2019 Table 1 / journal Table 7: the run's frozen encoder on the table's SentEval probing tasks.

    :func:`diverse_fairseq.analysis.probing.probe_checkpoint` with the classifier seeded by the run's seed;
    ``{task: {"accuracy", "valid_accuracy", "majority", ...}}`` (percentages), cached in
    ``analysis/probing.json`` while its key (checkpoint name and contents, task files' digests, classifier
    settings, package version) matches."""
    from ..analysis.probing import ProbeSettings, cache_key, probe_checkpoint
    from ..data.senteval import parse_tasks

    tasks, settings = parse_tasks(run.probing_tasks), ProbeSettings(seed=seed)
    path = run.run_dir(row, seed) / "analysis" / "probing.json"
    key = dict(cache_key(checkpoint, tasks, run.probing_dir, settings),
               checkpoint_identity=checkpoint_identity(checkpoint))
    payload = json.loads(path.read_text()) if path.exists() else {}
    if payload.get("key") != key:
        print(f"  [{row.id} seed {seed}] probing tasks {', '.join(t.name for t in tasks)}", flush=True)
        payload = probe_checkpoint(checkpoint, tasks, run.probing_dir, settings, data=str(run.data_bin / run.dataset),
                                   device="cuda" if run.gpus else "cpu")
        payload["key"] = key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1) + "\n")
    return payload["tasks"]


def run_job(row: Row, run: RunConfig, seed: int) -> Dict:
    """One row and seed: train (or reuse), evaluate, measure head disagreement (and probe, for tables that ask
    for it); the per-seed record."""
    record = train_row(row, run, seed)
    evals = {subset: evaluate_row(row, run, seed, record["checkpoint"], subset) for subset in run.subsets}
    record["eval"] = evals[run.subsets[0]]  # the report's BLEU
    record["evals"] = evals
    record["disagreement"] = disagreement_scores(row, run, seed, record["checkpoint"])
    if record["disagreement"]:  # None for a single-head model
        record["output_disagreement"] = record["disagreement"]["enc_self"]["out"]
    if run.probing_tasks:
        record["probing"] = probing_scores(row, run, seed, record["checkpoint"])
    return record


def limit_threads(threads: int):
    """Pin this process (in-process torch) and the subprocesses it starts to ``threads`` CPU threads."""
    import torch

    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)


def _worker_init(threads: int):
    from ..cli_logging import setup_cli_logging

    limit_threads(threads)
    setup_cli_logging()


def _worker_job(row: Row, run: RunConfig, seed: int) -> Dict:
    """``run_job`` in a worker process, its output (and its subprocesses') appended to the job's log."""
    log_path = run.log_path(row, seed)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "a", encoding="utf-8") as log:
        saved = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            print(f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} {row.id} seed {seed}", flush=True)
            return run_job(row, run, seed)
        except SystemExit as e:  # a failed fairseq-train/-generate: an ordinary error for the parent
            raise RuntimeError(str(e)) from None
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Start and end lines of the jobs: ``row i of n (seed s)``, elapsed time, estimated time remaining.

    The estimate is the mean duration of the jobs that trained in this invocation (reused runs take no
    time) applied to the queued jobs and the rest of the running ones, spread over the parallel jobs."""

    def __init__(self, table: Table, run: RunConfig, total: int):
        self.name, self.rows, self.run, self.total = table.table, table.rows, run, total
        self.start, self.started, self.durations, self.done = time.time(), {}, [], 0

    def _where(self, row: Row, seed: int) -> str:
        i = next(i for i, r in enumerate(self.rows, 1) if r.id == row.id)
        return f"[{self.name}] row {i} of {len(self.rows)} (seed {seed}) {row.label}"

    def remaining(self, now: float) -> str:
        if self.done == self.total:
            return "0:00:00"
        if not self.durations:
            return "unknown"
        mean = sum(self.durations) / len(self.durations)
        queued = self.total - self.done - len(self.started)
        work = queued * mean + sum(max(mean - (now - t), 0.0) for t in self.started.values())
        return _clock(work / max(1, min(self.run.jobs, self.total - self.done)))

    def _line(self, text: str):
        now = time.time()
        print(f"{text}; elapsed {_clock(now - self.start)}, estimated remaining {self.remaining(now)}", flush=True)

    def begin(self, row: Row, seed: int):
        self.started[(row.id, seed)] = time.time()
        self._line(f"{self._where(row, seed)}: started")

    def end(self, row: Row, seed: int, record: Optional[Dict] = None, error: Optional[str] = None):
        seconds = time.time() - self.started.pop((row.id, seed))
        self.done += 1
        if error is not None:
            what = f"FAILED after {_clock(seconds)}: {error}"
        elif record.get("reused"):
            what = f"reused the run trained {record.get('trained_at', 'earlier')}, BLEU {record['eval']['bleu']:.2f}"
        else:
            self.durations.append(seconds)
            what = f"finished in {_clock(seconds)}, BLEU {record['eval']['bleu']:.2f}"
        if self.run.jobs > 1:
            what += f" (log: {self.run.log_path(row, seed)})"
        self._line(f"{self._where(row, seed)}: {what} [{self.done}/{self.total} jobs done]")


def run_table(table: Table, run: RunConfig) -> Dict[str, List[Dict]]:
    """Train and evaluate every row and seed (``run.jobs`` at once); return ``{row id: [per-seed record]}``."""
    data = run.data_bin / run.dataset
    if not (data / "prepare.json").exists():
        raise SystemExit(f"error: no prepared dataset in {data}. Prepare it first: make data DATASET={run.dataset}")
    same_as = same_model_rows(table, run)
    todo = [(row, seed) for row in table.rows if row.id not in same_as for seed in run.seeds]
    for row_id, first in same_as.items():
        print(f"[{table.table}] row {row_id} trains the same model as row {first} at this scale "
              f"(same architecture, setting and mapped flags): it gets {first}'s runs", flush=True)
    if run.dry_run:
        dry_run_table(table, run, todo)
        return None
    progress = Progress(table, run, len(todo))
    print(f"[{table.table}] {len(table.rows)} rows x {len(run.seeds)} seed(s) = {len(todo)} jobs, {run.jobs} at a "
          f"time, {run.threads} CPU thread(s) each", flush=True)
    records, failed = {}, []
    if run.jobs == 1:
        limit_threads(run.threads)
        for row, seed in todo:
            progress.begin(row, seed)
            records[row.id, seed] = run_job(row, run, seed)
            progress.end(row, seed, records[row.id, seed])
    else:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        queue, running = list(todo), {}
        with ProcessPoolExecutor(run.jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_init, initargs=(run.threads,)) as pool:
            while queue or running:
                while queue and len(running) < run.jobs:
                    row, seed = queue.pop(0)
                    progress.begin(row, seed)
                    running[pool.submit(_worker_job, row, run, seed)] = (row, seed)
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    row, seed = running.pop(future)
                    try:
                        records[row.id, seed] = future.result()
                        progress.end(row, seed, records[row.id, seed])
                    except Exception as e:  # noqa: BLE001 - reported below with the job's log
                        failed.append((row, seed))
                        progress.end(row, seed, error=str(e) or type(e).__name__)
    if failed:
        logs_ = "\n".join(f"  {row.id} seed {seed}: {run.log_path(row, seed)}" for row, seed in failed)
        raise SystemExit(f"error: {len(failed)} job(s) failed; their logs:\n{logs_}")
    return {row.id: [dict(records[same_as.get(row.id, row.id), seed], row=row.id,
                          **({"same_as": same_as[row.id]} if row.id in same_as else {}))
                     for seed in run.seeds] for row in table.rows}


def dry_run_table(table: Table, run: RunConfig, todo: List[tuple]):
    """``DRY_RUN=1``: print each job's training and evaluation commands (and whether a finished run would be
    reused); nothing is trained, evaluated or written."""
    print(f"[{table.table}] DRY_RUN=1: the commands of {len(todo)} job(s); nothing is run or written", flush=True)
    for row, seed in todo:
        arch, row_args, request = job_request(row, run, seed)
        setting = request.setting
        args, launcher, info = training.build_command(request)
        train_cmd = launcher + args
        run_dir = run.run_dir(row, seed)
        record_path = run_dir / "train.json"
        if record_path.exists() and same_key(json.loads(record_path.read_text()).get("key"),
                                             cache_key(run, request)):
            state = "finished earlier: its training would be reused"
        elif (run_dir / "checkpoint_last.pt").exists():
            state = "interrupted: training would resume it, or start afresh if its options changed"
        else:
            state = "would be trained"
        checkpoint = run_dir / (f"checkpoint_avg_last{info['average']}.pt" if info["average"]
                                else info["single_checkpoint"])
        eval_cmds = [[sys.executable, "-m", "diverse_fairseq.evaluate", str(checkpoint),
                      str(run.data_bin / run.dataset), "--out", str(eval_dir(run, row, seed, subset)),
                      *(["--subset", subset] if subset != "test" else []), *run.generate_args,
                      *(["--cpu"] if run.gpus == 0 else [])] for subset in run.subsets]
        threads = "".join(f"{k}={v} " for k, v in run.thread_env().items())
        device = "CUDA_VISIBLE_DEVICES='' " if run.gpus == 0 else ""
        print(f"  {row.id} seed {seed} ({arch}, {setting}; {state}):\n"
              f"    train:    {threads}{device}{shlex.join(train_cmd)}"
              + "".join(f"\n    evaluate: {threads}{shlex.join(cmd)}" for cmd in eval_cmds), flush=True)
    print(f"[{table.table}] then head-diversity scores{' and probing' if run.probing_tasks else ''} of each "
          f"checkpoint, and the report in {run.out_dir.parent}", flush=True)


def same_model_rows(table: Table, run: RunConfig) -> Dict[str, str]:
    """``{row id: id of the first earlier row}`` for rows whose training command equals an earlier row's.

    At demo scale several paper layer lists map to one demo layer (``scale.py``), so e.g. NAACL 2019 Table 3's
    rows [1-3], [1,2] and [1] are one model; it is trained once and its runs stand for every such row."""
    first: Dict[tuple, str] = {}
    out = {}
    for row in table.rows:
        setting = run.setting(row)
        signature = (row.arch(training.SETTINGS[setting].arch), setting, tuple(scale.row_args(row.args, setting)))
        if signature in first:
            out[row.id] = first[signature]
        else:
            first[signature] = row.id
    return out
