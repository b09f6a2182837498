"""``python -m diverse_fairseq.tables TABLE [--dataset D] [--scale demo|paper] [--seeds 1,2] [--gpus N]
[--threads N] [--jobs N] [--rows a,b] [--subsets valid,test] [--train-hook SCRIPT] [--dry-run 1]``.

TABLE is a table of ``configs/tables/`` or any table YAML, such as the diagnosis experiments of
``configs/experiments/`` (docs/demo-findings.md).

Every option defaults to an environment variable (in brackets), as the make targets pass them. The values
are checked before any work starts; a bad one stops the run with a message naming the variable.
"""

import argparse
import json
import os
import shlex
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

from .. import training
from ..data.recipes import RECIPES
from ..data.recipes.demo import SHIPPED
from ..runs import env_checks, paths
from ..runs.cli_logging import setup_cli_logging
from .cache import RUNNER_FLAGS
from .check import SCALES, dataset_for
from .config import RunConfig
from .report import summarise, write_report
from .runner import TableInterrupted, interrupted_lines, run_table
from .spec import REPO, TableSpecError, load_table

SUBSETS = ("valid", "test")


#: the options besides the table and --data-bin: (flag, the environment variable that is its default, the
#: variable's default, the parser of its value (None: read where it is used), help)
OPTIONS = (
    ("--dataset", "DATASET", None, None, "dataset to run on; default: the table's paper dataset at scale paper, "
                                         "demo at scale demo"),
    ("--scale", "SCALE", "demo", lambda name, text: env_checks.parse_choice(name, text, SCALES),
     "demo or paper, exactly"),
    ("--seeds", "SEEDS", "1", env_checks.parse_seeds,
     "a count N (seeds 1..N) or a comma-separated list of positive seeds"),
    ("--gpus", "GPUS", "0", env_checks.parse_int, "GPUs per run, 0 = CPU"),
    ("--threads", "THREADS", "1", lambda name, text: env_checks.parse_int(name, text, 1),
     "CPU threads of every training/decoding job (OMP_NUM_THREADS, MKL_NUM_THREADS, torch): fixed, so that a seed "
     "gives the same numbers on any machine"),
    ("--jobs", "JOBS", None, lambda name, text: None if text in (None, "") else env_checks.parse_int(name, text, 1),
     "row/seed jobs run at once, each with its log in <out>/logs/; default: the CPU cores (at most the number of "
     "jobs), 1 with GPUS > 0"),
    ("--out", "RESULTS", None, None, "results directory (default results/<table>)"),
    ("--train-args", "TRAIN_ARGS", "", env_checks.parse_words,
     "extra fairseq-train flags for every row, e.g. '--max-update 100'"),
    ("--probing-data", "PROBING_DATA", None, None, "folder of SentEval's probing files, for tables with probing "
     "tasks; missing files are downloaded there (default work/senteval_probing)"),
    ("--generate-args", "GENERATE_ARGS", "", env_checks.parse_words,
     "extra fairseq-generate flags for every row, e.g. '--beam 1'"),
    ("--rows", "ROWS", "", None, "comma-separated row ids to run (default: all); a chosen row's baseline runs too"),
    ("--subsets", "SUBSETS", "test", lambda name, text: parse_subsets(text), "comma-separated subsets to decode, "
     "valid and/or test; the first is the report's BLEU (default test)"),
    ("--train-hook", "TRAIN_HOOK", None, lambda name, text: parse_hook(text), "a Python script started in place "
     "of 'python -m fairseq_cli.train' with the same arguments, to watch each training, e.g. "
     "scripts/experiments/kernel_probe.py (records the SVGD kernel); not part of the cache key, so a finished run "
     "is reused without it"),
    ("--allow-unverified-data", "ALLOW_UNVERIFIED_DATA", "", env_checks.parse_flag, "1: run a paper-scale table "
     "on data that prepare.json records as not the published data (skipped or partial CWMT, a corpus count that "
     "differs from the published one); SentEval stand-ins are still refused"),
    ("--progress-interval", "PROGRESS_INTERVAL", "30", lambda name, text: env_checks.parse_float(name, text, 0),
     "seconds between two progress lines of a training row (update, losses, time left), printed only when "
     "fairseq has logged since the last one; 0: every record it logs (default 30)"),
    ("--dry-run", "DRY_RUN", "", env_checks.parse_flag,
     "1: print every row's training and evaluation commands, run and write nothing"),
)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.tables", description=__doc__)
    p.add_argument("table", help="a table id from configs/tables/ (e.g. demo, emnlp18_t1) or a YAML path")
    p.add_argument("--data-bin", default=str(paths.from_env("DATA_BIN")), help="[DATA_BIN]")
    for flag, variable, default, _, text in OPTIONS:
        p.add_argument(flag, default=os.environ.get(variable, default), help=f"{text} [{variable}]")
    return p


#: variables of other commands that the table runner does not read: {name: what to use instead}
FOREIGN_VARIABLES = {
    "SEED": "SEEDS (a count: SEEDS=3 runs seeds 1, 2, 3; or a list: SEEDS=2,5); SEED is scripts/train.sh's",
    "SAVE_DIR": "RESULTS (the results directory; each run trains in <results>/<dataset>-<scale>/runs/<row>/seed<N>); "
                "SAVE_DIR is scripts/train.sh's",
    # scripts/evaluate.sh's decoding variables: a table decodes what the table says (its subsets, the recipe's
    # beam and length penalty), so that its test BLEU does not depend on the shell it was started from
    "SUBSET": "SUBSETS (the subsets a table decodes; the first is the report's BLEU); SUBSET is scripts/evaluate.sh's",
    "BEAM": "GENERATE_ARGS='--beam N' (recorded in the evaluation's cache key); BEAM is scripts/evaluate.sh's",
    "LENPEN": "GENERATE_ARGS='--lenpen X'; LENPEN is scripts/evaluate.sh's",
    "BATCH_SIZE": "GENERATE_ARGS='--batch-size N'; BATCH_SIZE is scripts/evaluate.sh's",
    "CPU": "GPUS=0 (trains and decodes on the CPU); CPU is scripts/evaluate.sh's",
}


def foreign_variable_warnings(env) -> List[str]:
    """Warnings for variables set in ``env`` that belong to ``scripts/train.sh`` or ``scripts/evaluate.sh``."""
    return env_checks.foreign_variables(env, FOREIGN_VARIABLES, "the table runner (ignored)")


def default_jobs(jobs: int, gpus: int) -> int:
    """``JOBS`` unset: one job per CPU core (at most ``jobs``), or 1 when the jobs use GPUs."""
    if gpus > 0:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, jobs))


def parse_subsets(text) -> List[str]:
    """``SUBSETS``: distinct names among valid and test, comma-separated."""
    subsets = [s.strip() for s in str(text).split(",")]
    if not all(s in SUBSETS for s in subsets) or len(set(subsets)) != len(subsets):
        raise env_checks.bad("SUBSETS (--subsets)", text, f"use {', '.join(SUBSETS)} or both, comma-separated")
    return subsets


def parse_hook(text) -> Optional[str]:
    """``TRAIN_HOOK``: an existing Python script (absolute path), or None."""
    if text in (None, ""):
        return None
    path = Path(text)
    if not path.is_file() or path.suffix != ".py":
        raise env_checks.bad("TRAIN_HOOK (--train-hook)", text, "name a Python script that exists, e.g. "
                             "scripts/experiments/kernel_probe.py")
    return str(path.resolve())


def select_rows(table, text: str):
    """``table`` with only the rows named in ``text`` (comma-separated ids) and their baselines; all when empty."""
    wanted = [r.strip() for r in str(text or "").split(",") if r.strip()]
    if not wanted:
        return table
    ids = [r.id for r in table.rows]
    unknown = [r for r in wanted if r not in ids]
    if unknown:
        raise env_checks.bad("ROWS (--rows)", text, f"{', '.join(unknown)} not in table {table.table}: use ids among "
                             f"{', '.join(ids)}")
    keep = set(wanted) | {table.row(r).baseline for r in wanted}
    for base in sorted(keep - set(wanted), key=ids.index):
        print(f"[{table.table}] --rows: also running {base}, the baseline of the chosen rows", flush=True)
    return replace(table, rows=[r for r in table.rows if r.id in keep])


def check_settings(args) -> dict:
    """The validated run settings; raises SystemExit naming the first bad variable."""
    settings = {flag[2:].replace("-", "_"): parse(f"{variable} ({flag})", getattr(args, flag[2:].replace("-", "_")))
                for flag, variable, _, parse, _ in OPTIONS if parse is not None}
    # scripts/train.sh's launch variables (MAX_UPDATE, PRECISION, ...) apply to every row's training
    settings["train_options"] = training.options_from_env(os.environ)
    if settings["gpus"]:  # more GPUs than are visible: stop now, not when the first row starts training
        training.select_gpus(settings["gpus"], os.environ, training.visible_gpus())
    taken = [a for a in settings["train_args"] if a.split("=", 1)[0] in RUNNER_FLAGS]
    if taken:
        raise env_checks.bad("TRAIN_ARGS (--train-args)", args.train_args,
                             f"leave out {' '.join(taken)}: the runner sets {' and '.join(RUNNER_FLAGS)} itself (it "
                             f"reads fairseq's JSON log records from the run's train.log)")
    return settings


#: the variables the runner reads: its options' defaults, and scripts/train.sh's launch variables for every row
RUNNER_VARIABLES = (*(variable for _, variable, *_ in OPTIONS if variable != "DRY_RUN"), "DATA_BIN", "MAX_TOKENS",
                    "UPDATE_FREQ", "MAX_UPDATE", "AVERAGE", "PRECISION", "EMBEDDINGS", "RESUME_ANYWAY")


def resume_command(argv: List[str], env) -> str:
    """The command that continues an interrupted table: this one, with the runner's variables that are set
    (``make table-<id> VAR=...`` when only the table is named)."""
    variables = {name: env[name] for name in RUNNER_VARIABLES if env_checks.get(env, name) is not None}
    if len(argv) == 1 and not argv[0].startswith("-") and "/" not in argv[0] and not argv[0].endswith(".yaml"):
        target = "demo" if argv[0] == "demo" else f"table-{argv[0]}"  # the Makefile's targets
        return shlex.join(["make", target, *(f"{k}={v}" for k, v in variables.items())])
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in variables.items())
    return prefix + shlex.join(["python", "-m", "diverse_fairseq.tables", *argv])


def data_problems(meta: dict) -> List[str]:
    """Why a prepared dataset (its prepare.json) is not the published data, in words; empty when it is."""
    expectations = (meta.get("verification") or {}).get("expectations", "published")
    stand_in = [] if expectations == "published" else [
        f"its files were checked against the stand-in manifest {expectations.get('manifest')!r} (EXPECT), not the "
        f"published sizes, checksums and counts"]
    record, recipe = meta.get("training_data"), RECIPES.get(meta.get("dataset"))
    if record is None:  # a recipe that records its corpora, prepared before it did
        older = recipe is not None and recipe.corpora_file
        return stand_in + (["prepared by an older version that did not check the corpora' counts (no training_data)"]
                           if older else [])
    return stand_in + ([] if record.get("verified", True) else list(record.get("problems") or ["not verified"]))


def check_paper_data(data: Path, allow: bool):
    """Refuse data prepared from other than the published corpora unless ALLOW_UNVERIFIED_DATA=1."""
    meta = data / "prepare.json"  # not prepared yet: the runner says how to prepare it
    what = "; ".join(data_problems(json.loads(meta.read_text(encoding="utf-8"))) if meta.is_file() else [])
    if not what:
        return
    if allow:
        print(f"[tables] warning: {data} is not the papers' data ({what}); running anyway (ALLOW_UNVERIFIED_DATA=1)"
              f": the results are not comparable with the papers'", flush=True)
        return
    raise SystemExit(f"error: {data} was prepared from other data than the papers' ({what}), see its prepare.json. "
                     f"Prepare it again with the full published corpora (make data DATASET={data.name.split('+')[0]}, "
                     f"without CWMT=skip, ALLOW_UNVERIFIED=1 or EXPECT), or run this paper-scale table on it anyway "
                     f"with ALLOW_UNVERIFIED_DATA=1 (--allow-unverified-data 1).")


def probing_dir(folder: Optional[str]) -> Path:
    """Where the SentEval probing files are: ``folder``, else the default (a mirror's own with a mirror)."""
    from ..data import senteval
    from ..data.download import MIRROR_ENV

    return (Path(folder) if folder else senteval.default_dir(os.environ.get(MIRROR_ENV) or None)).resolve()


def ensure_probing_data(tasks: List[str], folder: Optional[str], scale: str = "paper") -> Path:
    """:func:`probing_dir`, with the missing files downloaded; at scale paper every file must have SentEval's
    published size, at scale demo a mirror's stand-ins are accepted with a warning."""
    from ..data import senteval
    from ..data.download import MIRROR_ENV, DownloadError

    mirror, path = os.environ.get(MIRROR_ENV) or None, probing_dir(folder)
    try:
        senteval.download(senteval.parse_tasks(tasks), path, mirror=mirror,
                          require_published=scale == "paper" or not mirror)
    except DownloadError as e:
        raise SystemExit(f"error: {e}") from None
    return path


def results_dir(argv: Optional[List[str]] = None, args=None, table_id: Optional[str] = None) -> Path:
    """Where ``main(argv)`` writes its report: ``--out`` / RESULTS, else ``results/<table>``."""
    args = args or build_parser().parse_args(argv)
    return Path(args.out or REPO / "results" / (table_id or load_table(args.table).table)).resolve()


def main(argv: Optional[List[str]] = None):
    args = build_parser().parse_args(argv)
    settings = check_settings(args)  # before any work
    setup_cli_logging()
    for warning in foreign_variable_warnings(os.environ):
        print(f"[tables] warning: {warning}", flush=True)
    scale = settings["scale"]
    try:
        table = select_rows(load_table(args.table), args.rows)
        dataset = dataset_for(table, scale, args.dataset)
        if not dataset:
            raise SystemExit("error: this table names no paper dataset; pass --dataset / DATASET")
        if dataset not in RECIPES and not (Path(args.data_bin) / dataset / "prepare.json").exists():
            raise env_checks.bad("DATASET (--dataset)", dataset, f"use one of {', '.join(sorted(RECIPES))}, or the "
                                 f"name of a dataset prepared in {args.data_bin}")
    except TableSpecError as e:
        raise SystemExit(f"error: {e}")
    out = results_dir(args=args, table_id=table.table)
    n_jobs = len(table.rows) * len(settings["seeds"])
    jobs = min(settings.pop("jobs") or default_jobs(n_jobs, settings["gpus"]), n_jobs)
    allow_unverified_data = settings.pop("allow_unverified_data")
    run = RunConfig(dataset=dataset, out_dir=out / f"{dataset}-{scale}", data_bin=Path(args.data_bin).resolve(),
                    jobs=jobs, probing_tasks=table.probing,
                    probing_dir=probing_dir(args.probing_data) if table.probing else None, **settings)
    if scale == "paper":
        check_paper_data(run.data_bin / dataset, allow_unverified_data)
    if run.dry_run:
        run_table(table, run)
        raise SystemExit(0)  # also ending make figure-*
    if table.probing:
        ensure_probing_data(table.probing, args.probing_data, scale)
    if dataset in SHIPPED:  # the demo corpora ship with the repository: prepare it, or check that it is (quick when
        # it is up to date); the data preparation's own variables (DEMO_DIR, BPE_SIZE, WORK_DIR, ...) apply
        from ..data.prepare import parse_options, prepare

        prepare(parse_options([dataset, "--data-bin", str(run.data_bin)]))
    try:
        results = run_table(table, run)
    except TableInterrupted as e:  # Ctrl-C: one line per interrupted row, then the shell's status for SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C would cut the lines or the exit short
        resume = resume_command(sys.argv[1:] if argv is None else argv, os.environ)
        for line in interrupted_lines(table, run, e.jobs, resume):
            print(line, file=sys.stderr, flush=True)
        raise SystemExit(training.INTERRUPT_EXIT) from None
    summary = summarise(table, results, dataset, scale, subset=run.subsets[0])
    md = write_report(summary, out)
    print("\n" + md.read_text(encoding="utf-8"))
    print(f"written: {md}, {md.with_suffix('.json')} and {md.with_suffix('.png')}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
