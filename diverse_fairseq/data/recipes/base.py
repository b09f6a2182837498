"""What a dataset recipe declares, the context it collects its raw text with, and what several recipes share."""

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..download import Source
from ..progress import atomic_path
from ..text import iter_lines
from ..verify import junk_member

SPLITS = ("train", "valid", "test")


@dataclass
class Archive:
    """An archive to download (one file or the parts of a split archive) and extract into ``orig/<name>``: only
    the members that ``wanted(member)`` selects (the WMT archives hold many language pairs). ``expected_lines`` maps
    a member file name suffix to the line count that a published source (``counts_source``) records for it, checked
    right after extraction (:func:`diverse_fairseq.data.verify.check_member_lines`)."""

    name: str
    parts: Sequence[Source]
    wanted: Optional[Callable[[str], bool]] = None
    expected_lines: Dict[str, int] = field(default_factory=dict)
    counts_source: str = ""


@dataclass
class Recipe:
    """A dataset's recipe: sources, direction, text processing, segmentation and decoding defaults."""

    name: str
    src: str
    tgt: str
    description: str
    bpe: str  # default segmentation: "subword-nmt" or "sentencepiece"
    bpe_size: int  # merges (subword-nmt) / vocabulary (sentencepiece)
    joint_bpe: bool
    joined_dictionary: bool
    archives: List[Archive] = field(default_factory=list)  # none: the text is local (demo, custom)
    lowercase: bool = False
    aggressive_dash: bool = False
    punct_norm: bool = False  # Moses punctuation normalisation ...
    non_printing: bool = False  # ... and non-printing character removal, on these splits:
    normalize_splits: Tuple[str, ...] = ("train",)
    apostrophe_splits: Tuple[str, ...] = ()  # splits read from XML/SGM get fairseq's ’ -> ' replacement
    clean_min: int = 1
    clean_max: int = 250
    clean_ratio: float = 9.0  # clean-corpus-n.perl's default ratio
    clean_after_bpe: bool = False
    clean_splits: Tuple[str, ...] = ("train",)  # dev/test stay whole so that they align with their references
    valid_every: Optional[int] = None  # derive valid as every N-th line of the cleaned train set
    beam: int = 5
    lenpen: float = 1.0
    # decoding length limit: at most max_len_a * source length + max_len_b tokens (fairseq's defaults: 0, 200)
    max_len_a: float = 0.0
    max_len_b: int = 200
    collect: Callable[["Context"], Dict[str, object]] = None  # writes raw/{split}.{lang}; returns params
    check: Optional[Callable[["Context"], None]] = None  # early checks before any download
    collect_key: Optional[Callable[["Context"], Dict[str, object]]] = None  # inputs of collect beyond archives
    # a recipe completed from the user's options (the custom corpus: languages, folder, name); returns the recipe
    configure: Optional[Callable[["Recipe", Dict[str, object]], "Recipe"]] = None
    # dictionary entries per language (fairseq-preprocess's: 4 special symbols, padded to a multiple of 8) that
    # paper-scale parameter counts (``make check-tables``) assume; empty: ``bpe_size`` symbols
    assumed_vocab: Dict[str, int] = field(default_factory=dict)
    # a JSON file that ``collect`` writes into raw/ (corpora, counts, checks): prepare.json's "training_data"
    corpora_file: Optional[str] = None
    # the training pairs the paper reports (0: none) and where; printed beside the final count (a large difference
    # is a warning naming the corpus that is short)
    paper_train_pairs: int = 0
    paper_train_source: str = ""
    # the folder under WORK_DIR whose ``downloads/`` the recipe reads and fills (default: its own work folder): a
    # variant with other text processing shares the archives it has in common with the recipe it varies
    downloads_name: Optional[str] = None

    @property
    def langs(self) -> Tuple[str, str]:
        return (self.src, self.tgt)

    def raw_splits(self) -> Tuple[str, ...]:
        return ("train", "test") if self.valid_every else SPLITS


#: what the two WMT recipes share: Moses normalisation of train, fairseq's apostrophe fix on the SGM dev/test
#: sets, 32k subword-nmt merges, length cleaning after BPE, and the papers' beam 4 / length penalty 0.6
WMT_SETTINGS = dict(bpe="subword-nmt", bpe_size=32000, punct_norm=True, non_printing=True,
                    apostrophe_splits=("valid", "test"), clean_after_bpe=True, beam=4, lenpen=0.6)


#: where the WMT dev/test archives' md5s are published: sacrebleu's test-set registry, which sacrebleu checks its
#: own downloads against. Written here (not looked up in the installed sacrebleu at run time, which would silently
#: check nothing if a release moved an address); tests/data/test_data_sources.py checks the installed sacrebleu agrees
SACREBLEU_REGISTRY = ("sacrebleu's test-set registry (github.com/mjpost/sacrebleu, sacrebleu/dataset/__init__.py at "
                      "5166cf77b880ddd6d677f9243bcc4b4cb233cc90; sacrebleu 2.6.0)")
#: {address: (sacrebleu dataset, md5)}: the registry lists these under http://; statmt.org serves both schemes
SACREBLEU_MD5 = {
    "https://data.statmt.org/wmt17/translation-task/dev.tgz": ("wmt17/dev", "9b1aa63c1cf49dccdd20b962fe313989"),
    "https://data.statmt.org/wmt17/translation-task/test.tgz": ("wmt17", "86a1724c276004aa25455ae2a04cef26"),
    "https://statmt.org/wmt14/test-full.tgz": ("wmt14/full", "a8cd784e006feb32ac6f3d9ec7eb389a"),
}


def sacrebleu_source(filename: str, url: str) -> Source:
    """A WMT dev/test archive, with the md5 that sacrebleu's test-set registry publishes for it."""
    dataset, md5 = SACREBLEU_MD5[url]
    return Source(filename, (url,), md5=md5, checksum_source=f"{SACREBLEU_REGISTRY}, {dataset}")


#: WMT17's dev.tgz holds newstest2008-2016 and newsdev2017: one file serves WMT14 and WMT17
WMT17_DEV = sacrebleu_source("dev.tgz", "https://data.statmt.org/wmt17/translation-task/dev.tgz")
#: size and sha256: TensorFlow Datasets' registry of the http address (github.com/tensorflow/datasets,
#: tensorflow_datasets/url_checksums/wmt17_translate.txt at 333639b37af6c6fedf3610a4a2d42f1c6ef6f7d5); sha1: GluonNLP's
#: (github.com/dmlc/gluon-nlp, scripts/datasets/url_checksums/wmt.txt at 01122db3867722db061566a79e843a08f9134431).
#: The https address is ours (statmt.org serves both); macaron-net's prepare-wmt14en2de.sh (line 21) uses the http one
NEWS_COMMENTARY_V12 = Source("training-parallel-nc-v12.tgz",
                             ("https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
                              "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz"),
                             size=168591139, sha256="2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2",
                             sha1="d98afc59e1d753485530b377ff65f1f891d3bced",
                             checksum_source="TensorFlow Datasets url_checksums/wmt17_translate.txt (333639b3), "
                                             "sha1: GluonNLP url_checksums/wmt.txt (01122db)")


@dataclass
class Context:
    """Where a recipe finds its downloads and extracted archives and writes its raw text, plus user options."""

    recipe: Recipe
    work_dir: Path
    options: Dict[str, object] = field(default_factory=dict)
    log: Callable[[str], None] = print
    downloads: Optional[Path] = None  # the downloaded files (default: work_dir/downloads)

    @property
    def raw(self) -> Path:
        return self.work_dir / "raw"

    def extracted(self, archive_name: str) -> Path:
        return self.work_dir / "orig" / archive_name

    def raw_path(self, split: str, lang: str) -> Path:
        return self.raw / f"{split}.{lang}"

    def corpora_path(self, split: str) -> Path:
        """``raw/{split}.corpora.json``: [[corpus name, pairs], ...] in the order of the raw split's lines."""
        return self.raw / f"{split}.corpora.json"

    def copy_of(self, source: Source) -> Optional[dict]:
        """The ``.verified`` record of a downloaded file (``copy``: which published copy it is, ``origin``: where it
        came from), None where it was not downloaded or not recorded."""
        path = (self.downloads or self.work_dir / "downloads") / source.filename
        try:
            return json.loads(path.with_name(path.name + ".verified").read_text())
        except (OSError, ValueError):
            return None

    def member(self, archive: str, relative: str) -> Path:
        """``orig/archive/relative``, or a file of the same name anywhere under it (archive layouts vary; packing
        debris such as ``__MACOSX/`` is never chosen)."""
        root = self.extracted(archive)
        if (root / relative).is_file():
            return root / relative
        matches = sorted(p for p in root.rglob(Path(relative).name)
                         if p.is_file() and not junk_member(p.relative_to(root).as_posix()))
        if not matches:
            raise FileNotFoundError(f"{relative} not found in {root}: the archive does not have the expected layout. "
                                    f"Delete {root} and the archive it came from, and run the command again.")
        return matches[0]

    def parallel(self, archive: str, stem: str) -> Tuple[Iterator[str], Iterator[str]]:
        """The lines of the members ``stem.SRC`` and ``stem.TGT`` of an extracted archive."""
        return (iter_lines(self.member(archive, f"{stem}.{self.recipe.src}")),
                iter_lines(self.member(archive, f"{stem}.{self.recipe.tgt}")))


def write_raw(ctx: Context, split: str, corpora: Sequence[Tuple[str, Iterable[str], Iterable[str]]]) -> List[int]:
    """Stream parallel corpora [(name, source lines, target lines)] into raw/{split}.{src,tgt} (atomically) and
    their pair counts into :meth:`Context.corpora_path`; return the pairs of each corpus, in order. Two sides of
    different lengths stop it: the source is damaged."""
    src, tgt = ctx.recipe.langs
    sizes = []
    with atomic_path(ctx.raw_path(split, src)) as ts, atomic_path(ctx.raw_path(split, tgt)) as tt, \
            open(ts, "w", encoding="utf-8", newline="\n") as fs, open(tt, "w", encoding="utf-8", newline="\n") as ft:
        for name, source, target in corpora:
            n = 0
            for n, (s, t) in enumerate(itertools.zip_longest(source, target), 1):
                if s is None or t is None:
                    raise ValueError(f"{ctx.recipe.name} {split}: {name}: the {src} and {tgt} sides differ in line "
                                     f"count; the source is damaged")
                fs.write(s.replace("\r", " ").replace("\n", " ") + "\n")
                ft.write(t.replace("\r", " ").replace("\n", " ") + "\n")
            if len(corpora) > 1:
                ctx.log(f"  raw {split}: {name}: {n:,} sentence pairs")
            sizes.append([name, n])
    ctx.corpora_path(split).write_text(json.dumps(sizes) + "\n")
    ctx.log(f"  raw {split}: {sum(n for _, n in sizes):,} sentence pairs" + (" in all" if len(corpora) > 1 else ""))
    return [n for _, n in sizes]


def write_folder(ctx: Context, found: Dict[Tuple[str, str], Path], name: Optional[str] = None) -> Dict[str, object]:
    """raw/ from the files of :func:`corpus_files`, each split one corpus: ``name``, else ``SPLIT.SRC/SPLIT.TGT``."""
    src, tgt = ctx.recipe.langs
    for split in SPLITS:
        write_raw(ctx, split, [(name or f"{split}.{src}/{split}.{tgt}", iter_lines(found[split, src]),
                                iter_lines(found[split, tgt]))])
    return {}


def corpus_files(directory: Path, langs: Sequence[str], hint: str) -> Dict[Tuple[str, str], Path]:
    """{(split, lang): file} of a folder of plain parallel text: ``SPLIT.LANG`` or ``SPLIT.LANG.gz`` for each of
    :data:`SPLITS` and ``langs``; SystemExit naming the first missing file, then ``hint`` (what to do)."""
    found = {}
    for split in SPLITS:
        for lang in langs:
            found[split, lang] = next((directory / n for n in (f"{split}.{lang}", f"{split}.{lang}.gz")
                                       if (directory / n).is_file()), None)
            if found[split, lang] is None:
                raise SystemExit(f"error: {directory / f'{split}.{lang}'} not found (nor {split}.{lang}.gz). {hint}")
    return found
