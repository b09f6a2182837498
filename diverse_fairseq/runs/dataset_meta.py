"""``prepare.json``, the record of how a dataset was prepared (written by :mod:`diverse_fairseq.data.prepare`),
read by training, evaluation, the interactive command and the probing through one typed loader
(:func:`load_dataset_meta`), so every field has exactly one default: the one below. Fields this version does not
know are kept in :attr:`DatasetMeta.other` (they count in a run's identity like the known ones).
"""

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Dict, Optional

from .hints import prepare_hint

META_FILE = "prepare.json"


@dataclass(frozen=True)
class DatasetMeta:
    """One prepared dataset (``DATA_BIN/<dataset>/prepare.json``)."""

    source_lang: str
    target_lang: str
    dataset: str = ""  # its name; :func:`load_dataset_meta` gives the folder's name where prepare.json has none
    recipe: Optional[str] = None  # the prepare_data recipe (wmt14_en_de, custom, ...)
    description: Optional[str] = None
    bpe: str = "subword-nmt"  # subword-nmt | sentencepiece
    bpe_size: Optional[int] = None
    joint_bpe: bool = False
    bpe_models: Dict[str, str] = field(default_factory=dict)  # {language: file name of its segmentation model}
    post_process: str = "subword_nmt"  # fairseq's --post-process that removes the segmentation
    moses_tokenized: bool = False  # the text was Moses-tokenized before BPE (then detokenized after decoding)
    lowercase: bool = False
    aggressive_dash: bool = False
    zh_seg: Optional[str] = None  # the Chinese word segmenter of a zh side (jieba | char); None: no zh side
    joined_dictionary: bool = False
    # the recipe's decoding: beam, length penalty, length limit max_len_a * |x| + max_len_b (fairseq's defaults)
    beam: int = 5
    lenpen: float = 1.0
    max_len_a: float = 0.0
    max_len_b: int = 200
    sacrebleu_tokenize: str = "13a"
    compound_split: bool = False  # the tokenized BLEU splits compounds (German targets)
    references: Dict[str, str] = field(default_factory=dict)  # {split: raw reference file}
    sentences: Dict[str, int] = field(default_factory=dict)  # {split: sentence pairs}
    synthetic: bool = False  # dictionaries only (make check-tables), no text
    created: Optional[str] = None  # when it was written: not part of a run's identity
    other: Dict[str, object] = field(default_factory=dict)  # fields this version does not know, kept as they are

    def identity(self) -> Dict:
        """What a run's identity takes from the data: every field but the creation time, JSON-normalised."""
        known = {k: v for k, v in asdict(self).items() if k not in ("created", "other")}
        return json.loads(json.dumps({**known, **self.other}, sort_keys=True))


def meta_from_dict(data: Dict, where: str = META_FILE) -> DatasetMeta:
    """A :class:`DatasetMeta` of a parsed ``prepare.json`` (SystemExit naming ``where`` if a required field lacks)."""
    missing = [name for name in ("source_lang", "target_lang") if name not in data]
    if missing:
        raise SystemExit(f"error: {where} lacks {', '.join(missing)}: prepare the dataset again "
                         f"({prepare_hint(Path(where).parent)})")
    known = {f.name for f in fields(DatasetMeta)} - {"other"}
    return DatasetMeta(**{k: v for k, v in data.items() if k in known},
                       other={k: v for k, v in data.items() if k not in known})


def load_dataset_meta(data_dir) -> DatasetMeta:
    """The :class:`DatasetMeta` of the prepared dataset in ``data_dir``; SystemExit saying how to make it."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise SystemExit(f"error: {path} not found: prepare the data first: {prepare_hint(data_dir)}")
    return meta_from_dict({"dataset": Path(data_dir).name, **json.loads(path.read_text(encoding="utf-8"))}, str(path))
