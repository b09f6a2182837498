"""The table descriptions in configs/tables/ (issue 8): they parse, and every row's flags parse with fairseq.

* every ``configs/tables/*.yaml`` loads with :func:`diverse_fairseq.tables.spec.load_table`;
* every row's ``args`` go through fairseq-train's own argument parser (``options.get_training_parser`` +
  ``parse_args_and_arch``, with ``--user-dir diverse_fairseq``) with the architecture the runner would train
  at paper scale, and each ``--flag value`` of the row comes through with its value; comma lists and layer
  indices are checked with the criterion's / optimizer's own validators. Rows whose routing flags are not
  registered yet (no ``--routing-*`` option at all) are skipped with fairseq's "unrecognized arguments";
* malformed descriptions are rejected with a message naming the bad field.

No training, no data: the positional data directory is a dummy.
"""

import copy
from pathlib import Path

import pytest

from diverse_fairseq.methods.options import parse_layers, parse_names
from diverse_fairseq.runs import settings
from diverse_fairseq.tables.spec import TABLE_DIR, TableSpecError, load_table, parse_table
from diverse_fairseq.user_dir import USER_DIR

PAPER_DATASETS = ("iwslt14_de_en", "wmt14_en_de", "wmt14_en_de_joined", "wmt17_zh_en")
DISAGREEMENT = "label_smoothed_cross_entropy_with_disagreement"
REPULSIVE = "repulsive_adam"

TABLE_FILES = sorted(TABLE_DIR.glob("*.yaml"))
EXPECTED_TABLES = {
    "demo", "emnlp18_t1", "emnlp18_t2", "emnlp18_t3", "emnlp18_t4_5",
    "naacl19_t1", "naacl19_t2", "naacl19_t3", "naacl19_t4",
    "journal_t5", "journal_t6", "journal_t7",
    "emnlp20_t2", "emnlp20_t2_wmt14", "emnlp20_t8", "emnlp20_t10", "emnlp20_f3",
}


def _rows():
    out = []
    for path in TABLE_FILES:
        table = load_table(path)
        for row in table.rows:
            out.append(pytest.param(table, row, id=f"{table.table}:{row.id}"))
    return out


# ------------------------------------------------------------------------------------ the table files
def test_expected_tables_exist():
    missing = EXPECTED_TABLES - {p.stem for p in TABLE_FILES}
    assert not missing, f"missing table descriptions: {sorted(missing)}"


@pytest.mark.parametrize("path", TABLE_FILES, ids=[p.stem for p in TABLE_FILES])
def test_table_file_loads(path: Path):
    table = load_table(path.stem)
    assert table.table == path.stem, "the table id must equal the file name (results/<table>/)"
    assert table.title
    assert table.baseline in [r.id for r in table.rows]
    if table.table == "demo":
        assert table.rows[0].id == "baseline" and table.baseline == "baseline"
        assert [r.id for r in table.rows] == ["baseline", "disagreement", "aggregation", "repulsive", "all_three"]
        assert all(r.description for r in table.rows), "every demo row says what it runs"
        return
    assert table.paper_dataset in PAPER_DATASETS, f"{path.name}: paper_dataset {table.paper_dataset!r}"
    if table.figure_x:  # a figure: every row is a point; the papers plot them without printing numbers
        assert all(r.figure for r in table.rows) and path.stem.rsplit("_", 1)[1].startswith("f"), path.name
    for row in table.rows:  # a row the paper has no number for says so in its description
        assert table.figure_x or "bleu" in row.paper or "no " in row.description and "paper" in row.description, (
            f"{path.name}: row {row.id} has no paper BLEU and no description saying why")
    # tables that mix model sizes name the setting on every row
    settings = {r.setting for r in table.rows}
    assert settings == {None} or None not in settings, f"{path.name}: setting given on some rows only"
    # significance as the papers mark it: every row against the baseline of its own size
    for row in table.rows:
        base = table.row(row.baseline)
        assert base.baseline == base.id and base.setting == row.setting, (path.name, row.id, base.id)


# ------------------------------------------------------------------------------- fairseq's own parser
def _setting(table, row) -> str:
    if table.paper_dataset is None:
        return "tiny"
    return row.setting or settings.DEFAULT_SETTING[table.paper_dataset]


def _flag_values(args):
    """``[(flag, value or None)]`` for the row's command line (None: a switch such as --fp16-no-flatten-grads)."""
    pairs, i = [], 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), f"expected a flag, got {flag!r} in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append((flag, args[i + 1]))
            i += 2
        else:
            pairs.append((flag, None))
            i += 1
    return pairs


def _same(parsed, given: str) -> bool:
    if isinstance(parsed, bool):
        return parsed == (given.lower() in ("true", "1"))
    if isinstance(parsed, (int, float)):
        return float(parsed) == float(given)
    return str(parsed) == given


def _check_layers(value, depth: int, flag: str):
    if value is None or str(value).strip().lower() == "all":
        return
    for item in str(value).split(","):
        i = int(item)
        assert -depth <= i < depth, f"{flag} {value}: layer {i} outside a {depth}-layer stack"


@pytest.mark.parametrize("table,row", _rows())
def test_row_args_parse_with_fairseq(table, row):
    from fairseq import options

    setting = settings.SETTINGS[_setting(table, row)]
    arch = row.arch(setting.arch)
    # as diverse_fairseq.training puts them: our defaults first, the row's flags after (they override),
    # and --fp16 as on GPU, so that the repulsive optimizer's precision check sees the real set-up
    argv = ["data-dummy", "--user-dir", USER_DIR, "--task", "translation", "--arch", arch, *setting.extra,
            "--optimizer", "adam", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--fp16", *row.args]
    parser = options.get_training_parser()
    args, unknown = options.parse_args_and_arch(parser, argv, parse_known=True)
    assert args.arch == arch
    depth = {"encoder": args.encoder_layers, "decoder": args.decoder_layers}

    # routing layer indices are checked before a possible skip: they are plain data
    for flag, value in _flag_values(row.args):
        if flag in ("--routing-encoder-layers",):
            _check_layers(value, depth["encoder"], flag)
        elif flag in ("--routing-decoder-layers", "--routing-encoder-decoder-layers"):
            _check_layers(value, depth["decoder"], flag)

    if unknown:
        flags = [u for u in unknown if u.startswith("--")]
        registered_routing = [o for o in parser._option_string_actions if o.startswith("--routing-")]
        if flags and all(f.startswith("--routing-") for f in flags) and not registered_routing:
            pytest.skip(f"unrecognized arguments: {' '.join(unknown)} (the routing flags are not registered yet)")
        pytest.fail(f"{table.table}:{row.id}: fairseq-train: unrecognized arguments: {' '.join(unknown)}")

    # every --flag value of the row comes through
    for flag, value in _flag_values(row.args):
        dest = flag[2:].replace("-", "_")
        assert hasattr(args, dest), f"{flag} parsed but no args.{dest}"
        parsed = getattr(args, dest)
        if value is None:
            assert parsed is True, f"{flag}: expected a switch set to True, got {parsed!r}"
        else:
            assert _same(parsed, value), f"{flag}: expected {value!r}, got {parsed!r}"

    # the criterion and optimizer fields, checked with the plugins' own validators
    has_disagreement = DISAGREEMENT in row.args
    has_repulsive = REPULSIVE in row.args
    assert args.criterion == (DISAGREEMENT if has_disagreement else "label_smoothed_cross_entropy")
    assert args.optimizer == (REPULSIVE if has_repulsive else "adam")
    if has_disagreement:
        from diverse_fairseq.methods.disagreement import criterion as dl

        assert row.family == "diverse_transformer", "the disagreement criterion needs --arch diverse_transformer*"
        assert parse_names(args.disagreement_terms, dl.TERMS, "--disagreement-terms")
        assert parse_names(args.disagreement_attention, dl.ATTENTION_TYPES, "--disagreement-attention")
        assert parse_layers(args.disagreement_layers, min(depth.values()), "--disagreement-layers", "all")
        assert args.disagreement_lambda > 0
    if has_repulsive:
        from diverse_fairseq.methods.repulsive import optimizer as ra

        assert args.repulsive_method in ra.METHODS
        assert parse_names(args.repulsive_attention, ra.ATTENTION_TYPES, "--repulsive-attention")
        assert parse_names(args.repulsive_projections, ra.PROJECTIONS, "--repulsive-projections")
        for d in (min(depth.values()), 3):  # valid at paper depth and at the 3-layer demo depth (SCALE=demo)
            assert parse_layers(args.repulsive_layers, d, "--repulsive-layers", "all")
        assert args.repulsive_stepsize > 0 and args.repulsive_alpha >= 0
        ra.check_precision_setup(args)  # --fp16 on GPU: the row must make per-parameter gradients visible
    if any(a.startswith("--routing-") for a in row.args):
        assert row.family == "diverse_transformer", "routing needs --arch diverse_transformer*"
        assert args.routing_type in ("simple", "em")


# ------------------------------------------------------------------------------ malformed descriptions
GOOD = {
    "table": "t",
    "title": "a table",
    "paper_dataset": "wmt14_en_de",
    "baseline": "none",
    "rows": [
        {"id": "none", "label": "Transformer", "family": "transformer", "args": [], "paper": {"bleu": 27.31}},
        {"id": "d", "label": "+ D", "family": "diverse_transformer", "setting": "base",
         "args": ["--criterion", DISAGREEMENT], "paper": {"bleu": 28.2, "train_speed": 1.1}},
    ],
}


def _bad(edit):
    data = copy.deepcopy(GOOD)
    edit(data)
    return data


def test_good_description_parses():
    table = parse_table(copy.deepcopy(GOOD), "good.yaml")
    assert [r.id for r in table.rows] == ["none", "d"] and table.row("d").setting == "base"
    assert table.row("d").arch("transformer_wmt_en_de") == "diverse_transformer_wmt_en_de"


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.pop("rows"), "rows"),
    (lambda d: d.update(rows=[]), "rows"),
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d["rows"][1].update(flags=["--x"]), "flags"),
    (lambda d: d["rows"][1].update(family="lstm"), "family"),
    (lambda d: d["rows"][1].pop("family"), "family"),
    (lambda d: d["rows"][1].update(setting="huge"), "setting"),
    (lambda d: d.update(baseline="nope"), "baseline"),
    (lambda d: d.pop("baseline"), "baseline"),
    (lambda d: d["rows"][1].update(id="none"), "rows"),
    (lambda d: d["rows"][1].update(paper={"bleu": "28.2"}), "paper"),
    (lambda d: d["rows"][1].update(paper={"bleu": "n/a"}), "paper"),
    (lambda d: d["rows"][1].update(args="--criterion x"), "args"),
    (lambda d: d["rows"][1].pop("label"), "label"),
    (lambda d: d.pop("title"), "title"),
], ids=["missing-rows", "empty-rows", "unknown-table-field", "unknown-row-field", "bad-family", "missing-family",
        "bad-setting", "baseline-not-a-row", "missing-baseline", "duplicate-ids", "string-paper-value",
        "non-numeric-paper-value", "args-not-a-list", "missing-label", "missing-title"])
def test_malformed_description_is_rejected(edit, field):
    with pytest.raises(TableSpecError, match=field) as err:
        parse_table(_bad(edit), "bad.yaml")
    assert "bad.yaml" in str(err.value)


def test_row_baseline_defaults_to_the_tables_and_can_be_set_per_row():
    data = copy.deepcopy(GOOD)
    data["rows"] += [
        {"id": "big", "label": "Big", "family": "transformer", "setting": "big", "baseline": "big"},
        {"id": "big_d", "label": "Big + D", "family": "diverse_transformer", "setting": "big", "baseline": "big",
         "description": "the big model with the Output disagreement term"},
    ]
    data["rows"][1]["setting"] = None
    table = parse_table(data, "good.yaml")
    assert {r.id: r.baseline for r in table.rows} == {"none": "none", "d": "none", "big": "big", "big_d": "big"}
    assert table.row("big_d").description == "the big model with the Output disagreement term"
    assert table.row("d").description == ""


def _with_big_rows(big_baseline, big_d_baseline):
    def edit(d):
        d["rows"][0]["setting"] = d["rows"][1]["setting"] = "base"
        d["rows"] += [{"id": "big", "label": "Big", "family": "transformer", "setting": "big",
                       "baseline": big_baseline},
                      {"id": "big_d", "label": "Big + D", "family": "transformer", "setting": "big",
                       "baseline": big_d_baseline}]
    return edit


@pytest.mark.parametrize("edit,message", [
    (_with_big_rows("big", "nope"), r"rows\[3\] \(big_d\): field 'baseline' names 'nope', which is not a row id"),
    # a Big row tested against Transformer-Base: the mixed-size table without per-row baselines
    (_with_big_rows("none", "none"), r"rows\[2\] \(big\): field 'baseline' names 'none' of setting 'base', but "
                                     r"this row's setting is 'big'"),
    # a chain: big_d against d, which is itself tested against none
    (_with_big_rows("big", "d"), r"field 'baseline' names 'd', which is not a baseline row"),
    (lambda d: d["rows"][1].update(baseline=3), r"field 'baseline' must be a str"),
    (lambda d: d["rows"][1].update(description="two\nlines"), r"field 'description' must be one non-empty line"),
    (lambda d: d["rows"][1].update(description=""), r"field 'description' must be one non-empty line"),
    (lambda d: d["rows"][1].update(description=["a"]), r"field 'description' must be a str"),
], ids=["unknown-row-baseline", "big-against-base", "baseline-chain", "non-string-baseline", "multiline-description",
        "empty-description", "list-description"])
def test_bad_row_baseline_or_description_is_rejected(edit, message):
    with pytest.raises(TableSpecError, match=message) as err:
        parse_table(_bad(edit), "bad.yaml")
    assert "bad.yaml" in str(err.value)


def test_emnlp20_f3_has_ma_and_rma_at_every_head_count_each_against_ma_of_its_heads():
    table = load_table("emnlp20_f3")
    heads = [1, 2, 4, 8, 16]
    assert table.figure_x == "number of heads M" and table.baseline == "ma_h4"
    assert [(r.figure["series"], r.figure["x"]) for r in table.rows] == [(s, h) for s in ("MA", "RMA") for h in heads]
    rma = load_table("emnlp20_t2").row("rma").args
    for row in table.rows:
        h = str(int(row.figure["x"]))
        assert row.args[-4:] == ["--encoder-attention-heads", h, "--decoder-attention-heads", h]
        assert row.args[:-4] == ([] if row.figure["series"] == "MA" else rma)  # Table 2's RMA settings
        assert row.baseline == f"ma_h{h}"
        assert 128 % int(h) == 0 and 512 % int(h) == 0  # the demo's and Transformer-small's width


FIGURE = {"table": "f", "title": "a figure", "figure_x": "heads", "baseline": "a",
          "rows": [{"id": "a", "label": "A", "family": "transformer", "figure": {"series": "A", "x": 1}},
                   {"id": "b", "label": "B", "family": "transformer", "figure": {"series": "A", "x": 2}}]}


def test_figure_points_parse():
    table = parse_table(copy.deepcopy(FIGURE), "fig.yaml")
    assert table.figure_x == "heads" and [r.figure for r in table.rows] == [{"series": "A", "x": 1.0},
                                                                            {"series": "A", "x": 2.0}]
    assert parse_table(copy.deepcopy(GOOD), "good.yaml").figure_x is None


def _bad_figure(edit):
    data = copy.deepcopy(FIGURE)
    edit(data)
    return data


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["rows"][1].pop("figure"), r"rows\[1\]: missing field 'figure'"),
    (lambda d: d.pop("figure_x"), r"rows\[0\]: field 'figure' needs the table's 'figure_x'"),
    (lambda d: d["rows"][1]["figure"].update(x="2"), r"field 'figure' needs a number 'x', got '2'"),
    (lambda d: d["rows"][1]["figure"].update(colour="red"), r"unknown field\(s\) colour"),
    (lambda d: d["rows"][1]["figure"].update(x=1), r"field 'figure' repeats the point\(s\) A at x = 1"),
    (lambda d: d.update(figure_x=3), r"field 'figure_x' must be a str"),
], ids=["row-without-point", "points-without-axis", "string-x", "unknown-point-field", "repeated-point",
        "non-string-axis"])
def test_bad_figure_is_rejected(edit, message):
    with pytest.raises(TableSpecError, match=message):
        parse_table(_bad_figure(edit), "fig.yaml")


def test_duplicate_ids_are_named():
    with pytest.raises(TableSpecError, match=r"repeats the id\(s\) none"):
        parse_table(_bad(lambda d: d["rows"][1].update(id="none")), "bad.yaml")


def test_unknown_table_is_reported_with_the_known_ones():
    with pytest.raises(TableSpecError, match="known tables: .*emnlp18_t1"):
        load_table("no_such_table")
