"""The default folders, one default each: inside the repository, whatever the current directory.

``scripts/*.sh``, the table runner and the Python entry points (``python -m diverse_fairseq.training``,
``.evaluate``, ``.data.prepare``, ``.interactive_command``) all use these when the variable is unset:

- ``DATA_BIN`` (the prepared, binarized datasets): ``<repository>/data-bin``
- ``CHECKPOINTS`` (the parent of the default save directories): ``<repository>/checkpoints``
- ``WORK_DIR`` (downloads and intermediate files of data preparation): ``<repository>/work``

A variable that is set is used as given (a relative path then is relative to the current directory).
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA_BIN = REPO / "data-bin"
CHECKPOINTS = REPO / "checkpoints"
WORK_DIR = REPO / "work"
DEFAULTS = {"DATA_BIN": DATA_BIN, "CHECKPOINTS": CHECKPOINTS, "WORK_DIR": WORK_DIR}


def from_env(name: str, env=None) -> Path:
    """The folder ``name`` (one of :data:`DEFAULTS`) as the environment sets it, else its default."""
    value = (os.environ if env is None else env).get(name)
    return Path(value) if value else DEFAULTS[name]
