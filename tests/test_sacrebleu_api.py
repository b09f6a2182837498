"""The sacrebleu calls the package makes, all through sacrebleu's public API, behave as the code assumes.

pyproject.toml states the sacrebleu range these were run on (``sacrebleu>=2.3,<3``). Every call below is one
the package makes (``grep -rn sacrebleu diverse_fairseq``); a sacrebleu release that changes one fails here.
"""

import re

import pytest

sacrebleu = pytest.importorskip("sacrebleu")

from diverse_fairseq.significance import (  # noqa: E402
    bleu_from_statistics,
    paired_bootstrap,
    sentence_statistics,
    sign_test,
)

HYPS = ["the cat sat on the mat", "a dog barked at the mailman", "it rains today in the city", "hello world"]
REFS = ["the cat sat on a mat", "the dog barked at the mailman", "it is raining today in the city", "hello world !"]


def test_version_is_in_the_stated_range():
    import tomllib
    from pathlib import Path

    deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    spec = next(d for d in deps["dependencies"] if d.startswith("sacrebleu"))
    assert spec == "sacrebleu>=2.3,<3"
    major, minor = map(int, sacrebleu.__version__.split(".")[:2])
    assert major == 2 and minor >= 3, sacrebleu.__version__


def test_bleu_metric_corpus_score_and_signature():
    """evaluate.py: BLEU(tokenize, lowercase).corpus_score(hyps, [refs]).score and get_signature()."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize="13a", lowercase=False)
    score = metric.corpus_score(HYPS, [REFS])
    assert 0 < score.score < 100
    assert re.fullmatch(r"nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:2\.\d+\.\d+",
                        str(metric.get_signature()))
    assert str(score).startswith(f"BLEU = {score.score:.2f} ")
    tok = BLEU(tokenize="none", force=True).corpus_score(HYPS, [REFS])
    assert tok.score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="none").score)  # ablation.py
    assert BLEU(lowercase=True).corpus_score(["Hello World, how are You"], [["hello world, how are you"]]).score \
        == pytest.approx(100.0)


def test_sentence_statistics_sum_to_the_corpus_score():
    """significance.sign_test: per-sentence statistics from BLEUScore's public fields, scored by compute_bleu,
    give exactly corpus_score's BLEU, also after swapping one sentence."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    stats = sentence_statistics(BLEU(effective_order=True), HYPS, REFS)
    assert stats.shape == (4, 10) and stats[0, 0] == 6 and stats[0, 1] == 6  # 6 hyp and ref words
    assert bleu_from_statistics(metric, stats.sum(0)) == pytest.approx(metric.corpus_score(HYPS, [REFS]).score)
    other = list(HYPS)
    other[1] = "the dog barked at the mailman"
    swapped = stats.sum(0) - stats[1] + sentence_statistics(BLEU(effective_order=True), other[1:2], REFS[1:2])[0]
    assert bleu_from_statistics(metric, swapped) == pytest.approx(metric.corpus_score(other, [REFS]).score)
    assert sign_test(HYPS, other, REFS) == {"better": 1, "worse": 0, "ties": 3, "p_value": 1.0}


def test_paired_test_and_zh_tokenizer_and_datasets():
    """significance.paired_bootstrap (sacrebleu.significance.PairedTest), text.py's Chinese tokenizer
    (BLEU(tokenize='zh').tokenizer) and the test-set registry (sacrebleu.DATASETS) that the md5s written in
    data/recipes/base.py come from (tests/data/test_data_sources.py checks they agree)."""
    from sacrebleu.metrics import BLEU

    refs = REFS * 5
    better = (["the cat sat on a mat"] + HYPS[1:]) * 5  # the first sentence now equals its reference
    signature, results = paired_bootstrap(HYPS * 5, {"sys": better}, refs, samples=50)
    assert signature.startswith("nrefs:1|bs:50|seed:12345|")
    assert results["sys"]["bleu"] > results["baseline"]["bleu"] and 0 < results["sys"]["p_value"] <= 1
    assert BLEU(tokenize="zh").tokenizer("我爱北京天安门") == "我 爱 北 京 天 安 门"
    wmt14 = sacrebleu.DATASETS["wmt14"]
    assert len(wmt14.md5) == len(wmt14.data) >= 1
