"""The steps of one row and seed (one *job*), each cached beside its run (``cache.py``), in the order
:func:`run_job` runs them: :func:`train_row` (into ``<out>/runs/<row>/seed<N>/``), :func:`evaluate_row` (the plan's
checkpoint), :func:`disagreement_scores` and, for tables that ask for it, :func:`probing_scores`.
"""

import json
import os
import shlex
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Dict, Optional, Tuple

from .. import training
from ..evaluate import EvalRequest, evaluate
from ..runs.dataset_meta import load_dataset_meta
from ..runs.plan import Plan, TrainRequest, decoding, plan
from ..runs.settings import SETTINGS
from . import scale
from .cache import cache_key, cache_version, cached, checkpoint_identity, key_difference, load, store
from .config import RunConfig
from .progress import last_summary, model_parameters
from .records import EvalRecord, JobRecord, TrainRecord, from_json
from .spec import Row


def job_plan(row: Row, run: RunConfig, seed: int) -> Plan:
    """The one function that turns a table row and seed into its plan (training, cache key, dry run, check)."""
    run_dir, setting = run.run_dir(row, seed), run.setting(row)
    # the row's family and flags (layer flags mapped to the setting's depth, scale.py), TRAIN_ARGS, and the JSON log
    # (read by progress.py) of every run, which TRAIN_ARGS may not set
    extra = ["--arch", row.arch(SETTINGS[setting].arch), *scale.row_args(row.args, setting),
             "--log-file", str(run_dir / "train.log"), *run.train_args, "--log-format", "json"]
    return plan(TrainRequest(
        dataset=run.dataset, setting=setting, extra=tuple(extra), seed=seed, save_dir=run_dir,
        data_bin=run.data_bin, gpus=run.gpus,
        options=replace(run.train_options, dry_run=False),  # the runner's own dry run never calls training.run
        entry=run.train_hook))


def train_row(row: Row, run: RunConfig, seed: int) -> Tuple[TrainRecord, bool]:
    """Train one row/seed (or reuse its finished run); return its training record and whether it was reused.

    A finished run (``train.json``) or an interrupted one (``key.json``) is reused or resumed only under this
    run's cache key; otherwise its directory is moved aside to ``seed<N>.stale-<time>/`` (nothing is deleted)."""
    run_dir, tag = run.run_dir(row, seed), f"{row.id} seed {seed}"
    job = job_plan(row, run, seed)
    row_args, key = scale.row_args(row.args, job.setting_name), cache_key(job)
    finished = load(run_dir / "train.json")
    if finished is not None and finished.get("key") == key:
        record = from_json(TrainRecord, finished)
        print(f"  [{tag}] training finished earlier ({record.trained_at}); reusing {run_dir}", flush=True)
        # the plan's checkpoint, beside train.json also when the results directory has moved since
        return replace(record, checkpoint=str(job.checkpoint(record.averaged_checkpoints))), True
    stored = finished.get("key") if finished is not None else load(run_dir / "key.json")  # key.json: interrupted
    if stored == key:
        print(f"  [{tag}] resuming the interrupted run in {run_dir}", flush=True)
    elif finished is not None or (run_dir.exists() and any(run_dir.iterdir())):
        stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.rename(stale)
        print(f"  [{tag}] the run in {run_dir} was made by a different command ({key_difference(stored, key)}): "
              f"moved it to {stale.name}/ and training afresh", flush=True)
    store(run_dir / "key.json", key)
    print(f"  [{tag}] training {job.arch} ({job.setting_name}): {shlex.join(row_args + run.train_args)}", flush=True)
    # the training processes' environment: this one's, pinned to run.threads CPU threads
    result = training.run(job.request, env=dict(os.environ, PYTHONUNBUFFERED="1", **run.thread_env()))
    log = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
    train, valid = last_summary(log, "train"), last_summary(log, "valid")
    record = TrainRecord(
        row=row.id, seed=seed, arch=job.arch, setting=job.setting_name, train_args=list(result.plan.args), key=key,
        trained_at=time.strftime("%Y-%m-%d %H:%M:%S"), threads=run.threads, checkpoint=str(result.checkpoint),
        args=row_args, averaged_checkpoints=result.averaged, best_checkpoint_metric=job.best_checkpoint_metric,
        embeddings=result.plan.embedding_sharing,
        parameters=model_parameters(log), updates=int(train.get("num_updates", 0)),
        train_steps_per_second=train.get("ups"), train_loss=train.get("loss"), valid_loss=valid.get("loss"),
        valid_nll_loss=valid.get("nll_loss"))
    store(run_dir / "train.json", asdict(record))
    return record, False


def eval_request(run: RunConfig, row: Row, seed: int, checkpoint: str, subset: str) -> EvalRequest:
    """The evaluation of ``subset`` with ``checkpoint``, from the table alone (the setting's decoding,
    ``GENERATE_ARGS``, devices, precision), not from scripts/evaluate.sh's variables (``__main__`` warns of them)."""
    precision = run.train_options.precision or ("fp16" if run.gpus else "fp32")
    data = run.data_bin / run.dataset
    d = decoding(load_dataset_meta(data), SETTINGS[run.setting(row)])
    return EvalRequest(checkpoint=Path(checkpoint), data_dir=data, subset=subset, length_penalty=d.length_penalty,
                       beam_search=d.beam_search, max_len_a=d.max_len_a, max_len_b=d.max_len_b,
                       out=run.eval_dir(row, seed, subset), cpu=run.gpus == 0, precision=precision,
                       generate_args=tuple(run.generate_args))


def evaluation_key(request: EvalRequest) -> Dict:
    """An evaluation's cache key (``eval/key.json``): every field of the request but where it reads and writes,
    the checkpoint by name and contents (:func:`checkpoint_identity`), and the cache version."""
    key = {k: v for k, v in asdict(request).items() if k not in ("checkpoint", "data_dir", "out")}
    key.update(checkpoint=request.checkpoint.name, checkpoint_identity=checkpoint_identity(request.checkpoint),
               version=cache_version())
    return json.loads(json.dumps(key))


def evaluate_row(row: Row, run: RunConfig, seed: int, checkpoint: str, subset: str = "test") -> EvalRecord:
    """Decode and score ``subset`` (cached in results.json while key.json matches :func:`evaluation_key`)."""
    request = eval_request(run, row, seed, checkpoint, subset)
    out, key = request.out, evaluation_key(request)
    results = load(out / "results.json") if load(out / "key.json") == key else None
    if results is None:
        print(f"  [{row.id} seed {seed}] evaluating {checkpoint} on {subset}", flush=True)
        if out.exists():
            shutil.rmtree(out)  # made with other decoding flags
        results = evaluate(request)
        store(out / "key.json", key)
    target_lang = load_dataset_meta(request.data_dir).target_lang
    return from_json(EvalRecord, dict(results, out=str(out), target_lang=target_lang))


def disagreement_scores(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Optional[Dict]:
    """EMNLP 2018 Tables 4–5 disagreement scores of one run on the whole validation set, per attention type
    (:mod:`diverse_fairseq.analysis.scores`): ``{type: {"sub", "pos", "out", "offdiag_cos", "layers": [...]}}``.

    Only the scores (no NLL, pictures or ablation), cached in ``analysis/disagreement.json`` with their key
    among them. A model with a single head per attention module has no head pairs: None (the cache says why)."""
    from ..analysis.scores import SCALE, TooFewHeads

    key = {"scale": SCALE, "max_sentences": None, "checkpoint_identity": checkpoint_identity(checkpoint)}

    def compute():
        from ..analysis.pipeline import Options, score_checkpoint

        print(f"  [{row.id} seed {seed}] head-diversity scores", flush=True)
        opts = Options(data=str(run.data_bin / run.dataset), max_sentences=None, max_tokens=4096,
                       ablation=False, progress=False, device="cuda" if run.gpus else "cpu")
        try:
            payload = score_checkpoint(checkpoint, opts, label=row.id)
        except TooFewHeads as e:
            return dict(key, by_type=None, skipped=str(e))
        print(f"  [{row.id} seed {seed}] head-diversity scores of {payload['sentences']} sentences in "
              f"{payload['seconds']:.1f}s", flush=True)
        return dict(payload, checkpoint_identity=key["checkpoint_identity"])

    payload = cached(run.run_dir(row, seed) / "analysis" / "disagreement.json", key, compute,
                     stored_key=lambda payload: {name: payload.get(name) for name in key})
    if payload["by_type"] is None:
        print(f"  [{row.id} seed {seed}] no head-diversity scores: {payload['skipped']}", flush=True)
        return None
    return {t: {**scores, "layers": payload["by_layer"][t]} for t, scores in payload["by_type"].items()}


def probing_scores(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Dict:
    """NAACL 2019 Table 1 / journal Table 7: the run's frozen encoder on the table's SentEval probing tasks
    (``{task: {"accuracy", "valid_accuracy", "majority", ...}}``, seeded by the run's seed), cached in
    ``analysis/probing.json``."""
    from ..analysis.probing import ProbeSettings, probe_checkpoint
    from ..analysis.probing import cache_key as probing_key
    from ..data.senteval import parse_tasks

    tasks, settings = parse_tasks(run.probing_tasks), ProbeSettings(seed=seed)
    key = dict(probing_key(checkpoint, tasks, run.probing_dir, settings),
               checkpoint_identity=checkpoint_identity(checkpoint))

    def compute():
        print(f"  [{row.id} seed {seed}] probing tasks {', '.join(t.name for t in tasks)}", flush=True)
        return dict(probe_checkpoint(checkpoint, tasks, run.probing_dir, settings, device="cuda" if run.gpus else
                                     "cpu", data=str(run.data_bin / run.dataset)), key=key)

    return cached(run.run_dir(row, seed) / "analysis" / "probing.json", key, compute)["tasks"]


def run_job(row: Row, run: RunConfig, seed: int) -> JobRecord:
    """One row and seed's record: train (or reuse), evaluate, score head disagreement (and probe)."""
    train, reused = train_row(row, run, seed)
    return JobRecord(
        train=train, reused=reused,
        evals={subset: evaluate_row(row, run, seed, train.checkpoint, subset) for subset in run.subsets},
        disagreement=disagreement_scores(row, run, seed, train.checkpoint),
        probing=probing_scores(row, run, seed, train.checkpoint) if run.probing_tasks else None)
