"""The directory to pass to fairseq's ``--user-dir``, wherever the package is installed.

``--user-dir diverse_fairseq`` is relative to the working directory (the repository root). From any directory,
after ``pip install``, ask the package where it is (fairseq's ``import_user_module`` imports :data:`USER_DIR`,
this package's absolute path, as the module ``diverse_fairseq``)::

    fairseq-train data-bin/demo --user-dir "$(python -m diverse_fairseq.user_dir)" ...
"""

from pathlib import Path

USER_DIR = str(Path(__file__).resolve().parent)

if __name__ == "__main__":
    print(USER_DIR)
