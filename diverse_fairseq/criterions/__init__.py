"""criterions registered with fairseq when diverse_fairseq is imported."""

from . import disagreement_loss  # noqa: F401  (registers label_smoothed_cross_entropy_with_disagreement)
