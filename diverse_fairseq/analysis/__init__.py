"""Head-diversity analysis of trained translation models (``python -m diverse_fairseq.analyze``) and probing of
their encoders (``python -m diverse_fairseq.probing``).

:mod:`.scores` (EMNLP 2018 Tables 4–5), :mod:`.loading` (checkpoint and batches; a stock ``transformer`` rebuilt
as the identical, observable ``diverse_transformer``), :mod:`.collect` (teacher-forced passes), :mod:`.ablation`
(head importance, Michel et al. 2019; EMNLP 2020 Fig. 2), :mod:`.plots`, :mod:`.report`, :mod:`.pipeline` (all of
it for one or several checkpoints) and :mod:`.probing` (Conneau et al. 2018). Not imported by
``import diverse_fairseq``: training needs neither matplotlib nor scikit-learn.
"""
