"""pytest plugin (``-p fairseq_swap``) for running fairseq's own tests with this project's classes in place of
fairseq's.

Loaded only inside the pytest subprocess that tests/methods/test_fairseq_suite.py starts. Before fairseq's test
modules are imported, it points fairseq's module attributes at our classes (``MultiheadAttention`` ->
``DiverseMultiheadAttention``, ``TransformerModel`` -> ``DiverseTransformerModel``, the encoder, decoder and their
layers -> ours), so that ``from fairseq... import X`` in those modules gets ours. Every instance of a stock base
class (ours call its ``__init__``) is recorded by class name and written as JSON to ``$FAIRSEQ_SWAP_RECORD`` at the
end, so that the caller can check that the swap took effect and that no stock instance was built.
"""

import json
import os
from collections import Counter

import fairseq.models.transformer as transformer_pkg
import fairseq.models.transformer.transformer_decoder as decoder_mod
import fairseq.models.transformer.transformer_encoder as encoder_mod
import fairseq.models.transformer.transformer_legacy as legacy_mod
import fairseq.modules as modules_pkg
import fairseq.modules.multihead_attention as mha_mod
import fairseq.modules.transformer_layer as layer_mod

import diverse_fairseq  # noqa: F401  (registers the models)
from diverse_fairseq.methods.attention import DiverseMultiheadAttention
from diverse_fairseq.methods.transformer import (
    DiverseTransformerDecoder,
    DiverseTransformerDecoderLayer,
    DiverseTransformerEncoder,
    DiverseTransformerEncoderLayer,
    DiverseTransformerModel,
)

#: (module, attribute, replacement)
SWAPS = [
    (mha_mod, "MultiheadAttention", DiverseMultiheadAttention),
    (modules_pkg, "MultiheadAttention", DiverseMultiheadAttention),
    (layer_mod, "TransformerEncoderLayerBase", DiverseTransformerEncoderLayer),
    (layer_mod, "TransformerDecoderLayerBase", DiverseTransformerDecoderLayer),
    (encoder_mod, "TransformerEncoderBase", DiverseTransformerEncoder),
    (decoder_mod, "TransformerDecoderBase", DiverseTransformerDecoder),
    (legacy_mod, "TransformerModel", DiverseTransformerModel),
    (transformer_pkg, "TransformerModel", DiverseTransformerModel),
]

#: the stock classes whose instances are recorded: ours subclass them
RECORDED = [mha_mod.MultiheadAttention, layer_mod.TransformerEncoderLayerBase, layer_mod.TransformerDecoderLayerBase,
            encoder_mod.TransformerEncoderBase, decoder_mod.TransformerDecoderBase]

built = Counter()


def _recording(init):
    def __init__(self, *args, **kwargs):
        built[type(self).__name__] += 1
        init(self, *args, **kwargs)
    return __init__


def pytest_configure(config):
    for cls in RECORDED:
        cls.__init__ = _recording(cls.__init__)
    for module, name, replacement in SWAPS:
        if not hasattr(module, name):
            raise AttributeError(f"fairseq has no {module.__name__}.{name} to swap; "
                                 "update tests/methods/fairseq_swap.py")
        setattr(module, name, replacement)


def pytest_unconfigure(config):
    path = os.environ.get("FAIRSEQ_SWAP_RECORD")
    if path:
        with open(path, "w") as f:
            json.dump(dict(built), f)
