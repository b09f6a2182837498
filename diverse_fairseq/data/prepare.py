"""Prepare a dataset from its public download to a binarized fairseq dataset, resumably.

    python -m diverse_fairseq.data.prepare DATASET [options]      (scripts/prepare_data.sh DATASET)

DATASET is one of demo, demo_fr, iwslt14_de_en, wmt14_en_de, wmt17_zh_en, or ``custom``: your own plain-text corpus
(``SRC=xx TGT=yy CORPUS_DIR=dir``, see :mod:`diverse_fairseq.data.recipes.custom`), prepared into
DATA_BIN/custom_xx_yy (or DATA_BIN/DATASET_NAME). The steps (download, extract, collect, normalize, tokenize,
clean, learn-bpe, apply-bpe, [clean-bpe], binarize) are each skipped when their outputs exist and are complete, so
an interrupted run continues where it stopped. Intermediate files go to WORK_DIR/DATASET, the binarized data to
DATA_BIN/DATASET (defaults: the repository's work/ and data-bin/), with ``prepare.json`` (how the data was made,
read through :mod:`diverse_fairseq.runs.dataset_meta`), the test references (``test.ref.TGT`` raw,
``test.tok.TGT`` tokenized) and the BPE model. Long steps print progress lines every PROGRESS_INTERVAL seconds.
Every option also has an environment variable (in brackets).
"""

import argparse
import functools
import hashlib
import itertools
import json
import os
import shlex
import shutil
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

from ..runs import env_checks, paths
from ..runs.dataset_meta import (
    CorpusPairs,
    DatasetMeta,
    FileCheck,
    LengthCap,
    TrainingData,
    TrainPairs,
    Verification,
    load_dataset_meta,
)
from ..runs.identity import changed_fields
from ..runs.options import add_options, choice, integer, label, option, resolve, switch, text, warn_misspelled, word
from ..runs.paths import data_bin_option, work_dir_option
from . import bpe as bpe_mod
from . import progress
from .archive import CorruptArchiveError, extract
from .download import (
    DownloadError,
    checksums_option,
    expected_for,
    fetch,
    mirror_option,
    read_checksum_file,
    where_to_get,
)
from .progress import Progress, ProgressOptions, atomic_path, begin_step, heartbeat
from .recipes import RECIPES, TEMPLATES, Context, Recipe, get
from .recipes.base import SPLITS
from .text import MOSES_RULES, clean_pair, count_lines, iter_lines, map_file, normalize, tokenize
from .verify import (
    Expectations,
    Expected,
    VerificationError,
    candidates,
    check_member_lines,
    describe_all,
    reject,
    verified_record,
)


def _option(var: str, help: str, default=None, parse=text, custom_only=False, **kind):
    """A field of :class:`PrepareOptions` (:func:`~diverse_fairseq.runs.options.option`); ``custom_only``: an
    option of the ``custom`` recipe (your own corpus), refused with any other dataset."""
    return option(var, f"custom: {help}" if custom_only else help, default, parse, custom_only=custom_only, **kind)


def _label(f) -> str:
    """``VAR (--option)``: how errors name an option."""
    return label(f)


@dataclass(frozen=True)
class PrepareOptions:
    """What :func:`prepare` makes: the dataset and its options. Each field is the command-line option
    ``--field-name`` of :func:`build_parser`, read from its environment variable where not given."""

    dataset: str
    bpe: Optional[str] = _option("BPE", "segmentation, subword-nmt or sentencepiece; default: the recipe's "
                                        "(sentencepiece for demo, subword-nmt otherwise)", parse=choice(bpe_mod.KINDS))
    bpe_size: Optional[int] = _option("BPE_SIZE", "BPE merges / sentencepiece vocabulary; default: the recipe's "
                                                  "(custom: 10000)", parse=integer(1))
    work_dir: Path = work_dir_option()
    data_bin: Path = data_bin_option()
    mirror: Optional[str] = mirror_option("URL or directory holding the archives by file name, used instead of the "
                                          "public addresses")
    checksums: Optional[str] = checksums_option("md5sum/sha256sum file: digests checked for files that have no "
                                                "published one; one that contradicts a published digest is refused")
    expect: Optional[str] = _option(
        "EXPECT", "JSON manifest of expected sizes, checksums and member line counts that replace the published ones "
        "(stand-in archives, e.g. the tests' fixtures); the data is written as DATASET+NAME under WORK_DIR and "
        "DATA_BIN and labelled in prepare.json, never where the real data goes", metavar="MANIFEST")
    workers: int = _option("WORKERS", "processes for tokenization, BPE and fairseq-preprocess (default 2)", 2,
                           integer(1))
    demo_dir: Optional[str] = _option("DEMO_DIR", "demo corpus directory (default data/demo; data/demo_fr for demo_fr)")
    cwmt_dir: Optional[str] = _option("CWMT_DIR", "WMT17: where the manually downloaded CWMT corpora are "
                                                  "(default WORK_DIR/wmt17_zh_en/manual/cwmt)")
    skip_cwmt: bool = _option("CWMT", "WMT17: proceed without the CWMT corpora (CWMT=skip)", False, word("skip"),
                              store_true=True)
    zh_seg: str = _option("ZH_SEG", "WMT17: Chinese word segmentation before Moses tokenization, jieba or char",
                          "jieba", choice(("jieba", "char")))
    wmt17_source: Optional[str] = _option("WMT17_SOURCE", "WMT17: where UN v1.0 comes from, original (the UN's "
                                          "two-part download, default) or hf (the Hugging Face Hub copy of the wmt "
                                          "organisation)")
    length_unit: Optional[str] = _option("LENGTH_UNIT", "WMT17: what the 50-token length cap counts, subwords (after "
                                                        "BPE, default) or words (Moses tokens before BPE)")
    allow_unverified: bool = _option("ALLOW_UNVERIFIED", "WMT17: go on when a corpus' pair count differs from the "
                                     "published one; prepare.json records the data as unverified (ALLOW_UNVERIFIED=1)",
                                     False, switch, store_true=True)
    src: Optional[str] = _option("SRC", "source language code, the suffix of its files", custom_only=True)
    tgt: Optional[str] = _option("TGT", "target language code", custom_only=True)
    corpus_dir: Optional[str] = _option("CORPUS_DIR", "folder with train/valid/test.SRC and .TGT, one "
                                                      "sentence per line", custom_only=True)
    name: Optional[str] = _option("DATASET_NAME", "name of the prepared dataset under DATA_BIN "
                                                  "(default custom_SRC_TGT)", custom_only=True)
    separate_vocab: bool = _option("SEPARATE_VOCAB", "one BPE model and dictionary per language instead of joint "
                                                     "ones (SEPARATE_VOCAB=1)", False, switch, custom_only=True,
                                   store_true=True)
    replace: bool = _option("REPLACE", "replace the prepared dataset under DATA_BIN when this one differs from it "
                                       "(BPE size, dictionaries, ...); without it that is refused, as models trained "
                                       "on it would no longer match (REPLACE=1)", False, switch, store_true=True)
    stop_after: Optional[str] = _option("STOP_AFTER", "stop (resumably) after this step id, e.g. tokenize",
                                        metavar="STEP")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prepare_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="which dataset to prepare: " + ", ".join(DATASETS) + "; custom: your own corpus "
                                   "(--src, --tgt, --corpus-dir)")
    return add_options(p, PrepareOptions, ProgressOptions)


DATASETS = sorted([*RECIPES, *TEMPLATES])


def parse_options(argv: Optional[List[str]], env: Mapping[str, str]) -> PrepareOptions:
    """The :class:`PrepareOptions` of a command line and the environment: an option not given is its variable's
    value, else the field's default (SystemExit naming a bad value); also sets the progress interval
    (``PROGRESS_INTERVAL``) of this process. An unknown dataset is refused in one line naming the valid ones."""
    args = build_parser().parse_args(argv)
    if args.dataset not in DATASETS:
        raise SystemExit(f"error: unknown dataset {args.dataset!r}: use one of {', '.join(DATASETS)} "
                         f"(make data DATASET=NAME; custom: your own corpus, SRC=xx TGT=yy CORPUS_DIR=dir)")
    progress.set_interval(resolve(ProgressOptions, env, args).interval)
    return resolve(PrepareOptions, env, args, dataset=args.dataset)


class StopPipeline(Exception):
    """Raised after the step named by ``--stop-after`` (a deliberate, resumable stop)."""


class Preparer:
    """Runs one recipe's pipeline with the user's options: its steps in order, each printing ``[name] step i/n:
    title`` and whether it ran or was skipped."""

    def __init__(self, recipe: Recipe, args: PrepareOptions):
        """The options are checked before any work: SystemExit naming the variable and what to use."""
        given = [_label(f) for f in fields(args)[1:] if f.metadata.get("custom_only") and getattr(args, f.name)]
        if given and recipe.name not in TEMPLATES:  # the custom corpus' options would be ignored
            raise SystemExit(f"error: {', '.join(given)} only apply to `custom` (your own corpus); {recipe.name} has "
                             f"fixed languages and sources. Unset them, or prepare your corpus with SRC=xx TGT=yy "
                             f"CORPUS_DIR=dir scripts/prepare_data.sh custom")
        options = {**asdict(args), "source": args.wmt17_source}
        self.r = recipe = recipe.configure(recipe, options) if recipe.configure else recipe
        if args.stop_after is not None:  # the other options are checked where they enter (parse_options)
            stop_after = next(f for f in fields(args) if f.name == "stop_after")
            env_checks.parse_choice(_label(stop_after), args.stop_after, step_ids(recipe))
        self.args = args
        self.kind = args.bpe or recipe.bpe
        self.size = args.bpe_size or recipe.bpe_size
        self.expect = Expectations.load(args.expect) if args.expect else None
        # data made against a manifest's expectations never lands where the published data goes
        label = f"+{self.expect.name}" if self.expect else ""
        self.work = Path(args.work_dir) / (recipe.name + label)
        self.dest = Path(args.data_bin) / (recipe.name + label)
        shared = recipe.downloads_name or recipe.name  # a variant shares its base's archives
        self.downloads = Path(args.work_dir) / (shared + label) / "downloads"
        self.pair_stats = self.work / "stats" / "train.pairs.json"  # training pairs per corpus before/after cleaning
        self.models = bpe_mod.model_files(self.kind, self.work / "bpe", recipe.langs, recipe.joint_bpe)
        self.checksums = read_checksum_file(args.checksums) if args.checksums else {}
        self.ctx = Context(recipe, self.work, options, log=self.log, downloads=self.downloads)
        self.chain = hashlib.sha256(recipe.name.encode()).hexdigest()  # the key of the steps so far
        self.ran, self.skipped = [], []

    log = staticmethod(functools.partial(print, flush=True))

    def path(self, stage: str, split: str, lang: str, ext: str = "") -> Path:
        return self.work / stage / (f"{split}.{lang}" + (f".{ext}" if ext else ""))

    def needs_tok(self, split: str, lang: str) -> bool:
        """Whether the Moses-tokenized text of (split, lang) is used later."""
        if self.kind == "subword-nmt" or (split == "test" and lang == self.r.tgt):
            return True  # subword-nmt segments the tokens; the tokenized reference is for the papers' tokenized BLEU
        cleaned = split in self.r.clean_splits or (self.r.valid_every and split == "train")
        return bool(cleaned and not self.r.clean_after_bpe)

    # ------------------------------------------------------------------------------------------ pipeline
    def run(self) -> Path:
        r, kind, size, langs = self.r, self.kind, self.size, self.r.langs
        self.log(f"[{r.name}] preparing {r.description}\n"
                 f"[{r.name}] {r.src}->{r.tgt}, {kind} {size}{' joint' if r.joint_bpe else ' per language'}, "
                 f"work dir {self.work}, output {self.dest}")
        if r.check:
            r.check(self.ctx)
        if self.expect:
            self.log(f"[{r.name}] expectations from the manifest {self.expect.path} ({self.expect.name!r}), not the "
                     f"published ones: the data goes to {self.dest}")
        # a file already there (an earlier run's, or placed by hand) is verified first
        for source in (s for a in r.archives for s in a.parts):
            if (self.downloads / source.filename).exists():
                self._download(source, self._expected(source))
        # each archive is downloaded, verified and extracted (member line counts checked) before the next one is
        # fetched, so that a wrong file is refused before anything else is done
        for archive in r.archives:
            for source in archive.parts:
                expected, name = self._expected(source), source.filename
                self.step(f"download-{name}", f"download {name}", [self.downloads / name],
                           {"file": name, "expected": describe_all(expected)},
                           functools.partial(self._download, source, expected))
            files = [self.downloads / s.filename for s in archive.parts]
            self.step(f"extract-{archive.name}", f"extract {' + '.join(f.name for f in files)}",
                       [self.ctx.extracted(archive.name)],
                       {"parts": [(f.name, f.stat().st_size if f.exists() else None) for f in files],
                        "lines": self._expected_lines(archive)},
                       functools.partial(self._extract, archive, files))
        splits = r.raw_splits()
        raw_outputs = ([self.ctx.raw_path(s, lang) for s in splits for lang in langs]
                       + ([self.ctx.raw / r.corpora_file] if r.corpora_file else []))
        self.step("collect", "collect the raw parallel text (strip XML/SGM, concatenate corpora)", raw_outputs,
                   r.collect_key(self.ctx) if r.collect_key else {}, lambda: r.collect(self.ctx))
        what = [w for w, on in ((" punctuation", r.punct_norm), (", remove non-printing characters", r.non_printing),
                                (", ’ -> '", r.apostrophe_splits)) if on]
        self.step("normalize", "normalize" + "".join(what) if what else "normalize (nothing to do: copy)",
                   [self.path("norm", s, lang) for s in splits for lang in langs],
                   {"punct": r.punct_norm, "non_printing": r.non_printing, "splits": r.normalize_splits,
                    "apostrophe": r.apostrophe_splits, **({"moses": MOSES_RULES} if r.punct_norm else {})},
                   lambda: [map_file(functools.partial(normalize, lang=lang, apostrophe=s in r.apostrophe_splits,
                                                       punct=r.punct_norm and s in r.normalize_splits,
                                                       non_printing=r.non_printing and s in r.normalize_splits),
                                     self.ctx.raw_path(s, lang), self.path("norm", s, lang), self.args.workers,
                                     desc=f"normalize {s}.{lang}") for s in splits for lang in langs])
        tok_pairs = [(s, lang) for s in splits for lang in langs if self.needs_tok(s, lang)]
        self.step("tokenize", "tokenize with sacremoses ("
                   f"{'aggressive hyphen splitting, ' if r.aggressive_dash else ''}"
                   f"{'lowercase, ' if r.lowercase else ''}{len(tok_pairs)} files)",
                   [self.path("tok", s, lang) for s, lang in tok_pairs],
                   {"pairs": tok_pairs, "aggressive": r.aggressive_dash, "lowercase": r.lowercase,
                    "zh_seg": self.args.zh_seg if "zh" in langs else None, "moses": MOSES_RULES},
                   functools.partial(self._tokenize, tok_pairs))
        before = not r.clean_after_bpe
        what = (f"clean (ratio {r.clean_ratio}, {r.clean_min}-{r.clean_max} tokens) " if before else "") + \
               (f"and split valid = every {r.valid_every}-th line " if r.valid_every else "")
        self.step("clean", (what or "collect splits ") + ("" if before else "(cleaning happens after BPE)"),
                   [self.path("clean", s, lang, "txt") for s in SPLITS for lang in langs]
                   + ([self.pair_stats] if before else []),
                   {"before_bpe": before, "max": r.clean_max, "min": r.clean_min, "ratio": r.clean_ratio,
                    "splits": r.clean_splits, "valid_every": r.valid_every, "lowercase": r.lowercase},
                   lambda: [self._clean(s, "clean") for s in splits])
        ext = "tok" if kind == "subword-nmt" else "txt"
        self.step("learn-bpe", f"learn {kind} ({size}, {'joint' if r.joint_bpe else 'per language'})",
                   sorted(set(self.models.values())), {"kind": kind, "size": size, "joint": r.joint_bpe},
                   lambda: bpe_mod.learn(kind, {lang: self.path("clean", "train", lang, ext) for lang in langs},
                                         self.work / "bpe", size, r.joint_bpe, self.args.workers, log=self.log,
                                         again=self._again))
        self.step("apply-bpe", f"apply {kind} to train, valid, test",
                   [self.path("bpe", s, lang) for s in SPLITS for lang in langs], {},
                   lambda: [bpe_mod.apply(kind, self.models[lang], self.path("clean", s, lang, ext),
                                          self.path("bpe", s, lang), self.args.workers)
                            for s in SPLITS for lang in langs])
        if r.clean_after_bpe:  # clean_splits (train among them) cleaned, the others copied as they are
            self.step("clean-bpe", f"clean after BPE ({', '.join(r.clean_splits)}: ratio {r.clean_ratio}, "
                       f"{r.clean_min}-{r.clean_max} tokens)",
                       [self.path("final", s, lang) for s in SPLITS for lang in langs] + [self.pair_stats],
                       {"max": r.clean_max, "min": r.clean_min, "ratio": r.clean_ratio, "splits": r.clean_splits},
                       lambda: [self._clean(s, "final") for s in SPLITS])
        self.step("binarize", "binarize with fairseq-preprocess"
                   f"{' (joined dictionary)' if r.joined_dictionary else ''} into {self.dest}",
                   [self.dest / "prepare.json"], {"dest": str(self.dest), "joined": r.joined_dictionary},
                   self._binarize)
        self.log(f"[{r.name}] done: {self.dest} (ran {len(self.ran)} steps, skipped {len(self.skipped)})")
        for line in compare_with_paper(load_dataset_meta(self.dest).train_pairs, r.name):
            self.log(line)
        return self.dest

    def step(self, step_id: str, title: str, outputs: List[Path], params: Dict, fn: Callable[[], None]):
        """Run ``fn`` unless step ``step_id`` already completed with the same parameters and inputs. A finished step
        leaves a stamp ``WORK/.stamps/<step>.json`` with a key made of its parameters and the keys of all steps before
        it; the next run skips it when the key matches and its outputs exist, else runs it (and, as their keys
        change, everything after it) again."""
        blob = json.dumps({"step": step_id, "params": params, "before": self.chain}, sort_keys=True, default=str)
        key = self.chain = hashlib.sha256(blob.encode()).hexdigest()
        label = f"[{self.r.name}] step {len(self.ran) + len(self.skipped) + 1}/{len(step_ids(self.r))}"
        stamp = self.work / ".stamps" / f"{step_id}.json"
        try:
            done = all(o.exists() for o in outputs) and json.loads(stamp.read_text()).get("key") == key
        except (OSError, ValueError):
            done = False
        if done:
            self.log(f"{label}: {title} -- done already, skipped")
            self.skipped.append(step_id)
        else:
            stamp.unlink(missing_ok=True)
            self.log(f"{label}: {title}")
            started = time.time()
            begin_step(label)
            try:
                fn()
            finally:
                begin_step("")
            missing = [str(o) for o in outputs if not o.exists()]
            if missing:
                raise RuntimeError(f"step {step_id} finished without producing {', '.join(missing)} (a bug)")
            seconds = round(time.time() - started, 1)
            with atomic_path(stamp) as tmp:
                tmp.write_text(json.dumps({"key": key, "params": params, "outputs": [str(o) for o in outputs],
                                           "seconds": seconds}, indent=1, default=str))
            self.log(f"[{self.r.name}]   finished {step_id} in {seconds:.1f}s")
            self.ran.append(step_id)
        if step_id == self.args.stop_after:
            raise StopPipeline(f"stopped after step {step_id} as asked (--stop-after); run again to continue")

    def _expected(self, source):
        return expected_for(source, self.checksums, self.expect.files if self.expect else None)

    def _expected_lines(self, archive):
        if self.expect and archive.name in self.expect.lines:
            return self.expect.lines[archive.name], f"manifest {self.expect.path}"
        return dict(archive.expected_lines), archive.counts_source

    def _download(self, source, expected):
        try:
            fetch(source, self.downloads, mirror=self.args.mirror, checksums=self.checksums, log=self.log,
                  expected=expected)
        except DownloadError as e:
            hint = source.extra.get("hint")
            raise SystemExit(f"error: {e}" + (f"\n  {hint}" if hint else "")) from None

    def _extract(self, archive, files):
        """Extract ``archive`` and check its members' line counts before the folder appears under orig/."""
        lines, source = self._expected_lines(archive)
        where = where_to_get(archive.parts[0], self.args.mirror)

        def check(root):
            if lines:
                found = check_member_lines(root, lines, " + ".join(f.name for f in files), source, where)
                self.log(f"  {archive.name}: line counts as published ({source}): "
                         + ", ".join(f"{k} {v:,}" for k, v in found.items()))

        try:
            extract(files, self.ctx.extracted(archive.name), archive.wanted, self.log, check=check)
        except VerificationError as e:
            moved = reject(files)
            raise SystemExit(f"error: {e} The archive was moved to {', '.join(m.name for m in moved)}; run the "
                             f"command again to download it anew.") from None

    def _tokenize(self, pairs):
        for split, lang in pairs:
            fn = functools.partial(tokenize, lang=lang, aggressive_dash=self.r.aggressive_dash,
                                   lowercase=self.r.lowercase, zh_seg=self.args.zh_seg)
            n = map_file(fn, self.path("norm", split, lang), self.path("tok", split, lang), self.args.workers,
                         desc=f"tokenize {split}.{lang}")
            self.log(f"  tokenized {split}.{lang}: {n:,} lines")

    def _clean(self, split: str, stage: str):
        """Copy ``split``'s line-aligned files into ``stage``/{target}.{lang}.{ext} (clean/: the normalized .txt, and
        the tokenized .tok where it is used later; final/: the BPE text) without the pairs that clean-corpus-n.perl
        drops, where this stage is the recipe's cleaning one (on .tok before BPE, or after BPE); into clean/, every
        ``valid_every``-th kept training pair goes to valid. The cleaning stage writes the training pairs per corpus
        before and after (:attr:`pair_stats`)."""
        r, after_bpe = self.r, stage == "final"
        cleaning = after_bpe == r.clean_after_bpe
        if after_bpe:
            inputs = {(lang, ""): self.path("bpe", split, lang) for lang in r.langs}
        else:
            inputs = {(lang, ext): self.path("norm" if ext == "txt" else "tok", split, lang)
                      for lang in r.langs for ext in ("txt", "tok") if ext == "txt" or self.needs_tok(split, lang)}
        clean_ext = ("" if after_bpe else "tok") if cleaning and split in r.clean_splits else None
        targets = ["train", "valid"] if not after_bpe and split == "train" and r.valid_every else [split]
        path = self.ctx.corpora_path("train")  # the corpus of each raw training line, in order
        sizes = json.loads(path.read_text()) if path.exists() else []
        corpora = itertools.chain(*(itertools.repeat(name, n) for name, n in sizes), itertools.repeat(r.name))
        kept_by, total_by = Counter(), Counter()
        with ExitStack() as stack:
            out = {}
            for target in targets:
                for lang, ext in inputs:
                    tmp = stack.enter_context(atomic_path(self.path(stage, target, lang, ext)))
                    out[target, lang, ext] = stack.enter_context(open(tmp, "w", encoding="utf-8"))
            meter = stack.enter_context(Progress(f"clean {split}", total=count_lines(next(iter(inputs.values()))),
                                                 unit="pairs"))
            for row, corpus in zip(zip(*map(iter_lines, inputs.values())), corpora):
                meter.update()
                total_by[corpus] += 1
                values = dict(zip(inputs, row))
                if clean_ext is not None:
                    pair = clean_pair(values[r.src, clean_ext], values[r.tgt, clean_ext], r.clean_min, r.clean_max,
                                      r.clean_ratio)
                    if pair is None:
                        continue
                    values[r.src, clean_ext], values[r.tgt, clean_ext] = pair
                kept_by[corpus] += 1
                target = "valid" if len(targets) == 2 and kept_by.total() % r.valid_every == 0 else targets[0]
                for (lang, ext), text in values.items():
                    out[target, lang, ext].write((text.lower() if ext == "txt" and r.lowercase else text) + "\n")
        kept, total = kept_by.total(), total_by.total()
        self.log(f"  {split}: kept {kept:,} of {total:,} pairs"
                 + (f" ({total - kept:,} removed)" if clean_ext is not None else "")
                 + (f", every {r.valid_every}-th kept pair -> valid" if len(targets) == 2 else ""))
        if split == "train" and cleaning:
            stats = {name: {"before_cleaning": n, "after_cleaning": kept_by[name]} for name, n in total_by.items()}
            with atomic_path(self.pair_stats) as tmp:
                tmp.write_text(json.dumps(stats, indent=1) + "\n")
            for name, n in total_by.items():
                self.log(f"  train {name}: {n:,} pairs before cleaning, {kept_by[name]:,} after")

    def _binarize(self):
        """fairseq-preprocess into ``dest.binarizing``, where the references, BPE models and prepare.json join it
        before it is renamed to ``dest`` (which so only ever holds a complete dataset). fairseq runs in this process
        (a subprocess would pay for importing torch and fairseq again)."""
        from fairseq import options
        from fairseq_cli import preprocess

        r = self.r
        if self.dest.exists() and not (self.dest / "prepare.json").exists():
            raise SystemExit(f"error: {self.dest} exists but was not made by this script (no prepare.json); "
                             f"move it away or choose another DATA_BIN")
        final = self.work / ("final" if r.clean_after_bpe else "bpe")
        tmp = self.dest.with_name(self.dest.name + ".binarizing")
        if tmp.exists():
            shutil.rmtree(tmp)
        argv = ["--source-lang", r.src, "--target-lang", r.tgt,
                *(a for s in SPLITS for a in (f"--{s}pref", str(final / s))), "--destdir", str(tmp),
                "--workers", str(self.args.workers)] + (["--joined-dictionary"] if r.joined_dictionary else [])
        self.log("  fairseq-preprocess " + " ".join(argv))
        before = list(preprocess.logger.handlers)
        try:
            with heartbeat("fairseq-preprocess", log=self.log):
                preprocess.main(options.get_preprocessing_parser().parse_args(argv))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            for handler in set(preprocess.logger.handlers) - set(before):  # main adds a preprocess.log file handler
                preprocess.logger.removeHandler(handler)
                handler.close()
        counts = {split: count_lines(final / f"{split}.{r.src}") for split in SPLITS}
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
        for model in set(self.models.values()):
            shutil.copyfile(model, tmp / model.name)
        stats = json.loads(self.pair_stats.read_text()) if self.pair_stats.exists() else {}
        training_data = None
        if r.corpora_file:  # the recipe's record of its training corpora, completed
            record = TrainingData.from_json(json.loads((self.ctx.raw / r.corpora_file).read_text(encoding="utf-8")))
            training_data = replace(
                record, length_cap=LengthCap(r.clean_max, "subwords after BPE" if r.clean_after_bpe
                                             else "words before BPE"), train_pairs=counts["train"],
                train_pairs_vs_paper=round(counts["train"] / record.paper_train_pairs, 4)
                if record.paper_train_pairs else None)  # printed by compare_with_paper
            if not record.verified:
                self.log("  warning: the training data is not the published data: " + "; ".join(record.problems)
                         + ". prepare.json records it; paper-scale tables refuse it unless ALLOW_UNVERIFIED_DATA=1")
        unk = self._unk_rates(tmp, final)
        moses = any(self.needs_tok(split, lang) for split in r.raw_splits() for lang in r.langs) or r.punct_norm
        DatasetMeta(
            dataset=r.name, recipe=self.args.dataset, description=r.description, source_lang=r.src,
            target_lang=r.tgt, bpe=self.kind, bpe_size=self.size, joint_bpe=r.joint_bpe,
            bpe_models={lang: m.name for lang, m in self.models.items()},
            post_process=self.kind.replace("-", "_"),  # fairseq's --post-process that undoes the segmentation
            moses_tokenized=self.kind == "subword-nmt", lowercase=r.lowercase, aggressive_dash=r.aggressive_dash,
            zh_seg=self.args.zh_seg if "zh" in r.langs else None, joined_dictionary=r.joined_dictionary,
            beam=r.beam, lenpen=r.lenpen, max_len_a=r.max_len_a, max_len_b=r.max_len_b,
            sacrebleu_tokenize="zh" if r.tgt == "zh" else "13a", compound_split=r.tgt == "de", references=refs,
            sentences=counts, created=time.strftime("%Y-%m-%d %H:%M:%S"), moses=MOSES_RULES if moses else None,
            verification=self._verification_record(),
            train_pairs=TrainPairs({name: CorpusPairs(**v) for name, v in stats.items()}, counts["train"],
                                   r.paper_train_pairs or None, r.paper_train_source or None,
                                   f"manifest {self.expect.name}" if self.expect else "published"),
            training_data=training_data, unk=unk,
        ).write(tmp)
        if self.dest.exists():
            differences = replaced_differences(self.dest, tmp)
            if differences and not self.args.replace:
                shutil.rmtree(tmp)
                raise SystemExit(
                    f"error: {self.dest} already holds a prepared dataset that this one would replace, and they differ "
                    f"({'; '.join(differences)}): models trained on it would no longer match its dictionaries. To "
                    f"replace it: {self._again(self.size, replace=True)} (the finished steps are kept); or move it "
                    f"aside first (mv {self.dest} {self.dest}.old); to keep both, choose another DATA_BIN"
                    f"{' or DATASET_NAME' if self.args.dataset == 'custom' else ''}")
            if differences:
                self.log(f"  replacing {self.dest} (REPLACE=1): {'; '.join(differences)}")
            shutil.rmtree(self.dest)
        os.replace(tmp, self.dest)  # tmp is dest's sibling, made by fairseq-preprocess
        self.log("  sentences: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    def _unk_rates(self, binarized: Path, final: Path) -> Dict[str, Dict[str, float]]:
        """{split: {language: % of tokens <unk>}} of valid and test, as fairseq-preprocess reports them (and this
        script's own log otherwise drops): printed, and warned of above :data:`~.bpe.UNK_WARN_PCT` % with
        ``BPE_SIZE`` and a size that fits the corpus (:func:`~.bpe.fitting_merges`)."""
        from fairseq.data import Dictionary

        r = self.r
        dictionaries = {lang: Dictionary.load(str(binarized / f"dict.{lang}.txt")) for lang in r.langs}
        rates = {split: {lang: round(bpe_mod.unk_percent(iter_lines(final / f"{split}.{lang}"),
                                                         dictionaries[lang].indices), 2) for lang in r.langs}
                 for split in ("valid", "test")}
        self.log("  <unk> after binarisation: " + "; ".join(f"{split} " + ", ".join(
            f"{lang} {pct:.2f}%" for lang, pct in langs.items()) for split, langs in rates.items()))
        worst = max(pct for langs in rates.values() for pct in langs.values())
        if worst > bpe_mod.UNK_WARN_PCT:
            self.log(f"  warning: {worst:.2f}% of the tokens of a held-out split are <unk> (more than "
                     f"{bpe_mod.UNK_WARN_PCT:g}%): {self._fitting_size()}")
        return rates

    def _fitting_size(self) -> str:
        """What to do about many <unk>: a BPE_SIZE that fits this corpus (found with the merges it learned), and the
        command that prepares it so."""
        r = self.r
        if self.kind != "subword-nmt":
            size = max(1, self.size // 2)
            return (f"the {self.size:,}-piece sentencepiece vocabulary does not fit this corpus; prepare it again with "
                    f"a smaller one, e.g. {self._again(size, replace=True)}")
        groups = [list(r.langs)] if r.joint_bpe else [[lang] for lang in r.langs]
        sizes = [bpe_mod.fitting_merges(self.models[langs[0]], [self.path("clean", "train", lang, "tok")
                                                                  for lang in langs],
                                        [self.path("clean", split, lang, "tok") for split in ("valid", "test")
                                         for lang in langs]) for langs in groups]
        learned = min(bpe_mod.count_merges(self.models[langs[0]]) for langs in groups)
        if None in sizes:
            return (f"no number of BPE merges brings it under {bpe_mod.UNK_WARN_PCT:g}%: valid or test has "
                    f"characters the training text lacks (BPE_SIZE={self.size:,}, {learned:,} merges learned)")
        return (f"BPE_SIZE={self.size:,} ({learned:,} merges learned) segments held-out words into pieces the "
                f"training text never has; {min(sizes):,} merges would leave at most {bpe_mod.UNK_WARN_PCT:g}% "
                f"<unk>: {self._again(min(sizes), replace=True)}")

    def _again(self, bpe_size: int, replace: Optional[bool] = None) -> str:
        """The command that prepares this dataset again with ``bpe_size`` (the options that name the data given);
        with REPLACE=1 where it replaces a prepared dataset (``replace``; default: where one is there)."""
        a = self.args
        replace = (self.dest / "prepare.json").exists() if replace is None else replace
        given = [("SRC", a.src), ("TGT", a.tgt), ("CORPUS_DIR", a.corpus_dir), ("DATASET_NAME", a.name),
                 ("SEPARATE_VOCAB", "1" if a.separate_vocab else None), ("DEMO_DIR", a.demo_dir), ("BPE", a.bpe),
                 ("WORK_DIR", a.work_dir if Path(a.work_dir) != Path(paths.WORK_DIR) else None),
                 ("DATA_BIN", a.data_bin if Path(a.data_bin) != Path(paths.DATA_BIN) else None),
                 ("EXPECT", a.expect), ("REPLACE", "1" if replace else None), ("BPE_SIZE", bpe_size)]
        return " ".join([f"{var}={shlex.quote(str(value))}" for var, value in given if value]
                        + ["scripts/prepare_data.sh", a.dataset])

    def _verification_record(self) -> Verification:
        """What each fetched file was checked against, its sha256 (to compare two machines' data) and, for a file
        published in several copies, which copy it is and where it came from."""
        files = {}
        for archive in self.r.archives:
            lines, source = self._expected_lines(archive)
            for src in archive.parts:
                expected = self._expected(src)
                path = self.downloads / src.filename  # deleted after extraction to save disk: nothing to record
                record = (verified_record(path, expected) or {}) if path.exists() else {}
                copy = next((c for c in candidates(expected) if c.copy and c.copy == record.get("copy")), None)
                checked = copy or (expected if isinstance(expected, Expected) else None)
                files[src.filename] = FileCheck(
                    archive.name, path.stat().st_size if path.exists() else None, record.get("sha256"),
                    f"{checked.describe()} ({checked.source})" if checked and checked.pinned() else
                    describe_all(expected) if not checked else
                    "no published size or checksum (HTML and magic bytes only)",
                    dict(lines) or None, source or None, copy.copy if copy else None,
                    record.get("origin", "") if copy else None)
        return Verification({"manifest": self.expect.name, "path": self.expect.path} if self.expect else "published",
                            files)


def compare_with_paper(record: TrainPairs, dataset: str, tolerance: float = 0.05, corpus_loss: float = 0.10
                       ) -> List[str]:
    """Lines that print the final training pair count beside the paper's; a warning when they differ by more than
    ``tolerance``, naming the corpora that lost more than ``corpus_loss`` of their pairs in cleaning."""
    paper, final = record.paper, record.final_train
    if not paper:
        return [f"[{dataset}] training pairs: {final:,} (no paper count to compare with)"]
    diff = (final - paper) / paper
    out = [f"[{dataset}] training pairs: {final:,}, the paper's {paper:,} ({diff:+.1%}; {record.paper_source})"]
    if abs(diff) <= tolerance:
        return out
    corpora = record.corpora.items()
    lossy = "; ".join(f"{name} kept {v.after_cleaning:,} of {v.before_cleaning:,}" for name, v in corpora
                      if v.after_cleaning < (1 - corpus_loss) * v.before_cleaning)
    listing = "; ".join(f"{name} {v.before_cleaning:,} -> {v.after_cleaning:,}" for name, v in corpora)
    why = (f"more pairs than the paper's: {listing}" if diff > 0
           else f"short: {lossy} (lost more than {corpus_loss:.0%} in cleaning)" if lossy
           else f"no corpus lost more than {corpus_loss:.0%} in cleaning, so a corpus is smaller than the paper's or "
                f"missing: {listing}")
    label = "" if record.expectations == "published" else f" [{record.expectations}]"
    out.append(f"[{dataset}] warning{label}: {abs(diff):.0%} {'fewer' if diff < 0 else 'more'} training pairs than "
               f"the paper; {why}")
    return out


def replaced_differences(old: Path, new: Path) -> List[str]:
    """How the prepared dataset in ``new`` differs from the one in ``old`` that it would replace: the fields of
    prepare.json that a run's identity takes (:meth:`DatasetMeta.identity`), then the dictionaries; empty when the
    same data was made again."""
    changed = [f"{name}: {before!r} before, {after!r} now"[:200] for name, before, after
               in changed_fields(load_dataset_meta(old).identity(), load_dataset_meta(new).identity())
               if name != "dataset"]
    dictionaries = sorted(name for name in {p.name for folder in (old, new) for p in folder.glob("dict.*.txt")}
                          if not (old / name).is_file() or not (new / name).is_file()
                          or (old / name).read_bytes() != (new / name).read_bytes())
    return changed + ([f"dictionaries {', '.join(dictionaries)} differ"] if dictionaries else [])


def step_ids(recipe: Recipe) -> List[str]:
    """The ids of the recipe's pipeline steps, in order (the values of ``--stop-after``)."""
    return ([step for a in recipe.archives
             for step in [f"download-{s.filename}" for s in a.parts] + [f"extract-{a.name}"]]
            + ["collect", "normalize", "tokenize", "clean", "learn-bpe", "apply-bpe"]
            + (["clean-bpe"] if recipe.clean_after_bpe else []) + ["binarize"])


def prepare(options: PrepareOptions) -> Path:
    """Prepare ``options.dataset`` (each step skipped when its output is complete); return its folder under
    ``options.data_bin``. The options are checked first (SystemExit naming the variable); a download or
    verification that fails raises its error, and :class:`StopPipeline` where ``stop_after`` stops it."""
    return Preparer(get(options.dataset), options).run()


def main(argv=None):
    warn_misspelled(os.environ, "prepare")
    if os.environ.get("DRY_RUN", "") not in ("", "0"):  # train.sh's and the tables' variable: here it would be ignored
        raise SystemExit("error: DRY_RUN is set, but preparing data has no dry run (it would download and write for "
                         "real): run it without DRY_RUN (its options: scripts/prepare_data.sh --help)")
    options = parse_options(argv, os.environ)
    try:
        prepare(options)
    except StopPipeline as e:
        print(f"[{options.dataset}] {e}", flush=True)
    except (CorruptArchiveError, DownloadError, VerificationError) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(f"\n[{options.dataset}] interrupted; run the same command again to resume") from None


if __name__ == "__main__":
    main()
