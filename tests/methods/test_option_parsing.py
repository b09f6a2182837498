"""The one parser of layer options (diverse_fairseq.methods.options): ``all``, ``none``, comma lists of 0-based
indices (negative from the last layer); malformed text and out-of-range indices are errors naming the flag and
the layer count. Used by --routing-*-layers, --disagreement-layers, --repulsive-layers and tables.scale (their
own tests: test_routing_model.py, test_disagreement_criterion.py, test_repulsive.py)."""

import pytest

from diverse_fairseq.methods.options import ALL_LAYERS, NO_LAYERS, parse_layer_spec, parse_layers, resolve_layers
from diverse_fairseq.tables import scale
from diverse_fairseq.tables.scale import LAYER_FLAGS


@pytest.mark.parametrize("value,default,expected", [
    ("all", "none", ALL_LAYERS), (" All ", "none", ALL_LAYERS), ("none", "all", NO_LAYERS), ("NONE", "all", NO_LAYERS),
    (None, "all", ALL_LAYERS), ("", "none", NO_LAYERS), ("2,0,-1,0", "all", (-1, 0, 2)), (3, "all", (3,)),
    ([1, "0"], "all", (0, 1)),
])
def test_layer_spec_syntax(value, default, expected):
    assert parse_layer_spec(value, "--x-layers", default) == expected


@pytest.mark.parametrize("value", ["0,,1", "1-2", "first", "0;1", "1.5", ",", True, [0.5]])
def test_malformed_layer_lists_name_the_flag(value):
    with pytest.raises(ValueError, match=r"--x-layers: expected 'all', 'none' or comma-separated layer indices"):
        parse_layer_spec(value, "--x-layers", "all")


def test_resolution_against_the_model_depth():
    assert resolve_layers(ALL_LAYERS, 3, "--x-layers") == (0, 1, 2)
    assert resolve_layers(NO_LAYERS, 3, "--x-layers") == ()
    assert resolve_layers((-1, 0), 3, "--x-layers") == (0, 2)
    assert parse_layers("none", 6, "--x-layers", default="all") == ()  # none is none, never all
    with pytest.raises(ValueError, match=r"--x-layers 0,4: layer index 4 is out of range for 3 layers of dec_self "
                                         r"attention \(valid: -3..2"):
        resolve_layers((0, 4), 3, "--x-layers", " of dec_self attention")


@pytest.mark.parametrize("flag", LAYER_FLAGS)
def test_table_rows_use_the_same_syntax(flag):
    """A malformed layer flag in a table row fails when the row is mapped to the demo depth, with the
    plugins' own message (not a bare int() error)."""
    assert scale.row_args([flag, "NONE"], "tiny") == [flag, "NONE"]
    with pytest.raises(ValueError, match=rf"{flag}: expected 'all', 'none'"):
        scale.row_args([flag, "0,x"], "tiny")
