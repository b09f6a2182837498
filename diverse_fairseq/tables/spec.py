"""Table descriptions (``configs/tables/<table>.yaml``): parsing and validation.

A table file::

    table: emnlp18_t1                      # id, used for results/<table>/
    title: "EMNLP 2018 Table 1: ..."
    paper_dataset: wmt17_zh_en             # the dataset the paper's numbers are for (optional)
    baseline: none                         # id of the row significance is measured against by default
    probing: [SentLen, WC, ...]            # optional: probe every row's encoder on these SentEval tasks (or "all")
    rows:
      - id: none
        label: "Transformer-Base"
        family: transformer                # model family: transformer or diverse_transformer
        setting: base                      # optional model at paper scale: small, base, big (THUMT's), fairseq_base,
                                           # fairseq_big (fairseq's, EMNLP 2020)
        args: []                           # extra fairseq-train flags (criterion, optimizer, features)
        paper: {bleu: 24.13, params: 88}   # the paper's numbers (optional; params in millions; probe_sentlen, ...)
        description: "..."                 # one line saying what the row runs (optional; printed below the table)
        baseline: none                     # the row this one is tested against (default: the table's baseline)
        figure: {series: "MA", x: 4}       # the row's point in a figure (only in a figure's description)

A *figure* is a table whose rows are the points of a plot: it names its x axis (``figure_x: "number of heads M"``)
and every row its curve and x value (``figure``); ``make figure-<id>`` plots the report's JSON.

Significance follows the papers: every "+" row is tested against its own-size baseline, so a table with Base and Big
rows gives each Big row ``baseline: big``. A row whose baseline is itself is a baseline (no test).

Hyper-parameters are not repeated here: a row is trained with the dataset's paper setting (the row's ``setting``
if it names one) or ``tiny`` at demo scale; the family turns the setting's architecture into the row's
(``transformer_wmt_en_de`` → ``diverse_transformer_wmt_en_de``).
"""

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from ..runs.paths import REPO
from ..runs.settings import DEMO_SETTING, SETTINGS

TABLE_DIR = REPO / "configs" / "tables"
FAMILIES = ("transformer", "diverse_transformer")
SETTING_NAMES = tuple(name for name in SETTINGS if name != DEMO_SETTING)  # a row may name any paper-scale one


class TableSpecError(ValueError):
    """A table or scale description is malformed; the message names the file and the field."""


@dataclass
class Row:
    id: str
    label: str
    family: str
    args: List[str] = field(default_factory=list)
    paper: Dict[str, float] = field(default_factory=dict)
    setting: Optional[str] = None
    baseline: Optional[str] = None  # id of the row this one is tested against; None before parse_table fills it
    description: str = ""
    figure: Optional[Dict] = None  # {"series": name, "x": number}: the row's point in a figure
    # why the paper's parameter count cannot be built (the measured arithmetic); only such a row may build more
    # than 2% off its paper's count at paper scale, and `make check-tables` prints it as a GAP with this text
    params_gap: str = ""

    def arch(self, setting_arch: str) -> str:
        """The setting's architecture name with this row's model family, e.g. diverse_transformer_wmt_en_de."""
        return setting_arch.replace("transformer", self.family, 1)


@dataclass
class Table:
    table: str
    title: str
    baseline: str
    rows: List[Row]
    paper_dataset: Optional[str] = None
    probing: List[str] = field(default_factory=list)  # SentEval probing tasks run on every row (steps.probing_scores)
    figure_x: Optional[str] = None  # a figure's x-axis label; None for a table

    def row(self, row_id: str) -> Row:
        return next(r for r in self.rows if r.id == row_id)


def _require(mapping, key, kind, where):
    if not isinstance(mapping, dict) or key not in mapping:
        raise TableSpecError(f"{where}: missing field '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        raise TableSpecError(f"{where}: field '{key}' must be a {kind.__name__}, got {value!r}")
    return value


def _one_line(row, where, name: str = "description") -> str:
    if name not in row:
        return ""
    text = _require(row, name, str, where).strip()
    if not text or "\n" in text:
        raise TableSpecError(f"{where}: field '{name}' must be one non-empty line, got {text!r}")
    return text


def _check_unknown(mapping, allowed, where):
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise TableSpecError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _check_repeats(values, field_name: str, what: str, source):
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise TableSpecError(f"{source}: field '{field_name}' repeats the {what} {', '.join(repeated)}")


def _parse_row(r, figure_x, where) -> Row:
    _check_unknown(r if isinstance(r, dict) else {}, [f.name for f in fields(Row)], where)
    family = _require(r, "family", str, where)
    if family not in FAMILIES:
        raise TableSpecError(f"{where}: field 'family' must be one of {', '.join(FAMILIES)}, got {family!r}")
    setting = r.get("setting")
    if setting is not None and setting not in SETTING_NAMES:
        raise TableSpecError(f"{where}: field 'setting' must be one of {', '.join(SETTING_NAMES)}, got {setting!r}")
    paper = r.get("paper", {}) or {}
    if not isinstance(paper, dict) or not all(isinstance(v, (int, float)) for v in paper.values()):
        raise TableSpecError(f"{where}: field 'paper' must map names to numbers, got {paper!r}")
    args = r.get("args", [])
    if not isinstance(args, list) or not all(isinstance(v, (str, int, float)) for v in args):
        raise TableSpecError(f"{where}: field 'args' must be a list of command-line strings, got {args!r}")
    return Row(id=_require(r, "id", str, where), label=_require(r, "label", str, where), family=family,
               args=[str(v) for v in args], paper={k: float(v) for k, v in paper.items()}, setting=setting,
               baseline=_require(r, "baseline", str, where) if "baseline" in r else None,
               description=_one_line(r, where), figure=_figure_point(r, figure_x, where),
               params_gap=_one_line(r, where, "params_gap"))


def parse_table(data, source="<table>") -> Table:
    """Validate a table description (already loaded from YAML) and return it as a ``Table``."""
    if not isinstance(data, dict):
        raise TableSpecError(f"{source}: a table description is a mapping, got {type(data).__name__}")
    _check_unknown(data, [f.name for f in fields(Table)], source)
    figure_x = _require(data, "figure_x", str, source) if "figure_x" in data else None
    rows_data = _require(data, "rows", list, source)
    if not rows_data:
        raise TableSpecError(f"{source}: field 'rows' is empty")
    rows = [_parse_row(r, figure_x, f"{source}: rows[{i}]") for i, r in enumerate(rows_data)]
    _check_repeats([f"{r.figure['series']} at x = {r.figure['x']:g}" for r in rows if r.figure], "figure",
                   "point(s)", source)
    ids = [r.id for r in rows]
    _check_repeats(ids, "rows", "id(s)", source)
    baseline = _require(data, "baseline", str, source)
    if baseline not in ids:
        raise TableSpecError(f"{source}: field 'baseline' names {baseline!r}, which is not a row id ({', '.join(ids)})")
    _resolve_baselines(rows, baseline, source)
    return Table(table=_require(data, "table", str, source), title=_require(data, "title", str, source),
                 baseline=baseline, rows=rows, paper_dataset=data.get("paper_dataset"), figure_x=figure_x,
                 probing=_probing_tasks(data.get("probing"), source))


def _probing_tasks(value, source) -> List[str]:
    from ..data.senteval import BY_NAME, TASKS

    if value is None:
        return []
    if value == "all":
        return [t.name for t in TASKS]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise TableSpecError(f"{source}: field 'probing' must be 'all' or a list of task names, got {value!r}")
    unknown = [v for v in value if v.lower() not in BY_NAME]
    if unknown:
        raise TableSpecError(f"{source}: field 'probing' names unknown task(s) {', '.join(unknown)}; known: "
                             f"{', '.join(t.name for t in TASKS)}")
    return [BY_NAME[v.lower()].name for v in value]


def _figure_point(row, figure_x, where) -> Optional[Dict]:
    if figure_x is None:
        if isinstance(row, dict) and "figure" in row:
            raise TableSpecError(f"{where}: field 'figure' needs the table's 'figure_x' (the x-axis label)")
        return None
    point = _require(row, "figure", dict, where)
    _check_unknown(point, ("series", "x"), f"{where}: field 'figure'")
    series = _require(point, "series", str, f"{where}: field 'figure'")
    x = point.get("x")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TableSpecError(f"{where}: field 'figure' needs a number 'x', got {x!r}")
    return {"series": series, "x": float(x)}


def _resolve_baselines(rows: List[Row], default: str, source: str):
    """Give every row its baseline (default: the table's), a baseline row of its own setting."""
    by_id = {r.id: r for r in rows}
    for row in rows:
        row.baseline = row.baseline or default
    for i, row in enumerate(rows):
        where = f"{source}: rows[{i}] ({row.id}): field 'baseline'"
        base = by_id.get(row.baseline)
        if base is None:
            raise TableSpecError(f"{where} names {row.baseline!r}, which is not a row id ({', '.join(by_id)})")
        if base.baseline != base.id:
            raise TableSpecError(f"{where} names {base.id!r}, which is not a baseline row (its own baseline is "
                                 f"{base.baseline!r}); give {base.id!r} 'baseline: {base.id}'")
        if None not in (base.setting, row.setting) and base.setting != row.setting:
            raise TableSpecError(f"{where} names {base.id!r} of setting {base.setting!r}, but this row's setting "
                                 f"is {row.setting!r}: each row is tested against a baseline of its own size")


def load_table(name_or_path) -> Table:
    """Load ``configs/tables/<name>.yaml`` (or a path to a YAML file)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TABLE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in TABLE_DIR.glob("*.yaml"))
        raise TableSpecError(f"no table description {path}; known tables: {', '.join(known)}")
    with open(path) as f:
        return parse_table(yaml.safe_load(f), str(path))
