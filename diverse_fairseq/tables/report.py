"""Summarise a table's runs: mean ± std over seeds, significance against the baseline, markdown and JSON."""

import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from .disagreement_report import disagreement_entry, disagreement_section
from .spec import Table

UP, DOUBLE_UP = "↑", "⇑"  # p < 0.05, p < 0.01 against the baseline row (paired bootstrap)


def _mean_std(values: List[Optional[float]]):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _fmt(mean, std, digits=2, seeds=1):
    if mean is None:
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if seeds > 1 else f"{mean:.{digits}f}"


def _read_lines(path: Path) -> List[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def significance(results: Dict[str, List[Dict]], baseline_id: str, samples: int = 1000) -> Dict[str, Dict]:
    """Paired bootstrap (sacrebleu's, ``samples`` resamples) of every row against the baseline (first seeds).

    Returns ``{row id: {"p_value", "delta", "mark"}}``; the mark is ↑ / ⇑ only for an improvement.
    """
    from ..significance import paired_bootstrap

    def hyps_and_refs(record):
        out, tgt = Path(record["eval"]["out"]), record["eval"]["target_lang"]
        return _read_lines(out / f"hyp.detok.{tgt}"), _read_lines(out / f"ref.detok.{tgt}")

    base_hyps, refs = hyps_and_refs(results[baseline_id][0])
    systems = {row_id: hyps_and_refs(runs[0])[0] for row_id, runs in results.items() if row_id != baseline_id}
    if not systems:
        return {}
    _, scores = paired_bootstrap(base_hyps, systems, refs, samples=samples)
    marks = {}
    for row_id in systems:
        p, delta = scores[row_id]["p_value"], scores[row_id]["bleu"] - scores["baseline"]["bleu"]
        better = delta > 0
        marks[row_id] = {"p_value": p, "delta": delta,
                         "mark": (DOUBLE_UP if p < 0.01 else UP if p < 0.05 else "") if better else ""}
    return marks


def summarise(table: Table, results: Dict[str, List[Dict]], dataset: str, scale: str) -> Dict:
    """Per-row numbers (mean and std over seeds), significance marks and the paper's numbers."""
    marks = significance(results, table.baseline)
    rows = []
    for row in table.rows:
        runs = results[row.id]
        seeds = len(runs)
        bleu = _mean_std([r["eval"]["bleu"] for r in runs])
        tok = _mean_std([r["eval"].get("tok_bleu") for r in runs])
        entry = {
            "id": row.id, "label": row.label, "seeds": [r["seed"] for r in runs],
            "bleu": bleu[0], "bleu_std": bleu[1], "tok_bleu": tok[0], "tok_bleu_std": tok[1],
            "signature": runs[0]["eval"].get("signature"),
            "parameters": runs[0]["parameters"],
            "train_steps_per_second": _mean_std([r["train_steps_per_second"] for r in runs])[0],
            "decode_sentences_per_second": _mean_std(
                [(r["eval"].get("speed") or {}).get("sentences_per_second") for r in runs])[0],
            "updates": runs[0]["updates"],
            "paper": row.paper if dataset == table.paper_dataset else {},
        }
        for key in ("output_disagreement",):
            if all(key in r for r in runs):
                entry[key] = _mean_std([r[key] for r in runs])[0]
        entry.update(disagreement_entry(table, row, runs))  # EMNLP 2018 Tables 4-5 scores, ours and the paper's
        if row.id in marks:
            entry["significance"] = marks[row.id]
        rows.append(entry)
    return {"table": table.table, "title": table.title, "dataset": dataset, "scale": scale,
            "baseline": table.baseline, "rows": rows}


def to_markdown(summary: Dict) -> str:
    """The summary as a markdown table (BLEU, significance, parameters, speeds, paper numbers)."""
    rows = summary["rows"]
    seeds = max(len(r["seeds"]) for r in rows)
    has_paper = any(r["paper"] for r in rows)
    has_dis = any("output_disagreement" in r for r in rows)
    head = ["System", "BLEU", "tok. BLEU", "Δ", "params", "train steps/s", "decode sent/s"]
    if has_dis:
        head.insert(4, "Out. disagreement (enc)")
    if has_paper:
        head.append("paper BLEU")
    lines = [f"### {summary['title']}", "",
             f"dataset `{summary['dataset']}`, scale `{summary['scale']}`, seeds {rows[0]['seeds']}; "
             f"{UP} p < 0.05, {DOUBLE_UP} p < 0.01 against **{summary['baseline']}** (paired bootstrap, "
             f"1000 samples)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base_bleu = next(r["bleu"] for r in rows if r["id"] == summary["baseline"])
    for r in rows:
        mark = (r.get("significance") or {}).get("mark", "")
        cells = [r["label"], _fmt(r["bleu"], r["bleu_std"], seeds=seeds) + mark,
                 _fmt(r["tok_bleu"], r["tok_bleu_std"], seeds=seeds),
                 "–" if r["id"] == summary["baseline"] else f"{r['bleu'] - base_bleu:+.2f}",
                 f"{r['parameters'] / 1e6:.2f}M" if r["parameters"] else "–",
                 f"{r['train_steps_per_second']:.2f}" if r["train_steps_per_second"] else "–",
                 f"{r['decode_sentences_per_second']:.1f}" if r["decode_sentences_per_second"] else "–"]
        if has_dis:
            cells.insert(4, f"{r['output_disagreement']:.3f}" if "output_disagreement" in r else "–")
        if has_paper:
            cells.append(f"{r['paper']['bleu']:.2f}" if "bleu" in r["paper"] else "–")
        lines.append("| " + " | ".join(cells) + " |")
    sig = rows[0].get("signature")
    if sig:
        lines += ["", f"sacrebleu signature: `{sig}`"]
    lines += disagreement_section(summary)  # EMNLP 2018 Tables 4-5 layout, only for tables with those paper numbers
    return "\n".join(lines) + "\n"


def write_report(summary: Dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{summary['dataset']}.md"
    md.write_text(to_markdown(summary), encoding="utf-8")
    (out_dir / f"{summary['dataset']}.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    return md
