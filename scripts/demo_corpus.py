#!/usr/bin/env python3
"""Build the English→German demo corpus from German gettext catalogs of Debian packages.

Standard library only: this runs before the project's virtual environment exists. The shell driver
``scripts/build_demo_corpus.sh`` downloads the pinned packages of ``data/demo/packages.txt`` and
extracts their German catalogs into ``<extract-dir>/<package>/usr/share/locale/de*/LC_MESSAGES/``;
this module then parses the catalogs (``.mo``, and ``.po`` for tests), cleans the pairs, splits them
deterministically and writes ``train``/``valid``/``test`` files plus ``stats.json``.

Pipeline (each step is a small function below, counted in ``stats.json``):
  parse (undecodable entries dropped) → drop header → drop fuzzy → expand plurals → normalise
  whitespace → strip keyboard accelerators → drop untranslated → drop letterless → length filter →
  ratio filter → deduplicate pairs → one German per English → split by sha256 of the English side.
"""

import argparse
import codecs
import gzip
import hashlib
import json
import re
import struct
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

MO_MAGIC = 0x950412DE
CONTEXT_SEP = "\x04"
LOCALE_DIRS = ("de", "de_DE")  # never de_AT / de_CH: regional variants would duplicate sources
# Catalogs of GCC are reserved for an independent evaluation set: never used, whatever ships them.
EXCLUDED_CATALOG = re.compile(r"^(gcc|cpplib)([-_.].*)?$")
EXCLUDED_PACKAGE = re.compile(r"^(gcc|cpp)(-.*)?$")
MIN_WORDS, MAX_WORDS = 1, 60
MAX_RATIO, RATIO_MIN_WORDS = 3.0, 3
HELD_OUT = 1000
GZIP_TRAIN = True  # train.{en,de} exceed 1 MB each, so they are shipped as deterministic .gz files


@dataclass(frozen=True)
class Entry:
    """One catalog entry; ``msgstr`` holds all forms (one for a singular entry)."""

    msgid: str
    msgstr: tuple
    context: str | None = None
    msgid_plural: str | None = None
    fuzzy: bool = False


@dataclass(frozen=True)
class Pair:
    """A candidate sentence pair and the package it came from."""

    en: str
    de: str
    package: str


# --------------------------------------------------------------------------------------------------
# Catalog reading
# --------------------------------------------------------------------------------------------------


def header_charset(header):
    """Return the charset named by a catalog header's ``Content-Type`` line, or ``utf-8``.

    A missing charset or the template placeholder ``CHARSET`` falls back to UTF-8.
    """
    match = re.search(r"charset=([A-Za-z0-9_.:-]+)", header or "")
    if not match or match.group(1).upper() == "CHARSET":
        return "utf-8"
    try:
        return codecs.lookup(match.group(1)).name
    except LookupError:
        return "utf-8"


def read_mo_strings(data):
    """Return the raw ``(msgid_bytes, msgstr_bytes)`` pairs of a ``.mo`` file, either byte order."""
    for order in ("<", ">"):
        if struct.unpack(order + "I", data[:4])[0] == MO_MAGIC:
            break
    else:
        raise ValueError("not a GNU .mo file (bad magic number)")
    _, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])

    def string(table, i):
        length, offset = struct.unpack_from(order + "2I", data, table + 8 * i)
        return data[offset:offset + length]

    return [(string(ids_at, i), string(strs_at, i)) for i in range(count)]


def mo_entry(key, value, charset):
    """Decode one ``.mo`` record into an :class:`Entry` (``None`` if it does not decode).

    The key is ``[msgctxt \\x04] msgid [\\x00 msgid_plural]``; plural forms in the value are
    separated by NUL bytes. A compiled catalog carries no flags: ``msgfmt`` leaves fuzzy entries
    out unless told otherwise, so every ``.mo`` entry counts as non-fuzzy.
    """
    try:
        key, value = key.decode(charset), value.decode(charset)
    except UnicodeDecodeError:
        return None
    context = None
    if CONTEXT_SEP in key:
        context, key = key.split(CONTEXT_SEP, 1)
    msgid, has_plural, plural = key.partition("\x00")
    return Entry(msgid, tuple(value.split("\x00")), context, plural if has_plural else None)


def parse_mo(data):
    """Parse ``.mo`` bytes into ``(entries, undecodable_count)``, decoding with the header charset."""
    raw = read_mo_strings(data)
    header = next((v for k, v in raw if k == b""), b"").decode("ascii", "replace")
    charset = header_charset(header)
    entries = [mo_entry(k, v, charset) for k, v in raw]
    return [e for e in entries if e is not None], sum(e is None for e in entries)


_PO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
               '"': '"', "\\": "\\"}


def po_unquote(token):
    """Turn one quoted ``.po`` string literal (with its quotes) into its text, resolving escapes."""
    return re.sub(r"\\(.)", lambda m: _PO_ESCAPES.get(m.group(1), m.group(0)), token[1:-1])


def po_blocks(text):
    """Split ``.po`` text into entry blocks (lists of lines), skipping obsolete ``#~`` lines."""
    blocks, current = [], []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if current:
                blocks.append(current)
            current = []
        elif not line.startswith("#~"):
            current.append(line)
    if current:
        blocks.append(current)
    return blocks


def po_entry(block):
    """Parse one ``.po`` block into an :class:`Entry` (``None`` for a block without ``msgid``).

    Handles ``#, fuzzy`` flags, ``msgctxt``, ``msgid_plural``, ``msgstr[n]`` and strings continued
    over several quoted lines.
    """
    fields, fuzzy, last = {}, False, None
    for line in block:
        if line.startswith("#,"):
            fuzzy = fuzzy or "fuzzy" in (f.strip() for f in line[2:].split(","))
        elif line.startswith("#"):
            continue
        elif line.startswith('"'):
            fields[last] += po_unquote(line)
        else:
            last, _, literal = line.partition(" ")
            fields[last] = po_unquote(literal.strip())
    if "msgid" not in fields:
        return None
    forms = sorted((k for k in fields if k.startswith("msgstr[")), key=lambda k: int(k[7:-1]))
    msgstr = tuple(fields[k] for k in forms) if forms else (fields.get("msgstr", ""),)
    return Entry(fields["msgid"], msgstr, fields.get("msgctxt"), fields.get("msgid_plural"), fuzzy)


def parse_po(data):
    """Parse ``.po`` bytes into a list of :class:`Entry`, decoding with the header charset."""
    charset = header_charset(data.decode("latin-1"))
    entries = (po_entry(block) for block in po_blocks(data.decode(charset)))
    return [e for e in entries if e is not None]


def read_catalog(path):
    """Read a ``.mo`` or ``.po`` file into ``(entries, undecodable_count)``."""
    data = Path(path).read_bytes()
    if str(path).endswith(".po"):
        return parse_po(data), 0
    return parse_mo(data)


def write_mo(entries):
    """Serialise entries as a little-endian ``.mo`` file (no hash table), in the header's charset.

    Like ``msgfmt``, fuzzy entries are left out; unlike it, untranslated ones are kept, so that the
    test fixture built with this writer still exercises the empty-translation rule.
    """
    header = next((e.msgstr[0] for e in entries if e.msgid == "" and e.context is None), "")
    charset = header_charset(header)
    records = []
    for e in entries:
        if e.fuzzy:
            continue
        key = (e.context + CONTEXT_SEP if e.context is not None else "") + e.msgid
        if e.msgid_plural is not None:
            key += "\x00" + e.msgid_plural
        records.append((key.encode(charset), "\x00".join(e.msgstr).encode(charset)))
    records.sort()
    count = len(records)
    ids_at, strs_at = 28, 28 + 8 * count
    offset = strs_at + 8 * count
    tables, blob = bytearray(), bytearray()
    for column in (0, 1):
        for record in records:
            tables += struct.pack("<2I", len(record[column]), offset + len(blob))
            blob += record[column] + b"\x00"
    prologue = struct.pack("<7I", MO_MAGIC, 0, count, ids_at, strs_at, 0, offset)
    return prologue + bytes(tables) + bytes(blob)


# --------------------------------------------------------------------------------------------------
# Catalog discovery
# --------------------------------------------------------------------------------------------------


def is_excluded_catalog(path):
    """True for GCC's catalogs (``gcc.mo``, ``gcc-12.mo``, ``cpplib.mo``…), reserved for evaluation."""
    return bool(EXCLUDED_CATALOG.match(Path(path).name.rsplit(".", 1)[0]))


def find_catalogs(package_dir):
    """Sorted German catalogs (``de`` and ``de_DE`` only) under one extracted package tree."""
    found = []
    for locale in LOCALE_DIRS:
        messages = Path(package_dir) / "usr/share/locale" / locale / "LC_MESSAGES"
        found += [p for p in sorted(messages.glob("*.mo")) if p.is_file() and not is_excluded_catalog(p)]
    return found


def read_packages(path):
    """Read ``name version`` lines (``#`` comments allowed); refuse GCC packages."""
    packages = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, version = line.split()
        if EXCLUDED_PACKAGE.match(name):
            raise ValueError(f"{name}: GCC catalogs are reserved for evaluation and may not be used")
        packages.append((name, version))
    return packages


# --------------------------------------------------------------------------------------------------
# Cleaning rules
# --------------------------------------------------------------------------------------------------


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
    en, de = (strip_accelerators(normalise_whitespace(s)) for s in (pair.en, pair.de))
    return Pair(en, de, pair.package)


def is_translated(pair):
    """False when the translation is empty or identical to the source (an untranslated entry)."""
    return bool(pair.de) and pair.de != pair.en


# printf conversions (%s, %-10.3lu, %1$s, %%), C99 macros (%<PRId64>), {name} and $1 placeholders.
_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[a-zA-Z%]"
    r"|%<\w+>|\{\w*\}|\$\d+"
)


def has_letters(pair):
    """True when both sides contain a letter outside format placeholders (``%s (%d)`` has none)."""
    return all(any(c.isalpha() for c in _PLACEHOLDER.sub("", s)) for s in (pair.en, pair.de))


def within_length(pair):
    """True when both sides have MIN_WORDS–MAX_WORDS whitespace-separated words."""
    return all(MIN_WORDS <= len(s.split()) <= MAX_WORDS for s in (pair.en, pair.de))


def within_ratio(pair):
    """False when the word-length ratio exceeds MAX_RATIO and the longer side has > RATIO_MIN_WORDS words."""
    short, long_ = sorted((len(pair.en.split()), len(pair.de.split())))
    return long_ <= RATIO_MIN_WORDS or long_ <= MAX_RATIO * short


def deduplicate(pairs):
    """Keep one copy of each exact ``(en, de)`` pair, attributed to the first package (sorted by name).

    Returns ``(unique_pairs, counts)``; ``counts`` maps ``(en, de)`` to its number of occurrences,
    which :func:`unique_source` uses to pick among competing translations.
    """
    counts = Counter((p.en, p.de) for p in pairs)
    first = {}
    for p in sorted(pairs, key=lambda p: (p.en, p.de, p.package)):
        first.setdefault((p.en, p.de), p)
    return list(first.values()), counts


def unique_source(pairs, counts):
    """Keep one German translation per English string: the most frequent, ties → smallest string."""
    by_en = defaultdict(list)
    for p in pairs:
        by_en[p.en].append(p)
    return [min(group, key=lambda p: (-counts[(p.en, p.de)], p.de)) for group in by_en.values()]


# --------------------------------------------------------------------------------------------------
# Split
# --------------------------------------------------------------------------------------------------


def split_key(pair):
    """Deterministic sort/split key: sha256 of the (normalised) English side, then the English."""
    return hashlib.sha256(pair.en.encode("utf-8")).hexdigest(), pair.en


def split_pairs(pairs, n_valid=HELD_OUT, n_test=HELD_OUT):
    """Split by hash order: the first ``n_test`` pairs → test, the next ``n_valid`` → valid, rest → train.

    English strings are unique already; a held-out candidate whose German was already taken by an
    earlier held-out pair goes back to the train pool. Train pairs whose English or German occurs in
    valid or test are dropped, so no held-out sentence (either side) is seen in training and
    valid ∩ test = ∅. Returns ``({split: pairs}, dropped_train_collisions)``.
    """
    held = {"test": [], "valid": []}
    wanted = {"test": n_test, "valid": n_valid}
    held_de, pool = set(), []
    for pair in sorted(pairs, key=split_key):
        split = next((s for s in ("test", "valid") if len(held[s]) < wanted[s]), None)
        if split is None or pair.de in held_de:
            pool.append(pair)
        else:
            held[split].append(pair)
            held_de.add(pair.de)
    held_en = {p.en for s in held.values() for p in s}
    train = [p for p in pool if p.en not in held_en and p.de not in held_de]
    return {"train": train, "valid": held["valid"], "test": held["test"]}, len(pool) - len(train)


# --------------------------------------------------------------------------------------------------
# Pipeline
# --------------------------------------------------------------------------------------------------


PAIR_RULES = (
    ("translated", is_translated),
    ("has_letters", has_letters),
    ("length_1_60_words", within_length),
    ("length_ratio", within_ratio),
)


def catalog_pairs(catalogs, stats):
    """Parse, filter and normalise the entries of all ``(package, path)`` catalogs into pairs.

    Updates ``stats`` in place with per-package raw entry counts and per-step totals.
    """
    pairs, steps = [], Counter()
    for package, path in catalogs:
        entries, undecodable = read_catalog(path)
        info = stats["packages"].setdefault(package, {"catalogs": [], "raw_entries": 0})
        info["catalogs"].append(Path(path).name)
        info["raw_entries"] += len(entries) + undecodable
        steps["raw_entries"] += len(entries) + undecodable
        steps["decodable"] += len(entries)
        entries = drop_header(entries)
        steps["no_header"] += len(entries)
        entries = drop_fuzzy(entries)
        steps["not_fuzzy"] += len(entries)
        expanded = expand_plurals(entries, package)
        steps["pairs_after_plural_expansion"] += len(expanded)
        pairs += [normalise_pair(p) for p in expanded]
    stats["steps"] = dict(steps)
    for name, rule in PAIR_RULES:
        pairs = [p for p in pairs if rule(p)]
        stats["steps"][name] = len(pairs)
    return pairs


def build_corpus(catalogs, n_valid=HELD_OUT, n_test=HELD_OUT):
    """Run the whole pipeline on ``(package, path)`` catalogs; return ``(splits, stats)``."""
    stats = {"packages": {}}
    pairs = catalog_pairs(catalogs, stats)
    pairs, counts = deduplicate(pairs)
    stats["steps"]["deduplicated_pairs"] = len(pairs)
    pairs = unique_source(pairs, counts)
    stats["steps"]["unique_english"] = len(pairs)
    splits, dropped = split_pairs(pairs, n_valid, n_test)
    stats["train_pairs_dropped_for_overlap"] = dropped
    stats["splits"] = {name: len(split) for name, split in splits.items()}
    kept = Counter(p.package for split in splits.values() for p in split)
    for package, info in stats["packages"].items():
        info["pairs_kept"] = kept[package]
    return splits, stats


def write_lines(path, lines, compress):
    """Write UTF-8 lines (``\\n``-terminated); gzip with mtime 0 and no file name when ``compress``."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if compress:
        with open(str(path) + ".gz", "wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as gz:
            gz.write(data)
    else:
        Path(path).write_bytes(data)


def write_corpus(out_dir, splits, stats, gzip_train=GZIP_TRAIN):
    """Write ``{split}.{en,de}`` (train gzipped if ``gzip_train``) and ``stats.json`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        pairs = sorted(pairs, key=split_key)
        for side in ("en", "de"):
            write_lines(out_dir / f"{name}.{side}", [getattr(p, side) for p in pairs],
                        gzip_train and name == "train")
    text = json.dumps(stats, indent=2, ensure_ascii=False) + "\n"
    (out_dir / "stats.json").write_text(text, encoding="utf-8")


def package_catalogs(packages, extract_dir):
    """List ``(package, catalog_path)`` for the pinned packages, in packages-file order."""
    catalogs = []
    for name, _ in packages:
        found = find_catalogs(Path(extract_dir) / name)
        if not found:
            raise FileNotFoundError(f"{name}: no German catalog found under {extract_dir}/{name}")
        catalogs += [(name, path) for path in found]
    return catalogs


def main(argv=None):
    """Command line: build the corpus, or (``--po2mo``) compile a ``.po`` file into a ``.mo`` file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", default="data/demo/packages.txt")
    parser.add_argument("--extract-dir", default="work/demo_corpus/extract")
    parser.add_argument("--out", default="data/demo")
    parser.add_argument("--po2mo", nargs=2, metavar=("PO", "MO"), help="only compile PO into MO")
    args = parser.parse_args(argv)
    if args.po2mo:
        Path(args.po2mo[1]).write_bytes(write_mo(parse_po(Path(args.po2mo[0]).read_bytes())))
        return 0
    packages = read_packages(args.packages)
    splits, stats = build_corpus(package_catalogs(packages, args.extract_dir))
    stats["packages"] = {name: {"version": version, **stats["packages"][name]} for name, version in packages}
    write_corpus(args.out, splits, stats)
    print(json.dumps({key: stats[key] for key in ("steps", "splits")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
