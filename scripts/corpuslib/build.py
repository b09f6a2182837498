"""The pipeline over all catalogs, the deterministic train/valid/test split, and the written corpus."""

import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

from .catalog import read_catalog
from .rules import PAIR_RULES, deduplicate, drop_fuzzy, drop_header, expand_plurals, normalise_pair, unique_source

HELD_OUT = 1000
GZIP_TRAIN = True  # each side of train exceeds 1 MB, so they are shipped as deterministic .gz files


def split_key(pair):
    """Deterministic sort/split key: sha256 of the (normalised) English side, then the English."""
    return hashlib.sha256(pair.en.encode("utf-8")).hexdigest(), pair.en


def split_pairs(pairs, n_valid=HELD_OUT, n_test=HELD_OUT):
    """Split by hash order: the first ``n_test`` pairs → test, the next ``n_valid`` → valid, rest → train.

    English strings are unique already; a held-out candidate whose translation was already taken by an
    earlier held-out pair goes back to the train pool. Train pairs whose English or translation occurs in
    valid or test are dropped, so no held-out sentence (either side) is seen in training and
    valid ∩ test = ∅. Returns ``({split: pairs}, dropped_train_collisions)``.
    """
    held = {"test": [], "valid": []}
    wanted = {"test": n_test, "valid": n_valid}
    held_tgt, pool = set(), []
    for pair in sorted(pairs, key=split_key):
        split = next((s for s in ("test", "valid") if len(held[s]) < wanted[s]), None)
        if split is None or pair.tgt in held_tgt:
            pool.append(pair)
        else:
            held[split].append(pair)
            held_tgt.add(pair.tgt)
    held_en = {p.en for s in held.values() for p in s}
    train = [p for p in pool if p.en not in held_en and p.tgt not in held_tgt]
    return {"train": train, "valid": held["valid"], "test": held["test"]}, len(pool) - len(train)


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


def write_corpus(out_dir, splits, stats, lang, gzip_train=GZIP_TRAIN):
    """Write ``{split}.en`` and ``{split}.{lang}`` (train gzipped if ``gzip_train``) and ``stats.json`` into
    ``out_dir``; ``lang`` names the target side's files (``de``, ``fr``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        pairs = sorted(pairs, key=split_key)
        for suffix, lines in (("en", [p.en for p in pairs]), (lang, [p.tgt for p in pairs])):
            write_lines(out_dir / f"{name}.{suffix}", lines, gzip_train and name == "train")
    text = json.dumps(stats, indent=2, ensure_ascii=False) + "\n"
    (out_dir / "stats.json").write_text(text, encoding="utf-8")
