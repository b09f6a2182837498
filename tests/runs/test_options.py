"""One options layer (issue 36): every command's options and their environment variables are dataclass fields
(diverse_fairseq.runs.options), the parser generated from them, flag before variable before default, errors naming
``VAR (--flag)``; no environment read below ``main()``; one meaning of GPUS. Issue 38: a misspelled variable is
warned of before any work, and ``make data DATASET=wrong`` is refused in one line."""

import ast
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from diverse_fairseq.runs import options
from diverse_fairseq.runs.options import (
    add_options,
    flag_of,
    integer,
    misspelled_variables,
    option,
    options_of,
    resolve,
    seeds,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "diverse_fairseq"


@dataclass(frozen=True)
class Toy:
    name: str
    seeds: list = option("TOY_SEEDS", "seeds", parse=seeds, default_factory=lambda: [1])
    jobs: int = option("TOY_JOBS", "jobs", 2, integer(1))
    fast: bool = option("TOY_FAST", "fast", False, options.switch, store_true=True)


def toy(argv, env):
    import argparse

    return resolve(Toy, env, add_options(argparse.ArgumentParser(), Toy).parse_args(argv), name="t")


def test_flag_before_variable_before_default():
    assert toy([], {}) == Toy("t", [1], 2, False)
    assert toy([], {"TOY_SEEDS": "3", "TOY_JOBS": "4", "TOY_FAST": "1"}) == Toy("t", [1, 2, 3], 4, True)
    flags = ["--seeds", "2,5", "--jobs", "1", "--fast"]
    assert toy(flags, {"TOY_SEEDS": "3", "TOY_JOBS": "4"}) == Toy("t", [2, 5], 1, True)
    assert toy([], {"TOY_SEEDS": "", "TOY_JOBS": ""}) == Toy("t", [1], 2, False)  # an empty variable is unset
    assert toy(["--jobs", ""], {"TOY_JOBS": "4"}).jobs == 2  # an empty flag is the default
    assert resolve(Toy, {"TOY_JOBS": "4"}, name="t").jobs == 4  # a command without flags: variables only


def test_errors_name_the_variable_and_the_flag():
    for argv, env in (([], {"TOY_JOBS": "0"}), (["--jobs", "0"], {})):
        with pytest.raises(SystemExit, match=r"^error: TOY_JOBS \(--jobs\)='0' is not valid: use a positive integer"):
            toy(argv, env)
    with pytest.raises(SystemExit, match=r"^error: TOY_JOBS='0' is not valid"):  # scripts/train.sh: no flag
        resolve(Toy, {"TOY_JOBS": "0"}, name="t")
    with pytest.raises(SystemExit, match=r"TOY_FAST \(--fast\)='yes' is not valid: use TOY_FAST=1 to turn it on"):
        toy([], {"TOY_FAST": "yes"})


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--help"])
    assert exit.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_each_commands_parser_is_generated_from_its_fields(capsys):
    """Every option field of a command is a flag of its --help, with its variable in brackets."""
    from diverse_fairseq import evaluate, interactive_command, probing
    from diverse_fairseq.data import prepare, senteval
    from diverse_fairseq.data.progress import ProgressOptions
    from diverse_fairseq.runs.paths import DataBin
    from diverse_fairseq.tables import __main__ as tables
    from diverse_fairseq.tables import check
    from diverse_fairseq.tables.options import TableOptions

    commands = [(tables.main, ["demo"], [TableOptions]),
                (evaluate.main, ["c.pt", "d"], [DataBin, evaluate.EvalRequest]),
                (prepare.main, ["demo"], [prepare.PrepareOptions, ProgressOptions]),
                (check.main, [], [check.CheckOptions]), (senteval.main, [], [senteval.DownloadOptions]),
                (probing.main, ["c.pt"], [probing.ProbingFiles]), (interactive_command.main, ["c.pt"], [DataBin])]
    for main, argv, classes in commands:
        text = _help(main, argv, capsys)
        for f in (f for cls in classes for f in options_of(cls)):
            var = f.metadata["var"]
            assert f"{flag_of(f)} " in text and (var is None or f"[{var}]" in text), (main.__module__, f.name)
    assert "GPUS" in options.variables(TableOptions) and "--gpus" in _help(tables.main, ["demo"], capsys)


def test_train_sh_help_lists_every_variable_of_its_fields(capsys):
    from diverse_fairseq.runs.plan import TrainOptions, TrainRequest
    from diverse_fairseq.training import main as train

    assert train(["--help"]) == 0
    text = capsys.readouterr().out
    for cls in (TrainRequest, TrainOptions):
        assert all(f"  {var}: " in text for var in options.variables(cls))


def test_training_reads_every_variable_of_its_fields():
    """scripts/train.sh has no flags of its own: each of its fields is its variable (``VAR`` in the error)."""
    from diverse_fairseq.runs.plan import TrainOptions, TrainRequest
    from diverse_fairseq.training import request_from_env

    checked = [f for cls in (TrainOptions, TrainRequest) for f in options_of(cls)
               if f.metadata["parse"] not in (options.text, options.path)]
    assert len(checked) >= 16
    for f in checked:
        var = f.metadata["var"]
        with pytest.raises(SystemExit, match=rf"^error: {var}='bad value' is not valid: use "):  # NAME takes a word
            request_from_env("demo", "tiny", [], {var: "bad value"})
    request = request_from_env("demo", "tiny", [], {"SAVE_DIR": "s", "DATA_BIN": "d", "CHECKPOINTS": "c",
                                                    "MASTER_ADDR": "m", "GPUS": "2", "SEED": "3"})
    assert (request.save_dir, request.data_bin, request.options.checkpoints) == (Path("s"), Path("d"), Path("c"))
    assert (request.options.master_addr, request.gpus, request.seed) == ("m", 2, 3)


def test_commands_take_the_flag_before_the_variable():
    from diverse_fairseq.data.prepare import parse_options as prepare_options
    from diverse_fairseq.evaluate import parse_request
    from diverse_fairseq.tables.__main__ import parse_options as table_options

    env = {"SEEDS": "5", "GPUS": "1", "THREADS": "3", "MAX_UPDATE": "7", "BEAM": "9", "BPE_SIZE": "200",
           "DATA_BIN": "/env"}
    o = table_options(["demo", "--seeds", "2,4", "--gpus", "0"], env)
    assert (o.seeds, o.gpus, o.threads, o.train_options.max_update, o.data_bin) == ([2, 4], 0, 3, 7, Path("/env"))
    assert parse_request(["c.pt", "d", "--beam", "4"], env).beam == 4 and parse_request(["c.pt", "d"], env).beam == 9
    assert parse_request(["c.pt", "d"], env).data_dir == Path("/env/d")
    assert prepare_options(["demo", "--bpe-size", "100"], env).bpe_size == 100
    assert prepare_options(["demo"], env).bpe_size == 200 and prepare_options(["demo"], {}).bpe_size is None
    with pytest.raises(SystemExit, match=r"^error: GPUS \(--gpus\)='-1' is not valid: use a non-negative integer"):
        table_options(["demo", "--gpus", "-1"], env)


def test_gpus_is_one_field_for_train_sh_and_the_tables():
    """GPUS: GPUs per run; unset: every GPU visible to the process that trains (the CPU when none)."""
    from diverse_fairseq.runs.plan import TrainRequest
    from diverse_fairseq.tables.options import TableOptions

    train, table = ({f.name: f for f in fields(cls)}["gpus"] for cls in (TrainRequest, TableOptions))
    assert {k: v for k, v in train.metadata.items() if k != "parse"} == \
        {k: v for k, v in table.metadata.items() if k != "parse"}
    assert train.default is table.default is None and "every GPU visible" in table.metadata["help"]


# ------------------------------------------------------------------------ no environment below main()
#: reads or writes of os.environ outside a function named main: (file, function) -> why
ALLOWED = {
    ("significance.py", "paired_bootstrap"): "sacrebleu reads its bootstrap seed only from SACREBLEU_SEED: set for "
                                             "one test and restored (docs/architecture.md)",
}


def environment_uses(root: Path):
    """(file, enclosing function, line) of every use of os.environ, os.getenv, os.putenv and os.unsetenv (also
    imported by name) in ``root``'s Python files."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "env" not in source:  # os.environ, getenv, putenv, unsetenv (also imported by name)
            continue
        tree = ast.parse(source)
        names = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "os" for a in node.names}

        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                attribute = (isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
                             and child.value.id == "os" and child.attr in ("environ", "getenv", "putenv", "unsetenv"))
                if attribute or (isinstance(child, ast.Name) and child.id in names):
                    found.append((path.relative_to(root).as_posix(), inner, child.lineno))
                visit(child, inner)

        visit(tree, None)
    return found


def test_no_environment_below_main():
    """Only a command's main() reads (or writes) the environment; library code takes typed arguments."""
    uses = environment_uses(PACKAGE)
    below = [(file, function, line) for file, function, line in uses if function != "main"]
    unexpected = [f"{file}:{line} in {function or 'the module'}" for file, function, line in below
                  if (file, function) not in ALLOWED]
    assert not unexpected, "the environment read below main(): hand it down from main() instead"
    stale = set(ALLOWED) - {(file, function) for file, function, _ in below}
    assert not stale, f"no longer reads the environment: remove from ALLOWED {sorted(stale)}"
    assert len([u for u in uses if u[1] == "main"]) >= 8  # the scan sees the reads that are allowed


# ------------------------------------------------------------------------------ misspelled variables
def test_misspelled_variables_are_named_with_the_one_they_resemble():
    env = {"TRAIN_ARG": "--max-update 100", "BPESIZE": "2000", "MAX_UPDATES": "5", "max_update": "3", "GPU": "1",
           "SEEDS": "3", "TRAIN_ARGS": "--lr 1"}  # the last two are ours
    warnings = misspelled_variables(env)
    assert [w.split("=")[0] for w in warnings] == ["BPESIZE", "GPU", "MAX_UPDATES", "TRAIN_ARG", "max_update"]
    assert warnings[0] == ("BPESIZE='2000' is not a variable of diverse-fairseq and is ignored: did you mean "
                           "BPE_SIZE?")
    assert [w.rsplit(" ", 1)[1] for w in warnings] == ["BPE_SIZE?", "GPUS?", "MAX_UPDATE?", "TRAIN_ARGS?",
                                                       "MAX_UPDATE?"]


SYSTEM = ("PATH", "HOME", "SHELL", "TERM", "USER", "LANG", "LANGUAGE", "PWD", "OLDPWD", "SHLVL", "_", "LOGNAME",
          "HOSTNAME", "DISPLAY", "EDITOR", "PAGER", "TMPDIR", "TEMP", "TMP", "TZ", "MAIL", "COLUMNS", "LINES", "LC_ALL",
          "LC_CTYPE", "LS_COLORS", "LESSOPEN", "SSH_AUTH_SOCK", "SSH_CONNECTION", "XDG_RUNTIME_DIR",
          "XDG_SESSION_ID", "DBUS_SESSION_BUS_ADDRESS", "COLORTERM", "TERM_PROGRAM", "TMUX", "http_proxy",
          "https_proxy", "no_proxy", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "NCCL_DEBUG",
          "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "VIRTUAL_ENV",
          "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "HF_HOME", "TORCH_HOME", "MAKEFLAGS", "MAKELEVEL", "MFLAGS",
          "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "DEBIAN_FRONTEND", "CI",
          "GITHUB_ACTIONS", "GITHUB_REF", "GITHUB_SHA", "RUNNER_OS", "RUNNER_TEMP", "JAVA_HOME", "GOPATH", "EUID",
          # torchrun, in the processes it starts
          "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
          "ROLE_NAME", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
          # a real SLURM job (sbatch --nodes 2 --gres gpu:8), and SLURM's input variables
          "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES",
          "SLURM_JOB_NUM_NODES", "SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS",
          "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_ON_NODE", "SLURM_SUBMIT_DIR",
          "SLURM_SUBMIT_HOST", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS",
          "SLURM_MEM_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_ID", "SLURM_STEPID",
          "SLURM_TOPOLOGY_ADDR", "SLURMD_NODENAME", "SBATCH_PARTITION", "SBATCH_ACCOUNT", "SBATCH_TIMELIMIT",
          "SRUN_CPUS_PER_TASK", "SQUEUE_FORMAT", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES")


def test_system_variables_are_not_taken_for_misspellings():
    assert misspelled_variables(dict.fromkeys(SYSTEM, "x")) == []
    assert not misspelled_variables(dict.fromkeys(options.our_variables(), "x"))


def test_commands_warn_of_a_misspelled_variable_before_any_work(monkeypatch, capsys, tmp_path):
    from diverse_fairseq.data.prepare import main as prepare
    from diverse_fairseq.training import main as train

    monkeypatch.setenv("TRAIN_ARG", "--max-update 100")
    monkeypatch.setenv("CHECKPOINTS", str(tmp_path / "ck"))
    assert train(["--help"]) == 0
    # TRAIN_ARGS is the table runner's: the warning says what scripts/train.sh reads instead
    assert ("[train] warning: TRAIN_ARG='--max-update 100' is not a variable of diverse-fairseq and is ignored: did "
            "you mean TRAIN_ARGS? (TRAIN_ARGS is not read by this command either: use extra fairseq-train options "
            "after the setting on the command line (TRAIN_ARGS is the table runner's))") in capsys.readouterr().out
    monkeypatch.setenv("BPESIZE", "2000")
    with pytest.raises(SystemExit):
        prepare(["wrong"])
    assert "[prepare] warning: BPESIZE='2000' is not a variable of diverse-fairseq and is ignored: did you mean " \
           "BPE_SIZE?" in capsys.readouterr().out
    assert not (tmp_path / "ck").exists()


def test_our_variables_are_the_fields_and_the_scripts():
    """The variables the misspelling check knows: every class with option fields in the package, and every variable
    the shell scripts and the Makefile read from the environment."""
    classes = set()
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)) if "option(" in source else ():
            body = node.body if isinstance(node, ast.ClassDef) else []
            calls = [s.value.func for s in body if isinstance(s, ast.AnnAssign) and isinstance(s.value, ast.Call)]
            if any(isinstance(c, ast.Name) and c.id.endswith("option") for c in calls):
                classes.add(node.name)
    assert classes == {cls.__name__ for cls in options.option_classes()}
    ours = options.our_variables()
    read = {m for path in (REPO / "scripts").glob("*.sh") for m in re.findall(r"\$\{([A-Z]\w*):-", path.read_text())}
    makefile = (REPO / "Makefile").read_text()
    internal = set(re.findall(r"^(\w+) *:?=", makefile, re.M))  # VAR := ... (VAR ?= ... is the user's)
    used = set(re.findall(r"\$\(([A-Z]\w*)\)", makefile)) - internal
    used |= set(re.findall(r"^(\w+) *\?=", makefile, re.M))
    assert {"PYTHON", "VENV", "DEMO_OUT", "SETTING", "N"} <= read | used
    assert read | used <= ours, (read | used) - ours


# ------------------------------------------------------------------------------- make data DATASET=wrong
def test_a_wrong_dataset_is_refused_in_one_line(capsys):
    from diverse_fairseq.data.prepare import DATASETS
    from diverse_fairseq.data.prepare import main as prepare

    with pytest.raises(SystemExit) as err:
        prepare(["wrong"])
    message = str(err.value.code)  # a text: exit status 1
    assert message.startswith("error: unknown dataset 'wrong': use one of ") and "\n" not in message
    assert all(name in message for name in DATASETS) and "custom" in DATASETS
    assert capsys.readouterr().err == ""  # no usage lines
    assert "bash scripts/prepare_data.sh $(DATASET)" in (REPO / "Makefile").read_text()
    assert 'exec "$PY" -m diverse_fairseq.data.prepare "$@"' in (REPO / "scripts" / "prepare_data.sh").read_text()


def test_dry_run_is_refused_by_data_preparation_before_any_work(monkeypatch, tmp_path):
    """DRY_RUN is train.sh's and the table runner's: preparing data has no dry run, and would otherwise do the real
    work (a newcomer's DRY_RUN=1 scripts/prepare_data.sh replaced prepared data)."""
    from diverse_fairseq.data.prepare import main as prepare

    monkeypatch.setenv("DRY_RUN", "1")
    with pytest.raises(SystemExit) as refused:
        prepare(["demo", "--data-bin", str(tmp_path / "data-bin"), "--work-dir", str(tmp_path / "work")])
    assert "error: DRY_RUN is set, but preparing data has no dry run" in str(refused.value.code)
    assert not (tmp_path / "data-bin").exists() and not (tmp_path / "work").exists()
