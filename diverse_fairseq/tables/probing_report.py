"""The probing accuracies of a table's runs beside the paper's: NAACL 2019 Table 1 and the journal's Table 7.

A table with a ``probing:`` field has every run's frozen encoder probed on those SentEval tasks
(``steps.probing_scores``); its rows carry the paper's test accuracies as ``paper:`` keys ``probe_sentlen`` …
``probe_coordinv`` (:attr:`diverse_fairseq.data.senteval.Task.paper_key`). :func:`probing_entry` puts the mean
over seeds into a row's summary entry; :func:`probing_section` renders the markdown.
"""

import statistics
from typing import Dict, List

from ..data.senteval import BY_NAME
from .records import JobRecord


def probing_entry(table, row, runs: List[JobRecord]) -> Dict:
    """``{"probing": {"accuracy", "accuracy_per_seed", "majority", "paper"}}`` for a row (empty without probing)."""
    if not runs or not all(r.probing for r in runs):
        return {}
    names = list(runs[0].probing)
    return {"probing": {
        "accuracy": {t: statistics.fmean(r.probing[t]["accuracy"] for r in runs) for t in names},
        "accuracy_per_seed": {t: [r.probing[t]["accuracy"] for r in runs] for t in names},
        "majority": {t: runs[0].probing[t]["majority"] for t in names},
        "paper": {t: row.paper[BY_NAME[t.lower()].paper_key] for t in names
                  if BY_NAME[t.lower()].paper_key in row.paper},
    }}


def probing_section(summary: Dict) -> List[str]:
    """Markdown lines: per row and task our test accuracy and the paper's, then the majority class's share."""
    rows = [r for r in summary["rows"] if r.get("probing")]
    if not rows:
        return []
    names = list(rows[0]["probing"]["accuracy"])
    seeds = max(len(r["seeds"]) for r in rows)
    lines = ["", "#### Linguistic probing (NAACL 2019 Table 1, journal Table 7)", "",
             "Test accuracy (%) of an MLP on the frozen encoder's sentence representation (the mean of the top "
             "encoder layer's outputs over the sentence's tokens), trained on the task's `tr` sentences and selected "
             f"on `va`; mean over {seeds} seed(s), the paper's in brackets. The papers instead train a probing encoder "
             "(3 layers in NAACL 2019, 6 in the journal) with the MLP on each task; the last line is the share of the "
             "most frequent class in the test set (chance level).", "",
             "| System | " + " | ".join(BY_NAME[t.lower()].column for t in names) + " |",
             "|" + "---|" * (len(names) + 1)]
    for r in rows:
        p = r["probing"]
        cells = [f"{p['accuracy'][t]:.2f}" + (f" ({p['paper'][t]:.2f})" if t in p["paper"] else "") for t in names]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    majority = rows[0]["probing"]["majority"]
    lines.append("| majority class | " + " | ".join(f"{majority[t]:.2f}" for t in names) + " |")
    return lines
