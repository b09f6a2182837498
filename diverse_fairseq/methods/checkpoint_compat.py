"""Let fairseq checkpoints load under ``torch.load(weights_only=True)`` (the default since torch 2.6).

fairseq pickles a few plain Python objects beside the tensors: the ``argparse.Namespace`` of argparse-era
configs, the logging meters in ``extra_state["metrics"]`` and numpy scalars inside them. torch's safe
unpickler rejects any global it does not know, so ``fairseq-generate``, ``fairseq-interactive`` and a
resumed ``fairseq-train`` fail with ``UnpicklingError``. Instead of switching the check off we add exactly
these classes to torch's allowlist (``torch.serialization.add_safe_globals``); everything else stays refused.
"""

import argparse
import collections

import numpy as np
import torch


def _fairseq_meter_classes():
    from fairseq.logging import meters

    return [
        meters.AverageMeter,
        meters.SumMeter,
        meters.ConcatTensorMeter,
        meters.TimeMeter,
        meters.StopwatchMeter,
        meters.MetersDict,
    ]


def _numpy_scalar_globals():
    """The globals numpy scalars and dtypes pickle through (names differ between numpy 1.x and 2.x)."""
    found = [np.dtype, np.ndarray]
    for module_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = __import__(module_name, fromlist=["scalar", "_reconstruct"])
        except ImportError:
            continue
        found += [getattr(module, "scalar"), getattr(module, "_reconstruct")]
        break
    # numpy >= 1.25 pickles dtypes as instances of these per-type classes (np.dtypes.Float64DType, ...)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType")]
    return found


FAIRSEQ_CHECKPOINT_GLOBALS = None


def allowlist_fairseq_checkpoint_globals():
    """Register the globals found in fairseq checkpoints with torch's ``weights_only`` unpickler."""
    global FAIRSEQ_CHECKPOINT_GLOBALS
    if FAIRSEQ_CHECKPOINT_GLOBALS is None:
        FAIRSEQ_CHECKPOINT_GLOBALS = [
            argparse.Namespace,
            collections.OrderedDict,
            collections.defaultdict,
            *_fairseq_meter_classes(),
            *_numpy_scalar_globals(),
        ]
        add = getattr(torch.serialization, "add_safe_globals", None)
        if add is not None:  # torch < 2.4 has no allowlist and loads these anyway
            add(FAIRSEQ_CHECKPOINT_GLOBALS)
    return FAIRSEQ_CHECKPOINT_GLOBALS


allowlist_fairseq_checkpoint_globals()
