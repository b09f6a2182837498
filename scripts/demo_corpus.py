#!/usr/bin/env python3
"""Build the English→German demo corpus from German gettext catalogs of Debian packages.

Standard library only: this runs before the project's virtual environment exists. The shell driver
``scripts/build_demo_corpus.sh`` downloads the pinned packages of ``data/demo/packages.txt`` and
extracts their German catalogs into ``<extract-dir>/<package>/usr/share/locale/de*/LC_MESSAGES/``;
this command then parses the catalogs (``.mo``, and ``.po`` for tests; ``corpuslib/catalog.py``), cleans the
pairs (``corpuslib/rules.py``), splits them deterministically and writes ``train``/``valid``/``test`` files plus
``stats.json`` (``corpuslib/build.py``).

Pipeline (each step is a small function there, counted in ``stats.json``):
  parse (undecodable entries dropped) → drop header → drop fuzzy → expand plurals → normalise
  whitespace → strip keyboard accelerators → drop untranslated → drop letterless → length filter →
  ratio filter → deduplicate pairs → one German per English → split by sha256 of the English side.
"""

import argparse
import json
import sys
from pathlib import Path

from corpuslib.build import build_corpus, write_corpus
from corpuslib.catalog import package_catalogs, parse_po, read_packages, write_mo


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
