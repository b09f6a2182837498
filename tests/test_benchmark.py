"""scripts/benchmark.py runs every kind of case (translation training, decoding, language model, RoBERTa) at a tiny
size, each against its own stock-fairseq baseline, and ends with the JSON line `make bench` documents.

One run goes through the command line (``python scripts/benchmark.py``); the others call its ``main(argv)`` in the
test's process (each new Python process would first spend some 6 s importing torch and fairseq)."""

import gc
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = ["--steps", "2", "--warmup", "1", "--tokens", "96", "--batches", "2", "--vocab", "64",
        "--decode-len", "3", "--decode-tokens", "30", "--lm-length", "16", "--roberta-length", "16",
        "--model-args", "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
                        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64",
        "--lm-model-args", "--decoder-layers 2 --decoder-embed-dim 32 --decoder-input-dim 32 "
                           "--decoder-output-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 4",
        "--roberta-model-args", "--encoder-layers 2 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 "
                                "--encoder-attention-heads 4"]


def bench(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark.py"), *TINY, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.fixture
def script(monkeypatch):
    """scripts/benchmark.py as a module (``benchlib`` importable as when it runs as a script)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("benchmark_script", REPO / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench_here(script, capsys):
    """``bench_here(*args)`` → (exit status, stdout, stderr) of ``script.main`` with the tiny sizes, in this
    process; the torch thread count that it sets (one, for its CPU clock) is restored afterwards. The objects this
    process held before (pytest's, the imported modules') are frozen for the run (``gc.freeze``): the
    ``gc.collect()`` that frees each case then walks what the run made, not the whole test process each time."""
    def run(*args):
        threads, status = torch.get_num_threads(), 0
        gc.freeze()
        try:
            script.main([*TINY, *args])
        except SystemExit as e:
            status = e.code
        finally:
            gc.unfreeze()
            torch.set_num_threads(threads)
        out, err = capsys.readouterr()
        return status, out, err
    return run


def test_every_kind_of_case_against_its_own_baseline():
    """Through the command line, with ``--large``: the cases that ``--only`` names run, and no other large one."""
    keys = ["disagreement_out_all", "repulsive_sgld_all", "routing_em_enc2_decode",
            "lm_disagreement_out_all", "lm_repulsive_svgd_all", "lm_routing_em_dec2_train",
            "roberta_disagreement_out_all", "roberta_repulsive_svgd_all", "roberta_routing_em_enc2_train"]
    run = bench("--only", ",".join(keys), "--large")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    memory_keys = ["disagreement_out_all", "lm_disagreement_out_all", "lm_routing_em_dec2_train",  # report_memory
                   "roberta_disagreement_out_all", "roberta_routing_em_enc2_train"]
    assert sorted(result) == sorted(keys + [f"{k}_peak_mem" for k in memory_keys])
    assert all(math.isfinite(v) and v > 0 for v in result.values())
    # one row per case and per baseline, the baselines first, each baseline described once
    table = [line.split()[0]
             for line in lines[lines.index(next(row for row in lines if row.startswith("case"))) + 1:-1]]
    assert table == ["baseline", "baseline_lm", "baseline_roberta", "baseline_decode", *keys]
    assert any("baseline_lm: stock transformer_lm" in line for line in lines)
    assert any("baseline_roberta: stock roberta" in line and "(roberta)" in line for line in lines)
    # the stock models and the repulsive ones hold the same tensors (SVGD keeps no state beyond Adam's)
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in table}
    assert rows["lm_repulsive_svgd_all"][3] == rows["baseline_lm"][3]
    assert rows["roberta_repulsive_svgd_all"][3] == rows["baseline_roberta"][3]


def test_only_the_baselines_that_cases_need_are_timed_and_unknown_cases_are_refused(bench_here):
    status, out, err = bench_here("--only", "lm_repulsive_svgd_all", "--no-memory")
    assert status == 0, err[-3000:]
    assert "baseline:" not in out and "baseline_lm:" in out
    assert list(json.loads(out.strip().splitlines()[-1])) == ["lm_repulsive_svgd_all"]
    status, out, err = bench_here("--only", "lm_nothing")
    assert status == 2 and "unknown case(s) lm_nothing" in err and "lm_routing_em_dec2_train" in err


def test_the_default_run_leaves_out_the_roberta_base_cases_and_prints_its_peak_memory(script, bench_here):
    """(With ``--large``, the cases that ``--only`` names run: test_every_kind_of_case_against_its_own_baseline.)"""
    status, out, err = bench_here("--no-memory", "--steps", "1")
    assert status == 0, err[-3000:]
    lines = out.strip().splitlines()
    result = json.loads(lines[-1])
    from_cases = list(script.CASES)  # benchlib.cases.CASES
    assert sorted(result) == sorted(k for k in from_cases if not k.startswith(("roberta_", "routing_em_all_train")))
    assert "baseline_roberta:" not in out
    peak = next(line for line in lines if line.startswith("peak resident memory (RSS) of this run: "))
    assert int(peak.split(": ")[1].split()[0]) > 100 and "run with --large" in peak
