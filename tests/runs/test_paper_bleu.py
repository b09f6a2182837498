"""The EMNLP 2020 authors' BLEU (diverse_fairseq.runs.paper_bleu): fairseq-generate's scorer for IWSLT14, the
detokenize / tokenize without -a / ##AT## / multi-bleu chain for WMT14, and its column in the report."""

from dataclasses import replace

import pytest
from test_tables import _fake_run, _refs, _table

from diverse_fairseq.data.text import tokenize
from diverse_fairseq.evaluate import tokenized_pair
from diverse_fairseq.runs.dataset_meta import meta_from_dict
from diverse_fairseq.runs.paper_bleu import atat_split, authors_bleu, plain_bleu, wmt14_bleu, wmt14_tokens
from diverse_fairseq.tables import report

REFS = ["the cat sat on the mat .", "we saw a zyzzyva in the garden yesterday .", "it was raining all day long .",
        "she said that he would come back tomorrow ."]
HYPS = ["the cat sat on a mat .", "we saw a <unk> in the garden .", "it rained all day long .",
        "she said he would come tomorrow ."]


def _fairseq_generate_bleu(hyps, refs):
    """fairseq-generate's BLEU with --remove-bpe: the reference is the binarized target written back with
    escape_unk (an out-of-dictionary word is ``<<unk>>``), both sides encoded with add_if_not_exist, then
    fairseq's own scorer."""
    from fairseq.data import Dictionary
    from fairseq.scoring.bleu import BleuConfig, Scorer

    d = Dictionary()
    for word in " ".join(REFS).split():
        if word != "zyzzyva":  # a word the training data did not have
            d.add_symbol(word)
    scorer = Scorer(BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    targets = []
    for hyp, ref in zip(hyps, refs):
        target = d.encode_line(ref, add_if_not_exist=False)
        target_str = d.string(target, escape_unk=True)
        targets.append(target_str)
        scorer.add(d.encode_line(target_str, add_if_not_exist=True), d.encode_line(hyp, add_if_not_exist=True))
    return scorer.score(), targets


def test_iwslt14_bleu_is_fairseq_generates():
    fairseq_score, targets = _fairseq_generate_bleu(HYPS, REFS)
    assert "<<unk>>" in targets[1]  # what fairseq-generate writes on its T- line
    ours = plain_bleu(HYPS, targets)
    assert ours.score == pytest.approx(fairseq_score, abs=1e-9) and 20 < ours.score < 80
    # sacrebleu's defaults (13a tokenization, exp smoothing) are not the authors' number on this example
    from sacrebleu.metrics import BLEU

    assert BLEU().corpus_score(HYPS, [targets]).score != pytest.approx(fairseq_score, abs=1e-3)
    result = authors_bleu("iwslt14_de_en", HYPS, targets, REFS, "en")
    assert result["paper_bleu"] == round(fairseq_score, 2) and "test-iwslt14.sh" in result["paper_bleu_kind"]
    with pytest.raises(ValueError, match="T- lines"):
        authors_bleu("iwslt14_de_en", HYPS, None, REFS, "en")
    assert authors_bleu("wmt14_en_de", HYPS, targets, REFS, "de") == {}  # the THUMT tables: no such column


def test_wmt14_hyphens_are_split_as_the_authors_script_does(tmp_path):
    raw = "Die Kosten-Nutzen-Analyse für das E-Mail-System kostet 3-4 Euro."
    model = tokenize(raw, "de", aggressive_dash=True)  # what the model writes: -a tokenized, @-@
    assert "Kosten @-@ Nutzen" in model
    ours = wmt14_tokens(raw, "de")
    assert ours == ("Die Kosten ##AT##-##AT## Nutzen ##AT##-##AT## Analyse für das E ##AT##-##AT## Mail "
                    "##AT##-##AT## System kostet 3 ##AT##-##AT## 4 Euro .")
    assert "@" not in ours.replace("##AT##", "")
    # the compound split of our tokenized BLEU, on -a tokenized text, gives the other form
    meta = meta_from_dict({"source_lang": "en", "target_lang": "de", "moses_tokenized": True, "compound_split": True,
                           "aggressive_dash": True})
    hyps, _ = tokenized_pair([model], [raw], [raw], tmp_path, "test", meta)
    assert "@ ##AT##-##AT## @" in hyps[0]
    # Perl's s{(\S)-(\S)}{...}g is left to right and does not overlap: the middle of a-b-c is consumed
    assert atat_split("a-b-c") == "a ##AT##-##AT## b-c"


def test_wmt14_bleu_of_the_reference_through_the_model_tokenization_is_100():
    refs = ["Die Kosten-Nutzen-Analyse ist \"gut\" & billig.", "Er sagte: „Das E-Mail-System läuft.“"]
    model = [tokenize(r, "de", aggressive_dash=True) for r in refs]
    assert wmt14_bleu(model, refs, "de").score == pytest.approx(100.0)
    worse = [model[0], "Er sagte : Das System läuft ."]
    score = wmt14_bleu(worse, refs, "de").score
    assert 0 < score < 100
    result = authors_bleu("wmt14_en_de_joined", worse, None, refs, "de")
    assert result["paper_bleu"] == round(score, 2) and "without -a" in result["paper_bleu_kind"]


def test_the_report_puts_the_authors_bleu_beside_the_papers(tmp_path):
    refs = _refs(n=10)
    table = _table("""
  - {id: ma, label: MA, family: transformer, paper: {bleu: 34.4}}
  - {id: rma, label: RMA, family: transformer, paper: {bleu: 35.2}}
""", baseline="ma")
    results = {}
    for row_id, bleu in (("ma", 33.91), ("rma", 34.87)):
        run = _fake_run(tmp_path, row_id, 1, refs, refs)
        evaluation = replace(run.eval, paper_bleu=bleu, paper_bleu_kind="fairseq-generate's BLEU (test)")
        results[row_id] = [replace(run, evals={"test": evaluation})]
    md = report.to_markdown(report.summarise(table, results, "iwslt14_de_en", "paper"))
    head = next(line for line in md.splitlines() if line.startswith("| System |"))
    cells = [c.strip() for c in head.strip("|").split("|")]
    assert cells[-2:] == ["authors' BLEU", "paper BLEU"]
    line = next(line for line in md.splitlines() if line.startswith("| RMA |"))
    assert [c.strip() for c in line.strip("|").split("|")][-2:] == ["34.87", "35.20"]
    assert "authors' BLEU: fairseq-generate's BLEU (test)" in md
    for runs in results.values():  # a dataset without the authors' scoring: no column
        runs[0] = replace(runs[0], evals={"test": replace(runs[0].eval, paper_bleu=None)})
    assert "authors' BLEU" not in report.to_markdown(report.summarise(table, results, "iwslt14_de_en", "paper"))
