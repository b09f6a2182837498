"""Progress lines of data preparation (diverse_fairseq/data/progress.py): their format, the interval, and that a
real preparation prints them for download, tokenization, BPE and binarization, labelled with the step."""

import re
import time
from pathlib import Path

import pytest

from diverse_fairseq.data import progress
from diverse_fairseq.data.download import Source, fetch
from diverse_fairseq.data.prepare import main as prepare

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
ENV_KEYS = ("PROGRESS_INTERVAL", "BPE", "BPE_SIZE", "WORK_DIR", "DATA_BIN", "DEMO_DIR", "STOP_AFTER")


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    """Tests change the interval and the step label; put them back afterwards."""
    monkeypatch.setattr(progress, "interval", progress.interval)
    monkeypatch.setattr(progress, "_step", "")


def test_progress_lines_count_percent_elapsed_and_time_left():
    seen = []
    progress.set_interval(0)
    progress.begin_step("[demo] step 3/7")
    meter = progress.Progress("tokenize train.en", total=4, unit="lines", log=seen.append)
    meter.update(1)
    time.sleep(0.01)
    meter.update(1)
    assert re.fullmatch(r"\[demo\] step 3/7 tokenize train\.en: 1/4 lines \(25%\), \d+\.\ds elapsed(, about \S+ left)?",
                        seen[0]), seen
    assert re.fullmatch(r".*: 2/4 lines \(50%\), \d+\.\ds elapsed, about \S+ left", seen[1]), seen
    meter.close()  # every update was shown already: no repeated last line
    assert len(seen) == 2
    progress.begin_step("")
    seen.clear()
    progress.set_interval(0.5)
    meter = progress.Progress("clean train", total=4, unit="pairs", log=seen.append)
    meter.update(3)  # sooner than the interval: not shown
    time.sleep(0.6)
    meter.close()  # the work took longer than the interval: a last line with what was done
    assert seen == [seen[0]] and re.fullmatch(r"clean train: 3/4 pairs \(75%\), \d+\.\ds elapsed, done", seen[0]), seen
    progress.set_interval(0)
    seen.clear()
    with progress.Progress("download x.tgz", total=3 * 1024 * 1024, unit="bytes", initial=1024 * 1024,
                           log=seen.append) as meter:
        meter.update(1024 * 1024)
    assert re.fullmatch(r"download x\.tgz: 2\.0 MiB/3\.0 MiB \(67%\), \d+\.\ds elapsed, "
                        r"[\d.]+ [KMG]iB/s, about \S+ left",
                        seen[0]), seen
    assert len(seen) == 1  # the last update showed everything there was: no repeated last line


def test_progress_lines_are_spaced_by_the_interval():
    seen = []
    progress.set_interval(3600)
    with progress.Progress("clean train", total=10, log=seen.append) as meter:
        for _ in range(10):
            meter.update()
    assert seen == []  # faster than the interval: silent
    assert progress.duration(4.21) == "4.2s" and progress.duration(302) == "5m02s"
    assert progress.duration(7500) == "2h05m" and progress.size(512) == "512 B"
    with pytest.raises(SystemExit, match=r"PROGRESS_INTERVAL \(--progress-interval\)='soon' is not valid"):
        progress.set_interval("soon")
    with pytest.raises(SystemExit, match="PROGRESS_INTERVAL"):
        progress.set_interval("-1")


def test_heartbeat_reports_work_that_tells_nothing_about_itself():
    seen = []
    progress.set_interval(0)
    with progress.heartbeat("learn subword-nmt codes", log=seen.append):
        time.sleep(1.5)  # the heartbeat wakes at least every 0.5 s
    assert re.fullmatch(r"learn subword-nmt codes: running, \d+\.\ds elapsed", seen[0]), seen
    assert re.fullmatch(r"learn subword-nmt codes: done in \d+\.\ds", seen[-1]), seen


def test_a_preparation_prints_progress_for_each_long_step(tmp_path, capsys):
    prepare(["demo", "--demo-dir", str(FIXTURES / "demo_text"), "--work-dir", str(tmp_path / "work"),
             "--data-bin", str(tmp_path / "data-bin"), "--bpe", "subword-nmt", "--bpe-size", "100", "--workers", "1",
             "--progress-interval", "0"])
    out = capsys.readouterr().out
    elapsed = r"\d+\.\ds elapsed"
    for pattern in (
        rf"\[demo\] step 2/7 normalize train\.en: 60/60 lines \(100%\), {elapsed}",
        rf"\[demo\] step 3/7 tokenize train\.de: 60/60 lines \(100%\), {elapsed}",
        rf"\[demo\] step 4/7 clean train: 60/60 pairs \(100%\), {elapsed}",
        r"\[demo\] step 5/7 learn subword-nmt codes: done in \d+\.\ds",
        rf"\[demo\] step 6/7 subword-nmt test\.en\.tok: 6/6 lines \(100%\), {elapsed}",
        r"\[demo\] step 7/7 fairseq-preprocess: done in \d+\.\ds",
    ):
        assert re.search(pattern, out), f"no line matches {pattern!r} in:\n{out[-3000:]}"


def test_download_prints_bytes_of_the_total(tmp_path, capsys):
    progress.set_interval(0)
    source = Source("de-en.tgz", ("http://unreachable.invalid/de-en.tgz",))
    fetch(source, tmp_path, mirror=str(FIXTURES / "mirror"))
    size = (FIXTURES / "mirror" / "de-en.tgz").stat().st_size
    out = capsys.readouterr().out
    assert re.search(rf"copy de-en\.tgz: {re.escape(progress.size(size))}/{re.escape(progress.size(size))} "
                     rf"\(100%\), \d+\.\ds elapsed", out), out
    assert (tmp_path / "de-en.tgz").stat().st_size == size
