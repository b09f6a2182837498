"""models registered with fairseq when diverse_fairseq is imported."""

from . import diverse_transformer  # noqa: F401  (registers diverse_transformer and its architectures)
