"""Clean logs (diverse_fairseq/runs/cli_logging.py, applied when the package is imported): the three warnings of
torch about fairseq's calls filtered by category and message (others still show), fairseq's user-dir line dropped,
its configuration dump kept off the console but in a log file, one log format. Here in this process, on the real
calls; the real fairseq-train and fairseq-generate processes are checked in test_run_life.py (Ctrl-C) and
tests/tables/test_tables.py (their logs, LIBRARY_NOISE), the analysis command in tests/analysis/test_analysis.py."""

import io
import logging
import re
import warnings
from argparse import Namespace

import torch
from omegaconf import OmegaConf

from diverse_fairseq.runs import cli_logging
from diverse_fairseq.runs.cli_logging import quiet_libraries, setup_cli_logging
from diverse_fairseq.user_dir import USER_DIR

#: a line of fairseq's log format: ``2024-05-01 12:00:00 | INFO | fairseq_cli.train | message``
FAIRSEQ_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| [\w.]+ \| .*")


def test_the_known_warnings_are_filtered_by_message_and_category_and_others_still_show():
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.zeros(1, 3, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # nothing hidden by an earlier showing
        quiet_libraries()
        list(torch.utils.data.DataLoader([1, 2], pin_memory=True))  # no GPU here: pinned memory unused
        with torch.cuda.amp.autocast(enabled=False):  # fairseq's spelling
            pass
        attention(x, x, x, key_padding_mask=torch.zeros(1, 3, dtype=torch.bool),
                  attn_mask=torch.zeros(3, 3))  # a boolean padding mask with a float attention mask
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found", DeprecationWarning)
        warnings.warn("Support for mismatched shapes is deprecated", UserWarning)
    assert [(w.category, str(w.message)) for w in seen] == [
        (DeprecationWarning, "'pin_memory' argument is set as true but no accelerator is found"),
        (UserWarning, "Support for mismatched shapes is deprecated")]


def test_fairseqs_user_dir_line_is_not_logged(caplog, monkeypatch):
    """fairseq logs it when a process that imported the package loads a checkpoint (the analysis, the runner)."""
    from fairseq import utils

    quiet_libraries()
    monkeypatch.setattr(utils.import_user_module, "memo", set(), raising=False)  # a fresh process's
    with caplog.at_level(logging.INFO):
        utils.import_user_module(Namespace(user_dir=USER_DIR))
        logging.getLogger("fairseq.utils").info("another line")
    assert [r.getMessage() for r in caplog.records if r.name == "fairseq.utils"] == ["another line"]


def test_the_configuration_dump_stays_off_the_console_and_in_the_log_file(tmp_path):
    """As in fairseq-train: the console handler of its basicConfig, then ``--log-file``'s handler on its logger;
    fairseq-generate's console handler (a bare basicConfig of fairseq.models) gets fairseq's format."""
    root, logger = logging.getLogger(), logging.getLogger("fairseq_cli.train")
    console, bare = io.StringIO(), io.StringIO()
    handlers = [logging.StreamHandler(console), logging.StreamHandler(bare)]
    handlers[0].setFormatter(logging.Formatter(cli_logging.LOG_FORMAT, cli_logging.DATE_FORMAT))
    handlers[1].setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    level = root.level
    try:
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(logging.INFO)
        quiet_libraries()
        log_file = logging.FileHandler(tmp_path / "train.log")
        logger.addHandler(log_file)
        logger.info(OmegaConf.create({"common": {"seed": 1, "log_file": "train.log"}}))
        logger.info("num. shared model params: 10")
    finally:
        logger.removeHandler(log_file)
        log_file.close()
        for handler in handlers:
            root.removeHandler(handler)
        root.setLevel(level)
    assert "'seed': 1" in (tmp_path / "train.log").read_text() and "seed" not in console.getvalue() + bare.getvalue()
    for text in (console.getvalue(), bare.getvalue()):
        [line] = text.splitlines()
        assert FAIRSEQ_LINE.fullmatch(line) and line.endswith("| fairseq_cli.train | num. shared model params: 10")


def test_the_command_line_tools_log_in_fairseqs_format(capsys):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        setup_cli_logging()
        logging.getLogger("diverse_fairseq.analysis").info("3 attention modules")
    finally:
        root.handlers[:] = handlers  # basicConfig(force=True) replaced them
        root.setLevel(level)
    [line] = capsys.readouterr().err.splitlines()
    assert FAIRSEQ_LINE.fullmatch(line) and line.endswith(" | INFO | diverse_fairseq.analysis | 3 attention modules")
