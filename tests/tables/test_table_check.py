"""Every table row builds and trains at demo scale (``make check-tables``'s demo half), and the layer rule
that maps the tables' paper-scale layer selections to the demo model (diverse_fairseq/tables/scale.py).

The paper-scale half of ``make check-tables`` builds Transformer-Big models and is not run here.
"""

import dataclasses
import json
import time

import pytest
import yaml

from diverse_fairseq.methods.thumt_search import ThumtSequenceGenerator
from diverse_fairseq.runs.plan import plan
from diverse_fairseq.runs.settings import SETTINGS
from diverse_fairseq.tables import check, scale, steps
from diverse_fairseq.tables.config import RunConfig
from diverse_fairseq.tables.job import make_job
from diverse_fairseq.tables.spec import TABLE_DIR, load_table
from diverse_fairseq.training import request_from_env
from diverse_fairseq.user_dir import USER_DIR

TABLES = [load_table(p) for p in sorted(TABLE_DIR.glob("*.yaml"))]


# ------------------------------------------------------------------------------------- the layer rule
@pytest.mark.parametrize("value,expected", [
    ("0", "0"), ("1", "0"), ("2", "0"), ("3", "1"), ("4", "1"), ("5", "1"), ("-1", "1"), ("-6", "0"),
    ("0,1,2", "0"), ("3,4,5", "1"), ("0,1", "0"), ("0,5", "0,1"), ("all", "all"), ("none", "none"),
])
def test_paper_layers_map_to_the_two_demo_layers(value, expected):
    """NAACL 2019 Table 3's rows on the 2-layer demo model: paper layers 1-3 → demo layer 0, 4-6 → layer 1."""
    assert scale.map_layers(value, 6, 2) == expected


@pytest.mark.parametrize("small", [1, 2, 3, 4, 6])
def test_the_rule_keeps_order_and_reaches_every_small_layer(small):
    images = [int(scale.map_layers(str(i), 6, small)) for i in range(6)]
    assert images == sorted(images) and set(images) == set(range(small))  # monotone, nothing unreachable
    assert images[0] == 0 and images[-1] == small - 1  # bottom to bottom, top to top
    if small == 6:
        assert images == list(range(6))


@pytest.mark.parametrize("value", ["6", "-7", "0,6"])
def test_an_index_outside_the_paper_model_is_an_error(value):
    with pytest.raises(ValueError, match="outside the paper's 6-layer stack"):
        scale.map_layers(value, 6, 2, "--routing-encoder-layers")


def test_row_args_map_every_layer_flag_and_nothing_else():
    args = ["--routing-encoder-layers", "3,4,5", "--routing-decoder-layers", "all", "--routing-iterations", "3",
            "--routing-encoder-decoder-layers=5", "--repulsive-layers", "-1", "--disagreement-layers", "0,1,2",
            "--encoder-attention-heads", "8"]
    assert scale.row_args(args, "tiny") == [
        "--routing-encoder-layers", "1", "--routing-decoder-layers", "all", "--routing-iterations", "3",
        "--routing-encoder-decoder-layers=1", "--repulsive-layers", "1", "--disagreement-layers", "0",
        "--encoder-attention-heads", "8"]
    assert scale.changes(args, scale.row_args(args, "tiny")) == [
        "--routing-encoder-layers 3,4,5→1", "--routing-encoder-decoder-layers=5→--routing-encoder-decoder-layers=1",
        "--repulsive-layers -1→1", "--disagreement-layers 0,1,2→0"]
    for setting in ("small", "base", "big"):  # the paper's depth: unchanged
        assert SETTINGS[setting].layers == scale.PAPER_LAYERS
        assert scale.row_args(args, setting) == args


def test_layer_flags_are_every_layer_option_of_the_plugin():
    """A new option that selects layers must be added to scale.LAYER_FLAGS, or the demo would ignore the rule."""
    from fairseq import options

    def layer_options(arch, criterion, optimizer):
        parser = options.get_training_parser()
        options.parse_args_and_arch(parser, ["data-dummy", "--user-dir", USER_DIR, "--task", "translation",
                                             "--arch", arch, "--criterion", criterion, "--optimizer", optimizer])
        return {o for o in parser._option_string_actions if o.endswith("-layers")}

    stock = layer_options("transformer", "label_smoothed_cross_entropy", "adam")
    ours = layer_options("diverse_transformer", "label_smoothed_cross_entropy_with_disagreement", "repulsive_adam")
    assert ours - stock == set(scale.LAYER_FLAGS)


# ------------------------------------------------------------------- the runner builds the same command
class _Captured(Exception):
    pass


@pytest.mark.parametrize("table,row_id,scale_name", [("naacl19_t3", "l4_6", "demo"), ("naacl19_t3", "l4_6", "paper"),
                                                     ("emnlp20_t10", "last", "demo")])
def test_runner_trains_with_the_checked_command(table, row_id, scale_name, tmp_path, monkeypatch):
    table = load_table(table)
    row = table.row(row_id)
    dataset = check.dataset_for(table, scale_name)
    data_bin = tmp_path / "data-bin"
    (data_bin / dataset).mkdir(parents=True)
    (data_bin / dataset / "prepare.json").write_text('{"source_lang": "en", "target_lang": "de"}')
    seen = {}

    def fake_run(p, env):
        seen["args"] = list(p.args)
        raise _Captured

    monkeypatch.setattr(steps.training, "run", fake_run)
    run = RunConfig(dataset=dataset, scale=scale_name, seeds=[1], gpus=0, out_dir=tmp_path, data_bin=data_bin)
    with pytest.raises(_Captured):
        steps.train(make_job(table.table, row, run, 1), {})
    expected = list(check.row_plan(row, dataset, scale_name, data_bin, gpus=0).args)

    def without_paths(args):  # the run's own directories and log file
        drop = {"--save-dir", "--tensorboard-logdir", "--log-file"}
        return [a for i, a in enumerate(args) if a not in drop and (i == 0 or args[i - 1] not in drop)]

    assert without_paths(seen["args"]) == without_paths(expected)
    if scale_name == "demo":
        layers = seen["args"][seen["args"].index(next(f for f in scale.LAYER_FLAGS if f in seen["args"])) + 1]
        assert layers == "1"  # paper layers 4-6 / the last layer → the demo's top layer


# ------------------------------------------------------------------------------------ make check-tables
@pytest.mark.timeout(1800)  # ~100 rows of a few seconds each; past the 600 s default on a busy 2-core machine
def test_every_table_row_builds_and_trains_one_step_at_demo_scale(capsys):
    start = time.perf_counter()
    lines, failures = check.check(TABLES, ("demo",))
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n[check-tables, demo scale] {lines} rows in {seconds:.1f}s")
    assert lines == sum(len(t.rows) for t in TABLES)
    assert not failures, "\n".join(failures)
    assert out.count("\nok   ") + out.startswith("ok   ") == lines


def test_check_tables_names_every_broken_row(tmp_path, capsys):
    spec = {"table": "broken", "title": "rows that cannot run", "paper_dataset": "wmt14_en_de", "baseline": "none",
            "rows": [{"id": "none", "label": "baseline", "family": "transformer", "args": [], "paper": {"bleu": 1}},
                     {"id": "layer7", "label": "a layer the paper model lacks", "family": "diverse_transformer",
                      "args": ["--routing-type", "em", "--routing-encoder-layers", "6"], "paper": {"bleu": 1}},
                     {"id": "typo", "label": "unknown flag", "family": "transformer",
                      "args": ["--no-such-flag", "1"], "paper": {"bleu": 1}}]}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert check.main(["--scale", "demo", str(path)]) == 1
    out = capsys.readouterr().out
    assert "ok   broken:none scale=demo" in out
    assert "FAILED broken:layer7 scale=demo: ValueError: --routing-encoder-layers 6: layer index 6 is outside" in out
    assert "FAILED broken:typo scale=demo:" in out and "--no-such-flag" in out
    assert "3 table/row/scale lines, 2 failed" in out


@pytest.mark.parametrize("name,value,message", [
    ("SCALE", "full", "SCALE (--scale)='full' is not valid: use SCALE=demo or SCALE=paper"),
    ("DATASET", "wmt14", "DATASET (--dataset)='wmt14' is not valid: use DATASET=demo"),
])
def test_a_bad_variable_from_the_environment_is_refused(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as err:
        check.main([])
    assert message in str(err.value)


# ------------------------------------------------------------------- paper scale: the papers' parameter counts
def test_a_row_within_two_percent_of_the_papers_parameters_passes():
    ok, text = check.compare_parameters(89_700_000, 88.0)  # +1.9%
    assert ok and text == "89.70M params, paper 88M (+1.9%)"
    assert check.compare_parameters(60_500_000, None) == (True, "60.50M params")  # the paper reports none


def test_only_a_row_that_says_why_may_be_more_than_two_percent_off():
    """journal Table 6's 8-head Big + Aggregation (288M in the paper, 280.84M built) states why in its
    params_gap and is printed as GAP; the same count without a reason fails, and a row within 2% is ok."""
    table = load_table("journal_t6")
    gap_row = next(r for r in table.rows if r.id == "aggregation")
    status, text = check.judge_parameters(280_840_000, gap_row)
    assert status == "GAP " and "288M (-2.5%)" in text and "no layer count gives +24M" in text
    plain = dataclasses.replace(gap_row, params_gap="")
    assert check.judge_parameters(280_840_000, plain)[0] == "FAIL"
    assert check.judge_parameters(287_000_000, plain)[0] == "ok  "
    gaps = [(t.table, r.id) for t in TABLES for r in t.rows if r.params_gap]
    assert gaps == [("journal_t6", "aggregation"), ("journal_t6", "both")]


def test_a_row_more_than_two_percent_off_fails_with_a_clear_message():
    ok, text = check.compare_parameters(60_530_000, 88.0)  # the shared-embedding model against the paper's
    assert not ok
    assert text.startswith("60.53M params, paper 88M (-31.2%): more than 2% off the paper's count, so this is not "
                           "the paper's model")
    assert not check.compare_parameters(86_200_000, 88.0)[0]  # -2.05%


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """One data-bin for the module's paper-scale tests, which only read it: ``check.write_synthetic_data`` writes
    a dataset's synthetic dictionaries (tens of thousands of symbols) there once and then leaves them as they are."""
    return tmp_path_factory.mktemp("synthetic") / "data-bin"


def _paper_parameters(table, row_id, data_bin):
    tab = load_table(table)
    row = tab.row(row_id)
    check.write_synthetic_data(data_bin, tab.paper_dataset)
    return check.count_parameters(list(check.row_plan(row, tab.paper_dataset, "paper", data_bin, 8, "fp32").args)), row


@pytest.mark.parametrize("table,row_id", [
    ("naacl19_t4", "base"), ("naacl19_t4", "base_aggregation"), ("naacl19_t4", "big"),
    ("naacl19_t4", "big_aggregation"),
    ("journal_t5_zh_en", "base"), ("journal_t5_zh_en", "big_both"),
])
def test_paper_scale_models_build_the_papers_parameter_counts(table, row_id, data_bin):
    """Transformer-Base/Big (+ EM routing in two layers) at paper scale, on dictionaries of the assumed sizes,
    have the papers' parameter counts (NAACL 2019 Table 4, journal Table 5) within 2%. Built on the meta device."""
    built, row = _paper_parameters(table, row_id, data_bin)
    ok, text = check.compare_parameters(built, row.paper["params"])
    assert ok, f"{table}:{row_id}: {text}"


def test_the_shared_embedding_model_stays_available_and_is_not_the_papers(data_bin, tmp_path):
    """EMBEDDINGS=shared builds fairseq's model (output tied to the target embedding on separate dictionaries):
    fewer parameters than the paper's, which the check reports."""
    check.write_synthetic_data(data_bin, "wmt14_en_de")
    env = {"DATA_BIN": str(data_bin), "SAVE_DIR": str(tmp_path / "run"), "PRECISION": "fp32"}
    args = list(plan(request_from_env("wmt14_en_de", "base", [], env=dict(env, EMBEDDINGS="shared"), gpus=8)).args)
    assert "--share-decoder-input-output-embed" in args
    built = check.count_parameters(args)
    untied = list(plan(request_from_env("wmt14_en_de", "base", [], env=env, gpus=8)).args)
    assert check.count_parameters(untied) - built == 28_544 * 512  # the output matrix of the German dictionary
    assert not check.compare_parameters(built, 88.0)[0]


def test_fairseq_validation_bleu_options_parse_and_score(data_bin):
    """The paper-scale command's --eval-bleu options (beam, BPE removal, Moses detokenization) parse with fairseq's
    parser and work with the translation task: a validation step on a synthetic batch scores BLEU statistics.
    The model is shrunk by later flags (they override the setting's) to keep the step fast."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    tab = load_table("naacl19_t3")
    check.write_synthetic_data(data_bin, tab.paper_dataset)
    args = list(check.row_plan(tab.row("none"), tab.paper_dataset, "paper", data_bin, 8, "fp32").args)
    assert args[args.index("--eval-bleu-remove-bpe") + 1] == "@@ "
    assert args[args.index("--eval-bleu-detok") + 1] == "moses"
    # the THUMT papers' decoding: GNMT's length penalty and THUMT's search (the plugin's task), at most |x| + 50 tokens
    assert args[args.index("--task") + 1:args.index("--task") + 6] == ["translation_length_penalty",
                                                                       "--length-penalty", "gnmt", "--beam-search",
                                                                       "thumt"]
    assert json.loads(args[args.index("--eval-bleu-args") + 1]) == {"beam": 4, "lenpen": 0.6, "max_len_a": 1.0,
                                                                    "max_len_b": 49}
    small = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
             "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
             "--decoder-attention-heads", "2", "--eval-bleu-args", '{"beam": 4, "lenpen": 0.6, "max_len_b": 8}']
    parsed = options.parse_args_and_arch(options.get_training_parser(), args + small)
    assert parsed.eval_bleu and parsed.best_checkpoint_metric == "bleu" and parsed.maximize_best_checkpoint_metric
    cfg = convert_namespace_to_omegaconf(parsed)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    generator = task.sequence_generator  # THUMT's search with GNMT's penalty
    assert isinstance(generator, ThumtSequenceGenerator) and (generator.penalty_form, generator.alpha) == ("gnmt", 0.6)
    criterion = task.build_criterion(cfg.criterion)
    model.eval()
    _, _, logging_output = task.valid_step(check._synthetic_batch(task), model, criterion)
    assert logging_output["_bleu_ref_len"] == 4 * 5  # four references of five words (eos removed)
    assert (logging_output["_bleu_sys_len"] > 0
            and len([k for k in logging_output if k.startswith("_bleu_counts_")]) == 4)


def test_paper_scale_lines_say_how_each_row_decodes(monkeypatch, capsys):
    """``make check-tables SCALE=paper``: a THUMT row decodes with GNMT's penalty, THUMT's search and at most |x| + 50
    tokens, an EMNLP 2020 (fairseq) row with fairseq's --lenpen and search and the recipe's 200 tokens (models not
    built here; the two tables cut to the rows whose lines are read)."""
    monkeypatch.setattr(check, "build_and_step", lambda args, layers, step: check.Result(True, "built", None))
    tables = [dataclasses.replace(table, rows=[table.row(row_id)])
              for table, row_id in ((load_table("journal_t5"), "big"), (load_table("emnlp20_t2_wmt14"), "ma"))]
    check.check(tables, ("paper",))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "journal_t5:big " in x)
    assert "[decoding: thumt beam search 4, gnmt length penalty 0.6, at most 1·|x| + 49 tokens]" in line
    line = next(x for x in out.splitlines() if "emnlp20_t2_wmt14:ma " in x)
    assert "[decoding: fairseq beam search 4, fairseq length penalty 0.6, at most 0·|x| + 200 tokens]" in line


def test_paper_scale_check_prints_the_real_dictionaries_parameters(tmp_path):
    """After ``make data``, the paper-scale check also builds each row on the prepared dataset's dictionaries
    (data-bin/<dataset>/dict.*.txt) and prints that count beside the paper's; without prepared data, or on data the
    check made itself, it prints only the assumed sizes' count."""
    import json
    import re

    real = tmp_path / "data-bin"
    data = real / "iwslt14_de_en"
    data.mkdir(parents=True)
    (data / "prepare.json").write_text(json.dumps({"dataset": "iwslt14_de_en", "source_lang": "de",
                                                   "target_lang": "en", "joined_dictionary": True}))
    dictionary = check.synthetic_dictionary(entries=6632)  # a joined dictionary smaller than the assumed 10,008
    for lang in ("de", "en"):
        dictionary.save(str(data / f"dict.{lang}.txt"))
    assert check.real_dictionaries(real, "iwslt14_de_en") == {"de": 6632, "en": 6632}
    assert check.real_dictionaries(real, "wmt14_en_de") is None and check.real_dictionaries(None, "x") is None
    table = dataclasses.replace(load_table("emnlp20_t2"), rows=[load_table("emnlp20_t2").row("ma")])
    printed = []
    _, failures = check.check([table], scales=("paper",), paper_gpus=1, out=printed.append, real_data_bin=real)
    line = next(p for p in printed if p.startswith("ok") and "emnlp20_t2:ma" in p)
    assert not failures and f"real dictionaries of {data} (de 6,632 / en 6,632 entries): " in line
    assumed, on_real = (float(m) for m in re.findall(r"([\d.]+)M params", line))
    # one embedding matrix shared by source, target and output (--share-all-embeddings), 512 wide
    assert assumed - on_real == pytest.approx((10008 - 6632) * 512 / 1e6, abs=0.011)
    assert check.real_data_note(table.rows[0], "iwslt14_de_en", tmp_path / "none", 1, "fp32", {}) == ""
    (data / "prepare.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en", "synthetic": True}))
    assert check.real_dictionaries(real, "iwslt14_de_en") is None
