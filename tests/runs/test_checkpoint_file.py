"""Bad checkpoint files and checkpoints of another dataset: one clear error each, from the evaluation and the
analysis alike (diverse_fairseq.runs.checkpoint_file), and no empty output folder left behind."""

import datetime
import json
import shutil
from pathlib import Path

import pytest
import torch

from diverse_fairseq.analyze import main as analyze
from diverse_fairseq.evaluate import main as evaluate
from diverse_fairseq.runs.checkpoint_file import read_checkpoint

pytestmark = pytest.mark.slow  # every test here uses a model trained by fairseq-train
ENV_KEYS = ("DATA_BIN", "SUBSET", "BEAM", "LENPEN", "BATCH_SIZE", "OUT", "CPU", "PRECISION")


@pytest.fixture(scope="module")
def trained(custom_model):
    """(data dir, checkpoint): the fixture corpus prepared (scripts/prepare_data.sh custom), and a tiny model trained
    one update (the session's ``custom_model``)."""
    return custom_model


def _bad_files(folder: Path, good: Path):
    """{kind: path} of files that are not usable checkpoints."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"empty": folder / "empty.pt", "garbage": folder / "garbage.pt", "truncated": folder / "truncated.pt",
             "unsafe": folder / "unsafe.pt", "plain torch": folder / "plain.pt"}
    files["empty"].write_bytes(b"")
    files["garbage"].write_bytes(bytes(range(256)) * 8)
    whole = good.read_bytes()
    files["truncated"].write_bytes(whole[: len(whole) // 2])
    torch.save({"model": {}, "cfg": {}, "when": datetime.date(2024, 1, 1)}, files["unsafe"])
    torch.save({"w": torch.zeros(3)}, files["plain torch"])
    return files


MESSAGES = {
    "empty": r"empty\.pt is truncated \(0 bytes; the file is empty\): its save or copy did not finish; use another "
             r"checkpoint of the run",
    "garbage": r"garbage\.pt is not a checkpoint \(torch cannot read it\); give a \.pt file written by fairseq-train",
    "truncated": r"truncated\.pt is truncated \([\d,]+ bytes; its zip archive has no end\)",
    "unsafe": r"unsafe\.pt is not a checkpoint \(it holds Python objects that fairseq checkpoints do not, which "
              r"loading would have to execute: .*datetime\.date",
    "plain torch": r"plain\.pt is not a checkpoint \(a torch file without fairseq's checkpoint fields",
}


@pytest.mark.parametrize("kind", list(MESSAGES))
def test_bad_files_get_one_clear_message_from_analysis_and_no_folder(trained, tmp_path, kind):
    data, good = trained
    bad = _bad_files(tmp_path / "run", good)[kind]
    with pytest.raises(SystemExit, match=MESSAGES[kind]) as info:
        analyze([str(bad), "--data", str(data), "--cpu", "--no-progress"])
    assert "weights_only=False" not in str(info.value)
    assert not (tmp_path / "run" / "analysis").exists()


@pytest.mark.parametrize("kind", ["empty", "garbage", "truncated"])
def test_bad_files_get_the_same_message_from_evaluation_before_any_output(trained, tmp_path, kind):
    data, good = trained
    bad = _bad_files(tmp_path / "run", good)[kind]
    with pytest.raises(SystemExit, match=MESSAGES[kind]):
        evaluate([str(bad), str(data), "--cpu"])
    assert not list((tmp_path / "run").glob("eval-*"))


def _other_dataset(data: Path, tmp_path: Path, extra: int) -> Path:
    """A copy of ``data`` whose joined dictionary holds ``extra`` more symbols (as another corpus would)."""
    other = tmp_path / "other"
    shutil.copytree(data, other)
    for lang in ("en", "de"):
        with open(other / f"dict.{lang}.txt", "a", encoding="utf-8") as f:
            f.writelines(f"extra{i} 1\n" for i in range(extra))
    return other


def test_a_checkpoint_of_another_dataset_names_both_dictionary_sizes(trained, tmp_path):
    data, good = trained
    rows = read_checkpoint(good)["model"]["encoder.embed_tokens.weight"].shape[0]
    other = _other_dataset(data, tmp_path, 16)
    message = rf"was trained on a dictionary of {rows:,} symbols \(en, encoder\), this dataset has {rows + 16:,} " \
              rf"\({other}/dict\.en\.txt\) \(it was trained on {data}\)"
    with pytest.raises(SystemExit, match=message):
        evaluate([str(good), str(other), "--cpu", "--out", str(tmp_path / "eval")])
    assert not (tmp_path / "eval").exists()
    with pytest.raises(SystemExit, match=message):
        analyze([str(good), "--data", str(other), "--cpu", "--no-progress", "--out", str(tmp_path / "analysis")])
    assert not (tmp_path / "analysis").exists()


def test_a_checkpoint_of_another_language_pair_is_refused(trained, tmp_path):
    data, good = trained
    other = _other_dataset(data, tmp_path, 0)
    (other / "prepare.json").write_text(json.dumps({"dataset": "other", "source_lang": "de", "target_lang": "en",
                                                    "post_process": "none"}))
    with pytest.raises(SystemExit, match=r"translates en→de, but .*other is a de→en dataset"):
        evaluate([str(good), str(other), "--cpu"])


def test_a_good_checkpoint_still_loads(trained):
    data, good = trained
    state = read_checkpoint(good)
    assert state["cfg"]["task"]["data"] == str(data) and "encoder.embed_tokens.weight" in state["model"]
