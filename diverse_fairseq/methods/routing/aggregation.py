"""Routing-by-agreement aggregation of attention heads: a drop-in replacement for ``out_proj``.

Li, Yang, Dou, Wang, Lyu, Tu. *Information Aggregation for Multi-Head Attention with
Routing-by-Agreement*. NAACL 2019, §4.1 (Eqs. 5-7) and §4.2; the authors' fused vote network
(docs/methods.md#routing-by-agreement-aggregation).
"""

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from diverse_fairseq.methods.routing.algorithms import ROUTING_TYPES, get_routing_function, valid_iterations

__all__ = ["RoutingAggregation"]


@torch.jit.ignore
def route(routing: str, compile: bool, votes: Tensor, beta_a: Optional[Tensor], beta_mu: Optional[Tensor],
          iterations: int, eps: float) -> Tensor:
    """The output capsules [..., N, E/N] of ``votes`` [..., H, N, E/N] by ``routing`` (``"em"`` with the learned
    costs β_A, β_μ and the variance floor ``eps``, or ``"simple"``), through ``torch.compile`` if ``compile``.

    Under ``torch.jit.script`` this stays a Python call (the routing cores are autograd Functions, optionally
    compiled): a scripted routed model runs with the eager values in Python, and cannot be saved for a runtime
    without Python (docs/fairseq-notes.md#torchscript)."""
    function = get_routing_function(routing, compile)
    if routing == "em":
        return function(votes, beta_a, beta_mu, iterations, None, eps)
    return function(votes, iterations)


class RoutingAggregation(nn.Module):
    """Aggregate the concatenated heads ``Ô`` [..., E] into [..., E] by routing-by-agreement.

    Vote network, the authors' fused form of Eqs. 5-6 (docs/methods.md#votes)::

        u     = ReLU(W1 · LayerNorm(Ô) + b1)              W1: E x E          (input capsules, Eq. 5)
        votes = W2 · u + b2 -> [..., H, N, E/N]           W2: E x H·E        (V_{h→n}, Eq. 6)

    then simple routing (Algorithm 1) or EM routing (Algorithm 2) over the H input capsules, and the N
    output capsules of width E/N are concatenated back to [..., E] (§4.1, "O = [Ω_1, .., Ω_N]").
    With N = E (the default, as in the paper's experiments) W2 is E x H·N.

    Parameters at E = 512, H = 8, N = 512: LayerNorm 1,024 + W1/b1 262,656 + W2/b2 2,101,248
    = 2,364,928, i.e. +2.1M over W_O (NAACL 2019 Tables 2-3); EM routing adds the 2·N = 1,024 learned costs
    β_A, β_μ (2,365,952 in all).

    Args:
        embed_dim: E, width of the concatenated heads and of the output.
        num_heads: H, the number of input capsules.
        routing: ``"simple"`` or ``"em"``.
        num_capsules: N output capsules, must divide E; default E (capsule width 1).
        iterations: routing iterations T (default 3).
        eps: EM variance floor ε (at most 1e-4).
        compile: run the routing core through ``torch.compile`` (``--routing-compile``).

    ``routing``, ``num_capsules`` and ``iterations`` are the ``--routing-*`` options, validated with messages
    naming the flags by :func:`~diverse_fairseq.methods.routing.options.routing_plan`; here (and in
    ``get_routing_function``) they are only asserted. ``eps`` (no command-line option) is checked here.

    Initialisation: W1, W2 Xavier-uniform with zero biases (as fairseq's ``out_proj``); LayerNorm with
    unit gain and zero bias; β_A = β_μ = 0. Hinton et al. (2018) learn β_a and β_u discriminatively
    and give no initial value; at 0 the initial activations are A_n = sigmoid(-λ χ_n), i.e. about ½ in
    the first iteration (where R_n = H/N is small), so no capsule starts switched off.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        routing: str = "em",
        num_capsules: Optional[int] = None,
        iterations: int = 3,
        eps: float = 1e-6,
        compile: bool = False,
    ):
        super().__init__()
        if embed_dim < 1 or num_heads < 1:
            raise ValueError(f"embed_dim and num_heads must be >= 1, got {embed_dim} and {num_heads}")
        if num_capsules is None:
            num_capsules = embed_dim
        assert routing in ROUTING_TYPES, f"unknown routing type {routing!r}; expected one of {ROUTING_TYPES}"
        assert num_capsules >= 1 and embed_dim % num_capsules == 0, (
            f"num_capsules (routing output capsules, N={num_capsules}) must be >= 1 and divide "
            f"embed_dim (E={embed_dim})")
        assert valid_iterations(iterations), f"routing iterations must be an integer >= 1, got {iterations!r}"
        if not 0.0 < eps <= 1e-4:
            raise ValueError(f"the EM variance floor eps must lie in (0, 1e-4], got {eps}")

        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.routing = routing
        self.num_capsules = num_capsules
        self.capsule_dim = embed_dim // num_capsules
        self.iterations = iterations
        self.eps = eps
        self.compile = bool(compile)

        self.layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, embed_dim)  # W1: input capsules, Eq. 5
        self.fc2 = nn.Linear(embed_dim, num_heads * embed_dim)  # W2: votes, Eq. 6
        if routing == "em":
            self.beta_a = nn.Parameter(torch.zeros(num_capsules))  # β_A, per output capsule
            self.beta_mu = nn.Parameter(torch.zeros(num_capsules))  # β_μ, per output capsule
        else:
            self.register_parameter("beta_a", None)
            self.register_parameter("beta_mu", None)
        self.reset_parameters()

    #: ``_route`` is Python-only (TorchScript skips it)
    __jit_unused_properties__ = ["_route"]

    @property
    def _route(self) -> Callable[..., Tensor]:
        """The routing function :func:`route` applies (``torch.compile``d if ``compile``)."""
        return get_routing_function(self.routing, self.compile)

    def reset_parameters(self) -> None:
        self.layer_norm.reset_parameters()
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)
        if self.beta_a is not None:
            nn.init.zeros_(self.beta_a)
            nn.init.zeros_(self.beta_mu)

    def votes(self, x: Tensor) -> Tensor:
        """The vote vectors V_{h→n}: [..., E] -> [..., H, N, E/N]."""
        u = F.relu(self.fc1(self.layer_norm(x)))  # [..., E]
        v = self.fc2(u)  # [..., H·E]
        return v.view(list(x.shape[:-1]) + [self.num_heads, self.num_capsules, self.capsule_dim])

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        """x: concatenated head outputs Ô [..., E] (e.g. [T, B, E]) -> aggregated output [..., E].

        ``padding_mask``: ``[B, T]``, True at padding positions of an input ``[T, B, E]`` (the attention module
        passes its self-attention padding, see ``DiverseMultiheadAttention.combine_heads``).
        Those positions are not routed and come out as zeros: routing is per position, so this only saves
        the work whose results fairseq ignores (padded queries).
        """
        if x.shape[-1] != self.embed_dim:
            raise ValueError(f"expected input width {self.embed_dim}, got {x.shape[-1]}")
        if (padding_mask is not None and x.dim() == 3 and padding_mask.dim() == 2
                and padding_mask.size(0) == x.size(1) and padding_mask.size(1) == x.size(0)
                and bool(padding_mask.any())):
            keep = ~padding_mask.t().to(torch.bool)  # [T, B]
            routed = self._aggregate(x[keep])  # [K, E]
            out = routed.new_zeros(x.shape)
            out[keep] = routed
            return out
        return self._aggregate(x)

    def _aggregate(self, x: Tensor) -> Tensor:
        votes = self.votes(x)  # [..., H, N, E/N]
        out = route(self.routing, self.compile, votes, self.beta_a, self.beta_mu, self.iterations, self.eps)
        return out.reshape(list(x.shape[:-1]) + [self.embed_dim])  # [..., N, E/N] -> [..., E]

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, routing={self.routing!r}, "
            f"num_capsules={self.num_capsules}, iterations={self.iterations}"
        )
