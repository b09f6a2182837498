#!/usr/bin/env python3
"""Build an English→X demo corpus (X = de: data/demo, fr: data/demo_fr) from gettext catalogs of Debian packages.

Standard library only: this runs before the project's virtual environment exists. The shell driver
``scripts/build_demo_corpus.sh [LANG]`` downloads the pinned packages of ``<out>/packages.txt`` and extracts
their catalogs of language LANG into ``<extract-dir>/<package>/usr/share/locale/{LANG,LANG_LANG}/LC_MESSAGES/``;
this command then parses the catalogs (``.mo``, and ``.po`` for tests; ``corpuslib/catalog.py``), cleans the
pairs (``corpuslib/rules.py``), splits them deterministically and writes ``train``/``valid``/``test`` files plus
``stats.json`` (``corpuslib/build.py``). The language changes only which catalogs are read and the target files'
suffix: every rule is the same for every language.

Pipeline (each step is a small function there, counted in ``stats.json``):
  parse (undecodable entries dropped) → drop header → drop fuzzy → expand plurals → normalise
  whitespace → strip keyboard accelerators → drop untranslated → drop letterless → length filter →
  ratio filter → deduplicate pairs → one translation per English string → split by sha256 of the English side.
"""

import argparse
import json
import sys
from pathlib import Path

from corpuslib.build import build_corpus, write_corpus
from corpuslib.catalog import locale_dirs, package_catalogs, parse_po, read_packages, write_mo


def corpus_dir(lang):
    """The shipped corpus folder of target language ``lang``: ``data/demo`` (German), ``data/demo_<lang>``."""
    return "data/demo" if lang == "de" else f"data/demo_{lang}"


def main(argv=None):
    """Command line: build the corpus, or (``--po2mo``) compile a ``.po`` file into a ``.mo`` file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lang", default="de", help="target language: the catalogs read and the files' suffix")
    parser.add_argument("--packages", help="pinned 'name version' list (default <out>/packages.txt)")
    parser.add_argument("--extract-dir", help="extracted package trees (default work/demo_corpus/extract/<lang>)")
    parser.add_argument("--out", help="output folder (default data/demo for de, data/demo_<lang> otherwise)")
    parser.add_argument("--po2mo", nargs=2, metavar=("PO", "MO"), help="only compile PO into MO")
    args = parser.parse_args(argv)
    if args.po2mo:
        Path(args.po2mo[1]).write_bytes(write_mo(parse_po(Path(args.po2mo[0]).read_bytes())))
        return 0
    try:
        locale_dirs(args.lang)
    except ValueError as e:
        parser.error(f"--lang: {e}")
    out = args.out or corpus_dir(args.lang)
    packages = read_packages(args.packages or f"{out}/packages.txt")
    catalogs = package_catalogs(packages, args.extract_dir or f"work/demo_corpus/extract/{args.lang}", args.lang)
    splits, stats = build_corpus(catalogs)
    stats["packages"] = {name: {"version": version, **stats["packages"][name]} for name, version in packages}
    write_corpus(out, splits, stats, args.lang)
    print(json.dumps({key: stats[key] for key in ("steps", "splits")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
