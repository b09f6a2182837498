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
from pathlib import Path
from typing import Dict, List, Optional

from ..archive import extract
from ..download import Source
from ..text import iter_lines, sgm_segments
from .base import NEWS_COMMENTARY_V12, WMT17_DEV, WMT_SETTINGS, Archive, Context, Recipe, sacrebleu_source, write_raw

UN_HINT = ("The UN's own addresses do not always answer: WMT17_SOURCE=hf (--wmt17-source hf) downloads the same "
           "corpus from the Hugging Face Hub instead.")
UN_PARTS = [Source(f"UNv1.0.en-zh.tar.gz.{i:02d}", tuple(base + f"UNv1.0.en-zh.tar.gz.{i:02d}" for base in (
    "https://stuncorpusprod.blob.core.windows.net/corpusfiles/",
    "https://conferences.unite.un.org/UNCorpus/en/DownloadFile?filename=")), extra={"hint": UN_HINT}) for i in range(2)]
#: the Hugging Face Hub copies (``wmt_utils.py`` of huggingface/datasets' wmt17/wmt18/wmt19 scripts)
HF_BASE = "https://huggingface.co/datasets/wmt/"
HF_UN = Source("UNv1.0.en-zh.zip", (HF_BASE + "uncorpus/resolve/main-zip/UNv1.0.en-zh.zip",))
DEV = WMT17_DEV
TEST = sacrebleu_source("test.tgz", "https://data.statmt.org/wmt17/translation-task/test.tgz")

CWMT_CORPORA = ("casia2015", "casict2011", "casict2015", "datum2015", "datum2017", "neu2017")
CWMT_SOURCES = {name: Source(f"{name}.zip", (f"{HF_BASE}wmt18/resolve/main/cwmt-wmt/{name}.zip",),
                             extra={"hint": "If you have the CWMT zips or folders, put them into "
                                            "WORK_DIR/wmt17_zh_en/manual/cwmt/ (or CWMT_DIR=dir): they are used "
                                            "instead; CWMT=skip prepares the data without CWMT."})
                for name in CWMT_CORPORA}
SOURCES = ("original", "hf")  # WMT17_SOURCE: where UN v1.0 comes from
LENGTH_UNITS = ("subwords", "words")  # LENGTH_UNIT: what the 50-token cap counts

#: where the published counts come from
COUNTS_SOURCE = ("tensor2tensor, tensor2tensor/data_generators/translate_enzh.py (github.com/tensorflow/tensor2tensor "
                 "at ba2cf587857963515d660e4550bcaa1f5df9952a): 'UN parallel corpus. 15,886,041 lines', 'casia2015: "
                 "1,050,000 lines', 'casict2015: 2,036,833', 'datum2015: 1,000,003', 'datum2017: 1,999,968', "
                 "'NEU2017: 2,000,000'")
#: sentence pairs per corpus as published (:data:`COUNTS_SOURCE`); casict2011 and News Commentary v12 zh-en have
#: no published count that we know of: they are recorded, not checked
EXPECTED_PAIRS: Dict[str, int] = {"UN-v1.0": 15_886_041, "CWMT casia2015": 1_050_000, "CWMT casict2015": 2_036_833,
                                  "CWMT datum2015": 1_000_003, "CWMT datum2017": 1_999_968, "CWMT neu2017": 2_000_000}
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
            dict.fromkeys(("UNv1.0.en-zh.zh", "UNv1.0.en-zh.en"), EXPECTED_PAIRS["UN-v1.0"]), COUNTS_SOURCE),
    Archive("dev", [DEV], lambda n: "newsdev2017-zhen" in n),
    Archive("test", [TEST], lambda n: "newstest2017-zhen" in n),
]
#: the member files of each CWMT zip whose line counts are published (datum2017 is 20 books: only their sum is)
_CWMT_MEMBERS = {"casia2015": ("casia2015_ch.txt", "casia2015_en.txt"),
                 "casict2015": ("casict2015_ch.txt", "casict2015_en.txt"),
                 "datum2015": ("datum_ch.txt", "datum_en.txt"), "neu2017": ("NEU_cn.txt", "NEU_en.txt")}
CWMT_ARCHIVES = [Archive(f"cwmt-{name}", [CWMT_SOURCES[name]], None,
                         {m: EXPECTED_PAIRS[f"CWMT {name}"] for m in _CWMT_MEMBERS.get(name, ())},
                         COUNTS_SOURCE if name in _CWMT_MEMBERS else "") for name in CWMT_CORPORA]

CWMT_INSTRUCTIONS = f"""\
The CWMT part of the WMT17 Chinese-English data is downloaded from the Hugging Face Hub
({HF_BASE}wmt18/resolve/main/cwmt-wmt/<name>.zip, six zips: {', '.join(CWMT_CORPORA)}).
The FTP server that WMT17 named (via http://nlp.nju.edu.cn/cwmt-wmt/) no longer answers. If you have the
zips or their unpacked folders already, put them into
    {{cwmt_dir}}
(any layout: files named like casia2015_ch.txt / casia2015_en.txt or Book1_cn.txt / Book1_en.txt are found
wherever they are) or point --cwmt-dir / CWMT_DIR there: they are used instead of the download.
To prepare the data without CWMT (about 9M fewer pairs), run again with --skip-cwmt (make: CWMT=skip)."""


def cwmt_dir(options: Dict[str, object], work_dir: Path) -> Path:
    """Where CWMT text or zips put there by hand are looked for: ``CWMT_DIR``, else ``WORK/manual/cwmt``."""
    return Path(options.get("cwmt_dir") or work_dir / "manual" / "cwmt")


def _manual_cwmt(directory: Path) -> bool:
    """Whether ``directory`` holds CWMT text or zips put there by hand."""
    return directory.is_dir() and (any(directory.glob("*.zip")) or bool(_cwmt_pairs(directory)))


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


def _cwmt_pairs(root: Path):
    """[(name, zh file, en file)] for every ``*_en.txt`` with a ``*_ch.txt``/``*_cn.txt`` partner under root."""
    pairs = []
    for en in sorted(root.rglob("*_en.txt")):
        stem = en.name[: -len("_en.txt")]
        zh = next((p for p in (en.with_name(f"{stem}_ch.txt"), en.with_name(f"{stem}_cn.txt")) if p.is_file()), None)
        if zh:
            pairs.append((str(en.relative_to(root).parent / stem), zh, en))
    return pairs


def _corpus_of(name: str, zh: Path) -> Optional[str]:
    """The CWMT corpus (casia2015, ...) a file pair belongs to, from its folder or file name."""
    text = f"{name}/{zh}".lower()
    return next((corpus for corpus in CWMT_CORPORA if corpus in text), "neu2017" if "neu" in text else None)


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


def _cwmt_roots(ctx: Context):
    """Folders to search for CWMT text: the user's folder (its zip files unpacked under orig/cwmt), or the
    downloaded zips' extraction folders."""
    directory = cwmt_dir(ctx.options, ctx.work_dir)
    if not _manual_cwmt(directory):
        return [ctx.extracted(a.name) for a in ctx.recipe.archives if a.name.startswith("cwmt-")]
    zips = sorted(directory.glob("*.zip"))
    for z in zips:
        if not (ctx.extracted("cwmt") / z.stem).exists():
            ctx.log(f"  unpacking {z.name}")
            extract([z], ctx.extracted("cwmt") / z.stem, log=ctx.log)
    return [directory] + ([ctx.extracted("cwmt")] if zips else [])


def check_counts(found: Dict[str, int], allow_unverified: bool, log=print) -> Dict[str, Dict[str, object]]:
    """``{corpus: {"pairs", "expected", "check"}}`` for the corpora read; SystemExit at the first count that
    differs from :data:`EXPECTED_PAIRS` unless ``allow_unverified`` (then it is recorded as ``mismatch``)."""
    report = {}
    for name, n in found.items():
        expected = EXPECTED_PAIRS.get(name)
        status = "no published count" if expected is None else ("ok" if n == expected else "mismatch")
        report[name] = {"pairs": n, "expected": expected, "check": status}
        if status != "mismatch":
            continue
        message = (f"{name}: {n:,} sentence pairs, expected {expected:,} (published count: {COUNTS_SOURCE}). "
                   f"The file is truncated or not the published corpus")
        if not allow_unverified:
            raise SystemExit(
                f"error: {message}. Delete it (its zip/archive in downloads/, or your copy under CWMT_DIR) and run "
                f"again to download it from {WHERE.get(name, 'its public address')}; or, to prepare it anyway, run "
                f"again with ALLOW_UNVERIFIED=1 (--allow-unverified): prepare.json then records the data as unverified "
                f"and paper-scale tables refuse it unless ALLOW_UNVERIFIED_DATA=1.")
        log(f"  warning: {message}; kept because ALLOW_UNVERIFIED=1 (recorded as unverified)")
    return report


def collect(ctx: Context):
    corpora = [("news-commentary-v12", *ctx.parallel("news-commentary", "training/news-commentary-v12.zh-en")),
               ("UN-v1.0", *ctx.parallel("un", "en-zh/UNv1.0.en-zh"))]
    keys = [name for name, _, _ in corpora]  # the corpus whose published count each file counts towards
    cwmt, found, missing = [], [], []
    if not ctx.options.get("skip_cwmt"):
        cwmt = [pair for root in _cwmt_roots(ctx) for pair in _cwmt_pairs(root)]
        found = sorted({_corpus_of(name, zh) for name, zh, _ in cwmt} - {None})
        missing = [c for c in CWMT_CORPORA if c not in found]
        if missing:
            ctx.log(f"  warning: CWMT corpora not found: {', '.join(missing)} (using {', '.join(found) or 'none'});"
                    f" prepare.json records a partial CWMT and paper-scale tables refuse the data unless "
                    f"ALLOW_UNVERIFIED_DATA=1")
        corpora += [(f"CWMT {name}", iter_lines(zh), iter_lines(en)) for name, zh, en in cwmt]
        keys += [f"CWMT {_corpus_of(name, zh) or name}" for name, zh, _ in cwmt]
    per_corpus: Dict[str, int] = {}
    for key, n in zip(keys, write_raw(ctx, "train", corpora)):
        per_corpus[key] = per_corpus.get(key, 0) + n
    report = check_counts(per_corpus, bool(ctx.options.get("allow_unverified")), log=ctx.log)
    for split, archive, member in (("valid", "dev", "dev/newsdev2017-zhen-{}.sgm"),
                                   ("test", "test", "test/newstest2017-zhen-{}.sgm")):
        sides = [sgm_segments(ctx.member(archive, member.format(f))) for f in ("src.zh", "ref.en")]
        write_raw(ctx, split, [(ctx.recipe.name, *sides)])
    digest = hashlib.sha256("".join(f"{name}:{zh.stat().st_size}:{en.stat().st_size}" for name, zh, en in cwmt)
                            .encode()).hexdigest()
    record = corpus_record(report, skipped=bool(ctx.options.get("skip_cwmt")), found=found, missing=missing,
                           digest=digest)
    (ctx.raw / CORPORA_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def corpus_record(report: Dict[str, Dict[str, object]], skipped: bool, found: List[str], missing: List[str],
                  digest: str = "") -> Dict[str, object]:
    """What prepare.json records about the training corpora: each corpus' count and check, the CWMT status
    (``complete``, ``partial`` or ``skipped``), and ``verified`` (every published count matched and CWMT complete);
    ``problems`` says, in words, why not."""
    cwmt = {"status": "skipped" if skipped else ("partial" if missing else "complete"), "corpora": found,
            "missing": list(CWMT_CORPORA) if skipped else missing, "digest": digest,
            "pairs": sum(r["pairs"] for name, r in report.items() if name.startswith("CWMT "))}
    problems = [f"{name}: {r['pairs']:,} pairs, published {r['expected']:,}" for name, r in report.items()
                if r["check"] == "mismatch"]
    if cwmt["status"] != "complete":
        problems.append(f"CWMT {cwmt['status']} (missing: {', '.join(cwmt['missing'])})")
    return {"corpora": report, "cwmt": cwmt, "counts_source": COUNTS_SOURCE, "verified": not problems,
            "problems": problems, "paper_train_pairs": PAPER_TRAIN_PAIRS, "paper_source": PAPER_SOURCE}


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
