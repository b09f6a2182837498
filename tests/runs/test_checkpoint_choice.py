"""The evaluated checkpoint is decided in one place (diverse_fairseq.runs.settings): the EMNLP 2020 settings
evaluate checkpoint_best.pt by validation loss, the THUMT settings by validation BLEU, the demo the last one."""

from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch
from conftest import fake_prepared

from diverse_fairseq import training
from diverse_fairseq.runs import settings
from diverse_fairseq.runs.settings import checkpoint_name, describe
from diverse_fairseq.tables import report

ENV_KEYS = ("SEEDS", "SEED", "SAVE_DIR", "TRAIN_ARGS", "JOBS", "DRY_RUN", "SCALE", "AVERAGE", "GPUS")


def test_an_unknown_metric_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'bleu' or 'loss'"):
        replace(settings.SETTINGS["small"], best_checkpoint_metric="accuracy")
    with pytest.raises(ValueError, match="best_checkpoint_metric='BLEU'"):
        checkpoint_name("BLEU")


def test_the_emnlp20_settings_train_with_fairseqs_default_best_metric(tmp_path, monkeypatch):
    """"loss" adds no flag (fairseq keeps checkpoint_best.pt by validation loss by default), and training.run
    says checkpoint_best.pt is the model to evaluate; "bleu" adds --eval-bleu."""
    data_bin = fake_prepared(tmp_path / "data-bin", "iwslt14_de_en")
    monkeypatch.setattr(training, "visible_gpus", lambda: 1)
    result = training.run_from_env("iwslt14_de_en", "small", [], env={"DATA_BIN": str(data_bin), "DRY_RUN": "1"},
                                   gpus=1)
    assert result.checkpoint.name == "checkpoint_best.pt" and result.plan.best_checkpoint_metric == "loss"
    assert "--best-checkpoint-metric" not in result.plan.args and "--eval-bleu" not in result.plan.args
    fake_prepared(data_bin, "wmt14_en_de")
    result = training.run_from_env("wmt14_en_de", "base", [], env={"DATA_BIN": str(data_bin), "DRY_RUN": "1"}, gpus=1)
    assert result.checkpoint.name == "checkpoint_best.pt" and "--eval-bleu" in result.plan.args


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
    """A finished run whose results folder has moved since (its train.json names a checkpoint elsewhere) is
    evaluated from its plan's checkpoint in its own folder: the setting's, checkpoint_best.pt by validation loss."""
    from diverse_fairseq.tables import steps
    from diverse_fairseq.tables.cache import cache_key, store
    from diverse_fairseq.tables.config import RunConfig
    from diverse_fairseq.tables.job import make_job
    from diverse_fairseq.tables.records import TrainRecord
    from diverse_fairseq.tables.spec import Row

    data_bin = fake_prepared(tmp_path / "data-bin", "iwslt14_de_en")
    run = RunConfig(dataset="iwslt14_de_en", scale="paper", seeds=[1], gpus=0, out_dir=tmp_path / "out",
                    data_bin=data_bin)
    row = Row(id="ma", label="MA", family="transformer", args=[])
    job = make_job("t", row, run, 1)
    run_dir = run.run_dir(row, 1)
    run_dir.mkdir(parents=True)
    torch.save({"optimizer_history": [{"num_updates": 1}], "model": {}, "cfg": {}}, run_dir / "checkpoint_best.pt")
    stored = TrainRecord(row="ma", seed=1, arch="transformer_iwslt_de_en", setting="small", train_args=[],
                         key=cache_key(job.plan), trained_at="then", threads=1, checkpoint="/moved/checkpoint_best.pt",
                         args=[], averaged_checkpoints=0, best_checkpoint_metric="loss", embeddings="all",
                         parameters=None, updates=1, train_steps_per_second=None, train_loss=None, valid_loss=None,
                         valid_nll_loss=None)
    store(run_dir / "train.json", asdict(stored))
    record, reused = steps.train(job, {})
    assert reused and record.checkpoint == str(run_dir / "checkpoint_best.pt")
    assert record.best_checkpoint_metric == "loss"


def test_the_report_says_which_checkpoint_it_evaluated():
    assert describe("loss") == "a single checkpoint (the best by validation loss, checkpoint_best.pt)"
    assert describe("bleu", 5) == "the average of the last 5 checkpoints (checkpoint_avg_last5.pt)"
    rows = [SimpleNamespace(label=label, averaged_checkpoints=[0], best_checkpoint_metric=["loss"])
            for label in ("MA", "RMA")]  # the fields of report.RowSummary that the note reads
    assert report.checkpoints_note(rows) == (
        "Checkpoints: a single checkpoint (the best by validation loss) for every run, as the EMNLP 2020 authors' "
        "README tests checkpoint_best.pt (fairseq's best by validation loss).")
