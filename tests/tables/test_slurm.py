"""The table runner on a real SLURM cluster (``LAUNCHER=slurm``, tables/slurm.py): the one-node cluster of
scripts/slurm_cluster.sh on this machine (the session's ``slurm_cluster`` fixture starts it; where it cannot, these
tests skip with the script's one line). Each test runs test_tables' tiny table (``TABLE``, ``TINY``, one seed):

* through SLURM it gives exactly the numbers of the local run (``tiny_table_local``, the end-to-end test's), with
  the state changes, logs and progress lines on the way; the same command again submits nothing;
* a job that a second invocation finds queued or running is followed, not submitted again; Ctrl-C leaves it running
  and names scancel; cancelled with scancel, it is reported CANCELLED with the end of its log;
* a job that reaches a one-minute time limit (tests/tables/slurm_stall_hook.py stalls it after its first
  checkpoint) is submitted again and resumes from checkpoint_last.pt. It is submitted first of all (``time_limited``)
  so that its minute passes while the other tests run.
"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ctrl_c_as_in_a_terminal, demo_text_env, once_per_session
from test_tables import TABLE, TINY

REPO = Path(__file__).resolve().parents[2]
HOOK = Path(__file__).with_name("slurm_stall_hook.py")
LIMITED = TINY + " --max-update 4"  # the time-limit test's run: two updates before its time limit, two after
#: the table runner's variables that would change these runs, unset for each test
ENV_KEYS = ("LAUNCHER", "PARTITION", "ACCOUNT", "QOS", "CONSTRAINT", "TIME_LIMIT", "SBATCH_ARGS", "NODES", "WAIT",
            "RESUBMIT", "TRAIN_HOOK", "ROWS", "SEEDS", "GPUS", "JOBS", "RESULTS", "TRAIN_ARGS", "GENERATE_ARGS",
            "SUBSETS", "MAX_UPDATE", "PROGRESS_INTERVAL", "DRY_RUN", "THREADS")


def _command(root: Path, out: str, train_args: str = TINY):
    table = root / f"{out}.yaml"  # one per test: tests on other xdist workers run beside it in the same folder
    table.write_text(TABLE)
    return [str(table), "--dataset", "demo", "--scale", "demo", "--data-bin", str(root / "data-bin"), "--out",
            str(root / out), "--train-args", train_args, "--generate-args", "--beam 2 --max-len-b 5", "--seeds", "1"]


def _environment(root: Path, **variables) -> dict:
    return dict(demo_text_env(root), LAUNCHER="slurm", GPUS="0", THREADS="1", PROGRESS_INTERVAL="1",
                PYTHONUNBUFFERED="1", **variables)


def _table(root: Path, out: str, monkeypatch, capfd, train_args: str = TINY, **variables):
    """``python -m diverse_fairseq.tables`` of the tiny table with LAUNCHER=slurm and ``variables``, results in
    ``root/out``, run by its ``main`` in this process: (exit status, its output and its error message)."""
    capfd.readouterr()
    status, message = _main_here(root, out, monkeypatch, train_args, **variables)
    out_, err = capfd.readouterr()
    return status, out_ + err + message


def _main_here(root: Path, out: str, monkeypatch, train_args: str = TINY, **variables):
    """(exit status, error message) of :func:`_table`'s run of ``main``. What main changes in the process (the root
    logger, torch's threads) is put back."""
    import logging

    import torch

    from diverse_fairseq.tables.__main__ import main

    for name, value in _environment(root, **variables).items():
        monkeypatch.setenv(name, value)
    root_logger = logging.getLogger()
    handlers, level, threads = list(root_logger.handlers), root_logger.level, torch.get_num_threads()
    try:
        main(_command(root, out, train_args))
    except SystemExit as e:
        return (e.code or 0, "") if isinstance(e.code, int) or e.code is None else (1, str(e.code))
    finally:
        root_logger.handlers[:] = handlers
        root_logger.setLevel(level)
        torch.set_num_threads(threads)
    return 0, ""


def _sacct(slurm_id: str) -> str:
    return subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", slurm_id], capture_output=True,
                          text=True).stdout.strip().split(" ")[0]


def _submissions(run_dir: Path):
    return [(s["job_id"], s["state"]) for s in json.loads((run_dir / "slurm.json").read_text())["submissions"]]


@pytest.fixture(scope="session", autouse=True)
def time_limited(slurm_cluster, demo_text_prepared, tmp_path_factory, worker_id):
    """The time-limit test's job, submitted (``WAIT=0``) before this module's first test, and before the session
    fixtures its tests use (``tiny_table_local``: hence the session scope), so that its minute passes meanwhile: the
    first row alone, four updates, TIME_LIMIT=1, slurm_stall_hook.py as fairseq-train; once per session, also when
    xdist's workers share this module's tests. Returns its results folder."""
    root = demo_text_prepared

    def submit(_):
        with pytest.MonkeyPatch.context() as monkeypatch:
            status, message = _main_here(root, "results-time-limit", monkeypatch, LIMITED, WAIT="0", TIME_LIMIT="1",
                                         ROWS="base", TRAIN_HOOK=str(HOOK))
        assert status == 0, message

    once_per_session(tmp_path_factory, worker_id, "time_limited", submit)
    return root / "results-time-limit"


@pytest.mark.slow
def test_the_tiny_table_on_slurm_has_the_local_runs_numbers_and_a_rerun_submits_nothing(
        tiny_table_local, monkeypatch, capfd):
    root = tiny_table_local.table.parent
    status, out = _table(root, "results-slurm", monkeypatch, capfd)
    assert status == 0, out[-4000:]
    assert "2 rows x 1 seed(s) = 2 jobs, each a SLURM job" in out
    runs = root / "results-slurm" / "demo-demo" / "runs"
    for row in ("base", "dis"):
        run_dir = runs / row / "seed1"
        found = re.search(rf"row {row} seed 1: submitted: SLURM job (\d+), PENDING \(log: (\S+)\)", out)
        assert found, out[-4000:]
        slurm_id, log = found.group(1), run_dir / "slurm" / f"{found.group(1)}_0_log.out"
        assert found.group(2) == str(log)  # the job's SLURM log, beside its run
        assert f"row {row} seed 1: SLURM job {slurm_id} RUNNING (log: {log})" in out
        assert re.search(rf"row {row} seed 1: SLURM job {slurm_id} COMPLETED: BLEU \d+\.\d\d\n", out)
        assert "[train] " in log.read_text() and _sacct(slurm_id) == "COMPLETED"
        script = (run_dir / "slurm" / f"{slurm_id}_submission.sh").read_text()  # submitit's sbatch script
        assert "--cpus-per-task=1\n" in script and "--signal=USR2@0\n" in script and "--time" not in script
        assert _submissions(run_dir) == [(slurm_id, "COMPLETED")]
        # exactly the local run's numbers and translations (tiny_table_local: the same table, seed 1)
        local, cluster = tiny_table_local.records[row, 1], json.loads((run_dir / "job.json").read_text())
        for key in ("train_loss", "valid_loss", "valid_nll_loss", "updates", "parameters"):
            assert cluster["train"][key] == local["train"][key], (row, key)
        for key in ("bleu", "tok_bleu", "sentences"):
            assert cluster["evals"]["test"][key] == local["evals"]["test"][key], (row, key)
        assert (run_dir / "eval" / "hyp.detok.de").read_text() == tiny_table_local.hypotheses[row, 1]
    # the live progress line, read from the run's train.log while the job runs on the node
    assert re.search(r"row \w+ seed 1: update 3/3 \(100%\), train loss \d+\.\d{3}", out), out[-4000:]
    assert (root / "results-slurm" / "demo.md").exists()

    status, out = _table(root, "results-slurm", monkeypatch, capfd)  # the same command again: nothing submitted
    assert status == 0 and "submitted" not in out and out.count(": finished earlier: BLEU") == 2, out[-4000:]
    for row in ("base", "dis"):
        assert len(_submissions(runs / row / "seed1")) == 1


def _read_until(proc, pattern: str, timeout: float = 300) -> str:
    """The output of ``proc`` up to the first line matching ``pattern`` (or its end)."""
    seen, end = [], time.time() + timeout
    while time.time() < end:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            break
    return "".join(seen)


@pytest.mark.slow
def test_a_queued_or_running_job_is_followed_not_submitted_again_and_scancel_reports_it_cancelled(
        demo_text_prepared, monkeypatch, capfd):
    root = demo_text_prepared
    # slurm_stall_hook.py holds the job RUNNING after its second update until it is cancelled, however long the
    # second invocation takes on a loaded machine (a plain three-update job may end before it is looked at)
    first = subprocess.Popen([sys.executable, "-m", "diverse_fairseq.tables", *_command(root, "results-cancel")],
                             env=_environment(root, ROWS="base", TRAIN_HOOK=str(HOOK)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_as_in_a_terminal)
    slurm_id = None
    try:
        seen = _read_until(first, r"submitted: SLURM job \d+")
        slurm_id = re.search(r"row base seed 1: submitted: SLURM job (\d+), PENDING", seen).group(1)
        # running, so that its log exists when it is cancelled (on a cluster busy with the other tests' jobs it may
        # wait its turn in the queue first)
        seen += _read_until(first, rf"SLURM job {slurm_id} RUNNING")
        assert f"SLURM job {slurm_id} RUNNING" in seen, seen
        # a second invocation while the first one waits: it follows the job, it does not submit it again
        status, out = _table(root, "results-cancel", monkeypatch, capfd, ROWS="base", WAIT="0", TRAIN_HOOK=str(HOOK))
        assert status == 0, out[-3000:]
        assert re.search(rf"row base seed 1: SLURM job {slurm_id} (PENDING|RUNNING|\(not in sacct yet\)), submitted "
                         rf"earlier: followed, not submitted again", out), out[-3000:]
        assert "To collect them, run " in out and f"to cancel them: scancel {slurm_id}" in out
        # Ctrl-C while the first waits: the job keeps running; the lines say how to collect and cancel it
        first.send_signal(signal.SIGINT)
        rest = first.communicate(timeout=120)[0]
    finally:
        if first.poll() is None:
            first.kill()
            if slurm_id is not None:  # a failed test leaves no job running
                subprocess.run(["scancel", slurm_id])
    assert first.returncode == 130, seen + rest
    assert "Ctrl-C: the jobs keep running on the cluster; to collect them, run " in rest
    assert f"; to cancel them: scancel {slurm_id}" in rest
    assert _sacct(slurm_id) in ("PENDING", "RUNNING")
    run_dir = root / "results-cancel" / "demo-demo" / "runs" / "base" / "seed1"
    assert [i for i, _ in _submissions(run_dir)] == [slurm_id]

    subprocess.run(["scancel", slurm_id], check=True)
    for _ in range(60):
        if _sacct(slurm_id) == "CANCELLED":
            break
        time.sleep(0.5)
    status, out = _table(root, "results-cancel", monkeypatch, capfd, ROWS="base", TRAIN_HOOK=str(HOOK))  # collect
    log = run_dir / "slurm" / f"{slurm_id}_0_log.out"
    assert status == 1, out[-3000:]
    assert f"row base seed 1: SLURM job {slurm_id} CANCELLED; the end of its log ({log}):\n    | " in out
    assert (f"error: 1 job(s) failed on the cluster:\n  row base seed 1: SLURM job {slurm_id} CANCELLED, log {log}"
            in out)
    assert "other failed jobs are submitted again with RESUBMIT=failed" in out
    assert [i for i, _ in _submissions(run_dir)] == [slurm_id]  # not submitted again without RESUBMIT=failed


@pytest.mark.slow
def test_a_job_that_reaches_its_time_limit_is_submitted_again_and_resumes(time_limited, monkeypatch, capfd):
    root = time_limited.parent
    run_dir = time_limited / "demo-demo" / "runs" / "base" / "seed1"
    first = _submissions(run_dir)[0][0]
    # collect: the same command, but a longer time limit for the rest of the job (the tests share two cores), and
    # plain fairseq-train, which resumes from checkpoint_last.pt (TRAIN_HOOK is not part of the job's key)
    status, out = _table(root, "results-time-limit", monkeypatch, capfd, LIMITED, ROWS="base", TIME_LIMIT="10")
    assert status == 0, out[-4000:]
    found = re.search(rf"SLURM job {first} TIMEOUT, submitted again to resume from checkpoint_last.pt: SLURM job "
                      rf"(\d+), PENDING", out)
    assert found, out[-4000:]
    again = found.group(1)
    assert f"SLURM job {again} COMPLETED: BLEU" in out
    assert _submissions(run_dir) == [(first, "TIMEOUT"), (again, "COMPLETED")]
    assert "#SBATCH --time=1\n" in (run_dir / "slurm" / f"{first}_submission.sh").read_text()
    assert "#SBATCH --time=10\n" in (run_dir / "slurm" / f"{again}_submission.sh").read_text()
    stalled = (run_dir / "slurm" / f"{first}_0_log.out").read_text()
    assert "trained to update 2; waiting for the time limit" in stalled and "DUE TO TIME LIMIT" in stalled
    resumed = (run_dir / "slurm" / f"{again}_0_log.out").read_text()  # fairseq-train's output among the job's
    assert "[base seed 1] resuming the interrupted run" in resumed
    assert re.search(r"Loaded checkpoint \S+/checkpoint_last\.pt \(epoch \d+ @ 2 updates\)", resumed), resumed[-3000:]
    assert json.loads((run_dir / "job.json").read_text())["train"]["updates"] == 4
