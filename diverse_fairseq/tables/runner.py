"""Train, evaluate and measure every row of a table, resuming whatever is already finished.

For each row and seed the runner

1. trains with ``fairseq-train --user-dir diverse_fairseq`` into ``<out>/runs/<row>/seed<N>/`` (fairseq resumes
   from ``checkpoint_last.pt`` there; a finished run leaves ``train.json`` and is skipped next time);
2. evaluates ``checkpoint_last.pt`` with ``diverse_fairseq.evaluate`` (sacrebleu and tokenized BLEU, decoding
   speed; skipped when ``eval/results.json`` exists);
3. records parameters and training steps/s from fairseq's log.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from . import logs
from .spec import REPO, Row, Setting, Table

USER_DIR = str(REPO / "diverse_fairseq")


@dataclass
class RunConfig:
    dataset: str
    scale: str
    seeds: List[int]
    gpus: int
    out_dir: Path

    def run_dir(self, row: Row, seed: int) -> Path:
        return self.out_dir / "runs" / row.id / f"seed{seed}"


def train_command(row: Row, setting: Setting, run: RunConfig, seed: int) -> List[str]:
    """The fairseq-train command line of one row (the scale's settings, then the row's own flags)."""
    save_dir = run.run_dir(row, seed)
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(REPO / setting.data), "--user-dir", USER_DIR,
           "--arch", setting.arch(row.family), *setting.model_args, *setting.train_args, *row.args,
           "--seed", str(seed), "--save-dir", str(save_dir), "--no-epoch-checkpoints",
           "--log-format", "simple", "--log-interval", "50",
           "--tensorboard-logdir", str(save_dir / "tensorboard")]
    if run.gpus == 0:
        cmd.append("--cpu")
    else:
        cmd += ["--distributed-world-size", str(run.gpus)]
    return cmd


def _stream(cmd: List[str], log_path: Path, env: Dict[str, str]) -> int:
    """Run ``cmd`` with its output appended to ``log_path`` and echoed (fairseq's progress log)."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in proc.stdout:
            log.write(line)
            if "| INFO | train" in line or "| valid |" in line or "| train |" in line or "Error" in line:
                print("    " + line.rstrip().split(" | INFO | ")[-1], flush=True)
        return proc.wait()


def _env(run: RunConfig) -> Dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if run.gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def train_row(row: Row, setting: Setting, run: RunConfig, seed: int) -> Dict:
    """Train one row/seed (or reuse its finished run) and return its training record."""
    run_dir = run.run_dir(row, seed)
    record_path = run_dir / "train.json"
    if record_path.exists():
        print(f"  [{row.id} seed {seed}] training finished earlier; reusing {run_dir}", flush=True)
        return json.loads(record_path.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = train_command(row, setting, run, seed)
    print(f"  [{row.id} seed {seed}] training: {' '.join(cmd[3:])}", flush=True)
    start = time.time()
    code = _stream(cmd, run_dir / "train.log", _env(run))
    log = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
    if code != 0 or not (run_dir / "checkpoint_last.pt").exists():
        tail = "\n".join(log.splitlines()[-25:])
        raise SystemExit(f"error: training row '{row.id}' (seed {seed}) failed with exit code {code}; "
                         f"log: {run_dir / 'train.log'}\n{tail}")
    train = logs.last_summary(log, "train")
    record = {
        "row": row.id, "seed": seed, "command": cmd[3:],
        "parameters": logs.model_parameters(log),
        "updates": int(train.get("num_updates", 0)),
        "train_steps_per_second": train.get("ups"),
        "train_loss": train.get("loss"),
        "valid_loss": logs.last_summary(log, "valid").get("loss"),
        "wall_seconds_this_session": round(time.time() - start, 1),
    }
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def evaluate_row(row: Row, setting: Setting, run: RunConfig, seed: int) -> Dict:
    """Decode and score the test set with the last checkpoint of one row/seed (cached in eval/results.json)."""
    run_dir = run.run_dir(row, seed)
    out = run_dir / "eval"
    from ..evaluate import load_meta, main as evaluate_main

    if (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())
    else:
        print(f"  [{row.id} seed {seed}] evaluating", flush=True)
        args = [str(run_dir / "checkpoint_last.pt"), str(REPO / setting.data), "--out", str(out),
                *setting.generate_args]
        if run.gpus == 0:
            args.append("--cpu")
        results = evaluate_main(args)
    return dict(results, out=str(out), target_lang=load_meta(REPO / setting.data)["target_lang"])


def run_table(table: Table, setting: Setting, run: RunConfig) -> Dict[str, List[Dict]]:
    """Train and evaluate every row and seed; return ``{row id: [per-seed record]}``."""
    data = REPO / setting.data
    if not any(data.glob("dict.*.txt")):
        raise SystemExit(f"error: no binarized dataset in {data}. Prepare it first: "
                         f"make data DATASET={run.dataset}")
    results = {}
    for i, row in enumerate(table.rows, 1):
        print(f"[{table.table}] row {i}/{len(table.rows)}: {row.label}", flush=True)
        results[row.id] = []
        for seed in run.seeds:
            record = train_row(row, setting, run, seed)
            record["eval"] = evaluate_row(row, setting, run, seed)
            results[row.id].append(record)
    return results
