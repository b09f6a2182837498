"""Precision paths of ``repulsive_adam``: the SVGD/SPOS transform must see the true gradient in fp32.

fairseq's trainer does backward → all-reduce → ``multiply_grads`` → ``clip_grad_norm`` →
``optimizer.step()``, so ``step()`` sees the gradients Adam would see. What it must undo depends on the
precision wrapper around the optimizer, and each case hands the transform the true, unscaled, clipped
gradient in fp32:

* fp32: the gradients as they are.
* ``--memory-efficient-fp16`` and ``--fp16 --fp16-no-flatten-grads`` (and ``--bf16``): the wrapper calls
  ``step(scale=1/multiply_factor)`` because the optimizer ``supports_step_with_scale``; the loss scale
  and the clip factor are divided out in fp32 (fp16 gradients are never rescaled in fp16 first). The
  transformed gradients are handed to Adam as fp32 tensors, never written back into fp16 ``.grad``.
* ``--amp``: fairseq's ``AMPOptimizer`` unscales the inner torch optimizer in ``clip_grad_norm`` and then
  passes the *fairseq* optimizer to ``GradScaler.step``, which would unscale the same gradients a second
  time (a known fairseq 0.12 trap). :class:`AmpAwareStep` sets ``_step_supports_amp_scaling``, so
  ``GradScaler.step`` only checks for inf/NaN and calls ``step()`` with ``self.grad_scale`` /
  ``self.found_inf`` set: the step is skipped when ``found_inf``; the gradients are divided by
  ``grad_scale`` only if ``clip_grad_norm`` (which fairseq's AMP wrapper always precedes with the
  unscale) did not run since the last step.
* plain ``--fp16`` (one flat fp32 master tensor) hides the per-head structure: refused at start-up by
  :func:`check_precision_setup` with a message naming ``--fp16-no-flatten-grads``.
"""

from typing import Optional, Tuple

import torch

from diverse_fairseq.methods.repulsive.particle_adam import OPTIMIZER_NAME


def option(cfg, name: str, default):
    """``cfg.name``, or ``default`` when absent or an unresolved ``${...}`` interpolation."""
    try:
        value = getattr(cfg, name)
    except Exception:  # omegaconf: interpolation to a missing node
        return default
    if value is None or (isinstance(value, str) and value.startswith("${")):
        return default
    return value


def check_precision_setup(cfg) -> None:
    """Refuse set-ups in which the optimizer cannot see per-parameter gradients."""
    fp16 = bool(option(cfg, "fp16", False))
    bf16 = bool(option(cfg, "bf16", False))
    if fp16 and not bf16 and not any(
        option(cfg, flag, False) for flag in ("memory_efficient_fp16", "fp16_no_flatten_grads", "amp")
    ):
        raise ValueError(
            f"--optimizer {OPTIMIZER_NAME} needs each parameter's own gradient, but --fp16 flattens all "
            "parameters into one fp32 master tensor. Add --fp16-no-flatten-grads (or use "
            "--memory-efficient-fp16 or --amp)."
        )
    if option(cfg, "ddp_backend", None) == "fully_sharded":
        raise ValueError(f"--optimizer {OPTIMIZER_NAME} does not support --ddp-backend fully_sharded "
                         "(FSDP flattens parameters); use legacy_ddp, c10d or no_c10d")
    if option(cfg, "zero_sharding", "none") not in ("none", None):
        raise ValueError(f"--optimizer {OPTIMIZER_NAME} does not support --zero-sharding")
    if option(cfg, "fp16_adam_stats", False):
        raise ValueError(f"--optimizer {OPTIMIZER_NAME} does not support --fp16-adam-stats")


class AmpAwareStep:
    """Mixin for a ``FairseqOptimizer`` whose ``step()`` starts with :meth:`true_gradient_factor`."""

    # torch.amp.GradScaler.step() then calls step() with grad_scale / found_inf set ("--amp" above)
    _step_supports_amp_scaling = True
    _unscaled_since_step = False

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        # fairseq's AMPOptimizer unscales this optimizer's gradients right before calling this
        self._unscaled_since_step = True
        return super().clip_grad_norm(max_norm, aggregate_norm_fn)

    def true_gradient_factor(self, scale=1.0) -> Tuple[bool, Optional[torch.Tensor]]:
        """``(skip, inv_scale)``: skip the step (AMP overflow), else raw gradients × inv_scale (None: 1)."""
        unscaled = self._unscaled_since_step
        self._unscaled_since_step = False
        grad_scale = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler.step (--amp)
        if grad_scale is not None:
            found_inf = getattr(self, "found_inf", None)
            if found_inf is not None and bool(found_inf.sum() > 0):
                return True, None  # overflow: GradScaler skips the step and lowers the scale
            if not unscaled:
                scale = scale * grad_scale
        return False, (1.0 / scale if torch.is_tensor(scale) or scale != 1.0 else None)
