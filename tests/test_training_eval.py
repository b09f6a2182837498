"""Training recipes (command construction, multi-GPU/multi-node arithmetic), checkpoint averaging,
and the end-to-end path demo data → scripts/train.sh → averaged checkpoint → scripts/evaluate.sh."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import demo_text_env, fake_prepared, lines

from diverse_fairseq.average_checkpoints import average_checkpoints, last_n_checkpoints
from diverse_fairseq.evaluate import parse_generate_output, parse_generate_speed
from diverse_fairseq.runs.plan import plan, update_freq
from diverse_fairseq.runs.settings import resolve_setting
from diverse_fairseq.training import request_from_env
from diverse_fairseq.user_dir import USER_DIR

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture
def data_bin(tmp_path):
    return fake_prepared(tmp_path / "data-bin", "wmt14_en_de")


def command_from_env(dataset, setting, extra, env, gpus):
    """(fairseq-train arguments, launcher, plan) of ``scripts/train.sh DATASET SETTING EXTRA`` under ``env``."""
    p = plan(request_from_env(dataset, setting, extra, env=env, gpus=gpus))
    return list(p.args), list(p.launcher), p


def value(args, flag):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_update_freq_keeps_the_papers_batch():
    assert update_freq(8 * 4096, 1, 4096) == 8
    assert update_freq(8 * 4096, 4, 4096) == 2  # the repulsive-attention paper's 4 GPUs
    assert update_freq(8 * 4096, 8, 4096) == 1
    assert update_freq(8 * 4096, 3, 4096) == 3  # rounded up: never a smaller batch than the paper's
    assert update_freq(4096, 16, 4096) == 1


def test_settings_and_architecture_names():
    assert resolve_setting("base")[2] == "transformer_wmt_en_de"
    assert resolve_setting("big")[2] == "transformer_vaswani_wmt_en_de_big"
    assert resolve_setting("diverse_transformer_vaswani_wmt_en_de_big")[:1] == ("big",)
    assert resolve_setting("diverse_transformer_iwslt_de_en")[0] == "small"
    assert resolve_setting("diverse_transformer_wmt_en_de")[2] == "diverse_transformer_wmt_en_de"


def test_command_on_gpus_with_passthrough(data_bin):
    env = {"DATA_BIN": str(data_bin), "CHECKPOINTS": "/ck"}
    args, launcher, info = command_from_env(
        "wmt14_en_de", "big", ["--criterion", "label_smoothed_cross_entropy_with_disagreement", "--lr", "1e-3"],
        env=env, gpus=2)
    assert (launcher == [sys.executable, "-m", "fairseq_cli.train"] and info.update_freq == 4
            and info.tokens_per_update == 8 * 4096)
    assert value(args, "--arch") == ["transformer_vaswani_wmt_en_de_big"] and "--fp16" in args
    # the papers' big setting: dropout 0.1 and lr 5e-4 (journal §4.1.1), single models (no averaging)
    assert value(args, "--dropout") == ["0.1"]
    # the THUMT Transformer of the papers: untied embeddings, pre-norm, every dropout type 0.1, Adam eps 1e-9,
    # the best checkpoint by validation BLEU
    assert "--share-all-embeddings" not in args and "--share-decoder-input-output-embed" not in args
    assert "--encoder-normalize-before" in args and "--decoder-normalize-before" in args
    assert value(args, "--attention-dropout") == ["0.1"] and value(args, "--activation-dropout") == ["0.1"]
    assert value(args, "--adam-eps") == ["1e-09"] and value(args, "--best-checkpoint-metric") == ["bleu"]
    assert "--eval-bleu" in args and "--maximize-best-checkpoint-metric" in args
    assert info.best_checkpoint_metric == "bleu" and info.single_checkpoint.name == "checkpoint_best.pt"
    assert value(args, "--lr") == ["1e-3"] and args[-2:] == ["--lr", "1e-3"]  # an extra option replaces ours, last
    save = value(args, "--save-dir")[0]
    assert "--load-checkpoint-on-all-dp-ranks" in args
    assert re.fullmatch(r"/ck/wmt14_en_de_big-disagreement_out-[0-9a-f]{8}", save)
    assert value(args, "--tensorboard-logdir") == [save + "/tensorboard"] and str(info.save_dir) == save
    assert info.average == 0 and info.update_based
    # averaging stays an option: AVERAGE=N keeps at least the last N checkpoints
    args, _, info = command_from_env("wmt14_en_de", "big", [], env=dict(env, AVERAGE="30"), gpus=2)
    assert info.average == 30 and value(args, "--keep-interval-updates") == ["30"] and value(args, "--lr") == ["0.0005"]


def test_embeddings_choice(data_bin):
    """EMBEDDINGS=shared gives fairseq's standard model on the THUMT settings; a bad value names the choices;
    the EMNLP 2020 settings (fairseq's) share, with Adam's eps 1e-8 and the best checkpoint by validation loss."""
    env = {"DATA_BIN": str(data_bin), "CHECKPOINTS": "/ck"}
    args, _, _ = command_from_env("wmt14_en_de", "base", [], env=dict(env, EMBEDDINGS="shared"), gpus=8)
    assert "--share-all-embeddings" in args  # the fixture's dictionary is joined
    with pytest.raises(SystemExit, match="EMBEDDINGS"):
        command_from_env("wmt14_en_de", "base", [], env=dict(env, EMBEDDINGS="tied"), gpus=8)
    args, _, info = command_from_env("wmt14_en_de", "fairseq_base", [], env=env, gpus=8)
    assert "--share-all-embeddings" in args and "--encoder-normalize-before" not in args and "--eval-bleu" not in args
    assert value(args, "--adam-eps") == ["1e-08"] and value(args, "--warmup-updates") == ["8000"]
    # fairseq's default best metric (loss): nothing to add, and checkpoint_best.pt is evaluated
    assert "--best-checkpoint-metric" not in args and info.best_checkpoint_metric == "loss"
    assert info.single_checkpoint.name == "checkpoint_best.pt"
    args, _, _ = command_from_env("wmt14_en_de", "small", [], env=env, gpus=1)
    assert value(args, "--adam-eps") == ["1e-08"] and "--share-all-embeddings" in args


def test_the_demo_command_is_unchanged(tmp_path):
    """The demo scale's command (its results are cached under its full command) is exactly what it was."""
    data_bin = fake_prepared(tmp_path / "data-bin", "demo")
    args, _, _ = command_from_env("demo", "tiny", [], env={"DATA_BIN": str(data_bin), "SAVE_DIR": "/s"}, gpus=0)
    start = args.index("--arch")
    assert args[start:args.index("--criterion")] == [
        "--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "128",
        "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
        "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--encoder-normalize-before",
        "--decoder-normalize-before", "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
        "--adam-eps", "1e-09", "--clip-norm", "0.0", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "400", "--warmup-init-lr", "1e-07", "--dropout", "0.1", "--weight-decay", "0.0"]
    assert "--eval-bleu" not in args and "--attention-dropout" not in args


def test_run_records_whether_checkpoints_were_averaged(data_bin, monkeypatch):
    from diverse_fairseq import training
    monkeypatch.setattr(training, "visible_gpus", lambda: 8)
    result = training.run_from_env("wmt14_en_de", "base", [], env={"DATA_BIN": str(data_bin), "DRY_RUN": "1"}, gpus=8)
    # the setting's single model (settings.checkpoint_name): the best by validation BLEU for the THUMT base setting
    assert result.averaged == 0 and result.checkpoint.name == "checkpoint_best.pt"


def test_command_multi_node_and_cpu(data_bin):
    env = {"DATA_BIN": str(data_bin), "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "2222"}
    args, launcher, info = command_from_env("wmt14_en_de", "base", [], env=env, gpus=8)
    assert launcher[1:4] == ["-m", "torch.distributed.run", "--nnodes"] and "fairseq_cli.train" in launcher
    assert value(launcher, "--nproc-per-node") == ["8"] and value(launcher, "--master-addr") == ["10.0.0.1"]
    assert value(args, "--distributed-world-size") == ["16"] and info.update_freq == 1 and not info.rank0
    slurm = {"DATA_BIN": str(data_bin), "SLURM_NNODES": "2", "SLURM_JOB_ID": "77", "SLURM_NODEID": "0"}
    args, launcher, info = command_from_env("wmt14_en_de", "base", [], env=slurm, gpus=4)
    assert (launcher == [sys.executable, "-m", "fairseq_cli.train"] and value(args, "--distributed-port") == ["12077"]
            and info.world == 8)
    args, _, info = command_from_env("wmt14_en_de", "base", [], env={"DATA_BIN": str(data_bin)}, gpus=0)
    assert "--cpu" in args and "--fp16" not in args and info.update_freq == 8
    with pytest.raises(SystemExit, match="only PRECISION=fp32"):
        command_from_env("wmt14_en_de", "base", [], env={"DATA_BIN": str(data_bin), "PRECISION": "fp16"}, gpus=0)
    with pytest.raises(SystemExit, match="prepare the data first"):
        command_from_env("iwslt14_de_en", "small", [], env={"DATA_BIN": str(data_bin)}, gpus=0)


def _dry_run(monkeypatch, capsys, data_bin, visible, **env):
    """training.main with DRY_RUN=1 and ``visible`` GPUs; returns (exit status, printed text)."""
    from diverse_fairseq import training

    for key in ("GPUS", "CUDA_VISIBLE_DEVICES", "NNODES", "NODE_RANK", "SLURM_NNODES", "UPDATE_FREQ", "MAX_TOKENS",
                "PRECISION", "SAVE_DIR"):
        monkeypatch.delenv(key, raising=False)
    from diverse_fairseq.runs import plan as run_plan

    monkeypatch.setattr(run_plan, "visible_gpus", lambda: visible)  # GPUS unset: the plan takes every visible GPU
    monkeypatch.setattr(training, "visible_gpus", lambda: visible)  # and training checks GPUS=N against them
    for key, val in dict(env, DATA_BIN=str(data_bin), DRY_RUN="1").items():
        monkeypatch.setenv(key, val)
    status = training.main(["wmt14_en_de", "base"])
    return status, capsys.readouterr().out


def test_gpus_restricts_training_to_the_first_n_visible_devices(data_bin, monkeypatch, capsys):
    status, out = _dry_run(monkeypatch, capsys, data_bin, 4, GPUS="2")
    assert status == 0 and "on 2 GPU(s), 4096 tokens x 2 x update-freq 4 = 32768 tokens" in out
    assert "[train] CUDA_VISIBLE_DEVICES=0,1 " in out and " --update-freq 4 " in out and " --fp16" in out
    # the first N of the devices visible now, when CUDA_VISIBLE_DEVICES already picks some
    status, out = _dry_run(monkeypatch, capsys, data_bin, 3, GPUS="2", CUDA_VISIBLE_DEVICES="5,3,7")
    assert "[train] CUDA_VISIBLE_DEVICES=5,3 " in out and "on 2 GPU(s)" in out
    # GPUS=0: the CPU; GPUS unset: every visible GPU, the environment left alone
    status, out = _dry_run(monkeypatch, capsys, data_bin, 4, GPUS="0")
    assert "[train] CUDA_VISIBLE_DEVICES='' " in out and " --cpu" in out and "on the CPU" in out
    status, out = _dry_run(monkeypatch, capsys, data_bin, 4)
    assert "CUDA_VISIBLE_DEVICES" not in out and "on 4 GPU(s)" in out and " --update-freq 2 " in out
    # multi-node through torchrun: N processes per node, world size N x nodes
    status, out = _dry_run(monkeypatch, capsys, data_bin, 8, GPUS="2", NNODES="2", NODE_RANK="0")
    assert "CUDA_VISIBLE_DEVICES=0,1 " in out and "--nproc-per-node 2 " in out
    command = next(line for line in out.splitlines() if "fairseq_cli.train" in line)
    assert command.rstrip().endswith("--distributed-world-size 4") and "on 4 GPU(s)" in out


@pytest.mark.parametrize("gpus, visible, message", [
    ("3", 2, r"GPUS=3 but only 2 GPU\(s\) are visible \(CUDA_VISIBLE_DEVICES unset\): use GPUS=2 or fewer"),
    ("1", 0, r"GPUS=1 but only 0 GPU\(s\) are visible"),
    ("two", 2, r"GPUS='two' is not valid: use a non-negative integer"),
    ("-1", 2, r"GPUS='-1' is not valid"),
])
def test_bad_gpus_is_an_error_before_training(data_bin, monkeypatch, capsys, gpus, visible, message):
    with pytest.raises(SystemExit, match=message):
        _dry_run(monkeypatch, capsys, data_bin, visible, GPUS=gpus)
    assert "[train]" not in capsys.readouterr().out  # nothing was started or printed as started


def test_table_runs_check_gpus_before_any_work(monkeypatch):
    from diverse_fairseq import training
    from diverse_fairseq.tables.__main__ import default_jobs, parse_options
    from diverse_fairseq.tables.options import check_gpus

    monkeypatch.setattr(training, "visible_gpus", lambda: 1)
    with pytest.raises(SystemExit, match=r"GPUS=2 but only 1 GPU\(s\) are visible"):
        check_gpus(parse_options(["demo", "--gpus", "2"], {}), {})
    check_gpus(parse_options(["demo", "--gpus", "1"], {}), {})
    # GPUS unset means what it means for scripts/train.sh: every GPU visible to the process that trains (was: the CPU)
    assert parse_options(["demo"], {}).gpus is None and default_jobs(8, None) == 1


def test_average_checkpoints_is_the_mean_and_loads_safely(tmp_path):
    for i, scale in enumerate((1.0, 3.0)):
        torch.save({"args": argparse.Namespace(arch="transformer"),
                    "model": {"w": torch.full((2, 2), scale, dtype=torch.float16),
                              "steps": torch.tensor([4 * (i + 1)])}},
                   tmp_path / f"checkpoint_1_{(i + 1) * 100}.pt")
    (tmp_path / "checkpoint_1_50.pt").write_bytes((tmp_path / "checkpoint_1_100.pt").read_bytes())
    files = last_n_checkpoints(str(tmp_path), 2, update_based=True)
    assert [Path(f).name for f in files] == ["checkpoint_1_200.pt", "checkpoint_1_100.pt"]
    state = average_checkpoints(files)
    assert state["model"]["w"].dtype == torch.float32 and torch.equal(state["model"]["w"], torch.full((2, 2), 2.0))
    assert state["model"]["steps"].tolist() == [6] and state["args"].arch == "transformer"


def test_parse_generate_output():
    text = ("S-1\tb\nT-1\tB\nH-1\t-0.5\tbb\nD-1\t-0.5\tbb\nS-0\ta\nT-0\tA\nH-0\t-0.1\t\n"
            "2026-01-01 | INFO | fairseq_cli.generate | Translated 3,003 sentences (86,152 tokens) in 61.5s "
            "(48.82 sentences/s, 1400.62 tokens/s)\n")
    parsed = parse_generate_output(text)
    assert parsed["hyps"] == {0: "", 1: "bb"} and parsed["targets"] == {0: "A", 1: "B"}
    assert parse_generate_speed(text) == {"sentences": 3003, "tokens": 86152, "seconds": 61.5,
                                          "sentences_per_second": 48.82, "tokens_per_second": 1400.62}


TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--max-tokens", "100",
        "--save-interval-updates", "2", "--log-interval", "1", "--num-workers", "0"]


@pytest.mark.slow
def test_demo_train_average_evaluate_end_to_end(demo_text_prepared, tmp_path):
    # data: the session's demo_text preparation (scripts/prepare_data.sh demo with these variables)
    env = dict(demo_text_env(demo_text_prepared), CHECKPOINTS=str(tmp_path / "checkpoints"), MAX_UPDATE="4",
               AVERAGE="2", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for key in ("BPE", "SAVE_DIR", "PRECISION", "UPDATE_FREQ", "MAX_TOKENS", "NNODES", "OUT", "SUBSET"):
        env.pop(key, None)

    def run(*cmd):
        proc = subprocess.run(["bash", *map(str, cmd)], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    out = (demo_text_prepared / "prepare_data.log").read_text()  # the fixture's scripts/prepare_data.sh demo
    assert "step 7/7: binarize" in out
    out = run(REPO / "scripts" / "train.sh", "demo", "tiny", *TINY)
    (save,) = (tmp_path / "checkpoints").glob("demo_tiny-*")  # one directory per variant
    assert "update-freq 1" in out and (save / "checkpoint_1_4.pt").exists() and (save / "tensorboard").is_dir()
    stored = json.loads((save / "train_args.json").read_text())  # the options, checked when the run resumes
    assert stored["identity"]["options"]["--arch"] == "transformer" and save.name.endswith(stored["hash"])
    avg = save / "checkpoint_avg_last2.pt"
    assert "averaging the last 2 checkpoints" in out and avg.exists()
    out = run(REPO / "scripts" / "evaluate.sh", avg, "demo", "--max-len-b", "5")
    result_dir = save / "eval-demo-test-checkpoint_avg_last2"
    results = json.loads((result_dir / "results.json").read_text())
    refs = lines(FIXTURES / "demo_text" / "test.de")
    assert results["sentences"] == len(refs) and results["speed"]["sentences"] == len(refs)
    assert results["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a") and 0 <= results["bleu"] <= 100
    assert results["tok_bleu_kind"] == "tokenized, compound-split" and results["speed"]["sentences_per_second"] > 0
    assert lines(result_dir / "ref.detok.de") == refs
    assert len(lines(result_dir / "hyp.detok.de")) == len(refs)
    assert "BLEU (sacrebleu, detokenized) =" in out and "sentences/s" in out


# ------------------------------------------- issue 30: the THUMT papers' decoding and training length
def test_thumt_settings_train_the_authors_100k_updates_and_big_300k_is_named():
    """The authors' trainer runs train_steps=100000 for every model (Diversify-MHA bin/trainer.py), Big too;
    Vaswani et al.'s 300k stays an option named big_300k, otherwise the big setting."""
    from dataclasses import replace

    from diverse_fairseq.runs.settings import SETTINGS

    assert SETTINGS["base"].max_update == SETTINGS["big"].max_update == 100000
    assert SETTINGS["big_300k"] == replace(SETTINGS["big"], max_update=300000)
    assert resolve_setting("big_300k")[:1] == ("big_300k",)


def test_each_setting_decodes_as_its_paper(data_bin):
    """THUMT settings (base, big): GNMT's penalty and THUMT's beam search through the plugin's task and at most
    |x| + 50 tokens, in the validation BLEU and in the table runner's evaluation; fairseq's settings keep --lenpen,
    fairseq's search and the recipe's cap."""
    from dataclasses import replace

    from diverse_fairseq.runs import settings
    from diverse_fairseq.runs.dataset_meta import load_dataset_meta
    from diverse_fairseq.runs.plan import decoding, task_args

    fake_prepared(data_bin, "wmt14_en_de", beam=4, lenpen=0.6, max_len_a=0.0, max_len_b=200)
    meta = load_dataset_meta(data_bin / "wmt14_en_de")
    env = {"DATA_BIN": str(data_bin), "CHECKPOINTS": "/ck"}
    for setting in ("base", "big", "big_300k"):
        s = settings.SETTINGS[setting]
        assert (s.length_penalty, s.beam_search, s.max_len_a, s.max_len_b) == ("gnmt", "thumt", 1.0, 49)
        args, _, _ = command_from_env("wmt14_en_de", setting, [], env=env, gpus=8)
        assert value(args, "--task") == ["translation_length_penalty"] and value(args, "--length-penalty") == ["gnmt"]
        assert value(args, "--beam-search") == ["thumt"]  # a task option: --eval-bleu decodes with it
        assert json.loads(value(args, "--eval-bleu-args")[0]) == {"beam": 4, "lenpen": 0.6, "max_len_a": 1.0,
                                                                  "max_len_b": 49}
        d = decoding(meta, s)  # what the table runner's evaluation decodes with
        assert (d.length_penalty, d.beam_search, d.max_len_a, d.max_len_b) == ("gnmt", "thumt", 1.0, 49)
    for setting in ("small", "fairseq_base", "fairseq_big", "tiny"):
        s = settings.SETTINGS[setting]
        assert (s.length_penalty, s.beam_search, s.max_len_a, s.max_len_b) == ("fairseq", "fairseq", None, None)
        args, _, _ = command_from_env("wmt14_en_de", setting, [], env=env, gpus=8)
        assert value(args, "--task") == ["translation"] and "--length-penalty" not in args
        assert "--beam-search" not in args
        d = decoding(meta, s)
        assert (d.length_penalty, d.beam_search, d.max_len_a, d.max_len_b) == ("fairseq", "fairseq", 0.0, 200)
    with pytest.raises(ValueError, match="use one of fairseq, gnmt"):
        task_args("wu")
    with pytest.raises(ValueError, match="use one of fairseq, thumt"):
        task_args("gnmt", "greedy")
    assert task_args("fairseq", "thumt") == ["--task", "translation_length_penalty", "--length-penalty", "fairseq",
                                              "--beam-search", "thumt"]
    with pytest.raises(ValueError, match="beam_search='greedy'"):
        replace(settings.SETTINGS["base"], beam_search="greedy")


def test_evaluate_decodes_with_the_chosen_penalty_and_cap(tmp_path):
    """evaluate's fairseq-generate command: GNMT's penalty via --length-penalty gnmt (LENGTH_PENALTY), THUMT's
    search via --beam-search thumt (BEAM_SEARCH), the cap via --max-len-a/-b (MAX_LEN_A/B); by default fairseq's
    penalty and search and the recipe's cap."""
    from diverse_fairseq import evaluate
    from diverse_fairseq.runs.dataset_meta import meta_from_dict

    meta = meta_from_dict({"source_lang": "en", "target_lang": "de", "beam": 4, "lenpen": 0.6, "max_len_a": 0,
                           "max_len_b": 200, "post_process": "subword_nmt"})

    def command(argv, env=None):
        return evaluate.generate_command(evaluate.parse_request(["c.pt", "d", *argv], env or {}), meta, tmp_path,
                                         on_gpu=False)

    cmd = command(["--length-penalty", "gnmt", "--max-len-a", "1", "--max-len-b", "49"])
    assert value(cmd, "--task") == ["translation_length_penalty"] and value(cmd, "--length-penalty") == ["gnmt"]
    assert value(cmd, "--lenpen") == ["0.6"] and value(cmd, "--max-len-a") == ["1"]
    assert value(cmd, "--max-len-b") == ["49"] and "--beam-search" not in cmd
    cmd = command(["--length-penalty", "gnmt", "--beam-search", "thumt"])
    assert value(cmd, "--length-penalty") == ["gnmt"] and value(cmd, "--beam-search") == ["thumt"]
    cmd = command([])
    assert value(cmd, "--task") == ["translation"] and "--length-penalty" not in cmd and "--beam-search" not in cmd
    assert value(cmd, "--max-len-a") == ["0"] and value(cmd, "--max-len-b") == ["200"]
    assert value(command([], {"LENGTH_PENALTY": "gnmt"}), "--length-penalty") == ["gnmt"]
    with pytest.raises(SystemExit, match="LENGTH_PENALTY"):
        command([], {"LENGTH_PENALTY": "wu"})
    assert value(command([], {"LENGTH_PENALTY": "gnmt", "BEAM_SEARCH": "thumt"}), "--beam-search") == ["thumt"]
    with pytest.raises(SystemExit, match="BEAM_SEARCH"):
        command([], {"BEAM_SEARCH": "greedy"})


def test_interactive_command_decodes_as_the_checkpoint_was_validated(tmp_path):
    """A THUMT-setting checkpoint (validated with GNMT's penalty, THUMT's search and |x| + 50 tokens) gets the same
    decoding in the printed fairseq-interactive command; a plain translation checkpoint keeps fairseq's and the
    recipe's."""
    from diverse_fairseq.interactive_command import build_command, stored_decoding
    from diverse_fairseq.runs.dataset_meta import meta_from_dict

    meta = meta_from_dict({"source_lang": "en", "target_lang": "de", "bpe": "sentencepiece",
                           "bpe_models": {"en": "spm.model"}, "beam": 4, "lenpen": 0.6, "max_len_a": 0,
                           "max_len_b": 200})
    thumt = {"cfg": {"task": {"_name": "translation_length_penalty", "length_penalty": "gnmt", "beam_search": "thumt",
                              "eval_bleu": True,
                              "eval_bleu_args": '{"beam": 4, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 49}'}}}
    cmd = build_command("c.pt", tmp_path, meta, stored_decoding(thumt))
    assert value(cmd, "--task") == ["translation_length_penalty"] and value(cmd, "--length-penalty") == ["gnmt"]
    assert value(cmd, "--beam-search") == ["thumt"]
    gnmt_only = {"cfg": {"task": {"_name": "translation_length_penalty", "length_penalty": "gnmt"}}}  # before it
    assert "--beam-search" not in build_command("c.pt", tmp_path, meta, stored_decoding(gnmt_only))
    assert value(cmd, "--lenpen") == ["0.6"] and value(cmd, "--max-len-a") == ["1.0"]
    assert value(cmd, "--max-len-b") == ["49"]
    plain = {"cfg": {"task": {"_name": "translation", "eval_bleu": False}}}
    cmd = build_command("c.pt", tmp_path, meta, stored_decoding(plain))
    assert value(cmd, "--task") == ["translation"] and "--length-penalty" not in cmd and "--beam-search" not in cmd
    assert value(cmd, "--max-len-a") == ["0"] and value(cmd, "--max-len-b") == ["200"]


def test_a_failed_generation_names_its_log_and_fairseqs_error(tmp_path, capsys):
    """evaluate's fairseq-generate, run in the evaluating process (evaluate.run_generate): a wrong option (its parser's
    exit) and a failure of fairseq's (here an empty data folder) each end in one error that names the log, which holds
    the traceback; the process's logging is left as it was."""
    import logging

    from diverse_fairseq import evaluate

    data = tmp_path / "data"
    data.mkdir()
    cmd = [sys.executable, "-m", "fairseq_cli.generate", str(data), "--path", str(tmp_path / "missing.pt"), "--cpu",
           "--user-dir", USER_DIR, "--results-path", str(tmp_path / "out")]
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    log = tmp_path / "generate-test.log"
    with pytest.raises(SystemExit, match=rf"fairseq-generate failed \(exit 2\): its options are wrong .*{log}$"):
        evaluate.run_generate(cmd + ["--no-such-option"], log)
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    failed = rf"^error: fairseq-generate failed: Exception: Could not infer language pair.*; its log is {log}$"
    with pytest.raises(SystemExit, match=failed):
        evaluate.run_generate(cmd, log)
    assert "Traceback (most recent call last)" in log.read_text()
    assert root.handlers == handlers and root.level == level
