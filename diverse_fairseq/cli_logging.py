"""Logging set-up shared by the package's command-line tools (``python -m diverse_fairseq.tables``,
``python -m diverse_fairseq.analyze``)."""

import logging
import sys

#: libraries whose DEBUG/INFO chatter (matplotlib's font search, hydra's config loading) is noise here
NOISY_LOGGERS = ("matplotlib", "PIL", "hydra")


def setup_cli_logging(level: int = logging.INFO) -> None:
    """Log to stderr at ``level`` in fairseq's format, with the noisy libraries at WARNING.

    ``force=True``: importing fairseq leaves the root logger at DEBUG, so without it every matplotlib font
    lookup of the analysis pictures would be printed.
    """
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=level,
                        stream=sys.stderr, force=True)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
