"""Your own parallel corpus: plain-text files in a folder, no download (docs/usage.md#your-own-corpus).

    SRC=xx TGT=yy CORPUS_DIR=dir scripts/prepare_data.sh custom     -> data-bin/custom_xx_yy

``CORPUS_DIR`` holds ``train``, ``valid`` and ``test`` ``.xx`` and ``.yy`` (each may be gzipped, ``train.xx.gz``), one
sentence per line, UTF-8, line ``i`` of ``SPLIT.xx`` translated by line ``i`` of ``SPLIT.yy``; :func:`check` checks
them before anything is done, then the text goes through the paper datasets' steps.
"""

import collections
import dataclasses
import gzip
import re
from pathlib import Path
from typing import Dict, List

from .base import SPLITS, Context, Recipe, corpus_files, write_folder

_LANG = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,15}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _layout(src: str, tgt: str) -> str:
    return " ".join(f"{split}.{lang}" for split in SPLITS for lang in (src, tgt)) + \
        " (one sentence per line, UTF-8, .gz allowed)"


def configure(template: Recipe, options: Dict[str, object]) -> Recipe:
    """The recipe for the user's corpus, from ``src``, ``tgt``, ``corpus_dir``, ``name`` and ``separate_vocab``;
    raises SystemExit naming the variable when one is missing or malformed."""
    src, tgt, corpus = options.get("src"), options.get("tgt"), options.get("corpus_dir")
    missing = [var for var, value in (("SRC (--src)", src), ("TGT (--tgt)", tgt), ("CORPUS_DIR (--corpus-dir)", corpus))
               if not value]
    if missing:
        raise SystemExit(f"error: the custom dataset needs {', '.join(missing)}: e.g. SRC=en TGT=de "
                         f"CORPUS_DIR=/path/to/corpus scripts/prepare_data.sh custom, where the folder holds "
                         f"{_layout('SRC', 'TGT')}")
    for var, value in (("SRC (--src)", src), ("TGT (--tgt)", tgt)):
        if not _LANG.match(str(value)):
            raise SystemExit(f"error: {var}={value!r} is not a language code: use letters, digits, '_' or '-', "
                             f"starting with a letter (e.g. en, de, pt_br); it is the files' suffix")
    if src == tgt:
        raise SystemExit(f"error: SRC and TGT are both {src!r}: give the source and the target language")
    name = options.get("name")
    if name and not _NAME.match(str(name)):
        raise SystemExit(f"error: DATASET_NAME (--name)={name!r} is not a valid folder name: use letters, digits, "
                         f"'_', '-' or '.'")
    separate = bool(options.get("separate_vocab"))
    return dataclasses.replace(template, name=name or f"custom_{src}_{tgt}", src=src, tgt=tgt,
                               description=f"your corpus in {Path(str(corpus)).expanduser().resolve()} ({src}→{tgt})",
                               joint_bpe=not separate, joined_dictionary=not separate)


def files(ctx: Context) -> Dict[tuple, Path]:
    """{(split, lang): file} for the six corpus files; SystemExit naming the first missing one."""
    directory = Path(str(ctx.options["corpus_dir"])).expanduser().resolve()
    layout = _layout(*ctx.recipe.langs)
    if not directory.is_dir():
        raise SystemExit(f"error: CORPUS_DIR={directory} is not a folder: point it at the folder with {layout}")
    return corpus_files(directory, ctx.recipe.langs,
                        f"CORPUS_DIR must hold {layout}; add the file or point CORPUS_DIR at the folder that has it")


#: what :func:`_scan` found in a corpus file: its lines, those ending in CR LF, the 1-based numbers of the empty ones
FileStats = collections.namedtuple("FileStats", "lines crlf empty")


def _scan(path: Path) -> FileStats:
    """SystemExit naming the file (and the line) when ``path`` is empty or not UTF-8."""
    n = crlf = 0
    empty = []
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SystemExit(f"error: {path} is not UTF-8 text (line {n}: {e.reason}); convert it, e.g. "
                                 f"iconv -f LATIN1 -t UTF-8 {path.name} > {path.name}.utf8, "
                                 "and replace the file") from None
            if text.endswith("\r\n"):
                crlf += 1
            if not text.strip():
                empty.append(n)
    if n == 0:
        raise SystemExit(f"error: {path} is empty: every split needs sentences (valid and test a few hundred or "
                         f"more, cut from the training data if need be)")
    return FileStats(n, crlf, empty)


def _lines(numbers: List[int], shown: int = 5) -> str:
    return ", ".join(str(i) for i in numbers[:shown]) + (f" and {len(numbers) - shown:,} more"
                                                         if len(numbers) > shown else "")


def check(ctx: Context):
    """Validate the corpus folder before any work: SystemExit for a missing, empty or non-UTF-8 file, sides of
    different lengths, an empty line in valid or test (it would be scored as if it were a sentence); warnings for
    CR LF line ends and training pairs with an empty side (dropped by the length cleaning, whose minimum is 1)."""
    found = files(ctx)
    src, tgt = ctx.recipe.langs
    for split in SPLITS:
        stats = {lang: _scan(found[split, lang]) for lang in (src, tgt)}
        n, names = stats[src].lines, f"{found[split, src].name} / {found[split, tgt].name}"
        if n != stats[tgt].lines:
            raise SystemExit(
                f"error: {found[split, src]} has {n:,} lines but {found[split, tgt]} has {stats[tgt].lines:,}: "
                f"line i of one must be the translation of line i of the other. Fix the alignment (a sentence "
                f"with a line break inside, or a missing line) so that both have the same number of lines")
        for lang, s in stats.items():
            if s.crlf:
                ctx.log(f"  warning: {found[split, lang]}: {s.crlf:,} of {s.lines:,} lines end in CR LF (Windows "
                        f"line ends); they are read as plain line ends")
            if s.empty and split != "train":
                raise SystemExit(
                    f"error: {found[split, lang]} line {s.empty[0]} is empty ({len(s.empty):,} empty lines in all: "
                    f"{_lines(s.empty)}): an empty {'reference' if lang == tgt else 'source sentence'} in {split} "
                    f"would be scored as if it were a translation. Remove the pair (line {s.empty[0]} of both "
                    f"{found[split, src].name} and {found[split, tgt].name}) or fill in the missing sentence")
        empty_pairs = sorted(set(stats[src].empty) | set(stats[tgt].empty))
        if empty_pairs:
            ctx.log(f"  warning: {split}: {len(empty_pairs):,} of {n:,} sentence pairs have an empty side "
                    f"(lines {_lines(empty_pairs)} of {names}); they are dropped")
        ctx.log(f"  {split}: {n:,} sentence pairs in {names}")


def collect_key(ctx: Context):
    """The corpus files' names, sizes and modification times: a changed corpus is prepared again."""
    return {"corpus": {f"{split}.{lang}": [str(path), path.stat().st_size, path.stat().st_mtime_ns]
                       for (split, lang), path in sorted(files(ctx).items())}}


RECIPE = Recipe(
    name="custom", src="", tgt="",  # set from SRC / TGT by configure()
    description="your own parallel corpus (SRC, TGT, CORPUS_DIR)",
    bpe="subword-nmt", bpe_size=10000, joint_bpe=True, joined_dictionary=True, non_printing=True,
    collect=lambda ctx: write_folder(ctx, files(ctx)), check=check, collect_key=collect_key, configure=configure,
)
