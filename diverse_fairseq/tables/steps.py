"""The steps of one job (:func:`~diverse_fairseq.tables.job.run_job`), each cached beside its run (``cache.py``), in
the order the job runs them: :func:`train` (the plan, into ``<out>/runs/<row>/seed<N>/``), :func:`evaluation` (the
plan's checkpoint, each subset), :func:`disagreement_scores` and, for tables that ask for it, :func:`probing_scores`.
"""

import json
import shlex
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple

from .. import training
from ..evaluate import EvalRecord, EvalRequest, evaluate
from ..runs.checkpoint_file import damage, latest_intact
from ..runs.lock import LOCK_FILE
from .cache import cache_key, cache_version, cached, checkpoint_identity, key_difference, load, store
from .progress import last_summary, model_parameters
from .records import TrainRecord, from_json

if TYPE_CHECKING:  # job.py imports this module
    from .job import TableJob

#: the SLURM launcher's files in a run directory (tables/slurm.py): the job's submissions and their logs
SLURM_STATE, SLURM_LOGS = "slurm.json", "slurm"
#: what a run directory holds besides the run, never moved aside with a stale run: the lock of the job that trains it
#: (runs/lock.py) and the SLURM launcher's files (a SLURM job writes its log there while it runs)
BESIDE_THE_RUN = (LOCK_FILE, SLURM_STATE, SLURM_LOGS)


def train(job: "TableJob", env: Mapping[str, str]) -> Tuple[TrainRecord, bool]:
    """Train the job's plan (or reuse its finished run); return its training record and whether it was reused.
    ``env``: the training processes' environment.

    A finished run (``train.json``) or an interrupted one (``key.json``) is reused or resumed only under the plan's
    cache key; otherwise its files are moved aside to ``seed<N>.stale-<time>/`` (nothing is deleted). A finished
    run is reused while the checkpoint it evaluates reads, whatever became of the others; damaged or lost
    checkpoints are dealt with by :func:`recover` before training."""
    run_dir, tag, p = job.run_dir, job.tag, job.plan
    key = cache_key(p)
    finished = load(run_dir / "train.json")
    if finished is not None and finished.get("key") == key:
        record = from_json(TrainRecord, finished)
        checkpoint = p.checkpoint(record.averaged_checkpoints)  # beside train.json, also in a moved results folder
        what = damage(checkpoint)
        if what is None:
            print(f"  [{tag}] training finished earlier ({record.trained_at}); reusing {run_dir}", flush=True)
            return replace(record, checkpoint=str(checkpoint)), True
        print(f"  [{tag}] training finished earlier ({record.trained_at}), but the checkpoint it evaluates, "
              f"{checkpoint.name}, {'is missing' if what == 'missing' else 'cannot be read'}", flush=True)
        recover(job, checkpoint)
    else:
        if resumable(run_dir, key):
            print(f"  [{tag}] resuming the interrupted run in {run_dir}", flush=True)
        elif finished is not None or run_dir.is_dir() and any(f.name not in BESIDE_THE_RUN for f in run_dir.iterdir()):
            stored = finished.get("key") if finished is not None else load(run_dir / "key.json")
            stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
            stale.mkdir()
            for path in run_dir.iterdir():  # all but the lock this job holds and the launcher's files
                if path.name not in BESIDE_THE_RUN:
                    path.rename(stale / path.name)
            print(f"  [{tag}] the run in {run_dir} was made by a different command ({key_difference(stored, key)}): "
                  f"moved it to {stale.name}/ and training afresh", flush=True)
        recover(job)
    store(run_dir / "key.json", key)
    print(f"  [{tag}] training {p.arch} ({p.setting_name}): {shlex.join(job.row_args + job.train_args)}", flush=True)
    result = training.run(p, env)
    log = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
    fit, valid = last_summary(log, "train"), last_summary(log, "valid")
    record = TrainRecord(
        row=job.row, seed=job.seed, arch=p.arch, setting=p.setting_name, train_args=list(p.args), key=key,
        trained_at=time.strftime("%Y-%m-%d %H:%M:%S"), threads=job.threads, checkpoint=str(result.checkpoint),
        args=list(job.row_args), averaged_checkpoints=result.averaged, best_checkpoint_metric=p.best_checkpoint_metric,
        embeddings=p.embedding_sharing, parameters=model_parameters(log), updates=int(fit.get("num_updates", 0)),
        train_steps_per_second=fit.get("ups"), train_loss=fit.get("loss"), valid_loss=valid.get("loss"),
        valid_nll_loss=valid.get("nll_loss"))
    store(run_dir / "train.json", asdict(record))
    return record, False


def resumable(run_dir: Path, key: Dict) -> bool:
    """Whether ``run_dir`` holds an interrupted run made under cache key ``key``, which :func:`train` resumes: no
    ``train.json`` (a finished run's), and the ``key.json`` its training wrote when it started is ``key``."""
    return load(run_dir / "train.json") is None and load(run_dir / "key.json") == key


def recover(job: "TableJob", evaluated: Optional[Path] = None):
    """Before training: a damaged ``checkpoint_last.pt``, or ``evaluated`` (the lost or damaged checkpoint that a
    finished run evaluates) is moved aside (``.damaged``); a run left without ``checkpoint_last.pt`` so resumes from
    its intact checkpoint with the most updates (copied to ``checkpoint_last.pt``), else trains afresh; a line says
    which. A lost ``checkpoint_best.pt`` is not made again by resuming: SystemExit with the commands."""
    run_dir, tag, last = job.run_dir, job.tag, job.run_dir / "checkpoint_last.pt"
    if evaluated is not None and evaluated.name == "checkpoint_best.pt":
        raise SystemExit(
            f"error: {evaluated}, the checkpoint that row {job.row} seed {job.seed} evaluates, cannot be read, and "
            f"training again from another checkpoint would not make it again (fairseq keeps the best by validation). "
            f"Copy it back if you have it, then {job.rerun}; or train the run afresh: mv {run_dir} {run_dir}.lost, "
            f"then {job.rerun}")
    damaged = []
    for path in dict.fromkeys(p for p in (last, evaluated) if p is not None and p.is_file()):
        what = damage(path)
        if what is not None:
            path.rename(path.with_name(path.name + ".damaged"))
            print(f"  [{tag}] {path.name} is {what}: moved it to {path.name}.damaged", flush=True)
            damaged.append(path)
    if last.exists() or not (damaged or evaluated is not None):
        return
    intact = latest_intact(run_dir)
    if intact is None:
        print(f"  [{tag}] no intact checkpoint to resume from: training afresh in {run_dir}", flush=True)
        return
    updates, source = intact
    shutil.copyfile(source, last)
    print(f"  [{tag}] resuming from {source.name} (update {updates}, intact), copied to {last.name}; to train "
          f"afresh instead, move {run_dir} aside and {job.rerun}", flush=True)


def evaluation_settings(request: EvalRequest) -> Dict:
    """Every field of ``request`` but the checkpoint and where it reads and writes: how it decodes and scores."""
    return {k: v for k, v in asdict(request).items() if k not in ("checkpoint", "data_dir", "out")}


def evaluation_key(request: EvalRequest) -> Dict:
    """An evaluation's cache key (``eval/key.json``): :func:`evaluation_settings`, the checkpoint by name and
    contents (:func:`checkpoint_identity`), and the cache version."""
    key = dict(evaluation_settings(request), checkpoint=request.checkpoint.name,
               checkpoint_identity=checkpoint_identity(request.checkpoint), version=cache_version())
    return json.loads(json.dumps(key))


def evaluation(job: "TableJob", request: EvalRequest) -> EvalRecord:
    """Decode and score ``request.subset`` in this process (cached in results.json while key.json matches
    :func:`evaluation_key`)."""
    out, key = request.out, evaluation_key(request)
    if load(out / "key.json") == key and (out / "results.json").exists():
        return from_json(EvalRecord, dict(load(out / "results.json"), out=str(out)))
    print(f"  [{job.tag}] evaluating {request.checkpoint} on {request.subset}", flush=True)
    if out.exists():
        shutil.rmtree(out)  # made with other decoding flags
    record = evaluate(request)
    store(out / "key.json", key)
    return record


def disagreement_scores(job: "TableJob", checkpoint: Path) -> Optional[Dict]:
    """EMNLP 2018 Tables 4–5 disagreement scores of one run on the whole validation set, per attention type
    (:mod:`diverse_fairseq.analysis.scores`): ``{type: {"sub", "pos", "out", "offdiag_cos", "layers": [...]}}``.

    Only the scores (no NLL, pictures or ablation), cached in ``analysis/disagreement.json`` with their key
    among them. A model with a single head per attention module has no head pairs: None (the cache says why)."""
    from ..analysis.scores import SCALE, TooFewHeads

    key = {"scale": SCALE, "max_sentences": None, "checkpoint_identity": checkpoint_identity(checkpoint)}

    def compute():
        from ..analysis.pipeline import Options, score_checkpoint

        print(f"  [{job.tag}] head-diversity scores", flush=True)
        opts = Options(data=str(job.data), max_sentences=None, max_tokens=4096, ablation=False, progress=False,
                       device=job.device)
        try:
            payload = score_checkpoint(str(checkpoint), opts, label=job.row)
        except TooFewHeads as e:
            return dict(key, by_type=None, skipped=str(e))
        print(f"  [{job.tag}] head-diversity scores of {payload['sentences']} sentences in "
              f"{payload['seconds']:.1f}s", flush=True)
        return dict(payload, checkpoint_identity=key["checkpoint_identity"])

    payload = cached(job.run_dir / "analysis" / "disagreement.json", key, compute,
                     stored_key=lambda payload: {name: payload.get(name) for name in key})
    if payload["by_type"] is None:
        print(f"  [{job.tag}] no head-diversity scores: {payload['skipped']}", flush=True)
        return None
    return {t: {**scores, "layers": payload["by_layer"][t]} for t, scores in payload["by_type"].items()}


def probing_scores(job: "TableJob", checkpoint: Path) -> Dict:
    """NAACL 2019 Table 1 / journal Table 7: the run's frozen encoder on the table's SentEval probing tasks
    (``{task: {"accuracy", "valid_accuracy", "majority", ...}}``, seeded by the run's seed), cached in
    ``analysis/probing.json``."""
    from ..analysis.probing import ProbeSettings, probe_checkpoint
    from ..analysis.probing import cache_key as probing_key
    from ..data.senteval import parse_tasks

    tasks, settings = parse_tasks(list(job.probing_tasks)), ProbeSettings(seed=job.seed)
    key = dict(probing_key(str(checkpoint), tasks, job.probing_dir, settings),
               checkpoint_identity=checkpoint_identity(checkpoint))

    def compute():
        print(f"  [{job.tag}] probing tasks {', '.join(t.name for t in tasks)}", flush=True)
        return dict(probe_checkpoint(str(checkpoint), tasks, job.probing_dir, settings, device=job.device,
                                     data=str(job.data)), key=key)

    return cached(job.run_dir / "analysis" / "probing.json", key, compute)["tasks"]
