"""The markdown reports of the head-diversity analysis: ``scores.md`` of one checkpoint (the disagreement scores
exp(D) of EMNLP 2018 Table 4 per attention type and Table 5 per layer, on the paper's scale of :mod:`.scores`;
the effect of masking each head, Michel et al. 2019, EMNLP 2020 Figure 2) and ``compare.md`` of several."""

from typing import Dict, List, Mapping, Optional, Sequence

from diverse_fairseq.methods.sites import ATTENTION_TYPES

from .scores import COSINE_NAMES, SCALE, SCORE_NAMES

PAPER_REFERENCE = ("EMNLP 2018 Table 4 (Zh=>En validation, encoder, H = 8): baseline sub 0.882 / pos 0.007 / "
                   "out 0.881; Out regularization: out 0.997; Pos regularization: pos 0.219")


def fmt(value: Optional[float], digits: int = 3) -> str:
    """Paper style (0.882); values too small for that in scientific notation; None as n/a."""
    if value is None:
        return "n/a"
    if value != 0.0 and abs(value) < 10 ** -digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _type_table(first: str, rows: Mapping[str, Mapping]) -> List[str]:
    """EMNLP 2018 Table 4 layout: a row per attention type (or model) of its ``by_type`` entry, Sub./Pos./Out.,
    then the off-diagonal mean cosines."""
    header = [first, "Sub.", "Pos.", "Out.", *(f"mean cos i≠j ({n.capitalize()}.)" for n in COSINE_NAMES)]
    return _table(header, [[name, *(fmt(s.get(n)) for n in SCORE_NAMES),
                            *(fmt((s.get("offdiag_cos") or {}).get(n)) for n in COSINE_NAMES)]
                           for name, s in rows.items()])


def _layer_table(first: str, rows: Mapping[str, Sequence[Mapping]], score: str) -> List[str]:
    """EMNLP 2018 Table 5 layout for one measure: a row per attention type (or model) of its ``by_layer``
    entries, a column per layer."""
    layers = range(1, max(len(entries) for entries in rows.values()) + 1)
    values = {name: {e["layer"]: e[score] for e in entries} for name, entries in rows.items()}
    return _table([first, *map(str, layers)], [[name, *(fmt(v.get(layer)) for layer in layers)]
                                               for name, v in values.items()])


def scores_markdown(payload: Mapping, importance: Optional[Mapping] = None) -> str:
    lines = [
        f"# Head-diversity analysis: {payload['checkpoint']}",
        "",
        f"arch `{payload['arch']}`, data `{payload['data']}` subset `{payload['subset']}`: "
        f"{payload['sentences']} sentences, {payload['source_tokens']} source / {payload['target_tokens']} "
        f"target tokens; teacher-forced NLL {payload['nll']:.4f} nats/token.",
        "",
        "## Disagreement scores exp(D) (EMNLP 2018 Table 4 layout; larger = more diverse heads)",
        "",
        f"Scale: {SCALE}, as in the paper (orthogonal heads: exp(-1/H)). The last two columns are a "
        "different figure, the mean cosine over distinct head pairs (1 = identical heads, 0 = orthogonal).",
        "",
        *_type_table("attention", payload["by_type"]),
        "",
        f"Paper for comparison: {PAPER_REFERENCE}.",
        "",
        "## Per layer (EMNLP 2018 Table 5 layout)",
    ]
    for score in SCORE_NAMES:
        lines += ["", f"**{score}** per layer", "", *_layer_table("attention", payload["by_layer"], score)]
    lines += ["", f"Definition: {payload['definition']}"]
    if importance is not None:  # Δ NLL (and BLEU drop) per head: rows attention type × layer, columns heads
        s = importance["summary"]
        bleu, cell = "", "{delta_nll:+.4f}"
        if importance.get("base_bleu") is not None:
            bleu = (f" Cells: Δ NLL / BLEU drop (BLEU {importance['base_bleu']:.2f} unmasked on the first "
                    f"{importance['bleu_sentences']} sentences).")
            cell += " / {delta_bleu:+.2f}"
        heads: Dict[tuple, Dict[int, Dict]] = {}
        for h in importance["heads"]:
            heads.setdefault((h["attention_type"], h["layer"]), {})[h["head"]] = h
        width = range(1, max(len(v) for v in heads.values()) + 1)
        lines += [
            "",
            "## Head importance by ablation (Michel et al. 2019; EMNLP 2020 Figure 2)",
            "",
            f"Unmasked NLL {importance['base_nll']:.4f} nats/token. Each cell: increase of the NLL when that head's "
            f"output is zeroed (larger = more important; negative = the model is better without it).{bleu} "
            f"Mean {fmt(s['mean_delta_nll'], 4)}, max {fmt(s['max_delta_nll'], 4)}; "
            f"{s['heads_improving_when_masked']} of {s['heads']} heads improve the NLL when masked.",
            "",
            *_table(["attention, layer", *(f"head {i}" for i in width)],
                    [[f"{atype} {layer}", *(cell.format(**by_head[i]) if i in by_head else "" for i in width)]
                     for (atype, layer), by_head in heads.items()]),
        ]
    return "\n".join(lines) + "\n"


def comparison_markdown(payloads: Mapping[str, Mapping], importances: Mapping[str, Optional[Mapping]]) -> str:
    """Several checkpoints side by side: per attention type a Table 4 (rows = models) and Table 5 rows."""
    lines = ["# Head-diversity comparison", ""]
    lines += [f"- **{label}**: `{p['checkpoint']}` (arch `{p['arch']}`, {p['sentences']} sentences of "
              f"`{p['subset']}`, NLL {p['nll']:.4f})" for label, p in payloads.items()]
    types = [t for t in ATTENTION_TYPES if any(t in p["by_type"] for p in payloads.values())]
    for atype in types:
        lines += ["", f"## {atype}: disagreement scores exp(D) (EMNLP 2018 Table 4 layout)", "",
                  f"Scale: {SCALE}; last two columns: mean cosine over distinct head pairs.", "",
                  *_type_table("model", {label: p["by_type"].get(atype, {}) for label, p in payloads.items()})]
        for score in SCORE_NAMES:
            lines += ["", f"{atype}, **{score}** per layer (EMNLP 2018 Table 5 layout)", "",
                      *_layer_table("model", {label: p["by_layer"].get(atype, []) for label, p in payloads.items()},
                                    score)]
    summaries = {label: {"nll": i["base_nll"], **i["summary"]} for label, i in importances.items() if i is not None}
    if summaries:
        lines += ["", "## Head importance (Δ NLL when one head is masked)", "",
                  *_table(["model", "NLL", "mean Δ", "max Δ", "min Δ", "heads better masked"],
                          [[label, *(fmt(s[k], 4) for k in ("nll", "mean_delta_nll", "max_delta_nll", "min_delta_nll")),
                            f"{s['heads_improving_when_masked']}/{s['heads']}"] for label, s in summaries.items()])]
    lines += ["", f"Definition: {next(iter(payloads.values()))['definition']}"]
    return "\n".join(lines) + "\n"
