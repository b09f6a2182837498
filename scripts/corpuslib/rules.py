"""The cleaning rules: catalog entries → sentence pairs, normalised, filtered and deduplicated."""

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

MIN_WORDS, MAX_WORDS = 1, 60
MAX_RATIO, RATIO_MIN_WORDS = 3.0, 3


@dataclass(frozen=True)
class Pair:
    """A candidate sentence pair and the package it came from."""

    en: str
    tgt: str  # the translation, in the corpus' target language
    package: str


def drop_header(entries):
    """Drop the header entry (empty msgid, no context), which holds catalog metadata, not text."""
    return [e for e in entries if e.msgid or e.context is not None]


def drop_fuzzy(entries):
    """Drop entries flagged ``#, fuzzy`` (unreviewed machine-suggested translations)."""
    return [e for e in entries if not e.fuzzy]


def expand_plurals(entries, package):
    """Turn entries into pairs: singular ↔ ``msgstr[0]``, plural ↔ ``msgstr[1]``; context is dropped."""
    pairs = []
    for e in entries:
        pairs.append(Pair(e.msgid, e.msgstr[0], package))
        if e.msgid_plural is not None and len(e.msgstr) > 1:
            pairs.append(Pair(e.msgid_plural, e.msgstr[1], package))
    return pairs


def normalise_whitespace(text):
    """Collapse every run of whitespace (spaces, ``\\n``, ``\\t``…) to one space and strip the ends."""
    return " ".join(text.split())


# Keyboard-accelerator markers. "&" (mc) and "^" (aptitude) must be preceded by a letter, a space, "|",
# "/", "-" or nothing (so "'^quota'" is left alone) and followed by a letter, but not by a lone
# capital (so "AT&T", "R&D" and the control-key notation "^C" are left alone); "&amp;"-like
# entities are excluded. "_" (GTK, debconf) must start a word, so "LC_ALL" is never touched.
_LETTER = r"[^\W\d_]"
_MARKER_BEFORE = r"(?<![^\w\s|/-])(?<![\d_])"
_MARKER_AFTER = rf"(?={_LETTER})(?![A-Z](?!{_LETTER}))"
_ACCELERATORS = (
    ("&", re.compile(_MARKER_BEFORE + "&" + _MARKER_AFTER + rf"(?!{_LETTER}+;)")),
    ("^", re.compile(_MARKER_BEFORE + r"\^" + _MARKER_AFTER)),
    ("_", re.compile(rf"(?<!\S)_(?={_LETTER})")),
)
ACCEL_MAX_WORDS = 5


def strip_accelerators(text):
    """Remove a keyboard-accelerator marker (``&``, ``^`` or ``_``) from a short, menu-like string.

    Only strings of at most ACCEL_MAX_WORDS words are touched, and only a marker character that
    occurs exactly once in the string and matches its pattern in ``_ACCELERATORS``
    (``Sa&ve`` → ``Save``, ``Ü^ber`` → ``Über``, ``_Back`` → ``Back``). Each side of a pair is
    handled on its own, since translators do not always keep the marker. Format placeholders
    (``%s``, ``%1$s``, ``{name}``, ``$1``…) never match and are kept exactly.
    """
    if len(text.split()) > ACCEL_MAX_WORDS:
        return text
    for marker, pattern in _ACCELERATORS:
        if text.count(marker) == 1:
            text = pattern.sub("", text)
    return text


def normalise_pair(pair):
    """Apply whitespace normalisation, then accelerator stripping, to both sides of a pair."""
    en, tgt = (strip_accelerators(normalise_whitespace(s)) for s in (pair.en, pair.tgt))
    return Pair(en, tgt, pair.package)


def is_translated(pair):
    """False when the translation is empty or identical to the source (an untranslated entry)."""
    return bool(pair.tgt) and pair.tgt != pair.en


# printf conversions (%s, %-10.3lu, %1$s, %%), C99 macros (%<PRId64>), {name} and $1 placeholders.
_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[a-zA-Z%]"
    r"|%<\w+>|\{\w*\}|\$\d+"
)


def has_letters(pair):
    """True when both sides contain a letter outside format placeholders (``%s (%d)`` has none)."""
    return all(any(c.isalpha() for c in _PLACEHOLDER.sub("", s)) for s in (pair.en, pair.tgt))


def within_length(pair):
    """True when both sides have MIN_WORDS–MAX_WORDS whitespace-separated words."""
    return all(MIN_WORDS <= len(s.split()) <= MAX_WORDS for s in (pair.en, pair.tgt))


def within_ratio(pair):
    """False when the word-length ratio exceeds MAX_RATIO and the longer side has > RATIO_MIN_WORDS words."""
    short, long_ = sorted((len(pair.en.split()), len(pair.tgt.split())))
    return long_ <= RATIO_MIN_WORDS or long_ <= MAX_RATIO * short


def deduplicate(pairs):
    """Keep one copy of each exact ``(en, tgt)`` pair, attributed to the first package (sorted by name).

    Returns ``(unique_pairs, counts)``; ``counts`` maps ``(en, tgt)`` to its number of occurrences,
    which :func:`unique_source` uses to pick among competing translations.
    """
    counts = Counter((p.en, p.tgt) for p in pairs)
    first = {}
    for p in sorted(pairs, key=lambda p: (p.en, p.tgt, p.package)):
        first.setdefault((p.en, p.tgt), p)
    return list(first.values()), counts


def unique_source(pairs, counts):
    """Keep one translation per English string: the most frequent, ties → the smallest string."""
    by_en = defaultdict(list)
    for p in pairs:
        by_en[p.en].append(p)
    return [min(group, key=lambda p: (-counts[(p.en, p.tgt)], p.tgt)) for group in by_en.values()]


PAIR_RULES = (
    ("translated", is_translated),
    ("has_letters", has_letters),
    ("length_1_60_words", within_length),
    ("length_ratio", within_ratio),
)
