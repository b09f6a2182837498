"""The default folders of ``scripts/*.sh``, the table runner and the Python entry points, one default each, inside
the repository whatever the current directory: ``DATA_BIN`` (the binarized datasets), ``CHECKPOINTS`` (the parent
of the default save directories) and ``WORK_DIR`` (downloads and intermediate files of data preparation). A
variable that is set is used as given (a relative path then is relative to the current directory).
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {"DATA_BIN": REPO / "data-bin", "CHECKPOINTS": REPO / "checkpoints", "WORK_DIR": REPO / "work"}
DATA_BIN, CHECKPOINTS, WORK_DIR = DEFAULTS.values()


def from_env(name: str, env=None) -> Path:
    """The folder ``name`` (one of :data:`DEFAULTS`) as the environment sets it, else its default."""
    value = (os.environ if env is None else env).get(name)
    return Path(value) if value else DEFAULTS[name]
