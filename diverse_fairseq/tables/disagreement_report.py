"""The disagreement scores of a table's runs beside the paper's: EMNLP 2018 Tables 4 and 5.

Li, Tu, Yang, Lyu, Zhang. *Multi-Head Attention with Disagreement Regularization*. EMNLP 2018, §5.5:
Table 4 lists exp(D) of subspaces (Sub.), attended positions (Pos.) and outputs (Out.) of the encoder
self-attention, one row per regularization term; Table 5 the position score per encoder layer. Both are on
the paper's scale, exp(−mean over all H² head pairs, self-pairs included)
(:mod:`diverse_fairseq.analysis.scores`), so mutually orthogonal heads score exp(−1/H): 0.882 for the
paper's H = 8, 0.779 for the demo's H = 4.

A table row carries the paper's numbers as flat keys of its ``paper:`` mapping: ``sub_score``,
``pos_score``, ``out_score`` (Table 4) and ``pos_score_layer1`` … ``pos_score_layer6`` (Table 5). Our numbers
come from the table runner's ``disagreement_scores`` (the whole validation set, per attention type and per
layer). :func:`disagreement_entry` puts the mean over seeds into a row's summary entry;
:func:`disagreement_section` renders the markdown, for tables whose rows carry the paper's scores (other
tables keep the scores in their JSON only).
"""

import math
import statistics
from typing import Dict, List, Optional, Sequence

from .records import JobRecord

SCORES = (("sub", "Sub."), ("pos", "Pos."), ("out", "Out."))
ATTENTION = "enc_self"  # the paper's Tables 4-5 measure the encoder
PAPER_LAYER_KEY = "pos_score_layer{}"


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _mean_scores(per_seed: Sequence[Dict]) -> Dict:
    """Mean over seeds of ``{type: {"sub", "pos", "out", "layers": [{"layer", "heads", "sub", "pos", "out"}]}}``."""
    out = {}
    for atype in per_seed[0]:
        runs = [d[atype] for d in per_seed if atype in d]
        depth = min(len(r.get("layers", [])) for r in runs)
        out[atype] = {name: _mean([r.get(name) for r in runs]) for name, _ in SCORES}
        out[atype]["layers"] = [
            {"layer": runs[0]["layers"][i]["layer"], "heads": runs[0]["layers"][i].get("heads"),
             **{name: _mean([r["layers"][i].get(name) for r in runs]) for name, _ in SCORES}}
            for i in range(depth)]
    return out


def disagreement_entry(table, row, runs: List[JobRecord]) -> Dict:
    """What a row's summary entry stores: ``{"disagreement": mean over seeds, "paper_disagreement": {...}}``.

    ``paper_disagreement`` holds the row's paper scores (Table 4/5 keys) and the dataset they are for; it is
    kept whatever dataset ran, since the scale, unlike BLEU, can be compared across data. Empty when the runs
    carry no scores.
    """
    if not runs or not all(r.disagreement for r in runs):
        return {}
    paper = {k: v for k, v in row.paper.items() if k.endswith("_score") or k.startswith("pos_score_layer")}
    entry = {"disagreement": _mean_scores([r.disagreement for r in runs])}
    if paper:
        entry["paper_disagreement"] = {"dataset": table.paper_dataset, "scores": paper}
    return entry


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{value:.1e}" if 0 < abs(value) < 1e-3 else f"{value:.3f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def disagreement_section(summary: Dict) -> List[str]:
    """Markdown lines: Table 4 (Sub./Pos./Out. of the encoder) and Table 5 (per encoder layer), ours beside
    the paper's. Nothing when no row carries both our scores and the paper's."""
    rows = [r for r in summary["rows"] if ATTENTION in r.get("disagreement", {})]
    if not rows or not any(r.get("paper_disagreement") for r in rows):
        return []
    paper_data = next(r["paper_disagreement"]["dataset"] for r in rows if r.get("paper_disagreement"))
    paper = {r["id"]: (r.get("paper_disagreement") or {}).get("scores", {}) for r in rows}
    ours = {r["id"]: r["disagreement"][ATTENTION] for r in rows}
    heads = sorted({e["heads"] for o in ours.values() for e in o["layers"] if e.get("heads")})
    depth = max(len(o["layers"]) for o in ours.values())
    paper_depth = max([int(k[len(PAPER_LAYER_KEY.format("")):]) for p in paper.values() for k in p
                       if k.startswith(PAPER_LAYER_KEY.format(""))] or [0])
    seeds = max(len(r["seeds"]) for r in rows)
    h_note = ", ".join(f"exp(−1/{h}) = {math.exp(-1 / h):.3f} at H = {h}" for h in heads)

    lines = ["", "#### Disagreement scores of the encoder self-attention (EMNLP 2018 Tables 4–5)", "",
             f"exp(D) on the paper's scale, exp(−mean over all H² head pairs, self-pairs included): larger = more "
             f"diverse heads, at most 1.0; mutually orthogonal heads give exp(−1/H) ({h_note}; the paper's H = 8 "
             f"gives 0.882). Ours: the whole `{summary['dataset']}` validation set, teacher-forced, mean over "
             f"{seeds} seed(s); paper: `{paper_data}` validation set. Per attention type and layer (all three types) "
             "in the JSON, key `disagreement`.", "",
             "Table 4 layout (per type: exp of the mean over layers of the similarity, the geometric mean of the "
             "layer scores):", ""]
    lines += _table(["Regularization", *(n for _, n in SCORES), *(f"paper {n}" for _, n in SCORES)],
                    [[r["label"], *(_fmt(ours[r["id"]][k]) for k, _ in SCORES),
                      *(_fmt(paper[r["id"]].get(f"{k}_score")) for k, _ in SCORES)] for r in rows])

    lines += ["", f"Table 5 layout, Pos. per encoder layer (1 = bottom; ours {depth} layers, the paper's "
                  f"{paper_depth}):", ""]
    layers = range(1, depth + 1)

    def ours_layer(row_id: str, name: str) -> List[str]:
        by_layer = {e["layer"]: e for e in ours[row_id]["layers"]}
        return [_fmt(by_layer.get(layer, {}).get(name)) for layer in layers]

    lines += _table(["Regularization", *map(str, layers), *(f"paper {layer}" for layer in range(1, paper_depth + 1))],
                    [[r["label"], *ours_layer(r["id"], "pos"),
                      *(_fmt(paper[r["id"]].get(PAPER_LAYER_KEY.format(layer))) for layer in range(1, paper_depth + 1))]
                     for r in rows])
    lines += ["", "Sub. and Out. per encoder layer (ours; the paper reports positions only):", ""]
    lines += _table(["Regularization", *(f"Sub. {layer}" for layer in layers), *(f"Out. {layer}" for layer in layers)],
                    [[r["label"], *ours_layer(r["id"], "sub"), *ours_layer(r["id"], "out")] for r in rows])
    return lines
