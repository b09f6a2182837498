"""The ``--routing-*`` options of ``diverse_transformer``: flags, defaults and their validation into a plan.

Routing-by-agreement (Li et al., NAACL 2019, §3-4) replaces concatenation + W_O of chosen attention modules by a
:class:`~diverse_fairseq.methods.routing.aggregation.RoutingAggregation`; :func:`routing_plan` turns the options into
``{(attention_type, layer): aggregator kwargs}``, which :func:`diverse_fairseq.methods.transformer.install_routing`
applies. Models with one stack pass their placements: ``diverse_transformer_lm`` routes decoder self-attention
(:data:`DECODER_ROUTING`), ``diverse_roberta`` encoder self-attention (:data:`ENCODER_ROUTING`).
"""

from typing import Dict, Tuple

from diverse_fairseq.methods.options import parse_layers
from diverse_fairseq.methods.routing.algorithms import ROUTING_TYPES, valid_iterations

# (flag destination, attention type, stack whose depth bounds the indices)
ROUTING_PLACEMENTS = (
    ("routing_encoder_layers", "enc_self", "encoder"),
    ("routing_decoder_layers", "dec_self", "decoder"),
    ("routing_encoder_decoder_layers", "enc_dec", "decoder"),
)
ENCODER_ROUTING = ROUTING_PLACEMENTS[:1]  # RoBERTa: --routing-encoder-layers only
DECODER_ROUTING = ROUTING_PLACEMENTS[1:2]  # transformer_lm: --routing-decoder-layers only
ROUTING_DEFAULTS = {
    "routing_type": "em",
    "routing_encoder_layers": "none",
    "routing_decoder_layers": "none",
    "routing_encoder_decoder_layers": "none",
    "routing_iterations": 3,
    "routing_capsules": None,
    "routing_compile": False,
}

# the options that only act on routed modules (an error when they differ from the default and none routes)
ROUTING_OPTIONS = ("routing_type", "routing_iterations", "routing_capsules", "routing_compile")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def set_routing_defaults(args, defaults: Dict[str, object] = ROUTING_DEFAULTS) -> None:
    """Fill in the routing options a namespace lacks (default: no routing; older checkpoints have none)."""
    for dest, default in defaults.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, default)


def routing_architecture(args) -> None:
    """Routing defaults of the ``routing_transformer_*`` architectures, the paper's "Effective Aggregation"
    (NAACL 2019 Table 3 / journal Table 5): EM routing, 3 iterations, encoder self-attention of layers 0, 1."""
    set_routing_defaults(args, {"routing_type": "em", "routing_encoder_layers": "0,1", "routing_iterations": 3})


def _depth(args, stack: str) -> int:
    keep = getattr(args, f"{stack}_layers_to_keep", None)
    return len(str(keep).split(",")) if keep else getattr(args, f"{stack}_layers")


def routing_plan(args, placements=ROUTING_PLACEMENTS) -> Dict[Tuple[str, int], dict]:
    """Validate the routing options of ``args`` and return ``{(attention_type, layer): aggregator kwargs}``.

    This is where the ``--routing-*`` options are checked, once, when the model is built; the aggregator and
    the routing functions only assert them. ``--routing-compile`` is the one compile switch (no environment
    variable), resolved here into each aggregator's ``compile``.

    Errors (``ValueError``) name the flag: an unknown ``--routing-type``, a layer index out of range, a
    ``--routing-iterations`` below 1, a ``--routing-capsules`` that does not divide the width of a
    routed attention module, and a ``--routing-type`` / ``--routing-iterations`` / ``--routing-capsules`` /
    ``--routing-compile`` other than the default when no layer routes (it would do nothing; the default
    values themselves are accepted, as checkpoints of unrouted models store them). ``placements``: the
    ``(flag destination, attention type, stack)`` the model has (default: all three of an encoder-decoder).
    """
    set_routing_defaults(args)
    routing = str(args.routing_type).strip().lower()
    if routing not in ROUTING_TYPES:
        raise ValueError(
            f"--routing-type: unknown routing type {args.routing_type!r}; choose from {', '.join(ROUTING_TYPES)}"
        )
    iterations = args.routing_iterations
    if not valid_iterations(iterations):
        raise ValueError(f"--routing-iterations must be an integer >= 1, got {iterations!r}")
    capsules = args.routing_capsules
    if capsules is not None and (not _is_int(capsules) or capsules < 1):
        raise ValueError(f"--routing-capsules must be a positive integer, got {capsules!r}")
    plan = {}
    for dest, attention_type, stack in placements:
        layers = parse_layers(getattr(args, dest), _depth(args, stack), _flag(dest))
        width = getattr(args, f"{stack}_embed_dim")  # enc_dec: the decoder's width, as its queries
        if layers and capsules is not None and width % int(capsules) != 0:
            raise ValueError(
                f"--routing-capsules {capsules} must divide the attention width {width} "
                f"({_flag(dest)}: capsule width E/N)"
            )
        for layer in layers:
            plan[(attention_type, layer)] = dict(
                routing=routing,
                num_capsules=None if capsules is None else int(capsules),
                iterations=iterations,
                compile=bool(args.routing_compile),
            )
    if not plan:
        idle = [_flag(dest) + ("" if isinstance(getattr(args, dest), bool) else f" {getattr(args, dest)}")
                for dest in ROUTING_OPTIONS if getattr(args, dest) != ROUTING_DEFAULTS[dest]]
        if idle:
            flags = [_flag(dest) for dest, _, _ in placements]
            raise ValueError(
                f"{', '.join(idle)} would do nothing: no attention module routes ({', '.join(flags)} select "
                f"none). Choose layers to route, e.g. {flags[0]} 0,1"
                + (" (or --arch routing_transformer_*)" if len(flags) > 1 else "") + ", or drop the option")
    return plan


def add_routing_args(parser, placements=ROUTING_PLACEMENTS) -> None:
    """The ``--routing-*`` options, added by ``DiverseTransformerModel.add_args`` (the layer flags of
    ``placements`` only: the LM and RoBERTa variants have one stack each).

    No argparse defaults (fairseq's convention for architecture options): the ``routing_transformer_*``
    architectures set their own (:func:`routing_architecture`), everything else falls back to
    ``ROUTING_DEFAULTS`` (no routing).
    """
    layers = ("comma-separated 0-based layer indices (negative ones count from the last layer, "
              "-1 = the last), 'all' or 'none' (default: none)")
    parser.add_argument("--routing-type", choices=ROUTING_TYPES, metavar="{simple,em}",
                        help="routing-by-agreement algorithm aggregating the heads of the routed attention "
                             "modules: simple (NAACL 2019 Alg. 1) or em (Alg. 2) (default: em)")
    helps = {"enc_self": "encoder self-attention layers whose heads are aggregated by routing instead of "
                         "concatenation + W_O: ",
             "dec_self": "decoder self-attention layers aggregated by routing: ",
             "enc_dec": "encoder-decoder attention layers aggregated by routing: "}
    for dest, attention_type, _ in placements:
        parser.add_argument(_flag(dest), type=str, metavar="LAYERS", help=helps[attention_type] + layers)
    parser.add_argument("--routing-iterations", type=int, metavar="T",
                        help="routing iterations T (default: 3, as in the paper)")
    parser.add_argument("--routing-capsules", type=int, metavar="N",
                        help="output capsules N per routed module, must divide the model width E "
                             "(capsule width E/N); default E, i.e. capsules of width 1 as in the paper")
    parser.add_argument("--routing-compile", action="store_true",
                        help="run the routing iterations through torch.compile (needs a working "
                             "TorchInductor toolchain)")
