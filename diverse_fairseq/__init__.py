"""diverse-fairseq: fairseq plugins for multi-head attention whose heads stay diverse (docs/architecture.md).

``fairseq-train --user-dir diverse_fairseq ...`` (or ``import diverse_fairseq``) registers the methods
(:mod:`.methods`): the ``diverse_transformer`` models, the ``..._with_disagreement`` criteria (Li et al. EMNLP 2018),
routing-by-agreement (``--routing-*``, Li et al. NAACL 2019) and ``--optimizer repulsive_adam`` (An et al. EMNLP
2020); it also allowlists fairseq's checkpoint classes for ``torch.load(weights_only=True)``. The rest of the
package is the experiment workflow that uses them: data, training, evaluation, the paper tables, the analysis.
"""

__version__ = "0.1.0"

from . import methods  # noqa: F401  (side effect: fairseq registrations, checkpoint allowlist)
from .runs.cli_logging import quiet_libraries

quiet_libraries()  # fairseq's commands load the package (--user-dir) before they configure, log and train
