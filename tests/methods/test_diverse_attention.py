"""DiverseMultiheadAttention: equal to fairseq's attention observed or not, recorded heads correct, fused kernel
kept."""

import contextlib
from unittest import mock

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from diverse_fairseq.methods import attention as diverse_attention
from diverse_fairseq.methods.attention import DiverseMultiheadAttention, ReplacedOutProj
from diverse_fairseq.methods.sites import AttentionSite, observe

E, H, T, S, B = 32, 4, 6, 9, 3
# stock fairseq passes a bool key padding mask with a float causal mask to torch's attention
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")

TAP_SETS = [(), ("o",), ("v",), ("a",), ("v", "a", "o")]


@contextlib.contextmanager
def tapping(module, taps):
    """Record ``taps`` of ``module`` within the block (not observed, i.e. fairseq's own path, when ``taps`` is
    empty); yields a function returning what the last forward recorded."""
    if not taps:
        yield dict
        return
    site = AttentionSite("enc_self", 0, module)
    with observe([site], taps) as seen:
        yield lambda: seen.heads(site)


def pair(kind, dropout=0.0, **kwargs):
    """A stock module and ours with the same parameters (built from the same seed)."""
    kw = dict(self_attention=True) if kind == "self" else dict(encoder_decoder_attention=True)
    kw.update(kwargs)
    torch.manual_seed(0)
    stock = MultiheadAttention(E, H, dropout=dropout, **kw)
    torch.manual_seed(0)
    ours = DiverseMultiheadAttention(E, H, dropout=dropout, **kw)
    for (n1, p1), (n2, p2) in zip(stock.named_parameters(), ours.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    return stock, ours


def inputs(kind):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, E, generator=g)
    if kind == "self":  # decoder-style: causal mask, right padding
        kpm = torch.zeros(B, T, dtype=torch.bool)
        kpm[0, -2:] = True
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        return dict(query=x, key=x, value=x, key_padding_mask=kpm, attn_mask=mask)
    enc = torch.randn(S, B, E, generator=g)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, :3] = True  # left-padded source
    return dict(query=x, key=enc, value=enc, key_padding_mask=kpm, static_kv=True)


@pytest.mark.parametrize("kind", ["self", "enc_dec"])
@pytest.mark.parametrize("taps", TAP_SETS)
@pytest.mark.parametrize("need_weights", [False, True])
def test_matches_stock_attention_in_training(kind, taps, need_weights):
    stock, ours = pair(kind)
    args = inputs(kind)
    x_stock = {k: (v.clone().requires_grad_(True) if k == "query" else v) for k, v in args.items()}
    x_ours = {k: (v.clone().requires_grad_(True) if k == "query" else v) for k, v in args.items()}
    if kind == "self":
        x_stock["key"] = x_stock["value"] = x_stock["query"]
        x_ours["key"] = x_ours["value"] = x_ours["query"]
    y1, w1 = stock(**x_stock, need_weights=need_weights)
    with tapping(ours, taps) as tapped:
        y2, w2 = ours(**x_ours, need_weights=need_weights)
    if not taps:
        assert torch.equal(y1, y2)  # stock path, bit-identical
    assert (y1 - y2).abs().max() <= 1e-6
    if need_weights:
        assert (w1 - w2).abs().max() <= 1e-6
    else:
        assert w2 is None
    y1.pow(2).sum().backward()
    y2.pow(2).sum().backward()
    assert (x_stock["query"].grad - x_ours["query"].grad).abs().max() <= 1e-5
    for p1, p2 in zip(stock.parameters(), ours.parameters()):
        assert (p1.grad - p2.grad).abs().max() <= 1e-5
    assert set(tapped()) == set(taps)


@pytest.mark.parametrize("kind", ["self", "enc_dec"])
def test_tapped_tensors(kind):
    _, ours = pair(kind)
    args = inputs(kind)
    with tapping(ours, {"v", "a", "o"}) as tapped:
        ours(**args, need_weights=False)
    src = T if kind == "self" else S
    v, a, o = tapped()["v"], tapped()["a"], tapped()["o"]
    assert v.shape == (B, H, src, E // H) and a.shape == (B, H, T, src) and o.shape == (B, H, T, E // H)
    value = ours.v_proj(args["value"])  # [S, B, E]
    assert torch.allclose(v, value.view(src, B, H, E // H).permute(1, 2, 0, 3))
    assert a.dtype == torch.float32 and torch.allclose(a.sum(-1), torch.ones(B, H, T))
    padded = args["key_padding_mask"][:, None, None, :].expand_as(a)
    assert torch.all(a[padded] == 0)
    assert torch.allclose(o, a @ v, atol=1e-6)
    # only the observed taps are recorded, and nothing stays on the module after the block
    with tapping(ours, {"o"}) as tapped:
        ours(**args, need_weights=False)
    assert set(tapped()) == {"o"} and ours.observer is None


def test_fused_kernel_unless_positions_are_tapped():
    _, ours = pair("self")
    args = inputs("self")
    softmax = mock.Mock(wraps=diverse_attention.utils.softmax)
    sdpa = mock.Mock(wraps=torch.nn.functional.scaled_dot_product_attention)
    with mock.patch.object(diverse_attention.utils, "softmax", softmax), \
            mock.patch.object(diverse_attention.F, "scaled_dot_product_attention", sdpa):
        for taps in [("o",), ("v",), ("v", "o")]:
            with tapping(ours, taps):
                ours(**args, need_weights=False)
        assert sdpa.call_count == 3 and softmax.call_count == 0
        with tapping(ours, ("a",)):
            ours(**args, need_weights=False)
        assert sdpa.call_count == 3 and softmax.call_count == 1


def test_attention_dropout_is_applied_on_the_tapped_path():
    _, ours = pair("enc_dec", dropout=0.5)
    args = inputs("enc_dec")
    ours.train()
    torch.manual_seed(3)
    with tapping(ours, {"o"}):
        y1, _ = ours(**args, need_weights=False)
        y2, _ = ours(**args, need_weights=False)
        assert not torch.allclose(y1, y2)
        ours.eval()
        y3, _ = ours(**args, need_weights=False)
        y4, _ = ours(**args, need_weights=False)
    assert torch.equal(y3, y4)


def incremental_outputs(module, x, enc=None, enc_pad=None):
    """Decode x [T, B, E] one step at a time through the module's incremental state."""
    state, outs = {}, []
    for t in range(x.size(0)):
        q = x[t : t + 1]
        if enc is None:
            y, _ = module(q, q, q, incremental_state=state, need_weights=False)
        else:
            y, _ = module(q, enc, enc, key_padding_mask=enc_pad, incremental_state=state, static_kv=True,
                          need_weights=False)
        outs.append(y)
    return torch.cat(outs, 0)


@pytest.mark.parametrize("kind", ["self", "enc_dec"])
@pytest.mark.parametrize("taps", TAP_SETS)
def test_incremental_decoding_matches_stock(kind, taps):
    stock, ours = pair(kind)
    stock.eval()
    ours.eval()
    args = inputs(kind)
    x = args["query"]
    enc = None if kind == "self" else args["key"]
    pad = None if kind == "self" else args["key_padding_mask"]
    with torch.no_grad():
        y_stock = incremental_outputs(stock, x, enc, pad)
        with tapping(ours, taps) as tapped:
            y_ours = incremental_outputs(ours, x, enc, pad)
        assert (y_stock - y_ours).abs().max() <= 1e-6
        assert set(tapped()) == set(taps)
        if "o" in taps:
            assert tapped()["o"].shape == (B, H, 1, E // H)  # the last step
        # and incremental decoding equals the full-sequence forward
        if kind == "self":
            full, _ = ours(x, x, x, attn_mask=torch.triu(torch.full((T, T), float("-inf")), 1), need_weights=False)
        else:
            full, _ = ours(x, enc, enc, key_padding_mask=pad, static_kv=True, need_weights=False)
        assert (full - y_ours).abs().max() <= 1e-5


def test_beamable_encoder_decoder_incremental():
    stock, ours = pair("enc_dec")
    beam = 2
    for m in (stock, ours):
        m.eval()
        m.set_beam_size(beam)
    args = inputs("enc_dec")
    x = args["query"].repeat_interleave(beam, dim=1)  # [T, B*beam, E]
    enc = args["key"].repeat_interleave(beam, dim=1)
    pad = args["key_padding_mask"].repeat_interleave(beam, dim=0)
    with torch.no_grad(), tapping(ours, {"o"}):
        y_stock = incremental_outputs(stock, x, enc, pad)
        y_ours = incremental_outputs(ours, x, enc, pad)
    assert (y_stock - y_ours).abs().max() <= 1e-6


class _Doubler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x, padding_mask=None):
        return x * self.scale


def test_aggregator_replaces_out_proj():
    stock, _ = pair("self")
    torch.manual_seed(0)
    ours = DiverseMultiheadAttention(E, H, self_attention=True, aggregator=_Doubler())
    ours.load_state_dict(stock.state_dict(), strict=False)
    assert isinstance(ours.out_proj, ReplacedOutProj)  # no parameters, raises if called
    assert not any(n.startswith("out_proj") for n, _ in ours.named_parameters())
    args = inputs("self")
    y, _ = ours(**args, need_weights=False)
    stock.out_proj.weight.data.copy_(2 * torch.eye(E))
    stock.out_proj.bias.data.zero_()
    y_ref, _ = stock(**args, need_weights=False)
    assert (y - y_ref).abs().max() <= 1e-5
    y.sum().backward()
    assert ours.aggregator.scale.grad is not None
    # incremental decoding goes through the aggregator too
    ours.eval()
    stock.eval()
    with torch.no_grad():
        x = args["query"]
        assert (incremental_outputs(ours, x) - incremental_outputs(stock, x)).abs().max() <= 1e-5


def test_unknown_tap_is_rejected():
    _, ours = pair("self")
    with pytest.raises(ValueError, match="unknown attention taps"):
        with tapping(ours, {"q"}):
            pass


def test_observing_inside_torch_compile_is_refused():
    """Recording heads is Python-side state: under torch.compile it fails with a clear error, never silently."""
    _, ours = pair("self")
    args = inputs("self")
    compiled = torch.compile(ours, backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="cannot be observed inside torch.compile"):
        with tapping(ours, {"o"}):
            compiled(**args, need_weights=False)
    assert ours.observer is None


def test_nested_observation_is_refused():
    _, ours = pair("self")
    with tapping(ours, {"o"}):
        with pytest.raises(RuntimeError, match="already observed"):
            with tapping(ours, {"v"}):
                pass
