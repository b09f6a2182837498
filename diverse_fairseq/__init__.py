"""diverse-fairseq: fairseq plugins for multi-head attention whose heads stay diverse.

Load with ``fairseq-train --user-dir diverse_fairseq ...`` (or ``import diverse_fairseq``). Importing the
package registers, with fairseq's registries:

* models and architectures (``diverse_fairseq.models``): the Transformer variant whose attention modules
  expose their heads (disagreement regularization, Li et al. EMNLP 2018) and can aggregate them by
  routing-by-agreement (Li et al. NAACL 2019);
* criteria (``diverse_fairseq.criterions``): label-smoothed cross-entropy plus the disagreement term;
* optimizers (``diverse_fairseq.optim``): Adam whose per-head Q/K/V gradients are replaced by an SVGD or
  SPOS update (repulsive attention, An et al. EMNLP 2020).

It also allowlists, for ``torch.load(weights_only=True)`` (the default since torch 2.6), the classes
fairseq stores in its checkpoints, so that ``fairseq-generate``, ``fairseq-interactive`` and resuming
``fairseq-train`` work without switching the safety check off (``diverse_fairseq.checkpoint_compat``).
"""

__version__ = "0.1.0"

from . import checkpoint_compat  # noqa: F401  (side effect: allowlist fairseq checkpoint globals)
from . import criterions, models, optim  # noqa: F401  (side effect: fairseq registrations)
