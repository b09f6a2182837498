"""The fairseq-interactive command printed for a checkpoint segments raw input exactly as the data preparation
segmented the dataset, on both recipes (subword-nmt after Moses tokenization, and sentencepiece): the fixture
corpus prepared, a tiny model trained one update, the printed command parsed by fairseq and run. The commands run
as printed outside the virtual environment (a shell whose PATH has no ``python`` with this project): evaluate's
translate hint, then the fairseq-interactive command it prints."""

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CUSTOM_CORPUS as CORPUS
from conftest import lines, one_update_model
from fairseq_in_process import fairseq_interactive

from diverse_fairseq.data.prepare import main as prepare
from diverse_fairseq.interactive_command import main as interactive_command
from diverse_fairseq.runs.hints import translate_command

pytestmark = pytest.mark.slow  # every test here uses a model trained by fairseq-train
REPO = Path(__file__).resolve().parents[1]
ENV_KEYS = ("BPE", "BPE_SIZE", "WORK_DIR", "DATA_BIN", "WORKERS", "SRC", "TGT", "CORPUS_DIR", "DATASET_NAME",
            "SEPARATE_VOCAB", "PROGRESS_INTERVAL", "STOP_AFTER")
RECIPES = {"subword-nmt": "200", "sentencepiece": "300"}  # BPE and BPE_SIZE


@pytest.fixture(scope="module")
def trained(tmp_path_factory, custom_model):
    """{bpe: (dataset folder, checkpoint)}: the fixture corpus prepared with each segmentation, and a tiny model
    trained one update on it (subword-nmt: the session's ``custom_model``, on the corpus as scripts/prepare_data.sh
    custom prepares it with these settings)."""
    data, checkpoint = custom_model
    meta = json.loads((data / "prepare.json").read_text())
    assert (meta["bpe"], meta["bpe_size"]) == ("subword-nmt", int(RECIPES["subword-nmt"]))
    out = {"subword-nmt": (data, checkpoint)}
    for bpe, size in RECIPES.items():
        if bpe in out:
            continue
        root = tmp_path_factory.mktemp(bpe)
        prepare(["custom", "--src", "en", "--tgt", "de", "--corpus-dir", str(CORPUS), "--work-dir", str(root / "work"),
                 "--data-bin", str(root / "data-bin"), "--bpe", bpe, "--bpe-size", size, "--workers", "1"])
        data = root / "data-bin" / "custom_en_de"
        out[bpe] = data, one_update_model(data, root / "run")
    return out


def printed_command(checkpoint, *dataset):
    """The command line that ``diverse_fairseq.interactive_command``'s main prints (called here), split into
    arguments."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert interactive_command([str(checkpoint), *dataset]) == 0
    return shlex.split(out.getvalue())


#: a shell outside the virtual environment: no VIRTUAL_ENV, no PYTHONPATH, a PATH without the project's Python
OUTSIDE_THE_VENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1"}


def run_as_printed(command: str, stdin=None) -> str:
    """The output of the shell line ``command`` run from the repository root outside the virtual environment."""
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, env=OUTSIDE_THE_VENV, input=stdin, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc.stdout


def fairseq_args(cmd):
    """The fairseq-interactive arguments of a printed command (after ``<python> -m fairseq_cli.interactive``)."""
    assert cmd[1:3] == ["-m", "fairseq_cli.interactive"] and (REPO / cmd[0]).samefile(sys.executable), cmd[:3]
    return cmd[3:]


def encoder(cmd):
    """fairseq's own reading of ``cmd``: its task (with the dataset's test split loaded) and the function that
    fairseq-interactive applies to every input line (tokenizer, then BPE)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_interactive_generation_parser(), input_args=fairseq_args(cmd))
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("test")
    tokenizer, bpe = task.build_tokenizer(cfg.tokenizer), task.build_bpe(cfg.bpe)

    def encode(line):
        if tokenizer is not None:
            line = tokenizer.encode(line)
        return bpe.encode(line) if bpe is not None else line
    return task, encode


@pytest.mark.parametrize("bpe", list(RECIPES))
def test_the_printed_command_segments_input_as_the_data_preparation_did(trained, bpe):
    data, checkpoint = trained[bpe]
    cmd = printed_command(checkpoint)  # the dataset is the one stored in the checkpoint
    assert fairseq_args(cmd)[0] == str(data) and cmd == printed_command(checkpoint, str(data))
    task, encode = encoder(cmd)
    test, dictionary = task.dataset("test"), task.source_dictionary
    raw = lines(CORPUS / "test.en")
    # the symbols fairseq-interactive gives the model (its encode_line of the encoded input) are the prepared ones
    prepared = [test.src[i].tolist() for i in range(len(test))]
    assert [dictionary.encode_line(encode(line), add_if_not_exist=False).tolist() for line in raw] == prepared
    prepared = [dictionary.string(test.src[i]) for i in range(len(test))]  # as text, unknown pieces as <unk>
    if bpe == "subword-nmt":
        assert cmd[cmd.index("--tokenizer") + 1] == "moses" and "--moses-no-dash-splits" in cmd
        # the mistake this command prevents: BPE without the tokenizer sees "file:" as one word
        assert encode("file:").replace("@@ ", "") == "file :"
        no_moses = [a for a in cmd if a not in ("--tokenizer", "moses", "--moses-no-dash-splits")]
        _, bpe_only = encoder(no_moses)
        assert bpe_only("file:").replace("@@ ", "") == "file:"
        assert sum(dictionary.string(dictionary.encode_line(bpe_only(line), add_if_not_exist=False)) != piece
                   for line, piece in zip(raw, prepared)) >= 8
    else:
        assert "--tokenizer" not in cmd and cmd[cmd.index("--sentencepiece-model") + 1] == str(data / "spm.model")


@pytest.mark.parametrize("bpe", list(RECIPES))
def test_the_printed_command_runs_and_reads_input_as_prepared(trained, bpe, tmp_path):
    """subword-nmt: evaluate's translate hint run as printed outside the virtual environment, then the command it
    prints (input on stdin); sentencepiece: fairseq-interactive's main called in this process on the printed
    command's arguments (input from a file; a new process would import fairseq)."""
    data, checkpoint = trained[bpe]
    cmd = printed_command(checkpoint)
    raw = lines(CORPUS / "test.en")[:6]
    if bpe == "subword-nmt":
        printed = run_as_printed(translate_command(checkpoint, data))  # what evaluate prints last
        assert shlex.split(printed) == cmd
        out = run_as_printed(printed.strip() + " --beam 1 --max-len-b 3 --cpu", stdin="\n".join(raw) + "\n")
    else:
        (tmp_path / "input.txt").write_text("\n".join(raw) + "\n", encoding="utf-8")
        out = fairseq_interactive([*fairseq_args(cmd), "--beam", "1", "--max-len-b", "3", "--cpu",
                                   "--input", tmp_path / "input.txt"])
    task, encode = encoder(cmd)
    shown = {int(k[2:]): v
             for k, v in (line.split("\t", 1) for line in out.splitlines() if line.startswith("S-"))}
    dictionary = task.source_dictionary
    assert shown == {i: dictionary.string(dictionary.encode_line(encode(line), add_if_not_exist=False))
                     for i, line in enumerate(raw)}
    test = task.dataset("test")
    assert list(shown.values()) == [dictionary.string(test.src[i]) for i in range(len(raw))]
    assert sum(line.startswith("D-") for line in out.splitlines()) == len(raw)  # a detokenized output each


def test_a_checkpoint_is_refused_for_another_dataset(trained):
    (_, ckpt_a), (data_b, _) = trained["subword-nmt"], trained["sentencepiece"]
    with pytest.raises(SystemExit, match=r"was trained on a dictionary of [\d,]+ symbols \(en, encoder\), this dataset "
                                         r"has [\d,]+"):
        interactive_command([str(ckpt_a), str(data_b)])
