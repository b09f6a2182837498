"""The steps of one row and seed (one *job*), each cached beside its run (``cache.py``):

1. :func:`train_row` trains with :func:`diverse_fairseq.training.run` (``fairseq-train --user-dir
   diverse_fairseq`` with the dataset's setting) into ``<out>/runs/<row>/seed<N>/``; fairseq resumes from
   ``checkpoint_last.pt`` there, and a finished run leaves ``train.json`` and is reused next time. It records
   parameters and training steps/s from fairseq's log (``--log-format json``, read by
   :mod:`diverse_fairseq.tables.logs`; the runner passes ``--log-file`` and ``--log-format json`` itself).
   When a row's YAML, the setting or the data change (the key of ``keys.py``), the old run directory is
   **moved aside** to ``seed<N>.stale-<time>/`` (nothing is deleted) and the row is trained afresh; a run
   interrupted under the same key resumes from its last checkpoint.
2. :func:`evaluate_row` evaluates the run's checkpoint (the average of the last checkpoints where training made
   one, else the setting's single model, :mod:`diverse_fairseq.checkpoint_choice`: ``checkpoint_best.pt`` by
   validation BLEU for the THUMT papers' settings, by validation loss for the EMNLP 2020 authors' fairseq
   settings, ``checkpoint_last.pt`` at demo scale) with :mod:`diverse_fairseq.evaluate` (sacrebleu and tokenized BLEU,
   decoding speed; reused while ``eval/key.json`` matches);
3. :func:`disagreement_scores` and, for tables that ask for it, :func:`probing_scores` measure the checkpoint.

:func:`run_job` runs them in this order and returns the per-seed record.
"""

import json
import os
import shlex
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import training
from ..checkpoint_choice import evaluated_checkpoint
from . import logs, scale
from .cache import checkpoint_identity, lookup, package_version, store, whole_file
from .config import RunConfig
from .keys import LOG_FORMAT_ARGS, cache_key, key_difference, same_key
from .spec import Row


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


def _move_aside(run_dir: Path, why: str, tag: str):
    stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(stale)
    print(f"  [{tag}] the run in {run_dir} was made by a different command ({why}): moved it to {stale.name}/ "
          f"and training afresh", flush=True)


def _valid_nll(log: str) -> Optional[float]:
    """The last validation's NLL per target token (fairseq's ``nll_loss``: base 2, without label smoothing)."""
    return logs.last_summary(log, "valid").get("nll_loss")


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
    finished = lookup(record_path, key, same=same_key)
    if finished.hit:
        record = finished.data
        print(f"  [{tag}] training finished earlier ({record.get('trained_at', 'unknown time')}); "
              f"reusing {run_dir}", flush=True)
        if "valid_nll_loss" not in record and log_file.exists():  # a record written before it was kept
            record["valid_nll_loss"] = _valid_nll(log_file.read_text(encoding="utf-8", errors="replace"))
        # the setting's checkpoint (checkpoint_choice) beside train.json, also when the results directory has
        # moved since, and for records written before the setting named its best checkpoint metric
        chosen = training.SETTINGS[setting]
        name = evaluated_checkpoint(chosen, record.get("averaged_checkpoints") or 0)
        return dict(record, checkpoint=str(run_dir / name), best_checkpoint_metric=chosen.best_checkpoint_metric,
                    reused=True)
    if finished.data is not None:
        _move_aside(run_dir, key_difference(finished.key, key), tag)
    elif run_dir.exists() and any(run_dir.iterdir()):
        interrupted = lookup(key_path, key, stored_key=whole_file, same=same_key)
        if not interrupted.hit:
            _move_aside(run_dir, key_difference(interrupted.key, key), tag)
        else:
            print(f"  [{tag}] resuming the interrupted run in {run_dir}", flush=True)
    store(key_path, key)
    print(f"  [{tag}] training {arch} ({setting}): {shlex.join(row_args + run.train_args)}", flush=True)
    info = training.run(request, env=job_env(run))  # info["checkpoint"]: checkpoint_choice's, for the setting
    log = log_file.read_text(encoding="utf-8", errors="replace")
    train = logs.last_summary(log, "train")
    record = {
        "row": row.id, "seed": seed, "arch": arch, "setting": setting,
        "train_args": info["args"],  # fairseq-train's arguments, whatever the launcher (python -m, torchrun)
        "key": key, "trained_at": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": run.threads,
        "checkpoint": info["checkpoint"], "args": row_args, "averaged_checkpoints": info["averaged"],
        "best_checkpoint_metric": info["best_checkpoint_metric"],
        "parameters": logs.model_parameters(log),
        "updates": int(train.get("num_updates", 0)),
        "train_steps_per_second": train.get("ups"),
        "train_loss": train.get("loss"),
        "valid_loss": logs.last_summary(log, "valid").get("loss"),
        "valid_nll_loss": _valid_nll(log),
    }
    store(record_path, record)
    return dict(record, reused=False)


def decoding_args(run: RunConfig, row: Row) -> List[str]:
    """The row's decoding protocol as :mod:`diverse_fairseq.evaluate` options: its setting's length penalty form
    and length limit (:func:`diverse_fairseq.training.decoding`: GNMT's penalty and |x| + 50 tokens for the THUMT
    papers' settings, fairseq's penalty and the recipe's limit for the others)."""
    from ..evaluate import load_meta

    return training.decoding_args(load_meta(run.data_bin / run.dataset), training.SETTINGS[run.setting(row)])


def evaluate_command(run: RunConfig, row: Row, seed: int, checkpoint: str, subset: str) -> List[str]:
    """The arguments of :mod:`diverse_fairseq.evaluate` (without the program) that decode ``subset`` with
    ``checkpoint`` into :meth:`RunConfig.eval_dir`, as the row's setting decodes (:func:`decoding_args`)."""
    return [checkpoint, str(run.data_bin / run.dataset), "--out", str(run.eval_dir(row, seed, subset)),
            *(["--subset", subset] if subset != "test" else []), *decoding_args(run, row), *run.generate_args,
            *(["--cpu"] if run.gpus == 0 else [])]


def evaluate_row(row: Row, run: RunConfig, seed: int, checkpoint: str, subset: str = "test") -> Dict:
    """Decode and score ``subset`` with one row/seed's checkpoint (cached in results.json of
    :meth:`RunConfig.eval_dir` while key.json there matches: the checkpoint's name and contents
    (:func:`checkpoint_identity`), the decoding flags)."""
    from ..evaluate import load_meta
    from ..evaluate import main as evaluate_main

    out = run.eval_dir(row, seed, subset)
    key = {"checkpoint": Path(checkpoint).name, "checkpoint_identity": checkpoint_identity(checkpoint),
           "decoding": decoding_args(run, row), "generate_args": run.generate_args, "cpu": run.gpus == 0,
           "version": package_version()}
    if (out / "results.json").exists() and lookup(out / "key.json", key, stored_key=whole_file).hit:
        results = json.loads((out / "results.json").read_text())
    else:
        print(f"  [{row.id} seed {seed}] evaluating {checkpoint} on {subset}", flush=True)
        if out.exists():
            shutil.rmtree(out)  # made with other decoding flags
        results = evaluate_main(evaluate_command(run, row, seed, checkpoint, subset))
        store(out / "key.json", key)
    return dict(results, out=str(out), target_lang=load_meta(run.data_bin / run.dataset)["target_lang"])


def disagreement_scores(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Optional[Dict]:
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
    identity = checkpoint_identity(checkpoint)
    # the key is kept among the scores: the scale, the whole set (no sentence limit) and the checkpoint
    key = {"scale": SCALE, "max_sentences": None, "checkpoint_identity": identity}
    found = lookup(path, key, stored_key=lambda payload: {name: payload.get(name) for name in key})
    if found.hit:
        payload = found.data
    else:
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
        store(path, payload)
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
    from ..analysis.probing import ProbeSettings, probe_checkpoint
    from ..analysis.probing import cache_key as probing_key
    from ..data.senteval import parse_tasks

    tasks, settings = parse_tasks(run.probing_tasks), ProbeSettings(seed=seed)
    path = run.run_dir(row, seed) / "analysis" / "probing.json"
    key = dict(probing_key(checkpoint, tasks, run.probing_dir, settings),
               checkpoint_identity=checkpoint_identity(checkpoint))
    found = lookup(path, key)
    if found.hit:
        payload = found.data
    else:
        print(f"  [{row.id} seed {seed}] probing tasks {', '.join(t.name for t in tasks)}", flush=True)
        payload = probe_checkpoint(checkpoint, tasks, run.probing_dir, settings, data=str(run.data_bin / run.dataset),
                                   device="cuda" if run.gpus else "cpu")
        payload["key"] = key
        store(path, payload)
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
