"""A paper figure from a table run: ``python -m diverse_fairseq.tables.figure FIGURE [the table options]``.

A figure is a table description whose rows carry a point (``figure: {series, x}``, see :mod:`.spec`), e.g.
``configs/tables/emnlp20_f3.yaml``: MA and RMA with 1 to 16 heads. This command runs it with the table runner
(``python -m diverse_fairseq.tables``, the same options and environment variables: SCALE, SEEDS, GPUS, ...; finished
runs are reused), then reads the report's JSON (``results/<figure>/<dataset>.json``) and writes beside it

* ``<dataset>-figure.png``: validation NLL (left) and test BLEU (right) against x, one curve per series through the
  means over seeds, every seed a point;
* ``<dataset>-figure.json``: the numbers behind it, ``{"table", "title", "dataset", "scale", "x_label", "metrics":
  {name: axis label}, "series": [{"name", "points": [{"row", "x", "seeds", <metric>: [per seed], <metric>_mean}]}],
  "best_x": {series: {metric: x of the best mean}}}``.

``--plot-only RESULTS.json`` skips the run and plots an existing report JSON.
"""

import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

from .records import from_json
from .report import Summary, mean, pyplot, save_figure

# metric key of a report row → (axis label, whether lower is better); per seed in "<key>_per_seed"
METRICS = {"valid_nll_loss": ("validation NLL per token (base 2)", True), "bleu": ("test BLEU (sacrebleu)", False)}


def figure_data(summary: Summary) -> Dict:
    """The figure's numbers from a report summary (the table runner's, or its ``<dataset>.json``)."""
    rows = [r for r in summary.rows if r.figure]
    if not rows or not summary.figure_x:
        raise ValueError(f"{summary.table}: the report has no figure points (a figure's description names "
                         f"'figure_x' and gives every row a 'figure: {{series, x}}')")
    series: Dict[str, List[Dict]] = {}
    for r in rows:
        point = {"row": r.id, "label": r.label, "x": r.figure["x"], "seeds": r.seeds}
        for key in METRICS:
            point[key] = getattr(r, f"{key}_per_seed")
            point[f"{key}_mean"] = mean(point[key])
        series.setdefault(r.figure["series"], []).append(point)
    out, best = [], {}
    for name, points in series.items():
        points.sort(key=lambda p: p["x"])
        out.append({"name": name, "points": points})
        best[name] = {}
        for key, (_, lower) in METRICS.items():
            scored = [p for p in points if p[f"{key}_mean"] is not None]
            best[name][key] = (min if lower else max)(scored, key=lambda p: p[f"{key}_mean"])["x"] if scored else None
    return {"table": summary.table, "title": summary.title, "dataset": summary.dataset,
            "scale": summary.scale, "x_label": summary.figure_x,
            "metrics": {k: label for k, (label, _) in METRICS.items()}, "series": out, "best_x": best}


def plot_figure(data: Dict, path: Path) -> Path:
    """One panel per metric: the mean over seeds of each series as a line, every seed as a point."""
    fig, axes = pyplot().subplots(1, len(METRICS), figsize=(5.0 * len(METRICS), 3.8))
    xs = sorted({p["x"] for s in data["series"] for p in s["points"]})
    for ax, key in zip(axes, METRICS):
        for k, s in enumerate(data["series"]):
            colour = f"C{k}"
            means = [(p["x"], p[f"{key}_mean"]) for p in s["points"] if p[f"{key}_mean"] is not None]
            if means:
                ax.plot(*zip(*means), "-", color=colour, label=f"{s['name']} (mean)", zorder=2)
            seeds = [(p["x"], v) for p in s["points"] for v in p[key] if v is not None]
            if seeds:
                ax.scatter(*zip(*seeds), s=16, color=colour, alpha=0.6, zorder=3,
                           label=f"{s['name']} (one seed)")
        if xs and min(xs) > 0:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.set_xlabel(data["x_label"])
        ax.set_ylabel(data["metrics"][key])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{data['title']}\ndataset {data['dataset']}, scale {data['scale']}", fontsize=9)
    return save_figure(fig, path)


def main(argv: Optional[List[str]] = None) -> bool:
    """Run the table (or, with ``--plot-only``, take its report JSON) and write ``<dataset>-figure.png`` and
    ``.json`` beside the report JSON."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--plot-only"] and len(argv) == 2:
        results = Path(argv[1])
        summary = from_json(Summary, json.loads(results.read_text(encoding="utf-8")))
    else:
        from .__main__ import main as run_table
        from .__main__ import parse_options, results_dir

        summary = run_table(argv)
        results = results_dir(parse_options(argv, os.environ), summary.table) / f"{summary.dataset}.json"
    data = figure_data(summary)
    stem = results.with_name(f"{results.stem}-figure")
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    plot_figure(data, stem.with_suffix(".png"))
    for name, best in data["best_x"].items():
        print(f"{name}: " + ", ".join(f"best {key} at {data['x_label']} = {x:g}" for key, x in best.items()
                                      if x is not None))
    print(f"written: {stem.with_suffix('.png')} and {stem.with_suffix('.json')}")
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
