"""The evaluated checkpoint is decided in one place (diverse_fairseq.checkpoint_choice): the EMNLP 2020 settings
evaluate checkpoint_best.pt by validation loss, the THUMT settings by validation BLEU, the demo the last one."""

import json
from dataclasses import replace

import pytest
from conftest import fake_prepared

from diverse_fairseq import training
from diverse_fairseq.checkpoint_choice import checkpoint_name, describe, evaluated_checkpoint, recorded_metric
from diverse_fairseq.tables import report

ENV_KEYS = ("SEEDS", "SEED", "SAVE_DIR", "TRAIN_ARGS", "JOBS", "DRY_RUN", "SCALE", "AVERAGE", "GPUS")


@pytest.mark.parametrize("setting, metric, name", [
    ("small", "loss", "checkpoint_best.pt"),  # the EMNLP 2020 authors' README: test ... checkpoint_best.pt
    ("fairseq_base", "loss", "checkpoint_best.pt"),
    ("fairseq_big", "loss", "checkpoint_best.pt"),
    ("base", "bleu", "checkpoint_best.pt"),  # the THUMT trainer keeps its best by validation BLEU
    ("big", "bleu", "checkpoint_best.pt"),
    ("tiny", None, "checkpoint_last.pt"),  # the demo scale
])
def test_each_setting_names_its_checkpoint(setting, metric, name):
    s = training.SETTINGS[setting]
    assert s.best_checkpoint_metric == metric and evaluated_checkpoint(s) == name
    assert evaluated_checkpoint(s, average=5) == "checkpoint_avg_last5.pt"


def test_an_unknown_metric_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'bleu' or 'loss'"):
        replace(training.SETTINGS["small"], best_checkpoint_metric="accuracy")
    with pytest.raises(ValueError, match="best_checkpoint_metric='BLEU'"):
        checkpoint_name("BLEU")


def test_the_emnlp20_settings_train_with_fairseqs_default_best_metric(tmp_path, monkeypatch):
    """"loss" adds no flag (fairseq keeps checkpoint_best.pt by validation loss by default), and training.run
    says checkpoint_best.pt is the model to evaluate; "bleu" adds --eval-bleu."""
    data_bin = fake_prepared(tmp_path / "data-bin", "iwslt14_de_en")
    monkeypatch.setattr(training, "visible_gpus", lambda: 1)
    info = training.run_from_env("iwslt14_de_en", "small", [], env={"DATA_BIN": str(data_bin), "DRY_RUN": "1"},
                                 gpus=1)
    assert info["checkpoint"].endswith("/checkpoint_best.pt") and info["best_checkpoint_metric"] == "loss"
    assert "--best-checkpoint-metric" not in info["args"] and "--eval-bleu" not in info["args"]
    fake_prepared(data_bin, "wmt14_en_de")
    info = training.run_from_env("wmt14_en_de", "base", [], env={"DATA_BIN": str(data_bin), "DRY_RUN": "1"}, gpus=1)
    assert info["checkpoint"].endswith("/checkpoint_best.pt") and "--eval-bleu" in info["args"]


def test_a_paper_scale_emnlp20_dry_run_evaluates_the_best_checkpoint(tmp_path, monkeypatch, capsys):
    """``DRY_RUN=1 make table-emnlp20_t2 SCALE=paper``: every evaluation command reads checkpoint_best.pt."""
    from diverse_fairseq.tables.__main__ import main

    data_bin = fake_prepared(tmp_path / "data-bin", "iwslt14_de_en", bpe_size=10000, created="2024-01-01 00:00:00")
    meta = data_bin / "iwslt14_de_en" / "prepare.json"
    meta.write_text(meta.read_text().replace("{", '{"dataset": "iwslt14_de_en", ', 1))
    monkeypatch.setenv("DRY_RUN", "1")
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as done:
        main(["emnlp20_t2", "--scale", "paper", "--data-bin", str(data_bin), "--out", str(out), "--seeds", "1",
              "--jobs", "1", "--gpus", "0"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    evaluations = [line for line in text.splitlines() if "diverse_fairseq.evaluate" in line]
    assert evaluations and all("/checkpoint_best.pt " in line for line in evaluations), text[-3000:]


def test_a_reused_run_evaluates_its_settings_checkpoint(tmp_path):
    """A finished run recorded before the setting named its metric (checkpoint_last.pt in train.json) is evaluated
    from the setting's checkpoint now."""
    from diverse_fairseq.tables import runner, steps
    from diverse_fairseq.tables.cache import store
    from diverse_fairseq.tables.keys import cache_key

    data_bin = fake_prepared(tmp_path / "data-bin", "iwslt14_de_en")
    run = runner.RunConfig(dataset="iwslt14_de_en", scale="paper", seeds=[1], gpus=0, out_dir=tmp_path / "out",
                           data_bin=data_bin)
    row = runner.Row(id="ma", label="MA", family="transformer", args=[])
    _, _, request = steps.job_request(row, run, 1)
    run_dir = run.run_dir(row, 1)
    run_dir.mkdir(parents=True)
    store(run_dir / "train.json", {"key": cache_key(run, request), "checkpoint": str(run_dir / "checkpoint_last.pt"),
                                   "averaged_checkpoints": 0, "setting": "small"})
    record = steps.train_row(row, run, 1)
    assert record["reused"] and record["checkpoint"] == str(run_dir / "checkpoint_best.pt")
    assert record["best_checkpoint_metric"] == "loss"
    assert json.loads((run_dir / "train.json").read_text())["checkpoint"].endswith("checkpoint_last.pt")


def test_the_report_says_which_checkpoint_it_evaluated():
    assert describe("loss") == "a single checkpoint (the best by validation loss, checkpoint_best.pt)"
    assert describe("bleu", 5) == "the average of the last 5 checkpoints (checkpoint_avg_last5.pt)"
    # records written before the metric was recorded: checkpoint_best.pt was only ever chosen by BLEU
    assert recorded_metric({"checkpoint": "/x/checkpoint_best.pt"}) == "bleu"
    assert recorded_metric({"checkpoint": "/x/checkpoint_last.pt"}) is None
    assert recorded_metric({"checkpoint": "/x/checkpoint_best.pt", "best_checkpoint_metric": "loss"}) == "loss"
    rows = [{"label": "MA", "averaged_checkpoints": [0], "best_checkpoint_metric": ["loss"]},
            {"label": "RMA", "averaged_checkpoints": [0], "best_checkpoint_metric": ["loss"]}]
    assert report.checkpoints_note(rows) == (
        "Checkpoints: a single checkpoint (the best by validation loss) for every run, as the EMNLP 2020 authors' "
        "README tests checkpoint_best.pt (fairseq's best by validation loss).")
