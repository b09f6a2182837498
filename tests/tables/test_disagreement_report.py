"""EMNLP 2018 Tables 4-5 in the table report: the paper's numbers in configs/tables/emnlp18_t4_5.yaml, the
mean over seeds stored in a row's summary entry, and the markdown beside the paper's numbers."""

import math
from types import SimpleNamespace

import pytest
from conftest import job_record

from diverse_fairseq.tables.report import disagreement_entry, disagreement_section
from diverse_fairseq.tables.spec import load_table

LAYERS = 6


def test_paper_table4_is_the_geometric_mean_of_table5():
    """Each row's Table 4 Pos. lies within the geometric means of its Table 5 values' rounding intervals
    (a typo in the transcription would break this), and every row has all of Table 4 and Table 5."""
    table = load_table("emnlp18_t4_5")
    assert [r.id for r in table.rows] == ["none", "sub", "pos", "out"]
    for row in table.rows:
        layers = [row.paper[f"pos_score_layer{layer}"] for layer in range(1, LAYERS + 1)]
        assert all(0 < row.paper[k] <= 1 for k in ("sub_score", "pos_score", "out_score"))
        low = math.exp(sum(math.log(v - 5e-4) for v in layers) / LAYERS)
        high = math.exp(sum(math.log(v + 5e-4) for v in layers) / LAYERS)
        assert low - 5e-4 <= row.paper["pos_score"] <= high + 5e-4, (row.id, low, high)
    # the baseline: orthogonal heads at H = 8 give exp(-1/8) = 0.882, the paper's Sub.
    assert table.row("none").paper["sub_score"] == pytest.approx(math.exp(-1 / 8), abs=5e-4)


def _scores(shift):
    layers = [{"layer": layer, "heads": 4, "sub": 0.70 + shift + layer / 100, "pos": 0.20 + layer / 100,
               "out": 0.75 + shift}
              for layer in (1, 2)]
    per_type = {"sub": 0.7 + shift, "pos": 0.2, "out": 0.75 + shift, "layers": layers}
    return {"enc_self": per_type, "dec_self": dict(per_type)}


def _summary(table_name, dataset="demo"):
    table = load_table(table_name)
    rows = []
    for i, row in enumerate(table.rows):
        runs = [job_record(1, disagreement=_scores(0.01 * i)), job_record(2, disagreement=_scores(0.01 * i + 0.02))]
        entry = {"disagreement": None, "paper_disagreement": None, **disagreement_entry(table, row, runs)}
        rows.append(SimpleNamespace(id=row.id, label=row.label, seeds=[1, 2], **entry))
    return SimpleNamespace(dataset=dataset, rows=rows)  # what disagreement_section reads of a report.Summary


def test_entry_is_the_mean_over_seeds_with_the_papers_numbers():
    table = load_table("emnlp18_t4_5")
    row = table.row("out")
    entry = disagreement_entry(table, row, [job_record(disagreement=_scores(0.0)),
                                            job_record(disagreement=_scores(0.02))])
    enc = entry["disagreement"]["enc_self"]
    assert enc["sub"] == pytest.approx(0.71) and enc["pos"] == pytest.approx(0.2)
    assert [e["sub"] for e in enc["layers"]] == pytest.approx([0.72, 0.73])
    assert entry["paper_disagreement"]["dataset"] == "wmt17_zh_en"
    assert entry["paper_disagreement"]["scores"]["out_score"] == 0.997
    assert "bleu" not in entry["paper_disagreement"]["scores"]
    # a seed without scores
    assert disagreement_entry(table, row, [job_record(disagreement=_scores(0.0)), job_record()]) == {}


def test_section_puts_ours_beside_the_papers_table4_and_table5():
    lines = disagreement_section(_summary("emnlp18_t4_5"))
    text = "\n".join(lines)
    assert "exp(−mean over all H² head pairs, self-pairs included)" in text and "exp(−1/4) = 0.779" in text
    tables, current = [], None
    for line in lines:
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            current.append([c.strip() for c in line.strip("|").split("|")])
        else:
            current = None
    table4, table5, sub_out = tables
    assert table4[0] == ["Regularization", "Sub.", "Pos.", "Out.", "paper Sub.", "paper Pos.", "paper Out."]
    assert table4[2] == ["n/a (no regularization)", "0.710", "0.200", "0.760", "0.882", "0.007", "0.881"]
    assert table4[5][0] == "Output regularization" and table4[5][4:] == ["0.989", "0.006", "0.997"]
    assert table5[0] == ["Regularization", "1", "2", *(f"paper {layer}" for layer in range(1, 7))]
    assert table5[4] == ["Position regularization", "0.210", "0.220", "0.217", "0.167", "0.219", "0.242",
                         "0.233", "0.249"]
    assert sub_out[0] == ["Regularization", "Sub. 1", "Sub. 2", "Out. 1", "Out. 2"]
    assert sub_out[2][1:] == ["0.720", "0.730", "0.760", "0.760"]
    assert all(len(r) == len(t[0]) for t in tables for r in t)


def test_no_section_for_tables_without_the_papers_scores():
    assert disagreement_section(_summary("emnlp18_t1")) == []
    row = SimpleNamespace(id="a", label="a", seeds=[1], disagreement=None, paper_disagreement=None)
    assert disagreement_section(SimpleNamespace(dataset="demo", rows=[row])) == []
