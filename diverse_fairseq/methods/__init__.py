"""The three methods, as fairseq plugins (importing this package registers them with fairseq).

* :mod:`.disagreement`: disagreement regularization (Li et al., EMNLP 2018): the head similarities D_sub,
  D_pos, D_out (:mod:`.disagreement.similarity`, Eqs. 1-3) and the criterion
  ``label_smoothed_cross_entropy_with_disagreement`` (:mod:`.disagreement.criterion`, J = L + λ·D).
* :mod:`.routing`: routing-by-agreement aggregation (Li et al., NAACL 2019): simple and EM routing
  (:mod:`.routing.algorithms`, Algorithms 1-2), their fast path (:mod:`.routing.fast`), the vote network
  that replaces concat + W_O (:mod:`.routing.aggregation`, Eqs. 5-7) and the ``--routing-*`` options
  (:mod:`.routing.options`).
* :mod:`.repulsive`: repulsive attention (An et al., EMNLP 2020): the SVGD / SPOS update (:mod:`.repulsive.svgd`,
  Eqs. 4-5), which parameters are particles (:mod:`.repulsive.particles`), the optimizer applying it before
  Adam (:mod:`.repulsive.particle_adam`, Algorithm 1), its precision paths (:mod:`.repulsive.precision`) and
  ``--optimizer repulsive_adam`` (:mod:`.repulsive.optimizer`).

Shared by the three: the ``diverse_transformer`` model and architectures (:mod:`.transformer`), the language
models ``diverse_transformer_lm`` and ``diverse_roberta`` (:mod:`.language_models`), their attention
module whose heads can be observed and recombined (:mod:`.attention`), the one way to find attention modules
(:mod:`.sites`), the list options' parser (:mod:`.options`), the one fairseq hook (:mod:`.hooks`) and the
checkpoint allowlist for ``torch.load`` (:mod:`.checkpoint_compat`).

Decoding as the THUMT papers did: ``--task translation_length_penalty --length-penalty gnmt`` divides finished
hypotheses' scores by GNMT's length penalty (:mod:`.length_penalty`), and ``--beam-search thumt`` decodes with
THUMT's beam search (:mod:`.thumt_search`).
"""

from diverse_fairseq.methods import (
    checkpoint_compat,  # noqa: F401  (allowlists fairseq's checkpoint globals)
    language_models,  # noqa: F401  (registers --arch diverse_transformer_lm*, diverse_roberta*)
    length_penalty,  # noqa: F401  (registers --task translation_length_penalty)
    transformer,  # noqa: F401  (registers --arch diverse_transformer*, routing_transformer_*)
)
from diverse_fairseq.methods.disagreement import criterion  # noqa: F401  (registers the disagreement criterion)
from diverse_fairseq.methods.hooks import install_build_model_hook
from diverse_fairseq.methods.repulsive import optimizer  # noqa: F401  (registers --optimizer repulsive_adam)

install_build_model_hook()
