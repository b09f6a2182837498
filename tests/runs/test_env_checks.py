"""Every environment variable the entry points read is validated before any work, with an error naming the
variable, the bad value and the accepted values (diverse_fairseq.runs.env_checks, shared by training, data
preparation, evaluation and the table runner; the runner's own cases are in test_tables.py)."""

from pathlib import Path

import pytest
from conftest import fake_prepared

from diverse_fairseq.data.prepare import main as prepare
from diverse_fairseq.evaluate import main as evaluate
from diverse_fairseq.runs import env_checks
from diverse_fairseq.training import main as training_main
from diverse_fairseq.training import request_from_env

REPO = Path(__file__).resolve().parents[2]


def test_helpers():
    assert env_checks.parse_int("N", " 3 ", 1) == 3 and env_checks.parse_int("N", "-2", -5) == -2
    assert env_checks.parse_float("X", "0.6") == 0.6 and env_checks.parse_flag("F", "") is False
    assert env_checks.parse_seeds("SEEDS", "3") == [1, 2, 3] and env_checks.parse_choice("C", "a", ("a", "b")) == "a"
    with pytest.raises(SystemExit, match=r"N='70000' is not valid: use an integer from 1 to 65535"):
        env_checks.parse_int("N", "70000", 1, 65535)
    with pytest.raises(SystemExit, match=r"X='nan' is not valid: use a finite number"):
        env_checks.parse_float("X", "nan")
    with pytest.raises(SystemExit, match=r"C='A' is not valid: use C=a or C=b \(exactly, lower case\)"):
        env_checks.parse_choice("C", "A", ("a", "b"))


@pytest.fixture
def data_bin(tmp_path):
    return fake_prepared(tmp_path / "data-bin", "demo")


@pytest.mark.parametrize("name,value,message", [
    ("MAX_TOKENS", "4k", "use a positive integer"), ("UPDATE_FREQ", "0", "use a positive integer"),
    ("MAX_UPDATE", "1e5", "use a positive integer"), ("AVERAGE", "-1", "use a non-negative integer"),
    ("SEED", "one", "use a non-negative integer"), ("PRECISION", "FP16", "use PRECISION=fp16, PRECISION=bf16"),
    ("NNODES", "0", "use a positive integer"), ("MASTER_PORT", "99999", "from 1 to 65535"),
    ("DRY_RUN", "yes", "use DRY_RUN=1 to turn it on"), ("SLURM_NNODES", "two", "use a positive integer"),
])
def test_training_refuses_a_bad_variable(data_bin, name, value, message):
    with pytest.raises(SystemExit, match=rf"{name}='{value}' is not valid: .*{message}"):
        request_from_env("demo", "tiny", [], env={"DATA_BIN": str(data_bin), name: value}, gpus=0)


def test_training_node_rank_must_be_below_the_node_count(data_bin):
    with pytest.raises(SystemExit, match=r"NODE_RANK='2' is not valid: use an integer from 0 to 1"):
        request_from_env("demo", "tiny", [], env={"DATA_BIN": str(data_bin), "NNODES": "2", "NODE_RANK": "2"}, gpus=1)


def test_train_sh_refuses_a_bad_variable(data_bin, tmp_path, monkeypatch):
    """scripts/train.sh execs ``python -m diverse_fairseq.training "$@"``: that main, in this process, with the
    variables in its environment (train.sh itself refuses for real in test_save_dir's
    test_train_sh_refuses_before_training)."""
    assert 'exec "$PY" -m diverse_fairseq.training "$@"' in (REPO / "scripts" / "train.sh").read_text()
    for name, value in (("DATA_BIN", str(data_bin)), ("CHECKPOINTS", str(tmp_path / "ck")), ("MAX_UPDATE", "lots"),
                        ("CUDA_VISIBLE_DEVICES", "")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=r"MAX_UPDATE='lots' is not valid: use a positive integer"):
        training_main(["demo", "tiny"])
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("name,value,message", [
    ("WORKERS", "two", "WORKERS (--workers)='two' is not valid: use a positive integer"),
    ("WORKERS", "0", "WORKERS (--workers)='0'"),
    ("BPE", "bpe", "BPE (--bpe)='bpe' is not valid: use BPE=subword-nmt or BPE=sentencepiece"),
    ("BPE_SIZE", "8k", "BPE_SIZE (--bpe-size)='8k' is not valid"),
    ("ZH_SEG", "pkuseg", "use ZH_SEG=jieba or ZH_SEG=char"),
    ("CWMT", "yes", "CWMT (--skip-cwmt)='yes' is not valid: use CWMT=skip"),
    ("ALLOW_UNVERIFIED", "yes", "ALLOW_UNVERIFIED (--allow-unverified)='yes' is not valid: use ALLOW_UNVERIFIED=1"),
    ("STOP_AFTER", "tokenise", "STOP_AFTER (--stop-after)='tokenise' is not valid: use STOP_AFTER=collect, "
                               "STOP_AFTER=normalize, STOP_AFTER=tokenize"),
])
def test_prepare_refuses_a_bad_variable(monkeypatch, tmp_path, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as err:
        prepare(["demo", "--work-dir", str(tmp_path / "work"), "--data-bin", str(tmp_path / "bin")])
    assert message in str(err.value)
    assert not (tmp_path / "work").exists() and not (tmp_path / "bin").exists()  # refused before any work


@pytest.mark.parametrize("name,value,message", [
    ("BEAM", "0", "BEAM (--beam)='0' is not valid: use a positive integer"),
    ("LENPEN", "long", "LENPEN (--lenpen)='long' is not valid: use a finite number"),
    ("BATCH_SIZE", "-4", "BATCH_SIZE (--batch-size)='-4'"), ("SUBSET", "dev", "use SUBSET=test or SUBSET=valid"),
    ("CPU", "true", "CPU (--cpu)='true' is not valid: use CPU=1"),
    ("PRECISION", "half", "PRECISION (--precision)='half' is not valid"),
])
def test_evaluate_refuses_a_bad_variable(monkeypatch, tmp_path, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as err:
        evaluate([str(tmp_path / "missing.pt"), "demo", "--out", str(tmp_path / "out")])
    assert message in str(err.value) and not (tmp_path / "out").exists()


def test_evaluate_refuses_several_checkpoints(tmp_path):
    with pytest.raises(SystemExit, match="is a checkpoint, not a dataset: name one checkpoint"):
        evaluate([str(tmp_path / "a" / "checkpoint_last.pt"), str(tmp_path / "b" / "checkpoint_last.pt"), "demo"])
