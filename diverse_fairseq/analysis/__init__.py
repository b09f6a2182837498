"""Head-diversity analysis of trained translation models (``python -m diverse_fairseq.analyze``: :mod:`.pipeline`
over :mod:`.loading`, :mod:`.scores`, :mod:`.ablation`, :mod:`.plots`, :mod:`.report`) and probing of their
encoders (``python -m diverse_fairseq.probing``: :mod:`.probing`). Not imported by ``import diverse_fairseq``:
training needs neither matplotlib nor scikit-learn.
"""
