"""Optimizers registered with fairseq when diverse_fairseq is imported.

* ``repulsive_adam`` (:mod:`.repulsive_adam`): Adam whose per-head Q/K/V gradients are replaced by an
  SVGD or SPOS update (repulsive attention, An et al. EMNLP 2020); core math in :mod:`.repulsive`,
  particle discovery in :mod:`.particles`.

Importing this package also wraps ``fairseq.models.build_model`` so that built models are tracked
(see :mod:`.particles`).
"""

from .particles import install_build_model_hook, track_model  # noqa: F401
from .repulsive import spos_direction, svgd_direction  # noqa: F401
from . import repulsive_adam  # noqa: F401  (side effect: registers --optimizer repulsive_adam)

install_build_model_hook()
