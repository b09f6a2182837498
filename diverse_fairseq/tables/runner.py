"""Train, evaluate and measure every row of a table, resuming whatever is already finished.

For each row and seed the runner

1. trains with :func:`diverse_fairseq.training.run` (``fairseq-train --user-dir diverse_fairseq`` with the
   dataset's setting) into ``<out>/runs/<row>/seed<N>/``; fairseq resumes from ``checkpoint_last.pt`` there,
   and a finished run leaves ``train.json`` and is skipped next time;
2. evaluates the run's checkpoint (averaged where the setting averages) with :mod:`diverse_fairseq.evaluate`
   (sacrebleu and tokenized BLEU, decoding speed; skipped when ``eval/results.json`` exists);
3. records parameters and training steps/s from fairseq's log.
"""

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from .. import training
from . import logs
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

    def run_dir(self, row: Row, seed: int) -> Path:
        return self.out_dir / "runs" / row.id / f"seed{seed}"

    def setting(self, row: Row) -> str:
        """The training setting of ``row``: ``tiny`` at demo scale, else the row's or the dataset's."""
        if self.scale == "demo":
            return "tiny"
        return row.setting or training.DEFAULT_SETTING[self.dataset]


def train_row(row: Row, run: RunConfig, seed: int) -> Dict:
    """Train one row/seed (or reuse its finished run) and return its training record."""
    run_dir = run.run_dir(row, seed)
    record_path = run_dir / "train.json"
    if record_path.exists():
        print(f"  [{row.id} seed {seed}] training finished earlier; reusing {run_dir}", flush=True)
        return json.loads(record_path.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    setting = run.setting(row)
    arch = row.arch(training.SETTINGS[setting].arch)
    log_file = run_dir / "train.log"
    env = dict(os.environ, SAVE_DIR=str(run_dir), SEED=str(seed), DATA_BIN=str(run.data_bin),
               PYTHONUNBUFFERED="1")
    if run.gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    extra = ["--arch", arch, *row.args, "--log-file", str(log_file), *run.train_args]
    print(f"  [{row.id} seed {seed}] training {arch} ({setting}): {shlex.join(row.args + run.train_args)}",
          flush=True)
    info = training.run(run.dataset, setting, extra, env=env, gpus=run.gpus)
    log = log_file.read_text(encoding="utf-8", errors="replace")
    train = logs.last_summary(log, "train")
    record = {
        "row": row.id, "seed": seed, "arch": arch, "setting": setting, "command": info["command"][3:],
        "checkpoint": info["checkpoint"],
        "parameters": logs.model_parameters(log),
        "updates": int(train.get("num_updates", 0)),
        "train_steps_per_second": train.get("ups"),
        "train_loss": train.get("loss"),
        "valid_loss": logs.last_summary(log, "valid").get("loss"),
    }
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def evaluate_row(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Dict:
    """Decode and score the test set with one row/seed's checkpoint (cached in eval/results.json)."""
    from ..evaluate import load_meta, main as evaluate_main

    data = run.data_bin / run.dataset
    out = run.run_dir(row, seed) / "eval"
    if (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())
    else:
        print(f"  [{row.id} seed {seed}] evaluating {checkpoint}", flush=True)
        args = [checkpoint, str(data), "--out", str(out), *run.generate_args]
        if run.gpus == 0:
            args.append("--cpu")
        results = evaluate_main(args)
    return dict(results, out=str(out), target_lang=load_meta(data)["target_lang"])


def disagreement_scores(row: Row, run: RunConfig, seed: int, checkpoint: str) -> Dict:
    """EMNLP 2018 Tables 4–5 disagreement scores of one run on the whole validation set, per attention type.

    On the paper's scale, exp(−mean over all H² head pairs, self-pairs included)
    (:mod:`diverse_fairseq.analysis.scores`): ``{type: {"sub", "pos", "out", "offdiag_cos": {"sub", "out"},
    "layers": [{"layer": 1, "heads", "sub", "pos", "out", "offdiag_cos", ...}, ...]}}``, the per-type numbers
    being Table 4's and the per-layer ones Table 5's. Only the scores are computed (teacher-forced passes in
    batches of 4096 tokens without the output projection; no NLL, pictures or head ablation: a few seconds
    for the demo model's 1,000 validation sentences on one CPU thread), cached in
    ``analysis/disagreement.json``; a cache on another scale or of part of the set is recomputed.
    """
    from ..analysis.scores import SCALE

    path = run.run_dir(row, seed) / "analysis" / "disagreement.json"
    payload = json.loads(path.read_text()) if path.exists() else {}
    if payload.get("scale") != SCALE or payload.get("max_sentences") is not None:
        from ..analysis.pipeline import Options, score_checkpoint

        print(f"  [{row.id} seed {seed}] head-diversity scores", flush=True)
        device = "cuda" if run.gpus else "cpu"
        opts = Options(data=str(run.data_bin / run.dataset), max_sentences=None, max_tokens=4096,
                       ablation=False, progress=False, device=device)
        payload = score_checkpoint(checkpoint, opts, label=row.id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"  [{row.id} seed {seed}] head-diversity scores of {payload['sentences']} sentences in "
              f"{payload['seconds']:.1f}s", flush=True)
    return {t: {**scores, "layers": payload["by_layer"][t]} for t, scores in payload["by_type"].items()}


def run_table(table: Table, run: RunConfig) -> Dict[str, List[Dict]]:
    """Train and evaluate every row and seed; return ``{row id: [per-seed record]}``."""
    data = run.data_bin / run.dataset
    if not (data / "prepare.json").exists():
        raise SystemExit(f"error: no prepared dataset in {data}. Prepare it first: make data DATASET={run.dataset}")
    results = {}
    for i, row in enumerate(table.rows, 1):
        print(f"[{table.table}] row {i}/{len(table.rows)}: {row.label}", flush=True)
        results[row.id] = []
        for seed in run.seeds:
            record = train_row(row, run, seed)
            record["eval"] = evaluate_row(row, run, seed, record["checkpoint"])
            record["disagreement"] = disagreement_scores(row, run, seed, record["checkpoint"])
            record["output_disagreement"] = record["disagreement"]["enc_self"]["out"]
            results[row.id].append(record)
    return results
