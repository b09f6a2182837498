"""diverse_transformer: the same model as fairseq's transformer, with observable attention modules."""

from argparse import Namespace

import pytest
import torch
from _disagreement_utils import batch, build, tiny_task
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel

from diverse_fairseq.methods.attention import DiverseMultiheadAttention
from diverse_fairseq.methods.sites import attention_sites, observe, uses_activation_checkpointing
from diverse_fairseq.methods.transformer import DiverseTransformerModel

pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def test_same_parameters_and_outputs_as_stock_transformer(task):
    stock = build(TransformerModel, "transformer", task)
    ours = build(DiverseTransformerModel, "diverse_transformer", task)
    s1, s2 = stock.state_dict(), ours.state_dict()
    assert list(s1) == list(s2)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)  # same initialisation from the same seed
    sample = batch(task)
    for model in (stock, ours):
        model.train()
    out1 = stock(**sample["net_input"])[0]
    out2 = ours(**sample["net_input"])[0]
    assert torch.equal(out1, out2)
    out1.logsumexp(-1).sum().backward()
    out2.logsumexp(-1).sum().backward()
    for (n, p1), p2 in zip(stock.named_parameters(), ours.parameters()):
        assert torch.equal(p1.grad, p2.grad), n


def test_attention_sites(task):
    model = build(DiverseTransformerModel, "diverse_transformer", task)
    sites = attention_sites(model)
    assert all(isinstance(s.module, DiverseMultiheadAttention) for s in sites)
    tags = [s.key for s in sites]
    assert sorted(tags) == sorted(
        [("enc_self", 0), ("enc_self", 1), ("dec_self", 0), ("enc_dec", 0), ("dec_self", 1), ("enc_dec", 1)]
    )
    where = {s.module: s.key for s in sites}
    assert where[model.encoder.layers[1].self_attn] == ("enc_self", 1)
    assert where[model.decoder.layers[0].encoder_attn] == ("enc_dec", 0)
    assert where[model.decoder.layers[1].self_attn] == ("dec_self", 1)
    assert not uses_activation_checkpointing(model)
    checkpointed = build(DiverseTransformerModel, "diverse_transformer", task, extra=["--checkpoint-activations"])
    assert uses_activation_checkpointing(checkpointed) and [s.key for s in attention_sites(checkpointed)] == tags


def test_taps_do_not_change_the_model_output(task):
    model = build(DiverseTransformerModel, "diverse_transformer", task).eval()
    sample = batch(task)
    with torch.no_grad():
        ref = model(**sample["net_input"])[0]
        sites = attention_sites(model)
        with observe(sites, {"v", "a", "o"}) as seen:
            tapped = model(**sample["net_input"])[0]
    assert (ref - tapped).abs().max() <= 1e-5
    assert all(set(seen.heads(s)) == {"v", "a", "o"} for s in sites)


@pytest.mark.parametrize(
    "ours,stock",
    [
        ("diverse_transformer", "transformer"),
        ("diverse_transformer_iwslt_de_en", "transformer_iwslt_de_en"),
        ("diverse_transformer_wmt_en_de", "transformer_wmt_en_de"),
        ("diverse_transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_de_big"),
        ("diverse_transformer_wmt_en_de_big", "transformer_wmt_en_de_big"),
    ],
)
def test_architectures_have_the_stock_sizes(ours, stock):
    assert ARCH_MODEL_REGISTRY[ours] is DiverseTransformerModel
    a, b = Namespace(), Namespace()
    ARCH_CONFIG_REGISTRY[ours](a)
    ARCH_CONFIG_REGISTRY[stock](b)
    assert vars(a) == vars(b)


def test_big_8_heads_architecture():
    a = Namespace()
    ARCH_CONFIG_REGISTRY["diverse_transformer_wmt_en_de_big_8heads"](a)
    assert (a.encoder_embed_dim, a.encoder_attention_heads, a.decoder_attention_heads) == (1024, 8, 8)
    assert a.encoder_ffn_embed_dim == 4096 and a.dropout == 0.3


def test_incremental_generation_matches_stock(task):
    """Beam search through the tapped incremental path gives the stock model's hypotheses."""
    from fairseq.sequence_generator import SequenceGenerator

    stock = build(TransformerModel, "transformer", task).eval()
    ours = build(DiverseTransformerModel, "diverse_transformer", task).eval()
    sample = batch(task)
    hyps = []
    for model in (stock, ours):
        gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=10)
        with torch.no_grad(), observe(attention_sites(ours), {"o", "a"}):
            out = gen.generate([model], sample)
        hyps.append([(h[0]["tokens"].tolist(), round(float(h[0]["score"]), 5)) for h in out])
    assert hyps[0] == hyps[1]
