"""One save directory per training variant (a readable name plus a hash of the effective options), the options
stored in it, and the refusal to resume a directory trained with other options (diverse_fairseq.runs.identity)."""

import json
import re
from pathlib import Path

import pytest
from conftest import fake_prepared

from diverse_fairseq.runs import plan as run_plan
from diverse_fairseq.runs.identity import write_args
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.training import request_from_env, run_from_env

DISAGREEMENT = ["--arch", "diverse_transformer", "--criterion", "label_smoothed_cross_entropy_with_disagreement",
                "--disagreement-lambda", "0.5"]


@pytest.fixture
def env(tmp_path):
    fake_prepared(tmp_path / "data-bin", "demo", created="today")  # the creation time is not part of the hash
    return {"DATA_BIN": str(tmp_path / "data-bin"), "CHECKPOINTS": str(tmp_path / "ck")}


def plan_of(env, extra, **more):
    return plan(request_from_env("demo", "tiny", extra, env=dict(env, **more), gpus=0))


def save_dir(env, extra, **more):
    return str(plan_of(env, extra, **more).save_dir)


def test_every_variant_gets_its_own_directory(env):
    baseline, variant = save_dir(env, []), save_dir(env, DISAGREEMENT)
    assert re.fullmatch(re.escape(env["CHECKPOINTS"]) + r"/demo_tiny-[0-9a-f]{8}", baseline)
    assert re.fullmatch(re.escape(env["CHECKPOINTS"]) + r"/demo_tiny-disagreement_out-[0-9a-f]{8}", variant)
    assert baseline != variant
    assert save_dir(env, DISAGREEMENT) == variant  # the same command finds its directory again
    assert save_dir(env, [], SEED="2") != baseline  # another seed is another run
    assert save_dir(env, ["--lr", "1e-3"]) != baseline
    # options that may change on resume do not move the run: a longer run, averaging, logging
    assert save_dir(env, [], MAX_UPDATE="5000", AVERAGE="5") == baseline
    assert save_dir(env, ["--log-interval", "1", "--num-workers", "0"]) == baseline
    # the last occurrence of an option counts, as in fairseq: restating a default changes nothing
    assert save_dir(env, ["--criterion", "label_smoothed_cross_entropy"]) == baseline


REPULSIVE = ["--arch", "diverse_transformer", "--optimizer", "repulsive_adam"]


def test_spelled_out_defaults_are_the_same_run(env):
    """Tried as a new user would (issue 31): spelling out the plugin's defaults, or fairseq's, is the same run,
    in the same directory (the identity is taken over the effective option values)."""
    plain = save_dir(env, REPULSIVE)
    assert save_dir(env, REPULSIVE + ["--repulsive-method", "svgd", "--repulsive-alpha", "0.01",
                                      "--repulsive-stepsize", "0.1"]) == plain
    assert save_dir(env, REPULSIVE + ["--dropout", "0.1"]) == plain  # the tiny setting's dropout
    assert save_dir(env, REPULSIVE + ["--repulsive-alpha", "0.02"]) != plain  # a real change still counts
    assert save_dir(env, REPULSIVE + ["--dropout", "0.2"]) != plain


def test_tensorboard_does_not_change_the_run(env, monkeypatch):
    """``--tensorboard-logdir`` is added only where a writer is installed: a results folder moved to a machine
    without one must name, resume and reuse the same run."""
    monkeypatch.setattr(run_plan, "tensorboard_available", lambda: True)
    with_tb = plan_of(env, DISAGREEMENT)
    monkeypatch.setattr(run_plan, "tensorboard_available", lambda: False)
    without = plan_of(env, DISAGREEMENT)
    assert "--tensorboard-logdir" in with_tb.args and "--tensorboard-logdir" not in without.args
    assert with_tb.save_dir == without.save_dir and with_tb.identity == without.identity


def test_explicit_save_dir_wins(env, tmp_path):
    assert save_dir(env, DISAGREEMENT, SAVE_DIR=str(tmp_path / "mine")) == str(tmp_path / "mine")
    p = plan_of(env, ["--save-dir", str(tmp_path / "flag")])
    assert p.save_dir == tmp_path / "flag" and list(p.args[-2:]) == ["--save-dir", str(tmp_path / "flag")]


def _checkpoint(path):
    """A small file that torch reads as a fairseq checkpoint at update 1 (a damaged one is refused to resume)."""
    import torch

    torch.save({"optimizer_history": [{"num_updates": 1}], "model": {}}, path)


def fake_trained(env, extra, where):
    """A save directory as a finished (or interrupted) run with ``extra`` leaves it."""
    p = plan_of(env, extra, SAVE_DIR=str(where))
    where.mkdir(parents=True)
    write_args(where, p.identity, p.command)
    _checkpoint(where / "checkpoint_last.pt")


def test_the_same_options_resume(env, tmp_path, capsys):
    where = tmp_path / "run"
    fake_trained(env, DISAGREEMENT, where)
    result = run_from_env("demo", "tiny", DISAGREEMENT + ["--log-interval", "7"],
                          env=dict(env, SAVE_DIR=str(where), DRY_RUN="1", MAX_UPDATE="2000"), gpus=0)
    assert result.plan.save_dir == where and f"resuming from {where}" in capsys.readouterr().out


def test_other_options_are_refused_naming_them(env, tmp_path):
    where = tmp_path / "run"
    fake_trained(env, DISAGREEMENT, where)
    with pytest.raises(SystemExit) as err:
        run_from_env("demo", "tiny", ["--arch", "diverse_transformer", "--lr", "1e-3"],
            env=dict(env, SAVE_DIR=str(where), DRY_RUN="1"), gpus=0)
    message = str(err.value)
    assert "--criterion label_smoothed_cross_entropy_with_disagreement → label_smoothed_cross_entropy" in message
    assert "--disagreement-lambda 0.5 → (default)" in message and "--lr [0.002] → [0.001]" in message
    assert "--arch" not in message and "RESUME_ANYWAY=1" in message and "SAVE_DIR" in message


def test_changed_data_is_refused_and_resume_anyway_overrides(env, tmp_path, capsys):
    where = tmp_path / "run"
    fake_trained(env, [], where)
    meta = Path(env["DATA_BIN"]) / "demo" / "prepare.json"
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), bpe_size=999)))
    with pytest.raises(SystemExit, match=r"the prepared data \(prepare.json"):
        run_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where), DRY_RUN="1"), gpus=0)
    run_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where), DRY_RUN="1", RESUME_ANYWAY="1"), gpus=0)
    assert "RESUME_ANYWAY=1: resuming" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="RESUME_ANYWAY='yes' is not valid"):
        run_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where), DRY_RUN="1", RESUME_ANYWAY="yes"), gpus=0)


def test_a_directory_without_stored_options_resumes_with_a_warning(env, tmp_path, capsys):
    where = tmp_path / "old"
    where.mkdir()
    _checkpoint(where / "checkpoint_last.pt")
    run_from_env("demo", "tiny", DISAGREEMENT, env=dict(env, SAVE_DIR=str(where), DRY_RUN="1"), gpus=0)
    assert "no train_args.json (trained by an older version)" in capsys.readouterr().out


def test_the_training_command_refuses_before_training(env, tmp_path, monkeypatch, capfd):
    """scripts/train.sh's command, ``python -m diverse_fairseq.training`` (train.sh execs it; here its main in this
    process, with train.sh's variables; test_run_life's Ctrl-C test runs train.sh itself): a real run with another
    option stops before fairseq-train starts, naming the change (the SystemExit's message is Python's stderr)."""
    from diverse_fairseq import training

    where = tmp_path / "run"
    fake_trained(env, [], where)
    for name, value in dict(env, SAVE_DIR=str(where), CUDA_VISIBLE_DEVICES="").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DRY_RUN", raising=False)  # a real run: it must stop before fairseq-train starts
    with pytest.raises(SystemExit) as refused:
        training.main(["demo", "tiny", "--lr", "1e-3"])
    out, err = capfd.readouterr()
    stderr = err + str(refused.value.code)
    assert refused.value.code not in (0, None) and "--lr [0.002] → [0.001]" in stderr
    assert "fairseq_cli.train" in out and "| INFO |" not in out + stderr
