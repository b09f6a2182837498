"""The directory to pass to fairseq's ``--user-dir``, wherever the package is installed.

``--user-dir diverse_fairseq`` is a path relative to the working directory, so it only works from the
repository root. From any directory, after ``pip install``, ask the package where it is::

    fairseq-train data-bin/demo --user-dir "$(python -m diverse_fairseq.user_dir)" ...

``python -m diverse_fairseq.user_dir`` prints :data:`USER_DIR`, the absolute path of this package, which
fairseq's ``import_user_module`` imports as the module ``diverse_fairseq``.
"""

from pathlib import Path

USER_DIR = str(Path(__file__).resolve().parent)


def main() -> int:
    """Print :data:`USER_DIR`."""
    print(USER_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
