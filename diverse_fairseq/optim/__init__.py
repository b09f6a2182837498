"""Optimizers registered with fairseq when diverse_fairseq is imported: ``repulsive_adam`` (repulsive
attention, An et al. EMNLP 2020; :mod:`.repulsive_adam` says which module of this package does what).

Importing this package installs :mod:`diverse_fairseq.hooks` (models are tracked when built).
"""

from ..hooks import install_build_model_hook, track_model  # noqa: F401
from .repulsive import spos_direction, svgd_direction  # noqa: F401
from . import repulsive_adam  # noqa: F401  (side effect: registers --optimizer repulsive_adam)

install_build_model_hook()
