"""The default folders of ``scripts/*.sh``, the table runner and the Python entry points, one default each, inside
the repository whatever the current directory: ``DATA_BIN`` (the binarized datasets), ``CHECKPOINTS`` (the parent
of the default save directories) and ``WORK_DIR`` (downloads and intermediate files of data preparation). A
variable that is set is used as given (a relative path then is relative to the current directory). Each is one
option field (:mod:`.options`), the same in every command that has it.
"""

from dataclasses import dataclass
from pathlib import Path

from .options import option
from .options import path as a_path

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {"DATA_BIN": REPO / "data-bin", "CHECKPOINTS": REPO / "checkpoints", "WORK_DIR": REPO / "work"}
DATA_BIN, CHECKPOINTS, WORK_DIR = DEFAULTS.values()


def data_bin_option(help: str = "root of the binarized datasets (default: the repository's data-bin/)"):
    return option("DATA_BIN", help, DATA_BIN, a_path)


def checkpoints_option():
    return option("CHECKPOINTS", "parent of the default save directories (default: the repository's checkpoints/)",
                  CHECKPOINTS, a_path)


def work_dir_option():
    return option("WORK_DIR", "root of intermediate files (default: the repository's work/)", WORK_DIR, a_path)


@dataclass(frozen=True)
class DataBin:
    """The ``--data-bin`` option of a command that reads prepared datasets by name."""

    data_bin: Path = data_bin_option()
