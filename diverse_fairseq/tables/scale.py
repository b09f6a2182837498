"""Paper-scale layer selections on smaller models: one rule, applied to every layer flag of a table row.

The tables' ``args`` select layers as in the papers' models, which all have ``PAPER_LAYERS`` = 6 encoder and
6 decoder layers: 0-based indices into that stack (``0`` = the paper's layer 1, the bottom; ``5`` or ``-1`` =
layer 6, the top), ``all`` or ``none``. A setting with fewer layers (``tiny``, the demo scale: 2 + 2) runs the
same row with every index mapped by

    paper index i (0 .. L−1, a negative i is read as L + i)  →  floor(i · L_small / L)

so for L = 6 and L_small = 2 paper layers 1–3 (indices 0, 1, 2) become demo layer 0 and paper layers 4–6 demo
layer 1. Indices that land on the same small layer are merged (``0,1,2`` → ``0``), ``all`` and ``none`` stay, and
an index outside the paper's stack is an error.
"""

from typing import List

from diverse_fairseq.methods.options import ALL_LAYERS, parse_layer_spec

from ..runs.settings import SETTINGS

PAPER_LAYERS = 6
# every option that selects layers (tests/test_table_scale.py checks that the plugin registers no other)
LAYER_FLAGS = ("--routing-encoder-layers", "--routing-decoder-layers", "--routing-encoder-decoder-layers",
               "--repulsive-layers", "--disagreement-layers")


def map_layers(value: str, layers: int, to_layers: int, flag: str = "layers") -> str:
    """A layer selection of an ``layers``-deep stack mapped to a ``to_layers``-deep one by the rule above."""
    text = str(value).strip()
    spec = parse_layer_spec(text, flag, ALL_LAYERS)  # the plugins' own syntax check
    if spec == ALL_LAYERS or not spec:
        return text
    indices = set()
    for i in spec:
        if not -layers <= i < layers:
            raise ValueError(f"{flag} {value}: layer index {i} is outside the paper's {layers}-layer stack")
        indices.add((i % layers) * to_layers // layers)
    return ",".join(str(i) for i in sorted(indices))


def row_args(args: List[str], setting: str) -> List[str]:
    """A table row's fairseq-train flags for ``setting``: the layer flags mapped to its depth."""
    depth = SETTINGS[setting].layers
    if depth == PAPER_LAYERS:
        return list(args)
    out = list(args)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag not in LAYER_FLAGS:
            continue
        if eq:
            out[i] = f"{flag}={map_layers(value, PAPER_LAYERS, depth, flag)}"
        elif i + 1 < len(out):
            out[i + 1] = map_layers(out[i + 1], PAPER_LAYERS, depth, flag)
    return out


def changes(args: List[str], mapped: List[str]) -> List[str]:
    """The layer flags that :func:`row_args` changed, e.g. ``["--routing-encoder-layers 3,4,5→1"]``."""
    return [f"{mapped[i - 1]} {a}→{b}" if i and not a.startswith("--") else f"{a}→{b}"
            for i, (a, b) in enumerate(zip(args, mapped)) if a != b]
