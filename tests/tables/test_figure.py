"""Paper figures run by the table runner (``make figure-<id>``): the plotting step and the 1-head rows.

* ``diverse_fairseq.tables.figure`` turns a report JSON, written by the real ``report.summarise`` /
  ``write_report`` for ``configs/tables/emnlp20_f3.yaml`` from fake runs, into a PNG that opens as an image
  and a JSON with one curve per series, the per-seed values and the best x;
* a 1-head model (M = 1) has no head pairs: the runner records no head-diversity scores for it (cached,
  asked once) instead of failing, and the report leaves its disagreement out.
"""

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import fake_prepared
from test_tables import _corrupt, _fake_run, _refs

from diverse_fairseq.tables import figure, report, steps
from diverse_fairseq.tables.config import RunConfig
from diverse_fairseq.tables.job import make_job
from diverse_fairseq.tables.records import from_json
from diverse_fairseq.tables.spec import load_table

HEADS = (1, 2, 4, 8, 16)


@pytest.fixture
def report_json(tmp_path):
    """results/emnlp20_f3/demo.json as the runner writes it: 10 rows x 2 seeds, NLL lowest at M = 4."""
    table = load_table("emnlp20_f3")
    refs = _refs(n=30)
    results = {}
    for row in table.rows:
        heads, rma = int(row.figure["x"]), row.figure["series"] == "RMA"
        distance = abs(HEADS.index(heads) - 2)  # 0 at M = 4
        results[row.id] = []
        for seed in (1, 2):
            rng = random.Random(f"{row.id}-{seed}")
            hyps = [_corrupt(r, 0.2 + 0.05 * distance - 0.03 * rma, rng) for r in refs]
            nll = 3.0 + 0.2 * distance - 0.1 * rma + 0.01 * seed
            record = _fake_run(tmp_path / "runs", row.id, seed, hyps, refs, valid_loss=nll + 0.5, valid_nll_loss=nll)
            if heads > 1:
                record = replace(record, disagreement={"enc_self": {"sub": 0.7, "pos": 0.1, "out": 0.8, "layers": []}})
            results[row.id].append(record)
    summary = report.summarise(table, results, "demo", "demo")
    md = report.write_report(summary, tmp_path / "results" / "emnlp20_f3")
    return md.with_suffix(".json")


def test_the_report_carries_the_points_and_the_validation_nll(report_json):
    summary = json.loads(report_json.read_text())
    assert summary["figure_x"] == "number of heads M"
    rows = {r["id"]: r for r in summary["rows"]}
    assert rows["rma_h4"]["figure"] == {"series": "RMA", "x": 4.0}
    assert rows["rma_h4"]["valid_nll_loss_per_seed"] == pytest.approx([2.91, 2.92])
    assert rows["rma_h4"]["valid_nll_loss"] == pytest.approx(2.915)
    assert rows["rma_h4"]["significance"]["baseline"] == "ma_h4"  # each M against MA of the same M
    assert rows["ma_h1"]["output_disagreement"] is None and rows["ma_h1"]["disagreement"] is None  # no head pairs
    assert rows["ma_h2"]["output_disagreement"] == pytest.approx(0.8)


def test_plot_step_writes_a_png_and_the_json_behind_it(report_json, capsys):
    assert figure.main(["--plot-only", str(report_json)])
    png, data_path = report_json.with_name("demo-figure.png"), report_json.with_name("demo-figure.json")
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
    data = json.loads(data_path.read_text())
    assert (data["table"], data["dataset"], data["scale"], data["x_label"]) == ("emnlp20_f3", "demo", "demo",
                                                                                 "number of heads M")
    assert set(data["metrics"]) == {"valid_nll_loss", "bleu"}
    assert [s["name"] for s in data["series"]] == ["MA", "RMA"]
    for s in data["series"]:
        assert [p["x"] for p in s["points"]] == list(map(float, HEADS))
        assert [p["row"] for p in s["points"]] == [f"{s['name'].lower()}_h{h}" for h in HEADS]
        for p in s["points"]:
            assert p["seeds"] == [1, 2] and len(p["valid_nll_loss"]) == len(p["bleu"]) == 2
            assert p["valid_nll_loss_mean"] == pytest.approx(sum(p["valid_nll_loss"]) / 2)
    assert data["best_x"] == {"MA": {"valid_nll_loss": 4.0, "bleu": 4.0}, "RMA": {"valid_nll_loss": 4.0, "bleu": 4.0}}
    out = capsys.readouterr().out
    assert "MA: best valid_nll_loss at number of heads M = 4" in out and "demo-figure.png" in out


def test_a_table_without_points_is_refused(report_json):
    summary = from_json(report.Summary, json.loads(report_json.read_text()))
    assert figure.figure_data(summary)["x_label"] == "number of heads M"  # the JSON read back: its typed summary
    with pytest.raises(ValueError, match="emnlp20_f3: the report has no figure points"):
        figure.figure_data(replace(summary, figure_x=None))


def test_one_head_models_get_no_head_diversity_scores(tmp_path, monkeypatch):
    from diverse_fairseq.analysis import pipeline
    from diverse_fairseq.analysis.scores import TooFewHeads, check_heads

    calls = []

    def one_head(checkpoint, opts, label=None):
        calls.append(checkpoint)
        check_heads(1, checkpoint)

    monkeypatch.setattr(pipeline, "score_checkpoint", one_head)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"one head")  # the caches check its size and SHA-256
    table = load_table("emnlp20_f3")
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path,
                    data_bin=fake_prepared(tmp_path / "data-bin", "demo"))
    job = make_job(table.table, table.row("rma_h1"), run, 1)
    for _ in range(2):
        assert steps.disagreement_scores(job, Path("checkpoint_last.pt")) is None
    assert calls == ["checkpoint_last.pt"]  # the second call reads the cache
    cached = json.loads((run.run_dir(table.row("rma_h1"), 1) / "analysis" / "disagreement.json").read_text())
    assert cached["by_type"] is None and "at least 2 heads, got H = 1" in cached["skipped"]
    with pytest.raises(TooFewHeads):
        check_heads(1, "x")
