"""The whole analysis of one checkpoint (scores, head importance, pictures) written to a directory, the
side-by-side view of several (``compare.md``, joint pictures), and the scores alone for the table runner (the
files: docs/analysis.md#head-diversity-analysis). The numbers come from teacher-forced passes over the reference,
one forward per batch with every attention module tapped: the disagreement scores (:mod:`.scores`), each head's
output averaged over the non-padding query tokens (the journal version's Figure 3 t-SNE), the token NLL and the
attention maps of one sentence."""

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from diverse_fairseq.methods.sites import ATTENTION_TYPES, TOKEN_SIDES, AttentionSite, attention_sites, observe

from . import plots
from .ablation import batch_nll, head_importance
from .loading import heatmap_sentence, load_batches, load_checkpoint
from .report import comparison_markdown, scores_markdown
from .scores import SCALE, TOKEN_SIDE, ScoreAccumulator, check_heads, combine_layers

logger = logging.getLogger("diverse_fairseq.analysis")

DEFINITION = (
    f"EMNLP 2018 Tables 4-5 on the paper's scale, {SCALE}: sub, out = exp(-mean over non-padding tokens of "
    "(1/H^2) sum_i sum_j cos(x_i, x_j)) of projected values V (sub, key tokens) and head outputs O (out, query "
    "tokens); pos = mean over sentences of exp(-(1/H^2) sum_i sum_j sum_{t,s} A_i[t,s] A_j[t,s]) (query tokens "
    "t). Tokens: source for enc_self and for sub of enc_dec, target otherwise. Teacher-forced forward on the "
    "reference. Per attention type: exp(-mean over layers of the similarity) = geometric mean of the layer "
    "scores. sub/out: e^-1 = identical heads, exp(-1/H) = mutually orthogonal heads (0.882 at H = 8, 0.779 at "
    "H = 4), 1.0 (the maximum) = the heads' unit vectors cancel; pos: 1.0 = heads attend to disjoint positions. "
    "offdiag_cos (a second figure, not a score): mean over tokens of the mean cosine over head pairs i != j "
    "(1 = identical, 0 = orthogonal, -1/(H-1) = cancelling); per attention type its mean over layers."
)


@torch.no_grad()
def collect(model, sites: Sequence[AttentionSite], batches: List[Dict], pad: int, progress: bool = True,
            nll: bool = True) -> Tuple[Dict, Dict[Tuple[str, int], Tensor]]:
    """The ``scores.json`` content of ``batches`` less the run's metadata, and each head's mean output over the
    query tokens, ``(type, layer) -> [H, d]``.

    ``nll=False`` skips the NLL (``None``) and the decoder's output projection (``features_only``), which is
    most of the cost of a pass that only wants the scores."""
    scores = {s.key: ScoreAccumulator() for s in sites}
    out_sums: Dict[Tuple[str, int], Tensor] = {}
    out_counts: Dict[Tuple[str, int], int] = {}
    nll_sum, sentences, src_tokens, tgt_tokens = 0.0, 0, 0, 0
    for sample in tqdm(batches, desc="scores", unit="batch", disable=None if progress else True, leave=False):
        with observe(sites, {"v", "a", "o"}) as seen:
            net_output = model(**sample["net_input"], features_only=not nll)
        # True at padding (fairseq left-pads sources: any side works)
        masks = {"source": sample["net_input"]["src_tokens"].eq(pad), "target": sample["target"].eq(pad)}
        for site in sites:
            key, side = site.key, TOKEN_SIDE[site.attention_type]
            tapped = seen.heads(site)
            scores[key].update(tapped, key_pad=masks[side["sub"]], query_pad=masks[side["out"]])
            o = tapped["o"].double()  # [B, H, T, d]
            keep = (~masks[side["out"]]).to(o.dtype)  # [B, T]
            out_sums[key] = out_sums.get(key, 0.0) + torch.einsum("bhtd,bt->hd", o, keep)  # [H, d]
            out_counts[key] = out_counts.get(key, 0) + int(keep.sum())
        if nll:
            nll_sum += batch_nll(model, sample, net_output, pad)[0]
        tgt_tokens += int((~masks["target"]).sum())
        src_tokens += int((~masks["source"]).sum())
        sentences += sample["target"].size(0)
    by_layer: Dict[str, List[Dict]] = {}
    for site in sites:
        acc = scores[site.key]
        entry = {"layer": site.layer + 1, "heads": site.num_heads, **acc.scores(),
                 "similarity": acc.similarities(), "offdiag_cos": acc.offdiag()}
        by_layer.setdefault(site.attention_type, []).append(entry)
    for entries in by_layer.values():
        entries.sort(key=lambda e: e["layer"])
    by_type = {t: combine_layers(by_layer[t]) for t in ATTENTION_TYPES if t in by_layer}
    payload = {"sentences": sentences, "source_tokens": src_tokens, "target_tokens": tgt_tokens,
               "nll": nll_sum / max(tgt_tokens, 1) if nll else None, "scale": SCALE, "definition": DEFINITION,
               "token_side": {t: TOKEN_SIDE[t] for t in by_type}, "by_type": by_type, "by_layer": by_layer}
    return payload, {key: (out_sums[key] / max(out_counts[key], 1)).float().cpu() for key in out_sums}


@dataclass
class Options:
    data: Optional[str] = None
    subset: str = "valid"
    max_sentences: Optional[int] = 500
    max_tokens: int = 4096
    sentence_id: Optional[int] = None
    seed: int = 1
    ablation: bool = True
    ablation_bleu: bool = False
    bleu_sentences: int = 100
    beam: int = 4
    device: str = "cpu"
    progress: bool = True  # progress bars where stderr is a terminal (tqdm's disable=None)


Analysis = NamedTuple("Analysis", [("label", str), ("out", Path), ("scores", Dict), ("importance", Optional[Dict]),
                                   ("head_means", Dict[Tuple[str, int], Tensor])])


def _write_json(path: Path, payload) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _prepare(checkpoint: str, opts: Options, label: Optional[str]):
    """Seeds everything; the loaded model, its batches of ``opts.subset``, its attention sites (two heads or more)
    and the report's metadata."""
    random.seed(opts.seed)
    np.random.seed(opts.seed)
    torch.manual_seed(opts.seed)
    loaded = load_checkpoint(checkpoint, opts.data, opts.device)
    batches = load_batches(loaded.task, opts.subset, opts.max_sentences, opts.max_tokens, device=opts.device)
    sites = attention_sites(loaded.model)
    check_heads(min(int(s.module.num_heads) for s in sites), str(checkpoint))  # before the forward passes
    label = label or Path(checkpoint).parent.name
    meta = {"label": label, "checkpoint": str(checkpoint), "arch": loaded.arch, "data": str(loaded.data),
            "subset": opts.subset, "max_sentences": opts.max_sentences, "seed": opts.seed}
    logger.info("%s: %d attention modules, %d batches of %s", label, len(sites), len(batches), opts.subset)
    return loaded, batches, sites, meta


def score_checkpoint(checkpoint: str, opts: Options, label: Optional[str] = None) -> Dict:
    """Only the disagreement scores of one checkpoint (no pictures, no ablation): the ``scores.json`` payload.

    One teacher-forced forward per batch of ``opts.max_tokens`` tokens without the output projection (no NLL:
    ``payload["nll"]`` is None); ``payload["seconds"]`` is the time taken, loading included.
    """
    start = time.time()
    loaded, batches, sites, meta = _prepare(checkpoint, opts, label)
    scores, _ = collect(loaded.model, sites, batches, loaded.task.target_dictionary.pad(), progress=opts.progress,
                        nll=False)
    return {**meta, "max_tokens": opts.max_tokens, **scores, "seconds": round(time.time() - start, 2)}


def analyze_checkpoint(checkpoint: str, out: Path, opts: Options, label: Optional[str] = None) -> Analysis:
    """Scores, head importance and pictures of one checkpoint, written to ``out``."""
    start = time.time()
    out = Path(out)
    loaded, batches, sites, meta = _prepare(checkpoint, opts, label)
    out.mkdir(parents=True, exist_ok=True)  # after loading: a bad checkpoint leaves no empty folder
    model, task, label = loaded.model, loaded.task, meta["label"]
    pad = task.target_dictionary.pad()

    scores, head_means = collect(model, sites, batches, pad, progress=opts.progress)
    sentence_id, sentence = heatmap_sentence(task, opts.subset, opts.sentence_id, opts.max_sentences, opts.device)
    with torch.no_grad(), observe(sites, {"a"}) as seen:
        model(**sentence["net_input"])
    maps = {s.key: seen.heads(s)["a"][0].float().cpu() for s in sites}  # (type, layer) -> [H, T, S]
    imp = None
    if opts.ablation:
        bleu_batches = (load_batches(task, opts.subset, opts.bleu_sentences, opts.max_tokens, device=opts.device)
                        if opts.ablation_bleu else None)
        imp = {**meta, **head_importance(model, task, sites, batches, pad, bleu_batches=bleu_batches, beam=opts.beam,
                                         progress=opts.progress)}
        _write_json(out / "importance.json", imp)
    scores = {**meta, "heatmap_sentence": sentence_id, **scores}
    _write_json(out / "scores.json", scores)
    (out / "scores.md").write_text(scores_markdown(scores, imp))
    _plot_one(out, label, scores, imp, head_means, maps, sentence, sentence_id, task, pad, opts.seed)
    scores["seconds"] = round(time.time() - start, 1)
    _write_json(out / "scores.json", scores)
    logger.info("%s: analysis written to %s in %.1fs", label, out, scores["seconds"])
    return Analysis(label, out, scores, imp, head_means)


def _head_mean(head_means: Dict, atype: str) -> Optional[np.ndarray]:
    """``[H, d]``: the heads' mean outputs of one attention type averaged over its layers (journal Fig. 3)."""
    layers = [m for (t, _), m in sorted(head_means.items()) if t == atype]
    return torch.stack(layers).mean(0).numpy() if layers else None


def _plot_one(out: Path, label: str, scores: Dict, imp: Optional[Dict], head_means: Dict, maps: Dict,
              sentence: Dict, sentence_id: int, task, pad: int, seed: int) -> None:
    net_input = sentence["net_input"]  # the heatmaps' axes: the sentence's symbols, padding dropped
    tokens = {"source": [task.source_dictionary[t] for t in net_input["src_tokens"][0].tolist() if t != pad],
              "target": [task.target_dictionary[t] for t in net_input["prev_output_tokens"][0].tolist() if t != pad]}
    panels = {}
    for atype in ATTENTION_TYPES:
        per_layer = {layer: m.numpy() for (t, layer), m in maps.items() if t == atype}
        if per_layer:
            note = "; decoder positions show the decoder input" if atype != "enc_self" else ""
            plots.plot_attention_heatmaps(
                per_layer, *(tokens[side] for side in TOKEN_SIDES[atype]),
                f"{label}: {plots.TYPE_TITLES[atype]}, sentence {sentence_id} (rows: queries, columns: keys{note})",
                out / f"attention_{atype}.png")
        layers = sorted(layer for (t, layer) in head_means if t == atype)
        if layers:
            panels[atype] = {**{f"layer {layer + 1}": head_means[(atype, layer)].numpy() for layer in layers},
                             "mean over layers": _head_mean(head_means, atype)}
    plots.plot_tsne(panels, out / "tsne.png", seed,
                    f"{label}: t-SNE of the heads' mean outputs (journal Fig. 3; seed {seed})")
    plots.plot_layer_scores({label: scores["by_layer"]}, out / "layer_scores.png",
                            f"{label}: disagreement exp(D) per layer (EMNLP 2018 Table 5); {SCALE}")
    if imp is None:
        return
    by_type: Dict[str, List[Dict]] = {}
    for h in imp["heads"]:
        by_type.setdefault(h["attention_type"], []).append(h)
    plots.plot_importance_histogram({t: [h["delta_nll"] for h in heads] for t, heads in by_type.items()},
                                    out / "importance_hist.png",
                                    f"{label}: heads by NLL increase when masked (EMNLP 2020 Fig. 2)")
    grids = {}
    for atype, heads in by_type.items():
        grids[atype] = np.zeros((max(h["layer"] for h in heads), max(h["head"] for h in heads)))
        for h in heads:
            grids[atype][h["layer"] - 1, h["head"] - 1] = h["delta_nll"]
    plots.plot_importance_grid(grids, out / "importance_grid.png", f"{label}: Δ NLL when one head is masked")


def compare(analyses: Sequence[Analysis], out: Path, seed: int) -> None:
    """Side-by-side report and joint pictures of several analysed checkpoints."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(comparison_markdown({a.label: a.scores for a in analyses},
                                                        {a.label: a.importance for a in analyses}))
    _write_json(out / "compare.json", {"models": {a.label: {"scores": str(a.out / "scores.json"),
                                                            "by_type": a.scores["by_type"]} for a in analyses}})
    panels = {}
    for atype in ATTENTION_TYPES:
        means = {a.label: _head_mean(a.head_means, atype) for a in analyses}
        if all(m is not None for m in means.values()) and len({m.shape[1] for m in means.values()}) == 1:
            panels[atype] = means
    if panels:
        plots.plot_tsne(panels, out / "tsne.png", seed,
                        f"t-SNE of the heads' outputs averaged over words and layers (journal Fig. 3; seed {seed})")
    plots.plot_layer_scores({a.label: a.scores["by_layer"] for a in analyses}, out / "layer_scores.png",
                            f"disagreement exp(D) per layer (EMNLP 2018 Table 5); {SCALE}")
    if all(a.importance is not None for a in analyses):
        plots.plot_importance_histogram({a.label: [h["delta_nll"] for h in a.importance["heads"]] for a in analyses},
                                        out / "importance_hist.png",
                                        "heads by NLL increase when masked (EMNLP 2020 Fig. 2)")


def unique_labels(checkpoints: Sequence[str]) -> List[str]:
    """Short distinct names: the checkpoint directory's name, with more parent directories as needed."""
    parts = [Path(c).resolve().parent.parts for c in checkpoints]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["-".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [f"model{i + 1}" for i in range(len(checkpoints))]
