"""``python -m diverse_fairseq.analyze CHECKPOINT [...]``: head-diversity analysis of translation checkpoints.

Disagreement scores (EMNLP 2018 Tables 4–5), head importance by ablation (Michel et al. 2019; EMNLP 2020
Figure 2) and pictures (heatmaps, t-SNE as in the journal version's Figure 3). See
:mod:`diverse_fairseq.analysis` and ``python -m diverse_fairseq.analyze --help``.
"""

import sys

from diverse_fairseq.analysis.__main__ import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
