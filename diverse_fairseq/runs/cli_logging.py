"""Logging set-up shared by the package's command-line tools (``python -m diverse_fairseq.tables``,
``python -m diverse_fairseq.analyze``), and the hydra noise of every fairseq command that loads the package.

:func:`quiet_hydra` runs when :mod:`diverse_fairseq` is imported, which fairseq's command-line tools do while
parsing ``--user-dir diverse_fairseq``, before they turn their arguments into a hydra configuration
(``fairseq.dataclass.utils.convert_namespace_to_omegaconf``). That conversion prints, before every train,
generate and interactive command:

* six deprecation warnings of hydra-core 1.3 about the API that fairseq 0.12 calls (``hydra.experimental``'s
  ``initialize``/``compose``, no ``version_base``, ``strict=False``, ``# @package _group_`` headers, schema
  matching); nothing a user of fairseq can change;
* ``DEBUG:hydra.core.utils:Setting JobRuntime:...`` lines: importing ``fairseq.models`` runs
  ``logging.basicConfig(level=logging.DEBUG)`` in ``fairseq/models/wav2vec/wav2vec2_classification.py`` (line 25
  of fairseq-fixed 0.12.3.1), so in fairseq-generate and fairseq-interactive, which configure logging only
  after that import, hydra's debug records are printed.
"""

import logging
import sys
import warnings

#: libraries whose DEBUG/INFO chatter (matplotlib's font search, hydra's config loading) is noise here
NOISY_LOGGERS = ("matplotlib", "PIL", "hydra")

#: the starts of the deprecation warnings that hydra-core 1.3 gives for fairseq 0.12's use of it (matched after
#: leading white space, as :func:`warnings.filterwarnings` matches a message's start)
HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.\w+\(\) is no longer experimental",
    r"The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header",
    r"'[^']*' is validated against ConfigStore schema with the same name",
    r"The strict flag in the compose API is deprecated",
)


def quiet_hydra() -> None:
    """Keep hydra's deprecation warnings about fairseq's calls and its DEBUG records out of the output: the
    warnings are ignored by their text (other warnings, hydra's included, still show), the ``hydra`` logger is
    set to WARNING (its warnings and errors still show). Idempotent."""
    pattern = r"\s*(?:" + "|".join(HYDRA_DEPRECATIONS) + ")"
    if not any(f[0] == "ignore" and getattr(f[1], "pattern", None) == pattern for f in warnings.filters):
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    logging.getLogger("hydra").setLevel(logging.WARNING)


def setup_cli_logging(level: int = logging.INFO) -> None:
    """Log to stderr at ``level`` in fairseq's format, with the noisy libraries at WARNING.

    ``force=True``: importing fairseq leaves the root logger at DEBUG, so without it every matplotlib font
    lookup of the analysis pictures would be printed.
    """
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=level,
                        stream=sys.stderr, force=True)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
