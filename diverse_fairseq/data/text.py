"""Line files and their text: reading (plain or gzip) and a parallel map with progress lines; SGM/XML segment
extraction, normalisation, Moses tokenization, cleaning.

Moses tools come from sacremoses (no Perl checkout): ``normalize-punctuation.perl`` is ``MosesPunctNormalizer``,
``remove-non-printing-char.perl`` is :func:`normalize` with ``non_printing``, ``tokenizer.perl`` is ``MosesTokenizer``
and ``clean-corpus-n.perl`` is :func:`clean_pair`. sacremoses is a port, not the scripts: where the two differ by a
rule that the scripts the paper recipes ran have, the rule is added here (:data:`MOSES_RULES`; the differences left
and their rates on the demo corpus: docs/methods.md, "Differences from the authors' code"). Chinese is segmented into
words with jieba (``zh_seg="jieba"``, optional dependency) or into characters with sacrebleu's Chinese tokenizer
(``zh_seg="char"``).
"""

import contextlib
import functools
import gzip
import multiprocessing
import re
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import regex

from ..runs.hints import pip_command
from .progress import Progress, atomic_path

CHUNK_LINES = 2000


def iter_lines(path) -> Iterator[str]:
    """The lines of a UTF-8 file (``*.gz`` gunzipped) without line terminators (``\\n``, ``\\r\\n``) or leading BOM."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="strict", newline="\n") as f:
        for i, line in enumerate(f):
            line = line.rstrip("\n").rstrip("\r")
            yield line.lstrip("\ufeff") if i == 0 else line


def count_lines(path) -> int:
    """The lines of a file as :func:`iter_lines` reads them: ``wc -l``'s count, plus a last line without a newline."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def map_file(fn: Callable[[str], str], src, dst, workers: int = 1, desc: str = "") -> int:
    """Write ``fn(line)`` for every line of ``src`` to ``dst`` (atomically), in order, with progress lines; returns
    the number of lines. With ``workers > 1`` a process pool maps chunks of lines: ``fn`` must then be picklable
    (a module-level function or a ``functools.partial`` of one)."""
    total = count_lines(src) if Path(src).suffix != ".gz" else None
    parallel = workers > 1 and (total is None or total > CHUNK_LINES)
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as out, \
            Progress(desc or Path(dst).name, total=total, unit="lines") as meter, \
            multiprocessing.get_context("fork").Pool(workers) if parallel else contextlib.nullcontext() as pool:
        for line in pool.imap(fn, iter_lines(src), CHUNK_LINES) if parallel else map(fn, iter_lines(src)):
            out.write(line.replace("\n", " ") + "\n")
            meter.update()
    return meter.done


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")
_SPACES = re.compile(r"\s+")
_NON_PRINTING = regex.compile(r"\p{C}")


def sgm_segments(path) -> List[str]:
    """The ``<seg>`` texts of a WMT ``.sgm`` or IWSLT ``.xml`` file as sacrebleu's ``FakeSGMLDataset`` extracts them
    (lines starting with ``<seg ``, tags removed, whitespace collapsed), so they match ``sacrebleu -t ...`` exactly."""
    lines = (line.strip() for line in iter_lines(path))
    return [_SPACES.sub(" ", _SEG.sub(r"\1", line)).strip() for line in lines if line.startswith("<seg ")]


IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")
_IWSLT_STRIP = re.compile("</?(title|description)>")


def iwslt_train_lines(path) -> List[str]:
    """The text lines of an IWSLT ``train.tags.*`` file, filtered as fairseq's prepare-iwslt14.sh does."""
    return [_IWSLT_STRIP.sub("", line) for line in iter_lines(path) if not any(tag in line for tag in IWSLT_DROP)]


#: the rules of the Moses Perl scripts (mosesdecoder 34452895f, the scripts that fairseq's and macaron-net's
#: preparation scripts clone) that sacremoses 0.2 lacks and :func:`normalize` / :func:`tokenize` add; recorded in
#: prepare.json (``moses``), so that data made before them is not taken for data made with them:
#: - tokenizer.perl splits the full stop of a line's last word unconditionally ("U.S." at a line's end becomes
#:   "U.S ."), since Moses commit 9fc964da7 (2018-11-07, "tokenizer.perl: split final dots unconditionally");
#: - normalize-punctuation.perl reads each line with its newline, so its ``(\.+)"(\s*[^<])`` rule (de, es, fr:
#:   ``."`` -> ``".``) also fires at a line's end; and it turns a ’ that is not between letters into ``"``
#:   (sacremoses' ``perl_parity``)
MOSES_RULES = ("sacremoses + tokenizer.perl's final full stop (Moses 9fc964da7) + normalize-punctuation.perl per line "
               "with its newline, perl_parity")


@functools.cache
def _moses(tool: str, lang: str):
    """sacremoses' ``tool`` (``MosesPunctNormalizer``, ``MosesTokenizer``, ``MosesDetokenizer``) for ``lang``; the
    normalizer with the Perl script's ’ and French-quote rules (``perl_parity``)."""
    import sacremoses

    extra = {"perl_parity": True} if tool == "MosesPunctNormalizer" else {}
    return getattr(sacremoses, tool)(lang=lang, **extra)


def normalize(line: str, lang: str, punct: bool = False, non_printing: bool = False, apostrophe: bool = False) -> str:
    """Apply the selected normalisations: Moses punctuation normalisation (of the line with its newline, as the Perl
    script reads it: :data:`MOSES_RULES`), non-printing character removal (Unicode "other" characters, ``\\p{C}``,
    become spaces), and the ``’`` → ``'`` replacement fairseq applies to XML/SGM dev and test sets."""
    if apostrophe:
        line = line.replace("\u2019", "'")
    if punct:
        line = _moses("MosesPunctNormalizer", lang).normalize(line + "\n")  # it strips the newline again
    return _NON_PRINTING.sub(" ", line) if non_printing else line


@functools.cache
def _zh_segmenter(mode: str):
    if mode == "jieba":
        try:
            import jieba
        except ImportError as e:
            raise RuntimeError("Chinese word segmentation with jieba was asked for (ZH_SEG=jieba, the default with "
                               f"BPE=subword-nmt) but jieba is not installed: run `{pip_command('jieba')}`, or choose "
                               "ZH_SEG=char (characters) or BPE=sentencepiece (needs no segmentation).") from e
        jieba.setLogLevel(60)
        return lambda s: " ".join(w for w in jieba.cut(s) if w.strip())
    if mode == "char":
        from sacrebleu.metrics import BLEU

        return BLEU(tokenize="zh").tokenizer  # sacrebleu's Chinese tokenizer, through its public metric
    raise ValueError(f"unknown Chinese segmentation {mode!r}: use 'jieba' or 'char'")


def tokenize(line: str, lang: str, aggressive_dash: bool = False, lowercase: bool = False,
             zh_seg: str = "jieba") -> str:
    """Moses-tokenize one line (escaping ``& < > ' "`` as tokenizer.perl does; the full stop of the last word split
    off, as tokenizer.perl does since Moses 9fc964da7: :data:`MOSES_RULES`); Chinese is segmented first.
    ``lowercase`` lowercases *after* tokenization, as fairseq's IWSLT recipe does."""
    if lang == "zh":
        line = _zh_segmenter(zh_seg)(line)
    out = _moses("MosesTokenizer", lang).tokenize(line, aggressive_dash_splits=aggressive_dash, return_str=True,
                                                  escape=True)
    out = _FINAL_DOT.sub(r"\1 .", out)
    return out.lower() if lowercase else out


# the last word ending in a full stop that is not all full stops (tokenizer.perl keeps "..." together before it
# looks at words: DOTMULTI)
_FINAL_DOT = re.compile(r"(?:(?<=\s)|^)(\S*[^.\s])\.$")


def detokenize(line: str, lang: str) -> str:
    """Undo :func:`tokenize` for ``lang`` (Moses detokenizer, unescaping entities)."""
    return _moses("MosesDetokenizer", lang).detokenize(line.split(), return_str=True, unescape=True)


_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """Split hyphenated compounds as fairseq's ``compound_split_bleu.sh`` does: ``a-b`` → ``a ##AT##-##AT## b``."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


#: clean-corpus-n.perl's ``$max_word_length``: a pair with a longer word (a run of characters other than white space
#: and ``|``) is dropped (mosesdecoder scripts/training/clean-corpus-n.perl, lines 16 and 128-131 at 34452895f)
MAX_WORD_LENGTH = 1000
_LONG_WORD = re.compile(r"[^\s|]{%d}" % (MAX_WORD_LENGTH + 1))


def clean_pair(src: str, tgt: str, min_len: int, max_len: int, ratio: float) -> Optional[Tuple[str, str]]:
    """``clean-corpus-n.perl`` on one pair: collapse whitespace, then drop the pair (return None) when a side is
    shorter than ``min_len`` or longer than ``max_len`` tokens, their length ratio exceeds ``ratio``, or a side has
    a word longer than :data:`MAX_WORD_LENGTH` characters. Returns the whitespace-normalised pair when it is kept.
    (The script also deletes ``|``, its factor separator, from unfactored text: Moses-tokenized text has none, it is
    escaped as ``&#124;``.)"""
    src, tgt = _SPACES.sub(" ", src).strip(), _SPACES.sub(" ", tgt).strip()
    ns, nt = len(src.split()), len(tgt.split())
    if not (min_len <= ns <= max_len and min_len <= nt <= max_len and ns and nt) or max(ns / nt, nt / ns) > ratio:
        return None
    if _LONG_WORD.search(src) or _LONG_WORD.search(tgt):
        return None
    return src, tgt

