"""The one patch diverse_fairseq applies to fairseq: ``fairseq.models.build_model`` remembers its models.

Why fairseq forces it: the trainer builds the optimizer with ``build_optimizer(cfg, params)``, which
receives only the parameters, never the model. ``--optimizer repulsive_adam`` needs the model's structure
(which parameters are the q/k/v projections of which attention module, with how many heads; see
:mod:`diverse_fairseq.methods.repulsive.particles`), so it has to find the model some other way.

What it hooks: :func:`install_build_model_hook` (called once when :mod:`diverse_fairseq.methods` is
imported; idempotent) wraps ``fairseq.models.build_model``, which every task's ``build_model`` calls
(fairseq-train, fairseq-hydra-train and checkpoint loading alike), so that each model it returns is
added to a ``WeakSet`` (a model nobody references any more is forgotten), and remembered as the last model
built for its task (:func:`model_built_for`). Nothing else is changed: the wrapper returns the same model.
Models built some other way (e.g. ``ModelClass.build_model(args, task)`` directly) can be registered with
:func:`track_model`.

The second use: fairseq_cli/train.py builds the task, then the model (``task.build_model``), then the criterion
(``task.build_criterion``, which passes the criterion the task but not the model), then the trainer, and the
optimizer only when the trainer first needs it. A criterion that needs a certain model (the disagreement
criterion needs ``--arch diverse_transformer*``) finds the model of its task with :func:`model_built_for` and
refuses a wrong one when it is built, before any training step (a failing step would leave a ``crash.pt``).
"""

import functools
import weakref
from typing import List, Optional

from torch import nn

_TRACKED_MODELS: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
# task → weak reference to the last model built for it; both weak, so neither is kept alive by this table
_MODEL_OF_TASK: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def track_model(model: nn.Module) -> nn.Module:
    """Register ``model`` so that ``repulsive_adam`` can find its attention modules; returns it."""
    _TRACKED_MODELS.add(model)
    return model


def tracked_models() -> List[nn.Module]:
    """The live models built through ``fairseq.models.build_model`` or passed to :func:`track_model`."""
    return list(_TRACKED_MODELS)


def model_built_for(task) -> Optional[nn.Module]:
    """The last live model that ``fairseq.models.build_model`` built for ``task`` (fairseq-train's model when its
    criterion is built), or None (a task that built none, or one that cannot be weakly referenced)."""
    try:
        ref = _MODEL_OF_TASK.get(task)
    except TypeError:
        return None
    return ref() if ref is not None else None


def _remember_task(model: nn.Module, task) -> None:
    try:
        _MODEL_OF_TASK[task] = weakref.ref(model)
    except TypeError:  # a task object without weak references (a test's stand-in)
        pass


def install_build_model_hook() -> None:
    """Wrap ``fairseq.models.build_model`` once so that every model it builds is tracked."""
    import fairseq.models as fairseq_models

    original = fairseq_models.build_model
    if getattr(original, "_diverse_fairseq_tracks_models", False):
        return

    @functools.wraps(original)
    def build_model(*args, **kwargs):
        model = track_model(original(*args, **kwargs))
        task = kwargs.get("task", args[1] if len(args) > 1 else None)  # build_model(cfg, task, from_checkpoint)
        if task is not None:
            _remember_task(model, task)
        return model

    build_model._diverse_fairseq_tracks_models = True
    fairseq_models.build_model = build_model
