"""Logging of the package's command-line tools, and hydra's noise kept out of every fairseq command.

:func:`quiet_hydra` runs when fairseq's tools import :mod:`diverse_fairseq` (``--user-dir``), before they build
their hydra configuration: hydra-core 1.3 warns of fairseq 0.12's calls, and importing ``fairseq.models`` runs
``logging.basicConfig(level=logging.DEBUG)`` (``fairseq/models/wav2vec/wav2vec2_classification.py`` line 25).
"""

import logging
import sys
import warnings

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


def quiet_hydra() -> None:
    """Ignore those warnings by their text (other warnings, hydra's included, still show) and set the ``hydra``
    logger to WARNING. Idempotent: :func:`warnings.filterwarnings` replaces an equal filter."""
    warnings.filterwarnings("ignore", message=r"\s*(?:" + "|".join(HYDRA_DEPRECATIONS) + ")", category=UserWarning)
    logging.getLogger("hydra").setLevel(logging.WARNING)


def setup_cli_logging(level: int = logging.INFO) -> None:
    """Log to stderr at ``level`` in fairseq's format, with the noisy libraries at WARNING (``force=True``:
    importing fairseq leaves the root logger at DEBUG)."""
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=level,
                        stream=sys.stderr, force=True)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
