"""Run the rows of an experiment table at demo scale and record validation loss, validation BLEU and test BLEU.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python scripts/experiments/run.py configs/experiments/X.yaml \
        --out results/experiments/X [--train-args '--lr 0.002 ...'] [--rows a,b] [--seed 1] [--jobs 2]

An experiment table has the format of ``configs/tables/*.yaml`` (``python -m diverse_fairseq.tables`` runs it
too, test BLEU only). This script exists for the diagnosis in ``docs/demo-findings.md``: it also decodes the
validation set, because the demo setting is chosen on the baseline's validation numbers only. Per row and seed:

1. train: ``python -m diverse_fairseq.training demo tiny --arch <row arch> <row args> <--train-args>`` into
   ``<out>/<row>/seed<N>/`` (rows with ``--optimizer repulsive_adam`` go through ``kernel_probe.py``, the same
   training plus a read-only record of the SVGD kernel, ``kernel_stats.jsonl``);
2. evaluate the last checkpoint with ``python -m diverse_fairseq.evaluate`` on ``valid`` and ``test`` (CPU,
   the demo recipe's beam and length penalty; ``--subsets valid`` skips the test set);
3. write ``<out>/summary.md`` / ``summary.json``: valid loss (fairseq's validation after the last update,
   label-smoothed cross-entropy in bits), valid and test sacrebleu BLEU, training minutes.

Finished steps are skipped when the command is run again. ``--jobs`` rows run at once (one CPU thread each).
"""

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

from diverse_fairseq.tables import logs  # noqa: E402


def train(row, run_dir: Path, args) -> None:
    log = run_dir / "train.log"
    if (run_dir / "train.done").exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    arch = "transformer".replace("transformer", row.get("family", "transformer"), 1)
    extra = ["--arch", arch, *map(str, row.get("args", [])), "--log-format", "json", "--log-file", str(log),
             *shlex.split(args.train_args)]  # logs.last_summary reads fairseq's JSON records
    entry = ([str(HERE / "kernel_probe.py")] if "repulsive_adam" in extra else ["-m", "diverse_fairseq.training"])
    cmd = [sys.executable, *entry, "demo", "tiny", *extra]
    env = dict(os.environ, SAVE_DIR=str(run_dir), SEED=str(args.seed), DATA_BIN=str(args.data_bin),
               CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    start = time.time()
    with open(run_dir / "train.out", "w") as out:
        rc = subprocess.call(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if rc != 0:
        raise RuntimeError(f"training {row['id']} failed (exit {rc}), see {run_dir / 'train.out'}")
    (run_dir / "train.done").write_text(json.dumps({"command": cmd, "minutes": (time.time() - start) / 60}) + "\n")


def evaluate(run_dir: Path, subset: str, args) -> dict:
    out = run_dir / f"eval-{subset}"
    if not (out / "results.json").exists():
        cmd = [sys.executable, "-m", "diverse_fairseq.evaluate", str(run_dir / "checkpoint_last.pt"), "demo",
               "--data-bin", str(args.data_bin), "--subset", subset, "--out", str(out), "--cpu"]
        with open(run_dir / f"eval-{subset}.out", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                 env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        if rc != 0:
            raise RuntimeError(f"evaluation failed (exit {rc}), see {run_dir / f'eval-{subset}.out'}")
    return json.loads((out / "results.json").read_text())


def _bleu(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def run_row(row, args) -> dict:
    run_dir = Path(args.out) / row["id"] / f"seed{args.seed}"
    train(row, run_dir, args)
    log = (run_dir / "train.log").read_text(errors="replace")
    valid, trained = logs.last_summary(log, "valid"), logs.last_summary(log, "train")
    record = {"row": row["id"], "label": row.get("label", row["id"]), "seed": args.seed,
              "train_args": args.train_args, "valid_loss": valid.get("loss"), "valid_nll": valid.get("nll_loss"),
              "train_loss": trained.get("loss"), "updates": trained.get("num_updates"),
              "train_minutes": json.loads((run_dir / "train.done").read_text())["minutes"]}
    for subset in ("valid", "test"):
        done = (run_dir / f"eval-{subset}" / "results.json").exists()
        res = evaluate(run_dir, subset, args) if subset in args.subsets or done else {}
        record[f"{subset}_bleu"], record[f"{subset}_tok_bleu"] = res.get("bleu"), res.get("tok_bleu")
    print(f"[{row['id']}] valid loss {record['valid_loss']}  valid BLEU {_bleu(record['valid_bleu'])}  "
          f"test BLEU {_bleu(record['test_bleu'])}", flush=True)
    return record


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", help="an experiment table YAML")
    p.add_argument("--out", required=True, help="results directory (one per setting: finished runs are reused)")
    p.add_argument("--train-args", default="", help="fairseq-train flags added to every row (setting overrides)")
    p.add_argument("--rows", default="", help="comma-separated row ids to run (default: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="rows trained at once")
    p.add_argument("--subsets", default="valid,test", help="subsets to decode (a decoded one is always reported)")
    p.add_argument("--data-bin", default=str(REPO / "data-bin"), help="prepared datasets (demo is prepared if absent)")
    args = p.parse_args(argv)
    args.data_bin = Path(args.data_bin).resolve()
    args.subsets = [s for s in args.subsets.split(",") if s]
    if not (args.data_bin / "demo" / "prepare.json").exists():
        subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "demo"], check=True, cwd=REPO,
                       env=dict(os.environ, DATA_BIN=str(args.data_bin)))
    table = yaml.safe_load(Path(args.table).read_text())
    wanted = [r for r in args.rows.split(",") if r]
    rows = [r for r in table["rows"] if not wanted or r["id"] in wanted]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        records = list(pool.map(lambda r: run_row(r, args), rows))
    out = Path(args.out)
    previous = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else []
    merged = {(r["row"], r["seed"]): r for r in previous + records}
    records = sorted(merged.values(), key=lambda r: ([x["id"] for x in table["rows"]].index(r["row"])
                                                     if r["row"] in [x["id"] for x in table["rows"]] else 99, r["seed"]))
    (out / "summary.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"{table.get('title', table['table'])} (train args: `{args.train_args or 'none'}`)", "",
             "| row | seed | valid loss | valid BLEU | test BLEU | train min |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['seed']} | {r['valid_loss']} | {_bleu(r['valid_bleu'])} | {_bleu(r['test_bleu'])} | "
              f"{r['train_minutes']:.1f} |" for r in records]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
