"""``python -m diverse_fairseq.tables TABLE [--dataset D] [--scale demo|paper] [--seeds 1,2] [--gpus N]``."""

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ..cli_logging import setup_cli_logging
from .report import summarise, write_report
from .runner import RunConfig, run_table
from .spec import REPO, TableSpecError, load_table


def build_parser():
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.tables", description=__doc__)
    p.add_argument("table", help="a table id from configs/tables/ (e.g. demo, emnlp18_t1) or a YAML path")
    p.add_argument("--dataset", default=env("DATASET"), help="dataset to run on [DATASET]; default: the "
                   "table's paper dataset at scale paper, demo at scale demo")
    p.add_argument("--scale", default=env("SCALE", "demo"), choices=("demo", "paper"), help="[SCALE]")
    p.add_argument("--seeds", default=env("SEEDS", "1"), help="comma-separated seeds, or a count N [SEEDS]")
    p.add_argument("--gpus", type=int, default=int(env("GPUS", "0")), help="GPUs per run, 0 = CPU [GPUS]")
    p.add_argument("--out", default=env("RESULTS"), help="results directory (default results/<table>)")
    p.add_argument("--data-bin", default=env("DATA_BIN", str(REPO / "data-bin")), help="[DATA_BIN]")
    p.add_argument("--train-args", default=env("TRAIN_ARGS", ""),
                   help="extra fairseq-train flags for every row, e.g. '--max-update 100' [TRAIN_ARGS]")
    p.add_argument("--generate-args", default=env("GENERATE_ARGS", ""),
                   help="extra fairseq-generate flags for every row, e.g. '--beam 1' [GENERATE_ARGS]")
    return p


def parse_seeds(text: str):
    text = str(text).strip()
    if "," not in text and text.isdigit() and int(text) > 0:
        return list(range(1, int(text) + 1))
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise SystemExit(f"error: --seeds/SEEDS must be a count (3) or a comma-separated list (1,2,3), got {text!r}")
    return seeds


def ensure_demo_data(data: Path):
    """The demo corpus ships with the repository: prepare (segment and binarize) it, or check that it is.

    ``prepare_data`` skips every step whose output is complete and up to date, so this is quick after the
    first run and redoes only what a changed corpus or recipe needs.
    """
    env = dict(os.environ, DATA_BIN=str(data.parent))
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "demo"], check=True, cwd=REPO, env=env)


def main(argv=None):
    args = build_parser().parse_args(argv)
    setup_cli_logging()
    try:
        table = load_table(args.table)
        dataset = args.dataset or (table.paper_dataset if args.scale == "paper" else "demo")
        if not dataset:
            raise SystemExit("error: this table names no paper dataset; pass --dataset / DATASET")
    except TableSpecError as e:
        raise SystemExit(f"error: {e}")
    out = Path(args.out or REPO / "results" / table.table).resolve()
    run = RunConfig(dataset=dataset, scale=args.scale, seeds=parse_seeds(args.seeds), gpus=args.gpus,
                    out_dir=out / f"{dataset}-{args.scale}", data_bin=Path(args.data_bin),
                    train_args=shlex.split(args.train_args), generate_args=shlex.split(args.generate_args))
    if dataset == "demo":
        ensure_demo_data(run.data_bin / dataset)
    results = run_table(table, run)
    summary = summarise(table, results, dataset, args.scale)
    md = write_report(summary, out)
    print("\n" + md.read_text(encoding="utf-8"))
    print(f"written: {md} and {md.with_suffix('.json')}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
