"""Logging and warnings of every process that runs this package, set in one place: :func:`quiet_libraries`.

It runs when the package is imported: fairseq's tools import it (``--user-dir``) while they parse their options,
before they build their hydra configuration, log it and train or decode; the package's own tools import it first.
:func:`setup_cli_logging` gives those tools fairseq's log format and applies it again. What it does, each thing
narrowly (by logger and message, by warning category and message):

* hydra-core 1.3's deprecation warnings about fairseq 0.12's calls, and hydra's DEBUG logging: importing
  ``fairseq.models`` runs ``logging.basicConfig(level=logging.DEBUG)``
  (``fairseq/models/wav2vec/wav2vec2_classification.py`` line 25);
* :data:`KNOWN_WARNINGS`, three warnings of torch about fairseq 0.12's calls, known to be harmless
  (docs/fairseq-notes.md, "Known warnings", says why for each);
* fairseq's line "--user-dir=... has already been imported." (fairseq logs it when a process that imported the
  package, an analysis or the table runner, loads a checkpoint: nothing is wrong);
* fairseq's configuration dump (``logger.info(cfg)``, lines of 8,000-12,000 characters) kept off the console; a
  ``--log-file`` (the table runner's ``train.log``) still receives it;
* one log format: fairseq's (``fairseq_cli/train.py``'s), also for fairseq-generate, whose own ``basicConfig``
  comes after that DEBUG one and does nothing, and for the package's tools.
"""

import argparse
import contextlib
import logging
import sys
import warnings
from typing import Dict, List

#: fairseq's log format and date format (fairseq_cli/train.py): every log line of a job has it
LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

#: libraries whose DEBUG/INFO chatter (matplotlib's font search, hydra's config loading) is noise here
NOISY_LOGGERS = ("matplotlib", "PIL", "hydra")

#: the starts of hydra-core 1.3's deprecation warnings for fairseq 0.12's use of it (after leading white space)
HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.\w+\(\) is no longer experimental",
    r"The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header",
    r"'[^']*' is validated against ConfigStore schema with the same name",
    r"The strict flag in the compose API is deprecated",
)

#: (category, start of the message) of torch's warnings about fairseq 0.12's calls that change nothing here
#: (docs/fairseq-notes.md, "Known warnings"): pinned memory asked for without a GPU (the data loaders of training
#: and decoding); the old spelling of autocast (fairseq's train and valid steps); a boolean key padding mask with
#: a float attention mask (fairseq's attention)
KNOWN_WARNINGS = (
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found"),
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated"),
    (UserWarning, r"Support for mismatched key_padding_mask and attn_mask is deprecated"),
)


class UserDirLine(logging.Filter):
    """Drops fairseq's "--user-dir=... has already been imported." (``fairseq.utils.import_user_module``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("--user-dir=") and message.endswith("has already been imported."))


class ConfigDump(logging.Filter):
    """Drops the configuration that fairseq's command-line tools log as an object (``logger.info(cfg)``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from omegaconf import DictConfig  # fairseq's dependency, imported by then wherever fairseq logs

        return not (record.name.startswith("fairseq_cli.") and isinstance(record.msg, (DictConfig,
                                                                                       argparse.Namespace)))


USER_DIR_LINE, CONFIG_DUMP = UserDirLine(), ConfigDump()


def _is_console(handler: logging.Handler) -> bool:
    """A stream handler that is not a log file's."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def quiet_libraries() -> None:
    """Apply what the module's docstring lists to this process: the warning filters, the ``hydra`` logger at
    WARNING, the user-dir line dropped, and on the root logger's console handlers the configuration dump dropped
    and fairseq's format where a bare ``basicConfig`` left Python's default one. Idempotent: an equal warning filter
    replaces the earlier one, a filter is added to a logger or handler once."""
    warnings.filterwarnings("ignore", message=r"\s*(?:" + "|".join(HYDRA_DEPRECATIONS) + ")", category=UserWarning)
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    logging.getLogger("hydra").setLevel(logging.WARNING)
    logging.getLogger("fairseq.utils").addFilter(USER_DIR_LINE)
    for handler in filter(_is_console, logging.getLogger().handlers):
        handler.addFilter(CONFIG_DUMP)
        if getattr(handler.formatter, "_fmt", None) == logging.BASIC_FORMAT:  # a bare basicConfig()'s
            handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))


def setup_cli_logging(level: int = logging.INFO) -> None:
    """Log to stderr at ``level`` in fairseq's format, with the noisy libraries at WARNING (``force=True``:
    importing fairseq leaves the root logger at DEBUG), and :func:`quiet_libraries` on the new handler."""
    logging.basicConfig(format=LOG_FORMAT, datefmt=DATE_FORMAT, level=level, stream=sys.stderr, force=True)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    quiet_libraries()


def _handlers() -> Dict[logging.Logger, List[logging.Handler]]:
    """{logger: its handlers} of the root logger and of every logger created so far."""
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    return {logger: list(logger.handlers) for logger in loggers}


@contextlib.contextmanager
def fairseq_main_logging(*handlers: logging.Handler):
    """For a fairseq command's ``main`` run in this process (fairseq-train's in ``training.train_here``,
    fairseq-generate's in ``evaluate.run_generate``): ``handlers`` first on the root logger, whose level is lowered
    to INFO where it is higher (fairseq's progress, summary and speed lines are INFO). Afterwards the level is put
    back, and ``handlers`` and those fairseq added to its loggers meanwhile are removed and closed (fairseq-train's
    ``--log-file`` handler would otherwise also receive the next run's lines in this process)."""
    root = logging.getLogger()
    level, before = root.level, _handlers()
    root.handlers[:0] = handlers  # first: they have seen a line by the time it is shown
    root.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        for logger, now in _handlers().items():
            for extra in now:
                if extra not in before.get(logger, ()):
                    logger.removeHandler(extra)
                    extra.close()
        root.setLevel(level)
