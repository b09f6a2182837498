"""A run's life around fairseq-train (issue 31, item 6): Ctrl-C ends with one line saying what was saved and how to
resume (``scripts/train.sh`` and the table runner), a damaged ``checkpoint_last.pt`` is refused before training
with the fix, the disagreement criterion on a model without observable heads is refused when it is built (no
crash.pt), hydra's noise stays out of fairseq's commands, and the header names the ``--arch`` given."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, ctrl_c_as_in_a_terminal, fake_prepared, job_record, tiny_train_args

from diverse_fairseq import training
from diverse_fairseq.runs.checkpoint_file import trained_updates
from diverse_fairseq.runs.hints import python_command
from diverse_fairseq.runs.identity import write_args
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.tables import runner
from diverse_fairseq.tables.config import RunConfig

ENV_KEYS = ("SEEDS", "SEED", "TRAIN_ARGS", "DRY_RUN", "SAVE_DIR", "MAX_UPDATE", "GPUS", "AVERAGE", "RESUME_ANYWAY",
            "SCALE", "JOBS", "MAX_TOKENS", "UPDATE_FREQ", "PRECISION", "EMBEDDINGS")
SMALL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--max-tokens", "100",
         "--save-interval-updates", "2", "--log-interval", "1", "--num-workers", "0"]
INTERRUPTED = re.compile(r"\[train\] interrupted at update (\d+); the last checkpoint is at update (\d+) "
                         r"\((\S+checkpoint_last\.pt)\); resume with: (.+)")
#: what hydra printed before every fairseq command; torch's three warnings about fairseq's calls, fairseq's user-dir
#: line, its configuration dump and fairseq-generate's Python default log format (diverse_fairseq/runs/cli_logging.py)
HYDRA_NOISE = ("DEBUG:hydra", "site-packages/hydra", "version_base", "ConfigStore schema", "strict flag",
               "no longer experimental", "package header", "'pin_memory' argument", "torch.cuda.amp.autocast",
               "mismatched key_padding_mask", "has already been imported", "{'_name': None, 'common'", "INFO:fairseq")


def _env(**extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(REPO), **extra)
    for key in ENV_KEYS:
        if key not in extra:
            env.pop(key, None)
    return env


@pytest.fixture
def toy_bin(tiny_data, tmp_path):
    """``tmp_path/data-bin/toy``: the binarized toy corpus with the prepare.json that scripts/train.sh reads."""
    dest = tmp_path / "data-bin" / "toy"
    shutil.copytree(tiny_data, dest)
    (dest / "prepare.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de",
                                                   "joined_dictionary": True}))
    return dest.parent


def _checkpoint(path: Path, updates: int):
    torch.save({"optimizer_history": [{"num_updates": updates}], "model": {"w": torch.zeros(2)}, "args": None,
                "cfg": {"task": {}}}, path)


# ------------------------------------------------------------------------------------------ Ctrl-C
def _interrupt(cmd, env, when, ctrl_c=1, timeout=120):
    """Run ``cmd`` in its own process group and send SIGINT to the group, as Ctrl-C in a terminal, at the first
    output line ``when`` matches (``ctrl_c`` times, 0.5 s apart); return its exit status and whole output."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_as_in_a_terminal)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if re.search(when, line):
                for i in range(ctrl_c):
                    time.sleep(0.5 if i else 0)
                    os.killpg(proc.pid, signal.SIGINT)
                break
        seen.append(proc.communicate(timeout=timeout)[0])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, "".join(seen)


def test_ctrl_c_during_training_ends_with_one_line_and_resumes(toy_bin, tmp_path, capsys):
    """A real tiny training (scripts/train.sh) interrupted by SIGINT to its process group, as Ctrl-C in a terminal:
    exit 130, no traceback, the last line gives update N, the checkpoint's update M and a command that resumes."""
    env = _env(DATA_BIN=str(toy_bin), CHECKPOINTS=str(tmp_path / "ck"), MAX_UPDATE="1000")
    cmd = ["bash", str(REPO / "scripts" / "train.sh"), "toy", "tiny", *SMALL, "--arch", "diverse_transformer"]
    status, out = _interrupt(cmd, env, r"num_updates=3\b")  # after the checkpoint of update 2
    assert status == 130, out[-3000:]  # the shell's status for SIGINT
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert not [noise for noise in HYDRA_NOISE if noise in out], out[:3000]
    assert "[train] toy tiny: diverse_transformer on the CPU" in out  # the --arch given, not the setting's
    last = out.strip().splitlines()[-1]
    found = INTERRUPTED.fullmatch(last)
    assert found, last
    reached, saved, checkpoint, resume = int(found[1]), int(found[2]), Path(found[3]), found[4]
    assert reached >= 3 and 2 <= saved <= reached and trained_updates(checkpoint) == saved
    assert resume.startswith(f"SAVE_DIR={checkpoint.parent} ") and " scripts/train.sh toy tiny " in resume
    # the command resumes that run: the same directory, no option changed (its dry run, in this process, says so)
    words = shlex.split(resume)
    variables = dict(w.split("=", 1) for w in words[:words.index("scripts/train.sh")])
    dataset, setting, *extra = words[words.index("scripts/train.sh") + 1:]
    training.run_from_env(dataset, setting, extra, env=dict(variables, DRY_RUN="1", CUDA_VISIBLE_DEVICES=""))
    assert f"[train] resuming from {checkpoint.parent};" in capsys.readouterr().out


def test_interrupt_message_without_a_checkpoint(tmp_path):
    assert training.interrupt_message(None, tmp_path, "CMD") == (
        "interrupted before fairseq reported an update; no checkpoint was saved yet, so a new run starts from "
        "update 0 with: CMD")
    assert training.last_update('epoch 001:  5 / 58 loss=7.4, num_updates=5, lr=2e-05\n'
                                '{"epoch": 1, "train_num_updates": "12"}') == 12


def test_ctrl_c_in_a_table_names_each_interrupted_row_and_the_command(tmp_path, monkeypatch):
    """The table runner (jobs run in this process): the interrupted row, its update and checkpoint, and the
    same make command; finished rows are not listed."""
    from diverse_fairseq.tables.__main__ import resume_command
    from diverse_fairseq.tables.spec import load_table

    table = load_table("naacl19_t3")
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path / "out", jobs=1)
    run.data_bin = fake_prepared(tmp_path / "data-bin", "demo")
    calls = []

    def job(job, env):
        calls.append(job.row)
        if len(calls) == 2:
            job.run_dir.mkdir(parents=True)
            _checkpoint(job.run_dir / "checkpoint_last.pt", 6)
            raise training.Interrupted(7)
        return job_record(job.seed, bleu=1.0, row=job.row)

    monkeypatch.setattr(runner, "run_job", job)
    with pytest.raises(runner.TableInterrupted) as caught:
        runner.run_table(table, run, {})
    (interrupted, update), = caught.value.jobs
    assert (interrupted.row, interrupted.seed, update) == (calls[1], 1, 7)
    resume = resume_command(["naacl19_t3"], {"SCALE": "demo", "SEEDS": "1", "HOME": "/root"})
    assert resume == "make table-naacl19_t3 SCALE=demo SEEDS=1"
    # another command line: this Python (the project's, by its path: it runs outside the venv too)
    assert resume_command(["t.yaml", "--seeds", "2"], {}) == python_command("diverse_fairseq.tables", "t.yaml",
                                                                            "--seeds", "2")
    # make demo's command (``demo --dataset X``): the make target again, the dataset named once
    assert (resume_command(["demo", "--dataset", "custom_en_de"], {"DATASET": "custom_en_de", "SEEDS": "1"})
            == "make demo DATASET=custom_en_de SEEDS=1")
    lines = runner.interrupted_lines(caught.value.jobs, resume)
    checkpoint = interrupted.run_dir / "checkpoint_last.pt"
    assert lines == [f"[naacl19_t3] row {interrupted.row} seed 1: interrupted at update 7; the last checkpoint is "
                     f"at update 6 ({checkpoint}); resume with: make table-naacl19_t3 SCALE=demo SEEDS=1"]


ONE_ROW = """
table: one
title: "one row"
baseline: base
rows:
  - {id: base, label: "Transformer", family: transformer}
"""


def test_ctrl_c_in_a_table_run_by_the_worker_pool_twice(toy_bin, tmp_path):
    """JOBS=2 (the worker pool, two seeds): Ctrl-C (SIGINT to the process group) once the first job has started,
    and again while the jobs stop: exit 130, no traceback from the runner or its workers, and last a line for each
    job handed out (the second seed's only if Ctrl-C came after it was)."""
    table = tmp_path / "one.yaml"
    table.write_text(ONE_ROW)
    env = _env(JOBS="2", PROGRESS_INTERVAL="1")
    cmd = [sys.executable, "-m", "diverse_fairseq.tables", str(table), "--dataset", "toy", "--scale", "demo",
           "--data-bin", str(toy_bin), "--out", str(tmp_path / "results"), "--seeds", "2",
           "--train-args", shlex.join([*SMALL, "--max-update", "1000"])]
    status, out = _interrupt(cmd, env, ": started;", ctrl_c=2, timeout=60)  # the second while the workers stop
    assert status == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    interrupted = [line for line in out.splitlines() if re.match(r"\[one\] row base seed \d: interrupted ", line)]
    assert "[one] row base seed 1: interrupted " in out and out.strip().splitlines()[-len(interrupted):] == interrupted


# ------------------------------------------------------------------------- one-process runs in this process
def test_one_process_runs_one_after_another_in_a_process_each_start_as_a_fresh_fairseq_train(
        toy_bin, tmp_path, monkeypatch):
    """A one-process run trains in the calling process (a table's worker trains several runs there): a second run
    starts without what fairseq kept from the first (its best validation score: here one no run can beat; its
    tensorboard writers), writes nothing into the first run's ``--log-file`` or ``--tensorboard-logdir``, and trains
    in this one process although fairseq's default world size is every GPU the process sees (four, faked here:
    fairseq would start four processes)."""
    from fairseq import checkpoint_utils

    env = {"DATA_BIN": str(toy_bin), "CHECKPOINTS": str(tmp_path / "ck"), "CUDA_VISIBLE_DEVICES": ""}

    def run(name):
        save = tmp_path / name
        extra = [*SMALL, "--max-update", "2", "--log-file", str(save / "train.log"), "--log-format", "json"]
        result = training.run_from_env("toy", "tiny", extra, env=dict(env, SAVE_DIR=str(save)), gpus=0)
        assert result.plan.in_process and trained_updates(save / "checkpoint_last.pt") == 2
        return save

    def tensorboard(save):  # {file: its bytes} of the run's tensorboard logs (train, train_inner, valid)
        return {f.relative_to(save): f.read_bytes() for f in (save / "tensorboard").rglob("events.out.*")}

    first = run("first")
    log, events = (first / "train.log").read_text(), tensorboard(first)
    assert '"num_updates": "2"' in log and (first / "checkpoint_best.pt").exists()
    assert {f.parts[1] for f in events} >= {"train", "valid"}
    checkpoint_utils.save_checkpoint.best = float("-inf")  # as if an earlier run's validation loss had been -inf
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    second = run("second")
    assert (second / "checkpoint_best.pt").exists() and '"num_updates": "2"' in (second / "train.log").read_text()
    assert (first / "train.log").read_text() == log
    # fairseq keeps its tensorboard writers by tag alone: the second run's logs go to its own directory
    assert tensorboard(first) == events and {f.parts[1] for f in tensorboard(second)} >= {"train", "valid"}


# ------------------------------------------------------------------------------ damaged checkpoint_last.pt
@pytest.fixture
def env(tmp_path):
    fake_prepared(tmp_path / "data-bin", "demo")
    return {"DATA_BIN": str(tmp_path / "data-bin"), "CHECKPOINTS": str(tmp_path / "ck"), "CUDA_VISIBLE_DEVICES": ""}


def _damaged_run(env, where: Path, others=(("checkpoint_best.pt", 4), ("checkpoint_1_2.pt", 2))):
    """``where`` as a run leaves it when checkpoint_last.pt's save was cut short: train_args.json, a truncated
    checkpoint_last.pt and the intact ``others``."""
    p = plan(training.request_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where)), gpus=0))
    where.mkdir(parents=True)
    write_args(where, p.identity, p.command)
    _checkpoint(where / "checkpoint_last.pt", 6)
    data = (where / "checkpoint_last.pt").read_bytes()
    (where / "checkpoint_last.pt").write_bytes(data[: len(data) // 2])
    for name, updates in others:
        _checkpoint(where / name, updates)


def test_a_truncated_checkpoint_last_is_refused_before_training_with_the_fix(env, tmp_path, monkeypatch):
    where = tmp_path / "run"
    _damaged_run(env, where)
    monkeypatch.setattr(training, "launch", lambda p, env: pytest.fail("fairseq-train was started"))
    with pytest.raises(SystemExit) as err:
        training.run_from_env("demo", "tiny", [], env=dict(env, SAVE_DIR=str(where)), gpus=0)
    message = str(err.value)
    last = where / "checkpoint_last.pt"
    assert message.startswith(f"error: {last} is truncated (")
    assert (f"resume from checkpoint_best.pt (update 4, intact): mv {last} {last}.damaged && "
            f"cp {where}/checkpoint_best.pt {last}, then run the same command again to resume; ") in message
    assert f"or, to train afresh in {where}, only mv {last} {last}.damaged" in message
    # the fix works: after it, the run resumes from update 4
    from diverse_fairseq.runs.checkpoint_file import refuse_damaged_last

    subprocess.run(f"mv {last} {last}.damaged && cp {where}/checkpoint_best.pt {last}", shell=True, check=True)
    refuse_damaged_last(where, "rerun")
    assert trained_updates(last) == 4


def test_a_damaged_checkpoint_last_without_an_intact_one_is_moved_aside(env, tmp_path):
    from diverse_fairseq.runs.checkpoint_file import refuse_damaged_last

    where = tmp_path / "run"
    _damaged_run(env, where, others=())
    (where / "checkpoint_best.pt").write_bytes(b"")  # empty: not a candidate either
    with pytest.raises(SystemExit, match=r"no other checkpoint there is intact: move it aside \(mv \S+"
                                         r"checkpoint_last\.pt \S+checkpoint_last\.pt\.damaged\) and rerun to "
                                         r"train afresh"):
        refuse_damaged_last(where, "rerun")


# ------------------------------------------------------------------------------- plugin misuse at build
def test_disagreement_on_a_plain_transformer_is_refused_when_built_and_the_failed_run_leaves_nothing(
        toy_bin, tmp_path, caplog):
    """The disagreement criterion on ``--arch transformer`` (no observable heads): fairseq-train stops when it builds
    the criterion, before the first step, without crash.pt. That failed training (scripts/train.sh's
    ``training.run``, here in this process, as is fairseq-train's main) offers no resume: it wrote no
    checkpoint; the folder is removed (a crash.pt in it would keep it), and fairseq's own error line comes last
    (issue 27, item 7; was test_training_runs.py's test_a_failed_training_offers_no_resume_and_leaves_no_folder)."""
    where = tmp_path / "ck" / "new-run"
    env = {"DATA_BIN": str(toy_bin), "CHECKPOINTS": str(tmp_path / "ck"), "SAVE_DIR": str(where),
           "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(SystemExit) as err:
        training.run_from_env("toy", "tiny", [*SMALL, "--arch", "transformer", "--max-update", "2", "--criterion",
                                              "label_smoothed_cross_entropy_with_disagreement"], env=env, gpus=0)
    message = str(err.value)
    assert message.startswith("error: fairseq-train failed (exit 1): it wrote no checkpoint, so there is nothing "
                              f"to resume; removed the unused {where}"), message
    assert "resume from" not in message and not where.exists() and (tmp_path / "ck").exists()
    assert not (where / "crash.pt").exists()
    refusal = "needs a model whose attention modules expose their heads (--arch diverse_transformer*"
    last = message.splitlines()[-1]
    assert last.startswith("fairseq-train said: ") and refusal in last, message
    assert refusal in caplog.text  # also logged as it happened, with its traceback
    assert "num_updates" not in caplog.text and "fairseq_cli.train" in caplog.text  # before the first step


def test_the_criterion_finds_the_model_of_its_task(tiny_data):
    """The hook remembers the model each task built; the criterion checks it when built, and a model without
    the chosen layers is refused too (the same check as at the first step)."""
    from fairseq import options, tasks

    from diverse_fairseq.methods.hooks import model_built_for

    def build(arch, *extra):
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, [str(a) for a in tiny_train_args(
            tiny_data, "unused", arch=arch, extra=["--criterion", "label_smoothed_cross_entropy_with_disagreement",
                                                   *extra])])
        task = tasks.setup_task(args)
        model = task.build_model(args)
        assert model_built_for(task) is model
        return task.build_criterion(args)

    assert build("diverse_transformer").regularized_sites  # accepted
    with pytest.raises(ValueError, match="--arch diverse_transformer"):
        build("transformer")
    with pytest.raises(ValueError, match="--disagreement-layers"):
        build("diverse_transformer", "--disagreement-layers", "5")


# --------------------------------------------------------------------------------------------- noise
# fairseq-generate's start-up (the evaluation's and the interactive command's) without hydra's noise (HYDRA_NOISE
# above): checked on the logs of the real fairseq-generate runs of test_tables.py's
# test_tiny_table_end_to_end_resume_and_retrain_on_a_changed_row; fairseq-train's, through scripts/train.sh, in the
# Ctrl-C test above.


def test_the_header_names_the_arch_given(env, capsys):
    training.run_from_env("demo", "tiny", ["--arch", "diverse_transformer"], env=dict(env, DRY_RUN="1"), gpus=0)
    assert "[train] demo tiny: diverse_transformer on the CPU" in capsys.readouterr().out
