"""What ``scripts/train.sh`` (diverse_fairseq.training) does around fairseq-train (issue 27, items 1, 5, 6, 7):
a finished run is left alone, a variable of another command is named, a misspelled setting and routing flags
on an architecture without routing are refused before anything runs, and a failed fairseq-train says "resume"
only where there is something to resume, with fairseq's own error line last."""

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import fake_prepared

from diverse_fairseq import training
from diverse_fairseq.runs.checkpoint_file import finished, trained_updates
from diverse_fairseq.runs.identity import ARGS_FILE, write_args
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.runs.settings import resolve_setting

ENV_KEYS = ("SEEDS", "SEED", "TRAIN_ARGS", "DRY_RUN", "SAVE_DIR", "MAX_UPDATE", "GPUS", "AVERAGE", "RESUME_ANYWAY")


@pytest.fixture
def env(tmp_path):
    fake_prepared(tmp_path / "data-bin", "demo")
    return {"DATA_BIN": str(tmp_path / "data-bin"), "CHECKPOINTS": str(tmp_path / "ck"), "CUDA_VISIBLE_DEVICES": ""}


def trained(env, where: Path, updates: int, extra=()):
    """``where`` as a run of ``extra`` leaves it after ``updates`` updates: its train_args.json and a
    checkpoint_last.pt that records ``updates`` where fairseq does (optimizer_history[-1]["num_updates"])."""
    p = plan(training.request_from_env("demo", "tiny", list(extra), env=dict(env, SAVE_DIR=str(where)), gpus=0))
    where.mkdir(parents=True)
    write_args(where, p.identity, p.command)
    torch.save({"optimizer_history": [{"num_updates": updates - 1}, {"num_updates": updates}],
                "model": {"w": torch.zeros(2)}}, where / "checkpoint_last.pt")


def no_training(*args, **kwargs):
    raise AssertionError("fairseq-train was started")


# ----------------------------------------------------------------------------- item 1: finished runs
def test_a_finished_run_is_left_alone(env, tmp_path, monkeypatch, capsys):
    where = tmp_path / "run"
    trained(env, where, 150)
    before = (where / "checkpoint_last.pt").read_bytes()
    monkeypatch.setattr(subprocess, "Popen", no_training)
    monkeypatch.setattr(subprocess, "call", no_training)
    result = training.run_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where), MAX_UPDATE="150"), gpus=0)
    out = capsys.readouterr().out
    assert f"already trained to 150 updates (--max-update 150): {where}; left as it is" in out
    assert "raise MAX_UPDATE (e.g. MAX_UPDATE=300" in out and "resuming from" not in out
    assert result.finished_earlier and result.checkpoint == where / "checkpoint_last.pt"
    assert (where / "checkpoint_last.pt").read_bytes() == before
    # the same through an extra --max-update (the last one counts), and in a dry run
    training.run_from_env("demo", "tiny", ["--max-update", "100"], env=dict(env, SAVE_DIR=str(where), MAX_UPDATE="900",
                                                                  DRY_RUN="1"), gpus=0)
    assert "already trained to 150 updates (--max-update 100)" in capsys.readouterr().out


def test_a_run_short_of_max_update_resumes(env, tmp_path, monkeypatch, capsys):
    where = tmp_path / "run"
    trained(env, where, 150)
    started = []
    monkeypatch.setattr(training, "launch", lambda p, env: started.append(p.command) or (0, ""))
    result = training.run_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where), MAX_UPDATE="300"), gpus=0)
    assert len(started) == 1 and not result.finished_earlier and f"resuming from {where}" in capsys.readouterr().out


def test_trained_updates_reads_what_fairseq_resumes_from(tmp_path):
    torch.save({"optimizer_history": [{"num_updates": 7}]}, tmp_path / "a.pt")
    (tmp_path / "b.pt").write_bytes(b"not a checkpoint")
    assert trained_updates(tmp_path / "a.pt") == 7
    assert trained_updates(tmp_path / "b.pt") is None  # fairseq decides what to do with it
    assert finished(tmp_path, 7) is None  # no checkpoint_last.pt
    (tmp_path / "a.pt").rename(tmp_path / "checkpoint_last.pt")
    assert finished(tmp_path, 7) == 7 and finished(tmp_path, 8) is None
    assert finished(tmp_path, 0) is None  # --max-update 0: no limit in fairseq


def test_a_variable_of_the_table_runner_is_named(env, monkeypatch, capsys):
    for key, value in dict(env, SEEDS="3", DRY_RUN="1").items():
        monkeypatch.setenv(key, value)
    assert training.main(["demo", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "[train] warning: SEEDS=3 is not read by scripts/train.sh: use SEED" in out
    assert "now training with SEED=1" in out and " --seed 1 " in out
    monkeypatch.setenv("SEED", "3")
    monkeypatch.setenv("TRAIN_ARGS", "--lr 1e-3")
    training.main(["demo", "tiny"])
    out = capsys.readouterr().out
    assert "now training with SEED=3" in out and "TRAIN_ARGS=--lr 1e-3 is not read by scripts/train.sh" in out
    monkeypatch.delenv("SEEDS")
    monkeypatch.delenv("TRAIN_ARGS")
    training.main(["demo", "tiny"])
    assert "warning" not in capsys.readouterr().out


# ------------------------------------------------------------------ item 5: failures of fairseq-train
def test_a_configuration_error_is_refused_before_training(env, tmp_path, monkeypatch):
    """An option fairseq-train does not accept is refused when the run is planned (fairseq's own parser gives
    the run's identity), with argparse's error line, before fairseq-train starts or a folder is made."""
    where = tmp_path / "ck" / "new-run"
    monkeypatch.setattr(subprocess, "Popen", no_training)
    with pytest.raises(SystemExit) as err:
        training.run_from_env("demo", "tiny", ["--no-such-option"], env=dict(env, SAVE_DIR=str(where)), gpus=0)
    message = str(err.value)
    assert message.startswith("error: fairseq-train would not accept these options: ")
    assert message.endswith("error: unrecognized arguments: --no-such-option") and not where.exists()


# A failed fairseq-train (no checkpoint: no resume offered, the folder removed, fairseq's own error line last) is
# test_run_life.py's test_disagreement_on_a_plain_transformer_is_refused_when_built_and_the_failed_run_leaves_nothing
# (one real fairseq-train that fails at start for both properties).


def test_failure_messages(tmp_path):
    where = tmp_path / "run"
    where.mkdir()
    (where / "checkpoint_last.pt").write_bytes(b"x")
    message = training.failure_message(1, "RuntimeError: CUDA out of memory", where)
    assert message == (f"error: fairseq-train failed (exit 1): run the same command again to resume from "
                       f"{where}/checkpoint_last.pt\nfairseq-train said: RuntimeError: CUDA out of memory")
    assert where.exists()
    other = tmp_path / "other"
    (other / "tensorboard" / "train").mkdir(parents=True)
    (other / ARGS_FILE).write_text("{}")
    (other / "notes.txt").write_text("the user's")
    assert training.failure_message(-9, "", other) == (
        f"error: fairseq-train failed (killed by signal 9): it wrote no checkpoint, so there is nothing to resume "
        f"({other} kept: it holds other files)")
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]  # ours removed, the user's file kept


# ----------------------------------------------------------- item 6: a setting that is not one
def test_a_misspelled_setting_is_refused_with_the_nearest(env):
    with pytest.raises(SystemExit, match=r"'tinny' is neither a setting \(small, base, big, big_300k, fairseq_base, "
                                         r"fairseq_big, tiny\) nor a registered architecture \(--arch\): "
                                         r"did you mean the setting 'tiny'\?"):
        resolve_setting("tinny")
    with pytest.raises(SystemExit, match="did you mean the setting 'base'"):
        plan(training.request_from_env("demo", "bsae", [], env=env, gpus=0))
    assert resolve_setting("transformer_tiny")[2] == "transformer_tiny"  # fairseq's own: accepted
    assert resolve_setting("routing_transformer_wmt_en_de")[:1] == ("base",)


# ------------------------------------------------- item 7: routing flags on an architecture without routing
@pytest.mark.parametrize("setting, extra, suggested", [
    ("tiny", ["--routing-encoder-layers", "0"], "diverse_transformer"),
    ("base", ["--routing-type=em", "--routing-encoder-layers", "0,1"], "diverse_transformer_wmt_en_de"),
    ("tiny", ["--arch", "transformer_iwslt_de_en", "--routing-iterations", "3"], "diverse_transformer_iwslt_de_en"),
])
def test_routing_flags_need_a_routing_architecture(env, monkeypatch, setting, extra, suggested):
    monkeypatch.setattr(subprocess, "Popen", no_training)
    with pytest.raises(SystemExit, match=rf"--routing-.*: routing-by-agreement options, which --arch \S+ does not "
                                         rf"accept: add --arch {suggested} \(the same sizes"):
        training.run_from_env("demo", setting, extra, env=dict(env, DRY_RUN="1"), gpus=0)


def test_routing_flags_with_a_routing_architecture_pass(env):
    for extra in (["--arch", "diverse_transformer", "--routing-encoder-layers", "0"],
                  ["--arch", "routing_transformer_wmt_en_de", "--routing-iterations", "2"]):
        result = training.run_from_env("demo", "tiny", extra, env=dict(env, DRY_RUN="1"), gpus=0)
        assert result.plan.command[-len(extra):] == extra


def test_only_one_process_of_fairseq_train_itself_trains_in_the_calling_process(env):
    """``Plan.in_process``: the CPU or one GPU on one node trains in the calling process (``training.launch``);
    several GPUs, torchrun (NNODES), a TRAIN_HOOK script, a world size, or an option that fairseq-train's command line
    handles itself (--profile, --use-plasma-view) start the command."""
    from dataclasses import replace

    def planned(gpus=0, extra=(), **variables):
        return plan(training.request_from_env("demo", "tiny", list(extra), env=dict(env, **variables), gpus=gpus))

    assert planned(0).in_process and planned(1).in_process
    assert not planned(2).in_process
    assert not planned(0, NNODES="1").in_process and planned(0, NNODES="1").launcher[1:3] == ("-m",
                                                                                             "torch.distributed.run")
    for options in (["--distributed-world-size", "1"], ["--profile"], ["--use-plasma-view"]):
        assert not planned(1, options).in_process, options
    hooked = plan(replace(training.request_from_env("demo", "tiny", [], env=env, gpus=0), entry="/x/hook.py"))
    assert not hooked.in_process and hooked.command[1] == "/x/hook.py"
