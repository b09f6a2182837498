"""``python -m diverse_fairseq.probing CHECKPOINT [--tasks ...] [--data-dir DIR] [--download]``: linguistic probing.

The ten probing tasks of Conneau et al. (2018) (NAACL 2019 Table 1, the journal's Table 7) on the frozen
encoder of a translation checkpoint. See :mod:`diverse_fairseq.analysis.probing` and ``--help``.
"""

import sys

from diverse_fairseq.analysis.probing import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
