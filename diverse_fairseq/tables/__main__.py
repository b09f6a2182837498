"""``python -m diverse_fairseq.tables TABLE [--dataset D] [--scale demo|paper] [--seeds 1,2] [--gpus N]``."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .report import summarise, write_report
from .runner import RunConfig, run_table
from .spec import REPO, TableSpecError, load_setting, load_table


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
    p.add_argument("--scales", default=env("SCALES_FILE"), help="scale settings YAML "
                   "(default configs/tables/scales.yaml) [SCALES_FILE]")
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


def ensure_demo_data(setting_data: Path):
    """The demo corpus ships with the repository: binarize it on first use."""
    if not any(setting_data.glob("dict.*.txt")):
        subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "demo"], check=True, cwd=REPO)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        table = load_table(args.table)
        dataset = args.dataset or (table.paper_dataset if args.scale == "paper" else "demo")
        if not dataset:
            raise SystemExit("error: this table names no paper dataset; pass --dataset / DATASET")
        setting = load_setting(args.scale, dataset, args.scales)
    except TableSpecError as e:
        raise SystemExit(f"error: {e}")
    out = Path(args.out or REPO / "results" / table.table)
    run = RunConfig(dataset=dataset, scale=args.scale, seeds=parse_seeds(args.seeds), gpus=args.gpus,
                    out_dir=out / f"{dataset}-{args.scale}")
    if dataset == "demo":
        ensure_demo_data(REPO / setting.data)
    results = run_table(table, setting, run)
    summary = summarise(table, results, dataset, args.scale)
    md = write_report(summary, out)
    print("\n" + md.read_text(encoding="utf-8"))
    print(f"written: {md} and {md.with_suffix('.json')}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
