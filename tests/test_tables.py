"""The table runner end to end at demo scale with tiny settings: train, evaluate, report, resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --max-tokens 200 --max-update 3 "
        "--save-interval-updates 3 --num-workers 0")

TABLE = """
table: tiny_table
title: "two rows"
baseline: base
rows:
  - id: base
    label: "Transformer"
    family: transformer
  - id: dis
    label: "+ Disagreement"
    family: diverse_transformer
    args: [--criterion, label_smoothed_cross_entropy_with_disagreement, --disagreement-terms, out]
"""


@pytest.fixture(scope="module")
def demo_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    env = dict(os.environ, DATA_BIN=str(root / "data-bin"), WORK_DIR=str(root / "work"),
               DEMO_DIR=str(REPO / "tests" / "fixtures" / "demo_text"), BPE_SIZE="100")
    env.pop("BPE", None)
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_data.sh"), "demo"], env=env, check=True,
                   capture_output=True, timeout=600)
    return root


def _run_table(root, table_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "diverse_fairseq.tables", str(table_path), "--dataset", "demo", "--scale", "demo",
           "--data-bin", str(root / "data-bin"), "--out", str(root / "results"), "--train-args", TINY,
           "--generate-args", "--beam 2 --max-len-b 5",
           "--seeds", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # no library debug chatter (matplotlib's font search in the analysis step, hydra's config loading)
    assert " DEBUG " not in proc.stderr and "DEBUG:" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_tiny_table_end_to_end_and_resume(demo_bin):
    table_path = demo_bin / "tiny_table.yaml"
    table_path.write_text(TABLE)
    _run_table(demo_bin, table_path)

    summary = json.loads((demo_bin / "results" / "demo.json").read_text())
    assert [r["id"] for r in summary["rows"]] == ["base", "dis"]
    for row in summary["rows"]:
        for key in ("bleu", "tok_bleu", "parameters", "train_steps_per_second", "decode_sentences_per_second",
                    "updates", "signature", "output_disagreement"):
            assert row[key] is not None, (row["id"], key)
        assert row["updates"] == 3
    # equal sizes: the disagreement model adds no parameter
    assert summary["rows"][0]["parameters"] == summary["rows"][1]["parameters"]
    assert set(summary["rows"][1]["significance"]) == {"p_value", "delta", "mark"}

    md = (demo_bin / "results" / "demo.md").read_text()
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table_lines) == 2 + 2  # header, rule, two rows
    header = [c.strip() for c in table_lines[0].strip("|").split("|")]
    for line in table_lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(header) and all(cells), line
    assert "sacrebleu signature: `nrefs:1|" in md

    # A second run resumes: both rows are finished, nothing is trained or decoded again.
    out = _run_table(demo_bin, table_path)
    assert out.count("training finished earlier") == 2
    assert "evaluating" not in out and "head-diversity scores" not in out
