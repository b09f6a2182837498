"""The table report's note on rows the two significance tests disagree on: what was measured, always; the
brevity-penalty reason only where the lengths support it (the sign test marks, the bootstrap does not, and the
row's outputs are longer than a baseline that is shorter than the references)."""

import pytest
from test_tables import _fake_run, _refs, _table

from diverse_fairseq.significance import length_ratio
from diverse_fairseq.tables import report

TABLE = "  - {id: base, label: B, family: transformer}\n  - {id: d, label: D, family: transformer}\n"


def _note(tmp_path, base, system, refs):
    results = {"base": [_fake_run(tmp_path, "base", 1, base, refs)], "d": [_fake_run(tmp_path, "d", 1, system, refs)]}
    summary = report.summarise(_table(TABLE), results, "demo", "demo")
    sig = summary.rows[1].significance
    note = next(line for line in report.to_markdown(summary).splitlines() if line.startswith("The two tests disagree"))
    return sig, note


def test_longer_outputs_are_given_as_the_reason_where_the_lengths_support_it(tmp_path):
    """Too short a baseline; a system that adds one word to most sentences and ruins a sixth of them."""
    refs = _refs(120)
    base = [" ".join(r.split()[: len(r.split()) // 2]) for r in refs]
    system = [" ".join("yy" for _ in b.split()) if i < 20 else b + " zz" for i, b in enumerate(base)]
    sig, note = _note(tmp_path, base, system, refs)
    assert sig["sign_test"]["mark"] and not sig["bootstrap"]["mark"] and report.longer_outputs_explain(sig)
    assert f"D: sign test 100 better / 20 worse / 0 ties (p = {sig['sign_test']['p_value']:.2g}), bootstrap p = " \
           f"{sig['bootstrap']['p_value']:.2g}, BLEU difference {sig['delta']:+.2f}, length ratio (hyp/ref) " \
           f"{length_ratio(system, refs):.3f} against B's {length_ratio(base, refs):.3f} " \
           "(only the sign test marks it)" \
           in note
    assert "D's outputs are longer than B's, which are shorter than the references: below a length ratio of 1 each " \
           "longer sentence softens BLEU's brevity penalty" in note


def test_no_length_reason_where_the_bootstrap_marks_at_equal_lengths(tmp_path):
    """A system that repairs 20 broken sentences of the baseline and spoils one word in 16 others, all at the
    same lengths: corpus BLEU rises clearly (bootstrap mark), 20 better against 16 worse is no sign-test evidence,
    and the lengths, equal, explain nothing: the note states the numbers and gives no reason."""
    refs = _refs(120, seed=3)
    base = [" ".join("yy" for _ in r.split()) if i < 20 else r for i, r in enumerate(refs)]
    system = [r if i < 20 else " ".join(["zz"] + r.split()[1:]) if i < 36 else r for i, r in enumerate(refs)]
    sig, note = _note(tmp_path, base, system, refs)
    assert sig["bootstrap"]["mark"] and not sig["sign_test"]["mark"]
    assert (sig["sign_test"]["better"], sig["sign_test"]["worse"]) == (20, 16)
    assert sig["length_ratio"]["row"] == pytest.approx(sig["length_ratio"]["baseline"])
    assert not report.longer_outputs_explain(sig)
    assert "D: sign test 20 better / 16 worse / 84 ties" in note and "(only the bootstrap marks it)" in note
    assert "length ratio (hyp/ref) 1.000 against B's 1.000" in note
    assert "brevity" not in note and "longer" not in note
