"""Validation of the list options shared by the plugins: the comma-separated names (``--disagreement-terms``,
``--disagreement-attention``, ``--repulsive-attention``, ``--repulsive-projections``) and the layer lists
(``--routing-*-layers``, ``--disagreement-layers``, ``--repulsive-layers``: ``all``, ``none`` or 0-based indices)."""

from dataclasses import field
from typing import Iterable, Sequence, Tuple, Union


def parse_names(value: Union[str, Iterable, None], allowed: Sequence[str], flag: str) -> Tuple[str, ...]:
    """The names in ``value`` (a comma-separated string, or a list given through hydra) in the canonical
    order of ``allowed``, without duplicates. Raises ``ValueError`` naming ``flag`` when ``value`` is empty
    or holds a name outside ``allowed``."""
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
    else:  # a list given through hydra
        names = [str(n).strip() for n in (value or [])]
        names = [n for n in names if n]
    if not names:
        raise ValueError(f"{flag} is empty; choose one or more of {', '.join(allowed)}")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"{flag}: unknown value(s) {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return tuple(n for n in allowed if n in names)


# ------------------------------------------------------------------------------------------ layer lists
# The one parser of every option that selects layers (--routing-encoder-layers, --routing-decoder-layers,
# --routing-encoder-decoder-layers, --disagreement-layers, --repulsive-layers; tables.scale.LAYER_FLAGS).
ALL_LAYERS = "all"
NO_LAYERS: Tuple[int, ...] = ()
LayerSpec = Union[str, Tuple[int, ...]]


def _layer_syntax_error(flag: str, value) -> ValueError:
    return ValueError(f"{flag}: expected 'all', 'none' or comma-separated layer indices (0-based; negative ones "
                      f"count from the last layer), got {value!r}")


def parse_layer_spec(value, flag: str, default: str) -> LayerSpec:
    """The syntax of a layer option, before the model's depth is known: :data:`ALL_LAYERS`, :data:`NO_LAYERS`
    or the sorted distinct indices as given (negative ones count from the last layer).

    ``value``: ``"all"``, ``"none"`` (any case), a comma list of integers, or through hydra an integer or a
    list of integers; ``None`` or ``""`` mean ``default`` (``"all"`` or ``"none"``, the option's default).
    Raises ``ValueError`` naming ``flag`` for anything else.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        value = default
    if isinstance(value, bool):
        raise _layer_syntax_error(flag, value)
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, str):
        text = value.strip().lower()
        if text == "none":
            return NO_LAYERS
        if text == ALL_LAYERS:
            return ALL_LAYERS
        items = [item.strip() for item in text.split(",")]
    else:  # a list from a hydra config
        items = list(value)
    indices = set()
    for item in items:
        try:
            idx = int(item) if not isinstance(item, bool) else None
        except (TypeError, ValueError):
            idx = None
        if idx is None or (isinstance(item, float) and item != idx):
            raise _layer_syntax_error(flag, value)
        indices.add(idx)
    if not indices:
        raise _layer_syntax_error(flag, value)
    return tuple(sorted(indices))


def resolve_layers(spec: LayerSpec, num_layers: int, flag: str, where: str = "") -> Tuple[int, ...]:
    """The 0-based layers of a ``num_layers``-deep stack that :func:`parse_layer_spec`'s ``spec`` selects, sorted.
    An index outside ``-num_layers .. num_layers-1`` is a ``ValueError`` naming ``flag`` and the layer count
    (``where`` says which stack, e.g. ``" of enc_self attention"``)."""
    if spec == ALL_LAYERS:
        return tuple(range(num_layers))
    layers = set()
    for idx in spec:
        if not -num_layers <= idx < num_layers:
            shown = ",".join(map(str, spec))
            raise ValueError(
                f"{flag} {shown}: layer index {idx} is out of range for {num_layers} layers{where} "
                f"(valid: {-num_layers}..{num_layers - 1}, negative indices count from the last layer)"
            )
        layers.add(idx % num_layers)
    return tuple(sorted(layers))


def parse_layers(value, num_layers: int, flag: str, default: str = "none") -> Tuple[int, ...]:
    """:func:`parse_layer_spec` then :func:`resolve_layers`: the selected 0-based layers of a stack."""
    return resolve_layers(parse_layer_spec(value, flag, default), num_layers, flag)


def describe_layers(spec: LayerSpec) -> str:
    """``all``, ``none`` or the comma list, for messages."""
    return spec if spec == ALL_LAYERS else ",".join(map(str, spec)) or "none"


# ------------------------------------------------------------------------------ dataclass fields
def attention_types_field(what: str, default: str = "enc_self,dec_self,enc_dec"):
    """The ``--*-attention`` option of a plugin's dataclass config: which attention types ``what``."""
    return field(default=default,
                 metadata={"help": f"comma-separated attention types {what}: enc_self, dec_self, enc_dec"})


def layers_field(what: str, none: bool = True):
    """The ``--*-layers`` option of a plugin's dataclass config (default ``all``), parsed by :func:`parse_layer_spec`;
    ``none``: whether 'none' is a choice to offer in the help."""
    return field(default=None,
                 metadata={"help": f"layers {what} in every selected attention type: 'all' (the default), "
                                   + ("'none' or " if none else "or ")
                                   + "comma-separated 0-based layer indices (negative ones count from the last layer)"})
