"""A run planned once (issue 31): the default folders, prepare.json's one default per field, the checkpoint to
evaluate decided by the plan alone, and the evaluation's cache key covering everything that changes decoding."""

import json
from pathlib import Path

import pytest
from conftest import fake_prepared

from diverse_fairseq.evaluate import EvalRequest
from diverse_fairseq.runs import paths
from diverse_fairseq.runs.dataset_meta import load_dataset_meta
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.training import request_from_env

REPO = Path(__file__).resolve().parents[2]


def test_default_folders_are_the_repositorys_whatever_the_current_directory(tmp_path, monkeypatch):
    """The shell scripts default to the repository's data-bin/, checkpoints/ and work/; so does Python."""
    from diverse_fairseq.data.prepare import parse_options
    from diverse_fairseq.evaluate import parse_request
    from diverse_fairseq.runs.options import resolve

    monkeypatch.chdir(tmp_path)
    request = request_from_env("demo", "tiny", [], env={}, gpus=0)
    assert request.data_bin == REPO / "data-bin" and request.options.checkpoints == REPO / "checkpoints"
    assert parse_request(["a.pt", "demo"], {}).data_dir == REPO / "data-bin" / "demo"
    prepared = parse_options(["demo"], {})  # an option neither given nor in the environment: the field's default
    assert Path(prepared.data_bin) == REPO / "data-bin" and Path(prepared.work_dir) == REPO / "work"
    assert resolve(paths.DataBin, {"DATA_BIN": "mine"}).data_bin == Path("mine")  # a set variable is used as given


@pytest.mark.parametrize("setting, metric, name", [
    ("small", "loss", "checkpoint_best.pt"),  # the EMNLP 2020 authors' README: test ... checkpoint_best.pt
    ("fairseq_base", "loss", "checkpoint_best.pt"),
    ("fairseq_big", "loss", "checkpoint_best.pt"),
    ("base", "bleu", "checkpoint_best.pt"),  # the THUMT trainer keeps its best by validation BLEU
    ("big", "bleu", "checkpoint_best.pt"),
    ("tiny", None, "checkpoint_last.pt"),  # the demo scale
])
def test_each_settings_plan_names_its_checkpoint(tmp_path, setting, metric, name):
    """The plan alone decides which checkpoint is evaluated: the setting's single model, or the average."""
    data_bin = fake_prepared(tmp_path / "data-bin", "wmt14_en_de")
    p = plan(request_from_env("wmt14_en_de", setting, [], env={"DATA_BIN": str(data_bin)}, gpus=0))
    assert p.best_checkpoint_metric == metric
    assert p.single_checkpoint == p.save_dir / name
    assert p.checkpoint(5) == p.save_dir / "checkpoint_avg_last5.pt"


def test_prepare_json_has_one_default_per_field(tmp_path):
    """A prepare.json that does not say whether the text was Moses-tokenized: training's validation BLEU and the
    evaluation read the same default (before, training assumed Moses for subword-nmt and evaluation did not)."""
    data_bin = fake_prepared(tmp_path / "data-bin", "wmt14_en_de", post_process="subword_nmt")
    meta = load_dataset_meta(data_bin / "wmt14_en_de")
    p = plan(request_from_env("wmt14_en_de", "base", [], env={"DATA_BIN": str(data_bin)}, gpus=8))
    assert "--eval-bleu" in p.args  # the THUMT setting chooses its checkpoint by validation BLEU
    detok = p.args[p.args.index("--eval-bleu-detok") + 1]
    assert meta.moses_tokenized is False and detok == "space"
    assert meta.dataset == "wmt14_en_de" and p.meta == meta  # the folder's name where prepare.json has none


@pytest.mark.parametrize("setting, env, averaged, name", [
    ("base", {}, 0, "checkpoint_best.pt"),  # the THUMT papers' single model: the best by validation BLEU
    ("fairseq_base", {}, 0, "checkpoint_best.pt"),  # the EMNLP 2020 authors': the best by validation loss
    ("tiny", {}, 0, "checkpoint_last.pt"),
    ("fairseq_base", {"AVERAGE": "5"}, 5, "checkpoint_avg_last5.pt"),
    ("base", {"AVERAGE": "5"}, 0, "checkpoint_best.pt"),  # averaging asked for but not written (too few)
])
def test_the_plan_decides_the_checkpoint_to_evaluate(tmp_path, setting, env, averaged, name):
    data_bin = fake_prepared(tmp_path / "data-bin", "wmt14_en_de")
    p = plan(request_from_env("wmt14_en_de", setting, [], env=dict(env, DATA_BIN=str(data_bin),
                                                                    SAVE_DIR=str(tmp_path / "run")), gpus=8))
    assert p.checkpoint(averaged) == tmp_path / "run" / name


def test_the_evaluation_key_covers_everything_that_changes_decoding(tmp_path):
    from diverse_fairseq.tables.steps import evaluation_key

    checkpoint = tmp_path / "checkpoint_last.pt"
    checkpoint.write_bytes(b"a model")
    base = EvalRequest(checkpoint=checkpoint, data_dir=tmp_path)
    key = evaluation_key(base)
    assert json.loads(json.dumps(key)) == key == evaluation_key(EvalRequest(checkpoint=checkpoint, data_dir=tmp_path))
    for changed in (dict(subset="valid"), dict(beam=1), dict(lenpen=2.0), dict(length_penalty="gnmt"),
                    dict(beam_search="thumt"), dict(batch_size=3), dict(cpu=True),
                    dict(precision="fp16"), dict(generate_args=("--max-len-b", "5"))):
        assert evaluation_key(EvalRequest(checkpoint=checkpoint, data_dir=tmp_path, **changed)) != key, changed
