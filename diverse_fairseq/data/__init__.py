"""Data preparation for the paper datasets (IWSLT14 De-En, WMT14 En-De, WMT17 Zh-En), the demo corpus and your own
(``custom``): ``python -m diverse_fairseq.data.prepare DATASET`` (``scripts/prepare_data.sh DATASET``).
:mod:`.download` and :mod:`.archive` fetch and extract verified archives, :mod:`.recipes` say per dataset where the
data comes from and how it is made, :mod:`.text` and :mod:`.bpe` process the text, :mod:`.progress` runs the resumable
steps and prints progress, and :mod:`.prepare` is the command line and the pipeline that runs a recipe. Only the
binarize step needs fairseq; everything else is plain Python (sacremoses, subword-nmt, sentencepiece)."""
