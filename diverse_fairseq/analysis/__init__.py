"""Head-diversity analysis of trained translation models (``python -m diverse_fairseq.analyze``).

* :mod:`.scores`: the disagreement scores exp(D) of EMNLP 2018 Tables 4–5 on the paper's scale (mean over
  all H² head pairs, self-pairs included), with the off-diagonal mean cosine as a second figure;
* :mod:`.loading`: loads a checkpoint (a stock ``transformer`` as the identical ``diverse_transformer``, so
  its heads can be observed and masked through :func:`diverse_fairseq.methods.sites.observe`) and batches;
* :mod:`.collect`: teacher-forced passes gathering scores, mean head outputs, NLL and attention maps;
* :mod:`.ablation`: head importance by masking one head at test time (Michel et al. 2019; EMNLP 2020 Fig. 2);
* :mod:`.plots`: PNG heatmaps, t-SNE (journal Fig. 3), per-layer scores, importance histogram;
* :mod:`.report`: markdown and JSON; :mod:`.pipeline`: all of it for one or several checkpoints.

Not imported by ``import diverse_fairseq`` (training needs neither matplotlib nor scikit-learn's TSNE).
"""

from .scores import (
    mean_pair_cosine,
    offdiag_cosine,
    output_score,
    position_score,
    sentence_position_overlap,
    subspace_score,
)

__all__ = ["mean_pair_cosine", "offdiag_cosine", "output_score", "position_score", "sentence_position_overlap",
           "subspace_score"]
