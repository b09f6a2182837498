"""``python -m diverse_fairseq.tables TABLE [--dataset D] [--scale demo|paper] [--seeds 1,2] [--gpus N]
[--threads N] [--jobs N] [--rows a,b] [--subsets valid,test] [--train-hook SCRIPT] [--dry-run 1] [...]`` (``--help``
lists every option).

TABLE is a table of ``configs/tables/`` or any table YAML, such as the diagnosis experiments of
``configs/experiments/`` (docs/demo-findings.md).

Every option defaults to an environment variable (in brackets), as the make targets pass them. The values
are checked before any work starts; a bad one stops the run with a message naming the variable.
"""

import argparse
import os
import shlex
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import List, Mapping, Optional

from .. import training
from ..data.recipes import RECIPES
from ..data.recipes.demo import SHIPPED
from ..runs import env_checks, options
from ..runs.cli_logging import setup_cli_logging
from ..runs.dataset_meta import DatasetMeta, load_dataset_meta
from ..runs.hints import python_command
from ..runs.options import warn_misspelled
from .check import dataset_for
from .config import RunConfig
from .options import TableOptions, check_gpus
from .report import summarise, write_report
from .runner import TableInterrupted, interrupted_lines, run_table
from .slurm import SlurmOptions, check_cluster
from .spec import REPO, TableSpecError, load_table

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m diverse_fairseq.tables", description=__doc__)
    p.add_argument("table", help="a table id from configs/tables/ (e.g. demo, emnlp18_t1) or a YAML path")
    return options.add_options(p, TableOptions, SlurmOptions)


def parse_options(argv: Optional[List[str]], env: Mapping[str, str]) -> TableOptions:
    """The checked :class:`TableOptions` of a command line and the environment (SystemExit naming the first bad
    variable, before any work)."""
    args = build_parser().parse_args(argv)
    table_options = options.resolve(TableOptions, env, args, table=args.table)  # its own variables' errors first
    return replace(table_options, slurm=options.resolve(SlurmOptions, env, args),
                   train_options=training.options_from_env(env))


def slurm_variable_warnings(launcher: str, env) -> List[str]:
    """Warnings for the variables of the other launcher set in ``env``: LAUNCHER=slurm's when the jobs run on this
    machine, ``JOBS`` (the local worker pool's) when each is a SLURM job."""
    theirs = ["JOBS"] if launcher == "slurm" else options.variables(SlurmOptions)
    given = [v for v in theirs if env_checks.get(env, v) is not None]
    other = "local" if launcher == "slurm" else "slurm"
    return [f"{', '.join(given)}: LAUNCHER={other}'s, ignored by LAUNCHER={launcher}"] if given else []


def foreign_variable_warnings(env) -> List[str]:
    """Warnings for variables set in ``env`` that belong to ``scripts/train.sh`` or ``scripts/evaluate.sh``."""
    return env_checks.foreign_variables(env, FOREIGN_VARIABLES, "the table runner (ignored)")


def default_jobs(jobs: int, gpus: Optional[int]) -> int:
    """``JOBS`` unset: one job per CPU core (at most ``jobs``), or 1 when the jobs use GPUs (``gpus`` None: every
    visible GPU)."""
    if (training.visible_gpus() if gpus is None else gpus) > 0:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, jobs))


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


#: the variables the runner reads: its options', and scripts/train.sh's launch variables for every row
RUNNER_VARIABLES = (*(v for v in options.variables(TableOptions) if v != "DRY_RUN"), *options.variables(SlurmOptions),
                    "MAX_TOKENS", "UPDATE_FREQ", "MAX_UPDATE", "AVERAGE", "PRECISION", "EMBEDDINGS", "RESUME_ANYWAY")


def resume_command(argv: List[str], env) -> str:
    """The command that continues an interrupted table: this one, with the runner's variables that are set
    (``make table-<id> VAR=...`` when only the table is named, ``make demo DATASET=...`` for the Makefile's demo
    target's command); otherwise this Python (the project's, by its path) with the same arguments."""
    variables = {name: env[name] for name in RUNNER_VARIABLES if env_checks.get(env, name) is not None}
    if argv[:2] == ["demo", "--dataset"] and len(argv) == 3:  # make demo [DATASET=...]
        variables = {"DATASET": argv[2], **{k: v for k, v in variables.items() if k != "DATASET"}}
        argv = ["demo"]
    if len(argv) == 1 and not argv[0].startswith("-") and "/" not in argv[0] and not argv[0].endswith(".yaml"):
        target = "demo" if argv[0] == "demo" else f"table-{argv[0]}"  # the Makefile's targets
        return shlex.join(["make", target, *(f"{k}={v}" for k, v in variables.items())])
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in variables.items())
    return prefix + python_command("diverse_fairseq.tables", *argv)


def data_problems(meta: DatasetMeta) -> List[str]:
    """Why a prepared dataset (its prepare.json) is not the published data, in words; empty when it is."""
    recipe = RECIPES.get(meta.dataset)
    return meta.problems(records_corpora=recipe is not None and bool(recipe.corpora_file))


def check_paper_data(data: Path, allow: bool):
    """Refuse data prepared from other than the published corpora unless ALLOW_UNVERIFIED_DATA=1."""
    # not prepared yet: the runner says how to prepare it
    what = "; ".join(data_problems(load_dataset_meta(data)) if (data / "prepare.json").is_file() else [])
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


def probing_dir(folder: Optional[Path], mirror: Optional[str]) -> Path:
    """Where the SentEval probing files are: ``folder`` (PROBING_DATA), else the default (a mirror's own with a
    mirror)."""
    from ..data import senteval

    return (Path(folder) if folder else senteval.default_dir(mirror)).resolve()


def ensure_probing_data(tasks: List[str], folder: Optional[Path], scale: str = "paper",
                        mirror: Optional[str] = None) -> Path:
    """:func:`probing_dir`, with the missing files downloaded (from ``mirror`` where given); at scale paper every
    file must have SentEval's published size, at scale demo a mirror's stand-ins are accepted with a warning."""
    from ..data import senteval
    from ..data.download import DownloadError

    path = probing_dir(folder, mirror)
    try:
        senteval.download(senteval.parse_tasks(tasks), path, mirror=mirror,
                          require_published=scale == "paper" or not mirror)
    except DownloadError as e:
        raise SystemExit(f"error: {e}") from None
    return path


def results_dir(options: TableOptions, table_id: str) -> Path:
    """Where :func:`main` writes its report: ``--out`` / RESULTS, else ``results/<table>``."""
    return Path(options.out or REPO / "results" / table_id).resolve()


def main(argv: Optional[List[str]] = None):
    env = dict(os.environ)  # this machine's environment, read once and handed down (to the jobs too)
    warn_misspelled(env, "tables")
    o = parse_options(argv, env)  # every option checked before any work
    check_gpus(o, env)
    slurm = o.launcher == "slurm" and not o.dry_run
    if slurm:
        check_cluster()
    setup_cli_logging()
    for warning in foreign_variable_warnings(env) + slurm_variable_warnings(o.launcher, env):
        print(f"[tables] warning: {warning}", flush=True)
    scale = o.scale
    try:
        table = select_rows(load_table(o.table), o.rows)
        dataset = dataset_for(table, scale, o.dataset)
        if not dataset:
            raise SystemExit("error: this table names no paper dataset; pass --dataset / DATASET")
        if dataset not in RECIPES and not (o.data_bin / dataset / "prepare.json").exists():
            raise env_checks.bad("DATASET (--dataset)", dataset, f"use one of {', '.join(sorted(RECIPES))}, or the "
                                 f"name of a dataset prepared in {o.data_bin}")
    except TableSpecError as e:
        raise SystemExit(f"error: {e}")
    out = results_dir(o, table.table)
    n_jobs = len(table.rows) * len(o.seeds)
    resume = resume_command(sys.argv[1:] if argv is None else argv, env)
    run = RunConfig(dataset=dataset, scale=scale, seeds=o.seeds, gpus=o.gpus, out_dir=out / f"{dataset}-{scale}",
                    data_bin=o.data_bin.resolve(), train_args=o.train_args, generate_args=o.generate_args,
                    threads=o.threads, jobs=min(o.jobs or default_jobs(n_jobs, o.gpus), n_jobs),
                    progress_interval=o.progress_interval, probing_tasks=table.probing, rerun=f"run {resume}",
                    probing_dir=probing_dir(o.probing_data, o.mirror) if table.probing else None, dry_run=o.dry_run,
                    train_hook=o.train_hook, subsets=o.subsets, slurm=o.slurm if slurm else None,
                    # over NODES nodes, fairseq's world size and the update frequency count every node's GPUs
                    train_options=replace(o.train_options, slurm_nnodes=o.slurm.nodes) if slurm else o.train_options)
    if scale == "paper":
        check_paper_data(run.data_bin / dataset, o.allow_unverified_data)
    if run.dry_run:
        run_table(table, run, env)
        raise SystemExit(0)  # also ending make figure-*
    if table.probing:
        ensure_probing_data(table.probing, o.probing_data, scale, o.mirror)
    if dataset in SHIPPED:  # the demo corpora ship with the repository: prepare it, or check that it is (quick when
        # it is up to date); the data preparation's own variables (DEMO_DIR, BPE_SIZE, WORK_DIR, ...) apply
        from ..data import prepare

        prepare.prepare(prepare.parse_options([dataset, "--data-bin", str(run.data_bin)], env))
    try:
        results = run_table(table, run, env)
    except TableInterrupted as e:  # Ctrl-C: one line per interrupted row, then the shell's status for SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C would cut the lines or the exit short
        for line in interrupted_lines(e.jobs, resume):
            print(line, file=sys.stderr, flush=True)
        raise SystemExit(training.INTERRUPT_EXIT) from None
    summary = summarise(table, results, dataset, scale, subset=run.subsets[0])
    md = write_report(summary, out)
    print("\n" + md.read_text(encoding="utf-8"))
    print(f"written: {md}, {md.with_suffix('.json')} and {md.with_suffix('.png')}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
