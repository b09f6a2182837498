"""Prepare a dataset from its public download to a binarized fairseq dataset, resumably.

    python -m diverse_fairseq.data.prepare DATASET [options]      (scripts/prepare_data.sh DATASET)

DATASET is one of demo, iwslt14_de_en, wmt14_en_de, wmt17_zh_en, or ``custom``: your own plain-text corpus
(``SRC=xx TGT=yy CORPUS_DIR=dir``, see :mod:`diverse_fairseq.data.recipes.custom`), prepared into
DATA_BIN/custom_xx_yy (or DATA_BIN/DATASET_NAME). The steps (download, extract,
collect, normalize, tokenize, clean, learn-bpe, apply-bpe, [clean-bpe], binarize) are each skipped
when their outputs exist and are complete, so an interrupted run continues where it stopped.
Intermediate files go to WORK_DIR/DATASET, the binarized data to DATA_BIN/DATASET (defaults: the repository's
work/ and data-bin/, :mod:`diverse_fairseq.runs.paths`), together with ``prepare.json`` (how the data was made, read
through :mod:`diverse_fairseq.runs.dataset_meta`), the test references (``test.ref.TGT`` raw, ``test.tok.TGT``
tokenized) and the BPE model. Long steps print progress lines (done of all, elapsed, time left) every
PROGRESS_INTERVAL seconds (:mod:`.progress`).

Every option also has an environment variable (in brackets), which the Makefile passes through. Other code
calls :func:`prepare` with typed :class:`PrepareOptions`; only :func:`parse_options` (``main``, the table
runner's command line) reads argv and the environment.
"""

import argparse
import bisect
import functools
import json
import os
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, fields
from pathlib import Path
from typing import List, Optional

from ..runs import env_checks, paths
from . import bpe as bpe_mod
from . import progress
from .archive import CorruptArchiveError, extract
from .binarize import binarize
from .download import DownloadError, expected_for, fetch, read_checksum_file, where_to_get
from .lines import count_lines, iter_lines, map_file
from .progress import Progress
from .recipes import RECIPES, TEMPLATES, Context, Recipe, get
from .steps import Pipeline, StopPipeline, atomic_path
from .text import clean_pair, normalize, tokenize
from .verify import Expectations, VerificationError, check_member_lines, reject, verified_sha256

SPLITS = ("train", "valid", "test")
# (variable, option key) of the options only the custom recipe reads
CUSTOM_OPTIONS = (("SRC (--src)", "src"), ("TGT (--tgt)", "tgt"), ("CORPUS_DIR (--corpus-dir)", "corpus_dir"),
                  ("DATASET_NAME (--name)", "name"), ("SEPARATE_VOCAB (--separate-vocab)", "separate_vocab"))


def _env(name, default=None):
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prepare_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", choices=sorted([*RECIPES, *TEMPLATES]),
                   help="which dataset to prepare; custom: your own corpus (--src, --tgt, --corpus-dir)")
    p.add_argument("--bpe", default=_env("BPE"),
                   help="segmentation, subword-nmt or sentencepiece [BPE]; default: the recipe's (sentencepiece "
                        "for demo, subword-nmt otherwise)")
    p.add_argument("--bpe-size", default=_env("BPE_SIZE"),
                   help="BPE merges / sentencepiece vocabulary [BPE_SIZE]; default: the recipe's (custom: 10000)")
    p.add_argument("--work-dir", default=str(paths.from_env("WORK_DIR")), help="root of intermediate files [WORK_DIR]")
    p.add_argument("--data-bin", default=str(paths.from_env("DATA_BIN")), help="root of binarized datasets [DATA_BIN]")
    p.add_argument("--mirror", default=_env("DIVERSE_FAIRSEQ_MIRROR"),
                   help="URL or directory holding the archives by file name, used instead of the public "
                        "addresses [DIVERSE_FAIRSEQ_MIRROR]")
    p.add_argument("--checksums", default=_env("CHECKSUMS"),
                   help="md5sum/sha256sum file: digests checked for files that have no published one; one that "
                        "contradicts a published digest is refused [CHECKSUMS]")
    p.add_argument("--expect", default=_env("EXPECT"), metavar="MANIFEST",
                   help="JSON manifest of expected sizes, checksums and member line counts that replace the "
                        "published ones (stand-in archives, e.g. the tests' fixtures); the data is written as "
                        "DATASET+NAME under WORK_DIR and DATA_BIN and labelled in prepare.json, never where the "
                        "real data goes [EXPECT]")
    p.add_argument("--workers", default=_env("WORKERS", "2"),
                   help="processes for tokenization, BPE and fairseq-preprocess [WORKERS] (default 2)")
    p.add_argument("--demo-dir", default=_env("DEMO_DIR"), help="demo corpus directory [DEMO_DIR] (default data/demo)")
    p.add_argument("--cwmt-dir", default=_env("CWMT_DIR"),
                   help="WMT17: where the manually downloaded CWMT corpora are [CWMT_DIR] "
                        "(default WORK_DIR/wmt17_zh_en/manual/cwmt)")
    p.add_argument("--skip-cwmt", action="store_true", default=None,
                   help="WMT17: proceed without the CWMT corpora [CWMT=skip]")
    p.add_argument("--wmt17-source", default=_env("WMT17_SOURCE"),
                   help="WMT17: where UN v1.0 comes from, original (the UN's two-part download, default) or hf "
                        "(the Hugging Face Hub copy of the wmt organisation) [WMT17_SOURCE]")
    p.add_argument("--length-unit", default=_env("LENGTH_UNIT"),
                   help="WMT17: what the 50-token length cap counts, subwords (after BPE, default) or words "
                        "(Moses tokens before BPE) [LENGTH_UNIT]")
    p.add_argument("--allow-unverified", action="store_true", default=_env("ALLOW_UNVERIFIED") == "1",
                   help="WMT17: go on when a corpus' pair count differs from the published one; prepare.json "
                        "records the data as unverified [ALLOW_UNVERIFIED=1]")
    p.add_argument("--zh-seg", default=_env("ZH_SEG", "jieba"),
                   help="WMT17: Chinese word segmentation before Moses tokenization, jieba or char [ZH_SEG]")
    p.add_argument("--src", default=_env("SRC"), help="custom: source language code, the suffix of its files [SRC]")
    p.add_argument("--tgt", default=_env("TGT"), help="custom: target language code [TGT]")
    p.add_argument("--corpus-dir", default=_env("CORPUS_DIR"),
                   help="custom: folder with train/valid/test.SRC and .TGT, one sentence per line [CORPUS_DIR]")
    p.add_argument("--name", default=_env("DATASET_NAME"),
                   help="custom: name of the prepared dataset under DATA_BIN [DATASET_NAME] (default custom_SRC_TGT)")
    p.add_argument("--separate-vocab", action="store_true", default=_env("SEPARATE_VOCAB") == "1",
                   help="custom: one BPE model and dictionary per language instead of joint ones [SEPARATE_VOCAB=1]")
    p.add_argument("--progress-interval", default=_env(progress.ENV, str(progress.DEFAULT_INTERVAL)),
                   help=f"seconds between progress lines of a long step, 0 = every update [{progress.ENV}] "
                        f"(default {progress.DEFAULT_INTERVAL:g})")
    p.add_argument("--stop-after", default=_env("STOP_AFTER"), metavar="STEP",
                   help="stop (resumably) after this step id, e.g. tokenize [STOP_AFTER]")
    return p


@dataclass(frozen=True)
class PrepareOptions:
    """What :func:`prepare` makes: the dataset and the options of :func:`build_parser` (validated)."""

    dataset: str
    bpe: Optional[str] = None  # None: the recipe's
    bpe_size: Optional[int] = None  # None: the recipe's
    work_dir: Path = paths.WORK_DIR
    data_bin: Path = paths.DATA_BIN
    mirror: Optional[str] = None
    checksums: Optional[str] = None
    expect: Optional[str] = None  # an expectations manifest (verify.Expectations): stand-ins, output DATASET+NAME
    workers: int = 2
    demo_dir: Optional[str] = None
    cwmt_dir: Optional[str] = None
    skip_cwmt: bool = False
    zh_seg: str = "jieba"
    wmt17_source: Optional[str] = None  # None: original
    length_unit: Optional[str] = None  # None: subwords
    allow_unverified: bool = False
    src: Optional[str] = None
    tgt: Optional[str] = None
    corpus_dir: Optional[str] = None
    name: Optional[str] = None
    separate_vocab: bool = False
    stop_after: Optional[str] = None


class Preparer:
    """Runs one recipe's pipeline with the user's options."""

    def __init__(self, recipe: Recipe, args: PrepareOptions):
        options = {"demo_dir": args.demo_dir, "cwmt_dir": args.cwmt_dir, "skip_cwmt": args.skip_cwmt,
                   "src": args.src, "tgt": args.tgt, "corpus_dir": args.corpus_dir, "name": args.name,
                   "separate_vocab": args.separate_vocab, "work_dir": args.work_dir,
                   "source": args.wmt17_source, "length_unit": args.length_unit,
                   "allow_unverified": args.allow_unverified}
        if recipe.name not in TEMPLATES:  # the custom corpus' options would be ignored: say so
            given = [var for var, key in CUSTOM_OPTIONS if options[key]]
            if given:
                raise SystemExit(f"error: {', '.join(given)} only apply to `custom` (your own corpus); {recipe.name} "
                                 f"has fixed languages and sources. Unset them, or prepare your corpus with "
                                 f"SRC=xx TGT=yy CORPUS_DIR=dir scripts/prepare_data.sh custom")
        if recipe.configure:
            recipe = recipe.configure(recipe, options)
        self.r = recipe
        self.args = args
        self.kind = args.bpe or recipe.bpe
        self.size = int(recipe.bpe_size if args.bpe_size is None else args.bpe_size)
        if self.size <= 0:
            raise SystemExit(f"error: BPE_SIZE (--bpe-size)={self.size} is not valid: use a positive number of "
                             f"merges (subword-nmt) or vocabulary entries (sentencepiece)")
        try:
            self.expect = Expectations.load(args.expect) if args.expect else None
        except VerificationError as e:
            raise SystemExit(f"error: {e}") from None
        # data made against a manifest's expectations never lands where the published data goes
        self.label = f"+{self.expect.name}" if self.expect else ""
        self.work = Path(args.work_dir) / ((recipe.work_name or recipe.name) + self.label)
        self.dest = Path(args.data_bin) / (recipe.name + self.label)
        shared = recipe.downloads_name or recipe.work_name or recipe.name  # a variant shares its base's archives
        self.downloads = Path(args.work_dir) / (shared + self.label) / "downloads"
        self.workers = max(1, args.workers)
        self.checksums = read_checksum_file(args.checksums) if args.checksums else {}
        self.ctx = Context(recipe, self.work, options, log=self.log)

    # ------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def log(msg):
        print(msg, flush=True)

    def path(self, stage: str, split: str, lang: str, ext: str = "") -> Path:
        return self.work / stage / (f"{split}.{lang}" + (f".{ext}" if ext else ""))

    @property
    def pair_stats(self) -> Path:
        """Training pairs per corpus before and after cleaning, written by the step that cleans train."""
        return self.work / "stats" / "train.pairs.json"

    def _corpus_of_line(self):
        """A function: index of a raw training line -> the corpus it came from (``raw/train.corpora.json``)."""
        path = self.ctx.corpora_path("train")
        sizes = json.loads(path.read_text()) if path.exists() else []
        bounds, names, end = [], [], 0
        for name, n in sizes:
            end += n
            bounds.append(end)
            names.append(name)

        def corpus(i):
            k = bisect.bisect_right(bounds, i)
            return names[k] if k < len(names) else self.r.name
        return corpus, {name: n for name, n in sizes}

    def _write_pair_stats(self, kept_by_corpus, total_by_corpus):
        stats = {name: {"before_cleaning": total_by_corpus.get(name, 0), "after_cleaning": kept_by_corpus.get(name, 0)}
                 for name in dict.fromkeys([*total_by_corpus, *kept_by_corpus])}
        self.pair_stats.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.pair_stats) as tmp:
            tmp.write_text(json.dumps(stats, indent=1) + "\n")
        for name, v in stats.items():
            self.log(f"  train {name}: {v['before_cleaning']:,} pairs before cleaning, {v['after_cleaning']:,} after")

    def splits_from_raw(self) -> List[str]:
        return list(self.r.raw_splits())

    def needs_tok(self, split: str, lang: str) -> bool:
        """Whether the Moses-tokenized text of (split, lang) is used later."""
        if self.kind == "subword-nmt":
            return True
        if split == "test" and lang == self.r.tgt:
            return True  # the tokenized reference for the papers' tokenized BLEU
        cleaned = split in self.r.clean_splits or (self.r.valid_every and split == "train")
        return bool(cleaned and not self.r.clean_after_bpe)

    # ------------------------------------------------------------------------------------------ pipeline
    def run(self):
        r = self.r
        if self.kind not in bpe_mod.KINDS:
            raise SystemExit(f"error: BPE must be one of {', '.join(bpe_mod.KINDS)}, not {self.kind!r}")
        self.log(f"[{r.name}] preparing {r.description}\n"
                 f"[{r.name}] {r.src}->{r.tgt}, {self.kind} {self.size}{' joint' if r.joint_bpe else ' per language'}, "
                 f"work dir {self.work}, output {self.dest}")
        if r.check:
            r.check(self.ctx)
        parts = [s for a in r.archives for s in a.parts]
        n_steps = len(parts) + len(r.archives) + 7 + (1 if r.clean_after_bpe else 0)
        pipe = Pipeline(r.name, self.work, n_steps, stop_after=self.args.stop_after, log=self.log)
        # a variant with other text processing shares the archives it has in common with the recipe it varies
        downloads = self.downloads
        if self.expect:
            self.log(f"[{r.name}] expectations from the manifest {self.expect.path} ({self.expect.name!r}), not the "
                     f"published ones: the data goes to {self.dest}")
        for source in parts:  # a file already there (an earlier run's, or placed by hand) is verified first
            if (downloads / source.filename).exists():
                self._download(source, downloads, self._expected(source))
        # each archive is downloaded, verified and extracted (member line counts checked) before the next one is
        # fetched, so that a wrong file is refused before anything else is done
        for archive in r.archives:
            for source in archive.parts:
                expected = self._expected(source)
                pipe.step(f"download-{source.filename}", f"download {source.filename}", [downloads / source.filename],
                          {"file": source.filename, "expected": expected.describe()},
                          functools.partial(self._download, source, downloads, expected))
            files = [downloads / s.filename for s in archive.parts]
            pipe.step(f"extract-{archive.name}", f"extract {' + '.join(f.name for f in files)}",
                      [self.ctx.extracted(archive.name)],
                      {"parts": [(f.name, f.stat().st_size if f.exists() else None) for f in files],
                       "lines": self._expected_lines(archive)},
                      functools.partial(self._extract, archive, files))
        raw_outputs = [self.ctx.raw_path(s, lang) for s in self.splits_from_raw() for lang in r.langs]
        if r.corpora_file:
            raw_outputs.append(self.ctx.raw / r.corpora_file)
        pipe.step("collect", "collect the raw parallel text (strip XML/SGM, concatenate corpora)", raw_outputs,
                  r.collect_key(self.ctx) if r.collect_key else {}, lambda: r.collect(self.ctx))
        self._text_steps(pipe)
        self._bpe_steps(pipe)
        self._binarize_step(pipe)
        self.log(f"[{r.name}] done: {self.dest} (ran {len(pipe.ran)} steps, skipped {len(pipe.skipped)})")
        pairs = json.loads((self.dest / "prepare.json").read_text()).get("train_pairs")
        if pairs:  # absent from data prepared by an earlier version
            for line in compare_with_paper(pairs, r.name):
                self.log(line)

    def _expected(self, source):
        try:
            return expected_for(source, self.checksums, self.expect.files if self.expect else None)
        except DownloadError as e:
            raise SystemExit(f"error: {e}") from None

    def _expected_lines(self, archive):
        if self.expect and archive.name in self.expect.lines:
            return self.expect.lines[archive.name], f"manifest {self.expect.path}"
        return dict(archive.expected_lines), archive.counts_source

    def _download(self, source, downloads, expected):
        try:
            fetch(source, downloads, mirror=self.args.mirror, checksums=self.checksums, log=self.log,
                  expected=expected)
        except DownloadError as e:
            hint = source.extra.get("hint")
            raise SystemExit(f"error: {e}" + (f"\n  {hint}" if hint else "")) from None

    def _extract(self, archive, files):
        """Extract ``archive`` and check its members' line counts before the folder appears under orig/."""
        lines, source = self._expected_lines(archive)
        where = where_to_get(archive.parts[0], self.args.mirror)
        found = {}

        def check(root):
            if lines:
                found.update(check_member_lines(root, lines, " + ".join(f.name for f in files), source, where))
                self.log(f"  {archive.name}: line counts as published ({source}): "
                         + ", ".join(f"{k} {v:,}" for k, v in found.items()))

        try:
            extract(files, self.ctx.extracted(archive.name), archive.wanted, self.log, check=check)
        except VerificationError as e:
            moved = reject(files)
            raise SystemExit(f"error: {e} The archive was moved to {', '.join(m.name for m in moved)}; run the "
                             f"command again to download it anew.") from None

    # normalise, tokenize, clean ----------------------------------------------------------------------
    def _text_steps(self, pipe: Pipeline):
        r = self.r
        splits = self.splits_from_raw()
        norm_out = [self.path("norm", s, lang) for s in splits for lang in r.langs]
        pipe.step("normalize", "normalize" + (" punctuation" if r.punct_norm else "") +
                  (", remove non-printing characters" if r.non_printing else "") +
                  (", ’ -> '" if r.apostrophe_splits else "") if (r.punct_norm or r.non_printing or r.apostrophe_splits)
                  else "normalize (nothing to do: copy)", norm_out,
                  {"punct": r.punct_norm, "non_printing": r.non_printing, "splits": r.normalize_splits,
                   "apostrophe": r.apostrophe_splits}, self._normalize)
        tok_pairs = [(s, lang) for s in splits for lang in r.langs if self.needs_tok(s, lang)]
        pipe.step("tokenize", "tokenize with sacremoses ("
                  f"{'aggressive hyphen splitting, ' if r.aggressive_dash else ''}"
                  f"{'lowercase, ' if r.lowercase else ''}{len(tok_pairs)} files)",
                  [self.path("tok", s, lang) for s, lang in tok_pairs],
                  {"pairs": tok_pairs, "aggressive": r.aggressive_dash, "lowercase": r.lowercase,
                   "zh_seg": self.args.zh_seg if "zh" in r.langs else None},
                  functools.partial(self._tokenize, tok_pairs))
        out_splits = list(SPLITS)
        clean_out = [self.path("clean", s, lang, "txt") for s in out_splits for lang in r.langs]
        before = not r.clean_after_bpe
        what = (f"clean (ratio {r.clean_ratio}, {r.clean_min}-{r.clean_max} tokens) " if before else "") + \
               (f"and split valid = every {r.valid_every}-th line " if r.valid_every else "")
        pipe.step("clean", (what or "collect splits ") + ("" if before else "(cleaning happens after BPE)"),
                  clean_out + ([self.pair_stats] if before else []),
                  {"before_bpe": before, "max": r.clean_max, "min": r.clean_min, "ratio": r.clean_ratio,
                   "splits": r.clean_splits, "valid_every": r.valid_every, "lowercase": r.lowercase},
                  self._clean)

    def _normalize(self):
        r = self.r
        for split in self.splits_from_raw():
            for lang in r.langs:
                on = split in r.normalize_splits
                fn = functools.partial(normalize, lang=lang, punct=r.punct_norm and on,
                                       non_printing=r.non_printing and on, apostrophe=split in r.apostrophe_splits)
                map_file(fn, self.ctx.raw_path(split, lang), self.path("norm", split, lang), self.workers,
                         desc=f"normalize {split}.{lang}")

    def _tokenize(self, pairs):
        r = self.r
        for split, lang in pairs:
            fn = functools.partial(tokenize, lang=lang, aggressive_dash=r.aggressive_dash, lowercase=r.lowercase,
                                   zh_seg=self.args.zh_seg)
            n = map_file(fn, self.path("norm", split, lang), self.path("tok", split, lang), self.workers,
                         desc=f"tokenize {split}.{lang}")
            self.log(f"  tokenized {split}.{lang}: {n:,} lines")

    def _clean(self):
        """Write clean/{split}.{lang}.txt (and .tok where tokenized text exists) for train/valid/test."""
        r = self.r
        for split in self.splits_from_raw():
            streams = {}
            for lang in r.langs:
                streams[(lang, "txt")] = iter_lines(self.path("norm", split, lang))
                if self.path("tok", split, lang).exists() and self.needs_tok(split, lang):
                    streams[(lang, "tok")] = iter_lines(self.path("tok", split, lang))
            do_clean = (not r.clean_after_bpe) and (split in r.clean_splits)
            if do_clean and not all((lang, "tok") in streams for lang in r.langs):
                raise RuntimeError(f"cleaning {split} needs tokenized text for both languages (a bug)")
            targets = ["train", "valid"] if (split == "train" and r.valid_every) else [split]
            keys = list(streams)
            kept = total = 0
            corpus_of, _ = self._corpus_of_line()
            kept_by, total_by = {}, {}
            with ExitStack() as stack:
                writers = {}
                for t in targets:
                    for lang, ext in keys:
                        tmp = stack.enter_context(atomic_path(self.path("clean", t, lang, ext)))
                        writers[(t, lang, ext)] = stack.enter_context(open(tmp, "w", encoding="utf-8"))
                rows = zip(*(streams[k] for k in keys))
                meter = Progress(f"clean {split}", total=count_lines(self.path("norm", split, r.src)), unit="pairs")
                for row in rows:
                    meter.update()
                    name = corpus_of(total)
                    total_by[name] = total_by.get(name, 0) + 1
                    total += 1
                    values = dict(zip(keys, row))
                    if do_clean:
                        pair = clean_pair(values[(r.src, "tok")], values[(r.tgt, "tok")], r.clean_min, r.clean_max,
                                          r.clean_ratio)
                        if pair is None:
                            continue
                        values[(r.src, "tok")], values[(r.tgt, "tok")] = pair
                    kept += 1
                    kept_by[name] = kept_by.get(name, 0) + 1
                    target = "valid" if len(targets) == 2 and kept % r.valid_every == 0 else targets[0]
                    for (lang, ext), text in values.items():
                        if ext == "txt" and r.lowercase:
                            text = text.lower()
                        writers[(target, lang, ext)].write(text + "\n")
                meter.close()
            self.log(f"  {split}: kept {kept:,} of {total:,} pairs"
                     + (f" ({total - kept:,} removed)" if do_clean else "")
                     + (f", every {r.valid_every}-th kept pair -> valid" if len(targets) == 2 else ""))
            if split == "train" and not r.clean_after_bpe:
                self._write_pair_stats(kept_by, total_by)

    # BPE ----------------------------------------------------------------------------------------------
    def _bpe_input(self, split, lang) -> Path:
        return self.path("clean", split, lang, "tok" if self.kind == "subword-nmt" else "txt")

    def _bpe_steps(self, pipe: Pipeline):
        r = self.r
        model_dir = self.work / "bpe"
        models = bpe_mod.model_files(self.kind, model_dir, list(r.langs), r.joint_bpe)
        pipe.step("learn-bpe", f"learn {self.kind} ({self.size}, {'joint' if r.joint_bpe else 'per language'})",
                  sorted(set(models.values())), {"kind": self.kind, "size": self.size, "joint": r.joint_bpe},
                  lambda: bpe_mod.learn(self.kind, {lang: self._bpe_input("train", lang) for lang in r.langs},
                                        model_dir, self.size, r.joint_bpe, self.workers, log=self.log))
        self.models = models
        pipe.step("apply-bpe", f"apply {self.kind} to train, valid, test",
                  [self.path("bpe", s, lang) for s in SPLITS for lang in r.langs], {},
                  lambda: [bpe_mod.apply(self.kind, models[lang], self._bpe_input(s, lang), self.path("bpe", s, lang),
                                         self.workers) for s in SPLITS for lang in r.langs])
        if r.clean_after_bpe:
            pipe.step("clean-bpe", f"clean after BPE ({', '.join(r.clean_splits)}: ratio {r.clean_ratio}, "
                      f"{r.clean_min}-{r.clean_max} tokens)",
                      [self.path("final", s, lang) for s in SPLITS for lang in r.langs] + [self.pair_stats],
                      {"max": r.clean_max, "min": r.clean_min, "ratio": r.clean_ratio, "splits": r.clean_splits},
                      self._clean_after_bpe)

    def _final(self, split, lang) -> Path:
        return self.path("final" if self.r.clean_after_bpe else "bpe", split, lang)

    def _clean_after_bpe(self):
        r = self.r
        for split in SPLITS:
            src, tgt = self.path("bpe", split, r.src), self.path("bpe", split, r.tgt)
            if split not in r.clean_splits:
                for lang in r.langs:
                    with atomic_path(self.path("final", split, lang)) as tmp:
                        shutil.copyfile(self.path("bpe", split, lang), tmp)
                continue
            kept = total = 0
            corpus_of, _ = self._corpus_of_line()
            kept_by, total_by = {}, {}
            with atomic_path(self.path("final", split, r.src)) as ts, \
                    atomic_path(self.path("final", split, r.tgt)) as tt, \
                    open(ts, "w", encoding="utf-8") as fs, open(tt, "w", encoding="utf-8") as ft:
                meter = Progress(f"clean {split}", total=count_lines(src), unit="pairs")
                for s, t in zip(iter_lines(src), iter_lines(tgt)):
                    meter.update()
                    name = corpus_of(total)  # before-BPE steps keep every train line: line i is raw line i
                    total_by[name] = total_by.get(name, 0) + 1
                    total += 1
                    pair = clean_pair(s, t, r.clean_min, r.clean_max, r.clean_ratio)
                    if pair is not None:
                        fs.write(pair[0] + "\n")
                        ft.write(pair[1] + "\n")
                        kept += 1
                        kept_by[name] = kept_by.get(name, 0) + 1
                meter.close()
            self.log(f"  {split}: kept {kept:,} of {total:,} pairs ({total - kept:,} removed)")
            if split == "train":
                self._write_pair_stats(kept_by, total_by)

    # binarize ---------------------------------------------------------------------------------------
    def _binarize_step(self, pipe: Pipeline):
        meta = self.dest / "prepare.json"
        pipe.step("binarize", "binarize with fairseq-preprocess"
                  f"{' (joined dictionary)' if self.r.joined_dictionary else ''}"
                  f" into {self.dest}", [meta], {"dest": str(self.dest), "joined": self.r.joined_dictionary},
                  self._binarize)

    def _binarize(self):
        r = self.r
        if self.dest.exists() and not (self.dest / "prepare.json").exists():
            raise SystemExit(f"error: {self.dest} exists but was not made by this script (no prepare.json); "
                             f"move it away or choose another DATA_BIN")
        prefix = {split: self.work / ("final" if r.clean_after_bpe else "bpe") / split for split in SPLITS}
        tmp = binarize(r.src, r.tgt, prefix["train"], prefix["valid"], prefix["test"], self.dest,
                       r.joined_dictionary, workers=self.workers, log=self.log)
        counts = {}
        for split in SPLITS:
            counts[split] = sum(1 for _ in iter_lines(self._final(split, r.src)))
        # references: raw (for sacrebleu) where the split is the untouched raw split, tokenized for tok-BLEU
        refs = {}
        for split in ("valid", "test"):
            raw = self.ctx.raw_path(split, r.tgt)
            if raw.exists() and split not in r.clean_splits:
                shutil.copyfile(raw, tmp / f"{split}.ref.{r.tgt}")
                refs[split] = f"{split}.ref.{r.tgt}"
            tok = self.path("clean", split, r.tgt, "tok")
            if tok.exists():
                shutil.copyfile(tok, tmp / f"{split}.tok.{r.tgt}")
        for lang, model in self.models.items():
            if not (tmp / model.name).exists():
                shutil.copyfile(model, tmp / model.name)
        meta = {
            "dataset": r.name, "recipe": self.args.dataset, "description": r.description,
            "source_lang": r.src, "target_lang": r.tgt,
            "bpe": self.kind, "bpe_size": self.size, "joint_bpe": r.joint_bpe,
            "bpe_models": {lang: m.name for lang, m in self.models.items()},
            "post_process": bpe_mod.POST_PROCESS[self.kind],
            "moses_tokenized": self.kind == "subword-nmt", "lowercase": r.lowercase,
            "aggressive_dash": r.aggressive_dash, "zh_seg": self.args.zh_seg if "zh" in r.langs else None,
            "joined_dictionary": r.joined_dictionary, "beam": r.beam, "lenpen": r.lenpen,
            "max_len_a": r.max_len_a, "max_len_b": r.max_len_b,
            "sacrebleu_tokenize": "zh" if r.tgt == "zh" else "13a",
            "compound_split": r.tgt == "de", "references": refs, "sentences": counts,
            "verification": self._verification_record(),
            "train_pairs": self._train_pairs_record(counts["train"]),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        if r.corpora_file:
            meta["training_data"] = training_data(self.work / "raw" / r.corpora_file, counts["train"],
                                                  r.clean_max, r.clean_after_bpe, self.log)
        (tmp / "prepare.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
        if self.dest.exists():
            shutil.rmtree(self.dest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, self.dest)
        self.log("  sentences: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    def _verification_record(self):
        """What each fetched file was checked against, and its sha256 (to compare two machines' data)."""
        downloads = self.downloads
        files = {}
        for archive in self.r.archives:
            lines, source = self._expected_lines(archive)
            for src in archive.parts:
                expected = self._expected(src)
                path = downloads / src.filename  # deleted after extraction to save disk: nothing to record
                files[src.filename] = {
                    "archive": archive.name, "size": path.stat().st_size if path.exists() else None,
                    "sha256": verified_sha256(path, expected) if path.exists() else None,
                    "checked": (f"{expected.describe()} ({expected.source})" if expected.pinned()
                                else "no published size or checksum (HTML and magic bytes only)"),
                    "member_lines": ({k: v for k, v in lines.items()} if lines else None),
                    "member_lines_source": source or None}
        return {"expectations": ({"manifest": self.expect.name, "path": self.expect.path} if self.expect
                                 else "published"), "files": files}

    def _train_pairs_record(self, final_train):
        corpora = json.loads(self.pair_stats.read_text()) if self.pair_stats.exists() else {}
        return {"corpora": corpora, "final_train": final_train, "paper": self.r.paper_train_pairs or None,
                "paper_source": self.r.paper_train_source or None,
                "expectations": "published" if not self.expect else f"manifest {self.expect.name}"}


def training_data(corpora_file: Path, train_pairs: int, clean_max: int, after_bpe: bool, log=print) -> dict:
    """The recipe's record of its training corpora (``Recipe.corpora_file``), completed with the final training
    pair count, the length cap's unit, and the comparison with the paper's count (printed)."""
    record = json.loads(Path(corpora_file).read_text(encoding="utf-8"))
    record["length_cap"] = {"max": clean_max, "unit": "subwords after BPE" if after_bpe else "words before BPE"}
    record["train_pairs"] = train_pairs
    paper = record.get("paper_train_pairs")
    if paper:
        record["train_pairs_vs_paper"] = round(train_pairs / paper, 4)
        log(f"  training pairs: {train_pairs:,}, the paper's {paper:,} ({100 * train_pairs / paper:.1f}%; "
            f"{record.get('paper_source', '')})")
    if not record.get("verified", True):
        log("  warning: the training data is not the published data: " + "; ".join(record.get("problems", []))
            + ". prepare.json records it; paper-scale tables refuse it unless ALLOW_UNVERIFIED_DATA=1")
    return record


ZH_SEGS = ("jieba", "char")


def check_args(args, recipe: Recipe):
    """Validate the options and the environment variables they default to, before any work (SystemExit
    naming the variable and the accepted values)."""
    if args.bpe is not None:
        args.bpe = env_checks.parse_choice("BPE (--bpe)", args.bpe, bpe_mod.KINDS)
    if args.bpe_size is not None:
        args.bpe_size = env_checks.parse_int("BPE_SIZE (--bpe-size)", args.bpe_size, 1)
    args.workers = env_checks.parse_int("WORKERS (--workers)", args.workers, 1)
    args.zh_seg = env_checks.parse_choice("ZH_SEG (--zh-seg)", args.zh_seg, ZH_SEGS)
    if args.skip_cwmt is None:
        cwmt = _env("CWMT")
        if cwmt is not None and cwmt != "skip":
            raise env_checks.bad("CWMT", cwmt, "use CWMT=skip to prepare WMT17 without the CWMT corpora, or leave "
                                               "it unset")
        args.skip_cwmt = cwmt == "skip"
    if args.stop_after is not None:
        args.stop_after = env_checks.parse_choice("STOP_AFTER (--stop-after)", args.stop_after,
                                                  step_ids(recipe))
    return args


#: a final training pair count further than this fraction from the paper's is a warning
PAPER_TOLERANCE = 0.05
#: a corpus that loses more than this fraction of its pairs in cleaning is named as short
CORPUS_LOSS = 0.10


def compare_with_paper(record, dataset: str) -> List[str]:
    """Lines that print the final training pair count beside the paper's; a warning naming the short corpus
    when they differ by more than :data:`PAPER_TOLERANCE`."""
    paper, final = record.get("paper"), record["final_train"]
    if not paper:
        return [f"[{dataset}] training pairs: {final:,} (no paper count to compare with)"]
    diff = (final - paper) / paper
    out = [f"[{dataset}] training pairs: {final:,}, the paper's {paper:,} ({diff:+.1%}; {record['paper_source']})"]
    if abs(diff) <= PAPER_TOLERANCE:
        return out
    corpora = record.get("corpora") or {}
    lossy = [f"{name} kept {v['after_cleaning']:,} of {v['before_cleaning']:,}"
             for name, v in corpora.items()
             if v["before_cleaning"] and v["after_cleaning"] < (1 - CORPUS_LOSS) * v["before_cleaning"]]
    listing = "; ".join(f"{name} {v['before_cleaning']:,} -> {v['after_cleaning']:,}" for name, v in corpora.items())
    if diff < 0:
        why = (f"short: {'; '.join(lossy)} (lost more than {CORPUS_LOSS:.0%} in cleaning)" if lossy else
               f"no corpus lost more than {CORPUS_LOSS:.0%} in cleaning, so a corpus is smaller than the paper's "
               f"or missing: {listing}")
    else:
        why = f"more pairs than the paper's: {listing}"
    label = "" if record.get("expectations") == "published" else f" [{record.get('expectations')}]"
    out.append(f"[{dataset}] warning{label}: {abs(diff):.0%} {'fewer' if diff < 0 else 'more'} training pairs than "
               f"the paper; {why}")
    return out


def step_ids(recipe: Recipe) -> List[str]:
    """The ids of the recipe's pipeline steps, in order (the values of ``--stop-after``)."""
    return ([step for a in recipe.archives
             for step in [f"download-{s.filename}" for s in a.parts] + [f"extract-{a.name}"]]
            + ["collect", "normalize", "tokenize", "clean", "learn-bpe", "apply-bpe"]
            + (["clean-bpe"] if recipe.clean_after_bpe else []) + ["binarize"])


def parse_options(argv) -> PrepareOptions:
    """The validated :class:`PrepareOptions` of a command line and the environment (SystemExit naming a bad
    value); also sets the progress interval (``PROGRESS_INTERVAL``) of this process."""
    args = build_parser().parse_args(argv)
    progress.set_interval(progress.parse_interval(args.progress_interval))
    args = check_args(args, get(args.dataset))
    return PrepareOptions(**{f.name: getattr(args, f.name) for f in fields(PrepareOptions)})


def prepare(options: PrepareOptions) -> Path:
    """Prepare ``options.dataset`` (each step skipped when its output is complete); return its folder under
    ``options.data_bin``. Raises :class:`StopPipeline` where ``stop_after`` stops it."""
    preparer = Preparer(get(options.dataset), options)
    preparer.run()
    return preparer.dest


def main(argv=None):
    options = parse_options(argv)
    name = get(options.dataset).name
    try:
        prepare(options)
    except StopPipeline as e:
        print(f"[{name}] {e}", flush=True)
    except (CorruptArchiveError, VerificationError) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(f"\n[{name}] interrupted; run the same command again to resume") from None


if __name__ == "__main__":
    main()
