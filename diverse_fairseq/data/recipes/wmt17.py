"""WMT17 Chinese→English: News Commentary v12 + UN Parallel Corpus v1.0 + CWMT (about 25M pairs).

newsdev2017 is valid and newstest2017 test. Chinese is segmented into words (jieba, or characters
with ``ZH_SEG=char``; sentencepiece needs neither), both sides are Moses-tokenized, BPE with 32k merges
is learned per language, and training pairs longer than 50 tokens are dropped after BPE (the journal
paper: "maximum length limited to 50", about 20.6M pairs). Dictionaries are separate.

The CWMT corpora are behind a licence agreement and must be downloaded by hand; see
:data:`CWMT_INSTRUCTIONS`. ``--skip-cwmt`` (``CWMT=skip``) proceeds without them.
"""

import hashlib
from pathlib import Path

from ..archive import extract
from ..download import Source, published_md5
from ..text import sgm_segments
from .base import WMT_SETTINGS, Archive, Context, Recipe, concat_parallel, find_member, write_parallel

DEV_URL = "https://data.statmt.org/wmt17/translation-task/dev.tgz"
TEST_URL = "https://data.statmt.org/wmt17/translation-task/test.tgz"
# size and sha256: TensorFlow Datasets' registry of the same URL, tensorflow_datasets/url_checksums/wmt17_translate.txt
# (github.com/tensorflow/datasets, commit 333639b3)
NEWS_COMMENTARY = Source("training-parallel-nc-v12.tgz",
                         ("http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",),
                         size=168591139, sha256="2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2",
                         checksum_source="TensorFlow Datasets url_checksums/wmt17_translate.txt")
UN_BASE = "https://stuncorpusprod.blob.core.windows.net/corpusfiles/"
UN_PARTS = [Source(f"UNv1.0.en-zh.tar.gz.{i:02d}", (UN_BASE + f"UNv1.0.en-zh.tar.gz.{i:02d}",
                                                   f"https://conferences.unite.un.org/UNCorpus/en/DownloadFile?filename=UNv1.0.en-zh.tar.gz.{i:02d}"))
            for i in range(2)]
SACREBLEU = "sacrebleu's test-set registry"
DEV = Source("dev.tgz", (DEV_URL,), md5=published_md5(DEV_URL), checksum_source=SACREBLEU)
TEST = Source("test.tgz", (TEST_URL,), md5=published_md5(TEST_URL), checksum_source=SACREBLEU)
# UN v1.0 en-zh: no size or checksum of the two split parts is published; the line count of its members is
# (tensor2tensor's data_generators/translate_enzh.py: "UN parallel corpus. 15,886,041 lines")
UN_LINES = 15_886_041
UN_COUNTS_SOURCE = "tensor2tensor data_generators/translate_enzh.py ('UN parallel corpus. 15,886,041 lines')"

ARCHIVES = [
    Archive("news-commentary", [NEWS_COMMENTARY], lambda n: n.endswith(("news-commentary-v12.zh-en.zh",
                                                                        "news-commentary-v12.zh-en.en"))),
    Archive("un", UN_PARTS, lambda n: n.endswith(("UNv1.0.en-zh.zh", "UNv1.0.en-zh.en")),
            expected_lines={"UNv1.0.en-zh.zh": UN_LINES, "UNv1.0.en-zh.en": UN_LINES}, counts_source=UN_COUNTS_SOURCE),
    Archive("dev", [DEV], lambda n: "newsdev2017-zhen" in n),
    Archive("test", [TEST], lambda n: "newstest2017-zhen" in n),
]

CWMT_CORPORA = ("casia2015", "casict2011", "casict2015", "datum2015", "datum2017", "neu2017")
CWMT_INSTRUCTIONS = """\
The CWMT part of the WMT17 Chinese-English data needs a manual download (licence agreement):
  1. Go to http://nlp.nju.edu.cn/cwmt-wmt/ (linked from https://www.statmt.org/wmt17/translation-task.html),
     register and accept the licence.
  2. Download the six parallel corpora: {corpora}
     (casia2015.zip, casict2011.zip, casict2015.zip, datum2015.zip, datum2017.zip, neu2017.zip).
  3. Put the zip files, or the folders unpacked from them, into
        {cwmt_dir}
     (any layout: files named like casia2015_ch.txt / casia2015_en.txt or Book1_cn.txt / Book1_en.txt
     are found wherever they are), or point --cwmt-dir / CWMT_DIR there.
  4. Run the command again.
To prepare the data without CWMT (about 9M fewer pairs), run again with --skip-cwmt (make: CWMT=skip)."""


def cwmt_dir(ctx: Context) -> Path:
    return Path(ctx.options.get("cwmt_dir") or (ctx.work_dir / "manual" / "cwmt"))


def _cwmt_pairs(root: Path):
    """[(name, zh file, en file)] for every ``*_en.txt`` with a ``*_ch.txt``/``*_cn.txt`` partner under root."""
    pairs = []
    for en in sorted(root.rglob("*_en.txt")):
        stem = en.name[: -len("_en.txt")]
        for zh_name in (f"{stem}_ch.txt", f"{stem}_cn.txt"):
            zh = en.with_name(zh_name)
            if zh.is_file():
                pairs.append((str(en.relative_to(root).parent / stem), zh, en))
                break
    return pairs


def check(ctx: Context):
    if ctx.options.get("skip_cwmt"):
        ctx.log("  CWMT skipped as asked (--skip-cwmt): training on News Commentary v12 + UN v1.0 only")
        return
    directory = cwmt_dir(ctx)
    has_zip = directory.is_dir() and any(directory.glob("*.zip"))
    if not directory.is_dir() or not (has_zip or _cwmt_pairs(directory)):
        raise SystemExit(f"error: CWMT data not found in {directory}.\n" +
                         CWMT_INSTRUCTIONS.format(corpora=", ".join(CWMT_CORPORA), cwmt_dir=directory))


def _cwmt_roots(ctx: Context):
    """Folders to search for CWMT text: the user's folder, and its zip files unpacked under orig/cwmt."""
    directory = cwmt_dir(ctx)
    roots = [directory]
    zips = sorted(directory.glob("*.zip"))
    if zips:
        target = ctx.orig / "cwmt"
        for z in zips:
            dest = target / z.stem
            if not dest.exists():
                ctx.log(f"  unpacking {z.name}")
                extract([z], dest, log=ctx.log)
        roots.append(target)
    return roots


def collect(ctx: Context):
    root = ctx.extracted("news-commentary")
    corpora = [("news-commentary-v12", find_member(root, "training/news-commentary-v12.zh-en.zh"),
                find_member(root, "training/news-commentary-v12.zh-en.en"))]
    root = ctx.extracted("un")
    corpora.append(("UN-v1.0", find_member(root, "en-zh/UNv1.0.en-zh.zh"), find_member(root, "en-zh/UNv1.0.en-zh.en")))
    cwmt = []
    if not ctx.options.get("skip_cwmt"):
        cwmt = [pair for root in _cwmt_roots(ctx) for pair in _cwmt_pairs(root)]
        found = {c for c in CWMT_CORPORA if any(c in name or c in str(zh) for name, zh, _ in cwmt)}
        missing = [c for c in CWMT_CORPORA if c not in found]
        if missing:
            ctx.log(f"  warning: CWMT corpora not found: {', '.join(missing)} (using {', '.join(sorted(found))})")
        corpora += [(f"CWMT {name}", zh, en) for name, zh, en in cwmt]
    concat_parallel(ctx, "train", corpora, "zh", "en")
    root = ctx.extracted("dev")
    write_parallel(ctx, "valid", {"zh": sgm_segments(find_member(root, "dev/newsdev2017-zhen-src.zh.sgm")),
                                  "en": sgm_segments(find_member(root, "dev/newsdev2017-zhen-ref.en.sgm"))})
    root = ctx.extracted("test")
    write_parallel(ctx, "test", {"zh": sgm_segments(find_member(root, "test/newstest2017-zhen-src.zh.sgm")),
                                 "en": sgm_segments(find_member(root, "test/newstest2017-zhen-ref.en.sgm"))})
    digest = hashlib.sha256()
    for name, zh, en in cwmt:
        digest.update(f"{name}:{zh.stat().st_size}:{en.stat().st_size}".encode())
    return {"cwmt": [name for name, _, _ in cwmt], "cwmt_digest": digest.hexdigest()}


def collect_key(ctx: Context):
    """What the collect step depends on beyond the archives: which CWMT files are used."""
    if ctx.options.get("skip_cwmt"):
        return {"cwmt": "skipped"}
    directory = cwmt_dir(ctx)
    files = sorted(str(p.relative_to(directory)) + f":{p.stat().st_size}"
                   for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else []
    return {"cwmt_files": files}


RECIPE = Recipe(
    **WMT_SETTINGS,
    name="wmt17_zh_en", src="zh", tgt="en",
    description="WMT17 zh→en (News Commentary v12, UN v1.0, CWMT; newsdev2017/newstest2017)",
    archives=ARCHIVES,
    joint_bpe=False, joined_dictionary=False,  # Chinese and English: separate BPE and dictionaries
    clean_max=50,
    collect=collect,
    check=check,
    collect_key=collect_key,
    paper_train_pairs=20_600_000,
    paper_train_source="journal §4.1.1 and NAACL 2019 §5.2.1: 'about 20.6M sentence pairs' (length <= 50)",
    notes="download 1.5 GB + CWMT 0.7 GB, ~40 GB of disk, preparation several hours with WORKERS=16",
    # only V_zh + 2 V_en is fixed by the papers' parameter counts: Transformer-Base 108M and Big 304M (NAACL 2019
    # Table 4, journal Table 5) give 124.7k embedding rows beyond the layers; English is taken as 32k merges
    # plus its alphabet (33.0k), Chinese as the rest (58.7k: its character inventory is large)
    assumed_vocab={"zh": 58688, "en": 33000},
)
