"""Is system B significantly better than baseline A on the same references? Two tests, both on corpus BLEU:

* **paired bootstrap resampling** (Koehn 2004), computed by sacrebleu's own implementation
  (``sacrebleu.significance.PairedTest``, the ``--paired-bs`` of its command line): 1000 resamples, a p-value and
  the 95% confidence interval of each system's BLEU. One correction: when the two systems' BLEU are exactly equal
  (e.g. identical outputs) the p-value is 1, where sacrebleu's formula gives 1/(samples+1).
* **sign test** (Collins et al. 2005, used by Li et al. EMNLP 2018): for every sentence, does putting B's translation
  in place of A's raise (+), lower (−) or keep (=) A's corpus BLEU? Ties are dropped and the two-sided p-value of n+
  against n− is the exact binomial one with probability ½. sacrebleu has no sign test.

Use detokenized outputs with the default ``13a`` tokenization (sacrebleu), or the tokenized, compound-split files
that ``diverse_fairseq.evaluate`` writes (``hyp.tok.*``/``ref.tok.*``) with ``--tokenize none`` to test the papers'
tokenized BLEU. Marks: ``**`` p < 0.01, ``*`` p < 0.05, each followed by the system the test finds better
(``baseline better`` or ``system better``). Where both systems score below :data:`MIN_BLEU` nothing is marked, and
the output says why (:func:`unmark_low_bleu`, the same rule as the table report's).

Each system is labelled by its run: a file in an evaluation folder (``results.json`` beside it) by the methods and
setting its training recorded (``train_args.json`` beside the checkpoint: ``disagreement_out (tiny)``, or the
architecture without a method: ``transformer (tiny)``), else by the checkpoint's save dir and name
(``transformer_seed1/checkpoint_best``); any other file by its name. Two systems of the same methods and setting
get their checkpoint's save dir and name too, and files whose labels would still be equal their paths relative to
their common folder.
"""

import argparse
import json
import logging
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple
from unittest import mock

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from .runs.identity import ARGS_FILE

DEFAULT_SAMPLES = 1000
DEFAULT_SEED = 12345


def read_lines(path, role: str = "input") -> List[str]:
    """The lines of ``path``; SystemExit naming ``role`` (the option that gave it) when it is missing."""
    path = Path(path)
    if not path.is_file():
        hint = (" (it is a folder: name the file in it, e.g. hyp.detok.* of an evaluation)" if path.is_dir() else
                ": check the path; python -m diverse_fairseq.evaluate writes hyp.detok.*, ref.detok.*, hyp.tok.* and "
                "ref.tok.* into its output folder")
        raise SystemExit(f"error: {role} file {path} not found{hint}")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _json(path: Path) -> Dict:
    """The JSON object in ``path``; {} where there is none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_of(path: Path) -> Tuple[Optional[str], Optional[str]]:
    """(``<save dir>/<checkpoint name>``, ``<methods or architecture> (<setting>)``) of a file in an evaluation
    folder: the checkpoint that ``results.json`` beside it names, and what the run's ``train_args.json`` records
    (beside the checkpoint as recorded, or above the evaluation folder, where evaluate writes by default); None
    for what is not known."""
    checkpoint = _json(path.parent / "results.json").get("checkpoint")
    if not checkpoint:
        return None, None
    checkpoint = Path(checkpoint)
    about = _json(checkpoint.parent / ARGS_FILE) or _json(path.parent.parent / ARGS_FILE)
    what = about.get("method") or about.get("identity", {}).get("options", {}).get("--arch")
    described = f"{what} ({about['setting']})" if what and about.get("setting") else None
    return f"{checkpoint.parent.name}/{checkpoint.stem}", described


def system_labels(paths: Sequence) -> List[str]:
    """One distinct label per file, as the module's docstring says (every system's file in an evaluation folder is
    ``hyp.detok.<lang>``, so its run tells them apart)."""
    runs = {}  # resolved path -> (checkpoint label or the file's name, the run's methods and setting or None)
    for path in map(Path, paths):
        name, described = run_of(path)
        runs[str(path.resolve())] = (name or path.name, described)
    firsts = [described or name for name, described in runs.values()]
    labels = {r: described if described and firsts.count(described) == 1 else
              f"{described[:-1]}, {name})" if described else name for r, (name, described) in runs.items()}
    if len(set(labels.values())) < len(labels):  # a file named twice keeps one label
        common = os.path.commonpath(list(labels))
        labels = {r: os.path.relpath(r, common) for r in labels}
    return [labels[str(Path(p).resolve())] for p in paths]


def _metric(tokenize: str, lowercase: bool, effective_order: bool = False):
    return BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none", effective_order=effective_order)


def length_ratio(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a", lowercase: bool = False) -> float:
    """Hypothesis length over reference length in BLEU's tokens: the ratio behind its brevity penalty."""
    score = _metric(tokenize, lowercase).corpus_score(list(hyps), [list(refs)])
    return score.sys_len / score.ref_len


def sign_test_p(plus: int, minus: int) -> float:
    """Exact two-sided binomial p-value of ``plus`` successes out of ``plus + minus`` with p = ½ (1 for none)."""
    n = plus + minus
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(plus, minus) + 1)) / 2 ** n)


def sentence_statistics(metric, hyps: Sequence[str], refs: Sequence[str]):
    """Per-sentence BLEU sufficient statistics as an (N, 2 + 2·max order) array
    ``[hyp length, ref length, matches n=1.., hyp n-grams n=1..]``, from the public fields of
    ``BLEU.sentence_score``; summed over sentences they are the corpus statistics that ``corpus_score`` scores."""
    scores = [metric.sentence_score(hyp, [ref]) for hyp, ref in zip(hyps, refs)]
    return np.array([[s.sys_len, s.ref_len, *s.counts, *s.totals] for s in scores], dtype=np.float64)


def bleu_from_statistics(metric, total) -> float:
    """Corpus BLEU of summed statistics with ``metric``'s settings (``BLEU.compute_bleu``, public)."""
    order = metric.max_ngram_order
    return metric.compute_bleu(
        correct=[int(x) for x in total[2:2 + order]], total=[int(x) for x in total[2 + order:2 + 2 * order]],
        sys_len=int(total[0]), ref_len=int(total[1]), smooth_method=metric.smooth_method,
        smooth_value=metric.smooth_value, effective_order=False, max_ngram_order=order).score


def sign_test(baseline: Sequence[str], system: Sequence[str], refs: Sequence[str], tokenize: str = "13a",
              lowercase: bool = False) -> Dict[str, float]:
    """Collins et al. (2005) sign test: per sentence, the effect on the baseline's corpus BLEU of
    replacing its translation by the system's."""
    # effective_order only silences sacrebleu's advice for sentence-level *scores*; the statistics are the same
    stats_metric, metric = _metric(tokenize, lowercase, effective_order=True), _metric(tokenize, lowercase)
    base_stats, sys_stats = (sentence_statistics(stats_metric, hyps, refs) for hyps in (baseline, system))
    total = base_stats.sum(0)
    base_bleu = bleu_from_statistics(metric, total)
    counts = {"better": 0, "worse": 0, "ties": 0}
    for base_row, sys_row in zip(base_stats, sys_stats):
        same = (base_row == sys_row).all()
        change = 0.0 if same else bleu_from_statistics(metric, total - base_row + sys_row) - base_bleu
        counts["better" if change > 1e-9 else "worse" if change < -1e-9 else "ties"] += 1
    return {**counts, "p_value": sign_test_p(counts["better"], counts["worse"])}


def paired_bootstrap(baseline: Sequence[str], systems: Dict[str, Sequence[str]], refs: Sequence[str],
                     tokenize: str = "13a", lowercase: bool = False, samples: int = DEFAULT_SAMPLES,
                     seed: int = DEFAULT_SEED) -> Tuple[str, Dict[str, Dict[str, float]]]:
    """sacrebleu's paired bootstrap resampling; returns (signature, {name: score, mean, ci, p_value})."""
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)
    named = [("baseline", list(baseline))] + [(name, list(h)) for name, h in systems.items()]
    with mock.patch.dict(os.environ, SACREBLEU_SEED=str(seed)):  # sacrebleu reads its seed there only
        signatures, scores = PairedTest(named, {"BLEU": _metric(tokenize, lowercase)}, [list(refs)],
                                        test_type="bs", n_samples=samples)()
    base, results = scores["BLEU"][0].score, {}
    for name, res in zip(scores["System"], scores["BLEU"]):
        # equal BLEU: no evidence of a difference (sacrebleu would report 1/(samples+1))
        p = 1.0 if name != "baseline" and res.p_value is not None and res.score == base else res.p_value
        results[name] = {"bleu": res.score, "mean": res.mean, "ci95": res.ci, "p_value": p}
    return str(signatures["BLEU"]), results


def mark(p: float, single: str = "*", double: str = "**") -> str:
    """The mark of a p-value: ``double`` below 0.01, ``single`` below 0.05."""
    return double if p < 0.01 else single if p < 0.05 else ""


#: the corpus BLEU below which, for both systems, no difference is marked (:func:`unmark_low_bleu`)
MIN_BLEU = 1.0


def unmark_low_bleu(entry: Dict, baseline_bleu: float, system_bleu: float) -> Dict:
    """The one rule of both reports on barely trained systems (this command's :func:`compare` and the table report,
    ``tables/report.py``): where both BLEU scores are below :data:`MIN_BLEU` and a test marked a difference,
    ``entry`` (one system's comparison) with every mark emptied (the keys ``mark`` and ``*_mark``, at any depth)
    and ``unmarked`` saying why; else ``entry`` itself. Below 1 BLEU the systems share a handful of n-grams with the
    references, so a small p-value says that two untrained systems differ, not that one translates better."""
    def unmarked(value):
        if not isinstance(value, dict):
            return value
        return {k: "" if k == "mark" or k.endswith("_mark") else unmarked(v) for k, v in value.items()}

    if not (baseline_bleu < MIN_BLEU and system_bleu < MIN_BLEU) or unmarked(entry) == entry:
        return entry
    why = (f"not marked: both systems score below {MIN_BLEU:g} BLEU ({system_bleu:.2f}, baseline "
           f"{baseline_bleu:.2f}), where BLEU counts a handful of matching n-grams: a small p-value then says that "
           f"two barely trained systems differ, not that either translates better")
    return dict(unmarked(entry), unmarked=why)


def better(marked: str, direction: float) -> str:
    """Which system a marked test finds better: ``system`` for a positive ``direction`` (BLEU difference, or sign
    test wins minus losses), ``baseline`` for a negative one; "" where nothing is marked."""
    return "" if not marked or not direction else "system" if direction > 0 else "baseline"


def compare(ref_path, baseline_path, system_paths, tokenize="13a", lowercase=False, samples=DEFAULT_SAMPLES,
            seed=DEFAULT_SEED) -> Dict[str, object]:
    """Both tests for every system against the baseline; the dictionary that ``--json`` prints."""
    refs = read_lines(ref_path, "reference (--ref)")
    baseline = read_lines(baseline_path, "baseline (--baseline)")
    system_paths = [str(p) for p in system_paths]
    if len(set(system_paths)) != len(system_paths):
        raise SystemExit(f"error: --system names the same file twice ({', '.join(system_paths)}): "
                         "name each system once")
    labels = system_labels([baseline_path, *system_paths])
    systems = {p: read_lines(p, "system (--system)") for p in system_paths}
    for name, hyps in [(str(baseline_path), baseline)] + list(systems.items()):
        if len(hyps) != len(refs):
            raise SystemExit(f"error: {name} has {len(hyps)} lines but the reference {ref_path} has {len(refs)}")
    signature, boot = paired_bootstrap(baseline, systems, refs, tokenize, lowercase, samples, seed)
    out = {"reference": str(ref_path), "sentences": len(refs), "signature": signature, "samples": samples,
           "seed": seed, "baseline": {"file": str(baseline_path), "label": labels[0], **boot["baseline"]},
           "systems": []}
    for (name, hyps), label in zip(systems.items(), labels[1:]):
        sign = sign_test(baseline, hyps, refs, tokenize, lowercase)
        b, base_bleu = boot[name], boot["baseline"]["bleu"]
        entry = unmark_low_bleu({"file": name, "label": label, **b, "delta": b["bleu"] - base_bleu,
                                       "bootstrap_mark": mark(b["p_value"]), "sign_test": sign,
                                       "sign_mark": mark(sign["p_value"])}, base_bleu, b["bleu"])
        entry["bootstrap_better"] = better(entry["bootstrap_mark"], entry["delta"])
        entry["sign_better"] = better(entry["sign_mark"], sign["better"] - sign["worse"])
        out["systems"].append(entry)
    return out


def format_report(result: Dict[str, object]) -> str:
    """The table: one line per system, each mark followed by the system its test finds better, and why a system
    is not marked where :func:`unmark_low_bleu` says so."""
    base, words = result["baseline"], len("baseline better")
    width = max(len("system"), *(len(s["label"]) for s in [base, *result["systems"]]))
    lines = [f"reference {result['reference']} ({result['sentences']} sentences); {result['signature']}",
             f"{'system':{width}s} {'BLEU':>6s} {'95% CI':>13s} {'delta':>6s} {'p(boot)':>8s}   {'':{words}s} "
             f"{'+/-/=':>13s} {'p(sign)':>8s}",
             f"{base['label']:{width}s} {base['bleu']:6.2f} {base['mean']:6.2f}±{base['ci95']:5.2f}"
             f" {'':>6s} {'':>8s}   {'':{words}s} {'':>13s} {'':>8s}  (baseline)"]
    for s in result["systems"]:
        sg = s["sign_test"]
        boot_better, sign_better = (f"{s[k]} better" if s[k] else "" for k in ("bootstrap_better", "sign_better"))
        lines.append(f"{s['label']:{width}s} {s['bleu']:6.2f} {s['mean']:6.2f}±{s['ci95']:5.2f} "
                     f"{s['delta']:+6.2f} {s['p_value']:8.4f}{s['bootstrap_mark']:2s} {boot_better:{words}s} "
                     f"{'/'.join(str(sg[k]) for k in ('better', 'worse', 'ties')):>13s} "
                     f"{sg['p_value']:8.4f}{s['sign_mark']:2s} {sign_better}".rstrip())
    lines.append("** p < 0.01, * p < 0.05 (paired bootstrap: sacrebleu; sign test: exact binomial), each followed by "
                 "the system that test finds better; +/-/=: sentences where the system's translation raises, lowers "
                 "or keeps the baseline's corpus BLEU")
    lines += [f"{s['label']}: {s['unmarked']}" for s in result["systems"] if s.get("unmarked")]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="significance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", required=True, help="reference file, one sentence per line")
    p.add_argument("--baseline", required=True, help="baseline system output")
    p.add_argument("--system", required=True, nargs="+", help="output(s) of the system(s) to test")
    p.add_argument("--tokenize", default="13a", help="sacrebleu tokenization: 13a (detokenized text), none "
                                                     "(already tokenized text), zh, intl, ...")
    p.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="resampling seed (sacrebleu's default 12345)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    result = compare(args.ref, args.baseline, args.system, args.tokenize, args.lowercase, args.samples, args.seed)
    print(json.dumps(result, indent=1) if args.json else format_report(result))
    return result


if __name__ == "__main__":
    main()
