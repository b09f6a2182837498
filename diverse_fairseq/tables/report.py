"""Summarise a table's runs: mean ± std over seeds, significance against each row's baseline, markdown, JSON and a
picture of the per-seed BLEU.

Significance follows the papers: every row is tested against its own baseline (``baseline:`` in the table) with both
tests of :mod:`diverse_fairseq.significance` on sacrebleu BLEU of the detokenized test output. With several seeds both
run on the concatenated outputs of all seeds (seed k of a row paired with seed k of its baseline), so a difference
must hold across the seeds' outputs to be marked.

Where the rows carry the paper's numbers, ours are put beside them: the disagreement scores of EMNLP 2018 Tables 4-5
(``paper:`` keys ``sub_score``, ``pos_score``, ``out_score``, ``pos_score_layer1`` …, on the paper's scale of
:mod:`diverse_fairseq.analysis.scores`) and the probing accuracies of NAACL 2019 Table 1 / the journal's Table 7
(``probe_sentlen`` …, :attr:`diverse_fairseq.data.senteval.Task.paper_key`).
"""

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..data.senteval import BY_NAME
from ..runs.settings import METRICS, describe
from ..significance import DEFAULT_SAMPLES, length_ratio, mark, paired_bootstrap, sign_test, unmark_low_bleu
from .records import JobRecord
from .scale import changes as layer_changes
from .spec import Table

UP, DOUBLE_UP = "↑", "⇑"  # paired bootstrap: p < 0.05, p < 0.01 (only improvements are marked)
DAGGER, DOUBLE_DAGGER = "†", "‡"  # sign test: p < 0.05, p < 0.01
PARAMS_NOTE = "¹"
# the paper's numbers a table row may carry, with their column names and formats
PAPER_COLUMNS = (("bleu", "paper BLEU", "{:.2f}"), ("params", "paper params", "{:.0f}M"),
                 ("train_speed", "paper train steps/s", "{:.2f}"), ("decode_speed", "paper decode sent/s", "{:.2f}"),
                 ("relative_step_time", "paper step time (rel.)", "{:.2f}"))
SCORES = (("sub", "Sub."), ("pos", "Pos."), ("out", "Out."))  # EMNLP 2018's disagreement scores
ATTENTION = "enc_self"  # the paper's Tables 4-5 measure the encoder
PAPER_LAYER_KEY = "pos_score_layer{}"
# a length-ratio difference (hyp/ref, BLEU's tokens) below this is "nearly equal": it cannot explain the sign test
LENGTH_RATIO_GAP = 0.01


def _mean_std(values: Sequence[Optional[float]]):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def mean(values: Sequence[Optional[float]]) -> Optional[float]:
    """The mean over seeds of the values that are not None; None when none is."""
    return _mean_std(values)[0]


def _cell(value: Optional[float], spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _score(value: Optional[float]) -> str:  # a disagreement score: tiny ones in scientific notation
    return _cell(value, ".1e" if value is not None and 0 < abs(value) < 1e-3 else ".3f")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def concatenated(runs: List[JobRecord]):
    """(hypotheses, references) of all seeds' detokenized test outputs, one seed after the other."""
    hyps, refs = [], []
    for record in runs:
        out, tgt = Path(record.eval.out), record.eval.target_lang
        hyps += (out / f"hyp.detok.{tgt}").read_text(encoding="utf-8").split("\n")[:-1]
        refs += (out / f"ref.detok.{tgt}").read_text(encoding="utf-8").split("\n")[:-1]
    return hyps, refs


def significance(table: Table, results: Dict[str, List[JobRecord]], samples: int = DEFAULT_SAMPLES) -> Dict[str, Dict]:
    """Both tests of every non-baseline row against its own baseline, on the concatenated seeds: ``{row id: ...}``
    (marks for improvements only; ``length_ratio``: hypothesis/reference length in BLEU's tokens)."""
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
            hyps, p_boot = systems[f"row:{row_id}"], boot[f"row:{row_id}"]["p_value"]
            delta = boot[f"row:{row_id}"]["bleu"] - boot["baseline"]["bleu"]
            sign = sign_test(base_hyps, hyps, refs)
            marks[row_id] = {
                "baseline": base_id, "seeds": seeds, "sentences": len(refs), "delta": delta,
                "bootstrap": {"p_value": p_boot, "samples": samples,
                              "mark": mark(p_boot, UP, DOUBLE_UP) if delta > 0 else ""},
                "sign_test": dict(sign, mark=mark(sign["p_value"], DAGGER, DOUBLE_DAGGER)
                                  if sign["better"] > sign["worse"] else ""),
                "seeds_better": sum(r.eval.bleu > b.eval.bleu for r, b in zip(results[row_id], base_runs)),
                "seeds_total": len(seeds),
                "length_ratio": {"row": length_ratio(hyps, refs), "baseline": base_ratio},
            }
            marks[row_id] = unmark_low_bleu(marks[row_id], boot["baseline"]["bleu"], boot[f"row:{row_id}"]["bleu"])
    return marks


def _mean_scores(per_seed: Sequence[Dict]) -> Dict:
    """Mean over seeds of ``{type: {"sub", "pos", "out", "layers": [{"layer", "heads", "sub", "pos", "out"}]}}``."""
    out = {}
    for atype in per_seed[0]:
        runs = [d[atype] for d in per_seed if atype in d]
        depth = min(len(r.get("layers", [])) for r in runs)
        out[atype] = {name: mean([r.get(name) for r in runs]) for name, _ in SCORES}
        out[atype]["layers"] = [
            {"layer": runs[0]["layers"][i]["layer"], "heads": runs[0]["layers"][i].get("heads"),
             **{name: mean([r["layers"][i].get(name) for r in runs]) for name, _ in SCORES}}
            for i in range(depth)]
    return out


@dataclass(frozen=True)
class RowSummary:
    """One row of the report: its numbers over the seeds (mean, standard deviation, per seed), read from its runs'
    :class:`JobRecord` s, beside the paper's; ``asdict`` is the row of ``<dataset>.json``."""

    id: str
    label: str
    description: str
    baseline: str
    seeds: List[int]
    bleu: Optional[float]  # of the report's subset (the runner's first --subsets)
    bleu_std: Optional[float]
    bleu_per_seed: List[float]
    tok_bleu: Optional[float]
    tok_bleu_std: Optional[float]
    tok_bleu_per_seed: List[float]
    signature: str
    paper_bleu: Optional[float]  # as the paper's authors scored it (runs/paper_bleu.py), where the dataset has theirs
    paper_bleu_kind: Optional[str]
    bleu_by_subset: Dict[str, Optional[float]]  # every decoded subset's
    parameters: Optional[int]
    train_steps_per_second: Optional[float]
    decode_sentences_per_second: Optional[float]
    updates: int
    # the last validation of each seed: label-smoothed loss and NLL per target token (base 2, fairseq's)
    valid_loss_per_seed: List[Optional[float]]
    valid_nll_loss: Optional[float]
    valid_nll_loss_per_seed: List[Optional[float]]
    averaged_checkpoints: List[int]
    checkpoint_names: List[str]
    best_checkpoint_metric: List[Optional[str]]
    evaluated_checkpoint: List[str]
    reused_seeds: List[int]  # seeds whose run an earlier invocation trained
    trained_at: List[str]
    # how the embeddings are shared, the dictionary sizes (fairseq adds <s>, <pad>, </s>, <unk>)
    embeddings: Dict
    paper: Dict[str, float]
    layers_mapped: List[str]  # scale.py, at demo scale
    same_as: Optional[str]  # trained once with an earlier row (job.table_jobs)
    output_disagreement: Optional[float] = None  # EMNLP 2018's Out. of the encoder (None: no head pairs)
    disagreement: Optional[Dict] = None  # the mean over seeds of the head-diversity scores
    paper_disagreement: Optional[Dict] = None  # the row's paper scores (Table 4/5 keys) and their dataset
    probing: Optional[Dict] = None  # {"accuracy", "accuracy_per_seed", "majority", "paper"}
    significance: Optional[Dict] = None  # against the row's baseline (:func:`significance`)
    figure: Optional[Dict] = None  # the row's point in a figure (tables/figure.py)


@dataclass(frozen=True)
class Summary:
    """A table's report: ``<dataset>.json`` (``asdict``), the markdown and the picture are made from it."""

    table: str
    title: str
    dataset: str
    scale: str
    subset: str  # the subset of the BLEU column
    paper_dataset: Optional[str]
    baseline: str
    rows: List[RowSummary]
    figure_x: Optional[str] = None  # a figure's x-axis label (tables/figure.py)


def disagreement_entry(table: Table, row, runs: List[JobRecord]) -> Dict:
    """``{"disagreement": mean over seeds, "paper_disagreement": the row's paper scores (Table 4/5 keys) and their
    dataset}`` (fields of :class:`RowSummary`), the latter whatever dataset ran (the scale, unlike BLEU, compares
    across data); {} without scores."""
    if not runs or not all(r.disagreement for r in runs):
        return {}
    paper = {k: v for k, v in row.paper.items() if k.endswith("_score") or k.startswith("pos_score_layer")}
    entry = {"disagreement": _mean_scores([r.disagreement for r in runs])}
    if paper:
        entry["paper_disagreement"] = {"dataset": table.paper_dataset, "scores": paper}
    return entry


def probing_entry(table: Table, row, runs: List[JobRecord]) -> Dict:
    """``{"probing": {"accuracy", "accuracy_per_seed", "majority", "paper"}}`` (a field of :class:`RowSummary`) for
    a row (empty without probing)."""
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


def summarise(table: Table, results: Dict[str, List[JobRecord]], dataset: str, scale: str,
              subset: str = "test") -> Summary:
    """Per-row numbers (mean, std and per-seed values), significance marks and the paper's numbers; the BLEU is
    that of ``subset`` (the runner's first ``--subsets``), the other decoded subsets' in ``bleu_by_subset``."""
    marks, rows = significance(table, results), []
    for row in table.rows:
        runs = results[row.id]
        evals, trains = [r.eval for r in runs], [r.train for r in runs]
        (bleu, bleu_std), (tok, tok_std) = _mean_std([e.bleu for e in evals]), _mean_std([e.tok_bleu for e in evals])
        rows.append(RowSummary(
            id=row.id, label=row.label, description=row.description, baseline=row.baseline,
            seeds=[t.seed for t in trains], bleu=bleu, bleu_std=bleu_std, bleu_per_seed=[e.bleu for e in evals],
            tok_bleu=tok, tok_bleu_std=tok_std, tok_bleu_per_seed=[e.tok_bleu for e in evals],
            signature=evals[0].signature, paper_bleu=mean([e.paper_bleu for e in evals]),
            paper_bleu_kind=evals[0].paper_bleu_kind,
            bleu_by_subset={name: mean([r.evals[name].bleu for r in runs]) for name in runs[0].evals},
            parameters=trains[0].parameters, train_steps_per_second=mean([t.train_steps_per_second for t in trains]),
            decode_sentences_per_second=mean([(e.speed or {}).get("sentences_per_second") for e in evals]),
            updates=trains[0].updates, valid_loss_per_seed=[t.valid_loss for t in trains],
            valid_nll_loss=mean([t.valid_nll_loss for t in trains]),
            valid_nll_loss_per_seed=[t.valid_nll_loss for t in trains],
            averaged_checkpoints=[t.averaged_checkpoints for t in trains],
            checkpoint_names=sorted({Path(t.checkpoint).name for t in trains}),
            best_checkpoint_metric=[t.best_checkpoint_metric for t in trains],
            evaluated_checkpoint=[describe(t.best_checkpoint_metric, t.averaged_checkpoints) for t in trains],
            reused_seeds=[r.train.seed for r in runs if r.reused and not r.same_as],
            trained_at=[t.trained_at for t in trains],
            embeddings={"sharing": trains[0].embeddings, "dictionary_sizes": {
                path.name.split(".")[1]: sum(1 for _ in path.open(encoding="utf-8")) + 4
                for path in sorted(Path(evals[0].data).glob("dict.*.txt"))}},
            paper=row.paper, layers_mapped=layer_changes(row.args, trains[0].args), same_as=runs[0].same_as,
            output_disagreement=mean([r.output_disagreement for r in runs]) if all(
                r.output_disagreement is not None for r in runs) else None,
            significance=marks.get(row.id), figure=row.figure,
            **disagreement_entry(table, row, runs), **probing_entry(table, row, runs)))
    return Summary(table=table.table, title=table.title, dataset=dataset, scale=scale, subset=subset,
                   paper_dataset=table.paper_dataset, baseline=table.baseline, rows=rows, figure_x=table.figure_x)


def _params_differ(r: RowSummary) -> bool:  # in millions, rounded
    paper = r.paper.get("params")
    return paper is not None and r.parameters is not None and round(r.parameters / 1e6) != round(paper)


def params_footnote(summary: Summary, rows: List[RowSummary]) -> str:
    """Why our parameter counts (``rows``) differ from the paper's."""
    emb = rows[0].embeddings
    vocab = " / ".join(f"{lang} {n:,}" for lang, n in emb["dictionary_sizes"].items())
    sharing = {
        "all": "one embedding matrix shared by the source, the target and the output projection "
               "(`--share-all-embeddings`, joined dictionary)",
        "decoder": "the target embedding shared with the output projection (`--share-decoder-input-output-embed`)",
        "none": "separate embedding matrices",
    }[emb["sharing"]]
    text = (f"{PARAMS_NOTE} Our parameter count differs from the paper's ({', '.join(r.label for r in rows)}): "
            f"ours is fairseq's count of the trained parameters of the model trained here, with {sharing}"
            + (f", over our dictionaries ({vocab} types incl. 4 special symbols)" if vocab else "") +
            "; the paper's count comes from its own vocabulary and embedding set-up, so the embedding matrices "
            "account for the difference")
    if summary.scale != "paper":
        text += f"; besides, at scale `{summary.scale}` the model is the small demo setting, not the paper's size"
    return text + "."


def checkpoints_note(rows: List[RowSummary]) -> str:
    """Which checkpoint was evaluated (:mod:`diverse_fairseq.runs.settings`): a single one or an average."""
    kinds = {}  # what was evaluated -> labels of the rows
    for r in rows:
        single = " / ".join(METRICS[m] for m in sorted(set(r.best_checkpoint_metric), key=str))
        for n in sorted(set(r.averaged_checkpoints)):
            what = f"the average of the last {n} checkpoints" if n else f"a single checkpoint ({single})"
            kinds.setdefault(what, []).append(r.label)
    if len(kinds) == 1 and not any(set(r.averaged_checkpoints) - {0} for r in rows):
        metrics = {m for r in rows for m in r.best_checkpoint_metric}
        why = ("as the EMNLP 2020 authors' README tests checkpoint_best.pt (fairseq's best by validation loss)"
               if metrics == {"loss"} else
               "as the journal version reports single models (the other papers do not say)")
        return f"Checkpoints: {next(iter(kinds))} for every run, {why}."
    return "Checkpoints: " + "; ".join(f"{what} for {', '.join(labels)}" for what, labels in kinds.items()) + "."


def reused_note(rows: List[RowSummary]) -> str:
    """Which runs this invocation reused instead of training them (same cache key)."""
    parts = []
    for r in rows:
        if r.reused_seeds:
            when = sorted({t for t, seed in zip(r.trained_at, r.seeds) if seed in r.reused_seeds and t})
            parts.append(f"{r.label} (seed{'s' if len(r.reused_seeds) > 1 else ''} "
                         f"{', '.join(map(str, r.reused_seeds))}, trained {', '.join(when) or 'earlier'})")
    if not parts:
        return "Every run was trained by this invocation."
    every = sum(len(r.reused_seeds) for r in rows) == sum(len(r.seeds) for r in rows)
    return ("Reused from earlier invocations (finished runs made by the same command): " + "; ".join(parts)
            + (". No run was trained by this invocation." if every else
               ". The other runs were trained by this invocation."))


def longer_outputs_explain(sig: Dict) -> bool:
    """Whether the output lengths account for a sign-test mark without a bootstrap mark: the baseline is shorter
    than the references (length ratio below 1, where BLEU's brevity penalty applies) and the row's outputs are
    longer by at least :data:`LENGTH_RATIO_GAP`. Then each of the row's longer sentences put in place of the
    baseline's softens the brevity penalty, and wins that swap even where its words are not better."""
    lengths = sig["length_ratio"]
    return bool(sig["sign_test"]["mark"] and not sig["bootstrap"]["mark"]
                and lengths["baseline"] < 1 and lengths["row"] - lengths["baseline"] >= LENGTH_RATIO_GAP)


def split_tests_note(rows: List[RowSummary], by_id: Dict[str, RowSummary]) -> str:
    """The rows one test marks and the other does not: what each test measured, and a reason only where those
    numbers give one (:func:`longer_outputs_explain`); "" if the two tests agree everywhere."""
    split = [r for r in rows if r.significance
             and bool(r.significance["bootstrap"]["mark"]) != bool(r.significance["sign_test"]["mark"])]
    if not split:
        return ""
    parts, reasons = [], []
    for r in split:
        sig = r.significance
        sign, lengths = sig["sign_test"], sig["length_ratio"]
        base_label = by_id[r.baseline].label
        parts.append(f"{r.label}: sign test {sign['better']} better / {sign['worse']} worse / {sign['ties']} ties "
                     f"(p = {sign['p_value']:.2g}), bootstrap p = {sig['bootstrap']['p_value']:.2g}, BLEU difference "
                     f"{sig['delta']:+.2f}, length ratio (hyp/ref) {lengths['row']:.3f} against {base_label}'s "
                     f"{lengths['baseline']:.3f} (only the {'sign test' if sign['mark'] else 'bootstrap'} marks it)")
        if longer_outputs_explain(sig):
            reasons.append(
                f"{r.label}'s outputs are longer than {base_label}'s, which are shorter than the references: below "
                f"a length ratio of 1 each longer sentence softens BLEU's brevity penalty, so it wins its swap even "
                f"where its words are not better, and the sign test counts these wins where corpus BLEU does not rise "
                f"significantly")
    return ("The two tests disagree on " + ", ".join(r.label for r in split) + ". The sign test counts the "
            "test sentences whose translation, put in place of the baseline's, raises (or lowers) the baseline's "
            "corpus BLEU, each sentence one vote whatever the size of its change; the bootstrap compares the corpus "
            "BLEU of resampled test sets. Measured: " + "; ".join(parts) + "."
            + "".join(f" {reason[0].upper()}{reason[1:]}." for reason in reasons))


def to_markdown(summary: Summary) -> str:
    """The summary as a markdown table (BLEU, significance, parameters, speeds, paper numbers) and its notes."""
    rows = summary.rows
    by_id = {r.id: r for r in rows}
    seeds = max(len(r.seeds) for r in rows)
    paper_keys = [c for c in PAPER_COLUMNS if any(c[0] in r.paper for r in rows)]
    has_rel = any("relative_step_time" in r.paper for r in rows)
    baselines = sorted({r.baseline for r in rows}, key=list(by_id).index)
    valid = summary.subset != "test"  # a diagnosis on the validation set (docs/demo-findings.md)
    authors = next((r.paper_bleu_kind for r in rows if r.paper_bleu is not None), None)

    def mean_std(value, std):
        return "–" if value is None else f"{value:.2f}" + (f" ± {std:.2f}" if seeds > 1 else "")

    def bleu(r, b, sig):
        marks = sig.get("bootstrap", {}).get("mark", "") + sig.get("sign_test", {}).get("mark", "")
        return mean_std(r.bleu, r.bleu_std) + (" " + marks if seeds > 1 and marks else marks)

    def step_time(r, b, s):
        ups, base_ups = r.train_steps_per_second, b.train_steps_per_second
        return f"{base_ups / ups:.2f}" if ups and base_ups else "–"

    columns = [  # (header, shown, cell of row r with its baseline row b and its significance s)
        ("System", True, lambda r, b, s: r.label),
        ("BLEU", True, bleu),
        ("per seed", seeds > 1, lambda r, b, s: " / ".join(f"{v:.2f}" for v in r.bleu_per_seed)),
        ("tok. BLEU", True, lambda r, b, s: mean_std(r.tok_bleu, r.tok_bleu_std)),
        ("Δ", True, lambda r, b, s: "–" if b is r else f"{r.bleu - b.bleu:+.2f}"),
        ("seeds > baseline", seeds > 1, lambda r, b, s: "–" if b is r else f"{s['seeds_better']}/{s['seeds_total']}"),
        ("tested against", len(baselines) > 1, lambda r, b, s: "–" if b is r else b.label),
        ("Out. disagreement (enc)", any(r.output_disagreement is not None for r in rows),
         lambda r, b, s: _cell(r.output_disagreement, ".3f")),
        ("params", True, lambda r, b, s: (f"{r.parameters / 1e6:.2f}M" if r.parameters else "–")
         + (PARAMS_NOTE if _params_differ(r) else "")),
        ("train steps/s", True, lambda r, b, s: _cell(r.train_steps_per_second or None)),
        ("step time (rel.)", has_rel, step_time),
        ("decode sent/s", True, lambda r, b, s: _cell(r.decode_sentences_per_second or None, ".1f")),
        ("valid loss", valid, lambda r, b, s: _cell(mean(r.valid_loss_per_seed), ".3f")),
        ("valid nll", valid, lambda r, b, s: _cell(r.valid_nll_loss, ".3f")),
        ("test BLEU", valid, lambda r, b, s: _cell(r.bleu_by_subset.get("test"))),
        # beside the paper's BLEU: scored as the paper's authors scored theirs
        ("authors' BLEU", authors, lambda r, b, s: _cell(r.paper_bleu)),
        *((name, True, lambda r, b, s, key=key, fmt=fmt: fmt.format(r.paper[key]) if key in r.paper else "–")
          for key, name, fmt in paper_keys),
    ]
    shown = [(name, cell) for name, show, cell in columns if show]
    seed_list = ", ".join(map(str, rows[0].seeds))
    lines = [f"### {summary.title}", "",
             f"dataset `{summary.dataset}`, scale `{summary.scale}`, seed{'s' if seeds > 1 else ''} {seed_list}"
             + (f"; BLEU of the **{summary.subset}** set, valid loss / nll: fairseq's last validation (bits)"
                if valid else "")
             + (" (BLEU: mean ± standard deviation over the seeds)" if seeds > 1 else ""), ""]
    lines += markdown_table([name for name, _ in shown], [
        [cell(r, by_id[r.baseline], r.significance or {}) for _, cell in shown] for r in rows])

    notes = [
        f"Significance of each row against its baseline (improvements only): {UP} p < 0.05, {DOUBLE_UP} p < 0.01 "
        f"paired bootstrap resampling (Koehn 2004; sacrebleu, {DEFAULT_SAMPLES} samples); {DAGGER} p < 0.05, "
        f"{DOUBLE_DAGGER} p < 0.01 sign test (Collins et al. 2005, the test of EMNLP 2018); both on the BLEU "
        f"column (sacrebleu, detokenized). Δ: BLEU minus the baseline's.",
        split_tests_note(rows, by_id)]
    if len(baselines) > 1:
        tested = {b: [r.label for r in rows if r.baseline == b and r.id != b] for b in baselines}
        notes.append("As in the papers, each row is tested against the baseline of its own size: " + "; ".join(
            f"**{by_id[b].label}** for {', '.join(labels)}" for b, labels in tested.items() if labels) + ".")
    else:
        notes.append(f"Baseline: **{by_id[baselines[0]].label}**.")
    if seeds > 1:
        notes.append(f"With {seeds} seeds, \"per seed\" lists the BLEU of seeds {seed_list} in that order, and both "
                     f"tests run on the outputs of all seeds concatenated (seed k of a row paired with seed k of its "
                     f"baseline, over the test references repeated {seeds} times); \"seeds > baseline\" counts the "
                     f"seeds whose BLEU beats the baseline's of the same seed.")
    notes += [checkpoints_note(rows), reused_note(rows)]
    if any(r.same_as for r in rows):
        notes.append("Trained once for several rows (at this scale their commands are identical, so their numbers "
                     "are one model's): " + "; ".join(f"{r.label} = {by_id[r.same_as].label}"
                                                     for r in rows if r.same_as) + ".")
    if any(r.layers_mapped for r in rows):
        mapped = "; ".join(f"{r.label}: {', '.join(r.layers_mapped)}" for r in rows if r.layers_mapped)
        notes.append("Layer flags mapped from the paper's six-layer model to this one (one rule, "
                     f"diverse_fairseq/tables/scale.py): {mapped}.")
    paper_dataset = summary.paper_dataset
    if paper_keys and (summary.dataset != paper_dataset or summary.scale != "paper"):
        notes.append("The paper columns are the paper's numbers" + (f" on `{paper_dataset}`" if paper_dataset else "")
                     + f" at full scale, for reference: this run used `{summary.dataset}` at scale "
                     f"`{summary.scale}`.")
    if authors:
        notes.append(f"authors' BLEU: {authors} (diverse_fairseq/runs/paper_bleu.py), the number to compare with the "
                     "paper's BLEU; the BLEU column is sacrebleu's on detokenized text.")
    if has_rel:
        notes.append("Step time (rel.): the baseline's training steps/s divided by the row's.")
    differ = [r for r in rows if _params_differ(r)]
    if differ:
        notes.append(params_footnote(summary, differ))
    lines += [""] + [n for note in notes if note for n in (note, "")]
    described = [r for r in rows if r.description]
    if described:
        lines += ["Rows:", ""] + [f"- **{r.label}**: {r.description}" for r in described] + [""]
    lines.append(f"![BLEU per seed]({summary.dataset}.png)")
    if rows[0].signature:
        lines += ["", f"sacrebleu signature: `{rows[0].signature}`"]
    return "\n".join(lines + disagreement_section(summary) + probing_section(summary)) + "\n"


def disagreement_section(summary: Summary) -> List[str]:
    """Markdown lines: Table 4 (Sub./Pos./Out. of the encoder) and Table 5 (per encoder layer), ours beside
    the paper's. Nothing when no row carries both our scores and the paper's."""
    rows = [r for r in summary.rows if ATTENTION in (r.disagreement or {})]
    if not any(r.paper_disagreement for r in rows):
        return []
    paper_data = next(r.paper_disagreement["dataset"] for r in rows if r.paper_disagreement)
    paper = {r.id: (r.paper_disagreement or {}).get("scores", {}) for r in rows}
    ours = {r.id: r.disagreement[ATTENTION] for r in rows}
    heads = sorted({e["heads"] for o in ours.values() for e in o["layers"] if e.get("heads")})
    layers = range(1, max(len(o["layers"]) for o in ours.values()) + 1)
    prefix = PAPER_LAYER_KEY.format("")
    paper_layers = range(1, max((int(k[len(prefix):]) for p in paper.values() for k in p if k.startswith(prefix)),
                                default=0) + 1)
    h_note = ", ".join(f"exp(−1/{h}) = {math.exp(-1 / h):.3f} at H = {h}" for h in heads)

    def ours_layer(row_id: str, name: str) -> List[str]:
        by_layer = {e["layer"]: e for e in ours[row_id]["layers"]}
        return [_score(by_layer.get(layer, {}).get(name)) for layer in layers]

    return [
        "", "#### Disagreement scores of the encoder self-attention (EMNLP 2018 Tables 4–5)", "",
        f"exp(D) on the paper's scale, exp(−mean over all H² head pairs, self-pairs included): larger = more diverse "
        f"heads, at most 1.0; mutually orthogonal heads give exp(−1/H) ({h_note}; the paper's H = 8 gives 0.882). "
        f"Ours: the whole `{summary.dataset}` validation set, teacher-forced, mean over "
        f"{max(len(r.seeds) for r in rows)} seed(s); paper: `{paper_data}` validation set. Per attention type and "
        "layer (all three types) in the JSON, key `disagreement`.", "",
        "Table 4 layout (per type: exp of the mean over layers of the similarity, the geometric mean of the layer "
        "scores):", "",
        *markdown_table(["Regularization", *(n for _, n in SCORES), *(f"paper {n}" for _, n in SCORES)],
                        [[r.label, *(_score(ours[r.id][k]) for k, _ in SCORES),
                          *(_score(paper[r.id].get(f"{k}_score")) for k, _ in SCORES)] for r in rows]),
        "", f"Table 5 layout, Pos. per encoder layer (1 = bottom; ours {len(layers)} layers, the paper's "
            f"{len(paper_layers)}):", "",
        *markdown_table(["Regularization", *map(str, layers), *(f"paper {layer}" for layer in paper_layers)],
                        [[r.label, *ours_layer(r.id, "pos"),
                          *(_score(paper[r.id].get(PAPER_LAYER_KEY.format(layer))) for layer in paper_layers)]
                         for r in rows]),
        "", "Sub. and Out. per encoder layer (ours; the paper reports positions only):", "",
        *markdown_table(["Regularization", *(f"{name} {layer}" for name in ("Sub.", "Out.") for layer in layers)],
                        [[r.label, *ours_layer(r.id, "sub"), *ours_layer(r.id, "out")] for r in rows])]


def probing_section(summary: Summary) -> List[str]:
    """Markdown lines: per row and task our test accuracy and the paper's, then the majority class's share."""
    rows = [r for r in summary.rows if r.probing]
    if not rows:
        return []
    names = list(rows[0].probing["accuracy"])
    majority = rows[0].probing["majority"]
    return ["", "#### Linguistic probing (NAACL 2019 Table 1, journal Table 7)", "",
            "Test accuracy (%) of an MLP on the frozen encoder's sentence representation (the mean of the top encoder "
            "layer's outputs over the sentence's tokens), trained on the task's `tr` sentences and selected on `va`; "
            f"mean over {max(len(r.seeds) for r in rows)} seed(s), the paper's in brackets. The papers instead "
            "train a probing encoder (3 layers in NAACL 2019, 6 in the journal) with the MLP on each task; the last "
            "line is the share of the most frequent class in the test set (chance level).", "",
            *markdown_table(["System", *(BY_NAME[t.lower()].column for t in names)], [
                *([r.label, *(f"{r.probing['accuracy'][t]:.2f}" + (
                    f" ({r.probing['paper'][t]:.2f})" if t in r.probing["paper"] else "") for t in names)]
                  for r in rows),
                ["majority class", *(f"{majority[t]:.2f}" for t in names)]])]


def pyplot():
    """matplotlib's pyplot with the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def plot_seeds(summary: Summary, path: Path) -> Path:
    """Per-seed BLEU of every row (points) and its mean (bar), as a PNG."""
    rows = summary.rows
    fig, ax = pyplot().subplots(figsize=(max(5.0, 1.1 * len(rows) + 3.0), 3.6))
    for x, r in enumerate(rows):
        values = r.bleu_per_seed
        offsets = [(k - (len(values) - 1) / 2) * 0.08 for k in range(len(values))]
        ax.scatter([x + o for o in offsets], values, s=18, color="tab:blue", zorder=3,
                   label="one seed" if x == 0 else None)
        ax.hlines(r.bleu, x - 0.3, x + 0.3, color="black", linewidth=2, zorder=2,
                  label="mean over seeds" if x == 0 else None)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.label for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("BLEU (sacrebleu)")
    ax.set_title(f"{summary.table}: {summary.dataset}, scale {summary.scale}, "
                 f"seeds {', '.join(map(str, rows[0].seeds))}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes, never over a point
    return save_figure(fig, path)


def write_report(summary: Summary, out_dir: Path) -> Path:
    """``<out_dir>/<dataset>.md``, ``.json`` and ``.png``; returns the markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{summary.dataset}.md"
    md.write_text(to_markdown(summary), encoding="utf-8")
    (out_dir / f"{summary.dataset}.json").write_text(json.dumps(asdict(summary), indent=1, ensure_ascii=False) + "\n")
    plot_seeds(summary, out_dir / f"{summary.dataset}.png")
    return md
