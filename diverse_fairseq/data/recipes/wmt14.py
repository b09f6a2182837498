"""WMT14 English→German: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs).

As fairseq's ``prepare-wmt14en2de.sh --icml17`` (the WMT14-only data): normalise punctuation and remove non-printing
characters (training text), Moses-tokenize with aggressive hyphen splitting, joint BPE with 32k merges, clean after
BPE (ratio 1.5, 1–250 tokens); but valid is newstest2013 and test newstest2014, as in the papers (that script cuts
valid from the training data). ``wmt14_en_de`` has one dictionary per language, as the THUMT recipe of the EMNLP
2018 / NAACL 2019 / journal papers (joint BPE, separate vocabularies, untied embeddings).

``wmt14_en_de_joined`` (:data:`MACARON`) is the EMNLP 2020 authors' data: their README (bangann/Repulsive-Attention,
commit f480b5c, ``RepulsiveTransformer/README.md`` line 18) points to macaron-net's
``translation/macaron-scripts/data-preprocessing/prepare-wmt14en2de.sh`` (zhuohan123/macaron-net, commit 3a84e7a),
which differs from the THUMT recipe above in four places (line numbers of that script):

- News Commentary **v12** (``training-parallel-nc-v12.tgz`` from WMT17, lines 21, 35), not v9;
- **32,764** joint BPE merges (``BPE_TOKENS=32764``, line 16; ``learn_bpe.py -s``, line 123), not 32,000;
- the length filter runs **before BPE**, on the Moses-tokenized words: ``clean-corpus-n.perl ... 1 80`` with its
  default ratio 9 (line 103), not 1-250 subwords with ratio 1.5 after BPE;
- valid newstest2013 is read from the plain-text ``dev/newstest2013.{en,de}`` and normalised like the training text
  (lines 107-113), the test set (newstest2014 "full") gets only the ’ -> ' replacement (lines 95-99).

Both tokenize with ``-a`` (line 84), and the authors binarize with ``--joined-dictionary`` (the data-preprocessing
README, lines 40-44). The variant keeps its own work folder (its text differs) but reads and fills ``wmt14_en_de``'s
``downloads/`` (``downloads_name``): only News Commentary v12 is an extra download.
"""

import contextlib
import dataclasses
import functools

from ..download import Source
from ..text import sgm_segments
from .base import NEWS_COMMENTARY_V12, WMT17_DEV, WMT_SETTINGS, Archive, Context, Recipe, sacrebleu_source, write_raw

# sizes and sha256 of the training archives: TensorFlow Datasets' registry (github.com/tensorflow/datasets 333639b3)
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
TEST = sacrebleu_source("test-full.tgz", "https://statmt.org/wmt14/test-full.tgz")

ARCHIVES = [
    Archive("europarl", [EUROPARL], lambda n: n.endswith(("europarl-v7.de-en.de", "europarl-v7.de-en.en"))),
    Archive("commoncrawl", [COMMONCRAWL], lambda n: n.endswith(("commoncrawl.de-en.de", "commoncrawl.de-en.en"))),
    Archive("news-commentary", [NEWS_COMMENTARY],
            lambda n: n.endswith(("news-commentary-v9.de-en.de", "news-commentary-v9.de-en.en"))),
    Archive("dev", [WMT17_DEV], lambda n: "newstest2013" in n),
    Archive("test", [TEST], lambda n: n.endswith(("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"))),
]


def collect_corpora(ctx: Context, news_commentary, sgm_valid: bool):
    """Write raw train (Europarl v7, Common Crawl, then ``news_commentary``: (name, archive, member stem)), valid
    (newstest2013 from dev.tgz: with ``sgm_valid`` its SGM files where present, else its plain-text ones) and test
    (newstest2014 from the SGM files)."""
    corpora = [("europarl-v7", "europarl", "training/europarl-v7.de-en"),
               ("commoncrawl", "commoncrawl", "commoncrawl.de-en"), news_commentary]
    write_raw(ctx, "train", [(name, *ctx.parallel(archive, stem)) for name, archive, stem in corpora])
    valid = None
    if sgm_valid:
        with contextlib.suppress(FileNotFoundError):
            valid = [sgm_segments(ctx.member("dev", f"dev/newstest2013-{f}.sgm")) for f in ("src.en", "ref.de")]
    write_raw(ctx, "valid", [(ctx.recipe.name, *(valid or ctx.parallel("dev", "dev/newstest2013")))])
    test = [sgm_segments(ctx.member("test", f"test-full/newstest2014-deen-{f}.sgm")) for f in ("src.en", "ref.de")]
    write_raw(ctx, "test", [(ctx.recipe.name, *test)])
    return {}


RECIPE = Recipe(
    **WMT_SETTINGS,
    name="wmt14_en_de", src="en", tgt="de",
    description="WMT14 en→de (Europarl v7, Common Crawl, News Commentary v9; newstest2013/2014)",
    archives=ARCHIVES,
    joint_bpe=True, joined_dictionary=False,  # one BPE for English and German, a dictionary per language
    aggressive_dash=True, clean_ratio=1.5,
    collect=functools.partial(collect_corpora, news_commentary=(
        "news-commentary-v9", "news-commentary", "training/news-commentary-v9.de-en"), sgm_valid=True),
    paper_train_pairs=4_500_000,
    paper_train_source="EMNLP 2020 Appendix B.2.3: 'about 4.5 million training sentence pairs' "
                       "(NAACL 2019 §5.2.1 and the journal §4.1.1: 4.6M)",
    # only V_en + 2 V_de (source, target and output embeddings) is fixed by the papers' parameter counts:
    # Transformer-Base 88.0M and Big 264M (NAACL 2019 Table 3, journal Tables 5-6) give 85.6k embedding rows
    # beyond the layers; split evenly (joint 32k merges give each language a similar vocabulary)
    assumed_vocab={"en": 28536, "de": 28544},
)
MACARON = dataclasses.replace(
    RECIPE, name="wmt14_en_de_joined",
    archives=[*ARCHIVES[:2], Archive("news-commentary-v12", [NEWS_COMMENTARY_V12], lambda n: n.endswith(
        ("news-commentary-v12.de-en.de", "news-commentary-v12.de-en.en"))), *ARCHIVES[3:]],
    # macaron-net's corpora (Europarl v7, Common Crawl, News Commentary v12, in that order: its ``CORPORA``), valid
    # from the plain-text newstest2013 files (its ``dev=dev/newstest2013``), test newstest2014 from the SGM files
    collect=functools.partial(collect_corpora, news_commentary=(
        "news-commentary-v12", "news-commentary-v12", "training/news-commentary-v12.de-en"), sgm_valid=False),
    description="WMT14 en→de as macaron-net's scripts (Europarl v7, Common Crawl, News Commentary v12; "
                "newstest2013/2014), joined dictionary",
    bpe_size=32764, joined_dictionary=True,
    normalize_splits=("train", "valid"), apostrophe_splits=("test",),
    clean_after_bpe=False, clean_min=1, clean_max=80, clean_ratio=9.0,  # clean-corpus-n.perl's default ratio
    downloads_name=RECIPE.name, assumed_vocab={})
