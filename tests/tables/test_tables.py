"""The table runner and its report.

* report: significance of every row against its own baseline (paired bootstrap and sign test), on the
  concatenated outputs of several seeds, checked against a computation by hand; mean ± sd, per-seed values,
  k/n seeds, notes (checkpoints, reused runs, parameter footnote, row descriptions) and the PNG;
* runner: the cache key (the effective command), progress lines, the environment checks;
* end to end at demo scale with tiny settings: train, evaluate, report, resume, retrain on a changed row.
"""

import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from conftest import demo_text_env, fake_prepared, job_record, with_train
from test_run_life import HYDRA_NOISE

from diverse_fairseq import training
from diverse_fairseq.runs import plan as run_plan
from diverse_fairseq.runs.env_checks import parse_seeds
from diverse_fairseq.runs.plan import TrainOptions
from diverse_fairseq.tables import report, runner, steps
from diverse_fairseq.tables.__main__ import default_jobs, parse_options
from diverse_fairseq.tables.cache import cache_key, key_difference
from diverse_fairseq.tables.config import RunConfig
from diverse_fairseq.tables.job import job_plan, make_job, table_jobs
from diverse_fairseq.tables.progress import Progress
from diverse_fairseq.tables.spec import Row, parse_table

REPO = Path(__file__).resolve().parents[2]
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
    description: "the plain model"
    family: transformer
  - id: dis
    label: "+ Disagreement"
    family: diverse_transformer
    args: [--criterion, label_smoothed_cross_entropy_with_disagreement, --disagreement-terms, out]
"""


# ------------------------------------------------------------------------------------------- BLEU by hand
def _bleu_stats(hyp: str, ref: str):
    """[hyp length, ref length, matches n=1..4, hyp n-grams n=1..4] of one sentence (words: no tokenization
    needed for the lower-case letter words used here)."""
    h, r = hyp.split(), ref.split()
    stats = [len(h), len(r)]
    grams = lambda words, n: Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))  # noqa: E731
    stats += [sum((grams(h, n) & grams(r, n)).values()) for n in range(1, 5)]
    stats += [max(len(h) - n + 1, 0) for n in range(1, 5)]
    return np.array(stats, dtype=np.float64)


def _bleu(total) -> float:
    """Corpus BLEU from summed statistics (no zero counts occur in this data: no smoothing)."""
    hyp_len, ref_len = total[0], total[1]
    log_p = sum(math.log(total[2 + n] / total[6 + n]) for n in range(4)) / 4
    bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


def _bootstrap_by_hand(base, system, refs, samples=1000, seed=12345):
    """Koehn's paired bootstrap as sacrebleu runs it (its resampling indices, two-sided statistic)."""
    b = np.stack([_bleu_stats(h, r) for h, r in zip(base, refs)])
    s = np.stack([_bleu_stats(h, r) for h, r in zip(system, refs)])
    idx = np.random.default_rng(seed).choice(len(refs), size=(samples, len(refs)), replace=True)
    diffs = np.abs(np.array([_bleu(s[i].sum(0)) - _bleu(b[i].sum(0)) for i in idx]))
    observed = abs(_bleu(s.sum(0)) - _bleu(b.sum(0)))
    p = (np.sum(diffs - diffs.mean() > observed) + 1) / (samples + 1)
    return _bleu(s.sum(0)) - _bleu(b.sum(0)), p


def _sign_by_hand(base, system, refs):
    b = np.stack([_bleu_stats(h, r) for h, r in zip(base, refs)])
    s = np.stack([_bleu_stats(h, r) for h, r in zip(system, refs)])
    total, plus, minus = b.sum(0), 0, 0
    for i in range(len(refs)):
        swapped = _bleu(total - b[i] + s[i])
        plus += swapped > _bleu(total) + 1e-9
        minus += swapped < _bleu(total) - 1e-9
    return plus, minus


# ------------------------------------------------------------------------------------- synthetic runs
WORDS = [f"{a}{b}" for a in "bcdfg" for b in "aeiou"]


def _corrupt(ref: str, rate: float, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) if rng.random() < rate else w for w in ref.split())


def _refs(n=60, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 16))) for _ in range(n)]


def _fake_run(root: Path, row_id: str, seed: int, hyps, refs, **record):
    out = root / row_id / f"seed{seed}" / "eval"
    out.mkdir(parents=True)
    (out / "hyp.detok.de").write_text("".join(h + "\n" for h in hyps))
    (out / "ref.detok.de").write_text("".join(r + "\n" for r in refs))
    bleu = _bleu(sum(_bleu_stats(h, r) for h, r in zip(hyps, refs)))
    train = dict(parameters=1_440_000, train_steps_per_second=5.0, updates=3, valid_loss=4.0, valid_nll_loss=3.0,
                 checkpoint=str(root / row_id / f"seed{seed}" / "checkpoint_last.pt"),
                 train_args=["data", "--share-all-embeddings"], embeddings="all")
    return job_record(seed, row=row_id, eval={"out": str(out), "bleu": bleu, "tok_bleu": bleu,
                                              "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:x",
                                              "speed": {"sentences_per_second": 50.0}}, **dict(train, **record))


def _table(rows_yaml: str, baseline="base"):
    import yaml

    return parse_table(yaml.safe_load(f"table: t\ntitle: a table\nbaseline: {baseline}\nrows:\n{rows_yaml}"), "t.yaml")


TWO_SIZES = """
  - {id: base, label: Base, family: transformer, setting: base, paper: {bleu: 27.3, params: 88}}
  - {id: base_d, label: Base + D, family: diverse_transformer, setting: base, description: "base with D"}
  - {id: big, label: Big, family: transformer, setting: big, baseline: big}
  - {id: big_d, label: Big + D, family: diverse_transformer, setting: big, baseline: big}
"""


@pytest.fixture
def two_sizes(tmp_path):
    """Base/Big × none/+D over two seeds: + D is better than its own baseline, Big better than Base."""
    refs = _refs()
    rates = {"base": 0.5, "base_d": 0.35, "big": 0.2, "big_d": 0.15}
    results = {}
    for row_id, rate in rates.items():
        results[row_id] = []
        for seed in (1, 2):
            rng = random.Random(f"{row_id}-{seed}")
            results[row_id].append(_fake_run(tmp_path, row_id, seed, [_corrupt(r, rate, rng) for r in refs], refs))
    return _table(TWO_SIZES), results, refs


def test_each_row_is_tested_against_its_own_baseline_on_the_concatenated_seeds(two_sizes):
    table, results, refs = two_sizes
    marks = report.significance(table, results)
    assert set(marks) == {"base_d", "big_d"}  # baselines are not tested
    assert marks["base_d"]["baseline"] == "base" and marks["big_d"]["baseline"] == "big"
    for row_id, base_id in (("base_d", "base"), ("big_d", "big")):
        # by hand: seed k of the row paired with seed k of its baseline, the references repeated per seed
        base = [h for run in results[base_id]
                for h in Path(run.eval.out, "hyp.detok.de").read_text().split("\n")[:-1]]
        system = [h for run in results[row_id]
                  for h in Path(run.eval.out, "hyp.detok.de").read_text().split("\n")[:-1]]
        delta, p = _bootstrap_by_hand(base, system, refs + refs)
        m = marks[row_id]
        assert m["sentences"] == 2 * len(refs) and m["seeds"] == [1, 2]
        assert m["delta"] == pytest.approx(delta, abs=1e-6)
        assert m["bootstrap"]["p_value"] == pytest.approx(p, abs=2 / 1001)
        plus, minus = _sign_by_hand(base, system, refs + refs)
        assert (m["sign_test"]["better"], m["sign_test"]["worse"]) == (plus, minus)
        per_seed = sum(r.eval.bleu > b.eval.bleu for r, b in zip(results[row_id], results[base_id]))
        assert (m["seeds_better"], m["seeds_total"]) == (per_seed, 2)
    # Big + D is only slightly better than Big, far better than Base: tested against Base it would be ⇑
    assert marks["big_d"]["delta"] < marks["base_d"]["delta"]


def test_concatenation_is_not_the_first_seed_alone(tmp_path):
    """A row that wins clearly on seed 2 only: one seed's test sees nothing, the concatenated one does."""
    refs = _refs(80)
    rng = random.Random(1)
    base = [[_corrupt(r, 0.3, rng) for r in refs] for _ in range(2)]
    system = [base[0], [_corrupt(r, 0.1, rng) for r in refs]]  # seed 1: identical outputs
    results = {"base": [_fake_run(tmp_path, "base", s + 1, base[s], refs) for s in range(2)],
               "d": [_fake_run(tmp_path, "d", s + 1, system[s], refs) for s in range(2)]}
    table = _table("  - {id: base, label: B, family: transformer}\n  - {id: d, label: D, family: transformer}\n")
    one_seed = report.significance(table, {k: v[:1] for k, v in results.items()})["d"]
    both = report.significance(table, results)["d"]
    assert one_seed["bootstrap"]["p_value"] == 1.0 and one_seed["bootstrap"]["mark"] == ""
    assert both["bootstrap"]["mark"] == report.DOUBLE_UP and both["sign_test"]["mark"] == report.DOUBLE_DAGGER
    assert (both["seeds_better"], both["seeds_total"]) == (1, 2)


def test_markdown_and_picture_with_several_seeds(two_sizes, tmp_path):
    table, results, _ = two_sizes
    results["base"][1] = replace(results["base"][1], reused=True)
    summary = report.summarise(table, results, "wmt14_en_de", "paper")
    md_path = report.write_report(summary, tmp_path / "out")
    md = md_path.read_text()
    rows = {r.id: r for r in summary.rows}
    base_d = rows["base_d"]
    values = base_d.bleu_per_seed
    sd = math.sqrt(sum((v - sum(values) / 2) ** 2 for v in values))  # sample sd of two values
    assert base_d.bleu_std == pytest.approx(sd)
    line = next(line for line in md.splitlines() if line.startswith("| Base + D |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    mark = base_d.significance["bootstrap"]["mark"] + base_d.significance["sign_test"]["mark"]
    assert mark  # 0.5 → 0.35 word error rate over 120 sentences is significant
    assert cells[1] == f"{base_d.bleu:.2f} ± {sd:.2f} {mark}"
    assert cells[2] == f"{values[0]:.2f} / {values[1]:.2f}"  # per seed
    assert cells[5] == "2/2"  # seeds > baseline
    assert cells[6] == "Base"  # tested against (the table has two baselines)
    big_d = next(line for line in md.splitlines() if line.startswith("| Big + D |"))
    assert big_d.strip("|").split("|")[6].strip() == "Big"
    # legends: which test and which p-level each mark means; the seeds; the baselines
    for text in ("↑ p < 0.05, ⇑ p < 0.01 paired bootstrap resampling", "1000 samples",
                 "† p < 0.05, ‡ p < 0.01 sign test (Collins et al. 2005", "seeds 1, 2 in that order",
                 "outputs of all seeds concatenated", "**Base** for Base + D; **Big** for Big + D",
                 "Checkpoints: a single checkpoint (the last) for every run",
                 "Reused from earlier invocations (finished runs made by the same command): Base (seed 2, trained "
                 "2024-01-01 00:00:00)", "- **Base + D**: base with D", "![BLEU per seed](wmt14_en_de.png)"):
        assert text in md, text
    # the paper's numbers beside ours, and why the parameter counts differ
    base_line = [c.strip()
                 for c in next(line for line in md.splitlines() if line.startswith("| Base |")).strip("|").split("|")]
    assert base_line[-2:] == ["27.30", "88M"] and base_line[-5] == "1.44M" + report.PARAMS_NOTE
    assert "¹ Our parameter count differs from the paper's (Base)" in md and "--share-all-embeddings" in md
    # the PNG is a real image
    import matplotlib.image

    png = md_path.with_suffix(".png")
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert json.loads(md_path.with_suffix(".json").read_text())["rows"][1]["bleu_per_seed"] == values


def test_markdown_with_one_seed_and_averaged_checkpoints(two_sizes, tmp_path):
    table, results, _ = two_sizes
    one = {k: v[:1] for k, v in results.items()}
    one["big"][0] = with_train(one["big"][0], averaged_checkpoints=5, checkpoint="/x/checkpoint_avg_last5.pt")
    md = report.to_markdown(report.summarise(table, one, "demo", "demo"))
    assert "| per seed |" not in md and " ± " not in md and "seeds > baseline" not in md
    assert ("Checkpoints: a single checkpoint (the last) for Base, Base + D, Big + D; the average of the last 5 "
            "checkpoints for Big.") in md
    assert "Every run was trained by this invocation." in md
    for runs in one.values():  # the THUMT papers' rows at paper scale: the best checkpoint by validation BLEU
        runs[0] = with_train(runs[0], averaged_checkpoints=0, checkpoint="/x/checkpoint_best.pt",
                             best_checkpoint_metric="bleu")
    best = report.to_markdown(report.summarise(table, one, "demo", "demo"))
    assert "Checkpoints: a single checkpoint (the best by validation BLEU) for every run" in best
    assert ("The paper columns are the paper's numbers at full scale" in md
            and "at scale `demo` the model is the small demo setting" in md)


# --------------------------------------------------------------------------------------- the runner
@pytest.fixture
def prepared(tmp_path):
    data = tmp_path / "data-bin" / "demo"
    data.mkdir(parents=True)
    meta = {"dataset": "demo", "source_lang": "en", "target_lang": "de", "joined_dictionary": True,
            "bpe_size": 4000, "created": "2024-01-01 00:00:00"}
    (data / "prepare.json").write_text(json.dumps(meta))
    return tmp_path


def _key(root: Path, out="results", seed=1, args=(), env=None, train_args=()):
    """The cache key of a one-row table's job, from the row's plan (job.job_plan)."""
    run = RunConfig(dataset="demo", scale="demo", seeds=[seed], gpus=0, out_dir=root / out,
                    data_bin=root / "data-bin", train_args=list(train_args),
                    train_options=training.options_from_env(env or {}))
    row = Row(id="r", label="R", family="transformer", args=list(args))
    return cache_key(job_plan(row, run, seed))


def test_cache_key_is_the_runs_identity(prepared):
    key = _key(prepared)
    assert key == _key(prepared) and key["identity"]["options"]["--arch"] == "transformer" and key["dataset"] == "demo"
    assert str(prepared) not in json.dumps(key)  # no path of the run: the results directory may move
    assert key == _key(prepared, out="moved")
    assert key == _key(prepared, args=["--dropout", "0.1"])  # the tiny setting's dropout, spelled out
    for changed in (_key(prepared, args=["--dropout", "0.2"]), _key(prepared, seed=2),
                    _key(prepared, train_args=["--max-update", "5"]), _key(prepared, env={"MAX_UPDATE": "7"}),
                    _key(prepared, env={"AVERAGE": "2"})):
        assert changed != key
    meta_path = prepared / "data-bin" / "demo" / "prepare.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(dict(meta, created="2025-01-01 00:00:00")))
    assert _key(prepared) == key  # re-made, same data
    meta_path.write_text(json.dumps(dict(meta, bpe_size=8000)))
    assert _key(prepared) != key
    diff = key_difference(key, _key(prepared, args=["--dropout", "0.2"]))
    assert "--dropout (default) → 0.2" in diff and "prepared data" in diff
    assert "older runner" in key_difference(None, key)


def test_logging_flags_and_tensorboard_are_not_part_of_the_key(prepared, monkeypatch):
    """The log format and file, and ``--tensorboard-logdir`` (present only where a writer is installed) change
    what is written, not what is trained: a results folder moved to a machine without tensorboard is reused.
    Any other change of the command still counts."""
    old = _key(prepared)
    assert _key(prepared, train_args=["--log-format", "simple"]) == old
    installed = run_plan.tensorboard_available()
    monkeypatch.setattr(run_plan, "tensorboard_available", lambda: not installed)
    assert _key(prepared) == old
    assert old == _key(prepared)
    assert old != _key(prepared, train_args=["--log-format", "json", "--dropout", "0.2"])
    assert key_difference(old, _key(prepared, train_args=["--log-format=json", "--dropout", "0.2"])) == \
        "changed: --dropout (default) → 0.2"


def test_a_rows_train_command_names_each_option_once(prepared):
    """The row's ``--arch``, its flags, TRAIN_ARGS and the runner's ``--log-format json`` replace the setting's
    options in the planned fairseq-train argv (the last one given wins, as fairseq reads them), never add to them."""
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=prepared / "results",
                    data_bin=prepared / "data-bin", train_args=["--dropout", "0.3", "--lr=0.001"])
    row = Row(id="r", label="R", family="diverse_transformer", args=["--dropout", "0.2", "--lr", "0.01"])
    job = job_plan(row, run, 1)
    flags = Counter(a.split("=", 1)[0] for a in job.args if a.startswith("--"))
    assert [flag for flag, n in flags.items() if n > 1] == []
    assert job.args[job.args.index("--arch") + 1] == "diverse_transformer" and "--lr=0.001" in job.args
    assert job.args[job.args.index("--log-format") + 1] == "json" and job.args[job.args.index("--dropout") + 1] == "0.3"


def test_train_args_may_not_set_the_runners_log_flags(monkeypatch):
    monkeypatch.setenv("TRAIN_ARGS", "--max-update 5 --log-format simple")
    with pytest.raises(SystemExit, match=r"TRAIN_ARGS \(--train-args\)='--max-update 5 --log-format simple' is not "
                                         r"valid: leave out --log-format: the runner sets --log-format and --log-file"):
        parse_options(["demo"], os.environ)


def test_log_reader_takes_fairseq_json_records():
    from diverse_fairseq.tables import progress as logs

    text = "\n".join([
        "2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {'log_format': 'json'}}",
        "2026-01-01 00:00:00 | INFO | fairseq_cli.train | num. shared model params: 1,234 (num. trained: 1,200)",
        '{"epoch": 1, "update": 0.5, "loss": "9.1", "num_updates": "1"}',  # train_inner, as in a --log-file
        '{"epoch": 1, "train_loss": "8.5", "train_ups": "4.2", "train_num_updates": "2", "train_train_wall": "1"}',
        '2026-01-01 00:00:01 | INFO | valid | {"epoch": 1, "valid_loss": "8.9", "valid_best_loss": "8.9"}',
        '{"epoch": 2, "train_loss": "7.5", "train_ups": "4.4", "train_num_updates": "4", "train_lr": "0.0001"}',
        "epoch 002 | loss 1.0 | num_updates 4",  # a text line of --log-format simple: not read
    ])
    assert logs.last_summary(text, "train") == {"loss": 7.5, "ups": 4.4, "num_updates": 4.0, "lr": 0.0001}
    assert logs.last_summary(text, "valid") == {"loss": 8.9, "best_loss": 8.9}
    assert logs.model_parameters(text) == 1200
    assert logs.last_summary("epoch 001 | loss 1.0", "train") == {}
    with pytest.raises(ValueError, match="subset='test' is not valid: use 'train' or 'valid'"):
        logs.last_summary(text, "test")


def test_training_without_a_tensorboard_writer_leaves_the_flag_out(prepared, monkeypatch, capsys):
    env = {"DATA_BIN": str(prepared / "data-bin"), "SAVE_DIR": str(prepared / "run"), "DRY_RUN": "1"}

    def args():
        return list(run_plan.plan(training.request_from_env("demo", "tiny", [], env=env, gpus=0)).args)

    monkeypatch.setattr(run_plan, "tensorboard_available", lambda: True)
    assert args()[args().index("--tensorboard-logdir") + 1] == str(prepared / "run" / "tensorboard")
    monkeypatch.setattr(run_plan, "tensorboard_available", lambda: False)
    training.run_from_env("demo", "tiny", [], env=env, gpus=0)
    assert "--tensorboard-logdir" not in args()
    assert "no tensorboard logs: neither tensorboardX nor tensorboard is installed" in capsys.readouterr().out


def test_progress_lines(tmp_path, capsys):
    table = _table("  - {id: base, label: B, family: transformer}\n  - {id: d, label: D, family: transformer}\n")
    run = RunConfig(dataset="demo", scale="demo", seeds=[1, 2], gpus=0, out_dir=tmp_path, jobs=1,
                    data_bin=fake_prepared(tmp_path / "data-bin", "demo"))
    one, two = table_jobs(table, run)[:2]  # row base, seeds 1 and 2 (row d trains the same model)
    capsys.readouterr()
    progress = Progress(table, run, total=4)
    progress.begin(one)
    progress.started[("base", 1)] -= 60  # it ran a minute
    progress.end(one, job_record(bleu=12.345))
    progress.begin(two)
    progress.end(two, job_record(bleu=12.0, reused=True, trained_at="yesterday"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[t] row 1 of 2 (seed 1) B: started; elapsed 0:00:00, estimated remaining unknown")
    assert "row 1 of 2 (seed 1) B: finished in 0:01:00, BLEU 12.35" in lines[1]
    assert "estimated remaining 0:03:00" in lines[1]  # three jobs left at a minute each, one at a time
    assert "reused the run trained yesterday" in lines[3] and "estimated remaining 0:02:00" in lines[3]


def test_rows_with_one_demo_model_are_trained_once(tmp_path, monkeypatch):
    """NAACL 2019 Table 3 at demo scale: [1-3], [1,2] and [1] map to demo layer 0 and [4-6], [6] to layer 1, so
    the runner trains each model once and gives its runs to the other rows; at paper scale every row trains."""
    from diverse_fairseq.tables.spec import load_table

    table = load_table("naacl19_t3")
    data_bin = fake_prepared(fake_prepared(tmp_path / "data-bin", "demo"), "wmt14_en_de")
    demo = RunConfig(dataset="demo", scale="demo", seeds=[1, 2], gpus=0, out_dir=tmp_path, jobs=1, data_bin=data_bin)
    paper = RunConfig(dataset="wmt14_en_de", scale="paper", seeds=[1], gpus=0, out_dir=tmp_path, jobs=1,
                      data_bin=data_bin)
    assert [job.rows for job in table_jobs(table, demo) if job.seed == 1] == [
        ("none",), ("l1_6",), ("l4_6", "l6"), ("l1_3", "l1_2", "l1")]
    assert [job.rows for job in table_jobs(table, paper)] == [(row.id,) for row in table.rows]

    trained = []
    monkeypatch.setattr(runner, "run_job", lambda job, env: trained.append((job.row, job.seed)) or
                        job_record(job.seed, bleu=float(len(trained)), row=job.row))
    results = runner.run_table(table, demo, {})
    assert sorted(trained) == sorted((r, s) for r in ("none", "l1_6", "l4_6", "l1_3") for s in (1, 2))
    assert [r.eval for r in results["l1"]] == [r.eval for r in results["l1_3"]]
    assert results["l6"][1].same_as == "l4_6" and results["l6"][1].train.seed == 2
    assert results["l4_6"][0].same_as is None


def test_a_row_that_spells_out_defaults_is_the_same_run(tmp_path):
    """Rows are the same run when their run identities are (effective option values), not their spelling: a row
    that spells out fairseq's and the plugin's defaults gets the plain row's runs; a real change does not."""
    table = _table("  - {id: base, label: B, family: transformer}\n"
                   "  - {id: spelled, label: S, family: transformer, args: [--activation-fn, relu]}\n"
                   "  - {id: other, label: O, family: transformer, args: [--activation-fn, gelu]}\n")
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path,
                    data_bin=fake_prepared(tmp_path / "data-bin", "demo"))
    assert [job.rows for job in table_jobs(table, run)] == [("base", "spelled"), ("other",)]


def _settings(monkeypatch, **env):
    for name in ("SCALE", "SEEDS", "GPUS", "THREADS", "JOBS", "TRAIN_ARGS", "GENERATE_ARGS", "DRY_RUN", "MAX_TOKENS",
                 "UPDATE_FREQ", "MAX_UPDATE", "AVERAGE", "PRECISION", "EMBEDDINGS", "NNODES", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "SLURM_NNODES", "SLURM_JOB_ID", "SLURM_NODEID", "CHECKPOINTS",
                 "RESUME_ANYWAY", "ROWS", "SUBSETS", "TRAIN_HOOK", "PROGRESS_INTERVAL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return parse_options(["demo"], os.environ)


@pytest.mark.parametrize("env,message", [
    ({"SCALE": "Paper"}, r"SCALE \(--scale\)='Paper' is not valid: use SCALE=demo or SCALE=paper"),
    ({"SCALE": "full"}, r"SCALE \(--scale\)='full'"),
    ({"SEEDS": "0"}, r"SEEDS \(--seeds\)='0' is not valid: use a count"),
    ({"SEEDS": "1,-2"}, r"SEEDS \(--seeds\)='1,-2'"),
    ({"SEEDS": "1,1"}, r"SEEDS \(--seeds\)='1,1'.*distinct"),
    ({"SEEDS": "three"}, r"SEEDS"),
    ({"GPUS": "-1"}, r"GPUS \(--gpus\)='-1' is not valid: use a non-negative integer"),
    ({"GPUS": "one"}, r"GPUS"),
    ({"THREADS": "0"}, r"THREADS \(--threads\)='0' is not valid: use a positive integer"),
    ({"JOBS": "2.5"}, r"JOBS \(--jobs\)='2.5' is not valid: use a positive integer"),
    ({"TRAIN_ARGS": "--lr '1e-3"}, r"TRAIN_ARGS \(--train-args\)=.* is not valid: use flags quoted"),
    ({"GENERATE_ARGS": '--beam "1'}, r"GENERATE_ARGS \(--generate-args\)=.* is not valid"),
    ({"DRY_RUN": "yes"}, r"DRY_RUN \(--dry-run\)='yes' is not valid: use DRY_RUN=1 to turn it on"),
    ({"PROGRESS_INTERVAL": "-5"},
     r"PROGRESS_INTERVAL \(--progress-interval\)='-5' is not valid: use a finite number >= 0"),
], ids=["scale-case", "scale-name", "seeds-zero", "seeds-negative", "seeds-repeated", "seeds-word", "gpus-negative",
        "gpus-word", "threads-zero", "jobs-float", "train-args-quote", "generate-args-quote", "dry-run-word",
        "progress-interval-negative"])
def test_bad_environment_is_refused(monkeypatch, env, message):
    with pytest.raises(SystemExit, match=message):
        _settings(monkeypatch, **env)


def test_an_unknown_dataset_is_refused_before_any_work(monkeypatch, tmp_path):
    from diverse_fairseq.tables.__main__ import main

    monkeypatch.setenv("DATASET", "wmt14")
    with pytest.raises(SystemExit, match=r"DATASET \(--dataset\)='wmt14' is not valid: use one of demo, "):
        main(["demo", "--data-bin", str(tmp_path / "bin"), "--out", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists() and not (tmp_path / "bin").exists()


def test_good_environment(monkeypatch):
    settings = _settings(monkeypatch, SCALE="paper", SEEDS="3", GPUS="0", THREADS="2", JOBS="4",
                         TRAIN_ARGS="--lr '1e-3'")
    assert settings == replace(settings, table="demo", scale="paper", seeds=[1, 2, 3], gpus=0, threads=2, jobs=4,
                               train_args=["--lr", "1e-3"], generate_args=[], dry_run=False,
                               allow_unverified_data=False, train_options=TrainOptions(), subsets=["test"],
                               train_hook=None, progress_interval=30.0)
    assert _settings(monkeypatch, PROGRESS_INTERVAL="0").progress_interval == 0
    assert _settings(monkeypatch, MAX_UPDATE="7").train_options == TrainOptions(max_update=7)
    assert _settings(monkeypatch, DRY_RUN="1").dry_run
    assert _settings(monkeypatch).seeds == [1] and _settings(monkeypatch).threads == 1
    assert parse_seeds("SEEDS", "5,2") == [5, 2]
    assert default_jobs(1, 0) == 1 and default_jobs(100, 0) == len(os.sched_getaffinity(0))
    assert default_jobs(100, 2) == 1


def test_cli_refuses_a_bad_scale_before_any_work(tmp_path, monkeypatch):
    """The command's main in this process (the SystemExit's message is what Python prints on stderr, exit 1)."""
    from diverse_fairseq.tables.__main__ import main

    monkeypatch.setenv("SCALE", "Paper")
    with pytest.raises(SystemExit) as refused:
        main(["demo", "--out", str(tmp_path / "r"), "--data-bin", str(tmp_path / "d")])
    assert refused.value.code not in (0, None) and "SCALE (--scale)='Paper' is not valid" in str(refused.value.code)
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


# ------------------------------------------------------------------------------------------ end to end
def _run_table(root, table_path, seeds="2", jobs="2"):
    # the fixture's small demo corpus, so that the runner's own data check finds it up to date
    env = dict(demo_text_env(root), PYTHONUNBUFFERED="1", THREADS="1", JOBS=jobs, PROGRESS_INTERVAL="1")
    cmd = [sys.executable, "-m", "diverse_fairseq.tables", str(table_path), "--dataset", "demo", "--scale", "demo",
           "--data-bin", str(root / "data-bin"), "--out", str(root / "results"), "--train-args", TINY,
           "--generate-args", "--beam 2 --max-len-b 5", "--seeds", seeds]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "(ran 0 steps" in proc.stdout + proc.stderr, "the fixture's corpus was prepared again"
    # no library debug chatter (matplotlib's font search in the analysis step, hydra's config loading)
    assert " DEBUG " not in proc.stderr and "DEBUG:" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


def _run_table_here(root, table_path, monkeypatch, capfd, seeds, jobs):
    """:func:`_run_table`'s run through the command's ``main`` in this process (its fairseq-train and -generate are
    still subprocesses): the same environment and arguments, the same checks of its output; the process's
    environment is left as it was. What ``main`` changes in the process (the root logger, torch's threads) is put
    back afterwards."""
    import logging

    import torch

    from diverse_fairseq.tables.__main__ import main

    env = dict(demo_text_env(root), PYTHONUNBUFFERED="1", THREADS="1", JOBS=jobs, PROGRESS_INTERVAL="1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BPE", raising=False)
    root_logger = logging.getLogger()
    handlers, level, threads = list(root_logger.handlers), root_logger.level, torch.get_num_threads()
    capfd.readouterr()
    environ = dict(os.environ)
    try:
        main([str(table_path), "--dataset", "demo", "--scale", "demo", "--data-bin", str(root / "data-bin"),
              "--out", str(root / "results"), "--train-args", TINY, "--generate-args", "--beam 2 --max-len-b 5",
              "--seeds", seeds])
    finally:
        root_logger.handlers[:] = handlers  # setup_cli_logging's basicConfig(force=True) replaced them
        root_logger.setLevel(level)
        torch.set_num_threads(threads)
    assert dict(os.environ) == environ  # read by main, handed to the jobs, never written
    out, err = capfd.readouterr()
    assert "(ran 0 steps" in out + err, "the fixture's corpus was prepared again"
    assert " DEBUG " not in err and "DEBUG:" not in err, err[-2000:]
    return out


@pytest.mark.slow
def test_tiny_table_end_to_end_resume_and_retrain_on_a_changed_row(tiny_table_local, monkeypatch, capfd):
    demo_bin, table_path = tiny_table_local.table.parent, tiny_table_local.table
    out = tiny_table_local.stdout  # 2 rows x 2 seeds, 2 jobs at a time
    assert "4 jobs, 2 at a time, 1 CPU thread(s) each" in out
    for row, label in ((1, "Transformer"), (2, "+ Disagreement")):
        for seed in (1, 2):
            assert f"row {row} of 2 (seed {seed}) {label}: started; elapsed " in out
            assert f"row {row} of 2 (seed {seed}) {label}: finished in " in out
    assert "estimated remaining" in out and "[4/4 jobs done]" in out
    logs = demo_bin / "results" / "demo-demo" / "logs"
    for row, seed in (("base", 1), ("dis", 2)):  # the start line names the job's log
        assert f"; log: {logs / f'{row}-seed{seed}.log'}\n" in out
    # the progress line, read from the run's train.log while the job runs (here: its last update, 3 of 3)
    assert re.search(r"\(seed \d\) [^:]+: update 3/3 \(100%\), train loss \d+\.\d{3}.*; training done", out), out
    runs = demo_bin / "results" / "demo-demo" / "runs"
    record = json.loads((runs / "dis" / "seed2" / "train.json").read_text())
    options = record["key"]["identity"]["options"]
    assert options["--seed"] == 2 and record["threads"] == 1
    # --disagreement-terms out is the criterion's default: not part of the identity
    assert options["--criterion"] == "label_smoothed_cross_entropy_with_disagreement"
    logs = demo_bin / "results" / "demo-demo" / "logs"
    job_log = (logs / "dis-seed2.log").read_text()
    assert "fairseq" in job_log  # the job's own output went to its log: one log format, no library noise
    assert not [noise for noise in HYDRA_NOISE if noise in job_log] and "\r" not in job_log, job_log[-3000:]
    assert not re.search(r"^(DEBUG|INFO|WARNING):|^\S+ \S+,\d{3} \|", job_log, re.M), job_log[-3000:]
    # fairseq-generate's start-up (the evaluation's, as the interactive command's): no hydra deprecation warnings,
    # no DEBUG:hydra lines (the real fairseq-generate runs of the evaluation, their whole log)
    for row in ("base", "dis"):
        for seed in (1, 2):
            text = (runs / row / f"seed{seed}" / "eval" / "generate-test.log").read_text()
            assert "loading model(s) from" in text, text[-2000:]  # it got past the configuration
            assert not [noise for noise in HYDRA_NOISE if noise in text], text[:3000]

    summary = json.loads((demo_bin / "results" / "demo.json").read_text())
    assert [r["id"] for r in summary["rows"]] == ["base", "dis"]
    for row in summary["rows"]:
        for key in ("bleu", "bleu_std", "tok_bleu", "parameters", "train_steps_per_second",
                    "decode_sentences_per_second", "updates", "signature", "output_disagreement"):
            assert row[key] is not None, (row["id"], key)
        assert row["updates"] == 3 and len(row["bleu_per_seed"]) == 2 and row["reused_seeds"] == []
    # equal sizes: the disagreement model adds no parameter
    assert summary["rows"][0]["parameters"] == summary["rows"][1]["parameters"]
    sig = summary["rows"][1]["significance"]
    assert sig["baseline"] == "base" and sig["seeds_total"] == 2 and set(sig["sign_test"]) >= {"p_value", "mark"}

    md = (demo_bin / "results" / "demo.md").read_text()
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table_lines) == 2 + 2  # header, rule, two rows
    header = [c.strip() for c in table_lines[0].strip("|").split("|")]
    for line in table_lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(header) and all(cells), line
    assert "sacrebleu signature: `nrefs:1|" in md and "- **Transformer**: the plain model" in md
    assert (demo_bin / "results" / "demo.png").stat().st_size > 1000

    # A changed row: its runs are moved aside and retrained; the unchanged row is reused, not even decoded.
    table_path.write_text(TABLE.replace("--disagreement-terms, out]", "--disagreement-terms, out, --dropout, '0.2']"))
    # the second invocation through main in this process (the first was the real command line); one job at a time,
    # so the jobs run in the runner's own process: their output is printed
    out = _run_table_here(demo_bin, table_path, monkeypatch, capfd, seeds="1", jobs="1")
    assert f"; training log: {runs / 'dis' / 'seed1' / 'train.log'}\n" in out
    assert out.count("training finished earlier") == 1 and "[base seed 1]" in out
    assert "[dis seed 1] the run in" in out and "changed: --dropout (default) → 0.2" in out
    assert "evaluating" in out and out.count("evaluating") == 1
    assert [p.name for p in (runs / "dis").iterdir() if ".stale-" in p.name][0].startswith("seed1.stale-")
    assert json.loads((runs / "dis" / "seed1" / "train.json").read_text())["args"][-2:] == ["--dropout", "0.2"]
    md = (demo_bin / "results" / "demo.md").read_text()
    assert "Reused from earlier invocations (finished runs made by the same command): Transformer (seed 1" in md

    # Issue 38: a finished row's checkpoint_last.pt deleted, the table runs again and gives the row's result (its
    # record, job.json), training nothing
    bleu = json.loads((demo_bin / "results" / "demo.json").read_text())["rows"][0]["bleu"]
    (runs / "base" / "seed1" / "checkpoint_last.pt").unlink()
    out = _run_table_here(demo_bin, table_path, monkeypatch, capfd, seeds="1", jobs="1")
    assert out.count("and evaluated: reusing its record") == 2 and "Errno" not in out
    assert json.loads((demo_bin / "results" / "demo.json").read_text())["rows"][0]["bleu"] == bleu


def test_a_row_the_two_tests_disagree_on_is_explained(tmp_path):
    """Too short a baseline; a system that adds one word to most of its sentences and ruins a sixth of them:
    most swaps lower the brevity penalty (sign test ‡), corpus BLEU falls (no bootstrap mark). The report says
    so, with the counts and both length ratios."""
    from diverse_fairseq.significance import length_ratio

    refs = _refs(120)
    base = [" ".join(r.split()[: len(r.split()) // 2]) for r in refs]
    system = [" ".join("yy" for _ in b.split()) if i < 20 else b + " zz" for i, b in enumerate(base)]
    results = {"base": [_fake_run(tmp_path, "base", 1, base, refs)], "d": [_fake_run(tmp_path, "d", 1, system, refs)]}
    table = _table("  - {id: base, label: B, family: transformer}\n  - {id: d, label: D, family: transformer}\n")
    summary = report.summarise(table, results, "demo", "demo")
    sig = summary.rows[1].significance
    assert sig["sign_test"]["mark"] == report.DOUBLE_DAGGER and sig["bootstrap"]["mark"] == "" and sig["delta"] < 0
    assert sig["length_ratio"] == {"row": pytest.approx(length_ratio(system, refs)),
                                   "baseline": pytest.approx(length_ratio(base, refs))}
    assert sig["length_ratio"]["baseline"] < sig["length_ratio"]["row"] < 1
    note = next(line for line in report.to_markdown(summary).splitlines() if line.startswith("The two tests disagree"))
    assert "on D." in note and "D: sign test 100 better / 20 worse / 0 ties" in note
    assert f"length ratio (hyp/ref) {length_ratio(system, refs):.3f} against B's {length_ratio(base, refs):.3f}" in note
    # where the tests agree there is no such note
    agree = {"base": results["base"], "d": [_fake_run(tmp_path / "agree", "d", 1, refs, refs)]}
    assert "The two tests disagree" not in report.to_markdown(report.summarise(table, agree, "demo", "demo"))


# ------------------------------------------------------- issue 27: dry runs and caches of changed models
def test_dry_run_prints_every_rows_commands_and_writes_nothing(prepared, monkeypatch, capsys):
    """``DRY_RUN=1 make table-emnlp18_t1``: each job's fairseq-train and evaluation command, exit 0, no folder."""
    from diverse_fairseq.tables.__main__ import main

    for key in ("SEED", "SAVE_DIR", "TRAIN_ARGS", "JOBS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRY_RUN", "1")
    monkeypatch.setenv("SEED", "3")  # train.sh's variable: named, not silently ignored
    out = prepared / "results"
    mine = prepared / "data-bin" / "custom_en_de"  # your own corpus, prepared (the demo would be prepared first)
    mine.mkdir()
    (mine / "prepare.json").write_text((prepared / "data-bin" / "demo" / "prepare.json").read_text())
    with pytest.raises(SystemExit) as done:
        main(["emnlp18_t1", "--dataset", "custom_en_de", "--data-bin", str(prepared / "data-bin"), "--out", str(out),
              "--seeds", "2", "--jobs", "1"])
    assert done.value.code == 0 and not out.exists()
    text = capsys.readouterr().out
    assert "[tables] warning: SEED=3 is not read by the table runner (ignored): use SEEDS" in text
    assert "DRY_RUN=1: the commands of 14 job(s); nothing is run or written" in text
    for row in ("none", "sub", "pos", "out", "sub_pos", "sub_out", "all"):
        for seed in (1, 2):
            run_dir = out / "custom_en_de-demo" / "runs" / row / f"seed{seed}"
            assert f"  {row} seed {seed} (" in text and f"--save-dir {run_dir} " in text
            assert f"diverse_fairseq.evaluate {run_dir}/checkpoint_last.pt" in text
    assert text.count("fairseq_cli.train") == 14 and "FAILED" not in text


def test_dry_run_of_an_unprepared_dataset_says_what_a_run_would_prepare(tmp_path, monkeypatch, capsys):
    from diverse_fairseq.tables.__main__ import main

    monkeypatch.setenv("DRY_RUN", "1")
    with pytest.raises(SystemExit) as done:
        main(["emnlp18_t1", "--dataset", "demo", "--data-bin", str(tmp_path / "data-bin"), "--out",
              str(tmp_path / "results")])
    assert done.value.code == 0 and not (tmp_path / "results").exists() and not (tmp_path / "data-bin").exists()
    assert f"a real run prepares it first (DATA_BIN={tmp_path / 'data-bin'} scripts/prepare_data.sh demo)" in \
        capsys.readouterr().out


def test_evaluation_cache_sees_a_changed_checkpoint(prepared, monkeypatch):
    """A checkpoint changed after its evaluation (the run resumed or retrained in place) is evaluated again;
    the same file in a moved results directory is not."""
    calls = []

    def fake_evaluate(request):
        calls.append(request.checkpoint)
        request.out.mkdir(parents=True, exist_ok=True)
        record = job_record(bleu=float(len(calls)), eval={"out": str(request.out)}).eval
        (request.out / "results.json").write_text(json.dumps(asdict(record)))
        return record

    def bleu(job):
        return steps.evaluation(job, job.evals[0]).bleu

    monkeypatch.setattr(steps, "evaluate", fake_evaluate)
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=prepared / "results",
                    data_bin=prepared / "data-bin")
    row = Row(id="r", label="R", family="transformer")
    job = make_job("t", row, run, 1)
    checkpoint = job.evals[0].checkpoint
    assert checkpoint == job.run_dir / "checkpoint_last.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"model at update 150")
    assert bleu(job) == 1.0
    assert bleu(job) == 1.0 and len(calls) == 1  # cached
    checkpoint.write_bytes(b"model at update 151")
    assert bleu(job) == 2.0 and len(calls) == 2
    moved = prepared / "moved"
    (prepared / "results").rename(moved)
    run.out_dir = moved
    assert bleu(make_job("t", row, run, 1)) == 2.0
    assert len(calls) == 2


def test_a_table_decodes_what_the_table_says_whatever_the_environment(tmp_path, monkeypatch):
    """With scripts/evaluate.sh's variables exported (``SUBSET=valid BEAM=1 LENPEN=2 BATCH_SIZE=3 CPU=0``), a
    table still decodes its own subset (test) with the recipe's beam and length penalty: the same fairseq-generate
    command and results as without them (issue 31). fairseq-generate is replaced by a fake that echoes the
    references; everything between the table and it is the real code."""
    from diverse_fairseq import evaluate

    data = tmp_path / "data-bin" / "demo"
    data.mkdir(parents=True)
    refs = {"test": ["ein test", "noch ein test"], "valid": ["anders"]}
    (data / "prepare.json").write_text(json.dumps({
        "dataset": "demo", "source_lang": "en", "target_lang": "de", "post_process": "subword_nmt", "beam": 4,
        "lenpen": 0.6, "moses_tokenized": False}))
    commands = []

    def fake_generate(cmd, log_file):
        commands.append(cmd)
        subset = cmd[cmd.index("--gen-subset") + 1]
        out = Path(cmd[cmd.index("--results-path") + 1])
        (out / f"generate-{subset}.txt").write_text("".join(
            f"S-{i}\tx\nT-{i}\t{r}\nH-{i}\t-0.1\t{r}\n" for i, r in enumerate(refs[subset])))
        Path(log_file).write_text("")

    monkeypatch.setattr(evaluate, "run_generate", fake_generate)
    monkeypatch.setattr(evaluate, "read_checkpoint", lambda path: {})
    monkeypatch.setattr(evaluate, "check_dataset", lambda *args: None)
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=tmp_path / "results",
                    data_bin=tmp_path / "data-bin")
    row = Row(id="r", label="R", family="transformer")
    job = make_job("t", row, run, 1)
    checkpoint = job.evals[0].checkpoint
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"a model")
    for name, value in dict(SUBSET="valid", BEAM="1", LENPEN="2", BATCH_SIZE="3", CPU="0").items():
        monkeypatch.setenv(name, value)  # the job's machine
    results = steps.evaluation(job, job.evals[0])
    (cmd,) = commands
    assert cmd[cmd.index("--gen-subset") + 1] == "test" and results.subset == "test" and results.sentences == 2
    assert cmd[cmd.index("--beam") + 1] == "4" and cmd[cmd.index("--lenpen") + 1] == "0.6"
    assert cmd[cmd.index("--batch-size") + 1] == "128" and "--cpu" in cmd
    assert (run.eval_dir(row, 1, "test") / "results.json").exists() and not run.eval_dir(row, 1, "valid").exists()


def test_the_table_runner_names_the_decoding_variables_it_ignores():
    from diverse_fairseq.tables.__main__ import foreign_variable_warnings

    warnings = foreign_variable_warnings({"SUBSET": "valid", "BEAM": "1", "PRECISION": "fp16"})
    assert len(warnings) == 2  # PRECISION is the runner's own (training and decoding precision)
    assert warnings[0].startswith("SUBSET=valid is not read by the table runner (ignored): use SUBSETS")
    assert warnings[1].startswith("BEAM=1 is not read by the table runner (ignored): use GENERATE_ARGS='--beam N'")


def test_a_row_launched_through_torchrun_records_its_fairseq_train_arguments(prepared, monkeypatch):
    """NNODES=1 makes training start fairseq through torchrun (the run's plan): the run record keeps
    fairseq-train's own arguments, not a slice of the launcher's command line."""
    started = []

    def fake_fairseq(p, env):  # writes the log a real run's record is read from
        started.append(cmd := p.command)
        save_dir = Path(cmd[cmd.index("--save-dir") + 1])
        (save_dir / "train.log").write_text('{"epoch": 1, "train_loss": "5.5", "train_num_updates": "3"}\n')
        return 0, ""

    monkeypatch.setattr(training, "launch", fake_fairseq)
    run = RunConfig(dataset="demo", scale="demo", seeds=[1], gpus=0, out_dir=prepared / "results",
                    data_bin=prepared / "data-bin", train_options=training.options_from_env({"NNODES": "1"}))
    row = Row(id="r", label="R", family="transformer", args=["--dropout", "0.2"])
    record, reused = steps.train(make_job("t", row, run, 1), {})
    assert not reused
    [cmd] = started
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and cmd[cmd.index("--nnodes") + 1] == "1"
    entry = cmd.index("fairseq_cli.train")
    assert cmd[entry - 1] == "-m" and record.train_args == cmd[entry + 1:]
    assert record.train_args[0] == str(prepared / "data-bin" / "demo")
    assert record.train_args[-6:] == ["--dropout", "0.2", "--log-file", str(run.run_dir(row, 1) / "train.log"),
                                         "--log-format", "json"]
    assert json.loads((run.run_dir(row, 1) / "train.json").read_text())["train_args"] == record.train_args
    assert record.updates == 3 and record.train_loss == 5.5 and record.embeddings == "all"


def test_rows_and_subsets_are_chosen_on_the_command_line(capsys):
    from diverse_fairseq.tables.__main__ import parse_options, select_rows
    from diverse_fairseq.tables.spec import load_table

    def parse_subsets(text):
        return parse_options(["t", "--subsets", text], {}).subsets

    def parse_hook(text):
        return parse_options(["t", "--train-hook", text], {}).train_hook

    table = load_table(str(REPO / "configs" / "experiments" / "repulsive_diagnosis.yaml"))
    chosen = select_rows(table, "drive_only,authors_bw")
    assert [r.id for r in chosen.rows] == ["svgd", "drive_only", "authors_bw"]  # the baseline runs too
    assert "also running svgd, the baseline" in capsys.readouterr().out
    assert select_rows(table, "") is table
    with pytest.raises(SystemExit, match=r"ROWS \(--rows\)='svdg' is not valid: svdg not in table"):
        select_rows(table, "svdg")
    assert parse_subsets("valid,test") == ["valid", "test"] and parse_subsets("valid") == ["valid"]
    with pytest.raises(SystemExit, match=r"SUBSETS \(--subsets\)='dev' is not valid: use valid, test"):
        parse_subsets("dev")
    assert parse_hook(str(REPO / "scripts" / "experiments" / "kernel_probe.py")).endswith("kernel_probe.py")
    with pytest.raises(SystemExit, match=r"TRAIN_HOOK \(--train-hook\)='nope.py' is not valid"):
        parse_hook("nope.py")


def test_paper_dry_run_decodes_each_row_as_its_paper(tmp_path, monkeypatch, capsys):
    """``DRY_RUN=1 make table-journal_t5 SCALE=paper``: the THUMT rows (base, big) validate and evaluate with GNMT's
    length penalty, THUMT's beam search and at most |x| + 50 tokens; EMNLP 2020's fairseq rows keep fairseq's
    --lenpen, fairseq's search and the recipe's 200-token cap."""
    from diverse_fairseq.tables.__main__ import main

    for key in ("SEED", "SEEDS", "SAVE_DIR", "TRAIN_ARGS", "GENERATE_ARGS", "JOBS", "ROWS", "SCALE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRY_RUN", "1")
    data_bin = tmp_path / "data-bin"
    meta = {"source_lang": "en", "target_lang": "de", "joined_dictionary": True, "beam": 4, "lenpen": 0.6,
            "max_len_a": 0.0, "max_len_b": 200, "post_process": "subword_nmt"}
    for dataset in ("wmt14_en_de", "wmt14_en_de_joined"):
        (data_bin / dataset).mkdir(parents=True)
        (data_bin / dataset / "prepare.json").write_text(json.dumps(dict(meta, dataset=dataset)))

    def commands(table, rows):
        with pytest.raises(SystemExit) as done:
            main([table, "--scale", "paper", "--data-bin", str(data_bin), "--out", str(tmp_path / table),
                  "--rows", rows, "--gpus", "0"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        return ([line for line in text.splitlines() if line.strip().startswith("train:")],
                [line for line in text.splitlines() if line.strip().startswith("evaluate:")])

    train, evaluate = commands("journal_t5", "base,big")
    assert len(train) == len(evaluate) == 2
    for line in train:
        assert "--task translation_length_penalty --length-penalty gnmt --beam-search thumt" in line
        assert '"max_len_a": 1.0, "max_len_b": 49' in line and "--max-update 100000" in line
    for line in evaluate:
        assert "--length-penalty gnmt --beam-search thumt --max-len-a 1 --max-len-b 49" in line
    train, evaluate = commands("emnlp20_t2_wmt14", "ma")
    assert "--task translation " in train[0] and "--length-penalty" not in train[0] and "--beam-search" not in train[0]
    assert "--length-penalty fairseq --beam-search fairseq --max-len-a 0 --max-len-b 200" in evaluate[0]


def test_job_records_round_trip_through_json(tmp_path):
    """A per-seed record is typed (issue 31): asdict/from_json give back the same record, nested records
    included; evaluate's results.json is read into its EvalRecord whatever else it holds, and a record without a
    required field is refused by name."""
    from diverse_fairseq.tables.records import EvalRecord, JobRecord, TrainRecord, from_json

    record = replace(job_record(2, bleu=12.5, reused=True, disagreement={"enc_self": {"out": 0.8}},
                                probing={"WC": {"accuracy": 50.0}}, key={"identity": {"options": {"--seed": 2}}}),
                     same_as="base")
    stored = json.loads(json.dumps(asdict(record)))
    assert from_json(JobRecord, stored) == record
    assert isinstance(from_json(JobRecord, stored).eval, EvalRecord) and record.output_disagreement == 0.8
    results = dict(asdict(record.eval), bleu=30.0, tok_bleu=31.0, written_by="a later version")
    evaluation = from_json(EvalRecord, results)
    assert (evaluation.bleu, evaluation.tok_bleu, evaluation.paper_bleu) == (30.0, 31.0, None)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'updates'"):
        from_json(TrainRecord, {k: v for k, v in asdict(record.train).items() if k != "updates"})
