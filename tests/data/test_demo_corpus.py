"""Tests of the demo-corpus builder (scripts/demo_corpus.py, scripts/corpuslib/) and of the shipped corpus in
data/demo/.

The fixture tests/fixtures/demo_corpus/ is an extracted package tree: ``demo.po`` (hand-written, one
entry per cleaning rule) compiled into ``usr/share/locale/de/LC_MESSAGES/demo.mo``, and
``reserved.po`` compiled into ``cpplib.mo``, ``gcc.mo`` and a ``de_AT`` catalog that must never be read.
Regenerate a binary with ``python3 scripts/demo_corpus.py --po2mo SRC.po DST.mo``.
"""

import gzip
import json
import struct
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "demo_corpus"
MESSAGES = FIXTURE / "usr/share/locale/de/LC_MESSAGES"
DEMO = REPO / "data" / "demo"

sys.path.insert(0, str(REPO / "scripts"))
from corpuslib import build, catalog, rules  # noqa: E402


def _pairs(splits):
    return {(p.en, p.de) for split in splits.values() for p in split}


@pytest.fixture(scope="module")
def po_entries():
    return catalog.parse_po((FIXTURE / "demo.po").read_bytes())


@pytest.fixture(scope="module")
def mo_entries():
    entries, undecodable = catalog.read_catalog(MESSAGES / "demo.mo")
    assert undecodable == 0
    return entries


@pytest.fixture(scope="module")
def built():
    """The fixture catalog run through the whole pipeline with 1 valid and 1 test pair."""
    return build.build_corpus(
        [("demo", path) for path in catalog.find_catalogs(FIXTURE)], n_valid=1, n_test=1
    )


# ---- reading catalogs -----------------------------------------------------------------------------


def test_committed_mo_is_the_compiled_po(po_entries):
    assert (MESSAGES / "demo.mo").read_bytes() == catalog.write_mo(po_entries)
    reserved = catalog.write_mo(catalog.parse_po((FIXTURE / "reserved.po").read_bytes()))
    for name in ("de/LC_MESSAGES/cpplib.mo", "de/LC_MESSAGES/gcc.mo", "de_AT/LC_MESSAGES/demo.mo"):
        assert (FIXTURE / "usr/share/locale" / name).read_bytes() == reserved


def test_mo_and_po_agree_except_fuzzy(po_entries, mo_entries):
    assert {e for e in po_entries if not e.fuzzy} == set(mo_entries)
    assert [e.msgid for e in po_entries if e.fuzzy] == ["Fuzzy guess %s"]


def test_big_endian_mo_parses_the_same(mo_entries):
    data = (MESSAGES / "demo.mo").read_bytes()
    count, ids_at, strs_at = struct.unpack_from("<3I", data, 8)
    table_end = strs_at + 8 * count
    words = struct.unpack_from(f"<{table_end // 4}I", data)
    swapped = struct.pack(f">{len(words)}I", *words) + data[table_end:]
    assert catalog.parse_mo(swapped) == (mo_entries, 0)


def test_header_charset_is_honoured():
    po = 'msgid ""\nmsgstr "Content-Type: text/plain; charset=ISO-8859-1\\n"\n\nmsgid "Size"\nmsgstr "Größe"\n'
    entries = catalog.parse_po(po.encode("latin-1"))
    assert entries[1].msgstr == ("Größe",)
    mo = catalog.write_mo(entries)
    assert b"Gr\xf6\xdfe\x00" in mo
    assert catalog.parse_mo(mo) == (entries, 0)
    assert catalog.header_charset("charset=CHARSET") == "utf-8"


def test_context_plural_and_multiline_entries(mo_entries):
    by_key = {(e.context, e.msgid): e for e in mo_entries}
    assert by_key[("state", "Open")].msgstr == ("Offen",)
    plural = by_key[(None, "%d file removed")]
    assert plural.msgid_plural == "%d files removed"
    assert plural.msgstr == ("%d Datei entfernt", "%d Dateien entfernt")
    assert (None, "Usage: %s [OPTION]...\n\tCopy   files.\n") in by_key
    assert (None, 'Invalid "quote" in LC_ALL') in by_key
    assert not any("Obsolete" in e.msgid for e in mo_entries)


# ---- catalog discovery ----------------------------------------------------------------------------


def test_gcc_and_cpplib_catalogs_are_excluded(built):
    assert [p.name for p in catalog.find_catalogs(FIXTURE)] == ["demo.mo"]  # not cpplib/gcc, not de_AT
    for name in ("gcc.mo", "gcc-12.mo", "cpplib.mo", "cpplib-12.mo"):
        assert catalog.is_excluded_catalog(Path("x") / name)
    assert not catalog.is_excluded_catalog("gccgo-tools.mo") and not catalog.is_excluded_catalog("coreutils.mo")
    assert not any("reserviert" in de for _, de in _pairs(built[0]))


def test_gcc_packages_are_refused(tmp_path):
    for name in ("gcc-12-locales", "cpp-12", "gcc"):
        listing = tmp_path / "packages.txt"
        listing.write_text(f"coreutils 9.1-1\n{name} 1.0\n")
        with pytest.raises(ValueError, match="reserved"):
            catalog.read_packages(listing)


def test_shipped_package_list_is_pinned_and_gcc_free():
    packages = catalog.read_packages(DEMO / "packages.txt")
    assert len(packages) >= 20 and len({name for name, _ in packages}) == len(packages)
    assert all(version for _, version in packages)


# ---- cleaning rules -------------------------------------------------------------------------------


def test_header_and_fuzzy_are_dropped(po_entries):
    kept = rules.drop_fuzzy(rules.drop_header(po_entries))
    assert all(e.msgid for e in kept)
    assert not any(e.fuzzy for e in kept)
    assert len(kept) == len(po_entries) - 2


def test_plurals_expand_to_two_pairs(po_entries):
    pairs = {(p.en, p.de) for p in rules.expand_plurals(po_entries, "demo")}
    assert ("%d file removed", "%d Datei entfernt") in pairs
    assert ("%d files removed", "%d Dateien entfernt") in pairs


def test_whitespace_is_collapsed():
    assert rules.normalise_whitespace(" Usage:\n\t%s  [OPTION]...\n") == "Usage: %s [OPTION]..."


@pytest.mark.parametrize("text, expected", [
    ("Sa&ve", "Save"), ("&Speichern", "Speichern"), ("Ü^ber", "Über"), ("_Back", "Back"),
    ("Confirmation|&Delete", "Confirmation|Delete"),
    ("AT&T", "AT&T"), ("R&D", "R&D"), ("Press ^C", "Press ^C"), ("LC_ALL", "LC_ALL"),
    ("a && b", "a && b"), ("Save & Exit", "Save & Exit"), ("&amp; escaped", "&amp; escaped"),
    ("'^quota' option", "'^quota' option"),
    ("Sa&ve the file now to the disk", "Sa&ve the file now to the disk"),  # too long for a menu
])
def test_accelerators(text, expected):
    assert rules.strip_accelerators(text) == expected


@pytest.mark.parametrize("en, de, rule, keep", [
    ("Linux", "Linux", rules.is_translated, False),
    ("Untranslated", "", rules.is_translated, False),
    ("File", "Datei", rules.is_translated, True),
    ("%s (%d)", "%s [%d]", rules.has_letters, False),
    ("%s: done", "%s: fertig", rules.has_letters, True),
    (" ".join(["w"] * 61), " ".join(["W"] * 61), rules.within_length, False),
    (" ".join(["w"] * 60), " ".join(["W"] * 60), rules.within_length, True),
    ("Quit", "Beenden Sie das Programm jetzt", rules.within_ratio, False),
    ("Quit now", "Jetzt beenden bitte", rules.within_ratio, True),  # longer side ≤ 3 words
    ("a b", "c d e f g h", rules.within_ratio, True),  # ratio exactly 3
])
def test_pair_rules(en, de, rule, keep):
    assert rule(rules.Pair(en, de, "demo")) is keep


def test_fixture_through_the_pipeline(built):
    splits, stats = built
    pairs = _pairs(splits)
    english = [en for en, _ in pairs]
    assert len(english) == len(set(english))
    assert ("Open", "Öffnen") in pairs  # most frequent of three
    assert ("Close", "Schließen") in pairs  # tie: smaller string
    assert ("Save", "Speichern") in pairs and ("About", "Über") in pairs
    assert ("Usage: %s [OPTION]... Copy files.", "Aufruf: %s [OPTION]... Dateien kopieren.") in pairs
    assert ("Copying %1$s to %2$s (%<PRId64> bytes)", "Kopiere %1$s nach %2$s (%<PRId64> Bytes)") in pairs
    assert ("Hello {name}, run $1 now", "Hallo {name}, führe jetzt $1 aus") in pairs
    assert ('Invalid "quote" in LC_ALL', "Ungültiges „Zitat“ in LC_ALL") in pairs
    for dropped in ("Linux", "Untranslated message", "Fuzzy guess %s", "Quit", "%s (%d)", "word word"):
        assert not any(en.startswith(dropped) for en in english)
    assert stats["steps"]["deduplicated_pairs"] == stats["steps"]["length_ratio"] - 2  # Open×2, Permission×2
    assert stats["splits"] == {"train": len(pairs) - 2, "valid": 1, "test": 1}
    assert stats["packages"]["demo"]["catalogs"] == ["demo.mo"]


def test_unique_source_prefers_frequency_then_order():
    pairs = [rules.Pair("Open", de, "p") for de in ("Offen", "Öffnen", "Öffnen")]
    unique, counts = rules.deduplicate(pairs)
    assert [(p.en, p.de) for p in rules.unique_source(unique, counts)] == [("Open", "Öffnen")]
    unique, counts = rules.deduplicate([rules.Pair("Close", de, "p") for de in ("Zu", "Schließen")])
    assert [p.de for p in rules.unique_source(unique, counts)] == ["Schließen"]


# ---- split and output -----------------------------------------------------------------------------


def _synthetic_pairs():
    """200 pairs; pairs 4k and 4k + 1 share their German string."""
    return [rules.Pair(f"message number {i}", f"Meldung {i - i % 2 if i % 4 < 2 else i}", "p")
            for i in range(200)]


def test_split_sizes_and_no_overlap():
    splits, dropped = build.split_pairs(_synthetic_pairs(), n_valid=20, n_test=20)
    assert len(splits["valid"]) == 20 and len(splits["test"]) == 20
    held = splits["valid"] + splits["test"]
    assert len({p.en for p in held}) == 40 and len({p.de for p in held}) == 40
    held_sides = {p.en for p in held} | {p.de for p in held}
    assert not any(p.en in held_sides or p.de in held_sides for p in splits["train"])
    assert len(splits["train"]) + 40 + dropped == 200


def test_split_is_a_function_of_the_pairs_not_their_order():
    pairs = _synthetic_pairs()
    assert build.split_pairs(pairs, 20, 20) == build.split_pairs(list(reversed(pairs)), 20, 20)


def test_written_corpus_is_deterministic(tmp_path, built):
    splits, stats = built
    build.write_corpus(tmp_path / "a", splits, stats)
    build.write_corpus(tmp_path / "b", {k: list(reversed(v)) for k, v in splits.items()}, stats)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["stats.json", "test.de", "test.en", "train.de.gz", "train.en.gz", "valid.de", "valid.en"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


# ---- the shipped corpus ---------------------------------------------------------------------------


def _read(name):
    path = DEMO / name
    data = gzip.decompress(path.with_name(name + ".gz").read_bytes()) if not path.exists() else path.read_bytes()
    text = data.decode("utf-8")
    assert text.endswith("\n")
    return text[:-1].split("\n")


@pytest.fixture(scope="module")
def corpus():
    return {split: {side: _read(f"{split}.{side}") for side in ("en", "de")}
            for split in ("train", "valid", "test")}


def test_corpus_sizes(corpus):
    for split, sides in corpus.items():
        assert len(sides["en"]) == len(sides["de"]), split
    assert len(corpus["train"]["en"]) >= 25_000
    assert len(corpus["valid"]["en"]) == 1000 and len(corpus["test"]["en"]) == 1000


def test_corpus_lines_are_clean(corpus):
    for sides in corpus.values():
        for lines in sides.values():
            assert all(line and line == rules.normalise_whitespace(line) for line in lines)


def test_corpus_has_no_held_out_leak(corpus):
    for side in ("en", "de"):
        train = set(corpus["train"][side])
        valid, test = set(corpus["valid"][side]), set(corpus["test"][side])
        assert not (valid & train) and not (test & train) and not (valid & test), side
    assert len(set(corpus["train"]["en"])) == len(corpus["train"]["en"])


def test_corpus_matches_its_stats(corpus):
    stats = json.loads((DEMO / "stats.json").read_text(encoding="utf-8"))
    assert stats["splits"] == {split: len(sides["en"]) for split, sides in corpus.items()}
    assert sum(p["pairs_kept"] for p in stats["packages"].values()) == sum(stats["splits"].values())
    listed = dict(catalog.read_packages(DEMO / "packages.txt"))
    assert {name: info["version"] for name, info in stats["packages"].items()} == listed
