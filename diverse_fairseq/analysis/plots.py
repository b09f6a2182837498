"""PNG pictures of head diversity (matplotlib's Agg canvas, no display; deterministic for a given seed): attention
heatmaps (EMNLP 2018 §5.5), t-SNE of the heads (journal Figure 3), scores per layer (EMNLP 2018 Table 5 as
curves), and the NLL increase when one head is masked (EMNLP 2020 Figure 2). Colours follow matplotlib's cycle
(``C0``, ``C1``, ...), so a model keeps its colour in every panel."""

from pathlib import Path
from typing import List, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from .scores import SCORE_NAMES

TYPE_TITLES = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention",
               "enc_dec": "encoder-decoder attention"}
SCORE_TITLES = {"sub": "subspace (Sub.)", "pos": "position (Pos.)", "out": "output (Out.)"}
DPI = 100


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")  # savefig picks the Agg canvas


def _save(fig: Figure, title: str, path: Path) -> Path:
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def plot_attention_heatmaps(maps: Mapping[int, np.ndarray], query_labels: Sequence[str], key_labels: Sequence[str],
                            title: str, path: Path, max_labels: int = 40) -> Path:
    """One attention type: ``maps[layer] = [H, T, S]`` probabilities; rows = layers, columns = heads.

    Each panel's colours run from 0 to that head's largest probability, so that the pattern of a flat
    head stays visible; the panel title gives that maximum."""
    layers = sorted(maps)
    heads, tgt_len, src_len = maps[layers[0]].shape
    cell = 0.9 + 0.12 * max(tgt_len, src_len)
    fig = _figure(min(2 + heads * cell, 40), min(1 + len(layers) * cell, 40))
    axes = fig.subplots(len(layers), heads, squeeze=False)
    show_labels = max(tgt_len, src_len) <= max_labels
    for r, layer in enumerate(layers):
        for h in range(heads):
            ax = axes[r][h]
            probs = np.asarray(maps[layer][h])  # [T, S]
            ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=max(float(probs.max()), 1e-6), aspect="auto",
                      interpolation="nearest")  # colour scale per head: 0 .. its largest probability
            ax.set_title(f"layer {layer + 1}, head {h + 1} (max {probs.max():.2f})", fontsize=8)
            if show_labels:
                ax.set_xticks(range(src_len), key_labels, rotation=90, fontsize=6)
                ax.set_yticks(range(tgt_len), query_labels if h == 0 else [""] * tgt_len, fontsize=6)
            else:
                ax.set(xticks=[], yticks=[])
    return _save(fig, title, path)


def _tsne(points: np.ndarray, seed: int) -> np.ndarray:
    """2-D t-SNE embedding of ``points`` [N, D] (exact method, PCA init: deterministic for a seed)."""
    from sklearn.manifold import TSNE

    n = points.shape[0]
    if n < 3:
        return np.pad(points[:, :2], ((0, 0), (0, max(0, 2 - points.shape[1]))))
    perplexity = float(max(1.0, min(30.0, (n - 1) / 3.0)))
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed, method="exact",
                learning_rate="auto", max_iter=1000)
    return tsne.fit_transform(points.astype(np.float64))


def plot_tsne(panels: Mapping[str, Mapping[str, np.ndarray]], path: Path, seed: int, title: str) -> Path:
    """One panel per key of ``panels`` (an attention type); in each, groups ``{label: [H, D]}`` of heads are
    projected jointly and coloured by group, each point annotated with its head (h1 ... hH)."""
    fig = _figure(5.0 * len(panels), 4.8)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (panel, groups) in zip(axes, panels.items()):
        sizes = [len(pts) for pts in groups.values()]
        coords = _tsne(np.concatenate(list(groups.values()), axis=0), seed)
        for gi, (group, xy) in enumerate(zip(groups, np.split(coords, np.cumsum(sizes)[:-1]))):
            ax.scatter(xy[:, 0], xy[:, 1], color=f"C{gi}", label=group, s=40)
            for h, (x, y) in enumerate(xy):
                ax.annotate(f"h{h + 1}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(TYPE_TITLES.get(panel, panel), fontsize=10)
        ax.set(xticks=[], yticks=[])
        ax.legend(fontsize=7, loc="best")
    return _save(fig, title, path)


def plot_layer_scores(by_model: Mapping[str, Mapping[str, Sequence[Mapping[str, Optional[float]]]]],
                      path: Path, title: str) -> Path:
    """Rows = attention types, columns = sub/pos/out; ``by_model[label][type]`` is the list of per-layer
    score dicts (layer order; an entry's ``heads`` gives H). sub/out on a linear axis with dotted lines at
    e^-1 (identical heads), exp(-1/H) (mutually orthogonal heads) and 1 (the maximum: heads that cancel), pos
    on a log axis (the paper's values are often below 0.01)."""
    types = [t for t in TYPE_TITLES if any(t in m for m in by_model.values())]
    fig = _figure(4.2 * len(SCORE_NAMES), 3.0 * len(types))
    axes = fig.subplots(len(types), len(SCORE_NAMES), squeeze=False)
    for r, atype in enumerate(types):
        for c, score in enumerate(SCORE_NAMES):
            ax = axes[r][c]
            seen: List[float] = []
            heads = set()
            for mi, (label, per_type) in enumerate(by_model.items()):
                layers = per_type.get(atype, [])
                heads.update(entry["heads"] for entry in layers if entry.get("heads"))
                points = [(i + 1, entry[score]) for i, entry in enumerate(layers) if entry.get(score) is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", color=f"C{mi}", label=label)
                    seen += [y for _, y in points]
            if score == "pos":  # in (0, 1]
                ax.set_yscale("log")
                positive = [y for y in seen if y > 0]
                ax.set_ylim(min([1e-3] + [0.5 * y for y in positive]), 1.0)
            else:  # e^-1 for identical heads, exp(-1/H) for orthogonal ones, 1 (the maximum) if they cancel
                for level in (1.0, np.exp(-1.0), *(np.exp(-1.0 / h) for h in heads)):
                    ax.axhline(level, color="gray", linestyle=":", linewidth=0.8)
                for h in sorted(heads):
                    ax.text(1.0, np.exp(-1.0 / h), f" orthogonal, H={h}", transform=ax.get_yaxis_transform(),
                            fontsize=6, color="gray", va="bottom", ha="right")
                ax.set_ylim(min([0.3] + [y - 0.05 for y in seen]), 1.02)
            ax.set_title(f"{TYPE_TITLES[atype]}: {SCORE_TITLES[score]}", fontsize=9)
            ax.set_xlabel("layer", fontsize=8)
            ax.set_ylabel("exp(D)", fontsize=8)
            ax.grid(alpha=0.3)
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
            ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, title, path)


def plot_importance_histogram(by_model: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """Histogram of per-head ablation effects, one (overlaid) distribution per model or attention type."""
    fig = _figure(6.4, 4.0)
    ax = fig.subplots()
    values = np.concatenate([np.asarray(v, dtype=float) for v in by_model.values()])
    lo, hi = float(values.min()), float(values.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    bins = np.linspace(lo, hi, 21)
    for i, (label, vals) in enumerate(by_model.items()):
        ax.hist(np.asarray(vals, dtype=float), bins=bins, alpha=0.6, color=f"C{i}", label=label,
                edgecolor="black", linewidth=0.4)
    ax.axvline(0.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xlabel("NLL increase when the head is masked (nats/token)", fontsize=9)
    ax.set_ylabel("number of heads", fontsize=9)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    return _save(fig, title, path)


def plot_importance_grid(grids: Mapping[str, np.ndarray], path: Path, title: str) -> Path:
    """Per attention type a layers × heads grid of NLL increases (diverging colours centred on 0)."""
    fig = _figure(3.6 * len(grids) + 1.0, 3.4)
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    bound = max(float(np.abs(g).max()) for g in grids.values()) or 1.0
    for ax, (atype, grid) in zip(axes, grids.items()):
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", interpolation="nearest")
        ax.set_title(TYPE_TITLES.get(atype, atype), fontsize=9)
        ax.set_xticks(range(grid.shape[1]), [str(h + 1) for h in range(grid.shape[1])], fontsize=7)
        ax.set_yticks(range(grid.shape[0]), [str(layer + 1) for layer in range(grid.shape[0])], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="Δ NLL (nats/token)")
    return _save(fig, title, path)

