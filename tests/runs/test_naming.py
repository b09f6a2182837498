"""Readable variants (diverse_fairseq/runs/naming.py): the default save directory carries the run's methods before
the hash of its identity, read from the final fairseq-train arguments (or the ``NAME`` the user gives), and
train_args.json records the setting and methods that ``make significance`` labels a system by."""

import json
import re
from dataclasses import replace

import pytest
from conftest import fake_prepared

from diverse_fairseq import training
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.runs.settings import SETTINGS
from diverse_fairseq.tables.spec import load_table
from diverse_fairseq.training import request_from_env

ENV_KEYS = ("NAME", "SAVE_DIR", "MAX_UPDATE", "DRY_RUN", "GPUS", "SEED")


@pytest.fixture
def env(tmp_path):
    fake_prepared(tmp_path / "data-bin", "demo")
    return {"DATA_BIN": str(tmp_path / "data-bin"), "CHECKPOINTS": str(tmp_path / "ck")}


def plan_of(env, extra, **more):
    return plan(request_from_env("demo", "tiny", extra, env=dict(env, **more), gpus=0))


def test_the_save_directory_names_the_methods_of_each_demo_row(env):
    """``make demo``'s rows trained by scripts/train.sh: each directory says which methods it holds; the hash still
    tells variants of one method apart."""
    table = load_table("demo")
    names = {row.id: plan_of(env, ["--arch", row.arch(SETTINGS["tiny"].arch), *row.args]).save_dir.name
             for row in table.rows}
    expected = {"baseline": "", "disagreement": "disagreement_out-", "aggregation": "routing_em-",
                "repulsive": "repulsive_svgd-", "all_three": "disagreement_out+routing_em+repulsive_svgd-"}
    for row, label in expected.items():
        assert re.fullmatch(rf"demo_tiny-{re.escape(label)}[0-9a-f]{{8}}", names[row]), (row, names[row])
    # the effective values: the terms in their canonical order, an architecture's routing, another update rule
    disagreement = ["--arch", "diverse_transformer", "--criterion", "label_smoothed_cross_entropy_with_disagreement"]
    assert "-disagreement_sub_pos-" in plan_of(env, disagreement + ["--disagreement-terms", "pos,sub"]).save_dir.name
    assert "-routing_em-" in plan_of(env, ["--arch", "routing_transformer_wmt_en_de"]).save_dir.name
    assert "-routing_simple-" in plan_of(env, ["--arch", "diverse_transformer", "--routing-decoder-layers", "0",
                                               "--routing-type", "simple"]).save_dir.name
    spos = plan_of(env, ["--optimizer", "repulsive_adam", "--repulsive-method", "spos"])
    assert "-repulsive_spos-" in spos.save_dir.name
    lam = plan_of(env, disagreement + ["--disagreement-lambda", "0.5"]).save_dir.name
    assert lam.startswith("demo_tiny-disagreement_out-") and lam != names["disagreement"]


def test_name_replaces_the_methods_and_keeps_the_hash(env):
    unnamed, named = plan_of(env, []), plan_of(env, [], NAME="lr-sweep.1")
    assert named.save_dir.name == "demo_tiny-lr-sweep.1-" + unnamed.save_dir.name.rsplit("-", 1)[1]
    assert named.identity == unnamed.identity  # a name is not part of what the run is
    with pytest.raises(SystemExit, match=r"NAME='my run' is not valid: use letters, digits"):
        plan_of(env, [], NAME="my run")


def test_a_run_trained_under_the_earlier_name_is_found_again(env, tmp_path):
    """A run of a method that an earlier version saved as ``demo_tiny-<hash>`` is resumed there, not retrained."""
    variant = plan_of(env, ["--optimizer", "repulsive_adam"])
    earlier = variant.save_dir.with_name("demo_tiny-" + variant.save_dir.name.rsplit("-", 1)[1])
    earlier.mkdir(parents=True)
    assert plan_of(env, ["--optimizer", "repulsive_adam"]).save_dir == earlier
    variant.save_dir.mkdir()  # once both exist, the named one is the run's
    assert plan_of(env, ["--optimizer", "repulsive_adam"]).save_dir == variant.save_dir


def test_train_args_json_records_the_setting_and_the_methods(env, tmp_path, capsys):
    """What training writes beside its checkpoints (fairseq-train replaced by a script that does nothing)."""
    script = tmp_path / "no_training.py"
    script.write_text("")
    request = request_from_env("demo", "tiny", ["--arch", "diverse_transformer", "--routing-encoder-layers", "0"],
                               env=env, gpus=0)
    result = training.train(replace(request, entry=str(script)), {})
    stored = json.loads((result.plan.save_dir / "train_args.json").read_text())
    assert (stored["setting"], stored["method"]) == ("tiny", "routing_em")
    assert result.plan.save_dir.name.startswith("demo_tiny-routing_em-") and "new run in" in capsys.readouterr().out
