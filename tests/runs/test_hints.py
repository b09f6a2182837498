"""Every hint names a command that runs as printed (diverse_fairseq/runs/hints.py): the preparation of a dataset that
training or evaluation cannot find (the user's own corpus with its own languages, a recipe), the evaluation named
after training, and the commands that need the project's Python. Each printed command is run as a shell would run
it, in this process (:func:`run_printed`: its variables set, the module that the script or ``python -m`` starts
called with its arguments); evaluate's translate hint runs outside the virtual environment in
tests/test_interactive_command.py."""

import importlib
import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import CUSTOM_CORPUS, REPO, fake_prepared

from diverse_fairseq import evaluate, training
from diverse_fairseq.data.senteval import BY_NAME, read_task
from diverse_fairseq.runs import hints, paths

ENV_KEYS = ("DATA_BIN", "WORK_DIR", "SRC", "TGT", "CORPUS_DIR", "DATASET_NAME", "STOP_AFTER", "BPE", "BPE_SIZE",
            "SEPARATE_VOCAB", "DEMO_DIR", "SAVE_DIR", "NAME", "MAX_UPDATE", "GPUS", "DRY_RUN", "SUBSET", "OUT")
DEMO_TEXT = REPO / "tests" / "fixtures" / "demo_text"


def run_printed(command: str, monkeypatch, call: str = "main"):
    """``VAR=value ... scripts/<tool>.sh ARGS`` or ``<python> -m <module> ARGS``, as a shell in the current folder
    runs it: the variables set, the script found (it must ``exec "$PY" -m <module> "$@"``) or the interpreter
    checked to be this one, then ``<module>.<call>(ARGS)`` in this process (another function than ``main`` also
    gets the environment); its result."""
    words = shlex.split(command)
    while re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(name, value)
    program = Path.cwd() / words[0]
    if program.suffix == ".sh":
        module, args = re.search(r'exec "\$PY" -m (\S+) "\$@"', program.read_text())[1], words[1:]
    else:
        assert program.samefile(sys.executable) and words[1] == "-m", words[:2]
        module, args = words[2], words[3:]
    function = getattr(importlib.import_module(module), call)
    return function(args) if call == "main" else function(args, dict(os.environ))


def refusal(function, *args) -> str:
    with pytest.raises(SystemExit) as refused:
        function(*args)
    return str(refused.value)


def test_a_missing_custom_dataset_names_its_own_preparation_which_runs(tmp_path, monkeypatch, capsys):
    """``scripts/train.sh custom_de_en tiny``, without a setting, and ``scripts/evaluate.sh ... custom_de_en`` on
    data not prepared yet name ``SRC=de TGT=en CORPUS_DIR=... scripts/prepare_data.sh custom`` (not the
    ``scripts/prepare_data.sh custom_de_en`` that prepare_data refuses); run with the corpus folder, it prepares
    exactly the missing folder. Another name gets DATASET_NAME and the language placeholders explained."""
    data_bin = tmp_path / "data-bin"
    monkeypatch.setenv("DATA_BIN", str(data_bin))
    monkeypatch.setattr(training, "visible_gpus", lambda: 0)
    messages = [refusal(training.main, ["custom_de_en", "tiny"]), refusal(training.main, ["custom_de_en"]),
                refusal(evaluate.main, [str(tmp_path / "checkpoint_last.pt"), "custom_de_en"])]
    printed = f"DATA_BIN={data_bin} SRC=de TGT=en CORPUS_DIR=/path/to/corpus scripts/prepare_data.sh custom"
    for message in messages:
        assert "prepare the data first" in message and printed in message, message
        assert "replace /path/to/corpus by your corpus folder: it holds train.de train.en valid.de" in message
    monkeypatch.setenv("WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("STOP_AFTER", "collect")  # the corpus is read and checked; the rest is the fixtures' work
    run_printed(printed.replace("/path/to/corpus", str(CUSTOM_CORPUS)), monkeypatch)
    out = capsys.readouterr().out
    assert "[custom_de_en] de->en, " in out and f", output {data_bin / 'custom_de_en'}\n" in out

    message = refusal(training.main, ["mine", "tiny"])
    printed = re.search(r"DATA_BIN=\S+ SRC=SRC_LANG .*scripts/prepare_data.sh custom", message)[0]
    assert "DATASET_NAME=mine" in printed and "SRC_LANG, TGT_LANG by the language codes" in message
    run_printed(printed.replace("/path/to/corpus", str(CUSTOM_CORPUS)).replace("SRC_LANG", "en")
                .replace("TGT_LANG", "de"), monkeypatch)
    assert f", output {data_bin / 'mine'}\n" in capsys.readouterr().out


def test_a_missing_recipe_dataset_names_its_preparation_which_runs(tmp_path, monkeypatch, capsys):
    data_bin = tmp_path / "data-bin"
    monkeypatch.setenv("DATA_BIN", str(data_bin))
    message = refusal(training.main, ["demo", "tiny"])
    printed = f"DATA_BIN={data_bin} scripts/prepare_data.sh demo"
    assert message.endswith(f"prepare the data first: {printed}")
    for name, value in (("WORK_DIR", tmp_path / "work"), ("DEMO_DIR", DEMO_TEXT), ("STOP_AFTER", "collect")):
        monkeypatch.setenv(name, str(value))
    run_printed(printed, monkeypatch)
    assert f", output {data_bin / 'demo'}\n" in capsys.readouterr().out
    # the default folder needs no variable: the scripts use it when DATA_BIN is unset
    assert hints.prepare_command(paths.DATA_BIN / "custom_en_de").startswith("SRC=en TGT=de CORPUS_DIR=")


def test_the_evaluation_named_after_training_finds_the_data(tmp_path, monkeypatch, capsys):
    """``DATA_BIN=elsewhere scripts/train.sh demo tiny`` names ``DATA_BIN=elsewhere scripts/evaluate.sh ...``: without
    the variable the evaluation would look for the data in data-bin/."""
    data_bin = fake_prepared(tmp_path / "elsewhere", "demo")
    monkeypatch.setenv("DATA_BIN", str(data_bin))
    monkeypatch.setenv("DRY_RUN", "1")
    monkeypatch.setattr(training, "visible_gpus", lambda: 0)
    assert training.main(["demo", "tiny"]) == 0
    printed = re.search(r"evaluate with: (.+)", capsys.readouterr().out)[1]
    monkeypatch.delenv("DATA_BIN")
    request = run_printed(printed, monkeypatch, call="parse_request")
    assert request.data_dir == data_bin / "demo" and request.checkpoint.name == "checkpoint_last.pt"
    assert request.checkpoint.parent.parent == paths.CHECKPOINTS


def test_commands_that_need_the_projects_python_name_it(tmp_path, monkeypatch):
    """pip and ``python -m`` hints start with this interpreter's path (the venv's), whose modules they name: a shell
    outside the venv has no ``python`` with torch, or none at all (test_interactive_command.py runs the translate
    hint in such a shell)."""
    monkeypatch.chdir(REPO)
    for command in (hints.pip_command("jieba"), hints.pip_command("-e", hints.repository_extra("tensorboard")),
                    hints.translate_command("c.pt", "data-bin/demo")):
        program, *rest = shlex.split(command)
        assert Path(program).samefile(sys.executable) and rest[0] == "-m", command
        assert importlib.util.find_spec(rest[1]) is not None
    tensorboard = hints.pip_command("-e", hints.repository_extra("tensorboard"))
    assert tensorboard.endswith(" -m pip install -e '.[tensorboard]'")
    message = refusal(read_task, BY_NAME["sentlen"], tmp_path)
    printed = re.search(r"Download it with `([^`]+)`", message)[1]
    assert shlex.split(printed)[1:] == ["-m", "diverse_fairseq.data.senteval", "--dest", str(tmp_path), "--tasks",
                                        "SentLen"] and Path(shlex.split(printed)[0]).samefile(sys.executable)
