"""The hydra configs in configs/ give the same fairseq options as diverse_fairseq.training, the one source
of the papers' hyper-parameters.

For every ``configs/<method>/<dataset>_*.yaml``:

* its keys become fairseq-train flags (``section.key: value`` → ``--key value``; ``_name`` → ``--task``,
  ``--arch``, ``--criterion``, ``--optimizer``, ``--lr-scheduler``; lists → comma lists; ``true`` → a switch);
* :func:`diverse_fairseq.runs.plan.plan` builds the command of the same dataset and architecture, with
  only the config's method options (criterion name, ``disagreement_*``, ``routing_*``, ``repulsive_*``) as
  extra flags, for the GPUs the config is written for (8 × 4096 tokens for base/big, one GPU for small) in fp32
  (the configs say to add ``common.fp16=true`` on GPUs);
* both flag lists go through fairseq-train's own parser (``parse_args_and_arch``: architecture defaults
  applied) and must agree on every option except the run's paths.
"""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from diverse_fairseq.data.recipes import RECIPES
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.runs.settings import resolve_setting
from diverse_fairseq.training import request_from_env
from diverse_fairseq.user_dir import USER_DIR

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for d in ("disagreement", "routing", "repulsive") for p in (REPO / "configs" / d).glob("*.yaml"))
NAME_FLAGS = {"task": "--task", "model": "--arch", "criterion": "--criterion", "optimizer": "--optimizer",
              "lr_scheduler": "--lr-scheduler"}
METHOD_PREFIXES = ("disagreement_", "routing_", "repulsive_")
# where a run writes, and the resume flag the plan adds for several GPUs: not hyper-parameters
RUN_SPECIFIC = {"data", "save_dir", "tensorboard_logdir", "user_dir", "load_checkpoint_on_all_dp_ranks"}


def hydra_flags(cfg: dict):
    """(the data directory, fairseq-train flags) that a hydra config sets."""
    data, flags = None, []
    for section, values in cfg.items():
        if section == "hydra":
            continue
        for key, value in values.items():
            if key == "_name":
                flags += [NAME_FLAGS[section], value]
            elif key == "data":
                data = value
            elif key == "user_dir":
                flags += ["--user-dir", USER_DIR]
            elif value is True:
                flags.append("--" + key.replace("_", "-"))
            elif value not in (False, None):
                text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
                flags += ["--" + key.replace("_", "-"), text]
    return data, flags


def method_flags(cfg: dict):
    """The config's method options (what a table row would pass on top of the setting)."""
    flags = ["--criterion", cfg["criterion"]["_name"]]
    if cfg["optimizer"]["_name"] != "adam":
        flags += ["--optimizer", cfg["optimizer"]["_name"]]
    for section in ("model", "criterion", "optimizer"):
        for key, value in cfg[section].items():
            if key.startswith(METHOD_PREFIXES):
                flags += ["--" + key.replace("_", "-"),
                          ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return flags


def dataset_of(path: Path) -> str:
    names = [name for name in RECIPES if path.stem.startswith(name + "_")]
    assert names, f"{path.name}: the file name must start with a dataset name ({', '.join(RECIPES)})"
    return max(names, key=len)


def parse(flags):
    from fairseq import options

    return vars(options.parse_args_and_arch(options.get_training_parser(), flags))


def differences(cfg: dict, path: Path, tmp_path: Path):
    """``{option: (hydra config's value, training.py's value)}`` for every option on which they disagree."""
    dataset = dataset_of(path)
    recipe = RECIPES[dataset]
    data_bin = tmp_path / "data-bin"
    (data_bin / dataset).mkdir(parents=True, exist_ok=True)
    (data_bin / dataset / "prepare.json").write_text(json.dumps(
        {"source_lang": recipe.src, "target_lang": recipe.tgt, "joined_dictionary": recipe.joined_dictionary,
         "beam": recipe.beam, "lenpen": recipe.lenpen, "max_len_a": recipe.max_len_a, "max_len_b": recipe.max_len_b,
         "post_process": "subword_nmt", "moses_tokenized": True}))
    arch = cfg["model"]["_name"]
    setting = resolve_setting(arch)[1]
    gpus = setting.batch_tokens // setting.max_tokens  # the GPUs the papers' batch is made of
    args = list(plan(request_from_env(dataset, arch, method_flags(cfg), gpus=gpus,
                                      env={"DATA_BIN": str(data_bin), "PRECISION": "fp32"})).args)
    data, flags = hydra_flags(cfg)
    assert data == "???", f"{path.name}: task.data must be left to the command line"
    from_hydra, from_training = parse([args[0], *flags]), parse(args)
    return {k: (from_hydra.get(k), from_training.get(k)) for k in sorted(set(from_hydra) | set(from_training))
            if k not in RUN_SPECIFIC and from_hydra.get(k) != from_training.get(k)}


def test_the_configs_exist():
    names = {f"{p.parent.name}/{p.stem}" for p in CONFIGS}
    assert {"disagreement/iwslt14_de_en_small", "disagreement/wmt14_en_de_big", "routing/wmt14_en_de_base"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.name}/{p.stem}" for p in CONFIGS])
def test_hydra_config_matches_training_settings(path, tmp_path):
    cfg = OmegaConf.to_container(OmegaConf.load(path))
    diff = differences(cfg, path, tmp_path)
    assert not diff, f"{path.relative_to(REPO)} and diverse_fairseq/training.py disagree (hydra, training.py): " + \
        "; ".join(f"{k}: {a!r} vs {b!r}" for k, a, b in ((k, *v) for k, v in diff.items()))


@pytest.mark.parametrize("section,key,value,option", [
    ("optimization", "lr", [0.0007], "lr"),
    ("model", "dropout", 0.3, "dropout"),
    ("optimization", "max_update", 300000, "max_update"),
    ("task", "length_penalty", "fairseq", "length_penalty"),
    ("task", "beam_search", "fairseq", "beam_search"),
    ("optimizer", "adam_eps", 1e-8, "adam_eps"),
])
def test_a_changed_value_is_reported(section, key, value, option, tmp_path):
    """The comparison is not vacuous: the big config with the values it had before (lr 7e-4, dropout 0.3,
    300k updates, fairseq's length penalty and search, Adam's default eps) is caught."""
    path = REPO / "configs" / "disagreement" / "wmt14_en_de_big.yaml"
    cfg = OmegaConf.to_container(OmegaConf.load(path))
    cfg[section][key] = value
    assert option in differences(cfg, path, tmp_path)
