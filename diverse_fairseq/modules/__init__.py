"""Attention building blocks: attention with head taps, routing-by-agreement aggregation."""

from .aggregation import RoutingAggregation  # noqa: F401
from .routing import em_routing, get_routing_function, simple_routing, squash  # noqa: F401
from .diverse_attention import DiverseMultiheadAttention  # noqa: F401
