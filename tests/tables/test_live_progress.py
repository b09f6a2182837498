"""Live progress of a table row's training (diverse_fairseq/tables/progress.py): the log path when a
row starts, then a line with update, losses and the time left, read from fairseq's JSON log while it grows."""

import re
import time
from pathlib import Path

from conftest import fake_prepared, job_record, tiny_train_args
from fairseq_in_process import fairseq_train

from diverse_fairseq.tables.config import RunConfig
from diverse_fairseq.tables.job import make_job
from diverse_fairseq.tables.progress import LogWatcher, Progress, progress_line
from diverse_fairseq.tables.spec import Row, Table

START = ("{'_name': None, 'common': {'_name': None, 'log_format': 'json'}, 'optimization': {'_name': None, "
         "'max_epoch': 0, 'max_update': 800, 'stop_time_hours': 0.0}}")


def _inner(updates, loss, wall):
    return (f'{{"epoch": 1, "update": 0.5, "loss": "{loss}", "nll_loss": "7.1", "num_updates": "{updates}", '
            f'"train_wall": "20", "wall": "{wall}"}}')


def test_no_line_before_the_first_update():
    assert progress_line("") is None
    assert progress_line(START + "\nnum. shared model params: 1,234 (num. trained: 1,234)\n") is None


def test_update_loss_and_time_left_from_the_rate_so_far():
    log = "\n".join([START, _inner(100, 9.5, 20), _inner(200, 7.1234, 30)])
    # 100 updates in fairseq's 10 s since the first record (the start-up before it does not count): 600 more take
    # 60 s; with one record only, its 100 updates in 20 s: 700 more take 140 s
    assert progress_line(log) == "update 200/800 (25%), train loss 7.123; about 0:01:00 left"
    assert progress_line("\n".join([START, _inner(100, 9.5, 20)])).endswith("; about 0:02:20 left")


def test_last_validation_with_its_bleu_and_an_epoch_summary():
    log = "\n".join([
        START, _inner(100, 9.5, 20),
        '{"epoch": 1, "train_loss": "8.0", "train_num_updates": "150", "train_train_wall": "25", "train_wall": "50"}',
        # console form of a validation record (after fairseq's logging prefix)
        '2026-01-01 00:00:01 | INFO | valid | {"epoch": 1, "valid_loss": "7.5", "valid_bleu": "3.14159", '
        '"valid_num_updates": "150", "valid_best_bleu": "3.14"}',
    ])
    # 50 updates in 30 s: 650 more take 390 s
    assert progress_line(log) == ("update 150/800 (18%), train loss 8.000, valid loss 7.500, BLEU 3.14 (update 150); "
                                  "about 0:06:30 left")
    # the summary of an epoch that ends at the last logged update: the last train loss stays the logged one
    same = "\n".join([START, _inner(150, 7.25, 50), '{"epoch": 1, "train_loss": "8.0", "train_num_updates": "150"}'])
    assert progress_line(same) == "update 150/800 (18%), train loss 7.250; about 0:03:37 left"
    later = log + "\n" + _inner(200, 6.0, 60)
    assert progress_line(later).startswith("update 200/800 (25%), train loss 6.000, valid loss 7.500, BLEU 3.14 "
                                           "(update 150); about 0:04:00 left")


def test_a_resumed_run_takes_the_last_start_up_and_the_whole_runs_rate():
    first = "\n".join([START, _inner(400, 5.0, 100)])
    resumed = first + "\n" + START.replace("'max_update': 800", "'max_update': 1600") + "\n" + _inner(500, 4.5, 125)
    assert progress_line(resumed) == "update 500/1600 (31%), train loss 4.500; about 0:04:35 left"
    # the rate since the restart's first record: 100 updates in 50 s
    assert progress_line(resumed + "\n" + _inner(600, 4.4, 175)).endswith("; about 0:08:20 left")
    done = first + "\n" + _inner(800, 4.0, 200)
    assert progress_line(done) == "update 800/800 (100%), train loss 4.000; training done"
    no_limit = _inner(10, 9.0, 5)  # --max-epoch only: no update count to reach
    assert progress_line(no_limit) == "update 10, train loss 9.000"


def test_the_watcher_prints_only_what_was_logged_after_it_started(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(START + "\n" + _inner(800, 4.0, 200) + "\n")  # a finished run, reused: no line for it
    seen = []
    watcher = LogWatcher(log, 30, seen.append)
    watcher.poll()
    assert seen == []
    with open(log, "a") as f:
        f.write(START + "\n")
    watcher.poll()  # a resumed run that has not logged an update yet shows where it stands
    assert seen == ["update 800/800 (100%), train loss 4.000; training done"]
    watcher.poll()
    assert len(seen) == 1  # nothing new: no second line
    fresh = tmp_path / "fresh.log"
    watcher = LogWatcher(fresh, 30, seen.append)
    watcher.poll()  # not written yet
    fresh.write_text(START + "\n" + _inner(100, 9.0, 10) + "\n")
    watcher.poll()
    assert seen[-1] == "update 100/800 (12%), train loss 9.000; about 0:01:10 left"


def _one_row(tmp_path, interval, jobs=1):
    table = Table(table="t", title="t", baseline="base", rows=[Row(id="base", label="Base", family="transformer")])
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path / "results", jobs=jobs,
                    progress_interval=interval, data_bin=fake_prepared(tmp_path / "data-bin", "demo"))
    return table, run, make_job(table.table, table.rows[0], run, 1)


def test_the_start_line_names_the_log(tmp_path, capsys):
    table, run, job = _one_row(tmp_path, 0)
    progress = Progress(table, run, total=1)
    progress.begin(job)
    progress.end(job, job_record(bleu=1.0))
    assert f"started; elapsed 0:00:00, estimated remaining unknown; training log: " \
           f"{run.run_dir(table.rows[0], 1) / 'train.log'}" in capsys.readouterr().out
    table, run, job = _one_row(tmp_path, 0, jobs=2)
    progress = Progress(table, run, total=1)
    progress.begin(job)
    progress.end(job, job_record(bleu=1.0))
    assert f"started; elapsed 0:00:00, estimated remaining unknown; log: {run.log_path(table.rows[0], 1)}" in \
        capsys.readouterr().out


def test_an_interrupted_run_of_the_same_command_starts_as_resuming_from_its_update(tmp_path, capsys):
    """The start line of a job whose run directory holds its interrupted run (key.json of the job's cache key and
    checkpoint_last.pt at update 45) says where it resumes; a run of another command (another key) is "started"."""
    import json

    import torch

    from diverse_fairseq.tables.cache import cache_key

    table, run, job = _one_row(tmp_path, 0)
    job.run_dir.mkdir(parents=True)
    torch.save({"optimizer_history": [{"num_updates": 45}]}, job.run_dir / "checkpoint_last.pt")
    for key, line in ((cache_key(job.plan), "resuming from update 45; elapsed"), ({"other": 1}, "started; elapsed")):
        (job.run_dir / "key.json").write_text(json.dumps(key))
        progress = Progress(table, run, total=1)
        progress.begin(job)
        progress.end(job, job_record(bleu=1.0))
        assert f"[t] row 1 of 1 (seed 1) Base: {line}" in capsys.readouterr().out


def test_progress_lines_while_a_real_tiny_run_trains(tiny_data, tmp_path, capsys):
    table, run, job = _one_row(tmp_path, 0)  # every record fairseq logs (read every 0.5 s)
    row = table.rows[0]
    run_dir = run.run_dir(row, 1)
    args = [str(a) for a in tiny_train_args(tiny_data, run_dir, max_update=8)]
    args[args.index("simple")] = "json"
    args += ["--log-file", str(run_dir / "train.log")]
    run_dir.mkdir(parents=True)
    progress = Progress(table, run, total=1)
    progress.begin(job)
    # fairseq-train in this process (one torch thread); the watcher's lines printed while it trains land in its
    # returned output (fairseq_train redirects stdout), the later ones in capsys: together, in the order printed
    during = fairseq_train(args)  # its --log-file handlers are closed and removed afterwards (fairseq_in_process)
    time.sleep(1.0)  # one more look at the finished log
    progress.end(job, job_record())
    printed = during + capsys.readouterr().out
    lines = [line for line in printed.splitlines() if ": update " in line]
    assert lines, "no progress line while the run trained"
    pattern = re.compile(r"^\[t\] row 1 of 1 \(seed 1\) Base: update (\d+)/8 \(\d+%\), train loss \d+\.\d{3}"
                         r"(, valid loss \d+\.\d{3} \(update \d+\))?(; about \d:\d\d:\d\d left|; training done)?$")
    numbers = []
    for line in lines:
        match = pattern.match(line)
        assert match, line
        numbers.append(int(match.group(1)))
    assert numbers == sorted(numbers) and len(set(lines)) == len(lines)  # forward only, never the same line twice
    final = progress_line(Path(run_dir / "train.log").read_text())
    assert final.startswith("update 8/8 (100%), train loss ") and "valid loss " in final
    assert final.endswith("; training done") and lines[-1].endswith(final)
