"""A table job as one value (issue 36): built once with its plan, it pickles, ``run_job(job, env)`` writes its
record (``job.json``) and ``finished_record`` reads it back; a damaged or lost checkpoint of a table row recovers by
itself or names the commands (issue 38); one run is trained by one process (``runs/lock.py``).

fairseq-train is replaced by a fake that writes the log and the checkpoints a real run leaves (training.run and
everything around it is the real code); fairseq-generate and the head-diversity scores by fakes returning records.
"""

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import REPO, fake_prepared, job_record

from diverse_fairseq import training
from diverse_fairseq.runs import plan as run_plan
from diverse_fairseq.runs.lock import run_lock
from diverse_fairseq.tables import runner, steps
from diverse_fairseq.tables.config import RunConfig
from diverse_fairseq.tables.job import finished_record, job_key, run_job, table_jobs
from diverse_fairseq.tables.spec import Row, Table

ENV_KEYS = ("SAVE_DIR", "DRY_RUN", "GPUS", "MAX_UPDATE", "SEED", "TRAIN_ARGS")
TABLE = Table(table="t", title="t", baseline="a", rows=[
    Row(id="a", label="A", family="transformer", baseline="a"),
    Row(id="b", label="B", family="transformer", args=["--dropout", "0.2"], baseline="a")])


def _checkpoint(path: Path, updates: int):
    torch.save({"optimizer_history": [{"num_updates": updates}], "model": {"w": torch.zeros(2)}, "cfg": {"task": {}}},
               path)


@pytest.fixture
def fakes(monkeypatch):
    """fairseq-train writes train.log, checkpoint_1_2.pt and checkpoint_best.pt (update 2) and checkpoint_last.pt
    at --max-update (3); the evaluation
    returns a record whose BLEU counts the evaluations. Returns the list of the commands fairseq-train was given."""
    started = []

    def fake_fairseq(p, env):
        started.append(cmd := p.command)
        save_dir = Path(cmd[cmd.index("--save-dir") + 1])
        (save_dir / "train.log").write_text('{"epoch": 1, "train_loss": "5.5", "train_num_updates": "3"}\n')
        _checkpoint(save_dir / "checkpoint_1_2.pt", 2)
        _checkpoint(save_dir / "checkpoint_best.pt", 2)
        _checkpoint(save_dir / "checkpoint_last.pt", 3)
        return 0, ""

    def fake_evaluate(request):
        record = job_record(bleu=10.0 + len(started), eval={"out": str(request.out), "subset": request.subset}).eval
        request.out.mkdir(parents=True, exist_ok=True)
        (request.out / "results.json").write_text(json.dumps(asdict(record)))
        return record

    monkeypatch.setattr(training, "launch", fake_fairseq)
    monkeypatch.setattr(steps, "evaluate", fake_evaluate)
    monkeypatch.setattr(steps, "disagreement_scores", lambda job, checkpoint: None)
    return started


@pytest.fixture
def run(tmp_path):
    return RunConfig(dataset="demo", scale="demo", seeds=[1, 2], gpus=0, out_dir=tmp_path / "out", jobs=1,
                     data_bin=fake_prepared(tmp_path / "data-bin", "demo"), train_args=["--max-update", "3"],
                     rerun="run make table-t")


def test_a_job_is_planned_once_and_its_record_read_back(run, fakes, monkeypatch, capsys):
    """Each job's plan is built once (before: three times for a row's first seed, twice for the others), the job
    pickles, its decoding is the plan's, and a finished job's record is read back instead of being made again."""
    plans = []
    parse = run_plan.parse_train_args  # called once by each plan()
    monkeypatch.setattr(run_plan, "parse_train_args", lambda args: plans.append(1) or parse(args))
    results = runner.run_table(TABLE, run, {})
    assert len(plans) == 4 and len(fakes) == 4  # 2 rows x 2 seeds: one plan and one training each
    runner.dry_run_table(TABLE, replace(run, dry_run=True))
    assert len(plans) == 8  # the dry run: one plan per job too
    assert "finished earlier: its record would be reused" in capsys.readouterr().out

    jobs = table_jobs(TABLE, run)
    job = pickle.loads(pickle.dumps(jobs[0]))  # what submitit sends to a SLURM node
    assert job.plan == jobs[0].plan and job.evals == jobs[0].evals
    d, (request,) = job.plan.decoding, job.evals
    assert (request.beam, request.lenpen, request.max_len_b, request.cpu) == (d.beam, d.lenpen, d.max_len_b, True)
    assert request.checkpoint == job.run_dir / "checkpoint_last.pt" and request.precision == job.plan.precision
    assert job.env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    stored = json.loads((job.run_dir / "job.json").read_text())
    assert stored["key"] == job_key(job) and finished_record(job) == results["a"][0]
    assert finished_record(replace(job, evals=(replace(request, beam=2),))) is None  # another decoding
    again = runner.run_table(TABLE, run, {})
    assert len(fakes) == 4 and [r.reused for r in again["b"]] == [True, True]
    assert [r.eval.bleu for r in again["b"]] == [r.eval.bleu for r in results["b"]]


def test_a_finished_row_whose_last_checkpoint_is_gone_gives_its_result(run, fakes, capsys):
    """Issue 38: a finished row's checkpoint_last.pt deleted, the table runs again and gives the row's result
    (its record); without the record, a damaged checkpoint_last.pt is moved aside and the run resumes from its
    intact checkpoint with the most updates, with a line saying so; never a raw [Errno 2]."""
    results = runner.run_table(TABLE, run, {})
    job = table_jobs(TABLE, run)[0]
    last = job.run_dir / "checkpoint_last.pt"
    last.unlink()
    capsys.readouterr()
    again = runner.run_table(TABLE, run, {})
    assert again["a"][0].eval.bleu == results["a"][0].eval.bleu and len(fakes) == 4
    # a line says the checkpoint is gone, and how to train the run again
    assert (f"A: reused the run trained {again['a'][0].train.trained_at}, BLEU {again['a'][0].eval.bleu:.2f}; its "
            f"evaluated checkpoint {last} is missing: the record's numbers stand, but analysing or translating this "
            f"run needs that checkpoint; to train the run again: mv {job.run_dir} {job.run_dir}.old, then "
            f"{job.rerun}") in capsys.readouterr().out

    (job.run_dir / "job.json").unlink()  # a run finished by an earlier version: train.json only
    _checkpoint(last, 3)
    last.write_bytes(last.read_bytes()[:100])
    capsys.readouterr()
    runner.run_table(TABLE, run, {})
    out = capsys.readouterr().out
    assert "[a seed 1] training finished earlier" in out and "checkpoint it evaluates, checkpoint_last.pt, cannot " \
        "be read" in out
    assert "[a seed 1] checkpoint_last.pt is truncated (100 bytes; " in out
    assert "moved it to checkpoint_last.pt.damaged" in out and (job.run_dir / "checkpoint_last.pt.damaged").exists()
    assert "[a seed 1] resuming from checkpoint_best.pt (update 2, intact), copied to checkpoint_last.pt" in out
    assert len(fakes) == 5 and "Errno" not in out  # the fake fairseq-train resumed it


def test_a_lost_best_checkpoint_names_the_commands(run, fakes, tmp_path):
    """A finished run that evaluates checkpoint_best.pt (here IWSLT14's setting, as EMNLP 2020's) cannot make it
    again by resuming: the error says how to get the result (copy it back, or move the run aside and run the
    table)."""
    paper = replace(run, dataset="iwslt14_de_en", scale="paper", seeds=[1],
                    data_bin=fake_prepared(tmp_path / "data-bin", "iwslt14_de_en"))
    job = table_jobs(TABLE, paper)[0]
    assert job.evals[0].checkpoint.name == "checkpoint_best.pt"
    run_job(job, {})  # trains, evaluates the best checkpoint
    (job.run_dir / "job.json").unlink()
    (job.run_dir / "checkpoint_best.pt").unlink()
    with pytest.raises(SystemExit) as refused:
        run_job(job, {})
    assert str(refused.value) == (
        f"error: {job.run_dir}/checkpoint_best.pt, the checkpoint that row a seed 1 evaluates, cannot be read, and "
        f"training again from another checkpoint would not make it again (fairseq keeps the best by validation). "
        f"Copy it back if you have it, then run make table-t; or train the run afresh: mv {job.run_dir} "
        f"{job.run_dir}.lost, then run make table-t")


#: a process that holds a run's lock until its stdin closes: runs/lock.py alone (it needs only the standard
#: library), so that it starts in a fraction of a second
HOLD = f"""import importlib.util, pathlib, sys
spec = importlib.util.spec_from_file_location("lock", {str(REPO / "diverse_fairseq" / "runs" / "lock.py")!r})
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
with lock.run_lock(pathlib.Path(sys.argv[1]), {{"SLURM_JOB_ID": sys.argv[2]}}):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_one_run_is_trained_by_one_process(run, fakes, tmp_path):
    """Another process holds a run's lock: scripts/train.sh on that save directory and the table's job are refused
    before any work, naming it; once it is killed (SIGKILL: no clean-up) the run is free again."""
    job = table_jobs(TABLE, run)[0]
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(job.run_dir), ""], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        named = f"{job.run_dir} is being trained by another process: pid {holder.pid} on host {socket.gethostname()}"
        env = dict(os.environ, DATA_BIN=str(run.data_bin), SAVE_DIR=str(job.run_dir), GPUS="0")
        train_sh = subprocess.run(["bash", str(REPO / "scripts" / "train.sh"), "demo", "tiny"], env=env,
                                  capture_output=True, text=True, timeout=300)
        assert train_sh.returncode == 1 and named in train_sh.stderr, train_sh.stdout + train_sh.stderr
        assert f"(kill {holder.pid} on {socket.gethostname()}; it keeps its last checkpoint), then run the same " \
               "command again" in train_sh.stderr
        with pytest.raises(SystemExit, match="then run make table-t$") as refused:
            run_job(job, {})
        assert named in str(refused.value) and fakes == [] and not (job.run_dir / "key.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    run_job(job, {})  # the killed holder left nothing held
    assert len(fakes) == 1 and not json.loads((job.run_dir / "run.lock").read_text() or "{}")


def test_the_lock_names_a_slurm_job_and_is_the_first_nodes(run, fakes, tmp_path):
    """The holder's SLURM job is named; the other nodes of a multi-node run (NODE_RANK > 0, SLURM_NODEID > 0)
    train the run that the first node's process holds."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run"), "4242"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SystemExit, match=r"\(SLURM job 4242\), since .*\(scancel 4242; it keeps its last"):
            with run_lock(tmp_path / "run", {}):
                pass
        env = {"DATA_BIN": str(run.data_bin), "SAVE_DIR": str(tmp_path / "run"), "NNODES": "2", "MAX_UPDATE": "3"}
        training.run_from_env("demo", "tiny", [], dict(env, NODE_RANK="1"), gpus=0)
        assert len(fakes) == 1  # the second node trained
        with pytest.raises(SystemExit, match="is being trained by another process"):
            training.run_from_env("demo", "tiny", [], dict(env, NODE_RANK="0"), gpus=0)
    finally:
        holder.stdin.close()
        holder.wait()
    with run_lock(tmp_path / "run", {}):  # released when its holder ended
        pass
