"""fairseq ``MultiheadAttention`` whose heads can be observed and combined by a custom module.

Disagreement regularization (Li et al., EMNLP 2018, §3) needs, per attention module and per forward,
the projected values V, the attention probabilities A or the head outputs O
(docs/methods.md#disagreement-regularization); routing-by-agreement (Li et al., NAACL 2019, §4) replaces
the concatenation + W_O that combines the heads.
``DiverseMultiheadAttention`` offers both without giving up fairseq's behaviour:

* not observed and no aggregator: ``MultiheadAttention.forward`` unchanged (bit-identical to stock);
* full sequences (training, scoring): own Q/K/V projections and the fused
  ``scaled_dot_product_attention`` kernel; A is materialised (fp32 softmax, as fairseq does) only when
  it is recorded or attention weights are requested;
* incremental decoding: fairseq's own cached path up to the attention logits (``before_softmax=True``),
  then softmax, dropout and ``A·V`` here, so the key/value cache stays fairseq's.

Heads are observed only through :func:`diverse_fairseq.methods.sites.observe`, which sets ``observer`` for
the duration of a ``with`` block.
"""

import logging
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor, nn

from diverse_fairseq.methods.scripting import inherited_as

logger = logging.getLogger(__name__)


class ReplacedOutProj(nn.Module):
    """The ``out_proj`` of an attention whose heads a routing aggregator combines: no parameters, never called.

    It exists because fairseq's ``MultiheadAttention.forward``, which the incremental path runs up to the
    attention logits, names ``self.out_proj`` (after its early return), and TorchScript compiles that line."""

    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("out_proj is replaced by the routing aggregator of this attention module")


class DiverseMultiheadAttention(MultiheadAttention):
    """Multi-head attention whose heads can be observed and whose head combination can be replaced.

    Attributes:
        observer: ``None``, or inside :func:`~diverse_fairseq.methods.sites.observe` a ``HeadObserver``
            that records ``{"v": [B,H,S,d], "a": [B,H,T,S], "o": [B,H,T,d]}`` (with their autograd graph;
            ``a`` is the fp32 softmax output before attention dropout, ``v`` covers the real key tokens, no
            ``bias_kv`` / zero-attention slot) and may hold a head mask [H] multiplied into O.

    Args:
        aggregator: optional module mapping the concatenated heads ``[T, B, E] -> [T, B, E]``; it
            replaces ``out_proj``, which is then deleted (no unused parameters).
        Other arguments: as fairseq's ``MultiheadAttention``.
    """

    #: [B, T] query padding of an encoder-decoder attention with an aggregator, which fairseq's decoder layer
    #: cannot pass as an argument: set by DiverseTransformerDecoderLayer.forward right before the call and
    #: cleared by the forward that reads it (self-attention uses its key padding, which is its query padding).
    #: Declared here so that TorchScript types the attribute as assignable.
    query_padding_mask: Optional[Tensor]

    def __init__(self, *args, aggregator: Optional[nn.Module] = None, **kwargs):
        super().__init__(*args, **kwargs)
        # fairseq's name, which --retain-dropout-modules matches (FairseqDropout names itself after its owner's class)
        self.dropout_module.module_name = "MultiheadAttention"
        self.observer = None
        self.aggregator: Optional[nn.Module] = None
        self.query_padding_mask = None
        if aggregator is not None:
            self.set_aggregator(aggregator)

    # ------------------------------------------------------------------ configuration

    def set_aggregator(self, aggregator: nn.Module) -> None:
        """Combine heads with ``aggregator`` ([T, B, E] -> [T, B, E]) instead of ``out_proj``, whose parameters
        are dropped (see :class:`ReplacedOutProj`)."""
        self.out_proj = ReplacedOutProj()
        self.aggregator = aggregator

    def reset_parameters(self):
        if getattr(self, "aggregator", None) is None:
            return super().reset_parameters()
        # out_proj is gone; initialise the projections as fairseq does, the aggregator itself
        gain = 1 / 2**0.5 if self.qkv_same_dim else 1.0
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        if hasattr(self.aggregator, "reset_parameters"):
            self.aggregator.reset_parameters()

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> None:
        """Load a checkpoint of the same model without routing (stock fairseq or ours) into a routed module.

        Such a checkpoint has this module's ``out_proj`` and no ``aggregator``: its ``out_proj`` is dropped
        and the aggregator keeps the initialisation it was built with (what fine-tuning a pre-trained model
        with routing-by-agreement means, e.g. ``--restore-file roberta.pt --reset-optimizer``). Each such
        module is logged, so that nothing is dropped silently. fairseq calls this before loading strictly."""
        super().upgrade_state_dict_named(state_dict, name)
        if self.aggregator is None:
            return
        prefix = f"{name}." if name else ""
        out_proj = [k for k in state_dict if k.startswith(f"{prefix}out_proj.")]
        if not out_proj or any(k.startswith(f"{prefix}aggregator.") for k in state_dict):
            return
        for key in out_proj:
            del state_dict[key]
        for key, value in self.aggregator.state_dict().items():
            state_dict[f"{prefix}aggregator.{key}"] = value.detach().clone()
        logger.warning("%s: the checkpoint has no routing aggregator here; its out_proj (%s) is dropped and "
                       "the aggregator starts from its initialisation", name or "attention", ", ".join(out_proj))

    def combine_heads(self, o: Tensor, query_padding_mask: Optional[Tensor] = None) -> Tensor:
        """Record, mask, concatenate and project the head outputs ``o`` [B, H, T, d]: ``[T, B, E]``.

        ``query_padding_mask`` [B, T] (True = pad): positions a routing aggregator need not route."""
        if self.observer is not None:
            self.observer.record("o", o)
            if self.observer.head_mask is not None:
                o = o * self.observer.head_mask.to(dtype=o.dtype, device=o.device).view(1, -1, 1, 1)  # [B, H, T, d]
        bsz, num_heads, tgt_len, head_dim = o.shape
        x = o.permute(2, 0, 1, 3).reshape(tgt_len, bsz, num_heads * head_dim)  # [T, B, E]
        if self.aggregator is not None:
            return self.aggregator(x, query_padding_mask)
        return self.out_proj(x)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if self.observer is not None:
            if torch.compiler.is_compiling():
                raise RuntimeError("attention heads cannot be observed inside torch.compile; observe the uncompiled "
                                   "model")
        if (self.observer is None and self.aggregator is None) or before_softmax or self.onnx_trace:
            if self.aggregator is not None and not before_softmax:
                raise RuntimeError("DiverseMultiheadAttention with an aggregator cannot be ONNX-traced")
            return self._stock_forward(
                query, key, value, key_padding_mask=key_padding_mask,
                incremental_state=incremental_state, need_weights=need_weights, static_kv=static_kv,
                attn_mask=attn_mask, before_softmax=before_softmax, need_head_weights=need_head_weights,
            )
        if need_head_weights:
            need_weights = True
        if incremental_state is not None:
            return self._forward_incremental(
                query, key, value, key_padding_mask, incremental_state, need_weights, static_kv,
                attn_mask, need_head_weights,
            )
        return self._forward_full(
            query, key, value, key_padding_mask, need_weights, attn_mask, need_head_weights
        )

    def _dropout_p(self) -> float:
        active = self.training or self.dropout_module.apply_during_inference
        return self.dropout_module.p if active else 0.0

    def _forward_full(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        need_weights: bool,
        attn_mask: Optional[Tensor],
        need_head_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        tgt_len, bsz, _ = query.size()
        # padded query positions [B, T] need not be routed; in self-attention the queries are the keys
        query_padding = key_padding_mask if self.self_attention else self.query_padding_mask
        self.query_padding_mask = None  # used once: no tensor outlives the call
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention:
            value = key
        assert key is not None and value is not None
        num_heads, head_dim = self.num_heads, self.head_dim

        q = self.q_proj(query)  # [T, B, E]
        k = self.k_proj(key)  # [S, B, E]
        v = self.v_proj(value)  # [S, B, E]
        if self.observer is not None:
            self.observer.record("v", v.view(-1, bsz, num_heads, head_dim).permute(1, 2, 0, 3))  # [B, H, S, d]
        if self.bias_k is not None:
            k, v, key_padding_mask, attn_mask = self._add_bias(k, v, key_padding_mask, attn_mask, bsz)

        # [L, B, E] -> [B, H, L, d]
        q = q.view(q.size(0), bsz, num_heads, head_dim).permute(1, 2, 0, 3)
        k = k.view(k.size(0), bsz, num_heads, head_dim).permute(1, 2, 0, 3)
        v = v.view(v.size(0), bsz, num_heads, head_dim).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k, v, key_padding_mask, attn_mask = self._append_zero_attn(k, v, key_padding_mask, attn_mask)
        src_len = k.size(2)

        # one additive mask for both: [1 or B, 1, T or 1, S]
        mask: Optional[Tensor] = None
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(attn_mask, float("-inf"))
            if attn_mask.dim() == 3:  # [B*H, T, S]
                mask = attn_mask.to(q.dtype).view(bsz, num_heads, tgt_len, src_len)
            else:  # [T, S]
                mask = attn_mask.to(q.dtype).view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            pad = key_padding_mask.to(torch.bool).view(bsz, 1, 1, src_len)
            if mask is None:
                mask = torch.zeros(pad.shape, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(pad, float("-inf"))

        dropout_p = self._dropout_p()
        weights: Optional[Tensor] = None
        record_a = False
        if self.observer is not None:  # (a plain None test, which TorchScript resolves for an unobserved module)
            record_a = "a" in self.observer.taps
        if record_a or need_weights:
            logits = torch.matmul(q * self.scaling, k.transpose(-1, -2))  # [B, H, T, S]
            if mask is not None:
                logits = logits + mask
            probs = utils.softmax(logits, dim=-1)  # fp32, as fairseq
            if self.observer is not None:
                if record_a:
                    self.observer.record("a", probs)
            weights = probs
            probs = self.dropout_module(probs.type_as(logits))
            o = torch.matmul(probs, v)  # [B, H, T, d]
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)  # [B, H, T, d]
        attn = self.combine_heads(o, query_padding)  # [T, B, E]
        return attn, self._head_weights(weights, need_weights, need_head_weights)

    def _forward_incremental(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
        need_weights: bool,
        static_kv: bool,
        attn_mask: Optional[Tensor],
        need_head_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        tgt_len, bsz, _ = query.size()
        num_heads, head_dim = self.num_heads, self.head_dim
        # fairseq's cached projection path (never the fused one: incremental_state is set)
        logits, v = self._stock_forward(
            query, key, value, key_padding_mask=key_padding_mask, incremental_state=incremental_state,
            need_weights=False, static_kv=static_kv, attn_mask=attn_mask, before_softmax=True,
        )  # logits [B*H, T, S] (scaled, masked), v [kv_B*H, S, d]
        assert v is not None  # before_softmax returns the values
        src_len = logits.size(-1)
        kv_bsz = v.size(0) // num_heads
        probs_f = utils.softmax(logits, dim=-1)  # fp32
        probs = self.dropout_module(probs_f.type_as(logits))
        if self.encoder_decoder_attention and bsz != kv_bsz:  # beamable enc-dec attention
            o = torch.einsum(
                "bxhts,bhsd->bxhtd",
                probs.view(kv_bsz, -1, num_heads, tgt_len, src_len),
                v.view(kv_bsz, num_heads, -1, head_dim),
            ).reshape(bsz, num_heads, tgt_len, head_dim)
        else:
            o = torch.bmm(probs, v).view(bsz, num_heads, tgt_len, head_dim)  # [B, H, T, d]
        if self.observer is not None:
            self.observer.record("v", v.view(kv_bsz, num_heads, -1, head_dim))
            self.observer.record("a", probs_f.view(bsz, num_heads, tgt_len, src_len))
        attn = self.combine_heads(o)  # [T, B, E]
        weights = probs_f.view(bsz, num_heads, tgt_len, src_len) if need_weights else None
        return attn, self._head_weights(weights, need_weights, need_head_weights)

    @staticmethod
    def _head_weights(
        weights: Optional[Tensor], need_weights: bool, need_head_weights: bool
    ) -> Optional[Tensor]:
        """fairseq's convention: [H, B, T, S] per head, else the mean over heads [B, T, S]."""
        if not need_weights or weights is None:
            return None
        weights = weights.transpose(1, 0)  # [H, B, T, S]
        return weights if need_head_weights else weights.mean(dim=0)


#: fairseq's ``MultiheadAttention.forward``, for the paths that keep it (TorchScript compiles no ``super()``)
DiverseMultiheadAttention._stock_forward = inherited_as(MultiheadAttention.forward, "_stock_forward",
                                                        DiverseMultiheadAttention)
