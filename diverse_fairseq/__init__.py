"""diverse-fairseq: fairseq plugins for multi-head attention whose heads stay diverse.

Load with ``fairseq-train --user-dir diverse_fairseq ...`` (or ``import diverse_fairseq``). The package has two
halves (docs/architecture.md):

* :mod:`diverse_fairseq.methods`, the three methods as fairseq plugins, registered on import: the
  ``diverse_transformer`` model and architectures, the criterion
  ``label_smoothed_cross_entropy_with_disagreement`` (disagreement regularization, Li et al. EMNLP 2018),
  routing-by-agreement aggregation (``--routing-*``, Li et al. NAACL 2019) and ``--optimizer repulsive_adam``
  (repulsive attention, An et al. EMNLP 2020). Importing also allowlists, for ``torch.load(weights_only=True)``,
  the classes fairseq stores in its checkpoints (:mod:`diverse_fairseq.methods.checkpoint_compat`).
* the experiment workflow, which uses them: data recipes (:mod:`.data`), training (:mod:`.training`),
  evaluation (:mod:`.evaluate`, :mod:`.average_checkpoints`, :mod:`.significance`), the paper tables
  (:mod:`.tables`) and the head-diversity analysis (:mod:`.analysis`, ``python -m diverse_fairseq.analyze``).
"""

__version__ = "0.1.0"

from . import methods  # noqa: F401  (side effect: fairseq registrations, checkpoint allowlist)
from .runs.cli_logging import quiet_hydra

quiet_hydra()  # fairseq's commands load the package (--user-dir) before they build their hydra configuration
