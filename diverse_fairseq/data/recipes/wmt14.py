"""WMT14 English→German: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs).

As fairseq's ``prepare-wmt14en2de.sh --icml17`` (the WMT14-only data): normalise punctuation and remove
non-printing characters (training text), Moses-tokenize with aggressive hyphen splitting, joint BPE with 32k merges,
clean after BPE (ratio 1.5, 1–250 tokens). Unlike that script (which cuts valid from the training data), valid is
newstest2013 and test newstest2014, as in the papers.

Two binarizations of the same text: ``wmt14_en_de`` has one dictionary per language, as the THUMT recipe of the
EMNLP 2018 / NAACL 2019 / journal papers (joint BPE, separate vocabularies, untied embeddings);
``wmt14_en_de_joined`` has fairseq's joined dictionary (for ``--share-all-embeddings``: the EMNLP 2020 authors'
``wmt14_en_de_joined_dict``). The variant shares the first one's downloads, tokenization and BPE (``work_name``).
"""

import dataclasses

from ..download import Source, published_md5
from ..lines import iter_lines
from ..text import sgm_segments
from .base import WMT_SETTINGS, Archive, Context, Recipe, concat_parallel, find_member, write_parallel

DEV_URL = "https://data.statmt.org/wmt17/translation-task/dev.tgz"
TEST_URL = "https://statmt.org/wmt14/test-full.tgz"
# sizes and sha256 of the training archives: TensorFlow Datasets' registry of the same URLs,
# tensorflow_datasets/url_checksums/wmt14_translate.txt (github.com/tensorflow/datasets, commit 333639b3)
TFDS_WMT14 = "TensorFlow Datasets url_checksums/wmt14_translate.txt"
EUROPARL = Source("training-parallel-europarl-v7.tgz", ("http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",),
                  size=657632379, sha256="0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7",
                  checksum_source=TFDS_WMT14)
COMMONCRAWL = Source("training-parallel-commoncrawl.tgz", ("http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",),
                     size=918311367, sha256="c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5",
                     checksum_source=TFDS_WMT14)
NEWS_COMMENTARY = Source("training-parallel-nc-v9.tgz", ("http://statmt.org/wmt14/training-parallel-nc-v9.tgz",),
                         size=80418416, sha256="cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485",
                         checksum_source=TFDS_WMT14)
# WMT17's dev.tgz holds newstest2008-2016 and newsdev2017; one file serves WMT14 and WMT17 (md5 published by sacrebleu)
SACREBLEU = "sacrebleu's test-set registry"
DEV = Source("dev.tgz", (DEV_URL,), md5=published_md5(DEV_URL), checksum_source=SACREBLEU)
TEST = Source("test-full.tgz", (TEST_URL,), md5=published_md5(TEST_URL), checksum_source=SACREBLEU)


def _endswith(*suffixes):
    return lambda name: name.endswith(suffixes)


ARCHIVES = [
    Archive("europarl", [EUROPARL], _endswith("europarl-v7.de-en.de", "europarl-v7.de-en.en")),
    Archive("commoncrawl", [COMMONCRAWL], _endswith("commoncrawl.de-en.de", "commoncrawl.de-en.en")),
    Archive("news-commentary", [NEWS_COMMENTARY],
            _endswith("news-commentary-v9.de-en.de", "news-commentary-v9.de-en.en")),
    Archive("dev", [DEV], lambda n: "newstest2013" in n),
    Archive("test", [TEST], _endswith("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm")),
]


def newstest2013(ctx: Context):
    """newstest2013 en/de from dev.tgz: the SGM files when present, else the plain-text ones."""
    root = ctx.extracted("dev")
    try:
        return {"en": sgm_segments(find_member(root, "dev/newstest2013-src.en.sgm")),
                "de": sgm_segments(find_member(root, "dev/newstest2013-ref.de.sgm"))}
    except FileNotFoundError:
        return {lang: list(iter_lines(find_member(root, f"dev/newstest2013.{lang}"))) for lang in ("en", "de")}


def collect(ctx: Context):
    corpora = []
    for name, archive, stem in (("europarl-v7", "europarl", "training/europarl-v7.de-en"),
                                ("commoncrawl", "commoncrawl", "commoncrawl.de-en"),
                                ("news-commentary-v9", "news-commentary", "training/news-commentary-v9.de-en")):
        root = ctx.extracted(archive)
        corpora.append((name, find_member(root, f"{stem}.en"), find_member(root, f"{stem}.de")))
    concat_parallel(ctx, "train", corpora, "en", "de")
    write_parallel(ctx, "valid", newstest2013(ctx))
    root = ctx.extracted("test")
    write_parallel(ctx, "test", {"en": sgm_segments(find_member(root, "test-full/newstest2014-deen-src.en.sgm")),
                                 "de": sgm_segments(find_member(root, "test-full/newstest2014-deen-ref.de.sgm"))})
    return {}


RECIPE = Recipe(
    **WMT_SETTINGS,
    name="wmt14_en_de", src="en", tgt="de",
    description="WMT14 en→de (Europarl v7, Common Crawl, News Commentary v9; newstest2013/2014)",
    archives=ARCHIVES,
    joint_bpe=True, joined_dictionary=False,  # one BPE for English and German, a dictionary per language
    aggressive_dash=True,
    clean_ratio=1.5,
    collect=collect,
    paper_train_pairs=4_500_000,
    paper_train_source="EMNLP 2020 Appendix B.2.3: 'about 4.5 million training sentence pairs' "
                       "(NAACL 2019 §5.2.1 and the journal §4.1.1: 4.6M)",
    notes="download 1.6 GB, ~15 GB of disk, preparation 1-3 hours with WORKERS=8",
    # only V_en + 2 V_de (source, target and output embeddings) is fixed by the papers' parameter counts:
    # Transformer-Base 88.0M and Big 264M (NAACL 2019 Table 3, journal Tables 5-6) give 85.6k embedding rows
    # beyond the layers; split evenly (joint 32k merges give each language a similar vocabulary)
    assumed_vocab={"en": 28536, "de": 28544},
)
JOINED = dataclasses.replace(
    RECIPE, name="wmt14_en_de_joined", joined_dictionary=True, work_name=RECIPE.name, assumed_vocab={},
    description=RECIPE.description + ", joined dictionary",
    notes="binarizes the text of wmt14_en_de (prepared first if needed) with one joined dictionary")
