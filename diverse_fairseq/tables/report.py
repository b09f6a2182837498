"""Summarise a table's runs: mean ± std over seeds, significance against each row's baseline, markdown,
JSON and a picture of the per-seed BLEU.

Significance follows the papers: every row is tested against its own baseline (``baseline:`` in the table;
a Big row against Transformer-Big) with both tests of :mod:`diverse_fairseq.significance`, paired bootstrap
resampling (Koehn 2004, 1000 samples, as NAACL 2019 and the journal) and the sign test (Collins et al. 2005,
as EMNLP 2018), on sacrebleu BLEU of the detokenized test output. With several seeds both run on the
concatenated outputs of all seeds: seed k of a row paired with seed k of its baseline, over the references
repeated once per seed, so a difference must hold across the seeds' outputs to be marked; the report adds
how many seeds beat the baseline's BLEU of the same seed.
"""

import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from ..runs.settings import METRICS, describe
from .disagreement_report import disagreement_entry, disagreement_section
from .probing_report import probing_entry, probing_section
from .records import JobRecord
from .scale import changes as layer_changes
from .spec import Table

UP, DOUBLE_UP = "↑", "⇑"  # paired bootstrap: p < 0.05, p < 0.01 (only improvements are marked)
DAGGER, DOUBLE_DAGGER = "†", "‡"  # sign test: p < 0.05, p < 0.01
SAMPLES = 1000
PARAMS_NOTE = "¹"
# the paper's numbers a table row may carry, with their column names and formats
PAPER_COLUMNS = (("bleu", "paper BLEU", "{:.2f}"), ("params", "paper params", "{:.0f}M"),
                 ("train_speed", "paper train steps/s", "{:.2f}"), ("decode_speed", "paper decode sent/s", "{:.2f}"),
                 ("relative_step_time", "paper step time (rel.)", "{:.2f}"))


def _mean_std(values: List[Optional[float]]):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _fmt(mean, std, digits=2, seeds=1):
    if mean is None:
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if seeds > 1 else f"{mean:.{digits}f}"


def _mark(p_value: float, better: bool, single: str, double: str) -> str:
    return (double if p_value < 0.01 else single if p_value < 0.05 else "") if better else ""


def concatenated(runs: List[JobRecord]):
    """(hypotheses, references) of all seeds' test outputs (evaluate's detokenized files), one seed after the
    other."""
    hyps, refs = [], []
    for record in runs:
        out, tgt = Path(record.eval.out), record.eval.target_lang
        hyps += (out / f"hyp.detok.{tgt}").read_text(encoding="utf-8").split("\n")[:-1]
        refs += (out / f"ref.detok.{tgt}").read_text(encoding="utf-8").split("\n")[:-1]
    return hyps, refs


def significance(table: Table, results: Dict[str, List[JobRecord]], samples: int = SAMPLES) -> Dict[str, Dict]:
    """Both tests of every non-baseline row against its own baseline, on the concatenated seeds.

    Returns ``{row id: {"baseline", "seeds", "sentences", "delta", "bootstrap": {"p_value", "mark"},
    "sign_test": {"better", "worse", "ties", "p_value", "mark"}, "seeds_better", "seeds_total"}}``, where
    ``delta`` is the BLEU difference on the concatenated outputs and marks are given to improvements only;
    ``length_ratio`` holds the row's and the baseline's hypothesis/reference length ratio (BLEU's tokens).
    """
    from ..significance import length_ratio, paired_bootstrap, sign_test

    by_baseline: Dict[str, List[str]] = {}
    for row in table.rows:
        if row.baseline != row.id:
            by_baseline.setdefault(row.baseline, []).append(row.id)
    marks = {}
    for base_id, row_ids in by_baseline.items():
        base_runs = results[base_id]
        seeds = [r.train.seed for r in base_runs]
        base_hyps, refs = concatenated(base_runs)
        systems = {}
        for row_id in row_ids:
            if [r.train.seed for r in results[row_id]] != seeds:
                raise ValueError(f"row {row_id} has seeds {[r.train.seed for r in results[row_id]]}, its baseline "
                                 f"{base_id} {seeds}: the tests pair seed k with seed k")
            hyps, row_refs = concatenated(results[row_id])
            if row_refs != refs:
                raise ValueError(f"rows {row_id} and {base_id} were scored against different references")
            systems[f"row:{row_id}"] = hyps  # prefixed: a row may be called "baseline"
        _, boot = paired_bootstrap(base_hyps, systems, refs, samples=samples)
        base_ratio = length_ratio(base_hyps, refs)
        for row_id in row_ids:
            hyps = systems[f"row:{row_id}"]
            delta = boot[f"row:{row_id}"]["bleu"] - boot["baseline"]["bleu"]
            p_boot = boot[f"row:{row_id}"]["p_value"]
            sign = sign_test(base_hyps, hyps, refs)
            per_seed = zip(results[row_id], base_runs)
            marks[row_id] = {
                "baseline": base_id, "seeds": seeds, "sentences": len(refs), "delta": delta,
                "bootstrap": {"p_value": p_boot, "samples": samples, "mark": _mark(p_boot, delta > 0, UP, DOUBLE_UP)},
                "sign_test": dict(sign, mark=_mark(sign["p_value"], sign["better"] > sign["worse"], DAGGER,
                                                   DOUBLE_DAGGER)),
                "seeds_better": sum(r.eval.bleu > b.eval.bleu for r, b in per_seed),
                "seeds_total": len(seeds),
                "length_ratio": {"row": length_ratio(hyps, refs), "baseline": base_ratio},
            }
    return marks


def embedding_setup(record: JobRecord) -> Dict:
    """How the run's embeddings are shared (as the plan gave fairseq-train) and its dictionary sizes (from the
    data)."""
    data, sizes = Path(record.eval.data), {}
    if data.is_dir():
        for path in sorted(data.glob("dict.*.txt")):
            # fairseq adds 4 special symbols (<s>, <pad>, </s>, <unk>) to the entries of the file
            sizes[path.name.split(".")[1]] = sum(1 for _ in path.open(encoding="utf-8")) + 4
    return {"sharing": record.train.embeddings, "dictionary_sizes": sizes}


def summarise(table: Table, results: Dict[str, List[JobRecord]], dataset: str, scale: str,
              subset: str = "test") -> Dict:
    """Per-row numbers (mean, std and per-seed values), significance marks and the paper's numbers; the BLEU is
    that of ``subset`` (the runner's first ``--subsets``), the other decoded subsets' in ``bleu_by_subset``."""
    marks = significance(table, results)
    rows = []
    for row in table.rows:
        runs = results[row.id]
        evals, trains = [r.eval for r in runs], [r.train for r in runs]
        bleu = _mean_std([e.bleu for e in evals])
        tok = _mean_std([e.tok_bleu for e in evals])
        entry = {
            "id": row.id, "label": row.label, "description": row.description, "baseline": row.baseline,
            "seeds": [t.seed for t in trains],
            "bleu": bleu[0], "bleu_std": bleu[1], "bleu_per_seed": [e.bleu for e in evals],
            "tok_bleu": tok[0], "tok_bleu_std": tok[1], "tok_bleu_per_seed": [e.tok_bleu for e in evals],
            "signature": evals[0].signature,
            # BLEU as the paper's authors scored it (diverse_fairseq.runs.paper_bleu), where the dataset has their
            # scoring
            "paper_bleu": _mean_std([e.paper_bleu for e in evals])[0],
            "paper_bleu_kind": evals[0].paper_bleu_kind,
            "bleu_by_subset": {name: _mean_std([r.evals[name].bleu for r in runs])[0] for name in runs[0].evals},
            "parameters": trains[0].parameters,
            "train_steps_per_second": _mean_std([t.train_steps_per_second for t in trains])[0],
            "decode_sentences_per_second": _mean_std([(e.speed or {}).get("sentences_per_second") for e in evals])[0],
            "updates": trains[0].updates,
            # the last validation of each seed: label-smoothed loss and NLL per target token (base 2, fairseq's)
            "valid_loss_per_seed": [t.valid_loss for t in trains],
            "valid_nll_loss": _mean_std([t.valid_nll_loss for t in trains])[0],
            "valid_nll_loss_per_seed": [t.valid_nll_loss for t in trains],
            "averaged_checkpoints": [t.averaged_checkpoints for t in trains],
            "checkpoint_names": sorted({Path(t.checkpoint).name for t in trains}),
            "best_checkpoint_metric": [t.best_checkpoint_metric for t in trains],
            "evaluated_checkpoint": [describe(t.best_checkpoint_metric, t.averaged_checkpoints) for t in trains],
            "reused_seeds": [r.train.seed for r in runs if r.reused and not r.same_as],
            "trained_at": [t.trained_at for t in trains],
            "embeddings": embedding_setup(runs[0]),
            "paper": row.paper,
            "layers_mapped": layer_changes(row.args, trains[0].args),  # scale.py, at demo scale
            "same_as": runs[0].same_as,  # trained once with an earlier row (runner.same_model_rows)
        }
        if all(r.output_disagreement is not None for r in runs):
            entry["output_disagreement"] = _mean_std([r.output_disagreement for r in runs])[0]
        entry.update(disagreement_entry(table, row, runs))  # EMNLP 2018 Tables 4-5 scores, ours and the paper's
        entry.update(probing_entry(table, row, runs))  # NAACL 2019 Table 1 / journal Table 7 probing accuracies
        if row.id in marks:
            entry["significance"] = marks[row.id]
        if row.figure:
            entry["figure"] = row.figure  # the row's point in a figure (tables/figure.py)
        rows.append(entry)
    summary = {"table": table.table, "title": table.title, "dataset": dataset, "scale": scale, "subset": subset,
               "paper_dataset": table.paper_dataset, "baseline": table.baseline, "rows": rows}
    if table.figure_x:
        summary["figure_x"] = table.figure_x
    return summary


def _params_differ(r: Dict) -> bool:
    paper = r["paper"].get("params")
    return paper is not None and r["parameters"] is not None and round(r["parameters"] / 1e6) != round(paper)


def params_footnote(summary: Dict, rows: List[Dict]) -> str:
    """Why our parameter counts (``rows``) differ from the paper's."""
    emb = rows[0]["embeddings"]
    sizes = emb["dictionary_sizes"]
    vocab = " / ".join(f"{lang} {n:,}" for lang, n in sizes.items())
    sharing = {
        "all": "one embedding matrix shared by the source, the target and the output projection "
               "(`--share-all-embeddings`, joined dictionary)",
        "decoder": "the target embedding shared with the output projection (`--share-decoder-input-output-embed`)",
        "none": "separate embedding matrices",
    }[emb["sharing"]]
    text = (f"{PARAMS_NOTE} Our parameter count differs from the paper's ({', '.join(r['label'] for r in rows)}): "
            f"ours is fairseq's count of the trained parameters of the model trained here, with {sharing}"
            + (f", over our dictionaries ({vocab} types incl. 4 special symbols)" if vocab else "") +
            "; the paper's count comes from its own "
            "vocabulary and embedding set-up, so the embedding matrices account for the difference")
    if summary["scale"] != "paper":
        text += f"; besides, at scale `{summary['scale']}` the model is the small demo setting, not the paper's size"
    return text + "."


def checkpoints_note(rows: List[Dict]) -> str:
    """Which checkpoint was evaluated (:mod:`diverse_fairseq.runs.settings`): a single one (the last, or the
    best by validation BLEU as the THUMT papers' rows, or by validation loss as the EMNLP 2020 rows, at paper
    scale) or an average (from the train records)."""
    def single(r: Dict) -> str:
        metrics = sorted(set(r.get("best_checkpoint_metric") or [None]), key=str)
        return " / ".join(METRICS[m] for m in metrics)

    kinds = {}  # what was evaluated -> labels of the rows
    for r in rows:
        for n in sorted(set(r["averaged_checkpoints"])):
            what = f"the average of the last {n} checkpoints" if n else f"a single checkpoint ({single(r)})"
            kinds.setdefault(what, []).append(r["label"])
    if len(kinds) == 1 and not any(set(r["averaged_checkpoints"]) - {0} for r in rows):
        metrics = {m for r in rows for m in r.get("best_checkpoint_metric") or [None]}
        why = ("as the EMNLP 2020 authors' README tests checkpoint_best.pt (fairseq's best by validation loss)"
               if metrics == {"loss"} else
               "as the journal version reports single models (the other papers do not say)")
        return f"Checkpoints: {next(iter(kinds))} for every run, {why}."
    return "Checkpoints: " + "; ".join(f"{what} for {', '.join(labels)}" for what, labels in kinds.items()) + "."


def reused_note(rows: List[Dict]) -> str:
    """Which runs this invocation reused instead of training them (same cache key)."""
    parts, total = [], sum(len(r["seeds"]) for r in rows)
    for r in rows:
        if r["reused_seeds"]:
            when = sorted({t for t, seed in zip(r["trained_at"], r["seeds"]) if seed in r["reused_seeds"] and t})
            parts.append(f"{r['label']} (seed{'s' if len(r['reused_seeds']) > 1 else ''} "
                         f"{', '.join(map(str, r['reused_seeds']))}, trained {', '.join(when) or 'earlier'})")
    if not parts:
        return "Every run was trained by this invocation."
    reused = sum(len(r["reused_seeds"]) for r in rows)
    return ("Reused from earlier invocations (finished runs made by the same command): " + "; ".join(parts)
            + (". No run was trained by this invocation." if reused == total else
               ". The other runs were trained by this invocation."))


# a length-ratio difference (hyp/ref, BLEU's tokens) below this is "nearly equal": it cannot explain the sign test
LENGTH_RATIO_GAP = 0.01


def longer_outputs_explain(sig: Dict) -> bool:
    """Whether the output lengths account for a sign-test mark without a bootstrap mark: the baseline is shorter
    than the references (length ratio below 1, where BLEU's brevity penalty applies) and the row's outputs are
    longer by at least :data:`LENGTH_RATIO_GAP`. Then each of the row's longer sentences put in place of the
    baseline's softens the brevity penalty, and wins that swap even where its words are not better."""
    lengths = sig.get("length_ratio")
    return bool(sig["sign_test"]["mark"] and not sig["bootstrap"]["mark"] and lengths
                and lengths["baseline"] < 1 and lengths["row"] - lengths["baseline"] >= LENGTH_RATIO_GAP)


def split_tests_note(rows: List[Dict], by_id: Dict[str, Dict]) -> str:
    """The rows one test marks and the other does not: what each test measured (counts, p-values, the output
    lengths), and a reason only where those numbers give one (:func:`longer_outputs_explain`); "" if the two
    tests agree everywhere."""
    split = [r for r in rows if r.get("significance")
             and bool(r["significance"]["bootstrap"]["mark"]) != bool(r["significance"]["sign_test"]["mark"])]
    if not split:
        return ""
    parts, reasons = [], []
    for r in split:
        sig = r["significance"]
        sign, lengths = sig["sign_test"], sig.get("length_ratio")
        base_label = by_id[r["baseline"]]["label"]
        marked = "sign test" if sign["mark"] else "bootstrap"
        part = (f"{r['label']}: sign test {sign['better']} better / {sign['worse']} "
                f"worse / {sign['ties']} ties (p = {sign['p_value']:.2g}), bootstrap p = "
                f"{sig['bootstrap']['p_value']:.2g}, BLEU difference {sig['delta']:+.2f}")
        if lengths:
            part += f", length ratio (hyp/ref) {lengths['row']:.3f} against {base_label}'s {lengths['baseline']:.3f}"
        parts.append(part + f" (only the {marked} marks it)")
        if longer_outputs_explain(sig):
            reasons.append(
                f"{r['label']}'s outputs are longer than {base_label}'s, which are shorter than the references: below "
                f"a length ratio of 1 each longer sentence softens BLEU's brevity penalty, so it wins its swap even "
                f"where its words are not better, and the sign test counts these wins where corpus BLEU does not rise "
                f"significantly")
    return ("The two tests disagree on " + ", ".join(r["label"] for r in split) + ". The sign test counts the "
            "test sentences whose translation, put in place of the baseline's, raises (or lowers) the baseline's "
            "corpus BLEU, each sentence one vote whatever the size of its change; the bootstrap compares the corpus "
            "BLEU of resampled test sets. Measured: " + "; ".join(parts) + "."
            + ("" if not reasons else " " + " ".join(reason[0].upper() + reason[1:] + "." for reason in reasons)))


def to_markdown(summary: Dict) -> str:
    """The summary as a markdown table (BLEU, significance, parameters, speeds, paper numbers) and its notes."""
    rows = summary["rows"]
    by_id = {r["id"]: r for r in rows}
    seeds = max(len(r["seeds"]) for r in rows)
    paper_keys = [c for c in PAPER_COLUMNS if any(c[0] in r["paper"] for r in rows)]
    has_dis = any("output_disagreement" in r for r in rows)
    has_rel = any("relative_step_time" in r["paper"] for r in rows)
    baselines = sorted({r["baseline"] for r in rows}, key=list(by_id).index)
    head = ["System", "BLEU"] + (["per seed"] if seeds > 1 else []) + ["tok. BLEU", "Δ"]
    head += (["seeds > baseline"] if seeds > 1 else []) + (["tested against"] if len(baselines) > 1 else [])
    head += (["Out. disagreement (enc)"] if has_dis else []) + ["params", "train steps/s"]
    head += (["step time (rel.)"] if has_rel else []) + ["decode sent/s"]
    valid = summary.get("subset", "test") != "test"  # a diagnosis on the validation set (docs/demo-findings.md)
    authors = next((r["paper_bleu_kind"] for r in rows if r.get("paper_bleu") is not None), None)
    head += (["valid loss", "valid nll", "test BLEU"] if valid else []) + (["authors' BLEU"] if authors else [])
    head += [c[1] for c in paper_keys]
    seed_list = ", ".join(map(str, rows[0]["seeds"]))
    lines = [f"### {summary['title']}", "",
             f"dataset `{summary['dataset']}`, scale `{summary['scale']}`, seed{'s' if seeds > 1 else ''} {seed_list}"
             + ("" if summary.get("subset", "test") == "test" else
                f"; BLEU of the **{summary['subset']}** set, valid loss / nll: fairseq's last validation (bits)")
             + (" (BLEU: mean ± standard deviation over the seeds)" if seeds > 1 else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        base = by_id[r["baseline"]]
        sig = r.get("significance") or {}
        mark = (sig.get("bootstrap") or {}).get("mark", "") + (sig.get("sign_test") or {}).get("mark", "")
        cells = [r["label"], _fmt(r["bleu"], r["bleu_std"], seeds=seeds) + (" " + mark if seeds > 1 and mark else mark)]
        if seeds > 1:
            cells.append(" / ".join(f"{b:.2f}" for b in r["bleu_per_seed"]))
        cells += [_fmt(r["tok_bleu"], r["tok_bleu_std"], seeds=seeds),
                  "–" if base is r else f"{r['bleu'] - base['bleu']:+.2f}"]
        if seeds > 1:
            cells.append("–" if base is r else f"{sig['seeds_better']}/{sig['seeds_total']}")
        if len(baselines) > 1:
            cells.append("–" if base is r else base["label"])
        if has_dis:
            cells.append(f"{r['output_disagreement']:.3f}" if "output_disagreement" in r else "–")
        cells.append((f"{r['parameters'] / 1e6:.2f}M" if r["parameters"] else "–")
                     + (PARAMS_NOTE if _params_differ(r) else ""))
        ups = r["train_steps_per_second"]
        cells.append(f"{ups:.2f}" if ups else "–")
        if has_rel:
            base_ups = base["train_steps_per_second"]
            cells.append(f"{base_ups / ups:.2f}" if ups and base_ups else "–")
        cells.append(f"{r['decode_sentences_per_second']:.1f}" if r["decode_sentences_per_second"] else "–")
        if valid:
            losses = [v for v in r["valid_loss_per_seed"] if v is not None]
            cells.append(f"{sum(losses) / len(losses):.3f}" if losses else "–")
            cells.append(f"{r['valid_nll_loss']:.3f}" if r["valid_nll_loss"] is not None else "–")
            test = r.get("bleu_by_subset", {}).get("test")
            cells.append("–" if test is None else f"{test:.2f}")
        if authors:  # beside the paper's BLEU: scored as the paper's authors scored theirs
            cells.append("–" if r.get("paper_bleu") is None else f"{r['paper_bleu']:.2f}")
        for key, _, fmt in paper_keys:
            cells.append(fmt.format(r["paper"][key]) if key in r["paper"] else "–")
        lines.append("| " + " | ".join(cells) + " |")

    notes = [
        f"Significance of each row against its baseline (improvements only): {UP} p < 0.05, {DOUBLE_UP} p < 0.01 "
        f"paired bootstrap resampling (Koehn 2004; sacrebleu, {SAMPLES} samples); {DAGGER} p < 0.05, "
        f"{DOUBLE_DAGGER} p < 0.01 sign test (Collins et al. 2005, the test of EMNLP 2018); both on the BLEU "
        f"column (sacrebleu, detokenized). Δ: BLEU minus the baseline's."]
    split = split_tests_note(rows, by_id)
    if split:
        notes.append(split)
    if len(baselines) > 1:
        notes.append("As in the papers, each row is tested against the baseline of its own size: "
                     + "; ".join(f"**{by_id[b]['label']}** for " + ", ".join(
                         r["label"] for r in rows if r["baseline"] == b and r["id"] != b) for b in baselines
                         if any(r["baseline"] == b and r["id"] != b for r in rows)) + ".")
    else:
        notes.append(f"Baseline: **{by_id[baselines[0]]['label']}**.")
    if seeds > 1:
        notes.append(f"With {seeds} seeds, \"per seed\" lists the BLEU of seeds {seed_list} in that order, and both "
                     f"tests run on the outputs of all seeds concatenated (seed k of a row paired with seed k of its "
                     f"baseline, over the test references repeated {seeds} times); \"seeds > baseline\" counts the "
                     f"seeds whose BLEU beats the baseline's of the same seed.")
    notes += [checkpoints_note(rows), reused_note(rows)]
    same = [r for r in rows if r.get("same_as")]
    if same:
        notes.append("Trained once for several rows (at this scale their commands are identical, so their numbers "
                     "are one model's): " + "; ".join(f"{r['label']} = {by_id[r['same_as']]['label']}"
                                                     for r in same) + ".")
    if any(r.get("layers_mapped") for r in rows):
        mapped = "; ".join(f"{r['label']}: {', '.join(r['layers_mapped'])}" for r in rows if r.get("layers_mapped"))
        notes.append("Layer flags mapped from the paper's six-layer model to this one (one rule, "
                     f"diverse_fairseq/tables/scale.py): {mapped}.")
    paper_dataset = summary.get("paper_dataset")
    if paper_keys and (summary["dataset"] != paper_dataset or summary["scale"] != "paper"):
        notes.append("The paper columns are the paper's numbers" + (f" on `{paper_dataset}`" if paper_dataset else "")
                     + f" at full scale, for reference: this run used `{summary['dataset']}` at scale "
                     f"`{summary['scale']}`.")
    if authors:
        notes.append(f"authors' BLEU: {authors} (diverse_fairseq/runs/paper_bleu.py), the number to compare with the "
                     "paper's BLEU; the BLEU column is sacrebleu's on detokenized text.")
    if has_rel:
        notes.append("Step time (rel.): the baseline's training steps/s divided by the row's.")
    differ = [r for r in rows if _params_differ(r)]
    if differ:
        notes.append(params_footnote(summary, differ))
    lines += [""] + [n for note in notes for n in (note, "")]
    described = [r for r in rows if r.get("description")]
    if described:
        lines += ["Rows:", ""] + [f"- **{r['label']}**: {r['description']}" for r in described] + [""]
    lines.append(f"![BLEU per seed]({summary['dataset']}.png)")
    sig = rows[0].get("signature")
    if sig:
        lines += ["", f"sacrebleu signature: `{sig}`"]
    lines += disagreement_section(summary)  # EMNLP 2018 Tables 4-5 layout, only for tables with those paper numbers
    lines += probing_section(summary)  # only for tables with a probing field
    return "\n".join(lines) + "\n"


def plot_seeds(summary: Dict, path: Path) -> Path:
    """Per-seed BLEU of every row (points) and its mean (bar), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows) + 3.0), 3.6))
    for x, r in enumerate(rows):
        values = r["bleu_per_seed"]
        offsets = [(k - (len(values) - 1) / 2) * 0.08 for k in range(len(values))]
        ax.scatter([x + o for o in offsets], values, s=18, color="tab:blue", zorder=3,
                   label="one seed" if x == 0 else None)
        ax.hlines(r["bleu"], x - 0.3, x + 0.3, color="black", linewidth=2, zorder=2,
                  label="mean over seeds" if x == 0 else None)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("BLEU (sacrebleu)")
    ax.set_title(f"{summary['table']}: {summary['dataset']}, scale {summary['scale']}, "
                 f"seeds {', '.join(map(str, rows[0]['seeds']))}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes, never over a point
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(summary: Dict, out_dir: Path) -> Path:
    """``<out_dir>/<dataset>.md``, ``.json`` and ``.png``; returns the markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{summary['dataset']}.md"
    md.write_text(to_markdown(summary), encoding="utf-8")
    (out_dir / f"{summary['dataset']}.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    plot_seeds(summary, out_dir / f"{summary['dataset']}.png")
    return md
