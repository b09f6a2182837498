"""Foundation: the package trains, saves, generates and resumes (that fairseq's own argument parsing imports it
with --user-dir: test_user_workflow's test_user_dir_helper_prints_a_directory_fairseq_imports). fairseq-train and
fairseq-generate run in this process (tests/methods/fairseq_in_process.py, the same arguments); their command lines
run as subprocesses in the workflow's tests (test_user_workflow, test_training_eval, test_run_life)."""

import re
import subprocess

import pytest
import torch
from conftest import USER_DIR, tiny_train_args
from fairseq_in_process import fairseq_generate, fairseq_train


def test_package_imports_and_allowlists_fairseq_globals():
    import argparse

    import diverse_fairseq
    from diverse_fairseq.methods.checkpoint_compat import FAIRSEQ_CHECKPOINT_GLOBALS

    assert diverse_fairseq.__version__
    assert argparse.Namespace in FAIRSEQ_CHECKPOINT_GLOBALS
    assert argparse.Namespace in torch.serialization.get_safe_globals()


def test_weights_only_rejects_unknown_globals(tmp_path):
    """The allowlist is narrow: an arbitrary class stays refused by torch's safe unpickler."""
    import diverse_fairseq  # noqa: F401

    path = tmp_path / "bad.pt"
    torch.save({"x": subprocess.CompletedProcess(args=[], returncode=0)}, path)
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(path)


def _train_losses(stdout_and_err):
    return [float(m) for m in re.findall(r"\| train \| epoch \d+ \| loss ([0-9.]+)", stdout_and_err)]


@pytest.mark.slow
def test_train_save_generate_resume(tiny_data, tmp_path):
    save = tmp_path / "ckpt"
    log = fairseq_train(tiny_train_args(tiny_data, save, max_update=40))
    assert (save / "checkpoint_last.pt").exists()
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+) \| nll_loss", log)]
    assert len(losses) >= 10 and losses[-1] < losses[0] - 0.5, losses

    # The checkpoint loads with torch's default weights_only=True once the plugin is imported.
    import diverse_fairseq  # noqa: F401

    state = torch.load(save / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 40

    gen = fairseq_generate(
        [tiny_data, "--user-dir", USER_DIR, "--cpu", "--path", save / "checkpoint_last.pt",
         "--source-lang", "en", "--target-lang", "de", "--gen-subset", "test",
         "--beam", "2", "--batch-size", "16"],
    )
    hyps = [line for line in gen.splitlines() if line.startswith("H-")]
    assert len(hyps) == 40

    rlog = fairseq_train(tiny_train_args(tiny_data, save, max_update=50))
    assert "Loaded checkpoint" in rlog and "(epoch" in rlog
    assert "num_updates 50" in rlog or re.search(r"num_updates\D+50\b", rlog)
    state = torch.load(save / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 50
