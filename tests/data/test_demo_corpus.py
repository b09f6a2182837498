"""Tests of the demo-corpus builder (scripts/demo_corpus.py, scripts/corpuslib/) and of the shipped corpora in
data/demo/ (English→German) and data/demo_fr/ (English→French).

The fixture tests/fixtures/demo_corpus/ is an extracted package tree: ``demo.po`` (hand-written, one
entry per cleaning rule) compiled into ``usr/share/locale/de/LC_MESSAGES/demo.mo``; ``demo.fr.po`` (the same kinds
of entries in French) into ``fr/LC_MESSAGES/demo.mo`` and ``demo.fr_FR.po`` (ISO-8859-1) into
``fr_FR/LC_MESSAGES/extra.mo``; ``reserved.po`` into ``cpplib.mo``, ``gcc.mo`` and the ``de_AT`` and ``fr_CA``
catalogs that must never be read. Regenerate a binary with ``python3 scripts/demo_corpus.py --po2mo SRC.po DST.mo``.
"""

import gzip
import json
import struct
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "demo_corpus"
LOCALE = FIXTURE / "usr/share/locale"
MESSAGES = LOCALE / "de/LC_MESSAGES"
DEMO = REPO / "data" / "demo"
DEMO_FR = REPO / "data" / "demo_fr"
#: each fixture .po file and the catalogs compiled from it
COMPILED = {"demo.po": ["de/LC_MESSAGES/demo.mo"], "demo.fr.po": ["fr/LC_MESSAGES/demo.mo"],
            "demo.fr_FR.po": ["fr_FR/LC_MESSAGES/extra.mo"],
            "reserved.po": ["de/LC_MESSAGES/cpplib.mo", "de/LC_MESSAGES/gcc.mo", "de_AT/LC_MESSAGES/demo.mo",
                            "fr/LC_MESSAGES/gcc.mo", "fr_CA/LC_MESSAGES/demo.mo"]}

sys.path.insert(0, str(REPO / "scripts"))
import demo_corpus  # noqa: E402
from corpuslib import build, catalog, rules  # noqa: E402


def _pairs(splits):
    return {(p.en, p.tgt) for split in splits.values() for p in split}


@pytest.fixture(scope="module")
def po_entries():
    return catalog.parse_po((FIXTURE / "demo.po").read_bytes())


@pytest.fixture(scope="module")
def mo_entries():
    entries, undecodable = catalog.read_catalog(MESSAGES / "demo.mo")
    assert undecodable == 0
    return entries


def _build(lang):
    """The fixture's catalogs of ``lang`` run through the whole pipeline with 1 valid and 1 test pair."""
    return build.build_corpus([("demo", path) for path in catalog.find_catalogs(FIXTURE, lang)], n_valid=1, n_test=1)


@pytest.fixture(scope="module")
def built():
    return _build("de")


@pytest.fixture(scope="module")
def built_fr():
    return _build("fr")


# ---- reading catalogs -----------------------------------------------------------------------------


def test_committed_mo_is_the_compiled_po():
    for po, catalogs in COMPILED.items():
        compiled = catalog.write_mo(catalog.parse_po((FIXTURE / po).read_bytes()))
        for name in catalogs:
            assert (LOCALE / name).read_bytes() == compiled, name
    assert sorted(str(p.relative_to(LOCALE)) for p in LOCALE.rglob("*.mo")) == sorted(sum(COMPILED.values(), []))


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


def test_gcc_and_cpplib_catalogs_are_excluded(built, built_fr):
    found = [str(p.relative_to(LOCALE)) for p in catalog.find_catalogs(FIXTURE, "de")]
    assert found == ["de/LC_MESSAGES/demo.mo"]  # not cpplib/gcc, not de_AT
    for name in ("gcc.mo", "gcc-12.mo", "cpplib.mo", "cpplib-12.mo"):
        assert catalog.is_excluded_catalog(Path("x") / name)
    assert not catalog.is_excluded_catalog("gccgo-tools.mo") and not catalog.is_excluded_catalog("coreutils.mo")
    assert not any("reserviert" in tgt for _, tgt in _pairs(built[0]) | _pairs(built_fr[0]))


def test_language_selects_its_catalogs_without_regional_variants():
    assert catalog.locale_dirs("de") == ("de", "de_DE") and catalog.locale_dirs("fr") == ("fr", "fr_FR")
    found = [str(p.relative_to(LOCALE)) for p in catalog.find_catalogs(FIXTURE, "fr")]
    assert found == ["fr/LC_MESSAGES/demo.mo", "fr_FR/LC_MESSAGES/extra.mo"]  # not gcc, not fr_CA, no German
    assert catalog.find_catalogs(FIXTURE, "it") == []
    for bad in ("FR", "fr_FR", "french", ""):
        with pytest.raises(ValueError, match="two-letter language code"):
            catalog.locale_dirs(bad)
    with pytest.raises(FileNotFoundError, match="demo_corpus: no it catalog .* take demo_corpus out of the package"):
        catalog.package_catalogs([("demo_corpus", "1.0")], FIXTURE.parent, "it")


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
    pairs = {(p.en, p.tgt) for p in rules.expand_plurals(po_entries, "demo")}
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


@pytest.mark.parametrize("en, tgt, rule, keep", [
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
def test_pair_rules(en, tgt, rule, keep):
    assert rule(rules.Pair(en, tgt, "demo")) is keep


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


def test_french_fixture_through_the_pipeline(built_fr):
    """The same rules on the French catalogs: only the catalogs read differ with the language."""
    splits, stats = built_fr
    pairs = _pairs(splits)
    assert len({en for en, _ in pairs}) == len(pairs) == 13
    assert ("Open", "Ouvrir") in pairs and ("Close", "Clore") in pairs  # most frequent; tie: smaller string
    assert ("%d file removed", "%d fichier supprimé") in pairs
    assert ("%d files removed", "%d fichiers supprimés") in pairs
    assert ("Save", "Enregistrer") in pairs and ("Back", "Retour") in pairs  # accelerators & and _
    assert ("Usage: %s [OPTION]... Copy files.", "Utilisation : %s [OPTION]... Copier des fichiers.") in pairs
    assert ("cannot stat %s", "impossible d'évaluer « %s »") in pairs
    assert ("Device busy", "Périphérique occupé") in pairs  # fr_FR, decoded as its header's ISO-8859-1
    assert not {"Linux", "Untranslated message", "Fuzzy guess %s", "Quit", "%s (%d)"} & {en for en, _ in pairs}
    assert stats["packages"]["demo"]["catalogs"] == ["demo.mo", "extra.mo"]
    assert stats["steps"]["deduplicated_pairs"] == stats["steps"]["length_ratio"] - 1  # Open×2


def test_command_line_builds_the_french_corpus(tmp_path, capsys):
    """``scripts/demo_corpus.py --lang fr`` (as build_demo_corpus.sh fr calls it) writes the .en/.fr files."""
    (tmp_path / "packages.txt").write_text("demo_corpus 1.0\n")  # the fixture tree, as an extracted package
    assert demo_corpus.main(["--lang", "fr", "--extract-dir", str(FIXTURE.parent), "--out", str(tmp_path)]) == 0
    # 13 pairs, fewer than the 1,000 held out for test: all go to test
    assert json.loads(capsys.readouterr().out)["splits"] == {"train": 0, "valid": 0, "test": 13}
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["packages.txt", "stats.json", "test.en", "test.fr", "train.en.gz", "train.fr.gz", "valid.en",
                     "valid.fr"]
    english = (tmp_path / "test.en").read_text(encoding="utf-8").splitlines()
    french = (tmp_path / "test.fr").read_text(encoding="utf-8").splitlines()
    assert french[english.index("Device busy")] == "Périphérique occupé"
    stats = json.loads((tmp_path / "stats.json").read_text(encoding="utf-8"))
    assert stats["packages"]["demo_corpus"]["version"] == "1.0"
    with pytest.raises(SystemExit):
        demo_corpus.main(["--lang", "french", "--out", str(tmp_path)])
    assert "--lang: 'french' is not a two-letter language code" in capsys.readouterr().err


def test_unique_source_prefers_frequency_then_order():
    pairs = [rules.Pair("Open", de, "p") for de in ("Offen", "Öffnen", "Öffnen")]
    unique, counts = rules.deduplicate(pairs)
    assert [(p.en, p.tgt) for p in rules.unique_source(unique, counts)] == [("Open", "Öffnen")]
    unique, counts = rules.deduplicate([rules.Pair("Close", de, "p") for de in ("Zu", "Schließen")])
    assert [p.tgt for p in rules.unique_source(unique, counts)] == ["Schließen"]


# ---- split and output -----------------------------------------------------------------------------


def _synthetic_pairs():
    """200 pairs; pairs 4k and 4k + 1 share their German string."""
    return [rules.Pair(f"message number {i}", f"Meldung {i - i % 2 if i % 4 < 2 else i}", "p")
            for i in range(200)]


def test_split_sizes_and_no_overlap():
    splits, dropped = build.split_pairs(_synthetic_pairs(), n_valid=20, n_test=20)
    assert len(splits["valid"]) == 20 and len(splits["test"]) == 20
    held = splits["valid"] + splits["test"]
    assert len({p.en for p in held}) == 40 and len({p.tgt for p in held}) == 40
    held_sides = {p.en for p in held} | {p.tgt for p in held}
    assert not any(p.en in held_sides or p.tgt in held_sides for p in splits["train"])
    assert len(splits["train"]) + 40 + dropped == 200


def test_split_is_a_function_of_the_pairs_not_their_order():
    pairs = _synthetic_pairs()
    assert build.split_pairs(pairs, 20, 20) == build.split_pairs(list(reversed(pairs)), 20, 20)


@pytest.mark.parametrize("lang", ["de", "fr"])
def test_written_corpus_is_deterministic(tmp_path, lang, built, built_fr):
    splits, stats = {"de": built, "fr": built_fr}[lang]
    build.write_corpus(tmp_path / "a", splits, stats, lang)
    build.write_corpus(tmp_path / "b", {k: list(reversed(v)) for k, v in splits.items()}, stats, lang)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(["stats.json", "test.en", f"test.{lang}", "train.en.gz", f"train.{lang}.gz", "valid.en",
                            f"valid.{lang}"])
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


# ---- the shipped corpora ---------------------------------------------------------------------------


def _read(folder, name):
    path = folder / name
    data = gzip.decompress(path.with_name(name + ".gz").read_bytes()) if not path.exists() else path.read_bytes()
    text = data.decode("utf-8")
    assert text.endswith("\n")
    return text[:-1].split("\n")


@pytest.fixture(scope="module", params=[(DEMO, "de"), (DEMO_FR, "fr")], ids=["demo", "demo_fr"])
def corpus(request):
    """``(folder, lang, {split: {"en": lines, "tgt": lines}})`` of one shipped corpus."""
    folder, lang = request.param
    return folder, lang, {split: {"en": _read(folder, f"{split}.en"), "tgt": _read(folder, f"{split}.{lang}")}
                          for split in ("train", "valid", "test")}


def test_corpus_sizes(corpus):
    _, _, splits = corpus
    for split, sides in splits.items():
        assert len(sides["en"]) == len(sides["tgt"]), split
    assert 25_000 <= len(splits["train"]["en"]) <= 45_000  # the two corpora are about the same size
    assert len(splits["valid"]["en"]) == 1000 and len(splits["test"]["en"]) == 1000


def test_corpus_lines_are_clean(corpus):
    for sides in corpus[2].values():
        for lines in sides.values():
            assert all(line and line == rules.normalise_whitespace(line) for line in lines)


def test_corpus_has_no_held_out_leak(corpus):
    _, _, splits = corpus
    for side in ("en", "tgt"):
        train = set(splits["train"][side])
        valid, test = set(splits["valid"][side]), set(splits["test"][side])
        assert not (valid & train) and not (test & train) and not (valid & test), side
    assert len(set(splits["train"]["en"])) == len(splits["train"]["en"])


def test_corpus_matches_its_stats(corpus):
    folder, _, splits = corpus
    stats = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
    assert stats["splits"] == {split: len(sides["en"]) for split, sides in splits.items()}
    assert sum(p["pairs_kept"] for p in stats["packages"].values()) == sum(stats["splits"].values())
    listed = dict(catalog.read_packages(folder / "packages.txt"))
    assert {name: info["version"] for name, info in stats["packages"].items()} == listed
    assert not any(catalog.is_excluded_catalog(name) for p in stats["packages"].values() for name in p["catalogs"])


def test_french_corpus_reads_the_german_pins():
    """data/demo_fr/packages.txt is data/demo/packages.txt less the three packages without a French catalog."""
    german, french = (dict(catalog.read_packages(d / "packages.txt")) for d in (DEMO, DEMO_FR))
    assert french.items() <= german.items()
    assert sorted(set(german) - set(french)) == ["krb5-locales", "libelf1", "xfsprogs"]


def test_french_corpus_prepares_as_demo_fr(tmp_path, capsys):
    """``make data DATASET=demo_fr`` on the first lines of the shipped files (the whole corpus takes a minute)."""
    from diverse_fairseq.data.prepare import main as prepare
    from diverse_fairseq.data.recipes import RECIPES

    assert (RECIPES["demo_fr"].src, RECIPES["demo_fr"].tgt) == ("en", "fr")
    part = tmp_path / "demo_fr"
    part.mkdir()
    for split, n in (("train", 60), ("valid", 6), ("test", 6)):
        for lang in ("en", "fr"):
            (part / f"{split}.{lang}").write_text("\n".join(_read(DEMO_FR, f"{split}.{lang}")[:n]) + "\n")
    prepare(["demo_fr", "--demo-dir", str(part), "--work-dir", str(tmp_path / "work"), "--data-bin",
             str(tmp_path / "data-bin"), "--bpe-size", "100", "--workers", "1"])
    dest = tmp_path / "data-bin" / "demo_fr"
    meta = json.loads((dest / "prepare.json").read_text())
    assert meta["sentences"] == {"train": 60, "valid": 6, "test": 6}
    assert (dest / "test.ref.fr").read_text(encoding="utf-8") == (part / "test.fr").read_text(encoding="utf-8")
    assert (dest / "train.en-fr.fr.bin").exists()


def test_demo_table_runs_on_demo_fr(tmp_path, monkeypatch, capsys):
    """``make demo DATASET=demo_fr`` passes the dataset to the table runner, which prepares the shipped corpus itself
    (the dry run says so instead of asking for ``make data``)."""
    import subprocess

    from diverse_fairseq.tables.__main__ import main

    make = subprocess.run(["make", "-n", "--no-print-directory", "demo", "DATASET=demo_fr"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert make[-1].endswith("-m diverse_fairseq.tables demo --dataset demo_fr"), make
    monkeypatch.setenv("DRY_RUN", "1")
    with pytest.raises(SystemExit) as done:
        main(["demo", "--dataset", "demo_fr", "--data-bin", str(tmp_path / "data-bin"), "--out",
              str(tmp_path / "results")])
    assert done.value.code == 0 and not (tmp_path / "data-bin").exists()
    assert (f"a real run prepares it first (DATA_BIN={tmp_path / 'data-bin'} scripts/prepare_data.sh demo_fr)"
            in capsys.readouterr().out)
