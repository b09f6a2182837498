"""End-to-end fairseq runs with --criterion label_smoothed_cross_entropy_with_disagreement (tiny CPU model)."""

import math
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, USER_DIR, tiny_train_args
from fairseq_in_process import FairseqFailed, fairseq_train

pytestmark = pytest.mark.slow

CRITERION = ["--criterion", "label_smoothed_cross_entropy_with_disagreement"]
SIM_KEYS = ("sim_out_enc_self", "sim_out_dec_self", "sim_out_enc_dec")
UPDATES = 12


def parse_log(text, kind="train_inner"):
    """Metric dicts of fairseq's 'simple' log lines of one kind (train_inner, train, valid)."""
    rows = []
    for line in text.splitlines():
        if f"| {kind} |" not in line:
            continue
        body = line.split(f"| {kind} |", 1)[1]
        pairs = re.findall(r"([a-z_]+)[= ](-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?|nan|inf)\b", body)
        if pairs:
            rows.append({k: float(v) for k, v in pairs})
    return rows


def train(data, save_dir, lam, extra=(), max_update=UPDATES):
    args = tiny_train_args(
        data, save_dir, arch="diverse_transformer", max_update=max_update,
        extra=[*CRITERION, "--disagreement-lambda", str(lam), "--no-save", *extra],
    )
    return fairseq_train(args)


@pytest.fixture(scope="module")
def single_runs(tiny_data, tmp_path_factory):
    """λ = 1 and λ = 0, one process, --update-freq 2."""
    out = {}
    for lam in (1.0, 0.0):
        out[lam] = train(tiny_data, tmp_path_factory.mktemp(f"single{lam}"), lam, extra=["--update-freq", "2"])
    return out


def test_regularized_run_lowers_logged_output_similarity(single_runs):
    reg, base = parse_log(single_runs[1.0]), parse_log(single_runs[0.0])
    assert len(reg) == len(base) == UPDATES
    for key in SIM_KEYS:
        assert all(key in row for row in reg + base), key
        assert reg[0][key] == pytest.approx(base[0][key], abs=2e-4)  # same start, same first batches
        assert reg[-1][key] < 0.5 * base[-1][key], (key, reg[-1][key], base[-1][key])
    assert reg[-1]["sim_total"] < 0.5 * base[-1]["sim_total"]
    # logged for validation too
    for text in single_runs.values():
        valid = parse_log(text, "valid")
        assert valid and all(key in valid[-1] for key in SIM_KEYS)
    assert (parse_log(single_runs[1.0], "valid")[-1]["sim_out_enc_self"]
            < parse_log(single_runs[0.0], "valid")[-1]["sim_out_enc_self"])


# Two gloo ranks against one process with --update-freq 2 (the disagreement criterion's logged loss, gradient norm
# and similarities per update): test_routing_model.py's two-process test, with all three methods in one run.


@pytest.mark.parametrize("precision", [["--memory-efficient-fp16"], ["--amp"]])
def test_precision_modes(tiny_data, tmp_path, precision):
    text = train(tiny_data, tmp_path, 1.0, extra=[*precision, "--disagreement-terms", "sub,pos,out"], max_update=4)
    rows = parse_log(text)
    assert len(rows) >= 3
    for row in rows:
        for key in ("sim_total", "sim_sub_enc_self", "sim_pos_dec_self", "sim_out_enc_dec"):
            assert math.isfinite(row[key]), (key, row)


def test_hydra_train_with_the_paper_config(tiny_data, tmp_path):
    overrides = [
        f"task.data={tiny_data}", "task.source_lang=en", "task.target_lang=de", f"common.user_dir={USER_DIR}",
        "common.cpu=true", "common.log_interval=1", "optimization.max_update=3", "checkpoint.no_save=true",
        f"checkpoint.save_dir={tmp_path / 'ckpt'}", "dataset.max_tokens=1000", "dataset.num_workers=0",
        "+model.encoder_layers=2", "+model.decoder_layers=2", "+model.encoder_embed_dim=32",
        "+model.decoder_embed_dim=32", "+model.encoder_ffn_embed_dim=64", "+model.decoder_ffn_embed_dim=64",
        "model.dropout=0.0",
    ]
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", str(REPO / "configs" / "disagreement"),
           "--config-name", "iwslt14_de_en_small", *overrides]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "diverse_transformer_iwslt_de_en" in text or "DiverseTransformerModel" in text
    rows = [r for r in parse_log(text.replace("[train_inner][INFO] -", "| train_inner |"))]
    assert len(rows) >= 3 and all(key in rows[-1] for key in SIM_KEYS)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--disagreement-lambda", "-0.5"], "--disagreement-lambda must be a finite number >= 0"),
        (["--checkpoint-activations"], "cannot be used with --checkpoint-activations"),
    ],
)
def test_start_up_errors(tiny_data, tmp_path, extra, message):
    args = tiny_train_args(tiny_data, tmp_path, arch="diverse_transformer", max_update=2,
                           extra=[*CRITERION, "--no-save", *extra])
    with pytest.raises(FairseqFailed) as failed:
        fairseq_train(args)
    assert message in failed.value.text
    assert "| train_inner |" not in failed.value.text  # refused before any update
