"""Data preparation for the paper datasets (IWSLT14 De-En, WMT14 En-De, WMT17 Zh-En) and the demo corpus.

Entry point: ``python -m diverse_fairseq.data.prepare DATASET`` (``scripts/prepare_data.sh DATASET``).
The modules each do one job:

* :mod:`.download`  fetch an archive with resume, checksum verification, atomic rename and a mirror;
* :mod:`.archive`   extract (possibly split) tar/zip archives safely, rejecting corrupt ones;
* :mod:`.progress`  the resumable step runner (a step is skipped when its outputs are complete), progress lines;
* :mod:`.text`      line files (reading, a parallel map); SGM/XML extraction, normalisation, Moses
  tokenization (sacremoses), cleaning;
* :mod:`.bpe`       learn/apply subword-nmt BPE or sentencepiece;
* :mod:`.recipes`   one module per dataset: where the data comes from and the recipe's settings;
* :mod:`.prepare`   the command line and the generic pipeline that runs a recipe, binarized by fairseq-preprocess.

Only the binarize step needs fairseq; everything else is plain Python (sacremoses, subword-nmt, sentencepiece).
"""
