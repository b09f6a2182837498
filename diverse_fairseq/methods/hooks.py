"""The one patch diverse_fairseq applies to fairseq: ``fairseq.models.build_model`` remembers its models.

Why fairseq forces it: the trainer builds the optimizer with ``build_optimizer(cfg, params)``, which
receives only the parameters, never the model. ``--optimizer repulsive_adam`` needs the model's structure
(which parameters are the q/k/v projections of which attention module, with how many heads; see
:mod:`diverse_fairseq.methods.repulsive.particles`), so it has to find the model some other way.

What it hooks: :func:`install_build_model_hook` (called once when :mod:`diverse_fairseq.methods` is
imported; idempotent) wraps ``fairseq.models.build_model``, which every task's ``build_model`` calls
(fairseq-train, fairseq-hydra-train and checkpoint loading alike), so that each model it returns is
added to a ``WeakSet`` (a model nobody references any more is forgotten). Nothing else is changed: the
wrapper returns the same model. Models built some other way (e.g. ``ModelClass.build_model(args, task)``
directly) can be registered with :func:`track_model`.
"""

import functools
import weakref
from typing import List

from torch import nn

_TRACKED_MODELS: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def track_model(model: nn.Module) -> nn.Module:
    """Register ``model`` so that ``repulsive_adam`` can find its attention modules; returns it."""
    _TRACKED_MODELS.add(model)
    return model


def tracked_models() -> List[nn.Module]:
    """The live models built through ``fairseq.models.build_model`` or passed to :func:`track_model`."""
    return list(_TRACKED_MODELS)


def install_build_model_hook() -> None:
    """Wrap ``fairseq.models.build_model`` once so that every model it builds is tracked."""
    import fairseq.models as fairseq_models

    original = fairseq_models.build_model
    if getattr(original, "_diverse_fairseq_tracks_models", False):
        return

    @functools.wraps(original)
    def build_model(*args, **kwargs):
        return track_model(original(*args, **kwargs))

    build_model._diverse_fairseq_tracks_models = True
    fairseq_models.build_model = build_model
