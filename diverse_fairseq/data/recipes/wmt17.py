"""WMT17 Chinese→English: News Commentary v12 + UN Parallel Corpus v1.0 + CWMT (about 25M pairs).

newsdev2017 is valid and newstest2017 test; BPE (32k merges) and dictionaries per language; training pairs longer
than 50 tokens dropped (the journal paper: "maximum length limited to 50", about 20.6M pairs). The cap's unit is an
assumption (the journal names no unit; the authors' THUMT trainer, github.com/jack57lee/Diversify-MHA
``bin/trainer.py``, filters only at 256): subwords after BPE by default, ``LENGTH_UNIT=words`` counts Moses tokens
(segmented Chinese words) before BPE. The routes (CWMT from the Hugging Face Hub, since WMT17's FTP server no
longer answers; ``WMT17_SOURCE=hf``) and the verification (:func:`check_counts`, :func:`corpus_record`):
docs/usage.md, "WMT17 Zh→En".
"""

import hashlib
import json
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Tuple

from ...runs.dataset_meta import CorpusCount, CwmtRecord, TrainingData
from ..archive import extract
from ..download import Copy, Source, copies_source
from ..text import iter_lines, sgm_segments
from ..verify import VerificationError, check_copies, junk_member
from .base import NEWS_COMMENTARY_V12, WMT17_DEV, WMT_SETTINGS, Archive, Context, Recipe, sacrebleu_source, write_raw

UN_HINT = ("The UN's own addresses do not always answer: WMT17_SOURCE=hf (--wmt17-source hf) downloads the same "
           "corpus from the Hugging Face Hub instead.")
#: the parts' sizes and sha1: GluonNLP's registry of the first address (github.com/dmlc/gluon-nlp,
#: scripts/datasets/url_checksums/wmt.txt at 01122db3867722db061566a79e843a08f9134431); together 1,386,685,703 bytes,
#: the size TensorFlow Datasets records for the whole archive (url_checksums/wmt17_translate.txt at 333639b3)
UN_PART_PINS = ((1_073_741_824, "1bec5f10297512183e483fdd4984d207700657d1"),
                (312_943_879, "15df2968bc69ef7662cf3029282bbb62cbf107b1"))
UN_PARTS = [Source(f"UNv1.0.en-zh.tar.gz.{i:02d}", tuple(base + f"UNv1.0.en-zh.tar.gz.{i:02d}" for base in (
    "https://stuncorpusprod.blob.core.windows.net/corpusfiles/",
    "https://conferences.unite.un.org/UNCorpus/en/DownloadFile?filename=")), extra={"hint": UN_HINT},
    size=size, sha1=sha1, checksum_source="GluonNLP url_checksums/wmt.txt (01122db)")
    for i, (size, sha1) in enumerate(UN_PART_PINS)]
#: the Hugging Face Hub copies (``wmt_utils.py`` of huggingface/datasets' wmt17/wmt18/wmt19 scripts); the sizes and
#: sha256 of their zips: Hugging Face's own record (HF_RECORD)
HF_BASE = "https://huggingface.co/datasets/wmt/"
HF_RECORD = ("huggingface/datasets, datasets/wmt17/dataset_infos.json (zh-en download_checksums) at "
             "040102f100964a33fd334e2695f1c493fa6b92db")
HF_UN = Source("UNv1.0.en-zh.zip", (HF_BASE + "uncorpus/resolve/main-zip/UNv1.0.en-zh.zip",), size=1_385_832_125,
               sha256="97f5ce0892084cdbb2332b52ffcc0299a649ba0a43712d921575fe2b7edfb4b4", checksum_source=HF_RECORD)
DEV = WMT17_DEV
TEST = sacrebleu_source("test.tgz", "https://data.statmt.org/wmt17/translation-task/test.tgz")

CWMT_CORPORA = ("casia2015", "casict2011", "casict2015", "datum2015", "datum2017", "neu2017")
#: where the CWMT zips are: the address Hugging Face's current wmt_utils.py uses (wmt/wmt18's main-zip revision:
#: commit 452c046 on wmt/wmt18, "Replace wmt18 main branch with main-zip", 9e4608a on wmt/wmt19; its main branch
#: now holds Parquet files), then the wmt/wmt18-data dataset repository's cwmt-wmt/ folder (commit f9b1de8, "Re-add
#: CWMT data files")
CWMT_ADDRESSES = (HF_BASE + "wmt18/resolve/main-zip/cwmt-wmt/{}.zip",
                  HF_BASE + "wmt18-data/resolve/main/cwmt-wmt/{}.zip")
#: five zips are the files the WMT17 FTP server served, byte for byte: Hugging Face's sizes and sha256 (HF_RECORD,
#: and the LFS pointers of wmt/wmt18-data f9b1de8) equal TensorFlow Datasets' of the FTP files
#: (url_checksums/wmt17_translate.txt at 333639b37af6c6fedf3610a4a2d42f1c6ef6f7d5)
CWMT_PINS = {"casia2015": (98_159_063, "c939f1528f96c419e9bbffb9caad869616a969e7704ffac896e245a02aff59a9"),
             "casict2011": (166_957_775, "606adc0ccc5d8fc7c47f8589991286616342a1a379a571ce3038918731ae0182"),
             "casict2015": (106_836_569, "eef8e25b297c1aff12ab24719247d3588e756d7a4e2c30d4d34fcb4d05ab1050"),
             "datum2015": (100_118_018, "654afce6731485c40ce856514ab80cd2bfd836126bcaf48cdb911ebc32b021a4"),
             "datum2017": (99_278_067, "737455c139596f4abf3b1da73bc38932b3ef9534549328eff47d867e29950ed2")}
CWMT_PINS_SOURCE = (f"{HF_RECORD}; equal to TensorFlow Datasets' record of the WMT17 FTP file "
                    f"(url_checksums/wmt17_translate.txt, 333639b3)")
#: neu2017 has two published copies: Hugging Face's, a repack (wmt/wmt18-data commit 65bb4bb "fix neu2017" replaced
#: a 148,680,704-byte upload by it), served by both addresses; and the FTP server's file, which no address serves any
#: more (a copy put into downloads/ or CWMT_DIR is recognised)
HF_NEU2017 = Copy("Hugging Face's repack", tuple(a.format("neu2017") for a in CWMT_ADDRESSES), 150_311_715,
                  sha256="5c5ea9ac5cbc43c974bd53796a3a29829800865b6398b52cda0a3854cb0d2e03",
                  source=f"{HF_RECORD}; wmt/wmt18-data cwmt-wmt/neu2017.zip LFS pointer (65bb4bb)")
FTP_NEU2017 = Copy("the WMT17 FTP file", (), 148_681_171,
                   sha256="9f63020b6990cde85f5387b745e3ae37f1d6a49848b90a49bae28219fb65395f",
                   sha1="532b56ba62f6cffccdc85f4316468873ca739bd1",
                   source="TensorFlow Datasets url_checksums/wmt17_translate.txt (333639b3); sha1: GluonNLP "
                          "url_checksums/wmt.txt (01122db)")
CWMT_HINT = ("If you have the CWMT zips or folders, put them into WORK_DIR/wmt17_zh_en/manual/cwmt/ (or CWMT_DIR=dir): "
             "they are used instead; CWMT=skip prepares the data without CWMT.")
CWMT_SOURCES = {**{name: Source(f"{name}.zip", tuple(a.format(name) for a in CWMT_ADDRESSES), size=size, sha256=sha256,
                                checksum_source=CWMT_PINS_SOURCE, extra={"hint": CWMT_HINT})
                   for name, (size, sha256) in CWMT_PINS.items()},
                "neu2017": copies_source("neu2017.zip", (HF_NEU2017, FTP_NEU2017), extra={"hint": CWMT_HINT})}
SOURCES = ("original", "hf")  # WMT17_SOURCE: where UN v1.0 comes from
LENGTH_UNITS = ("subwords", "words")  # LENGTH_UNIT: what the 50-token cap counts

#: where the published counts come from. UN v1.0: the UN's own statistics; CWMT: no count from CWMT that we know of,
#: only a third party's, made on its repack of the WMT17 FTP files (COUNTED_COPIES)
UN_COUNT_SOURCE = ("the UN Parallel Corpus page, conferences.unite.un.org/uncorpus, bilingual statistics: en-zh 91,028 "
                   "documents, 15,886,041 lines")
CWMT_COUNTS_SOURCE = ("tensor2tensor, tensor2tensor/data_generators/translate_enzh.py (github.com/tensorflow/"
                      "tensor2tensor at ba2cf587857963515d660e4550bcaa1f5df9952a; added by its PR #461): 'casia2015: "
                      "1,050,000 lines', 'casict2015: 2,036,833', 'datum2015: 1,000,003', 'datum2017: 1,999,968', "
                      "'NEU2017: 2,000,000', counted on a third party's repack of the WMT17 FTP files "
                      "(s3-us-west-2.amazonaws.com/twairball.wmt17.zh-en/cwmt.tgz), not published by CWMT")
COUNTS_SOURCE = f"UN v1.0: {UN_COUNT_SOURCE}; CWMT: {CWMT_COUNTS_SOURCE}"
#: the copies the CWMT counts were made on; a count that differs on another published copy is a warning, not a refusal
COUNTED_COPIES = {FTP_NEU2017.name}
#: sentence pairs per corpus as published (:data:`COUNTS_SOURCE`); casict2011 and News Commentary v12 zh-en have
#: no published count that we know of: they are recorded, not checked
EXPECTED_PAIRS: Dict[str, int] = {"UN-v1.0": 15_886_041, "CWMT casia2015": 1_050_000, "CWMT casict2015": 2_036_833,
                                  "CWMT datum2015": 1_000_003, "CWMT datum2017": 1_999_968, "CWMT neu2017": 2_000_000}
#: a third party's count of News Commentary v12 zh-en, printed beside ours, not checked: ``wc -l`` gives 227,330 for
#: each side in twairball/fairseq-zh-en's "Dataset misaligned.ipynb" (commit 1231cc038941575d427a1871b1ec986e97e85310)
THIRD_PARTY_PAIRS = {"news-commentary-v12": (227_330, "twairball/fairseq-zh-en, 'Dataset misaligned.ipynb' (1231cc0): "
                                                      "wc -l of news-commentary-v12.zh-en.zh and .en")}
#: the journal version (Neurocomputing 2021), §4.1.1: "all of the available parallel data with maximum length
#: limited to 50, consisting of about 20.6 M sentence pairs"
PAPER_TRAIN_PAIRS = 20_600_000
PAPER_SOURCE = "journal version (Neurocomputing 2021), Sec. 4.1.1: 'about 20.6 M sentence pairs'"
#: where each corpus with a published count comes from (named when its count is wrong)
WHERE = {"UN-v1.0": f"{UN_PARTS[0].urls[0]} (or WMT17_SOURCE=hf: {HF_UN.urls[0]})",
         **{f"CWMT {name}": source.urls[0] for name, source in CWMT_SOURCES.items()}}
CORPORA_FILE = "corpora.json"  # written by collect next to the raw text, copied into prepare.json

ARCHIVES = [
    Archive("news-commentary", [NEWS_COMMENTARY_V12],
            lambda n: n.endswith(("news-commentary-v12.zh-en.zh", "news-commentary-v12.zh-en.en"))),
    Archive("un", UN_PARTS, lambda n: n.endswith(("UNv1.0.en-zh.zh", "UNv1.0.en-zh.en")),
            dict.fromkeys(("UNv1.0.en-zh.zh", "UNv1.0.en-zh.en"), EXPECTED_PAIRS["UN-v1.0"]), UN_COUNT_SOURCE),
    Archive("dev", [DEV], lambda n: "newsdev2017-zhen" in n),
    Archive("test", [TEST], lambda n: "newstest2017-zhen" in n),
]
#: the member files of each CWMT zip whose line counts are published (datum2017 is 20 books: only their sum is).
#: neu2017's count is not checked on extraction: it is checked (or only compared) once the copy read is known
_CWMT_MEMBERS = {"casia2015": ("casia2015_ch.txt", "casia2015_en.txt"),
                 "casict2015": ("casict2015_ch.txt", "casict2015_en.txt"),
                 "datum2015": ("datum_ch.txt", "datum_en.txt")}
CWMT_ARCHIVES = [Archive(f"cwmt-{name}", [CWMT_SOURCES[name]], None,
                         {m: EXPECTED_PAIRS[f"CWMT {name}"] for m in _CWMT_MEMBERS.get(name, ())},
                         CWMT_COUNTS_SOURCE if name in _CWMT_MEMBERS else "") for name in CWMT_CORPORA]

CWMT_INSTRUCTIONS = f"""\
The CWMT part of the WMT17 Chinese-English data is downloaded from the Hugging Face Hub
({CWMT_ADDRESSES[0].format('<name>')}, else {CWMT_ADDRESSES[1].format('<name>')};
six zips: {', '.join(CWMT_CORPORA)}).
The FTP server that WMT17 named (via http://nlp.nju.edu.cn/cwmt-wmt/) no longer answers. If you have the
zips or their unpacked folders already, put them into
    {{cwmt_dir}}
(any layout: files named like casia2015_ch.txt / casia2015_en.txt or Book1_cn.txt / Book1_en.txt are found
wherever they are, each attributed to the corpus its folder or file name inside CWMT_DIR (or its zip) names)
or point --cwmt-dir / CWMT_DIR there: they are used instead of the download.
To prepare the data without CWMT (about 9M fewer pairs), run again with --skip-cwmt (make: CWMT=skip)."""


def cwmt_dir(options: Dict[str, object], work_dir: Path) -> Path:
    """Where CWMT text or zips put there by hand are looked for: ``CWMT_DIR``, else ``WORK/manual/cwmt``."""
    return Path(options.get("cwmt_dir") or work_dir / "manual" / "cwmt")


def _manual_cwmt(directory: Path) -> bool:
    """Whether ``directory`` holds CWMT text or zips put there by hand."""
    return directory.is_dir() and (any(_zips(directory)) or bool(_cwmt_pairs(directory)))


def _zips(directory: Path) -> List[Path]:
    return sorted(z for z in directory.glob("*.zip") if not junk_member(z.name))


def configure(recipe: Recipe, options: Dict[str, object]) -> Recipe:
    """The recipe for the user's options: where UN v1.0 comes from (``source``), whether CWMT is downloaded
    (not skipped and not given by hand) and the unit of the length cap (``length_unit``)."""
    source = options.get("source") or "original"
    unit = options.get("length_unit") or "subwords"
    for var, value, choices in (("WMT17_SOURCE (--wmt17-source)", source, SOURCES),
                                ("LENGTH_UNIT (--length-unit)", unit, LENGTH_UNITS)):
        if value not in choices:
            raise SystemExit(f"error: {var}={value!r} is not valid: use one of {', '.join(choices)}")
    archives = [replace(a, parts=[HF_UN]) if a.name == "un" and source == "hf" else a
                for a in recipe.archives if not a.name.startswith("cwmt-")]
    manual_dir = cwmt_dir(options, Path(options.get("work_dir") or "work") / recipe.name)
    if not options.get("skip_cwmt") and not _manual_cwmt(manual_dir):
        archives += CWMT_ARCHIVES
    return replace(recipe, archives=archives, clean_after_bpe=unit == "subwords")


def _cwmt_pairs(root: Path) -> List[Tuple[PurePosixPath, Path, Path]]:
    """[(path inside root without the language suffix, zh file, en file)] for every ``*_en.txt`` with a
    ``*_ch.txt``/``*_cn.txt`` partner under root (packing debris such as ``__MACOSX/`` and ``._*`` left out)."""
    pairs = []
    for en in sorted(root.rglob("*_en.txt")):
        relative = PurePosixPath(en.relative_to(root).as_posix())
        if junk_member(relative.as_posix()):
            continue
        stem = en.name[: -len("_en.txt")]
        zh = next((p for p in (en.with_name(f"{stem}_ch.txt"), en.with_name(f"{stem}_cn.txt")) if p.is_file()), None)
        if zh:
            pairs.append((relative.parent / stem, zh, en))
    return pairs


def _corpus_of(relative: PurePosixPath) -> Optional[str]:
    """The CWMT corpus (casia2015, ...) a file pair belongs to, from its path inside CWMT_DIR or inside its zip only
    (never from the folders above: a WORK_DIR named after a corpus must not decide): the innermost name that is a
    corpus' name or starts with it (``casia2015``, ``CASICT2015_ch``, the folder ``datum2017`` of ``Book1``); NEU's
    files are named ``NEU_cn.txt`` / ``NEU_en.txt``."""
    for part in reversed(relative.parts):
        low = part.lower()
        if low == "neu":
            return "neu2017"
        corpus = next((c for c in CWMT_CORPORA if low.startswith(c)), None)
        if corpus:
            return corpus
    return None


def check(ctx: Context):
    if ctx.options.get("skip_cwmt"):
        ctx.log("  CWMT skipped as asked (--skip-cwmt): training on News Commentary v12 + UN v1.0 only; "
                "prepare.json records it and paper-scale tables refuse the data unless ALLOW_UNVERIFIED_DATA=1")
        return
    directory = cwmt_dir(ctx.options, ctx.work_dir)
    if _manual_cwmt(directory):
        ctx.log(f"  CWMT: using the files in {directory}")
    else:
        ctx.log("  " + CWMT_INSTRUCTIONS.format(cwmt_dir=directory).replace("\n", "\n  "))


def _manual_copy(zip_path: Path, log) -> Optional[str]:
    """Which published copy a zip put into CWMT_DIR is, for a corpus published in several (neu2017): the copy whose
    size and digests it has, else ``not a published copy``; None for the other corpora."""
    source = CWMT_SOURCES.get(_corpus_of(PurePosixPath(zip_path.stem)) or "")
    if source is None or not source.copies:
        return None
    try:
        return check_copies(zip_path, zip_path.name, [c.expected() for c in source.copies], "")[1].copy
    except VerificationError:
        log(f"  warning: {zip_path} is none of the published copies of {source.filename} "
            f"({'; '.join(c.expected().describe() for c in source.copies)})")
        return "not a published copy"


def _cwmt_roots(ctx: Context) -> List[Tuple[Path, PurePosixPath, Optional[str], Optional[str]]]:
    """[(folder to search for CWMT text, the path of that folder inside CWMT_DIR, its corpus where known, the
    published copy it is where a corpus has several)]: the downloaded zips' extraction folders (their corpus is the
    zip's), or the user's folder and its zip files, unpacked under orig/cwmt (their corpora read from the paths inside
    CWMT_DIR: a zip's name, then the paths inside it)."""
    directory = cwmt_dir(ctx.options, ctx.work_dir)
    if not _manual_cwmt(directory):
        return [(ctx.extracted(a.name), PurePosixPath(), a.name[len("cwmt-"):], (ctx.copy_of(a.parts[0]) or {}).get(
            "copy")) for a in ctx.recipe.archives if a.name.startswith("cwmt-")]
    roots = [(directory, PurePosixPath(), None, None)]
    for z in _zips(directory):
        if not (ctx.extracted("cwmt") / z.stem).exists():
            ctx.log(f"  unpacking {z.name}")
            extract([z], ctx.extracted("cwmt") / z.stem, log=ctx.log)
        roots.append((ctx.extracted("cwmt") / z.stem, PurePosixPath(z.stem), None, _manual_copy(z, ctx.log)))
    return roots


def cwmt_files(ctx: Context) -> Tuple[List[Tuple[str, Optional[str], Path, Path]], Dict[str, str]]:
    """([(name, corpus, zh file, en file)] of the CWMT text to read, {corpus: the published copy read} for the
    corpora published in several copies): a downloaded zip's text is its corpus', a file's in CWMT_DIR the corpus
    its path inside CWMT_DIR names (:func:`_corpus_of`; None: no corpus, read as it is)."""
    files, copies = [], {}
    for root, prefix, corpus, copy in _cwmt_roots(ctx):
        for relative, zh, en in _cwmt_pairs(root):
            owner = corpus or _corpus_of(prefix / relative)
            files.append((str(prefix / relative), owner, zh, en))
            if owner and copy:
                copies[owner] = copy
    return files, copies


def check_counts(found: Dict[str, int], allow_unverified: bool, log=print,
                 copies: Optional[Dict[str, str]] = None) -> Dict[str, CorpusCount]:
    """The check of each corpus read against :data:`EXPECTED_PAIRS` (a third party's count printed beside ours,
    :data:`THIRD_PARTY_PAIRS`). ``copies``: {corpus: the published copy read} for corpora published in several; a
    count that differs on a copy the count was not made on (not in :data:`COUNTED_COPIES`) is a warning naming that
    (``differs on another copy``), any other difference a SystemExit unless ``allow_unverified`` (then it is recorded
    as ``mismatch``)."""
    report = {}
    for name, n in found.items():
        expected = EXPECTED_PAIRS.get(name)
        copy = (copies or {}).get(name)
        status = "no published count" if expected is None else "ok" if n == expected else \
            "differs on another copy" if copy and copy not in COUNTED_COPIES else "mismatch"
        third, third_source = THIRD_PARTY_PAIRS.get(name, (None, None))
        report[name] = CorpusCount(n, expected, status, copy, third, third_source)
        if third is not None:
            log(f"  {name}: {n:,} sentence pairs; {third:,} in {third_source} (a third party's count, printed, "
                f"not checked)")
        source = UN_COUNT_SOURCE if name == "UN-v1.0" else CWMT_COUNTS_SOURCE
        if status == "differs on another copy":
            log(f"  warning: {name}: {n:,} sentence pairs, {expected:,} published, but the published count was made "
                f"on another copy of the corpus than the one read ({copy}; published count: {source}): recorded, "
                f"not refused")
        if status != "mismatch":
            continue
        message = (f"{name}: {n:,} sentence pairs, expected {expected:,} (published count: {source}). "
                   f"The file is truncated or not the published corpus")
        if not allow_unverified:
            raise SystemExit(
                f"error: {message}. Delete it (its zip/archive in downloads/, or your copy under CWMT_DIR) and run "
                f"again to download it from {WHERE.get(name, 'its public address')}; or, to prepare it anyway, run "
                f"again with ALLOW_UNVERIFIED=1 (--allow-unverified): prepare.json then records the data as unverified "
                f"and paper-scale tables refuse it unless ALLOW_UNVERIFIED_DATA=1.")
        log(f"  warning: {message}; kept because ALLOW_UNVERIFIED=1 (recorded as unverified)")
    return report


def collect(ctx: Context) -> TrainingData:
    corpora = [("news-commentary-v12", *ctx.parallel("news-commentary", "training/news-commentary-v12.zh-en")),
               ("UN-v1.0", *ctx.parallel("un", "en-zh/UNv1.0.en-zh"))]
    keys = [name for name, _, _ in corpora]  # the corpus whose published count each file counts towards
    cwmt, found, missing, copies = [], [], [], {}
    if not ctx.options.get("skip_cwmt"):
        cwmt, copies = cwmt_files(ctx)
        found = sorted({owner for _, owner, _, _ in cwmt} - {None})
        missing = [c for c in CWMT_CORPORA if c not in found]
        if missing:
            ctx.log(f"  warning: CWMT corpora not found: {', '.join(missing)} (using {', '.join(found) or 'none'});"
                    f" prepare.json records a partial CWMT and paper-scale tables refuse the data unless "
                    f"ALLOW_UNVERIFIED_DATA=1")
        corpora += [(f"CWMT {name}", iter_lines(zh), iter_lines(en)) for name, _, zh, en in cwmt]
        keys += [f"CWMT {owner or name}" for name, owner, _, _ in cwmt]
    per_corpus: Dict[str, int] = {}
    for key, n in zip(keys, write_raw(ctx, "train", corpora)):
        per_corpus[key] = per_corpus.get(key, 0) + n
    report = check_counts(per_corpus, bool(ctx.options.get("allow_unverified")), log=ctx.log,
                          copies={f"CWMT {c}": copy for c, copy in copies.items()})
    for split, archive, member in (("valid", "dev", "dev/newsdev2017-zhen-{}.sgm"),
                                   ("test", "test", "test/newstest2017-zhen-{}.sgm")):
        sides = [sgm_segments(ctx.member(archive, member.format(f))) for f in ("src.zh", "ref.en")]
        write_raw(ctx, split, [(ctx.recipe.name, *sides)])
    digest = hashlib.sha256("".join(f"{name}:{zh.stat().st_size}:{en.stat().st_size}" for name, _, zh, en in cwmt)
                            .encode()).hexdigest()
    record = corpus_record(report, skipped=bool(ctx.options.get("skip_cwmt")), found=found, missing=missing,
                           digest=digest, copies=copies)
    (ctx.raw / CORPORA_FILE).write_text(json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")
    return record


def corpus_record(report: Dict[str, CorpusCount], skipped: bool, found: List[str], missing: List[str],
                  digest: str = "", copies: Optional[Dict[str, str]] = None) -> TrainingData:
    """What prepare.json records about the training corpora: each corpus' count and check, the CWMT status
    (``complete``, ``partial`` or ``skipped``) and the copies read, and ``verified`` (every published count matched
    on the copy it was made on, CWMT complete); ``problems`` says, in words, why not, ``notes`` what differs without
    being a problem."""
    cwmt = CwmtRecord("skipped" if skipped else ("partial" if missing else "complete"), list(found),
                      list(CWMT_CORPORA) if skipped else list(missing), digest,
                      sum(r.pairs for name, r in report.items() if name.startswith("CWMT ")), copies or None)
    problems = [f"{name}: {r.pairs:,} pairs, published {r.expected:,}" for name, r in report.items()
                if r.check == "mismatch"]
    notes = [f"{name}: {r.pairs:,} pairs, published {r.expected:,}, counted on another copy than the one read "
             f"({r.copy})" for name, r in report.items() if r.check == "differs on another copy"]
    if cwmt.status != "complete":
        problems.append(f"CWMT {cwmt.status} (missing: {', '.join(cwmt.missing)})")
    return TrainingData(report, cwmt, COUNTS_SOURCE, not problems, problems, PAPER_TRAIN_PAIRS, PAPER_SOURCE,
                        notes=notes or None)


def collect_key(ctx: Context):
    """What the collect step depends on beyond the archives: which CWMT files are used, and whether mismatched
    counts are accepted."""
    allow = bool(ctx.options.get("allow_unverified"))
    if ctx.options.get("skip_cwmt"):
        return {"cwmt": "skipped", "allow_unverified": allow}
    directory = cwmt_dir(ctx.options, ctx.work_dir)
    files = sorted(str(p.relative_to(directory)) + f":{p.stat().st_size}"
                   for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else []
    return {"cwmt_files": files, "allow_unverified": allow}


RECIPE = Recipe(
    **WMT_SETTINGS,
    name="wmt17_zh_en", src="zh", tgt="en",
    description="WMT17 zh→en (News Commentary v12, UN v1.0, CWMT; newsdev2017/newstest2017)",
    archives=ARCHIVES + CWMT_ARCHIVES,
    joint_bpe=False, joined_dictionary=False,  # Chinese and English: separate BPE and dictionaries
    clean_max=50, corpora_file=CORPORA_FILE, paper_train_pairs=PAPER_TRAIN_PAIRS,
    collect=collect, check=check, collect_key=collect_key, configure=configure,
    paper_train_source="journal §4.1.1 and NAACL 2019 §5.2.1: 'about 20.6M sentence pairs' (length <= 50)",
    # only V_zh + 2 V_en is fixed by the papers' parameter counts: Transformer-Base 108M and Big 304M (NAACL 2019
    # Table 4, journal Table 5) give 124.7k embedding rows beyond the layers; English is taken as 32k merges
    # plus its alphabet (33.0k), Chinese as the rest (58.7k: its character inventory is large)
    assumed_vocab={"zh": 58688, "en": 33000},
)
