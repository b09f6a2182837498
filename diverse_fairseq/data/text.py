"""Text processing: SGM/XML segment extraction, normalisation, Moses tokenization, cleaning.

Moses tools come from sacremoses (no Perl checkout): ``normalize-punctuation.perl`` is
``MosesPunctNormalizer``, ``remove-non-printing-char.perl`` is :func:`remove_non_printing`,
``tokenizer.perl`` is ``MosesTokenizer`` and ``clean-corpus-n.perl`` is :func:`clean_pair`.
Chinese is segmented into words with jieba (``zh_seg="jieba"``, optional dependency) or into
characters with sacrebleu's Chinese tokenizer (``zh_seg="char"``).
"""

import re
from typing import List, Optional, Tuple

from .lines import iter_lines

_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")
_SPACES = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------- extraction
def sgm_segments(path) -> List[str]:
    """The ``<seg>`` texts of a WMT ``.sgm`` or IWSLT ``.xml`` file, as sacrebleu extracts them.

    Lines starting with ``<seg `` are kept, the tags removed and whitespace collapsed (sacrebleu's
    ``FakeSGMLDataset``), so the references match ``sacrebleu -t ...`` exactly.
    """
    out = []
    for line in iter_lines(path):
        stripped = line.strip()
        if stripped.startswith("<seg "):
            out.append(_SPACES.sub(" ", _SEG.sub(r"\1", stripped)).strip())
    return out


IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIP = ("<title>", "</title>", "<description>", "</description>")


def iwslt_train_lines(path) -> List[str]:
    """The text lines of an IWSLT ``train.tags.*`` file, filtered as fairseq's prepare-iwslt14.sh does."""
    out = []
    for line in iter_lines(path):
        if any(tag in line for tag in IWSLT_DROP):
            continue
        for tag in IWSLT_STRIP:
            line = line.replace(tag, "")
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------------- normalisation
_NON_PRINTING = None


def remove_non_printing(line: str) -> str:
    """Replace Unicode "other" characters (``\\p{C}``: controls, format, unassigned) by spaces."""
    global _NON_PRINTING
    if _NON_PRINTING is None:
        import regex

        _NON_PRINTING = regex.compile(r"\p{C}")
    return _NON_PRINTING.sub(" ", line)


_NORMALIZERS = {}


def normalize(line: str, lang: str, punct: bool = False, non_printing: bool = False, apostrophe: bool = False) -> str:
    """Apply the selected normalisations: Moses punctuation normalisation, non-printing character
    removal, and the ``’`` → ``'`` replacement fairseq applies to XML/SGM dev and test sets."""
    if apostrophe:
        line = line.replace("\u2019", "'")
    if punct:
        norm = _NORMALIZERS.get(lang)
        if norm is None:
            from sacremoses import MosesPunctNormalizer

            norm = _NORMALIZERS[lang] = MosesPunctNormalizer(lang=lang)
        line = norm.normalize(line)
    if non_printing:
        line = remove_non_printing(line)
    return line


# ---------------------------------------------------------------------------------------------- tokenization
_TOKENIZERS = {}


def _zh_segmenter(mode: str):
    if mode == "jieba":
        try:
            import jieba
        except ImportError as e:
            raise RuntimeError(
                "Chinese word segmentation with jieba was asked for (ZH_SEG=jieba, the default with "
                "BPE=subword-nmt) but jieba is not installed: run `pip install jieba`, or choose "
                "ZH_SEG=char (characters) or BPE=sentencepiece (needs no segmentation)."
            ) from e
        jieba.setLogLevel(60)
        return lambda s: " ".join(w for w in jieba.cut(s) if w.strip())
    if mode == "char":
        from sacrebleu.metrics import BLEU

        return BLEU(tokenize="zh").tokenizer  # sacrebleu's Chinese tokenizer, through its public metric
    raise ValueError(f"unknown Chinese segmentation {mode!r}: use 'jieba' or 'char'")


def tokenize(line: str, lang: str, aggressive_dash: bool = False, lowercase: bool = False,
             zh_seg: str = "jieba") -> str:
    """Moses-tokenize one line (escaping ``& < > ' "`` as tokenizer.perl does); Chinese is segmented
    first. ``lowercase`` lowercases *after* tokenization, as fairseq's IWSLT recipe does."""
    key = (lang, zh_seg if lang == "zh" else None)
    tok = _TOKENIZERS.get(key)
    if tok is None:
        from sacremoses import MosesTokenizer

        moses = MosesTokenizer(lang=lang)
        if lang == "zh":
            seg = _zh_segmenter(zh_seg)
            tok = lambda s, a: moses.tokenize(seg(s), aggressive_dash_splits=a, return_str=True, escape=True)  # noqa: E731
        else:
            tok = lambda s, a: moses.tokenize(s, aggressive_dash_splits=a, return_str=True, escape=True)  # noqa: E731
        _TOKENIZERS[key] = tok
    out = tok(line, aggressive_dash)
    return out.lower() if lowercase else out


_DETOKENIZERS = {}


def detokenize(line: str, lang: str) -> str:
    """Undo :func:`tokenize` for ``lang`` (Moses detokenizer, unescaping entities)."""
    detok = _DETOKENIZERS.get(lang)
    if detok is None:
        from sacremoses import MosesDetokenizer

        detok = _DETOKENIZERS[lang] = MosesDetokenizer(lang=lang)
    return detok.detokenize(line.split(), return_str=True, unescape=True)


_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """Split hyphenated compounds as fairseq's ``compound_split_bleu.sh`` does: ``a-b`` → ``a ##AT##-##AT## b``."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


# ---------------------------------------------------------------------------------------------- cleaning
def clean_pair(src: str, tgt: str, min_len: int, max_len: int, ratio: float) -> Optional[Tuple[str, str]]:
    """``clean-corpus-n.perl`` on one pair: collapse whitespace, then drop the pair (return None) when a
    side is shorter than ``min_len`` or longer than ``max_len`` tokens, or their length ratio exceeds
    ``ratio``. Returns the whitespace-normalised pair when it is kept."""
    src = _SPACES.sub(" ", src).strip()
    tgt = _SPACES.sub(" ", tgt).strip()
    ns = len(src.split(" ")) if src else 0
    nt = len(tgt.split(" ")) if tgt else 0
    if ns < min_len or nt < min_len or ns > max_len or nt > max_len:
        return None
    if ns == 0 or nt == 0 or ns / nt > ratio or nt / ns > ratio:
        return None
    return src, tgt

