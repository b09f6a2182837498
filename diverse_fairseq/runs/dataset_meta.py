"""``prepare.json``, the record of how a dataset was prepared, written and read through one type:
:class:`DatasetMeta` (:meth:`DatasetMeta.write`, :func:`load_dataset_meta`). The data preparation
(:mod:`diverse_fairseq.data.prepare`) and ``make check-tables``' dictionaries-only data write it; training,
evaluation, the interactive command, the probing and the paper-scale data check read it. Every field has exactly one
default: the one below. Fields this version does not know are kept in ``other`` (they count in a run's identity like
the known ones).

The records of how the training data was checked (:class:`Verification`, :class:`TrainPairs`, :class:`TrainingData`)
are typed too. A field added after a layout was first written (``_added``) is left out of the file while it is unset,
so that a ``prepare.json`` written before reads back to the same identity (:meth:`DatasetMeta.identity`): the runs
trained on it keep their save directories.
"""

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, ClassVar, Dict, List, Optional, Union

from .hints import prepare_hint

META_FILE = "prepare.json"


def _added(default=None):
    """A field this version added to a record: not written while it is None."""
    return field(default=default, metadata={"omit_unset": True})


def _json(value):
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _each(record) -> Callable[[Dict], Dict]:
    """A reader of ``{name: record}``."""
    return lambda data: {k: record.from_json(v) for k, v in data.items()}


class _Record:
    """The JSON form of a record: :meth:`to_json` writes every field (an ``_added`` one only when set) and the keys
    it does not know (``other``) as they were; :meth:`from_json` reads it back (``_nested``: the readers of the
    fields that hold records)."""

    _nested: ClassVar[Dict[str, Callable]] = {}

    @classmethod
    def from_json(cls, data: Dict):
        names = {f.name for f in fields(cls)} - {"other"}
        values = {k: cls._nested[k](v) if k in cls._nested and v is not None else v
                  for k, v in data.items() if k in names}
        return cls(**values, other={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> Dict:
        out = {f.name: _json(getattr(self, f.name)) for f in fields(self)
               if f.name != "other" and not (f.metadata.get("omit_unset") and getattr(self, f.name) is None)}
        return {**out, **self.other}


# ------------------------------------------------------------------------------------------ verification
@dataclass(frozen=True)
class FileCheck(_Record):
    """One fetched file: what it was checked against, its sha256 (to compare two machines' data), the member line
    counts checked after extraction; ``copy`` and ``origin`` where the file is published in several copies."""

    archive: str
    size: Optional[int] = None  # None: deleted after extraction to save disk
    sha256: Optional[str] = None
    checked: str = ""
    member_lines: Optional[Dict[str, int]] = None
    member_lines_source: Optional[str] = None
    copy: Optional[str] = _added()  # which published copy it is (neu2017: Hugging Face's or the WMT17 FTP file)
    origin: Optional[str] = _added()  # the address it came from ("" or None: placed by hand)
    other: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Verification(_Record):
    """What every fetched file was checked against: the published values, or a stand-in manifest (``EXPECT``)."""

    expectations: Union[str, Dict[str, str]] = "published"  # or {"manifest": NAME, "path": FILE}
    files: Dict[str, FileCheck] = field(default_factory=dict)
    other: Dict[str, object] = field(default_factory=dict)
    _nested: ClassVar = {"files": _each(FileCheck)}

    @property
    def manifest(self) -> Optional[str]:
        """The stand-in manifest's name, None where the published values were checked."""
        return None if self.expectations == "published" else str(dict(self.expectations).get("manifest"))


# ------------------------------------------------------------------------------------------ training pairs
@dataclass(frozen=True)
class CorpusPairs(_Record):
    before_cleaning: int
    after_cleaning: int
    other: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainPairs(_Record):
    """The training pairs per corpus before and after cleaning, the final count and the paper's."""

    corpora: Dict[str, CorpusPairs] = field(default_factory=dict)
    final_train: int = 0
    paper: Optional[int] = None
    paper_source: Optional[str] = None
    expectations: str = "published"  # or "manifest NAME"
    other: Dict[str, object] = field(default_factory=dict)
    _nested: ClassVar = {"corpora": _each(CorpusPairs)}


# ------------------------------------------------------------------------------------------ training corpora
@dataclass(frozen=True)
class CorpusCount(_Record):
    """One corpus' pairs and their check against a published count (``ok``, ``mismatch``, ``no published count``,
    or ``differs on another copy``: the count was made on another copy of the corpus than the one read)."""

    pairs: int
    expected: Optional[int] = None
    check: str = "no published count"
    copy: Optional[str] = _added()  # the published copy read, where the corpus has several
    third_party: Optional[int] = _added()  # a count someone else made, printed beside ours, not checked
    third_party_source: Optional[str] = _added()
    other: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class CwmtRecord(_Record):
    """The CWMT part of WMT17 Zh-En: ``complete``, ``partial`` or ``skipped``, the corpora found and missing, a
    digest of the files read, their pairs, and which published copy each multi-copy corpus was read from."""

    status: str = "complete"
    corpora: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    digest: str = ""
    pairs: int = 0
    copies: Optional[Dict[str, str]] = _added()
    other: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class LengthCap(_Record):
    max: int
    unit: str  # "subwords after BPE" or "words before BPE"
    other: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingData(_Record):
    """A recipe's record of its training corpora (WMT17 Zh-En): each corpus' count and check, the CWMT status,
    ``verified`` (every published count matched on the copy it was made on, CWMT complete) and, in words, the
    ``problems`` (why not) and ``notes`` (differences that are no problem: a count made on another copy)."""

    corpora: Dict[str, CorpusCount] = field(default_factory=dict)
    cwmt: CwmtRecord = field(default_factory=CwmtRecord)
    counts_source: str = ""
    verified: bool = True
    problems: List[str] = field(default_factory=list)
    paper_train_pairs: Optional[int] = None
    paper_source: Optional[str] = None
    length_cap: Optional[LengthCap] = _added()  # set by the preparation once the cap was applied
    train_pairs: Optional[int] = _added()
    train_pairs_vs_paper: Optional[float] = _added()
    notes: Optional[List[str]] = _added()
    other: Dict[str, object] = field(default_factory=dict)
    _nested: ClassVar = {"corpora": _each(CorpusCount), "cwmt": CwmtRecord.from_json, "length_cap": LengthCap.from_json}


# ------------------------------------------------------------------------------------------ the dataset
@dataclass(frozen=True)
class DatasetMeta(_Record):
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
    # how the data was made and checked (the preparation writes them; dictionaries-only data has none)
    moses: Optional[str] = _added()  # the Moses rules the text went through (data/text.py: MOSES_RULES)
    verification: Optional[Verification] = _added()
    train_pairs: Optional[TrainPairs] = _added()
    training_data: Optional[TrainingData] = _added()  # the recipe's record of its corpora (WMT17 Zh-En)
    unk: Optional[Dict[str, Dict[str, float]]] = _added()  # {split: {language: % of tokens <unk>}} (valid, test)
    other: Dict[str, object] = field(default_factory=dict)  # fields this version does not know, kept as they are
    _nested: ClassVar = {"verification": Verification.from_json, "train_pairs": TrainPairs.from_json,
                         "training_data": TrainingData.from_json}

    def identity(self) -> Dict:
        """What a run's identity takes from the data: every field written but the creation time and the ``<unk>``
        rates (measured of the data, not a choice that makes it), JSON-normalised."""
        return json.loads(json.dumps({k: v for k, v in self.to_json().items() if k not in ("created", "unk")},
                                     sort_keys=True))

    def write(self, data_dir) -> Path:
        """Write ``data_dir/prepare.json``; return its path."""
        path = Path(data_dir) / META_FILE
        path.write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    def problems(self, records_corpora: bool = False) -> List[str]:
        """Why this data is not the published data, in words (empty when it is): checked against a stand-in
        manifest, or the recipe's record of its corpora says so; ``records_corpora``: the recipe writes such a record
        (data prepared before it did is reported)."""
        manifest = self.verification.manifest if self.verification else None
        stand_in = [] if manifest is None else [
            f"its files were checked against the stand-in manifest {manifest!r} (EXPECT), not the published sizes, "
            f"checksums and counts"]
        record = self.training_data
        if record is None:
            return stand_in + (["prepared by an older version that did not check the corpora' counts (no "
                                "training_data)"] if records_corpora else [])
        return stand_in + ([] if record.verified else list(record.problems or ["not verified"]))


def meta_from_dict(data: Dict, where: str = META_FILE) -> DatasetMeta:
    """A :class:`DatasetMeta` of a parsed ``prepare.json`` (SystemExit naming ``where`` if a required field lacks)."""
    missing = [name for name in ("source_lang", "target_lang") if name not in data]
    if missing:
        raise SystemExit(f"error: {where} lacks {', '.join(missing)}: prepare the dataset again "
                         f"({prepare_hint(Path(where).parent)})")
    return DatasetMeta.from_json(data)


def load_dataset_meta(data_dir) -> DatasetMeta:
    """The :class:`DatasetMeta` of the prepared dataset in ``data_dir``; SystemExit saying how to make it."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise SystemExit(f"error: {path} not found: prepare the data first: {prepare_hint(data_dir)}")
    return meta_from_dict({"dataset": Path(data_dir).name, **json.loads(path.read_text(encoding="utf-8"))}, str(path))
